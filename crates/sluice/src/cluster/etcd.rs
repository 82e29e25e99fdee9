//! The coordination store on etcd: leases, guarded writes as transactions comparing create
//! revisions. Only this file knows etcd.
//!
//! It speaks etcd's v3 JSON gateway (`POST /v3/kv/range` …, the same gRPC services as JSON over
//! HTTP/1.1, served by every etcd ≥ 3.4 on its client port) through reqwest: no protobuf
//! compiler at build time, and the same rustls configuration as every other connection. Keys and
//! values travel base64-encoded; 64-bit integers as strings.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use sluice_connectors::tls::{ClientTls, Verification};
use sluice_core::secret::Secret;
use sluice_core::{Error, ErrorKind, Result, Side};

use super::store::{store_error, Entry, Event, Guard, Store, Watch};

/// How long one watch lives before it ends and its watcher reads the prefix again: the safety
/// net under the watch (a member that stopped answering without closing the connection, an
/// event lost anywhere), at the cost of one read and one new watch per prefix and period.
const WATCH_FOR: Duration = Duration::from_secs(120);

/// How to reach an etcd cluster: its members, TLS files and user.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// Members, comma separated: `http://host:port` or `https://host:port`.
    pub members: String,
    /// The CA that signed the members' certificates (the system's roots when absent).
    pub ca: Option<PathBuf>,
    /// A client certificate and key, for members started with `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// An etcd user, with its password, when etcd has authentication enabled.
    pub user: Option<String>,
    pub password: Option<Secret>,
}

/// A connection to an etcd cluster (any of its members).
pub struct EtcdStore {
    http: reqwest::Client,
    members: Vec<String>,
    /// The member that answered last: requests go there first.
    current: AtomicUsize,
    user: Option<(String, Secret)>,
    /// The auth token of `user`, renewed when etcd says it is no longer valid.
    token: Mutex<Option<Secret>>,
    /// The revision of the latest write made through this connection.
    written: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("EtcdStore").field("members", &self.members).finish_non_exhaustive()
    }
}

fn etcd_config_error(message: impl Into<String>) -> Error {
    Error::config(message).on(Side::State)
}

