//! NATS JetStream as a stream target.
//!
//! Events are published to the subjects of the template into one stream, each with a
//! `Nats-Msg-Id` that is the same on every replay, so JetStream drops what a crashed run had
//! stored already (within the stream's de-duplication window, `duplicate_window_secs`). Each
//! task's checkpoint is the last message on its own subject of the checkpoint stream (which
//! keeps one message per subject), written only once every event it covers is acknowledged, and
//! with `Nats-Expected-Last-Subject-Sequence`: a second run of the job writing at the same time
//! finds the sequence moved and stops (FENCED).
//!
//! A snapshot batch's messages are visible before its checkpoint: its position and keys are
//! written in the checkpoint message first (`pending`), and a run that finds them there keeps
//! them as held rows (`held`) until an acknowledgement that is not a duplicate shows a key was
//! not among what the broker held (see `events`).
//!
//! Each channel has its own connection, which does not reconnect: a message lost with a broken
//! connection can then never be followed by a later one, so a run that fails resends from its
//! checkpoint in order. (The library's connection task of a broken connection stays asleep
//! until the process ends: a small leak per broken connection, see ARCHITECTURE.md.)

pub(crate) mod connector;
pub mod source;

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_nats::jetstream::{self, message::PublishMessage as Publish, stream};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::change::Position;
use sluice_core::connector::{CheckItem, Checkpoint, Fence, HeldRows};
use sluice_core::secret::redact_url_passwords;
use sluice_core::{Error, ErrorKind, Result, Side};

use crate::events::{check_item, Channel, EventOptions, Message, Transport};
use crate::tls::{TlsParameters, Verification};

pub(crate) const TLS_PARAMETERS: TlsParameters = TlsParameters {
    mode: "tls",
    modes: &["disable", "require", "verify-ca", "verify-full"],
    ca: "tls_ca",
    cert: "tls_cert",
    key: "tls_key",
};

/// Publishes awaiting their acknowledgement at most, per channel.
const IN_FLIGHT: usize = 8192;
/// How long a request to the server (a publish's acknowledgement, stream info) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait before a broken connection is tried again: never, in effect (the client library has
/// no "do not reconnect"; a reconnected connection would send what was queued after a message
/// the broken one lost).
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// A `nats` target's options.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// May hold a password or token: never printed (`redact_url_passwords`).
    pub url: String,
    pub stream: String,
    pub checkpoint_stream: String,
    pub duplicate_window: Duration,
    pub events: EventOptions,
}

/// The prefix of the checkpoint subjects.
const CHECKPOINT_PREFIX: &str = "sluice.checkpoint";

/// A job or task name as one subject token: letters, digits, `-` kept, anything else as `_xx`
/// (hex of its bytes), so two names never share a token.
fn token(name: &str) -> String {
    let mut token = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' {
            token.push(byte as char);
        } else {
            token.push_str(&format!("_{byte:02x}"));
        }
    }
    token
}

/// Whether a NATS subject filter (`*` one token, `>` the rest) takes a subject.
fn covers(filter: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for part in filter.split('.') {
        match (part, subject_tokens.next()) {
            (">", Some(_)) => return true,
            ("*", Some(_)) => {}
            (part, Some(token)) if part == token => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

fn unavailable(doing: &str, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("NATS: {doing}: {error}")).on(Side::Target)
}

pub(crate) fn stream_not_found(error: &jetstream::context::GetStreamError) -> bool {
    matches!(error.kind(), jetstream::context::GetStreamErrorKind::JetStream(inner)
        if inner.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// The URL without its TLS parameters and with any password redacted.
pub(crate) fn shown_url(url: &str) -> String {
    redact_url_passwords(&TLS_PARAMETERS.read(url).rest)
}

/// A new connection for `side`: credentials from the URL, TLS from its scheme or parameters, no
/// reconnection.
pub(crate) async fn connect(address: &str, side: Side) -> Result<jetstream::Context> {
    let found = TLS_PARAMETERS.read(address);
    let mut url = found.rest.clone();
    let connected = Arc::new(AtomicBool::new(false));
    let once = connected.clone();
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(10))
        .request_timeout(Some(REQUEST_TIMEOUT))
        .max_reconnects(Some(1))
        .reconnect_delay_callback(move |_| if once.load(Ordering::Relaxed) { NEVER } else { Duration::ZERO })
        .name("sluice");
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host)) = rest.rsplit_once('@') {
            let decode = |text: &str| crate::tls::percent_decode(text);
            options = match userinfo.split_once(':') {
                Some((user, password)) => options.user_and_password(decode(user), decode(password)),
                None => options.token(decode(userinfo)),
            };
            url = format!("{scheme}://{host}");
        }
    }
    let verification = match found.mode.as_deref() {
        Some("disable") => None,
        Some("require") => Some(Verification::Encrypt),
        Some("verify-ca") => Some(Verification::Chain),
        Some(_) => Some(Verification::Full),
        None if url.starts_with("tls://") || found.ca.is_some() => Some(Verification::Full),
        None => None,
    };
    if let Some(verification) = verification {
        let config = found
            .client(verification)
            .config()
            .map_err(|problem| Error::config(format!("{side}.url: {problem}")).on(side))?;
        options = options.require_tls(true).tls_client_config(config);
        url = url.replacen("nats://", "tls://", 1);
    }
    let client = options.connect(url.as_str()).await.map_err(|error| {
        let text = error.to_string();
        let kind = if text.contains("authorization") || text.contains("Authorization") {
            ErrorKind::Auth
        } else if crate::tls::is_certificate_failure(&text) {
            ErrorKind::Config
        } else {
            ErrorKind::Unavailable
        };
        Error::new(kind, format!("NATS at {}: cannot connect: {text}", shown_url(address))).on(side).hint(format!(
            "check {side}.url (host, port, credentials, tls parameters) and that the server runs with JetStream (-js)"
        ))
    })?;
    connected.store(true, Ordering::Relaxed);
    Ok(jetstream::new(client))
}

