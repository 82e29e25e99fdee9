//! The verification of one target table: a pass over both sides, rounds that check
//! differences again while a stream applies changes, and the repair of what still differs.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::canonical::Canonical;
use super::comparison::{Comparison, Entry, Found, Sided};
use super::layout::Layout;
use super::{Difference, DifferenceKind, ReadBack, Repair, TableVerdict, VerifyOptions};
use crate::change::{Batch, Row};
use crate::connector::{Checkpoint, Source, Split, SplitHint};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::names::STREAM_TASK;
use crate::runner::context::RunContext;
use crate::runner::copy::as_written;
use crate::runner::stream;
use crate::schema::{TableName, TableSchema};
use crate::transform::TableMapping;
use crate::value::Value;

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

/// Differences kept per table for checking again and repairing; beyond them, a round reads
/// everything again.
const KEPT_FOR_RECHECK: usize = 100_000;

/// Rows one side may be read ahead of the other before the comparison waits for the other: the
/// rows waiting for their pair stay few enough to be found in cache (50,000 cost a tenth more
/// time on 1 M rows than 10,000).
const AHEAD: u64 = 10_000;

/// What the rounds made of a pass's differences.
struct Settled {
    /// Rounds run.
    rechecks: u64,
    /// Differences that changed in every round.
    unsettled: u64,
}

/// What a repair wrote.
struct Repaired {
    /// Differing rows replaced by the source's (missing and different ones) or deleted (extra
    /// ones, and rows the source no longer has).
    rows: u64,
    repairs: Vec<Repair>,
    /// Rows the target refused, each with its key and reason.
    problems: Vec<String>,
}

/// The verification of one target table.
pub(super) struct TableCheck {
    pub(super) context: Arc<RunContext>,
    pub(super) read_back: ReadBack,
    pub(super) options: VerifyOptions,
    pub(super) target: TableName,
    pub(super) mappings: Vec<Arc<TableMapping>>,
}

