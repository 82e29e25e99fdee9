//! What a standalone run keeps between runs: the plan, a copy of every checkpoint, the dirty
//! records and the run history. The target's checkpoint stays the truth for resuming; the state
//! keeps the plan so split ids are stable, and everything an operator inspects.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::change::Rejected;

use crate::connector::{Checkpoint, Split, TableTasks};
use crate::error::Result;
use crate::schema::TableName;
use crate::stats::{RunSummary, StreamSummary};

/// A job cut into tasks: per source table, its target name and its splits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub tables: Vec<PlannedTable>,
    /// The source's log position captured before the first split was read.
    #[serde(default)]
    pub source_position: Option<crate::change::Position>,
    /// Target tables whose copy is written under a hidden name and published when the stream
    /// passes the replay window (`crate::hidden`): those a `snapshot+cdc` target did not have
    /// when the job was first planned.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hidden: Vec<TableName>,
}

impl Plan {
    /// The target tables several source tables of the plan are loaded into (a route merging
    /// shards).
    pub fn merged_targets(&self) -> std::collections::BTreeSet<TableName> {
        let mut sources_per_target: std::collections::BTreeMap<&TableName, usize> = Default::default();
        for planned in &self.tables {
            *sources_per_target.entry(&planned.target).or_default() += 1;
        }
        sources_per_target.into_iter().filter(|(_, count)| *count > 1).map(|(name, _)| name.clone()).collect()
    }

    /// Each target table of a plan with the splits written into it.
    pub fn table_tasks(&self) -> Vec<TableTasks> {
        let mut tables: Vec<TableTasks> = Vec::new();
        for planned in &self.tables {
            let tasks = planned.splits.iter().map(|split| split.id.clone());
            match tables.iter_mut().find(|known| known.table == planned.target) {
                Some(known) => known.tasks.extend(tasks),
                None => tables.push(TableTasks { table: planned.target.clone(), tasks: tasks.collect() }),
            }
        }
        tables
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedTable {
    pub target: TableName,
    pub splits: Vec<Split>,
}

/// The store behind `--state-dir`. Calls are short and synchronous; every write is durable when
/// it returns.
pub trait StateStore: Send + Sync {
    /// The stored plan of a job, if one was made.
    fn load_plan(&self, job: &str) -> Result<Option<Plan>>;

    /// Replaces the stored plan. Called once per run, after planning and before any task starts.
    fn save_plan(&self, job: &str, plan: &Plan) -> Result<()>;

    /// Records a copy of a checkpoint after the target committed it. Never moves a task's copy
    /// backwards: a copy with fewer rows than the stored one is ignored.
    fn save_checkpoint(&self, job: &str, checkpoint: &Checkpoint) -> Result<()>;

    /// The stored checkpoint copies of a job.
    fn checkpoints(&self, job: &str) -> Result<Vec<Checkpoint>>;

    /// Keeps dirty records of a task. Idempotent per (task, table, key): a batch replayed after a
    /// crash does not count its rejects twice. A record of the stream (`Rejected::change`)
    /// replaces the one kept for its key: a row the stream leaves out again shows its last
    /// change and counts once. Returns the job's total number of dirty records.
    fn record_dirty(&self, job: &str, task: &str, records: &[Rejected]) -> Result<u64>;

    /// The job's dirty records, oldest first.
    fn dirty_records(&self, job: &str) -> Result<Vec<Rejected>>;

    /// Appends a finished run's summary to the job's history.
    fn record_run(&self, summary: &RunSummary) -> Result<()>;

    /// Replaces the live status of a job's change stream (phase, lag, rates, latency, position).
    /// Called by the stream task after a commit, at most once a second.
    fn save_stream_status(&self, job: &str, status: &StreamSummary) -> Result<()>;

    /// The last status saved for a job's change stream.
    fn stream_status(&self, job: &str) -> Result<Option<serde_json::Value>>;

    /// Forgets a job's plan, checkpoint copies, dirty records and stream status (a restart from
    /// scratch); its run history stays.
    fn forget(&self, job: &str) -> Result<()>;
}

/// A state store in memory, for tests.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    inner: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    plans: BTreeMap<String, Plan>,
    checkpoints: BTreeMap<(String, String), Checkpoint>,
    dirty: BTreeMap<String, Vec<(String, Rejected)>>,
    runs: Vec<String>,
    streams: BTreeMap<String, serde_json::Value>,
}

impl MemoryStateStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The number of runs recorded.
    pub fn runs(&self) -> usize {
        self.lock().runs.len()
    }
}

impl StateStore for MemoryStateStore {
    fn load_plan(&self, job: &str) -> Result<Option<Plan>> {
        Ok(self.lock().plans.get(job).cloned())
    }

    fn save_plan(&self, job: &str, plan: &Plan) -> Result<()> {
        self.lock().plans.insert(job.to_owned(), plan.clone());
        Ok(())
    }

    fn save_checkpoint(&self, job: &str, checkpoint: &Checkpoint) -> Result<()> {
        let mut state = self.lock();
        let entry =
            state.checkpoints.entry((job.to_owned(), checkpoint.task.clone())).or_insert_with(|| checkpoint.clone());
        if checkpoint.rows_written >= entry.rows_written {
            *entry = checkpoint.clone();
        }
        Ok(())
    }

    fn checkpoints(&self, job: &str) -> Result<Vec<Checkpoint>> {
        Ok(self
            .lock()
            .checkpoints
            .iter()
            .filter(|((owner, _), _)| owner == job)
            .map(|(_, checkpoint)| checkpoint.clone())
            .collect())
    }

    fn record_dirty(&self, job: &str, task: &str, records: &[Rejected]) -> Result<u64> {
        let mut state = self.lock();
        let dirty = state.dirty.entry(job.to_owned()).or_default();
        for record in records {
            let known = dirty.iter_mut().find(|(known_task, known)| {
                known_task == task && known.table == record.table && known.key == record.key
            });
            match known {
                Some((_, known)) if record.of_stream() => *known = record.clone(),
                Some(_) => {}
                None => dirty.push((task.to_owned(), record.clone())),
            }
        }
        Ok(dirty.len() as u64)
    }

    fn dirty_records(&self, job: &str) -> Result<Vec<Rejected>> {
        Ok(self
            .lock()
            .dirty
            .get(job)
            .map(|records| records.iter().map(|(_, record)| record.clone()).collect())
            .unwrap_or_default())
    }

    fn record_run(&self, summary: &RunSummary) -> Result<()> {
        self.lock().runs.push(summary.job.clone());
        Ok(())
    }

    fn save_stream_status(&self, job: &str, status: &StreamSummary) -> Result<()> {
        let status = serde_json::to_value(status).expect("summaries serialize");
        self.lock().streams.insert(job.to_owned(), status);
        Ok(())
    }

    fn stream_status(&self, job: &str) -> Result<Option<serde_json::Value>> {
        Ok(self.lock().streams.get(job).cloned())
    }

    fn forget(&self, job: &str) -> Result<()> {
        let mut state = self.lock();
        state.plans.remove(job);
        state.checkpoints.retain(|(owner, _), _| owner != job);
        state.dirty.remove(job);
        state.streams.remove(job);
        Ok(())
    }
}
