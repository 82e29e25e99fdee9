//! The one place that decides whether a failure is worth another attempt, and how long to wait.

use std::time::Duration;

use crate::connector::{Sink, Source};
use crate::error::{Error, ErrorKind, Side};
use crate::spec::{RestartPolicy, RetryPolicy};

/// True for failures a later attempt may not meet: unreachable servers and broken connections,
/// deadlocks and lock timeouts. Everything else (bad credentials, missing tables, bad data,
/// configuration) fails at once, since repeating it only delays the error.
pub fn is_transient(error: &Error) -> bool {
    match error.kind() {
        ErrorKind::Connect | ErrorKind::Unavailable => true,
        ErrorKind::Config
        | ErrorKind::Auth
        | ErrorKind::Read
        | ErrorKind::Write
        | ErrorKind::Schema
        | ErrorKind::Data
        | ErrorKind::State
        | ErrorKind::PositionLost
        | ErrorKind::Conflict
        | ErrorKind::Fenced
        | ErrorKind::Interrupted => false,
    }
}

/// The wait before attempt `attempt` (1-based; the first retry is attempt 2): exponential from
/// the initial backoff, capped.
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let exponent = attempt.saturating_sub(2).min(20);
    let millis = policy.initial_backoff_ms.saturating_mul(1 << exponent).min(policy.max_backoff_ms);
    Duration::from_millis(millis)
}

/// Calls `step` until it succeeds, fails for good, or has used `policy.max_attempts`; logs each
/// retry with `what`. `stopped` ends the retries early; `pause` waits between attempts (and may
/// return early on a stop).
pub async fn retrying<T, Step, StepFuture, Pause, PauseFuture>(
    policy: &RetryPolicy,
    what: &str,
    stopped: impl Fn() -> bool,
    pause: Pause,
    mut step: Step,
) -> crate::error::Result<T>
where
    Step: FnMut() -> StepFuture,
    StepFuture: std::future::Future<Output = crate::error::Result<T>>,
    Pause: Fn(Duration) -> PauseFuture,
    PauseFuture: std::future::Future<Output = ()>,
{
    let mut attempt = 1;
    loop {
        match step().await {
            Ok(value) => return Ok(value),
            Err(error) if is_transient(&error) && attempt < policy.max_attempts && !stopped() => {
                attempt += 1;
                let wait = backoff(policy, attempt);
                log::warn!("{what}: {error}; attempt {attempt} of {} in {wait:?}", policy.max_attempts);
                pause(wait).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// What to do with a task that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restart {
    /// Run it again from its checkpoint after this wait.
    After(Duration),
    /// Leave it failed: its error cannot heal, or the policy's restarts are used up (the reason
    /// says which limit).
    GiveUp(String),
}

/// A task's restarts under its `RestartPolicy`, carried from run to run (and, in a cluster, from
/// worker to worker in the task's status).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Restarts {
    /// Restarts of the task so far.
    pub total: u32,
    /// Failures in a row, with no row written in between.
    pub in_a_row: u32,
    /// When the first of those failures happened (seconds since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<u64>,
}

impl Restarts {
    /// Counts a failure of the task (`progressed`: its run wrote rows before it failed, which
    /// starts the count in a row afresh) at `now` (Unix seconds) and says what comes next. Only
    /// failures that may heal (`is_transient`) are restarted; every other error stops the task
    /// at once.
    pub fn failed(&mut self, policy: &RestartPolicy, error: &Error, progressed: bool, now: u64) -> Restart {
        if !is_transient(error) {
            return Restart::GiveUp("its error does not heal by itself".to_owned());
        }
        if progressed {
            self.in_a_row = 0;
            self.failing_since = None;
        }
        self.in_a_row += 1;
        let since = *self.failing_since.get_or_insert(now);
        if policy.max_restarts == 0 {
            return Restart::GiveUp("restarts are off (restart.max_restarts is 0)".to_owned());
        }
        if self.in_a_row > policy.max_restarts {
            return Restart::GiveUp(format!(
                "it failed {} times in a row without writing a row (restart.max_restarts is {})",
                self.in_a_row, policy.max_restarts
            ));
        }
        let failing = now.saturating_sub(since);
        if policy.give_up_after_secs > 0 && failing >= policy.give_up_after_secs {
            return Restart::GiveUp(format!(
                "it has been failing for {failing} s without writing a row (restart.give_up_after_secs is {})",
                policy.give_up_after_secs
            ));
        }
        self.total += 1;
        let exponent = (self.in_a_row - 1).min(20);
        let millis = policy.initial_backoff_ms.saturating_mul(1 << exponent).min(policy.max_backoff_ms);
        Restart::After(Duration::from_millis(millis))
    }
}

/// How often a restart's wait asks the side that failed whether it answers again.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long one such ask may take before it counts as no answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// How a restart's wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// The whole backoff passed.
    Out,
    /// The side that failed answers again after it did not: the restart need not wait longer.
    Answers,
}

/// Waits out a restart's backoff, or less. `probe` (none where the failure names no side to ask)
/// asks the side that failed whether it answers (its connector's `check`) every `PROBE_EVERY`;
/// once an ask went unanswered, the wait ends at the first answer. A server back after an outage
/// is used again within about a second, however long the backoff has grown meanwhile; a failure
/// the side answers through (it refuses the work, not the connection) waits the whole backoff,
/// so the expensive work still backs off while the asks stay cheap.
pub async fn wait_to_restart<Probe, Answer>(wait: Duration, probe: Option<Probe>) -> Waited
where
    Probe: FnMut() -> Answer,
    Answer: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + wait;
    let Some(mut probe) = probe else {
        tokio::time::sleep_until(deadline).await;
        return Waited::Out;
    };
    let mut unanswered = false;
    loop {
        let next = tokio::time::Instant::now() + PROBE_EVERY;
        if next >= deadline {
            tokio::time::sleep_until(deadline).await;
            return Waited::Out;
        }
        tokio::time::sleep_until(next).await;
        let answered = tokio::select! {
            answered = tokio::time::timeout(PROBE_TIMEOUT, probe()) => answered.unwrap_or(false),
            _ = tokio::time::sleep_until(deadline) => return Waited::Out,
        };
        if !answered {
            unanswered = true;
        } else if unanswered {
            return Waited::Answers;
        }
    }
}

