//! One server node: it advertises itself as a worker, competes to lead, and runs the tasks it
//! claims. The same code runs a single-node server (on a `MemoryStore`) and a cluster member
//! (on etcd).
//!
//! Placement rule: a worker claims a task only while it has a free slot (`capacity`) and its
//! load (tasks ÷ capacity) is not above the least loaded live worker with a free slot; it
//! claims at most one task per tick (500 ms), so work spreads across workers as they report
//! their loads. Claiming is a create of the task's ownership key with the worker's lease: at
//! most one worker wins, and the key's create revision is the task's fencing epoch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::connector::Fence;
use sluice_core::runner::{Backfill, Runner, Scope, STREAM_TASK};
use sluice_core::spec::{parse_job, JobSpec};
use sluice_core::state::{MemoryStateStore, StateStore};
use sluice_core::{Error, ErrorKind, Result, TableName};
use tokio::sync::watch;

use super::model::*;
use super::store::{Entry, Guard, Store};
use crate::logger::timestamp;
use crate::state_store::SqliteStateStore;

/// How often a node looks at the cluster.
const TICK: Duration = Duration::from_millis(500);

/// What a node is told at start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: String,
    /// Where its API listens, as other nodes and clients reach it.
    pub address: String,
    /// How many tasks it runs at once.
    pub capacity: usize,
    /// The lease of its worker record and task ownerships.
    pub lease: Duration,
    pub state_dir: PathBuf,
    /// Whether task writes are fenced in the target (a cluster; a single node needs no fence).
    pub fencing: bool,
}

/// A task this node runs.
#[derive(Debug)]
struct Running {
    stop: watch::Sender<bool>,
    generation: u64,
    guard: Guard,
}

