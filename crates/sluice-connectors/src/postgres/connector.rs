//! The `postgres` connector: a source (snapshot, and the change stream of a logical replication
//! slot) and a target; their capabilities, options and construction.

use std::sync::Arc;

use sluice_core::connector::{Fence, Sink, Source};
use sluice_core::filter::TableFilter;
use sluice_core::spec::{EndpointSpec, JobSpec, NodeKind, SpecError};
use sluice_core::{LogMark, Result};

use crate::{Connector, SourceSide, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "postgres",
    feature: "postgres",
    secrets: &[],
    capabilities: crate::SERVER_CAPABILITIES,
    source: Some(SourceSide { fields: SOURCE_FIELDS, validate: validate_source, build: build_source }),
    target: Some(TargetSide { fields: crate::SERVER_TARGET_FIELDS, validate, build, read_back: None }),
};

const SOURCE_FIELDS: &[&str] = &["type", "url", "tables", "slot", "publication", "stop_position"];

/// The source's own options: the replication slot and publication a DBA created, when the job
/// is not to create its own.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceOptions {
    pub slot: Option<String>,
    pub publication: Option<String>,
    /// `stop_position: {lsn: "0/16B3748"}` or `{time: …}`: where the stream ends.
    pub stop_position: Option<LogMark>,
}

impl SourceOptions {
    /// Reads the options of a `postgres` source; every problem, each with its path and line.
    pub fn read(endpoint: &EndpointSpec) -> std::result::Result<SourceOptions, Vec<SpecError>> {
        let mut errors = Vec::new();
        let mut name = |field: &str, rule: fn(&str) -> bool, expected: &str| -> Option<String> {
            let node = endpoint.options.get(field)?;
            match &node.kind {
                NodeKind::Scalar { text, .. } if rule(text) => Some(text.clone()),
                _ => {
                    errors.push(endpoint.error(field, expected));
                    None
                }
            }
        };
        let slot = name(
            "slot",
            |text| {
                !text.is_empty()
                    && text.len() <= 63
                    && text.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_')
            },
            "expected a replication slot name: lower-case letters, digits and _, at most 63 characters",
        );
        let publication = name(
            "publication",
            |text| !text.is_empty() && text.len() <= 63,
            "expected a publication name of at most 63 bytes",
        );
        let stop_position = endpoint.options.get("stop_position").and_then(|node| match stop_lsn(node) {
            Ok(position) => Some(position),
            Err(message) => {
                errors.push(endpoint.error("stop_position", message));
                None
            }
        });
        if errors.is_empty() {
            Ok(SourceOptions { slot, publication, stop_position })
        } else {
            Err(errors)
        }
    }
}

/// `{lsn: "0/16B3748"}` (as `pg_current_wal_lsn()` prints it) or `{time: "2026-12-01T00:00:00Z"}`.
fn stop_lsn(node: &sluice_core::spec::Node) -> std::result::Result<LogMark, String> {
    let expected =
        "expected a mapping {lsn: \"X/Y\"}, a WAL position as pg_current_wal_lsn() prints it, or {time: <RFC 3339 time>}";
    let NodeKind::Mapping(entries) = &node.kind else { return Err(expected.to_owned()) };
    match entries.as_slice() {
        [(key, value)] if key == "lsn" => match &value.kind {
            NodeKind::Scalar { text, .. } if super::source::parse_lsn(text).is_some() => {
                Ok(LogMark::Position(sluice_core::Position(serde_json::json!({ "lsn": text }))))
            }
            _ => Err(expected.to_owned()),
        },
        [(key, value)] if key == "time" => match &value.kind {
            NodeKind::Scalar { text, .. } => {
                sluice_core::clock::parse_rfc3339(text).map(LogMark::Time).ok_or_else(|| {
                    format!("time `{text}` is not an RFC 3339 time with its zone, e.g. 2026-12-01T00:00:00Z")
                })
            }
            _ => Err(expected.to_owned()),
        },
        _ => Err(expected.to_owned()),
    }
}

fn tls_problems(endpoint: &EndpointSpec) -> Vec<SpecError> {
    let Some(url) = &endpoint.url else { return Vec::new() };
    super::TLS_PARAMETERS.problems(url.expose()).into_iter().map(|problem| endpoint.error("url", problem)).collect()
}

fn validate_source(job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    let mut errors = SourceOptions::read(endpoint).err().unwrap_or_default();
    if endpoint.options.contains_key("stop_position") && !job.mode.streams() {
        errors.push(
            endpoint.error("stop_position", "only a job with a change stream (cdc, snapshot+cdc) stops at a position"),
        );
    }
    errors.extend(tls_problems(endpoint));
    errors
}

fn build_source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    let endpoint = &job.source;
    let options = SourceOptions::read(endpoint).map_err(crate::invalid)?;
    Ok(Arc::new(super::PostgresSource::new(
        crate::url(endpoint)?.clone(),
        endpoint.display_url(),
        TableFilter::new(&endpoint.tables),
        job.mode,
        super::Replication::named(&job.name, options.slot, options.publication),
        job.limits.batch_rows,
        options.stop_position,
    )))
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    tls_problems(endpoint)
}

fn build(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let endpoint = &job.target;
    Ok(Arc::new(
        super::PostgresSink::new(
            crate::url(endpoint)?.clone(),
            endpoint.display_url(),
            endpoint.write_mode,
            endpoint.create_tables,
            crate::namespace(endpoint),
        )
        .fenced_if(fence),
    ))
}
