//! The runner: runs one job, as a sequence of stages, each in a module of its own:
//!
//! - `prepare`: takes the fence, plans the job (or adopts a leader's plan), narrows the plan
//!   to the run's scope, and prepares, resets or verifies the target;
//! - `copy`: the snapshot, split by split, with up to `parallelism` tasks at once;
//! - `stream`: the change stream, in `cdc` and `snapshot+cdc` jobs;
//! - `replay`: dirty records written again after a fix (`sluice replay`), outside a run;
//! - `verify`: the target compared with the source through the mapping (`sluice verify`),
//!   outside a run, reading only.
//!
//! What every stage reads is the run's `context::RunContext`; what one stage makes for the
//! next (the plan, the hidden copies, the positions the copy reached) is handed on as a value.
//! The [`Runner`] is the façade that sequences the stages and sums the run up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::change::Position;
use crate::connector::{Sink, Source};
use crate::error::{Error, ErrorKind, Result};
use crate::schema::TableName;
use crate::spec::{JobSpec, Mode};
use crate::state::{Plan, StateStore};
use crate::stats::{JobStats, RunStatus, RunSummary};

mod context;
mod copied_keys;
mod copy;
mod mappings;
mod prepare;
mod replay;
mod stream;
mod verify;

use context::RunContext;
use copy::SnapshotCopy;
use stream::StreamStage;

pub use replay::{DirtyEntry, ReplayReport, Verdict};
pub use stream::ResyncRequest;
pub use verify::{Difference, DifferenceKind, ReadBack, Repair, TableVerdict, VerifyOptions, VerifyReport};

/// What part of a job one run covers. A standalone run covers the whole job; a cluster worker
/// runs one task of the plan its leader made.
#[derive(Debug, Clone, PartialEq)]
pub enum Scope {
    /// Every split, then the change stream when the mode has one.
    Whole,
    /// The snapshot of these source tables (every split of each, then their indexes).
    Tables(std::collections::BTreeSet<TableName>),
    /// These splits of the snapshot (by split id), without the indexes: a cluster spreads one
    /// large table over its workers as groups of splits, then a `Tables` task of the table
    /// (every split done) builds its indexes once.
    Splits(std::collections::BTreeSet<String>),
    /// The change stream alone; in `snapshot+cdc` every table's copy must be complete. With a
    /// backfill, tables added to a running job and just copied join the stream.
    Stream(Option<Backfill>),
}

/// Tables added to a running change stream and copied while it ran: the stream goes back to
/// `from` (captured before their copy began) and replays their changes from there, while the
/// changes of the tables it already had are skipped until it is back where it was.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Backfill {
    /// Names this backfill; the stream's checkpoint keeps it, so it is taken in once.
    pub id: String,
    /// The added tables (source names).
    pub tables: Vec<TableName>,
    pub from: Position,
}

/// Runs one job to completion, failure or stop.
pub struct Runner {
    /// What every stage reads.
    context: Arc<RunContext>,
    scope: Scope,
    /// The plan to execute when it was made elsewhere (a cluster leader's); without one the
    /// runner plans the job itself, from the plan kept in the state store.
    given_plan: Option<Plan>,
    /// Splits other runs copied to their end (a cluster's groups of a table, before its table
    /// task): found done without asking the target.
    copied_elsewhere: std::collections::BTreeSet<String>,
    /// Tables the stream copies again while it runs (`sluice job resync`), as asked now and
    /// later.
    resync: Option<watch::Receiver<Option<ResyncRequest>>>,
    /// Start from scratch: a new plan, the target's tables emptied and its checkpoints forgotten.
    /// Cleared once they are. Atomic because `run` takes the runner shared (callers hold it in an
    /// `Arc` and ask `still_restarting` once the run ends) and clears it in the middle.
    restart: AtomicBool,
    /// The stop signal's sender of a runner made by `outside_run`, kept so the signal stays open
    /// (a closed one would end every pause at once) and never set.
    _never_stopped: Option<watch::Sender<bool>>,
}

/// What the run reports of its stages, even when a later stage fails.
#[derive(Default)]
struct StageReport {
    /// The source's log position recorded in the plan.
    source_position: Option<Position>,
    /// Splits found complete in the target at start.
    splits_resumed_done: u64,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Runner").field("job", &self.context.job.name).finish_non_exhaustive()
    }
}

impl Runner {
    pub fn new(
        job: Arc<JobSpec>,
        source: Arc<dyn Source>,
        sink: Arc<dyn Sink>,
        state: Arc<dyn StateStore>,
        stop: watch::Receiver<bool>,
    ) -> Runner {
        Runner {
            context: Arc::new(RunContext::new(job, source, sink, state, stop)),
            scope: Scope::Whole,
            given_plan: None,
            copied_elsewhere: Default::default(),
            resync: None,
            restart: AtomicBool::new(false),
            _never_stopped: None,
        }
    }

    /// A runner for the work done outside a run (`replay_records`, `verify`): the job's source
    /// and sink, a state store of its own that nothing reads after it, no stop signal.
    pub fn outside_run(job: Arc<JobSpec>, source: Arc<dyn Source>, sink: Arc<dyn Sink>) -> Runner {
        let (never_stopped, stop) = watch::channel(false);
        let state: Arc<dyn StateStore> = Arc::new(crate::state::MemoryStateStore::default());
        Runner { _never_stopped: Some(never_stopped), ..Runner::new(job, source, sink, state, stop) }
    }

    /// Limits the run to part of the job (a cluster task).
    pub fn with_scope(mut self, scope: Scope) -> Runner {
        self.scope = scope;
        self
    }

