//! The `csv` and `jsonl` connectors: their capabilities, options (`delimiter`) and construction.

use std::sync::Arc;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::filter::TableFilter;
use sluice_core::spec::{EndpointSpec, JobSpec, NodeKind, SpecError};
use sluice_core::Result;

use super::Format;
use crate::{Connector, SourceSide, TargetSide};

const CAPABILITIES: Capabilities = Capabilities { snapshot_source: true, table_sink: true, ..Capabilities::NONE };

const SOURCE_FIELDS: &[&str] = &["type", "path", "tables", "delimiter"];
const TARGET_FIELDS: &[&str] = &["type", "path", "write_mode", "create_tables", "delimiter"];

pub(crate) const CSV: Connector = file_connector("csv");
pub(crate) const JSONL: Connector = file_connector("jsonl");

/// The two file connectors differ only by name: the format follows from it (`format`).
const fn file_connector(name: &'static str) -> Connector {
    Connector {
        name,
        feature: "file",
        secrets: &[],
        capabilities: CAPABILITIES,
        source: Some(SourceSide { fields: SOURCE_FIELDS, validate, build: build_source }),
        target: Some(TargetSide { fields: TARGET_FIELDS, validate, build: build_target, read_back: None }),
    }
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    match endpoint.options.get("delimiter") {
        Some(node) if delimiter(&node.kind).is_none() => {
            vec![endpoint.error("delimiter", "expected one ASCII character other than a quote or a line break")]
        }
        _ => Vec::new(),
    }
}

fn delimiter(node: &NodeKind) -> Option<u8> {
    match node {
        NodeKind::Scalar { text, .. } if text.len() == 1 && text != "\"" && text != "\n" => Some(text.as_bytes()[0]),
        _ => None,
    }
}

/// The format an endpoint names: CSV with its delimiter, or JSON Lines.
fn format(endpoint: &EndpointSpec) -> Format {
    match endpoint.connector.as_str() {
        "csv" => Format::Csv {
            delimiter: endpoint.options.get("delimiter").and_then(|node| delimiter(&node.kind)).unwrap_or(b','),
        },
        _ => Format::Jsonl,
    }
}

fn build_source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    let endpoint = &job.source;
    Ok(Arc::new(super::FileSource::new(crate::path(endpoint)?, format(endpoint), TableFilter::new(&endpoint.tables))))
}

fn build_target(job: &JobSpec, _fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let endpoint = &job.target;
    Ok(Arc::new(super::FileSink::new(crate::path(endpoint)?, format(endpoint))))
}
