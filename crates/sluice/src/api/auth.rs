//! Bearer tokens, each with a name and a role: `read` looks, `operate` also runs jobs (stop,
//! start, restart, a batch, replay or discard dirty records, verify), `admin` may do everything
//! (submit, update, roll back, delete, add tables, alarms). Tokens come from
//! `SLUICE_ADMIN_TOKEN` / `SLUICE_OPERATE_TOKEN` / `SLUICE_READ_TOKEN` (named after the variable)
//! or a tokens file of `ROLE NAME TOKEN` lines (`ROLE TOKEN` lines, named `ROLE-lineN`, stay
//! valid). A server with no token at all is open, and may then listen on loopback only.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::json;
use sluice_core::secret::Secret;
use sluice_core::{Error, Result};

use super::Api;

/// The shortest token accepted, from the environment or the tokens file.
const MIN_TOKEN_LENGTH: usize = 16;

/// What a token may do; each role may also do what the roles before it may.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Operate,
    Admin,
}

impl Role {
    fn parse(word: &str) -> Option<Role> {
        match word {
            "read" => Some(Role::Read),
            "operate" => Some(Role::Operate),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Admin => "admin",
        }
    }
}

/// Who sent a request: the name of its token and the token's role (`anonymous` and admin on a
/// server without tokens).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

/// The tokens a server accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    tokens: Vec<(Secret, Caller)>,
}

impl Tokens {
    /// From the environment, then the tokens file when given.
    pub fn load(file: Option<&Path>) -> Result<Tokens> {
        let mut tokens: Vec<(String, Caller)> = Vec::new();
        for (variable, role) in [
            ("SLUICE_ADMIN_TOKEN", Role::Admin),
            ("SLUICE_OPERATE_TOKEN", Role::Operate),
            ("SLUICE_READ_TOKEN", Role::Read),
        ] {
            if let Ok(token) = std::env::var(variable) {
                if token.len() < MIN_TOKEN_LENGTH {
                    return Err(Error::config(format!(
                        "{variable}: a token needs at least {MIN_TOKEN_LENGTH} characters"
                    ))
                    .hint("make one with `openssl rand -hex 32`"));
                }
                tokens.push((token, Caller { name: variable.to_owned(), role }));
            }
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|error| Error::config(format!("--tokens-file {}: cannot read it: {error}", path.display())))?;
            let mut problems = Vec::new();
            for (index, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let number = index + 1;
                let words: Vec<&str> = line.split_whitespace().collect();
                let (role, name, token) = match words.as_slice() {
                    [role, token] => (Role::parse(role), format!("{role}-line{number}"), *token),
                    [role, name, token] => (Role::parse(role), (*name).to_owned(), *token),
                    _ => (None, String::new(), ""),
                };
                let Some(role) = role else {
                    problems.push(format!("line {number}: expected `ROLE NAME TOKEN` (ROLE: read, operate or admin)"));
                    continue;
                };
                if token.len() < MIN_TOKEN_LENGTH {
                    problems.push(format!("line {number}: a token needs at least {MIN_TOKEN_LENGTH} characters"));
                } else if tokens.iter().any(|(_, caller)| caller.name == name) {
                    problems.push(format!("line {number}: the name {name} is given twice"));
                } else {
                    tokens.push((token.to_owned(), Caller { name, role }));
                }
            }
            if !problems.is_empty() {
                return Err(Error::config(format!("--tokens-file {}: {}", path.display(), problems.join("; "))));
            }
        }
        for (token, _) in &tokens {
            sluice_core::secret::register(token);
        }
        Ok(Tokens { tokens: tokens.into_iter().map(|(token, caller)| (Secret::new(token), caller)).collect() })
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Who presents this token (the strongest, should two lines give it), comparing every token in
    /// time independent of where they differ.
    fn caller(&self, presented: &str) -> Option<Caller> {
        self.tokens
            .iter()
            .filter(|(token, _)| equal(token.expose().as_bytes(), presented.as_bytes()))
            .map(|(_, caller)| caller.clone())
            .max_by_key(|caller| caller.role)
    }
}

fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |difference, (x, y)| difference | (x ^ y)) == 0
}

/// The role a request needs: `read` to look; `operate` to run a job's life (stop, start,
/// restart, a batch, dirty records, verify); `admin` for the rest.
pub fn needed(method: &Method, path: &str) -> Role {
    if matches!(*method, Method::GET | Method::HEAD) {
        return Role::Read;
    }
    // Inside the API's router the path has lost its `/api/v1`.
    let job_path = path.trim_end_matches('/').trim_start_matches("/api/v1").strip_prefix("/jobs/");
    let action = job_path.and_then(|rest| rest.split_once('/'));
    match action.map(|(_, action)| action) {
        Some("stop" | "start" | "restart" | "batches" | "dirty/discard" | "dirty/replay" | "verify" | "resync")
            if *method == Method::POST =>
        {
            Role::Operate
        }
        _ => Role::Admin,
    }
}

