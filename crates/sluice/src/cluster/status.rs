//! A job's status as the coordination store shows it: its state rolled up from the plan and its
//! tasks' statuses, their figures, its schedule and batches. The API answers with it (the
//! OpenAPI document derives from these types) and the leader's alarms evaluate it.

use serde::Serialize;
use serde_json::Value;
use sluice_core::Result;
use utoipa::ToSchema;

use super::model::*;
use super::store::Store;

/// A job's state, rolled up from its plan and tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Scheduled, and waiting for its first batch.
    Scheduled,
    /// Its plan of this generation does not exist yet.
    Pending,
    Running,
    /// A task failed for a reason that may heal and runs again from its checkpoint after a
    /// backoff (`restarts` counts them, `error` is the last failure).
    Restarting,
    /// Every task succeeded.
    Succeeded,
    /// Planning or a task failed (`error` says which and on what side).
    Failed,
    /// The operator stopped it.
    Stopped,
}

/// The error that failed a task or a plan.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorView {
    /// `source`, `target` or `state` (the coordination store), when known.
    pub side: Option<String>,
    pub message: String,
}

impl From<&ErrorRecord> for ErrorView {
    fn from(error: &ErrorRecord) -> ErrorView {
        ErrorView { side: error.side.clone(), message: error.message.clone() }
    }
}

/// A job's counters, summed over its tasks.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobStatsView {
    pub rows_read: u64,
    pub rows_written: u64,
    pub rows_skipped: u64,
    pub rows_per_sec: f64,
    /// The largest lag of its change stream, in seconds.
    pub lag_secs: Option<u64>,
    /// Bytes of the source's log past its change stream's checkpoint.
    pub log_behind_bytes: Option<u64>,
    /// Older log files the source still keeps before that checkpoint's (0: the next purge of
    /// the source's log may lose the stream's position).
    pub log_files_to_spare: Option<u64>,
    /// Rows that differed between target and source at the job's last verification; `None`
    /// when it was never verified.
    pub verify_differences: Option<u64>,
}

/// One task of a job's plan: which worker runs it, with what epoch, and how far it is.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskView {
    pub id: String,
    /// `snapshot` or `cdc`.
    pub kind: String,
    /// `pending`, `running`, `restarting`, `succeeded`, `failed` or `stopped`.
    pub state: String,
    pub worker: Option<String>,
    /// The fencing epoch of the claim that runs it.
    pub epoch: Option<u64>,
    /// The change stream's position committed in the target (connector-defined JSON).
    #[schema(value_type = Option<Object>)]
    pub position: Option<Value>,
    pub lag_secs: Option<u64>,
    pub rows_read: u64,
    pub rows_written: u64,
    pub updated_at: Option<String>,
    /// Its last error; while `restarting`, the failure it restarts from.
    pub error: Option<ErrorView>,
    /// Times it was run again after a failure that may heal, in this generation.
    pub restarts: u32,
    /// Why a pending task is not claimed, when the job's `placement:` is the reason: no live node
    /// has its zone and labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// A job as `GET /jobs/{name}` shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobView {
    pub name: String,
    pub state: JobState,
    /// While running: `snapshotting`, `catching_up` or `streaming`.
    pub phase: Option<String>,
    pub version: u32,
    pub mode: String,
    pub generation: u64,
    /// Its `priority:`: when workers lack room, higher goes first.
    pub priority: u32,
    pub stats: JobStatsView,
    pub tasks: Vec<TaskView>,
    /// The planning error, else the first failed task's, else the last failure of a task
    /// that is restarting.
    pub error: Option<ErrorView>,
    /// Restarts of its tasks in this generation.
    pub restarts: u32,
    /// Tables added to the running job and still being copied.
    pub backfill: Option<Vec<String>>,
    /// Its schedule and batches, for a job with `schedule:`.
    pub schedule: Option<ScheduleView>,
    /// A stream job stopped or failed: the change log its source keeps for it meanwhile (a
    /// PostgreSQL replication slot's WAL), as the leader last measured it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_log: Option<super::held_log::HeldLog>,
    pub updated_at: String,
}

/// A batch asked for (`POST /jobs/{name}/batches`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchQueued {
    pub name: String,
    /// The number it will run as.
    pub batch: u64,
    /// The batches it runs again, for a rerun.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<BatchRangeView>,
}

/// Batches `from` to `to`, both included.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct BatchRangeView {
    pub from: u64,
    pub to: u64,
}

impl From<BatchRange> for BatchRangeView {
    fn from(range: BatchRange) -> BatchRangeView {
        BatchRangeView { from: range.from, to: range.to }
    }
}

