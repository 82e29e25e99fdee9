//! Lanes: the stream's groups written by several target connections at once, committed in the
//! source's order (`apply_parallelism`).
//!
//! The applier folds the next group while earlier ones are written and committed by connections
//! of their own. Two rules keep this exactly what a serial apply would leave:
//! - **No two lanes write one row.** Before a change is folded, every group in flight that
//!   writes its key (before or after image) must have committed: the applier waits for it. A
//!   change of a table without a key waits for every group in flight.
//! - **Commits keep the source's order.** Each group's commit waits for the one before it, and
//!   carries the stream's checkpoint as a serial commit would; a group whose lane failed ends
//!   the chain (the ones after it roll back). So the target's checkpoint is always the end of a
//!   prefix of the source's transactions, and a reader never sees a group without the ones
//!   before it.
//!
//! A group whose rows the target refused comes back to the applier before its commit: the
//! dirty records are kept first, as on one connection.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use std::time::Instant;

use super::{stream_record, Applier, Arrival};
use crate::change::{Change, ChangeKind, Position, Rejected, Row};
use crate::connector::{AnyChangeWriter, Checkpoint, FoldedChangeWriter};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::names::STREAM_TASK;
use crate::net_changes::{NetChanges, Refusal};
use crate::schema::TableSchema;

/// Keys a group keeps for the groups after it; a group that writes more is kept as writing
/// every key (the next change waits for it whatever its key), so memory stays bounded however
/// large a transaction is.
pub(super) const GROUP_KEYS: usize = 20_000;

/// A group a lane writes and commits: what the applier counts once it has.
pub(super) struct Handed {
    arrivals: Vec<Arrival>,
    /// The stream's position after the group.
    at: Position,
    /// The checkpoint its commit writes (`rows_written` as the lane counts it).
    record: Checkpoint,
}

/// What a lane's task hands back once its group is through.
pub(super) enum Landed {
    /// Written and committed with its checkpoint; `rows_written` as the checkpoint says.
    Committed { writer: Box<dyn FoldedChangeWriter>, rows_written: u64, changes: u64 },
    /// Written, but the target refused some rows: the applier keeps them as dirty records,
    /// commits (`rows_before` + `changes` rows written) and passes the turn on.
    Refused {
        writer: Box<dyn FoldedChangeWriter>,
        refused: Vec<Refusal>,
        rows_before: u64,
        changes: u64,
        turn: oneshot::Sender<u64>,
    },
}

/// A group handed to a lane, and what the applier needs of it once it landed.
pub(super) struct Flight {
    sequence: u64,
    /// The keys it writes; `None`: too many to keep, taken as every key.
    keys: Option<Vec<u64>>,
    task: JoinHandle<Result<Landed>>,
    landed: Option<Result<Landed>>,
    group: Handed,
}

/// The lanes of one attempt: the writers not in use and the groups in flight.
pub(super) struct Lanes {
    idle: Vec<Box<dyn FoldedChangeWriter>>,
    flights: VecDeque<Flight>,
    /// Key (hash of table and key) → the last group in flight that writes it.
    keys: HashMap<u64, u64>,
    /// The last group in flight that writes too many keys to keep (`GROUP_KEYS`).
    wide: Option<u64>,
    next: u64,
    /// The commit turn of the last group handed over: the next one commits after it, with the
    /// rows written so far.
    turn: Option<oneshot::Receiver<u64>>,
}

impl Lanes {
    pub(super) fn new(writers: Vec<Box<dyn FoldedChangeWriter>>) -> Lanes {
        Lanes { idle: writers, flights: VecDeque::new(), keys: HashMap::new(), wide: None, next: 0, turn: None }
    }

    /// Whether the attempt has lanes beside the applier's own writer.
    pub(super) fn open(&self) -> bool {
        !self.idle.is_empty() || !self.flights.is_empty()
    }

    pub(super) fn in_flight(&self) -> bool {
        !self.flights.is_empty()
    }

    /// A writer not in use, if any.
    pub(super) fn take_idle(&mut self) -> Option<Box<dyn FoldedChangeWriter>> {
        self.idle.pop()
    }

