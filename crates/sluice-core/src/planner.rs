//! The planner: discovers a job's tables, maps them through the transform stage, cuts them into
//! splits and captures the source's log position. Its plan is plain data (serialisable, kept in
//! the state directory or the coordination store); a [`crate::runner::Runner`] executes it, or
//! a scope of it. A standalone run plans and runs in one process; on a cluster the leader plans
//! and every worker runs its task of that same plan, without discovering or splitting again.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::connector::{replaced_tables, AnyChangeWriter, Binding, Sink, Source, SplitHint, TableTasks};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::retry;
use crate::schema::{TableName, TableSchema};
use crate::spec::{JobSpec, Mode};
use crate::state::{Plan, PlannedTable};
use crate::transform::{self, Transforms};

/// A plan and the target tables it writes (target names, transformed shapes), which the target
/// prepares before any task runs.
#[derive(Debug, Clone)]
pub struct Planned {
    pub plan: Plan,
    pub targets: Vec<TableSchema>,
}

/// Plans one job.
pub struct Planner {
    job: Arc<JobSpec>,
    source: Arc<dyn Source>,
    sink: Arc<dyn Sink>,
    transforms: Transforms,
    /// Tables split for a copy even in a `cdc` job (tables added to a running stream).
    split_also: Vec<TableName>,
    /// `incremental-cursor` jobs: where each table's window starts (`marks`).
    marks: BTreeMap<TableName, Option<serde_json::Value>>,
    /// Windows given whole (a rerun of earlier batches), by source table.
    windows: BTreeMap<TableName, crate::cursor::CursorWindow>,
    stop: Option<watch::Receiver<bool>>,
}

impl std::fmt::Debug for Planner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Planner").field("job", &self.job.name).finish_non_exhaustive()
    }
}

impl Planner {
    pub fn new(job: Arc<JobSpec>, source: Arc<dyn Source>, sink: Arc<dyn Sink>) -> Planner {
        let transforms = Transforms::of(&job);
        Planner {
            job,
            source,
            sink,
            transforms,
            split_also: Vec::new(),
            marks: BTreeMap::new(),
            windows: BTreeMap::new(),
            stop: None,
        }
    }

    /// Splits these tables even when the job copies nothing (a `cdc` job to which they are
    /// added, backfilled by a copy).
    pub fn splitting(mut self, tables: Vec<TableName>) -> Planner {
        self.split_also = tables;
        self
    }

    /// Starts each table's cursor window at its mark (a cursor-incremental batch after the
    /// first; tables without one start from their first row).
    pub fn from_marks(mut self, marks: BTreeMap<TableName, Option<serde_json::Value>>) -> Planner {
        self.marks = marks;
        self
    }

    /// Reads these tables' windows as given instead of from their marks (a rerun).
    pub fn with_windows(mut self, windows: BTreeMap<TableName, crate::cursor::CursorWindow>) -> Planner {
        self.windows = windows;
        self
    }

    /// Gives up retrying once `stop` is set.
    pub(crate) fn stopping_on(mut self, stop: watch::Receiver<bool>) -> Planner {
        self.stop = Some(stop);
        self
    }

