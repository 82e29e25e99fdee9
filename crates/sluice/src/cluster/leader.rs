//! The leader's work: it plans each job generation into tasks (one snapshot task per table, or
//! per group of a large table's splits, then the change stream) and takes tables added to a
//! running job into its stream once their copy is complete. Only the node holding the leader key does this, and every plan it writes
//! is guarded by that key.

use std::sync::Arc;

use sluice_core::names::STREAM_TASK;
use sluice_core::planner::Planner;
use sluice_core::runner::Backfill;
use sluice_core::{retry, Error, ErrorKind, Result, Side, TableName};

use super::model::*;
use super::node::{lock, Node, View};
use super::store::Guard;
use crate::logger::timestamp;

impl Node {
    /// As leader: plans every job to run whose plan is missing or of an older generation, and
    /// takes added tables into the stream once their copy is complete. It decides on the copy,
    /// which holds the node's own writes (`Node::tick`), and never on one older than a plan it
    /// stored since.
    pub(super) fn lead(self: &Arc<Self>, view: &View, guard: Guard) {
        for (name, job, copied) in to_plan(view) {
            if !lock(&self.planning).insert(name.to_owned()) {
                continue;
            }
            // A planning that ended since the view was taken wrote after it: the view may lack
            // that plan. The next look, on a copy that holds it, decides.
            if view.revision < self.store.written() {
                lock(&self.planning).remove(name);
                continue;
            }
            let (node, job, previous, guard) = (self.clone(), job.clone(), view.plan(name).cloned(), guard.clone());
            tokio::spawn(async move {
                if copied {
                    node.join_backfill(&job, previous.expect("a current plan"), &guard).await;
                } else {
                    node.plan_generation(&job, previous, &guard).await;
                }
                lock(&node.planning).remove(&job.name);
            });
        }
    }

    /// Plans a generation and stores the plan, or the error that stopped planning (the job is
    /// then `failed` until restarted). A coordination-store error is not the job's: planning is
    /// tried again at the next tick.
    async fn plan_generation(&self, job: &JobRecord, previous: Option<PlanRecord>, guard: &Guard) {
        let started = std::time::Instant::now();
        // A backfill the stream may not have taken in yet stays with every later plan.
        let carried =
            previous.as_ref().and_then(|previous| previous.backfill.clone()).filter(|backfill| backfill.copied);
        let record = match self.plan(job, previous).await {
            Ok(record) => record,
            Err(error) if error.side() == Some(Side::State) && retry::is_transient(&error) => {
                log::warn!("job {}: planning waits for the coordination store: {error}", job.name);
                return;
            }
            Err(error) => {
                log::error!("job {}: planning failed: {error}", job.name);
                PlanRecord {
                    generation: job.generation,
                    version: job.version,
                    tasks: Vec::new(),
                    plan: None,
                    pieces: None,
                    error: Some((&error).into()),
                    stream_version: None,
                    backfill: carried,
                    batch: batch_of(job),
                    windows: Default::default(),
                }
            }
        };
        // What the plan takes in the store: its splits' pieces and its record.
        let plan_bytes = record.plan.as_ref().map_or(0, |plan| encode(plan).len());
        let stored = async {
            // The splits first, in pieces, then the record that points at them.
            let mut record = record;
            if let Some(plan) = record.plan.take() {
                match store_plan(&*self.store, &job.name, new_pieces_id(), &plan, guard).await? {
                    Some((header, pieces)) => {
                        record.plan = Some(header);
                        record.pieces = Some(pieces);
                    }
                    None => return Ok((false, record)),
                }
            }
            let stored = self.store.put_guarded(&plan_key(&job.name), &encode(&record), guard).await?;
            if stored {
                let keep = record.pieces.map(|pieces| pieces.id);
                if let Err(error) = remove_other_pieces(&*self.store, &job.name, keep).await {
                    log::warn!("job {}: could not remove the pieces of older plans: {error}", job.name);
                }
            }
            Ok::<_, Error>((stored, record))
        }
        .await;
        match stored {
            Ok((true, record)) => log::info!(
                "job {}: planned generation {} into {} tasks ({} plan pieces, {} bytes) in {} ms",
                job.name,
                job.generation,
                record.tasks.len(),
                record.pieces.map_or(0, |pieces| pieces.count),
                plan_bytes + encode(&record).len(),
                started.elapsed().as_millis()
            ),
            Ok((false, _)) => log::warn!("job {}: no longer the leader; the plan is left to the new one", job.name),
            Err(error) => log::warn!("job {}: could not store the plan: {error}", job.name),
        }
    }

