//! Bearer tokens: an admin token may do everything, a read token only GET. Tokens come from
//! `SLUICE_ADMIN_TOKEN` / `SLUICE_READ_TOKEN` or a tokens file (`admin TOKEN` / `read TOKEN`
//! per line). A server with no token at all is open, and may then listen on loopback only.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sluice_core::{Error, Result};

use super::Api;

/// The shortest token accepted, from the environment or the tokens file.
const MIN_TOKEN_LENGTH: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum Role {
    Read,
    Admin,
}

/// The tokens a server accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    tokens: Vec<(sluice_core::secret::Secret, Role)>,
}

impl Tokens {
    /// From the environment, then the tokens file when given.
    pub fn load(file: Option<&Path>) -> Result<Tokens> {
        let mut tokens = Vec::new();
        for (variable, role) in [("SLUICE_ADMIN_TOKEN", Role::Admin), ("SLUICE_READ_TOKEN", Role::Read)] {
            if let Ok(token) = std::env::var(variable) {
                if token.len() < MIN_TOKEN_LENGTH {
                    return Err(Error::config(format!(
                        "{variable}: a token needs at least {MIN_TOKEN_LENGTH} characters"
                    ))
                    .hint("make one with `openssl rand -hex 32`"));
                }
                tokens.push((token, role));
            }
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|error| Error::config(format!("--tokens-file {}: cannot read it: {error}", path.display())))?;
            for (number, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let role = match line.split_whitespace().next() {
                    Some("admin") => Role::Admin,
                    Some("read") => Role::Read,
                    _ => {
                        return Err(Error::config(format!(
                            "--tokens-file {} line {}: expected `admin TOKEN` or `read TOKEN`",
                            path.display(),
                            number + 1
                        )))
                    }
                };
                let token = line.split_whitespace().nth(1).unwrap_or_default();
                if token.len() < MIN_TOKEN_LENGTH {
                    return Err(Error::config(format!(
                        "--tokens-file {} line {}: a token needs at least {MIN_TOKEN_LENGTH} characters",
                        path.display(),
                        number + 1
                    )));
                }
                tokens.push((token.to_owned(), role));
            }
        }
        for (token, _) in &tokens {
            sluice_core::secret::register(token);
        }
        Ok(Tokens {
            tokens: tokens.into_iter().map(|(token, role)| (sluice_core::secret::Secret::new(token), role)).collect(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The role of a presented token, comparing in time independent of where they differ.
    fn role(&self, presented: &str) -> Option<Role> {
        self.tokens
            .iter()
            .filter(|(token, _)| equal(token.expose().as_bytes(), presented.as_bytes()))
            .map(|(_, role)| *role)
            .max()
    }
}

fn equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |difference, (x, y)| difference | (x ^ y)) == 0
}

/// Lets a request through when its token's role allows its method: 401 without a valid token,
/// 403 when a read token asks to change something.
pub async fn authorize(State(api): State<Arc<Api>>, mut request: Request, next: Next) -> Response {
    if api.tokens.is_empty() {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(role) = presented.and_then(|token| api.tokens.role(token)) else {
        return (
            StatusCode::UNAUTHORIZED,
            [("www-authenticate", "Bearer")],
            axum::Json(json!({ "error": "a valid bearer token is required (Authorization: Bearer TOKEN)" })),
        )
            .into_response();
    };
    let reading = matches!(*request.method(), Method::GET | Method::HEAD);
    if !reading && role < Role::Admin {
        return (
            StatusCode::FORBIDDEN,
            axum::Json(json!({ "error": "this token may only read; changes need an admin token" })),
        )
            .into_response();
    }
    request.extensions_mut().insert(role);
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
    use super::loopback_host;

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
