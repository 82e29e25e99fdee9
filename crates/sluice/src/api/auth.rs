//! Bearer tokens: an admin token may do everything, a read token only GET. Tokens come from
//! `SLUICE_ADMIN_TOKEN` / `SLUICE_READ_TOKEN` or a tokens file (`admin TOKEN` / `read TOKEN`
//! per line). A server with no token at all is open, and may then listen on loopback only.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sluice_core::{Error, Result};

use super::Api;

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
                if !token.is_empty() {
                    tokens.push((token, role));
                }
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
                if token.len() < 16 {
                    return Err(Error::config(format!(
                        "--tokens-file {} line {}: a token needs at least 16 characters",
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
pub async fn authorize(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
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
    next.run(request).await
}
