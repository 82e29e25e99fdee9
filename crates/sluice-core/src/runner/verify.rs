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
//! has not applied yet. So each difference found is checked again in rounds: the source's log
//! position is taken after the pass, the stage waits until the target's stream checkpoint has
//! reached it, and the differing keys are compared again. A difference is reported when it
//! stays the same (same source image, same target image) across two rounds, or is still there
//! after the last round. The source only ever sees plain reads: no lock, no write.
//!
//! This stage runs outside a run, reads only, and owns its report; it writes nothing to the
//! target, the source or the state store.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use crate::change::Row;
use crate::connector::{Source, SplitHint};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::filter::TableFilter;
use crate::names::STREAM_TASK;
use crate::schema::{DataType, TableName, TableSchema};
use crate::transform::TableMapping;
use crate::value::Value;

use super::context::RunContext;
use super::copy::as_written;
use super::stream;

mod canonical;
mod comparison;

use canonical::{canonical, Canonical};
use comparison::{Comparison, Entry, Found, Sided};

/// Reads a job's target back as a source of its tables, one target table at a time: a reader of
/// the target's own engine whose `discover` finds exactly the named table (an error when the
/// target has no such table).
pub type ReadBack = Arc<dyn Fn(&TableName) -> Result<Arc<dyn Source>> + Send + Sync>;

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
}

impl Default for VerifyOptions {
    fn default() -> VerifyOptions {
        VerifyOptions { tables: Vec::new(), max_differences: 10_000, rounds: 5, settle: Duration::from_secs(60) }
    }
}

/// A verification of a job: one verdict per target table.
#[derive(Debug, Clone, Serialize)]
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
#[derive(Debug, Clone, Serialize)]
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
    /// What kept part of the table from being compared (a column or the table missing in the
    /// target, a stream that did not catch up).
    pub problems: Vec<String>,
    pub elapsed_ms: u64,
}

/// A row that is not the same on both sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    pub kind: DifferenceKind,
    /// The target key (every compared column for a table without a key), as JSON values.
    pub key: serde_json::Map<String, serde_json::Value>,
    /// The columns whose values differ (`different` only).
    pub columns: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DifferenceKind {
    /// In the source, not in the target.
    Missing,
    /// In the target, not in the source.
    Extra,
    /// In both, with other values.
    Different,
}

/// How a target table is compared: the mapped schema, where each of its columns is in the
/// table read back, and the key rows pair by.
struct Layout {
    mapped: Arc<TableSchema>,
    /// `(column of the mapped schema, column of the table read back)` for each compared column.
    columns: Vec<(usize, usize)>,
    /// The type each compared column is compared as: the mapped type, except that text is
    /// padded to a fixed width only when the target stores it so (a MySQL `CHAR` lands in a
    /// PostgreSQL `varchar`, where a trailing space is a difference).
    types: Vec<DataType>,
    /// Positions in `columns` of the key (every compared column when the table has none).
    key: Vec<usize>,
}

impl Layout {
    fn of(mapped: Arc<TableSchema>, target: Option<&TableSchema>, problems: &mut Vec<String>) -> Layout {
        let mut columns = Vec::new();
        for (index, column) in mapped.columns.iter().enumerate() {
            let found = target.and_then(|target| {
                target
                    .column_index(&column.name)
                    .or_else(|| target.columns.iter().position(|other| other.name.eq_ignore_ascii_case(&column.name)))
            });
            match (found, target) {
                (Some(found), _) => columns.push((index, found)),
                (None, Some(target)) => problems
                    .push(format!("column {} is missing in target table {}: not compared", column.name, target.name)),
                // No target table: every source row is missing; compare what the source has.
                (None, None) => columns.push((index, index)),
            }
        }
        let key: Vec<usize> = mapped
            .primary_key
            .iter()
            .filter_map(|column| columns.iter().position(|(mapped_column, _)| mapped_column == column))
            .collect();
        let key =
            if key.len() == mapped.primary_key.len() && !key.is_empty() { key } else { (0..columns.len()).collect() };
        let types = columns
            .iter()
            .map(|&(mapped_column, target_column)| {
                let stored = target.map(|target| &target.columns[target_column].data_type);
                match (&mapped.columns[mapped_column].data_type, stored) {
                    (DataType::Text { length, fixed: true }, Some(DataType::Text { fixed, .. })) => {
                        DataType::Text { length: *length, fixed: *fixed }
                    }
                    (data_type, _) => data_type.clone(),
                }
            })
            .collect();
        Layout { mapped, columns, types, key }
    }

