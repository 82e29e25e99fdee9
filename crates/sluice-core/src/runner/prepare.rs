//! The prepare stage: what a run does before it copies anything. It takes the task's fence in
//! the target, plans the job (or adopts the plan a cluster leader made), narrows the plan to
//! the run's scope, finds which copies are still hidden, and prepares the target: creates its
//! tables, or, on a restart, empties them and forgets their checkpoints, or else verifies that
//! the checkpoints it holds match the plan.
//!
//! It owns the plan and hands it on (`Prepared`); it reads no row and writes none.

use std::collections::BTreeSet;

use super::context::RunContext;
use super::Scope;
use crate::connector::Split;
use crate::error::{Error, ErrorKind, Result, Side};
use crate::hidden::HiddenCopies;
use crate::planner::Planner;
use crate::schema::TableSchema;
use crate::spec::{Mode, SchemaChanges};
use crate::state::Plan;
use crate::transform;

/// The plan a run executes, as made here or adopted, before the run's scope narrows it.
pub(super) struct Planned {
    plan: Plan,
    /// The plan's target tables.
    targets: Vec<TableSchema>,
    /// The plan was made by this run (not by a cluster leader): this run prepares the target.
    planned_here: bool,
}

/// What the prepare stage hands the copy and the stream.
pub(super) struct Prepared {
    /// The plan, narrowed to the run's scope.
    pub(super) plan: Plan,
    /// The target tables of the narrowed plan.
    pub(super) targets: Vec<TableSchema>,
    /// Every split of the whole plan. The stream applies the changes of tables read whole (no
    /// key) only past the source position their copy was read at, and sends an event target
    /// only the changes past the read that copied each key (`copied_keys`).
    pub(super) splits: Vec<Split>,
    /// The plan's tables whose copy is still hidden (`crate::hidden`), as the target said when
    /// the run began.
    pub(super) hidden: HiddenCopies,
    /// The run started from scratch and has now emptied the target and forgotten its
    /// checkpoints.
    pub(super) target_reset: bool,
}

/// Takes the task's fence in the target, then plans the job, or adopts `given` (a cluster
/// leader's plan). `restarting` plans afresh, ignoring the stored plan.
pub(super) async fn plan(context: &RunContext, given: Option<&Plan>, restarting: bool) -> Result<Planned> {
    // A fenced sink takes its fence before reading any checkpoint.
    context.with_retry("take the task's fence in the target", || context.sink.claim(&context.job.name)).await?;
    let planned = match given {
        Some(plan) => Planned { plan: plan.clone(), targets: targets_of(context, plan)?, planned_here: false },
        None => plan_here(context, restarting).await?,
    };
    // Takes in which target tables several source tables are merged into.
    context.mappings.add_merged_targets(crate::planner::merged_targets(&context.job, &planned.plan));
    Ok(planned)
}

/// Plans the job from the plan kept in the state store (none on a restart).
async fn plan_here(context: &RunContext, restarting: bool) -> Result<Planned> {
    let job = &context.job;
    // A restart plans afresh, and keeps the new plan only once the target is reset: until then
    // the stored plan still matches the target's checkpoints.
    let mut previous = if restarting { None } else { context.state.load_plan(&job.name)? };
    let mut marks = Default::default();
    if let Some(plan) = previous.as_ref().filter(|_| job.mode == Mode::IncrementalCursor) {
        let found = crate::planner::marks(&job.name, &*context.sink, plan).await?;
        if found.complete {
            // The last batch completed: this run is the next one. Its checkpoints go first, so
            // no new split can be taken for done; a crash before the new plan is kept reads the
            // last window again.
            log::info!("the last batch completed: this run copies the rows changed since");
            context.sink.forget_checkpoints(&job.name, &plan.table_tasks()).await?;
            previous = None;
            marks = found.tables;
        }
    }
    let planned = Planner::new(job.clone(), context.source.clone(), context.sink.clone())
        .stopping_on(context.stop.clone())
        .from_marks(marks)
        .plan(previous)
        .await?;
    if !restarting {
        context.state.save_plan(&job.name, &planned.plan)?;
    }
    Ok(Planned { plan: planned.plan, targets: planned.targets, planned_here: true })
}

/// The target tables of a plan made elsewhere, for the indexes built after the copy.
fn targets_of(context: &RunContext, plan: &Plan) -> Result<Vec<TableSchema>> {
    let mut mappings = Vec::with_capacity(plan.tables.len());
    for planned in &plan.tables {
        if let Some(split) = planned.splits.first() {
            mappings.push((*context.mapping(&split.table)?).clone());
        }
    }
    Ok(transform::target_tables(&mappings))
}