impl EtcdStore {
    /// Connects to the members of `options` and proves one answers.
    pub async fn connect(options: &EtcdOptions) -> Result<EtcdStore> {
        let members: Vec<String> = options
            .members
            .split(',')
            .map(str::trim)
            .filter(|member| !member.is_empty())
            .map(|member| {
                let member = member.trim_end_matches('/');
                if member.contains("://") {
                    member.to_owned()
                } else {
                    format!("http://{member}")
                }
            })
            .collect();
        if members.is_empty() {
            return Err(etcd_config_error("--etcd: no member given; expected http(s)://host:port[,…]"));
        }
        if let Some(member) =
            members.iter().find(|member| !member.starts_with("http://") && !member.starts_with("https://"))
        {
            return Err(etcd_config_error(format!("--etcd {member}: expected http:// or https://")));
        }
        let secure = members.iter().any(|member| member.starts_with("https://"));
        let has_tls_files = options.ca.is_some() || options.cert.is_some() || options.key.is_some();
        if has_tls_files && !secure {
            return Err(etcd_config_error(
                "--etcd-ca/--etcd-cert/--etcd-key are given but the --etcd members are http://; use https://",
            ));
        }
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .tcp_keepalive(Duration::from_secs(1))
            .no_proxy();
        if secure {
            let tls = ClientTls {
                verification: Verification::Full,
                ca: options.ca.clone(),
                cert: options.cert.clone(),
                key: options.key.clone(),
            };
            let config = tls.config().map_err(|error| etcd_config_error(format!("etcd: {error}")))?;
            builder = builder.tls_backend_preconfigured(config);
        }
        let http = builder.build().map_err(|error| etcd_config_error(format!("etcd: {error}")))?;
        let user = match (&options.user, &options.password) {
            (Some(user), Some(password)) => Some((user.clone(), password.clone())),
            (None, None) => None,
            _ => return Err(etcd_config_error("etcd authentication needs both --etcd-user and SLUICE_ETCD_PASSWORD")),
        };
        // Each process starts at a member of its own (as etcd's own clients balance theirs), so
        // a hundred nodes do not all load the first member named.
        let first = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish() as usize % members.len()
        };
        let store = EtcdStore {
            http,
            members,
            current: AtomicUsize::new(first),
            user,
            token: Mutex::new(None),
            written: Default::default(),
        };
        match store.get("/sluice/").await {
            Ok(_) => Ok(store),
            Err(error) if error.kind() == ErrorKind::Unavailable => {
                for member in &store.members {
                    if speaks_tls(member).await {
                        return Err(etcd_config_error(format!(
                            "--etcd {member}: this member speaks TLS; write https:// (with --etcd-ca when its CA \
                             is not among the system's)"
                        )));
                    }
                }
                Err(error)
            }
            Err(error) => Err(error),
        }
    }

    /// Sends one gateway call, moving to the next member while a member cannot be reached (a
    /// request that could not connect was never sent, so this is safe even for a write), and
    /// authenticating again when etcd no longer knows the token.
    async fn call(&self, doing: &str, path: &str, body: &Value) -> Result<Value> {
        let mut authenticated_again = false;
        let mut failures = Vec::new();
        let mut attempt = 0;
        while attempt < self.members.len() * 2 {
            let index = (self.current.load(Ordering::Relaxed) + attempt) % self.members.len();
            let member = &self.members[index];
            let token = match self.token(doing, member).await {
                Ok(token) => token,
                // This member cannot be reached to sign in: the next one may.
                Err(error) if error.kind() == ErrorKind::Unavailable => {
                    failures.push(error.message().to_owned());
                    attempt += 1;
                    continue;
                }
                Err(error) => return Err(error),
            };
            let mut request = self.http.post(format!("{member}{path}")).json(body);
            if let Some(token) = &token {
                request = request.header("Authorization", token.expose());
            }
            match request.send().await {
                Ok(response) => {
                    self.current.store(index, Ordering::Relaxed);
                    let status = response.status();
                    let answer = answer(doing, member, response).await?;
                    // A streaming call (lease keep-alive) answers 200 with `{"error": {...}}`.
                    let streamed_error = answer.get("error").filter(|error| error.is_object());
                    if status.is_success() && streamed_error.is_none() {
                        return Ok(answer);
                    }
                    let message = streamed_error
                        .and_then(|error| error.get("message"))
                        .or_else(|| answer.get("error"))
                        .or_else(|| answer.get("message"))
                        .and_then(Value::as_str)
                        .unwrap_or("no message")
                        .to_owned();
                    if message.contains("invalid auth token") && self.user.is_some() && !authenticated_again {
                        authenticated_again = true;
                        *self.token.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = None;
                        continue;
                    }
                    return Err(answer_error(doing, status.as_u16(), &message));
                }
                Err(error) if error.is_connect() => {
                    let cause = describe(&error);
                    if sluice_connectors::tls::is_certificate_failure(&cause) {
                        return Err(Error::new(ErrorKind::Auth, format!("etcd at {member}: {cause}"))
                            .on(Side::State)
                            .hint(
                                sluice_connectors::tls::HANDSHAKE_HINT
                                    .replace("{ca}", "--etcd-ca")
                                    .replace(", or weaken {mode}", ""),
                            ));
                    }
                    failures.push(format!("{member}: {cause}"));
                    attempt += 1;
                }
                Err(error) => {
                    if error.is_timeout() {
                        // A member that takes the request and never answers (cut off from its
                        // peers, overloaded): the next call goes to another one. This call is not
                        // sent again, as it may have been applied.
                        self.current.store((index + 1) % self.members.len(), Ordering::Relaxed);
                    }
                    return Err(store_error(doing, format!("{member}: {}", describe(&error))));
                }
            }
        }
        Err(Error::new(ErrorKind::Unavailable, format!("coordination store: cannot {doing}: {}", failures.join("; ")))
            .on(Side::State)
            .hint("start etcd or fix --etcd"))
    }

    /// Opens a streaming call (a watch) on the first member that takes it. Members are asked to
    /// end the stream when they lose their cluster's leader (`hasleader`), so a watch never
    /// stays on a member cut off from the others.
    async fn open_stream(&self, doing: &str, path: &str, body: &Value) -> Result<(String, reqwest::Response)> {
        let mut failures = Vec::new();
        for attempt in 0..self.members.len() {
            let index = (self.current.load(Ordering::Relaxed) + attempt) % self.members.len();
            let member = &self.members[index];
            let token = match self.token(doing, member).await {
                Ok(token) => token,
                Err(error) if error.kind() == ErrorKind::Unavailable => {
                    failures.push(error.message().to_owned());
                    continue;
                }
                Err(error) => return Err(error),
            };
            let mut request = self
                .http
                .post(format!("{member}{path}"))
                .json(body)
                .timeout(WATCH_FOR)
                .header("Grpc-Metadata-hasleader", "true");
            if let Some(token) = &token {
                request = request.header("Authorization", token.expose());
            }
            match request.send().await {
                Ok(response) if response.status().is_success() => return Ok((member.clone(), response)),
                Ok(response) => {
                    let status = response.status().as_u16();
                    let answer = answer(doing, member, response).await?;
                    let message = answer.get("error").or_else(|| answer.get("message")).and_then(Value::as_str);
                    return Err(answer_error(doing, status, message.unwrap_or("no message")));
                }
                Err(error) => failures.push(format!("{member}: {}", describe(&error))),
            }
        }
        Err(Error::new(ErrorKind::Unavailable, format!("coordination store: cannot {doing}: {}", failures.join("; ")))
            .on(Side::State)
            .hint("start etcd or fix --etcd"))
    }

    /// The auth token to send, authenticating first when there is a user and no token yet.
    async fn token(&self, doing: &str, member: &str) -> Result<Option<Secret>> {
        let Some((user, password)) = &self.user else { return Ok(None) };
        if let Some(token) = self.token.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone() {
            return Ok(Some(token));
        }
        let body = json!({ "name": user, "password": password.expose() });
        let response = self
            .http
            .post(format!("{member}/v3/auth/authenticate"))
            .json(&body)
            .send()
            .await
            .map_err(|error| store_error(doing, format!("{member}: {}", describe(&error))))?;
        let status = response.status();
        let answer = answer(doing, member, response).await?;
        let Some(token) = answer.get("token").and_then(Value::as_str) else {
            let message = answer.get("error").and_then(Value::as_str).unwrap_or("no token in the answer");
            return Err(Error::new(ErrorKind::Auth, format!("etcd refused user {user}: {message} (HTTP {status})"))
                .on(Side::State)
                .hint("check --etcd-user and SLUICE_ETCD_PASSWORD"));
        };
        let token = Secret::new(token);
        *self.token.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(token.clone());
        Ok(Some(token))
    }

    async fn transaction(&self, doing: &str, compare: Value, success: Value) -> Result<(bool, u64)> {
        let answer = self.call(doing, "/v3/kv/txn", &json!({ "compare": [compare], "success": [success] })).await?;
        let succeeded = answer.get("succeeded").and_then(Value::as_bool).unwrap_or(false);
        // A delete that found nothing wrote nothing: its answer's revision may be another's.
        let deleted_nothing = answer
            .pointer("/responses/0/response_delete_range")
            .is_some_and(|deleted| integer(deleted.get("deleted")) == 0);
        if succeeded && !deleted_nothing {
            self.wrote(&answer);
        }
        Ok((succeeded, revision(&answer)))
    }

    /// Notes the revision of a write's answer.
    fn wrote(&self, answer: &Value) -> u64 {
        let revision = revision(answer);
        self.written.fetch_max(revision, Ordering::AcqRel);
        revision
    }
}