    fn data_type(&self, compared: usize) -> &DataType {
        &self.types[compared]
    }

    /// A row of the mapped schema as an entry.
    fn source_entry(&self, row: &Row) -> Entry {
        self.entry(|compared| &row[self.columns[compared].0])
    }

    /// A row read back from the target as an entry.
    fn target_entry(&self, row: &Row) -> Entry {
        self.entry(|compared| &row[self.columns[compared].1])
    }

    fn entry<'r>(&self, value_of: impl Fn(usize) -> &'r Value) -> Entry {
        let row: Vec<Canonical> =
            (0..self.columns.len()).map(|compared| canonical(value_of(compared), self.data_type(compared))).collect();
        let key = self.key.iter().map(|&compared| row[compared].clone()).collect();
        let key_values = self.key.iter().map(|&compared| value_of(compared).clone()).collect();
        Entry { key, row, key_values }
    }

    /// The key of a difference as JSON, by column name.
    fn key_json(&self, values: &[Value]) -> serde_json::Map<String, serde_json::Value> {
        self.key
            .iter()
            .zip(values)
            .map(|(&compared, value)| {
                let mut text = String::new();
                crate::json::encode_value(value, &mut text);
                let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(value.to_string()));
                (self.mapped.columns[self.columns[compared].0].name.clone(), json)
            })
            .collect()
    }

    fn column_names(&self, compared: &[usize]) -> Vec<String> {
        compared.iter().map(|&index| self.mapped.columns[self.columns[index].0].name.clone()).collect()
    }
}

/// One pass over a table: what it read and the differences it found.
struct Pass {
    rows_source: u64,
    rows_target: u64,
    rows_refused: u64,
    chunks: u64,
    found: Vec<Found>,
    /// Differences found beyond those kept in `found`.
    unlisted: u64,
}

/// Differences kept per table for checking again; beyond them, a round reads everything again.
const KEPT_FOR_RECHECK: usize = 100_000;

/// Rows one side may be read ahead of the other before the comparison waits for the other.
const AHEAD: u64 = 50_000;

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

/// The verification of one target table.
struct TableCheck {
    context: Arc<RunContext>,
    read_back: ReadBack,
    options: VerifyOptions,
    target: TableName,
    mappings: Vec<Arc<TableMapping>>,
}

