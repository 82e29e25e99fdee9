//! One attempt's applier: takes the events the read-ahead task hands it, folds whole source
//! transactions into groups (or keeps them as raw events for an event target), leaves out
//! what the target cannot hold as dirty records, applies DDL, and commits each group in one
//! target transaction with the stream's checkpoint.
//!
//! It owns the open group and the checkpoint it moves; it does not open the stream, recover the
//! checkpoint or retry: the stream stage does, and starts a new applier for each attempt.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use super::{PendingSchema, Received, StreamCheckpoint};
use crate::change::{
    key_text, row_json, Batch, Change, ChangeKind, Position, Rejected, RejectedChange, Row, SourceKey,
};
use crate::connector::{
    AnyChangeWriter, ChangeSource, Checkpoint, CommitCadence, FoldedChangeWriter, SchemaChange, SourceSchemaChange,
    StreamEvent, TransactionEnd,
};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::hidden::HiddenCopies;
use crate::names::STREAM_TASK;
use crate::net_changes::{has_unchanged, unchanged_lost, ApplyMode, Conflict, NetChanges, Refusal, Winner};
use crate::runner::context::RunContext;
use crate::runner::copied_keys::CopiedKeys;
use crate::runner::interrupted;
use crate::schema::{TableName, TableSchema};
use crate::spec::{ConflictPolicy, SchemaChanges};
use crate::stats::{StreamPhase, TableStats};
use crate::transform::TableMapping;
use crate::zero_dates;

mod lanes;
pub(super) mod resync;

use lanes::Lanes;

/// A group of whole transactions waits at most this long for more before it commits, even while
/// more keep arriving: bounds latency under a steady load that never leaves the channel empty.
const GROUP_LINGER: Duration = Duration::from_millis(50);

/// How often the position is committed when only transactions of other tables go by.
const IDLE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Echoes (`StreamEvent::Echo`) that make a commit of their own when nothing else does.
const ECHOES_PER_CHECKPOINT: u64 = 1_000;

/// A source transaction folded into the open group: when it arrived and when the source
/// committed it, for the latency histogram.
struct Arrival {
    received: SystemTime,
    committed_at: u64,
    /// Where its commit is in the source's log: the position of the changes of it left out.
    position: Position,
}

/// What one attempt starts its applier with.
pub(super) struct AttemptStart {
    pub(super) writer: AnyChangeWriter,
    /// Positions made durable, for the source (`ChangeStream::ack`).
    pub(super) acks: mpsc::UnboundedSender<Position>,
    pub(super) checkpoint: StreamCheckpoint,
    /// Rows applied by the stream over all runs, as the checkpoint counts them.
    pub(super) rows_applied: u64,
    /// The source's position when the attempt began: reaching it ends catching up.
    pub(super) head: Option<Position>,
    /// Tables read whole by the copy (no key), with their copy's position.
    pub(super) copied_at: HashMap<TableName, Position>,
    /// For an event target, where the copy read each key.
    pub(super) copied_keys: CopiedKeys,
    /// Keys with a dirty record, by target table.
    pub(super) dirty_keys: HashMap<TableName, HashSet<String>>,
    /// Resync requests made while the stream runs.
    pub(super) resync_requests: Option<tokio::sync::watch::Receiver<Option<resync::ResyncRequest>>>,
    pub(super) carried: Carried,
    /// The writers of the other lanes (`apply_parallelism`), opened for this attempt.
    pub(super) lanes: Vec<Box<dyn FoldedChangeWriter>>,
}

