//! What the API shows of a job: its state rolled up from the plan and its tasks' statuses, and
//! the Prometheus metrics.

use serde_json::{json, Value};
use sluice_core::Result;

use crate::cluster::model::*;
use crate::cluster::store::Store;

/// A job as `GET /jobs/{name}` shows it. State: `stopped` when stopped; `pending` until its
/// plan of this generation exists; `failed` when planning or a task failed; `succeeded` when
/// every task did; `running` otherwise, with the phase of its most advanced task.
pub async fn job_view(store: &dyn Store, job: &JobRecord) -> Result<Value> {
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
    let mut tasks = Vec::new();
    let (mut rows_read, mut rows_written, mut rows_skipped, mut rows_per_sec, mut lag) = (0, 0, 0, 0.0, None::<u64>);
    let (mut all_succeeded, mut failed, mut phase) = (true, None, None::<String>);
    for task in plan.iter().flat_map(|plan| &plan.tasks) {
        let status = status_of(&task.id);
        let owner = owners
            .iter()
            .find(|(id, owner, _)| *id == task.id && owner.generation == job.generation)
            .map(|(_, owner, _)| owner);
        let state = match (status, owner) {
            (Some(status), _) if status.state != TaskState::Running => {
                serde_json::to_value(status.state).unwrap_or_default()
            }
            (_, Some(_)) => json!("running"),
            _ => json!("pending"),
        };
        all_succeeded &= status.is_some_and(|status| status.state == TaskState::Succeeded);
        if let Some(status) = status {
            rows_read += status.rows_read;
            rows_written += status.rows_written;
            rows_skipped += status.rows_skipped;
            if status.state == TaskState::Running && owner.is_some() {
                rows_per_sec += status.rows_per_sec;
                if status.phase.is_some() && (phase.is_none() || task.kind == TaskKind::Cdc) {
                    phase = status.phase.clone();
                }
            }
            if let Some(task_lag) = status.lag_secs {
                lag = Some(lag.unwrap_or(0).max(task_lag));
            }
            if status.state == TaskState::Failed && failed.is_none() {
                failed = status.error.clone();
            }
        }
        tasks.push(json!({
            "id": task.id,
            "kind": task.kind,
            "state": state,
            "worker": owner.map(|owner| owner.worker.clone()).or(status.map(|status| status.worker.clone())),
            "epoch": status.map(|status| status.epoch),
            "position": status.and_then(|status| status.position.clone()),
            "lag_secs": status.and_then(|status| status.lag_secs),
            "rows_read": status.map_or(0, |status| status.rows_read),
            "rows_written": status.map_or(0, |status| status.rows_written),
            "updated_at": status.map(|status| status.updated_at.clone()),
            "error": status.and_then(|status| status.error.clone()),
        }));
    }
    let plan_error = plan.as_ref().and_then(|plan| plan.error.clone());
    let state = match (&job.desired, &plan) {
        (Desired::Stopped, _) => "stopped",
        (_, None) => "pending",
        _ if plan_error.is_some() || failed.is_some() => "failed",
        _ if all_succeeded => "succeeded",
        _ => "running",
    };
    Ok(json!({
        "name": job.name,
        "state": state,
        "phase": if state == "running" { phase.or(Some("snapshotting".into())) } else { None },
        "version": job.version,
        "mode": job.mode,
        "generation": job.generation,
        "stats": { "rows_read": rows_read, "rows_written": rows_written, "rows_skipped": rows_skipped, "rows_per_sec": rows_per_sec, "lag_secs": lag },
        "tasks": tasks,
        "error": plan_error.or(failed),
        "backfill": job.backfill.as_ref().map(|backfill| &backfill.tables),
        "updated_at": job.updated_at,
    }))
}

/// Prometheus text: per task rows and lag, per job state, and the live workers.
pub async fn metrics(store: &dyn Store) -> Result<String> {
    let mut text = String::new();
    text.push_str("# HELP sluice_task_rows_written Rows a task wrote (snapshot) or applied (cdc) in its generation.\n# TYPE sluice_task_rows_written gauge\n");
    let statuses: Vec<(String, TaskStatus, _)> = load_all(store, &format!("{ROOT}tasks/")).await?;
    for (key, status, _) in &statuses {
        let (job, task) = key.split_once('/').unwrap_or((key, ""));
        text.push_str(&format!("sluice_task_rows_written{{job=\"{job}\",task=\"{task}\"}} {}\n", status.rows_written));
    }
    text.push_str("# HELP sluice_task_lag_seconds Seconds behind the source of a change stream.\n# TYPE sluice_task_lag_seconds gauge\n");
    for (key, status, _) in &statuses {
        let (job, task) = key.split_once('/').unwrap_or((key, ""));
        if let Some(lag) = status.lag_secs {
            text.push_str(&format!("sluice_task_lag_seconds{{job=\"{job}\",task=\"{task}\"}} {lag}\n"));
        }
    }
    text.push_str(
        "# HELP sluice_job_running Whether the job is running (1) or not (0).\n# TYPE sluice_job_running gauge\n",
    );
    for (name, job, _) in load_all::<JobRecord>(store, &format!("{ROOT}jobs/")).await? {
        let state = job_view(store, &job).await?["state"].as_str().unwrap_or_default().to_owned();
        text.push_str(&format!(
            "sluice_job_running{{job=\"{name}\",state=\"{state}\"}} {}\n",
            u8::from(state == "running")
        ));
    }
    let workers = store.list(&format!("{ROOT}workers/")).await?.len();
    text.push_str(&format!(
        "# HELP sluice_workers Live workers.\n# TYPE sluice_workers gauge\nsluice_workers {workers}\n"
    ));
    Ok(text)
}
