//! The stream task of `cdc` and `snapshot+cdc` jobs: reads the source's change stream from the
//! position the target holds, folds whole source transactions into groups, and applies each
//! group in one target transaction together with the position after its last transaction.
//!
//! - A group only ever ends at a source commit, so no source transaction is split across two
//!   target transactions, and what the target shows is always a state the source had.
//! - A transaction larger than a batch is applied in pieces inside the same open target
//!   transaction, so memory stays bounded by `limits` whatever its size.
//! - After `snapshot+cdc`'s copy, the changes between the snapshot's start and its end are
//!   replayed (`ApplyMode::Replay`): the copy may hold any of them already. Past that window the
//!   target must match the source exactly (`ApplyMode::Strict`), or the job stops.
//! - Every failure drops the open target transaction and the stream, and the next attempt
//!   resumes from the checkpoint in the target: reconnects always start at a transaction
//!   boundary, and the target, not local state, says where.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::context::RunContext;
use super::copied_keys::CopiedKeys;
use super::{interrupted, Backfill};
use crate::change::{
    key_text, row_json, Batch, Change, ChangeKind, Position, Rejected, RejectedChange, Row, SourceKey,
};
use crate::connector::{
    ChangeShape, ChangeStream, ChangeWriter, Checkpoint, CommitCadence, SchemaChange, Source, SourceSchemaChange,
    Split, StreamEvent, TransactionEnd,
};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::hidden::HiddenCopies;
use crate::names::STREAM_TASK;
use crate::net_changes::{ApplyMode, NetChanges, Refusal};
use crate::retry;
use crate::schema::{TableName, TableSchema};
use crate::stats::{StreamPhase, TableStats};
use crate::transform::TableMapping;
use crate::zero_dates;

/// A group of whole transactions waits at most this long for more before it commits, even while
/// more keep arriving: bounds latency under a steady load that never leaves the channel empty.
const GROUP_LINGER: Duration = Duration::from_millis(50);

/// How often the position is committed when only transactions of other tables go by.
const IDLE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// The stream task's checkpoint: where to resume, and the end of the replay window of a
/// `snapshot+cdc` job (`None` once the job never had one or is past it).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StreamCheckpoint {
    at: Position,
    replay_until: Option<Position>,
    /// Tables created or altered by DDL whose new schema the target does not have yet: it comes
    /// with the table's next rows (their table map), keyed by source table name. Kept in the
    /// checkpoint, so a crash between the DDL and those rows forgets nothing.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pending: BTreeMap<String, PendingSchema>,
    /// The last backfill (`Backfill::id`) the stream took in, so a restart does not go back for
    /// it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backfilled: Option<String>,
    /// While a backfill catches up: only changes of these tables apply until the stream is back
    /// at `until`, where it was when the tables joined (the others have everything before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    catch_up: Option<CatchUp>,
    /// Tables whose copy is still hidden (`crate::hidden`): written under their hidden names,
    /// published in the commit that ends the replay window.
    #[serde(default, skip_serializing_if = "HiddenCopies::is_empty")]
    hidden: HiddenCopies,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CatchUp {
    until: Position,
    tables: Vec<TableName>,
}

/// What a target table still needs once its new schema arrives.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PendingSchema {
    /// Created since: create it.
    create: bool,
    /// Columns renamed (old, new) and changed in type, in statement order.
    renamed: Vec<(String, String)>,
    retyped: Vec<String>,
}

/// A source transaction folded into the open group: when it arrived and when the source
/// committed it, for the latency histogram.
/// How often the stream measures the source's log past its checkpoint.
const BACKLOG_EVERY: Duration = Duration::from_secs(10);

/// Measures the source's log past the stream's checkpoint (`Source::log_backlog`) beside the
/// stream, every `BACKLOG_EVERY`, until dropped.
struct BacklogWatch(tokio::task::JoinHandle<()>);

impl BacklogWatch {
    fn start(source: Arc<dyn crate::connector::Source>, stats: Arc<crate::stats::JobStats>) -> BacklogWatch {
        BacklogWatch(tokio::spawn(async move {
            loop {
                let position = stats.stream.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
                if let Some(position) = position {
                    match source.log_backlog(&position).await {
                        Ok(backlog) => {
                            *stats.stream.log_backlog.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = backlog;
                        }
                        Err(error) => log::debug!("cannot measure the source's log past the checkpoint: {error}"),
                    }
                }
                tokio::time::sleep(BACKLOG_EVERY).await;
            }
        }))
    }
}

impl Drop for BacklogWatch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The events the read-ahead task hands the applier, each with the share of the budget it holds.
type Received = mpsc::UnboundedReceiver<(Result<StreamEvent>, tokio::sync::OwnedSemaphorePermit)>;

struct Arrival {
    received: SystemTime,
    committed_at: u64,
    /// Where its commit is in the source's log: the position of the changes of it left out.
    position: Position,
}

/// Where the stream begins when the target holds no checkpoint yet. A cdc job starts where the
/// job says, else where the source stood when the job was first planned (kept in the plan, so a
/// crash before the first commit loses nothing); snapshot+cdc starts where its snapshot was
/// taken.
pub(super) async fn start_position(
    context: &RunContext,
    after_snapshot: bool,
    planned: Option<Position>,
) -> Result<Position> {
    let start = match (after_snapshot, context.source.start_position().await?) {
        (false, Some(position)) => Some(position),
        _ => planned,
    };
    start.ok_or_else(|| {
        Error::new(ErrorKind::Config, "the source has no change log position to stream from")
            .on(Side::Source)
            .hint("turn on the source's binary log (log_bin) and run the job again")
    })
}

/// The change stream of one run, over its attempts: what the earlier stages handed it, and
/// what one attempt leaves the next.
pub(super) struct StreamStage {
    context: Arc<RunContext>,
    /// Tables added to the running stream and just copied: the stream goes back for them.
    backfill: Option<Backfill>,
    /// Every split of the plan. The stream applies the changes of tables read whole (no key)
    /// only past the source position their copy was read at, and sends an event target only the
    /// changes past the read that copied each key (`copied_keys`).
    splits: Vec<Split>,
    /// The last position of each split this run copied to its end, for targets that keep no
    /// checkpoint (stdout): where the stream finds the copy's reads.
    copied: HashMap<String, Option<Position>>,
    /// The plan's tables whose copy is still hidden (`crate::hidden`), as the target said when
    /// the run began.
    hidden: HiddenCopies,
    /// Source schemas the stream met inside a transaction, for tables whose DDL a target that
    /// commits DDL on its own must apply before that transaction: the next attempt applies them
    /// first.
    reshape_first: Vec<Arc<TableSchema>>,
    /// The changes the stream left out as dirty records this run (table, key, position), so
    /// the summary counts each once.
    counted_left_out: HashSet<String>,
}

impl StreamStage {
    pub(super) fn new(
        context: Arc<RunContext>,
        backfill: Option<Backfill>,
        splits: Vec<Split>,
        copied: HashMap<String, Option<Position>>,
        hidden: HiddenCopies,
    ) -> StreamStage {
        StreamStage {
            context,
            backfill,
            splits,
            copied,
            hidden,
            reshape_first: Vec::new(),
            counted_left_out: HashSet::new(),
        }
    }

    /// Streams changes until stopped. `start` is where the stream begins when the target has no
    /// checkpoint yet; `after_snapshot` says a snapshot was taken from there, so the changes up
    /// to the copy's end are replayed.
    pub(super) async fn stream_changes(&mut self, start: Position, after_snapshot: bool) -> Result<()> {
        let mut attempt = 1;
        loop {
            let mut progressed = false;
            let waiting_schemas = self.reshape_first.len();
            let error = match self.apply_stream(&start, after_snapshot, &mut progressed).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if progressed {
                // A stream that ran for a while before failing starts its count afresh.
                attempt = 1;
            }
            if self.reshape_first.len() > waiting_schemas && !self.context.should_stop() {
                log::info!("change stream: {error}; starting again from the checkpoint to apply it first");
                continue;
            }
            let job = &self.context.job;
            if !retry::is_transient(&error) || attempt >= job.retry.max_attempts || self.context.should_stop() {
                return Err(if error.kind() == ErrorKind::Interrupted {
                    error
                } else {
                    error.context("change stream")
                });
            }
            attempt += 1;
            let wait = retry::backoff(&job.retry, attempt);
            log::warn!("change stream: {error}; attempt {attempt} of {} in {wait:?}", job.retry.max_attempts);
            self.context.pause(wait).await;
        }
    }

