//! Counters per table and job (DataX's "communication"), read by the progress display while a
//! run goes on and turned into the run summary at its end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::schema::TableName;

/// Live counters of one table. Writers add; readers load; all relaxed, since they are reports.
#[derive(Debug)]
pub struct TableStats {
    pub source: TableName,
    pub target: TableName,
    pub rows_read: AtomicU64,
    pub rows_written: AtomicU64,
    pub rows_skipped: AtomicU64,
    /// Rows a transform's `filter` left out (read, deliberately not written).
    pub rows_filtered: AtomicU64,
    /// Zero dates stored as NULL under `errors.zero_dates: null`.
    pub zero_dates_nulled: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Rows the source expects in this run (for ETA).
    pub rows_expected: AtomicU64,
    pub splits_total: AtomicU64,
    pub splits_done: AtomicU64,
}

impl TableStats {
    fn new(source: TableName, target: TableName) -> TableStats {
        TableStats {
            source,
            target,
            rows_read: AtomicU64::new(0),
            rows_written: AtomicU64::new(0),
            rows_skipped: AtomicU64::new(0),
            rows_filtered: AtomicU64::new(0),
            zero_dates_nulled: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            rows_expected: AtomicU64::new(0),
            splits_total: AtomicU64::new(0),
            splits_done: AtomicU64::new(0),
        }
    }

    pub fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    /// Takes `amount` off `counter`, stopping at 0.
    pub fn take(counter: &AtomicU64, amount: u64) {
        let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |value| Some(value.saturating_sub(amount)));
    }

    pub fn snapshot(&self) -> TableSummary {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TableSummary {
            source: self.source.to_string(),
            target: self.target.to_string(),
            rows_read: load(&self.rows_read),
            rows_written: load(&self.rows_written),
            rows_skipped: load(&self.rows_skipped),
            rows_filtered: load(&self.rows_filtered),
            zero_dates_nulled: load(&self.zero_dates_nulled),
            bytes_read: load(&self.bytes_read),
            rows_expected: load(&self.rows_expected),
            splits_total: load(&self.splits_total),
            splits_done: load(&self.splits_done),
        }
    }
}

/// The counters of a whole run.
#[derive(Debug)]
pub struct JobStats {
    started: Instant,
    tables: Mutex<BTreeMap<TableName, Arc<TableStats>>>,
    /// The change stream's counters (cdc and snapshot+cdc).
    pub stream: StreamStats,
}

impl Default for JobStats {
    fn default() -> Self {
        JobStats { started: Instant::now(), tables: Mutex::new(BTreeMap::new()), stream: StreamStats::default() }
    }
}

/// Where a change stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamPhase {
    /// The job has not reached its change stream (still copying, or snapshot only).
    NotStarted,
    /// Applying the backlog between the stream's start and the source's position when it began.
    CatchingUp,
    /// Caught up once; applying changes as they come.
    Streaming,
}

/// Upper bounds of the latency histogram's buckets, in milliseconds; a last bucket takes the rest.
pub const LATENCY_BOUNDS_MS: [u64; 16] =
    [5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 6_000, 7_500, 10_000, 30_000, 60_000, 300_000];

/// Live counters of the change stream.
#[derive(Debug, Default)]
pub struct StreamStats {
    phase: AtomicU8,
    pub rows_applied: AtomicU64,
    pub transactions_applied: AtomicU64,
    /// DDL statements carried to the target.
    pub schema_changes: AtomicU64,
    /// DDL statements passed over (`schema_changes: ignore`).
    pub schema_changes_ignored: AtomicU64,
    /// Row changes a transform's `filter` left out (both images outside it).
    pub changes_filtered: AtomicU64,
    /// Changes left out as dirty records (a value the target cannot hold), each counted once
    /// per run.
    pub dirty_records: AtomicU64,
    /// Changes that found the target's row otherwise than they expected (`conflict:`), each
    /// settled by the job's policy and kept as a dirty record.
    pub conflicts: AtomicU64,
    /// Transactions Sluice itself wrote into the source, passed over (`two_way`).
    pub echoes: AtomicU64,
    /// Unix seconds before which the target holds every change the source committed: the
    /// source commit time of the last transaction applied, or the time of the last heartbeat
    /// seen with nothing left to apply. 0 before the stream applied or saw anything.
    pub fresh_through: AtomicU64,
    /// The last position committed in the target.
    pub position: Mutex<Option<crate::change::Position>>,
    /// The source's log past that position, as last measured.
    pub log_backlog: Mutex<Option<crate::connector::LogBacklog>>,
    /// Source commit → target commit, per source transaction.
    latency: [AtomicU64; LATENCY_BOUNDS_MS.len() + 1],
    /// The sum of those latencies, in milliseconds.
    pub latency_sum_ms: AtomicU64,
}

