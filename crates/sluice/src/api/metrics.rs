//! `/metrics` in the Prometheus text format (version 0.0.4), read from what every worker
//! reports to the coordination store: any node answers for the whole cluster.
//!
//! Per task (labels `job`, `task`, `worker`): rows and bytes read, rows written and skipped,
//! source transactions applied, rows per second, lag, restarts, the apply-latency histogram,
//! the source's log past a stream's checkpoint (bytes, files, files the source keeps before it).
//! Per job: its state, dirty records, the differences its last verification found, alarms
//! firing. Per worker: tasks, capacity, fence
//! refusals; and which worker leads.

use std::fmt::Write;

use sluice_core::stats::LATENCY_BOUNDS_MS;
use sluice_core::Result;

use super::views::{job_view, serde_name, JobState};
use crate::cluster::model::*;
use crate::cluster::store::Store;

/// A label value escaped as the text format requires: backslash, double quote and newline.
pub fn escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for character in value.chars() {
        match character {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            other => escaped.push(other),
        }
    }
    escaped
}

/// One metric family being written: its header once, then its samples.
struct Family<'a> {
    text: &'a mut String,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn new(text: &'a mut String, name: &'static str, kind: &str, help: &str) -> Family<'a> {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        Family { text, name }
    }

    fn sample(&mut self, suffix: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        let labels: Vec<String> = labels.iter().map(|(name, value)| format!("{name}=\"{}\"", escape(value))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        let _ = writeln!(self.text, "{}{suffix}{labels} {value}", self.name);
    }
}

/// A per-task counter family: its name, help text and how to read it from a task's status.
type Counter = (&'static str, &'static str, fn(&TaskStatus) -> u64);

