//! The contracts between the engine and the connectors. The engine does no I/O to sources or
//! targets except through these traits.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::change::{Batch, Change, Position, Rejected, Row, RowEncoding};
use crate::cursor::CursorWindow;
use crate::error::{Error, ErrorKind, Result, Side};
use crate::schema::{TableName, TableSchema};
use crate::spec::CursorSpec;

/// A task's self-contained slice of the source: a key range of a table, a file, a log stream.
/// A task resumes from its split and its checkpoint alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// Stable across runs: `table#index`. Checkpoints are keyed by it.
    pub id: String,
    pub table: Arc<TableSchema>,
    /// The connector's own description of the slice (bounds, file, start position).
    pub descriptor: serde_json::Value,
    /// Rows the source expects in the split, for progress and ETA; 0 when unknown.
    pub estimated_rows: u64,
    /// The split is read in one pass and cannot resume part-way (a table with no key to resume
    /// by): it is the table's only split, and a task that finds an earlier attempt's rows in the
    /// target replaces them (`TableWriter::replace_all`) as it copies the split again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole: bool,
    /// `incremental-cursor` jobs: only the rows whose cursor lies in this window are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<CursorWindow>,
}

impl Split {
    /// A split of `table` with the connector's typed descriptor.
    pub fn new(id: String, table: Arc<TableSchema>, descriptor: &impl Serialize, estimated_rows: u64) -> Split {
        let descriptor = serde_json::to_value(descriptor).expect("split descriptors serialize");
        Split { id, table, descriptor, estimated_rows, whole: false, window: None }
    }

    /// The same split, read in one pass and copied again whole after a failure.
    pub fn read_whole(self) -> Split {
        Split { whole: true, ..self }
    }

    /// The descriptor as the connector's type. One that does not read (a plan made by another
    /// version) is a state error naming the split.
    pub fn read_descriptor<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(self.descriptor.clone()).map_err(|error| {
            Error::new(
                ErrorKind::State,
                format!("split {} has a descriptor this version cannot read: {error}", self.id),
            )
            .on(Side::State)
            .hint("plan the job again: delete its state directory (the target keeps the rows copied)")
        })
    }
}

/// Advice to `SnapshotSource::split` on how finely to cut.
#[derive(Debug, Clone, Copy)]
pub struct SplitHint {
    pub rows_per_split: u64,
}

/// The last durable position of one task, as the target knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub task: String,
    /// Resume after this position; `None` means from the split's start.
    pub position: Option<Position>,
    /// The split has been copied completely.
    pub done: bool,
    /// Rows written by this task over all runs.
    pub rows_written: u64,
}

/// The fencing token of a cluster task: its id and the epoch of the claim that owns it (the
/// coordination store's revision of the ownership key, so a later claim always has a larger
/// epoch). A fenced sink writes nothing for an epoch older than the one the target holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub task: String,
    pub epoch: u64,
}

impl Fence {
    /// The error of a commit or claim refused because the target holds epoch `held`.
    pub fn moved(&self, job: &str, held: u64) -> Error {
        Error::new(
            ErrorKind::Fenced,
            format!(
                "FENCED: job {job} task {} moved to a newer owner (the target holds epoch {held}, this worker has {}); nothing more is written by this worker",
                self.task, self.epoch
            ),
        )
        .on(Side::Target)
        .hint("nothing to do: the task runs on the worker that claimed it last")
    }
}

/// What a connector can be and do, declared once, by the connector. The registry checks jobs
/// against it (a mode needs a change source and a change or event sink, an upsert needs
/// `upsert`, a cluster job needs `fencing`), so no other code asks which connector it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    /// Reads tables in splits (`snapshot`, and the copy of `snapshot+cdc`).
    pub snapshot_source: bool,
    /// Follows a change log (`cdc`, `snapshot+cdc`).
    pub change_source: bool,
    /// Reads the rows of a cursor window (`incremental-cursor`, `CursorSource::cursor_window`).
    pub cursor_source: bool,
    /// Writes the rows of a snapshot.
    pub table_sink: bool,
    /// Applies a change stream folded per key (`Sink::folded_changes`).
    pub change_sink: bool,
    /// Takes a change stream as row events (`Sink::event_changes`).
    pub event_sink: bool,
    /// Replaces rows by primary key (`write_mode: upsert`).
    pub upsert: bool,
    /// Its commits check a fence, so a cluster can move its tasks (`Sink::claim`).
    pub fencing: bool,
    /// Commits rows and the checkpoint in one transaction (else: whole files by rename).
    pub transactions: bool,
}

impl Capabilities {
    /// Nothing: what a connector's declaration starts from, naming what it can do
    /// (`Capabilities { table_sink: true, ..Capabilities::NONE }`).
    pub const NONE: Capabilities = Capabilities {
        snapshot_source: false,
        change_source: false,
        cursor_source: false,
        table_sink: false,
        change_sink: false,
        event_sink: false,
        upsert: false,
        fencing: false,
        transactions: false,
    };
}

/// One line of a `sluice check` report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckItem {
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

/// The source's change log around a stream's checkpoint (`ChangeSource::log_backlog`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogBacklog {
    /// Log files from the checkpoint's on (its own included) the stream has yet to read.
    pub files_behind: u64,
    /// Bytes of log past the checkpoint.
    pub bytes_behind: u64,
    /// Older log files the server still keeps before the checkpoint's: the margin before a
    /// purge reaches the stream's position (0: the next purge may lose it).
    pub files_to_spare: u64,
}

/// One read of a split's copy, for a stream that must meet it exactly (`SnapshotSource::copy_reads`):
/// the rows of keys strictly after `after` (the split's start when `None` is the table's start),
/// up to the next read's `after`, as they stood at log position `as_of`. `as_of` is `None` when
/// the copy holds none of them (nothing was read there).
#[derive(Debug, Clone, PartialEq)]
pub struct CopyRead {
    pub after: Option<Row>,
    pub as_of: Option<Position>,
}

