//! The writers: a snapshot task's rows (`CopyWriter`, version 0) and a change stream's groups
//! (`ChangeApplier`, each key's last row or tombstone at the group's version), both sent at
//! `commit`, before the checkpoint that covers them.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::change::{key_identity, key_text, Batch, ChangeKind, Rejected, Row};
use sluice_core::connector::{
    ChangeWriter, Checkpoint, CommitCadence, FoldedChangeWriter, Refused, SchemaChange, TableWriter, Updated,
};
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use super::server::quote;
use super::tables::{self, qualified};
use super::types::{Encoder, Features, DELETED_COLUMN, VERSION_COLUMN};
use super::{checkpoints, Shared};

/// The statement that inserts rows of `columns` (and the Sluice columns after them).
fn insert_statement<'a>(table: &TableName, columns: impl Iterator<Item = &'a str>) -> String {
    let mut names: Vec<String> = columns.map(quote).collect();
    names.push(quote(VERSION_COLUMN));
    names.push(quote(DELETED_COLUMN));
    format!("INSERT INTO {} ({}) FORMAT RowBinary", qualified(table), names.join(", "))
}

/// The RowBinary bytes a copy task sends in one INSERT: large enough that a table copied by
/// four tasks makes few parts for the server to merge (5,000,000 sysbench rows: about 30 inserts
/// instead of 1,000), small enough to hold per task.
const COPY_INSERT_BYTES: usize = 32 * 1024 * 1024;

/// Writes one snapshot task's rows.
pub(super) struct CopyWriter {
    shared: Arc<Shared>,
    encoder: Encoder,
    job: String,
    task: String,
    table: Arc<TableSchema>,
    /// The rows staged since the last commit, in RowBinary.
    staged: Vec<u8>,
}

impl CopyWriter {
    pub(super) fn new(
        shared: Arc<Shared>,
        features: Features,
        job: &str,
        task: &str,
        table: Arc<TableSchema>,
    ) -> CopyWriter {
        CopyWriter {
            shared,
            encoder: Encoder::new(features),
            job: job.to_owned(),
            task: task.to_owned(),
            table,
            staged: Vec::new(),
        }
    }
}

#[async_trait]
impl TableWriter for CopyWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.staged.clear();
        let tasks = [self.task.clone()];
        Ok(checkpoints::read(&self.shared.server, &self.job, Some(&tasks)).await?.pop())
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        let mut rejected = Vec::new();
        for change in &batch.changes {
            let ChangeKind::Insert { after } = &change.kind else {
                return Err(Error::new(ErrorKind::Write, "a snapshot writes inserts only").on(Side::Target));
            };
            match self.encoder.values(&self.table, after, &mut self.staged) {
                Ok(()) => Encoder::end(0, false, &mut self.staged),
                Err(reason) => rejected.push(Rejected {
                    table: self.table.name.to_string(),
                    key: key_text(&self.table, after),
                    reason: format!("target: {reason}"),
                    record: None,
                    change: None,
                }),
            }
        }
        Ok(rejected)
    }

    /// Each INSERT is a part the server merges again: the rows go in inserts of about
    /// `COPY_INSERT_BYTES`, not one per batch.
    fn wants_commit(&self) -> bool {
        self.staged.len() >= COPY_INSERT_BYTES
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let shared = &self.shared;
        if !self.staged.is_empty() {
            shared.check_fence(&self.job).await?;
            let columns = self.table.columns.iter().map(|column| column.name.as_str());
            let statement = insert_statement(&self.table.name, columns);
            shared.server.insert(&statement, std::mem::take(&mut self.staged)).await?;
        }
        shared.check_fence(&self.job).await?;
        checkpoints::write(&shared.server, &self.job, shared.epoch(), checkpoint).await
    }

    /// The table is emptied now, not with the next commit: ClickHouse has no transaction to
    /// hold it in. A reader may see the table empty until the split's rows are in again.
    async fn replace_all(&mut self) -> Result<()> {
        self.staged.clear();
        self.shared.check_fence(&self.job).await?;
        tables::truncate(&self.shared.server, &self.table.name).await
    }
}

/// A key's last state in the open group: its row's values, or its tombstone's (in RowBinary, as
/// `Encoder` writes them, the Sluice columns left for the commit).
enum Line {
    Row(Vec<u8>),
    Tombstone(Vec<u8>),
}

/// One table's changes in the open group.
struct Staged {
    table: Arc<TableSchema>,
    /// By key (`key_identity`): each key once, as the group leaves it.
    keyed: HashMap<String, Line>,
    /// The rows inserted into a table without a primary key, but for the Sluice columns.
    appended: Vec<Vec<u8>>,
}

/// Applies a change stream's groups.
pub(super) struct ChangeApplier {
    shared: Arc<Shared>,
    features: Features,
    job: String,
    task: String,
    staged: Vec<Staged>,
}

impl ChangeApplier {
    pub(super) fn new(shared: Arc<Shared>, features: Features, job: &str, task: &str) -> ChangeApplier {
        ChangeApplier { shared, features, job: job.to_owned(), task: task.to_owned(), staged: Vec::new() }
    }

    fn staged(&mut self, table: &TableSchema) -> Result<&mut Staged> {
        let position = match self.staged.iter().position(|staged| staged.table.name == table.name) {
            Some(position) if *self.staged[position].table == *table => position,
            Some(_) => {
                // DDL commits the group before it (`ddl_commits`), so a group holds one schema per table.
                return Err(Error::new(
                    ErrorKind::State,
                    format!("table {}: its schema changed inside a group of changes", table.name),
                )
                .on(Side::Target));
            }
            None => {
                self.staged.push(Staged {
                    table: Arc::new(table.clone()),
                    keyed: HashMap::new(),
                    appended: Vec::new(),
                });
                self.staged.len() - 1
            }
        };
        Ok(&mut self.staged[position])
    }