/// A server node.
pub struct Node {
    pub store: Arc<dyn Store>,
    pub config: NodeConfig,
    lease: Mutex<i64>,
    running: Mutex<BTreeMap<String, Running>>,
    /// Jobs this node, as leader, is planning now.
    planning: Mutex<BTreeSet<String>>,
    state: Arc<SqliteStateStore>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Node").field("id", &self.config.id).finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Everything a tick looks at, read once.
struct View {
    jobs: Vec<(String, JobRecord, Entry)>,
    plans: BTreeMap<String, PlanRecord>,
    owners: BTreeSet<String>,
    statuses: BTreeMap<String, TaskStatus>,
    workers: Vec<WorkerRecord>,
}

impl Node {
    pub async fn start(store: Arc<dyn Store>, config: NodeConfig) -> Result<Arc<Node>> {
        let state = Arc::new(SqliteStateStore::open(&config.state_dir)?);
        let deadline = Instant::now() + Duration::from_secs(30);
        let lease = loop {
            match store.grant(config.lease).await {
                Ok(lease) => break lease,
                Err(error) if Instant::now() < deadline => {
                    log::warn!("node {}: {error}; trying again", config.id);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => return Err(error),
            }
        };
        Ok(Arc::new(Node {
            store,
            config,
            lease: Mutex::new(lease),
            running: Mutex::new(BTreeMap::new()),
            planning: Mutex::new(BTreeSet::new()),
            state,
        }))
    }

    /// Runs the node until `shutdown`; then stops its tasks, waits for them to save their
    /// checkpoints, and gives its lease back so other workers take over at once.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        tokio::spawn(self.clone().keep_lease());
        let mut last_error = String::new();
        loop {
            match self.tick().await {
                Ok(()) => last_error.clear(),
                Err(error) => {
                    let message = error.to_string();
                    if message != last_error {
                        log::warn!("node {}: {message}", self.config.id);
                        last_error = message;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.wait_for(|stopped| *stopped) => break,
            }
        }
        log::info!("node {}: stopping its tasks", self.config.id);
        self.stop_all();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !lock(&self.running).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lease = *lock(&self.lease);
        if let Err(error) = self.store.revoke(lease).await {
            log::warn!("node {}: could not give its lease back ({error}); its tasks move when it ends", self.config.id);
        }
    }

    fn stop_all(&self) {
        for running in lock(&self.running).values() {
            running.stop.send_replace(true);
        }
    }

    /// Renews the lease three times per lease period. A lease that ended (the node was paused
    /// or cut off for longer than the lease) means its tasks may already run elsewhere: every
    /// task here is stopped at once, and the node starts over with a new lease.
    async fn keep_lease(self: Arc<Self>) {
        let period = self.config.lease / 3;
        let mut renewed = Instant::now();
        loop {
            tokio::time::sleep(period).await;
            let lease = *lock(&self.lease);
            let lost = match self.store.renew(lease).await {
                Ok(true) => {
                    renewed = Instant::now();
                    false
                }
                Ok(false) => true,
                Err(error) => {
                    log::warn!("node {}: {error}", self.config.id);
                    renewed.elapsed() > self.config.lease
                }
            };
            if lost {
                log::error!(
                    "node {}: its lease ended; stopping its tasks (they continue on other workers, fenced against this one)",
                    self.config.id
                );
                self.stop_all();
                match self.store.grant(self.config.lease).await {
                    Ok(lease) => {
                        *lock(&self.lease) = lease;
                        renewed = Instant::now();
                    }
                    Err(error) => log::warn!("node {}: {error}", self.config.id),
                }
            }
        }
    }

    async fn view(&self) -> Result<View> {
        let store = &*self.store;
        Ok(View {
            jobs: load_all(store, &format!("{ROOT}jobs/")).await?,
            plans: load_all::<PlanRecord>(store, &format!("{ROOT}plans/"))
                .await?
                .into_iter()
                .map(|(job, plan, _)| (job, plan))
                .collect(),
            owners: store.list(&format!("{ROOT}owners/")).await?.into_iter().map(|entry| entry.key).collect(),
            statuses: load_all::<TaskStatus>(store, &format!("{ROOT}tasks/"))
                .await?
                .into_iter()
                .map(|(key, status, _)| (key, status))
                .collect(),
            workers: load_all::<WorkerRecord>(store, &format!("{ROOT}workers/"))
                .await?
                .into_iter()
                .map(|(_, worker, _)| worker)
                .collect(),
        })
    }

    async fn tick(self: &Arc<Self>) -> Result<()> {
        let lease = *lock(&self.lease);
        let record = WorkerRecord {
            id: self.config.id.clone(),
            address: self.config.address.clone(),
            capacity: self.config.capacity,
            tasks: lock(&self.running).keys().cloned().collect(),
            started_at: String::new(),
        };
        self.store.put(&worker_key(&self.config.id), &encode(&record), Some(lease)).await?;
        let leader = match self.store.create(LEADER, &self.config.id, Some(lease)).await? {
            Some(revision) => {
                log::info!("node {}: leads the cluster", self.config.id);
                Some(revision)
            }
            None => self
                .store
                .get(LEADER)
                .await?
                .filter(|entry| entry.value == self.config.id)
                .map(|entry| entry.create_revision),
        };
        let view = self.view().await?;
        if let Some(revision) = leader {
            self.lead(&view, Guard { key: LEADER.to_owned(), create_revision: revision });
        }
        self.stop_what_moved(&view);
        self.claim(&view, lease).await
    }

    /// As leader: plans every job to run whose plan is missing or of an older generation, and
    /// takes added tables into the stream once their copy is complete.
    fn lead(self: &Arc<Self>, view: &View, guard: Guard) {
        for (name, job, _) in &view.jobs {
            if job.desired != Desired::Running {
                continue;
            }
            let current = view.plans.get(name).filter(|plan| plan.generation == job.generation);
            let copied = current.is_some_and(|plan| {
                plan.backfill.as_ref().is_some_and(|backfill| !backfill.copied)
                    && plan.tasks.iter().filter(|task| task.kind == TaskKind::Snapshot).all(|task| {
                        view.statuses.get(&format!("{name}/{}", task.id)).is_some_and(|status| {
                            status.generation == job.generation && status.state == TaskState::Succeeded
                        })
                    })
            });
            if (current.is_some() && !copied) || !lock(&self.planning).insert(name.clone()) {
                continue;
            }
            let (node, job, previous, guard) =
                (self.clone(), job.clone(), view.plans.get(name).cloned(), guard.clone());
            tokio::spawn(async move {
                let record = if copied {
                    node.join_backfill(&job, previous.expect("a current plan"), &guard).await
                } else {
                    Some(node.plan(&job, previous).await.unwrap_or_else(|error| {
                        log::error!("job {}: planning failed: {error}", job.name);
                        PlanRecord {
                            generation: job.generation,
                            version: job.version,
                            tasks: Vec::new(),
                            plan: None,
                            error: Some((&error).into()),
                            stream_version: None,
                            backfill: None,
                        }
                    }))
                };
                if let Some(record) = record.filter(|record| record.generation == job.generation) {
                    match node.store.put_guarded(&plan_key(&job.name), &encode(&record), &guard).await {
                        Ok(true) => log::info!(
                            "job {}: planned generation {} into {} tasks",
                            job.name,
                            job.generation,
                            record.tasks.len()
                        ),
                        Ok(false) => {
                            log::warn!("job {}: no longer the leader; the plan is left to the new one", job.name)
                        }
                        Err(error) => log::warn!("job {}: could not store the plan: {error}", job.name),
                    }
                }
                lock(&node.planning).remove(&job.name);
            });
        }
    }

    /// The added tables are copied: a new generation runs the stream alone, with every table
    /// and the backfill to take in. The plan is stored before the job moves to its generation,
    /// so no worker ever sees the new generation without it. Returns nothing to store.
    async fn join_backfill(&self, job: &JobRecord, plan: PlanRecord, guard: &Guard) -> Option<PlanRecord> {
        let generation = crate::api::next_generation(job.generation);
        let record = PlanRecord {
            generation,
            version: job.version,
            tasks: plan
                .tasks
                .iter()
                .filter(|task| task.kind == TaskKind::Cdc)
                .cloned()
                .map(|task| TaskPlan { after: Vec::new(), ..task })
                .collect(),
            plan: plan.plan,
            error: None,
            stream_version: None,
            backfill: plan.backfill.map(|backfill| BackfillPlan { copied: true, ..backfill }),
        };
        let moved = async {
            if !self.store.put_guarded(&plan_key(&job.name), &encode(&record), guard).await? {
                return Ok(false);
            }
            let updated = JobRecord { generation, backfill: None, updated_at: timestamp(), ..job.clone() };
            self.store.put(&job_key(&job.name), &encode(&updated), None).await?;
            Ok::<_, Error>(true)
        }
        .await;
        match moved {
            Ok(true) => log::info!("job {}: the added tables are copied; the stream takes them in", job.name),
            Ok(false) => log::warn!("job {}: no longer the leader; the backfill is left to the new one", job.name),
            Err(error) => log::warn!("job {}: could not take the added tables into the stream: {error}", job.name),
        }
        None
    }

    /// Discovers and splits the job's tables and prepares the target, keeping the split ids of
    /// the previous plan for tables it already had. With tables being added, the plan copies
    /// only them while the stream runs on with the version before.
    async fn plan(&self, job: &JobRecord, previous: Option<PlanRecord>) -> Result<PlanRecord> {
        let spec = Arc::new(load_spec(&*self.store, &job.name, job.version).await?);
        let state = Arc::new(MemoryStateStore::default());
        let previous_backfill = previous.as_ref().and_then(|previous| previous.backfill.clone());
        if let Some(plan) = previous.and_then(|previous| previous.plan) {
            state.save_plan(&job.name, &plan)?;
        }
        let source = sluice_connectors::source(&spec)?;
        let sink = sluice_connectors::sink(&spec)?;
        let added: Vec<TableName> =
            job.backfill.iter().flat_map(|request| &request.tables).map(|table| TableName::parse(table)).collect();
        // The stream goes back here for the added tables: before any of their rows is read.
        let from = match (&job.backfill, &previous_backfill) {
            (Some(request), Some(previous)) if previous.backfill.id == request.id => {
                Some(previous.backfill.from.clone())
            }
            (Some(_), _) => Some(source.log_position().await?.ok_or_else(|| {
                Error::new(ErrorKind::Config, "the source has no change log position to backfill from")
                    .on(sluice_core::Side::Source)
            })?),
            _ => None,
        };
        let (_stop, stop_requested) = watch::channel(false);
        let runner = Runner::new(spec.clone(), source, sink, state, stop_requested).splitting(added.clone());
        let plan = runner.plan_and_prepare().await?;
        let mut record = PlanRecord {
            generation: job.generation,
            version: job.version,
            tasks: tasks_of(spec.mode, &plan),
            plan: None,
            error: None,
            stream_version: None,
            // A backfill taken in stays with the stream's plans: its checkpoint says whether it
            // took it in.
            backfill: previous_backfill.filter(|backfill| backfill.copied),
        };
        if let (Some(request), Some(from)) = (&job.backfill, from) {
            record.tasks = snapshot_tasks(&plan, &added);
            record.tasks.push(TaskPlan {
                id: STREAM_TASK.to_owned(),
                kind: TaskKind::Cdc,
                tables: Vec::new(),
                after: Vec::new(),
            });
            record.stream_version = Some(request.stream_version);
            record.backfill = Some(BackfillPlan {
                backfill: Backfill { id: request.id.clone(), tables: added, from },
                copied: false,
            });
        }
        record.plan = Some(plan);
        Ok(record)
    }

    /// Stops the tasks here whose job stopped, changed generation, or moved to another owner.
    fn stop_what_moved(&self, view: &View) {
        let jobs: BTreeMap<&str, &JobRecord> = view.jobs.iter().map(|(name, job, _)| (name.as_str(), job)).collect();
        for (key, running) in lock(&self.running).iter() {
            let job = key.split('/').next().unwrap_or_default();
            let keep = jobs
                .get(job)
                .is_some_and(|job| job.desired == Desired::Running && job.generation == running.generation)
                && view.owners.contains(&running.guard.key);
            if !keep && !*running.stop.borrow() {
                log::info!("node {}: stopping task {key}: its job stopped, changed or the task moved", self.config.id);
                running.stop.send_replace(true);
            }
        }
    }

    /// Claims one task when this worker has room and is among the least loaded.
    async fn claim(self: &Arc<Self>, view: &View, lease: i64) -> Result<()> {
        let mine = lock(&self.running).len();
        if mine >= self.config.capacity {
            return Ok(());
        }
        let load = |tasks: usize, capacity: usize| tasks as f64 / capacity.max(1) as f64;
        let least = view
            .workers
            .iter()
            .filter(|worker| worker.id != self.config.id && worker.tasks.len() < worker.capacity)
            .map(|worker| load(worker.tasks.len(), worker.capacity))
            .fold(f64::INFINITY, f64::min);
        if load(mine, self.config.capacity) > least {
            return Ok(());
        }
        for (name, job, _) in &view.jobs {
            let Some(plan) =
                view.plans.get(name).filter(|plan| plan.generation == job.generation && plan.error.is_none())
            else {
                continue;
            };
            if job.desired != Desired::Running {
                continue;
            }
            let status = |task: &str| {
                view.statuses.get(&format!("{name}/{task}")).filter(|status| status.generation == job.generation)
            };
            for task in &plan.tasks {
                let ended = status(&task.id)
                    .is_some_and(|status| matches!(status.state, TaskState::Succeeded | TaskState::Failed));
                let ready = task
                    .after
                    .iter()
                    .all(|before| status(before).is_some_and(|status| status.state == TaskState::Succeeded));
                let key = owner_key(name, &task.id);
                if ended || !ready || view.owners.contains(&key) {
                    continue;
                }
                let owner = encode(&Owner { worker: self.config.id.clone(), generation: job.generation });
                let epoch = match self.store.create(&key, &owner, Some(lease)).await {
                    Ok(Some(epoch)) => epoch,
                    Ok(None) => continue,
                    Err(error) => {
                        // The claim may have landed without its answer: give it back, or the
                        // task would wait for this live worker's lease.
                        if let Ok(Some(entry)) = self.store.get(&key).await {
                            if entry.value == owner {
                                let guard = Guard { key: key.clone(), create_revision: entry.create_revision };
                                let _ = self.store.delete_guarded(&guard).await;
                            }
                        }
                        return Err(error);
                    }
                };
                log::info!("node {}: claimed task {name}/{} with epoch {epoch}", self.config.id, task.id);
                let (stop, stopped) = watch::channel(false);
                let guard = Guard { key, create_revision: epoch };
                lock(&self.running).insert(
                    format!("{name}/{}", task.id),
                    Running { stop, generation: job.generation, guard: guard.clone() },
                );
                let (node, job, plan, task) = (self.clone(), job.clone(), plan.clone(), task.clone());
                tokio::spawn(async move { node.run_task(job, plan, task, guard, stopped).await });
                return Ok(());
            }
        }
        Ok(())
    }

    /// Runs one claimed task to its end, reporting its status every second while it holds the
    /// task, then gives the task up.
    async fn run_task(
        self: Arc<Self>,
        job: JobRecord,
        plan: PlanRecord,
        task: TaskPlan,
        guard: Guard,
        stop: watch::Receiver<bool>,
    ) {
        let name = format!("{}/{}", job.name, task.id);
        let status_key = status_key(&job.name, &task.id);
        let mut status = TaskStatus {
            generation: job.generation,
            state: TaskState::Running,
            worker: self.config.id.clone(),
            epoch: guard.create_revision,
            phase: None,
            position: None,
            lag_secs: None,
            rows_read: 0,
            rows_written: 0,
            rows_skipped: 0,
            rows_per_sec: 0.0,
            error: None,
            updated_at: timestamp(),
        };
        let outcome = match self.prepare_task(&job, &plan, &task, &guard, stop).await {
            Ok(runner) => {
                let reporter = tokio::spawn(report(
                    self.store.clone(),
                    runner.stats(),
                    status.clone(),
                    status_key.clone(),
                    guard.clone(),
                ));
                let (summary, error) = runner.run().await;
                reporter.abort();
                status = snapshot_status(&status, &runner.stats(), 0.0);
                let run_key = format!("{}{}-{}", runs_prefix(&job.name), timestamp(), task.id);
                let _ = self
                    .store
                    .put_guarded(&run_key, &serde_json::to_string(&summary).unwrap_or_default(), &guard)
                    .await;
                error
            }
            Err(error) => Some(error),
        };
        status.updated_at = timestamp();
        status.state = match &outcome {
            None => TaskState::Succeeded,
            Some(error) if matches!(error.kind(), ErrorKind::Interrupted) => TaskState::Stopped,
            Some(_) => TaskState::Failed,
        };
        status.error = outcome.as_ref().filter(|error| error.kind() != ErrorKind::Interrupted).map(Into::into);
        match &outcome {
            Some(error) if error.kind() == ErrorKind::Fenced => {
                log::warn!("node {}: task {name} stopped: {error}", self.config.id);
            }
            _ => {
                if let Some(error) = &outcome {
                    log::warn!("node {}: task {name} ended: {error}", self.config.id);
                }
                match self.store.put_guarded(&status_key, &encode(&status), &guard).await {
                    Ok(true) => log::info!("node {}: task {name} {:?}", self.config.id, status.state),
                    Ok(false) => {
                        log::warn!("node {}: task {name} moved to another worker before it ended here", self.config.id)
                    }
                    Err(error) => {
                        log::warn!("node {}: could not record the end of task {name}: {error}", self.config.id)
                    }
                }
            }
        }
        let _ = self.store.delete_guarded(&guard).await;
        lock(&self.running).remove(&name);
    }

    async fn prepare_task(
        &self,
        job: &JobRecord,
        plan: &PlanRecord,
        task: &TaskPlan,
        guard: &Guard,
        stop: watch::Receiver<bool>,
    ) -> Result<Arc<Runner>> {
        // While added tables are copied, the stream runs the version before them.
        let version = match task.kind {
            TaskKind::Cdc => plan.stream_version.unwrap_or(plan.version),
            TaskKind::Snapshot => plan.version,
        };
        let spec = Arc::new(load_spec(&*self.store, &job.name, version).await?);
        let source = sluice_connectors::source(&spec)?;
        let sink = if self.config.fencing {
            sluice_connectors::fenced_sink(&spec, Fence { task: task.id.clone(), epoch: guard.create_revision })?
        } else {
            sluice_connectors::sink(&spec)?
        };
        // Each task keeps the leader's plan to itself: a stream of an older version must not
        // drop from it the splits of tables another task is copying.
        let state = Arc::new(TaskStateStore { node: self.state.clone(), plan: Mutex::new(plan.plan.clone()) });
        let scope = match task.kind {
            TaskKind::Snapshot => Scope::Tables(task.tables.iter().cloned().collect()),
            TaskKind::Cdc => Scope::Stream(
                plan.backfill.as_ref().filter(|backfill| backfill.copied).map(|backfill| backfill.backfill.clone()),
            ),
        };
        Ok(Arc::new(Runner::new(spec, source, sink, state, stop).with_scope(scope)))
    }
}

/// A task's state store: the node's store for checkpoints, dirty records, runs and stream
/// status, with the leader's plan kept per task.
struct TaskStateStore {
    node: Arc<SqliteStateStore>,
    plan: Mutex<Option<sluice_core::state::Plan>>,
}

impl StateStore for TaskStateStore {
    fn load_plan(&self, _job: &str) -> Result<Option<sluice_core::state::Plan>> {
        Ok(lock(&self.plan).clone())
    }
    fn save_plan(&self, _job: &str, plan: &sluice_core::state::Plan) -> Result<()> {
        *lock(&self.plan) = Some(plan.clone());
        Ok(())
    }
    fn save_checkpoint(&self, job: &str, checkpoint: &sluice_core::connector::Checkpoint) -> Result<()> {
        self.node.save_checkpoint(job, checkpoint)
    }
    fn checkpoints(&self, job: &str) -> Result<Vec<sluice_core::connector::Checkpoint>> {
        self.node.checkpoints(job)
    }
    fn record_dirty(&self, job: &str, task: &str, records: &[sluice_core::Rejected]) -> Result<u64> {
        self.node.record_dirty(job, task, records)
    }
    fn dirty_records(&self, job: &str) -> Result<Vec<sluice_core::Rejected>> {
        self.node.dirty_records(job)
    }
    fn record_run(&self, summary: &sluice_core::stats::RunSummary) -> Result<()> {
        self.node.record_run(summary)
    }
    fn save_stream_status(&self, job: &str, status: &sluice_core::stats::StreamSummary) -> Result<()> {
        self.node.save_stream_status(job, status)
    }
    fn stream_status(&self, job: &str) -> Result<Option<serde_json::Value>> {
        self.node.stream_status(job)
    }
}

/// The job document of a version, parsed with this node's environment.
pub async fn load_spec(store: &dyn Store, job: &str, version: u32) -> Result<JobSpec> {
    let (record, _) = load::<VersionRecord>(store, &version_key(job, version)).await?.ok_or_else(|| {
        Error::new(ErrorKind::State, format!("job {job} has no version {version} in the coordination store"))
    })?;
    parse_job(&record.document, record.format == "json", |name| std::env::var(name).ok()).map_err(|errors| {
        let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
        Error::config(format!("job {job} version {version} is not valid on this node: {}", listed.join("; ")))
            .hint("an environment variable the job names may be missing on this node")
    })
}

fn snapshot_status(base: &TaskStatus, stats: &sluice_core::stats::JobStats, rows_per_sec: f64) -> TaskStatus {
    let tables = stats.snapshot();
    let stream = stats.stream.summary();
    let streaming = stream.phase != sluice_core::stats::StreamPhase::NotStarted;
    TaskStatus {
        rows_read: tables.iter().map(|table| table.rows_read).sum(),
        rows_written: tables.iter().map(|table| table.rows_written).sum::<u64>() + stream.rows_applied,
        rows_skipped: tables.iter().map(|table| table.rows_skipped).sum(),
        rows_per_sec,
        phase: Some(if streaming {
            serde_json::to_value(stream.phase)
                .ok()
                .and_then(|phase| phase.as_str().map(str::to_owned))
                .unwrap_or_default()
        } else {
            "snapshotting".into()
        }),
        lag_secs: streaming.then_some(stream.lag_seconds),
        position: stream.position.clone(),
        updated_at: timestamp(),
        ..base.clone()
    }
}

/// Writes a running task's status every second while its owner holds it.
async fn report(
    store: Arc<dyn Store>,
    stats: Arc<sluice_core::stats::JobStats>,
    base: TaskStatus,
    key: String,
    guard: Guard,
) {
    let mut last = (Instant::now(), 0u64);
    loop {
        let elapsed = last.0.elapsed().as_secs_f64().max(0.001);
        let status = snapshot_status(&base, &stats, 0.0);
        let rate = status.rows_written.saturating_sub(last.1) as f64 / elapsed;
        last = (Instant::now(), status.rows_written);
        let status = TaskStatus { rows_per_sec: rate, ..status };
        match store.put_guarded(&key, &encode(&status), &guard).await {
            Ok(true) => {}
            Ok(false) => {
                log::info!("task {key}: no longer owned here; its status is left to its owner");
                return;
            }
            Err(error) => log::warn!("task {key}: could not report its status: {error}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
