//! The jobs' checkpoints in the target, in `sluice.checkpoints`: one row per commit of a task,
//! written after the rows it covers, the task's latest row its checkpoint: the one of the newest
//! cluster claim (`epoch`, 0 off a cluster), and of those the last written. A stalled worker's late
//! checkpoint so never hides its successor's. Rows are only ever added: a reset adds a row that
//! forgets the task, so a reader never waits for a ClickHouse mutation to finish. The cluster's
//! claims are in `sluice.claims` (`Fencing`).

use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::connector::{Checkpoint, Fence};
use sluice_core::{Error, ErrorKind, Position, Result, Side};

use super::server::{literal, Server};
use super::tables::unescape;

const TABLE: &str = "`sluice`.`checkpoints`";
const CLAIMS: &str = "`sluice`.`claims`";

/// Makes the table unless it exists.
pub async fn prepare(server: &Server) -> Result<()> {
    server.query("CREATE DATABASE IF NOT EXISTS `sluice`").await?;
    server
        .query(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (job String, task String, position String, done UInt8, \
             rows_written UInt64, forgotten UInt8, epoch UInt64, written UInt64) \
             ENGINE = ReplacingMergeTree(written) ORDER BY (job, task, epoch)"
        ))
        .await?;
    server
        .query(&format!(
            "CREATE TABLE IF NOT EXISTS {CLAIMS} (job String, task String, epoch UInt64) \
             ENGINE = ReplacingMergeTree(epoch) ORDER BY (job, task)"
        ))
        .await
        .map(drop)
}

/// The checkpoints of `job`'s tasks among `tasks` (all of them when `None`), forgotten ones left
/// out.
pub async fn read(server: &Server, job: &str, tasks: Option<&[String]>) -> Result<Vec<Checkpoint>> {
    let mut filter = format!("job = {}", literal(job));
    if let Some(tasks) = tasks {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let listed: Vec<String> = tasks.iter().map(|task| literal(task)).collect();
        filter.push_str(&format!(" AND task IN ({})", listed.join(", ")));
    }
    let answer = server
        .query(&format!(
            "SELECT task, argMax(position, (epoch, written)), argMax(done, (epoch, written)), \
             argMax(rows_written, (epoch, written)), argMax(forgotten, (epoch, written)) \
             FROM {TABLE} WHERE {filter} GROUP BY task FORMAT TabSeparated"
        ))
        .await?;
    let mut found = Vec::new();
    for line in answer.lines() {
        let fields: Vec<String> = line.split('\t').map(unescape).collect();
        let [task, position, done, rows_written, forgotten] = fields.as_slice() else {
            return Err(corrupt(job, line));
        };
        if forgotten == "1" {
            continue;
        }
        let position = match position.as_str() {
            "" => None,
            text => Some(Position(serde_json::from_str(text).map_err(|_| corrupt(job, line))?)),
        };
        let rows_written = rows_written.parse().map_err(|_| corrupt(job, line))?;
        found.push(Checkpoint { task: task.clone(), position, done: done == "1", rows_written });
    }
    Ok(found)
}

/// Records a task's checkpoint, under the claim of `epoch` (0 off a cluster).
pub async fn write(server: &Server, job: &str, epoch: u64, checkpoint: &Checkpoint) -> Result<()> {
    let position = checkpoint.position.as_ref().map(|position| position.0.to_string()).unwrap_or_default();
    let mut line = Vec::with_capacity(128 + position.len());
    for field in [job, &checkpoint.task, &position] {
        escape(field, &mut line);
        line.push(b'\t');
    }
    let rest = format!("{}\t{}\t0\t{epoch}\t{}\n", u8::from(checkpoint.done), checkpoint.rows_written, stamp());
    line.extend_from_slice(rest.as_bytes());
    server.insert(&format!("INSERT INTO {TABLE} FORMAT TabSeparated"), line).await
}

/// Forgets every checkpoint of `job`.
pub async fn forget(server: &Server, job: &str) -> Result<()> {
    forget_where(server, &format!("job = {}", literal(job))).await
}

/// Forgets the checkpoints of `job`'s `tasks`.
pub async fn forget_tasks(server: &Server, job: &str, tasks: &[String]) -> Result<()> {
    if tasks.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = tasks.iter().map(|task| literal(task)).collect();
    forget_where(server, &format!("job = {} AND task IN ({})", literal(job), listed.join(", "))).await
}

/// Adds, for each task whose rows match `filter`, a row that forgets it, under its newest claim.
async fn forget_where(server: &Server, filter: &str) -> Result<()> {
    server
        .query(&format!(
            "INSERT INTO {TABLE} SELECT job, task, '', 0, 0, 1, max(epoch), {} FROM {TABLE} WHERE {filter} \
             GROUP BY job, task",
            stamp()
        ))
        .await
        .map(drop)
}

/// A cluster task's claim in the target: its fence, checked before each commit.
#[derive(Debug, Clone)]
pub struct Fencing {
    pub fence: Fence,
}

impl Fencing {
    /// The newest epoch claimed for the task.
    async fn held(&self, server: &Server, job: &str) -> Result<u64> {
        let answer = server
            .query(&format!(
                "SELECT max(epoch) FROM {CLAIMS} WHERE job = {} AND task = {} FORMAT TabSeparated",
                literal(job),
                literal(&self.fence.task)
            ))
            .await?;
        Ok(answer.trim().parse().unwrap_or(0))
    }

    /// Takes the task for this epoch, unless a newer one holds it.
    pub async fn claim(&self, server: &Server, job: &str) -> Result<()> {
        let held = self.held(server, job).await?;
        if held > self.fence.epoch {
            return Err(self.fence.moved(job, held));
        }
        let mut line = Vec::new();
        for field in [job, &self.fence.task] {
            escape(field, &mut line);
            line.push(b'\t');
        }
        line.extend_from_slice(format!("{}\n", self.fence.epoch).as_bytes());
        server.insert(&format!("INSERT INTO {CLAIMS} FORMAT TabSeparated"), line).await
    }

    /// Fails with `ErrorKind::Fenced` once a newer epoch claimed the task. Checked before a
    /// commit's rows and before its checkpoint; a commit past the check when the claim lands
    /// writes rows its successor writes again at the same versions, and a checkpoint that never
    /// hides the successor's (`read`).
    pub async fn check(&self, server: &Server, job: &str) -> Result<()> {
        let held = self.held(server, job).await?;
        if held > self.fence.epoch {
            return Err(self.fence.moved(job, held));
        }
        Ok(())
    }
}

/// When a checkpoint row is written: nanoseconds since 1970, and past the last one this process
/// wrote, so a task's commits in one process are ordered even when the clock steps back.
fn stamp() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_nanos()).unwrap_or(u64::MAX));
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// Text as a TabSeparated field: backslash, tab and newline escaped.
fn escape(text: &str, out: &mut Vec<u8>) {
    for byte in text.bytes() {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            other => out.push(other),
        }
    }
}

fn corrupt(job: &str, line: &str) -> Error {
    Error::new(ErrorKind::State, format!("job {job}: a row of sluice.checkpoints in ClickHouse does not read: {line}"))
        .on(Side::Target)
        .hint("delete the job's rows from sluice.checkpoints and run it with --restart")
}
