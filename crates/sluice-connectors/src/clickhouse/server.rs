//! The ClickHouse server over its HTTP interface: statements in the request body, answers in
//! TabSeparated, rows sent in the request body (`insert`), the user and password as HTTP basic
//! authentication, TLS by rustls for `https://`.

use std::time::Duration;

use sluice_core::{Error, ErrorKind, Result, Side};

use crate::tls::{ClientTls, Verification};

/// The server's version, for the types it has (`types::Features`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
}

impl Version {
    /// Reads `SELECT version()`'s answer (`18.16.1`, `24.8.4.13`).
    pub fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(Version { major, minor })
    }

    pub fn at_least(self, major: u32, minor: u32) -> bool {
        self >= Version { major, minor }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}.{}", self.major, self.minor)
    }
}

/// One ClickHouse server: where it is, who we are to it, and the HTTP client that talks to it.
#[derive(Debug, Clone)]
pub struct Server {
    http: reqwest::Client,
    /// The endpoint without credentials or TLS parameters.
    endpoint: reqwest::Url,
    user: String,
    password: Option<String>,
    /// The URL as messages show it (no password).
    shown: String,
}

/// The URL parameters of TLS: `ca` (a PEM file of the CA that signed the server) and a client
/// certificate's `cert` and `key`; `https://` turns TLS on.
pub const TLS_PARAMETERS: crate::tls::TlsParameters =
    crate::tls::TlsParameters { mode: "tls", modes: &["verify-full"], ca: "ca", cert: "cert", key: "key" };