impl StreamStats {
    pub fn phase(&self) -> StreamPhase {
        match self.phase.load(Ordering::Relaxed) {
            1 => StreamPhase::CatchingUp,
            2 => StreamPhase::Streaming,
            _ => StreamPhase::NotStarted,
        }
    }

    pub(crate) fn set_phase(&self, phase: StreamPhase) {
        let value = match phase {
            StreamPhase::NotStarted => 0,
            StreamPhase::CatchingUp => 1,
            StreamPhase::Streaming => 2,
        };
        self.phase.store(value, Ordering::Relaxed);
    }

    /// Seconds the target is behind the source: now minus `fresh_through` (0 before the
    /// stream knows). It grows while nothing is applied, whatever the reason (a target down,
    /// a stalled stream), so a lag alarm sees a stuck stream.
    pub fn lag_seconds(&self) -> u64 {
        match self.fresh_through.load(Ordering::Relaxed) {
            0 => 0,
            through => crate::clock::unix_seconds().saturating_sub(through),
        }
    }

    /// Marks the target fresh through `unix_seconds` (never backwards).
    pub fn fresh_through(&self, unix_seconds: u64) {
        self.fresh_through.fetch_max(unix_seconds, Ordering::Relaxed);
    }

    /// Transactions per latency bucket, the last one open (`LATENCY_BOUNDS_MS`).
    pub fn latency_counts(&self) -> Vec<u64> {
        self.latency.iter().map(|count| count.load(Ordering::Relaxed)).collect()
    }

    /// Counts `transactions` source transactions applied `latency` after their source commit.
    pub(crate) fn record_latency(&self, latency: Duration, transactions: u64) {
        let millis = latency.as_millis() as u64;
        let bucket = LATENCY_BOUNDS_MS.iter().position(|&bound| millis <= bound).unwrap_or(LATENCY_BOUNDS_MS.len());
        self.latency[bucket].fetch_add(transactions, Ordering::Relaxed);
        self.latency_sum_ms.fetch_add(millis.saturating_mul(transactions), Ordering::Relaxed);
    }

    /// The bucket bound under which `quantile` (0..=1) of the transactions were applied, in
    /// milliseconds; `None` before any transaction, `u64::MAX` past the last bound.
    pub(crate) fn latency_quantile_ms(&self, quantile: f64) -> Option<u64> {
        let counts: Vec<u64> = self.latency.iter().map(|count| count.load(Ordering::Relaxed)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let wanted = ((total as f64 * quantile).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, count) in counts.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return Some(LATENCY_BOUNDS_MS.get(bucket).copied().unwrap_or(u64::MAX));
            }
        }
        None
    }

    pub fn summary(&self) -> StreamSummary {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        StreamSummary {
            phase: self.phase(),
            rows_applied: load(&self.rows_applied),
            transactions_applied: load(&self.transactions_applied),
            schema_changes: load(&self.schema_changes),
            schema_changes_ignored: load(&self.schema_changes_ignored),
            changes_filtered: load(&self.changes_filtered),
            dirty_records: load(&self.dirty_records),
            conflicts: load(&self.conflicts),
            echoes: load(&self.echoes),
            lag_seconds: self.lag_seconds(),
            position: self
                .position
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .as_ref()
                .map(|position| position.0.clone()),
            latency_p50_ms: self.latency_quantile_ms(0.5),
            latency_p99_ms: self.latency_quantile_ms(0.99),
            latency_histogram: LATENCY_BOUNDS_MS
                .iter()
                .map(|&bound| Some(bound))
                .chain(std::iter::once(None))
                .zip(self.latency.iter().map(load))
                .map(|(up_to_ms, transactions)| LatencyBucket { up_to_ms, transactions })
                .collect(),
        }
    }
}

