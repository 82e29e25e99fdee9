//! Dirty records of a server's jobs, kept in the coordination store where every node and the
//! API see them: one key per rejected row, so `errors.max_dirty_records` is a budget of the job,
//! not of a node. A record's row is kept with it up to `RECORD_KEPT_BYTES`; a larger one is
//! kept whole in the state directory of the node that rejected it (the key names that node),
//! and cut in the shared record.
//!
//! ```text
//! /sluice/dirty/{job}/{table}/{key}   DirtyRecord
//! /sluice/audit/{millis}-{n}          AuditEntry: who discarded which records
//! ```

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::change::Rejected;
use sluice_core::connector::{Checkpoint, Split};
use sluice_core::runner::Runner;
use sluice_core::spec::WriteMode;
use sluice_core::state::{Plan, StateStore};
use sluice_core::stats::{RunSummary, StreamSummary};
use sluice_core::{Error, Result};

use super::model::{encode, load, load_all, load_plan, plan_key, JobRecord, PlanRecord, ROOT};
use super::store::Store;
use crate::state_store::SqliteStateStore;

/// The largest row text kept in the coordination store with its record.
const RECORD_KEPT_BYTES: usize = 64 * 1024;

pub fn dirty_prefix(job: &str) -> String {
    format!("{ROOT}dirty/{job}/")
}

/// A row's place in the key space: the table, then its key, with `/` and `%` escaped.
fn record_key(job: &str, table: &str, key: &str) -> String {
    let escape = |text: &str| text.replace('%', "%25").replace('/', "%2F");
    format!("{}{}/{}", dirty_prefix(job), escape(table), escape(key))
}

/// One rejected row, as every node sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirtyRecord {
    pub task: String,
    pub table: String,
    pub key: String,
    pub reason: String,
    /// The row as JSON text, when it could be rendered (cut past `RECORD_KEPT_BYTES`).
    pub record: Option<String>,
    /// The row was cut here; the whole of it is in `node`'s state directory.
    #[serde(default)]
    pub truncated: bool,
    /// The node whose task rejected it.
    pub node: String,
    /// RFC 3339.
    pub created_at: String,
}

/// An operator's action on dirty records, kept for audit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditEntry {
    pub at: String,
    pub job: String,
    pub action: String,
    /// Which token's role did it (`admin`, or `open` on a server without tokens).
    pub by: String,
    pub records: Vec<String>,
}

/// The job's dirty records, with their ids (their keys under the job's prefix), oldest first.
pub async fn list(store: &dyn Store, job: &str) -> Result<Vec<(String, DirtyRecord)>> {
    let mut records: Vec<(String, DirtyRecord)> =
        load_all(store, &dirty_prefix(job)).await?.into_iter().map(|(id, record, _)| (id, record)).collect();
    records.sort_by(|a, b| a.1.created_at.cmp(&b.1.created_at));
    Ok(records)
}

/// Forgets dirty records (all of the job's when `ids` is `None`) and audits it; how many went.
pub async fn discard(store: &dyn Store, job: &str, ids: Option<&[String]>, by: &str) -> Result<usize> {
    let known = list(store, job).await?;
    let chosen: Vec<String> =
        known.into_iter().map(|(id, _)| id).filter(|id| ids.is_none_or(|ids| ids.contains(id))).collect();
    for id in &chosen {
        store.delete(&format!("{}{id}", dirty_prefix(job))).await?;
    }
    let entry = AuditEntry {
        at: crate::logger::timestamp(),
        job: job.to_owned(),
        action: "discard".into(),
        by: by.to_owned(),
        records: chosen.clone(),
    };
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis();
    store.put(&format!("{ROOT}audit/{millis:020}-{job}"), &encode(&entry), None).await?;
    log::warn!("job {job}: {} dirty records discarded by {by}", chosen.len());
    Ok(chosen.len())
}

/// What a replay did: the records written this time, and those refused again (id, why).
#[derive(Debug, Default, Serialize)]
pub struct ReplayOutcome {
    pub replayed: usize,
    pub failed: Vec<ReplayFailure>,
    /// Rows of the replayed splits written again.
    pub rows_written: u64,
}

#[derive(Debug, Serialize)]
pub struct ReplayFailure {
    pub id: String,
    pub error: String,
}