    /// The sequence number of the last group in flight that writes one of `keys`; with `None`
    /// among them (a row without a key), the last group in flight.
    pub(super) fn last_writer_of(&self, keys: &[Option<u64>]) -> Option<u64> {
        if keys.is_empty() {
            return None;
        }
        let mut last = self.wide;
        for key in keys {
            let found = match key {
                Some(key) => self.keys.get(key).copied(),
                None => self.flights.back().map(|flight| flight.sequence),
            };
            last = last.max(found);
        }
        last
    }

    /// The oldest group in flight, once it has landed, or `None` with nothing in flight.
    pub(super) async fn front_landed(&mut self) -> Option<u64> {
        let front = self.flights.front_mut()?;
        if front.landed.is_none() {
            let landed = (&mut front.task).await.unwrap_or_else(|error| {
                Err(Error::new(ErrorKind::Write, format!("a lane of the change stream ended: {error}"))
                    .on(Side::Target))
            });
            front.landed = Some(landed);
        }
        Some(front.sequence)
    }

    /// Whether the oldest group in flight has landed (without waiting).
    pub(super) fn front_finished(&self) -> bool {
        self.flights.front().is_some_and(|flight| flight.landed.is_some() || flight.task.is_finished())
    }

    /// Takes the oldest group off, once `front_landed` said it landed: what its lane did, and
    /// the group. Its keys are free again.
    pub(super) fn pop_landed(&mut self) -> Option<(Result<Landed>, Handed)> {
        if self.flights.front().is_none_or(|flight| flight.landed.is_none()) {
            return None;
        }
        let flight = self.flights.pop_front()?;
        for key in flight.keys.iter().flatten() {
            if self.keys.get(key) == Some(&flight.sequence) {
                self.keys.remove(key);
            }
        }
        if self.wide == Some(flight.sequence) {
            self.wide = None;
        }
        Some((flight.landed.expect("landed"), flight.group))
    }

    /// Gives a writer back for later groups.
    pub(super) fn give_back(&mut self, writer: Box<dyn FoldedChangeWriter>) {
        self.idle.push(writer);
    }

    /// Hands a group to a lane: `writer` writes `net` (its rows so far, `staged_rows`, already in
    /// its open transaction), then, once the group before has committed, commits the group's
    /// record with the rows written so far (`rows_before` when no group is in flight).
    pub(super) fn hand_over(
        &mut self,
        mut writer: Box<dyn FoldedChangeWriter>,
        mut net: NetChanges,
        keys: Option<Vec<u64>>,
        staged_rows: u64,
        rows_before: u64,
        group: Handed,
    ) {
        let previous = self.turn.take();
        let (turn, next_turn) = oneshot::channel();
        let mut record = group.record.clone();
        self.turn = Some(next_turn);
        let task = tokio::spawn(async move {
            // The folded changes carry their target tables already (no hidden copies in lanes).
            let mut target = |table: &Arc<TableSchema>| table.clone();
            let applied = net.apply(&mut *writer, &mut target).await?;
            crate::failpoint::hit("stream.group.written");
            let rows_before = match previous {
                Some(previous) => previous.await.map_err(|_| {
                    Error::new(ErrorKind::Unavailable, "the group before this one failed; this one rolls back")
                        .on(Side::Target)
                })?,
                None => rows_before,
            };
            crate::failpoint::hit("stream.lane.turn");
            let changes = staged_rows + applied.changes as u64;
            if !applied.refused.is_empty() {
                return Ok(Landed::Refused { writer, refused: applied.refused, rows_before, changes, turn });
            }
            record.rows_written = rows_before + changes;
            writer.commit(&record).await?;
            crate::failpoint::hit("stream.group.committed");
            let _ = turn.send(record.rows_written);
            Ok(Landed::Committed { writer, rows_written: record.rows_written, changes })
        });
        let sequence = self.next;
        self.next += 1;
        match &keys {
            Some(keys) => {
                for key in keys {
                    self.keys.insert(*key, sequence);
                }
            }
            None => self.wide = Some(sequence),
        }
        self.flights.push_back(Flight { sequence, keys, task, landed: None, group });
    }

    /// Forgets the last group's turn once every group landed: the next group handed over
    /// commits after whatever the applier committed itself in between.
    pub(super) fn forget_turn(&mut self) {
        self.turn = None;
    }
}