    /// Sends one table's group at `version`, its rows and tombstones in one INSERT (which
    /// ClickHouse makes visible at once).
    async fn send(&self, staged: &Staged, version: u64) -> Result<()> {
        let table = &staged.table;
        let mut lines = Vec::new();
        for line in staged.keyed.values() {
            let (values, deleted) = match line {
                Line::Row(values) => (values, false),
                Line::Tombstone(values) => (values, true),
            };
            lines.extend_from_slice(values);
            Encoder::end(version, deleted, &mut lines);
        }
        for values in &staged.appended {
            lines.extend_from_slice(values);
            Encoder::end(version, false, &mut lines);
        }
        if lines.is_empty() {
            return Ok(());
        }
        let columns = table.columns.iter().map(|column| column.name.as_str());
        self.shared.server.insert(&insert_statement(&table.name, columns), lines).await
    }
}

fn keyless(table: &TableSchema, what: &str) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!("table {} has no primary key: the ClickHouse target cannot {what} its rows by key", table.name),
    )
    .on(Side::Target)
    .hint("give the source table a primary key, or leave it out of the job's change stream (`tables:`)")
}

#[async_trait]
impl ChangeWriter for ChangeApplier {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.staged.clear();
        let tasks = [self.task.clone()];
        Ok(checkpoints::read(&self.shared.server, &self.job, Some(&tasks)).await?.pop())
    }

    /// Sends the group's rows with their version, the checkpoint's count of row changes applied
    /// (module documentation), then the checkpoint.
    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        self.shared.check_fence(&self.job).await?;
        for table in &staged {
            self.send(table, checkpoint.rows_written).await?;
        }
        self.shared.check_fence(&self.job).await?;
        checkpoints::write(&self.shared.server, &self.job, self.shared.epoch(), checkpoint).await
    }

    fn cadence(&self) -> Option<CommitCadence> {
        Some(CommitCadence { every: self.shared.options.commit_interval, rows: self.shared.options.commit_rows })
    }

    async fn apply_schema_change(&mut self, change: &SchemaChange) -> Result<()> {
        self.shared.check_fence(&self.job).await?;
        let server = &self.shared.server;
        match change {
            SchemaChange::Create(table) => tables::ensure(server, table, self.features, true).await,
            SchemaChange::Drop(name) => tables::drop(server, name).await,
            SchemaChange::Rename { from, to } => tables::rename(server, from, to).await,
            SchemaChange::Truncate(name) => tables::truncate(server, name).await,
            SchemaChange::Alter { table, renamed, retyped } => {
                tables::alter(server, table, renamed, retyped, self.features).await
            }
        }
    }
}

#[async_trait]
impl FoldedChangeWriter for ChangeApplier {
    /// A group's rows go before its checkpoint: a crash or a fenced worker's late send leaves rows
    /// of a group the next run folds again from the checkpoint, and each key it leaves absent
    /// needs its tombstone at the later version.
    fn writes_outlive_failed_commits(&self) -> bool {
        true
    }

    async fn delete(&mut self, table: &TableSchema, keys: &[Row], _expect_all: bool) -> Result<()> {
        if table.primary_key.is_empty() {
            return Err(keyless(table, "delete"));
        }
        let encoder = Encoder::new(self.features);
        let staged = self.staged(table)?;
        for key in keys {
            let mut line = Vec::new();
            encoder.tombstone(table, key, &mut line).map_err(|reason| {
                Error::new(ErrorKind::Data, format!("table {}: a deleted key cannot be written: {reason}", table.name))
                    .on(Side::Target)
            })?;
            let identity = key.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n");
            staged.keyed.insert(identity, Line::Tombstone(line));
        }
        Ok(())
    }

    /// Stages the rows; one with a value its column cannot hold is left out and returned.
    async fn insert(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Vec<Refused>> {
        let encoder = Encoder::new(self.features);
        let staged = self.staged(table)?;
        let mut refused = Vec::new();
        for (index, row) in rows.iter().enumerate() {
            let mut line = Vec::new();
            if let Err(reason) = encoder.values(table, row, &mut line) {
                refused.push(Refused { index, reason });
                continue;
            }
            if table.primary_key.is_empty() {
                staged.appended.push(line);
            } else {
                staged.keyed.insert(key_identity(table, row), Line::Row(line));
            }
        }
        Ok(refused)
    }

    /// Called only for rows keeping values the source did not send: a ClickHouse row is written
    /// whole, so they cannot be.
    async fn update(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Updated> {
        Err(Error::new(
            ErrorKind::Write,
            format!(
                "table {}: {} updated row(s) keep values the source's log did not carry; a ClickHouse row is written whole",
                table.name,
                rows.len()
            ),
        )
        .on(Side::Target)
        .hint("make the source log whole rows (PostgreSQL: ALTER TABLE ... REPLICA IDENTITY FULL), then reset the job"))
    }

    fn ddl_commits(&self) -> bool {
        true
    }

    async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()> {
        let names: Vec<String> = tables.iter().map(|(hidden, _)| hidden.to_string()).collect();
        Err(Error::new(
            ErrorKind::State,
            format!("the ClickHouse target writes no hidden copies, yet was asked to publish {}", names.join(", ")),
        )
        .on(Side::Target))
    }
}
