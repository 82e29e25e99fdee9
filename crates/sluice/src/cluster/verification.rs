//! Verifications of a server's jobs (`POST /jobs/NAME/verify`): run by the node that was asked,
//! on the job's current version, the last report of each job kept in the coordination store
//! (`/sluice/verifications/{job}`), where any node finds it for the API, the console, the
//! metrics and the alarms (`verify_differences`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::runner::{ReadBack, Runner, VerifyOptions, VerifyReport};
use sluice_core::state::{MemoryStateStore, StateStore};
use sluice_core::Result;

use super::model::{encode, load, load_spec, verification_key, JobRecord};
use super::store::Store;

/// A job's last verification.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LastVerification {
    /// When it ended, Unix seconds.
    pub at: u64,
    /// The node that ran it.
    pub node: String,
    /// The job's version it verified.
    pub version: u32,
    pub report: VerifyReport,
}

/// Verifies `job` as its current version says, keeps the report as its last verification, and
/// returns it.
pub async fn verify(
    store: &dyn Store,
    job: &JobRecord,
    options: &VerifyOptions,
    node: &str,
) -> Result<LastVerification> {
    let spec = Arc::new(load_spec(store, &job.name, job.version).await?);
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let state: Arc<dyn StateStore> = Arc::new(MemoryStateStore::default());
    let runner =
        Runner::new(spec.clone(), sluice_connectors::source(&spec)?, sluice_connectors::sink(&spec)?, state, stopped);
    let reading = spec.clone();
    let read_back: ReadBack = Arc::new(move |table| sluice_connectors::read_back(&reading, table));
    let report = runner.verify(read_back, options).await?;
    let last = LastVerification {
        at: sluice_core::clock::unix_seconds(),
        node: node.to_owned(),
        version: job.version,
        report,
    };
    store.put(&verification_key(&job.name), &encode(&last), None).await?;
    log::info!(
        "job {}: verified, {} differences ({} repaired)",
        job.name,
        last.report.differences_total,
        last.report.tables.iter().map(|table| table.repaired).sum::<u64>()
    );
    Ok(last)
}

/// The last verification of `job`, if it was ever verified.
pub async fn last(store: &dyn Store, job: &str) -> Result<Option<LastVerification>> {
    Ok(load::<LastVerification>(store, &verification_key(job)).await?.map(|(last, _)| last))
}
