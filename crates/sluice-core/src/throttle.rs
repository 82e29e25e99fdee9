//! Job-wide speed limits (`limits.rows_per_sec`, `limits.bytes_per_sec`), shared by every task.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A limiter that schedules each admission in a virtual timeline: an admission of `n` rows takes
/// `n / rate` seconds of it, and waits until its slot starts. Idle time is not saved up, so there
/// is never a burst above the rate.
#[derive(Debug)]
pub(crate) struct Throttle {
    rows_per_sec: u64,
    bytes_per_sec: u64,
    /// For rows and bytes: the instant at which everything admitted so far is paid for.
    paid_until: Mutex<(Instant, Instant)>,
}

impl Throttle {
    /// A throttle; 0 means unlimited for that measure.
    pub fn new(rows_per_sec: u64, bytes_per_sec: u64) -> Throttle {
        let now = Instant::now();
        Throttle { rows_per_sec, bytes_per_sec, paid_until: Mutex::new((now, now)) }
    }

    /// Waits until `rows` and `bytes` may pass.
    pub(crate) async fn admit(&self, rows: u64, bytes: u64) {
        if self.rows_per_sec == 0 && self.bytes_per_sec == 0 {
            return;
        }
        let start = {
            let mut paid_until = self.paid_until.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let now = Instant::now();
            let mut start = now;
            let (rows_paid, bytes_paid) = &mut *paid_until;
            for (paid, amount, rate) in [(rows_paid, rows, self.rows_per_sec), (bytes_paid, bytes, self.bytes_per_sec)]
            {
                if rate > 0 {
                    let slot = (*paid).max(now);
                    *paid = slot + Duration::from_secs_f64(amount as f64 / rate as f64);
                    start = start.max(slot);
                }
            }
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rows_pass_at_the_configured_rate() {
        let throttle = Throttle::new(1_000, 0);
        let start = Instant::now();
        for _ in 0..10 {
            throttle.admit(500, 0).await;
        }
        // 5,000 rows at 1,000/s: the last batch may start once 4,500 rows are paid, at 4.5 s.
        let elapsed = start.elapsed().as_secs_f64();
        assert!((4.4..=4.6).contains(&elapsed), "took {elapsed} s");
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_never_waits() {
        let throttle = Throttle::new(0, 0);
        let start = Instant::now();
        throttle.admit(1_000_000, 1 << 30).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
