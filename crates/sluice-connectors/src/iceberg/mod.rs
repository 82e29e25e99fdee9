//! Apache Iceberg tables as a target (`type: iceberg`, feature `iceberg`): tables in a SQL
//! catalog (`catalog.rs`), their files under `warehouse`, readable by any Iceberg reader.
//!
//! - A copy writes data files and appends them with its checkpoint (`writer.rs`).
//! - The change stream merges each group by key into the tables it touches, copy-on-write
//!   (`crate::lake::keys` finds the rows; `changes.rs` writes the files again), so every reader
//!   reads it, equality deletes or not; the group's tables move together in one catalog commit,
//!   with the stream's checkpoint in each.
//! - A `snapshot+cdc` copy is hidden until the stream passes its end (`sluice_core::hidden`):
//!   a table of its own name in the catalog, given the table's name by the group's commit.
//! - A checkpoint is a property of the table's metadata file, so a commit and its position are
//!   one step; each snapshot's summary names the job, the task and the checkpoint too.
//!   Snapshots are expired as commits go: the last 100 are kept, and those younger than a day.
//!
//! Only the Iceberg format is the `iceberg` crate's (metadata, schemas, manifests and their
//! lists, snapshots, file IO); the data files, the key merge and the catalog are Sluice's
//! (ARCHITECTURE.md says why).

mod catalog;
mod changes;
pub(crate) mod connector;
mod files;
mod partition;
mod read_back;
mod table;
mod types;
mod writer;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use iceberg::io::FileIO;
use sluice_core::connector::{
    CheckItem, Checkpoint, Fence, FoldedChangeSink, FoldedChangeWriter, Sink, TableTasks, TableWriter,
};
use sluice_core::names::HIDDEN_PREFIX;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use catalog::{Commit, Pointer, SqlCatalog};
use table::{FileChanges, IcebergTable};

/// How many times a commit is tried again after another writer moved one of its tables.
const COMMIT_TRIES: usize = 50;

/// The target's options.
#[derive(Debug, Clone)]
pub(crate) struct IcebergOptions {
    pub catalog: SqlCatalog,
    pub warehouse: PathBuf,
    pub namespace: Option<String>,
    pub create_tables: bool,
    pub partition_by: crate::lake::PartitionBy,
    /// A group of the change stream commits this long after its first transaction...
    pub commit_interval: Duration,
    /// ...or once it holds this many row changes.
    pub commit_rows: u64,
    /// Data files are cut at about this size (and a copy commits each one).
    pub file_bytes: u64,
}

/// The table property holding a task's checkpoint.
fn checkpoint_property(job: &str, task: &str) -> String {
    format!("sluice.checkpoint.{job}.{task}")
}

/// What a stream's group records in each table it changes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct StreamMark {
    group: i64,
    checkpoint: Checkpoint,
}

/// What every writer of one target shares: its options, file IO and the cluster task's fence.
#[derive(Debug)]
struct Warehouse {
    options: IcebergOptions,
    io: FileIO,
    fence: Option<Fence>,
}

impl Warehouse {
    fn catalog(&self) -> &SqlCatalog {
        &self.options.catalog
    }

    /// Moves catalog pointers together (with the stream's `mark`, if given), checking the job's
    /// fence when the task has one.
    async fn commit(&self, job: &str, pointers: &[Pointer], mark: Option<&str>) -> Result<()> {
        let fence = self.fence.as_ref().map(|fence| (job, fence));
        self.catalog().commit(pointers, Commit { fence, mark: mark.map(|mark| (job, mark)) }).await
    }

    /// The partition fields `partition_by` gives a table (by its own name, a hidden copy's too).
    fn partition_fields(&self, table: &TableSchema) -> Result<Vec<partition::PartitionField>> {
        let own = TableName {
            namespace: table.name.namespace.clone(),
            name: sluice_core::names::own_name(&table.name.name).to_owned(),
        };
        self.options
            .partition_by
            .of(&own.to_string())
            .iter()
            .map(|entry| {
                partition::parse(entry)
                    .map_err(|problem| Error::config(format!("target.partition_by: {problem}")).on(Side::Target))
            })
            .collect()
    }