    /// Has the stream copy tables again while it runs, each switched in whole once copied
    /// (`sluice job resync`): the request `resync` holds now, and each one it is sent later,
    /// taken in where the stream is. A request the stream has done already is not done again.
    pub fn with_resync(mut self, resync: watch::Receiver<Option<ResyncRequest>>) -> Runner {
        self.resync = Some(resync);
        self
    }

    /// Executes this plan instead of planning: a cluster task runs its part of the plan its
    /// leader made (and whose target tables the leader prepared), discovering nothing.
    pub fn with_plan(mut self, plan: Plan) -> Runner {
        self.given_plan = Some(plan);
        self
    }

    /// Splits (by id) that other runs copied to their end, which this one counts as done
    /// without asking the target: a cluster's table task after the groups of its splits, whose
    /// target may keep nothing a node other than theirs can read (the blackhole).
    pub fn with_copied_splits(mut self, splits: std::collections::BTreeSet<String>) -> Runner {
        self.copied_elsewhere = splits;
        self
    }

    /// Runs the job from scratch (`sluice run --restart`): a new plan and snapshot position, the
    /// target's tables of the job emptied and its checkpoints forgotten, here and in the target.
    pub fn restarting(self) -> Runner {
        self.restart.store(true, Ordering::Relaxed);
        self
    }

    /// Whether this runner was to start from scratch and has not emptied the target yet (a run
    /// that failed before it did must start from scratch again).
    pub fn still_restarting(&self) -> bool {
        self.restart.load(Ordering::Relaxed)
    }

    /// The live counters, for a progress display.
    pub fn stats(&self) -> Arc<JobStats> {
        self.context.stats.clone()
    }

    /// Runs the job and returns its summary; `status` is `succeeded`, `failed` or `stopped`, and
    /// the error, if any, is returned beside it.
    pub async fn run(self: &Arc<Self>) -> (RunSummary, Option<Error>) {
        let mut report = StageReport::default();
        let result = self.run_stages(&mut report).await;
        let (job, state) = (&self.context.job, &self.context.state);
        let mut summary = RunSummary::new(&job.name, &job.mode.to_string(), &self.context.stats);
        summary.splits_resumed_done = report.splits_resumed_done;
        summary.source_position = report.source_position.as_ref().map(|position| position.0.clone());
        summary.dirty_records_total = state.dirty_records(&job.name).map(|records| records.len() as u64).unwrap_or(0);
        let error = result.err();
        summary.status = match &error {
            None => RunStatus::Succeeded,
            Some(error) if error.kind() == ErrorKind::Interrupted => RunStatus::Stopped,
            Some(_) => RunStatus::Failed,
        };
        summary.error = error.as_ref().map(ToString::to_string);
        if let Err(state_error) = state.record_run(&summary) {
            log::error!("could not record the run in the state store: {state_error}");
        }
        (summary, error)
    }

    /// Prepares, copies and streams, as the job's mode and the run's scope say.
    async fn run_stages(&self, report: &mut StageReport) -> Result<()> {
        let context = &self.context;
        let snapshot = context.job.mode != Mode::Cdc;
        let planned = prepare::plan(context, self.given_plan.as_ref(), self.still_restarting()).await?;
        report.source_position = planned.plan().source_position.clone();
        let prepared = planned.prepare(context, &self.scope, self.still_restarting()).await?;
        if prepared.target_reset {
            self.restart.store(false, Ordering::Relaxed);
        }
        let copy_only = matches!(self.scope, Scope::Tables(_) | Scope::Splits(_));
        let mut copied = HashMap::new();
        if (snapshot || copy_only) && !matches!(self.scope, Scope::Stream(_)) {
            // A group of splits leaves the indexes to its table's task, which runs after it.
            let build_indexes = !matches!(self.scope, Scope::Splits(_));
            let copy = SnapshotCopy::new(context.clone(), prepared.hidden.clone(), self.copied_elsewhere.clone());
            let copied_snapshot = copy.copy_snapshot(&prepared.plan, &prepared.targets, build_indexes).await;
            report.splits_resumed_done = copy.splits_resumed_done();
            copied_snapshot?;
            copied = copy.copied_positions();
        }
        if !context.job.mode.streams() || copy_only {
            return Ok(());
        }
        let start = stream::start_position(context, snapshot, prepared.plan.source_position.clone()).await?;
        let backfill = match &self.scope {
            Scope::Stream(backfill) => backfill.clone(),
            _ => None,
        };
        StreamStage::new(context.clone(), backfill, prepared.splits, copied, prepared.hidden)
            .resyncing(self.resync.clone())
            .stream_changes(start, snapshot)
            .await
    }

    /// Replays dirty records: copied rows by the split of `plan` that holds them, changes the
    /// stream left out by their source key. A source, target or state failure is an error; a
    /// record that cannot be replayed gets its verdict (`Verdict::Kept`).
    pub async fn replay_records(&self, plan: Option<&Plan>, entries: &[DirtyEntry]) -> Result<ReplayReport> {
        replay::Replay { context: &self.context }.replay_records(plan, entries).await
    }

    /// Compares every table of the job, source against target through the job's mapping, and
    /// names each row that differs (`verify`). Reads only; the target is read back by `read_back`.
    pub async fn verify(&self, read_back: ReadBack, options: &VerifyOptions) -> Result<VerifyReport> {
        verify::Verification { context: self.context.clone() }.verify(read_back, options).await
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn interrupted() -> Error {
    Error::new(ErrorKind::Interrupted, "stopped before completion; run the job again to resume")
}
