//! Dirty records of a server's jobs, kept in the coordination store where every node and the
//! API see them: one key per rejected row, so `errors.max_dirty_records` is a budget of the job,
//! not of a node. A record's row is kept with it up to `RECORD_KEPT_BYTES`; a larger one is
//! kept whole in the state directory of the node that rejected it (the record names that node),
//! and cut in the shared record. A batch keeps at most `KEPT_PER_BATCH` records: past that the
//! job's budget is exceeded anyway, and the store is not flooded.
//!
//! ```text
//! /sluice/dirty/{job}/{table}/{key}   DirtyRecord (a long key by its hash)
//! /sluice/audit/{millis}-{n}          AuditEntry: who discarded which records
//! ```

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::change::{Rejected, RejectedChange};
use sluice_core::connector::Checkpoint;
use sluice_core::runner::{DirtyEntry, Runner, Verdict};
use sluice_core::spec::WriteMode;
use sluice_core::state::{Plan, StateStore};
use sluice_core::stats::{RunSummary, StreamSummary};
use sluice_core::{Error, Result};

use super::model::{encode, load, load_all, load_plan, plan_key, JobRecord, PlanRecord, ROOT};
use super::store::Store;
use crate::state_store::SqliteStateStore;

/// The largest row text kept in the coordination store with its record.
const RECORD_KEPT_BYTES: usize = 16 * 1024;
/// The most records one batch keeps in the coordination store.
const KEPT_PER_BATCH: usize = 1_000;
/// Keys longer than this (a keyless table's row is its key) are stored by their hash.
const LONGEST_KEY: usize = 200;

/// Where a job's dirty records are kept.
pub fn dirty_prefix(job: &str) -> String {
    format!("{ROOT}dirty/{job}/")
}

/// A row's place in the key space: the table, then its key, with `/` and `%` escaped (a long
/// key by its FNV-1a hash: it is kept whole in the record).
fn record_key(job: &str, table: &str, key: &str) -> String {
    let escape = |text: &str| text.replace('%', "%25").replace('/', "%2F");
    let key = if key.len() > LONGEST_KEY {
        let hash = key
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3));
        format!("#{hash:016x}")
    } else {
        escape(key)
    };
    format!("{}{}/{key}", dirty_prefix(job), escape(table))
}

/// One rejected row, as every node sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirtyRecord {
    /// The task that refused it: a snapshot split, or the stream.
    pub task: String,
    /// The table as named on the side that refused it.
    pub table: String,
    /// The row's key (`id=5`), or the whole row for a table without one.
    pub key: String,
    /// Why, naming the column and side.
    pub reason: String,
    /// The row as JSON text, when it could be rendered (cut past `RECORD_KEPT_BYTES`).
    pub record: Option<String>,
    /// The row was cut here; the whole of it is in `node`'s state directory.
    #[serde(default)]
    pub truncated: bool,
    /// A change the stream left out: its position, the row before it, its source row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<RejectedChange>,
    /// The node whose task refused it.
    pub node: String,
    /// RFC 3339.
    pub created_at: String,
}

impl DirtyRecord {
    /// The record as the runner knows it.
    fn rejected(&self) -> Rejected {
        Rejected {
            table: self.table.clone(),
            key: self.key.clone(),
            reason: self.reason.clone(),
            record: self.record.clone(),
            change: self.change.clone(),
        }
    }

    fn of(reject: &Rejected, task: &str, node: &str) -> DirtyRecord {
        let row = reject.record.as_ref();
        DirtyRecord {
            task: task.to_owned(),
            table: reject.table.clone(),
            key: reject.key.clone(),
            reason: reject.reason.clone(),
            record: row.map(|row| cut_at(row, RECORD_KEPT_BYTES).to_owned()),
            truncated: row.is_some_and(|row| row.len() > RECORD_KEPT_BYTES),
            change: reject.change.clone(),
            node: node.to_owned(),
            created_at: crate::logger::timestamp(),
        }
    }
}

/// An operator's action on dirty records, kept for audit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditEntry {
    /// RFC 3339.
    pub at: String,
    pub job: String,
    /// `discard`.
    pub action: String,
    /// Who did it: `token NAME`, or `anonymous` on a server without tokens.
    pub by: String,
    /// The records' ids.
    pub records: Vec<String>,
}

/// The job's dirty records, with their ids (their keys under the job's prefix), oldest first.
pub async fn list(store: &dyn Store, job: &str) -> Result<Vec<(String, DirtyRecord)>> {
    let mut records: Vec<(String, DirtyRecord)> =
        load_all(store, &dirty_prefix(job)).await?.into_iter().map(|(id, record, _)| (id, record)).collect();
    records.sort_by(|a, b| a.1.created_at.cmp(&b.1.created_at));
    Ok(records)
}

/// Which records an operator means: these ids, or every record of the job.
#[derive(Debug, Clone)]
pub enum Chosen {
    Ids(Vec<String>),
    All,
}

impl Chosen {
    fn takes(&self, id: &str) -> bool {
        match self {
            Chosen::Ids(ids) => ids.iter().any(|wanted| wanted == id),
            Chosen::All => true,
        }
    }
}

/// Forgets dirty records and audits it (the audit entry first); how many went.
pub async fn discard(store: &dyn Store, job: &str, chosen: &Chosen, by: &str) -> Result<usize> {
    let ids: Vec<String> =
        list(store, job).await?.into_iter().map(|(id, _)| id).filter(|id| chosen.takes(id)).collect();
    if ids.is_empty() {
        return Ok(0);
    }
    let entry = AuditEntry {
        at: crate::logger::timestamp(),
        job: job.to_owned(),
        action: "discard".into(),
        by: by.to_owned(),
        records: ids.clone(),
    };
    let millis = sluice_core::clock::unix_millis();
    let mut attempt = 0;
    while store.create(&format!("{ROOT}audit/{millis:020}-{attempt:03}"), &encode(&entry), None).await?.is_none() {
        attempt += 1;
    }
    for id in &ids {
        store.delete(&format!("{}{id}", dirty_prefix(job))).await?;
    }
    log::warn!("job {job}: {} dirty records discarded by the {by}", ids.len());
    Ok(ids.len())
}

