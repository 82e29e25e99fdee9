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
//!
//! This stage owns the stream's attempts: recovering the checkpoint, the read-ahead task, the
//! retries, and what one attempt hands the next; each attempt's applier (`applier`) owns the
//! open group. It must not plan or copy: the plan's splits, the copy's positions and the hidden
//! copies come from the earlier stages as values.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use super::context::RunContext;
use super::copied_keys::CopiedKeys;
use super::Backfill;
use crate::change::Position;
use crate::connector::{AnyChangeWriter, ChangeStream, Checkpoint, FoldedChangeWriter, Split, StreamEvent};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::hidden::HiddenCopies;
use crate::names::STREAM_TASK;
use crate::retry;
use crate::schema::TableName;
use crate::spec::Consistency;
use crate::stats::StreamPhase;

mod applier;

use applier::resync::Resync;
pub use applier::resync::ResyncRequest;
use applier::{Applier, AttemptStart, Carried};

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
    /// Tables being copied again while the stream runs (`applier::resync`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resync: Option<Resync>,
    /// The last resync (`ResyncRequest::id`) done, so a restart does not copy its tables again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resynced: Option<String>,
}

impl StreamCheckpoint {
    /// Whether `request` is new to this stream: neither done nor being done. A resync it
    /// replaces is named (its copy, if any, is the caller's to drop).
    fn takes_resync(&self, request: &ResyncRequest) -> bool {
        if self.resynced.as_deref() == Some(request.id.as_str())
            || self.resync.as_ref().is_some_and(|resync| resync.id == request.id)
        {
            return false;
        }
        if let Some(previous) = &self.resync {
            log::warn!("resync {} gives way to resync {}: its copy is not finished", previous.id, request.id);
        }
        let names: Vec<String> = request.tables.iter().map(ToString::to_string).collect();
        log::info!("resync {}: {} are copied again while the stream runs", request.id, names.join(", "));
        true
    }
}