/// Replays dirty records (all of the job's when `ids` is `None`) after a fix: the splits that
/// hold them are copied again with the job's current version, by key (`Runner::replay`). A
/// record written this time is forgotten; one refused again stays, with the new reason; rows
/// of those splits refused for the first time become dirty records too.
pub async fn replay(
    store: &Arc<dyn Store>,
    job: &JobRecord,
    ids: Option<&[String]>,
    node: &str,
) -> Result<ReplayOutcome> {
    let chosen: Vec<(String, DirtyRecord)> =
        list(&**store, &job.name).await?.into_iter().filter(|(id, _)| ids.is_none_or(|ids| ids.contains(id))).collect();
    let mut outcome = ReplayOutcome::default();
    if chosen.is_empty() {
        return Ok(outcome);
    }
    let mut spec = super::worker::load_spec(&**store, &job.name, job.version).await?;
    spec.target.write_mode = WriteMode::Upsert;
    if let Some(error) = sluice_connectors::validate(&spec).into_iter().find(|error| error.path.starts_with("target")) {
        return Err(Error::config(format!("job {}: its records cannot be replayed: {error}", job.name))
            .hint("a replay writes rows again by key; discard the records instead"));
    }
    let plan = match load::<PlanRecord>(&**store, &plan_key(&job.name)).await? {
        Some((record, _)) => load_plan(&**store, &job.name, &record).await?,
        None => None,
    };
    let splits: Vec<Split> =
        plan.iter().flat_map(|plan| &plan.tables).flat_map(|table| &table.splits).cloned().collect();
    let mut wanted: Vec<Split> = Vec::new();
    for (id, record) in &chosen {
        match splits.iter().find(|split| split.id == record.task) {
            Some(split) if !wanted.iter().any(|known| known.id == split.id) => wanted.push(split.clone()),
            Some(_) => {}
            None => outcome.failed.push(ReplayFailure {
                id: id.clone(),
                error: format!(
                    "its task {} is not a copy of the job's current plan (a record of the change stream, or of a \
                     plan since replaced); fix the row in the target by hand, then discard it",
                    record.task
                ),
            }),
        }
    }
    let spec = Arc::new(spec);
    let source = sluice_connectors::source(&spec)?;
    let sink = sluice_connectors::sink(&spec)?;
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let state: Arc<dyn StateStore> = Arc::new(sluice_core::state::MemoryStateStore::default());
    let runner = Runner::new(spec, source, sink, state, stopped);
    let replayed = runner.replay(&wanted).await?;
    outcome.rows_written = replayed.written;
    let again =
        |table: &str, key: &str| replayed.rejected.iter().find(|reject| reject.table == table && reject.key == key);
    let in_wanted = |record: &DirtyRecord| wanted.iter().any(|split| split.id == record.task);
    for (id, record) in chosen.iter().filter(|(_, record)| in_wanted(record)) {
        match again(&record.table, &record.key) {
            Some(reject) => outcome.failed.push(ReplayFailure { id: id.clone(), error: reject.reason.clone() }),
            None => {
                store.delete(&format!("{}{id}", dirty_prefix(&job.name))).await?;
                outcome.replayed += 1;
            }
        }
    }
    // Rows refused now: kept (with this replay's reason), each under its task.
    for reject in &replayed.rejected {
        let task = chosen
            .iter()
            .find(|(_, record)| record.table == reject.table && record.key == reject.key)
            .map_or_else(|| "replay".to_owned(), |(_, record)| record.task.clone());
        let shared = DirtyRecord {
            task,
            table: reject.table.clone(),
            key: reject.key.clone(),
            reason: reject.reason.clone(),
            record: reject.record.as_ref().map(|row| cut_at(row, RECORD_KEPT_BYTES).to_owned()),
            truncated: reject.record.as_ref().is_some_and(|row| row.len() > RECORD_KEPT_BYTES),
            node: node.to_owned(),
            created_at: crate::logger::timestamp(),
        };
        store.put(&record_key(&job.name, &reject.table, &reject.key), &encode(&shared), None).await?;
    }
    log::info!(
        "job {}: replayed {} dirty records ({} rows of {} splits written again); {} refused again",
        job.name,
        outcome.replayed,
        outcome.rows_written,
        wanted.len(),
        outcome.failed.len()
    );
    Ok(outcome)
}

/// The state a server's task runs with: its node's own store, but dirty records in the
/// coordination store.
pub struct SharedState {
    pub local: Arc<SqliteStateStore>,
    pub store: Arc<dyn Store>,
    pub node: String,
}

impl SharedState {
    /// Runs a coordination-store call from the runner's synchronous state calls. The runner is
    /// on the server's multi-threaded runtime, where a worker thread may block in place.
    fn wait<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(call))
    }
}

impl StateStore for SharedState {
    fn load_plan(&self, job: &str) -> Result<Option<Plan>> {
        self.local.load_plan(job)
    }

    fn save_plan(&self, job: &str, plan: &Plan) -> Result<()> {
        self.local.save_plan(job, plan)
    }