    /// Plans the job. `previous` is the plan of an earlier run or generation: its splits are
    /// kept for tables still selected, so split ids and the checkpoints keyed by them stay valid,
    /// and its source position is kept, so a resumed snapshot continues the one it began. New
    /// tables are split when the job copies (not `cdc`), or when named by `splitting`.
    pub async fn plan(&self, previous: Option<Plan>) -> Result<Planned> {
        let split = self.job.mode != Mode::Cdc;
        let tables = self.with_retry("discover the source tables", || self.source.discover()).await?;
        if tables.is_empty() {
            if !self.job.mode.streams() {
                return Err(Error::new(ErrorKind::Schema, "no table matches `source.tables`")
                    .on(Side::Source)
                    .hint("check the include and exclude globs and that the tables exist"));
            }
            // A stream takes in the tables its log creates: nothing to copy yet is no error.
            log::warn!(
                "no table matches `source.tables` yet; the stream takes in matching tables as the source creates them"
            );
        }
        let first = previous.is_none();
        let previous = previous.unwrap_or_default();
        // Captured once, on first planning: a resumed run keeps the position of the snapshot
        // it continues.
        let source_position = match previous.source_position {
            Some(position) => Some(position),
            None => match self.source.changes() {
                Some(changes) => self.with_retry("read the source's log position", || changes.start_log()).await?,
                None => None,
            },
        };
        if let Some(position) = &source_position {
            let when = if split { "snapshot start" } else { "the job's first run" };
            log::info!("source log position at {when}: {}", position.brief());
        }
        let stored: BTreeMap<_, _> = previous
            .tables
            .into_iter()
            .filter_map(|table| Some((table.splits.first()?.table.name.clone(), table)))
            .collect();
        // A table the plan does not have is copied on first planning, and always by a snapshot.
        // A streaming job planned again leaves it to the stream, which creates it from the
        // source's CREATE TABLE (a copy of it now would hold rows the stream applies again);
        // tables that existed before are added to a running job by name (`splitting`).
        let copy_new = !self.job.mode.streams() || first;
        let mappings = self.transforms.map_all(tables, &|name| self.sink.target_name(name))?;
        let targets = transform::target_tables(&mappings);
        let mut plan = Plan { tables: Vec::with_capacity(mappings.len()), source_position, hidden: previous.hidden };
        for mapping in mappings {
            let table = mapping.source;
            let target = mapping.target.name.clone();
            let planned = match stored.get(&table.name) {
                Some(stored) => PlannedTable { target, splits: stored.splits.clone() },
                None if !(split && copy_new || self.split_also.contains(&table.name)) => {
                    if split {
                        log::info!("table {} is new to the job's plan: the change stream takes it in", table.name);
                    }
                    PlannedTable { target, splits: Vec::new() }
                }
                None => {
                    let snapshot = self.source.needs_snapshot()?;
                    let hint = SplitHint { rows_per_split: self.job.limits.split_rows };
                    let mut splits = self.with_retry("split the source table", || snapshot.split(&table, hint)).await?;
                    if let Some(cursor) = &self.job.source.cursor {
                        let mark = self.marks.get(&table.name).cloned().flatten();
                        let window = match self.windows.get(&table.name) {
                            Some(given) => given.clone(),
                            None => {
                                let reads = self.source.needs_cursor()?;
                                self.with_retry("read the cursor's highest value", || {
                                    reads.cursor_window(&table, cursor, mark.as_ref())
                                })
                                .await?
                            }
                        };
                        log::info!(
                            "table {}: cursor {} in ({}, {}]",
                            table.name,
                            window.column,
                            window.after.as_ref().map_or_else(|| "the first row".to_owned(), ToString::to_string),
                            window.through.as_ref().map_or_else(|| "none".to_owned(), ToString::to_string)
                        );
                        for split in &mut splits {
                            split.window = Some(window.clone());
                        }
                    }
                    PlannedTable { target, splits }
                }
            };
            plan.tables.push(planned);
        }
        refuse_whole_merges(&self.job, &plan)?;
        // A copy of one of several sources is never hidden: publishing it would replace the
        // table the other sources write into.
        if first && self.job.mode == Mode::SnapshotAndCdc && self.job.fan_in.is_none() {
            plan.hidden = self
                .with_retry("list the target's tables", || crate::hidden::tables_to_hide(&*self.sink, &targets))
                .await?;
            if !plan.hidden.is_empty() {
                log::info!(
                    "the copies of {} are hidden until the stream passes the copy's end, then published whole",
                    plan.hidden.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                );
            }
        }
        Ok(Planned { plan, targets })
    }

    async fn with_retry<T, F, Fut>(&self, what: &str, step: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let stopped = || self.stop.as_ref().is_some_and(|stop| *stop.borrow());
        let pause = |wait| {
            let mut stop = self.stop.clone();
            async move {
                match &mut stop {
                    Some(stop) => {
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            _ = stop.wait_for(|stopped| *stopped) => {}
                        }
                    }
                    None => tokio::time::sleep(wait).await,
                }
            }
        };
        retry::retrying(&self.job.retry, what, stopped, pause, step).await
    }
}

/// A table read whole (no key) is copied again by emptying its target table, which must then
/// hold that table's rows alone: such tables cannot be merged with others, nor be one of several
/// sources' (`JobSpec::fan_in`). Every one is named.
fn refuse_whole_merges(job: &JobSpec, plan: &Plan) -> Result<()> {
    let mut sources: BTreeMap<&TableName, Vec<&TableName>> = BTreeMap::new();
    for planned in &plan.tables {
        if let Some(split) = planned.splits.first() {
            sources.entry(&planned.target).or_default().push(&split.table.name);
        }
    }
    let problems: Vec<String> = plan
        .tables
        .iter()
        .filter(|planned| planned.splits.iter().any(|split| split.whole))
        .filter(|planned| job.fan_in.is_some() || sources.get(&planned.target).is_some_and(|merged| merged.len() > 1))
        .map(|planned| format!("{} (into {})", planned.splits[0].table.name, planned.target))
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    let (what, hint) = match &job.fan_in {
        Some(source) => (
            format!("tables without a key cannot be merged with other sources' tables (source {source})"),
            "give them a primary key, or leave them out of this source's `tables`",
        ),
        None => (
            "tables without a key cannot be merged with other tables by a route".to_owned(),
            "give them a primary key, or route each to a target table of its own",
        ),
    };
    Err(Error::new(ErrorKind::Config, format!("{what}: {}", problems.join(", "))).hint(hint))
}