/// The JSON of a gateway answer. Anything else is not etcd's gateway speaking: a plain-HTTP
/// request to an HTTPS member, a proxy, another service on the port. That is a setting to fix,
/// not a moment to wait out.
async fn answer(doing: &str, member: &str, response: reqwest::Response) -> Result<Value> {
    let status = response.status();
    let text = response.text().await.map_err(|error| store_error(doing, format!("{member}: {}", describe(&error))))?;
    serde_json::from_str(&text).map_err(|_| {
        let shown: String = text.trim().chars().take(200).collect();
        let hint = if shown.contains("HTTPS") {
            "this member speaks HTTPS: write https:// in --etcd, with --etcd-ca"
        } else {
            "check that --etcd names etcd's client URLs (etcd 3.4 or newer)"
        };
        Error::config(format!(
            "coordination store: cannot {doing}: etcd at {member} answered HTTP {status}, not etcd's JSON: {shown}"
        ))
        .on(Side::State)
        .hint(hint)
    })
}

/// Whether an `http://` member answers a TLS handshake: a plaintext request to an HTTPS-only
/// member is just a closed connection, which alone says nothing of why.
async fn speaks_tls(member: &str) -> bool {
    let Some(authority) = member.strip_prefix("http://") else { return false };
    let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host);
    let connect = tokio::net::TcpStream::connect(authority);
    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(2), connect).await else { return false };
    let tls = ClientTls { verification: Verification::Encrypt, ca: None, cert: None, key: None };
    let (Ok(config), Ok(name)) = (tls.config(), sluice_connectors::tls::server_name(host)) else { return false };
    let handshake = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, stream);
    match tokio::time::timeout(Duration::from_secs(2), handshake).await {
        Ok(Ok(_)) => true,
        // A server that wants a client certificate ends the handshake with an alert: TLS all the same.
        Ok(Err(error)) => error.to_string().to_ascii_lowercase().contains("alert"),
        Err(_) => false,
    }
}

