//! The leader fires schedules: a scheduled job runs again as batch N + 1 when its firing is due.
//!
//! A firing is a compare-and-swap of the job record (its batch number and a new generation), so
//! of two nodes that both believe they lead, one fires and the other finds the record changed:
//! a batch is never fired twice, across leader changes included. The new generation makes the
//! leader plan the job afresh (`leader.rs`): the target's tables of the job are emptied and
//! their checkpoints forgotten, then every task copies again.

use std::collections::BTreeSet;
use std::sync::Arc;

use sluice_core::spec::{Dependency, Missed, OnFailure, Overlap, ScheduleSpec};

use super::model::*;
use super::node::{Node, View};
use crate::logger::timestamp;

/// What the leader does with a scheduled job at a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is due.
    Wait,
    /// The batches are written back as they are (first firing set, an outcome recorded, a
    /// firing skipped or queued).
    Record(Batches),
    /// Batch `batches.batch` runs now.
    Fire(Batches),
    /// The job stops (a job it runs after failed, `on_failure: stop`); the batches say why.
    Stop(Batches),
}

/// How the job's current batch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchState {
    /// No batch ran yet.
    None,
    Running,
    /// It ended: `succeeded` or `failed`.
    Ended(&'static str),
}

/// Decides a tick for one scheduled job, at `now` (Unix seconds). `downstream` names a job of
/// its unit (one that runs after it, directly or not) still busy with the current batch: until
/// it ends, the batch counts as running, so a new batch never rewrites what that job reads.
pub fn decide(
    schedule: &ScheduleSpec,
    batches: Option<&Batches>,
    state: BatchState,
    downstream: Option<&str>,
    now: i64,
) -> Decision {
    let Some(batches) = batches else {
        let first = schedule.first(now);
        return Decision::Record(Batches { anchor: first.unwrap_or(now), due_at: first, ..Batches::default() });
    };
    let mut next = batches.clone();
    let changed = record_outcome(&mut next, state);
    let running = state == BatchState::Running || downstream.is_some();
    let running_now = |batch: u64| match downstream {
        Some(job) if state != BatchState::Running => format!("batch {batch} of job {job}, which runs after it,"),
        _ => format!("batch {batch}"),
    };
    let due = next.due_at.is_some_and(|due| due <= now);
    if due {
        let due_at = next.due_at.expect("due");
        let following = schedule.next_after(next.anchor, now);
        // Firings after this one that passed too: the server was down for them.
        let missed = schedule.next_after(next.anchor, due_at).is_some_and(|after| after <= now);
        next.due_at = following;
        if missed && schedule.missed == Missed::Skip {
            push(&mut next, skipped(due_at, "missed while no server ran (missed: skip)"));
            return Decision::Record(next);
        }
        if running {
            match schedule.overlap {
                Overlap::Skip => {
                    let reason = format!("{} was still running (overlap: skip)", running_now(batches.batch));
                    push(&mut next, skipped(due_at, &reason));
                }
                Overlap::Queue if next.queued => {
                    let reason = format!(
                        "{} was still running and a firing already waits (overlap: queue)",
                        running_now(batches.batch)
                    );
                    push(&mut next, skipped(due_at, &reason));
                }
                Overlap::Queue => next.queued = true,
            }
            return Decision::Record(next);
        }
        if next.rerun.is_some() {
            // The rerun goes first; this firing runs right after it.
            next.queued = true;
        }
        return Decision::Fire(fire(next, due_at));
    }
    if next.rerun.is_some() && !running {
        return Decision::Fire(fire(next, now));
    }
    if next.queued && !running {
        next.queued = false;
        return Decision::Fire(fire(next, now));
    }
    if changed {
        Decision::Record(next)
    } else {
        Decision::Wait
    }
}