impl TableCheck {
    async fn verify(self) -> Result<TableVerdict> {
        let started = Instant::now();
        let mut problems = Vec::new();
        let reader = (self.read_back)(&self.target).map_err(|error| error.on(Side::Target))?;
        let target_schema = match reader.discover().await {
            Ok(mut tables) => match tables.iter().position(|table| table.name == self.target) {
                Some(found) => Some(tables.swap_remove(found)),
                None if tables.len() == 1 => tables.pop(),
                None => None,
            },
            Err(error) if error.kind() == ErrorKind::Schema => None,
            Err(error) => return Err(error.on(Side::Target)),
        };
        if target_schema.is_none() {
            problems.push(format!("the target has no table {}: every source row is missing", self.target));
        }
        let layout = Arc::new(Layout::of(self.mappings[0].target.clone(), target_schema.as_ref(), &mut problems));
        let target_schema = target_schema.map(Arc::new);
        let sides = Sides { layout: layout.clone(), reader, target_schema };
        let mut pass = self.pass(&sides).await?;
        let mut rechecks = 0;
        let mut unsettled = Vec::new();
        if self.context.job.mode.streams() && !pass.found.is_empty() {
            let mut confirmed = Vec::new();
            while rechecks < self.options.rounds as u64 && !pass.found.is_empty() {
                let keys: Option<HashSet<Vec<Canonical>>> =
                    (pass.unlisted == 0).then(|| pass.found.iter().map(|found| found.key.clone()).collect());
                let again = match &keys {
                    Some(keys) => self.keys_again(&sides, keys).await?,
                    None => match self.wait_for_stream().await? {
                        Some(problem) => Err(problem),
                        None => Ok(self.pass(&sides).await?),
                    },
                };
                let again = match again {
                    Ok(again) => again,
                    Err(problem) => {
                        // Not checked again: what was found stands, as the problem says.
                        problems.push(problem);
                        confirmed.append(&mut pass.found);
                        break;
                    }
                };
                rechecks += 1;
                let previous = std::mem::take(&mut pass.found);
                // A round over some keys keeps the row counts of the full pass.
                pass = match keys {
                    Some(_) => Pass { found: again.found, unlisted: again.unlisted, ..pass },
                    None => again,
                };
                // What two rounds found alike, with the stream caught up between them, is a
                // difference; what changed is checked again.
                let (alike, changed): (Vec<Found>, Vec<Found>) =
                    std::mem::take(&mut pass.found).into_iter().partition(|found| previous.contains(found));
                confirmed.extend(alike);
                pass.found = changed;
            }
            // Rows that changed in every round never settled: not shown to differ.
            unsettled = std::mem::replace(&mut pass.found, confirmed);
        }
        let mut verdict = TableVerdict {
            table: self.target.to_string(),
            sources: self.mappings.iter().map(|mapping| mapping.source.name.to_string()).collect(),
            rows_source: pass.rows_source,
            rows_target: pass.rows_target,
            chunks: pass.chunks,
            differences: Vec::new(),
            differences_total: pass.found.len() as u64 + pass.unlisted,
            missing: 0,
            extra: 0,
            different: 0,
            rechecks,
            unsettled: unsettled.len() as u64,
            rows_refused: pass.rows_refused,
            problems,
            elapsed_ms: started.elapsed().as_millis() as u64,
        };
        for found in &pass.found {
            match found.kind {
                DifferenceKind::Missing => verdict.missing += 1,
                DifferenceKind::Extra => verdict.extra += 1,
                DifferenceKind::Different => verdict.different += 1,
            }
        }
        verdict.differences = pass
            .found
            .iter()
            .take(self.options.max_differences)
            .map(|found| Difference {
                kind: found.kind,
                key: layout.key_json(&found.key_values),
                columns: layout.column_names(&found.columns),
            })
            .collect();
        Ok(verdict)
    }

    /// Reads both sides at once and pairs their rows.
    async fn pass(&self, sides: &Sides) -> Result<Pass> {
        let capacity = self.context.job.limits.queue_batches.max(2);
        let (source_rows, mut from_source) = mpsc::channel::<Result<Vec<Entry>>>(capacity);
        let (target_rows, mut from_target) = mpsc::channel::<Result<Vec<Entry>>>(capacity);
        let source_task = tokio::spawn(self.read_source(sides, None, source_rows));
        let target_task = tokio::spawn(self.read_target(sides, None, target_rows));
        let mut comparison = Comparison::new(KEPT_FOR_RECHECK);
        let (mut source_open, mut target_open) = (true, true);
        while source_open || target_open {
            let (source_ahead, target_ahead) = comparison.ahead();
            let take_source = source_open && (!target_open || target_ahead < AHEAD || source_ahead == 0);
            let take_target = target_open && (!source_open || source_ahead < AHEAD || target_ahead == 0);
            tokio::select! {
                received = from_source.recv(), if take_source => match received {
                    Some(entries) => comparison.add(Sided::Source, entries?),
                    None => source_open = false,
                },
                received = from_target.recv(), if take_target => match received {
                    Some(entries) => comparison.add(Sided::Target, entries?),
                    None => target_open = false,
                },
            }
        }
        let read = joined(source_task).await?;
        joined(target_task).await?;
        let (rows_source, rows_target) = comparison.rows();
        let (found, unlisted) = comparison.finish();
        Ok(Pass { rows_source, rows_target, rows_refused: read.refused, chunks: read.chunks, found, unlisted })
    }