/// Keys of one split whose copied rows a stream target holds as an earlier read left them, not
/// as the split's checkpoint says: a run sent their rows and stopped before the checkpoint that
/// covers them, and the next run, reading the split again from that checkpoint at a later
/// position, found the broker already held them (it drops a message it already has). Their
/// changes go to the stream from the read of `position` (the split's position after the batch
/// that run was sending; its last read is the one that read them), so none is missing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldRows {
    pub task: String,
    pub position: Position,
    /// `change::key_identity` of each row.
    pub keys: Vec<String>,
}

/// A place data is read from: what every source does (probe, list its tables, forget what it
/// keeps for a job), and which of the reading capabilities it has. A capability is a trait of
/// its own ([`SnapshotSource`], [`ChangeSource`], [`CursorSource`]) that a source implements only
/// when it can; the engine asks for it here and never calls a method a source cannot honour.
/// The registry's declared [`Capabilities`] say the same before a source is built (the
/// conformance suite checks that they agree).
#[async_trait]
pub trait Source: Send + Sync {
    /// Probes connectivity, credentials and settings without reading data. Called by
    /// `sluice check` and at the start of every run; an error names the source side.
    async fn check(&self) -> Result<Vec<CheckItem>>;

    /// Lists the tables that the job's `tables` filter selects, with their schemas, sorted by
    /// name. Called once per run at planning. A filter entry that names a table which does not
    /// exist (no glob characters) is an error.
    async fn discover(&self) -> Result<Vec<TableSchema>>;

    /// The job is reset or deleted: releases what the source keeps for this job alone (a
    /// PostgreSQL job's own replication slot, which holds the server's WAL until it is dropped,
    /// and its publication), never what the user named. The default keeps nothing.
    async fn forget(&self) -> Result<()> {
        Ok(())
    }

    /// The source's snapshot reader: its tables in splits. `None` for a log of events only.
    fn snapshot(&self) -> Option<&dyn SnapshotSource> {
        None
    }

    /// The source's change log. `None` for a source without one.
    fn changes(&self) -> Option<&dyn ChangeSource> {
        None
    }

    /// The source's cursor reads (`incremental-cursor`). `None` for a source that cannot read a
    /// table by a column's range.
    fn cursor(&self) -> Option<&dyn CursorSource> {
        None
    }
}

impl<'s> dyn Source + 's {
    /// The snapshot reader, for a job that needs one; the registry refuses such a job from a
    /// source without one before it runs, so this error is a last guard.
    pub(crate) fn needs_snapshot(&self) -> Result<&dyn SnapshotSource> {
        self.snapshot().ok_or_else(|| {
            Error::new(ErrorKind::Config, "this source has no snapshot of its tables")
                .on(Side::Source)
                .hint("use mode: cdc")
        })
    }

    /// The change log, for a job that streams.
    pub fn needs_changes(&self) -> Result<&dyn ChangeSource> {
        self.changes().ok_or_else(|| {
            Error::new(ErrorKind::Config, "this source has no change log").on(Side::Source).hint("use mode: snapshot")
        })
    }

    /// The cursor reads, for an `incremental-cursor` job.
    pub(crate) fn needs_cursor(&self) -> Result<&dyn CursorSource> {
        self.cursor().ok_or_else(|| {
            Error::new(ErrorKind::Config, "this source cannot read a table by a cursor column")
                .on(Side::Source)
                .hint("use mode snapshot, or a MySQL, PostgreSQL or SQLite source")
        })
    }
}

/// Writes, inside a connector's `impl Source` or `impl Sink`, the accessors of the capability
/// traits the connector implements itself, each as `accessor: Trait`:
/// `sluice_core::capabilities!(snapshot: SnapshotSource, changes: ChangeSource)` for a source,
/// `sluice_core::capabilities!(folded_changes: FoldedChangeSink)` for a target.
#[macro_export]
macro_rules! capabilities {
    ($($accessor:ident: $capability:ident),+ $(,)?) => {
        $(
            fn $accessor(&self) -> Option<&dyn $crate::connector::$capability> {
                Some(self)
            }
        )+
    };
}

/// A source whose tables can be read in splits: the snapshot, the copy of `snapshot+cdc`, the
/// rows of a cursor window, and the rows of dirty records read again.
#[async_trait]
pub trait SnapshotSource: Send + Sync {
    /// Cuts one table into splits whose union is the whole table with no row in two splits.
    /// Called at planning only for tables with no stored plan, so ids stay stable on resume.
    async fn split(&self, table: &Arc<TableSchema>, hint: SplitHint) -> Result<Vec<Split>>;

    /// Opens a reader on a split, resuming strictly after `resume_after` when given. Called by
    /// the task that owns the split, possibly again after a retry.
    async fn open(&self, split: &Split, resume_after: Option<&Position>, batch_rows: usize) -> Result<Box<dyn Reader>>;

    /// Opens a reader as `open` does whose batches hand the rows on undecoded, in `encoding`
    /// (`Batch::encoded`), for a target that reads that format itself; `None` when this source
    /// cannot for this split (the engine then calls `open`). Asked only for tables the job maps
    /// unchanged. A source that can hold values the target must judge first (zero dates) says
    /// `None`. The default is `None`.
    async fn open_encoded(
        &self,
        _split: &Split,
        _resume_after: Option<&Position>,
        _batch_rows: usize,
        _encoding: RowEncoding,
    ) -> Result<Option<Box<dyn Reader>>> {
        Ok(None)
    }