/// The whole `/metrics` page.
pub async fn render(store: &dyn Store) -> Result<String> {
    let now = sluice_core::clock::unix_seconds();
    let mut text = String::new();
    let statuses: Vec<(String, TaskStatus, _)> = load_all(store, &format!("{ROOT}tasks/")).await?;
    let jobs: Vec<(String, JobRecord, _)> = load_all(store, &format!("{ROOT}jobs/")).await?;
    // Only the statuses of each job's current generation: older ones are history.
    let current: Vec<(&str, &str, &TaskStatus)> = statuses
        .iter()
        .filter_map(|(key, status, _)| {
            let (job, task) = key.split_once('/')?;
            let record = jobs.iter().find(|(name, _, _)| name == job)?;
            (record.1.generation == status.generation).then_some((job, task, status))
        })
        .collect();
    let counters: [Counter; 6] = [
        ("sluice_task_rows_read_total", "Rows a task read from the source in its generation.", |status| {
            status.rows_read
        }),
        (
            "sluice_task_rows_written_total",
            "Rows a task wrote (snapshot) or applied (change stream) in its generation.",
            |status| status.rows_written,
        ),
        ("sluice_task_rows_skipped_total", "Rows a task kept as dirty records instead of writing them.", |status| {
            status.rows_skipped
        }),
        ("sluice_task_bytes_read_total", "Bytes a task read from the source in its generation.", |status| {
            status.bytes_read
        }),
        ("sluice_task_transactions_applied_total", "Source transactions a change stream applied.", |status| {
            status.transactions_applied
        }),
        ("sluice_task_restarts_total", "Times a task was run again from its checkpoint after a failure.", |status| {
            u64::from(status.restarts.total)
        }),
    ];
    for (name, help, value) in counters {
        let mut family = Family::new(&mut text, name, "counter", help);
        for (job, task, status) in &current {
            family.sample("", &[("job", job), ("task", task), ("worker", &status.worker)], value(status));
        }
    }
    let mut family = Family::new(&mut text, "sluice_task_rows_per_second", "gauge", "Rows a task writes per second.");
    for (job, task, status) in &current {
        family.sample("", &[("job", job), ("task", task), ("worker", &status.worker)], status.rows_per_sec);
    }
    let mut family = Family::new(
        &mut text,
        "sluice_task_lag_seconds",
        "gauge",
        "Seconds the target is behind the source (a change stream): since the last source commit it holds.",
    );
    for (job, task, status) in &current {
        if let Some(lag) = status.lag_at(now) {
            family.sample("", &[("job", job), ("task", task), ("worker", &status.worker)], lag);
        }
    }
    type Backlog = (&'static str, &'static str, fn(&sluice_core::connector::LogBacklog) -> u64);
    let backlogs: [Backlog; 3] = [
        ("sluice_task_source_log_behind_bytes", "Bytes of the source's log past the stream's checkpoint.", |log| {
            log.bytes_behind
        }),
        (
            "sluice_task_source_log_behind_files",
            "Source log files from the stream's checkpoint on, its own included.",
            |log| log.files_behind,
        ),
        (
            "sluice_task_source_log_files_to_spare",
            "Older log files the source keeps before the checkpoint's: 0 means the next purge may lose the position.",
            |log| log.files_to_spare,
        ),
    ];
    for (name, help, read) in backlogs {
        let mut family = Family::new(&mut text, name, "gauge", help);
        for (job, task, status) in &current {
            if let Some(log) = &status.log_backlog {
                family.sample("", &[("job", job), ("task", task), ("worker", &status.worker)], read(log));
            }
        }
    }
    let mut family = Family::new(
        &mut text,
        "sluice_task_state",
        "gauge",
        "1 for the state a task is in (running, restarting, succeeded, failed, stopped).",
    );
    for (job, task, status) in &current {
        let state = serde_name(&status.state);
        family.sample("", &[("job", job), ("task", task), ("state", &state)], 1);
    }
    let mut family = Family::new(
        &mut text,
        "sluice_task_apply_latency_seconds",
        "histogram",
        "Source commit to target commit, per source transaction a change stream applied.",
    );
    for (job, task, status) in current.iter().filter(|(_, _, status)| !status.latency.is_empty()) {
        let mut cumulative = 0;
        for (index, count) in status.latency.iter().enumerate() {
            cumulative += count;
            let bound = match LATENCY_BOUNDS_MS.get(index) {
                Some(millis) => format!("{}", *millis as f64 / 1000.0),
                None => "+Inf".to_owned(),
            };
            family.sample("_bucket", &[("job", job), ("task", task), ("le", &bound)], cumulative);
        }
        family.sample("_sum", &[("job", job), ("task", task)], status.latency_sum_ms as f64 / 1000.0);
        family.sample("_count", &[("job", job), ("task", task)], cumulative);
    }

    let mut views = Vec::new();
    for (name, job, _) in &jobs {
        views.push((name, job_view(store, job).await?));
    }
    let mut family =
        Family::new(&mut text, "sluice_job_running", "gauge", "Whether the job is running (1) or not (0), by state.");
    for (name, view) in &views {
        let state = serde_name(&view.state);
        family.sample("", &[("job", name), ("state", &state)], u8::from(view.state == JobState::Running));
    }
    let mut family = Family::new(
        &mut text,
        "sluice_job_dirty_records",
        "gauge",
        "Rows of the job's current generation kept as dirty records (errors.max_dirty_records is the budget).",
    );
    for (name, view) in &views {
        family.sample("", &[("job", name)], view.stats.rows_skipped);
    }
    let mut family = Family::new(&mut text, "sluice_job_lag_seconds", "gauge", "The job's largest task lag.");
    for (name, view) in &views {
        if let Some(lag) = view.stats.lag_secs {
            family.sample("", &[("job", name)], lag);
        }
    }
    let mut family = Family::new(
        &mut text,
        "sluice_verify_differences",
        "gauge",
        "Rows that differed between target and source at the job's last verification (POST /jobs/NAME/verify).",
    );
    for (name, view) in &views {
        if let Some(differences) = view.stats.verify_differences {
            family.sample("", &[("job", name)], differences);
        }
    }

    let rules = crate::alarms::states(store).await?;
    let mut family = Family::new(
        &mut text,
        "sluice_job_alarms_firing",
        "gauge",
        "Alarm rules of the job firing now (its own `alarms:` and the global rules).",
    );
    for (name, _) in &views {
        let firing =
            rules.iter().filter(|rule| rule.job == **name && rule.phase == crate::alarms::Phase::Firing).count();
        family.sample("", &[("job", name)], firing);
    }

    let workers = load_workers(store).await?;
    let leader = store.get(LEADER).await?.map(|entry| entry.value).unwrap_or_default();
    let _ = writeln!(
        text,
        "# HELP sluice_workers Live workers.\n# TYPE sluice_workers gauge\nsluice_workers {}",
        workers.len()
    );
    let mut family = Family::new(&mut text, "sluice_worker_tasks", "gauge", "Tasks a worker runs.");
    for worker in &workers {
        family.sample("", &[("worker", &worker.id)], worker.tasks.len());
    }
    let mut family = Family::new(&mut text, "sluice_worker_capacity", "gauge", "Tasks a worker runs at most.");
    for worker in &workers {
        family.sample("", &[("worker", &worker.id)], worker.capacity);
    }
    let mut family = Family::new(
        &mut text,
        "sluice_worker_fence_refusals_total",
        "counter",
        "Writes of a worker's tasks refused by a fence (another worker had taken the task), since it started.",
    );
    for worker in &workers {
        family.sample("", &[("worker", &worker.id)], worker.fence_refusals);
    }
    let mut family = Family::new(&mut text, "sluice_worker_leader", "gauge", "1 for the worker that leads.");
    for worker in &workers {
        family.sample("", &[("worker", &worker.id)], u8::from(worker.id == leader));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
        let mut text = String::new();
        Family::new(&mut text, "sluice_x", "gauge", "help").sample("", &[("job", "we\"ird")], 1);
        assert_eq!(text, "# HELP sluice_x help\n# TYPE sluice_x gauge\nsluice_x{job=\"we\\\"ird\"} 1\n");
    }
}