/// JetStream as a transport.
pub struct NatsTransport {
    options: NatsOptions,
    /// A cluster task's claim: written into its checkpoint message, refused when the message
    /// holds a newer one.
    fence: Option<Fence>,
}

impl std::fmt::Debug for NatsTransport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("NatsTransport").field("url", &redact_url_passwords(&self.options.url)).finish()
    }
}

impl NatsTransport {
    pub fn new(options: NatsOptions, fence: Option<Fence>) -> NatsTransport {
        NatsTransport { options, fence }
    }

    fn shown_url(&self) -> String {
        shown_url(&self.options.url)
    }

    async fn connect(&self) -> Result<jetstream::Context> {
        connect(&self.options.url, Side::Target).await
    }

    /// The events stream's subjects, or `None` when it does not exist yet.
    async fn stream_subjects(&self, context: &jetstream::Context, name: &str) -> Result<Option<Vec<String>>> {
        match context.get_stream(name).await {
            Ok(mut stream) => {
                let info =
                    stream.info().await.map_err(|error| unavailable(&format!("reading stream {name}"), error))?;
                Ok(Some(info.config.subjects.clone()))
            }
            Err(error) if stream_not_found(&error) => Ok(None),
            Err(error) => Err(unavailable(&format!("reading stream {name}"), error)),
        }
    }

    async fn ensure_checkpoint_stream(&self, context: &jetstream::Context) -> Result<()> {
        let name = &self.options.checkpoint_stream;
        let wanted = format!("{CHECKPOINT_PREFIX}.>");
        match self.stream_subjects(context, name).await? {
            Some(subjects) if subjects.iter().any(|subject| covers(subject, &format!("{CHECKPOINT_PREFIX}.a.b"))) => {
                Ok(())
            }
            Some(subjects) => Err(Error::config(format!(
                "NATS stream {name} (target.checkpoint_stream) takes {subjects:?}, not the checkpoint subjects {wanted}"
            ))
            .on(Side::Target)
            .hint("name a stream of its own in target.checkpoint_stream; sluice creates it")),
            None => {
                let config = stream::Config {
                    name: name.clone(),
                    subjects: vec![wanted],
                    max_messages_per_subject: 1,
                    storage: stream::StorageType::File,
                    ..Default::default()
                };
                context.create_stream(config).await.map_err(|error| {
                    Error::new(ErrorKind::Config, format!("NATS: cannot create the checkpoint stream {name}: {error}"))
                        .on(Side::Target)
                        .hint("the account needs JetStream and the right to create streams; or create it with subjects sluice.checkpoint.> and max_msgs_per_subject 1")
                })?;
                log::info!("created NATS stream {name} for the checkpoints");
                Ok(())
            }
        }
    }
}

