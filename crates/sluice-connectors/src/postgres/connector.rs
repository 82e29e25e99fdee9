//! The `postgres` connector: a target (a source is still to come); its capabilities, options
//! and construction.

use std::sync::Arc;

use sluice_core::connector::{Fence, Sink};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::Result;

use crate::{Connector, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "postgres",
    feature: "postgres",
    capabilities: crate::SERVER_TARGET_CAPABILITIES,
    source: None,
    target: Some(TargetSide { fields: crate::SERVER_TARGET_FIELDS, validate, build }),
};

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    let Some(url) = &endpoint.url else { return Vec::new() };
    super::TLS_PARAMETERS.problems(url.expose()).into_iter().map(|problem| endpoint.error("url", problem)).collect()
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
