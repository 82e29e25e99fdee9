//! The audit trail: every API request that changes something is recorded in the coordination
//! store before it takes effect — when, who (the token's name and role), from where, what (the
//! action, the job, and for a new version its number and the diff from the one before) — and
//! its result once it ends. A request whose record cannot be written is refused, so nothing
//! changes unrecorded. Bounded by count and age; never holds a secret (documents at rest hold
//! `${VARIABLE}`s only, and every text is scrubbed).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use sluice_core::secret::scrub;

use super::auth::{Caller, Role};
use super::{failure, Api, Reply};
use crate::cluster::model::{load, version_key, VersionRecord, ROOT};

/// Records kept at most; older ones go first.
const MOST_RECORDS: usize = 10_000;

/// Records older than this go (seconds: 90 days).
const KEEP_SECS: u64 = 90 * 86_400;

/// Every this many records a node writes, it prunes the trail.
const PRUNE_EVERY: u64 = 100;

/// The largest answer body read for its result (larger ones pass through, recorded by status).
const MOST_ANSWER_BYTES: usize = 1 << 20;

fn prefix() -> String {
    format!("{ROOT}audit/")
}

/// One change asked of the API.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRecord {
    /// When it was asked, Unix milliseconds.
    pub at_ms: u64,
    /// The token's name (`anonymous` on a server without tokens).
    pub actor: String,
    pub role: String,
    /// The client's address.
    pub from: String,
    pub method: String,
    pub path: String,
    /// What was asked, in words: `create job`, `stop job`, `set alarms`, …
    pub action: String,
    pub job: Option<String>,
    /// The version a change made, when it made one.
    pub version: Option<u32>,
    /// For a new version of an existing job: the line diff from the version before.
    pub diff: Option<String>,
    /// The HTTP status it ended with; absent while it runs (or when the node died meanwhile).
    pub status: Option<u16>,
    /// `ok`, or the error it was answered.
    pub result: String,
    /// The node that served it.
    pub node: String,
}

/// The action a change request asks for, and the job it names.
fn action(method: &Method, path: &str) -> (String, Option<String>) {
    let path = path.trim_end_matches('/').trim_start_matches("/api/v1");
    let Some(rest) = path.strip_prefix("/jobs") else {
        let what = path.trim_start_matches('/');
        return (format!("{} {what}", verb(method)), None);
    };
    let rest = rest.trim_start_matches('/');
    if rest.is_empty() {
        return ("create job".to_owned(), None);
    }
    let (job, sub) = rest.split_once('/').unwrap_or((rest, ""));
    let action = match (method, sub) {
        (&Method::PUT, "") => "update job",
        (&Method::DELETE, "") => "delete job",
        (_, "dirty/discard") => "discard dirty records",
        (_, "dirty/replay") => "replay dirty records",
        (_, "tables") => "add tables",
        (_, "resync") => "resync tables",
        (_, "batches") => "run a batch",
        (_, "") => return (format!("{} job", verb(method)), Some(job.to_owned())),
        (_, sub) => return (format!("{sub} job"), Some(job.to_owned())),
    };
    (action.to_owned(), Some(job.to_owned()))
}

fn verb(method: &Method) -> &'static str {
    match *method {
        Method::PUT => "set",
        Method::DELETE => "delete",
        _ => "post",
    }
}

/// Records a change request before it runs and its result after; refuses it (503) when the
/// record cannot be written. Reads pass untouched.
pub async fn record(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    static WRITTEN: AtomicU64 = AtomicU64::new(0);
    let caller = request
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or(Caller { name: "anonymous".to_owned(), role: Role::Admin });
    let from =
        request.extensions().get::<ConnectInfo<SocketAddr>>().map_or_else(String::new, |peer| peer.0.to_string());
    let (action, job) = action(request.method(), request.uri().path());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let sequence = WRITTEN.fetch_add(1, Ordering::Relaxed);
    let node = api.node.config.id.clone();
    let key = format!("{}{:013}-{node}-{sequence:09}", prefix(), now.as_millis());
    let mut entry = AuditRecord {
        at_ms: now.as_millis() as u64,
        actor: caller.name,
        role: caller.role.name().to_owned(),
        from,
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
        action,
        job,
        version: None,
        diff: None,
        status: None,
        result: "pending".to_owned(),
        node,
    };
    let store = &*api.node.store;
    if let Err(error) = store.put(&key, &encode(&entry), None).await {
        return failure(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the audit trail cannot be written, so nothing was done: {error}"),
        )
        .into_response();
    }
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    // The answer is read for its error, version or name only when it is whole and small; a
    // larger one (a verification's differences) passes through untouched, recorded by status.
    use axum::body::HttpBody;
    let small = body.size_hint().exact().is_some_and(|size| size <= MOST_ANSWER_BYTES as u64);
    let (body, answered) = if small {
        let answer = axum::body::to_bytes(body, MOST_ANSWER_BYTES).await.unwrap_or_default();
        let answered: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
        (Body::from(answer), answered)
    } else {
        (body, serde_json::Value::Null)
    };
    entry.status = Some(parts.status.as_u16());
    entry.result = match answered["error"].as_str() {
        Some(error) if !parts.status.is_success() => scrub(error),
        _ if parts.status.is_success() => "ok".to_owned(),
        _ => format!("refused with status {}", parts.status.as_u16()),
    };
    let versioning = matches!(entry.action.as_str(), "create job" | "update job" | "rollback job" | "add tables");
    if parts.status.is_success() && versioning {
        entry.version = answered["version"].as_u64().map(|version| version as u32);
        // A created job is named by its document: the answer says which.
        if entry.job.is_none() {
            entry.job = answered["name"].as_str().map(str::to_owned);
        }
        if let (Some(job), Some(version)) = (&entry.job, entry.version.filter(|version| *version > 1)) {
            entry.diff = version_diff(store, job, version).await;
        }
    }
    if let Err(error) = store.put(&key, &encode(&entry), None).await {
        log::warn!("audit: the result of {} by {} was not recorded: {error}", entry.action, entry.actor);
    }
    if sequence % PRUNE_EVERY == PRUNE_EVERY - 1 {
        if let Err(error) = prune(store).await {
            log::warn!("audit: cannot prune the trail now: {error}");
        }
    }
    Response::from_parts(parts, body)
}

