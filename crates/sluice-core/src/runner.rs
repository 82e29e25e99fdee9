//! The runner: plans a job into tasks and runs up to `parallelism` of them at once. Each task is
//! a pipeline — read → durable write with checkpoint → ack — with a bounded channel between the
//! reader and the writer, so memory is set by `limits`, not by table size.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use crate::change::{Batch, Position};
use crate::connector::{Checkpoint, Sink, Source, Split, SplitHint};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::retry;
use crate::schema::TableSchema;
use crate::spec::JobSpec;
use crate::state::{Plan, PlannedTable, StateStore};
use crate::stats::{JobStats, RunSummary, TableStats};
use crate::throttle::Throttle;

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
        }
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
        let plan = self.plan().await?;
        let targets: Vec<TableSchema> = plan
            .tables
            .iter()
            .filter_map(|table| {
                let first = table.splits.first()?;
                Some(TableSchema { name: table.target.clone(), ..(*first.table).clone() })
            })
            .collect();
        self.sink.prepare(&targets).await?;

        let queue: Arc<Mutex<TaskQueue>> = Arc::new(Mutex::new(VecDeque::new()));
        for table in &plan.tables {
            for split in &table.splits {
                let stats = self.stats.table(&split.table.name, &table.target);
                TableStats::add(&stats.splits_total, 1);
                queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push_back((split.clone(), stats));
            }
        }
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
        first_error.map_or(Ok(()), Err)
    }

    /// Loads the stored plan, keeps its splits for tables still selected, and splits the new ones.
    async fn plan(&self) -> Result<Plan> {
        let tables = self.with_retry("discover the source tables", || self.source.discover()).await?;
        if tables.is_empty() {
            return Err(Error::new(ErrorKind::Schema, "no table matches `source.tables`")
                .on(Side::Source)
                .hint("check the include and exclude globs and that the tables exist"));
        }
        let stored: BTreeMap<_, _> = self
            .state
            .load_plan(&self.job.name)?
            .unwrap_or_default()
            .tables
            .into_iter()
            .filter_map(|table| Some((table.splits.first()?.table.name.clone(), table)))
            .collect();
        let mut plan = Plan::default();
        for table in tables {
            let target = self.sink.target_name(&table.name);
            let planned = match stored.get(&table.name) {
                Some(stored) => PlannedTable { target, splits: stored.splits.clone() },
                None => {
                    let table = Arc::new(table);
                    let splits = self
                        .with_retry("split the source table", || {
                            self.source.split(&table, SplitHint { rows_per_split: self.job.limits.split_rows })
                        })
                        .await?;
                    PlannedTable { target, splits }
                }
            };
            plan.tables.push(planned);
        }
        self.state.save_plan(&self.job.name, &plan)?;
        Ok(plan)
    }

    fn should_stop(&self) -> bool {
        *self.stop.borrow() || *self.abort.borrow()
    }

    /// Calls `step` until it succeeds, fails for good, or runs out of attempts.
    async fn with_retry<T, F, Fut>(&self, what: &str, mut step: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut attempt = 1;
        loop {
            match step().await {
                Ok(value) => return Ok(value),
                Err(error)
                    if retry::is_transient(&error) && attempt < self.job.retry.max_attempts && !self.should_stop() =>
                {
                    attempt += 1;
                    let wait = retry::backoff(&self.job.retry, attempt);
                    log::warn!("{what}: {error}; attempt {attempt} of {} in {:?}", self.job.retry.max_attempts, wait);
                    let mut stop = self.stop.clone();
                    let mut abort = self.abort.subscribe();
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.wait_for(|stopped| *stopped) => {}
                        _ = abort.wait_for(|aborted| *aborted) => {}
                    }
                }
                Err(error) => return Err(error),
            }
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
        let target_table = Arc::new(TableSchema { name: stats.target.clone(), ..(*split.table).clone() });
        let mut writer = self.sink.open(&self.job.name, &split.id, target_table).await?;
        let recovered = writer.recover().await?;
        let mut rows_written = recovered.as_ref().map_or(0, |checkpoint| checkpoint.rows_written);
        let mut position = recovered.as_ref().and_then(|checkpoint| checkpoint.position.clone());
        if recovered.as_ref().is_some_and(|checkpoint| checkpoint.done) {
            TableStats::add(&stats.splits_done, 1);
            self.resumed_done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(());
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
                self.write_batch(split, stats, &mut *writer, &batch, &mut rows_written).await?;
                position = Some(batch.position.clone());
                // A closed ack channel means the producer is gone; the next receive says why.
                let _ = acks.send(batch.position);
                if self.should_stop() {
                    return Err(interrupted());
                }
            }
            let done = Checkpoint { task: split.id.clone(), position: position.clone(), done: true, rows_written };
            writer.commit(&done).await?;
            self.state.save_checkpoint(&self.job.name, &done)?;
            TableStats::add(&stats.splits_done, 1);
            Ok(())
        }
        .await;
        drop(received);
        producer.abort();
        outcome
    }

    /// Writes one batch, keeps its rejects, and commits it with its checkpoint.
    async fn write_batch(
        &self,
        split: &Split,
        stats: &TableStats,
        writer: &mut dyn crate::connector::Writer,
        batch: &Batch,
        rows_written: &mut u64,
    ) -> Result<()> {
        let rows = batch.changes.len() as u64;
        TableStats::add(&stats.rows_read, rows + batch.rejected.len() as u64);
        TableStats::add(&stats.bytes_read, batch.bytes);
        self.throttle.admit(rows, batch.bytes).await;
        let target_rejects = writer.write(batch).await?;
        let written = rows - target_rejects.len() as u64;
        let rejects: Vec<_> = batch.rejected.iter().cloned().chain(target_rejects).collect();
        if !rejects.is_empty() {
            // Dirty records are stored before the commit that moves past them, so a crash cannot
            // lose them; storing is idempotent, so a replay cannot count them twice.
            let total = self.state.record_dirty(&self.job.name, &split.id, &rejects)?;
            TableStats::add(&stats.rows_skipped, rejects.len() as u64);
            for reject in &rejects {
                log::warn!("dirty record in {} ({}): {}", reject.table, reject.key, reject.reason);
            }
            if total > self.job.errors.max_dirty_records {
                let last = rejects.last().expect("rejects is not empty");
                return Err(Error::new(
                    ErrorKind::Data,
                    format!(
                        "{total} dirty records exceed errors.max_dirty_records = {}; the last: table {}, key {}: {}",
                        self.job.errors.max_dirty_records, last.table, last.key, last.reason
                    ),
                )
                .hint(
                    "fix the data or raise errors.max_dirty_records; the dirty records are kept in the state directory",
                ));
            }
        }
        *rows_written += written;
        let checkpoint = Checkpoint {
            task: split.id.clone(),
            position: Some(batch.position.clone()),
            done: false,
            rows_written: *rows_written,
        };
        writer.commit(&checkpoint).await?;
        TableStats::add(&stats.rows_written, written);
        self.state.save_checkpoint(&self.job.name, &checkpoint)?;
        Ok(())
    }
}

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
