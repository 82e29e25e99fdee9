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

/// An RFC 3339 time (`2026-12-01T00:00:00Z`, `2026-12-01 08:00:00+08:00`, a fraction of a second
/// allowed) as whole seconds since the Unix epoch, a fraction rounded up (the first whole second
/// at or after it). `None` for anything else, or a time before 1970.
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let text = text.trim();
    let bytes = text.as_bytes();
    if bytes.len() < 20 || !matches!(bytes[10], b'T' | b't' | b' ') || bytes[13] != b':' || bytes[16] != b':' {
        return None;
    }
    let date = crate::value::Date::parse(&text[..10]).filter(|date| !date.is_zero_or_partial())?;
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = text.get(range)?;
        digits.bytes().all(|byte| byte.is_ascii_digit()).then(|| digits.parse().ok())?
    };
    let (hours, minutes, seconds) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if hours > 23 || minutes > 59 || seconds > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut fraction = false;
    if let Some(after) = rest.strip_prefix('.') {
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        fraction = after[..digits].bytes().any(|byte| byte != b'0');
        rest = &after[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let zone = rest.get(1..)?;
            if zone.len() != 5 || zone.as_bytes()[2] != b':' {
                return None;
            }
            let (zone_hours, zone_minutes) = (zone[..2].parse::<i64>().ok()?, zone[3..].parse::<i64>().ok()?);
            if zone_hours > 23 || zone_minutes > 59 {
                return None;
            }
            sign * (zone_hours * 3_600 + zone_minutes * 60)
        }
    };
    let seconds =
        date.days_since_epoch() * 86_400 + hours * 3_600 + minutes * 60 + seconds - offset + i64::from(fraction);
    u64::try_from(seconds).ok()
}

/// Seconds since the Unix epoch as an RFC 3339 time in UTC (`2026-12-01T00:00:00Z`).
pub fn rfc3339(seconds: u64) -> String {
    let date = crate::value::Date::from_days_since_epoch((seconds / 86_400) as i64);
    let second_of_day = seconds % 86_400;
    format!("{date}T{:02}:{:02}:{:02}Z", second_of_day / 3_600, second_of_day / 60 % 60, second_of_day % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_read_as_epoch_seconds() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2026-12-01T00:00:00Z"), Some(1_796_083_200));
        assert_eq!(parse_rfc3339("2026-12-01 08:00:00+08:00"), Some(1_796_083_200));
        assert_eq!(parse_rfc3339("2026-11-30T19:30:00-04:30"), Some(1_796_083_200));
        assert_eq!(parse_rfc3339("2026-12-01T00:00:00.000Z"), Some(1_796_083_200));
        assert_eq!(parse_rfc3339("2026-12-01T00:00:00.25Z"), Some(1_796_083_201), "a fraction rounds up");
        assert_eq!(rfc3339(1_796_083_201), "2026-12-01T00:00:01Z");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        for bad in [
            "2026-12-01",
            "2026-12-01T00:00:00",
            "2026-13-01T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "yesterday",
            "1969-12-31T23:59:59Z",
            "2026-12-01T00:00:00.Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_three_units_read_one_clock() {
        let (seconds, millis, nanos) = (unix_seconds(), unix_millis(), unix_nanos());
        assert!(seconds > 1_700_000_000, "{seconds}");
        assert!(millis / 1000 >= seconds && millis / 1000 <= seconds + 1, "{millis} {seconds}");
        assert!(nanos / 1_000_000 >= millis, "{nanos} {millis}");
    }
}