impl Planned {
    /// The plan as made or adopted (the source position it records is the run's).
    pub(super) fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Narrows the plan to `scope`, finds the hidden copies, and, when the plan was made here,
    /// prepares the target (resets it when `restarting`).
    pub(super) async fn prepare(self, context: &RunContext, scope: &Scope, restarting: bool) -> Result<Prepared> {
        let Planned { mut plan, mut targets, planned_here } = self;
        let splits = plan.tables.iter().flat_map(|planned| &planned.splits).cloned().collect();
        narrow(&mut plan, scope)?;
        if matches!(scope, Scope::Tables(_) | Scope::Splits(_)) {
            targets.retain(|target| plan.tables.iter().any(|planned| planned.target == target.name));
        }
        let hidden = context
            .with_retry("list the target's tables", || HiddenCopies::of(&plan, &*context.sink, &context.job.name))
            .await?;
        let target_reset = planned_here && prepare_target(context, &plan, &targets, &hidden, restarting).await?;
        Ok(Prepared { plan, targets, splits, hidden, target_reset })
    }
}

/// Keeps the part of the plan `scope` covers.
fn narrow(plan: &mut Plan, scope: &Scope) -> Result<()> {
    match scope {
        Scope::Tables(tables) => plan.tables.retain(|planned| in_tables(planned, tables)),
        Scope::Splits(splits) => {
            for planned in &mut plan.tables {
                planned.splits.retain(|split| splits.contains(&split.id));
            }
            plan.tables.retain(|planned| !planned.splits.is_empty());
            let found: usize = plan.tables.iter().map(|planned| planned.splits.len()).sum();
            if found != splits.len() {
                return Err(Error::new(
                    ErrorKind::State,
                    format!(
                        "{} of the {} splits this task copies are not in the plan",
                        splits.len() - found,
                        splits.len()
                    ),
                )
                .on(Side::State));
            }
        }
        Scope::Whole | Scope::Stream(_) => {}
    }
    Ok(())
}

fn in_tables(planned: &crate::state::PlannedTable, tables: &BTreeSet<crate::schema::TableName>) -> bool {
    planned.splits.first().is_some_and(|split| tables.contains(&split.table.name))
}

/// Creates the target's tables; then, when `restarting`, empties the job's tables and forgets
/// its checkpoints (returns true once done), or else verifies the checkpoints the target holds.
async fn prepare_target(
    context: &RunContext,
    plan: &Plan,
    targets: &[TableSchema],
    hidden: &HiddenCopies,
    restarting: bool,
) -> Result<bool> {
    let job = &context.job;
    let mut prepared = hidden.schemas(targets);
    if job.schema_changes == SchemaChanges::Ignore {
        keep_target_columns(context, targets, &mut prepared).await?;
    }
    crate::planner::prepare_target(job, &*context.sink, plan, hidden, &prepared).await?;
    let mut tables = hidden.tasks(plan.table_tasks());
    if !restarting {
        crate::planner::verify_checkpoints(job, &*context.sink, &tables).await?;
        return Ok(false);
    }
    // A `cdc` job copies nothing: its tables are not its own to empty.
    if job.mode == Mode::Cdc {
        tables.clear();
    }
    log::warn!("restart: emptying the job's {} target tables and forgetting its checkpoints", tables.len());
    context.sink.reset(&job.name, &tables).await?;
    context.state.forget(&job.name)?;
    context.state.save_plan(&job.name, plan)?;
    Ok(true)
}

/// `schema_changes: ignore`: a target table that exists keeps its columns, whatever the source's
/// are now (an ignored statement may have added some since it was made): the job's rows reach it
/// with the columns it has, and the target is prepared for those alone. `targets` carry the own
/// names, `prepared` the names written under now (a hidden copy's).
async fn keep_target_columns(
    context: &RunContext,
    targets: &[TableSchema],
    prepared: &mut [TableSchema],
) -> Result<()> {
    for (target, table) in targets.iter().zip(prepared.iter_mut()) {
        let columns = context
            .with_retry(&format!("read the columns of target table {}", table.name), || {
                context.sink.table_columns(&table.name)
            })
            .await?;
        let Some(columns) = columns.filter(|columns| !columns.is_empty()) else { continue };
        let has = |name: &str| columns.iter().any(|column| column.eq_ignore_ascii_case(name));
        let left_out: Vec<&str> =
            table.columns.iter().map(|column| column.name.as_str()).filter(|name| !has(name)).collect();
        if !left_out.is_empty() {
            log::warn!(
                "target table {} lacks columns {} of the source's (schema_changes: ignore): rows reach it without them",
                table.name,
                left_out.join(", ")
            );
            *table = table.keeping(&has);
        }
        context.mappings.keep_columns(target.name.clone(), columns);
    }
    Ok(())
}
