//! What a cluster keeps in its coordination store, and under which keys. Every record is JSON.
//!
//! ```text
//! /sluice/jobs/{job}                 JobRecord: current version, desired state, generation
//! /sluice/versions/{job}/{version}   VersionRecord: the job document as submitted
//! /sluice/plans/{job}                PlanRecord: the leader's plan for one generation
//! /sluice/plan-pieces/{job}/{id}/{n} PlanPiece: the splits of a plan, in pieces of ≤ 512 KiB
//! /sluice/owners/{job}/{task}        Owner (leased): who runs a task; create revision = epoch
//! /sluice/tasks/{job}/{task}         TaskStatus: state, counters, position, last error
//! /sluice/runs/{job}/{time}-{task}   RunSummary of one finished task run
//! /sluice/workers/{id}               WorkerRecord (leased): address, capacity, tasks
//! /sluice/leader                     the leader's worker id (leased)
//! ```

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sluice_core::runner::VerifyReport;
use sluice_core::spec::JobSpec;
use sluice_core::state::Plan;
use sluice_core::{Error, ErrorKind, Result, Side, TableName};

use super::store::{Entry, Store};
use crate::job_text::{self, DocumentFormat, DocumentRules};

pub const ROOT: &str = "/sluice/";
pub const LEADER: &str = "/sluice/leader";

pub fn job_key(job: &str) -> String {
    format!("{ROOT}jobs/{job}")
}
pub fn versions_prefix(job: &str) -> String {
    format!("{ROOT}versions/{job}/")
}
pub fn version_key(job: &str, version: u32) -> String {
    format!("{}{version:08}", versions_prefix(job))
}
pub fn plan_key(job: &str) -> String {
    format!("{ROOT}plans/{job}")
}
pub fn plan_pieces_prefix(job: &str) -> String {
    format!("{ROOT}plan-pieces/{job}/")
}
fn plan_piece_key(job: &str, id: u64, index: u32) -> String {
    format!("{}{id:020}/{index:06}", plan_pieces_prefix(job))
}
pub fn owners_prefix(job: &str) -> String {
    format!("{ROOT}owners/{job}/")
}
pub fn owner_key(job: &str, task: &str) -> String {
    format!("{}{task}", owners_prefix(job))
}
pub fn statuses_prefix(job: &str) -> String {
    format!("{ROOT}tasks/{job}/")
}
pub fn status_key(job: &str, task: &str) -> String {
    format!("{}{task}", statuses_prefix(job))
}
pub fn runs_prefix(job: &str) -> String {
    format!("{ROOT}runs/{job}/")
}
pub fn verification_key(job: &str) -> String {
    format!("{ROOT}verifications/{job}")
}
pub fn repairs_prefix(job: &str) -> String {
    format!("{ROOT}repairs/{job}/")
}
pub fn worker_key(id: &str) -> String {
    format!("{ROOT}workers/{id}")
}

/// Whether the operator wants a job to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    Running,
    Stopped,
}

/// A job as the operator left it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    pub name: String,
    /// The version in force.
    pub version: u32,
    pub desired: Desired,
    /// Renewed (larger, from the clock) by every create, start, restart and new version: a plan
    /// and task states belong to one generation, and a worker stops a task of an older one.
    pub generation: u64,
    pub mode: String,
    pub updated_at: String,
    /// Tables added to the running job whose copy has not joined the stream yet.
    #[serde(default)]
    pub backfill: Option<BackfillRequest>,
    /// Tables the stream is to copy again while it runs (`POST /jobs/{name}/resync`); the
    /// stream's checkpoint says whether it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<sluice_core::runner::ResyncRequest>,
    /// The version in force's `schedule:`: the leader runs the job again by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<sluice_core::spec::ScheduleSpec>,
    /// The version in force's `after:`: the jobs whose batch N this job's batch N waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<sluice_core::spec::Dependency>,
    /// The version in force's `priority:`: when workers lack room, higher goes first.
    #[serde(default)]
    pub priority: u32,
    /// The version in force's `placement:`: the nodes that may claim its tasks.
    #[serde(default, skip_serializing_if = "sluice_core::spec::Placement::is_any")]
    pub placement: sluice_core::spec::Placement,
    /// The batches a schedule fired, and when it fires next (set by the leader).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches: Option<Batches>,
    /// The store revision this record was read at (not stored): a write back replaces it only
    /// if nobody wrote it since.
    #[serde(skip)]
    pub revision: u64,
}

/// A scheduled job's batches: each firing of its schedule runs the job again as batch N + 1.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batches {
    /// The last batch fired (0: none yet).
    pub batch: u64,
    /// Where a period counts from (Unix seconds): the first firing.
    pub anchor: i64,
    /// The next firing (Unix seconds); `None` when the schedule has no more.
    pub due_at: Option<i64>,
    /// A firing came while the batch ran, and runs when it ends (`overlap: queue`).
    pub queued: bool,
    /// Batches asked to run again (`POST /jobs/{job}/batches` with `from` and `to`): the next
    /// batch fired does that instead, and a firing due meanwhile waits for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun: Option<BatchRange>,
    /// The latest firings, fired or skipped, oldest first (at most `BATCH_HISTORY`).
    pub history: Vec<BatchRecord>,
}

