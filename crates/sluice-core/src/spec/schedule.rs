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
//!
//! `after:` makes a job run when other jobs' batches end instead: its batch N starts once batch
//! N of every job it names succeeded, with a policy per dependency for one that did not.

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

/// One job a job runs after (`after:`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub job: String,
    pub on_failure: OnFailure,
}

/// What a job does with its batch N when a job it runs after did not succeed in its batch N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Batch N is recorded as skipped (so are its own dependants'), and batch N + 1 waits.
    Skip,
    /// The job stops; `start` takes it up again.
    Stop,
    /// Batch N runs anyway.
    Continue,
}

impl fmt::Display for OnFailure {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            OnFailure::Skip => "skip",
            OnFailure::Stop => "stop",
            OnFailure::Continue => "continue",
        })
    }
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

/// Decodes `after:`: job names, or `{job: NAME, on_failure: skip|stop|continue}`.
pub(super) fn decode_after(decoder: &mut Decoder, fields: &Fields<'_>, name: Option<&str>) -> Option<Vec<Dependency>> {
    let Some(node) = fields.get("after") else {
        return Some(Vec::new());
    };
    let super::document::NodeKind::Sequence(items) = &node.kind else {
        decoder.error("after", node.line, format!("expected a list of job names, found {}", node.shape()));
        return None;
    };
    let mut dependencies: Vec<Dependency> = Vec::new();
    let mut valid = true;
    for (index, item) in items.iter().enumerate() {
        let path = format!("after[{index}]");
        let dependency = match &item.kind {
            super::document::NodeKind::Mapping(_) => {
                let Some(entry) = decoder.mapping(item, &path, &["job", "on_failure"]) else {
                    valid = false;
                    continue;
                };
                let job = entry
                    .require(decoder, "job", "the job to run after")
                    .and_then(|node| decoder.string(node, &entry.path("job")));
                let on_failure = choice(
                    decoder,
                    &entry,
                    "on_failure",
                    &[("skip", OnFailure::Skip), ("stop", OnFailure::Stop), ("continue", OnFailure::Continue)],
                );
                job.zip(on_failure).map(|(job, on_failure)| Dependency { job, on_failure })
            }
            _ => decoder.string(item, &path).map(|job| Dependency { job, on_failure: OnFailure::Skip }),
        };
        let Some(dependency) = dependency else {
            valid = false;
            continue;
        };
        if Some(dependency.job.as_str()) == name {
            decoder.error(&path, item.line, "a job cannot run after itself");
            valid = false;
        } else if dependencies.iter().any(|known| known.job == dependency.job) {
            decoder.error(&path, item.line, format!("job `{}` is listed twice", dependency.job));
            valid = false;
        } else {
            dependencies.push(dependency);
        }
    }
    valid.then_some(dependencies)
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

#[cfg(test)]
mod decode_tests {
    use crate::spec::{parse_job, OnFailure};

    fn errors(text: &str) -> Vec<String> {
        match parse_job(text, false, |_| None) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    const BASE: &str = "name: load\nsource: {type: sqlite, path: a.db}\ntarget: {type: sqlite, path: b.db}\n";

    #[test]
    fn after_takes_names_and_policies_and_reports_every_problem() {
        let job =
            parse_job(&format!("{BASE}after: [extract, {{job: other, on_failure: stop}}]\n"), false, |_| None).unwrap();
        assert_eq!(job.after.len(), 2);
        assert_eq!((job.after[0].job.as_str(), job.after[0].on_failure), ("extract", OnFailure::Skip));
        assert_eq!((job.after[1].job.as_str(), job.after[1].on_failure), ("other", OnFailure::Stop));

        let found =
            errors(&format!("{BASE}after: [load, x, x, {{job: y, on_failure: maybe}}]\nschedule: {{every_secs: 0}}\n"));
        let all = found.join("\n");
        for expected in [
            "after[0]",
            "cannot run after itself",
            "after[2]",
            "listed twice",
            "after[3].on_failure",
            "schedule.every_secs",
        ] {
            assert!(all.contains(expected), "{expected} in:\n{all}");
        }
        let both = errors(&format!("{BASE}after: [x]\nschedule: {{every_secs: 5}}\n")).join("\n");
        assert!(both.contains("takes no `schedule`"), "{both}");
        let streaming = errors(&format!("{BASE}mode: snapshot+cdc\nafter: [x]\n")).join("\n");
        assert!(streaming.contains("cannot be scheduled"), "{streaming}");
    }
}
