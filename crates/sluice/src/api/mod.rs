//! The HTTP API of `sluice server`: jobs, their versions and lifecycle, workers, the leader,
//! metrics and the OpenAPI document. Only this module knows HTTP. Every response passes job
//! documents and errors through the secret scrubber.

mod audit;
mod auth;
mod console;
mod diff;
mod metrics;
mod openapi;
pub mod series;
pub(crate) mod views;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use sluice_core::secret::redact_url_passwords;
use sluice_core::spec::{parse_job_partially, JobSpec, SpecError};

use crate::job_text::{self, DocumentFormat};

pub use auth::Tokens;

use crate::cluster::model::*;
use crate::cluster::node::Node;
use crate::logger::timestamp;
use views::{
    BatchQueued, DesiredView, ErrorBody, FieldError, JobSummary, JobView, LeaderView, ResyncAccepted, TablesAdded,
    VersionCreated, VersionDiff, VersionDocument, VersionSummary, WorkerView,
};

/// What every handler shares.
#[derive(Debug)]
pub struct Api {
    pub node: Arc<Node>,
    pub tokens: Tokens,
    /// `/metrics` answers without a token even when tokens are set (`--open-metrics`).
    pub open_metrics: bool,
    /// Each job's throughput and lag over the last hours.
    pub series: Arc<series::Series>,
}

/// The largest request body the API reads: a job document is a few kilobytes.
const MAX_BODY_BYTES: usize = 1024 * 1024;

type Shared = State<Arc<Api>>;

/// An API error: a status and a JSON body `{error}` (with `errors` for validation).
pub struct Failure(StatusCode, ErrorBody);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<sluice_core::Error> for Failure {
    /// 503 only when the coordination store cannot be reached or refuses this node; what a
    /// request got wrong is a 400, a conflict a 409, anything else a 500.
    fn from(error: sluice_core::Error) -> Failure {
        use sluice_core::ErrorKind;
        let status = match error.kind() {
            // Whatever the coordination store answered, the request itself was fine.
            _ if error.side() == Some(sluice_core::Side::State) => StatusCode::SERVICE_UNAVAILABLE,
            // The coordination store is down or refuses this node (its credentials).
            ErrorKind::Unavailable | ErrorKind::Connect | ErrorKind::Auth => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Config | ErrorKind::Schema | ErrorKind::Data => StatusCode::BAD_REQUEST,
            ErrorKind::Conflict | ErrorKind::Fenced => StatusCode::CONFLICT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure(status, ErrorBody { error: error.to_string(), errors: Vec::new() })
    }
}

fn failure(status: StatusCode, message: impl Into<String>) -> Failure {
    Failure(status, ErrorBody { error: sluice_core::secret::scrub(&message.into()), errors: Vec::new() })
}

type Reply = Result<Response, Failure>;

pub fn router(api: Arc<Api>) -> Router {
    let jobs = Router::new()
        .route("/jobs", get(list_jobs).post(create_job))
        .route("/jobs/{name}", get(show_job).put(update_job).delete(delete_job))
        .route("/jobs/{name}/stop", post(stop_job))
        .route("/jobs/{name}/start", post(start_job))
        .route("/jobs/{name}/restart", post(restart_job))
        .route("/jobs/{name}/batches", post(run_batch))
        .route("/jobs/{name}/versions", get(list_versions))
        .route("/jobs/{name}/versions/{version}", get(show_version))
        .route("/jobs/{name}/versions/{a}/diff/{b}", get(diff_versions))
        .route("/jobs/{name}/rollback", post(rollback_job))
        .route("/jobs/{name}/runs", get(list_runs))
        .route("/jobs/{name}/tables", post(add_tables))
        .route("/jobs/{name}/resync", post(resync_tables))
        .route("/jobs/{name}/series", get(job_series))
        .route("/jobs/{name}/dirty", get(list_dirty))
        .route("/jobs/{name}/dirty/discard", post(discard_dirty))
        .route("/jobs/{name}/dirty/replay", post(replay_dirty))
        .route("/jobs/{name}/verify", get(last_verification).post(verify_job))
        .route("/jobs/{name}/repairs", get(list_repairs))
        .route("/alarms", get(show_alarms).put(set_alarms))
        .route("/workers", get(list_workers))
        .route("/leader", get(show_leader))
        .route("/audit", get(audit::list))
        .route("/whoami", get(audit::whoami))
        // Runs inside `authorize`: a change is recorded with its caller, before it runs.
        .layer(axum::middleware::from_fn_with_state(api.clone(), audit::record))
        .layer(axum::middleware::from_fn_with_state(api.clone(), auth::authorize));
    let metrics = Router::new().route("/metrics", get(metrics));
    let metrics = if api.open_metrics {
        metrics
    } else {
        metrics.layer(axum::middleware::from_fn_with_state(api.clone(), auth::authorize))
    };
    Router::new()
        .nest("/api/v1", jobs)
        .merge(metrics)
        .route("/api/v1/openapi.json", get(|| async { ([("content-type", "application/json")], openapi::document()) }))
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(console::routes())
        .layer(axum::middleware::from_fn_with_state(api.clone(), auth::same_site))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(api)
}

/// Parses and validates a job document; every error found, as the API returns them.
fn validate(api: &Api, body: &[u8], headers: &HeaderMap) -> Result<(JobSpec, String, DocumentFormat), Failure> {
    let (cluster, document_rules) = (api.node.config.fencing, &api.node.config.document_rules);
    let text =
        std::str::from_utf8(body).map_err(|_| failure(StatusCode::BAD_REQUEST, "the job document is not UTF-8"))?;
    let content_type = headers.get("content-type").and_then(|value| value.to_str().ok()).unwrap_or("application/json");
    let format = DocumentFormat::of_content_type(content_type);
    let (job, mut errors) = job_text::check(text, format, document_rules);
    // The same document with every `${VAR}` left as written: what the store keeps at rest.
    if let (Some(written), _) =
        parse_job_partially(text, format == DocumentFormat::Json, |name| Some(format!("${{{name}}}")))
    {
        for endpoint in [&written.source, &written.target] {
            if endpoint.url.as_ref().is_some_and(|url| sluice_core::secret::has_literal_password(url.expose())) {
                errors.push(SpecError {
                    path: format!("{}.url", endpoint.role),
                    line: endpoint.line_of("url"),
                    message: "holds a password or token in plain text, which the server would keep at rest; write \
                              it as ${VARIABLE}, a variable the server lets documents read (named with its \
                              --env-prefix, SLUICE_VAR_ by default, on every node, or a file of its --secrets-dir)"
                        .into(),
                });
            }
        }
        errors.extend(sluice_core::spec::written_out_targets(&written.alarms, "alarms"));
        errors.extend(sluice_connectors::written_out_secrets(&written));
    }
    if let Some(job) = &job {
        if cluster && !sluice_connectors::fences(&job.target.connector) {
            errors.push(SpecError {
                path: "target.type".into(),
                line: job.target.line_of("type"),
                message: format!(
                    "`{}` cannot run on a cluster: its writes cannot be fenced against a worker whose task moved; use a {} target, or run the job standalone",
                    job.target.connector,
                    sluice_connectors::fencing_targets()
                ),
            });
        }
        if !job.name.chars().all(|character| character.is_ascii_alphanumeric() || "-_.".contains(character))
            || job.name.is_empty()
        {
            errors.push(SpecError {
                path: "name".into(),
                line: None,
                message: "a job name on a server uses letters, digits, `-`, `_` and `.` only".into(),
            });
        }
    }
    match job_text::decided((job, errors)) {
        Ok(job) => Ok((job, text.to_owned(), format)),
        Err(errors) => {
            let errors = errors.iter().map(FieldError::from).collect();
            Err(Failure(StatusCode::BAD_REQUEST, ErrorBody { error: "the job is invalid".into(), errors }))
        }
    }
}

async fn job(api: &Api, name: &str) -> Result<JobRecord, Failure> {
    let found = load_job(&*api.node.store, name).await?;
    found.ok_or_else(|| failure(StatusCode::NOT_FOUND, format!("no job named {name}")))
}

/// Writes a job record back, unless it changed since it was read (another request, or the
/// leader taking added tables into the stream).
async fn save_job(api: &Api, job: &JobRecord) -> Result<(), Failure> {
    if !api.node.store.replace(&job_key(&job.name), &encode(job), job.revision).await? {
        return Err(failure(
            StatusCode::CONFLICT,
            format!("job {} changed meanwhile; read it and try again", job.name),
        ));
    }
    Ok(())
}

/// Creates a job from its document (JSON, or YAML with `Content-Type: application/yaml`); every
/// validation error is returned at once.
#[utoipa::path(post, path = "/jobs", tag = "jobs",
    request_body(content = Object, description = "the job document, as `sluice run` reads it from a file", content_type = "application/json"),
    responses(
        (status = 201, description = "created", body = VersionCreated),
        (status = 400, description = "invalid: every problem, by path and line", body = ErrorBody),
        (status = 409, description = "a job of that name exists", body = ErrorBody),
    ))]