    /// A split of `table` holding exactly the rows with these primary keys (values in key
    /// order), read as any split (`open`): how a dirty record of the change stream is read again
    /// from the source for a replay. A source that cannot read rows by key says so
    /// (`ErrorKind::Config`).
    fn key_split(&self, table: &Arc<TableSchema>, _keys: &[Row]) -> Result<Split> {
        Err(Error::new(ErrorKind::Config, format!("this source cannot read rows of table {} by their key", table.name))
            .on(Side::Source)
            .hint("fix the rows in the target by hand, then discard their records"))
    }

    /// Where in the log the copy of `split` read its rows, from the split's last durable copy
    /// position (`None`: nothing copied yet): its reads in key order, the first starting at the
    /// split's own start. A stream into event targets uses them to send, per key, only the
    /// changes after the copied row, so no consumer sees a key go back in time at the switch.
    /// Empty when the source cannot tell (its reads are not consistent snapshots at a position).
    fn copy_reads(&self, _split: &Split, _copied: Option<&Position>) -> Result<Vec<CopyRead>> {
        Ok(Vec::new())
    }
}

/// The error of reading rows of `table` by key (`SnapshotSource::key_split`) when it has none.
pub fn no_key_to_read_by(table: &TableName) -> Error {
    Error::new(ErrorKind::Config, format!("table {table} has no primary key: its rows cannot be read by key"))
        .on(Side::Source)
        .hint("fix the rows in the target by hand, then discard their records")
}

/// A source with a change log: `cdc` and the stream of `snapshot+cdc`.
#[async_trait]
pub trait ChangeSource: Send + Sync {
    /// The source's current change-log position (for MySQL: the GTID set and binlog file:pos),
    /// or `None` for sources without a log. Called once, when a job is first planned and before
    /// any split is read, so a change stream started from it misses nothing the snapshot missed.
    async fn log_position(&self) -> Result<Option<Position>> {
        Ok(None)
    }

    /// The position a job's change stream starts from, called once, when the job is first
    /// planned, in place of `log_position`: a source that keeps its log for its readers makes
    /// the job's place in it first (a PostgreSQL replication slot). Never called again for the
    /// same plan, so a place lost later is found missing, not made again. The default is
    /// `log_position`.
    async fn start_log(&self) -> Result<Option<Position>> {
        self.log_position().await
    }

    /// How much of the source's change log lies past `position` (the stream's checkpoint), and
    /// how much the server keeps before it: what the source may purge before the stream loses
    /// its place. `None` for sources without a log. Called by the stream every few seconds.
    async fn log_backlog(&self, _position: &Position) -> Result<Option<LogBacklog>> {
        Ok(None)
    }

    /// The change log the source keeps for this job alone, in bytes, read or not: a PostgreSQL
    /// replication slot's WAL from its restart position to the server's current one. `None` for
    /// a source that keeps nothing for one job (a binlog is kept for every reader alike), or when
    /// what it would keep is gone. A server asks it of stopped jobs, which hold it until they run
    /// again or are reset.
    async fn held_log(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// The position a `cdc` job names to start from (`source.start_position`), if any. Without
    /// one, a job starts from the position captured when it was first planned.
    async fn start_position(&self) -> Result<Option<Position>> {
        Ok(None)
    }

    /// Where a job's stream ends (`source.stop_position`), if it names one: the stream commits
    /// the transaction that reaches it (`reached`) and ends successfully, applying nothing after.
    fn stop_position(&self) -> Option<Position> {
        None
    }

    /// Opens the change stream of the selected tables strictly after `after`, a transaction
    /// boundary (a position from `log_position`, `start_position` or a `Commit`). Called by the
    /// stream task, again after every retry, always from the last position durable in the target.
    /// A position the source no longer has is an `ErrorKind::PositionLost` error, at once.
    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>>;

    /// The schema a target gives a table that DDL in the change stream created or altered, so
    /// that it is the table a snapshot would have made (types with their own widths, defaults,
    /// counters, comments, indexes): the source describes the table as `discover` does, and
    /// keeps of that description what agrees with `logged`, the table as the change log gives
    /// it at the rows being applied, with which those rows were decoded (the table may have
    /// changed again since). Whatever disagrees stays as `logged` says. Called by the stream
    /// task once per created or altered table, before the target takes its new schema. The
    /// default is `logged` as it is: a log that carries every detail it has.
    async fn describe_logged(&self, logged: &TableSchema) -> Result<TableSchema> {
        Ok(logged.clone())
    }

    /// Whether the target applies this source's changes by key always, as it does inside a
    /// `snapshot+cdc` replay window: an insert replaces the row, an update or a delete of a row
    /// the target lacks is no error. True for streams of change events, where the producer's
    /// snapshot rows and the changes around them overlap.
    fn applies_by_key(&self) -> bool {
        false
    }

    /// Whether `position` is at or past `mark` in the source's log. Both come from this source.
    fn reached(&self, _position: &Position, _mark: &Position) -> bool {
        true
    }
}

/// A source that reads a table by a cursor column's range (`incremental-cursor`).
#[async_trait]
pub trait CursorSource: Send + Sync {
    /// The window of a cursor-incremental batch of `table` (`crate::cursor`): from `mark` (the
    /// previous batch's, in this source's JSON form; `None` on the first batch) lowered by
    /// `cursor.lookback_secs`, through the column's highest value now. A column the table lacks,
    /// or a lookback on a column that is not a time, is an error naming the table and column.
    /// Called once per table and batch, at planning; `SnapshotSource::open` then reads only the
    /// rows of `Split::window`.
    async fn cursor_window(
        &self,
        table: &TableSchema,
        cursor: &CursorSpec,
        mark: Option<&serde_json::Value>,
    ) -> Result<CursorWindow>;
}

/// What a change stream yields, in log order.
#[derive(Debug, Clone)]
pub enum StreamEvent {
    /// Row changes of the open source transaction, in order. More may follow before its
    /// `Commit`: a large transaction arrives in pieces, so memory stays bounded.
    Changes(Vec<Change>),
    /// The open transaction committed. `position` is where the stream resumes after it;
    /// `committed_at` is the source's commit time in Unix seconds.
    Commit { position: Position, committed_at: u64 },
    /// The source moved on with nothing for this job: a transaction on other tables, a log
    /// rotation, a heartbeat. Only ever between transactions.
    Advance { position: Position, committed_at: u64 },
    /// A transaction Sluice itself wrote into the source, passed over by a `two_way` job (the
    /// other job of the pair applied it). Only ever between transactions. The position moves on
    /// without a target write of its own, so a pair at rest stays at rest: a checkpoint written
    /// for it would be the other side's next echo.
    Echo { position: Position, committed_at: u64 },
    /// A DDL statement on selected tables, a transaction of its own. `statement` is its text,
    /// for messages; `changes` carry source table names.
    SchemaChange { statement: String, changes: Vec<SourceSchemaChange>, position: Position, committed_at: u64 },
    /// The stream reached the job's stop time (`source.stop_position: {time: …}`): the next
    /// transaction, dated `committed_at`, lies at or after it and is not part of the job.
    /// `position` is where that transaction begins. Only ever between transactions; nothing
    /// follows.
    End { position: Position, committed_at: u64 },
}

/// A DDL statement's effect on source tables, as the change stream saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSchemaChange {
    Create(TableName),
    Drop(TableName),
    Rename {
        from: TableName,
        to: TableName,
    },
    Truncate(TableName),
    /// Columns added, dropped, renamed (`renamed`: old and new name) or changed in type
    /// (`retyped`); the table's schema after the statement comes with its next rows.
    Alter {
        table: TableName,
        renamed: Vec<(String, String)>,
        retyped: Vec<String>,
    },
}