impl TableCheck {
    pub(super) async fn verify(self) -> Result<TableVerdict> {
        let started = Instant::now();
        let mut problems = Vec::new();
        let sides = self.sides(&mut problems).await?;
        let mut pass = self.pass(&sides).await?;
        let settled = self.settle(&sides, &mut pass, &mut problems).await?;
        let mut repaired = None;
        if self.options.repair && !pass.found.is_empty() {
            match self.repair(&sides, &pass.found).await? {
                Ok(mut done) => {
                    problems.append(&mut done.problems);
                    match self.keys_again(&sides, &pass.found).await? {
                        Ok(after) => pass = Pass { found: after.found, unlisted: pass.unlisted, ..pass },
                        Err(problem) => problems.push(problem),
                    }
                    repaired = Some(done);
                }
                Err(problem) => problems.push(problem),
            }
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
            rechecks: settled.rechecks,
            unsettled: settled.unsettled,
            rows_refused: pass.rows_refused,
            repaired: repaired.as_ref().map_or(0, |repaired| repaired.rows),
            repairs: repaired.map(|repaired| repaired.repairs).unwrap_or_default(),
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
        let layout = &sides.layout;
        verdict.differences = pass
            .found
            .iter()
            .take(self.options.max_differences)
            .map(|found| Difference {
                kind: found.kind,
                key: layout.key_json(&found.key),
                columns: layout.column_names(&found.columns),
            })
            .collect();
        Ok(verdict)
    }

    /// The target table read back and how it is compared; a target without the table, or
    /// without some of its columns, is a problem and not an error.
    async fn sides(&self, problems: &mut Vec<String>) -> Result<Sides> {
        let reader = (self.read_back)(&self.mappings[0].target).map_err(|error| error.on(Side::Target))?;
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
        let layout = Arc::new(Layout::of(self.mappings[0].target.clone(), target_schema.as_ref(), problems));
        let own_rows = self.own_rows(target_schema.as_ref());
        Ok(Sides { layout, reader, target_schema: target_schema.map(Arc::new), own_rows })
    }

    /// When the job is one of several sources (`JobSpec::fan_in`), which of the target's rows
    /// are this source's: those whose origin column holds one of its tables' origins. The
    /// other sources' rows are theirs to verify.
    fn own_rows(&self, target_schema: Option<&TableSchema>) -> Option<Arc<OwnRows>> {
        self.context.job.fan_in.as_ref()?;
        let (column, _) = self.mappings[0].origin()?;
        let index = target_schema?.columns.iter().position(|known| known.name.eq_ignore_ascii_case(column))?;
        let origins = self
            .mappings
            .iter()
            .filter_map(|mapping| match mapping.origin() {
                Some((_, Value::Text(origin))) => Some(origin.clone()),
                _ => None,
            })
            .collect();
        Some(Arc::new(OwnRows { index, origins }))
    }

    /// Checks a streaming job's differences again in rounds, each after the stream caught up:
    /// what two rounds find alike is a difference, what changes is checked again, and what
    /// changed in every round is unsettled. Leaves the differences in `pass.found`.
    async fn settle(&self, sides: &Sides, pass: &mut Pass, problems: &mut Vec<String>) -> Result<Settled> {
        let mut settled = Settled { rechecks: 0, unsettled: 0 };
        if !self.context.job.mode.streams() || pass.found.is_empty() {
            return Ok(settled);
        }
        let mut confirmed = Vec::new();
        while settled.rechecks < self.options.rounds as u64 && !pass.found.is_empty() {
            let listed = pass.unlisted == 0;
            let again = match listed {
                true => self.keys_again(sides, &pass.found).await?,
                false => match self.wait_for_stream().await? {
                    Some(problem) => Err(problem),
                    None => Ok(self.pass(sides).await?),
                },
            };
            let mut again = match again {
                Ok(again) => again,
                Err(problem) => {
                    // Not checked again: what was found stands, as the problem says.
                    problems.push(problem);
                    confirmed.append(&mut pass.found);
                    break;
                }
            };
            settled.rechecks += 1;
            let previous = std::mem::take(&mut pass.found);
            pass.unlisted = again.unlisted;
            if !listed {
                // A full pass again: its counts replace the first one's.
                (pass.rows_source, pass.rows_target, pass.chunks) =
                    (again.rows_source, again.rows_target, again.chunks);
            }
            let (alike, changed): (Vec<Found>, Vec<Found>) =
                std::mem::take(&mut again.found).into_iter().partition(|found| previous.contains(found));
            confirmed.extend(alike);
            pass.found = changed;
        }
        settled.unsettled = pass.found.len() as u64;
        pass.found = confirmed;
        pass.found.sort_by(|one, other| (one.kind as u8, &one.key).cmp(&(other.kind as u8, &other.key)));
        Ok(settled)
    }

    /// Writes the source's rows as they are now over the differing ones, through the job's
    /// change writer in one transaction with a checkpoint of its own (`repair/<table>`):
    /// every differing key is deleted, and the source's row of each key it still has is
    /// inserted. `Err` says why the table cannot be repaired.
    async fn repair(&self, sides: &Sides, found: &[Found]) -> Result<std::result::Result<Repaired, String>> {
        let layout = &sides.layout;
        if sides.target_schema.is_none() || !layout.complete() {
            return Ok(Err(format!(
                "not repaired: target table {} lacks columns the job writes; run the job again (it creates them) or \
                 `sluice run --restart`",
                self.target
            )));
        }
        if layout.keyless() {
            return Ok(Err(format!(
                "not repaired: table {} has no primary key, so a row cannot be replaced by key; run the job again \
                 with `sluice run --restart`",
                self.target
            )));
        }
        let context = &self.context;
        let Some(folded) = context.sink.folded_changes() else {
            return Ok(Err(format!(
                "not repaired: a `{}` target cannot delete and replace rows by key (a repair needs a PostgreSQL \
                 or MySQL target); copy the table again with `sluice run --restart`",
                context.job.target.connector
            )));
        };
        let task = format!("repair/{}", self.target);
        let mut writer = match folded.open_folded(&context.job.name, &task).await {
            Ok(writer) => writer,
            Err(error) if error.kind() == ErrorKind::Config => return Ok(Err(format!("not repaired: {error}"))),
            Err(error) => return Err(error),
        };
        let current = self.source_rows(sides, found).await?;
        let written_before = writer.recover().await?.map_or(0, |checkpoint| checkpoint.rows_written);
        let table = layout.mapped.clone();
        let deleted: Vec<Row> = found.iter().map(|found| layout.key_values(&found.key)).collect();
        writer.delete(&table, &deleted, false).await?;
        // The source's row of each differing key it still has, with the difference it repairs.
        let (repaired, rows): (Vec<&Found>, Vec<Row>) =
            found.iter().filter_map(|found| Some((found, current.get(&found.key)?.clone()))).unzip();
        let refused = writer.insert(&table, &rows).await?;
        let checkpoint = Checkpoint {
            task,
            position: None,
            done: true,
            rows_written: written_before + (rows.len() - refused.len()) as u64,
        };
        writer.commit(&checkpoint).await?;
        let problems = refused
            .iter()
            .map(|refusal| {
                let key = serde_json::Value::Object(layout.key_json(&repaired[refusal.index].key));
                format!("not repaired: the target refuses the source's row {key}: {}", refusal.reason)
            })
            .collect();
        let repairs = found
            .iter()
            .take(self.options.max_differences)
            .map(|found| Repair {
                kind: found.kind,
                key: layout.key_json(&found.key),
                before: found.target.as_ref().map(|image| layout.image_json(image)),
                after: current.get(&found.key).map(|row| layout.row_json(row)),
            })
            .collect();
        Ok(Ok(Repaired { rows: (found.len() - refused.len()) as u64, repairs, problems }))
    }

    /// The source's rows of `keys` as the mapping makes them, by key.
    async fn source_rows(&self, sides: &Sides, found: &[Found]) -> Result<HashMap<Vec<Canonical>, Row>> {
        let (rows, mut received) = mpsc::channel::<Result<Vec<Entry>>>(self.context.job.limits.queue_batches.max(2));
        let task = tokio::spawn(self.read_source(sides, Some(Wanted::of(self, sides, found)), true, rows));
        let mut current = HashMap::new();
        let key_columns = sides.layout.key_columns();
        while let Some(entries) = received.recv().await {
            for mut entry in entries? {
                if let Some(values) = entry.values {
                    entry.row.truncate(key_columns);
                    current.insert(entry.row, values);
                }
            }
        }
        joined(task).await?;
        Ok(current)
    }

    /// Reads both sides at once and pairs their rows.
    async fn pass(&self, sides: &Sides) -> Result<Pass> {
        let capacity = self.context.job.limits.queue_batches.max(2);
        let (source_rows, mut from_source) = mpsc::channel::<Result<Vec<Entry>>>(capacity);
        let (target_rows, mut from_target) = mpsc::channel::<Result<Vec<Entry>>>(capacity);
        let source_task = tokio::spawn(self.read_source(sides, None, false, source_rows));
        let target_task = tokio::spawn(self.read_target(sides, None, target_rows));
        let mut comparison = Comparison::new(KEPT_FOR_RECHECK, sides.layout.key_columns());
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
    /// rows first, then (for a job that streams, once the target's stream has reached the
    /// source's position after that read) the target's. `Err` says why the stream could not be
    /// waited for.
    async fn keys_again(&self, sides: &Sides, found: &[Found]) -> Result<std::result::Result<Pass, String>> {
        let wanted = Wanted::of(self, sides, found);
        let mut comparison = Comparison::new(KEPT_FOR_RECHECK, sides.layout.key_columns());
        let (rows, mut received) = mpsc::channel::<Result<Vec<Entry>>>(self.context.job.limits.queue_batches.max(2));
        let source_task = tokio::spawn(self.read_source(sides, Some(wanted.clone()), false, rows));
        while let Some(entries) = received.recv().await {
            comparison.add(Sided::Source, entries?);
        }
        let read = joined(source_task).await?;
        if self.context.job.mode.streams() {
            if let Some(problem) = self.wait_for_stream().await? {
                return Ok(Err(problem));
            }
        }
        let (rows, mut received) = mpsc::channel::<Result<Vec<Entry>>>(self.context.job.limits.queue_batches.max(2));
        let target_task = tokio::spawn(self.read_target(sides, Some(wanted), rows));
        while let Some(entries) = received.recv().await {
            comparison.add(Sided::Target, entries?);
        }
        joined(target_task).await?;
        let (rows_source, rows_target) = comparison.rows();
        let (found, unlisted) = comparison.finish();
        Ok(Ok(Pass { rows_source, rows_target, rows_refused: read.refused, chunks: read.chunks, found, unlisted }))
    }

    /// The source side's reader task; with `values`, each entry keeps its row's values.
    fn read_source(
        &self,
        sides: &Sides,
        keys: Option<Arc<Wanted>>,
        values: bool,
        rows: mpsc::Sender<Result<Vec<Entry>>>,
    ) -> impl std::future::Future<Output = SourceRead> + Send + 'static {
        let reading = SourceReading {
            context: self.context.clone(),
            mappings: self.mappings.clone(),
            layout: sides.layout.clone(),
            keys,
            values,
        };
        read_source(reading, rows)
    }

    /// The target side's reader task; none when the target has no such table.
    fn read_target(
        &self,
        sides: &Sides,
        keys: Option<Arc<Wanted>>,
        rows: mpsc::Sender<Result<Vec<Entry>>>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let limits = (self.context.job.limits.batch_rows, self.context.job.limits.split_rows);
        let (reader, schema, layout) = (sides.reader.clone(), sides.target_schema.clone(), sides.layout.clone());
        let own_rows = sides.own_rows.clone();
        async move {
            if let Some(schema) = schema {
                read_target(limits, reader, schema, layout, own_rows, keys, rows).await;
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
    /// The target rows this job compares, when other sources' rows share the table.
    own_rows: Option<Arc<OwnRows>>,
}

/// The target rows of one of several sources: those whose origin column (at `index` in the
/// table read back) holds one of `origins`.
struct OwnRows {
    index: usize,
    origins: HashSet<String>,
}

impl OwnRows {
    fn holds(&self, row: &Row) -> bool {
        matches!(row.get(self.index), Some(Value::Text(origin)) if self.origins.contains(origin))
    }
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

/// What the source side reads: the source tables mapped into the table, the rows of `keys` only
/// when given, each row's values kept with `values`.
struct SourceReading {
    context: Arc<RunContext>,
    mappings: Vec<Arc<TableMapping>>,
    layout: Arc<Layout>,
    keys: Option<Arc<Wanted>>,
    values: bool,
}

/// The rows a round or a repair reads: their keys, and where they can be read by key (else the
/// tables are read whole and only these keys kept).
struct Wanted {
    keys: HashSet<Vec<Canonical>>,
    /// The source's rows of these keys, per mapping (by its index), when every key traces back
    /// to its source key and the source reads rows by key.
    source: Option<Vec<(usize, Split)>>,
    /// The target's rows of these keys, when the target reads rows by key.
    target: Option<Split>,
}

/// Keys read by key at most; more are read by scanning the tables (a long key list costs more
/// than a scan).
const KEYS_BY_KEY: usize = 10_000;

impl Wanted {
    fn of(check: &TableCheck, sides: &Sides, found: &[Found]) -> Arc<Wanted> {
        let keys: HashSet<Vec<Canonical>> = found.iter().map(|found| found.key.clone()).collect();
        let layout = &sides.layout;
        let by_key = found.len() <= KEYS_BY_KEY && !layout.keyless();
        let snapshot = check.context.source.snapshot();
        let source = by_key.then(|| {
            let snapshot = snapshot?;
            let mut splits = Vec::new();
            for (index, mapping) in check.mappings.iter().enumerate() {
                let source_keys: Option<Vec<Row>> = found
                    .iter()
                    .map(|found| {
                        let key = mapping.source_key(&layout.key_row(&found.key))?;
                        (!key.iter().any(|value| matches!(value, Value::Null))).then_some(key)
                    })
                    .collect();
                splits.push((index, snapshot.key_split(&mapping.source, &source_keys?).ok()?));
            }
            Some(splits)
        });
        let target = by_key.then(|| {
            let schema = sides.target_schema.as_ref()?;
            let target_keys: Option<Vec<Row>> =
                found.iter().map(|found| layout.target_key(schema, &found.key)).collect();
            sides.reader.snapshot()?.key_split(schema, &target_keys?).ok()
        });
        let (source, target) = (source.flatten(), target.flatten());
        let how = |by_key: bool| if by_key { "by key" } else { "by a scan" };
        log::debug!(
            "table {}: {} rows read again, {} at the source, {} in the target",
            check.target,
            keys.len(),
            how(source.is_some()),
            how(target.is_some())
        );
        Arc::new(Wanted { keys, source, target })
    }
}

/// Reads every split of the source tables mapped into the table, passes the rows through their
/// mapping, and sends them as entries.
async fn read_source(reading: SourceReading, rows: mpsc::Sender<Result<Vec<Entry>>>) -> SourceRead {
    let SourceReading { context, mappings, layout, keys, values } = reading;
    let mut read = SourceRead { chunks: 0, refused: 0 };
    let by_key = keys.as_ref().and_then(|wanted| wanted.source.clone());
    let result: Result<()> = async {
        let snapshot = context.source.needs_snapshot()?;
        let hint = SplitHint { rows_per_split: context.job.limits.split_rows };
        for (index, mapping) in mappings.iter().enumerate() {
            let stats = context.stats.table(&mapping.source.name, &mapping.target.name);
            let splits = match &by_key {
                Some(splits) => splits.iter().filter(|(of, _)| *of == index).map(|(_, split)| split.clone()).collect(),
                None => context.with_retry("split the source table", || snapshot.split(&mapping.source, hint)).await?,
            };
            for split in &splits {
                read.chunks += 1;
                let mut reader = snapshot.open(split, None, context.job.limits.batch_rows).await?;
                while let Some(batch) = reader.next().await? {
                    let (batch, refused) = as_written(&context, mapping, batch, &stats);
                    read.refused += refused.len() as u64;
                    let entries = entries_of(batch, keys.as_deref(), layout.key_columns(), |row| {
                        layout.source_entry(row, values)
                    });
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

/// A batch's rows as entries (`entry` makes one of a row): those of `keys` only, when given.
fn entries_of(batch: Batch, keys: Option<&Wanted>, key_columns: usize, entry: impl Fn(Row) -> Entry) -> Vec<Entry> {
    batch
        .changes
        .into_iter()
        .map(|change| entry(change.into_row()))
        .filter(|entry| keys.is_none_or(|wanted| wanted.keys.contains(&entry.row[..key_columns])))
        .collect()
}

/// Reads the target table back, split by split, and sends its rows as entries.
async fn read_target(
    (batch_rows, split_rows): (usize, u64),
    reader: Arc<dyn Source>,
    schema: Arc<TableSchema>,
    layout: Arc<Layout>,
    own_rows: Option<Arc<OwnRows>>,
    keys: Option<Arc<Wanted>>,
    rows: mpsc::Sender<Result<Vec<Entry>>>,
) {
    let result: Result<()> = async {
        let snapshot = reader
            .snapshot()
            .ok_or_else(|| Error::new(ErrorKind::Config, "this target cannot be read back").on(Side::Target))?;
        let splits = match keys.as_ref().and_then(|wanted| wanted.target.clone()) {
            Some(split) => vec![split],
            None => snapshot.split(&schema, SplitHint { rows_per_split: split_rows }).await?,
        };
        for split in &splits {
            let mut split_reader = snapshot.open(split, None, batch_rows).await?;
            while let Some(mut batch) = split_reader.next().await? {
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
                if let Some(own) = &own_rows {
                    batch.changes.retain(|change| own.holds(change.row()));
                }
                let entries = entries_of(batch, keys.as_deref(), layout.key_columns(), |row| layout.target_entry(row));
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
