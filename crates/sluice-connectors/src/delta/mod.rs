//! Delta Lake tables as a target (`type: delta`, feature `delta`): one table directory per
//! target table under `path`, readable by any Delta reader.
//!
//! - A copy writes data files and commits them with its checkpoint (`writer.rs`): the commit is
//!   the checkpoint, numbered by the task's app transaction (`sluice/<job>/<task>`).
//! - The change stream merges each group by primary key into the tables it touches and commits
//!   them with the stream's checkpoint (`changes.rs`, `merge.rs`), decided first in a journal
//!   beside the tables (`journal.rs`), since Delta has no transaction across tables.
//! - A `snapshot+cdc` copy is hidden until the stream passes its end (`sluice_core::hidden`): it
//!   is a table of its own in `<table>/sluice_copy/`, and publishing it creates the table with
//!   the copy's files in its first version, so every version readers see is a state the source
//!   had.
//! - Compaction and vacuum run between groups (`maintenance.rs`); log checkpoints are Delta's.
//!
//! Only the Delta protocol is `deltalake-core`'s (log, commits and their conflicts, data files
//! with statistics, checkpoints, vacuum); the key merge and the compaction are Sluice's, because
//! deltalake's MERGE and OPTIMIZE need DataFusion (ARCHITECTURE.md).

mod changes;
pub(crate) mod connector;
mod journal;
mod maintenance;
mod merge;
mod read_back;
mod table;
mod types;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_core::connector::{
    CheckItem, Checkpoint, Fence, FoldedChangeSink, FoldedChangeWriter, Sink, TableTasks, TableWriter,
};
use sluice_core::names::HIDDEN_PREFIX;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use journal::{Entry, Journal};
use table::LakeTable;

/// The directory a hidden copy of a table lives in, inside the table's own directory.
const COPY_DIRECTORY: &str = "sluice_copy";

/// The task name of the change stream in app transaction ids.
const STREAM_APP: &str = sluice_core::names::STREAM_TASK;

/// How many recent commits recovery looks through when the journal lacks a checkpoint.
const HISTORY_DEPTH: usize = 1000;

/// The app transaction id of a job's task.
fn app_id(job: &str, task: &str) -> String {
    format!("sluice/{job}/{task}")
}

pub use crate::lake::PartitionBy;

/// The target's options.
#[derive(Debug, Clone)]
pub struct DeltaOptions {
    pub path: PathBuf,
    pub create_tables: bool,
    pub partition_by: PartitionBy,
    /// A group of the change stream commits this long after its first transaction...
    pub commit_interval: Duration,
    /// ...or once it holds this many row changes.
    pub commit_rows: u64,
    /// Data files are cut at about this size (and a copy commits each one).
    pub file_bytes: u64,
    /// How often the stream compacts a table's small files (`None`: never).
    pub compact_every: Option<Duration>,
    /// Commits between log checkpoints (`delta.checkpointInterval`).
    pub checkpoint_every: u64,
    /// How often the stream vacuums its tables (`None`: never).
    pub vacuum_every: Option<Duration>,
    /// Files no version newer than this needs are deleted by vacuum.
    pub vacuum_retention: Duration,
}

/// What every writer of one target shares: its options and the cluster task's fence.
#[derive(Debug)]
struct Lake {
    options: DeltaOptions,
    path: PathBuf,
    fence: Option<Fence>,
}

impl Lake {
    /// A table's directory relative to `path`: its own, or its hidden copy's inside it.
    fn relative(&self, name: &TableName) -> String {
        match name.name.strip_prefix(HIDDEN_PREFIX) {
            Some(own) => {
                let own = TableName { namespace: name.namespace.clone(), name: own.to_owned() };
                format!("{}/{COPY_DIRECTORY}", crate::file::directory_name(&own))
            }
            None => crate::file::directory_name(name),
        }
    }

    fn root(&self, name: &TableName) -> PathBuf {
        self.path.join(self.relative(name))
    }

    fn journal(&self, job: &str) -> Journal {
        Journal::new(&self.path, job)
    }

    fn check_fence(&self, job: &str) -> Result<()> {
        match &self.fence {
            Some(fence) => self.journal(job).check(job, fence),
            None => Ok(()),
        }
    }