    /// One attempt: recover, open the stream, apply until stopped or failed.
    async fn apply_stream(&mut self, start: &Position, after_snapshot: bool, progressed: &mut bool) -> Result<()> {
        let context = &*self.context;
        let mut writer = context.sink.open_changes(&context.job.name, STREAM_TASK).await?;
        // The source's position now: reaching it ends catching up, and, being after the copy's
        // end, it also closes a snapshot's replay window.
        let head = context.source.log_position().await?;
        let (checkpoint, rows_applied) = self.recovered_checkpoint(&mut *writer, start, after_snapshot, &head).await?;
        let stats = &context.stats.stream;
        if stats.phase() != StreamPhase::Streaming {
            let caught_up = head.as_ref().is_none_or(|head| context.source.reached(&checkpoint.at, head));
            stats.set_phase(if caught_up { StreamPhase::Streaming } else { StreamPhase::CatchingUp });
        }
        *stats.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(checkpoint.at.clone());
        log::info!("change stream starts after {}", checkpoint.at.brief());
        let _backlog = BacklogWatch::start(context.source.clone(), context.stats.clone());

        // Read before the stream opens, so a failure here leaves no replica connection behind.
        let copied_at = self.copy_positions().await?;
        let raw = writer.shape() == ChangeShape::Raw;
        let copied_keys =
            if raw && checkpoint.replay_until.is_some() { self.copied_keys().await? } else { CopiedKeys::default() };
        let stream = context.source.stream(&checkpoint.at).await?;
        let (producer, mut received, acks) = self.read_ahead(stream);
        let mut applier = Applier {
            context,
            raw,
            // When the writer wants groups committed, if not as soon as the stream pauses.
            cadence: writer.cadence(),
            events: Vec::new(),
            transaction_events: 0,
            acks,
            writer,
            checkpoint,
            rows_applied,
            head,
            targets: HashMap::new(),
            net: NetChanges::default(),
            arrivals: Vec::new(),
            staged_rows: 0,
            started: Instant::now(),
            opened: Instant::now(),
            moved: false,
            open_transaction: false,
            last_commit: Instant::now(),
            commit_took: Duration::ZERO,
            last_status: None,
            progressed: false,
            reshape_first: std::mem::take(&mut self.reshape_first),
            counted_left_out: std::mem::take(&mut self.counted_left_out),
            copied_at,
            copied_keys,
            dirty_keys: self.dirty_keys(),
            left_out: Vec::new(),
        };
        let outcome = applier.run(&mut received).await;
        *progressed = applier.progressed;
        self.reshape_first = std::mem::take(&mut applier.reshape_first);
        self.counted_left_out = std::mem::take(&mut applier.counted_left_out);
        drop(received);
        producer.abort();
        outcome
    }

    /// The stream's checkpoint as the target holds it, or the first one (from `start`) when it
    /// holds none; moved back for tables a backfill added. With the rows applied so far.
    async fn recovered_checkpoint(
        &self,
        writer: &mut dyn ChangeWriter,
        start: &Position,
        after_snapshot: bool,
        head: &Option<Position>,
    ) -> Result<(StreamCheckpoint, u64)> {
        let corrupt = |error: serde_json::Error| {
            Error::new(ErrorKind::Write, format!("the checkpoint of task {STREAM_TASK} is corrupt: {error}"))
                .on(Side::Target)
                .hint("delete the row of this job from the target's sluice.checkpoints table and start again")
        };
        let (checkpoint, rows_applied) = match writer.recover().await? {
            Some(Checkpoint { position: Some(position), rows_written, .. }) => {
                (serde_json::from_value::<StreamCheckpoint>(position.0).map_err(corrupt)?, rows_written)
            }
            _ => {
                let replay_until = if after_snapshot { head.clone() } else { None };
                let checkpoint = StreamCheckpoint {
                    at: start.clone(),
                    replay_until,
                    pending: BTreeMap::new(),
                    backfilled: None,
                    catch_up: None,
                    hidden: if after_snapshot { self.hidden.clone() } else { HiddenCopies::default() },
                };
                (checkpoint, 0)
            }
        };
        let checkpoint = match &self.backfill {
            Some(backfill) if checkpoint.backfilled.as_deref() != Some(backfill.id.as_str()) => {
                let names: Vec<String> = backfill.tables.iter().map(ToString::to_string).collect();
                // Normally the stream is past `from` and goes back for the added tables alone; a
                // stream still behind `from` simply goes on, every table from where it is.
                let ahead = self.context.source.reached(&checkpoint.at, &backfill.from);
                log::info!(
                    "change stream: {} joined after their copy; their changes since {} are replayed, the other tables resume after {}",
                    names.join(", "),
                    if ahead { &backfill.from.0 } else { &checkpoint.at.0 },
                    checkpoint.at.0
                );
                StreamCheckpoint {
                    at: if ahead { backfill.from.clone() } else { checkpoint.at.clone() },
                    // The copy ended before now: its window closes at the source's head.
                    replay_until: head.clone(),
                    backfilled: Some(backfill.id.clone()),
                    catch_up: ahead.then(|| CatchUp { until: checkpoint.at.clone(), tables: backfill.tables.clone() }),
                    ..checkpoint
                }
            }
            _ => checkpoint,
        };
        Ok((checkpoint, rows_applied))
    }

    /// Reads the stream ahead of the applier in a task of its own, and hands the source back
    /// the positions made durable (sent on the returned sender) between reads.
    ///
    /// The events in flight are bounded by rows, not by count: a transaction's commit costs one
    /// row of the budget, its changes one each, so thousands of small transactions can queue up
    /// for grouping while a huge one still waits for room.
    fn read_ahead(
        &self,
        mut stream: Box<dyn ChangeStream>,
    ) -> (tokio::task::JoinHandle<()>, Received, mpsc::UnboundedSender<Position>) {
        let limits = &self.context.job.limits;
        let budget_rows = (limits.queue_batches.max(1) * limits.batch_rows.max(1)) as u32;
        let budget = Arc::new(tokio::sync::Semaphore::new(budget_rows as usize));
        let (events, received) = mpsc::unbounded_channel::<(Result<StreamEvent>, tokio::sync::OwnedSemaphorePermit)>();
        let (acks, mut acknowledged) = mpsc::unbounded_channel::<Position>();
        let producer = tokio::spawn(async move {
            loop {
                let mut durable = None;
                while let Ok(position) = acknowledged.try_recv() {
                    durable = Some(position);
                }
                let acked = match &durable {
                    Some(position) => stream.ack(position).await,
                    None => Ok(()),
                };
                let event = match acked {
                    Ok(()) => stream.next().await,
                    Err(error) => Err(error),
                };
                let cost = match &event {
                    Ok(StreamEvent::Changes(changes)) => (changes.len() as u32).clamp(1, budget_rows),
                    _ => 1,
                };
                let Ok(permit) = budget.clone().acquire_many_owned(cost).await else { return };
                let failed = event.is_err();
                if events.send((event, permit)).is_err() || failed {
                    return;
                }
            }
        });
        (producer, received, acks)
    }