impl SourceSchemaChange {
    /// The tables the statement touches (both names of a rename).
    pub fn tables(&self) -> Vec<&TableName> {
        match self {
            SourceSchemaChange::Create(table)
            | SourceSchemaChange::Drop(table)
            | SourceSchemaChange::Truncate(table)
            | SourceSchemaChange::Alter { table, .. } => vec![table],
            SourceSchemaChange::Rename { from, to } => vec![from, to],
        }
    }
}

/// A DDL statement's effect to apply to a target, with target names and, for created and
/// altered tables, the schema the source's log gives the table after it.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaChange {
    Create(TableSchema),
    Drop(TableName),
    Rename { from: TableName, to: TableName },
    Truncate(TableName),
    Alter { table: TableSchema, renamed: Vec<(String, String)>, retyped: Vec<String> },
}

/// A source's change log, read from a transaction boundary.
#[async_trait]
pub trait ChangeStream: Send {
    /// The next event, waiting for one. Never yields a partial transaction's `Commit`; a
    /// silent or broken connection is an `ErrorKind::Unavailable` error, after which the stream
    /// task reopens the stream from its last durable position.
    async fn next(&mut self) -> Result<StreamEvent>;

    /// Everything up to `position` (a `Commit` or `Advance` position of this stream) is durable
    /// in the target: a source that keeps its log for its readers may release it (a PostgreSQL
    /// slot advances its confirmed position, a broker commits its offset). Called between
    /// `next` calls after each target commit, never before; a source whose log does not wait for
    /// readers ignores it.
    async fn ack(&mut self, _position: &Position) -> Result<()> {
        Ok(())
    }
}

/// When a change writer wants the stream's groups committed, if not at every pause of the
/// stream: a lake table takes a commit every few seconds (each one rewrites the files holding the
/// keys it changes), not one per source transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitCadence {
    /// A group commits this long after its first transaction...
    pub every: std::time::Duration,
    /// ...or once it holds this many row changes, whichever comes first.
    pub rows: u64,
}

/// The end of one source transaction, as an event writer sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct TransactionEnd {
    /// Names the transaction: unique, and increasing in log order (the source's commit
    /// position, as text).
    pub id: String,
    /// The source's commit time, Unix seconds.
    pub committed_at: u64,
    /// Where the stream resumes after this transaction.
    pub position: Position,
    /// Row events of the transaction that reached this sink (after the transform stage).
    pub events: u64,
    /// The transaction is inside a `snapshot+cdc` job's replay window: its changes may already
    /// be in the copy, so a sink that keys its records should let it replace them.
    pub replay: bool,
}

/// Reads one split in order.
#[async_trait]
pub trait Reader: Send {
    /// The next batch, or `None` when the split is exhausted. Each batch's position is the one to
    /// resume after once the batch is durable in the target. Pull-based: the engine calls it
    /// only when it has room, which is the backpressure.
    async fn next(&mut self) -> Result<Option<Batch>>;

    /// Tells the source that everything up to `position` is durable in the target, so it may
    /// release logs or offsets. Called after the checkpoint commit, never before.
    async fn ack(&mut self, _position: &Position) -> Result<()> {
        Ok(())
    }
}

/// A target table and the tasks (split ids) whose checkpoints vouch for its rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableTasks {
    pub table: TableName,
    pub tasks: Vec<String>,
}

/// Whether a table's checkpoints still describe the table a target holds
/// (`Sink::verify_checkpoints`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// They do (or there are none).
    Holds,
    /// They must be forgotten, so the table's splits are copied again: the table is empty
    /// although they say rows were written (emptied, or dropped and created again).
    Forget,
    /// It is another table than they were written against (created again), and it holds rows.
    Replaced,
}

