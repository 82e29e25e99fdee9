//! Tables without a key to resume by (no primary key, no unique NOT NULL key): each is one split,
//! read whole in one pass inside one consistent snapshot. A read cut short cannot resume, so the
//! split is copied again from its start and the runner replaces what the earlier attempt wrote
//! (`Split::whole`, `TableWriter::replace_all`).
//!
//! The snapshot's binlog position (MariaDB's `binlog_snapshot_file` and `_position`, set by
//! `START TRANSACTION WITH CONSISTENT SNAPSHOT`) is every batch's position: a `snapshot+cdc`
//! stream applies the table's changes only from there, because the copy holds exactly the
//! transactions before it. That is how a keyless table, whose rows a replay could not recognise,
//! streams without a duplicate.

use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use serde::{Deserialize, Serialize};
use sluice_core::change::{Batch, Position};
use sluice_core::connector::Reader;
use sluice_core::{Error, ErrorKind, Result, Side, TableSchema};
use tokio::sync::mpsc;

use super::decoded::DecodedRows;
use super::mysql_error;
use super::quote;
use super::tables::qualified;

/// Where a whole-table read stands: rows read so far, and the binlog position of its snapshot
/// (`file`, `position`, as in a source log position, so `ChangeSource::reached` compares it) when the
/// server reports one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRead {
    pub rows: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
}

/// Begins the transaction whose snapshot a read shares.
pub(super) const START_SNAPSHOT: &str = "START TRANSACTION WITH CONSISTENT SNAPSHOT";

/// Where in the binlog the open consistent snapshot stands: MariaDB says; MySQL has no such
/// status.
pub(super) const SNAPSHOT_STATUS: &str = "SHOW STATUS LIKE 'binlog_snapshot_%'";

/// The binlog file and position of `SNAPSHOT_STATUS`'s rows, when the server gave both.
pub(super) fn snapshot_position(status: &[(String, String)]) -> Option<(String, u64)> {
    let value = |name: &str| {
        status.iter().find(|(variable, _)| variable.eq_ignore_ascii_case(name)).map(|(_, value)| value.clone())
    };
    let file = value("binlog_snapshot_file").filter(|file| !file.is_empty())?;
    let position = value("binlog_snapshot_position")?.parse().ok()?;
    Some((file, position))
}

/// Reads a table in one query, streamed in batches by a task of its own; the channel's bound
/// (one batch waiting) is the backpressure.
pub(super) struct KeylessReader {
    batches: mpsc::Receiver<Result<Batch>>,
    task: tokio::task::JoinHandle<()>,
}

impl KeylessReader {
    /// Starts the read. With `position_needed` (a job that streams), a server that reports no
    /// snapshot position fails it.
    pub(super) fn start(
        connection: Conn,
        server: String,
        table: Arc<TableSchema>,
        batch_rows: usize,
        position_needed: bool,
    ) -> KeylessReader {
        let (sender, batches) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            let failed = sender.clone();
            let read = read_table(connection, &server, &table, batch_rows.max(1), position_needed, &sender).await;
            if let Err(error) = read {
                let _ = failed.send(Err(error)).await;
            }
        });
        KeylessReader { batches, task }
    }
}

impl Drop for KeylessReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl Reader for KeylessReader {
    async fn next(&mut self) -> Result<Option<Batch>> {
        self.batches.recv().await.transpose()
    }
}

async fn read_table(
    mut connection: Conn,
    server: &str,
    table: &Arc<TableSchema>,
    batch_rows: usize,
    position_needed: bool,
    batches: &mpsc::Sender<Result<Batch>>,
) -> Result<()> {
    let error = |doing: &str| {
        let doing = format!("{doing} of table {} (read whole: it has no key)", table.name);
        move |error| mysql_error(error, Side::Source, server, &doing)
    };
    connection
        .query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .await
        .map_err(error("set the isolation level"))?;
    connection.query_drop(START_SNAPSHOT).await.map_err(error("begin the snapshot"))?;
    let status: Vec<(String, String)> =
        connection.query(SNAPSHOT_STATUS).await.map_err(error("read the snapshot position"))?;
    let (file, position) = snapshot_position(&status).unzip();
    if position_needed && position.is_none() {
        return Err(no_snapshot_position(&[table.name.to_string()]));
    }
    let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
    let sql = format!("SELECT {} FROM {}", columns.join(", "), qualified(&table.name));
    let mut result = connection.exec_iter(sql, ()).await.map_err(error("read"))?;
    let mut read = 0u64;
    let mut sent = false;
    let mut rows = DecodedRows::new(table, batch_rows);
    loop {
        let row = result.next().await.map_err(error("read"))?;
        let end = row.is_none();
        if let Some(row) = row {
            rows.push(&mut row.unwrap());
        }
        // An empty table still sends one (empty) batch: its position says where the copy stood.
        if rows.count == batch_rows || (end && (rows.count > 0 || !sent)) {
            let full = std::mem::replace(&mut rows, DecodedRows::new(table, batch_rows));
            read += full.count as u64;
            let at = Position::of(&SnapshotRead { rows: read, file: file.clone(), position });
            let mut batch = Batch::counted(full.changes, at, full.bytes);
            batch.rejected = full.rejected;
            if batches.send(Ok(batch)).await.is_err() {
                return Ok(());
            }
            sent = true;
        }
        if end {
            break;
        }
    }
    drop(result);
    connection.query_drop("COMMIT").await.map_err(error("end the snapshot"))
}

/// The error for keyless tables a `snapshot+cdc` job cannot copy at a known binlog position.
pub(super) fn no_snapshot_position(tables: &[String]) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "{} {} no primary key and no unique NOT NULL key: in snapshot+cdc such a table is copied at the binlog position of a consistent snapshot, which only MariaDB reports (binlog_snapshot_position)",
            tables.join(", "),
            if tables.len() == 1 { "has" } else { "have" }
        ),
    )
    .on(Side::Source)
    .hint("add a primary key to each, or exclude them with \"!name\" in source.tables and copy them with a snapshot job")
}

/// The error for keyless tables whose engine keeps no consistent snapshot (MyISAM, Aria), which
/// a `snapshot+cdc` job copies at a snapshot's position.
pub(super) fn not_transactional(tables: &[String]) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "{} {} no primary key and a storage engine without consistent snapshots: in snapshot+cdc such a table cannot be copied at a known binlog position",
            tables.join(", "),
            if tables.len() == 1 { "has" } else { "have" }
        ),
    )
    .on(Side::Source)
    .hint("convert them to InnoDB or add a primary key, or exclude them with \"!name\" in source.tables and copy them with a snapshot job")
}
