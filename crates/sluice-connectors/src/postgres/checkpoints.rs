//! `sluice.checkpoints` and `sluice.fences` in PostgreSQL: reading a task's checkpoint and
//! committing a transaction together with it, fenced for cluster tasks. Shared by the snapshot
//! writer and the change writer.

use sluice_core::change::Position;
use sluice_core::connector::{Binding, Checkpoint, Fence};
use sluice_core::{Error, ErrorKind, Result, Side, TableName};
use tokio_postgres::Client;

use super::postgres_error;

/// A task's checkpoint row in `sluice.checkpoints`, if it has one.
pub(super) async fn read_checkpoint(
    client: &Client,
    server: &str,
    job: &str,
    task: &str,
) -> Result<Option<Checkpoint>> {
    let row = match client
        .query_opt(
            "SELECT position::text, done, rows_written FROM sluice.checkpoints WHERE job = $1 AND task = $2",
            &[&job, &task],
        )
        .await
    {
        Ok(row) => row,
        // No checkpoint table yet (a target no job has prepared): no checkpoint.
        Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => None,
        Err(error) => return Err(postgres_error(error, Side::Target, server, "read the checkpoint")),
    };
    let Some(row) = row else { return Ok(None) };
    let position: Option<String> = row.get(0);
    let position = position.map(|text| serde_json::from_str(&text).map(Position)).transpose().map_err(|error| {
        Error::new(ErrorKind::Write, format!("checkpoint of task {task} is corrupt: {error}")).on(Side::Target)
    })?;
    Ok(Some(Checkpoint {
        task: task.to_owned(),
        position,
        done: row.get(1),
        rows_written: row.get::<_, i64>(2) as u64,
    }))
}

/// The application name prefix of a fenced task's sessions (its epoch follows): a hash, since
/// application names are short.
pub(super) fn fence_tag(job: &str, fence: &Fence) -> String {
    let hash = format!("{job}\0{}", fence.task)
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("sluice-fence:{hash:016x}:")
}

/// The table of cluster fences: per job and cluster task, the newest epoch that claimed it.
/// `sql` (DDL of Sluice's own tables, `IF NOT EXISTS`) run under a lock every Sluice session
/// takes for it: PostgreSQL's `CREATE … IF NOT EXISTS` fails when two sessions create the same
/// table at once (jobs of one target's server starting together).
pub(super) fn own_tables(sql: &str) -> String {
    format!("BEGIN; SELECT pg_advisory_xact_lock({OWN_TABLES_LOCK}); {sql}; COMMIT")
}

/// The advisory lock of `own_tables` ("sluice" in ASCII).
const OWN_TABLES_LOCK: i64 = 0x736c_7569_6365;

pub(super) const FENCE_TABLE: &str = "CREATE SCHEMA IF NOT EXISTS sluice;
    CREATE TABLE IF NOT EXISTS sluice.fences (job text NOT NULL, task text NOT NULL, epoch bigint NOT NULL,
        PRIMARY KEY (job, task))";

/// Writes the checkpoint row and commits the open transaction with it. With a fence, the
/// commit happens only while the target holds the fence's epoch (the row is share-locked until
/// the commit, so a newer claim waits for it and then reads what it committed).
pub(super) async fn commit_with_checkpoint(
    client: &Client,
    server: &str,
    job: &str,
    fence: Option<&Fence>,
    checkpoint: &Checkpoint,
) -> Result<()> {
    if let Some(fence) = fence {
        let held: Option<i64> = client
            .query_opt("SELECT epoch FROM sluice.fences WHERE job = $1 AND task = $2 FOR SHARE", &[&job, &fence.task])
            .await
            .map_err(|error| postgres_error(error, Side::Target, server, "check the fence"))?
            .map(|row| row.get(0));
        if held != Some(fence.epoch as i64) {
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(fence.moved(job, held.unwrap_or_default() as u64));
        }
    }
    let position = checkpoint.position.as_ref().map(|position| position.0.to_string());
    let saved = client
        .execute(
            "INSERT INTO sluice.checkpoints (job, task, position, done, rows_written, updated_at) VALUES ($1, $2, $3::text::jsonb, $4, $5, now())
             ON CONFLICT (job, task) DO UPDATE SET position = EXCLUDED.position, done = EXCLUDED.done,
                 rows_written = EXCLUDED.rows_written, updated_at = EXCLUDED.updated_at",
            &[&job, &checkpoint.task, &position, &checkpoint.done, &(checkpoint.rows_written as i64)],
        )
        .await;
    let committed = match saved {
        Ok(_) => client.batch_execute("COMMIT").await,
        Err(error) => Err(error),
    };
    committed.map_err(|error| postgres_error(error, Side::Target, server, "commit"))
}

/// The table that binds a job's checkpoints to the target tables they were written against:
/// per job and target table, the table's identity (its OID) when they were last checked.
pub(super) const BINDING_TABLE: &str = "CREATE SCHEMA IF NOT EXISTS sluice;
    CREATE TABLE IF NOT EXISTS sluice.bindings (job text NOT NULL, target text NOT NULL, identity text NOT NULL,
        PRIMARY KEY (job, target))";

/// Checks one table's checkpoints against the table (see `Sink::verify_checkpoints`) and
/// records its identity.
pub(super) async fn verify_binding(
    client: &Client,
    server: &str,
    job: &str,
    table: &TableName,
    tasks: &[String],
) -> Result<Binding> {
    let error = |doing: &str| {
        let doing = format!("{doing} ({table})");
        move |error| postgres_error(error, Side::Target, server, &doing)
    };
    let name = super::tables::qualified(table);
    let identity: Option<String> = client
        .query_one("SELECT to_regclass($1)::oid::text", &[&name])
        .await
        .map_err(error("read the table's identity"))?
        .get(0);
    let Some(identity) = identity else { return Ok(Binding::Holds) };
    let bound: Option<String> = client
        .query_opt("SELECT identity FROM sluice.bindings WHERE job = $1 AND target = $2", &[&job, &name])
        .await
        .map_err(error("read the checkpoints' table identity"))?
        .map(|row| row.get(0));
    let claimed: i64 = client
        .query_one(
            "SELECT COALESCE(sum(rows_written), 0)::bigint FROM sluice.checkpoints WHERE job = $1 AND task = ANY($2)",
            &[&job, &tasks],
        )
        .await
        .map_err(error("read the table's checkpoints"))?
        .get(0);
    let has_rows: bool = client
        .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {name})"), &[])
        .await
        .map_err(error("look for rows"))?
        .get(0);
    let binding = Binding::judge(claimed as u64, bound.as_deref(), Some(&identity), has_rows);
    if binding == Binding::Holds {
        record_identity(client, server, job, table).await?;
    }
    Ok(binding)
}

/// Records the table's identity now as the one its checkpoints describe.
pub(super) async fn record_identity(client: &Client, server: &str, job: &str, table: &TableName) -> Result<()> {
    let name = super::tables::qualified(table);
    client
        .execute(
            "INSERT INTO sluice.bindings (job, target, identity)
             SELECT $1, $2, to_regclass($2)::oid::text WHERE to_regclass($2) IS NOT NULL
             ON CONFLICT (job, target) DO UPDATE SET identity = EXCLUDED.identity",
            &[&job, &name],
        )
        .await
        .map_err(|error| postgres_error(error, Side::Target, server, &format!("record the identity of {table}")))?;
    Ok(())
}