async fn create_job(State(api): Shared, headers: HeaderMap, body: Bytes) -> Reply {
    let (spec, document, format) = validate(&api, &body, &headers)?;
    no_cycle(&api, &spec).await?;
    let record = JobRecord {
        name: spec.name.clone(),
        version: 1,
        desired: Desired::Running,
        generation: next_generation(0),
        mode: spec.mode.to_string(),
        updated_at: timestamp(),
        backfill: None,
        resync: None,
        schedule: spec.schedule.clone(),
        after: spec.after.clone(),
        priority: spec.priority,
        placement: spec.placement.clone(),
        batches: None,
        revision: 0,
    };
    let version = VersionRecord { version: 1, format, document, created_at: timestamp(), origin: "submitted".into() };
    // The version first, so a job record never points at a missing version; both only if
    // absent, so an existing job is never touched.
    let exists = || {
        failure(
            StatusCode::CONFLICT,
            format!("job {} exists; PUT /api/v1/jobs/{} makes a new version", spec.name, spec.name),
        )
    };
    if api.node.store.create(&version_key(&spec.name, 1), &encode(&version), None).await?.is_none()
        || api.node.store.create(&job_key(&spec.name), &encode(&record), None).await?.is_none()
    {
        return Err(exists());
    }
    log::info!("job {}: submitted ({})", spec.name, spec.mode);
    Ok((StatusCode::CREATED, Json(VersionCreated { name: spec.name, version: 1 })).into_response())
}

/// The jobs, with their states.
#[utoipa::path(get, path = "/jobs", tag = "jobs", responses((status = 200, description = "jobs", body = [JobSummary])))]
async fn list_jobs(State(api): Shared) -> Reply {
    // From the cluster read now at one revision: a thousand jobs are listed without a read of
    // the store each.
    let store = api.node.read_now().await?;
    let jobs = load_all::<JobRecord>(&*store, &format!("{ROOT}jobs/")).await?;
    let mut listed = Vec::new();
    for (name, job, _) in jobs {
        let view = views::job_view(&*store, &job).await?;
        listed.push(JobSummary {
            name,
            state: view.state,
            version: job.version,
            mode: job.mode,
            phase: view.phase,
            rows_per_sec: view.stats.rows_per_sec,
            lag_secs: view.stats.lag_secs,
            error: view.error,
            stats: view.stats,
        });
    }
    Ok(Json(listed).into_response())
}

/// A job: state, phase, counters, tasks with their worker, epoch, position, lag and last error.
#[utoipa::path(get, path = "/jobs/{name}", tag = "jobs", params(("name" = String, Path)),
    responses((status = 200, description = "the job", body = JobView), (status = 404, description = "no such job", body = ErrorBody)))]
async fn show_job(State(api): Shared, Path(name): Path<String>) -> Reply {
    let job = job(&api, &name).await?;
    Ok(Json(views::job_view(&*api.node.store, &job).await?).into_response())
}

/// While added tables are copied, the stream runs the version before them: no other version
/// may come in between.
fn no_backfill(job: &JobRecord) -> Result<(), Failure> {
    match job.backfill {
        Some(_) => Err(failure(
            StatusCode::CONFLICT,
            format!("job {} is copying tables added to it; try again once they joined the stream", job.name),
        )),
        None => Ok(()),
    }
}