    /// The added tables are copied: a new generation runs the stream alone, with every table
    /// and the backfill to take in. The plan is stored before the job moves to its generation,
    /// so no worker ever sees the new generation without it.
    async fn join_backfill(&self, job: &JobRecord, plan: PlanRecord, guard: &Guard) {
        let generation = next_generation(job.generation);
        let record = PlanRecord {
            generation,
            version: job.version,
            tasks: plan
                .tasks
                .iter()
                .filter(|task| task.kind == TaskKind::Cdc)
                .cloned()
                .map(|task| TaskPlan { after: Vec::new(), ..task })
                .collect(),
            plan: plan.plan,
            // The stream's generation reads the same splits.
            pieces: plan.pieces,
            error: None,
            stream_version: None,
            backfill: plan.backfill.map(|backfill| BackfillPlan { copied: true, ..backfill }),
            batch: plan.batch,
            windows: plan.windows,
        };
        let moved = async {
            if !self.store.put_guarded(&plan_key(&job.name), &encode(&record), guard).await? {
                return Ok(false);
            }
            let updated = JobRecord { generation, backfill: None, updated_at: timestamp(), ..job.clone() };
            // A job changed meanwhile (stopped, updated) keeps its new state; the copied
            // backfill stays in the plans and joins the stream at its next start.
            self.store.replace(&job_key(&job.name), &encode(&updated), job.revision).await
        }
        .await;
        match moved {
            Ok(true) => log::info!("job {}: the added tables are copied; the stream takes them in", job.name),
            Ok(false) => log::warn!("job {}: no longer the leader; the backfill is left to the new one", job.name),
            Err(error) => log::warn!("job {}: could not take the added tables into the stream: {error}", job.name),
        }
    }

