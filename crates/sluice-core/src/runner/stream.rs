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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::{interrupted, Runner};
use crate::change::{Batch, Change, Position};
use crate::connector::{ChangeWriter, Checkpoint, SchemaChange, SourceSchemaChange, StreamEvent};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::net_changes::{ApplyMode, NetChanges};
use crate::retry;
use crate::schema::{TableName, TableSchema};
use crate::stats::{StreamPhase, TableStats};
use crate::zero_dates;

/// The task id of the change stream: its checkpoint row in the target carries it.
pub const STREAM_TASK: &str = "stream";

/// A group is committed once it holds this many changes, or is this old, even while more
/// transactions are waiting: bounds latency under a steady backlog.
const GROUP_MAX_AGE: Duration = Duration::from_millis(500);

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

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

/// A source transaction folded into the open group: when it arrived and when the source
/// committed it, for the latency histogram.
struct Arrival {
    received: SystemTime,
    committed_at: u64,
}

impl Runner {
    /// Streams changes until stopped. `snapshot_start` is the position the snapshot was taken
    /// from (`snapshot+cdc`), where the stream starts when the target has no checkpoint yet.
    pub(super) async fn stream_changes(&self, snapshot_start: Option<Position>) -> Result<()> {
        let mut attempt = 1;
        loop {
            let mut progressed = false;
            let error = match self.apply_stream(snapshot_start.clone(), &mut progressed).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if progressed {
                // A stream that ran for a while before failing starts its count afresh.
                attempt = 1;
            }
            if !retry::is_transient(&error) || attempt >= self.job.retry.max_attempts || self.should_stop() {
                return Err(if error.kind() == ErrorKind::Interrupted {
                    error
                } else {
                    error.context("change stream")
                });
            }
            attempt += 1;
            let wait = retry::backoff(&self.job.retry, attempt);
            log::warn!("change stream: {error}; attempt {attempt} of {} in {wait:?}", self.job.retry.max_attempts);
            self.pause(wait).await;
        }
    }

