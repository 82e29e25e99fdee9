//! `sluice.checkpoints` and `sluice.fences` in MySQL: reading a task's checkpoint and committing a
//! transaction together with it, fenced for cluster tasks. Shared by the snapshot writer and the
//! change writer.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use sluice_core::change::Position;
use sluice_core::connector::{Binding, Checkpoint, Fence};
use sluice_core::{Error, ErrorKind, Result, Side, TableName};

use super::mysql_error;

/// A task's checkpoint row in `sluice.checkpoints`, if it has one.
pub(super) async fn read_checkpoint(
    connection: &mut Conn,
    server: &str,
    job: &str,
    task: &str,
) -> Result<Option<Checkpoint>> {
    let row: Option<(Option<String>, bool, u64)> = match connection
        .exec_first(
            "SELECT position, done, rows_written FROM sluice.checkpoints WHERE job = ? AND task = ?",
            (job, task),
        )
        .await
    {
        Ok(row) => row,
        // No checkpoint table yet (a target no job has prepared): no checkpoint.
        Err(mysql_async::Error::Server(error)) if error.code == 1146 => None,
        Err(error) => return Err(mysql_error(error, Side::Target, server, "read the checkpoint")),
    };
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

/// The sessions of fenced tasks, so a task's next owner can end those of its older owners
/// (`end_older_sessions`). A connection id is known only while its server runs, so each row
/// also has the server's start (to the second).
pub(super) const SESSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS sluice.sessions (job VARCHAR(128) NOT NULL,
    task VARCHAR(512) NOT NULL, epoch BIGINT UNSIGNED NOT NULL, connection BIGINT UNSIGNED NOT NULL,
    server_started BIGINT NOT NULL, PRIMARY KEY (job, task, connection)) DEFAULT CHARSET = utf8mb4";

/// When the server started, in Unix seconds (its clock less its uptime).
async fn server_started(connection: &mut Conn, server: &str) -> Result<i64> {
    let error = |error| mysql_error(error, Side::Target, server, "read the server's uptime");
    let uptime: Option<(String, String)> =
        connection.query_first("SHOW GLOBAL STATUS LIKE 'Uptime'").await.map_err(error)?;
    let now: Option<i64> = connection.query_first("SELECT UNIX_TIMESTAMP()").await.map_err(error)?;
    let uptime = uptime.and_then(|(_, value)| value.parse::<i64>().ok()).unwrap_or_default();
    Ok(now.unwrap_or_default() - uptime)
}

/// Records a fenced task's connection, for `end_older_sessions`.
pub(super) async fn register_session(connection: &mut Conn, server: &str, job: &str, fence: &Fence) -> Result<()> {
    let started = server_started(connection, server).await?;
    connection
        .exec_drop(
            "INSERT INTO sluice.sessions (job, task, epoch, connection, server_started) VALUES (?, ?, ?, CONNECTION_ID(), ?)
             ON DUPLICATE KEY UPDATE epoch = VALUES(epoch), server_started = VALUES(server_started)",
            (job, &fence.task, fence.epoch, started),
        )
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, "record the task's session"))
}

/// Ends the sessions of the task's older epochs (a stalled worker's, even in the middle of a
/// statement or a DDL), so none holds a lock its new owner needs or writes after the claim.
/// A session another user owns without the rights to end it is logged and left to the fences.
pub(super) async fn end_older_sessions(connection: &mut Conn, server: &str, job: &str, fence: &Fence) -> Result<()> {
    let error = |doing: &'static str| move |error| mysql_error(error, Side::Target, server, doing);
    let started = server_started(connection, server).await?;
    let older: Vec<(u64, i64)> = connection
        .exec(
            "SELECT connection, server_started FROM sluice.sessions WHERE job = ? AND task = ? AND epoch < ?",
            (job, &fence.task, fence.epoch),
        )
        .await
        .map_err(error("read the sessions of the task's older owners"))?;
    for (id, server_started) in older {
        // A row from before the server's last start names a connection that is gone.
        if (server_started - started).abs() > 2 {
            continue;
        }
        match connection.query_drop(format!("KILL CONNECTION {id}")).await {
            Ok(()) => log::info!("task {} of job {job}: ended session {id} of an older owner", fence.task),
            // Unknown thread: it ended already.
            Err(mysql_async::Error::Server(server_error)) if server_error.code == 1094 => {}
            Err(kill_error) => log::warn!(
                "task {} of job {job}: could not end session {id} of an older owner: {kill_error}",
                fence.task
            ),
        }
    }
    connection
        .exec_drop(
            "DELETE FROM sluice.sessions WHERE job = ? AND task = ? AND epoch < ?",
            (job, &fence.task, fence.epoch),
        )
        .await
        .map_err(error("forget the sessions of the task's older owners"))
}

/// Fails with `ErrorKind::Fenced` unless the target still holds the fence's epoch: checked
/// before each statement that commits on its own (MySQL DDL), which the commit's fence cannot
/// cover.
pub(super) async fn check_fence(connection: &mut Conn, server: &str, job: &str, fence: Option<&Fence>) -> Result<()> {
    let Some(fence) = fence else { return Ok(()) };
    let held: Option<u64> = connection
        .exec_first("SELECT epoch FROM sluice.fences WHERE job = ? AND task = ?", (job, &fence.task))
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, "check the fence"))?;
    if held != Some(fence.epoch) {
        return Err(fence.moved(job, held.unwrap_or_default()));
    }
    Ok(())
}

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