    /// Discovers and splits the job's tables and prepares the target, keeping the split ids of
    /// the previous plan for tables it already had. With tables being added, the plan copies
    /// only them while the stream runs on with the version before.
    ///
    /// A schedule's new batch plans afresh (a new snapshot position) and starts the copy over:
    /// the job's target tables are emptied and their checkpoints forgotten first; a
    /// cursor-incremental job's keeps its rows and copies the window above its marks.
    async fn plan(&self, job: &JobRecord, previous: Option<PlanRecord>) -> Result<PlanRecord> {
        let spec = Arc::new(load_spec(&*self.store, &self.config.document_rules, &job.name, job.version).await?);
        let batch = batch_of(job);
        let fresh = previous.as_ref().is_some_and(|previous| previous.batch < batch);
        let incremental = spec.mode == sluice_core::spec::Mode::IncrementalCursor;
        let source = sluice_connectors::source(&spec)?;
        let sink = sluice_connectors::sink(&spec)?;
        // A cursor-incremental batch starts each table where the last one's checkpoints in the
        // target say it got to, and forgets them first, so a crash before the new plan is stored
        // reads the last window again rather than skipping the new one.
        let mut marks = Default::default();
        if let (true, true, Some(previous)) = (fresh, incremental, &previous) {
            if let Some(plan) = load_plan(&*self.store, &job.name, previous).await? {
                marks = sluice_core::planner::marks(&spec.name, &*sink, &plan).await?.tables;
                sink.forget_checkpoints(&spec.name, &plan.table_tasks()).await?;
            }
        }
        // A rerun of earlier batches reads their windows again, then the next batch goes on from
        // the marks.
        let rerun = job
            .batches
            .as_ref()
            .and_then(|batches| batches.history.iter().rev().find(|record| record.batch == Some(batch)))
            .and_then(|record| record.rerun_of);
        let windows = match (fresh && incremental, rerun, spec.source.cursor.as_ref()) {
            (true, Some(range), Some(cursor)) => rerun_windows(job, range, &cursor.column, &marks),
            _ => Default::default(),
        };
        if let Some(range) = rerun {
            log::info!("job {}: batch {batch} runs batches {} to {} again", job.name, range.from, range.to);
        }
        let previous = if fresh { None } else { previous };
        let previous_backfill = previous.as_ref().and_then(|previous| previous.backfill.clone());
        let previous_plan = match &previous {
            None => None,
            Some(previous) => match load_plan(&*self.store, &job.name, previous).await {
                Ok(plan) => plan,
                // Pieces removed under it (the job was deleted and made again): plan afresh.
                Err(error) if error.side() == Some(Side::State) && error.message().contains("is missing") => {
                    log::warn!("job {}: the previous plan is incomplete ({error}); planning afresh", job.name);
                    None
                }
                Err(error) => return Err(error),
            },
        };
        let added: Vec<TableName> =
            job.backfill.iter().flat_map(|request| &request.tables).map(|table| TableName::parse(table)).collect();
        // The stream goes back here for the added tables: before any of their rows is read.
        let from = match (&job.backfill, &previous_backfill) {
            (Some(request), Some(previous)) if previous.backfill.id == request.id => {
                Some(previous.backfill.from.clone())
            }
            (Some(_), _) => Some(source.needs_changes()?.log_position().await?.ok_or_else(|| {
                Error::new(ErrorKind::Config, "the source has no change log position to backfill from")
                    .on(sluice_core::Side::Source)
            })?),
            _ => None,
        };
        let planned = Planner::new(spec.clone(), source, sink.clone())
            .splitting(added.clone())
            .from_marks(marks)
            .with_windows(windows)
            .plan(previous_plan)
            .await?;
        // Workers run their tasks on this plan without discovering again: the target tables are
        // made once, here.
        // Copies still hidden are made and judged under their hidden names.
        let hidden = sluice_core::hidden::HiddenCopies::of(&planned.plan, &*sink, &spec.name).await?;
        let targets = hidden.schemas(&planned.targets);
        sluice_core::planner::prepare_target(&spec, &*sink, &planned.plan, &hidden, &targets).await?;
        let plan = planned.plan;
        let tables = hidden.tasks(plan.table_tasks());
        match (fresh, spec.mode) {
            (true, sluice_core::spec::Mode::IncrementalCursor) => {
                log::info!("job {}: batch {batch} copies the rows changed since batch {}", job.name, batch - 1)
            }
            (true, sluice_core::spec::Mode::Cdc) => {
                log::info!("job {}: batch {batch} applies the changes up to where the source stands now", job.name)
            }
            (true, _) => {
                log::info!(
                    "job {}: batch {batch} copies afresh: emptying its {} target tables",
                    job.name,
                    tables.len()
                );
                sink.reset(&spec.name, &tables).await?;
            }
            (false, _) => sluice_core::planner::verify_checkpoints(&spec, &*sink, &tables).await?,
        }
        let mut record = PlanRecord {
            generation: job.generation,
            version: job.version,
            tasks: tasks_of(spec.mode, &plan),
            plan: None,
            pieces: None,
            error: None,
            stream_version: None,
            // A backfill taken in stays with the stream's plans: its checkpoint says whether it
            // took it in.
            backfill: previous_backfill.filter(|backfill| backfill.copied),
            batch,
            windows: windows_of(&plan),
        };
        if let (Some(request), Some(from)) = (&job.backfill, from) {
            record.tasks = snapshot_tasks(&plan, &added);
            record.tasks.push(TaskPlan {
                id: STREAM_TASK.to_owned(),
                kind: TaskKind::Cdc,
                tables: Vec::new(),
                splits: None,
                after: Vec::new(),
                estimated_rows: 0,
            });
            record.stream_version = Some(request.stream_version);
            record.backfill = Some(BackfillPlan {
                backfill: Backfill { id: request.id.clone(), tables: added, from },
                copied: false,
            });
        }
        record.plan = Some(plan);
        Ok(record)
    }
}

/// The cursor windows of a plan's tables, as a batch's history keeps them.
fn windows_of(plan: &sluice_core::state::Plan) -> std::collections::BTreeMap<String, WindowBounds> {
    plan.tables
        .iter()
        .filter_map(|planned| {
            let split = planned.splits.first()?;
            let window = split.window.as_ref()?;
            Some((
                split.table.name.to_string(),
                WindowBounds { after: window.after.clone(), through: window.through.clone() },
            ))
        })
        .collect()
}

