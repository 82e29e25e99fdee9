//! The runner: plans a job into tasks and runs up to `parallelism` of them at once. Each task is
//! a pipeline — read → durable write with checkpoint → ack — with a bounded channel between the
//! reader and the writer, so memory is set by `limits`, not by table size.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use crate::change::{Batch, Position, Rejected};
use crate::connector::{Checkpoint, Sink, Source, Split};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::hidden::HiddenCopies;
use crate::planner::Planner;
use crate::retry;
use crate::schema::{TableName, TableSchema};
use crate::spec::{JobSpec, Mode};
use crate::state::{Plan, StateStore};
use crate::stats::{JobStats, RunSummary, TableStats};
use crate::throttle::Throttle;
use crate::transform::{self, TableMapping, Transforms};
use crate::zero_dates;

mod copied_keys;
mod replay;
mod stream;

pub use replay::{DirtyEntry, ReplayReport, Replayed, Verdict};

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

/// Splits waiting for a worker, each with the counters of its table.
type TaskQueue = VecDeque<(Split, Arc<TableStats>)>;

/// Runs one job to completion, failure or stop.
pub struct Runner {
    job: Arc<JobSpec>,
    source: Arc<dyn Source>,
    sink: Arc<dyn Sink>,
    state: Arc<dyn StateStore>,
    stats: Arc<JobStats>,
    throttle: Throttle,
    /// Set by the caller to stop gracefully (SIGINT/SIGTERM).
    stop: watch::Receiver<bool>,
    /// Set by the runner when one task failed, so the others stop too.
    abort: watch::Sender<bool>,
    /// Splits found complete in the target at start.
    resumed_done: std::sync::atomic::AtomicU64,
    /// The source's log position recorded in the plan.
    source_position: Mutex<Option<Position>>,
    scope: Scope,
    /// The plan to execute when it was made elsewhere (a cluster leader's); without one the
    /// runner plans the job itself, from the plan kept in the state store.
    given_plan: Option<Plan>,
    /// The job's routes and transform rules.
    transforms: Transforms,
    /// Each planned source table's mapping to its target table.
    mappings: Mutex<BTreeMap<TableName, Arc<TableMapping>>>,
    /// Target tables that more than one source table is merged into.
    shared_targets: Mutex<std::collections::BTreeSet<TableName>>,
    /// The plan's splits. The stream applies the changes of tables read whole (no key) only
    /// past the source position their copy was read at, and sends an event target only the
    /// changes past the read that copied each key (`copied_keys`).
    splits: Mutex<Vec<Split>>,
    /// The last position of each split this run copied to its end, for targets that keep no
    /// checkpoint (stdout): where the stream finds the copy's reads.
    copied: Mutex<HashMap<String, Option<Position>>>,
    /// Start from scratch: a new plan, the target's tables emptied and its checkpoints forgotten.
    /// Cleared once they are.
    restart: std::sync::atomic::AtomicBool,
    /// The plan's tables whose copy is still hidden (`crate::hidden`), as the target said when
    /// the run began.
    hidden: Mutex<HiddenCopies>,
    /// Source schemas the stream met inside a transaction, for tables whose DDL a target that
    /// commits DDL on its own must apply before that transaction: the next attempt applies them
    /// first.
    reshape_first: Mutex<Vec<Arc<TableSchema>>>,
    /// The changes the stream left out as dirty records this run (table, key, position), so
    /// the summary counts each once.
    stream_dirty: Mutex<std::collections::HashSet<String>>,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Runner").field("job", &self.job.name).finish_non_exhaustive()
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
        let throttle = Throttle::new(job.limits.rows_per_sec, job.limits.bytes_per_sec);
        let transforms = Transforms::of(&job);
        Runner {
            job,
            source,
            sink,
            state,
            stats: Arc::new(JobStats::default()),
            throttle,
            stop,
            abort: watch::channel(false).0,
            resumed_done: Default::default(),
            source_position: Mutex::new(None),
            scope: Scope::Whole,
            given_plan: None,
            transforms,
            mappings: Mutex::new(BTreeMap::new()),
            shared_targets: Mutex::new(Default::default()),
            splits: Mutex::new(Vec::new()),
            copied: Mutex::new(HashMap::new()),
            restart: std::sync::atomic::AtomicBool::new(false),
            hidden: Mutex::new(HiddenCopies::default()),
            reshape_first: Mutex::new(Vec::new()),
            stream_dirty: Mutex::new(Default::default()),
        }
    }

    /// Limits the run to part of the job (a cluster task).
    pub fn with_scope(mut self, scope: Scope) -> Runner {
        self.scope = scope;
        self
    }

    /// Executes this plan instead of planning: a cluster task runs its part of the plan its
    /// leader made (and whose target tables the leader prepared), discovering nothing.
    pub fn with_plan(mut self, plan: Plan) -> Runner {
        self.given_plan = Some(plan);
        self
    }

    /// Runs the job from scratch (`sluice run --restart`): a new plan and snapshot position, the
    /// target's tables of the job emptied and its checkpoints forgotten, here and in the target.
    pub fn restarting(self) -> Runner {
        self.restart.store(true, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// Whether this runner was to start from scratch and has not emptied the target yet (a run
    /// that failed before it did must start from scratch again).
    pub fn still_restarting(&self) -> bool {
        self.restart.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The live counters, for a progress display.
    pub fn stats(&self) -> Arc<JobStats> {
        self.stats.clone()
    }

    /// Runs the job and returns its summary; `status` is `succeeded`, `failed` or `stopped`, and
    /// the error, if any, is returned beside it.
    pub async fn run(self: &Arc<Self>) -> (RunSummary, Option<Error>) {
        let result = self.run_tasks().await;
        let mut summary = RunSummary::new(&self.job.name, &self.job.mode.to_string(), &self.stats);
        summary.splits_resumed_done = self.resumed_done.load(std::sync::atomic::Ordering::Relaxed);
        summary.source_position = self
            .source_position
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .as_ref()
            .map(|position| position.0.clone());
        summary.dirty_records_total =
            self.state.dirty_records(&self.job.name).map(|records| records.len() as u64).unwrap_or(0);
        let error = result.err();
        summary.status = match &error {
            None => "succeeded",
            Some(error) if error.kind() == ErrorKind::Interrupted => "stopped",
            Some(_) => "failed",
        }
        .to_owned();
        summary.error = error.as_ref().map(ToString::to_string);
        if let Err(state_error) = self.state.record_run(&summary) {
            log::error!("could not record the run in the state store: {state_error}");
        }
        (summary, error)
    }

    async fn run_tasks(self: &Arc<Self>) -> Result<()> {
        let snapshot = self.job.mode != Mode::Cdc;
        // A fenced sink takes its fence before reading any checkpoint.
        self.with_retry("take the task's fence in the target", || self.sink.claim(&self.job.name)).await?;
        let (mut plan, mut targets, planned_here) = match &self.given_plan {
            Some(plan) => (plan.clone(), self.targets_of(plan)?, false),
            None => {
                // A restart plans afresh, and keeps the new plan only once the target is reset:
                // until then the stored plan still matches the target's checkpoints.
                let mut previous = if self.still_restarting() { None } else { self.state.load_plan(&self.job.name)? };
                let mut marks = Default::default();
                if let Some(plan) = previous.as_ref().filter(|_| self.job.mode == Mode::IncrementalCursor) {
                    let found = crate::planner::marks(&self.job.name, &*self.sink, plan).await?;
                    if found.complete {
                        // The last batch completed: this run is the next one. Its checkpoints go
                        // first, so no new split can be taken for done; a crash before the new
                        // plan is kept reads the last window again.
                        log::info!("the last batch completed: this run copies the rows changed since");
                        self.sink.forget_checkpoints(&self.job.name, &plan.table_tasks()).await?;
                        previous = None;
                        marks = found.tables;
                    }
                }
                let planned = Planner::new(self.job.clone(), self.source.clone(), self.sink.clone())
                    .stopping_on(self.stop.clone())
                    .from_marks(marks)
                    .plan(previous)
                    .await?;
                if !self.still_restarting() {
                    self.state.save_plan(&self.job.name, &planned.plan)?;
                }
                (planned.plan, planned.targets, true)
            }
        };
        self.adopt(&plan);
        match &self.scope {
            Scope::Tables(tables) => plan
                .tables
                .retain(|planned| planned.splits.first().is_some_and(|split| tables.contains(&split.table.name))),
            Scope::Splits(splits) => {
                for planned in &mut plan.tables {
                    planned.splits.retain(|split| splits.contains(&split.id));
                }
                plan.tables.retain(|planned| !planned.splits.is_empty());
                let found: usize = plan.tables.iter().map(|planned| planned.splits.len()).sum();
                if found != splits.len() {
                    return Err(Error::new(
                        ErrorKind::State,
                        format!(
                            "{} of the {} splits this task copies are not in the plan",
                            splits.len() - found,
                            splits.len()
                        ),
                    )
                    .on(Side::State));
                }
            }
            Scope::Whole | Scope::Stream(_) => {}
        }
        if matches!(self.scope, Scope::Tables(_) | Scope::Splits(_)) {
            targets.retain(|target| plan.tables.iter().any(|planned| planned.target == target.name));
        }
        let hidden = self
            .with_retry("list the target's tables", || HiddenCopies::of(&plan, &*self.sink, &self.job.name))
            .await?;
        *lock(&self.hidden) = hidden.clone();
        if planned_here {
            self.sink.prepare(&hidden.schemas(&targets)).await?;
            let mut tables = hidden.tasks(plan.table_tasks());
            if self.still_restarting() {
                // A `cdc` job copies nothing: its tables are not its own to empty.
                if self.job.mode == Mode::Cdc {
                    tables.clear();
                }
                log::warn!("restart: emptying the job's {} target tables and forgetting its checkpoints", tables.len());
                self.sink.reset(&self.job.name, &tables).await?;
                self.state.forget(&self.job.name)?;
                self.state.save_plan(&self.job.name, &plan)?;
                self.restart.store(false, std::sync::atomic::Ordering::Relaxed);
            } else {
                crate::planner::verify_checkpoints(&self.job, &*self.sink, &tables).await?;
            }
        }
        let copy_only = matches!(self.scope, Scope::Tables(_) | Scope::Splits(_));
        if (snapshot || copy_only) && !matches!(self.scope, Scope::Stream(_)) {
            // A group of splits leaves the indexes to its table's task, which runs after it.
            let build_indexes = !matches!(self.scope, Scope::Splits(_));
            self.copy_snapshot(&plan, &targets, build_indexes).await?;
        }
        if !self.job.mode.streams() || copy_only {
            return Ok(());
        }
        // A cdc job starts where the job says, else where the source stood when the job was
        // first planned (kept in the plan, so a crash before the first commit loses nothing);
        // snapshot+cdc starts where its snapshot was taken.
        let start = match (snapshot, self.source.start_position().await?) {
            (false, Some(position)) => Some(position),
            _ => plan.source_position,
        };
        let Some(start) = start else {
            return Err(Error::new(ErrorKind::Config, "the source has no change log position to stream from")
                .on(Side::Source)
                .hint("turn on the source's binary log (log_bin) and run the job again"));
        };
        self.stream_changes(start, snapshot).await
    }

    /// Copies every split of the plan with up to `parallelism` tasks, then builds what the
    /// target builds last (secondary indexes).
    async fn copy_snapshot(self: &Arc<Self>, plan: &Plan, targets: &[TableSchema], build_indexes: bool) -> Result<()> {
        // Splits are taken a table at a time in turn (the first split of each table, then the
        // second ...), so concurrent tasks write into different tables when there are several:
        // writers of one table contend for its locks (MariaDB's AUTO-INC lock serialises every
        // LOAD DATA into a table with a counter) and its hottest pages.
        let mut queue = TaskQueue::new();
        let longest = plan.tables.iter().map(|table| table.splits.len()).max().unwrap_or(0);
        for index in 0..longest {
            for table in &plan.tables {
                if let Some(split) = table.splits.get(index) {
                    let stats = self.stats.table(&split.table.name, &table.target);
                    TableStats::add(&stats.splits_total, 1);
                    queue.push_back((split.clone(), stats));
                }
            }
        }
        let queue: Arc<Mutex<TaskQueue>> = Arc::new(Mutex::new(queue));
        let workers =
            self.job.parallelism.min(queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()).max(1);
        let mut handles = Vec::with_capacity(workers);
        for _ in 0..workers {
            let runner = self.clone();
            let queue = queue.clone();
            handles.push(tokio::spawn(async move {
                loop {
                    if runner.should_stop() {
                        return Ok(());
                    }
                    let next = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop_front();
                    let Some((split, stats)) = next else {
                        return Ok(());
                    };
                    if let Err(error) = runner.run_task(&split, &stats).await {
                        if error.kind() != ErrorKind::Interrupted {
                            runner.abort.send_replace(true);
                        }
                        return Err(error);
                    }
                }
            }));
        }
        let mut first_error: Option<Error> = None;
        for handle in handles {
            let outcome = handle
                .await
                .unwrap_or_else(|panic| Err(Error::new(ErrorKind::Write, format!("a task panicked: {panic}"))));
            if let Err(error) = outcome {
                // A real failure outranks the interruptions it caused in the other tasks.
                let replace = match &first_error {
                    None => true,
                    Some(current) => current.kind() == ErrorKind::Interrupted && error.kind() != ErrorKind::Interrupted,
                };
                if replace {
                    first_error = Some(error);
                }
            }
        }
        if first_error.is_none() && *self.stop.borrow() {
            let pending = queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len();
            if pending > 0 {
                first_error = Some(interrupted());
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        if !build_indexes {
            log::info!("every split of this group is copied");
            return Ok(());
        }
        log::info!("every split is copied; building secondary indexes where the target has them");
        let targets = lock(&self.hidden).schemas(targets);
        self.sink.finish(&targets).await
    }

    /// The target tables of a plan made elsewhere, for the indexes built after the copy.
    fn targets_of(&self, plan: &Plan) -> Result<Vec<TableSchema>> {
        let mut mappings = Vec::with_capacity(plan.tables.len());
        for planned in &plan.tables {
            if let Some(split) = planned.splits.first() {
                mappings.push((*self.mapping(&split.table)?).clone());
            }
        }
        Ok(transform::target_tables(&mappings))
    }

    /// Takes in what the plan says beyond its splits: the source position for the summary, and
    /// which target tables several source tables are merged into.
    fn adopt(&self, plan: &Plan) {
        *lock(&self.source_position) = plan.source_position.clone();
        let mut sources_per_target: BTreeMap<&TableName, usize> = BTreeMap::new();
        for planned in &plan.tables {
            *sources_per_target.entry(&planned.target).or_default() += 1;
        }
        lock(&self.shared_targets)
            .extend(sources_per_target.into_iter().filter(|(_, count)| *count > 1).map(|(name, _)| name.clone()));
        *lock(&self.splits) = plan.tables.iter().flat_map(|planned| &planned.splits).cloned().collect();
    }

    fn should_stop(&self) -> bool {
        *self.stop.borrow() || *self.abort.borrow()
    }

    /// Calls `step` until it succeeds, fails for good, or runs out of attempts.
    async fn with_retry<T, F, Fut>(&self, what: &str, step: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        retry::retrying(&self.job.retry, what, || self.should_stop(), |wait| self.pause(wait), step).await
    }

    /// Waits `wait`, or less when the run is stopped or aborted meanwhile.
    async fn pause(&self, wait: std::time::Duration) {
        let mut stop = self.stop.clone();
        let mut abort = self.abort.subscribe();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|stopped| *stopped) => {}
            _ = abort.wait_for(|aborted| *aborted) => {}
        }
    }

    async fn run_task(&self, split: &Split, stats: &Arc<TableStats>) -> Result<()> {
        self.with_retry(&format!("task {}", split.id), || self.copy_split(split, stats)).await.map_err(|error| {
            if error.kind() == ErrorKind::Interrupted {
                error
            } else {
                error.context(format_args!("task {}", split.id))
            }
        })
    }

    /// Copies one split from its checkpoint to its end.
    async fn copy_split(&self, split: &Split, stats: &Arc<TableStats>) -> Result<()> {
        let mapping = self.mapping(&split.table)?;
        let mut writer = self.sink.open(&self.job.name, &split.id, self.written_as(&mapping.target)).await?;
        let recovered = writer.recover().await?;
        let mut rows_written = recovered.as_ref().map_or(0, |checkpoint| checkpoint.rows_written);
        let mut position = recovered.as_ref().and_then(|checkpoint| checkpoint.position.clone());
        if recovered.as_ref().is_some_and(|checkpoint| checkpoint.done) {
            TableStats::add(&stats.splits_done, 1);
            self.resumed_done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
        }
        if split.whole && recovered.is_some() {
            // A split read whole cannot resume: what an earlier attempt committed goes with the
            // first commit of this one.
            log::info!(
                "task {}: an earlier attempt copied part of this keyless table; copying it again whole",
                split.id
            );
            writer.replace_all().await?;
            rows_written = 0;
            position = None;
        }
        TableStats::add(&stats.rows_expected, split.estimated_rows.saturating_sub(rows_written));
        let reader = self.source.open(split, position.as_ref(), self.job.limits.batch_rows).await?;

        let (batches, mut received) = mpsc::channel::<Result<Option<Batch>>>(self.job.limits.queue_batches);
        let (acks, ack_queue) = mpsc::unbounded_channel::<Position>();
        let producer = tokio::spawn(produce(reader, batches, ack_queue, self.stop.clone(), self.abort.subscribe()));

        let outcome = async {
            loop {
                let Some(item) = received.recv().await else {
                    // The producer stopped without reaching the end: a stop or an abort.
                    return Err(interrupted());
                };
                let Some(batch) = item? else { break };
                let committed =
                    self.write_batch(split, stats, &mapping, &mut *writer, batch, &mut rows_written).await?;
                position = Some(committed.clone());
                // A closed ack channel means the producer is gone; the next receive says why.
                let _ = acks.send(committed);
                if self.should_stop() {
                    return Err(interrupted());
                }
            }
            let done = Checkpoint { task: split.id.clone(), position: position.clone(), done: true, rows_written };
            writer.commit(&done).await?;
            self.state.save_checkpoint(&self.job.name, &done)?;
            lock(&self.copied).insert(split.id.clone(), position.clone());
            TableStats::add(&stats.splits_done, 1);
            Ok(())
        }
        .await;
        drop(received);
        producer.abort();
        outcome
    }

    /// Writes one batch, keeps its rejects, and commits it with its checkpoint; returns the
    /// position committed.
    async fn write_batch(
        &self,
        split: &Split,
        stats: &TableStats,
        mapping: &TableMapping,
        writer: &mut dyn crate::connector::Writer,
        batch: Batch,
        rows_written: &mut u64,
    ) -> Result<Position> {
        let rows = batch.changes.len() as u64;
        TableStats::add(&stats.rows_read, rows + batch.rejected.len() as u64);
        TableStats::add(&stats.bytes_read, batch.bytes);
        self.throttle.admit(rows, batch.bytes).await;
        let (batch, mut rejects) = self.as_written(mapping, batch, stats);
        let to_write = &batch;
        let target_rejects = writer.write(to_write).await?;
        let written = to_write.changes.len() as u64 - target_rejects.len() as u64;
        rejects.extend(target_rejects);
        if !rejects.is_empty() {
            TableStats::add(&stats.rows_skipped, rejects.len() as u64);
            self.keep_dirty(&split.id, &rejects)?;
        }
        *rows_written += written;
        let checkpoint = Checkpoint {
            task: split.id.clone(),
            position: Some(batch.position.clone()),
            done: false,
            rows_written: *rows_written,
        };
        writer.commit(&checkpoint).await?;
        crate::failpoint::hit("copy.batch.committed");
        TableStats::add(&stats.rows_written, written);
        self.state.save_checkpoint(&self.job.name, &checkpoint)?;
        Ok(batch.position)
    }

    /// Keeps rows that could not be read or written as dirty records of `task`, logs each with
    /// its table and key, and fails once the job has more than `errors.max_dirty_records` (one
    /// budget for the copy and the stream). Called before the commit that moves past them, so a
    /// crash cannot lose them; storing is idempotent, so a batch or group applied again after a
    /// failed commit does not count them twice.
    fn keep_dirty(&self, task: &str, rejects: &[Rejected]) -> Result<()> {
        let total = self.state.record_dirty(&self.job.name, task, rejects)?;
        for reject in rejects {
            log::warn!("dirty record in {} ({}): {}", reject.table, reject.key, reject.reason);
        }
        match rejects.last() {
            Some(last) if total > self.job.errors.max_dirty_records => Err(Error::new(
                ErrorKind::Data,
                format!(
                    "{total} dirty records exceed errors.max_dirty_records = {}; the last: table {}, key {}: {}",
                    self.job.errors.max_dirty_records, last.table, last.key, last.reason
                ),
            )
            .hint(
                "fix the data or raise errors.max_dirty_records; the dirty records are kept in the state directory \
                 (on a server: GET /api/v1/jobs/NAME/dirty, `sluice job dirty NAME`)",
            )),
            _ => Ok(()),
        }
    }

    /// A batch as the target gets it: transformed, and judged by the zero-date policy; with the
    /// rows the source, the transform or the policy refused.
    fn as_written(&self, mapping: &TableMapping, mut batch: Batch, stats: &TableStats) -> (Batch, Vec<Rejected>) {
        let mut rejects = std::mem::take(&mut batch.rejected);
        if !mapping.is_identity() {
            let transformed = mapping.batch(batch);
            TableStats::add(&stats.rows_filtered, transformed.filtered);
            batch = transformed.batch;
            rejects.append(&mut batch.rejected);
        }
        // The zero-date policy judges the rows as the target gets them.
        if !self.sink.holds_zero_dates() {
            if let Some(outcome) = zero_dates::apply(&batch, self.job.errors.zero_dates, &self.job.target.connector) {
                TableStats::add(&stats.zero_dates_nulled, outcome.nulled);
                rejects.extend(outcome.rejected);
                batch = Batch { rejected: Vec::new(), ..outcome.batch };
            }
        }
        (batch, rejects)
    }

    /// The mapping of a source table as planned, or, for a schema the plan does not have (a
    /// table created or altered in the change stream), compiled now.
    fn mapping(&self, table: &Arc<TableSchema>) -> Result<Arc<TableMapping>> {
        if let Some(mapping) = lock(&self.mappings).get(&table.name) {
            if mapping.source.columns == table.columns && mapping.source.primary_key == table.primary_key {
                return Ok(mapping.clone());
            }
        }
        let mapping = Arc::new(self.transforms.map(table, &|name| self.sink.target_name(name))?);
        let mut mappings = lock(&self.mappings);
        // A table merged with others (created later, or altered) must keep their shape.
        let sibling = mappings
            .values()
            .find(|other| other.source.name != table.name && other.target.name == mapping.target.name)
            .cloned();
        if let Some(sibling) = sibling {
            self.transforms.check_merge(&sibling, &mapping)?;
            lock(&self.shared_targets).insert(mapping.target.name.clone());
        }
        mappings.insert(table.name.clone(), mapping.clone());
        Ok(mapping)
    }

    /// A target table under the name its rows are written under now: a hidden copy's until the
    /// stream publishes it.
    fn written_as(&self, target: &Arc<TableSchema>) -> Arc<TableSchema> {
        lock(&self.hidden).schema(target)
    }

    /// The target name of a source table: routed, then named by the sink.
    fn target_name(&self, source: &TableName) -> TableName {
        self.transforms.target_name(source, &|name| self.sink.target_name(name))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Runner {}

fn interrupted() -> Error {
    Error::new(ErrorKind::Interrupted, "stopped before completion; run the job again to resume")
}

/// Pulls batches from a reader into the channel until the split ends, the writer goes away, or a
/// stop is asked for; forwards acknowledged positions to the reader between reads. Sends
/// `Ok(None)` at the end of the split, so the writer can tell the end from a stop.
async fn produce(
    mut reader: Box<dyn crate::connector::Reader>,
    batches: mpsc::Sender<Result<Option<Batch>>>,
    mut acks: mpsc::UnboundedReceiver<Position>,
    stop: watch::Receiver<bool>,
    abort: watch::Receiver<bool>,
) {
    loop {
        while let Ok(position) = acks.try_recv() {
            if let Err(error) = reader.ack(&position).await {
                let _ = batches.send(Err(error)).await;
                return;
            }
        }
        if *stop.borrow() || *abort.borrow() {
            return;
        }
        let item = reader.next().await;
        let last = !matches!(item, Ok(Some(_)));
        if batches.send(item).await.is_err() || last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use serde_json::json;

    use super::*;
    use crate::change::{Change, Rejected};
    use crate::connector::{CheckItem, Reader, SplitHint, Writer};
    use crate::schema::{Column, DataType, TableName};
    use crate::spec::parse_job;
    use crate::state::MemoryStateStore;
    use crate::value::Value;

    fn table() -> Arc<TableSchema> {
        Arc::new(TableSchema {
            name: TableName::parse("t"),
            columns: vec![Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false)],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        })
    }

    /// Rows 1..=rows in two splits; a row whose id is in `bad` cannot be decoded.
    struct MemorySource {
        rows: i64,
        bad: Vec<i64>,
    }

    #[async_trait]
    impl Source for MemorySource {
        async fn check(&self) -> Result<Vec<CheckItem>> {
            Ok(Vec::new())
        }
        async fn discover(&self) -> Result<Vec<TableSchema>> {
            Ok(vec![(*table()).clone()])
        }
        async fn split(&self, table: &Arc<TableSchema>, _hint: SplitHint) -> Result<Vec<Split>> {
            let half = self.rows / 2;
            Ok([(1, half), (half + 1, self.rows)]
                .iter()
                .enumerate()
                .map(|(index, (from, to))| Split {
                    id: format!("t#{index}"),
                    table: table.clone(),
                    descriptor: json!([from, to]),
                    estimated_rows: (to - from + 1) as u64,
                    whole: false,
                    window: None,
                })
                .collect())
        }
        async fn open(
            &self,
            split: &Split,
            resume_after: Option<&Position>,
            batch_rows: usize,
        ) -> Result<Box<dyn Reader>> {
            let from =
                resume_after.map_or(split.descriptor[0].as_i64().unwrap(), |position| position.0.as_i64().unwrap() + 1);
            Ok(Box::new(MemoryReader {
                next: from,
                to: split.descriptor[1].as_i64().unwrap(),
                batch_rows: batch_rows as i64,
                bad: self.bad.clone(),
            }))
        }
    }

    struct MemoryReader {
        next: i64,
        to: i64,
        batch_rows: i64,
        bad: Vec<i64>,
    }

    #[async_trait]
    impl Reader for MemoryReader {
        async fn next(&mut self) -> Result<Option<Batch>> {
            if self.next > self.to {
                return Ok(None);
            }
            let last = (self.next + self.batch_rows - 1).min(self.to);
            let mut changes = Vec::new();
            let mut rejected = Vec::new();
            for id in self.next..=last {
                if self.bad.contains(&id) {
                    rejected.push(Rejected {
                        table: "t".into(),
                        key: format!("id={id}"),
                        reason: "source: bad".into(),
                        record: None,
                        change: None,
                    });
                } else {
                    changes.push(Change::insert(table(), vec![Value::Int(id)]));
                }
            }
            self.next = last + 1;
            let mut batch = Batch::new(changes, Position(json!(last)));
            batch.rejected = rejected;
            Ok(Some(batch))
        }
    }

    /// A transactional target in memory whose commits fail with a transient error on the
    /// commit numbers in `failing_commits`.
    #[derive(Default)]
    struct MemoryTarget {
        committed: Mutex<(Vec<i64>, BTreeMap<String, Checkpoint>)>,
        commits: AtomicU32,
        failing_commits: Vec<u32>,
    }

    struct MemorySink(Arc<MemoryTarget>);

    #[async_trait]
    impl Sink for MemorySink {
        async fn check(&self) -> Result<Vec<CheckItem>> {
            Ok(Vec::new())
        }
        fn target_name(&self, source: &TableName) -> TableName {
            source.clone()
        }
        fn create_statements(&self, _tables: &[TableSchema]) -> Vec<String> {
            Vec::new()
        }
        async fn prepare(&self, _tables: &[TableSchema]) -> Result<()> {
            Ok(())
        }
        async fn reset(&self, _job: &str, _tables: &[crate::connector::TableTasks]) -> Result<()> {
            Ok(())
        }
        async fn open(&self, _job: &str, task: &str, _table: Arc<TableSchema>) -> Result<Box<dyn Writer>> {
            Ok(Box::new(MemoryWriter { target: self.0.clone(), task: task.to_owned(), staged: Vec::new() }))
        }
    }

    struct MemoryWriter {
        target: Arc<MemoryTarget>,
        task: String,
        staged: Vec<i64>,
    }

    #[async_trait]
    impl Writer for MemoryWriter {
        async fn recover(&mut self) -> Result<Option<Checkpoint>> {
            Ok(self.target.committed.lock().unwrap().1.get(&self.task).cloned())
        }
        async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
            self.staged.extend(batch.changes.iter().map(|change| match change.row()[0] {
                Value::Int(id) => id,
                _ => unreachable!(),
            }));
            Ok(Vec::new())
        }
        async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
            let number = self.target.commits.fetch_add(1, Ordering::SeqCst) + 1;
            if self.target.failing_commits.contains(&number) {
                return Err(Error::new(ErrorKind::Unavailable, "connection reset").on(Side::Target));
            }
            let mut committed = self.target.committed.lock().unwrap();
            committed.0.append(&mut self.staged);
            committed.1.insert(self.task.clone(), checkpoint.clone());
            Ok(())
        }
        async fn replace_all(&mut self) -> Result<()> {
            Ok(())
        }
    }

    fn job(extra: &str) -> Arc<JobSpec> {
        let text = format!("name: unit\nsource: {{type: memory}}\ntarget: {{type: memory}}\nlimits: {{batch_rows: 10}}\nretry: {{initial_backoff_ms: 1}}\n{extra}");
        Arc::new(parse_job(&text, false, |_| None).unwrap())
    }

    #[tokio::test]
    async fn transient_commit_failures_are_retried_without_duplicates() {
        let target = Arc::new(MemoryTarget { failing_commits: vec![3, 4, 9], ..Default::default() });
        let sink = Arc::new(MemorySink(target.clone()));
        let state = Arc::new(MemoryStateStore::default());
        let (_stop, stopped) = watch::channel(false);
        let runner = Arc::new(Runner::new(
            job(""),
            Arc::new(MemorySource { rows: 100, bad: vec![] }),
            sink,
            state.clone(),
            stopped,
        ));
        let (summary, error) = runner.run().await;
        assert!(error.is_none(), "{error:?}");
        let mut ids = target.committed.lock().unwrap().0.clone();
        ids.sort_unstable();
        assert_eq!(ids, (1..=100).collect::<Vec<_>>());
        assert_eq!((summary.status.as_str(), summary.rows_written), ("succeeded", 100));
        assert_eq!(state.runs(), 1);
    }

    #[tokio::test]
    async fn dirty_records_past_the_limit_fail_before_their_batch_commits() {
        let target = Arc::new(MemoryTarget::default());
        let sink = Arc::new(MemorySink(target.clone()));
        let state = Arc::new(MemoryStateStore::default());
        let (_stop, stopped) = watch::channel(false);
        let source = Arc::new(MemorySource { rows: 100, bad: vec![5, 15] });
        let runner = Arc::new(Runner::new(
            job("parallelism: 1\nerrors: {max_dirty_records: 1}\n"),
            source,
            sink,
            state.clone(),
            stopped,
        ));
        let (summary, error) = runner.run().await;
        let error = error.expect("the second dirty record fails the job");
        assert!(error.to_string().contains("2 dirty records exceed errors.max_dirty_records = 1"), "{error}");
        assert_eq!(summary.status, "failed");
        // Rows 1-10 (with the first dirty record) committed; the batch holding id 15 did not.
        let committed = target.committed.lock().unwrap().0.clone();
        assert_eq!(committed, (1..=10).filter(|id| *id != 5).collect::<Vec<_>>());
        assert_eq!(state.dirty_records("unit").unwrap().len(), 2, "both are kept for inspection");
    }
}
