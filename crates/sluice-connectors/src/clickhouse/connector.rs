//! The `clickhouse` connector: ClickHouse as a target, its options and construction.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::{Result, TableSchema};

use super::read_back::ClickHouseTable;
use super::{ClickHouseOptions, ClickHouseSink};
use crate::{Connector, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "clickhouse",
    feature: "clickhouse",
    secrets: &[],
    capabilities: Capabilities {
        table_sink: true,
        // Groups folded per key, each key's last row written with the group's version.
        change_sink: true,
        // Commits check the task's claim in `sluice.claims`; rows written again are idempotent.
        fencing: true,
        ..Capabilities::NONE
    },
    source: None,
    target: Some(TargetSide { fields: FIELDS, validate, build, read_back: Some(read_back) }),
};

const FIELDS: &[&str] = &["type", "url", "create_tables", "namespace", "commit_interval_secs", "commit_rows"];

const DEFAULT_COMMIT_INTERVAL_SECS: u64 = 1;
const DEFAULT_COMMIT_ROWS: u64 = 100_000;

pub(super) fn options(endpoint: &EndpointSpec) -> std::result::Result<ClickHouseOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let interval = crate::whole_number(endpoint, "commit_interval_secs", DEFAULT_COMMIT_INTERVAL_SECS, 1)
        .map_err(|error| errors.push(error))
        .unwrap_or(0);
    let rows = crate::whole_number(endpoint, "commit_rows", DEFAULT_COMMIT_ROWS, 1)
        .map_err(|error| errors.push(error))
        .unwrap_or(0);
    if let Some(url) = &endpoint.url {
        let url = url.expose();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            errors.push(endpoint.error(
                "url",
                "expected the server's HTTP interface: http://user:password@host:8123 or https://…:8443?ca=ca.pem",
            ));
        }
        for problem in super::server::TLS_PARAMETERS.problems(url) {
            errors.push(endpoint.error("url", problem));
        }
    }
    let Some(url) = endpoint.url.clone() else {
        // The registry reports the missing URL.
        return Err(errors);
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(ClickHouseOptions {
        url,
        shown: endpoint.display_url(),
        create_tables: endpoint.create_tables,
        namespace: crate::namespace(endpoint),
        commit_interval: Duration::from_secs(interval),
        commit_rows: rows,
    })
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

/// A table of the target read back for verification: its live rows.
fn read_back(job: &JobSpec, table: &Arc<TableSchema>) -> Result<Arc<dyn Source>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    Ok(Arc::new(ClickHouseTable::new(&options, table)?))
}

fn build(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    Ok(Arc::new(ClickHouseSink::new(options, fence)?))
}
