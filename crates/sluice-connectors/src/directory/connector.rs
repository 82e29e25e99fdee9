//! The `directory` connector: a watched directory of CSV or JSON Lines files, as a change source.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::connector::{Capabilities, Source};
use sluice_core::filter::TableFilter;
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::{Result, TableName};

use super::{DirectoryOptions, DirectorySource, Ready};
use crate::events::{count_option, names_option, text_option};
use crate::file::Format;
use crate::{Connector, SourceSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "directory",
    feature: "file",
    secrets: &[],
    capabilities: Capabilities { change_source: true, ..Capabilities::NONE },
    source: Some(SourceSide {
        fields: &["type", "path", "tables", "format", "delimiter", "table", "ready", "poll_ms", "key"],
        validate,
        build,
    }),
    target: None,
};

fn options(endpoint: &EndpointSpec) -> std::result::Result<DirectoryOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let format = match text_option(endpoint, "format").as_deref() {
        None | Some("jsonl") => Some(Format::Jsonl),
        Some("csv") => match text_option(endpoint, "delimiter") {
            None => Some(Format::Csv { delimiter: b',' }),
            Some(text) if text.len() == 1 && text != "\"" && text != "\n" => {
                Some(Format::Csv { delimiter: text.as_bytes()[0] })
            }
            Some(_) => {
                errors.push(
                    endpoint.error("delimiter", "expected one ASCII character other than a quote or a line break"),
                );
                None
            }
        },
        Some(other) => {
            errors.push(endpoint.error("format", format!("unknown format `{other}`; expected jsonl or csv")));
            None
        }
    };
    let ready = match text_option(endpoint, "ready").as_deref() {
        None | Some("rename") => Some(Ready::Rename),
        Some("marker") => Some(Ready::Marker),
        Some(other) => {
            errors.push(endpoint.error(
                "ready",
                format!("unknown `{other}`; expected rename (a file counts once it has the format's extension) or marker (once <file>.done exists)"),
            ));
            None
        }
    };
    let poll = count_option(endpoint, "poll_ms", 500).map_err(|error| errors.push(error)).ok();
    let key = names_option(endpoint, "key").map_err(|error| errors.push(error)).unwrap_or_default();
    match (endpoint.path.as_ref(), format, ready, poll) {
        (Some(path), Some(format), Some(ready), Some(poll)) if errors.is_empty() => Ok(DirectoryOptions {
            path: path.into(),
            format,
            table: text_option(endpoint, "table").map(|name| TableName::parse(&name)),
            ready,
            poll: Duration::from_millis(poll),
            key,
            filter: TableFilter::new(&endpoint.tables),
        }),
        _ => Err(errors),
    }
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec) -> Result<Arc<dyn Source>> {
    Ok(Arc::new(DirectorySource::new(options(&job.source).map_err(crate::invalid)?)))
}