impl Server {
    /// A server from a `http://user:password@host:port` or `https://…?ca=…` URL.
    pub fn new(url: &str, shown: String) -> Result<Server> {
        let found = TLS_PARAMETERS.read(url);
        let mut endpoint = reqwest::Url::parse(&found.rest)
            .map_err(|error| Error::config(format!("target.url `{shown}` is not a URL: {error}")).on(Side::Target))?;
        let secure = match endpoint.scheme() {
            "http" => false,
            "https" => true,
            other => {
                return Err(Error::config(format!(
                    "target.url `{shown}`: the scheme is {other}; ClickHouse is reached over http:// or https://"
                ))
                .on(Side::Target))
            }
        };
        let user = match crate::tls::percent_decode(endpoint.username()) {
            empty if empty.is_empty() => "default".to_owned(),
            user => user,
        };
        let password = endpoint.password().map(crate::tls::percent_decode);
        if let Some(password) = &password {
            sluice_core::secret::register(password);
        }
        let _ = endpoint.set_username("");
        let _ = endpoint.set_password(None);
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(600))
            .tcp_nodelay(true)
            .no_proxy();
        if secure {
            let tls = found.client(Verification::Full);
            builder = builder.tls_backend_preconfigured(tls_config(&tls, &shown)?);
        } else if found.ca.is_some() || found.cert.is_some() {
            return Err(Error::config(format!(
                "target.url `{shown}` names TLS files but is http://; use https:// to reach the server over TLS"
            ))
            .on(Side::Target));
        }
        let http = builder
            .build()
            .map_err(|error| Error::config(format!("target.url `{shown}`: {error}")).on(Side::Target))?;
        Ok(Server { http, endpoint, user, password, shown })
    }

    /// The URL as messages show it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Runs a statement and returns its answer (TabSeparated unless the statement says otherwise).
    pub async fn query(&self, statement: &str) -> Result<String> {
        let request = self.http.post(self.endpoint.clone()).body(statement.to_owned());
        let answer = self.send(request, statement).await?;
        String::from_utf8(answer).map_err(|_| {
            Error::new(
                ErrorKind::Read,
                format!("ClickHouse answered `{}` with text that is not UTF-8", brief(statement)),
            )
            .on(Side::Target)
        })
    }

    /// Runs a query whose answer is read as it arrives (`Response::chunk`).
    pub async fn stream(&self, statement: &str) -> Result<reqwest::Response> {
        self.respond(self.http.post(self.endpoint.clone()).body(statement.to_owned()), statement).await
    }

    /// Sends rows: `statement` is an `INSERT … FORMAT …` (in the URL), `rows` its data.
    pub async fn insert(&self, statement: &str, rows: Vec<u8>) -> Result<()> {
        let mut endpoint = self.endpoint.clone();
        endpoint.query_pairs_mut().append_pair("query", statement);
        self.send(self.http.post(endpoint).body(rows), statement).await.map(drop)
    }

    async fn send(&self, request: reqwest::RequestBuilder, statement: &str) -> Result<Vec<u8>> {
        let response = self.respond(request, statement).await?;
        let body = response.bytes().await.map_err(|error| self.unreachable(&error))?;
        Ok(body.to_vec())
    }

    /// The server's answer to a request, or its refusal as an error.
    async fn respond(&self, request: reqwest::RequestBuilder, statement: &str) -> Result<reqwest::Response> {
        let request = request.basic_auth(&self.user, self.password.as_deref());
        let response = request.send().await.map_err(|error| self.unreachable(&error))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.bytes().await.map_err(|error| self.unreachable(&error))?;
        Err(self.refused(status, &String::from_utf8_lossy(&body), statement))
    }

    fn unreachable(&self, error: &reqwest::Error) -> Error {
        let text = crate::tls::describe(error);
        let message = format!("ClickHouse at {}: {text}", self.shown);
        if crate::tls::is_certificate_failure(&text) {
            // A setting to fix, not a moment to wait out.
            let hint = "the TLS handshake failed: check that `ca=` in the URL is the CA that signed the server's \
                        certificate, and that the host in the URL is a name the certificate holds";
            return Error::new(ErrorKind::Auth, message).on(Side::Target).hint(hint);
        }
        let kind = if error.is_connect() { ErrorKind::Connect } else { ErrorKind::Unavailable };
        let hint = if self.endpoint.scheme() == "http" {
            "check that the server runs and that the URL's port is its HTTP port (8123 by default); a port that \
             speaks HTTPS (8443 by default) needs https://"
        } else {
            "check that the server runs and that the URL's port is its HTTPS port (8443 by default)"
        };
        Error::new(kind, message).on(Side::Target).hint(hint)
    }

    /// The server's refusal, classified by its error code (`Code: 60, e.displayText() = …`).
    fn refused(&self, status: reqwest::StatusCode, text: &str, statement: &str) -> Error {
        let code = text.strip_prefix("Code: ").and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next());
        let code: Option<u32> = code.and_then(|code| code.parse().ok());
        let message = text.trim().trim_end_matches(", e.what() = DB::Exception").trim();
        let kind = match code {
            // Unknown user, wrong password, not enough privileges, readonly.
            Some(192 | 193 | 194 | 164 | 497 | 516) => ErrorKind::Auth,
            // Unknown table, database or column; no such column in the table.
            Some(60 | 81 | 16 | 47) => ErrorKind::Schema,
            // Too many parts or simultaneous queries, timeouts, memory: a retry helps.
            Some(252 | 202 | 159 | 241 | 209 | 210) => ErrorKind::Unavailable,
            _ if status.is_server_error() && code.is_none() => ErrorKind::Unavailable,
            _ => ErrorKind::Write,
        };
        let error = Error::new(kind, format!("ClickHouse at {} refused `{}`: {message}", self.shown, brief(statement)))
            .on(Side::Target);
        match (kind, code) {
            (_, Some(164)) => error.hint("the session is read-only: give the user a profile with readonly = 0, and take `readonly` out of target.url"),
            (ErrorKind::Auth, _) => error.hint("check the user and password in target.url and the user's grants"),
            _ => error,
        }
    }
}

fn tls_config(tls: &ClientTls, shown: &str) -> Result<rustls::ClientConfig> {
    tls.config().map_err(|error| Error::config(format!("target.url `{shown}`: {error}")).on(Side::Target))
}

/// A statement as messages show it: its first 200 characters.
fn brief(statement: &str) -> String {
    let mut end = statement.len().min(200);
    while !statement.is_char_boundary(end) {
        end -= 1;
    }
    if end < statement.len() {
        format!("{}…", &statement[..end])
    } else {
        statement.to_owned()
    }
}

/// `name` as a ClickHouse identifier: in back quotes, with back quotes and backslashes escaped.
pub fn quote(name: &str) -> String {
    format!("`{}`", name.replace('\\', "\\\\").replace('`', "\\`"))
}

/// `text` as a ClickHouse string literal.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_major_then_minor() {
        let old = Version::parse("18.16.1").unwrap();
        assert_eq!(old, Version { major: 18, minor: 16 });
        assert!(!old.at_least(21, 9));
        assert!(Version::parse("24.8.4.13\n").unwrap().at_least(21, 9));
        assert_eq!(Version::parse("garbage"), None);
    }

    #[test]
    fn names_and_text_are_quoted() {
        assert_eq!(quote("we`ird\\"), "`we\\`ird\\\\`");
        assert_eq!(literal("it's\\"), "'it\\'s\\\\'");
    }
}