/// A future of a probe's answer, as `probe_of` makes it.
pub type Answer<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>>;

/// The probe of `wait_to_restart` for the side `failure` names: its connector's `check` succeeds.
/// None for a failure of the local state or one that names no side.
pub fn probe_of<'a>(failure: &Error, source: &'a dyn Source, sink: &'a dyn Sink) -> Option<impl FnMut() -> Answer<'a>> {
    let side = failure.side().filter(|side| matches!(side, Side::Source | Side::Target))?;
    Some(move || -> Answer<'a> {
        match side {
            Side::Source => Box::pin(async move { source.check().await.is_ok() }),
            _ => Box::pin(async move { sink.check().await.is_ok() }),
        }
    })
}

/// Whether a run that failed had been doing well first, which starts the count of restarts in a
/// row afresh: it wrote rows, or it ran for longer than the longest backoff (at least a minute; a
/// quiet stream writes nothing for hours).
pub fn ran_well(policy: &RestartPolicy, run: &crate::stats::RunSummary) -> bool {
    let wrote = run.rows_written > 0 || run.stream.as_ref().is_some_and(|stream| stream.rows_applied > 0);
    let lasted = Duration::from_secs_f64(run.elapsed_secs.max(0.0));
    wrote || lasted >= Duration::from_millis(policy.max_backoff_ms.max(60_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe answering as `answers` says, ask by ask (then as its last), counting the asks.
    fn probe<'a>(
        answers: &'static [bool],
        asks: &'a std::cell::Cell<usize>,
    ) -> impl FnMut() -> std::future::Ready<bool> + 'a {
        move || {
            let ask = asks.get();
            asks.set(ask + 1);
            std::future::ready(answers[ask.min(answers.len() - 1)])
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_waits_less_once_the_failed_side_answers_again_after_it_did_not() {
        let wait = Duration::from_secs(60);
        let timed = |answers: &'static [bool]| async move {
            let asks = std::cell::Cell::new(0);
            let started = tokio::time::Instant::now();
            let waited = wait_to_restart(wait, Some(probe(answers, &asks))).await;
            (waited, started.elapsed().as_secs(), asks.get())
        };
        // Down for two asks, then back: the third ask ends the wait.
        assert_eq!(timed(&[false, false, true]).await, (Waited::Answers, 3, 3));
        // Answering all along: the failure was not the connection; the whole backoff passes.
        assert_eq!(timed(&[true]).await, (Waited::Out, 60, 59));
        // Never back within the backoff.
        assert_eq!(timed(&[false]).await, (Waited::Out, 60, 59));
        // Nothing to ask.
        let started = tokio::time::Instant::now();
        let none: Option<fn() -> std::future::Ready<bool>> = None;
        assert_eq!(wait_to_restart(Duration::from_millis(1_500), none).await, Waited::Out);
        assert_eq!(started.elapsed(), Duration::from_millis(1_500));
    }

    fn unavailable() -> Error {
        Error::new(ErrorKind::Unavailable, "connection refused")
    }

    #[test]
    fn restarts_back_off_and_give_up_at_the_first_limit_reached() {
        let policy = RestartPolicy {
            max_restarts: 4,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 3_000,
            give_up_after_secs: 100,
            move_after: 2,
        };
        let mut restarts = Restarts::default();
        let waits: Vec<Restart> =
            (0..4).map(|second| restarts.failed(&policy, &unavailable(), false, second)).collect();
        let seconds = |millis: u64| Restart::After(Duration::from_millis(millis));
        assert_eq!(waits, vec![seconds(1_000), seconds(2_000), seconds(3_000), seconds(3_000)]);
        assert!(
            matches!(restarts.failed(&policy, &unavailable(), false, 5), Restart::GiveUp(reason) if reason.contains("max_restarts"))
        );
        // A run that wrote rows starts the count in a row afresh; the total goes on.
        assert_eq!(restarts.failed(&policy, &unavailable(), true, 50), seconds(1_000));
        assert_eq!((restarts.total, restarts.in_a_row, restarts.failing_since), (5, 1, Some(50)));
        assert_eq!(restarts.failed(&policy, &unavailable(), false, 149), seconds(2_000));
        assert!(
            matches!(restarts.failed(&policy, &unavailable(), false, 150), Restart::GiveUp(reason) if reason.contains("give_up_after_secs"))
        );
    }

    #[test]
    fn a_run_did_well_when_it_wrote_rows_or_lasted_past_the_longest_backoff() {
        let policy = RestartPolicy::default();
        let mut run = crate::stats::RunSummary::new("job", "cdc", &crate::stats::JobStats::default());
        run.elapsed_secs = 5.0;
        assert!(!ran_well(&policy, &run));
        run.elapsed_secs = 61.0;
        assert!(ran_well(&policy, &run), "a quiet stream that ran a minute did well");
        run.elapsed_secs = 5.0;
        run.rows_written = 1;
        assert!(ran_well(&policy, &run));
    }

    #[test]
    fn errors_that_cannot_heal_and_restarts_turned_off_give_up_at_once() {
        let mut restarts = Restarts::default();
        let conflict = Error::new(ErrorKind::Conflict, "row 7 is missing");
        assert!(matches!(restarts.failed(&RestartPolicy::default(), &conflict, false, 0), Restart::GiveUp(_)));
        let off = RestartPolicy { max_restarts: 0, ..RestartPolicy::default() };
        assert!(
            matches!(restarts.failed(&off, &unavailable(), false, 0), Restart::GiveUp(reason) if reason.contains("off"))
        );
        assert_eq!(restarts.total, 0);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let policy = RetryPolicy { max_attempts: 10, initial_backoff_ms: 100, max_backoff_ms: 1_000 };
        let waits: Vec<u128> = (2..7).map(|attempt| backoff(&policy, attempt).as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1_000]);
    }

    #[test]
    fn only_connection_failures_are_retried() {
        assert!(is_transient(&Error::new(ErrorKind::Unavailable, "connection reset")));
        assert!(!is_transient(&Error::new(ErrorKind::Auth, "access denied")));
        assert!(!is_transient(&Error::config("bad field")));
    }
}
