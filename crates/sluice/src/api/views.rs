//! What the API shows: typed views of jobs, versions and workers (the OpenAPI document is derived
//! from these types, so it cannot drift from the answers); a job's status is the cluster's
//! (`crate::cluster::status`).

use serde::Serialize;
use utoipa::ToSchema;

pub use crate::cluster::status::*;

/// A line of `GET /jobs`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct JobSummary {
    pub name: String,
    pub state: JobState,
    pub version: u32,
    pub mode: String,
    /// What a running job does now.
    pub phase: Option<String>,
    pub rows_per_sec: f64,
    pub lag_secs: Option<u64>,
    /// The last error, with its side.
    pub error: Option<ErrorView>,
    /// Its counters, as `GET /jobs/{name}` shows them: one request shows every job's progress.
    pub stats: JobStatsView,
}

/// A job made or given a new version.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionCreated {
    pub name: String,
    pub version: u32,
}

/// What the operator asked of a job: run or stop, in which generation.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DesiredView {
    pub name: String,
    /// `running` or `stopped`.
    pub desired: String,
    pub generation: u64,
}

/// A line of `GET /jobs/{name}/versions`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionSummary {
    pub version: u32,
    pub created_at: String,
    /// `submitted`, `updated`, `rollback to N` or `add tables …`.
    pub origin: String,
    pub current: bool,
}

/// One version's document, passwords redacted.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionDocument {
    pub version: u32,
    /// `yaml` or `json`.
    pub format: String,
    pub document: String,
    pub created_at: String,
    pub origin: String,
}

/// A line diff of two versions' documents.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionDiff {
    pub job: String,
    pub from: u32,
    pub to: u32,
    /// Unified lines: `- old`, `+ new`, `  same`.
    pub diff: String,
}

/// Tables accepted into a running job: copied, then taken into its stream.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TablesAdded {
    pub name: String,
    pub version: u32,
    pub backfill: Vec<String>,
}

/// Tables a running stream copies again.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResyncAccepted {
    pub name: String,
    /// Names the request (the stream does it once).
    pub id: String,
    pub tables: Vec<String>,
}

/// A live worker.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WorkerView {
    pub id: String,
    pub address: String,
    /// Tasks it runs at once.
    pub capacity: usize,
    /// Its share of the work relative to workers of the same capacity.
    pub weight: f64,
    /// `job/task` of the tasks it runs.
    pub tasks: Vec<String>,
    pub alive: bool,
    pub started_at: String,
}

/// The leader's worker id, when there is one.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaderView {
    pub leader: Option<String>,
}

/// A refused request: what is wrong, and for an invalid job document every problem.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

/// One problem of a job document, by field path and line.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FieldError {
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

impl From<&sluice_core::spec::SpecError> for FieldError {
    fn from(error: &sluice_core::spec::SpecError) -> FieldError {
        FieldError { path: error.path.clone(), line: error.line, message: sluice_core::secret::scrub(&error.message) }
    }
}
