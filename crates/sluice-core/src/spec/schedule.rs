//! `schedule:`: when a server runs a job again, each firing a numbered batch.
//!
//! ```yaml
//! schedule:
//!   cron: "0 */2 * * *"      # five fields: minute hour day-of-month month day-of-week
//!   timezone: Europe/Paris   # an IANA zone; default UTC
//!   overlap: skip            # a batch still running when the next fires: skip | queue
//!   missed: run_once         # firings missed while no server ran: run_once | skip
//! # or
//! schedule: {every_secs: 600}
//! ```

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use super::decode::{self, Decoder, Fields};

/// A validated schedule, kept in the coordination store with the job (serializable), and
/// evaluated by the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    /// A fixed period; the first batch fires when the job is submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_secs: Option<u64>,
    /// A five-field cron expression, in `timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// The IANA time zone the cron expression is read in.
    pub timezone: String,
    pub overlap: Overlap,
    pub missed: Missed,
}

/// What happens to a firing while the previous batch still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// The firing is recorded as skipped; the next one is waited for.
    Skip,
    /// One firing waits and runs as soon as the batch ends (firings beyond one are skipped).
    Queue,
}

/// What happens to firings that passed while no server ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// One batch runs at once for all of them.
    RunOnce,
    /// They are recorded as skipped; the next firing is waited for.
    Skip,
}

impl fmt::Display for ScheduleSpec {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.every_secs, &self.cron) {
            (Some(seconds), _) => write!(formatter, "every {seconds} s"),
            (None, Some(cron)) => write!(formatter, "cron `{cron}` ({})", self.timezone),
            (None, None) => formatter.write_str("never"),
        }
    }
}

impl ScheduleSpec {
    /// The first firing of a job submitted at `now` (Unix seconds).
    pub fn first(&self, now: i64) -> Option<i64> {
        match self.every_secs {
            Some(_) => Some(now),
            None => self.next_after(now, now),
        }
    }

    /// The first firing strictly after `after`, for a job whose firings are anchored at
    /// `anchor` (a period counts from there).
    pub fn next_after(&self, anchor: i64, after: i64) -> Option<i64> {
        if let Some(period) = self.every_secs {
            let period = period.max(1) as i64;
            if after < anchor {
                return Some(anchor);
            }
            return Some(anchor + ((after - anchor) / period + 1) * period);
        }
        let cron = cron_parser::Schedule::from_str(self.cron.as_deref()?).ok()?;
        let zone = chrono_tz::Tz::from_str(&self.timezone).ok()?;
        let after = Utc.timestamp_opt(after, 0).single()?.with_timezone(&zone);
        cron.next_after(&after).map(|next: DateTime<chrono_tz::Tz>| next.timestamp())
    }
}

/// Decodes `schedule:`, reporting every problem at its field.
pub(super) fn decode_schedule(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<Option<ScheduleSpec>> {
    let Some(node) = fields.get("schedule") else {
        return Some(None);
    };
    let schedule = decoder.mapping(node, "schedule", &["every_secs", "cron", "timezone", "overlap", "missed"])?;
    let every_secs = match schedule.get("every_secs") {
        None => Some(None),
        Some(node) => decoder.unsigned(node, &schedule.path("every_secs"), 366 * 86_400).and_then(|seconds| {
            if seconds == 0 {
                decoder.error(&schedule.path("every_secs"), node.line, "must be at least 1");
                return None;
            }
            Some(Some(seconds))
        }),
    };
    let cron = match schedule.get("cron") {
        None => Some(None),
        Some(node) => decoder.string(node, &schedule.path("cron")).and_then(|text| {
            match cron_parser::Schedule::from_str(&text) {
                Ok(_) => Some(Some(text)),
                Err(error) => {
                    decoder.error(
                        &schedule.path("cron"),
                        node.line,
                        format!("`{text}` is not a cron expression: {error}; expected five fields: minute hour day-of-month month day-of-week, e.g. \"0 */2 * * *\""),
                    );
                    None
                }
            }
        }),
    };
    let timezone = match schedule.get("timezone") {
        None => Some("UTC".to_owned()),
        Some(node) => decoder.string(node, &schedule.path("timezone")).and_then(|text| {
            if chrono_tz::Tz::from_str(&text).is_ok() {
                Some(text)
            } else {
                decoder.error(
                    &schedule.path("timezone"),
                    node.line,
                    format!("unknown time zone `{text}`; expected an IANA name such as UTC or Europe/Paris"),
                );
                None
            }
        }),
    };
    let overlap = choice(decoder, &schedule, "overlap", &[("skip", Overlap::Skip), ("queue", Overlap::Queue)]);
    let missed = choice(decoder, &schedule, "missed", &[("run_once", Missed::RunOnce), ("skip", Missed::Skip)]);
    let (every_secs, cron) = (every_secs?, cron?);
    match (&every_secs, &cron) {
        (Some(_), Some(_)) => {
            decoder.error("schedule", node.line, "set either `cron` or `every_secs`, not both");
            return None;
        }
        (None, None) => {
            decoder.error("schedule", node.line, "missing `cron` or `every_secs` (when the job runs again)");
            return None;
        }
        (Some(_), None) if schedule.get("timezone").is_some() => {
            decoder.error(&schedule.path("timezone"), node.line, "a time zone applies to `cron` only");
            return None;
        }
        _ => {}
    }
    Some(Some(ScheduleSpec { every_secs, cron, timezone: timezone?, overlap: overlap?, missed: missed? }))
}

/// Reads an optional enumerated field; the first choice is the default.
fn choice<T: Copy>(decoder: &mut Decoder, fields: &Fields<'_>, key: &str, choices: &[(&str, T)]) -> Option<T> {
    let Some(node) = fields.get(key) else {
        return Some(choices[0].1);
    };
    let text = decoder.string(node, &fields.path(key))?;
    let found = choices.iter().find(|(name, _)| *name == text).map(|(_, value)| *value);
    if found.is_none() {
        let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
        decoder.error(
            &fields.path(key),
            node.line,
            format!("unknown value {}; expected {}", decode::describe(node), names.join(" or ")),
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(seconds: u64) -> ScheduleSpec {
        ScheduleSpec {
            every_secs: Some(seconds),
            cron: None,
            timezone: "UTC".into(),
            overlap: Overlap::Skip,
            missed: Missed::RunOnce,
        }
    }

    #[test]
    fn a_period_fires_at_once_then_on_its_grid() {
        let schedule = every(60);
        assert_eq!(schedule.first(1_000), Some(1_000));
        assert_eq!(schedule.next_after(1_000, 1_000), Some(1_060));
        assert_eq!(schedule.next_after(1_000, 1_059), Some(1_060));
        assert_eq!(schedule.next_after(1_000, 1_060), Some(1_120));
        // Down for an hour: the next firing stays on the grid.
        assert_eq!(schedule.next_after(1_000, 4_630), Some(4_660));
    }

    #[test]
    fn cron_is_read_in_its_time_zone() {
        let schedule = ScheduleSpec {
            every_secs: None,
            cron: Some("0 2 * * *".into()),
            timezone: "Europe/Paris".into(),
            ..every(1)
        };
        // 2026-12-03 00:00:00 UTC; 02:00 in Paris (UTC+1 in winter) is 01:00 UTC.
        let midnight = 1_796_256_000;
        assert_eq!(schedule.first(midnight), Some(midnight + 3_600));
        let utc = ScheduleSpec { timezone: "UTC".into(), ..schedule.clone() };
        assert_eq!(utc.next_after(midnight, midnight), Some(midnight + 7_200));
    }
}