/// Rows a batch read, wrote and skipped.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct BatchRowsView {
    pub read: u64,
    pub written: u64,
    pub skipped: u64,
}

/// A scheduled job's batches.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ScheduleView {
    /// The schedule, e.g. `every 60 s`, ``cron `0 2 * * *` (Europe/Paris)`` or
    /// `after load-orders (on failure: skip)`.
    pub schedule: String,
    /// The last batch fired; 0 before the first.
    pub batch: u64,
    /// The next firing (RFC 3339, UTC).
    pub next_at: Option<String>,
    /// A firing waits for the running batch to end (`overlap: queue`).
    pub queued: bool,
    /// The latest firings, oldest first.
    pub history: Vec<BatchView>,
}

/// One firing of a schedule: a batch run, or a firing skipped.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BatchView {
    /// The batch number; absent for a skipped firing.
    pub batch: Option<u64>,
    /// When it was due (RFC 3339, UTC).
    pub due_at: Option<String>,
    pub fired_at: Option<String>,
    /// When the batch was seen to end (RFC 3339, UTC).
    pub ended_at: Option<String>,
    /// The batches it ran again, for a rerun.
    pub rerun_of: Option<BatchRangeView>,
    /// What it did, once it ended.
    pub rows: Option<BatchRowsView>,
    pub generation: Option<u64>,
    /// `running` (the current batch), `succeeded`, `failed`, or `skipped: why`.
    pub outcome: String,
}