#[async_trait]
impl Transport for NatsTransport {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let context = self.connect().await?;
        let mut items = vec![check_item("target NATS", true, format!("connected to {}", self.shown_url()))];
        for name in [&self.options.stream, &self.options.checkpoint_stream] {
            let detail = match self.stream_subjects(&context, name).await? {
                Some(subjects) => format!("stream {name} exists, subjects {subjects:?}"),
                None => format!("stream {name} does not exist; the first run creates it"),
            };
            items.push(check_item(&format!("target stream {name}"), true, detail));
        }
        Ok(items)
    }

    fn refuse_destination(&self, destination: &str) -> Option<String> {
        let bad = destination
            .split('.')
            .any(|token| token.is_empty() || token == "*" || token == ">" || token.chars().any(char::is_whitespace));
        if bad {
            Some("a NATS subject is dot-separated tokens, none empty, holding no whitespace, `*` or `>`".into())
        } else if covers(&format!("{CHECKPOINT_PREFIX}.>"), destination) {
            Some(format!("subjects under {CHECKPOINT_PREFIX} hold checkpoints"))
        } else {
            None
        }
    }

    async fn prepare(&self, destinations: &[String]) -> Result<()> {
        let context = self.connect().await?;
        self.ensure_checkpoint_stream(&context).await?;
        let name = &self.options.stream;
        match self.stream_subjects(&context, name).await? {
            Some(subjects) => {
                let uncovered: Vec<&String> = destinations
                    .iter()
                    .filter(|destination| !subjects.iter().any(|subject| covers(subject, destination)))
                    .collect();
                if !uncovered.is_empty() {
                    let uncovered: Vec<&str> = uncovered.iter().map(|subject| subject.as_str()).collect();
                    return Err(Error::config(format!(
                        "NATS stream {name} takes subjects {subjects:?}, not {}",
                        uncovered.join(", ")
                    ))
                    .on(Side::Target)
                    .hint(format!(
                        "add {} to the stream's subjects (nats stream edit {name}), or change target.subject",
                        self.options.events.template.with_wildcards("*")
                    )));
                }
                Ok(())
            }
            None => {
                let config = stream::Config {
                    name: name.clone(),
                    subjects: vec![self.options.events.template.with_wildcards("*")],
                    duplicate_window: self.options.duplicate_window,
                    storage: stream::StorageType::File,
                    ..Default::default()
                };
                context.create_stream(config).await.map_err(|error| {
                    Error::new(ErrorKind::Config, format!("NATS: cannot create stream {name}: {error}"))
                        .on(Side::Target)
                        .hint("the account needs JetStream and the right to create streams, and no other stream may take the same subjects")
                })?;
                log::info!("created NATS stream {name}");
                Ok(())
            }
        }
    }

    async fn open(&self, job: &str, task: &str) -> Result<Box<dyn Channel>> {
        let context = self.connect().await?;
        Ok(Box::new(NatsChannel {
            context,
            checkpoint_stream: self.options.checkpoint_stream.clone(),
            checkpoint_subject: format!("{CHECKPOINT_PREFIX}.{}.{}", token(job), token(task)),
            checkpoint_sequence: 0,
            committed: None,
            held: Vec::new(),
            held_keys: HashSet::new(),
            in_flight: VecDeque::new(),
            job: job.to_owned(),
            fence: self.fence.clone(),
        }))
    }

    async fn forget(&self, job: &str, tasks: &[String]) -> Result<()> {
        let context = self.connect().await?;
        let name = &self.options.checkpoint_stream;
        let stream = match context.get_stream(name).await {
            Ok(stream) => stream,
            Err(error) if stream_not_found(&error) => return Ok(()),
            Err(error) => return Err(unavailable(&format!("reading stream {name}"), error)),
        };
        for task in tasks {
            let subject = format!("{CHECKPOINT_PREFIX}.{}.{}", token(job), token(task));
            stream
                .purge()
                .filter(subject.as_str())
                .await
                .map_err(|error| unavailable(&format!("forgetting the checkpoint of task {task}"), error))?;
        }
        Ok(())
    }

    async fn held(&self, job: &str, tasks: &[String]) -> Result<Vec<HeldRows>> {
        let context = self.connect().await?;
        let name = &self.options.checkpoint_stream;
        let stream = match context.get_stream(name).await {
            Ok(stream) => stream,
            Err(error) if stream_not_found(&error) => return Ok(Vec::new()),
            Err(error) => return Err(unavailable(&format!("reading stream {name}"), error)),
        };
        let mut found = Vec::new();
        for task in tasks {
            let subject = format!("{CHECKPOINT_PREFIX}.{}.{}", token(job), token(task));
            let Some((_, message)) = read_checkpoint(&stream, &subject).await? else { continue };
            found.extend(message.held.into_iter().chain(message.pending).map(|read| HeldRows {
                task: task.clone(),
                position: read.position,
                keys: read.keys,
            }));
        }
        Ok(found)
    }

    fn describe(&self, destination: &str) -> String {
        format!("subject {destination} of NATS stream {}", self.options.stream)
    }
}