/// What one attempt of the stream hands the next.
#[derive(Default)]
pub(super) struct Carried {
    /// Source schemas the stream met inside a transaction, for tables whose DDL a target that
    /// commits DDL on its own must apply before that transaction: the next attempt applies them
    /// first.
    pub(super) reshape_first: Vec<Arc<TableSchema>>,
    /// The changes the stream left out as dirty records this run (table, key, position), so
    /// the summary counts each once.
    pub(super) counted_left_out: HashSet<String>,
    /// An attempt failed while lanes ran: the next one applies on one connection until it is
    /// past this position (the group that failed), then opens its lanes again.
    pub(super) serial_until: Option<Position>,
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
fn apply_mode(source: &dyn ChangeSource, checkpoint: &StreamCheckpoint) -> ApplyMode {
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

/// The dirty record of a conflict (`conflict:`): the target's row, the change's two images,
/// and which row the policy kept.
fn conflict_record(
    context: &RunContext,
    conflict: &Conflict,
    policy: &ConflictPolicy,
    position: &Position,
) -> Rejected {
    let table = &conflict.table;
    let shown = |row: Option<&Row>| row.map_or_else(|| "no row".to_owned(), |row| row_json(table, row));
    let kept = match conflict.winner {
        Winner::Source => "the source's row went in",
        Winner::Target => "the target's row stays",
    };
    let row = conflict.some_row();
    let refusal = Refusal {
        table: table.clone(),
        before: conflict.expected.clone(),
        after: row.clone(),
        transaction: conflict.transaction,
        reason: format!(
            "conflict ({policy}): the target held {} where the change expected {}; {kept}",
            shown(conflict.target.as_ref()),
            shown(conflict.expected.as_ref())
        ),
    };
    let mut record = stream_record(context, &refusal, position);
    record.record = conflict.source.as_ref().map(|source| row_json(table, source));
    record
}

/// One attempt's applier: the writer, the checkpoint it moves, and the open group of whole
/// source transactions folded (`net`) or written (`staged_rows`) since the last target commit.
pub(super) struct Applier<'a> {
    context: &'a RunContext,
    /// The writer takes row events (`AnyChangeWriter::Events`), not folds.
    raw: bool,
    /// When the writer wants groups committed, if not as soon as the stream pauses.
    cadence: Option<CommitCadence>,
    /// Raw row events of the open transaction not yet handed to the writer.
    events: Vec<Change>,
    /// Raw row events of the open transaction so far.
    transaction_events: u64,
    /// Positions made durable, for the source (`ChangeStream::ack`).
    acks: mpsc::UnboundedSender<Position>,
    writer: AnyChangeWriter,
    /// The source's change log.
    changes: &'a dyn ChangeSource,
    checkpoint: StreamCheckpoint,
    /// Rows applied by the stream over all runs, as the checkpoint counts them.
    rows_applied: u64,
    /// The source's position when the attempt began: reaching it ends catching up.
    head: Option<Position>,
    /// Source table → its mapping to the target, for the source schema it was made for.
    targets: HashMap<TableName, (Arc<TableSchema>, Arc<TableMapping>)>,
    /// Under `schema_changes: ignore`, the source tables whose target's columns this attempt
    /// has read.
    columns_read: HashSet<TableName>,
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
    /// Echoes passed over since the last commit.
    echoes: u64,
    /// A source transaction's changes are folded or written, its commit not seen yet.
    open_transaction: bool,
    last_commit: Instant,
    /// How long the last commit of a group took, from writing its changes to its commit.
    commit_took: Duration,
    /// When the stream's status was last saved in the state store.
    last_status: Option<Instant>,
    /// A group committed in this attempt.
    progressed: bool,
    /// What the last attempt handed this one, and what this one hands the next.
    carried: Carried,
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
    /// The conflicts the open group settled (`conflict:`), kept as dirty records when it commits.
    conflicts: Vec<Conflict>,
    /// What this attempt knows of a resync's copy beyond the checkpoint (`resync`).
    resync_frontier: Option<resync::Frontier>,
    /// Resync requests made while the stream runs.
    resync_requests: Option<tokio::sync::watch::Receiver<Option<resync::ResyncRequest>>>,
    /// A group committed since the resync's last step: the resync may take the next one even
    /// while events wait.
    resync_turn: bool,
    /// Groups written and committed by other connections while the applier folds the next.
    lanes: Lanes,
    /// The keys the open group writes (`lanes::change_keys`), for the groups after it; `None`
    /// past `lanes::GROUP_KEYS` (taken as every key).
    group_keys: Option<Vec<u64>>,
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

impl<'a> Applier<'a> {
    pub(super) fn new(context: &'a RunContext, changes: &'a dyn ChangeSource, start: AttemptStart) -> Applier<'a> {
        let AttemptStart {
            writer,
            acks,
            checkpoint,
            rows_applied,
            head,
            copied_at,
            copied_keys,
            dirty_keys,
            resync_requests,
            carried,
            lanes,
        } = start;
        Applier {
            context,
            raw: matches!(writer, AnyChangeWriter::Events(_)),
            // When the writer wants groups committed, if not as soon as the stream pauses.
            cadence: writer.cadence(),
            events: Vec::new(),
            transaction_events: 0,
            acks,
            writer,
            changes,
            checkpoint,
            rows_applied,
            head,
            targets: HashMap::new(),
            columns_read: HashSet::new(),
            resync_frontier: None,
            resync_requests,
            resync_turn: false,
            net: NetChanges::default(),
            arrivals: Vec::new(),
            staged_rows: 0,
            started: Instant::now(),
            opened: Instant::now(),
            moved: false,
            echoes: 0,
            open_transaction: false,
            last_commit: Instant::now(),
            commit_took: Duration::ZERO,
            last_status: None,
            progressed: false,
            carried,
            copied_at,
            copied_keys,
            dirty_keys,
            left_out: Vec::new(),
            conflicts: Vec::new(),
            lanes: Lanes::new(lanes),
            group_keys: Some(Vec::new()),
        }
    }

    /// Whether a group committed in this attempt.
    pub(super) fn progressed(&self) -> bool {
        self.progressed
    }

    /// What this attempt hands the next.
    pub(super) fn take_carried(&mut self) -> Carried {
        std::mem::take(&mut self.carried)
    }
}

impl Applier<'_> {
    /// Applies the stream's events until stopped or failed: whole source transactions are
    /// grouped, and a group commits when nothing more waits, when it is full, or when it has
    /// lingered long enough.
    pub(super) async fn run(&mut self, received: &mut Received) -> Result<()> {
        let outcome = self.apply_events(received).await;
        if outcome.is_err() && self.lanes.open() {
            self.carried.serial_until = Some(self.checkpoint.at.clone());
        }
        let settled = self.settle().await;
        outcome.and(settled)
    }