/// Reads a watch's stream of messages and sends its events on, until the stream ends, etcd
/// cancels the watch, or nobody listens any more (`Ok`).
async fn follow(
    mut response: reqwest::Response,
    events: &tokio::sync::mpsc::Sender<Vec<Event>>,
) -> std::result::Result<(), String> {
    let mut unread = Vec::new();
    loop {
        let Some(chunk) = response.chunk().await.map_err(|error| describe(&error))? else {
            return Err("the member closed the stream".to_owned());
        };
        unread.extend_from_slice(&chunk);
        // The gateway writes one JSON object per message; a chunk may end inside one.
        let mut messages = serde_json::Deserializer::from_slice(&unread).into_iter::<Value>();
        let mut read = 0;
        while let Some(message) = messages.next() {
            let message = match message {
                Ok(message) => message,
                Err(error) if error.is_eof() => break,
                Err(error) => return Err(format!("unexpected message: {error}")),
            };
            read = messages.byte_offset();
            if let Some(error) = message.get("error") {
                return Err(format!("etcd ended it: {error}"));
            }
            let result = message.get("result").unwrap_or(&message);
            if result.get("canceled").and_then(Value::as_bool) == Some(true) {
                let compacted = integer(result.get("compact_revision"));
                return Err(format!("etcd cancelled it (compacted to revision {compacted})"));
            }
            let batch = watch_events(result).map_err(|error| error.to_string())?;
            if !batch.is_empty() && events.send(batch).await.is_err() {
                return Ok(());
            }
        }
        unread.drain(..read);
    }
}

/// The events of one watch message.
fn watch_events(result: &Value) -> Result<Vec<Event>> {
    #[derive(Deserialize)]
    struct WatchEvent {
        #[serde(default, rename = "type")]
        kind: String,
        kv: KeyValue,
    }
    let Some(events) = result.get("events") else { return Ok(Vec::new()) };
    let events: Vec<WatchEvent> = serde_json::from_value(events.clone())
        .map_err(|error| store_error("watch", format!("unexpected answer: {error}")))?;
    events
        .iter()
        .map(|event| {
            let entry = entry(&event.kv)?;
            // A put is etcd's default event type, which the gateway leaves out.
            Ok(match event.kind.as_str() {
                "DELETE" => Event::Delete { key: entry.key, revision: entry.mod_revision },
                _ => Event::Put(entry),
            })
        })
        .collect()
}

/// An HTTP error answer of the gateway as a store error.
fn answer_error(doing: &str, status: u16, message: &str) -> Error {
    let kind = if message.contains("permission denied") || message.contains("authentication") || status == 401 {
        ErrorKind::Auth
    } else {
        ErrorKind::Unavailable
    };
    Error::new(kind, format!("coordination store: cannot {doing}: etcd answered {status}: {message}")).on(Side::State)
}