fn encode(record: &AuditRecord) -> String {
    serde_json::to_string(record).expect("an audit record serializes")
}

/// The diff from the version before `version` to it.
async fn version_diff(store: &dyn crate::cluster::store::Store, job: &str, version: u32) -> Option<String> {
    let (old, _) = load::<VersionRecord>(store, &version_key(job, version - 1)).await.ok()??;
    let (new, _) = load::<VersionRecord>(store, &version_key(job, version)).await.ok()??;
    Some(scrub(&super::diff::lines(&old.document, &new.document)))
}

/// Drops the records past `MOST_RECORDS` and those older than `KEEP_SECS`, oldest first.
async fn prune(store: &dyn crate::cluster::store::Store) -> sluice_core::Result<()> {
    let mut keys: Vec<String> = store.list(&prefix()).await?.into_iter().map(|entry| entry.key).collect();
    keys.sort();
    let now_ms = sluice_core::clock::unix_seconds() * 1000;
    let oldest_kept = now_ms.saturating_sub(KEEP_SECS * 1000);
    let surplus = keys.len().saturating_sub(MOST_RECORDS);
    for (index, key) in keys.iter().enumerate() {
        let millis: u64 = key[prefix().len()..].split('-').next().and_then(|text| text.parse().ok()).unwrap_or(0);
        if index < surplus || millis < oldest_kept {
            store.delete(key).await?;
        } else {
            break;
        }
    }
    Ok(())
}

/// Filters of `GET /audit`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct AuditQuery {
    /// Only the records of this job.
    pub job: Option<String>,
    /// Only the records of this token name.
    pub actor: Option<String>,
    /// The newest this many (default 100, at most 10,000).
    pub limit: Option<usize>,
}

/// The audit trail, newest first: every change asked of the API, who asked, from where, and
/// how it ended.
#[utoipa::path(get, path = "/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, description = "the records, newest first", body = [AuditRecord])))]
pub async fn list(State(api): State<Arc<Api>>, Query(query): Query<AuditQuery>) -> Reply {
    let limit = query.limit.unwrap_or(100).min(MOST_RECORDS);
    let mut entries = api.node.store.list(&prefix()).await?;
    entries.sort_by(|a, b| b.key.cmp(&a.key));
    let records: Vec<AuditRecord> = entries
        .iter()
        .filter_map(|entry| serde_json::from_str::<AuditRecord>(&entry.value).ok())
        .filter(|record| query.job.as_ref().is_none_or(|job| record.job.as_ref() == Some(job)))
        .filter(|record| query.actor.as_ref().is_none_or(|actor| &record.actor == actor))
        .take(limit)
        .collect();
    Ok(Json(records).into_response())
}

/// Who the request's token is: its name and role (what the console shows and hides by).
#[utoipa::path(get, path = "/whoami", tag = "audit",
    responses((status = 200, description = "the caller", body = Caller)))]
pub async fn whoami(caller: Option<axum::Extension<Caller>>) -> Reply {
    let caller = caller.map_or(Caller { name: "anonymous".into(), role: Role::Admin }, |caller| caller.0);
    Ok(Json(caller).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_change_is_named_as_an_action_on_its_job() {
        let cases = [
            (Method::POST, "/jobs", "create job", None),
            (Method::PUT, "/jobs/orders", "update job", Some("orders")),
            (Method::DELETE, "/jobs/orders", "delete job", Some("orders")),
            (Method::POST, "/jobs/orders/stop", "stop job", Some("orders")),
            (Method::POST, "/jobs/orders/rollback", "rollback job", Some("orders")),
            (Method::POST, "/jobs/orders/dirty/discard", "discard dirty records", Some("orders")),
            (Method::POST, "/jobs/orders/dirty/replay", "replay dirty records", Some("orders")),
            (Method::POST, "/jobs/orders/resync", "resync tables", Some("orders")),
            (Method::PUT, "/alarms", "set alarms", None),
        ];
        for (method, path, expected, job) in cases {
            assert_eq!(action(&method, path), (expected.to_owned(), job.map(str::to_owned)), "{method} {path}");
        }
    }
}