impl Binding {
    /// Judges a table from the rows its checkpoints say were written, the identity recorded
    /// when they were last checked (`bound`), its identity now (a target's own notion: an OID,
    /// a table id; `None` when the target cannot tell), and whether it holds rows.
    pub fn judge(rows_claimed: u64, bound: Option<&str>, identity: Option<&str>, has_rows: bool) -> Binding {
        let other_table = matches!((bound, identity), (Some(bound), Some(identity)) if bound != identity);
        if rows_claimed == 0 || (!other_table && has_rows) {
            Binding::Holds
        } else if has_rows {
            Binding::Replaced
        } else {
            Binding::Forget
        }
    }
}

/// The error for target tables replaced, outside the job, by tables holding other rows than the
/// job's checkpoints describe.
pub(crate) fn replaced_tables(job: &str, tables: &[String]) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "{} {} not the table{} job {job} copied into: {} created again since and {} rows the job's checkpoints do not describe",
            tables.join(", "),
            if tables.len() == 1 { "is" } else { "are" },
            if tables.len() == 1 { "" } else { "s" },
            if tables.len() == 1 { "it was" } else { "they were" },
            if tables.len() == 1 { "holds" } else { "hold" },
        ),
    )
    .on(Side::Target)
    .hint(format!("to copy everything again into emptied tables run `sluice run --restart` (or `sluice reset` first); to copy only these, drop or empty them and run again; if a table was only rebuilt (MySQL OPTIMIZE TABLE, ALTER TABLE ... FORCE) and holds the job's rows, delete its row of job {job} from the target's sluice.bindings"))
}

/// A place data is written to.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Probes connectivity, credentials and writability; an error names the target side.
    async fn check(&self) -> Result<Vec<CheckItem>>;

    /// Whether the target stores MySQL zero dates (`0000-00-00`) as they are. When it does not,
    /// the runner applies the job's `errors.zero_dates` policy before `write`.
    fn holds_zero_dates(&self) -> bool {
        false
    }

    /// The name a source table gets in this target.
    fn target_name(&self, source: &TableName) -> TableName;

    /// The statements that create `tables` (target names) in this target, for `sluice schema`.
    /// Targets without DDL (files) describe what they would write instead.
    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String>;

    /// Creates the missing tables (when the job allows it) and checks that the others exist.
    /// Idempotent; called once per run, before any writer opens. `tables` carry target names.
    async fn prepare(&self, tables: &[TableSchema]) -> Result<()>;

    /// `prepare` for a run whose copy loads the tables next, `finish` running once every split
    /// is in: a table created now may leave out what `finish` builds faster over loaded rows
    /// (PostgreSQL: the primary key), except the `merged` ones (several source tables load
    /// into each), whose keys must refuse a row another source table's row took. A run that
    /// only streams calls `prepare`.
    async fn prepare_for_copy(&self, tables: &[TableSchema], _merged: &[TableName]) -> Result<()> {
        self.prepare(tables).await
    }

    /// The names of the columns target table `table` has, in the target's spelling: `Some` of
    /// an empty list when it does not exist, `None` for a target without table definitions of
    /// its own (files, event streams, lakes). Read by a stream under `schema_changes: ignore`,
    /// whose rows reach the table with those columns alone.
    async fn table_columns(&self, _table: &TableName) -> Result<Option<Vec<String>>> {
        Ok(None)
    }

    /// Builds what is best built after the rows are in (secondary indexes). Idempotent; called
    /// once at the end of a run in which every split completed. `tables` carry target names.
    async fn finish(&self, _tables: &[TableSchema]) -> Result<()> {
        Ok(())
    }

    /// Judges whether the checkpoints of each table's tasks still describe the table the target
    /// holds (`Binding::judge`: a table emptied, or dropped and created again, outside the job
    /// since they were written), and records the identity of each table whose checkpoints hold,
    /// for the next run. Changes no checkpoint. Called once per run after `prepare`, before any
    /// writer opens; a target whose checkpoints are its data (whole files) has nothing to judge
    /// and answers nothing.
    async fn verify_checkpoints(&self, _job: &str, _tables: &[TableTasks]) -> Result<Vec<(TableName, Binding)>> {
        Ok(Vec::new())
    }

    /// Forgets the checkpoints of these tables' tasks, so their splits are copied again, and
    /// records the tables' identity now.
    async fn forget_checkpoints(&self, _job: &str, _tables: &[TableTasks]) -> Result<()> {
        Ok(())
    }

    /// Forgets every checkpoint of `job` (the stream's too) and empties `tables`, so that the
    /// job's next run copies everything again (`sluice run --restart`, `sluice reset`).
    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()>;

    /// Takes the job's fence in the target for this sink's epoch (a sink built with a `Fence`):
    /// from then on a commit of an older epoch fails with `ErrorKind::Fenced`. Called once when a
    /// cluster worker starts a task, before any checkpoint is read, so the new owner reads the
    /// checkpoint only after every commit of the old owner has landed or been refused. Fails
    /// with `ErrorKind::Fenced` when the target already holds a newer epoch. A sink without a
    /// fence does nothing.
    async fn claim(&self, _job: &str) -> Result<()> {
        Ok(())
    }

    /// The checkpoints the target holds for these tasks (missing ones left out). The default
    /// asks the change writer of each task.
    async fn checkpoints(&self, job: &str, tasks: &[String]) -> Result<Vec<Checkpoint>> {
        let mut found = Vec::with_capacity(tasks.len());
        for task in tasks {
            if let Some(checkpoint) = AnyChangeWriter::open(self, job, task).await?.recover().await? {
                found.push(checkpoint);
            }
        }
        Ok(found)
    }

    /// Opens the writer of one task's snapshot rows. `table` carries the target name.
    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>>;

    /// The target's writer of change streams folded per key (SQL tables, lakes). `None` for a
    /// target that takes no stream, or takes it as events.
    fn folded_changes(&self) -> Option<&dyn FoldedChangeSink> {
        None
    }

    /// The target's writer of change streams as row events (brokers, standard output). `None`
    /// for a target that takes no stream, or takes it folded.
    fn event_changes(&self) -> Option<&dyn EventChangeSink> {
        None
    }
}