impl Drop for Lanes {
    /// An attempt that ends without settling its lanes (its future dropped) stops their tasks:
    /// a group not yet committed rolls back with its connection.
    fn drop(&mut self) {
        for flight in &self.flights {
            flight.task.abort();
        }
    }
}

/// The keys a change writes, as lanes tell them apart: its table's name with the key of its
/// before and after images; `None` for a table without a key (its rows cannot be told apart).
pub(super) fn change_keys(change: &Change) -> [Option<u64>; 2] {
    let table = &change.table;
    if table.primary_key.is_empty() {
        return [None, None];
    }
    let key = |row: &Row| {
        let mut hasher = DefaultHasher::new();
        table.name.hash(&mut hasher);
        // Each key value's text straight into the hash, with no string made per change (two
        // keys that collide only make one change wait for the other's group).
        let mut text = HashedText(&mut hasher);
        for value in table.primary_key.iter().filter_map(|&index| row.get(index)) {
            let _ = write!(text, "{value}\u{1f}");
        }
        Some(hasher.finish())
    };
    match &change.kind {
        ChangeKind::Insert { after } => [key(after), key(after)],
        ChangeKind::Delete { before } => [key(before), key(before)],
        ChangeKind::Update { before, after } => [key(before), key(after)],
    }
}

/// Text written into a hasher.
struct HashedText<'a>(&'a mut DefaultHasher);

impl std::fmt::Write for HashedText<'_> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        self.0.write(text.as_bytes());
        Ok(())
    }
}

