//! `sluice.checkpoints` and `sluice.fences` in MySQL: reading a task's checkpoint and committing a
//! transaction together with it, fenced for cluster tasks. Shared by the snapshot writer and the
//! change writer.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use sluice_core::change::Position;
use sluice_core::connector::{Checkpoint, Fence};
use sluice_core::{Error, ErrorKind, Result, Side};

use super::mysql_error;

/// A task's checkpoint row in `sluice.checkpoints`, if it has one.
pub(super) async fn read_checkpoint(
    connection: &mut Conn,
    server: &str,
    job: &str,
    task: &str,
) -> Result<Option<Checkpoint>> {
    let row: Option<(Option<String>, bool, u64)> = connection
        .exec_first(
            "SELECT position, done, rows_written FROM sluice.checkpoints WHERE job = ? AND task = ?",
            (job, task),
        )
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, "read the checkpoint"))?;
    let Some((position, done, rows_written)) = row else { return Ok(None) };
    let position = position.map(|text| serde_json::from_str(&text).map(Position)).transpose().map_err(|error| {
        Error::new(ErrorKind::Write, format!("checkpoint of task {task} is corrupt: {error}")).on(Side::Target)
    })?;
    Ok(Some(Checkpoint { task: task.to_owned(), position, done, rows_written }))
}

/// The table of cluster fences: per job and cluster task, the newest epoch that claimed it.
pub(super) const FENCE_TABLE: &str = "CREATE DATABASE IF NOT EXISTS sluice CHARACTER SET utf8mb4;
    CREATE TABLE IF NOT EXISTS sluice.fences (job VARCHAR(128) NOT NULL, task VARCHAR(512) NOT NULL,
        epoch BIGINT UNSIGNED NOT NULL, PRIMARY KEY (job, task))";

/// Writes the checkpoint row and commits the open transaction with it. With a fence, the
/// commit happens only while the target holds the fence's epoch (the row is share-locked until
/// the commit, so a newer claim waits for it and then reads what it committed).
pub(super) async fn commit_with_checkpoint(
    connection: &mut Conn,
    server: &str,
    job: &str,
    fence: Option<&Fence>,
    checkpoint: &Checkpoint,
) -> Result<()> {
    if let Some(fence) = fence {
        let held: Option<u64> = connection
            .exec_first(
                "SELECT epoch FROM sluice.fences WHERE job = ? AND task = ? LOCK IN SHARE MODE",
                (job, &fence.task),
            )
            .await
            .map_err(|error| mysql_error(error, Side::Target, server, "check the fence"))?;
        if held != Some(fence.epoch) {
            let _ = connection.query_drop("ROLLBACK").await;
            return Err(fence.moved(job, held.unwrap_or_default()));
        }
    }
    let position = checkpoint.position.as_ref().map(|position| position.0.to_string());
    let saved = connection
        .exec_drop(
            "INSERT INTO sluice.checkpoints (job, task, position, done, rows_written) VALUES (?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE position = VALUES(position), done = VALUES(done),
                 rows_written = VALUES(rows_written), updated_at = CURRENT_TIMESTAMP(6)",
            (job, &checkpoint.task, position, checkpoint.done, checkpoint.rows_written),
        )
        .await;
    let committed = match saved {
        Ok(()) => connection.query_drop("COMMIT").await,
        Err(error) => Err(error),
    };
    committed.map_err(|error| mysql_error(error, Side::Target, server, "commit"))
}