/// A target that applies change streams folded per key.
#[async_trait]
pub trait FoldedChangeSink: Send + Sync {
    /// Opens the writer that applies a change stream's transactions. Called by the stream task,
    /// again after every retry.
    async fn open_folded(&self, job: &str, task: &str) -> Result<Box<dyn FoldedChangeWriter>>;

    /// Opens the writer of the stream's lane `lane` (1 and up; lane 0 is `open_folded`'s): it
    /// writes groups while the other lanes' commit, each group's commit after the group before
    /// it. `None` when the target cannot take another lane now (the stream applies on one).
    async fn open_lane(&self, _job: &str, _task: &str, _lane: usize) -> Result<Option<Box<dyn FoldedChangeWriter>>> {
        Ok(None)
    }

    /// Whether a `snapshot+cdc` copy is written under a hidden name and published by the
    /// stream (`crate::hidden`): a target whose change writer can rename tables at a group's
    /// commit (`FoldedChangeWriter::publish`) and which answers `existing_tables`.
    fn hides_copies(&self) -> bool {
        false
    }

    /// Which of `tables` (target names) the target has now. Only called when `hides_copies`.
    async fn existing_tables(&self, tables: &[TableName]) -> Result<Vec<TableName>> {
        Ok(tables.to_vec())
    }
}

/// A target that takes change streams as row events.
#[async_trait]
pub trait EventChangeSink: Send + Sync {
    /// Opens the writer that sends a change stream's events. Called by the stream task, again
    /// after every retry.
    async fn open_events(&self, job: &str, task: &str) -> Result<Box<dyn EventWriter>>;

    /// The rows of these snapshot tasks that the target holds as an earlier read of them left
    /// them (`HeldRows`), read without claiming the tasks. Called once, when the stream of a
    /// `snapshot+cdc` job starts. A target whose commits make a task's events and checkpoint
    /// visible together (a transaction) holds none.
    async fn held_rows(&self, _job: &str, _tasks: &[String]) -> Result<Vec<HeldRows>> {
        Ok(Vec::new())
    }
}

/// A change writer of either shape, as a target opens it for a stream (`AnyChangeWriter::open`).
pub(crate) enum AnyChangeWriter {
    Folded(Box<dyn FoldedChangeWriter>),
    Events(Box<dyn EventWriter>),
}

impl std::fmt::Debug for AnyChangeWriter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            AnyChangeWriter::Folded(_) => "AnyChangeWriter::Folded",
            AnyChangeWriter::Events(_) => "AnyChangeWriter::Events",
        })
    }
}

impl AnyChangeWriter {
    /// Opens the change writer of `task`: folded when the target applies changes folded per
    /// key, else events. A target with neither is a configuration error (the registry refuses
    /// such a job before it runs).
    pub async fn open<S: Sink + ?Sized>(sink: &S, job: &str, task: &str) -> Result<AnyChangeWriter> {
        if let Some(folded) = sink.folded_changes() {
            return Ok(AnyChangeWriter::Folded(folded.open_folded(job, task).await?));
        }
        if let Some(events) = sink.event_changes() {
            return Ok(AnyChangeWriter::Events(events.open_events(job, task).await?));
        }
        Err(Error::new(ErrorKind::Config, "this target cannot apply a change stream").on(Side::Target))
    }

    /// What writers of both shapes do.
    pub fn common(&mut self) -> &mut dyn ChangeWriter {
        match self {
            AnyChangeWriter::Folded(writer) => writer.as_mut(),
            AnyChangeWriter::Events(writer) => writer.as_mut(),
        }
    }

    /// The stream's checkpoint as the target holds it (`ChangeWriter::recover`).
    pub async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.common().recover().await
    }

    /// When the writer wants groups committed (`ChangeWriter::cadence`).
    pub fn cadence(&self) -> Option<CommitCadence> {
        match self {
            AnyChangeWriter::Folded(writer) => writer.cadence(),
            AnyChangeWriter::Events(writer) => writer.cadence(),
        }
    }

    /// Whether DDL commits the open transaction on its own (`FoldedChangeWriter::ddl_commits`;
    /// an event writer's never does).
    pub fn ddl_commits(&self) -> bool {
        match self {
            AnyChangeWriter::Folded(writer) => writer.ddl_commits(),
            AnyChangeWriter::Events(_) => false,
        }
    }

    /// The folded writer, where the caller needs one (hidden copies are published only by a
    /// target that applies changes folded: `FoldedChangeSink::hides_copies`).
    pub fn folded(&mut self) -> Result<&mut dyn FoldedChangeWriter> {
        match self {
            AnyChangeWriter::Folded(writer) => Ok(writer.as_mut()),
            AnyChangeWriter::Events(_) => Err(Error::new(
                ErrorKind::Config,
                "this target takes change events; it has no tables to rename or apply changes to by key",
            )
            .on(Side::Target)),
        }
    }
}

/// What every change writer does, folded or events: recover the stream's checkpoint, carry DDL,
/// and commit.
///
/// The protocol: `recover` once, then any number of writes (all in one open target
/// transaction) and `commit`. Like a `TableWriter`, a crash leaves the target before or after a
/// whole commit, so the stream resumes exactly after the last transaction applied. Tables carry
/// target names; keys and rows are in the order of the table's primary key and columns.
#[async_trait]
pub trait ChangeWriter: Send {
    /// The stream's checkpoint as the target holds it, or `None` before its first commit.
    async fn recover(&mut self) -> Result<Option<Checkpoint>>;

