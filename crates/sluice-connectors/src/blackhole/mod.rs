//! The `blackhole` target: takes every row and event and keeps none, for measuring a source or the
//! engine alone and for loading a cluster without a database. It keeps each task's checkpoint
//! in the memory of the process, committed with what it covers, so the engine's resume and
//! exactly-once logic runs as against any target within a run (a retried split resumes after its
//! last commit); a new process starts over. A cluster task's claim is kept the same way: a
//! commit of an older epoch than the last claim in this process is refused (FENCED), and a task
//! moved to another node starts over there, which costs nothing since nothing was kept.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use sluice_core::change::{Batch, Change, Rejected};
use sluice_core::connector::{
    Capabilities, ChangeWriter, CheckItem, Checkpoint, EventChangeSink, EventWriter, Fence, SchemaChange, Sink,
    TableTasks, TableWriter, TransactionEnd,
};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::{Result, TableName, TableSchema};

use crate::{Connector, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "blackhole",
    feature: "default",
    secrets: &[],
    capabilities: Capabilities {
        table_sink: true,
        event_sink: true,
        transactions: true,
        // Nothing it takes outlives the process, so a stalled worker that wakes harms nothing;
        // within one process, claims are checked (`Claims`).
        fencing: true,
        ..Capabilities::NONE
    },
    source: None,
    target: Some(TargetSide { fields: &["type"], validate, build, read_back: None }),
};

fn validate(_job: &JobSpec, _endpoint: &EndpointSpec) -> Vec<SpecError> {
    Vec::new()
}

fn build(_job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    Ok(Arc::new(Blackhole { fence }))
}

/// The checkpoints of every task, and the newest claim of each, by `job` and task.
#[derive(Debug, Default)]
struct Kept {
    checkpoints: HashMap<(String, String), Checkpoint>,
    claims: HashMap<(String, String), u64>,
}

/// The checkpoints and claims of this process.
fn kept() -> Arc<Mutex<Kept>> {
    static KEPT: std::sync::OnceLock<Arc<Mutex<Kept>>> = std::sync::OnceLock::new();
    KEPT.get_or_init(Arc::default).clone()
}

/// The sink of one job (and, on a cluster, one task's claim): what it keeps is the process's
/// (`kept`), shared by every sink built in it, as the tasks and retries of one run share a real
/// target.
#[derive(Debug)]
pub struct Blackhole {
    fence: Option<Fence>,
}

impl Blackhole {
    fn writer(&self, job: &str, task: &str) -> Discard {
        Discard { kept: kept(), job: job.to_owned(), task: task.to_owned(), fence: self.fence.clone() }
    }
}

#[async_trait]
impl Sink for Blackhole {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        Ok(vec![CheckItem {
            what: "target blackhole".into(),
            ok: true,
            detail: "takes every row and keeps none (checkpoints in this process's memory)".into(),
        }])
    }

    fn target_name(&self, source: &TableName) -> TableName {
        source.clone()
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables.iter().map(|table| format!("-- {}: discarded, nothing is created", table.name)).collect()
    }

    async fn prepare(&self, _tables: &[TableSchema]) -> Result<()> {
        Ok(())
    }

    async fn reset(&self, job: &str, _tables: &[TableTasks]) -> Result<()> {
        lock(&kept()).checkpoints.retain(|(kept_job, _), _| kept_job != job);
        Ok(())
    }

    async fn claim(&self, job: &str) -> Result<()> {
        let Some(fence) = &self.fence else { return Ok(()) };
        let kept = kept();
        let mut kept = lock(&kept);
        let held = kept.claims.entry((job.to_owned(), fence.task.clone())).or_insert(fence.epoch);
        if *held > fence.epoch {
            return Err(fence.moved(job, *held));
        }
        *held = fence.epoch;
        Ok(())
    }

    async fn open(&self, job: &str, task: &str, _table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        Ok(Box::new(self.writer(job, task)))
    }

    fn event_changes(&self) -> Option<&dyn EventChangeSink> {
        Some(self)
    }
}

#[async_trait]
impl EventChangeSink for Blackhole {
    async fn open_events(&self, job: &str, task: &str) -> Result<Box<dyn EventWriter>> {
        Ok(Box::new(self.writer(job, task)))
    }
}

fn lock(kept: &Mutex<Kept>) -> std::sync::MutexGuard<'_, Kept> {
    kept.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One task's writer: discards what it is given; a commit keeps the checkpoint.
struct Discard {
    kept: Arc<Mutex<Kept>>,
    job: String,
    task: String,
    fence: Option<Fence>,
}

impl Discard {
    fn key(&self) -> (String, String) {
        (self.job.clone(), self.task.clone())
    }

    fn recover(&self) -> Option<Checkpoint> {
        lock(&self.kept).checkpoints.get(&self.key()).cloned()
    }

    fn commit(&self, checkpoint: &Checkpoint) -> Result<()> {
        let mut kept = lock(&self.kept);
        if let Some(fence) = &self.fence {
            let held = kept.claims.get(&(self.job.clone(), fence.task.clone())).copied().unwrap_or(fence.epoch);
            if held > fence.epoch {
                return Err(fence.moved(&self.job, held));
            }
        }
        kept.checkpoints.insert(self.key(), checkpoint.clone());
        Ok(())
    }
}

#[async_trait]
impl TableWriter for Discard {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        Ok(Discard::recover(self))
    }

    async fn write(&mut self, _batch: &Batch) -> Result<Vec<Rejected>> {
        Ok(Vec::new())
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        Discard::commit(self, checkpoint)
    }

    async fn replace_all(&mut self) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl ChangeWriter for Discard {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        Ok(Discard::recover(self))
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        Discard::commit(self, checkpoint)
    }

    async fn apply_schema_change(&mut self, _change: &SchemaChange) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl EventWriter for Discard {
    async fn events(&mut self, _changes: &[Change]) -> Result<()> {
        Ok(())
    }

    async fn transaction_end(&mut self, _end: &TransactionEnd) -> Result<()> {
        Ok(())
    }
}
