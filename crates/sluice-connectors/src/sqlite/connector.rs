//! The `sqlite` connector: its capabilities, options and construction.

use std::sync::Arc;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::filter::TableFilter;
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::Result;

use crate::{Connector, SourceSide, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "sqlite",
    feature: "sqlite",
    secrets: &[],
    capabilities: Capabilities {
        snapshot_source: true,
        cursor_source: true,
        table_sink: true,
        upsert: true,
        transactions: true,
        ..Capabilities::NONE
    },
    source: Some(SourceSide { fields: &["type", "path", "tables"], validate: no_options, build: build_source }),
    target: Some(TargetSide {
        fields: &["type", "path", "write_mode", "create_tables"],
        validate: no_options,
        build: build_target,
        read_back: None,
    }),
};

fn no_options(_job: &JobSpec, _endpoint: &EndpointSpec) -> Vec<SpecError> {
    Vec::new()
}

fn build_source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    Ok(Arc::new(super::SqliteSource::new(crate::path(&job.source)?, TableFilter::new(&job.source.tables))))
}

fn build_target(job: &JobSpec, _fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let endpoint = &job.target;
    Ok(Arc::new(super::SqliteSink::new(crate::path(endpoint)?, endpoint.write_mode, endpoint.create_tables)))
}