    /// The table at the catalog's current metadata file, if it has it.
    async fn open(&self, name: &TableName) -> Result<Option<IcebergTable>> {
        match self.catalog().metadata_of(name).await? {
            Some(metadata) => Ok(Some(IcebergTable::load(&self.io, name, &metadata).await?)),
            None => Ok(None),
        }
    }

    /// The table of `schema`, created when missing (and the job may create tables).
    async fn ensure(&self, schema: &TableSchema) -> Result<IcebergTable> {
        if let Some(table) = self.open(&schema.name).await? {
            return Ok(table);
        }
        if !self.options.create_tables {
            return Err(Error::new(
                ErrorKind::Schema,
                format!("Iceberg table {} is not in catalog {}", schema.name, self.catalog().name),
            )
            .on(Side::Target)
            .hint("create it, or set target.create_tables: true"));
        }
        // A location of its own, so a table made again never shares files with the one before;
        // named after the table (a hidden copy's, after the table it becomes).
        let own = sluice_core::names::own_name(&schema.name.name);
        let location = self
            .options
            .warehouse
            .join(catalog::namespace_of(&schema.name))
            .join(files::unique_name(&format!("{own}-"), ""));
        let partitions = self.partition_fields(schema)?;
        let table = IcebergTable::create(&self.io, schema, &location.to_string_lossy(), &partitions).await?;
        let created = Pointer::Create { table: schema.name.clone(), metadata: table.metadata_file.clone() };
        // Unfenced: creating a table that is missing changes no row, and an existing one stays.
        match self.catalog().commit(&[created], Commit::default()).await {
            Ok(()) => Ok(table),
            // Another writer of the same table created it first.
            Err(error) if error.kind() == ErrorKind::Conflict => {
                let _ = std::fs::remove_dir_all(&location);
                self.open(&schema.name).await?.ok_or(error)
            }
            Err(error) => Err(error),
        }
    }

    /// Commits `changes` to the table `name`, again on the table as it is then when another
    /// writer moved it first (appends and removals of one's own files commute).
    async fn commit_files(&self, job: &str, name: &TableName, changes: &FileChanges) -> Result<IcebergTable> {
        let mut last = None;
        for _ in 0..COMMIT_TRIES {
            let table = self.open(name).await?.ok_or_else(|| {
                Error::new(ErrorKind::State, format!("Iceberg table {name} left catalog {}", self.catalog().name))
                    .on(Side::Target)
                    .hint("run the job with --restart to create and copy its tables again")
            })?;
            let staged = table.stage(&self.io, changes, None).await?;
            let pointer = Pointer::Move {
                table: name.clone(),
                from: table.metadata_file.clone(),
                to: staged.metadata_file.clone(),
            };
            match self.commit(job, &[pointer], None).await {
                Ok(()) => return Ok(staged),
                Err(error) if error.kind() == ErrorKind::Conflict => last = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last.expect("tried at least once"))
    }
}

/// Writes tables into Iceberg tables of one catalog.
#[derive(Debug)]
pub struct IcebergSink {
    warehouse: Arc<Warehouse>,
}

impl IcebergSink {
    pub(crate) fn new(options: IcebergOptions, fence: Option<Fence>) -> IcebergSink {
        IcebergSink { warehouse: Arc::new(Warehouse { options, io: FileIO::new_with_fs(), fence }) }
    }