    /// The partition columns of a table, checked against its columns.
    fn partition_columns(&self, table: &TableSchema) -> Result<Vec<String>> {
        let own = sluice_core::names::own_name(&table.name.name);
        let named = TableName { namespace: table.name.namespace.clone(), name: own.to_owned() }.to_string();
        let columns = self.options.partition_by.of(&named);
        let missing: Vec<&String> =
            columns.iter().filter(|column| !table.columns.iter().any(|known| known.name == **column)).collect();
        if !missing.is_empty() {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "target.partition_by: table {named} has no column {}",
                    missing.iter().map(|name| name.as_str()).collect::<Vec<_>>().join(", ")
                ),
            )
            .on(Side::Target)
            .hint("name columns of the target table (after route and transform), or list partition_by per table"));
        }
        Ok(columns)
    }

    fn properties(&self) -> Vec<(&'static str, String)> {
        vec![
            ("delta.checkpointInterval", self.options.checkpoint_every.to_string()),
            (
                "delta.deletedFileRetentionDuration",
                format!("interval {} seconds", self.options.vacuum_retention.as_secs()),
            ),
        ]
    }

    /// The table of `schema`, created when missing (and the job may create tables).
    async fn ensure_table(&self, schema: &TableSchema) -> Result<LakeTable> {
        let root = self.root(&schema.name);
        if let Some(table) = LakeTable::open(&schema.name, &root).await? {
            return Ok(table);
        }
        if !self.options.create_tables {
            return Err(Error::new(
                ErrorKind::Schema,
                format!("Delta table {} does not exist at {}", schema.name, root.display()),
            )
            .on(Side::Target)
            .hint("create it, or set target.create_tables: true"));
        }
        let partitions = self.partition_columns(schema)?;
        let properties: Vec<(&str, String)> = self.properties();
        LakeTable::create(schema, &types::arrow_schema(schema), &root, &partitions, &properties).await
    }

    /// The stream's last group as its tables hold it, for a journal that was lost: the largest
    /// group of the stream's app transaction among the tables under `path`, with the checkpoint
    /// its commit carries.
    async fn stream_entry_from_tables(&self, job: &str) -> Result<Option<Entry>> {
        let app = app_id(job, STREAM_APP);
        let mut best: Option<(i64, LakeTable)> = None;
        for root in self.table_roots()? {
            let name = TableName::parse(root.file_name().and_then(|name| name.to_str()).unwrap_or_default());
            let Some(table) = LakeTable::open(&name, &root).await? else { continue };
            if let Some(group) = table.app_version(&app).await? {
                if best.as_ref().is_none_or(|(known, _)| group > *known) {
                    best = Some((group, table));
                }
            }
        }
        let Some((group, table)) = best else { return Ok(None) };
        let checkpoint = checkpoint_in_history(&table, STREAM_APP, group).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::State,
                format!("the stream of job {job} committed group {group} to table {}, and neither .sluice/ nor the table's recent history holds its checkpoint", table.name),
            )
            .on(Side::Target)
            .hint("run the job with --restart to copy everything again")
        })?;
        log::warn!(
            "job {job}: the stream's journal is gone; resuming from group {group} as table {} records it",
            table.name
        );
        Ok(Some(Entry { group, epoch: 0, checkpoint, tables: Vec::new(), discard: Vec::new() }))
    }

    /// The directories under `path` that hold Delta tables (and their hidden copies).
    fn table_roots(&self) -> Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(&self.path) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(
                    Error::new(ErrorKind::Connect, format!("list {}: {error}", self.path.display())).on(Side::Target)
                )
            }
        };
        let mut roots = Vec::new();
        for entry in entries.filter_map(|entry| entry.ok()) {
            let root = entry.path();
            for candidate in [root.clone(), root.join(COPY_DIRECTORY)] {
                if LakeTable::exists(&candidate) {
                    roots.push(candidate);
                }
            }
        }
        Ok(roots)
    }
}