/// A reqwest error with its causes (the TLS reason sits two levels down).
fn describe(error: &reqwest::Error) -> String {
    sluice_connectors::tls::describe(error)
}

fn encode(text: &str) -> String {
    BASE64.encode(text.as_bytes())
}

/// The end of the key range holding every key that starts with `prefix` (etcd's prefix rule:
/// the prefix with its last byte incremented).
fn prefix_end(prefix: &str) -> String {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return BASE64.encode(end);
        }
    }
    // Every byte 0xff (or empty): to the end of the key space.
    BASE64.encode([0u8])
}

/// A 64-bit integer the gateway sends as a string (or leaves out when it is zero).
fn integer(value: Option<&Value>) -> i64 {
    match value {
        Some(Value::String(text)) => text.parse().unwrap_or(0),
        Some(Value::Number(number)) => number.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn revision(answer: &Value) -> u64 {
    integer(answer.get("header").and_then(|header| header.get("revision"))) as u64
}

#[derive(Deserialize)]
struct KeyValue {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default)]
    create_revision: Value,
    #[serde(default)]
    mod_revision: Value,
}

fn entries(answer: &Value) -> Result<Vec<Entry>> {
    let Some(kvs) = answer.get("kvs") else { return Ok(Vec::new()) };
    let kvs: Vec<KeyValue> = serde_json::from_value(kvs.clone())
        .map_err(|error| store_error("read", format!("unexpected answer: {error}")))?;
    kvs.iter().map(entry).collect()
}