    /// Where the copy of each table read whole (no key) stood in the source's log, from its
    /// checkpoint in the target: the copy holds exactly the transactions before it, so the
    /// stream skips that table's changes until it gets there (a replay could not recognise
    /// rows without a key).
    async fn copy_positions(&self) -> Result<HashMap<TableName, Position>> {
        let context = &*self.context;
        let splits: Vec<Split> = self.splits.iter().filter(|split| split.whole).cloned().collect();
        let mut positions = HashMap::new();
        for split in splits {
            let mapping = context.mapping(&split.table)?;
            let mut writer =
                context.sink.open(&context.job.name, &split.id, self.hidden.schema(&mapping.target)).await?;
            match writer.recover().await? {
                Some(Checkpoint { done: true, position: Some(position), .. }) => {
                    positions.insert(split.table.name.clone(), position);
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::State,
                        format!("the copy of table {} (read whole: it has no key) is not complete", split.table.name),
                    )
                    .on(Side::Target)
                    .hint("run the job again: the stream starts once every table is copied"))
                }
            }
        }
        Ok(positions)
    }

    /// Where the copy read each key of the tables it copied by key (`copied_keys`), from each
    /// split's last position: as this run copied it, else as the target holds it.
    async fn copied_keys(&self) -> Result<CopiedKeys> {
        let context = &*self.context;
        let splits: Vec<Split> = self.splits.iter().filter(|split| !split.whole).cloned().collect();
        let mut copied = self.copied.clone();
        let missing: Vec<String> =
            splits.iter().filter(|split| !copied.contains_key(&split.id)).map(|split| split.id.clone()).collect();
        if !missing.is_empty() {
            for checkpoint in context.sink.checkpoints(&context.job.name, &missing).await? {
                copied.insert(checkpoint.task, checkpoint.position);
            }
        }
        let mut keys = CopiedKeys::default();
        for split in &splits {
            let position = copied.get(&split.id).cloned().flatten();
            keys.add(split.table.name.clone(), context.source.copy_reads(split, position.as_ref())?);
        }
        let keys = keys.sorted(&*context.source);
        let unknown: Vec<String> = keys.unknown().map(ToString::to_string).collect();
        if !unknown.is_empty() {
            log::warn!(
                "change stream: the source does not say where its copy of {} was read, so their changes since the snapshot's start are all sent: a consumer may see a key's copied row followed by changes older than it",
                unknown.join(", ")
            );
        }
        Ok(keys)
    }

    /// The keys with a dirty record (of the copy or of the stream), by table: the target may
    /// lack their rows, so the stream applies their changes by key (`ApplyMode::Dirty`). A state
    /// store that does not answer (a cluster's etcd down) does not stop the stream: until the
    /// next attempt reads them, only the keys this attempt leaves out apply by key, and a change
    /// of another dirty key that meets a missing row stops the job naming it, as before dirty
    /// keys were kept.
    fn dirty_keys(&self) -> HashMap<TableName, HashSet<String>> {
        let mut keys: HashMap<TableName, HashSet<String>> = HashMap::new();
        match self.context.state.dirty_records(&self.context.job.name) {
            Ok(records) => {
                for record in records {
                    keys.entry(TableName::parse(&record.table)).or_default().insert(record.key);
                }
            }
            Err(error) => log::warn!(
                "change stream: cannot read the job's dirty records ({error}); their keys apply strictly until the next attempt reads them"
            ),
        }
        keys
    }
}

/// A source DDL effect as the target applies it now, with target names; `None` for a
/// created or altered table, whose new schema comes with its next rows (`pending`).
fn target_schema_change(
    context: &RunContext,
    statement: &str,
    change: SourceSchemaChange,
    pending: &mut BTreeMap<String, PendingSchema>,
) -> Result<Option<SchemaChange>> {
    let target = |name: &TableName| context.target_name(name);
    // A table merged with others into one target cannot be dropped, renamed or emptied
    // there without touching the others' rows.
    let shared = |name: &TableName| -> Result<()> {
        let target = target(name);
        if !context.mappings.is_shared(&target) {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Schema,
            format!("unsupported DDL `{statement}` on table {name}, which a route merges with other tables into {target}"),
        )
        .on(Side::Source)
        .hint("apply the statement's effect to the target by hand (e.g. delete the table's rows by its origin column), then restart the job from after it with a cdc start_position"))
    };
    Ok(match change {
        SourceSchemaChange::Create(table) => {
            pending.insert(table.to_string(), PendingSchema { create: true, ..PendingSchema::default() });
            None
        }
        SourceSchemaChange::Alter { table, renamed, retyped } => {
            let entry = pending.entry(table.to_string()).or_default();
            entry.renamed.extend(renamed);
            entry.retyped.extend(retyped);
            None
        }
        SourceSchemaChange::Drop(table) => {
            shared(&table)?;
            pending.remove(&table.to_string());
            Some(SchemaChange::Drop(target(&table)))
        }
        SourceSchemaChange::Rename { from, to } => {
            shared(&from)?;
            shared(&to)?;
            if !context.mappings.same_rules(&from, &to) {
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!("unsupported DDL `{statement}`: tables {from} and {to} fall under different route or transform rules, so the renamed table's rows would change shape (or lose their masks) in the target"),
                )
                .on(Side::Source)
                .hint("make the rules match both names, or apply the rename to the target by hand and restart from after it"));
            }
            if let Some(moved) = pending.remove(&from.to_string()) {
                pending.insert(to.to_string(), moved);
            }
            Some(SchemaChange::Rename { from: target(&from), to: target(&to) })
        }
        SourceSchemaChange::Truncate(table) => {
            shared(&table)?;
            Some(SchemaChange::Truncate(target(&table)))
        }
    })
}

/// Inside the replay window of a `snapshot+cdc` job, changes meet rows the copy may hold;
/// so do the changes of a source that is applied by key always (a stream of change events).
fn apply_mode(source: &dyn Source, checkpoint: &StreamCheckpoint) -> ApplyMode {
    if source.applies_by_key() {
        return ApplyMode::Replay;
    }
    match &checkpoint.replay_until {
        Some(mark) if !source.reached(&checkpoint.at, mark) => ApplyMode::Replay,
        _ => ApplyMode::Strict,
    }
}

/// Applies the zero-date policy to streamed changes: the changes in order as the target gets
/// them, but those the policy refuses (`reject`, or `null` into a NOT NULL column) as they
/// came, and which those are (index, reason), for the stream to leave them out as dirty
/// records.
fn adjust_zero_dates(
    context: &RunContext,
    changes: Vec<Change>,
    source: &TableName,
) -> (Vec<Change>, Vec<(usize, String)>) {
    if context.sink.holds_zero_dates() {
        return (changes, Vec::new());
    }
    let batch = Batch::new(changes, Position(serde_json::Value::Null));
    let Some(outcome) = zero_dates::apply(&batch, context.job.errors.zero_dates, &context.job.target.connector) else {
        return (batch.changes, Vec::new());
    };
    if outcome.nulled > 0 {
        let table = context.stats.table(source, &context.target_name(source));
        TableStats::add(&table.zero_dates_nulled, outcome.nulled);
    }
    let refused: Vec<(usize, String)> =
        outcome.left_out.into_iter().zip(outcome.rejected).map(|(index, rejected)| (index, rejected.reason)).collect();
    let mut kept = outcome.batch.changes.into_iter();
    let adjusted = batch
        .changes
        .into_iter()
        .enumerate()
        .filter_map(
            |(index, change)| {
                if refused.iter().any(|(left_out, _)| *left_out == index) {
                    Some(change)
                } else {
                    kept.next()
                }
            },
        )
        .collect();
    (adjusted, refused)
}

/// The dirty record of a change the stream left out at `position` (its transaction's
/// commit): its table and key in the target, both images and, when the key passes through
/// the transform unchanged from one source table, the source row to read on a replay.
fn stream_record(context: &RunContext, refusal: &Refusal, position: &Position) -> Rejected {
    let table = &refusal.table;
    let sources = context.mappings.merged_into(&table.name);
    let source = match sources.as_slice() {
        [mapping] => mapping.source_key(&refusal.after).map(|key| SourceKey {
            table: mapping.source.name.to_string(),
            key: key
                .iter()
                .map(|value| serde_json::from_str(&crate::json::to_text(value)).unwrap_or_default())
                .collect(),
        }),
        _ => None,
    };
    Rejected {
        table: table.name.to_string(),
        key: key_text(table, &refusal.after),
        reason: refusal.reason.clone(),
        record: Some(row_json(table, &refusal.after)),
        change: Some(RejectedChange {
            position: position.clone(),
            before: refusal.before.as_ref().map(|before| row_json(table, before)),
            source,
        }),
    }
}

