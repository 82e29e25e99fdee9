//! The `nats` connector (NATS JetStream as a target, and its streams of change events as a
//! source): its capabilities, options and construction.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::Result;

use super::source::{NatsSource, NatsSourceOptions};
use super::{NatsOptions, NatsTransport, TLS_PARAMETERS};
use crate::events::source::SourceOptions;
use crate::events::{count_option, text_option, EventOptions, EventSink};
use crate::{Connector, SourceSide, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "nats",
    feature: "nats",
    secrets: &[],
    capabilities: Capabilities {
        // Streams of change events, read back (`source.rs`).
        change_source: true,
        table_sink: true,
        event_sink: true,
        // A cluster task claims its checkpoint subject with its epoch; a checkpoint commit
        // refuses a writer whose claim is no longer the last (`mod.rs`, `NatsChannel::claim`).
        fencing: true,
        ..Capabilities::NONE
    },
    source: Some(SourceSide { fields: SOURCE_FIELDS, validate: validate_source, build: build_source }),
    target: Some(TargetSide { fields: FIELDS, validate, build, read_back: None }),
};

const SOURCE_FIELDS: &[&str] = &["type", "url", "stream", "subject", "format", "tables", "start_position"];

const FIELDS: &[&str] = &[
    "type",
    "url",
    "stream",
    "subject",
    "format",
    "checkpoint_stream",
    "duplicate_window_secs",
    "max_transaction_events",
];

/// The stream that keeps the checkpoints when `checkpoint_stream` is not given.
const DEFAULT_CHECKPOINT_STREAM: &str = "SLUICE_CHECKPOINTS";
/// JetStream's own default de-duplication window.
const DEFAULT_DUPLICATE_WINDOW_SECS: u64 = 120;

/// A stream name as JetStream takes it: no whitespace, `.`, `*`, `>`, path separators.
fn stream_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("is empty".into());
    }
    let bad: Vec<char> =
        name.chars().filter(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\')).collect();
    (!bad.is_empty()).then(|| format!("`{name}` holds {bad:?}; a JetStream stream name cannot"))
}

/// `url` and `stream`, both sides' (the events' stream, which a source reads).
fn url_and_stream(endpoint: &EndpointSpec, errors: &mut Vec<SpecError>) -> (Option<String>, Option<String>) {
    let url = endpoint.url.as_ref().map(|url| url.expose().to_owned());
    if let Some(url) = &url {
        if !["nats://", "tls://"].iter().any(|scheme| url.starts_with(scheme)) {
            errors.push(endpoint.error(
                "url",
                "expected nats://host:port or tls://host:port (user:password@ or token@ before the host)",
            ));
        }
        for problem in TLS_PARAMETERS.problems(url) {
            errors.push(endpoint.error("url", problem));
        }
    }
    let stream = text_option(endpoint, "stream");
    match &stream {
        None => errors
            .push(endpoint.error("stream", "missing required field `stream` (the JetStream stream of the events)")),
        Some(name) => {
            if let Some(problem) = stream_name_problem(name) {
                errors.push(endpoint.error("stream", problem));
            }
        }
    }
    (url, stream)
}

fn options(endpoint: &EndpointSpec) -> std::result::Result<NatsOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let events = EventOptions::of(endpoint, Some("subject"), "{db}.{table}").map_err(|found| errors.extend(found)).ok();
    let (url, stream) = url_and_stream(endpoint, &mut errors);
    let checkpoint_stream =
        text_option(endpoint, "checkpoint_stream").unwrap_or_else(|| DEFAULT_CHECKPOINT_STREAM.into());
    if let Some(problem) = stream_name_problem(&checkpoint_stream) {
        errors.push(endpoint.error("checkpoint_stream", problem));
    }
    if stream.as_deref() == Some(checkpoint_stream.as_str()) {
        errors.push(endpoint.error(
            "checkpoint_stream",
            "is the events' stream; checkpoints need a stream of their own (it keeps one message per subject)",
        ));
    }
    let window = count_option(endpoint, "duplicate_window_secs", DEFAULT_DUPLICATE_WINDOW_SECS)
        .map_err(|error| errors.push(error))
        .ok();
    match (url, stream, events, window) {
        (Some(url), Some(stream), Some(events), Some(window)) if errors.is_empty() => {
            Ok(NatsOptions { url, stream, checkpoint_stream, duplicate_window: Duration::from_secs(window), events })
        }
        _ => Err(errors),
    }
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    let events = options.events.clone();
    Ok(Arc::new(EventSink::new(events, &job.source.connector, Arc::new(NatsTransport::new(options, fence)))))
}

fn source_options(endpoint: &EndpointSpec) -> std::result::Result<NatsSourceOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let events = SourceOptions::of(endpoint, "subject", |_| None).map_err(|found| errors.extend(found)).ok();
    let (url, stream) = url_and_stream(endpoint, &mut errors);
    match (url, stream, events) {
        (Some(url), Some(stream), Some(events)) if errors.is_empty() => Ok(NatsSourceOptions { url, stream, events }),
        _ => Err(errors),
    }
}

fn validate_source(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    source_options(endpoint).err().unwrap_or_default()
}

fn build_source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    let options = source_options(&job.source).map_err(crate::invalid)?;
    Ok(Arc::new(NatsSource::new(options)))
}