    /// `run`'s loop; groups still in lanes when it returns are the caller's to settle.
    async fn apply_events(&mut self, received: &mut Received) -> Result<()> {
        let context = self.context;
        let mut stop = context.stop.clone();
        let mut abort = context.abort.subscribe();
        let first = std::mem::take(&mut self.carried.reshape_first);
        if !first.is_empty() {
            self.reshape(first).await?;
            self.commit().await?;
        } else if self.publishes() {
            // The window closed before this start (an idle source, or a crash between
            // MySQL's commit and its rename): publish before anything else.
            self.commit().await?;
        }
        self.resume_resync().await?;
        let cadence = self.cadence;
        let batch = context.job.mode == crate::spec::Mode::Cdc && context.job.batched();
        let stop_at = self.changes.stop_position();
        loop {
            // `source.stop_position`: the transaction that reached it ended the last event; it
            // commits with its group, and nothing after it is applied.
            if let Some(mark) = stop_at.as_ref().filter(|mark| self.changes.reached(&self.checkpoint.at, mark)) {
                if !self.open_transaction {
                    if !self.arrivals.is_empty() || self.moved {
                        self.commit().await?;
                    }
                    log::info!("change stream: reached source.stop_position {}; the job ends", mark.0);
                    return Ok(());
                }
            }
            // A batch of a scheduled `cdc` job ends once everything up to where the source
            // stood at its start is committed.
            if batch
                && self.idle()
                && self.head.as_ref().is_some_and(|head| self.changes.reached(&self.checkpoint.at, head))
            {
                log::info!("change stream: caught up with where the source stood at the batch's start; the batch ends");
                return Ok(());
            }
            // A resync asked now is taken in between groups; it copies a chunk between groups:
            // after each group, or whenever nothing waits.
            if self.idle() {
                self.take_resync_request().await?;
            }
            if self.resync_due() && (self.resync_turn || received.is_empty()) {
                self.resync_step().await?;
                self.resync_turn = false;
            }
            while self.lanes.front_finished() {
                self.reap().await?;
            }
            let resync_next = self.resync_due() && (self.resync_turn || received.is_empty());
            let deadline = if resync_next { Some(Instant::now()) } else { self.deadline() };
            let in_flight = self.lanes.in_flight();
            let mut landed = false;
            let event = tokio::select! {
                // The permit goes back on receipt: the budget bounds what waits in the channel.
                event = received.recv() => event.map(|(event, _permit)| Some(event)),
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now).into()), if deadline.is_some() => Some(None),
                // A lane's group landed: counted now, not at the next event.
                _ = self.lanes.front_landed(), if in_flight => {
                    landed = true;
                    Some(None)
                }
                _ = stop.wait_for(|stopped| *stopped) => None,
                _ = abort.wait_for(|aborted| *aborted) => None,
            };
            if landed {
                continue;
            }
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
                    if !self.idle() && cadence.is_none_or(|cadence| self.due(cadence, received.is_empty())) {
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
                Some(StreamEvent::Echo { position, committed_at }) => self.echo(position, committed_at),
                Some(StreamEvent::End { position, committed_at }) => {
                    self.advance(position, committed_at);
                    self.commit().await?;
                    log::info!(
                        "change stream: reached source.stop_position (the next transaction is dated {}, at or after its time); the job ends",
                        crate::clock::rfc3339(committed_at)
                    );
                    return Ok(());
                }
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
        let Applier { context, writer, net, events, staged_rows, checkpoint, conflicts, .. } = self;
        let writer = match writer {
            AnyChangeWriter::Events(writer) => {
                if !events.is_empty() {
                    writer.events(events).await?;
                    *staged_rows += events.len() as u64;
                    events.clear();
                }
                return Ok(());
            }
            AnyChangeWriter::Folded(writer) => writer,
        };
        // The folded changes carry their target tables already.
        let mut target = |table: &Arc<TableSchema>| checkpoint.hidden.schema(table);
        if let Some(policy) = &context.job.conflict {
            conflicts.extend(net.settle_conflicts(&mut **writer, &mut target, policy).await?);
        }
        let applied = net.apply(&mut **writer, &mut target).await?;
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
            let (source, at) = (self.changes, &self.checkpoint.at);
            self.copied_at.retain(|_, copy| !source.reached(at, copy));
            changes.retain(|change| !self.copied_at.contains_key(&change.table.name));
            if changes.is_empty() {
                return Ok(());
            }
        }
        if !self.copied_keys.is_empty() {
            changes = self.copied_keys.leave_out(self.changes, &self.checkpoint.at, changes);
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
                self.carried.reshape_first.extend(reshaped);
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
        if self.context.job.schema_changes == SchemaChanges::Ignore {
            self.keep_target_columns(&changes).await?;
        }
        self.open_transaction = true;
        let mode = apply_mode(self.changes, &self.checkpoint);
        let first_source = changes.first().map(|change| change.table.clone());
        let resynced = self.resync_changes(&changes)?;
        let mut mapped = Vec::with_capacity(changes.len());
        let mut filtered = 0u64;
        for change in changes {
            let mapping = mapping_of(&mut self.targets, self.context, &change.table)?;
            match mapping.change(change)? {
                Some(change) => mapped.push(change),
                None => filtered += 1,
            }
        }
        let mut copied = Vec::with_capacity(resynced.len());
        for change in resynced {
            copied.extend(self.resync_mapping(&change.table)?.change(change)?);
        }
        if filtered > 0 {
            self.context.stats.stream.changes_filtered.fetch_add(filtered, std::sync::atomic::Ordering::Relaxed);
        }
        self.wait_for_lanes(mapped.iter().chain(&copied)).await?;
        // The zero-date policy judges what reaches the target: a column the projection leaves
        // out, or a row the filter does, cannot fail it.
        if let Some(source) = first_source {
            self.take_in(mapped, &source.name, mode)?;
            // A resync's copy takes its changes as a replay: a key its last read found gone may
            // still see its deletion, and taking it in twice changes nothing.
            if !copied.is_empty() {
                self.take_in(copied, &source.name, ApplyMode::Replay)?;
            }
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
                if let ChangeKind::Update { after, .. } = &change.kind {
                    if has_unchanged(after) {
                        return Err(unchanged_lost(&change.table, after, "an event carries every value of its row"));
                    }
                }
                self.transaction_events += 1;
                self.events.push(change);
            } else {
                let mode =
                    if self.resyncing(&change.table.name) { ApplyMode::Replay } else { self.mode_of(&change, mode) };
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
        self.keep_conflicts()?;
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

    /// Keeps the conflicts the group settled as dirty records with both rows. They were settled
    /// by the job's policy, so they count apart from `errors.max_dirty_records`.
    fn keep_conflicts(&mut self) -> Result<()> {
        if self.conflicts.is_empty() {
            return Ok(());
        }
        let policy = self.context.job.conflict.clone().unwrap_or_default();
        let records: Vec<Rejected> = std::mem::take(&mut self.conflicts)
            .iter()
            .map(|conflict| {
                let arrival = self.arrivals.get(conflict.transaction).or(self.arrivals.last());
                let position = arrival.map_or(&self.checkpoint.at, |arrival| &arrival.position);
                conflict_record(self.context, conflict, &policy, position)
            })
            .collect();
        let new = self.count_once(&records);
        self.context.stats.stream.conflicts.fetch_add(new, std::sync::atomic::Ordering::Relaxed);
        self.context.keep_conflicts(STREAM_TASK, &records)
    }

    /// Counts the changes the stream left out, each once per run (a group applied again after a
    /// failed commit leaves the same ones out).
    fn count_left_out(&mut self, records: &[Rejected]) {
        let new = self.count_once(records);
        self.context.stats.stream.dirty_records.fetch_add(new, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many of `records` this run has not counted before (by table, key and position).
    fn count_once(&mut self, records: &[Rejected]) -> u64 {
        let counted = &mut self.carried.counted_left_out;
        records
            .iter()
            .filter(|record| {
                let position = record.change.as_ref().map(|change| change.position.0.to_string()).unwrap_or_default();
                counted.insert(format!("{}\n{}\n{position}", record.table, record.key))
            })
            .count() as u64
    }

    /// `schema_changes: ignore`: the first rows of each table in an attempt read which columns
    /// its target table has, so that its rows reach it with those alone, whatever columns the
    /// source added since (a target without a table definition answers nothing and takes rows
    /// as they are).
    async fn keep_target_columns(&mut self, changes: &[Change]) -> Result<()> {
        let context = self.context;
        for change in changes {
            let source = &change.table.name;
            if !self.columns_read.insert(source.clone()) {
                continue;
            }
            let target = context.target_name(source);
            let columns = context
                .with_retry(&format!("read the columns of target table {target}"), || {
                    context.sink.table_columns(&target)
                })
                .await?;
            if let Some(columns) = columns.filter(|columns| !columns.is_empty()) {
                self.targets.retain(|_, (_, mapping)| mapping.target.name != target);
                context.mappings.keep_columns(target, columns);
            }
        }
        Ok(())
    }

    /// Gives each target table whose source table changed by DDL (`pending`) the schema its
    /// first rows since then carry (`tables`, source schemas from their table maps), as the
    /// source describes it (`ChangeSource::describe_logged`): the table a snapshot would create. Its
    /// rows keep the mapping of the schema they were decoded with.
    async fn reshape(&mut self, tables: Vec<Arc<TableSchema>>) -> Result<()> {
        self.drain().await?;
        for table in tables {
            let Some(pending) = self.checkpoint.pending.remove(&table.name.to_string()) else { continue };
            let described =
                self.changes.describe_logged(&table).await.map_err(|error| {
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
                .common()
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
                replay: apply_mode(self.changes, &self.checkpoint) == ApplyMode::Replay,
            };
            if let AnyChangeWriter::Events(writer) = &mut self.writer {
                writer.transaction_end(&end).await?;
            }
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
            .is_some_and(|catch_up| self.changes.reached(&self.checkpoint.at, &catch_up.until))
        {
            log::info!("change stream: the added tables caught up; every table streams again");
            self.checkpoint.catch_up = None;
        }
    }

    /// Transactions of other tables, a rotation or a heartbeat.
    fn advance(&mut self, position: Position, committed_at: u64) {
        // A heartbeat where the stream already stands moves nothing once the attempt committed
        // and streams: an idle stream does not write its checkpoint again and again (the first
        // commit keeps where a new job starts; while it catches up, the commit is what says it
        // caught up).
        self.moved |= self.checkpoint.at != position
            || !self.progressed
            || self.context.stats.stream.phase() == StreamPhase::CatchingUp;
        self.checkpoint.at = position;
        self.end_catch_up();
        if self.arrivals.is_empty() && !self.open_transaction {
            // A heartbeat (no commit time) says the source had nothing more up to now.
            let through = if committed_at == 0 { crate::clock::unix_seconds() } else { committed_at };
            self.context.stats.stream.fresh_through(through);
        }
    }

    /// A transaction the other job of a two-way pair wrote into the source: the position
    /// moves on, but only every `ECHOES_PER_CHECKPOINT` of them make a commit of their own.
    /// Each checkpoint this job writes is a transaction the other job passes over in turn, so a
    /// commit per echo would bounce between the two servers forever; this way a pair at rest
    /// settles, and the checkpoint still follows a long run of the other side's writes.
    fn echo(&mut self, position: Position, committed_at: u64) {
        let moved = self.moved;
        self.advance(position, committed_at);
        self.echoes += 1;
        self.context.stats.stream.echoes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.moved = moved || self.echoes >= ECHOES_PER_CHECKPOINT;
    }

    /// A DDL statement: a transaction of its own, after the group before it.
    async fn schema_change(
        &mut self,
        statement: &str,
        changes: Vec<SourceSchemaChange>,
        position: Position,
        committed_at: u64,
    ) -> Result<()> {
        self.drain().await?;
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
            let (source, at) = (self.changes, &self.checkpoint.at);
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
            // The DDL goes on the applier's connection after the group, wherever it went.
            self.drain().await?;
        }
        let touched: Vec<&TableName> = changes.iter().flat_map(SourceSchemaChange::tables).collect();
        self.abandon_resync(statement, &touched).await?;
        if self.context.job.schema_changes == SchemaChanges::Stop {
            let tables: Vec<String> =
                changes.iter().flat_map(SourceSchemaChange::tables).map(ToString::to_string).collect();
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "DDL `{statement}` on {} at {}: the job says schema_changes: stop, so the stream stops before it \
                     (everything before it is applied)",
                    tables.join(", "),
                    position.0
                ),
            )
            .on(Side::Source)
            .hint("to go on, apply the statement's effect to the target yourself (a job starts only against a target with the source's columns), then set schema_changes: carry: the stream takes the statement (its effect is there) and what follows it"));
        }
        let (changes, passed_over): (Vec<_>, Vec<_>) = changes.into_iter().partition(|change| {
            self.context.job.schema_changes != SchemaChanges::Ignore
                || matches!(change, SourceSchemaChange::Create(_) | SourceSchemaChange::Rename { .. })
        });
        if !passed_over.is_empty() {
            let tables: Vec<String> =
                passed_over.iter().flat_map(SourceSchemaChange::tables).map(ToString::to_string).collect();
            log::warn!(
                "DDL `{statement}` on {} is not carried to the target (schema_changes: ignore): the target keeps its columns and rows",
                tables.join(", ")
            );
            self.context.stats.stream.schema_changes_ignored.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if changes.is_empty() {
                self.advance(position, committed_at);
                return Ok(());
            }
        }
        for change in changes {
            let Some(change) = target_schema_change(self.context, statement, change, &mut self.checkpoint.pending)?
            else {
                continue;
            };
            let change = self.checkpoint.hidden.follow(change);
            self.writer.common().apply_schema_change(&change).await.map_err(|error| {
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
            && checkpoint.replay_until.as_ref().is_none_or(|mark| self.changes.reached(&checkpoint.at, mark))
    }

    /// Commits the group with the checkpoint. The commit that ends the replay window also
    /// publishes the hidden copies: in its transaction, or, where DDL commits on its own, right
    /// after it (the checkpoint says they are still hidden until a second commit says they are
    /// not, so a crash in between publishes them on the next start).
    async fn commit(&mut self) -> Result<()> {
        if self.lane_takes_group() {
            return self.hand_over().await;
        }
        self.drain().await?;
        let began = Instant::now();
        self.write_folded().await?;
        crate::failpoint::hit("stream.group.written");
        self.keep_left_out()?;
        self.rows_applied += self.staged_rows;
        // Past the replay window, the window is forgotten, so a later reader of the
        // checkpoint need not know the source's position order.
        let mut stored = self.checkpoint.clone();
        if stored.replay_until.as_ref().is_some_and(|mark| self.changes.reached(&stored.at, mark)) {
            stored.replay_until = None;
        }
        let publish = self.publishes().then(|| stored.hidden.pairs());
        if let Some(tables) = publish.as_ref().filter(|_| !self.writer.ddl_commits()) {
            self.writer.folded()?.publish(tables).await?;
            stored.hidden = HiddenCopies::default();
        }
        self.write_checkpoint(&stored).await?;
        if let Some(tables) = publish {
            if !stored.hidden.is_empty() {
                self.writer.folded()?.publish(&tables).await?;
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
        let arrivals = std::mem::take(&mut self.arrivals);
        let at = self.checkpoint.at.clone();
        self.committed(&at, &arrivals, self.staged_rows)?;
        self.staged_rows = 0;
        self.moved = false;
        self.echoes = 0;
        self.last_commit = Instant::now();
        self.commit_took = began.elapsed();
        self.group_keys = Some(Vec::new());
        Ok(())
    }

    /// Counts a group made durable up to `at`: rows, transactions, lag, latency and phase; the
    /// source is told the position is durable.
    fn committed(&mut self, at: &Position, arrivals: &[Arrival], changes: u64) -> Result<()> {
        let context = self.context;
        // The producer is gone only when the attempt ends; the position is acknowledged then by
        // the next attempt's first commit.
        let _ = self.acks.send(at.clone());

        let stats = &context.stats.stream;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        stats.rows_applied.fetch_add(changes, relaxed);
        stats.transactions_applied.fetch_add(arrivals.len() as u64, relaxed);
        *stats.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(at.clone());
        let now = SystemTime::now();
        for arrival in arrivals {
            // The source's commit time has whole seconds: the commit happened within the second
            // after it, and no later than its arrival here.
            let second = UNIX_EPOCH + Duration::from_secs(arrival.committed_at);
            let committed = arrival.received.clamp(second, second + Duration::from_secs(1));
            stats.record_latency(now.duration_since(committed).unwrap_or_default(), 1);
        }
        if let Some(last) = arrivals.last() {
            stats.fresh_through(last.committed_at);
        }
        if stats.phase() == StreamPhase::CatchingUp
            && self.head.as_ref().is_none_or(|head| self.changes.reached(at, head))
        {
            log::info!("change stream caught up with the source; streaming");
            stats.set_phase(StreamPhase::Streaming);
        }
        self.resync_turn |= !arrivals.is_empty();
        self.progressed = true;
        if self.last_status.is_none_or(|saved| saved.elapsed() >= Duration::from_secs(1)) {
            context.state.save_stream_status(&context.job.name, &stats.summary())?;
            self.last_status = Some(Instant::now());
        }
        Ok(())
    }

    /// The checkpoint record of `stored`, with the rows applied so far.
    fn record(&self, stored: &StreamCheckpoint) -> Checkpoint {
        let position = Position(serde_json::to_value(stored).expect("positions serialize"));
        Checkpoint {
            task: STREAM_TASK.to_owned(),
            position: Some(position),
            done: false,
            rows_written: self.rows_applied,
        }
    }

    /// Commits the open transaction with `stored` as the stream's checkpoint, and keeps a copy
    /// in the state store.
    async fn write_checkpoint(&mut self, stored: &StreamCheckpoint) -> Result<()> {
        let record = self.record(stored);
        self.writer.common().commit(&record).await?;
        crate::failpoint::hit("stream.group.committed");
        self.context.state.save_checkpoint(&self.context.job.name, &record)
    }
}
