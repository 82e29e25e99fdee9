//! The system clock as time since the Unix epoch: what positions, checkpoints, alarms and keys
//! that sort by time carry. A clock set before 1970 reads as the epoch.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn since_epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default()
}

/// Whole seconds since the Unix epoch.
pub fn unix_seconds() -> u64 {
    since_epoch().as_secs()
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis() -> u64 {
    since_epoch().as_millis() as u64
}

/// Nanoseconds since the Unix epoch (until the year 2554).
pub fn unix_nanos() -> u64 {
    since_epoch().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_units_read_one_clock() {
        let (seconds, millis, nanos) = (unix_seconds(), unix_millis(), unix_nanos());
        assert!(seconds > 1_700_000_000, "{seconds}");
        assert!(millis / 1000 >= seconds && millis / 1000 <= seconds + 1, "{millis} {seconds}");
        assert!(nanos / 1_000_000 >= millis, "{nanos} {millis}");
    }
}