async fn next_version(
    api: &Api,
    job: &mut JobRecord,
    document: String,
    format: DocumentFormat,
    origin: String,
) -> Result<VersionCreated, Failure> {
    let versions = api.node.store.list(&versions_prefix(&job.name)).await?;
    let number = versions.len() as u32 + 1;
    let record = VersionRecord { version: number, format, document, created_at: timestamp(), origin };
    // Only if absent: of two concurrent new versions, one gets the number, the other a 409.
    if api.node.store.create(&version_key(&job.name, number), &encode(&record), None).await?.is_none() {
        return Err(failure(
            StatusCode::CONFLICT,
            format!("job {} got version {number} meanwhile; try again", job.name),
        ));
    }
    job.version = number;
    job.generation = next_generation(job.generation);
    job.updated_at = timestamp();
    save_job(api, job).await?;
    log::info!("job {}: version {number} ({})", job.name, record.origin);
    Ok(VersionCreated { name: job.name.clone(), version: number })
}

/// Refuses a job whose `after:` would close a cycle through the jobs on the server.
async fn no_cycle(api: &Api, spec: &sluice_core::spec::JobSpec) -> Result<(), Failure> {
    if spec.after.is_empty() {
        return Ok(());
    }
    let jobs = load_all::<JobRecord>(&*api.node.store, &format!("{ROOT}jobs/")).await?;
    let graph = jobs
        .into_iter()
        .map(|(name, job, _)| (name, job.after.into_iter().map(|dependency| dependency.job).collect()))
        .collect();
    let after: Vec<String> = spec.after.iter().map(|dependency| dependency.job.clone()).collect();
    match crate::cluster::schedule::cycle(&spec.name, &after, &graph) {
        Some(path) => Err(Failure(
            StatusCode::BAD_REQUEST,
            ErrorBody {
                error: "the job is invalid".into(),
                errors: vec![FieldError {
                    path: "after".into(),
                    line: None,
                    message: format!("the jobs would wait for each other forever: {}", path.join(" → ")),
                }],
            },
        )),
        None => Ok(()),
    }
}

/// Runs the next batch of a job with `schedule:` or `after:` now, or as soon as its running
/// batch ends; with `{"from": A, "to": B}`, that batch runs batches A to B again instead (a
/// backfill: an incremental-cursor job reads their cursor windows again, a snapshot copies
/// afresh).
#[utoipa::path(post, path = "/jobs/{name}/batches", tag = "jobs", params(("name" = String, Path)),
    request_body(content = Object, description = "optional: {\"from\": 3, \"to\": 5} to run batches 3 to 5 again", content_type = "application/json"),
    responses((status = 202, description = "the batch is queued; the leader fires it", body = BatchQueued),
        (status = 400, description = "the job has no schedule, or the batches cannot run again", body = ErrorBody), (status = 404, description = "no such job", body = ErrorBody)))]
async fn run_batch(State(api): Shared, Path(name): Path<String>, body: Bytes) -> Reply {
    // The leader writes the job record too (right after a submission, say): a request that
    // met such a write reads the record again and asks again, a few times.
    let mut attempts = 0;
    loop {
        match queue_batch(&api, &name, &body).await {
            Err(Failure(StatusCode::CONFLICT, _)) if attempts < 5 => attempts += 1,
            other => return other,
        }
    }
}

/// One attempt of `run_batch` on the job record as read now.
async fn queue_batch(api: &Api, name: &str, body: &[u8]) -> Reply {
    let name = name.to_owned();
    let mut job = job(api, &name).await?;
    if !job.batched() {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            format!("job {name} has no `schedule` or `after`; POST /api/v1/jobs/{name}/restart runs it again"),
        ));
    }
    let rerun = rerun_range(&job, body)?;
    // Asked for before the leader first saw the job: its schedule still starts from now.
    let now = unix_seconds();
    let first = job.schedule.as_ref().and_then(|schedule| schedule.first(now));
    let batches = job.batches.get_or_insert_with(|| Batches {
        anchor: first.unwrap_or(now),
        due_at: first,
        ..Default::default()
    });
    match rerun {
        Some(range) => batches.rerun = Some(range),
        None => batches.queued = true,
    }
    let next = batches.batch + 1 + u64::from(rerun.is_none() && batches.rerun.is_some());
    save_job(api, &job).await?;
    match rerun {
        Some(range) => {
            log::info!("job {name}: batches {} to {} asked to run again, as batch {next}", range.from, range.to)
        }
        None => log::info!("job {name}: batch {next} asked for"),
    }
    Ok((StatusCode::ACCEPTED, Json(BatchQueued { name, batch: next, rerun_of: rerun.map(Into::into) })).into_response())
}

/// The batches a request asks to run again, checked against the job, or `None` for the next one.
fn rerun_range(job: &JobRecord, body: &[u8]) -> Result<Option<BatchRange>, Failure> {
    let text = std::str::from_utf8(body).unwrap_or_default().trim();
    if text.is_empty() {
        return Ok(None);
    }
    let expected = "expected no body, or {\"from\": A, \"to\": B}: the batches to run again";
    let request: Value =
        serde_json::from_str(text).map_err(|error| failure(StatusCode::BAD_REQUEST, format!("{expected}: {error}")))?;
    let number = |field: &str| request.get(field).and_then(Value::as_u64);
    let Some(from) = number("from") else {
        return Err(failure(StatusCode::BAD_REQUEST, format!("{expected}; `from` is missing or not a batch number")));
    };
    let to = number("to").unwrap_or(from);
    let current = job.batches.as_ref().map_or(0, |batches| batches.batch);
    if from == 0 || from > to || to > current {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            format!("batches {from} to {to} cannot run again: job {} ran batches 1 to {current}", job.name),
        ));
    }
    if job.mode == "cdc" {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            format!("job {} is a cdc job: its batches applied their changes once, and cannot run again; a new batch applies what came since", job.name),
        ));
    }
    if job.mode == "incremental-cursor" {
        let history = job.batches.as_ref().map(|batches| batches.history.as_slice()).unwrap_or_default();
        let missing: Vec<u64> = [from, to]
            .into_iter()
            .filter(|number| !history.iter().any(|record| record.batch == Some(*number) && !record.windows.is_empty()))
            .collect();
        if !missing.is_empty() {
            return Err(failure(
                StatusCode::BAD_REQUEST,
                format!(
                    "job {}: the cursor windows of batch {} are not in its history (it keeps the latest {BATCH_HISTORY} firings, and a batch that did not end has none)",
                    job.name,
                    missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(" and ")
                ),
            ));
        }
    }
    Ok(Some(BatchRange { from, to }))
}

fn unix_seconds() -> i64 {
    sluice_core::clock::unix_seconds() as i64
}

