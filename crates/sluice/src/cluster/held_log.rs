//! What the sources of stream jobs nobody reads keep for them alone: a PostgreSQL replication slot
//! holds the server's WAL from where its job stopped until the job runs again or is reset, and a
//! forgotten one fills the server's disk. The leader measures it every `HELD_LOG_EVERY` for each
//! stream job that nobody reads (stopped, or its stream failed for good: `ChangeSource::held_log`),
//! keeps the figure for the job's view and the console, and warns in the log once it passes
//! `HELD_LOG_WARNING_BYTES`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_core::Result;
use utoipa::ToSchema;

use super::model::{load_all, load_spec, statuses_prefix, Desired, JobRecord, TaskState, TaskStatus, ROOT};
use super::store::Store;
use crate::job_text::DocumentRules;
use crate::logger::timestamp;

/// How often the leader measures what unread jobs' sources hold.
pub const HELD_LOG_EVERY: Duration = Duration::from_secs(10);

/// From this size on, each measure of an unread job's held log is also a warning in the log.
const HELD_LOG_WARNING_BYTES: u64 = 1 << 30;

/// The change log an unread job's source keeps for it, as last measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HeldLog {
    pub bytes: u64,
    /// When it was measured.
    pub at: String,
}

pub fn held_log_key(job: &str) -> String {
    format!("{ROOT}held_logs/{job}")
}

/// Measures what the source of each unread stream job holds for it, and forgets the figure of
/// every other job (its stream reads the log, or it is gone).
pub async fn measure(store: &dyn Store, document_rules: &DocumentRules) -> Result<()> {
    let jobs: Vec<(String, JobRecord, _)> = load_all(store, &format!("{ROOT}jobs/")).await?;
    let mut unread = Vec::new();
    for (name, job, _) in jobs {
        if unread_stream(store, &job).await? {
            unread.push((name, job));
        }
    }
    let measured: Vec<(String, HeldLog, _)> = load_all(store, &format!("{ROOT}held_logs/")).await?;
    for (name, _, _) in &measured {
        if !unread.iter().any(|(job, _)| job == name) {
            store.delete(&held_log_key(name)).await?;
        }
    }
    for (name, job) in &unread {
        match held_by_source(store, document_rules, job).await {
            Ok(Some(bytes)) => {
                if bytes >= HELD_LOG_WARNING_BYTES {
                    log::warn!(
                        "job {name} does not run and its source holds {:.1} MiB of change log for it (a replication slot), which grows until the job runs again or is reset",
                        bytes as f64 / (1u64 << 20) as f64
                    );
                }
                let held = HeldLog { bytes, at: timestamp() };
                store.put(&held_log_key(name), &serde_json::to_string(&held).unwrap_or_default(), None).await?;
            }
            Ok(None) => store.delete(&held_log_key(name)).await?,
            Err(error) => log::warn!("job {name}: cannot measure what its source holds for it: {error}"),
        }
    }
    Ok(())
}

/// A stream job whose stream reads nothing: stopped, or its stream task failed for good in the
/// job's generation.
async fn unread_stream(store: &dyn Store, job: &JobRecord) -> Result<bool> {
    if !job.mode.contains("cdc") {
        return Ok(false);
    }
    if job.desired == Desired::Stopped {
        return Ok(true);
    }
    let statuses: Vec<(String, TaskStatus, _)> = load_all(store, &statuses_prefix(&job.name)).await?;
    Ok(statuses.iter().any(|(task, status, _)| {
        task == sluice_core::names::STREAM_TASK
            && status.generation == job.generation
            && status.state == TaskState::Failed
    }))
}

async fn held_by_source(store: &dyn Store, document_rules: &DocumentRules, job: &JobRecord) -> Result<Option<u64>> {
    let spec = load_spec(store, document_rules, &job.name, job.version).await?;
    let source = sluice_connectors::source(&spec)?;
    match source.changes() {
        Some(changes) => changes.held_log().await,
        None => Ok(None),
    }
}