/// The table that binds a job's checkpoints to the target tables they were written against:
/// per job and target table, the table's identity (its creation time) when they were last
/// checked.
pub(super) const BINDING_TABLE: &str = "CREATE DATABASE IF NOT EXISTS sluice CHARACTER SET utf8mb4;
    CREATE TABLE IF NOT EXISTS sluice.bindings (job VARCHAR(128) NOT NULL, target VARCHAR(512) NOT NULL,
        identity VARCHAR(64) NOT NULL, PRIMARY KEY (job, target)) DEFAULT CHARSET = utf8mb4";

/// Checks one table's checkpoints against the table (see `Sink::verify_checkpoints`) and
/// records its identity.
pub(super) async fn verify_binding(
    connection: &mut Conn,
    server: &str,
    job: &str,
    table: &TableName,
    tasks: &[String],
) -> Result<Binding> {
    let error = |doing: &str| {
        let doing = format!("{doing} ({table})");
        move |error| mysql_error(error, Side::Target, server, &doing)
    };
    let Some(identity) = table_identity(connection, server, table).await? else { return Ok(Binding::Holds) };
    let identity = identity.filter(|identity| !identity.is_empty());
    let bound: Option<String> = connection
        .exec_first("SELECT identity FROM sluice.bindings WHERE job = ? AND target = ?", (job, table.to_string()))
        .await
        .map_err(error("read the checkpoints' table identity"))?;
    let mut claimed = 0u64;
    for chunk in tasks.chunks(1_000) {
        let sql = format!(
            "SELECT CAST(COALESCE(SUM(rows_written), 0) AS UNSIGNED) FROM sluice.checkpoints WHERE job = ? AND task IN ({})",
            vec!["?"; chunk.len()].join(", ")
        );
        let mut parameters: Vec<mysql_async::Value> = vec![job.into()];
        parameters.extend(chunk.iter().map(|task| task.as_str().into()));
        let sum: Option<u64> =
            connection.exec_first(sql, parameters).await.map_err(error("read the table's checkpoints"))?;
        claimed += sum.unwrap_or(0);
    }
    let has_rows: Option<u8> = connection
        .query_first(format!("SELECT 1 FROM {} LIMIT 1", super::tables::qualified(table)))
        .await
        .map_err(error("look for rows"))?;
    let binding = Binding::judge(
        claimed,
        bound.as_deref().filter(|bound| !bound.is_empty()),
        identity.as_deref(),
        has_rows.is_some(),
    );
    if binding == Binding::Holds {
        record_identity(connection, server, job, table).await?;
    }
    Ok(binding)
}

/// Forgets the checkpoints of a table's tasks and records its identity now.
pub(super) async fn forget_binding(
    connection: &mut Conn,
    server: &str,
    job: &str,
    table: &TableName,
    tasks: &[String],
) -> Result<()> {
    for chunk in tasks.chunks(1_000) {
        let sql =
            format!("DELETE FROM sluice.checkpoints WHERE job = ? AND task IN ({})", vec!["?"; chunk.len()].join(", "));
        let mut parameters: Vec<mysql_async::Value> = vec![job.into()];
        parameters.extend(chunk.iter().map(|task| task.as_str().into()));
        connection
            .exec_drop(sql, parameters)
            .await
            .map_err(|error| mysql_error(error, Side::Target, server, &format!("forget the checkpoints of {table}")))?;
    }
    record_identity(connection, server, job, table).await
}

/// Records the table's identity now as the one its checkpoints describe.
async fn record_identity(connection: &mut Conn, server: &str, job: &str, table: &TableName) -> Result<()> {
    let Some(identity) = table_identity(connection, server, table).await? else { return Ok(()) };
    let identity = identity.unwrap_or_default();
    connection
        .exec_drop(
            "INSERT INTO sluice.bindings (job, target, identity) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE identity = VALUES(identity)",
            (job, table.to_string(), identity),
        )
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, &format!("record the identity of {table}")))
}

/// A table's identity: `None` when it does not exist, else InnoDB's table id, which every
/// CREATE (and TRUNCATE) makes anew and an in-place ALTER keeps, when the user may read it
/// (PROCESS; `Some(None)` when not). The creation time would not do: MariaDB changes it with
/// every ALTER, an index build included, and it has whole seconds only.
async fn table_identity(connection: &mut Conn, server: &str, table: &TableName) -> Result<Option<Option<String>>> {
    let schema = table.namespace.as_deref().unwrap_or("");
    let exists: Option<u8> = connection
        .exec_first(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (schema, &table.name),
        )
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, &format!("look up {table}")))?;
    if exists.is_none() {
        return Ok(None);
    }
    // MariaDB and MySQL 5.7 name the view INNODB_SYS_TABLES, MySQL 8 INNODB_TABLES.
    let name = format!("{schema}/{}", table.name);
    let mut id = None;
    for view in ["INNODB_SYS_TABLES", "INNODB_TABLES"] {
        let sql = format!("SELECT CAST(TABLE_ID AS CHAR) FROM information_schema.{view} WHERE NAME = ?");
        if let Ok(Some(found)) = connection.exec_first::<String, _, _>(sql, (&name,)).await {
            id = Some(found);
            break;
        }
    }
    Ok(Some(id))
}