/// Decides a tick for a job that runs `after` others: its batch N + 1 fires once batch N + 1 of
/// each of them ended, by the policy of each that did not succeed. `dependencies` are their
/// batches, `None` for a job not (yet) on the server or that never fired. `busy.upstream`
/// names one of them running a batch now: a rerun or a batch asked for waits until it ends, so
/// it never reads what that batch is rewriting (a regular batch N + 1 waits for theirs anyway).
/// `busy.downstream` names a job of its unit after it that has not ended the current batch or
/// runs one now (a rerun): no batch fires until it ends, so none rewrites what that job reads.
pub fn decide_after(
    after: &[Dependency],
    batches: Option<&Batches>,
    state: BatchState,
    dependencies: &[Option<&Batches>],
    busy: Busy,
    now: i64,
) -> Decision {
    let Some(batches) = batches else {
        // A job made after its dependencies ran goes along from their current batch.
        let current = dependencies.iter().map(|batches| batches.map_or(0, |batches| batches.batch)).min().unwrap_or(0);
        return Decision::Record(Batches { batch: current.saturating_sub(1), anchor: now, ..Batches::default() });
    };
    let mut next = batches.clone();
    let changed = record_outcome(&mut next, state);
    let asked = next.rerun.is_some() || next.queued;
    if state == BatchState::Running || busy.downstream.is_some() || (busy.upstream.is_some() && asked) {
        return if changed { Decision::Record(next) } else { Decision::Wait };
    }
    if next.rerun.is_some() {
        return Decision::Fire(fire(next, now));
    }
    if next.queued {
        next.queued = false;
        return Decision::Fire(fire(next, now));
    }
    let number = batches.batch + 1;
    let mut failures = Vec::new();
    for (dependency, theirs) in after.iter().zip(dependencies) {
        let outcome = theirs
            .and_then(|theirs| theirs.history.iter().rev().find(|record| record.batch == Some(number)))
            .map(|record| record.outcome.clone());
        match outcome {
            // Not fired yet, or running.
            None | Some(None) => return if changed { Decision::Record(next) } else { Decision::Wait },
            Some(Some(outcome)) if outcome == "succeeded" => {}
            Some(Some(outcome)) => failures.push((dependency, outcome)),
        }
    }
    let failed = |policy: OnFailure| failures.iter().find(|(dependency, _)| dependency.on_failure == policy);
    let reason = |(dependency, outcome): &(&Dependency, String)| {
        format!("job {} batch {number} ended {outcome} (on_failure: {})", dependency.job, dependency.on_failure)
    };
    if let Some(failure) = failed(OnFailure::Stop) {
        next.batch = number;
        let outcome = Some(format!("stopped: {}", reason(failure)));
        push(&mut next, BatchRecord { batch: Some(number), due_at: now, outcome, ..BatchRecord::default() });
        return Decision::Stop(next);
    }
    if let Some(failure) = failed(OnFailure::Skip) {
        next.batch = number;
        let outcome = Some(format!("skipped: {}", reason(failure)));
        push(&mut next, BatchRecord { batch: Some(number), due_at: now, outcome, ..BatchRecord::default() });
        return Decision::Record(next);
    }
    Decision::Fire(fire(next, now))
}

/// The jobs of a unit around one that keep it from firing a batch now (`decide_after`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Busy<'a> {
    /// A job it runs after, running a batch.
    pub upstream: Option<&'a str>,
    /// A job that runs after it (directly or not), busy with the current batch.
    pub downstream: Option<&'a str>,
}

/// Records the outcome of the batch that ended, once; whether it did.
fn record_outcome(batches: &mut Batches, state: BatchState) -> bool {
    let BatchState::Ended(outcome) = state else { return false };
    let current = batches.batch;
    match batches.history.iter_mut().rev().find(|record| record.batch == Some(current)) {
        Some(record) if record.outcome.is_none() => {
            record.outcome = Some(outcome.to_owned());
            record.ended_at = Some(timestamp());
            true
        }
        _ => false,
    }
}

/// Fires the next batch: the rerun asked for, if any, else the schedule's next one.
fn fire(mut batches: Batches, due_at: i64) -> Batches {
    batches.batch += 1;
    let record = BatchRecord {
        batch: Some(batches.batch),
        due_at,
        fired_at: Some(timestamp()),
        rerun_of: batches.rerun.take(),
        ..BatchRecord::default()
    };
    push(&mut batches, record);
    batches
}

fn skipped(due_at: i64, reason: &str) -> BatchRecord {
    BatchRecord { batch: None, due_at, outcome: Some(format!("skipped: {reason}")), ..BatchRecord::default() }
}

