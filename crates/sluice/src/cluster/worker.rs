//! The worker's work: claiming a task (placement rule in `node.rs`), running it with a fenced
//! sink on the leader's plan, reporting its status while it holds the task, and giving it up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::connector::Fence;
use sluice_core::retry::Restart;
use sluice_core::runner::{Runner, Scope};
use sluice_core::state::StateStore;
use sluice_core::{Error, ErrorKind, Result};
use tokio::sync::watch;

use super::model::*;
use super::node::{lock, Node, Running, View};
use super::store::{Guard, Store};
use crate::logger::timestamp;

/// A task this worker may claim at a tick.
struct Candidate<'a> {
    rank: f64,
    name: &'a str,
    /// Its place in the plan.
    index: usize,
    job: &'a JobRecord,
    plan: &'a PlanRecord,
    task: &'a TaskPlan,
    status: Option<&'a TaskStatus>,
}

impl Node {
    /// Claims one task when this worker has room and is among the least loaded: of the tasks
    /// ready to run, the one of highest rank (the job's priority, raised while it waits).
    /// Whether it claimed one.
    pub(super) async fn claim(self: &Arc<Self>, view: &View, lease: i64) -> Result<bool> {
        let (me, tasks_here) = (self.record(), lock(&self.running).len());
        if tasks_here >= me.capacity {
            return Ok(false);
        }
        let free = may_claim(&me, tasks_here, &view.workers);
        let now_ms = sluice_core::clock::unix_millis();
        // Every task that may be claimed, highest rank first (`model::claim_rank`).
        let mut candidates = Vec::new();
        for (name, job) in view.jobs() {
            let Some(plan) = view.plan(name).filter(|plan| plan.generation == job.generation && plan.error.is_none())
            else {
                continue;
            };
            // `placement:`: only nodes of its zone and labels claim its tasks.
            if job.desired != Desired::Running || !job.placement.admits(me.zone.as_deref(), &me.labels) {
                continue;
            }
            let (statuses, owned) = (view.statuses_of(name), view.owned_of(name));
            let status = |task: &str| statuses.get(task).copied().filter(|status| status.generation == job.generation);
            for (index, task) in plan.tasks.iter().enumerate() {
                let ended = status(&task.id)
                    .is_some_and(|status| matches!(status.state, TaskState::Succeeded | TaskState::Failed));
                let ready = task
                    .after
                    .iter()
                    .all(|before| status(before).is_some_and(|status| status.state == TaskState::Succeeded));
                if ended || !ready || owned.contains(task.id.as_str()) {
                    continue;
                }
                let rank = claim_rank(job.priority, job.generation, now_ms);
                candidates.push(Candidate { rank, name, index, job, plan, task, status: status(&task.id) });
            }
        }
        // Highest rank first; among equals the job that waits longest, then its largest task
        // (longest first: `placement.rs`), then the plan's order.
        candidates.sort_by(|a, b| {
            b.rank
                .total_cmp(&a.rank)
                .then(a.job.generation.cmp(&b.job.generation))
                .then(a.name.cmp(b.name))
                .then(b.task.estimated_rows.cmp(&a.task.estimated_rows))
                .then(a.index.cmp(&b.index))
        });
        for Candidate { name, job, plan, task, status, .. } in candidates {
            let key = owner_key(name, &task.id);
            // A task workers kept failing goes to another one while another has room.
            let restarting = status.filter(|status| status.state == TaskState::Restarting);
            // Its load is weighed against the workers that may run it.
            let placed: Vec<WorkerRecord>;
            let workers = if job.placement.is_any() {
                &view.workers
            } else {
                placed = admitted(&job.placement, &view.workers);
                &placed
            };
            let allowed = match restarting.filter(|status| !status.avoid.is_empty()) {
                Some(status) => may_claim_avoiding(&me, tasks_here, workers, &status.avoid),
                None if job.placement.is_any() => free,
                None => may_claim(&me, tasks_here, workers),
            };
            if !allowed {
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
            let guard = Guard { key, create_revision: epoch };
            // The view may be older than the task's last run, which then ended and gave the task
            // up before this claim: its status, read now, says whether it already ended.
            let status = match load::<TaskStatus>(&*self.store, &status_key(name, &task.id)).await {
                Ok(current) => current.map(|(status, _)| status).filter(|status| status.generation == job.generation),
                Err(error) => {
                    let _ = self.store.delete_guarded(&guard).await;
                    return Err(error);
                }
            };
            if status.as_ref().is_some_and(|status| matches!(status.state, TaskState::Succeeded | TaskState::Failed)) {
                self.store.delete_guarded(&guard).await?;
                continue;
            }
            log::info!("node {}: claimed task {name}/{} with epoch {epoch}", self.config.id, task.id);
            let (stop, stopped) = watch::channel(false);
            // The job's resync request as it is now; `stop_what_moved` hands on a new one.
            let (resync, resyncs) = watch::channel(job.resync.clone());
            lock(&self.running).insert(
                format!("{name}/{}", task.id),
                Running { stop, resync, generation: job.generation, guard: guard.clone() },
            );
            let (node, job, plan, task) = (self.clone(), job.clone(), plan.clone(), task.clone());
            let previous = status;
            let signals = TaskSignals { stop: stopped, resync: resyncs };
            tokio::spawn(async move { node.run_task(job, plan, task, guard, signals, previous).await });
            return Ok(true);
        }
        Ok(false)
    }

    /// Runs one claimed task to its end, reporting its status every second while it holds the
    /// task, then gives the task up. A run that fails for a reason that may heal is run again
    /// from its checkpoint under the job's `restart:` policy; after `move_after` failures in a
    /// row here, the task is handed over to another worker when one has room. `previous` is
    /// the task's last status in this generation, from the worker it was on: its restarts (when
    /// it was handed over restarting) and how fresh the target is (so the lag keeps growing
    /// from where it was, not from this claim) carry over.
    async fn run_task(
        self: Arc<Self>,
        job: JobRecord,
        plan: PlanRecord,
        task: TaskPlan,
        guard: Guard,
        signals: TaskSignals,
        previous: Option<TaskStatus>,
    ) {
        let TaskSignals { stop, resync } = signals;
        let name = format!("{}/{}", job.name, task.id);
        let status_key = status_key(&job.name, &task.id);
        let (fresh_through, log_backlog) =
            previous.as_ref().map_or((None, None), |status| (status.fresh_through, status.log_backlog));
        let restarting = previous.filter(|status| status.state == TaskState::Restarting);
        let (restarts, avoid) = restarting.map(|status| (status.restarts, status.avoid)).unwrap_or_default();
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
            restarts,
            avoid: Vec::new(),
            bytes_read: 0,
            transactions_applied: 0,
            fresh_through,
            latency: Vec::new(),
            latency_sum_ms: 0,
            log_backlog,
        };
        let mut avoid = avoid;
        let mut failed_here = 0;
        let mut policy = sluice_core::spec::RestartPolicy::default();
        // The job as the task last ran it: what a restart's wait asks whether the side that
        // failed answers again.
        let mut last_spec = None;
        // The resync request the task started with: a failure runs it again at once only for a
        // request that came later.
        let mut resync_ran_for = job.resync.as_ref().map(|request| request.id.clone());
        let (outcome, summary) = loop {
            let signals = TaskSignals { stop: stop.clone(), resync: resync.clone() };
            let (outcome, summary) = match self.prepare_task(&job, &plan, &task, &guard, signals).await {
                Ok((spec, runner)) => {
                    policy = spec.restart.clone();
                    last_spec = Some(spec.clone());
                    (status.state, status.error) = (TaskState::Running, None);
                    let (reported, reporting) = watch::channel(false);
                    let reporter = tokio::spawn(report(
                        self.store.clone(),
                        runner.stats(),
                        status.clone(),
                        status_key.clone(),
                        guard.clone(),
                        reporting,
                    ));
                    let (run, error) = runner.run().await;
                    // Awaited, not aborted: a report in flight must land before the next status.
                    reported.send_replace(true);
                    let _ = reporter.await;
                    status = snapshot_status(&status, &runner.stats(), 0.0);
                    (error, Some(run))
                }
                Err(error)
                    if error.side() == Some(sluice_core::Side::State) && sluice_core::retry::is_transient(&error) =>
                {
                    // The coordination store failed, not the task: give it back to be claimed again
                    // (once the store answers: until then the task stays owned here).
                    log::warn!("node {}: task {name} could not start: {error}", self.config.id);
                    self.until_answered(&name, "give it up", || self.store.delete_guarded(&guard)).await;
                    self.forget(&name);
                    return;
                }
                Err(error) => (Some(error), None),
            };
            let Some(error) = outcome.as_ref().filter(|_| !*stop.borrow()) else { break (outcome, summary) };
            if task.kind == TaskKind::Cdc && self.resync_arrived(&job.name, &name, &mut resync_ran_for).await {
                // A damaged table stops the stream; the resync asked for it starts it again.
                log::warn!(
                    "node {}: task {name} failed: {error}; a resync was asked meanwhile: runs again with it",
                    self.config.id
                );
                continue;
            }
            let progressed = summary.as_ref().is_some_and(|run| sluice_core::retry::ran_well(&policy, run));
            let wait = match status.restarts.failed(&policy, error, progressed, sluice_core::clock::unix_seconds()) {
                Restart::After(wait) => wait,
                Restart::GiveUp(reason) => {
                    let outcome = match outcome {
                        Some(error) if status.restarts.total > 0 && sluice_core::retry::is_transient(&error) => {
                            Some(error.context(format!("not restarted again: {reason}")))
                        }
                        other => other,
                    };
                    break (outcome, summary);
                }
            };
            if progressed {
                failed_here = 0;
                avoid.clear();
            }
            failed_here += 1;
            log::warn!(
                "node {}: task {name} failed: {error}; restart {} in {wait:?} ({} in a row)",
                self.config.id,
                status.restarts.total,
                status.restarts.in_a_row
            );
            status.state = TaskState::Restarting;
            status.error = Some(error.into());
            status.updated_at = timestamp();
            if let Ok(false) = self.store.put_guarded(&status_key, &encode(&status), &guard).await {
                break (Some(Error::new(ErrorKind::Fenced, "the task moved to another worker")), None);
            }
            let asked = last_spec
                .as_deref()
                .and_then(|spec| Some((sluice_connectors::source(spec).ok()?, sluice_connectors::sink(spec).ok()?)));
            let probe =
                asked.as_ref().and_then(|(source, sink)| sluice_core::retry::probe_of(error, &**source, &**sink));
            let mut stopping = stop.clone();
            tokio::select! {
                waited = sluice_core::retry::wait_to_restart(wait, probe) => {
                    if waited == sluice_core::retry::Waited::Answers {
                        log::info!(
                            "node {}: task {name}: the {} answers again; restarting now",
                            self.config.id,
                            error.side().map_or("", sluice_core::Side::name)
                        );
                    }
                }
                _ = stopping.wait_for(|stopped| *stopped) => {
                    break (Some(Error::new(ErrorKind::Interrupted, "stopped while waiting to restart")), None);
                }
            }
            if failed_here >= policy.move_after {
                let mut avoided = avoid.clone();
                avoided.push(self.config.id.clone());
                let workers = load_workers(&*self.store).await;
                if workers.is_ok_and(|workers| other_worker_has_room(&workers, &avoided)) {
                    status.avoid = avoided;
                    status.updated_at = timestamp();
                    if let Ok(true) = self.store.put_guarded(&status_key, &encode(&status), &guard).await {
                        log::warn!(
                            "node {}: task {name} failed {failed_here} times in a row here; handing it over to another worker",
                            self.config.id
                        );
                        self.until_answered(&name, "give it up", || self.store.delete_guarded(&guard)).await;
                        self.forget(&name);
                        return;
                    }
                    status.avoid.clear();
                }
            }
        };
        status.updated_at = timestamp();
        status.state = match &outcome {
            None => TaskState::Succeeded,
            Some(error) if matches!(error.kind(), ErrorKind::Interrupted) => TaskState::Stopped,
            Some(_) => TaskState::Failed,
        };
        status.error = outcome.as_ref().filter(|error| error.kind() != ErrorKind::Interrupted).map(Into::into);
        let deleted = matches!(load_job(&*self.store, &job.name).await, Ok(None));
        match &outcome {
            Some(error) if error.kind() == ErrorKind::Fenced => {
                self.fence_refusals.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                log::warn!("node {}: task {name} stopped: {error}", self.config.id);
            }
            _ if deleted => log::info!("node {}: task {name} stopped: its job was deleted", self.config.id),
            _ => {
                if let Some(error) = &outcome {
                    log::warn!("node {}: task {name} ended: {error}", self.config.id);
                }
                // The end is recorded even when the coordination store is out for a while:
                // until it is, the task stays here, owned, and is not run again elsewhere.
                if let Some(summary) = &summary {
                    let run_key = format!("{}{}-{}", runs_prefix(&job.name), timestamp(), task.id);
                    let text = serde_json::to_string(summary).unwrap_or_default();
                    if let Err(error) = self.store.put_guarded(&run_key, &text, &guard).await {
                        log::warn!("node {}: could not record the run of task {name}: {error}", self.config.id);
                    }
                }
                let record = encode(&status);
                let recorded = self
                    .until_answered(&name, "record its end", || self.store.put_guarded(&status_key, &record, &guard))
                    .await;
                match recorded {
                    Some(true) => log::info!("node {}: task {name} {:?}", self.config.id, status.state),
                    Some(false) => {
                        log::warn!("node {}: task {name} moved to another worker before it ended here", self.config.id)
                    }
                    None => {}
                }
            }
        }
        self.until_answered(&name, "give it up", || self.store.delete_guarded(&guard)).await;
        self.forget(&name);
    }