/// Batches `from` to `to`, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRange {
    pub from: u64,
    pub to: u64,
}

/// What a batch did, summed over its tasks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRows {
    pub read: u64,
    pub written: u64,
    pub skipped: u64,
}

/// The cursor window a table's batch read (`incremental-cursor`), kept so the batch can run again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowBounds {
    pub after: Option<serde_json::Value>,
    pub through: Option<serde_json::Value>,
}

/// How many firings a job keeps in its history.
pub const BATCH_HISTORY: usize = 100;

/// One firing of a schedule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// The batch it ran as; `None` for a skipped firing.
    pub batch: Option<u64>,
    /// When it was due (Unix seconds).
    pub due_at: i64,
    /// When the leader fired it (RFC 3339), for a batch run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fired_at: Option<String>,
    /// The job generation the batch ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// `succeeded` or `failed` once the batch ended, or why the firing was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// When the leader saw the batch end (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// The batches this one ran again, for a rerun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<BatchRange>,
    /// Rows read, written and skipped, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<BatchRows>,
    /// Each table's cursor window (`incremental-cursor`), by source table name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub windows: std::collections::BTreeMap<String, WindowBounds>,
}

impl JobRecord {
    /// Whether the job runs in batches fired by the leader (`schedule:` or `after:`).
    pub fn batched(&self) -> bool {
        self.schedule.is_some() || !self.after.is_empty()
    }

    /// Whether it waits for a batch to fire: a batched job runs only a generation that a firing
    /// made, not the one it was submitted with (before its first batch) nor after a batch it
    /// skipped (a dependency failed with `on_failure: skip`).
    pub fn waiting_for_a_firing(&self) -> bool {
        self.batched()
            && !self
                .batches
                .as_ref()
                .is_some_and(|batches| batches.history.iter().any(|record| record.generation == Some(self.generation)))
    }
}

/// Reads a job record with its revision.
pub async fn load_job(store: &dyn Store, job: &str) -> Result<Option<JobRecord>> {
    Ok(load::<JobRecord>(store, &job_key(job))
        .await?
        .map(|(record, entry)| JobRecord { revision: entry.mod_revision, ..record }))
}

/// A generation after `previous`, from the clock in milliseconds: a job deleted and made again
/// under the same name never meets a task status of its predecessor.
pub fn next_generation(previous: u64) -> u64 {
    let now = sluice_core::clock::unix_millis();
    now.max(previous + 1)
}

/// Tables added to a running job (`POST /jobs/{name}/tables`): copied while the stream runs on
/// with the version before, then taken into the stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackfillRequest {
    pub id: String,
    /// Source names of the added tables.
    pub tables: Vec<String>,
    /// The version the stream runs while the tables are copied.
    pub stream_version: u32,
}

/// A backfill in a plan: what the stream needs to take the tables in, and whether their copy
/// is complete (then the plan runs the stream alone, with every table).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackfillPlan {
    pub backfill: sluice_core::runner::Backfill,
    pub copied: bool,
}

/// One version of a job's document, as it was submitted (secrets included: the API redacts
/// them on the way out).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionRecord {
    pub version: u32,
    pub format: DocumentFormat,
    pub document: String,
    pub created_at: String,
    /// How it came: `submitted`, `updated`, or `rollback to N`.
    pub origin: String,
}

/// What a task does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    Snapshot,
    Cdc,
}

/// One task of a plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskPlan {
    pub id: String,
    pub kind: TaskKind,
    /// The source tables a snapshot task copies.
    #[serde(default)]
    pub tables: Vec<TableName>,
    /// A group of one large table's splits that this snapshot task copies, without the table's
    /// indexes (its table task builds them once every group is done). None: the whole of
    /// `tables`. Positions, not ids, so the record stays small however many splits there are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splits: Option<SplitRange>,
    /// Tasks that must have succeeded (in the same generation) before this one may start.
    #[serde(default)]
    pub after: Vec<String>,
    /// The rows it copies, as the plan estimates them: a job's larger tasks are claimed first
    /// (`placement.rs`). 0 for the stream and for a table task whose groups copy its rows.
    #[serde(default)]
    pub estimated_rows: u64,
}

/// The leader's plan of one generation of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanRecord {
    pub generation: u64,
    pub version: u32,
    pub tasks: Vec<TaskPlan>,
    /// The splits and the source position every task of this plan shares. With `pieces`, the
    /// splits are kept apart (`load_plan` joins them): a plan of 100,000 splits is far larger
    /// than one etcd value may be, and every node reads every plan record at every tick.
    pub plan: Option<Plan>,
    #[serde(default)]
    pub pieces: Option<PlanPieces>,
    /// Why planning failed, when it did (the job is then `failed`).
    pub error: Option<ErrorRecord>,
    /// The version the stream task runs when it is not `version` (while tables are copied).
    #[serde(default)]
    pub stream_version: Option<u32>,
    #[serde(default)]
    pub backfill: Option<BackfillPlan>,
    /// The schedule's batch this plan runs (0 for a job without a schedule): a plan of a new
    /// batch starts the copy over.
    #[serde(default)]
    pub batch: u64,
    /// Each table's cursor window (`incremental-cursor`), by source table name: the batch's
    /// history keeps them once it ended, so the batch can run again.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub windows: std::collections::BTreeMap<String, WindowBounds>,
}