impl Applier<'_> {
    /// Whether the group about to commit goes to a lane: lanes are open, and the commit is a
    /// plain one (no replay window, DDL pending, backfill, resync, hidden copy or conflict
    /// policy, each of which the applier handles on its own connection after every lane landed).
    pub(super) fn lane_takes_group(&mut self) -> bool {
        if !self.lanes.open() || self.raw || self.cadence.is_some() || self.context.job.conflict.is_some() {
            return false;
        }
        if let Some(until) = &self.carried.serial_until {
            if !self.changes.reached(&self.checkpoint.at, until) {
                return false;
            }
            log::info!("change stream: past the group that failed; its lanes open again");
            self.carried.serial_until = None;
        }
        let checkpoint = &self.checkpoint;
        checkpoint.pending.is_empty()
            && checkpoint.catch_up.is_none()
            && checkpoint.resync.is_none()
            && checkpoint.hidden.is_empty()
            && checkpoint.replay_until.as_ref().is_none_or(|mark| self.changes.reached(&checkpoint.at, mark))
    }

    /// Hands the group to a lane: the applier's writer (which holds what the group staged so
    /// far) goes with it, and an idle lane's writer takes its place for the next group, once
    /// the oldest group landed if every lane is busy.
    pub(super) async fn hand_over(&mut self) -> Result<()> {
        let next = loop {
            if let Some(writer) = self.lanes.take_idle() {
                break writer;
            }
            self.reap().await?;
        };
        self.keep_left_out()?;
        let AnyChangeWriter::Folded(current) = &mut self.writer else {
            unreachable!("lanes are opened for a folded writer only")
        };
        let writer = std::mem::replace(current, next);
        let mut stored = self.checkpoint.clone();
        stored.replay_until = None;
        let record = self.record(&stored);
        let handed = Handed { arrivals: std::mem::take(&mut self.arrivals), at: stored.at, record };
        let net = std::mem::take(&mut self.net);
        let keys = self.group_keys.replace(Vec::new());
        self.lanes.hand_over(writer, net, keys, self.staged_rows, self.rows_applied, handed);
        self.staged_rows = 0;
        self.moved = false;
        self.echoes = 0;
        self.last_commit = Instant::now();
        Ok(())
    }

    /// Waits, before `changes` are folded, for every group in flight that writes one of their
    /// keys (every group, for a table without a key), and adds their keys to the open group's.
    pub(super) async fn wait_for_lanes<'c>(&mut self, changes: impl Iterator<Item = &'c Change>) -> Result<()> {
        if !self.lanes.open() {
            return Ok(());
        }
        let keys: Vec<Option<u64>> = changes.flat_map(change_keys).collect();
        if let Some(last) = self.lanes.last_writer_of(&keys) {
            while self.lanes.front_landed().await.is_some_and(|sequence| sequence <= last) {
                self.reap().await?;
            }
        }
        if let Some(group) = &mut self.group_keys {
            group.extend(keys.into_iter().flatten());
            if group.len() > GROUP_KEYS {
                self.group_keys = None;
            }
        }
        Ok(())
    }

    /// Counts the oldest group in flight once it landed; a group whose rows the target refused
    /// gets its dirty records kept, then its commit, here.
    pub(super) async fn reap(&mut self) -> Result<()> {
        if self.lanes.front_landed().await.is_none() {
            return Ok(());
        }
        let Some((landed, handed)) = self.lanes.pop_landed() else { return Ok(()) };
        let (writer, rows_written, changes) = match landed? {
            Landed::Committed { writer, rows_written, changes } => (writer, rows_written, changes),
            Landed::Refused { mut writer, refused, rows_before, changes, turn } => {
                let records: Vec<Rejected> = refused
                    .iter()
                    .map(|refusal| {
                        self.mark_dirty(&refusal.table, &refusal.after);
                        let arrival = handed.arrivals.get(refusal.transaction).or(handed.arrivals.last());
                        stream_record(self.context, refusal, arrival.map_or(&handed.at, |arrival| &arrival.position))
                    })
                    .collect();
                self.count_left_out(&records);
                self.context.keep_dirty(STREAM_TASK, &records)?;
                let record = Checkpoint { rows_written: rows_before + changes, ..handed.record.clone() };
                writer.commit(&record).await?;
                crate::failpoint::hit("stream.group.committed");
                let _ = turn.send(record.rows_written);
                (writer, record.rows_written, changes)
            }
        };
        self.lanes.give_back(writer);
        self.rows_applied = rows_written;
        let record = Checkpoint { rows_written, ..handed.record };
        self.context.state.save_checkpoint(&self.context.job.name, &record)?;
        self.committed(&handed.at, &handed.arrivals, changes)
    }

    /// Waits until every group in flight has landed and is counted: before the applier writes on
    /// its own connection anything but a group (DDL, a resync's copy, a publish).
    pub(super) async fn drain(&mut self) -> Result<()> {
        while self.lanes.in_flight() {
            self.reap().await?;
        }
        self.lanes.forget_turn();
        Ok(())
    }

    /// At the end of an attempt: every group in flight lands (or fails); the first failure is
    /// the outcome.
    pub(super) async fn settle(&mut self) -> Result<()> {
        let mut outcome = Ok(());
        while self.lanes.in_flight() {
            if let Err(error) = self.reap().await {
                if outcome.is_ok() {
                    outcome = Err(error);
                }
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{Column, DataType, TableName, TableSchema};
    use crate::value::Value;

    fn table(name: &str, keyed: bool) -> Arc<TableSchema> {
        let columns = vec![
            Column::new("id", DataType::Integer { bytes: 4, unsigned: false }, false),
            Column::new("v", DataType::Text { length: None, fixed: false }, true),
        ];
        let primary_key = if keyed { vec![0] } else { Vec::new() };
        Arc::new(TableSchema { columns, primary_key, ..TableSchema::named(TableName::new(Some("db"), name)) })
    }

    fn update(table: &Arc<TableSchema>, from: i64, to: i64) -> Change {
        let row = |id: i64| vec![Value::Int(id), Value::Text("x".into())];
        Change { table: table.clone(), kind: ChangeKind::Update { before: row(from), after: row(to) } }
    }

    #[test]
    fn a_change_is_known_by_its_tables_name_and_the_keys_it_writes() {
        let (items, orders) = (table("items", true), table("orders", true));
        let [before, after] = change_keys(&update(&items, 1, 2));
        assert_ne!(before, after, "a key moved writes two keys");
        assert_eq!(change_keys(&update(&items, 1, 1)), [before, before], "the same key again");
        assert_ne!(change_keys(&update(&orders, 1, 1))[0], before, "the same key of another table");
        assert_ne!(change_keys(&update(&items, 12, 12))[0], change_keys(&update(&items, 1, 1))[0]);
        assert_eq!(change_keys(&update(&table("log", false), 1, 2)), [None, None], "a table without a key");
    }
}