/// A version with another schedule counts its firings from now; its batch numbers go on.
fn reschedule(job: &mut JobRecord, schedule: Option<sluice_core::spec::ScheduleSpec>) {
    if job.schedule != schedule {
        if let (Some(batches), Some(schedule)) = (&mut job.batches, &schedule) {
            let now = unix_seconds();
            batches.due_at = schedule.first(now);
            batches.anchor = batches.due_at.unwrap_or(now);
        }
        job.schedule = schedule;
    }
}

/// A new version of the job (N+1): it is replanned and resumes from its checkpoints.
#[utoipa::path(put, path = "/jobs/{name}", tag = "jobs", params(("name" = String, Path)),
    request_body(content = Object, description = "the job file", content_type = "application/json"),
    responses((status = 200, description = "the new version", body = VersionCreated), (status = 400, description = "invalid", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody), (status = 409, description = "changed meanwhile, or tables are being added", body = ErrorBody)))]
async fn update_job(State(api): Shared, Path(name): Path<String>, headers: HeaderMap, body: Bytes) -> Reply {
    let mut job = job(&api, &name).await?;
    no_backfill(&job)?;
    let (spec, document, format) = validate(&api, &body, &headers)?;
    if spec.name != name {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            format!("the document names job {}, the path job {name}; a job cannot be renamed", spec.name),
        ));
    }
    job.mode = spec.mode.to_string();
    no_cycle(&api, &spec).await?;
    job.priority = spec.priority;
    job.placement = spec.placement.clone();
    job.after = spec.after;
    reschedule(&mut job, spec.schedule);
    Ok(Json(next_version(&api, &mut job, document, format, "updated".into()).await?).into_response())
}

/// Makes version N the current one again, as a new version.
#[utoipa::path(post, path = "/jobs/{name}/rollback", tag = "versions", params(("name" = String, Path)),
    request_body(content = Object, description = "{\"version\": N}", content_type = "application/json"),
    responses((status = 200, description = "the new version", body = VersionCreated), (status = 400, description = "not a version number", body = ErrorBody),
        (status = 404, description = "no such job or version", body = ErrorBody)))]
async fn rollback_job(State(api): Shared, Path(name): Path<String>, body: Bytes) -> Reply {
    let mut job = job(&api, &name).await?;
    no_backfill(&job)?;
    let request: Value = serde_json::from_slice(&body)
        .map_err(|error| failure(StatusCode::BAD_REQUEST, format!("expected {{\"version\": N}}: {error}")))?;
    let version =
        request.get("version").and_then(Value::as_u64).filter(|version| (1..=u64::from(u32::MAX)).contains(version));
    let Some(version) = version else {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            format!("expected {{\"version\": N}} with N a version of job {name}: 1 to {}", job.version),
        ));
    };
    if version > u64::from(job.version) {
        return Err(failure(
            StatusCode::NOT_FOUND,
            format!("job {name} has no version {version}; its versions are 1 to {}", job.version),
        ));
    }
    let (old, _) = load::<VersionRecord>(&*api.node.store, &version_key(&name, version as u32))
        .await?
        .ok_or_else(|| failure(StatusCode::NOT_FOUND, format!("job {name} has no version {version}")))?;
    let (spec, _, _) = validate(&api, old.document.as_bytes(), &format_header(old.format))?;
    job.mode = spec.mode.to_string();
    no_cycle(&api, &spec).await?;
    job.priority = spec.priority;
    job.placement = spec.placement.clone();
    job.after = spec.after;
    reschedule(&mut job, spec.schedule);
    Ok(Json(next_version(&api, &mut job, old.document, old.format, format!("rollback to {version}")).await?)
        .into_response())
}

fn format_header(format: DocumentFormat) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("content-type", format.content_type().parse().expect("a valid header value"));
    headers
}

async fn set_desired(api: &Api, name: &str, desired: Desired, new_generation: bool) -> Reply {
    let mut job = job(api, name).await?;
    job.desired = desired;
    if new_generation {
        job.generation = next_generation(job.generation);
    }
    job.updated_at = timestamp();
    save_job(api, &job).await?;
    log::info!("job {name}: {desired:?} (generation {})", job.generation);
    let desired = views::serde_name(&desired);
    Ok(Json(DesiredView { name: name.to_owned(), desired, generation: job.generation }).into_response())
}

/// Stops the job's tasks (they keep their checkpoints).
#[utoipa::path(post, path = "/jobs/{name}/stop", tag = "jobs", params(("name" = String, Path)),
    responses((status = 200, description = "stopping", body = DesiredView), (status = 404, description = "no such job", body = ErrorBody)))]
async fn stop_job(State(api): Shared, Path(name): Path<String>) -> Reply {
    set_desired(&api, &name, Desired::Stopped, false).await
}

/// Starts a stopped job; it resumes from its checkpoints.
#[utoipa::path(post, path = "/jobs/{name}/start", tag = "jobs", params(("name" = String, Path)),
    responses((status = 200, description = "starting", body = DesiredView), (status = 404, description = "no such job", body = ErrorBody)))]
async fn start_job(State(api): Shared, Path(name): Path<String>) -> Reply {
    let running = job(&api, &name).await?.desired == Desired::Running;
    // Starting a running job changes nothing; starting a stopped one begins a new generation.
    set_desired(&api, &name, Desired::Running, !running).await
}

/// Stops and starts the job's tasks (a new generation), resuming from their checkpoints.
#[utoipa::path(post, path = "/jobs/{name}/restart", tag = "jobs", params(("name" = String, Path)),
    responses((status = 200, description = "restarting", body = DesiredView), (status = 404, description = "no such job", body = ErrorBody)))]
async fn restart_job(State(api): Shared, Path(name): Path<String>) -> Reply {
    set_desired(&api, &name, Desired::Running, true).await
}

/// Deletes the job, its versions, plan, statuses, runs, dirty records, verifications and repairs.
#[utoipa::path(delete, path = "/jobs/{name}", tag = "jobs", params(("name" = String, Path)),
    responses((status = 204, description = "deleted"), (status = 404, description = "no such job", body = ErrorBody)))]