    /// Makes everything since the last commit durable together with `checkpoint`; on `Err`,
    /// none of it is.
    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()>;

    /// When groups commit. `None` (the default): as soon as no more transactions wait, a group
    /// of `limits.batch_rows` changes at most, 50 ms after its first transaction at the latest.
    /// Either way a group ends only at a source commit.
    fn cadence(&self) -> Option<CommitCadence> {
        None
    }

    /// Carries a DDL statement's effect to the target. Idempotent, because a target whose DDL
    /// commits on its own (MySQL) may see it again after a crash before the checkpoint: creating
    /// an existing table, dropping a missing one, renaming a renamed one, adding an existing
    /// column or dropping a missing one are no-ops. Followed by `commit`.
    async fn apply_schema_change(&mut self, change: &SchemaChange) -> Result<()>;
}

/// Applies a change stream folded per key within a group of transactions: one delete of the
/// keys that existed and one insert of the final rows per table. SQL tables show only the end
/// state of a group, and this is their fast path.
#[async_trait]
pub trait FoldedChangeWriter: ChangeWriter {
    /// Deletes the rows with these primary keys. With `expect_all`, a key with no row is an
    /// `ErrorKind::Conflict` error naming the table and the key; without it, missing rows are
    /// fine (the replay of changes a snapshot may already hold). For a table without a primary
    /// key each "key" is a whole row and deletes one row equal to it in every column, so a row
    /// listed twice deletes two of its duplicates.
    async fn delete(&mut self, table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()>;

    /// Inserts rows. A row whose primary key exists is an `ErrorKind::Conflict` error naming the
    /// table and the key. A row the target refuses for its content (a value out of its column's
    /// range, bytes its encoding refuses, a constraint other than the key) is left out, the
    /// others inserted, and returned with the reason (`find_refused`); a writer that cannot
    /// tell fails the call instead.
    async fn insert(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Vec<Refused>>;

    /// Updates rows in place by key: every column of each row but those `Value::Unchanged`,
    /// which the target keeps (an update whose log did not carry every value, and no earlier
    /// image of the key in the group), and whole rows where `updates_in_place` says so. Called
    /// between a group's deletes and its inserts. Returns the rows whose key the target lacks
    /// and those whose content the target refused, not updated (the engine then deletes them, as
    /// a row refused on insert is not there either).
    async fn update(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Updated>;

    /// Whether a row updated under the same key is best written by `update` rather than as a
    /// delete and an insert (PostgreSQL: an update that changes no indexed column adds no index
    /// entry). Only for tables with no unique index but the primary key: one statement updating
    /// many rows checks such an index row by row, so two rows swapping a value would collide.
    fn updates_in_place(&self) -> bool {
        false
    }

    /// Whether rows this writer sent can outlive a commit that failed (a target without
    /// transactions, as ClickHouse: a group's rows go before the checkpoint that covers them).
    /// The group run again after a crash, or after a paused worker was fenced, may then fold
    /// differently and find a key absent at its start and its end that the failed commit wrote:
    /// the engine then deletes every key a group leaves absent, whether or not the group found
    /// it there, so no such row outlives the replay.
    fn writes_outlive_failed_commits(&self) -> bool {
        false
    }

    /// The rows the target holds under these primary keys, locked until the open transaction
    /// ends, in any order (a key without a row has none): what a conflict policy (`conflict:`)
    /// judges each change against. Called inside the open transaction, before the group is
    /// written. The default, for targets that cannot read their rows back, refuses.
    async fn rows_by_key(&mut self, table: &TableSchema, keys: &[Row]) -> Result<Vec<Row>> {
        let _ = keys;
        Err(Error::new(
            ErrorKind::Config,
            format!("this target cannot read the rows of {} back to judge conflicts", table.name),
        )
        .on(Side::Target)
        .hint("remove `conflict:` from the job"))
    }

    /// Whether DDL commits the open transaction on its own (MySQL), so a schema change or a
    /// `publish` cannot share a transaction with rows and their checkpoint.
    fn ddl_commits(&self) -> bool {
        false
    }

    /// Gives each hidden copy (`crate::hidden`) its own name: `tables` are (hidden name, own
    /// name) pairs, renamed together, so readers see all of them at once or none. A pair whose
    /// hidden table is gone (published already, or dropped by the stream's DDL) is skipped; one
    /// whose own name is taken fails, naming both. Part of the open transaction where DDL is
    /// transactional; else (`ddl_commits`) one statement of its own, between commits.
    async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()>;

    /// Puts the hidden copy `hidden` in the place of table `own` (a resync): `own` is dropped and
    /// `hidden` takes its name, together, so readers see the one or the other. The default, for
    /// targets whose DDL is part of the open transaction, drops and renames in it; a target whose
    /// DDL commits on its own (`ddl_commits`) must make this idempotent, as a crash may come
    /// before the checkpoint that follows: without `hidden`, nothing is left to replace.
    async fn replace(&mut self, hidden: &TableName, own: &TableName) -> Result<()> {
        self.apply_schema_change(&SchemaChange::Drop(own.clone())).await?;
        self.apply_schema_change(&SchemaChange::Rename { from: hidden.clone(), to: own.clone() }).await
    }
}

/// Sends a change stream as row events, each as the source wrote it, in order, with each
/// transaction's end: event streams, whose readers see updates, order and transaction bounds.
#[async_trait]
pub trait EventWriter: ChangeWriter {
    /// The next row events of the open source transaction, in source order (an update carries
    /// its before and after images; tables carry target names). A large transaction comes in
    /// several calls; all of them become durable with the `commit` after its `transaction_end`.
    async fn events(&mut self, changes: &[Change]) -> Result<()>;

    /// The open source transaction ended. One or more transactions are followed by `commit`,
    /// which makes them durable with the checkpoint after the last one.
    async fn transaction_end(&mut self, end: &TransactionEnd) -> Result<()>;
}

/// A row a writer left out because the target refused its content.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// Its index in the rows the writer was given.
    pub index: usize,
    /// Why, naming the column when the target says which.
    pub reason: String,
}

/// What `FoldedChangeWriter::update` did not update: indexes into the rows it was given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Updated {
    /// Rows whose key the target lacks.
    pub missing: Vec<usize>,
    /// Rows whose content the target refused, with the reason; not updated.
    pub refused: Vec<Refused>,
}

/// Rows tried together inside the target's open transaction, each try undone on its own when a
/// row's content fails it (a savepoint): what `find_refused` needs of a writer.
#[async_trait]
pub trait RowTrial: Send {
    /// Writes `rows` of the rows being tried. `Ok(Some(reason))`: a row's content failed them
    /// and none of them was written; `Ok(None)`: they were; any other failure is an error.
    async fn try_rows(&mut self, rows: std::ops::Range<usize>) -> Result<Option<String>>;
}

/// Writes `count` rows through `trial`: all at once, and when a row's content fails them, the
/// halves again until each refused row is found alone; the others are written. Returns the
/// refused ones: a few tries per refused row, not one per row.
pub async fn find_refused(trial: &mut dyn RowTrial, count: usize) -> Result<Vec<Refused>> {
    let mut refused = Vec::new();
    let mut pending = Vec::with_capacity(8);
    pending.push(0..count);
    while let Some(rows) = pending.pop() {
        if rows.is_empty() {
            continue;
        }
        let Some(reason) = trial.try_rows(rows.clone()).await? else { continue };
        if rows.len() == 1 {
            refused.push(Refused { index: rows.start, reason });
            continue;
        }
        let middle = rows.start + rows.len() / 2;
        // Popped in row order: the first half next.
        pending.push(middle..rows.end);
        pending.push(rows.start..middle);
    }
    Ok(refused)
}

/// Writes one task's snapshot rows into a target table (or file).
///
/// The protocol: `recover` once, then any number of `write` and `commit`. What `write` stages
/// becomes durable only with the next `commit`, together with the checkpoint it is given, so a
/// crash at any instant leaves the target either before or after the whole commit.
#[async_trait]
pub trait TableWriter: Send {
    /// The checkpoint the target holds for this task, or `None` to start the split from scratch
    /// (a file target discards a partial file here). The engine resumes from this answer only:
    /// the target, not the local state, is the truth.
    async fn recover(&mut self) -> Result<Option<Checkpoint>>;