/// The change stream's part of the run summary.
#[derive(Debug, Clone, Serialize)]
pub struct StreamSummary {
    pub phase: StreamPhase,
    pub rows_applied: u64,
    pub transactions_applied: u64,
    pub schema_changes: u64,
    /// DDL statements passed over (`schema_changes: ignore`).
    pub schema_changes_ignored: u64,
    pub changes_filtered: u64,
    /// Changes left out as dirty records.
    pub dirty_records: u64,
    /// Conflicts settled by the job's policy (`conflict:`), each kept as a dirty record.
    pub conflicts: u64,
    /// Transactions Sluice wrote into the source, passed over (`two_way`).
    pub echoes: u64,
    pub lag_seconds: u64,
    /// The last source position committed in the target.
    pub position: Option<serde_json::Value>,
    /// Upper bounds of the buckets holding the median and the 99th percentile.
    pub latency_p50_ms: Option<u64>,
    pub latency_p99_ms: Option<u64>,
    /// Transactions per latency bucket (source commit → target commit).
    pub latency_histogram: Vec<LatencyBucket>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatencyBucket {
    /// The bucket's upper bound; `None` for the last, open bucket.
    pub up_to_ms: Option<u64>,
    pub transactions: u64,
}

impl JobStats {
    /// The counters of a table, created on first use.
    pub fn table(&self, source: &TableName, target: &TableName) -> Arc<TableStats> {
        let mut tables = self.tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        tables
            .entry(source.clone())
            .or_insert_with(|| Arc::new(TableStats::new(source.clone(), target.clone())))
            .clone()
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// A consistent-enough copy of every counter, for display and summaries.
    pub fn snapshot(&self) -> Vec<TableSummary> {
        let tables = self.tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        tables.values().map(|table| table.snapshot()).collect()
    }
}

/// One table's line of the run summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableSummary {
    pub source: String,
    pub target: String,
    pub rows_read: u64,
    pub rows_written: u64,
    pub rows_skipped: u64,
    /// Rows a transform's `filter` left out: rows_read = rows_written + rows_skipped + rows_filtered.
    pub rows_filtered: u64,
    pub zero_dates_nulled: u64,
    pub bytes_read: u64,
    pub rows_expected: u64,
    pub splits_total: u64,
    pub splits_done: u64,
}

/// How a run ended (or that it has not yet), as its summary says it: `running`, `succeeded`,
/// `failed`, `stopped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Succeeded,
    Failed,
    Stopped,
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
        })
    }
}

/// The reconciliation record of a run: what `sluice run --summary-json FILE` writes, and what a
/// run prints at its end (counters per table and in total, so a run can be checked against the
/// source).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub job: String,
    pub mode: String,
    pub status: RunStatus,
    pub error: Option<String>,
    pub elapsed_secs: f64,
    pub rows_read: u64,
    pub rows_written: u64,
    pub rows_skipped: u64,
    pub rows_filtered: u64,
    pub zero_dates_nulled: u64,
    pub bytes_read: u64,
    pub rows_per_sec: f64,
    /// Dirty records kept in the state directory for this job over all runs.
    pub dirty_records_total: u64,
    /// Splits already complete from an earlier run and not copied again.
    pub splits_resumed_done: u64,
    /// Times the job was run again from its checkpoints after a failure that may heal
    /// (`restart:`); the counters are those of its last run.
    pub restarts: u32,
    /// The source's log position captured before the snapshot's first read, where a change
    /// stream continues from.
    pub source_position: Option<serde_json::Value>,
    /// The change stream, for cdc and snapshot+cdc jobs.
    pub stream: Option<StreamSummary>,
    pub tables: Vec<TableSummary>,
}

impl RunSummary {
    pub fn new(job: &str, mode: &str, stats: &JobStats) -> RunSummary {
        let tables = stats.snapshot();
        let elapsed = stats.elapsed().as_secs_f64();
        let sum = |field: fn(&TableSummary) -> u64| tables.iter().map(field).sum::<u64>();
        let rows_written = sum(|table| table.rows_written);
        RunSummary {
            job: job.to_owned(),
            mode: mode.to_owned(),
            status: RunStatus::Running,
            error: None,
            elapsed_secs: (elapsed * 1000.0).round() / 1000.0,
            rows_read: sum(|table| table.rows_read),
            rows_written,
            rows_skipped: sum(|table| table.rows_skipped),
            rows_filtered: sum(|table| table.rows_filtered),
            zero_dates_nulled: sum(|table| table.zero_dates_nulled),
            bytes_read: sum(|table| table.bytes_read),
            rows_per_sec: if elapsed > 0.0 { (rows_written as f64 / elapsed).round() } else { 0.0 },
            dirty_records_total: 0,
            splits_resumed_done: 0,
            restarts: 0,
            source_position: None,
            stream: (stats.stream.phase() != StreamPhase::NotStarted).then(|| stats.stream.summary()),
            tables,
        }
    }
}
