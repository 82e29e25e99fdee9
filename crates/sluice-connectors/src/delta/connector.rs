//! The `delta` connector: Delta Lake tables as a target, its options and construction.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::{Result, TableSchema};

use super::read_back::LatestVersion;
use super::{DeltaOptions, DeltaSink};
use crate::columnar::read_back::ColumnarTable;
use crate::{Connector, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "delta",
    feature: "delta",
    secrets: &[],
    capabilities: Capabilities {
        table_sink: true,
        // Groups folded per key, merged into the files that hold the keys.
        change_sink: true,
        // A commit of a task's app transaction fails once another owner committed for it, and a
        // stream group is decided once, in the journal.
        fencing: true,
        transactions: true,
        ..Capabilities::NONE
    },
    source: None,
    target: Some(TargetSide { fields: FIELDS, validate, build, read_back: Some(read_back) }),
};

const FIELDS: &[&str] = &[
    "type",
    "path",
    "create_tables",
    "partition_by",
    "commit_interval_secs",
    "commit_rows",
    "target_file_mb",
    "compact_every_secs",
    "checkpoint_every",
    "vacuum_every_secs",
    "vacuum_retention_hours",
];

const DEFAULT_COMMIT_INTERVAL_SECS: u64 = 5;
const DEFAULT_COMMIT_ROWS: u64 = 200_000;
const DEFAULT_TARGET_FILE_MB: u64 = 16;
const DEFAULT_COMPACT_EVERY_SECS: u64 = 60;
/// Delta's own default.
const DEFAULT_CHECKPOINT_EVERY: u64 = 100;
const DEFAULT_VACUUM_EVERY_SECS: u64 = 3_600;
/// Delta's own default (`delta.deletedFileRetentionDuration`, 7 days).
const DEFAULT_VACUUM_RETENTION_HOURS: u64 = 168;

pub(super) fn options(endpoint: &EndpointSpec) -> std::result::Result<DeltaOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let mut take =
        |result: std::result::Result<u64, SpecError>| result.map_err(|error| errors.push(error)).unwrap_or(0);
    let commit_interval = take(crate::whole_number(endpoint, "commit_interval_secs", DEFAULT_COMMIT_INTERVAL_SECS, 1));
    let commit_rows = take(crate::whole_number(endpoint, "commit_rows", DEFAULT_COMMIT_ROWS, 1));
    let file_mb = take(crate::whole_number(endpoint, "target_file_mb", DEFAULT_TARGET_FILE_MB, 1));
    let compact_every = take(crate::whole_number(endpoint, "compact_every_secs", DEFAULT_COMPACT_EVERY_SECS, 0));
    let checkpoint_every = take(crate::whole_number(endpoint, "checkpoint_every", DEFAULT_CHECKPOINT_EVERY, 1));
    let vacuum_every = take(crate::whole_number(endpoint, "vacuum_every_secs", DEFAULT_VACUUM_EVERY_SECS, 0));
    let retention_hours =
        take(crate::whole_number(endpoint, "vacuum_retention_hours", DEFAULT_VACUUM_RETENTION_HOURS, 0));
    let partition_by = crate::lake::partition_by(endpoint).map_err(|found| errors.extend(found)).unwrap_or_default();
    let path = endpoint.path.as_ref().map(|path| {
        let path = PathBuf::from(path);
        // A relative path is the process's own directory's; Delta needs it absolute.
        std::env::current_dir().map(|here| here.join(&path)).unwrap_or(path)
    });
    let Some(path) = path else {
        // The registry reports the missing path.
        return Err(errors);
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let every = |seconds: u64| (seconds > 0).then(|| Duration::from_secs(seconds));
    Ok(DeltaOptions {
        path,
        create_tables: endpoint.create_tables,
        partition_by,
        commit_interval: Duration::from_secs(commit_interval),
        commit_rows,
        file_bytes: file_mb * 1024 * 1024,
        compact_every: every(compact_every),
        checkpoint_every,
        vacuum_every: every(vacuum_every),
        vacuum_retention: Duration::from_secs(retention_hours * 3_600),
    })
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    Ok(Arc::new(DeltaSink::new(options, fence)))
}

/// A table of the target read back for verification: its latest version's files.
fn read_back(job: &JobSpec, table: &Arc<TableSchema>) -> Result<Arc<dyn Source>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    Ok(Arc::new(ColumnarTable::new(table, LatestVersion::of(options, &table.name))))
}
