//! ClickHouse as a target, over its HTTP interface.
//!
//! Each source table becomes a `ReplacingMergeTree` ordered by its primary key, with two columns
//! of Sluice's after its own: `_sluice_version`, which orders a key's rows (the largest is the
//! key's row), and `_sluice_deleted`, set on the tombstone a deleted key gets. A `FINAL` read
//! shows each key once; the view `<table>_live` shows the rows the source has (tombstones left
//! out). A snapshot's rows have version 0; a change stream's group of transactions is written
//! with its checkpoint's count of row changes applied so far, which grows with every group and
//! is the same for the same source position when a group is applied again after a crash. So a
//! replayed group's rows collapse with their first copy (same key, same version, same values)
//! and a key's newest row wins, whatever order the rows reached the server in.
//!
//! ClickHouse has no transactions: a commit sends the rows, then the checkpoint (`checkpoints.rs`).
//! A crash between the two leaves rows the checkpoint does not cover, which the next run writes
//! again at the same versions: a `FINAL` reader sees each change once. On a cluster each commit
//! first checks the task's claim (`checkpoints::Fencing`); a stalled owner's late rows are
//! rows its successor writes again at the same versions. Decision 0071 says why.

pub mod checkpoints;
pub mod connector;
mod read_back;
pub mod server;
pub mod tables;
pub mod types;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_core::connector::{
    Binding, CheckItem, Checkpoint, Fence, FoldedChangeSink, FoldedChangeWriter, Sink, TableTasks, TableWriter,
};
use sluice_core::secret::Secret;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};
use tokio::sync::OnceCell;

use checkpoints::Fencing;
use server::{Server, Version};
use types::Features;

/// The options of a ClickHouse target.
#[derive(Debug, Clone)]
pub struct ClickHouseOptions {
    pub url: Secret,
    /// The URL as messages show it.
    pub shown: String,
    pub create_tables: bool,
    /// The database every table lands in; by default the source table's own namespace.
    pub namespace: Option<String>,
    pub commit_interval: Duration,
    pub commit_rows: u64,
}

/// The oldest server the types are chosen for until the server is asked (`sluice schema`
/// before the first run).
const OLDEST: Version = Version { major: 18, minor: 16 };

/// What the sink and its writers share: the server and what it can hold.
#[derive(Debug)]
pub(crate) struct Shared {
    server: Server,
    options: ClickHouseOptions,
    features: OnceCell<Features>,
    /// The cluster task's claim, when the sink is built for one.
    fencing: Option<Fencing>,
}

impl Shared {
    /// Fails once a newer owner claimed the cluster task (`Fencing::check`).
    async fn check_fence(&self, job: &str) -> Result<()> {
        match &self.fencing {
            Some(fencing) => fencing.check(&self.server, job).await,
            None => Ok(()),
        }
    }

    /// The epoch checkpoints are written under: the claim's, 0 off a cluster.
    fn epoch(&self) -> u64 {
        self.fencing.as_ref().map_or(0, |fencing| fencing.fence.epoch)
    }

    /// The server's types, asked once.
    async fn features(&self) -> Result<Features> {
        self.features
            .get_or_try_init(|| async {
                let answer = self.server.query("SELECT version()").await?;
                let version = Version::parse(&answer).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Read,
                        format!("ClickHouse at {} answered `{}` for its version", self.server.shown(), answer.trim()),
                    )
                    .on(Side::Target)
                })?;
                Ok(Features::of(version))
            })
            .await
            .copied()
    }
}

/// A ClickHouse target.
#[derive(Debug)]
pub struct ClickHouseSink {
    shared: Arc<Shared>,
}

impl ClickHouseSink {
    /// A sink; with a fence, one whose commits a newer claim of the cluster task refuses.
    pub fn new(options: ClickHouseOptions, fence: Option<Fence>) -> Result<ClickHouseSink> {
        let server = Server::new(options.url.expose(), options.shown.clone())?;
        let fencing = fence.map(|fence| Fencing { fence });
        Ok(ClickHouseSink { shared: Arc::new(Shared { server, options, features: OnceCell::new(), fencing }) })
    }
}