async fn delete_job(State(api): Shared, Path(name): Path<String>) -> Reply {
    let record = job(&api, &name).await?;
    // Read before the versions go: what the job keeps at its source is released after.
    let spec =
        crate::cluster::model::load_spec(&*api.node.store, &api.node.config.document_rules, &name, record.version)
            .await
            .ok();
    let store = &api.node.store;
    // The job record last: a delete that fails half-way leaves a job that can be deleted again.
    // Its workers stop its tasks when they see it gone, and write nothing more.
    // Its dirty records go too: a new job of the same name starts with its own budget.
    let dirty = crate::cluster::dirty::dirty_prefix(&name);
    for prefix in [versions_prefix(&name), statuses_prefix(&name), runs_prefix(&name), dirty] {
        store.delete_prefix(&prefix).await?;
    }
    store.delete(&verification_key(&name)).await?;
    store.delete(&crate::cluster::held_log::held_log_key(&name)).await?;
    store.delete_prefix(&crate::cluster::model::repairs_prefix(&name)).await?;
    store.delete(&plan_key(&name)).await?;
    store.delete_prefix(&plan_pieces_prefix(&name)).await?;
    store.delete(&job_key(&name)).await?;
    log::info!("job {name}: deleted");
    if let Some(spec) = spec {
        tokio::spawn(forget_at_source(spec));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Releases what a deleted job kept at its source (a PostgreSQL job's own replication slot):
/// its workers stop its tasks when they see it gone, so the slot is tried again for a minute
/// while its last reader ends.
async fn forget_at_source(spec: sluice_core::spec::JobSpec) {
    let name = spec.name.clone();
    let source = match sluice_connectors::source(&spec) {
        Ok(source) => source,
        Err(error) => return log::warn!("job {name}: its source keeps what it held: {error}"),
    };
    let mut attempt = 0;
    loop {
        match source.forget().await {
            Ok(()) => return,
            Err(error) if attempt < 30 => {
                log::debug!("job {name}: releasing what its source keeps: {error}; trying again");
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
            Err(error) => return log::warn!("job {name}: deleted, but its source keeps what it held: {error}"),
        }
    }
}

/// The job's versions.
#[utoipa::path(get, path = "/jobs/{name}/versions", tag = "versions", params(("name" = String, Path)),
    responses((status = 200, description = "versions", body = [VersionSummary]), (status = 404, description = "no such job", body = ErrorBody)))]
async fn list_versions(State(api): Shared, Path(name): Path<String>) -> Reply {
    let job = job(&api, &name).await?;
    let versions = load_all::<VersionRecord>(&*api.node.store, &versions_prefix(&name)).await?;
    let listed: Vec<VersionSummary> = versions
        .into_iter()
        .map(|(_, version, _)| VersionSummary {
            current: version.version == job.version,
            version: version.version,
            created_at: version.created_at,
            origin: version.origin,
        })
        .collect();
    Ok(Json(listed).into_response())
}

async fn version_document(api: &Api, name: &str, version: u32) -> Result<VersionRecord, Failure> {
    let (record, _) = load::<VersionRecord>(&*api.node.store, &version_key(name, version))
        .await?
        .ok_or_else(|| failure(StatusCode::NOT_FOUND, format!("job {name} has no version {version}")))?;
    Ok(VersionRecord { document: redact_url_passwords(&record.document), ..record })
}

/// One version's document, passwords redacted.
#[utoipa::path(get, path = "/jobs/{name}/versions/{version}", tag = "versions", params(("name" = String, Path), ("version" = u32, Path)),
    responses((status = 200, description = "the version", body = VersionDocument), (status = 404, description = "no such job or version", body = ErrorBody)))]
async fn show_version(State(api): Shared, Path((name, version)): Path<(String, u32)>) -> Reply {
    job(&api, &name).await?;
    let record = version_document(&api, &name, version).await?;
    Ok(Json(VersionDocument {
        version: record.version,
        format: record.format.name().into(),
        document: record.document,
        created_at: record.created_at,
        origin: record.origin,
    })
    .into_response())
}

/// A line diff of two versions' documents.
#[utoipa::path(get, path = "/jobs/{name}/versions/{a}/diff/{b}", tag = "versions",
    params(("name" = String, Path), ("a" = u32, Path), ("b" = u32, Path)),
    responses((status = 200, description = "the diff", body = VersionDiff), (status = 404, description = "no such job or version", body = ErrorBody)))]
async fn diff_versions(State(api): Shared, Path((name, a, b)): Path<(String, u32, u32)>) -> Reply {
    job(&api, &name).await?;
    let (old, new) = (version_document(&api, &name, a).await?, version_document(&api, &name, b).await?);
    let diff = diff::lines(&old.document, &new.document);
    Ok(Json(VersionDiff { job: name, from: a, to: b, diff }).into_response())
}

/// Run summaries of the job's finished task runs (the run summary of the README).
#[utoipa::path(get, path = "/jobs/{name}/runs", tag = "jobs", params(("name" = String, Path)),
    responses((status = 200, description = "run summaries", body = [Object]), (status = 404, description = "no such job", body = ErrorBody)))]
async fn list_runs(State(api): Shared, Path(name): Path<String>) -> Reply {
    job(&api, &name).await?;
    let runs = api.node.store.list(&runs_prefix(&name)).await?;
    let listed: Vec<Value> = runs.iter().filter_map(|entry| serde_json::from_str(&entry.value).ok()).collect();
    Ok(Json(Value::Array(listed)).into_response())
}

/// Adds tables to a running job with a change stream: a new version that lists them, copied
/// while the stream runs on with the version before, then taken into the stream, which replays
/// their changes from before their copy began.
#[utoipa::path(post, path = "/jobs/{name}/tables", tag = "jobs", params(("name" = String, Path)),
    request_body(content = Object, description = "{\"tables\": [\"db.table\", …]}", content_type = "application/json"),
    responses((status = 202, description = "accepted: copied while the stream runs on, then taken into it", body = TablesAdded),
        (status = 400, description = "invalid, a snapshot job, or a table already in the job", body = ErrorBody),
        (status = 409, description = "tables added before are still being copied", body = ErrorBody)))]