/// One attempt's applier: the writer, the checkpoint it moves, and the open group of whole
/// source transactions folded (`net`) or written (`staged_rows`) since the last target commit.
struct Applier<'a> {
    context: &'a RunContext,
    /// The writer takes raw row events (`ChangeShape::Raw`), not folds.
    raw: bool,
    /// When the writer wants groups committed, if not as soon as the stream pauses.
    cadence: Option<CommitCadence>,
    /// Raw row events of the open transaction not yet handed to the writer.
    events: Vec<Change>,
    /// Raw row events of the open transaction so far.
    transaction_events: u64,
    /// Positions made durable, for the source (`ChangeStream::ack`).
    acks: mpsc::UnboundedSender<Position>,
    writer: Box<dyn ChangeWriter>,
    checkpoint: StreamCheckpoint,
    /// Rows applied by the stream over all runs, as the checkpoint counts them.
    rows_applied: u64,
    /// The source's position when the attempt began: reaching it ends catching up.
    head: Option<Position>,
    /// Source table → its mapping to the target, for the source schema it was made for.
    targets: HashMap<TableName, (Arc<TableSchema>, Arc<TableMapping>)>,
    net: NetChanges,
    /// The source transactions in the group, for the latency histogram.
    arrivals: Vec<Arrival>,
    /// Changes of the group already written into the open target transaction.
    staged_rows: u64,
    /// When the group's first transaction arrived, or with a cadence, when it was committed at
    /// the source (to a second).
    started: Instant,
    /// When the applier took the group's first transaction.
    opened: Instant,
    /// The position moved past transactions of other tables since the last commit.
    moved: bool,
    /// A source transaction's changes are folded or written, its commit not seen yet.
    open_transaction: bool,
    last_commit: Instant,
    /// How long the last commit of a group took, from writing its changes to its commit.
    commit_took: Duration,
    /// When the stream's status was last saved in the state store.
    last_status: Option<Instant>,
    /// A group committed in this attempt.
    progressed: bool,
    /// Source schemas to apply before anything else (from the last attempt), and those met
    /// inside a transaction that end this one (for the next).
    reshape_first: Vec<Arc<TableSchema>>,
    /// The changes left out as dirty records this run (table, key, position), so the summary
    /// counts each once.
    counted_left_out: HashSet<String>,
    /// Tables read whole by the copy (no key) whose copy position the stream has not reached:
    /// their changes are in the copy.
    copied_at: HashMap<TableName, Position>,
    /// For an event target, where the copy read each key: the changes a copied row holds are
    /// left out.
    copied_keys: CopiedKeys,
    /// Keys with a dirty record, by target table: their changes apply by key.
    dirty_keys: HashMap<TableName, HashSet<String>>,
    /// Changes of the group left out (a value the target cannot hold), recorded as dirty
    /// records when the group commits.
    left_out: Vec<Refusal>,
}

/// The mapping of a source table to its target (cached per source schema).
fn mapping_of(
    targets: &mut HashMap<TableName, (Arc<TableSchema>, Arc<TableMapping>)>,
    context: &RunContext,
    table: &Arc<TableSchema>,
) -> Result<Arc<TableMapping>> {
    match targets.get(&table.name) {
        Some((source, mapping)) if Arc::ptr_eq(source, table) => Ok(mapping.clone()),
        _ => {
            let mapping = context.mapping(table)?;
            targets.insert(table.name.clone(), (table.clone(), mapping.clone()));
            Ok(mapping)
        }
    }
}

