//! `sluice job …`: a client of a server's API, over plain HTTP/1.1.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response: status and body.
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// Sends one request to `server` (`http://host:port`) and reads the whole response.
pub async fn request(
    server: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<(&str, &str)>,
) -> Result<Response, String> {
    let authority = server.trim_end_matches('/').strip_prefix("http://").ok_or_else(|| {
        format!("--server {server}: expected http://host:port (put a TLS-terminating proxy in front for https)")
    })?;
    let connect = TcpStream::connect(authority);
    let mut stream = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .map_err(|_| format!("{server}: no answer within 10 s"))?
        .map_err(|error| format!("cannot reach the server at {server}: {error}"))?;
    let mut head = format!(
        "{method} /api/v1{path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let (content_type, payload) = body.unwrap_or(("application/json", ""));
    head.push_str(&format!("Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n", payload.len()));
    stream.write_all(head.as_bytes()).await.map_err(|error| format!("{server}: {error}"))?;
    stream.write_all(payload.as_bytes()).await.map_err(|error| format!("{server}: {error}"))?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut raw))
        .await
        .map_err(|_| format!("{server}: the response did not end within 60 s"))?
        .map_err(|error| format!("{server}: {error}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{server}: not an HTTP response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{server}: not an HTTP response"))?;
    let chunked = head.lines().any(|line| line.to_ascii_lowercase().starts_with("transfer-encoding: chunked"));
    let body = if chunked { unchunk(body) } else { body.to_owned() };
    Ok(Response { status, body })
}

/// Joins the chunks of a chunked body.
fn unchunk(mut body: &str) -> String {
    let mut output = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        output.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    output
}