async fn add_tables(State(api): Shared, Path(name): Path<String>, body: Bytes) -> Reply {
    let mut job = job(&api, &name).await?;
    let tables = requested_tables(&body)?;
    if job.mode == "snapshot" {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            format!("job {name} has no change stream to add tables to; PUT a new version that lists them"),
        ));
    }
    no_backfill(&job)?;
    let (current, _) = load::<VersionRecord>(&*api.node.store, &version_key(&name, job.version))
        .await?
        .ok_or_else(|| failure(StatusCode::NOT_FOUND, format!("job {name} has no version {}", job.version)))?;
    let (spec, _, _) = validate(&api, current.document.as_bytes(), &format_header(current.format))?;
    let filter = sluice_core::filter::TableFilter::new(&spec.source.tables);
    if let Some(known) = tables.iter().find(|table| filter.matches(&sluice_core::TableName::parse(table))) {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            format!("table {known} is part of job {name} already (source.tables)"),
        ));
    }
    let parsed = if current.format == DocumentFormat::Json {
        sluice_core::spec::parse_json(&current.document)
    } else {
        sluice_core::spec::parse_yaml(&current.document)
    }
    .map_err(|error| {
        failure(StatusCode::INTERNAL_SERVER_ERROR, format!("version {} does not parse: {}", job.version, error.message))
    })?;
    let mut document = sluice_core::spec::to_json(&parsed);
    let Some(listed) = document.pointer_mut("/source/tables").and_then(Value::as_array_mut) else {
        return Err(failure(StatusCode::BAD_REQUEST, format!("job {name} has no source.tables list to add to")));
    };
    listed.extend(tables.iter().cloned().map(Value::String));
    let document = serde_json::to_string_pretty(&document).expect("JSON serializes");
    validate(&api, document.as_bytes(), &format_header(DocumentFormat::Json))?;
    job.backfill = Some(BackfillRequest {
        id: format!("added-{}", next_generation(job.generation)),
        tables: tables.clone(),
        stream_version: job.version,
    });
    let created =
        next_version(&api, &mut job, document, DocumentFormat::Json, format!("add tables {}", tables.join(", ")))
            .await?;
    Ok((StatusCode::ACCEPTED, Json(TablesAdded { name, version: created.version, backfill: tables })).into_response())
}

/// Copies tables of a running job's stream again, while the stream runs: each into a hidden
/// copy, chunk by chunk between the stream's groups, then put in the table's place whole
/// (PostgreSQL and MySQL targets). The running stream takes the request in where it is; a
/// failed job starts again with it.
#[utoipa::path(post, path = "/jobs/{name}/resync", tag = "jobs", params(("name" = String, Path)),
    request_body(content = Object, description = "{\"tables\": [\"db.table\", …]} (source names)", content_type = "application/json"),
    responses((status = 202, description = "accepted: the stream copies the tables again", body = ResyncAccepted),
        (status = 400, description = "invalid, a job without a stream, a table not in the job, or a target that cannot take it", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody)))]
async fn resync_tables(State(api): Shared, Path(name): Path<String>, body: Bytes) -> Reply {
    let mut job = job(&api, &name).await?;
    let tables = requested_tables(&body)?;
    let spec = crate::cluster::model::load_spec(&*api.node.store, &api.node.config.document_rules, &name, job.version)
        .await
        .map_err(|error| failure(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()))?;
    let mut problems = Vec::new();
    if !spec.mode.streams() {
        problems.push(format!("job {name} has no change stream ({}): run it again to copy its tables", spec.mode));
    }
    let filter = sluice_core::filter::TableFilter::new(&spec.source.tables);
    for table in &tables {
        if !filter.matches(&sluice_core::TableName::parse(table)) {
            problems.push(format!("table {table} is not among job {name}'s source.tables"));
        }
    }
    let takes_copies = sluice_connectors::sink(&spec)
        .map(|sink| sink.folded_changes().is_some_and(|folded| folded.hides_copies()))
        .unwrap_or(false);
    if !takes_copies {
        problems.push(format!(
            "job {name}'s target ({}) cannot take a table's copy under another name and put it in the table's place; PostgreSQL and MySQL targets can",
            spec.target.connector
        ));
    }
    if !problems.is_empty() {
        return Err(failure(StatusCode::BAD_REQUEST, problems.join("; ")));
    }
    let id = format!("resync-{}", sluice_core::clock::unix_millis());
    job.resync = Some(sluice_core::runner::ResyncRequest {
        id: id.clone(),
        tables: tables.iter().map(|table| sluice_core::TableName::parse(table)).collect(),
    });
    // A running stream takes the request in where it is (a stream that fails meanwhile runs
    // again with it); a job that failed (a damaged table stops its stream) starts again with it.
    if views::job_view(&*api.node.store, &job).await?.state == crate::cluster::status::JobState::Failed {
        job.generation = next_generation(job.generation);
    }
    job.updated_at = timestamp();
    save_job(&api, &job).await?;
    log::info!("job {name}: resync {id} of {}", tables.join(", "));
    Ok((StatusCode::ACCEPTED, Json(ResyncAccepted { name, id, tables })).into_response())
}

/// The tables a request names: `{"tables": ["db.table", …]}`, one or more, without wildcards.
fn requested_tables(body: &[u8]) -> Result<Vec<String>, Failure> {
    let expected = "expected {\"tables\": [\"db.table\", …]}: one or more table names, without wildcards";
    let request: Value = serde_json::from_slice(body)
        .map_err(|error| failure(StatusCode::BAD_REQUEST, format!("{expected}: {error}")))?;
    let tables: Vec<String> = request
        .get("tables")
        .and_then(Value::as_array)
        .map(|tables| tables.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    if tables.is_empty() || tables.iter().any(|table| !table.contains('.') || table.contains(['*', '?', '!', ' '])) {
        return Err(failure(StatusCode::BAD_REQUEST, expected));
    }
    Ok(tables)
}

/// Live workers: capacity, weight, the tasks they run.
#[utoipa::path(get, path = "/workers", tag = "cluster", responses((status = 200, description = "workers", body = [WorkerView])))]
async fn list_workers(State(api): Shared) -> Reply {
    let workers = load_workers(&*api.node.store).await?;
    let listed: Vec<WorkerView> = workers
        .into_iter()
        .map(|worker| WorkerView {
            id: worker.id,
            address: worker.address,
            capacity: worker.capacity,
            weight: worker.weight,
            tasks: worker.tasks,
            alive: true,
            started_at: worker.started_at,
        })
        .collect();
    Ok(Json(listed).into_response())
}

/// The leader's worker id.
#[utoipa::path(get, path = "/leader", tag = "cluster", responses((status = 200, description = "the leader", body = LeaderView)))]
async fn show_leader(State(api): Shared) -> Reply {
    let leader = api.node.store.get(LEADER).await?.map(|entry| entry.value);
    Ok(Json(LeaderView { leader }).into_response())
}

async fn metrics(State(api): Shared) -> Reply {
    Ok(([("content-type", "text/plain; version=0.0.4")], metrics::render(&*api.node.store).await?).into_response())
}

/// A job's throughput and lag over the last hours, as this node sampled them every 5 s.
#[utoipa::path(get, path = "/jobs/{name}/series", tag = "jobs", params(("name" = String, Path)),
    responses((status = 200, description = "samples, oldest first", body = series::SeriesView),
        (status = 404, description = "no such job", body = ErrorBody)))]