    /// A table of the target read back for verification: its current snapshot's files.
    pub(crate) fn read_back(&self, table: &Arc<TableSchema>) -> crate::columnar::read_back::ColumnarTable {
        let listing = read_back::CurrentSnapshot { warehouse: self.warehouse.clone(), name: table.name.clone() };
        crate::columnar::read_back::ColumnarTable::new(table, listing)
    }
}

#[async_trait]
impl Sink for IcebergSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let mut items = crate::file::check_directory(&self.warehouse.options.warehouse)?;
        items[0].what = "Iceberg warehouse directory".into();
        let catalog = self.warehouse.catalog();
        items.push(match catalog.tables().await {
            Ok(tables) => CheckItem {
                what: "Iceberg catalog".into(),
                ok: true,
                detail: format!("{} (catalog {}): {} tables", catalog.shown(), catalog.name, tables.len()),
            },
            Err(error) => CheckItem { what: "Iceberg catalog".into(), ok: false, detail: error.to_string() },
        });
        Ok(items)
    }

    fn target_name(&self, source: &TableName) -> TableName {
        TableName {
            namespace: self.warehouse.options.namespace.clone().or_else(|| source.namespace.clone()),
            name: source.name.clone(),
        }
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables
            .iter()
            .map(|table| match types::iceberg_schema(table) {
                Ok(schema) => {
                    let columns: Vec<String> = schema
                        .as_struct()
                        .fields()
                        .iter()
                        .map(|field| {
                            format!(
                                "  {} {}{}",
                                field.name,
                                field.field_type,
                                if field.required { " NOT NULL" } else { "" }
                            )
                        })
                        .collect();
                    format!(
                        "-- Iceberg table {} in catalog {}\n{}",
                        table.name,
                        self.warehouse.catalog().name,
                        columns.join(",\n")
                    )
                }
                Err(error) => format!("-- {error}"),
            })
            .collect()
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        // Every problem at once: the types and partition fields first, then the tables.
        let problems = tables.iter().filter_map(|table| {
            let checked = types::iceberg_schema(table).and_then(|schema| {
                partition::spec(&table.name, &schema, &self.warehouse.partition_fields(table)?).map(|_| ())
            });
            checked.err()
        });
        crate::lake::every_problem(problems.collect())?;
        for table in tables {
            self.warehouse.ensure(table).await?;
        }
        Ok(())
    }

    /// Drops the tables (their hidden copies too) from the catalog and deletes their files, and
    /// forgets the job's stream.
    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        self.warehouse.catalog().forget_stream(job).await?;
        for table in tables {
            let own = TableName {
                namespace: table.table.namespace.clone(),
                name: sluice_core::names::own_name(&table.table.name).to_owned(),
            };
            let hidden = TableName { namespace: own.namespace.clone(), name: format!("{HIDDEN_PREFIX}{}", own.name) };
            for name in [own, hidden] {
                let Some(found) = self.warehouse.open(&name).await? else { continue };
                self.warehouse.catalog().drop_table(&name).await?;
                match std::fs::remove_dir_all(files::local(found.location())) {
                    Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                        return Err(Error::new(
                            ErrorKind::Write,
                            format!("remove Iceberg table {name} at {}: {error}", found.location()),
                        )
                        .on(Side::Target));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    async fn claim(&self, job: &str) -> Result<()> {
        match &self.warehouse.fence {
            Some(fence) => self.warehouse.catalog().claim(job, fence).await,
            None => Ok(()),
        }
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        Ok(Box::new(writer::CopyWriter::new(self.warehouse.clone(), job, task, table)))
    }

    sluice_core::capabilities!(folded_changes: FoldedChangeSink);
}

#[async_trait]
impl FoldedChangeSink for IcebergSink {
    fn hides_copies(&self) -> bool {
        true
    }

    async fn existing_tables(&self, tables: &[TableName]) -> Result<Vec<TableName>> {
        let mut existing = Vec::new();
        for name in tables {
            if self.warehouse.catalog().metadata_of(name).await?.is_some() {
                existing.push(name.clone());
            }
        }
        Ok(existing)
    }

    /// The change writer of the job's stream, the only task whose changes an Iceberg target
    /// takes: another task's (a verification's repair) is refused.
    async fn open_folded(&self, job: &str, task: &str) -> Result<Box<dyn FoldedChangeWriter>> {
        if task != sluice_core::names::STREAM_TASK {
            return Err(Error::new(
                ErrorKind::Config,
                format!("an Iceberg target takes changes from its job's stream only, not from task {task}"),
            )
            .on(Side::Target)
            .hint("copy the table again with `sluice run --restart`"));
        }
        Ok(Box::new(changes::IcebergChanges::new(self.warehouse.clone(), job)))
    }
}