impl Applier<'_> {
    /// Applies the stream's events until stopped or failed: whole source transactions are
    /// grouped, and a group commits when nothing more waits, when it is full, or when it has
    /// lingered long enough.
    async fn run(&mut self, received: &mut Received) -> Result<()> {
        let context = self.context;
        let mut stop = context.stop.clone();
        let mut abort = context.abort.subscribe();
        let first = std::mem::take(&mut self.reshape_first);
        if !first.is_empty() {
            self.reshape(first).await?;
            self.commit().await?;
        } else if self.publishes() {
            // The window closed before this start (an idle source, or a crash between
            // MySQL's commit and its rename): publish before anything else.
            self.commit().await?;
        }
        let cadence = self.cadence;
        let batch = context.job.mode == crate::spec::Mode::Cdc && context.job.batched();
        loop {
            // A batch of a scheduled `cdc` job ends once everything up to where the source
            // stood at its start is committed.
            if batch
                && self.idle()
                && self.head.as_ref().is_some_and(|head| context.source.reached(&self.checkpoint.at, head))
            {
                log::info!("change stream: caught up with where the source stood at the batch's start; the batch ends");
                return Ok(());
            }
            let deadline = self.deadline();
            let event = tokio::select! {
                // The permit goes back on receipt: the budget bounds what waits in the channel.
                event = received.recv() => event.map(|(event, _permit)| Some(event)),
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now).into()), if deadline.is_some() => Some(None),
                _ = stop.wait_for(|stopped| *stopped) => None,
                _ = abort.wait_for(|aborted| *aborted) => None,
            };
            let Some(event) = event else {
                // Stopping: what is whole commits; an open transaction's pieces are dropped
                // with the target transaction.
                if !self.open_transaction && (!self.arrivals.is_empty() || self.moved) {
                    self.commit().await?;
                }
                return Err(interrupted());
            };
            match event.transpose()? {
                // The group waited long enough (with a cadence: if it is due).
                None => {
                    if cadence.is_none_or(|cadence| self.due(cadence, received.is_empty())) {
                        self.commit().await?;
                    }
                    continue;
                }
                Some(StreamEvent::Changes(changes)) => self.changes(changes).await?,
                Some(StreamEvent::Commit { position, committed_at }) => {
                    self.transaction_end(position, committed_at).await?
                }
                Some(StreamEvent::SchemaChange { statement, changes, position, committed_at }) => {
                    self.schema_change(&statement, changes, position, committed_at).await?
                }
                Some(StreamEvent::Advance { position, committed_at }) => self.advance(position, committed_at),
            }
            // Whole transactions commit as soon as nothing more is waiting (the events in
            // flight are bounded by rows, so under a backlog plenty wait and groups grow), or
            // when the group is full; the deadline above caps how long they linger.
            let group_rows = cadence.map_or(context.job.limits.batch_rows as u64, |cadence| cadence.rows);
            let full = self.staged_rows + self.pending() as u64 >= group_rows;
            let ready = match cadence {
                None => received.is_empty(),
                Some(cadence) => self.due(cadence, received.is_empty()),
            };
            if !self.open_transaction && !self.arrivals.is_empty() && (full || ready) {
                self.commit().await?;
            }
        }
    }

    /// Nothing is open, waiting or moved since the last commit.
    fn idle(&self) -> bool {
        !self.open_transaction && self.arrivals.is_empty() && !self.moved
    }

    /// Until when the applier waits for the next event before it commits what it holds: whole
    /// transactions wait a moment for more, and the position alone commits at most once a
    /// second. `None` while a transaction is open or nothing waits.
    fn deadline(&self) -> Option<Instant> {
        if self.open_transaction {
            None
        } else if !self.arrivals.is_empty() {
            Some(match self.cadence {
                None => self.started + GROUP_LINGER,
                // When the group is due by its first transaction's source commit, else (a
                // backlog, where that is long past) by how long it has been open.
                Some(cadence) => Some(self.due_at(cadence))
                    .filter(|due| *due > Instant::now())
                    .unwrap_or(self.opened + cadence.every),
            })
        } else if self.moved {
            let every =
                self.cadence.map_or(IDLE_CHECKPOINT_INTERVAL, |cadence| cadence.every.max(IDLE_CHECKPOINT_INTERVAL));
            Some(self.last_commit + every)
        } else {
            None
        }
    }

    /// Whether a group of a writer with a cadence commits now: due by its first transaction's
    /// source commit once the stream has caught up (nothing more waits and the group's last
    /// transaction is younger than the cadence), or open for the cadence's time whatever waits.
    /// While a backlog is read, a pause of the reader does not commit, so groups fill up to the
    /// cadence's rows instead of committing a few rows at a time.
    fn due(&self, cadence: CommitCadence, paused: bool) -> bool {
        let now = Instant::now();
        let caught_up = self.arrivals.last().is_some_and(|last| {
            let committed = UNIX_EPOCH + Duration::from_secs(last.committed_at);
            SystemTime::now().duration_since(committed).unwrap_or_default() <= cadence.every
        });
        (paused && caught_up && now >= self.due_at(cadence)) || now >= self.opened + cadence.every
    }

    /// When a caught-up group commits: early enough that, if it takes as long as the last
    /// commit did (a merge rewrites files), its first transaction is visible in the target one
    /// cadence after its source commit.
    fn due_at(&self, cadence: CommitCadence) -> Instant {
        self.started + cadence.every.saturating_sub(self.commit_took)
    }

    /// Changes taken in and not yet written into the open target transaction.
    fn pending(&self) -> usize {
        if self.raw {
            self.events.len()
        } else {
            self.net.len()
        }
    }

    /// Writes the folded changes (or the raw events) into the open target transaction.
    async fn write_folded(&mut self) -> Result<()> {
        if self.raw {
            if !self.events.is_empty() {
                self.writer.events(&self.events).await?;
                self.staged_rows += self.events.len() as u64;
                self.events.clear();
            }
            return Ok(());
        }
        // The folded changes carry their target tables already.
        let Applier { writer, net, staged_rows, checkpoint, .. } = self;
        let applied = net.apply(&mut **writer, &mut |table| checkpoint.hidden.schema(table)).await?;
        *staged_rows += applied.changes as u64;
        for refusal in applied.refused {
            self.mark_dirty(&refusal.table, &refusal.after);
            self.left_out.push(refusal);
        }
        Ok(())
    }

    /// Row changes of the open source transaction. A table with a pending schema gets it first.
    async fn changes(&mut self, mut changes: Vec<Change>) -> Result<()> {
        if !self.copied_at.is_empty() {
            // This transaction starts at `at`: before a copy's position, that copy holds it.
            let (source, at) = (&self.context.source, &self.checkpoint.at);
            self.copied_at.retain(|_, copy| !source.reached(at, copy));
            changes.retain(|change| !self.copied_at.contains_key(&change.table.name));
            if changes.is_empty() {
                return Ok(());
            }
        }
        if !self.copied_keys.is_empty() {
            changes = self.copied_keys.leave_out(&*self.context.source, &self.checkpoint.at, changes);
            if changes.is_empty() {
                return Ok(());
            }
        }
        if let Some(catch_up) = &self.checkpoint.catch_up {
            // The other tables have these changes already.
            changes.retain(|change| catch_up.tables.contains(&change.table.name));
            if changes.is_empty() {
                return Ok(());
            }
        }
        let mut reshaped: Vec<Arc<TableSchema>> = Vec::new();
        for change in &changes {
            if self.checkpoint.pending.contains_key(&change.table.name.to_string())
                && !reshaped.iter().any(|known| known.name == change.table.name)
            {
                reshaped.push(change.table.clone());
            }
        }
        if !reshaped.is_empty() {
            // The target takes the new schema after the rows before these: whole transactions
            // commit first when they can, so a target whose DDL commits on its own (MySQL) never
            // commits rows without their checkpoint.
            if self.open_transaction && self.writer.ddl_commits() {
                // Inside a source transaction whose earlier rows the open target transaction
                // holds: MySQL's DDL would commit them without their checkpoint. This attempt
                // ends here (its target transaction rolls back), and the next one gives the
                // tables their new schema before anything else, at the checkpoint's boundary.
                let names: Vec<String> = reshaped.iter().map(|table| table.name.to_string()).collect();
                self.reshape_first.extend(reshaped);
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("the new schema of {} comes inside a transaction", names.join(", ")),
                )
                .on(Side::Target));
            }
            if !self.open_transaction && !self.arrivals.is_empty() {
                self.commit().await?;
            } else {
                self.write_folded().await?;
            }
            self.reshape(reshaped).await?;
        }
        self.open_transaction = true;
        let mode = apply_mode(&*self.context.source, &self.checkpoint);
        let first_source = changes.first().map(|change| change.table.clone());
        let mut mapped = Vec::with_capacity(changes.len());
        let mut filtered = 0u64;
        for change in changes {
            let mapping = mapping_of(&mut self.targets, self.context, &change.table)?;
            match mapping.change(change)? {
                Some(change) => mapped.push(change),
                None => filtered += 1,
            }
        }
        if filtered > 0 {
            self.context.stats.stream.changes_filtered.fetch_add(filtered, std::sync::atomic::Ordering::Relaxed);
        }
        // The zero-date policy judges what reaches the target: a column the projection leaves
        // out, or a row the filter does, cannot fail it.
        if let Some(source) = first_source {
            self.take_in(mapped, &source.name, mode)?;
        }
        // A large transaction goes to the target in pieces, inside the one target transaction
        // that its commit will end.
        if self.pending() >= self.context.job.limits.batch_rows {
            self.write_folded().await?;
        }
        Ok(())
    }

    /// Takes in mapped changes of the open transaction, in order: judged by the zero-date
    /// policy, folded (a key with a dirty record by key) or kept as raw events; a change the
    /// policy refuses is left out.
    fn take_in(&mut self, mapped: Vec<Change>, source: &TableName, mode: ApplyMode) -> Result<()> {
        let (adjusted, refused) = adjust_zero_dates(self.context, mapped, source);
        let mut refused = refused.into_iter().peekable();
        for (index, Change { table, kind }) in adjusted.into_iter().enumerate() {
            let refusal = refused.next_if(|(left_out, _)| *left_out == index).map(|(_, reason)| reason);
            let kind = match (refusal, kind) {
                (Some(reason), ChangeKind::Insert { after }) => {
                    self.leave_out(table, None, after, reason)?;
                    continue;
                }
                (Some(reason), ChangeKind::Update { before, after }) => {
                    self.leave_out(table, Some(before), after, reason)?;
                    continue;
                }
                // The policy judges new images only: a delete is never refused.
                (_, kind) => kind,
            };
            let change = Change { table, kind };
            if self.raw {
                self.transaction_events += 1;
                self.events.push(change);
            } else {
                let mode = self.mode_of(&change, mode);
                self.net.add(change, mode)?;
            }
        }
        Ok(())
    }

    /// `Dirty` for a change of a key with a dirty record, else `mode`.
    fn mode_of(&self, change: &Change, mode: ApplyMode) -> ApplyMode {
        let Some(keys) = self.dirty_keys.get(&change.table.name) else { return mode };
        let dirty = |row: &Row| keys.contains(&key_text(&change.table, row));
        let touched = match &change.kind {
            ChangeKind::Update { before, after } => dirty(before) || dirty(after),
            ChangeKind::Insert { after } => dirty(after),
            ChangeKind::Delete { before } => dirty(before),
        };
        if touched {
            ApplyMode::Dirty
        } else {
            mode
        }
    }

    /// Marks the key of `row` dirty: the target lacks its row from now on.
    fn mark_dirty(&mut self, table: &TableSchema, row: &Row) {
        self.dirty_keys.entry(table.name.clone()).or_default().insert(key_text(table, row));
    }

    /// Leaves out a change (`before` → `after`) whose new image the target cannot hold, as the
    /// target leaves out a row it refuses: a folded group removes the key's row (by key), and
    /// the change is recorded as a dirty record when the group commits. Its key is dirty from
    /// now on.
    fn leave_out(&mut self, table: Arc<TableSchema>, before: Option<Row>, after: Row, reason: String) -> Result<()> {
        self.mark_dirty(&table, &after);
        if !self.raw {
            // The row goes; so does the old key of an update that moved it, as the source says.
            let gone = before.clone().unwrap_or_else(|| after.clone());
            let moved = key_text(&table, &gone) != key_text(&table, &after);
            self.net
                .add(Change { table: table.clone(), kind: ChangeKind::Delete { before: gone } }, ApplyMode::Dirty)?;
            if moved {
                let delete = ChangeKind::Delete { before: after.clone() };
                self.net.add(Change { table: table.clone(), kind: delete }, ApplyMode::Dirty)?;
            }
        }
        self.left_out.push(Refusal { table, before, after, transaction: self.arrivals.len(), reason });
        Ok(())
    }

    /// Keeps the changes the group left out as dirty records, before the commit that moves past
    /// them; past the job's budget the group does not commit and the stream stops.
    fn keep_left_out(&mut self) -> Result<()> {
        self.net.end_group();
        if self.left_out.is_empty() {
            return Ok(());
        }
        let records: Vec<Rejected> = std::mem::take(&mut self.left_out)
            .iter()
            .map(|refusal| {
                let arrival = self.arrivals.get(refusal.transaction).or(self.arrivals.last());
                stream_record(self.context, refusal, arrival.map_or(&self.checkpoint.at, |arrival| &arrival.position))
            })
            .collect();
        self.count_left_out(&records);
        self.context.keep_dirty(STREAM_TASK, &records)
    }

    /// Counts the changes the stream left out, each once per run (a group applied again after a
    /// failed commit leaves the same ones out).
    fn count_left_out(&mut self, records: &[Rejected]) {
        let counted = &mut self.counted_left_out;
        let new = records
            .iter()
            .filter(|record| {
                let position = record.change.as_ref().map(|change| change.position.0.to_string()).unwrap_or_default();
                counted.insert(format!("{}\n{}\n{position}", record.table, record.key))
            })
            .count();
        self.context.stats.stream.dirty_records.fetch_add(new as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Gives each target table whose source table changed by DDL (`pending`) the schema its
    /// first rows since then carry (`tables`, source schemas from their table maps), as the
    /// source describes it (`Source::describe_logged`): the table a snapshot would create. Its
    /// rows keep the mapping of the schema they were decoded with.
    async fn reshape(&mut self, tables: Vec<Arc<TableSchema>>) -> Result<()> {
        for table in tables {
            let Some(pending) = self.checkpoint.pending.remove(&table.name.to_string()) else { continue };
            let described =
                self.context.source.describe_logged(&table).await.map_err(|error| {
                    error.context(format_args!("describing the new schema of table {}", table.name))
                })?;
            let mapping = self.context.mapping(&Arc::new(described))?;
            let target = mapping.target.clone();
            let change = if pending.create {
                SchemaChange::Create((*target).clone())
            } else {
                // A projection may have renamed or left out the columns the DDL names.
                let kept = |name: &String| target.columns.iter().any(|column| &column.name == name);
                let renamed = pending.renamed.into_iter().filter(|(_, new)| kept(new)).collect();
                let retyped = pending.retyped.iter().filter_map(|name| mapping.target_column(name)).collect();
                SchemaChange::Alter { table: (*target).clone(), renamed, retyped }
            };
            let change = self.checkpoint.hidden.follow(change);
            self.writer
                .apply_schema_change(&change)
                .await
                .map_err(|error| error.context(format_args!("table {}", target.name)))?;
            crate::failpoint::hit("stream.schema.applied");
            log::info!("target table {} has the source's new schema", target.name);
        }
        Ok(())
    }

    /// The open source transaction committed at `position`.
    async fn transaction_end(&mut self, position: Position, committed_at: u64) -> Result<()> {
        if self.raw {
            self.write_folded().await?;
            let end = TransactionEnd {
                id: position.0.to_string(),
                committed_at,
                position: position.clone(),
                events: std::mem::take(&mut self.transaction_events),
                replay: apply_mode(&*self.context.source, &self.checkpoint) == ApplyMode::Replay,
            };
            self.writer.transaction_end(&end).await?;
        }
        if self.arrivals.is_empty() {
            self.opened = Instant::now();
        }
        if self.arrivals.is_empty() && self.cadence.is_none() {
            self.started = Instant::now();
        } else if self.arrivals.is_empty() {
            // With a cadence of seconds, the group's clock starts when its first transaction was
            // committed at the source, not when the applier got to it: a transaction that waited
            // behind the last commit has used up that much of the group's time already (whole
            // seconds: it may start up to a second early, never late).
            let waited = SystemTime::now()
                .duration_since(UNIX_EPOCH + Duration::from_secs(committed_at))
                .unwrap_or_default()
                .min(Duration::from_secs(3_600));
            self.started = Instant::now().checked_sub(waited).unwrap_or_else(Instant::now);
        }
        self.arrivals.push(Arrival { received: SystemTime::now(), committed_at, position: position.clone() });
        self.net.end_transaction();
        self.checkpoint.at = position;
        self.open_transaction = false;
        self.end_catch_up();
        Ok(())
    }

    /// Ends a backfill's catch-up once the stream is back where it was when the tables joined.
    fn end_catch_up(&mut self) {
        if self
            .checkpoint
            .catch_up
            .as_ref()
            .is_some_and(|catch_up| self.context.source.reached(&self.checkpoint.at, &catch_up.until))
        {
            log::info!("change stream: the added tables caught up; every table streams again");
            self.checkpoint.catch_up = None;
        }
    }

    /// Transactions of other tables, a rotation or a heartbeat.
    fn advance(&mut self, position: Position, committed_at: u64) {
        self.checkpoint.at = position;
        self.moved = true;
        self.end_catch_up();
        if self.arrivals.is_empty() && !self.open_transaction {
            // A heartbeat (no commit time) says the source had nothing more up to now.
            let through = if committed_at == 0 { crate::clock::unix_seconds() } else { committed_at };
            self.context.stats.stream.fresh_through(through);
        }
    }

    /// A DDL statement: a transaction of its own, after the group before it.
    async fn schema_change(
        &mut self,
        statement: &str,
        changes: Vec<SourceSchemaChange>,
        position: Position,
        committed_at: u64,
    ) -> Result<()> {
        if let Some(catch_up) = &self.checkpoint.catch_up {
            // The tables the stream had took this DDL already; an added table's copy may or may
            // not hold its effect, so it cannot be replayed safely.
            let added =
                changes.iter().flat_map(SourceSchemaChange::tables).find(|table| catch_up.tables.contains(table));
            if let Some(table) = added {
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!(
                        "unsupported DDL `{statement}` on table {table} while it was being added to the job ({})",
                        position.0
                    ),
                )
                .on(Side::Source)
                .hint("drop the added table in the target and add it again once no DDL runs on it"));
            }
            self.advance(position, committed_at);
            return Ok(());
        }
        if !self.copied_at.is_empty() {
            // DDL on a table read whole, before its copy's position: the copy holds its effect.
            let (source, at) = (&self.context.source, &self.checkpoint.at);
            self.copied_at.retain(|_, copy| !source.reached(at, copy));
            let copied = &self.copied_at;
            if let Some(table) =
                changes.iter().flat_map(SourceSchemaChange::tables).find(|table| copied.contains_key(*table))
            {
                if changes.iter().all(|change| matches!(change, SourceSchemaChange::Truncate(_))) {
                    self.advance(position, committed_at);
                    return Ok(());
                }
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!(
                        "DDL `{statement}` on table {table}, which has no key, came before the position its copy was read at ({}): the copy already holds its effect, and the stream cannot tell that table's rows apart to apply it again",
                        position.0
                    ),
                )
                .on(Side::Source)
                .hint("run the job with --restart, so the table is copied anew after the DDL"));
            }
        }
        if !self.arrivals.is_empty() || self.moved {
            self.commit().await?;
        }
        for change in changes {
            let Some(change) = target_schema_change(self.context, statement, change, &mut self.checkpoint.pending)?
            else {
                continue;
            };
            let change = self.checkpoint.hidden.follow(change);
            self.writer.apply_schema_change(&change).await.map_err(|error| {
                error.context(format_args!("applying `{statement}` ({position})", position = position.0))
            })?;
            crate::failpoint::hit("stream.ddl.applied");
        }
        log::info!("applied DDL to the target: {statement}");
        self.context.stats.stream.schema_changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.transaction_end(position, committed_at).await?;
        self.commit().await
    }

    /// Writes what is folded and commits the open target transaction with the stream's
    /// checkpoint; updates the counters: rows, transactions, lag, latency and phase.
    /// Whether the replay window is passed while copies are still hidden: the next commit
    /// publishes them.
    fn publishes(&self) -> bool {
        let checkpoint = &self.checkpoint;
        !checkpoint.hidden.is_empty()
            && checkpoint.replay_until.as_ref().is_none_or(|mark| self.context.source.reached(&checkpoint.at, mark))
    }

    /// Commits the group with the checkpoint. The commit that ends the replay window also
    /// publishes the hidden copies: in its transaction, or, where DDL commits on its own, right
    /// after it (the checkpoint says they are still hidden until a second commit says they are
    /// not, so a crash in between publishes them on the next start).
    async fn commit(&mut self) -> Result<()> {
        let began = Instant::now();
        self.write_folded().await?;
        crate::failpoint::hit("stream.group.written");
        self.keep_left_out()?;
        self.rows_applied += self.staged_rows;
        let context = self.context;
        // Past the replay window, the window is forgotten, so a later reader of the
        // checkpoint need not know the source's position order.
        let mut stored = self.checkpoint.clone();
        if stored.replay_until.as_ref().is_some_and(|mark| context.source.reached(&stored.at, mark)) {
            stored.replay_until = None;
        }
        let publish = self.publishes().then(|| stored.hidden.pairs());
        if let Some(tables) = publish.as_ref().filter(|_| !self.writer.ddl_commits()) {
            self.writer.publish(tables).await?;
            stored.hidden = HiddenCopies::default();
        }
        self.write_checkpoint(&stored).await?;
        if let Some(tables) = publish {
            if !stored.hidden.is_empty() {
                self.writer.publish(&tables).await?;
                crate::failpoint::hit("stream.publish.renamed");
                stored.hidden = HiddenCopies::default();
                self.write_checkpoint(&stored).await?;
            }
            self.checkpoint.hidden = HiddenCopies::default();
            let names: Vec<String> = tables.iter().map(|(_, own)| own.to_string()).collect();
            log::info!(
                "the copies of {} are published: the stream passed the copy's end ({})",
                names.join(", "),
                stored.at.0
            );
        }
        let checkpoint = &self.checkpoint;
        // The producer is gone only when the attempt ends; the position is acknowledged then by
        // the next attempt's first commit.
        let _ = self.acks.send(checkpoint.at.clone());

        let stats = &context.stats.stream;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        stats.rows_applied.fetch_add(self.staged_rows, relaxed);
        stats.transactions_applied.fetch_add(self.arrivals.len() as u64, relaxed);
        *stats.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(checkpoint.at.clone());
        let now = SystemTime::now();
        for arrival in &self.arrivals {
            // The source's commit time has whole seconds: the commit happened within the second
            // after it, and no later than its arrival here.
            let second = UNIX_EPOCH + Duration::from_secs(arrival.committed_at);
            let committed = arrival.received.clamp(second, second + Duration::from_secs(1));
            stats.record_latency(now.duration_since(committed).unwrap_or_default(), 1);
        }
        if let Some(last) = self.arrivals.last() {
            stats.fresh_through(last.committed_at);
        }
        if stats.phase() == StreamPhase::CatchingUp
            && self.head.as_ref().is_none_or(|head| context.source.reached(&checkpoint.at, head))
        {
            log::info!("change stream caught up with the source; streaming");
            stats.set_phase(StreamPhase::Streaming);
        }
        self.arrivals.clear();
        self.staged_rows = 0;
        self.moved = false;
        self.last_commit = Instant::now();
        self.commit_took = began.elapsed();
        self.progressed = true;
        if self.last_status.is_none_or(|saved| saved.elapsed() >= Duration::from_secs(1)) {
            context.state.save_stream_status(&context.job.name, &stats.summary())?;
            self.last_status = Some(Instant::now());
        }
        Ok(())
    }

    /// Commits the open transaction with `stored` as the stream's checkpoint, and keeps a copy
    /// in the state store.
    async fn write_checkpoint(&mut self, stored: &StreamCheckpoint) -> Result<()> {
        let position = Position(serde_json::to_value(stored).expect("positions serialize"));
        let record = Checkpoint {
            task: STREAM_TASK.to_owned(),
            position: Some(position),
            done: false,
            rows_written: self.rows_applied,
        };
        self.writer.commit(&record).await?;
        crate::failpoint::hit("stream.group.committed");
        self.context.state.save_checkpoint(&self.context.job.name, &record)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use serde_json::json;
    use tokio::sync::watch;

    use super::*;
    use crate::change::{ChangeKind, Row};
    use crate::connector::{ChangeStream, CheckItem, Reader, Sink, Source, Split, SplitHint, Writer};
    use crate::runner::Runner;
    use crate::schema::{Column, DataType};
    use crate::spec::parse_job;
    use crate::state::{MemoryStateStore, StateStore};
    use crate::value::Value;

    fn table() -> Arc<TableSchema> {
        Arc::new(TableSchema {
            name: TableName::parse("d.t"),
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                Column::new("v", DataType::Integer { bytes: 8, unsigned: false }, false),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        })
    }

    fn row(id: i64, v: i64) -> Row {
        vec![Value::Int(id), Value::Int(v)]
    }

    fn position(at: u64) -> Position {
        Position(json!(at))
    }

    /// A source whose change log is a script of events, then heartbeats; it records acks.
    struct ScriptedSource {
        script: Vec<StreamEvent>,
        acks: Arc<Mutex<Vec<Position>>>,
    }

    struct ScriptedStream {
        script: std::collections::VecDeque<StreamEvent>,
        last: Position,
        acks: Arc<Mutex<Vec<Position>>>,
    }

    #[async_trait]
    impl ChangeStream for ScriptedStream {
        async fn next(&mut self) -> Result<StreamEvent> {
            if let Some(event) = self.script.pop_front() {
                if let StreamEvent::Commit { position, .. } = &event {
                    self.last = position.clone();
                }
                return Ok(event);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(StreamEvent::Advance { position: self.last.clone(), committed_at: 0 })
        }

        async fn ack(&mut self, position: &Position) -> Result<()> {
            self.acks.lock().unwrap().push(position.clone());
            Ok(())
        }
    }

    #[async_trait]
    impl Source for ScriptedSource {
        async fn check(&self) -> Result<Vec<CheckItem>> {
            Ok(Vec::new())
        }
        async fn log_position(&self) -> Result<Option<Position>> {
            Ok(Some(position(0)))
        }
        async fn discover(&self) -> Result<Vec<TableSchema>> {
            Ok(vec![(*table()).clone()])
        }
        async fn split(&self, _table: &Arc<TableSchema>, _hint: SplitHint) -> Result<Vec<Split>> {
            Ok(Vec::new())
        }
        async fn open(&self, _split: &Split, _after: Option<&Position>, _rows: usize) -> Result<Box<dyn Reader>> {
            unreachable!("a cdc job copies nothing")
        }
        async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
            let start = after.0.as_u64().unwrap();
            let script = self
                .script
                .iter()
                .filter(|event| match event {
                    StreamEvent::Commit { position, .. } => position.0.as_u64().unwrap() > start,
                    _ => true,
                })
                .cloned()
                .collect();
            Ok(Box::new(ScriptedStream { script, last: after.clone(), acks: self.acks.clone() }))
        }
        fn reached(&self, position: &Position, mark: &Position) -> bool {
            position.0.as_u64() >= mark.0.as_u64()
        }
    }

    /// What a raw sink saw: row events and transaction ends in order, and its commits.
    #[derive(Debug, Clone, PartialEq)]
    enum Seen {
        Insert(Row),
        Update(Row, Row),
        Delete(Row),
        End { events: u64, position: Position },
        Commit(u64),
    }

    #[derive(Default)]
    struct RawTarget {
        durable: Mutex<(Vec<Seen>, Option<Checkpoint>)>,
    }

    struct RawSink(Arc<RawTarget>);

    #[async_trait]
    impl Sink for RawSink {
        async fn check(&self) -> Result<Vec<CheckItem>> {
            Ok(Vec::new())
        }
        fn target_name(&self, source: &TableName) -> TableName {
            source.clone()
        }
        fn create_statements(&self, _tables: &[TableSchema]) -> Vec<String> {
            Vec::new()
        }
        async fn prepare(&self, _tables: &[TableSchema]) -> Result<()> {
            Ok(())
        }
        async fn reset(&self, _job: &str, _tables: &[crate::connector::TableTasks]) -> Result<()> {
            Ok(())
        }
        async fn open(&self, _job: &str, _task: &str, _table: Arc<TableSchema>) -> Result<Box<dyn Writer>> {
            unreachable!("a cdc job copies nothing")
        }
        async fn open_changes(&self, _job: &str, _task: &str) -> Result<Box<dyn ChangeWriter>> {
            Ok(Box::new(RawWriter { target: self.0.clone(), staged: Vec::new() }))
        }
    }

    struct RawWriter {
        target: Arc<RawTarget>,
        staged: Vec<Seen>,
    }

    #[async_trait]
    impl ChangeWriter for RawWriter {
        fn shape(&self) -> ChangeShape {
            ChangeShape::Raw
        }
        async fn recover(&mut self) -> Result<Option<Checkpoint>> {
            Ok(self.target.durable.lock().unwrap().1.clone())
        }
        async fn delete(&mut self, _table: &TableSchema, _keys: &[Row], _expect_all: bool) -> Result<()> {
            unreachable!("a raw writer gets events, not folds")
        }
        async fn insert(&mut self, _table: &TableSchema, _rows: &[Row]) -> Result<Vec<crate::connector::Refused>> {
            unreachable!("a raw writer gets events, not folds")
        }
        async fn events(&mut self, changes: &[Change]) -> Result<()> {
            for change in changes {
                self.staged.push(match &change.kind {
                    ChangeKind::Insert { after } => Seen::Insert(after.clone()),
                    ChangeKind::Update { before, after } => Seen::Update(before.clone(), after.clone()),
                    ChangeKind::Delete { before } => Seen::Delete(before.clone()),
                });
            }
            Ok(())
        }
        async fn transaction_end(&mut self, end: &TransactionEnd) -> Result<()> {
            self.staged.push(Seen::End { events: end.events, position: end.position.clone() });
            Ok(())
        }
        async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
            let mut durable = self.target.durable.lock().unwrap();
            durable.0.append(&mut self.staged);
            durable.0.push(Seen::Commit(checkpoint.rows_written));
            durable.1 = Some(checkpoint.clone());
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_raw_sink_gets_every_event_in_order_with_transaction_ends_and_the_source_its_acks() {
        let change = |kind| Change { table: table(), kind };
        let script = vec![
            StreamEvent::Changes(vec![
                change(ChangeKind::Insert { after: row(1, 10) }),
                change(ChangeKind::Insert { after: row(2, 20) }),
            ]),
            StreamEvent::Commit { position: position(1), committed_at: 0 },
            // One transaction in two pieces: the update and the delete of the same keys are
            // not folded away.
            StreamEvent::Changes(vec![change(ChangeKind::Update { before: row(1, 10), after: row(1, 11) })]),
            StreamEvent::Changes(vec![change(ChangeKind::Delete { before: row(2, 20) })]),
            StreamEvent::Commit { position: position(2), committed_at: 0 },
        ];
        let acks = Arc::new(Mutex::new(Vec::new()));
        let source = Arc::new(ScriptedSource { script, acks: acks.clone() });
        let target = Arc::new(RawTarget::default());
        let job = Arc::new(
            parse_job("name: raw\nmode: cdc\nsource: {type: memory}\ntarget: {type: memory}\n", false, |_| None)
                .unwrap(),
        );
        let (stop, stopped) = watch::channel(false);
        let runner = Arc::new(Runner::new(
            job,
            source,
            Arc::new(RawSink(target.clone())),
            Arc::new(MemoryStateStore::default()),
            stopped,
        ));
        let run = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run().await }
        });
        // Until the source hears that its second transaction is durable.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !acks.lock().unwrap().contains(&position(2)) {
            assert!(Instant::now() < deadline, "no ack of the last transaction: {:?}", acks.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send_replace(true);
        let (summary, error) = run.await.unwrap();
        assert_eq!(error.map(|error| error.kind()), Some(ErrorKind::Interrupted), "{summary:?}");
        let seen: Vec<Seen> =
            target.durable.lock().unwrap().0.iter().filter(|seen| !matches!(seen, Seen::Commit(_))).cloned().collect();
        assert_eq!(
            seen,
            vec![
                Seen::Insert(row(1, 10)),
                Seen::Insert(row(2, 20)),
                Seen::End { events: 2, position: position(1) },
                Seen::Update(row(1, 10), row(1, 11)),
                Seen::Delete(row(2, 20)),
                Seen::End { events: 2, position: position(2) },
            ]
        );
        let checkpoint = target.durable.lock().unwrap().1.clone().expect("a checkpoint");
        assert_eq!(checkpoint.rows_written, 4);
        // Acks only ever name positions already durable, in order.
        let acked = acks.lock().unwrap().clone();
        assert!(acked.windows(2).all(|pair| pair[0].0.as_u64() <= pair[1].0.as_u64()), "{acked:?}");
    }

    /// A change whose new row the target cannot hold (a zero date under `zero_dates: reject`)
    /// is left out and kept as a dirty record, with its transaction's commit position and both
    /// images, before the commit that moves past it; the changes around it, and the later one of
    /// the same row, go on to the target, and the run counts it.
    #[tokio::test]
    async fn a_change_the_target_cannot_hold_is_left_out_as_a_dirty_record_and_the_stream_goes_on() {
        let dated = Arc::new(TableSchema {
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                Column::new("d", DataType::Date, true),
            ],
            ..(*table()).clone()
        });
        let change = |kind| Change { table: dated.clone(), kind };
        let day = |day: u8| vec![Value::Int(1), Value::Date(crate::value::Date { year: 2024, month: 1, day })];
        let zero = vec![Value::Int(1), Value::Date(crate::value::Date { year: 0, month: 0, day: 0 })];
        let other = vec![Value::Int(2), Value::Null];
        let script = vec![
            StreamEvent::Changes(vec![change(ChangeKind::Insert { after: day(1) })]),
            StreamEvent::Commit { position: position(1), committed_at: 0 },
            StreamEvent::Changes(vec![
                change(ChangeKind::Update { before: day(1), after: zero.clone() }),
                change(ChangeKind::Insert { after: other.clone() }),
            ]),
            StreamEvent::Commit { position: position(2), committed_at: 0 },
            StreamEvent::Changes(vec![change(ChangeKind::Update { before: zero.clone(), after: day(3) })]),
            StreamEvent::Commit { position: position(3), committed_at: 0 },
        ];
        let acks = Arc::new(Mutex::new(Vec::new()));
        let source = Arc::new(ScriptedSource { script, acks: acks.clone() });
        let target = Arc::new(RawTarget::default());
        let text =
            "name: raw\nmode: cdc\nsource: {type: memory}\ntarget: {type: memory}\nerrors: {max_dirty_records: 1}\n";
        let job = Arc::new(parse_job(text, false, |_| None).unwrap());
        let state = Arc::new(MemoryStateStore::default());
        let (stop, stopped) = watch::channel(false);
        let runner = Arc::new(Runner::new(job, source, Arc::new(RawSink(target.clone())), state.clone(), stopped));
        let run = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run().await }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !acks.lock().unwrap().contains(&position(3)) {
            assert!(Instant::now() < deadline, "no ack of the last transaction: {:?}", acks.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.send_replace(true);
        let (summary, _) = run.await.unwrap();
        assert_eq!(summary.stream.as_ref().map(|stream| stream.dirty_records), Some(1), "{summary:?}");
        let seen: Vec<Seen> = target
            .durable
            .lock()
            .unwrap()
            .0
            .iter()
            .filter(|seen| matches!(seen, Seen::Insert(_) | Seen::Update(..)))
            .cloned()
            .collect();
        assert_eq!(seen, vec![Seen::Insert(day(1)), Seen::Insert(other), Seen::Update(zero, day(3))]);
        let records = state.dirty_records("raw").unwrap();
        let [record] = records.as_slice() else { panic!("{records:?}") };
        assert_eq!((record.table.as_str(), record.key.as_str()), ("d.t", "id=1"));
        assert!(record.reason.contains("column d: zero date '0000-00-00'"), "{}", record.reason);
        assert_eq!(record.record.as_deref(), Some(r#"{"id": 1, "d": "0000-00-00"}"#));
        let change = record.change.as_ref().expect("a change of the stream");
        assert_eq!(change.position, position(2), "its transaction's commit");
        assert_eq!(change.before.as_deref(), Some(r#"{"id": 1, "d": "2024-01-01"}"#));
        assert_eq!(change.source, Some(SourceKey { table: "d.t".into(), key: vec![json!(1)] }));
    }
}