/// The source position up to which the target has applied the stream, read off the stream
/// task's checkpoint position; `None` when it is not a stream checkpoint.
pub(super) fn applied_position(checkpoint: &Position) -> Option<Position> {
    serde_json::from_value::<StreamCheckpoint>(checkpoint.0.clone()).ok().map(|checkpoint| checkpoint.at)
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

/// How often the stream measures the source's log past its checkpoint.
const BACKLOG_EVERY: Duration = Duration::from_secs(10);

/// Measures the source's log past the stream's checkpoint (`ChangeSource::log_backlog`) beside the
/// stream, every `BACKLOG_EVERY`, until dropped.
struct BacklogWatch(tokio::task::JoinHandle<()>);

impl BacklogWatch {
    fn start(source: Arc<dyn crate::connector::Source>, stats: Arc<crate::stats::JobStats>) -> BacklogWatch {
        BacklogWatch(tokio::spawn(async move {
            loop {
                let position = stats.stream.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
                if let Some(position) = position {
                    let Some(changes) = source.changes() else { return };
                    match changes.log_backlog(&position).await {
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

/// Where the stream begins when the target holds no checkpoint yet. A cdc job starts where the
/// job says, else where the source stood when the job was first planned (kept in the plan, so a
/// crash before the first commit loses nothing); snapshot+cdc starts where its snapshot was
/// taken.
pub(super) async fn start_position(
    context: &RunContext,
    after_snapshot: bool,
    planned: Option<Position>,
) -> Result<Position> {
    let start = match (after_snapshot, context.source.needs_changes()?.start_position().await?) {
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
    /// Tables to copy again while the stream runs (`applier::resync`), as asked now and later.
    resync: Option<watch::Receiver<Option<ResyncRequest>>>,
    /// What one attempt hands the next.
    carried: Carried,
}

impl StreamStage {
    pub(super) fn new(
        context: Arc<RunContext>,
        backfill: Option<Backfill>,
        splits: Vec<Split>,
        copied: HashMap<String, Option<Position>>,
        hidden: HiddenCopies,
    ) -> StreamStage {
        StreamStage { context, backfill, splits, copied, hidden, resync: None, carried: Carried::default() }
    }

    /// Tables to copy again while the stream runs, unless the stream did so already.
    pub(super) fn resyncing(mut self, resync: Option<watch::Receiver<Option<ResyncRequest>>>) -> StreamStage {
        self.resync = resync;
        self
    }

    /// Streams changes until stopped. `start` is where the stream begins when the target has no
    /// checkpoint yet; `after_snapshot` says a snapshot was taken from there, so the changes up
    /// to the copy's end are replayed.
    pub(super) async fn stream_changes(&mut self, start: Position, after_snapshot: bool) -> Result<()> {
        let mut attempt = 1;
        loop {
            let mut progressed = false;
            let waiting_schemas = self.carried.reshape_first.len();
            let error = match self.apply_stream(&start, after_snapshot, &mut progressed).await {
                Ok(()) => return Ok(()),
                Err(error) => error,
            };
            if progressed {
                // A stream that ran for a while before failing starts its count afresh.
                attempt = 1;
            }
            if self.carried.reshape_first.len() > waiting_schemas && !self.context.should_stop() {
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
        let changes = context.source.needs_changes()?;
        let mut writer = AnyChangeWriter::open(&*context.sink, &context.job.name, STREAM_TASK).await?;
        // The source's position now: reaching it ends catching up, and, being after the copy's
        // end, it also closes a snapshot's replay window.
        let head = changes.log_position().await?;
        let (checkpoint, rows_applied) = self.recovered_checkpoint(&mut writer, start, after_snapshot, &head).await?;
        let stats = &context.stats.stream;
        if stats.phase() != StreamPhase::Streaming {
            let caught_up = head.as_ref().is_none_or(|head| changes.reached(&checkpoint.at, head));
            stats.set_phase(if caught_up { StreamPhase::Streaming } else { StreamPhase::CatchingUp });
        }
        *stats.position.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(checkpoint.at.clone());
        log::info!("change stream starts after {}", checkpoint.at.brief());
        let _backlog = BacklogWatch::start(context.source.clone(), context.stats.clone());

        // Read before the stream opens, so a failure here leaves no replica connection behind.
        let copied_at = self.copy_positions().await?;
        let raw = matches!(writer, AnyChangeWriter::Events(_));
        let copied_keys =
            if raw && checkpoint.replay_until.is_some() { self.copied_keys().await? } else { CopiedKeys::default() };
        let lanes = self.open_lanes(matches!(writer, AnyChangeWriter::Folded(_))).await?;
        let stream = changes.stream(&checkpoint.at).await?;
        let (producer, mut received, acks) = self.read_ahead(stream);
        let start = AttemptStart {
            writer,
            acks,
            checkpoint,
            rows_applied,
            head,
            copied_at,
            copied_keys,
            dirty_keys: self.dirty_keys(),
            resync_requests: self.resync.clone(),
            carried: std::mem::take(&mut self.carried),
            lanes,
        };
        let mut applier = Applier::new(context, changes, start);
        let outcome = applier.run(&mut received).await;
        *progressed = applier.progressed();
        self.carried = applier.take_carried();
        drop(received);
        producer.abort();
        outcome
    }

    /// The writers of the attempt's other lanes: as many as the job's `apply_parallelism` asks
    /// beyond the stream's writer, when that writer applies folded
    /// changes (`folded`); none under `consistency: serial` or a conflict policy (which reads rows back
    /// on the stream's connection), or where the target cannot take them now.
    async fn open_lanes(&self, folded: bool) -> Result<Vec<Box<dyn FoldedChangeWriter>>> {
        let job = &self.context.job;
        let Some(sink) = self.context.sink.folded_changes().filter(|_| folded) else { return Ok(Vec::new()) };
        let count = match job.consistency {
            Consistency::Serial => 1,
            Consistency::Transaction => job.apply_parallelism.unwrap_or(1),
        };
        if count <= 1 || job.conflict.is_some() {
            return Ok(Vec::new());
        }
        let mut lanes = Vec::new();
        for lane in 1..count {
            match sink.open_lane(&job.name, STREAM_TASK, lane).await? {
                Some(writer) => lanes.push(writer),
                None => {
                    log::warn!(
                        "change stream: the target cannot apply on several connections (a MySQL target that logs statements: binlog_format = STATEMENT); it applies on one"
                    );
                    return Ok(Vec::new());
                }
            }
        }
        log::info!(
            "change stream applies on {count} target connections (apply_parallelism), committing in the source's order"
        );
        Ok(lanes)
    }

    /// The stream's checkpoint as the target holds it, or the first one (from `start`) when it
    /// holds none; moved back for tables a backfill added. With the rows applied so far.
    async fn recovered_checkpoint(
        &self,
        writer: &mut AnyChangeWriter,
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
                    resync: None,
                    resynced: None,
                };
                (checkpoint, 0)
            }
        };
        let checkpoint = match &self.backfill {
            Some(backfill) if checkpoint.backfilled.as_deref() != Some(backfill.id.as_str()) => {
                let names: Vec<String> = backfill.tables.iter().map(ToString::to_string).collect();
                // Normally the stream is past `from` and goes back for the added tables alone; a
                // stream still behind `from` simply goes on, every table from where it is.
                let ahead = self.context.source.needs_changes()?.reached(&checkpoint.at, &backfill.from);
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
        // A request that came while no stream ran; one that comes later is taken in by the applier.
        let mut checkpoint = checkpoint;
        if let Some(request) = self.resync.as_ref().and_then(|requests| requests.borrow().clone()) {
            if checkpoint.takes_resync(&request) {
                checkpoint.resync = Some(Resync::of(&request));
            }
        }
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
                // Nothing follows an error or the stream's end.
                let last = matches!(event, Err(_) | Ok(StreamEvent::End { .. }));
                if events.send((event, permit)).is_err() || last {
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
        let snapshot = context.source.needs_snapshot()?;
        for split in &splits {
            let position = copied.get(&split.id).cloned().flatten();
            keys.add(split.table.name.clone(), snapshot.copy_reads(split, position.as_ref())?);
        }
        if let Some(events) = context.sink.event_changes() {
            let tasks: Vec<String> = splits.iter().map(|split| split.id.clone()).collect();
            for held in events.held_rows(&context.job.name, &tasks).await? {
                let Some(split) = splits.iter().find(|split| split.id == held.task) else { continue };
                // The rows were read by the last read of the position their batch ended at.
                let read = snapshot.copy_reads(split, Some(&held.position))?.pop();
                match read.and_then(|read| read.as_of) {
                    Some(as_of) => keys.hold(split.table.name.clone(), held.keys, as_of),
                    None => log::warn!(
                        "change stream: the source does not say where task {} read the {} rows the target holds from an interrupted run; their changes since then are judged by the split's reads",
                        held.task,
                        held.keys.len()
                    ),
                }
            }
        }
        let keys = keys.sorted(context.source.needs_changes()?);
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use serde_json::json;
    use tokio::sync::watch;

    use std::time::Instant;

    use super::*;
    use crate::change::{Change, ChangeKind, Row, SourceKey};
    use crate::connector::TransactionEnd;
    use crate::connector::{
        ChangeSource, ChangeStream, ChangeWriter, CheckItem, EventChangeSink, EventWriter, Sink, Source, TableWriter,
    };
    use crate::runner::Runner;
    use crate::schema::TableSchema;
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
        async fn discover(&self) -> Result<Vec<TableSchema>> {
            Ok(vec![(*table()).clone()])
        }
        fn changes(&self) -> Option<&dyn ChangeSource> {
            Some(self)
        }
    }

    #[async_trait]
    impl ChangeSource for ScriptedSource {
        async fn log_position(&self) -> Result<Option<Position>> {
            Ok(Some(position(0)))
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
        async fn open(&self, _job: &str, _task: &str, _table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
            unreachable!("a cdc job copies nothing")
        }
        fn event_changes(&self) -> Option<&dyn EventChangeSink> {
            Some(self)
        }
    }

    #[async_trait]
    impl EventChangeSink for RawSink {
        async fn open_events(&self, _job: &str, _task: &str) -> Result<Box<dyn EventWriter>> {
            Ok(Box::new(RawWriter { target: self.0.clone(), staged: Vec::new() }))
        }
    }

    struct RawWriter {
        target: Arc<RawTarget>,
        staged: Vec<Seen>,
    }

    #[async_trait]
    impl ChangeWriter for RawWriter {
        async fn recover(&mut self) -> Result<Option<Checkpoint>> {
            Ok(self.target.durable.lock().unwrap().1.clone())
        }
        async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
            let mut durable = self.target.durable.lock().unwrap();
            durable.0.append(&mut self.staged);
            durable.0.push(Seen::Commit(checkpoint.rows_written));
            durable.1 = Some(checkpoint.clone());
            Ok(())
        }
        async fn apply_schema_change(&mut self, change: &crate::connector::SchemaChange) -> Result<()> {
            unreachable!("the script holds no DDL: {change:?}")
        }
    }

    #[async_trait]
    impl EventWriter for RawWriter {
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