fn push(batches: &mut Batches, record: BatchRecord) {
    batches.history.push(record);
    let excess = batches.history.len().saturating_sub(BATCH_HISTORY);
    batches.history.drain(..excess);
}

/// How the job's current batch stands in the view.
pub(super) fn batch_state(view: &View, job: &JobRecord) -> BatchState {
    let Some(batches) = &job.batches else { return BatchState::None };
    if batches.batch == 0 {
        return BatchState::None;
    }
    let Some(plan) = view.plan(&job.name).filter(|plan| plan.generation == job.generation) else {
        return BatchState::Running;
    };
    if plan.error.is_some() {
        return BatchState::Ended("failed");
    }
    let mut failed = false;
    let statuses = view.statuses_of(&job.name);
    for task in &plan.tasks {
        let status = statuses.get(task.id.as_str()).filter(|status| status.generation == job.generation);
        match status.map(|status| status.state) {
            Some(TaskState::Succeeded) => {}
            Some(TaskState::Failed | TaskState::Stopped) => failed = true,
            _ => return BatchState::Running,
        }
    }
    BatchState::Ended(if failed { "failed" } else { "succeeded" })
}

/// Gives the batch that just ended its rows, summed over its tasks, and the cursor windows it
/// read, from the plan and statuses of its generation.
fn summarize(view: &View, job: &JobRecord, batches: &mut Batches) {
    let current = job.batches.as_ref().map_or(0, |batches| batches.batch);
    let Some(record) = batches.history.iter_mut().rev().find(|record| record.batch == Some(current)) else { return };
    if record.outcome.is_none() || record.rows.is_some() {
        return;
    }
    let Some(plan) = view.plan(&job.name).filter(|plan| plan.generation == job.generation) else { return };
    let mut rows = BatchRows::default();
    let statuses = view.statuses_of(&job.name);
    for task in &plan.tasks {
        let status = statuses.get(task.id.as_str()).filter(|status| status.generation == job.generation);
        if let Some(status) = status {
            rows.read += status.rows_read;
            rows.written += status.rows_written;
            rows.skipped += status.rows_skipped;
        }
    }
    record.rows = Some(rows);
    record.windows = plan.windows.clone();
}

/// A running job of `root`'s unit (one that runs after it, directly or through others) that
/// has not ended batch `batch` yet, or runs a batch now (a rerun of earlier batches reads what
/// `root`'s next batch would empty), if any.
fn busy_downstream<'a>(view: &'a View, fired: &BTreeSet<String>, root: &str, batch: u64) -> Option<&'a str> {
    if batch == 0 {
        return None;
    }
    let mut unit = vec![root];
    let mut index = 0;
    while index < unit.len() {
        let upstream = unit[index];
        index += 1;
        for (name, job) in view.jobs() {
            if unit.contains(&name) || !job.after.iter().any(|dependency| dependency.job == upstream) {
                continue;
            }
            unit.push(name);
            if job.desired != Desired::Running {
                continue;
            }
            let theirs = job.batches.as_ref().map_or(0, |batches| batches.batch);
            if theirs < batch || runs_a_batch(view, fired, name, job) {
                return Some(name);
            }
        }
    }
    None
}

/// Whether the job runs a batch now, or fired one in this pass over the schedules (`fired`),
/// which the view, read before it, does not show yet.
fn runs_a_batch(view: &View, fired: &BTreeSet<String>, name: &str, job: &JobRecord) -> bool {
    fired.contains(name) || batch_state(view, job) == BatchState::Running
}