/// Forgets the checkpoints of target tables emptied or created again outside the job, so their
/// splits are copied again; a table created again that holds other rows stops the job, every
/// such table named. Once a job's change stream has committed, the stream owns the tables' rows
/// (a source may empty a table, DDL may re-create one) and the copy's checkpoints no longer
/// describe them: nothing is judged, and a target changed outside the job shows as rows the
/// stream finds missing or present.
/// Prepares the target for a run of `plan`: `tables` (under the names they are written under
/// now, `hidden` naming the copies still hidden) are made as `Sink::prepare_for_copy` says when
/// the job copies, as `Sink::prepare` says when it only streams.
pub async fn prepare_target(
    job: &JobSpec,
    sink: &dyn Sink,
    plan: &Plan,
    hidden: &crate::hidden::HiddenCopies,
    tables: &[TableSchema],
) -> Result<()> {
    if job.mode == Mode::Cdc {
        return sink.prepare(tables).await;
    }
    let merged: Vec<TableName> = merged_targets(job, plan).iter().map(|target| hidden.name(target)).collect();
    sink.prepare_for_copy(tables, &merged).await
}

/// The target tables of a plan that hold other rows than one source table's: those several
/// source tables are merged into, and every one when the job is one of several sources
/// (`JobSpec::fan_in`).
pub(crate) fn merged_targets(job: &JobSpec, plan: &Plan) -> std::collections::BTreeSet<TableName> {
    match job.fan_in {
        Some(_) => plan.tables.iter().map(|planned| planned.target.clone()).collect(),
        None => plan.merged_targets(),
    }
}

pub async fn verify_checkpoints(job: &JobSpec, sink: &dyn Sink, tables: &[TableTasks]) -> Result<()> {
    if job.mode.streams() {
        let mut writer = AnyChangeWriter::open(sink, &job.name, crate::names::STREAM_TASK).await?;
        if writer.recover().await?.is_some() {
            return Ok(());
        }
    }
    let judged = sink.verify_checkpoints(&job.name, tables).await?;
    let named = |wanted: Binding| -> Vec<String> {
        judged.iter().filter(|(_, binding)| *binding == wanted).map(|(table, _)| table.to_string()).collect()
    };
    let replaced = named(Binding::Replaced);
    if !replaced.is_empty() {
        return Err(replaced_tables(&job.name, &replaced));
    }
    let names = named(Binding::Forget);
    if names.is_empty() {
        return Ok(());
    }
    let forgotten: Vec<TableTasks> =
        tables.iter().filter(|table| names.contains(&table.table.to_string())).cloned().collect();
    sink.forget_checkpoints(&job.name, &forgotten).await?;
    log::warn!(
        "{} {} emptied or created again in the target since the job copied it: {} copied again",
        names.join(", "),
        if names.len() == 1 { "was" } else { "were" },
        if names.len() == 1 { "it is" } else { "they are" }
    );
    Ok(())
}
/// What the previous batch of a cursor-incremental job left: where each table's next window
/// starts, and whether every split completed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marks {
    /// By source table: the mark the next window starts from.
    pub tables: BTreeMap<TableName, Option<serde_json::Value>>,
    /// Every split of the previous plan is done in the target: the batch completed.
    pub complete: bool,
}

/// Reads the marks of a previous plan from the target's checkpoints.
pub async fn marks(job: &str, sink: &dyn Sink, previous: &Plan) -> Result<Marks> {
    let tasks: Vec<String> =
        previous.tables.iter().flat_map(|planned| planned.splits.iter().map(|split| split.id.clone())).collect();
    let done: Vec<String> = sink
        .checkpoints(job, &tasks)
        .await?
        .into_iter()
        .filter(|checkpoint| checkpoint.done)
        .map(|checkpoint| checkpoint.task)
        .collect();
    let mut marks = Marks { tables: BTreeMap::new(), complete: true };
    for planned in &previous.tables {
        let Some(window) = planned.splits.first().and_then(|split| split.window.as_ref()) else { continue };
        let table_done = planned.splits.iter().all(|split| done.contains(&split.id));
        marks.complete &= table_done;
        let mark =
            if table_done { window.through.clone().or_else(|| window.mark.clone()) } else { window.mark.clone() };
        marks.tables.insert(planned.splits[0].table.name.clone(), mark);
    }
    Ok(marks)
}