    /// Stages a batch. Rows the target refuses for their content (a constraint, an encoding)
    /// are returned as rejects with their key and reason; they are not staged. Any other failure
    /// is an error.
    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>>;

    /// Makes everything staged durable together with `checkpoint`. When it returns `Ok`, the
    /// data and the checkpoint are both durable; on `Err`, neither is.
    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()>;

    /// Whether the rows staged since the last commit should be committed now, asked after each
    /// `write`. A target that gains from fewer, larger commits (ClickHouse: each insert is a part
    /// its server merges again) says no until it holds enough; the engine commits at the end of a
    /// split whatever it says. The default commits every batch.
    fn wants_commit(&self) -> bool {
        true
    }

    /// Stages the removal of every row of this task's table, which the next `commit` makes
    /// durable with the first rows copied again: a split read whole (`Split::whole`) whose
    /// earlier attempt committed part of it starts over this way, so no row is copied twice.
    /// Transactional targets delete in the open transaction; a file target, which starts a
    /// split's part over at `recover`, has nothing to remove.
    async fn replace_all(&mut self) -> Result<()>;

    /// The bulk format this writer reads rows in as they are (`Batch::encoded`), sparing the
    /// copy their decoding and encoding again, when the job maps the table unchanged. A writer
    /// that says one takes batches in it as well as decoded ones, and finds a row the table
    /// refuses among them as it does among decoded rows. The default takes none.
    fn takes_encoded(&self) -> Option<RowEncoding> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows 0..n into a target that refuses the rows in `bad`, counting its tries.
    struct Trial {
        bad: Vec<usize>,
        written: Vec<usize>,
        tries: usize,
    }

    #[async_trait]
    impl RowTrial for Trial {
        async fn try_rows(&mut self, rows: std::ops::Range<usize>) -> Result<Option<String>> {
            self.tries += 1;
            match rows.clone().find(|row| self.bad.contains(row)) {
                Some(row) => Ok(Some(format!("row {row} refused"))),
                None => {
                    self.written.extend(rows);
                    Ok(None)
                }
            }
        }
    }

    #[tokio::test]
    async fn refused_rows_are_found_in_a_few_tries_and_the_others_written() {
        let mut trial = Trial { bad: vec![3, 700], written: Vec::new(), tries: 0 };
        let refused = find_refused(&mut trial, 1_000).await.unwrap();
        assert_eq!(
            refused,
            vec![
                Refused { index: 3, reason: "row 3 refused".into() },
                Refused { index: 700, reason: "row 700 refused".into() }
            ]
        );
        trial.written.sort_unstable();
        assert_eq!(trial.written, (0..1_000).filter(|row| *row != 3 && *row != 700).collect::<Vec<_>>());
        assert!(trial.tries <= 1 + 2 * 2 * 10, "{} tries", trial.tries);

        let mut clean = Trial { bad: Vec::new(), written: Vec::new(), tries: 0 };
        assert!(find_refused(&mut clean, 50).await.unwrap().is_empty());
        assert_eq!((clean.tries, clean.written.len()), (1, 50), "one try when nothing is refused");
        assert!(find_refused(&mut clean, 0).await.unwrap().is_empty());
    }
}