fn entry(kv: &KeyValue) -> Result<Entry> {
    let text = |encoded: &str| -> Result<String> {
        let bytes = BASE64.decode(encoded).map_err(|error| store_error("read", format!("bad base64: {error}")))?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    Ok(Entry {
        key: text(&kv.key)?,
        value: text(&kv.value)?,
        create_revision: integer(Some(&kv.create_revision)) as u64,
        mod_revision: integer(Some(&kv.mod_revision)) as u64,
    })
}

fn put_request(key: &str, value: &str, lease: Option<i64>) -> Value {
    let mut put = json!({ "key": encode(key), "value": encode(value) });
    if let Some(lease) = lease {
        put["lease"] = json!(lease.to_string());
    }
    put
}

fn compare_create(key: &str, create_revision: u64) -> Value {
    json!({ "target": "CREATE", "result": "EQUAL", "key": encode(key), "create_revision": create_revision.to_string() })
}

#[async_trait]
impl Store for EtcdStore {
    async fn grant(&self, ttl: Duration) -> Result<i64> {
        let answer =
            self.call("grant a lease", "/v3/lease/grant", &json!({ "TTL": ttl.as_secs().max(1).to_string() })).await?;
        match integer(answer.get("ID")) {
            0 => Err(store_error("grant a lease", format!("unexpected answer: {answer}"))),
            id => Ok(id),
        }
    }

    async fn renew(&self, lease: i64) -> Result<bool> {
        // The gateway answers a one-message keep-alive stream with one result; a lease etcd no
        // longer knows comes back with no TTL.
        let answer = self.call("renew the lease", "/v3/lease/keepalive", &json!({ "ID": lease.to_string() })).await?;
        let result = answer.get("result").unwrap_or(&answer);
        Ok(integer(result.get("TTL")) > 0)
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        match self.call("revoke the lease", "/v3/lease/revoke", &json!({ "ID": lease.to_string() })).await {
            Err(error) if error.message().contains("lease not found") => Ok(()),
            other => other.map(drop),
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>> {
        let answer = self.call("read", "/v3/kv/range", &json!({ "key": encode(key) })).await?;
        Ok(entries(&answer)?.into_iter().next())
    }

    async fn list_at(&self, prefix: &str) -> Result<(Vec<Entry>, u64)> {
        let body = json!({ "key": encode(prefix), "range_end": prefix_end(prefix) });
        let answer = self.call("list", "/v3/kv/range", &body).await?;
        Ok((entries(&answer)?, revision(&answer)))
    }

    async fn snapshot(&self, prefixes: &[&str]) -> Result<(Vec<Entry>, u64)> {
        let Some((first, rest)) = prefixes.split_first() else { return Ok((Vec::new(), 0)) };
        let (mut all, revision) = self.list_at(first).await?;
        for prefix in rest {
            let body = json!({
                "key": encode(prefix),
                "range_end": prefix_end(prefix),
                "revision": revision.to_string(),
            });
            all.extend(entries(&self.call("list", "/v3/kv/range", &body).await?)?);
        }
        Ok((all, revision))
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    async fn watch(&self, prefix: &str, revision: u64) -> Result<Watch> {
        let create = json!({ "create_request": {
            "key": encode(prefix),
            "range_end": prefix_end(prefix),
            "start_revision": (revision + 1).to_string(),
        }});
        let (member, response) = self.open_stream("watch", "/v3/watch", &create).await?;
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            if let Err(reason) = follow(response, &sender).await {
                log::debug!("coordination store: a watch on {member} ended: {reason}");
            }
        });
        Ok(receiver)
    }

    async fn count(&self, prefix: &str) -> Result<u64> {
        let body = json!({ "key": encode(prefix), "range_end": prefix_end(prefix), "count_only": true });
        let answer = self.call("count", "/v3/kv/range", &body).await?;
        // The gateway writes 64-bit integers as strings, and leaves out zeros.
        Ok(integer(answer.get("count")).max(0) as u64)
    }

    async fn put(&self, key: &str, value: &str, lease: Option<i64>) -> Result<u64> {
        let answer = self.call("write", "/v3/kv/put", &put_request(key, value, lease)).await?;
        Ok(self.wrote(&answer))
    }

    async fn create(&self, key: &str, value: &str, lease: Option<i64>) -> Result<Option<u64>> {
        let success = json!({ "request_put": put_request(key, value, lease) });
        let (succeeded, revision) = self.transaction("create", compare_create(key, 0), success).await?;
        Ok(succeeded.then_some(revision))
    }

    async fn replace(&self, key: &str, value: &str, mod_revision: u64) -> Result<bool> {
        let compare =
            json!({ "target": "MOD", "result": "EQUAL", "key": encode(key), "mod_revision": mod_revision.to_string() });
        let success = json!({ "request_put": put_request(key, value, None) });
        Ok(self.transaction("write", compare, success).await?.0)
    }

    async fn put_guarded(&self, key: &str, value: &str, guard: &Guard) -> Result<bool> {
        let success = json!({ "request_put": put_request(key, value, None) });
        Ok(self.transaction("write", compare_create(&guard.key, guard.create_revision), success).await?.0)
    }

    async fn delete_guarded(&self, guard: &Guard) -> Result<bool> {
        let success = json!({ "request_delete_range": { "key": encode(&guard.key) } });
        Ok(self.transaction("delete", compare_create(&guard.key, guard.create_revision), success).await?.0)
    }

    async fn delete_while(&self, key: &str, guard: &Guard) -> Result<bool> {
        let success = json!({ "request_delete_range": { "key": encode(key) } });
        Ok(self.transaction("delete", compare_create(&guard.key, guard.create_revision), success).await?.0)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let answer = self.call("delete", "/v3/kv/deleterange", &json!({ "key": encode(key) })).await?;
        if integer(answer.get("deleted")) > 0 {
            self.wrote(&answer);
        }
        Ok(())
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        let body = json!({ "key": encode(prefix), "range_end": prefix_end(prefix) });
        let answer = self.call("delete", "/v3/kv/deleterange", &body).await?;
        if integer(answer.get("deleted")) > 0 {
            self.wrote(&answer);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_after_its_last_byte() {
        assert_eq!(BASE64.decode(prefix_end("/jobs/")).unwrap(), b"/jobs0");
        assert_eq!(BASE64.decode(prefix_end("a\u{7f}")).unwrap(), b"a\x80");
    }

    #[test]
    fn gateway_integers_are_read_as_strings_numbers_or_absent() {
        assert_eq!(integer(Some(&json!("42"))), 42);
        assert_eq!(integer(Some(&json!(7))), 7);
        assert_eq!(integer(None), 0);
    }
}
