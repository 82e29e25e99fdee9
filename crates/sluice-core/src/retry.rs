//! The one place that decides whether a failure is worth another attempt, and how long to wait.

use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::spec::RetryPolicy;

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

#[cfg(test)]
mod tests {
    use super::*;

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
