//! `sluice job …`: a client of a server's API (HTTP or HTTPS, through reqwest).

use std::path::PathBuf;
use std::time::Duration;

use sluice_connectors::tls::{ClientTls, Verification};

/// Where the API is and how to talk to it.
#[derive(Debug, Clone)]
pub struct Connection {
    /// `http://host:port` or `https://host:port`.
    pub server: String,
    pub token: Option<String>,
    /// The CA that signed an HTTPS server's certificate (the system's roots when absent).
    pub ca: Option<PathBuf>,
}

/// A response: status and body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// Sends one request to the API and reads the whole response.
pub async fn request(
    connection: &Connection,
    method: reqwest::Method,
    path: &str,
    body: Option<(&str, &str)>,
) -> Result<Response, String> {
    let server = connection.server.trim_end_matches('/');
    if !server.starts_with("http://") && !server.starts_with("https://") {
        return Err(format!("--server {server}: expected http://host:port or https://host:port"));
    }
    let mut builder =
        reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).timeout(Duration::from_secs(60)).no_proxy();
    if server.starts_with("https://") {
        let tls = ClientTls { verification: Verification::Full, ca: connection.ca.clone(), cert: None, key: None };
        builder = builder.tls_backend_preconfigured(tls.config().map_err(|error| format!("--ca: {error}"))?);
    } else if connection.ca.is_some() {
        return Err(format!("--ca is given but --server {server} is http://; use https://"));
    }
    let client = builder.build().map_err(|error| format!("cannot make an HTTP client: {error}"))?;
    let mut request = client.request(method, format!("{server}/api/v1{path}")).header("Accept", "application/json");
    if let Some(token) = &connection.token {
        request = request.bearer_auth(token);
    }
    if let Some((content_type, payload)) = body {
        request = request.header("Content-Type", content_type).body(payload.to_owned());
    }
    let response = request.send().await.map_err(|error| {
        let cause = sluice_connectors::tls::describe(&error);
        if error.is_connect() {
            format!("cannot reach the server at {server}: {cause}")
        } else if error.is_timeout() {
            format!("{server}: no complete answer within 60 s")
        } else {
            format!("{server}: {cause}")
        }
    })?;
    let status = response.status().as_u16();
    let body = response.text().await.map_err(|error| format!("{server}: {error}"))?;
    Ok(Response { status, body })
}