pub fn time_of(seconds: i64) -> Option<String> {
    chrono::DateTime::from_timestamp(seconds, 0).map(|time| time.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

fn schedule_view(job: &JobRecord, state: JobState) -> Option<ScheduleView> {
    if !job.batched() {
        return None;
    }
    let schedule = match &job.schedule {
        Some(schedule) => schedule.to_string(),
        None => {
            let jobs: Vec<String> = job
                .after
                .iter()
                .map(|dependency| format!("{} (on failure: {})", dependency.job, dependency.on_failure))
                .collect();
            format!("after {}", jobs.join(", "))
        }
    };
    let batches = job.batches.clone().unwrap_or_default();
    let history = batches
        .history
        .iter()
        .map(|record| BatchView {
            batch: record.batch,
            due_at: time_of(record.due_at),
            fired_at: record.fired_at.clone(),
            ended_at: record.ended_at.clone(),
            rerun_of: record.rerun_of.map(BatchRangeView::from),
            rows: record.rows.map(|rows| BatchRowsView {
                read: rows.read,
                written: rows.written,
                skipped: rows.skipped,
            }),
            generation: record.generation,
            outcome: match &record.outcome {
                Some(outcome) => outcome.clone(),
                // The current batch, until the leader records how it ended.
                None if state == JobState::Succeeded => "succeeded".into(),
                None if state == JobState::Failed => "failed".into(),
                None if state == JobState::Stopped => "stopped".into(),
                None => "running".into(),
            },
        })
        .collect();
    Some(ScheduleView {
        schedule,
        batch: batches.batch,
        next_at: batches.due_at.and_then(time_of),
        queued: batches.queued,
        history,
    })
}

/// A job as `GET /jobs/{name}` shows it. State: `stopped` when stopped; `pending` until its
/// plan of this generation exists; `failed` when planning or a task failed; `succeeded` when
/// every task did; `running` otherwise, with the phase of its most advanced task.
pub async fn job_view(store: &dyn Store, job: &JobRecord) -> Result<JobView> {
    let plan = load::<PlanRecord>(store, &plan_key(&job.name))
        .await?
        .map(|(plan, _)| plan)
        .filter(|plan| plan.generation == job.generation);
    let statuses: Vec<(String, TaskStatus, _)> = load_all(store, &statuses_prefix(&job.name)).await?;
    let owners: Vec<(String, Owner, _)> = load_all(store, &owners_prefix(&job.name)).await?;
    let status_of = |task: &str| {
        statuses
            .iter()
            .find(|(id, status, _)| id == task && status.generation == job.generation)
            .map(|(_, status, _)| status)
    };
    let now = sluice_core::clock::unix_seconds();
    // With a `placement:` that no live node meets, a pending task says what it waits for.
    let unplaced = if job.placement.is_any() {
        None
    } else {
        let workers: Vec<WorkerRecord> =
            load_all(store, &format!("{ROOT}workers/")).await?.into_iter().map(|(_, worker, _)| worker).collect();
        admitted(&job.placement, &workers)
            .is_empty()
            .then(|| format!("a live node of {} (the job's placement:); none is up", job.placement))
    };
    let mut tasks = Vec::new();
    let mut stats = JobStatsView {
        rows_read: 0,
        rows_written: 0,
        rows_skipped: 0,
        rows_per_sec: 0.0,
        lag_secs: None,
        log_behind_bytes: None,
        log_files_to_spare: None,
        verify_differences: last_verification(store, &job.name).await?.map(|last| last.report.differences_total),
    };
    let (mut all_succeeded, mut failed, mut phase) = (true, None::<ErrorView>, None::<String>);
    let (mut restarting, mut restarts) = (None::<ErrorView>, 0);
    for task in plan.iter().flat_map(|plan| &plan.tasks) {
        let status = status_of(&task.id);
        let owner = owners
            .iter()
            .find(|(id, owner, _)| *id == task.id && owner.generation == job.generation)
            .map(|(_, owner, _)| owner);
        let state = match (status, owner) {
            (Some(status), _) if status.state != TaskState::Running => serde_name(&status.state),
            (_, Some(_)) => "running".to_owned(),
            _ => "pending".to_owned(),
        };
        all_succeeded &= status.is_some_and(|status| status.state == TaskState::Succeeded);
        if let Some(status) = status {
            stats.rows_read += status.rows_read;
            stats.rows_written += status.rows_written;
            stats.rows_skipped += status.rows_skipped;
            if status.state == TaskState::Running && owner.is_some() {
                stats.rows_per_sec += status.rows_per_sec;
                if status.phase.is_some() && (phase.is_none() || task.kind == TaskKind::Cdc) {
                    phase = status.phase.clone();
                }
            }
            if let Some(backlog) = status.log_backlog.filter(|_| task.kind == TaskKind::Cdc) {
                stats.log_behind_bytes = Some(backlog.bytes_behind);
                stats.log_files_to_spare = Some(backlog.files_to_spare);
            }
            if let Some(task_lag) = status.lag_at(now) {
                stats.lag_secs = Some(stats.lag_secs.unwrap_or(0).max(task_lag));
            }
            if status.state == TaskState::Failed && failed.is_none() {
                failed = status.error.as_ref().map(ErrorView::from);
            }
            if status.state == TaskState::Restarting && restarting.is_none() {
                restarting = status.error.as_ref().map(ErrorView::from);
            }
            restarts += status.restarts.total;
        }
        let waiting_for = unplaced.clone().filter(|_| state == "pending");
        tasks.push(TaskView {
            id: task.id.clone(),
            kind: serde_name(&task.kind),
            state,
            worker: owner.map(|owner| owner.worker.clone()).or(status.map(|status| status.worker.clone())),
            epoch: status.map(|status| status.epoch),
            position: status.and_then(|status| status.position.clone()),
            lag_secs: status.and_then(|status| status.lag_at(now)),
            rows_read: status.map_or(0, |status| status.rows_read),
            rows_written: status.map_or(0, |status| status.rows_written),
            updated_at: status.map(|status| status.updated_at.clone()),
            error: status.and_then(|status| status.error.as_ref().map(ErrorView::from)),
            restarts: status.map_or(0, |status| status.restarts.total),
            waiting_for,
        });
    }
    let plan_error = plan.as_ref().and_then(|plan| plan.error.as_ref().map(ErrorView::from));
    let waiting = job.waiting_for_a_firing();
    let state = match (&job.desired, &plan) {
        (Desired::Stopped, _) => JobState::Stopped,
        _ if waiting => JobState::Scheduled,
        (_, None) => JobState::Pending,
        _ if plan_error.is_some() || failed.is_some() => JobState::Failed,
        _ if restarting.is_some() => JobState::Restarting,
        _ if all_succeeded => JobState::Succeeded,
        _ => JobState::Running,
    };
    Ok(JobView {
        name: job.name.clone(),
        state,
        phase: if state == JobState::Running { phase.or(Some("snapshotting".into())) } else { None },
        version: job.version,
        mode: job.mode.clone(),
        generation: job.generation,
        priority: job.priority,
        stats,
        tasks,
        error: plan_error.or(failed).or(restarting),
        restarts,
        backfill: job.backfill.as_ref().map(|backfill| backfill.tables.clone()),
        schedule: schedule_view(job, state),
        held_log: match state {
            JobState::Stopped | JobState::Failed => {
                load::<super::held_log::HeldLog>(store, &super::held_log::held_log_key(&job.name))
                    .await?
                    .map(|(held, _)| held)
            }
            _ => None,
        },
        updated_at: job.updated_at.clone(),
    })
}

/// The serde name of a unit enum value (`TaskState::Succeeded` → `succeeded`).
pub fn serde_name(value: &impl Serialize) -> String {
    serde_json::to_value(value).ok().and_then(|value| value.as_str().map(str::to_owned)).unwrap_or_default()
}