/// Lets a request through when its token's role allows it: 401 without a valid token, 403
/// naming the role needed when the token's is weaker. The caller goes into the request.
pub async fn authorize(State(api): State<Arc<Api>>, mut request: Request, next: Next) -> Response {
    if api.tokens.is_empty() {
        request.extensions_mut().insert(Caller { name: "anonymous".into(), role: Role::Admin });
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(caller) = presented.and_then(|token| api.tokens.caller(token)) else {
        return (
            StatusCode::UNAUTHORIZED,
            [("www-authenticate", "Bearer")],
            axum::Json(json!({ "error": "a valid bearer token is required (Authorization: Bearer TOKEN)" })),
        )
            .into_response();
    };
    let needed = needed(request.method(), request.uri().path());
    if caller.role < needed {
        let message = format!(
            "this needs the {} role; the token {} has the {} role",
            needed.name(),
            caller.name,
            caller.role.name()
        );
        return (StatusCode::FORBIDDEN, axum::Json(json!({ "error": message, "needed": needed }))).into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// Refuses what a browser on another site could send: a request whose `Origin` is not the
/// server itself, or that a browser marks cross-site; and, on a server without tokens (whose
/// loopback address is its only protection), a `Host` that is not a loopback name (DNS
/// rebinding). A body must be JSON or YAML, which a plain HTML form cannot send.
pub async fn same_site(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let refuse = |message: String| (StatusCode::FORBIDDEN, axum::Json(json!({ "error": message }))).into_response();
    let host = header(headers, "host").unwrap_or_default();
    if let Some(origin) = header(headers, "origin") {
        let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest).trim_end_matches('/');
        if !origin_host.eq_ignore_ascii_case(host) {
            return refuse(format!("cross-site request refused: Origin {origin} is not this server ({host})"));
        }
    }
    if header(headers, "sec-fetch-site") == Some("cross-site") {
        return refuse("cross-site request refused (Sec-Fetch-Site: cross-site)".to_owned());
    }
    if api.tokens.is_empty() && !loopback_host(host) {
        return refuse(format!(
            "this server has no API token and answers only requests addressed to a loopback name, not Host {host}"
        ));
    }
    let has_body = header(headers, "content-length").is_some_and(|length| length != "0")
        || headers.contains_key("transfer-encoding");
    if has_body && !matches!(*request.method(), Method::GET | Method::HEAD) {
        let content_type = header(headers, "content-type").unwrap_or_default();
        let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
        if !matches!(media.as_str(), "application/json" | "application/yaml" | "application/x-yaml" | "text/yaml") {
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                axum::Json(json!({ "error": format!("a request body must be application/json or application/yaml, not {content_type:?}") })),
            )
                .into_response();
        }
    }
    next.run(request).await
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// Whether a `Host` header names this machine's loopback (with any port).
fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|character| character.is_ascii_digit()) && !name.ends_with(':') => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|address| address.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::{loopback_host, needed, Method, Role};

    #[test]
    fn each_route_needs_the_role_the_readme_says() {
        for (method, path, role) in [
            (Method::GET, "/api/v1/jobs", Role::Read),
            (Method::GET, "/api/v1/audit", Role::Read),
            (Method::POST, "/api/v1/jobs/a/stop", Role::Operate),
            (Method::POST, "/api/v1/jobs/a/start", Role::Operate),
            (Method::POST, "/api/v1/jobs/a/restart", Role::Operate),
            (Method::POST, "/api/v1/jobs/a/batches", Role::Operate),
            (Method::POST, "/api/v1/jobs/a/dirty/discard", Role::Operate),
            (Method::POST, "/api/v1/jobs/a/dirty/replay", Role::Operate),
            (Method::POST, "/api/v1/jobs/a/verify", Role::Operate),
            (Method::POST, "/api/v1/jobs/a/resync", Role::Operate),
            (Method::POST, "/api/v1/jobs", Role::Admin),
            (Method::PUT, "/api/v1/jobs/a", Role::Admin),
            (Method::DELETE, "/api/v1/jobs/a", Role::Admin),
            (Method::POST, "/api/v1/jobs/a/rollback", Role::Admin),
            (Method::POST, "/api/v1/jobs/a/tables", Role::Admin),
            (Method::PUT, "/api/v1/alarms", Role::Admin),
            // A job named like an action is still the job.
            (Method::DELETE, "/api/v1/jobs/stop", Role::Admin),
            (Method::POST, "/jobs/jobs/stop", Role::Operate),
        ] {
            assert_eq!(needed(&method, path), role, "{method} {path}");
        }
    }

    #[test]
    fn loopback_hosts_are_recognized_with_or_without_a_port() {
        for host in ["127.0.0.1:7070", "localhost", "LOCALHOST:1", "[::1]:80", "::1", "127.1.2.3"] {
            assert!(loopback_host(host), "{host}");
        }
        for host in ["evil.example:7070", "10.0.0.1", "", "localhost.evil.example"] {
            assert!(!loopback_host(host), "{host}");
        }
    }
}