    /// Repeats a write of task `name` to the coordination store until the store answers; `None`
    /// when it refused the write for a reason a retry will not fix (logged).
    async fn until_answered<T, Write, Written>(&self, name: &str, what: &str, mut write: Write) -> Option<T>
    where
        Write: FnMut() -> Written,
        Written: std::future::Future<Output = Result<T>>,
    {
        let mut wait = Duration::from_millis(200);
        let mut warned = false;
        loop {
            match write().await {
                Ok(value) => return Some(value),
                Err(error) if !sluice_core::retry::is_transient(&error) => {
                    log::warn!("node {}: task {name} could not {what}: {error}", self.config.id);
                    return None;
                }
                Err(error) => {
                    if !std::mem::replace(&mut warned, true) {
                        log::warn!(
                            "node {}: task {name} cannot {what} yet ({error}); trying until the coordination store answers",
                            self.config.id
                        );
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Whether the job holds a resync request the task has not run again for (read from the
    /// store, not at the next tick): then the task is told it and `ran_for` records it. A request
    /// handed to the running stream may not have been taken in when the stream failed (a damaged
    /// table stops it between groups), so being told is not enough: each request the task did
    /// not start with is worth one run at once.
    async fn resync_arrived(&self, job: &str, task: &str, ran_for: &mut Option<String>) -> bool {
        let Ok(Some(current)) = super::model::load_job(&*self.store, job).await else { return false };
        let Some(request) = current.resync else { return false };
        if ran_for.as_deref() == Some(request.id.as_str()) {
            return false;
        }
        *ran_for = Some(request.id.clone());
        if let Some(running) = lock(&self.running).get(task) {
            running.resync.send_replace(Some(request));
        }
        true
    }

    async fn prepare_task(
        &self,
        job: &JobRecord,
        plan: &PlanRecord,
        task: &TaskPlan,
        guard: &Guard,
        signals: TaskSignals,
    ) -> Result<(Arc<sluice_core::spec::JobSpec>, Arc<Runner>)> {
        let TaskSignals { stop, resync } = signals;
        // While added tables are copied, the stream runs the version before them.
        let version = match task.kind {
            TaskKind::Cdc => plan.stream_version.unwrap_or(plan.version),
            TaskKind::Snapshot => plan.version,
        };
        let spec = Arc::new(load_spec(&*self.store, &self.config.document_rules, &job.name, version).await?);
        let source = sluice_connectors::source(&spec)?;
        let sink = if self.config.fencing {
            sluice_connectors::fenced_sink(&spec, Fence { task: task.id.clone(), epoch: guard.create_revision })?
        } else {
            sluice_connectors::sink(&spec)?
        };
        // The task runs its part of the leader's plan as it is: no discovery, no splitting.
        let Some(whole) = load_plan(&*self.store, &job.name, plan).await? else {
            return Err(Error::new(ErrorKind::State, format!("job {} has no plan for task {}", job.name, task.id))
                .on(sluice_core::Side::State));
        };
        let group = match (task.splits, task.tables.first()) {
            (Some(range), Some(table)) => Some(range.ids(&whole, table)?),
            (Some(_), None) => {
                return Err(Error::new(
                    ErrorKind::State,
                    format!("task {} names splits its plan does not have", task.id),
                ))
            }
            (None, _) => None,
        };
        let copied = match (task.kind, &group) {
            (TaskKind::Snapshot, None) => copied_by_groups(&whole, plan, task)?,
            _ => Default::default(),
        };
        let scope = match task.kind {
            TaskKind::Snapshot => match group {
                Some(ids) => Scope::Splits(ids.into_iter().collect()),
                None => Scope::Tables(task.tables.iter().cloned().collect()),
            },
            TaskKind::Cdc => Scope::Stream(
                plan.backfill.as_ref().filter(|backfill| backfill.copied).map(|backfill| backfill.backfill.clone()),
            ),
        };
        let state: Arc<dyn StateStore> = Arc::new(super::dirty::SharedState {
            local: self.state.clone(),
            store: self.store.clone(),
            node: self.config.id.clone(),
        });
        let mut runner = Runner::new(spec.clone(), source, sink, state, stop)
            .with_scope(scope)
            .with_plan(whole)
            .with_copied_splits(copied);
        if task.kind == TaskKind::Cdc {
            runner = runner.with_resync(resync);
        }
        Ok((spec, Arc::new(runner)))
    }
}

/// The splits a table's task finds copied by the groups it runs after (all of which succeeded:
/// it is claimed only then), so it builds the table's indexes without asking the target about
/// them. A target that keeps checkpoints in itself would find them done anyway; one that keeps
/// nothing across nodes (the blackhole) would copy them again, and count their rows twice.
fn copied_by_groups(
    whole: &sluice_core::state::Plan,
    plan: &PlanRecord,
    task: &TaskPlan,
) -> Result<std::collections::BTreeSet<String>> {
    let mut copied = std::collections::BTreeSet::new();
    for group in plan.tasks.iter().filter(|group| task.after.contains(&group.id)) {
        if let (Some(range), Some(table)) = (group.splits, group.tables.first()) {
            copied.extend(range.ids(whole, table)?);
        }
    }
    Ok(copied)
}

/// What a running task is told while it runs: to stop, and the job's resync request.
struct TaskSignals {
    stop: watch::Receiver<bool>,
    resync: watch::Receiver<Option<sluice_core::runner::ResyncRequest>>,
}

fn snapshot_status(base: &TaskStatus, stats: &sluice_core::stats::JobStats, rows_per_sec: f64) -> TaskStatus {
    let tables = stats.snapshot();
    let stream = stats.stream.summary();
    let streaming = stream.phase != sluice_core::stats::StreamPhase::NotStarted;
    let fresh_through = match stats.stream.fresh_through.load(std::sync::atomic::Ordering::Relaxed) {
        0 => base.fresh_through,
        through => Some(base.fresh_through.unwrap_or(0).max(through)),
    };
    let now = sluice_core::clock::unix_seconds();
    TaskStatus {
        rows_read: tables.iter().map(|table| table.rows_read).sum(),
        bytes_read: tables.iter().map(|table| table.bytes_read).sum(),
        transactions_applied: stream.transactions_applied,
        fresh_through,
        latency: if streaming { stats.stream.latency_counts() } else { Vec::new() },
        latency_sum_ms: stats.stream.latency_sum_ms.load(std::sync::atomic::Ordering::Relaxed),
        log_backlog: (*stats.stream.log_backlog.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
            .or(base.log_backlog),
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
        lag_secs: match fresh_through {
            Some(through) => Some(now.saturating_sub(through)),
            None => streaming.then_some(0),
        },
        position: stream.position.clone(),
        updated_at: timestamp(),
        ..base.clone()
    }
}

/// Writes a running task's status every second while its owner holds it, until `done`.
async fn report(
    store: Arc<dyn Store>,
    stats: Arc<sluice_core::stats::JobStats>,
    base: TaskStatus,
    key: String,
    guard: Guard,
    mut done: watch::Receiver<bool>,
) {
    let mut last = (Instant::now(), 0u64);
    let mut failing = false;
    while !*done.borrow() {
        let elapsed = last.0.elapsed().as_secs_f64().max(0.001);
        let status = snapshot_status(&base, &stats, 0.0);
        let rate = status.rows_written.saturating_sub(last.1) as f64 / elapsed;
        last = (Instant::now(), status.rows_written);
        let status = TaskStatus { rows_per_sec: rate, ..status };
        match store.put_guarded(&key, &encode(&status), &guard).await {
            Ok(true) => failing = false,
            Ok(false) => {
                log::info!("task {key}: no longer owned here; its status is left to its owner");
                return;
            }
            Err(error) => {
                if !std::mem::replace(&mut failing, true) {
                    log::warn!("task {key}: could not report its status: {error}");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = done.changed() => {}
        }
    }
}