    /// One attempt: recover, open the stream, apply until stopped or failed.
    async fn apply_stream(&self, snapshot_start: Option<Position>, progressed: &mut bool) -> Result<()> {
        let mut writer = self.sink.open_changes(&self.job.name, STREAM_TASK).await?;
        let recovered = writer.recover().await?;
        let corrupt = |error: serde_json::Error| {
            Error::new(ErrorKind::Write, format!("the checkpoint of task {STREAM_TASK} is corrupt: {error}"))
                .on(Side::Target)
                .hint("delete the row of this job from the target's sluice.checkpoints table and start again")
        };
        let (mut checkpoint, mut rows_applied) = match recovered {
            Some(Checkpoint { position: Some(position), rows_written, .. }) => {
                (serde_json::from_value::<StreamCheckpoint>(position.0).map_err(corrupt)?, rows_written)
            }
            _ => match snapshot_start {
                Some(start) => {
                    // Any position after the copy's end closes the replay window; the current one
                    // is such a position.
                    let end = self.source.log_position().await?;
                    (StreamCheckpoint { at: start, replay_until: end, pending: BTreeMap::new() }, 0)
                }
                None => {
                    let at = self.source.start_position().await?;
                    (StreamCheckpoint { at, replay_until: None, pending: BTreeMap::new() }, 0)
                }
            },
        };
        let head = self.source.log_position().await?;
        let stats = &self.stats.stream;
        if stats.phase() != StreamPhase::Streaming {
            let caught_up = head.as_ref().is_none_or(|head| self.source.reached(&checkpoint.at, head));
            stats.set_phase(if caught_up { StreamPhase::Streaming } else { StreamPhase::CatchingUp });
        }
        *stats.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(checkpoint.at.clone());
        log::info!("change stream starts after {}", checkpoint.at.0);

        let mut stream = self.source.stream(&checkpoint.at).await?;
        let (events, mut received) = mpsc::channel::<Result<StreamEvent>>(self.job.limits.queue_batches.max(1));
        let producer = tokio::spawn(async move {
            loop {
                let event = stream.next().await;
                let failed = event.is_err();
                if events.send(event).await.is_err() || failed {
                    return;
                }
            }
        });

        let mut targets: HashMap<TableName, (Arc<TableSchema>, Arc<TableSchema>)> = HashMap::new();
        let mut target_of = |table: &Arc<TableSchema>| -> Arc<TableSchema> {
            match targets.get(&table.name) {
                Some((source, target)) if Arc::ptr_eq(source, table) => target.clone(),
                _ => {
                    let target =
                        Arc::new(TableSchema { name: self.sink.target_name(&table.name), ..(**table).clone() });
                    targets.insert(table.name.clone(), (table.clone(), target.clone()));
                    target
                }
            }
        };
        let mut net = NetChanges::default();
        // Changes of a source transaction whose commit has not arrived are folded or staged.
        let mut open_transaction = false;
        // Whole transactions folded or staged since the last target commit.
        let mut group: Vec<Arrival> = Vec::new();
        let mut group_rows: u64 = 0;
        let mut group_started = Instant::now();
        // The position moved past transactions of other tables since the last target commit.
        let mut moved = false;
        let mut last_commit = Instant::now();
        let mut stop = self.stop.clone();
        let mut abort = self.abort.subscribe();

        let outcome: Result<()> = async {
            loop {
                let event = tokio::select! {
                    event = received.recv() => event,
                    _ = stop.wait_for(|stopped| *stopped) => None,
                    _ = abort.wait_for(|aborted| *aborted) => None,
                };
                let stopping = event.is_none();
                match event.transpose()? {
                    None => {}
                    Some(StreamEvent::Changes(changes)) => {
                        let changes = self.adjust_zero_dates(changes)?;
                        let reshaped: Vec<Arc<TableSchema>> = {
                            let mut tables: Vec<Arc<TableSchema>> = Vec::new();
                            for change in &changes {
                                let key = change.table.name.to_string();
                                if checkpoint.pending.contains_key(&key)
                                    && !tables.iter().any(|known| known.name == change.table.name)
                                {
                                    tables.push(change.table.clone());
                                }
                            }
                            tables
                        };
                        if !reshaped.is_empty() {
                            // The target takes the new schema before these rows, and after the
                            // rows before them: whole transactions commit first when they can.
                            if !open_transaction && !group.is_empty() {
                                group_rows += net.apply(&mut *writer, &mut target_of).await? as u64;
                                rows_applied += group_rows;
                                self.commit_group(
                                    &mut *writer,
                                    &checkpoint,
                                    rows_applied,
                                    &group,
                                    group_rows,
                                    head.as_ref(),
                                )
                                .await?;
                                group.clear();
                                group_rows = 0;
                                moved = false;
                            } else {
                                group_rows += net.apply(&mut *writer, &mut target_of).await? as u64;
                            }
                            for table in reshaped {
                                let pending = checkpoint.pending.remove(&table.name.to_string()).unwrap_or_default();
                                let target = target_of(&table);
                                let change = if pending.create {
                                    SchemaChange::Create((*target).clone())
                                } else {
                                    SchemaChange::Alter {
                                        table: (*target).clone(),
                                        renamed: pending.renamed,
                                        retyped: pending.retyped,
                                    }
                                };
                                writer
                                    .apply_schema_change(&change)
                                    .await
                                    .map_err(|error| error.context(format_args!("table {}", target.name)))?;
                                log::info!("target table {} has the source's new schema", target.name);
                            }
                        }
                        open_transaction = true;
                        let mode = self.apply_mode(&checkpoint);
                        for change in changes {
                            net.add(change, mode)?;
                        }
                        // A large transaction goes to the target in pieces, inside the one
                        // target transaction that its commit will end.
                        if net.len() >= self.job.limits.batch_rows {
                            group_rows += net.apply(&mut *writer, &mut target_of).await? as u64;
                        }
                    }
                    Some(StreamEvent::Commit { position, committed_at }) => {
                        if group.is_empty() {
                            group_started = Instant::now();
                        }
                        group.push(Arrival { received: SystemTime::now(), committed_at });
                        checkpoint.at = position;
                        open_transaction = false;
                    }
                    Some(StreamEvent::SchemaChange { statement, changes, position, committed_at }) => {
                        // DDL is a transaction of its own: what came before commits first.
                        if !group.is_empty() || moved {
                            group_rows += net.apply(&mut *writer, &mut target_of).await? as u64;
                            rows_applied += group_rows;
                            self.commit_group(
                                &mut *writer,
                                &checkpoint,
                                rows_applied,
                                &group,
                                group_rows,
                                head.as_ref(),
                            )
                            .await?;
                            group.clear();
                            group_rows = 0;
                        }
                        for change in changes {
                            let Some(change) = self.schema_change(change, &mut checkpoint.pending) else { continue };
                            writer.apply_schema_change(&change).await.map_err(|error| {
                                error
                                    .context(format_args!("applying `{statement}` ({position})", position = position.0))
                            })?;
                        }
                        log::info!("applied DDL to the target: {statement}");
                        stats.schema_changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        checkpoint.at = position;
                        let ddl = [Arrival { received: SystemTime::now(), committed_at }];
                        self.commit_group(&mut *writer, &checkpoint, rows_applied, &ddl, 0, head.as_ref()).await?;
                        *progressed = true;
                        moved = false;
                        last_commit = Instant::now();
                    }
                    Some(StreamEvent::Advance { position, committed_at }) => {
                        checkpoint.at = position;
                        moved = true;
                        if group.is_empty() && !open_transaction {
                            let lag = if committed_at == 0 { 0 } else { unix_now().saturating_sub(committed_at) };
                            stats.lag_seconds.store(lag, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
                if open_transaction {
                    if stopping {
                        // The open transaction's pieces are dropped with the target transaction.
                        return Err(interrupted());
                    }
                    continue;
                }
                // Commit whole transactions when nothing more is waiting, when the group is
                // large or old, or when stopping; the position alone at most once a second.
                let full = group_rows + net.len() as u64 >= self.job.limits.batch_rows as u64;
                let due = !group.is_empty()
                    && (stopping || received.is_empty() || full || group_started.elapsed() >= GROUP_MAX_AGE);
                let idle_due =
                    group.is_empty() && moved && (stopping || last_commit.elapsed() >= IDLE_CHECKPOINT_INTERVAL);
                if due || idle_due {
                    group_rows += net.apply(&mut *writer, &mut target_of).await? as u64;
                    rows_applied += group_rows;
                    self.commit_group(&mut *writer, &checkpoint, rows_applied, &group, group_rows, head.as_ref())
                        .await?;
                    *progressed = true;
                    group.clear();
                    group_rows = 0;
                    moved = false;
                    last_commit = Instant::now();
                }
                if stopping {
                    return Err(interrupted());
                }
            }
        }
        .await;
        drop(received);
        producer.abort();
        outcome
    }

    /// A source DDL effect as the target applies it now, with target names; `None` for a
    /// created or altered table, whose new schema comes with its next rows (`pending`).
    fn schema_change(
        &self,
        change: SourceSchemaChange,
        pending: &mut BTreeMap<String, PendingSchema>,
    ) -> Option<SchemaChange> {
        let target = |name: &TableName| self.sink.target_name(name);
        match change {
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
                pending.remove(&table.to_string());
                Some(SchemaChange::Drop(target(&table)))
            }
            SourceSchemaChange::Rename { from, to } => {
                if let Some(moved) = pending.remove(&from.to_string()) {
                    pending.insert(to.to_string(), moved);
                }
                Some(SchemaChange::Rename { from: target(&from), to: target(&to) })
            }
            SourceSchemaChange::Truncate(table) => Some(SchemaChange::Truncate(target(&table))),
        }
    }

    /// Inside the replay window of a `snapshot+cdc` job, changes meet rows the copy may hold.
    fn apply_mode(&self, checkpoint: &StreamCheckpoint) -> ApplyMode {
        match &checkpoint.replay_until {
            Some(mark) if !self.source.reached(&checkpoint.at, mark) => ApplyMode::Replay,
            _ => ApplyMode::Strict,
        }
    }

    /// Applies the zero-date policy to streamed changes. A change cannot be skipped without
    /// breaking the ones after it on the same row, so `reject` stops the stream instead.
    fn adjust_zero_dates(&self, changes: Vec<Change>) -> Result<Vec<Change>> {
        if self.sink.holds_zero_dates() {
            return Ok(changes);
        }
        let batch = Batch::new(changes, Position(serde_json::Value::Null));
        let Some(outcome) = zero_dates::apply(&batch, self.job.errors.zero_dates, &self.job.target.connector) else {
            return Ok(batch.changes);
        };
        if let Some(rejected) = outcome.rejected.first() {
            return Err(Error::new(
                ErrorKind::Data,
                format!("change stream: table {}, key {}: {}", rejected.table, rejected.key, rejected.reason),
            )
            .hint("set errors.zero_dates: null to store such dates as NULL in nullable columns"));
        }
        if outcome.nulled > 0 {
            if let Some(change) = outcome.batch.changes.first() {
                let table = self.stats.table(&change.table.name, &self.sink.target_name(&change.table.name));
                TableStats::add(&table.zero_dates_nulled, outcome.nulled);
            }
        }
        Ok(outcome.batch.changes)
    }

    /// Commits the open target transaction with the stream's checkpoint and updates the
    /// counters: rows, transactions, lag, latency and phase.
    async fn commit_group(
        &self,
        writer: &mut dyn ChangeWriter,
        checkpoint: &StreamCheckpoint,
        rows_applied: u64,
        group: &[Arrival],
        group_rows: u64,
        head: Option<&Position>,
    ) -> Result<()> {
        // Past the replay window, the window is forgotten, so a later reader of the
        // checkpoint need not know the source's position order.
        let mut stored = checkpoint.clone();
        if stored.replay_until.as_ref().is_some_and(|mark| self.source.reached(&stored.at, mark)) {
            stored.replay_until = None;
        }
        let position = Position(serde_json::to_value(&stored).expect("positions serialize"));
        let record = Checkpoint {
            task: STREAM_TASK.to_owned(),
            position: Some(position),
            done: false,
            rows_written: rows_applied,
        };
        writer.commit(&record).await?;
        self.state.save_checkpoint(&self.job.name, &record)?;

        let stats = &self.stats.stream;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        stats.rows_applied.fetch_add(group_rows, relaxed);
        stats.transactions_applied.fetch_add(group.len() as u64, relaxed);
        *stats.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(checkpoint.at.clone());
        let now = SystemTime::now();
        for arrival in group {
            // The source's commit time has whole seconds: the commit happened within the second
            // after it, and no later than its arrival here.
            let second = UNIX_EPOCH + Duration::from_secs(arrival.committed_at);
            let committed = arrival.received.clamp(second, second + Duration::from_secs(1));
            stats.record_latency(now.duration_since(committed).unwrap_or_default(), 1);
        }
        if let Some(last) = group.last() {
            stats.lag_seconds.store(unix_now().saturating_sub(last.committed_at), relaxed);
        }
        if stats.phase() == StreamPhase::CatchingUp && head.is_none_or(|head| self.source.reached(&checkpoint.at, head))
        {
            log::info!("change stream caught up with the source; streaming");
            stats.set_phase(StreamPhase::Streaming);
        }
        Ok(())
    }
}
