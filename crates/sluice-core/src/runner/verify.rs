//! The verify stage (`sluice verify`): proves that the target holds what the job's mapping makes
//! of the source, and names every row where it does not.
//!
//! Each target table is compared with the source tables mapped into it. The source side reads
//! every split of those tables as the copy does and passes the rows through the same mapping
//! (routes, projections, filters, masks, the zero-date policy); the target side reads the
//! target table back with a reader of the target's own engine (`ReadBack`). Both sides are read
//! at once, in key order, and their rows paired by the target key (`comparison`): a row on one
//! side only is **missing** (source only) or **extra** (target only); a pair whose values differ
//! (as `canonical` defines equality for the column's type) is **different**, with the columns.
//!
//! A job that streams changes is compared while it runs: a difference may be a change the stream
//! has not applied yet. So each difference found is checked again in rounds: the source's rows
//! of the differing keys are read again (by key), the stage waits until the target's stream
//! checkpoint has reached the source's log position taken after that read, then reads the
//! target's rows of those keys. A difference is reported when two rounds find it alike (same
//! source image, same target image); one that changed in every round is counted as unsettled.
//! The source only ever sees plain reads: no lock, no write.
//!
//! This stage runs outside a run and owns its report. It writes nothing, except with `repair`:
//! the source's current rows over the differing ones, through the target's change writer under a
//! checkpoint task of its own (`repair/<table>`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::connector::Source;
use crate::error::{Error, ErrorKind, Result};
use crate::filter::TableFilter;
use crate::schema::{TableName, TableSchema};
use crate::transform::TableMapping;

use super::context::RunContext;

mod canonical;
mod comparison;
mod layout;
mod table;

use table::TableCheck;

/// Reads a job's target back as a source of its tables, one target table at a time, given the
/// table as the job's mapping makes it: a reader whose `discover` finds exactly that table (or
/// nothing, or a schema error, when the target has no such table). A reader of the target's own
/// engine ignores the mapped columns; a reader of files that hold no logical types (Parquet,
/// Delta) types its values by them.
pub type ReadBack = Arc<dyn Fn(&Arc<TableSchema>) -> Result<Arc<dyn Source>> + Send + Sync>;

/// What to verify and how.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Globs over source or target table names (`shop.*`, `!shop.audit`); empty: every table.
    pub tables: Vec<String>,
    /// Differences listed per table at most (all are counted).
    pub max_differences: usize,
    /// Rounds of checking differences again while a stream applies changes.
    pub rounds: usize,
    /// How long a round waits for the stream to reach the source's position.
    pub settle: Duration,
    /// Write the source's rows over the differing ones, then compare them again.
    pub repair: bool,
}

impl Default for VerifyOptions {
    fn default() -> VerifyOptions {
        VerifyOptions {
            tables: Vec::new(),
            max_differences: 10_000,
            rounds: 5,
            settle: Duration::from_secs(60),
            repair: false,
        }
    }
}

/// A verification of a job: one verdict per target table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerifyReport {
    pub job: String,
    pub tables: Vec<TableVerdict>,
    /// Differences over every table.
    pub differences_total: u64,
    pub elapsed_ms: u64,
}

impl VerifyReport {
    /// Whether source and target agree on every table, with nothing that kept a table from
    /// being compared.
    pub fn agrees(&self) -> bool {
        self.differences_total == 0 && self.tables.iter().all(|table| table.problems.is_empty())
    }
}

/// What one target table was found to hold against the source tables mapped into it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TableVerdict {
    /// The target table.
    pub table: String,
    /// The source tables mapped into it.
    pub sources: Vec<String>,
    /// Rows the source holds for the table, after the mapping's filters.
    pub rows_source: u64,
    pub rows_target: u64,
    /// Source splits read (the copy's chunks).
    pub chunks: u64,
    /// Differences, up to `VerifyOptions::max_differences`.
    pub differences: Vec<Difference>,
    pub differences_total: u64,
    pub missing: u64,
    pub extra: u64,
    pub different: u64,
    /// Rounds in which differences were checked again after the stream caught up.
    pub rechecks: u64,
    /// Rows that differed in every round, each time with other values: rows the source keeps
    /// changing faster than the rounds could see them settle. Not counted as differences.
    pub unsettled: u64,
    /// Source rows the mapping refuses (the job keeps them as dirty records, not in the table).
    pub rows_refused: u64,
    /// With `repair`: differing rows replaced by the source's or deleted.
    pub repaired: u64,
    /// With `repair`: each row replaced, up to `VerifyOptions::max_differences`.
    pub repairs: Vec<Repair>,
    /// What kept part of the table from being compared (a column or the table missing in the
    /// target, a stream that did not catch up).
    pub problems: Vec<String>,
    pub elapsed_ms: u64,
}

/// A row that is not the same on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    pub kind: DifferenceKind,
    /// The target key (every compared column for a table without a key), as JSON values.
    pub key: serde_json::Map<String, serde_json::Value>,
    /// The columns whose values differ (`different` only).
    pub columns: Vec<String>,
}

/// A differing row a repair replaced: its key, what the target held (as compared: `None` for a
/// missing row) and what the source holds now (`None`: the row was deleted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Repair {
    pub kind: DifferenceKind,
    pub key: serde_json::Map<String, serde_json::Value>,
    pub before: Option<serde_json::Map<String, serde_json::Value>>,
    pub after: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DifferenceKind {
    /// In the source, not in the target.
    Missing,
    /// In the target, not in the source.
    Extra,
    /// In both, with other values.
    Different,
}

/// The verification of a job, on the run context of a runner that does not run.
pub(super) struct Verification {
    pub(super) context: Arc<RunContext>,
}

impl Verification {
    pub(super) async fn verify(&self, read_back: ReadBack, options: &VerifyOptions) -> Result<VerifyReport> {
        let started = Instant::now();
        let context = &self.context;
        context.source.needs_snapshot()?;
        let discovered = context.with_retry("discover the source tables", || context.source.discover()).await?;
        let filter = TableFilter::new(&options.tables);
        let mut groups: BTreeMap<TableName, Vec<Arc<TableMapping>>> = BTreeMap::new();
        for table in discovered {
            let mapping = context.mapping(&Arc::new(table))?;
            groups.entry(mapping.target.name.clone()).or_default().push(mapping);
        }
        groups.retain(|target, mappings| {
            options.tables.is_empty()
                || filter.matches(target)
                || mappings.iter().any(|mapping| filter.matches(&mapping.source.name))
        });
        if groups.is_empty() {
            return Err(Error::new(ErrorKind::Config, "no table of the job matches --tables")
                .hint("name source or target tables, or globs of them (db.*)"));
        }
        let limit = Arc::new(Semaphore::new(context.job.parallelism.max(1)));
        let mut tasks = JoinSet::new();
        for (target, mappings) in groups {
            let table = TableCheck {
                context: context.clone(),
                read_back: read_back.clone(),
                options: options.clone(),
                target,
                mappings,
            };
            let limit = limit.clone();
            tasks.spawn(async move {
                let _permit = limit.acquire_owned().await;
                table.verify().await
            });
        }
        let mut tables = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let verdict =
                joined.map_err(|error| Error::new(ErrorKind::Read, format!("a verify task failed: {error}")))?;
            tables.push(verdict?);
        }
        tables.sort_by(|one, other| one.table.cmp(&other.table));
        let differences_total = tables.iter().map(|table| table.differences_total).sum();
        Ok(VerifyReport {
            job: context.job.name.clone(),
            tables,
            differences_total,
            elapsed_ms: started.elapsed().as_millis() as u64,
        })
    }
}