    fn save_checkpoint(&self, job: &str, checkpoint: &Checkpoint) -> Result<()> {
        self.local.save_checkpoint(job, checkpoint)
    }

    fn checkpoints(&self, job: &str) -> Result<Vec<Checkpoint>> {
        self.local.checkpoints(job)
    }

    fn record_dirty(&self, job: &str, task: &str, records: &[Rejected]) -> Result<u64> {
        let cut: Vec<&Rejected> = records
            .iter()
            .filter(|record| record.record.as_ref().is_some_and(|row| row.len() > RECORD_KEPT_BYTES))
            .collect();
        if !cut.is_empty() {
            // The whole rows stay on this node.
            let whole: Vec<Rejected> = cut.into_iter().cloned().collect();
            self.local.record_dirty(job, task, &whole)?;
        }
        self.wait(async {
            for record in records {
                let row = record.record.as_ref();
                let truncated = row.is_some_and(|row| row.len() > RECORD_KEPT_BYTES);
                let shared = DirtyRecord {
                    task: task.to_owned(),
                    table: record.table.clone(),
                    key: record.key.clone(),
                    reason: record.reason.clone(),
                    record: row.map(|row| cut_at(row, RECORD_KEPT_BYTES).to_owned()),
                    truncated,
                    node: self.node.clone(),
                    created_at: crate::logger::timestamp(),
                };
                // The first rejection of a row is kept: a batch replayed after a crash does
                // not count it twice.
                self.store.create(&record_key(job, &record.table, &record.key), &encode(&shared), None).await?;
            }
            self.store.count(&dirty_prefix(job)).await
        })
    }

    fn dirty_records(&self, job: &str) -> Result<Vec<Rejected>> {
        let records = self.wait(list(&*self.store, job))?;
        Ok(records
            .into_iter()
            .map(|(_, record)| Rejected {
                table: record.table,
                key: record.key,
                reason: record.reason,
                record: record.record,
            })
            .collect())
    }

    fn record_run(&self, summary: &RunSummary) -> Result<()> {
        self.local.record_run(summary)
    }

    fn save_stream_status(&self, job: &str, status: &StreamSummary) -> Result<()> {
        self.local.save_stream_status(job, status)
    }

    fn stream_status(&self, job: &str) -> Result<Option<serde_json::Value>> {
        self.local.stream_status(job)
    }

    fn forget(&self, job: &str) -> Result<()> {
        self.local.forget(job)
    }
}

/// `text` cut to at most `bytes`, on a character boundary.
fn cut_at(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::store::MemoryStore;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_are_shared_counted_once_and_discarded_with_an_audit() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::open(None).unwrap());
        let directory = tempfile::tempdir().unwrap();
        let node = |name: &str| SharedState {
            local: Arc::new(SqliteStateStore::open(&directory.path().join(name)).unwrap()),
            store: store.clone(),
            node: name.into(),
        };
        let (one, two) = (node("one"), node("two"));
        let reject = |key: &str, row: &str| Rejected {
            table: "db.t/x".into(),
            key: key.into(),
            reason: "too long for target column v".into(),
            record: Some(row.into()),
        };
        let big = "é".repeat(RECORD_KEPT_BYTES);
        let state = (one, two);
        // The runner calls the state from a runtime thread; a blocking one stands in for it.
        let total = tokio::task::spawn_blocking(move || {
            assert_eq!(state.0.record_dirty("job", "t#0", &[reject("id=1", "{}")]).unwrap(), 1);
            assert_eq!(state.0.record_dirty("job", "t#0", &[reject("id=1", "{}")]).unwrap(), 1, "idempotent");
            let total = state.1.record_dirty("job", "t#1", &[reject("id=2", &big)]).unwrap();
            assert_eq!(state.1.local.dirty_records("job").unwrap().len(), 1, "the whole big row stays on its node");
            assert_eq!(state.0.dirty_records("job").unwrap().len(), 2, "every node sees both");
            total
        })
        .await
        .unwrap();
        assert_eq!(total, 2, "the budget counts the job's records on every node");
        let records = list(&*store, "job").await.unwrap();
        let big = records.iter().find(|(_, record)| record.key == "id=2").unwrap();
        assert!(big.1.truncated && big.1.record.as_ref().unwrap().len() <= RECORD_KEPT_BYTES);
        assert_eq!(big.1.node, "two");
        let first = records[0].0.clone();
        assert_eq!(discard(&*store, "job", Some(std::slice::from_ref(&first)), "admin").await.unwrap(), 1);
        assert_eq!(list(&*store, "job").await.unwrap().len(), 1);
        assert_eq!(store.list(&format!("{ROOT}audit/")).await.unwrap().len(), 1);
    }
}