/// Where a plan's splits are kept: `count` pieces under `plan-pieces/{job}/{id}/`. A plan
/// carried over to a later generation keeps its pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanPieces {
    pub id: u64,
    pub count: u32,
}

/// A group of a table's splits: `count` splits from position `first` in the plan's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRange {
    pub first: usize,
    pub count: usize,
}

impl SplitRange {
    /// The ids of these splits of `table` in `plan`; an error when the plan has fewer (a task
    /// must never succeed having copied nothing).
    pub fn ids(&self, plan: &Plan, table: &TableName) -> Result<Vec<String>> {
        let planned =
            plan.tables.iter().find(|planned| planned.splits.first().is_some_and(|split| &split.table.name == table));
        let splits = planned.map(|planned| &planned.splits[..]).unwrap_or_default();
        let group = splits.get(self.first..self.first + self.count).ok_or_else(|| {
            Error::new(
                ErrorKind::State,
                format!(
                    "the plan has {} splits of {table}, not the {}..{} this task copies",
                    splits.len(),
                    self.first,
                    self.first + self.count
                ),
            )
            .on(Side::State)
        })?;
        Ok(group.iter().map(|split| split.id.clone()).collect())
    }
}

/// The most JSON one piece holds: well under etcd's default request limit of 1.5 MiB.
const PIECE_BYTES: usize = 512 * 1024;

/// Some splits of a plan, each table's schema written once per piece.
#[derive(Debug, Serialize, Deserialize)]
struct PlanPiece {
    tables: Vec<PieceTable>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PieceTable {
    target: TableName,
    /// This continues the last table of the previous piece.
    #[serde(default)]
    continued: bool,
    /// The schema of the splits (none for a table without splits).
    schema: Option<std::sync::Arc<sluice_core::TableSchema>>,
    splits: Vec<PieceSplit>,
}

#[derive(Debug, Serialize, Deserialize)]
struct PieceSplit {
    id: String,
    descriptor: serde_json::Value,
    estimated_rows: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    whole: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    window: Option<sluice_core::cursor::CursorWindow>,
    /// Only for a split whose schema is not its table's in this piece.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schema: Option<std::sync::Arc<sluice_core::TableSchema>>,
}

/// Cuts a plan's splits into pieces of about `limit` bytes of JSON at most (a single split
/// larger than that gets a piece of its own).
fn pieces_of(plan: &Plan, limit: usize) -> Vec<PlanPiece> {
    let mut pieces = Vec::new();
    let mut piece = PlanPiece { tables: Vec::new() };
    let mut size = 0;
    for table in &plan.tables {
        if table.splits.is_empty() {
            piece.tables.push(PieceTable {
                target: table.target.clone(),
                continued: false,
                schema: None,
                splits: Vec::new(),
            });
            continue;
        }
        let mut open = false;
        let mut continued = false;
        for split in &table.splits {
            let window_size = split.window.as_ref().map_or(0, |window| encode(window).len());
            let split_size = split.id.len() + split.descriptor.to_string().len() + window_size + 64;
            if size > 0 && size + split_size > limit {
                pieces.push(std::mem::replace(&mut piece, PlanPiece { tables: Vec::new() }));
                size = 0;
                continued = open;
                open = false;
            }
            if !open {
                size += encode(&*split.table).len() + 64;
                piece.tables.push(PieceTable {
                    target: table.target.clone(),
                    continued,
                    schema: Some(split.table.clone()),
                    splits: Vec::new(),
                });
                open = true;
            }
            let current = piece.tables.last_mut().expect("a table is open");
            let schema = (current.schema.as_ref() != Some(&split.table)).then(|| split.table.clone());
            size += split_size + schema.as_ref().map_or(0, |schema| encode(&**schema).len());
            current.splits.push(PieceSplit {
                id: split.id.clone(),
                descriptor: split.descriptor.clone(),
                estimated_rows: split.estimated_rows,
                whole: split.whole,
                window: split.window.clone(),
                schema,
            });
        }
    }
    pieces.push(piece);
    pieces
}

/// Joins pieces back into the plan `header` (which has the source position, no tables).
fn join_pieces(mut plan: Plan, pieces: Vec<PlanPiece>) -> Plan {
    for piece in pieces {
        for table in piece.tables {
            let schema = table.schema;
            let splits = table.splits.into_iter().filter_map(|split| {
                Some(sluice_core::connector::Split {
                    id: split.id,
                    table: split.schema.or_else(|| schema.clone())?,
                    descriptor: split.descriptor,
                    estimated_rows: split.estimated_rows,
                    whole: split.whole,
                    window: split.window,
                })
            });
            match plan.tables.last_mut() {
                Some(last) if table.continued => last.splits.extend(splits),
                _ => plan
                    .tables
                    .push(sluice_core::state::PlannedTable { target: table.target, splits: splits.collect() }),
            }
        }
    }
    plan
}

/// Stores a plan's splits in pieces (guarded), and returns the record's view of them: the plan
/// without its splits and where the pieces are.
pub async fn store_plan(
    store: &dyn Store,
    job: &str,
    id: u64,
    plan: &Plan,
    guard: &super::store::Guard,
) -> Result<Option<(Plan, PlanPieces)>> {
    let pieces = pieces_of(plan, PIECE_BYTES);
    for (index, piece) in pieces.iter().enumerate() {
        if !store.put_guarded(&plan_piece_key(job, id, index as u32), &encode(piece), guard).await? {
            return Ok(None);
        }
    }
    let header =
        Plan { tables: Vec::new(), source_position: plan.source_position.clone(), hidden: plan.hidden.clone() };
    Ok(Some((header, PlanPieces { id, count: pieces.len() as u32 })))
}

/// Removes the pieces of every plan of `job` but the one with `keep` (those of replaced plans,
/// and of plans whose record was never stored).
pub async fn remove_other_pieces(store: &dyn Store, job: &str, keep: Option<u64>) -> Result<()> {
    let prefix = plan_pieces_prefix(job);
    let mut ids: Vec<String> = store
        .list(&prefix)
        .await?
        .into_iter()
        .filter_map(|entry| Some(entry.key[prefix.len()..].split_once('/')?.0.to_owned()))
        .collect();
    ids.dedup();
    for id in ids {
        if keep.is_none_or(|keep| id != format!("{keep:020}")) {
            store.delete_prefix(&format!("{prefix}{id}/")).await?;
        }
    }
    Ok(())
}

/// A fresh id for a plan's pieces: pieces are never written over, so a worker reading a plan
/// never meets half of another one.
pub fn new_pieces_id() -> u64 {
    sluice_core::clock::unix_nanos()
}

/// The whole plan of a record: its splits joined from their pieces when they are kept apart.
pub async fn load_plan(store: &dyn Store, job: &str, record: &PlanRecord) -> Result<Option<Plan>> {
    let (Some(header), Some(pieces)) = (record.plan.clone(), record.pieces) else { return Ok(record.plan.clone()) };
    let mut loaded = Vec::with_capacity(pieces.count as usize);
    for index in 0..pieces.count {
        let key = plan_piece_key(job, pieces.id, index);
        let entry = store.get(&key).await?.ok_or_else(|| {
            Error::new(ErrorKind::Unavailable, format!("coordination store: piece {key} of the plan is missing"))
                .on(Side::State)
        })?;
        loaded.push(decode(&entry)?);
    }
    Ok(Some(join_pieces(header, loaded)))
}

/// An error as the API shows it: which side, and the message (secrets scrubbed).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorRecord {
    pub side: Option<String>,
    pub message: String,
}

