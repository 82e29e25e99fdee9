//! The `mysql` connector (MySQL and MariaDB): what it can do, its typed options on each side,
//! how they are checked (every problem with its field path and line) and how it is built.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::connector::{Fence, Sink, Source};
use sluice_core::filter::TableFilter;
use sluice_core::spec::{EndpointSpec, JobSpec, Mode, Node, NodeKind, SpecError};
use sluice_core::{LogMark, Position, Result};

use crate::{Connector, SourceSide, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "mysql",
    feature: "mysql",
    secrets: &[],
    capabilities: crate::SERVER_CAPABILITIES,
    source: Some(SourceSide { fields: SOURCE_FIELDS, validate: validate_source, build: build_source }),
    target: Some(TargetSide {
        fields: crate::SERVER_TARGET_FIELDS,
        validate: validate_target,
        build: build_target,
        read_back: None,
    }),
};

const SOURCE_FIELDS: &[&str] =
    &["type", "url", "tables", "start_position", "stop_position", "server_id", "read_timeout_secs"];

/// How long a snapshot read waits for the source's next bytes by default: far longer than a
/// primary-key range read is ever silent, far shorter than forever.
const READ_TIMEOUT_SECS: u64 = 120;

/// The source's own options.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceOptions {
    /// `start_position: {file: mysql-bin.000003, position: 4}` or `{time: …}`: where a `cdc`
    /// job starts.
    pub start_position: Option<LogMark>,
    /// `stop_position: {file: …, position: …}` or `{time: …}`: where its stream ends.
    pub stop_position: Option<LogMark>,
    /// `server_id`: the replica id of the binlog reader (default: derived from the job name).
    pub server_id: Option<u32>,
    /// `read_timeout_secs`: a snapshot read silent this long is given up and retried.
    pub read_timeout: Duration,
}