/// What a replay did: the records written this time, and those still dirty (id, why).
#[derive(Debug, Default, Serialize)]
pub struct ReplayOutcome {
    /// Records written and forgotten.
    pub replayed: usize,
    /// Records that stay: refused again, gone from the source, or not replayable.
    pub failed: Vec<ReplayFailure>,
    /// Rows written again.
    pub rows_written: u64,
}

/// A record a replay did not write, and why.
#[derive(Debug, Serialize)]
pub struct ReplayFailure {
    pub id: String,
    pub error: String,
}

/// Replays dirty records after a fix: their rows are read again from the source (a copied row
/// from the split that holds it, a change the stream left out by its source key) and written by
/// key with the job's current version (`Runner::replay_records`). A record written this time is
/// forgotten; one refused again stays, with the new reason.
pub async fn replay(
    store: &Arc<dyn Store>,
    document_rules: &crate::job_text::DocumentRules,
    job: &JobRecord,
    chosen: &Chosen,
    node: &str,
) -> Result<ReplayOutcome> {
    let records: Vec<(String, DirtyRecord)> =
        list(&**store, &job.name).await?.into_iter().filter(|(id, _)| chosen.takes(id)).collect();
    let mut outcome = ReplayOutcome::default();
    if records.is_empty() {
        return Ok(outcome);
    }
    let mut spec = super::model::load_spec(&**store, document_rules, &job.name, job.version).await?;
    spec.target.write_mode = WriteMode::Upsert;
    if let Some(error) = sluice_connectors::validate(&spec).into_iter().find(|error| error.path.starts_with("target")) {
        return Err(Error::config(format!("job {}: its records cannot be replayed: {error}", job.name))
            .hint("a replay writes rows again by key; fix them in the target by hand, then discard them"));
    }
    let plan = match load::<PlanRecord>(&**store, &plan_key(&job.name)).await? {
        Some((record, _)) => load_plan(&**store, &job.name, &record).await?,
        None => None,
    };
    let entries: Vec<DirtyEntry> = records
        .iter()
        .map(|(id, record)| DirtyEntry { id: id.clone(), task: record.task.clone(), record: record.rejected() })
        .collect();
    let spec = Arc::new(spec);
    let runner = Runner::outside_run(spec.clone(), sluice_connectors::source(&spec)?, sluice_connectors::sink(&spec)?);
    let report = runner.replay_records(plan.as_ref(), &entries).await?;
    outcome.rows_written = report.rows_written;
    for (id, verdict) in report.verdicts {
        let key = format!("{}{id}", dirty_prefix(&job.name));
        match verdict {
            Verdict::Written => {
                store.delete(&key).await?;
                outcome.replayed += 1;
            }
            Verdict::Refused(reason) => {
                if let Some((_, record)) = records.iter().find(|(known, _)| *known == id) {
                    let kept = DirtyRecord { reason: reason.clone(), ..record.clone() };
                    store.put(&key, &encode(&kept), None).await?;
                }
                outcome.failed.push(ReplayFailure { id, error: reason });
            }
            Verdict::Kept(error) => outcome.failed.push(ReplayFailure { id, error }),
        }
    }
    // Refused now under another name (another side refused it this time): kept as well.
    for (task, reject) in report.others {
        let record = DirtyRecord::of(&reject, &task, node);
        store.put(&record_key(&job.name, &reject.table, &reject.key), &encode(&record), None).await?;
    }
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
        let cut: Vec<Rejected> = records
            .iter()
            .filter(|record| record.record.as_ref().is_some_and(|row| row.len() > RECORD_KEPT_BYTES))
            .cloned()
            .collect();
        if !cut.is_empty() {
            // The whole rows stay on this node.
            self.local.record_dirty(job, task, &cut)?;
        }
        let (kept, unkept) = records.split_at(records.len().min(KEPT_PER_BATCH));
        if !unkept.is_empty() {
            log::warn!(
                "job {job}: task {task}: {} more dirty records in one batch are counted but not kept",
                unkept.len()
            );
        }
        self.wait(async {
            for record in kept {
                // The first rejection of a copied row is kept: a batch replayed after a crash
                // does not count it twice. A row the stream leaves out again shows its last
                // change, still one record.
                let shared = DirtyRecord::of(record, task, &self.node);
                let key = record_key(job, &record.table, &record.key);
                if record.of_stream() {
                    self.store.put(&key, &encode(&shared), None).await?;
                } else {
                    self.store.create(&key, &encode(&shared), None).await?;
                }
            }
            Ok(self.store.count(&dirty_prefix(job)).await? + unkept.len() as u64)
        })
    }

    fn dirty_records(&self, job: &str) -> Result<Vec<Rejected>> {
        let records = self.wait(list(&*self.store, job))?;
        Ok(records.into_iter().map(|(_, record)| record.rejected()).collect())
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
            change: None,
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
        assert_eq!(discard(&*store, "job", &Chosen::Ids(vec![first.clone()]), "admin").await.unwrap(), 1);
        assert_eq!(list(&*store, "job").await.unwrap().len(), 1);
        assert_eq!(store.list(&format!("{ROOT}audit/")).await.unwrap().len(), 1);
    }
}