impl Node {
    /// As leader: fires the schedules that are due. The copy tells whether any job's schedule
    /// has something to record; the store, read now, what: a batch is never fired on a copy that
    /// may lag another node's latest write (a firing of the previous leader, a dependant's batch
    /// that began).
    pub(super) async fn fire_schedules(self: &Arc<Self>, copy: &View) {
        let now = sluice_core::clock::unix_seconds() as i64;
        if !copy.jobs().any(|(name, job)| scheduled(copy, &BTreeSet::new(), name, job, now).is_some()) {
            return;
        }
        let view = match self.stored_view().await {
            Ok(view) => view,
            Err(error) => {
                log::warn!("node {}: schedules wait for the coordination store: {error}", self.config.id);
                return;
            }
        };
        let mut fired = BTreeSet::new();
        for (name, job) in view.jobs() {
            let Some(updated) = scheduled(&view, &fired, name, job, now) else { continue };
            match self.store.replace(&job_key(name), &encode(&updated), job.revision).await {
                Ok(true) => {
                    let batches = updated.batches.as_ref().expect("set above");
                    let before = job.batches.as_ref().and_then(|old| old.history.last());
                    if updated.generation != job.generation {
                        fired.insert(name.to_owned());
                        let trigger = job
                            .schedule
                            .as_ref()
                            .map_or_else(|| "after its dependencies".to_owned(), ToString::to_string);
                        log::info!("job {name}: batch {} fires ({trigger})", batches.batch);
                    } else if let Some(record) = batches.history.last().filter(|record| before != Some(*record)) {
                        log::info!("job {name}: {}", describe(record));
                    }
                }
                // Changed meanwhile (an operator, or another node): looked at again next tick.
                Ok(false) => {}
                Err(error) => log::warn!("job {name}: could not record its schedule: {error}"),
            }
        }
    }
}

/// The job's record with what its schedule (or its dependencies) decide now, when they decide
/// anything: a batch fired, recorded, skipped, or the job stopped.
fn scheduled(view: &View, fired: &BTreeSet<String>, name: &str, job: &JobRecord, now: i64) -> Option<JobRecord> {
    if job.desired != Desired::Running || !job.batched() {
        return None;
    }
    let state = batch_state(view, job);
    let mut decision = match &job.schedule {
        Some(schedule) => {
            let current = job.batches.as_ref().map_or(0, |batches| batches.batch);
            decide(schedule, job.batches.as_ref(), state, busy_downstream(view, fired, name, current), now)
        }
        None => {
            let current = job.batches.as_ref().map_or(0, |batches| batches.batch);
            let dependencies: Vec<Option<&Batches>> = job
                .after
                .iter()
                .map(|dependency| view.job(&dependency.job).and_then(|other| other.batches.as_ref()))
                .collect();
            let busy = Busy {
                upstream: job.after.iter().map(|dependency| dependency.job.as_str()).find(|upstream| {
                    view.job(upstream).is_some_and(|other| {
                        other.desired == Desired::Running && runs_a_batch(view, fired, upstream, other)
                    })
                }),
                downstream: busy_downstream(view, fired, name, current),
            };
            decide_after(&job.after, job.batches.as_ref(), state, &dependencies, busy, now)
        }
    };
    if let Decision::Record(batches) | Decision::Fire(batches) | Decision::Stop(batches) = &mut decision {
        summarize(view, job, batches);
    }
    Some(match decision {
        Decision::Wait => return None,
        Decision::Record(batches) => JobRecord { batches: Some(batches), ..job.clone() },
        Decision::Stop(batches) => {
            JobRecord { batches: Some(batches), desired: Desired::Stopped, updated_at: timestamp(), ..job.clone() }
        }
        Decision::Fire(mut batches) => {
            let generation = next_generation(job.generation);
            if let Some(record) = batches.history.last_mut() {
                record.generation = Some(generation);
            }
            JobRecord { batches: Some(batches), generation, updated_at: timestamp(), ..job.clone() }
        }
    })
}

fn describe(record: &BatchRecord) -> String {
    match (record.batch, &record.outcome) {
        (Some(batch), Some(outcome)) => format!("batch {batch} {outcome}"),
        (None, Some(outcome)) => format!("a firing due at {} was {outcome}", record.due_at),
        _ => "a batch is recorded".to_owned(),
    }
}