    /// Compares the rows of `keys` again, each side as of one source position: the source's
    /// rows first, then, once the target's stream has reached the source's position after that
    /// read, the target's. `Err` says why the stream could not be waited for.
    async fn keys_again(
        &self,
        sides: &Sides,
        keys: &HashSet<Vec<Canonical>>,
    ) -> Result<std::result::Result<Pass, String>> {
        let keys = Some(Arc::new(keys.clone()));
        let mut comparison = Comparison::new(KEPT_FOR_RECHECK);
        let (rows, mut received) = mpsc::channel::<Result<Vec<Entry>>>(self.context.job.limits.queue_batches.max(2));
        let source_task = tokio::spawn(self.read_source(sides, keys.clone(), rows));
        while let Some(entries) = received.recv().await {
            comparison.add(Sided::Source, entries?);
        }
        let read = joined(source_task).await?;
        if let Some(problem) = self.wait_for_stream().await? {
            return Ok(Err(problem));
        }
        let (rows, mut received) = mpsc::channel::<Result<Vec<Entry>>>(self.context.job.limits.queue_batches.max(2));
        let target_task = tokio::spawn(self.read_target(sides, keys, rows));
        while let Some(entries) = received.recv().await {
            comparison.add(Sided::Target, entries?);
        }
        joined(target_task).await?;
        let (rows_source, rows_target) = comparison.rows();
        let (found, unlisted) = comparison.finish();
        Ok(Ok(Pass { rows_source, rows_target, rows_refused: read.refused, chunks: read.chunks, found, unlisted }))
    }