impl SourceOptions {
    /// Reads the options of a `mysql` source; every problem, each with its path and line.
    pub fn read(endpoint: &EndpointSpec) -> std::result::Result<SourceOptions, Vec<SpecError>> {
        let mut errors = Vec::new();
        let mut position_option = |field: &str| match endpoint.options.get(field).map(log_position) {
            Some(Err(message)) => {
                errors.push(endpoint.error(field, message));
                None
            }
            Some(Ok(position)) => Some(position),
            None => None,
        };
        let start_position = position_option("start_position");
        let stop_position = position_option("stop_position");
        let server_id = endpoint.options.get("server_id").and_then(|node| {
            let id = scalar(node).and_then(|text| text.parse::<u32>().ok()).filter(|id| *id > 0);
            if id.is_none() {
                errors.push(endpoint.error(
                    "server_id",
                    "expected a replica server id from 1 to 4294967295, unique among the source's replicas",
                ));
            }
            id
        });
        let read_timeout = match endpoint.options.get("read_timeout_secs") {
            None => Some(READ_TIMEOUT_SECS),
            Some(node) => {
                let secs =
                    scalar(node).and_then(|text| text.parse::<u64>().ok()).filter(|secs| (1..=86_400).contains(secs));
                if secs.is_none() {
                    errors.push(
                        endpoint.error("read_timeout_secs", "expected a whole number of seconds from 1 to 86400"),
                    );
                }
                secs
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(SourceOptions {
            start_position,
            stop_position,
            server_id,
            read_timeout: Duration::from_secs(read_timeout.unwrap_or(READ_TIMEOUT_SECS)),
        })
    }
}

fn scalar(node: &Node) -> Option<&str> {
    match &node.kind {
        NodeKind::Scalar { text, .. } => Some(text),
        _ => None,
    }
}

/// `{file: mysql-bin.000003, position: 4}` or `{time: "2026-12-01T00:00:00Z"}` (a
/// `start_position` or `stop_position`).
fn log_position(node: &Node) -> std::result::Result<LogMark, String> {
    let expected = "expected a mapping {file: <binlog file>, position: <offset>} or {time: <RFC 3339 time>}";
    let NodeKind::Mapping(entries) = &node.kind else { return Err(expected.to_owned()) };
    let mut file = None;
    let mut offset = None;
    let mut time = None;
    for (key, value) in entries {
        let Some(text) = scalar(value) else { return Err(expected.to_owned()) };
        match key.as_str() {
            "file" => file = Some(text.to_owned()),
            "position" => {
                offset = Some(text.parse::<u64>().map_err(|_| format!("position `{text}` is not an offset"))?)
            }
            "gtid" => {}
            "time" => {
                time = Some(sluice_core::clock::parse_rfc3339(text).ok_or_else(|| {
                    format!("time `{text}` is not an RFC 3339 time with its zone, e.g. 2026-12-01T00:00:00Z")
                })?)
            }
            other => return Err(format!("unknown field `{other}`; {expected}")),
        }
    }
    match (file, offset, time) {
        (Some(file), Some(offset), None) => {
            Ok(LogMark::Position(Position(serde_json::json!({"file": file, "position": offset, "gtid": ""}))))
        }
        (None, None, Some(time)) => Ok(LogMark::Time(time)),
        (None, None, None) | (Some(_), None, None) | (None, Some(_), None) => Err(expected.to_owned()),
        _ => Err(format!("give a file and position, or a time, not both; {expected}")),
    }
}

fn tls_problems(endpoint: &EndpointSpec) -> Vec<SpecError> {
    let Some(url) = &endpoint.url else { return Vec::new() };
    super::TLS_PARAMETERS.problems(url.expose()).into_iter().map(|problem| endpoint.error("url", problem)).collect()
}

fn validate_source(job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    let mut errors = SourceOptions::read(endpoint).err().unwrap_or_default();
    if endpoint.options.contains_key("start_position")
        && job.mode != Mode::Cdc
        && errors.iter().all(|error| !error.path.ends_with("start_position"))
    {
        errors.push(endpoint.error(
            "start_position",
            "only a cdc job starts from a given position; snapshot+cdc starts where its snapshot was taken",
        ));
    }
    if endpoint.options.contains_key("stop_position") && !matches!(job.mode, Mode::Cdc | Mode::SnapshotAndCdc) {
        errors.push(
            endpoint.error("stop_position", "only a job with a change stream (cdc, snapshot+cdc) stops at a position"),
        );
    }
    errors.extend(tls_problems(endpoint));
    errors
}

fn validate_target(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    tls_problems(endpoint)
}

fn build_source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    let endpoint = &job.source;
    let options = SourceOptions::read(endpoint).map_err(crate::invalid)?;
    Ok(Arc::new(super::MysqlSource::new(
        crate::url(endpoint)?,
        endpoint.display_url(),
        TableFilter::new(&endpoint.tables),
        job.mode,
        job.parallelism,
        super::StreamOptions {
            start_position: options.start_position,
            stop_position: options.stop_position,
            server_id: options.server_id.unwrap_or_else(|| super::default_server_id(&job.name)),
            batch_rows: job.limits.batch_rows,
            two_way: job.two_way,
        },
        options.read_timeout,
    )?))
}

fn build_target(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let endpoint = &job.target;
    Ok(Arc::new(
        super::MysqlSink::new(
            crate::url(endpoint)?,
            endpoint.display_url(),
            endpoint.write_mode,
            endpoint.create_tables,
            crate::namespace(endpoint),
            // The copy's tasks and the stream's lanes (a backfill copies while the stream runs).
            job.parallelism + job.apply_parallelism.unwrap_or(1),
        )?
        .fenced_if(fence),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_position_is_a_file_and_an_offset_or_a_time() {
        let node = |text: &str| sluice_core::spec::parse_yaml(text).unwrap();
        let position = log_position(&node("{file: mysql-bin.000003, position: 4}")).unwrap();
        let expected = serde_json::json!({"file": "mysql-bin.000003", "position": 4, "gtid": ""});
        assert_eq!(position, LogMark::Position(Position(expected)));
        let time = log_position(&node("{time: \"2026-12-01T00:00:00Z\"}")).unwrap();
        assert_eq!(time, LogMark::Time(1_796_083_200));
        let zoneless = log_position(&node("{time: \"2026-12-01 00:00:00\"}")).unwrap_err();
        assert!(zoneless.contains("not an RFC 3339 time with its zone"), "{zoneless}");
        let both = log_position(&node("{file: mysql-bin.000003, position: 4, time: \"2026-12-01T00:00:00Z\"}"));
        assert!(both.unwrap_err().contains("not both"));
        assert!(log_position(&node("{file: mysql-bin.000003}")).unwrap_err().contains("expected a mapping"));
    }
}