/// The first cycle `after` would close through the jobs on the server (`graph`: each job's
/// `after` names), as the path from `name` back to it.
pub fn cycle(
    name: &str,
    after: &[String],
    graph: &std::collections::BTreeMap<String, Vec<String>>,
) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        target: &str,
        graph: &std::collections::BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        seen: &mut std::collections::BTreeSet<String>,
    ) -> bool {
        if at == target {
            return true;
        }
        if !seen.insert(at.to_owned()) {
            return false;
        }
        path.push(at.to_owned());
        for next in graph.get(at).into_iter().flatten() {
            if visit(next, target, graph, path, seen) {
                return true;
            }
        }
        path.pop();
        false
    }
    let mut seen = std::collections::BTreeSet::new();
    for first in after {
        let mut path = vec![name.to_owned()];
        if visit(first, name, graph, &mut path, &mut seen) {
            path.push(name.to_owned());
            return Some(path);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dependency(job: &str, on_failure: OnFailure) -> Dependency {
        Dependency { job: job.into(), on_failure }
    }

    fn ended(batch: u64, outcome: &str) -> Batches {
        let record = BatchRecord {
            batch: Some(batch),
            generation: Some(batch),
            outcome: Some(outcome.into()),
            ..BatchRecord::default()
        };
        Batches { batch, history: vec![record], ..Batches::default() }
    }

    #[test]
    fn a_dependant_batch_waits_for_the_same_batch_of_every_job_it_runs_after() {
        let after = [dependency("a", OnFailure::Skip), dependency("b", OnFailure::Skip)];
        let (a1, b0) = (ended(1, "succeeded"), Batches::default());
        let mine = recorded(decide_after(&after, None, BatchState::None, &[Some(&a1), Some(&b0)], Busy::default(), 5));
        assert_eq!(mine.batch, 0);
        assert_eq!(
            decide_after(&after, Some(&mine), BatchState::None, &[Some(&a1), Some(&b0)], Busy::default(), 6),
            Decision::Wait
        );
        assert_eq!(
            decide_after(&after, Some(&mine), BatchState::None, &[Some(&a1), None], Busy::default(), 6),
            Decision::Wait
        );
        let b1 = ended(1, "succeeded");
        let one =
            fired(decide_after(&after, Some(&mine), BatchState::None, &[Some(&a1), Some(&b1)], Busy::default(), 7));
        assert_eq!(one.batch, 1);
        assert_eq!(
            decide_after(&after, Some(&one), BatchState::Running, &[Some(&a1), Some(&b1)], Busy::default(), 8),
            Decision::Wait
        );
    }

    #[test]
    fn a_rerun_or_an_asked_batch_waits_while_a_job_it_runs_after_runs_a_batch() {
        let after = [dependency("a", OnFailure::Skip)];
        let a1 = ended(1, "succeeded");
        let mine = ended(1, "succeeded");
        for asked in [
            Batches { rerun: Some(BatchRange { from: 1, to: 1 }), ..mine.clone() },
            Batches { queued: true, ..mine.clone() },
        ] {
            // `a` started batch 2 and is rewriting what this job reads: wait until it ends.
            let busy = Busy { upstream: Some("a"), downstream: None };
            let waiting = decide_after(&after, Some(&asked), BatchState::None, &[Some(&a1)], busy, 9);
            assert_eq!(waiting, Decision::Wait, "{asked:?}");
            let run = fired(decide_after(&after, Some(&asked), BatchState::None, &[Some(&a1)], Busy::default(), 10));
            assert_eq!(run.batch, 2, "{asked:?}");
        }
    }

    #[test]
    fn no_batch_fires_while_a_job_after_it_reads_what_it_would_rewrite() {
        // `b` runs after `a`; `c` after `b`, and runs a batch now (a rerun of earlier ones).
        let after = [dependency("a", OnFailure::Skip)];
        let (a2, mine) = (ended(2, "succeeded"), ended(1, "succeeded"));
        let busy = Busy { upstream: None, downstream: Some("c") };
        assert_eq!(decide_after(&after, Some(&mine), BatchState::None, &[Some(&a2)], busy, 9), Decision::Wait);
        let free = decide_after(&after, Some(&mine), BatchState::None, &[Some(&a2)], Busy::default(), 9);
        assert_eq!(fired(free).batch, 2);
    }

    #[test]
    fn a_failed_dependency_skips_stops_or_continues_by_its_policy() {
        let failed = ended(1, "failed");
        let none = Batches::default();
        let skip = recorded(decide_after(
            &[dependency("a", OnFailure::Skip)],
            Some(&none),
            BatchState::None,
            &[Some(&failed)],
            Busy::default(),
            9,
        ));
        assert_eq!(skip.batch, 1);
        assert!(
            skip.history[0].outcome.as_deref().unwrap().starts_with("skipped: job a batch 1 ended failed"),
            "{skip:?}"
        );
        // Its own dependants see batch 1 skipped, and skip in turn.
        let after_skip = recorded(decide_after(
            &[dependency("b", OnFailure::Skip)],
            Some(&none),
            BatchState::None,
            &[Some(&skip)],
            Busy::default(),
            9,
        ));
        assert!(after_skip.history[0].outcome.as_deref().unwrap().starts_with("skipped: job b batch 1 ended skipped"));
        match decide_after(
            &[dependency("a", OnFailure::Stop)],
            Some(&none),
            BatchState::None,
            &[Some(&failed)],
            Busy::default(),
            9,
        ) {
            Decision::Stop(batches) => assert!(batches.history[0].outcome.as_deref().unwrap().starts_with("stopped:")),
            other => panic!("expected a stop, got {other:?}"),
        }
        let run = fired(decide_after(
            &[dependency("a", OnFailure::Continue)],
            Some(&none),
            BatchState::None,
            &[Some(&failed)],
            Busy::default(),
            9,
        ));
        assert_eq!(run.batch, 1);
    }

    #[test]
    fn cycles_through_after_are_found() {
        let graph: std::collections::BTreeMap<String, Vec<String>> =
            [("b".to_owned(), vec!["c".to_owned()]), ("c".to_owned(), vec!["a".to_owned()])].into();
        assert_eq!(cycle("a", &["b".to_owned()], &graph), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
        assert_eq!(cycle("d", &["b".to_owned()], &graph), None);
    }

    fn every(seconds: u64, overlap: Overlap, missed: Missed) -> ScheduleSpec {
        ScheduleSpec { every_secs: Some(seconds), cron: None, timezone: "UTC".into(), overlap, missed }
    }

    fn fired(decision: Decision) -> Batches {
        match decision {
            Decision::Fire(batches) => batches,
            other => panic!("expected a firing, got {other:?}"),
        }
    }

    fn recorded(decision: Decision) -> Batches {
        match decision {
            Decision::Record(batches) => batches,
            other => panic!("expected a record, got {other:?}"),
        }
    }

    #[test]
    fn batches_fire_on_the_period_and_record_their_outcome() {
        let schedule = every(60, Overlap::Skip, Missed::RunOnce);
        let first = recorded(decide(&schedule, None, BatchState::None, None, 1_000));
        assert_eq!((first.batch, first.due_at), (0, Some(1_000)));
        let one = fired(decide(&schedule, Some(&first), BatchState::None, None, 1_000));
        assert_eq!((one.batch, one.due_at), (1, Some(1_060)));
        assert_eq!(decide(&schedule, Some(&one), BatchState::Running, None, 1_030), Decision::Wait);
        let ended = recorded(decide(&schedule, Some(&one), BatchState::Ended("succeeded"), None, 1_040));
        assert_eq!(ended.history[0].outcome.as_deref(), Some("succeeded"));
        assert_eq!(decide(&schedule, Some(&ended), BatchState::Ended("succeeded"), None, 1_050), Decision::Wait);
        let two = fired(decide(&schedule, Some(&ended), BatchState::Ended("succeeded"), None, 1_061));
        assert_eq!((two.batch, two.due_at), (2, Some(1_120)));
    }

    #[test]
    fn a_firing_while_the_batch_runs_is_skipped_or_queued_once() {
        let skip = every(60, Overlap::Skip, Missed::RunOnce);
        let one = Batches { batch: 1, anchor: 0, due_at: Some(60), ..Batches::default() };
        let skipped = recorded(decide(&skip, Some(&one), BatchState::Running, None, 60));
        assert_eq!((skipped.batch, skipped.due_at), (1, Some(120)));
        assert!(skipped.history[0].outcome.as_deref().unwrap().contains("batch 1 was still running"));

        let queue = every(60, Overlap::Queue, Missed::RunOnce);
        let queued = recorded(decide(&queue, Some(&one), BatchState::Running, None, 60));
        assert!(queued.queued && queued.history.is_empty());
        let again = recorded(decide(&queue, Some(&queued), BatchState::Running, None, 120));
        assert!(again.queued && again.history.len() == 1, "a second firing beyond the one queued is skipped");
        let two = fired(decide(&queue, Some(&again), BatchState::Ended("succeeded"), None, 130));
        assert_eq!((two.batch, two.queued, two.due_at), (2, false, Some(180)));
    }

    #[test]
    fn a_rerun_fires_as_the_next_batch_and_a_firing_due_meanwhile_follows_it() {
        let schedule = every(60, Overlap::Skip, Missed::RunOnce);
        let range = BatchRange { from: 2, to: 3 };
        let waiting = Batches { batch: 4, anchor: 0, due_at: Some(300), rerun: Some(range), ..Batches::default() };
        let rerun = fired(decide(&schedule, Some(&waiting), BatchState::Ended("succeeded"), None, 250));
        assert_eq!((rerun.batch, rerun.history.last().unwrap().rerun_of, rerun.rerun), (5, Some(range), None));
        // Due at the same time: the rerun goes first, the regular batch right after.
        let both = fired(decide(&schedule, Some(&waiting), BatchState::Ended("succeeded"), None, 300));
        assert_eq!((both.batch, both.queued, both.history.last().unwrap().rerun_of), (5, true, Some(range)));
        let regular = fired(decide(&schedule, Some(&both), BatchState::Ended("succeeded"), None, 310));
        assert_eq!((regular.batch, regular.history.last().unwrap().rerun_of), (6, None));
    }

    #[test]
    fn a_unit_batch_counts_as_running_until_the_jobs_after_it_end_it() {
        let queue = every(60, Overlap::Queue, Missed::RunOnce);
        let one = Batches { batch: 1, anchor: 0, due_at: Some(60), ..Batches::default() };
        // The root's own batch ended, but a job reading what it wrote still runs batch 1.
        let queued = recorded(decide(&queue, Some(&one), BatchState::Ended("succeeded"), Some("load"), 60));
        assert!(queued.queued, "{queued:?}");
        let skip = every(60, Overlap::Skip, Missed::RunOnce);
        let skipped = recorded(decide(&skip, Some(&one), BatchState::Ended("succeeded"), Some("load"), 60));
        let reason = skipped.history.last().unwrap().outcome.clone().unwrap();
        assert!(reason.contains("batch 1 of job load, which runs after it, was still running"), "{reason}");
        // Once it ended, the queued firing runs.
        let two = fired(decide(&queue, Some(&queued), BatchState::Ended("succeeded"), None, 70));
        assert_eq!(two.batch, 2);
    }

    #[test]
    fn firings_missed_while_down_run_once_or_are_skipped() {
        let one = Batches { batch: 1, anchor: 0, due_at: Some(60), ..Batches::default() };
        // Down from 50 to 400: the firings at 60 … 360 passed.
        let once = fired(decide(&every(60, Overlap::Skip, Missed::RunOnce), Some(&one), BatchState::None, None, 400));
        assert_eq!((once.batch, once.due_at), (2, Some(420)));
        let skip = recorded(decide(&every(60, Overlap::Skip, Missed::Skip), Some(&one), BatchState::None, None, 400));
        assert_eq!((skip.batch, skip.due_at), (1, Some(420)));
        assert!(skip.history[0].outcome.as_deref().unwrap().contains("missed"));
    }

    #[test]
    fn the_history_keeps_the_latest_firings() {
        let schedule = every(1, Overlap::Skip, Missed::RunOnce);
        let mut batches = Batches { anchor: 0, due_at: Some(0), ..Batches::default() };
        for now in 0..(BATCH_HISTORY as i64 + 10) {
            batches = fired(decide(&schedule, Some(&batches), BatchState::None, None, now));
        }
        assert_eq!(batches.history.len(), BATCH_HISTORY);
        assert_eq!(batches.history.last().unwrap().batch, Some(batches.batch));
    }
}