impl From<&Error> for ErrorRecord {
    fn from(error: &Error) -> ErrorRecord {
        ErrorRecord { side: error.side().map(|side: Side| side.to_string()), message: error.to_string() }
    }
}

/// Who runs a task; the key is leased by the worker, so it vanishes with the worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Owner {
    pub worker: String,
    pub generation: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    Running,
    /// It failed for a reason that may heal and waits to run again from its checkpoint
    /// (`restart:`), here or, once it has been handed over, on another worker.
    Restarting,
    Succeeded,
    Failed,
    Stopped,
}

/// A task's state as its last owner reported it (written only while the owner holds the task).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskStatus {
    pub generation: u64,
    pub state: TaskState,
    pub worker: String,
    pub epoch: u64,
    pub phase: Option<String>,
    pub position: Option<serde_json::Value>,
    pub lag_secs: Option<u64>,
    pub rows_read: u64,
    pub rows_written: u64,
    pub rows_skipped: u64,
    pub rows_per_sec: f64,
    pub error: Option<ErrorRecord>,
    pub updated_at: String,
    /// Its restarts in this generation, carried from worker to worker.
    #[serde(default)]
    pub restarts: sluice_core::retry::Restarts,
    /// Workers that kept failing it and handed it over, in a row: they claim it only when no
    /// other live worker has room.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<String>,
    #[serde(default)]
    pub bytes_read: u64,
    /// Source transactions a change stream applied in this generation.
    #[serde(default)]
    pub transactions_applied: u64,
    /// Unix seconds before which the target holds every change of the source (a change
    /// stream); carried from attempt to attempt, so the lag keeps growing while it restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fresh_through: Option<u64>,
    /// Transactions per apply-latency bucket (`sluice_core::stats::LATENCY_BOUNDS_MS`, then an
    /// open bucket), source commit to target commit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub latency: Vec<u64>,
    /// The sum of those latencies, in milliseconds.
    #[serde(default)]
    pub latency_sum_ms: u64,
    /// The source's log past the stream's checkpoint, as last measured (a change stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_backlog: Option<sluice_core::connector::LogBacklog>,
}

impl TaskStatus {
    /// Seconds the target is behind the source at `now` (Unix seconds): since `fresh_through`,
    /// or the last reported lag when there is none yet.
    pub fn lag_at(&self, now: u64) -> Option<u64> {
        match self.fresh_through {
            Some(through) if matches!(self.state, TaskState::Running | TaskState::Restarting) => {
                Some(now.saturating_sub(through))
            }
            _ => self.lag_secs,
        }
    }
}

