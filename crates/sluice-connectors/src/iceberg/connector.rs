//! The `iceberg` connector: Apache Iceberg tables as a target, its options and construction.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, NodeKind, SpecError};
use sluice_core::{Result, TableSchema};

use super::catalog::SqlCatalog;
use super::{IcebergOptions, IcebergSink};
use crate::lake::PartitionBy;
use crate::{Connector, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "iceberg",
    feature: "iceberg",
    secrets: &[],
    capabilities: Capabilities {
        table_sink: true,
        // Groups folded per key, merged into the files that hold the keys.
        change_sink: true,
        // Every catalog commit checks the job's fence in the same SQL transaction.
        fencing: true,
        transactions: true,
        ..Capabilities::NONE
    },
    source: None,
    target: Some(TargetSide { fields: FIELDS, validate, build, read_back: Some(read_back) }),
};

const FIELDS: &[&str] = &[
    "type",
    "catalog",
    "warehouse",
    "namespace",
    "create_tables",
    "partition_by",
    "commit_interval_secs",
    "commit_rows",
    "target_file_mb",
];

const DEFAULT_COMMIT_INTERVAL_SECS: u64 = 5;
const DEFAULT_COMMIT_ROWS: u64 = 200_000;
const DEFAULT_TARGET_FILE_MB: u64 = 64;

/// A text field of a mapping, if it has one.
fn text<'a>(entries: &'a [(String, sluice_core::spec::Node)], field: &str) -> Option<&'a str> {
    entries.iter().find(|(key, _)| key == field).and_then(|(_, node)| match &node.kind {
        NodeKind::Scalar { text, .. } if !text.is_empty() => Some(text.as_str()),
        _ => None,
    })
}

/// `catalog: {type: sql, uri: "sqlite:////…/catalog.db", name: lake}`.
fn catalog(endpoint: &EndpointSpec) -> std::result::Result<SqlCatalog, SpecError> {
    let expected = "expected {type: sql, uri: \"sqlite:////absolute/path/catalog.db\", name: <catalog name>}";
    let Some(node) = endpoint.options.get("catalog") else {
        return Err(endpoint.error("catalog", format!("missing: {expected}")));
    };
    let NodeKind::Mapping(entries) = &node.kind else { return Err(endpoint.error("catalog", expected)) };
    if let Some((unknown, _)) = entries.iter().find(|(key, _)| !["type", "uri", "name"].contains(&key.as_str())) {
        return Err(endpoint.error(&format!("catalog.{unknown}"), format!("unknown field; {expected}")));
    }
    match text(entries, "type") {
        Some("sql") => {}
        Some("rest") => {
            return Err(endpoint.error("catalog.type", "the REST catalog is not supported yet; use {type: sql, …}"))
        }
        Some(other) => return Err(endpoint.error("catalog.type", format!("expected sql, found `{other}`"))),
        None => return Err(endpoint.error("catalog.type", format!("missing: {expected}"))),
    }
    let Some(uri) = text(entries, "uri") else {
        return Err(endpoint.error("catalog.uri", format!("missing: {expected}")));
    };
    let name = text(entries, "name").unwrap_or("default");
    SqlCatalog::parse(uri, name).map_err(|problem| endpoint.error("catalog.uri", problem))
}

pub(super) fn options(endpoint: &EndpointSpec) -> std::result::Result<IcebergOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let mut take =
        |result: std::result::Result<u64, SpecError>| result.map_err(|error| errors.push(error)).unwrap_or(0);
    let commit_interval = take(crate::whole_number(endpoint, "commit_interval_secs", DEFAULT_COMMIT_INTERVAL_SECS, 1));
    let commit_rows = take(crate::whole_number(endpoint, "commit_rows", DEFAULT_COMMIT_ROWS, 1));
    let file_mb = take(crate::whole_number(endpoint, "target_file_mb", DEFAULT_TARGET_FILE_MB, 1));
    let catalog = catalog(endpoint).map_err(|error| errors.push(error)).ok();
    let partition_by = crate::lake::partition_by(endpoint).map_err(|found| errors.extend(found)).unwrap_or_default();
    let entries = match &partition_by {
        PartitionBy::None => Vec::new(),
        PartitionBy::Every(entries) => entries.iter().map(|entry| ("partition_by".to_owned(), entry)).collect(),
        PartitionBy::Tables(tables) => tables
            .iter()
            .flat_map(|(table, entries)| entries.iter().map(move |entry| (format!("partition_by.{table}"), entry)))
            .collect(),
    };
    for (field, entry) in entries {
        if let Err(problem) = super::partition::parse(entry) {
            errors.push(endpoint.error(&field, problem));
        }
    }
    let warehouse = match endpoint.options.get("warehouse").map(|node| &node.kind) {
        Some(NodeKind::Scalar { text, .. }) if !text.is_empty() => {
            let path = PathBuf::from(text);
            // A relative path is the process's own directory's; Iceberg locations are absolute.
            Some(std::env::current_dir().map(|here| here.join(&path)).unwrap_or(path))
        }
        _ => {
            errors.push(endpoint.error("warehouse", "missing: the directory the tables' files go under"));
            None
        }
    };
    match (catalog, warehouse) {
        (Some(catalog), Some(warehouse)) if errors.is_empty() => Ok(IcebergOptions {
            catalog,
            warehouse,
            namespace: crate::namespace(endpoint),
            create_tables: endpoint.create_tables,
            partition_by,
            commit_interval: Duration::from_secs(commit_interval),
            commit_rows,
            file_bytes: file_mb * 1024 * 1024,
        }),
        _ => Err(errors),
    }
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    Ok(Arc::new(IcebergSink::new(options, fence)))
}

/// A table of the target read back for verification: its current snapshot's files.
fn read_back(job: &JobSpec, table: &Arc<TableSchema>) -> Result<Arc<dyn Source>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    Ok(Arc::new(IcebergSink::new(options, None).read_back(table)))
}

#[cfg(test)]
mod tests {
    use sluice_core::spec::parse_job;

    fn problems(target: &str) -> Vec<String> {
        let text = format!("name: s\nsource: {{type: mysql, url: \"mysql://a\"}}\ntarget: {target}\n");
        let job = parse_job(&text, false, |_| None).expect("a valid job file");
        match super::options(&job.target) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn the_catalog_and_warehouse_are_checked_together() {
        assert!(problems(
            "{type: iceberg, catalog: {type: sql, uri: \"sqlite:////tmp/c.db\", name: lake}, warehouse: /tmp/w}"
        )
        .is_empty());
        let found = problems("{type: iceberg, catalog: {type: rest, uri: \"http://x\"}, commit_rows: 0}");
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found.iter().any(|problem| problem.contains("target.catalog.type")), "{found:?}");
        assert!(found.iter().any(|problem| problem.contains("target.warehouse")), "{found:?}");
        assert!(found.iter().any(|problem| problem.contains("target.commit_rows")), "{found:?}");
    }
}
