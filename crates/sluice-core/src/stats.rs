//! Counters per table and job (DataX's "communication"), read by the progress display while a
//! run goes on and turned into the run summary at its end.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
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

    pub fn snapshot(&self) -> TableSummary {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TableSummary {
            source: self.source.to_string(),
            target: self.target.to_string(),
            rows_read: load(&self.rows_read),
            rows_written: load(&self.rows_written),
            rows_skipped: load(&self.rows_skipped),
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
}

impl Default for JobStats {
    fn default() -> Self {
        JobStats { started: Instant::now(), tables: Mutex::new(BTreeMap::new()) }
    }
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
    pub zero_dates_nulled: u64,
    pub bytes_read: u64,
    pub rows_expected: u64,
    pub splits_total: u64,
    pub splits_done: u64,
}

/// The reconciliation record of a run (product.md's `--summary-json`).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub job: String,
    pub mode: String,
    /// `succeeded`, `failed` or `stopped`.
    pub status: String,
    pub error: Option<String>,
    pub elapsed_secs: f64,
    pub rows_read: u64,
    pub rows_written: u64,
    pub rows_skipped: u64,
    pub zero_dates_nulled: u64,
    pub bytes_read: u64,
    pub rows_per_sec: f64,
    /// Dirty records kept in the state directory for this job over all runs.
    pub dirty_records_total: u64,
    /// Splits already complete from an earlier run and not copied again.
    pub splits_resumed_done: u64,
    /// The source's log position captured before the snapshot's first read, where a change
    /// stream continues from.
    pub source_position: Option<serde_json::Value>,
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
            status: "running".to_owned(),
            error: None,
            elapsed_secs: (elapsed * 1000.0).round() / 1000.0,
            rows_read: sum(|table| table.rows_read),
            rows_written,
            rows_skipped: sum(|table| table.rows_skipped),
            zero_dates_nulled: sum(|table| table.zero_dates_nulled),
            bytes_read: sum(|table| table.bytes_read),
            rows_per_sec: if elapsed > 0.0 { (rows_written as f64 / elapsed).round() } else { 0.0 },
            dirty_records_total: 0,
            splits_resumed_done: 0,
            source_position: None,
            tables,
        }
    }
}
