//! The run context: what every stage of a run (prepare, copy, stream, replay) reads and none of
//! them replaces — the job, its source, sink and state store, the live counters, the throttle,
//! the stop and abort signals, and the mappings of source tables to target tables.
//!
//! It owns no stage's progress: a plan, the copy's positions, the stream's checkpoint belong to
//! the stage that makes them and pass from one stage to the next as values. It must not grow
//! fields that one stage sets for another to read.

use std::sync::Arc;

use tokio::sync::watch;

use super::mappings::Mappings;
use crate::change::Rejected;
use crate::connector::{Sink, Source};
use crate::error::{Error, ErrorKind, Result};
use crate::retry;
use crate::schema::{TableName, TableSchema};
use crate::spec::JobSpec;
use crate::state::StateStore;
use crate::stats::JobStats;
use crate::throttle::Throttle;
use crate::transform::TableMapping;

/// What every stage of one run reads: set up once by `Runner::new`, shared by the stages (the
/// copy's concurrent tasks hold it in an `Arc`), never replaced.
pub(super) struct RunContext {
    pub(super) job: Arc<JobSpec>,
    pub(super) source: Arc<dyn Source>,
    pub(super) sink: Arc<dyn Sink>,
    pub(super) state: Arc<dyn StateStore>,
    pub(super) stats: Arc<JobStats>,
    pub(super) throttle: Throttle,
    /// Set by the caller to stop gracefully (SIGINT/SIGTERM).
    pub(super) stop: watch::Receiver<bool>,
    /// Set by the runner when one task failed, so the others stop too.
    pub(super) abort: watch::Sender<bool>,
    /// The job's routes and transform rules, and each source table's mapping to its target.
    pub(super) mappings: Mappings,
}

impl RunContext {
    pub(super) fn new(
        job: Arc<JobSpec>,
        source: Arc<dyn Source>,
        sink: Arc<dyn Sink>,
        state: Arc<dyn StateStore>,
        stop: watch::Receiver<bool>,
    ) -> RunContext {
        let throttle = Throttle::new(job.limits.rows_per_sec, job.limits.bytes_per_sec);
        let mappings = Mappings::of(&job);
        RunContext {
            job,
            source,
            sink,
            state,
            stats: Arc::new(JobStats::default()),
            throttle,
            stop,
            abort: watch::channel(false).0,
            mappings,
        }
    }

    pub(super) fn should_stop(&self) -> bool {
        *self.stop.borrow() || *self.abort.borrow()
    }

    /// Calls `step` until it succeeds, fails for good, or runs out of attempts.
    pub(super) async fn with_retry<T, F, Fut>(&self, what: &str, step: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        retry::retrying(&self.job.retry, what, || self.should_stop(), |wait| self.pause(wait), step).await
    }

    /// Waits `wait`, or less when the run is stopped or aborted meanwhile.
    pub(super) async fn pause(&self, wait: std::time::Duration) {
        let mut stop = self.stop.clone();
        let mut abort = self.abort.subscribe();
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|stopped| *stopped) => {}
            _ = abort.wait_for(|aborted| *aborted) => {}
        }
    }

    /// The mapping of a source table as planned, or, for a schema the plan does not have (a
    /// table created or altered in the change stream), compiled now.
    pub(super) fn mapping(&self, table: &Arc<TableSchema>) -> Result<Arc<TableMapping>> {
        self.mappings.mapping(table, &*self.sink)
    }

    /// The target name of a source table: routed, then named by the sink.
    pub(super) fn target_name(&self, source: &TableName) -> TableName {
        self.mappings.target_name(source, &*self.sink)
    }

    /// Keeps rows that could not be read or written as dirty records of `task`, logs each with
    /// its table and key, and fails once the job has more than `errors.max_dirty_records` (one
    /// budget for the copy and the stream). Called before the commit that moves past them, so a
    /// crash cannot lose them; storing is idempotent, so a batch or group applied again after a
    /// failed commit does not count them twice.
    /// Keeps the conflicts a policy settled (`conflict:`) with the dirty records, outside their
    /// budget.
    pub(super) fn keep_conflicts(&self, task: &str, records: &[Rejected]) -> Result<()> {
        self.state.record_dirty(&self.job.name, task, records)?;
        for record in records {
            log::warn!("conflict in {} ({}): {}", record.table, record.key, record.reason);
        }
        Ok(())
    }

    pub(super) fn keep_dirty(&self, task: &str, rejects: &[Rejected]) -> Result<()> {
        let total = self.state.record_dirty(&self.job.name, task, rejects)?;
        for reject in rejects {
            log::warn!("dirty record in {} ({}): {}", reject.table, reject.key, reject.reason);
        }
        match rejects.last() {
            Some(last) if total > self.job.errors.max_dirty_records => Err(Error::new(
                ErrorKind::Data,
                format!(
                    "{total} dirty records exceed errors.max_dirty_records = {}; the last: table {}, key {}: {}",
                    self.job.errors.max_dirty_records, last.table, last.key, last.reason
                ),
            )
            .hint(
                "fix the data or raise errors.max_dirty_records; the dirty records are kept in the state directory \
                 (on a server: GET /api/v1/jobs/NAME/dirty, `sluice job dirty NAME`)",
            )),
            _ => Ok(()),
        }
    }
}