async fn job_series(State(api): Shared, Path(name): Path<String>) -> Reply {
    job(&api, &name).await?;
    Ok(Json(api.series.of(&name)).into_response())
}

/// The job's dirty records, from every node, oldest first, with the budget they count against.
#[utoipa::path(get, path = "/jobs/{name}/dirty", tag = "dirty records", params(("name" = String, Path)),
    responses((status = 200, description = "{total, limit, records: [{id, task, table, key, reason, record, truncated, node, created_at, change}]}; change, for a change the stream left out: {position, before, source}", body = Object),
        (status = 404, description = "no such job", body = ErrorBody)))]
async fn list_dirty(State(api): Shared, Path(name): Path<String>) -> Reply {
    let job = job(&api, &name).await?;
    let limit = load_spec(&*api.node.store, &api.node.config.document_rules, &name, job.version)
        .await
        .map(|spec| spec.errors.max_dirty_records)
        .ok();
    let records = crate::cluster::dirty::list(&*api.node.store, &name).await?;
    // A row shown as JSON when it is (a cut row as the text it was cut to).
    let shown = |text: &str| {
        let text = sluice_core::secret::scrub(text);
        serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text))
    };
    let records: Vec<Value> = records
        .into_iter()
        .map(|(id, record)| {
            let change = record.change.as_ref().map(|change| {
                serde_json::json!({
                    "position": change.position, "before": change.before.as_deref().map(shown), "source": change.source,
                })
            });
            serde_json::json!({
                "id": id, "task": record.task, "table": record.table, "key": record.key,
                "reason": sluice_core::secret::scrub(&record.reason), "record": record.record.as_deref().map(shown),
                "truncated": record.truncated, "node": record.node, "created_at": record.created_at, "change": change,
            })
        })
        .collect();
    Ok(Json(serde_json::json!({ "total": records.len(), "limit": limit, "records": records })).into_response())
}

/// Forgets dirty records (`{"ids": [...]}`, or `{"all": true}`); each discard is kept in the
/// audit log with the name of the token that did it.
#[utoipa::path(post, path = "/jobs/{name}/dirty/discard", tag = "dirty records", params(("name" = String, Path)),
    request_body(content = Object, description = "{\"ids\": [\"…\"]} or {\"all\": true}", content_type = "application/json"),
    responses((status = 200, description = "{discarded: N}", body = Object),
        (status = 400, description = "neither ids nor all", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody)))]
async fn discard_dirty(
    State(api): Shared,
    Path(name): Path<String>,
    caller: Option<axum::Extension<auth::Caller>>,
    body: Bytes,
) -> Reply {
    job(&api, &name).await?;
    let chosen = chosen_of(&body)?.ok_or_else(|| {
        failure(StatusCode::BAD_REQUEST, "name the records to discard: {\"ids\": [\"…\"]}, or {\"all\": true}")
    })?;
    let by = caller.map_or_else(|| "anonymous".to_owned(), |caller| format!("token {}", caller.name));
    let discarded = crate::cluster::dirty::discard(&*api.node.store, &name, &chosen, &by).await?;
    Ok(Json(serde_json::json!({ "discarded": discarded })).into_response())
}

/// Replays dirty records after a fix (`{"ids": [...]}`, or every record of the job without
/// ids): their rows are read again from the splits that hold them and written by key with the
/// job's current version.
#[utoipa::path(post, path = "/jobs/{name}/dirty/replay", tag = "dirty records", params(("name" = String, Path)),
    request_body(content = Object, description = "{\"ids\": [\"…\"]} (omitted: every record of the job)", content_type = "application/json"),
    responses((status = 200, description = "{replayed: N, failed: [{id, error}], rows_written: N}", body = Object),
        (status = 400, description = "the target cannot write rows again by key", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody)))]
async fn replay_dirty(State(api): Shared, Path(name): Path<String>, body: Bytes) -> Reply {
    let job = job(&api, &name).await?;
    let chosen = chosen_of(&body)?.unwrap_or(crate::cluster::dirty::Chosen::All);
    let outcome = crate::cluster::dirty::replay(
        &api.node.store,
        &api.node.config.document_rules,
        &job,
        &chosen,
        &api.node.config.id,
    )
    .await?;
    Ok(Json(outcome).into_response())
}

/// Compares the job's target with its source through the job's mapping, as `sluice verify`
/// does, while the request waits; keeps the report as the job's last verification (for the
/// console, `/metrics` and the `verify_differences` alarm). With `repair`, the source's rows are
/// written over the differing ones first.
#[utoipa::path(post, path = "/jobs/{name}/verify", tag = "verification", params(("name" = String, Path)),
    request_body(content = Object, description = "{\"tables\": [\"GLOB\"], \"repair\": false, \"max_differences\": 10000} (each optional)", content_type = "application/json"),
    responses((status = 200, description = "{at, node, version, report: {job, tables: [{table, rows_source, rows_target, differences: [{kind, key, columns}], …}], differences_total, elapsed_ms}}", body = Object),
        (status = 400, description = "a bad request, or a target that cannot be read back", body = ErrorBody),
        (status = 404, description = "no such job", body = ErrorBody)))]
async fn verify_job(State(api): Shared, Path(name): Path<String>, body: Bytes) -> Reply {
    let record = job(&api, &name).await?;
    let options = verify_options(&body)?;
    let last = crate::cluster::verification::verify(
        &*api.node.store,
        &api.node.config.document_rules,
        &record,
        &options,
        &api.node.config.id,
    )
    .await?;
    Ok(Json(last).into_response())
}

/// The job's last verification.
#[utoipa::path(get, path = "/jobs/{name}/verify", tag = "verification", params(("name" = String, Path)),
    responses((status = 200, description = "{at, node, version, report}", body = Object),
        (status = 404, description = "no such job, or never verified", body = ErrorBody)))]