/// A waiting task gains one priority level per this many seconds: a low-priority task waits
/// at most `PROMOTE_SECS` × (the priority gap) longer than a higher one that came after it.
pub const PROMOTE_SECS: f64 = 30.0;

/// The rank a task is claimed by: its job's priority, raised by the time its job's generation
/// has waited (a generation is the clock in milliseconds when it began), so no task starves.
pub fn claim_rank(priority: u32, generation: u64, now_ms: u64) -> f64 {
    let waited_secs = now_ms.saturating_sub(generation) as f64 / 1000.0;
    f64::from(priority) + waited_secs / PROMOTE_SECS
}

/// A worker as it advertises itself.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub id: String,
    pub address: String,
    /// How many tasks it runs at once.
    pub capacity: usize,
    /// Its share of the work relative to other workers with the same capacity (a bigger
    /// machine: 2.0); 1.0 by default.
    #[serde(default = "one")]
    pub weight: f64,
    /// Its `--zone` and `--label`s, which a job's `placement:` may ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<String, String>,
    /// `job/task` of the tasks it runs: filled from the owner keys when workers are read
    /// (`load_workers`, a node's view), not stored, so a task's start and end write no worker
    /// record (every write wakes every node).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<String>,
    pub started_at: String,
    /// Writes its tasks' targets refused since it started: another worker had taken the task.
    #[serde(default)]
    pub fence_refusals: u64,
}

/// Live workers, each with the tasks it owns now (from the owner keys).
pub async fn load_workers(store: &dyn Store) -> Result<Vec<WorkerRecord>> {
    let mut workers: Vec<WorkerRecord> =
        load_all(store, &format!("{ROOT}workers/")).await?.into_iter().map(|(_, worker, _)| worker).collect();
    let owners: Vec<(String, Owner, Entry)> = load_all(store, &format!("{ROOT}owners/")).await?;
    assign_tasks(&mut workers, owners.iter().map(|(task, owner, _)| (task.as_str(), owner.worker.as_str())));
    Ok(workers)
}

/// Gives each worker the tasks (`job/task`) owned by it.
pub fn assign_tasks<'a>(workers: &mut [WorkerRecord], owned: impl Iterator<Item = (&'a str, &'a str)>) {
    let index: std::collections::HashMap<String, usize> =
        workers.iter().enumerate().map(|(position, worker)| (worker.id.clone(), position)).collect();
    for worker in workers.iter_mut() {
        worker.tasks.clear();
    }
    for (task, owner) in owned {
        if let Some(&position) = index.get(owner) {
            workers[position].tasks.push(task.to_owned());
        }
    }
}

fn one() -> f64 {
    1.0
}

/// The placement rule: a worker running `tasks` may claim one more while it has a free slot and
/// its load — tasks ÷ (capacity × weight) — is not above the least loaded other live worker
/// that has a free slot. Ties claim together, each a different task (the claim is a create, so
/// at most one wins a task).
pub fn may_claim(me: &WorkerRecord, tasks: usize, others: &[WorkerRecord]) -> bool {
    let load =
        |tasks: usize, worker: &WorkerRecord| tasks as f64 / (worker.capacity.max(1) as f64 * worker.weight.max(0.01));
    let least = others
        .iter()
        .filter(|worker| worker.id != me.id && worker.tasks.len() < worker.capacity)
        .map(|worker| load(worker.tasks.len(), worker))
        .fold(f64::INFINITY, f64::min);
    tasks < me.capacity && load(tasks, me) <= least
}

/// The placement rule for a task that the workers in `avoid` kept failing and handed over: they
/// claim it only when no other live worker has room; the others claim it by `may_claim` among
/// themselves (an avoided worker, idle since it gave the task up, would otherwise always look
/// less loaded and hold them back).
pub fn may_claim_avoiding(me: &WorkerRecord, tasks: usize, others: &[WorkerRecord], avoid: &[String]) -> bool {
    if avoid.contains(&me.id) {
        return !other_worker_has_room(others, avoid) && may_claim(me, tasks, others);
    }
    let others: Vec<WorkerRecord> = others.iter().filter(|worker| !avoid.contains(&worker.id)).cloned().collect();
    may_claim(me, tasks, &others)
}

/// The workers whose zone and labels `placement` admits.
pub fn admitted(placement: &sluice_core::spec::Placement, workers: &[WorkerRecord]) -> Vec<WorkerRecord> {
    workers.iter().filter(|worker| placement.admits(worker.zone.as_deref(), &worker.labels)).cloned().collect()
}

/// Whether a live worker other than those in `avoid` has a free slot.
pub fn other_worker_has_room(workers: &[WorkerRecord], avoid: &[String]) -> bool {
    workers.iter().any(|worker| !avoid.contains(&worker.id) && worker.tasks.len() < worker.capacity)
}

/// Decodes a stored record, naming the key when it is not what this version writes.
pub fn decode<T: DeserializeOwned>(entry: &Entry) -> Result<T> {
    serde_json::from_str(&entry.value).map_err(|error| {
        Error::new(ErrorKind::State, format!("coordination store: {} is not a valid record: {error}", entry.key))
            .on(Side::State)
            .hint("a node of another sluice version may have written it; run one version across the cluster")
    })
}