    /// The source side's reader task.
    fn read_source(
        &self,
        sides: &Sides,
        keys: Option<Arc<HashSet<Vec<Canonical>>>>,
        rows: mpsc::Sender<Result<Vec<Entry>>>,
    ) -> impl std::future::Future<Output = SourceRead> + Send + 'static {
        read_source(self.context.clone(), self.mappings.clone(), sides.layout.clone(), keys, rows)
    }

    /// The target side's reader task; none when the target has no such table.
    fn read_target(
        &self,
        sides: &Sides,
        keys: Option<Arc<HashSet<Vec<Canonical>>>>,
        rows: mpsc::Sender<Result<Vec<Entry>>>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let limits = (self.context.job.limits.batch_rows, self.context.job.limits.split_rows);
        let (reader, schema, layout) = (sides.reader.clone(), sides.target_schema.clone(), sides.layout.clone());
        async move {
            if let Some(schema) = schema {
                read_target(limits, reader, schema, layout, keys, rows).await;
            }
        }
    }

    /// Waits until the target's stream checkpoint reaches the source's log position now. `None`
    /// when it did; else why the differences could not be checked again.
    async fn wait_for_stream(&self) -> Result<Option<String>> {
        let context = &self.context;
        let changes = context.source.needs_changes()?;
        let Some(mark) = changes.log_position().await? else { return Ok(None) };
        let deadline = Instant::now() + self.options.settle;
        loop {
            let checkpoints = context.sink.checkpoints(&context.job.name, &[STREAM_TASK.to_owned()]).await?;
            let applied = checkpoints
                .iter()
                .filter_map(|checkpoint| stream::applied_position(checkpoint.position.as_ref()?))
                .next();
            if applied.as_ref().is_some_and(|applied| changes.reached(applied, &mark)) {
                return Ok(None);
            }
            if Instant::now() >= deadline {
                let at = applied.map_or_else(|| "nowhere yet".to_owned(), |applied| applied.brief());
                return Ok(Some(format!(
                    "the job's stream did not reach the source's position {} within {} s (it is at {at}): the \
                     differences listed may be changes it has not applied yet; is the job running?",
                    mark.brief(),
                    self.options.settle.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// What a pass reads: how the table is compared, and the target's reader and table.
struct Sides {
    layout: Arc<Layout>,
    reader: Arc<dyn Source>,
    /// `None` when the target has no such table.
    target_schema: Option<Arc<TableSchema>>,
}

/// The outcome of a reader task.
async fn joined<T>(task: tokio::task::JoinHandle<T>) -> Result<T> {
    task.await.map_err(|error| Error::new(ErrorKind::Read, format!("a verify reader failed: {error}")))
}

/// What the source side read.
struct SourceRead {
    chunks: u64,
    refused: u64,
}

/// Reads every split of the source tables mapped into the table, passes the rows through their
/// mapping, and sends them as entries.
async fn read_source(
    context: Arc<RunContext>,
    mappings: Vec<Arc<TableMapping>>,
    layout: Arc<Layout>,
    keys: Option<Arc<HashSet<Vec<Canonical>>>>,
    rows: mpsc::Sender<Result<Vec<Entry>>>,
) -> SourceRead {
    let mut read = SourceRead { chunks: 0, refused: 0 };
    let result: Result<()> = async {
        let snapshot = context.source.needs_snapshot()?;
        let hint = SplitHint { rows_per_split: context.job.limits.split_rows };
        for mapping in &mappings {
            let stats = context.stats.table(&mapping.source.name, &mapping.target.name);
            let splits = context.with_retry("split the source table", || snapshot.split(&mapping.source, hint)).await?;
            for split in &splits {
                read.chunks += 1;
                let mut reader = snapshot.open(split, None, context.job.limits.batch_rows).await?;
                while let Some(batch) = reader.next().await? {
                    let (batch, refused) = as_written(&context, mapping, batch, &stats);
                    read.refused += refused.len() as u64;
                    let entries = batch
                        .changes
                        .iter()
                        .map(|change| layout.source_entry(change.row()))
                        .filter(|entry| keys.as_ref().is_none_or(|keys| keys.contains(&entry.key)))
                        .collect();
                    if rows.send(Ok(entries)).await.is_err() {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    if let Err(error) = result {
        let _ = rows.send(Err(error)).await;
    }
    read
}

/// Reads the target table back, split by split, and sends its rows as entries.
async fn read_target(
    (batch_rows, split_rows): (usize, u64),
    reader: Arc<dyn Source>,
    schema: Arc<TableSchema>,
    layout: Arc<Layout>,
    keys: Option<Arc<HashSet<Vec<Canonical>>>>,
    rows: mpsc::Sender<Result<Vec<Entry>>>,
) {
    let result: Result<()> = async {
        let snapshot = reader
            .snapshot()
            .ok_or_else(|| Error::new(ErrorKind::Config, "this target cannot be read back").on(Side::Target))?;
        let splits = snapshot.split(&schema, SplitHint { rows_per_split: split_rows }).await?;
        for split in &splits {
            let mut split_reader = snapshot.open(split, None, batch_rows).await?;
            while let Some(batch) = split_reader.next().await? {
                if let Some(refused) = batch.rejected.first() {
                    return Err(Error::new(
                        ErrorKind::Data,
                        format!(
                            "a row of target table {} cannot be read back ({}): {}",
                            schema.name, refused.key, refused.reason
                        ),
                    )
                    .on(Side::Target));
                }
                let entries = batch
                    .changes
                    .iter()
                    .map(|change| layout.target_entry(change.row()))
                    .filter(|entry| keys.as_ref().is_none_or(|keys| keys.contains(&entry.key)))
                    .collect();
                if rows.send(Ok(entries)).await.is_err() {
                    return Ok(());
                }
            }
        }
        Ok(())
    }
    .await;
    if let Err(error) = result {
        let _ = rows.send(Err(error.on(Side::Target))).await;
    }
}