/// One task's publishes and checkpoint.
struct NatsChannel {
    context: jetstream::Context,
    checkpoint_stream: String,
    checkpoint_subject: String,
    /// The stream sequence of the task's checkpoint message (0: none), which the next checkpoint
    /// must find still last on its subject.
    checkpoint_sequence: u64,
    /// The checkpoint last read or written, which an intent (`Channel::intend`) keeps.
    committed: Option<Checkpoint>,
    /// Rows the broker may hold as an interrupted run's read left them, less the keys since
    /// acknowledged as new.
    held: Vec<HeldRead>,
    /// Every key of `held`, so an acknowledgement finds at once whether its key is one.
    held_keys: HashSet<String>,
    /// Publishes awaiting their acknowledgement, with the key identity of a snapshot row.
    in_flight: VecDeque<(jetstream::context::PublishAckFuture, Option<String>)>,
    job: String,
    fence: Option<Fence>,
}

/// The checkpoint message of a task: its checkpoint, if it committed one, the epoch of the
/// cluster claim that wrote it, if a cluster task did, the rows the broker may hold from
/// interrupted reads, and the batch being sent, if any.
#[derive(Debug, Default, Serialize, Deserialize)]
struct CheckpointMessage {
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    checkpoint: Option<Checkpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    held: Vec<HeldRead>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending: Option<HeldRead>,
}

/// Snapshot rows sent by a read: the split's position after their batch, and their keys
/// (`change::key_identity`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct HeldRead {
    position: Position,
    keys: Vec<String>,
}

/// The last checkpoint message on `subject` with its stream sequence, `None` when there is none.
async fn read_checkpoint(stream: &stream::Stream, subject: &str) -> Result<Option<(u64, CheckpointMessage)>> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => {
            let found = serde_json::from_slice(&message.payload).map_err(|error| {
                Error::new(
                    ErrorKind::State,
                    format!("the checkpoint on NATS subject {subject} is not one sluice wrote: {error}"),
                )
                .on(Side::Target)
                .hint("purge that subject of the checkpoint stream to start the task over")
            })?;
            Ok(Some((message.sequence, found)))
        }
        Err(error) if error.kind() == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound => {
            Ok(None)
        }
        Err(error) => Err(unavailable(&format!("reading the checkpoint on {subject}"), error)),
    }
}

impl NatsChannel {
    /// Writes `message` as the task's checkpoint, if its subject still ends with the one this
    /// channel read or wrote last; FENCED otherwise (another run or a newer claim wrote since).
    async fn write_checkpoint(&mut self, message: &CheckpointMessage) -> Result<()> {
        let payload = serde_json::to_vec(message).expect("checkpoints serialize");
        let largest = self.context.client().server_info().max_payload;
        if largest > 0 && payload.len() > largest {
            let keys: usize = message.held.iter().chain(&message.pending).map(|read| read.keys.len()).sum();
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "the checkpoint on NATS subject {} takes {} bytes with the keys of {keys} snapshot rows it keeps, more than the server takes in one message (max_payload {largest})",
                    self.checkpoint_subject,
                    payload.len()
                ),
            )
            .on(Side::Target)
            .hint("lower limits.batch_rows (each snapshot batch's keys are written with the checkpoint before its events), or raise the server's max_payload"));
        }
        let publish = Publish::build().payload(payload.into()).expected_last_subject_sequence(self.checkpoint_sequence);
        let sent = self
            .context
            .send_publish(self.checkpoint_subject.clone(), publish)
            .await
            .map_err(|error| unavailable("writing the checkpoint", error))?;
        match sent.await {
            Ok(ack) => {
                self.checkpoint_sequence = ack.sequence;
                Ok(())
            }
            Err(error) if error.kind() == jetstream::context::PublishErrorKind::WrongLastSequence => Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "FENCED: the checkpoint on NATS subject {} moved under this run: another run of the job, or a newer owner of its cluster task, writes to the same stream; nothing more is written by this one",
                    self.checkpoint_subject
                ),
            )
            .on(Side::Target)
            .hint("run a job in one place at a time; its events so far are in the stream")),
            Err(error) => Err(unavailable("writing the checkpoint", error)),
        }
    }

    /// A cluster task claims its checkpoint subject before it sends anything: a message written
    /// by a newer claim refuses this one (FENCED); otherwise the found checkpoint is written again
    /// with this claim's epoch, so an older owner that wakes can commit nothing more (its
    /// checkpoint no longer ends the subject) and cannot start again either. Standalone: as found.
    async fn claim(&mut self, found: CheckpointMessage) -> Result<Option<Checkpoint>> {
        let Some(fence) = self.fence.clone() else { return Ok(found.checkpoint) };
        if let Some(held) = found.epoch.filter(|held| *held > fence.epoch) {
            return Err(fence.moved(&self.job, held));
        }
        if found.epoch != Some(fence.epoch) {
            let claim = self.message(found.checkpoint.clone(), None);
            self.write_checkpoint(&claim).await?;
        }
        Ok(found.checkpoint)
    }

    /// The checkpoint message of this channel's state with `checkpoint` and `pending`.
    fn message(&self, checkpoint: Option<Checkpoint>, pending: Option<HeldRead>) -> CheckpointMessage {
        CheckpointMessage {
            checkpoint,
            epoch: self.fence.as_ref().map(|fence| fence.epoch),
            held: self.held.clone(),
            pending,
        }
    }

    async fn settle_one(&mut self) -> Result<()> {
        let Some((ack, identity)) = self.in_flight.pop_front() else { return Ok(()) };
        let ack = ack.await.map_err(|error| unavailable("a publish was not acknowledged", error))?;
        if let Some(identity) = identity.filter(|identity| !ack.duplicate && self.held_keys.remove(identity)) {
            // A key the broker did not have: whatever an interrupted read sent of it never
            // arrived, and this read's row is the one it holds.
            for read in &mut self.held {
                read.keys.retain(|key| *key != identity);
            }
            self.held.retain(|read| !read.keys.is_empty());
        }
        Ok(())
    }
}