#[async_trait]
impl Sink for ClickHouseSink {
    /// Reads only: the server's version, whether the user may write, and whether the
    /// checkpoints' table is there yet (the first run makes it).
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let server = &self.shared.server;
        let answer = server
            .query(
                "SELECT version(), (SELECT value FROM system.settings WHERE name = 'readonly'), \
                 (SELECT count() FROM system.tables WHERE database = 'sluice' AND name = 'checkpoints') \
                 FORMAT TabSeparated",
            )
            .await?;
        let fields: Vec<&str> = answer.trim_end().split('\t').collect();
        let [version, readonly, checkpoints] = fields.as_slice() else {
            return Err(Error::new(
                ErrorKind::Write,
                format!("ClickHouse at {}: unexpected answer `{answer}` to the version query", server.shown()),
            )
            .on(Side::Target));
        };
        let connection = CheckItem {
            what: "target clickhouse".into(),
            ok: true,
            detail: format!("ClickHouse {version} at {}", server.shown()),
        };
        let (ok, detail) = match (*readonly, *checkpoints) {
            ("0", "0") => (
                true,
                "the user may write; the first run creates the database `sluice` and its tables checkpoints and claims"
                    .to_owned(),
            ),
            ("0", _) => (true, "the user may write; sluice.checkpoints is there".to_owned()),
            (readonly, _) => (
                false,
                format!(
                    "the user is read-only (readonly = {readonly}): Sluice creates tables and inserts rows and \
                     checkpoints; give the user a profile with readonly = 0"
                ),
            ),
        };
        let writes = CheckItem { what: "target clickhouse writes".into(), ok, detail };
        Ok(vec![connection, writes])
    }

    fn target_name(&self, source: &TableName) -> TableName {
        let namespace = self.shared.options.namespace.as_deref().or(source.namespace.as_deref()).unwrap_or("default");
        TableName::new(Some(namespace), &source.name)
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        let features = self.shared.features.get().copied().unwrap_or(Features::of(OLDEST));
        tables.iter().flat_map(|table| tables::create_statements(table, features)).collect()
    }

    /// Makes or checks every table, and reports every table that fails at once.
    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        let features = self.shared.features().await?;
        checkpoints::prepare(&self.shared.server).await?;
        let mut failed = Vec::new();
        for table in tables {
            if let Err(error) =
                tables::ensure(&self.shared.server, table, features, self.shared.options.create_tables).await
            {
                failed.push(error);
            }
        }
        match failed.len() {
            0 => Ok(()),
            1 => Err(failed.remove(0)),
            count => {
                let listed: Vec<String> = failed.iter().map(ToString::to_string).collect();
                Err(Error::new(ErrorKind::Schema, format!("{count} tables cannot be written: {}", listed.join("; ")))
                    .on(Side::Target))
            }
        }
    }

    async fn table_columns(&self, table: &TableName) -> Result<Option<Vec<String>>> {
        let columns = tables::columns(&self.shared.server, table).await?;
        Ok(Some(
            columns
                .into_iter()
                .map(|(name, _)| name)
                .filter(|name| name != types::VERSION_COLUMN && name != types::DELETED_COLUMN)
                .collect(),
        ))
    }

    /// ClickHouse keeps no table identity Sluice can read on every version: a table is judged
    /// by its rows alone (one emptied or created again has its checkpoints forgotten, so its
    /// splits are copied again).
    async fn verify_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<Vec<(TableName, Binding)>> {
        let server = &self.shared.server;
        checkpoints::prepare(server).await?;
        let mut judged = Vec::with_capacity(tables.len());
        for table in tables {
            if tables::columns(server, &table.table).await?.is_empty() {
                continue;
            }
            let claimed: u64 = checkpoints::read(server, job, Some(&table.tasks))
                .await?
                .iter()
                .map(|checkpoint| checkpoint.rows_written)
                .sum();
            let has_rows = server
                .query(&format!("SELECT count() FROM (SELECT 1 FROM {} LIMIT 1)", tables::qualified(&table.table)))
                .await?
                .trim()
                != "0";
            judged.push((table.table.clone(), Binding::judge(claimed, None, None, has_rows)));
        }
        Ok(judged)
    }

    async fn forget_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let tasks: Vec<String> = tables.iter().flat_map(|table| table.tasks.iter().cloned()).collect();
        checkpoints::forget_tasks(&self.shared.server, job, &tasks).await
    }

    async fn claim(&self, job: &str) -> Result<()> {
        let Some(fencing) = &self.shared.fencing else { return Ok(()) };
        checkpoints::prepare(&self.shared.server).await?;
        fencing.claim(&self.shared.server, job).await
    }

    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        checkpoints::prepare(&self.shared.server).await?;
        for table in tables {
            tables::truncate(&self.shared.server, &table.table).await?;
        }
        checkpoints::forget(&self.shared.server, job).await
    }

    async fn checkpoints(&self, job: &str, tasks: &[String]) -> Result<Vec<Checkpoint>> {
        checkpoints::prepare(&self.shared.server).await?;
        checkpoints::read(&self.shared.server, job, Some(tasks)).await
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        let features = self.shared.features().await?;
        Ok(Box::new(writer::CopyWriter::new(self.shared.clone(), features, job, task, table)))
    }

    fn folded_changes(&self) -> Option<&dyn FoldedChangeSink> {
        Some(self)
    }
}

#[async_trait]
impl FoldedChangeSink for ClickHouseSink {
    async fn open_folded(&self, job: &str, task: &str) -> Result<Box<dyn FoldedChangeWriter>> {
        let features = self.shared.features().await?;
        checkpoints::prepare(&self.shared.server).await?;
        Ok(Box::new(writer::ChangeApplier::new(self.shared.clone(), features, job, task)))
    }
}