/// The checkpoint `task` committed with its app transaction `version`, from the table's recent
/// commits' metadata.
async fn checkpoint_in_history(table: &LakeTable, task: &str, version: i64) -> Result<Option<Checkpoint>> {
    for info in table.recent_sluice_info(HISTORY_DEPTH).await? {
        if info.get("task").and_then(|value| value.as_str()) == Some(task)
            && info.get("version").and_then(|value| value.as_i64()) == Some(version)
        {
            if let Some(checkpoint) = info.get("checkpoint") {
                return Ok(serde_json::from_value(checkpoint.clone()).ok());
            }
        }
    }
    Ok(None)
}

/// Writes tables into Delta tables under one directory.
#[derive(Debug)]
pub struct DeltaSink {
    lake: Arc<Lake>,
}

impl DeltaSink {
    pub fn new(options: DeltaOptions, fence: Option<Fence>) -> DeltaSink {
        let path = options.path.clone();
        DeltaSink { lake: Arc::new(Lake { options, path, fence }) }
    }
}

#[async_trait]
impl Sink for DeltaSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let mut items = crate::file::check_directory(&self.lake.path)?;
        items[0].what = "Delta tables directory".into();
        Ok(items)
    }

    fn target_name(&self, source: &TableName) -> TableName {
        source.clone()
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables
            .iter()
            .map(|table| {
                let partitions = self.lake.partition_columns(table).unwrap_or_default();
                let partitioned = if partitions.is_empty() {
                    String::new()
                } else {
                    format!(", partitioned by {}", partitions.join(", "))
                };
                let columns: Vec<String> = types::arrow_schema(table)
                    .fields()
                    .iter()
                    .map(|field| {
                        format!(
                            "  {} {}{}",
                            field.name(),
                            field.data_type(),
                            if field.is_nullable() { "" } else { " NOT NULL" }
                        )
                    })
                    .collect();
                format!(
                    "-- Delta table {}{partitioned}\n{}",
                    self.lake.root(&table.name).display(),
                    columns.join(",\n")
                )
            })
            .collect()
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        // Every problem at once: partitioning first, then the tables.
        crate::lake::every_problem(
            tables.iter().filter_map(|table| self.lake.partition_columns(table).err()).collect(),
        )?;
        for table in tables {
            self.lake.ensure_table(table).await?;
        }
        Ok(())
    }

    /// Deletes the tables (their copies too) and the job's bookkeeping: the next run makes them
    /// anew.
    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        for table in tables {
            let root = self.lake.root(&table.table);
            match std::fs::remove_dir_all(&root) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::new(
                        ErrorKind::Write,
                        format!("remove Delta table {}: {error}", root.display()),
                    )
                    .on(Side::Target));
                }
                _ => {}
            }
        }
        self.lake.journal(job).remove()
    }

    async fn claim(&self, job: &str) -> Result<()> {
        match &self.lake.fence {
            Some(fence) => self.lake.journal(job).claim(job, fence),
            None => Ok(()),
        }
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        Ok(Box::new(writer::CopyWriter {
            lake: self.lake.clone(),
            job: job.to_owned(),
            task: task.to_owned(),
            table,
            delta: None,
            schema: None,
            writer: None,
            version: 0,
            staged: 0,
            replace: false,
        }))
    }

    sluice_core::capabilities!(folded_changes: FoldedChangeSink);
}

#[async_trait]
impl FoldedChangeSink for DeltaSink {
    fn hides_copies(&self) -> bool {
        true
    }

    async fn existing_tables(&self, tables: &[TableName]) -> Result<Vec<TableName>> {
        Ok(tables.iter().filter(|name| LakeTable::exists(&self.lake.root(name))).cloned().collect())
    }

    /// The change writer of the job's stream, the only task whose changes a Delta target
    /// journals: another task's (a verification's repair) is refused.
    async fn open_folded(&self, job: &str, task: &str) -> Result<Box<dyn FoldedChangeWriter>> {
        if task != STREAM_APP {
            return Err(Error::new(
                ErrorKind::Config,
                format!("a Delta target takes changes from its job's stream only, not from task {task}"),
            )
            .on(Side::Target)
            .hint("copy the table again with `sluice run --restart`"));
        }
        Ok(Box::new(changes::DeltaChanges::new(self.lake.clone(), job)))
    }
}