pub fn encode<T: Serialize>(record: &T) -> String {
    serde_json::to_string(record).expect("records serialize")
}

/// Reads and decodes one record.
pub async fn load<T: DeserializeOwned>(store: &dyn Store, key: &str) -> Result<Option<(T, Entry)>> {
    match store.get(key).await? {
        Some(entry) => Ok(Some((decode(&entry)?, entry))),
        None => Ok(None),
    }
}

/// Reads and decodes every record under `prefix`, keyed by the rest of the key.
pub async fn load_all<T: DeserializeOwned>(store: &dyn Store, prefix: &str) -> Result<Vec<(String, T, Entry)>> {
    decode_all(prefix, store.list(prefix).await?)
}

/// Each entry under `prefix` with its name (the key after the prefix) and its record.
pub fn decode_all<T: DeserializeOwned>(
    prefix: &str,
    entries: impl IntoIterator<Item = Entry>,
) -> Result<Vec<(String, T, Entry)>> {
    entries.into_iter().map(|entry| Ok((entry.key[prefix.len()..].to_owned(), decode(&entry)?, entry))).collect()
}

/// A table of more splits than this is copied by groups of splits, which the workers of a
/// cluster share: groups of this many splits at least, and ...
pub const SPLITS_PER_TASK: usize = 4;
/// ... at most this many groups per table (a worker claims one task per tick: thousands of
/// tiny groups would wait on the ticks).
pub const GROUPS_PER_TABLE: usize = 16;

/// The snapshot tasks of the planned tables among `tables`: one per table; a table of more
/// than `SPLITS_PER_TASK` splits gets a task per group of splits first (at most
/// `GROUPS_PER_TABLE`), and its table task (which then finds every split done) builds its
/// indexes after them.
pub fn snapshot_tasks(plan: &Plan, tables: &[TableName]) -> Vec<TaskPlan> {
    let mut tasks = Vec::new();
    for table in &plan.tables {
        let Some(source) = table.splits.first().map(|split| split.table.name.clone()) else { continue };
        if !tables.contains(&source) {
            continue;
        }
        let mut groups = Vec::new();
        if table.splits.len() > SPLITS_PER_TASK {
            let groups_wanted = table.splits.len().div_ceil(SPLITS_PER_TASK).min(GROUPS_PER_TABLE);
            for group in table.splits.chunks(table.splits.len().div_ceil(groups_wanted)) {
                let (first, last) = (&group[0].id, &group[group.len() - 1].id);
                let id = format!("snapshot:{first}..{}", last.rsplit('#').next().unwrap_or(last));
                groups.push(id.clone());
                let position = table.splits.iter().position(|split| split.id == *first).unwrap_or_default();
                tasks.push(TaskPlan {
                    id,
                    kind: TaskKind::Snapshot,
                    tables: vec![source.clone()],
                    splits: Some(SplitRange { first: position, count: group.len() }),
                    after: Vec::new(),
                    estimated_rows: group.iter().map(|split| split.estimated_rows).sum(),
                });
            }
        }
        let estimated_rows =
            if groups.is_empty() { table.splits.iter().map(|split| split.estimated_rows).sum() } else { 0 };
        tasks.push(TaskPlan {
            id: format!("snapshot:{source}"),
            kind: TaskKind::Snapshot,
            tables: vec![source],
            splits: None,
            after: groups,
            estimated_rows,
        });
    }
    tasks
}

/// Cuts a job's plan into cluster tasks: the snapshot tasks (`snapshot_tasks`), then the change stream
/// after all of them.
pub fn tasks_of(mode: sluice_core::spec::Mode, plan: &Plan) -> Vec<TaskPlan> {
    use sluice_core::spec::Mode;
    let mut tasks = Vec::new();
    if mode != Mode::Cdc {
        let every: Vec<TableName> =
            plan.tables.iter().filter_map(|table| Some(table.splits.first()?.table.name.clone())).collect();
        tasks = snapshot_tasks(plan, &every);
    }
    if mode.streams() {
        let after = tasks.iter().map(|task| task.id.clone()).collect();
        tasks.push(TaskPlan {
            id: sluice_core::names::STREAM_TASK.to_owned(),
            kind: TaskKind::Cdc,
            tables: Vec::new(),
            splits: None,
            after,
            estimated_rows: 0,
        });
    }
    tasks
}

/// The job document of a version, its `${NAME}`s read by this node's rule.
pub async fn load_spec(store: &dyn Store, document_rules: &DocumentRules, job: &str, version: u32) -> Result<JobSpec> {
    let (record, _) = load::<VersionRecord>(store, &version_key(job, version)).await?.ok_or_else(|| {
        Error::new(ErrorKind::State, format!("job {job} has no version {version} in the coordination store"))
    })?;
    job_text::parse(&record.document, record.format, document_rules).map_err(|errors| {
        let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
        Error::config(format!("job {job} version {version} is not valid on this node: {}", listed.join("; ")))
            .hint("an environment variable the job names may be missing on this node")
    })
}