async fn last_verification(State(api): Shared, Path(name): Path<String>) -> Reply {
    job(&api, &name).await?;
    match crate::cluster::model::last_verification(&*api.node.store, &name).await? {
        Some(last) => Ok(Json(last).into_response()),
        None => Err(failure(
            StatusCode::NOT_FOUND,
            format!("job {name} was never verified: POST /api/v1/jobs/{name}/verify"),
        )),
    }
}

/// The rows verifications with `repair` rewrote, oldest first: each with its time, node, job
/// version, table, kind, key, the target's row before and the source's row written.
#[utoipa::path(get, path = "/jobs/{name}/repairs", tag = "verification", params(("name" = String, Path)),
    responses((status = 200, description = "[{at, node, version, table, kind, key, before, after}]", body = [Object]),
        (status = 404, description = "no such job", body = ErrorBody)))]
async fn list_repairs(State(api): Shared, Path(name): Path<String>) -> Reply {
    job(&api, &name).await?;
    let prefix = crate::cluster::model::repairs_prefix(&name);
    let repairs: Vec<(String, crate::cluster::model::RepairRecord, _)> = load_all(&*api.node.store, &prefix).await?;
    Ok(Json(repairs.into_iter().map(|(_, repair, _)| repair).collect::<Vec<_>>()).into_response())
}

/// The options of a verification request: `tables`, `repair`, `max_differences`, each optional.
fn verify_options(body: &[u8]) -> Result<sluice_core::runner::VerifyOptions, Failure> {
    let mut options = sluice_core::runner::VerifyOptions::default();
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(options);
    }
    let expected = "expected {\"tables\": [\"GLOB\"], \"repair\": true|false, \"max_differences\": N}";
    let request: Value = serde_json::from_slice(body)
        .map_err(|error| failure(StatusCode::BAD_REQUEST, format!("{expected}: {error}")))?;
    let Value::Object(fields) = request else { return Err(failure(StatusCode::BAD_REQUEST, expected)) };
    let mut problems = Vec::new();
    for (field, value) in fields {
        match (field.as_str(), value) {
            ("tables", Value::Array(tables)) => {
                match tables.iter().map(|table| table.as_str().map(str::to_owned)).collect() {
                    Some(tables) => options.tables = tables,
                    None => problems.push("tables: a list of strings".to_owned()),
                }
            }
            ("repair", Value::Bool(repair)) => options.repair = repair,
            ("max_differences", Value::Number(number)) if number.as_u64().is_some() => {
                options.max_differences = number.as_u64().unwrap_or_default() as usize;
            }
            ("tables" | "repair" | "max_differences", _) => problems.push(format!("{field}: wrong type")),
            (other, _) => problems.push(format!("{other}: unknown field")),
        }
    }
    if problems.is_empty() {
        Ok(options)
    } else {
        Err(failure(StatusCode::BAD_REQUEST, format!("{expected}: {}", problems.join("; "))))
    }
}

/// The records a request names: `{"ids": [...]}` or `{"all": true}`; `None` when it names none.
fn chosen_of(body: &[u8]) -> Result<Option<crate::cluster::dirty::Chosen>, Failure> {
    use crate::cluster::dirty::Chosen;
    let expected = "expected {\"ids\": [\"…\"]} or {\"all\": true}";
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let request: Value = serde_json::from_slice(body)
        .map_err(|error| failure(StatusCode::BAD_REQUEST, format!("{expected}: {error}")))?;
    if request.get("all") == Some(&Value::Bool(true)) {
        return Ok(Some(Chosen::All));
    }
    match request.get("ids") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| id.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(|ids| Some(Chosen::Ids(ids)))
            .ok_or_else(|| failure(StatusCode::BAD_REQUEST, format!("{expected}: ids are strings"))),
        Some(_) => Err(failure(StatusCode::BAD_REQUEST, expected)),
    }
}

/// Every alarm rule's state per job and the history of firings and resolutions, newest first.
#[utoipa::path(get, path = "/alarms", tag = "alarms",
    responses((status = 200, description = "{rules: [{job, scope, name, when, for_secs, state, value, since}], history: [...], global: DOCUMENT|null}", body = Object)))]
async fn show_alarms(State(api): Shared) -> Reply {
    let (states, history) = crate::alarms::overview(&*api.node.store).await?;
    let rules: Vec<Value> = states
        .iter()
        .map(|state| {
            serde_json::json!({
                "job": state.job, "scope": state.scope, "name": state.name, "when": state.when,
                "for_secs": state.for_secs, "state": state.phase, "value": state.value,
                "since": views::time_of(state.since as i64),
            })
        })
        .collect();
    // The global rules without their targets (which are secrets, even as variable names).
    let global: Vec<Value> = crate::alarms::global_rules(&*api.node.store, &api.node.config.document_rules)
        .await
        .unwrap_or_default()
        .iter()
        .map(|rule| {
            serde_json::json!({ "name": rule.name, "when": rule.condition.to_string(), "for_secs": rule.for_secs,
                "notify": rule.notify.iter().map(|target| target.field()).collect::<Vec<_>>() })
        })
        .collect();
    Ok(Json(serde_json::json!({ "rules": rules, "history": history, "global": global })).into_response())
}

/// Replaces the global alarm rules, evaluated for every job: a list of rules (or `{alarms:
/// [...]}`) in YAML or JSON, kept as written (`${VAR}` resolved by each node).
#[utoipa::path(put, path = "/alarms", tag = "alarms",
    request_body(content = String, description = "the rules, as in a job's `alarms:`", content_type = "application/yaml"),
    responses((status = 200, description = "{rules: N}", body = Object), (status = 400, description = "every error, with its line", body = ErrorBody)))]
async fn set_alarms(State(api): Shared, body: Bytes) -> Reply {
    let text = std::str::from_utf8(&body).map_err(|_| failure(StatusCode::BAD_REQUEST, "the rules are not UTF-8"))?;
    let rules = crate::alarms::checked_rules(text, &api.node.config.document_rules).map_err(|errors| {
        Failure(
            StatusCode::BAD_REQUEST,
            ErrorBody {
                error: "the alarm rules are not valid".into(),
                errors: errors.iter().map(FieldError::from).collect(),
            },
        )
    })?;
    api.node.store.put(crate::alarms::GLOBAL_RULES, text, None).await?;
    Ok(Json(serde_json::json!({ "rules": rules })).into_response())
}