#[async_trait]
impl Channel for NatsChannel {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.in_flight.clear();
        let stream = self
            .context
            .get_stream(&self.checkpoint_stream)
            .await
            .map_err(|error| unavailable(&format!("reading stream {}", self.checkpoint_stream), error))?;
        let (sequence, mut found) = read_checkpoint(&stream, &self.checkpoint_subject).await?.unwrap_or_default();
        self.checkpoint_sequence = sequence;
        // A batch written ahead and never committed: the broker may hold any of its rows.
        self.held = std::mem::take(&mut found.held);
        self.held.extend(found.pending.take());
        self.held_keys = self.held.iter().flat_map(|read| read.keys.iter().cloned()).collect();
        self.committed = found.checkpoint.clone();
        self.claim(found).await
    }

    fn writes_ahead(&self) -> bool {
        true
    }

    async fn intend(&mut self, position: &Position, messages: &[Message]) -> Result<()> {
        let keys = messages.iter().filter_map(|message| message.identity.clone()).collect();
        let pending = HeldRead { position: position.clone(), keys };
        let message = self.message(self.committed.clone(), Some(pending));
        self.write_checkpoint(&message).await
    }

    async fn send(&mut self, messages: Vec<Message>) -> Result<()> {
        for message in messages {
            while self.in_flight.len() >= IN_FLIGHT {
                self.settle_one().await?;
            }
            let publish = Publish::build()
                .payload(message.payload.into())
                .message_id(message.id)
                .header("Sluice-Key", message.key.as_str());
            let ack = self
                .context
                .send_publish(message.destination, publish)
                .await
                .map_err(|error| unavailable("publishing", error))?;
            self.in_flight.push_back((ack, message.identity));
            sluice_core::failpoint::hit("events.published");
        }
        Ok(())
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.settle_one().await?;
        }
        sluice_core::failpoint::hit("events.acknowledged");
        let message = self.message(Some(checkpoint.clone()), None);
        self.write_checkpoint(&message).await?;
        self.committed = Some(checkpoint.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_filters_match_as_nats_does() {
        assert!(covers("*.*", "shop.items"));
        assert!(!covers("*.*", "shop.items.x"));
        assert!(covers("cdc.>", "cdc.shop.items"));
        assert!(!covers("cdc.>", "cdc"));
        assert!(covers("shop.items", "shop.items"));
        assert!(!covers("shop.orders", "shop.items"));
    }

    #[test]
    fn names_become_distinct_tokens() {
        assert_eq!(token("orders-1"), "orders-1");
        assert_eq!(token("items#0"), "items_230");
        assert_ne!(token("a.b"), token("a_2eb"));
    }
}