/// A job's last verification.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LastVerification {
    /// When it ended, Unix seconds.
    pub at: u64,
    /// The node that ran it.
    pub node: String,
    /// The job's version it verified.
    pub version: u32,
    pub report: VerifyReport,
}

/// A row a verification repaired, as every node sees it (`/sluice/repairs/{job}/…`, oldest
/// first): when, where, the table and the repair (kind, key, the target's row before, the
/// source's row written; `after: null` for a row deleted).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RepairRecord {
    /// When its verification ended, Unix seconds.
    pub at: u64,
    pub node: String,
    /// The job's version it repaired by.
    pub version: u32,
    pub table: String,
    #[serde(flatten)]
    pub repair: sluice_core::runner::Repair,
}

/// The last verification of `job`, if it was ever verified.
pub async fn last_verification(store: &dyn Store, job: &str) -> Result<Option<LastVerification>> {
    Ok(load::<LastVerification>(store, &verification_key(job)).await?.map(|(last, _)| last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batched_job_runs_only_a_generation_a_firing_made() {
        let job = |history: Option<BatchRecord>| -> JobRecord {
            let mut job: JobRecord = serde_json::from_value(serde_json::json!({
                "name": "j", "version": 1, "desired": "running", "generation": 7, "mode": "snapshot",
                "updated_at": "", "after": [{"job": "a", "on_failure": "skip"}],
            }))
            .unwrap();
            job.batches = history.map(|record| Batches { batch: 1, history: vec![record], ..Batches::default() });
            job
        };
        assert!(job(None).waiting_for_a_firing(), "before its first batch");
        let skipped = BatchRecord {
            batch: Some(1),
            outcome: Some("skipped: job a batch 1 ended failed".into()),
            ..BatchRecord::default()
        };
        assert!(
            job(Some(skipped)).waiting_for_a_firing(),
            "its first batch was skipped: the submitted generation never runs"
        );
        let fired = BatchRecord { batch: Some(1), generation: Some(7), ..BatchRecord::default() };
        assert!(!job(Some(fired)).waiting_for_a_firing());
    }

    #[test]
    fn large_tables_are_cut_into_bounded_groups_and_their_table_task_comes_after() {
        use sluice_core::connector::Split;
        use sluice_core::state::PlannedTable;
        let table = |name: &str, splits: usize| PlannedTable {
            target: TableName::parse(name),
            splits: (0..splits)
                .map(|index| Split {
                    id: format!("{name}#{index}"),
                    table: std::sync::Arc::new(sluice_core::TableSchema::named(TableName::parse(name))),
                    descriptor: serde_json::Value::Null,
                    estimated_rows: 100,
                    whole: false,
                    window: None,
                })
                .collect(),
        };
        let plan = Plan {
            tables: vec![table("d.small", 4), table("d.mid", 20), table("d.huge", 2500)],
            source_position: None,
            hidden: Vec::new(),
        };
        let every: Vec<TableName> = ["d.small", "d.mid", "d.huge"].map(TableName::parse).to_vec();
        let tasks = snapshot_tasks(&plan, &every);
        let groups = |table: &str| {
            tasks.iter().filter(|task| task.tables[0].to_string() == table && task.splits.is_some()).count()
        };
        assert_eq!((groups("d.small"), groups("d.mid"), groups("d.huge")), (0, 5, GROUPS_PER_TABLE));
        let huge = tasks.iter().find(|task| task.id == "snapshot:d.huge").unwrap();
        assert_eq!(huge.after.len(), GROUPS_PER_TABLE, "the table task waits for every group");
        let mut covered = Vec::new();
        for task in tasks.iter().filter(|task| task.tables[0].to_string() == "d.huge") {
            if let Some(range) = task.splits {
                covered.extend(range.ids(&plan, &TableName::parse("d.huge")).unwrap());
            }
        }
        let expected: Vec<String> = (0..2500).map(|index| format!("d.huge#{index}")).collect();
        assert_eq!(covered, expected, "every split is in exactly one group, in order");
        // The rows each task copies, for the longest-first claim order: a group its splits', a
        // table task without groups its table's, one with groups none.
        let rows = |id: &str| tasks.iter().find(|task| task.id == id).unwrap().estimated_rows;
        assert_eq!((rows("snapshot:d.small"), rows("snapshot:d.huge")), (400, 0));
        let grouped: u64 = tasks.iter().filter(|task| task.splits.is_some()).map(|task| task.estimated_rows).sum();
        assert_eq!(grouped, (20 + 2500) * 100);
        let beyond = SplitRange { first: 2499, count: 2 };
        assert!(beyond.ids(&plan, &TableName::parse("d.huge")).is_err(), "a range past the plan is an error");
    }

    #[test]
    fn a_plan_cut_into_pieces_joins_back_whole() {
        use sluice_core::connector::Split;
        use sluice_core::state::PlannedTable;
        use sluice_core::{Column, DataType, TableSchema};
        let schema = |name: &str| {
            std::sync::Arc::new(TableSchema {
                name: TableName::parse(name),
                columns: vec![Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false)],
                primary_key: vec![0],
                indexes: Vec::new(),
                details: Default::default(),
            })
        };
        let table = |name: &str, splits: usize| PlannedTable {
            target: TableName::parse(name),
            splits: (0..splits)
                .map(|index| Split {
                    id: format!("{name}#{index}"),
                    table: schema(name),
                    descriptor: serde_json::json!({ "from": index * 100, "to": index * 100 + 100 }),
                    estimated_rows: 100,
                    whole: false,
                    // Cursor windows ride along with their splits.
                    window: (index % 2 == 1).then(|| sluice_core::cursor::CursorWindow {
                        column: "updated_at".into(),
                        mark: Some(serde_json::json!("2026-12-01 00:00:00")),
                        after: Some(serde_json::json!("2026-12-01 00:00:00")),
                        through: Some(serde_json::json!("2026-12-02 00:00:00")),
                        rerun: false,
                    }),
                })
                .collect(),
        };
        let plan = Plan {
            tables: vec![table("db.big", 3000), table("db.empty", 0), table("db.small", 3), table("db.big2", 700)],
            source_position: None,
            hidden: Vec::new(),
        };
        let pieces = pieces_of(&plan, 20_000);
        assert!(pieces.len() > 10, "{} pieces", pieces.len());
        for piece in &pieces {
            assert!(encode(piece).len() < 20_000 + 2_000, "a piece stays near the limit");
        }
        let pieces: Vec<PlanPiece> = pieces.iter().map(|piece| serde_json::from_str(&encode(piece)).unwrap()).collect();
        let joined = join_pieces(Plan { tables: Vec::new(), source_position: None, hidden: Vec::new() }, pieces);
        assert_eq!(joined.tables.len(), 4);
        assert_eq!(joined, plan);
    }

    fn worker(id: &str, tasks: usize, capacity: usize, weight: f64) -> WorkerRecord {
        WorkerRecord {
            id: id.into(),
            address: String::new(),
            capacity,
            weight,
            zone: None,
            labels: Default::default(),
            tasks: (0..tasks).map(|task| format!("job/{task}")).collect(),
            started_at: String::new(),
            fence_refusals: 0,
        }
    }

    #[test]
    fn higher_priorities_go_first_and_a_waiting_task_is_promoted() {
        let now = 10_000_000;
        // Submitted at the same time: the higher priority ranks first.
        assert!(claim_rank(5, now, now) > claim_rank(0, now, now));
        // A priority-0 job waiting since before a priority-5 one came: it overtakes it once it
        // waited 5 × PROMOTE_SECS longer, never later.
        let gap_ms = (5.0 * PROMOTE_SECS * 1000.0) as u64;
        let low_since = now - gap_ms - 1_000;
        assert!(claim_rank(0, low_since, now) > claim_rank(5, now, now));
        assert!(claim_rank(0, now - gap_ms + 1_000, now) < claim_rank(5, now, now));
    }

    #[test]
    fn the_least_loaded_worker_with_room_claims() {
        let others = [worker("b", 1, 4, 1.0), worker("c", 2, 4, 1.0)];
        assert!(may_claim(&worker("a", 0, 4, 1.0), 0, &others), "the idle worker claims");
        assert!(may_claim(&worker("a", 1, 4, 1.0), 1, &others), "ties claim together");
        assert!(!may_claim(&worker("a", 2, 4, 1.0), 2, &others), "a busier worker waits");
        assert!(!may_claim(&worker("a", 4, 4, 1.0), 4, &[]), "a full worker never claims");
        // Full workers do not hold others back; a weight of 2 takes twice the share.
        assert!(may_claim(&worker("a", 3, 4, 1.0), 3, &[worker("b", 4, 4, 1.0)]));
        assert!(may_claim(&worker("a", 2, 4, 2.0), 2, &[worker("b", 1, 4, 1.0)]), "2 of 8 shares is 1 of 4");
        assert!(!may_claim(&worker("a", 3, 4, 2.0), 3, &[worker("b", 1, 4, 1.0)]));
    }

    #[test]
    fn a_workers_tasks_are_the_ones_it_owns() {
        let mut workers = [worker("a", 3, 4, 1.0), worker("b", 0, 4, 1.0)];
        let owned = [("j/t1", "b"), ("j/t2", "gone"), ("k/t1", "b")];
        assign_tasks(&mut workers, owned.into_iter());
        assert!(workers[0].tasks.is_empty(), "what a record said before is replaced");
        assert_eq!(workers[1].tasks, ["j/t1", "k/t1"]);
    }

    #[test]
    fn a_task_handed_over_goes_to_a_worker_it_did_not_fail_on() {
        // a gave the task up and is idle; b runs another task and still takes this one.
        let (a, b) = (worker("a", 0, 4, 1.0), worker("b", 1, 4, 1.0));
        let avoid = ["a".to_owned()];
        let workers = [a.clone(), b.clone()];
        assert!(may_claim_avoiding(&b, 1, &workers, &avoid), "the other worker claims despite the idle one");
        assert!(!may_claim_avoiding(&a, 0, &workers, &avoid), "the avoided worker waits while another has room");
        let full = [a.clone(), worker("b", 4, 4, 1.0)];
        assert!(may_claim_avoiding(&a, 0, &full, &avoid), "with no other room the avoided worker takes it back");
    }
}