/// The windows that read batches `range.from` to `range.to` again: for each table the last one
/// read, from the start of the first of them that read it (a table created in the source since
/// batch `from` joined later) to the last one's end, marked as a rerun so the next batch starts
/// at `marks`.
fn rerun_windows(
    job: &JobRecord,
    range: BatchRange,
    column: &str,
    marks: &std::collections::BTreeMap<TableName, Option<serde_json::Value>>,
) -> std::collections::BTreeMap<TableName, sluice_core::cursor::CursorWindow> {
    let history = job.batches.as_ref().map(|batches| batches.history.as_slice()).unwrap_or_default();
    let windows_of =
        |number: u64| history.iter().find(|record| record.batch == Some(number)).map(|record| &record.windows);
    let (Some(_), Some(last)) = (windows_of(range.from), windows_of(range.to)) else {
        log::warn!(
            "job {}: batches {} to {} are no longer in the history; this batch reads from the marks",
            job.name,
            range.from,
            range.to
        );
        return Default::default();
    };
    last.iter()
        .filter_map(|(table, end)| {
            let start = (range.from..=range.to).find_map(|number| windows_of(number)?.get(table))?;
            let name = TableName::parse(table);
            let window = sluice_core::cursor::CursorWindow {
                column: column.to_owned(),
                mark: marks.get(&name).cloned().flatten(),
                after: start.after.clone(),
                through: end.through.clone(),
                rerun: true,
            };
            Some((name, window))
        })
        .collect()
}

/// The schedule's batch a job is at (0 without a schedule).
/// The jobs to run whose plan is missing or of an older generation, and those whose added
/// tables' copy is complete (`true`: their backfill joins the stream).
fn to_plan(view: &View) -> impl Iterator<Item = (&str, &JobRecord, bool)> + '_ {
    view.jobs().filter_map(|(name, job)| {
        // A batched job runs only what a firing made.
        if job.desired != Desired::Running || job.waiting_for_a_firing() {
            return None;
        }
        let current = view.plan(name).filter(|plan| plan.generation == job.generation);
        let copied = current.is_some_and(|plan| {
            plan.backfill.as_ref().is_some_and(|backfill| !backfill.copied) && {
                let statuses = view.statuses_of(name);
                plan.tasks.iter().filter(|task| task.kind == TaskKind::Snapshot).all(|task| {
                    statuses.get(task.id.as_str()).is_some_and(|status| {
                        status.generation == job.generation && status.state == TaskState::Succeeded
                    })
                })
            }
        });
        (current.is_none() || copied).then_some((name, job, copied))
    })
}

fn batch_of(job: &JobRecord) -> u64 {
    job.batches.as_ref().map_or(0, |batches| batches.batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rerun_reads_each_table_from_the_first_batch_that_read_it_to_the_last() {
        let bounds = |after: Option<i64>, through: i64| WindowBounds {
            after: after.map(serde_json::Value::from),
            through: Some(through.into()),
        };
        let record = |batch: u64, windows: &[(&str, WindowBounds)]| BatchRecord {
            batch: Some(batch),
            windows: windows.iter().map(|(table, bounds)| ((*table).to_owned(), bounds.clone())).collect(),
            ..BatchRecord::default()
        };
        let mut job: JobRecord = serde_json::from_value(serde_json::json!({
            "name": "j", "version": 1, "desired": "running", "generation": 7, "mode": "incremental-cursor",
            "updated_at": "",
        }))
        .unwrap();
        // `s.late` was created in the source after batch 1: batch 2 is the first to read it.
        job.batches = Some(Batches {
            batch: 3,
            history: vec![
                record(1, &[("s.early", bounds(None, 10))]),
                record(2, &[("s.early", bounds(Some(5), 20)), ("s.late", bounds(Some(1), 20))]),
                record(3, &[("s.early", bounds(Some(15), 30)), ("s.late", bounds(Some(15), 30))]),
            ],
            ..Batches::default()
        });
        let marks = [(TableName::parse("s.early"), Some(30.into()))].into();
        let windows = rerun_windows(&job, BatchRange { from: 1, to: 3 }, "at", &marks);
        let of = |table: &str| {
            let window = &windows[&TableName::parse(table)];
            (window.after.clone(), window.through.clone(), window.mark.clone(), window.rerun)
        };
        assert_eq!(of("s.early"), (None, Some(30.into()), Some(30.into()), true));
        assert_eq!(of("s.late"), (Some(1.into()), Some(30.into()), None, true));
        let later = rerun_windows(&job, BatchRange { from: 2, to: 3 }, "at", &marks);
        assert_eq!(later[&TableName::parse("s.early")].after, Some(5.into()));
    }
}
