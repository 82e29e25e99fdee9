//! `alarms:`: rules a server's leader evaluates against a job's live figures, and where it sends
//! word when one fires and when it resolves.
//!
//! ```yaml
//! alarms:
//!   - {name: lag, when: "lag_seconds > 5", for_secs: 10, notify: [{webhook: "${OPS_WEBHOOK}"}]}
//!   - {name: stalled, when: "stalled_seconds > 60", notify: [{slack: "${SLACK_WEBHOOK}"}]}
//! ```

use std::fmt;

use super::decode::{describe, Decoder, SpecError};
use super::document::{Node, NodeKind};
use crate::secret::Secret;

/// One alarm rule.
#[derive(Debug, Clone, PartialEq)]
pub struct AlarmSpec {
    /// Unique within its job (or among the global rules).
    pub name: String,
    /// `when:`: what is compared with what.
    pub condition: Condition,
    /// How long the condition must hold before the alarm fires (0: at once).
    pub for_secs: u64,
    /// Where its firing and resolution are sent.
    pub notify: Vec<Notify>,
}

/// A figure of a job an alarm can watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlarmMetric {
    /// Seconds the target is behind the source (the largest task lag).
    LagSeconds,
    /// Rows written per second, over the job's running tasks.
    RowsPerSec,
    /// Seconds without a row applied while the source moved on (the stall watchdog).
    StalledSeconds,
    /// Task restarts in the job's current generation.
    Restarts,
    /// 1 when the job failed, else 0.
    Failed,
    /// 1 while the job is restarting a failed task, else 0.
    Restarting,
    /// Dirty records kept for the job.
    DirtyRecords,
    /// Bytes of the source's log past the change stream's checkpoint.
    LogBehindBytes,
    /// Older log files the source keeps before the checkpoint's: the margin before a purge of
    /// the source's log loses the stream's position (`log_files_to_spare < 1`: at risk).
    LogFilesToSpare,
    /// Rows that differed between target and source at the job's last verification.
    VerifyDifferences,
}

impl AlarmMetric {
    /// Every metric with the name a condition calls it by.
    pub const ALL: [(&'static str, AlarmMetric); 10] = [
        ("lag_seconds", AlarmMetric::LagSeconds),
        ("rows_per_sec", AlarmMetric::RowsPerSec),
        ("stalled_seconds", AlarmMetric::StalledSeconds),
        ("restarts", AlarmMetric::Restarts),
        ("failed", AlarmMetric::Failed),
        ("restarting", AlarmMetric::Restarting),
        ("dirty_records", AlarmMetric::DirtyRecords),
        ("log_behind_bytes", AlarmMetric::LogBehindBytes),
        ("log_files_to_spare", AlarmMetric::LogFilesToSpare),
        ("verify_differences", AlarmMetric::VerifyDifferences),
    ];

    /// The name a condition calls it by.
    pub fn name(self) -> &'static str {
        AlarmMetric::ALL.iter().find(|(_, metric)| *metric == self).map(|(name, _)| *name).unwrap_or("?")
    }
}

/// A comparison of a metric with a threshold: `lag_seconds > 5`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Condition {
    /// The job's figure compared…
    pub metric: AlarmMetric,
    /// …this way…
    pub operator: Operator,
    /// …with this number.
    pub threshold: f64,
}

/// How a condition compares: `>`, `>=`, `<`, `<=`, `==`, `!=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Above,
    AtLeast,
    Below,
    AtMost,
    Equal,
    NotEqual,
}

const OPERATORS: [(&str, Operator); 6] = [
    (">=", Operator::AtLeast),
    ("<=", Operator::AtMost),
    ("==", Operator::Equal),
    ("!=", Operator::NotEqual),
    (">", Operator::Above),
    ("<", Operator::Below),
];

impl Condition {
    /// Parses `METRIC OP NUMBER`.
    pub fn parse(text: &str) -> Result<Condition, String> {
        let expected = "expected `METRIC OP NUMBER`, such as `lag_seconds > 5`";
        let (symbol, operator, at) = OPERATORS
            .iter()
            .find_map(|(symbol, operator)| text.find(symbol).map(|at| (*symbol, *operator, at)))
            .ok_or_else(|| format!("`{text}`: no comparison (>, >=, <, <=, ==, !=); {expected}"))?;
        let (metric, threshold) = (text[..at].trim(), text[at + symbol.len()..].trim());
        let metric =
            AlarmMetric::ALL.iter().find(|(name, _)| *name == metric).map(|(_, metric)| *metric).ok_or_else(|| {
                let names: Vec<&str> = AlarmMetric::ALL.iter().map(|(name, _)| *name).collect();
                format!("`{metric}` is not a metric an alarm can watch; expected one of: {}", names.join(", "))
            })?;
        let threshold = threshold
            .parse::<f64>()
            .ok()
            .filter(|value| value.is_finite())
            .ok_or_else(|| format!("`{threshold}` is not a number; {expected}"))?;
        Ok(Condition { metric, operator, threshold })
    }

    /// Whether the metric's `value` meets the condition.
    pub fn holds(&self, value: f64) -> bool {
        match self.operator {
            Operator::Above => value > self.threshold,
            Operator::AtLeast => value >= self.threshold,
            Operator::Below => value < self.threshold,
            Operator::AtMost => value <= self.threshold,
            Operator::Equal => value == self.threshold,
            Operator::NotEqual => value != self.threshold,
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let symbol =
            OPERATORS.iter().find(|(_, operator)| *operator == self.operator).map_or("?", |(symbol, _)| symbol);
        write!(formatter, "{} {symbol} {}", self.metric.name(), self.threshold)
    }
}

/// Where an alarm's firing and resolution are sent. A webhook's URL is a secret (Slack's and
/// most others carry their token in the path): it never prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notify {
    /// A POST of the event as JSON.
    Webhook(Secret),
    /// A POST of `{"text": …}`, as Slack's incoming webhooks (and Mattermost's, …) take it.
    Slack(Secret),
}

impl Notify {
    /// The URL, for the one place that sends to it.
    pub fn url(&self) -> &str {
        match self {
            Notify::Webhook(url) | Notify::Slack(url) => url.expose(),
        }
    }

    /// The field it was written as: `webhook` or `slack`.
    pub fn field(&self) -> &'static str {
        match self {
            Notify::Webhook(_) => "webhook",
            Notify::Slack(_) => "slack",
        }
    }
}

/// Every notification target of `alarms` (as written, `${VAR}` left in place, at `path`) that
/// is not a whole `${VARIABLE}`: a URL written out would be kept at rest and shown to readers.
pub fn written_out_targets(alarms: &[AlarmSpec], path: &str) -> Vec<SpecError> {
    let mut errors = Vec::new();
    for (index, alarm) in alarms.iter().enumerate() {
        for (target, notify) in alarm.notify.iter().enumerate() {
            let url = notify.url();
            if !super::decode::is_placeholder(url) {
                errors.push(SpecError {
                    path: format!("{path}[{index}].notify[{target}].{}", notify.field()),
                    line: None,
                    message: "a webhook URL is a secret (most carry a token); write it as ${VARIABLE} and set \
                              that variable in the environment of every node"
                        .into(),
                });
            }
        }
    }
    errors
}

/// Decodes a list of alarm rules at `path` (`alarms`), reporting every problem.
pub fn decode_alarms(decoder: &mut Decoder, node: &Node, path: &str) -> Option<Vec<AlarmSpec>> {
    let NodeKind::Sequence(items) = &node.kind else {
        decoder.error(path, node.line, format!("expected a list of alarm rules, found {}", node.shape()));
        return None;
    };
    let mut alarms: Vec<AlarmSpec> = Vec::new();
    let mut valid = true;
    for (index, item) in items.iter().enumerate() {
        let path = format!("{path}[{index}]");
        match decode_alarm(decoder, item, &path) {
            Some(alarm) if alarms.iter().any(|known| known.name == alarm.name) => {
                decoder.error(&format!("{path}.name"), item.line, format!("alarm `{}` is named twice", alarm.name));
                valid = false;
            }
            Some(alarm) => alarms.push(alarm),
            None => valid = false,
        }
    }
    valid.then_some(alarms)
}

fn decode_alarm(decoder: &mut Decoder, node: &Node, path: &str) -> Option<AlarmSpec> {
    let fields = decoder.mapping(node, path, &["name", "when", "for_secs", "notify"])?;
    let name = fields.require(decoder, "name", "the alarm's name").and_then(|node| {
        let name = decoder.string(node, &fields.path("name"))?;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
        if !valid {
            decoder.error(&fields.path("name"), node.line, format!("`{name}`: use 1 to 64 of a-z, A-Z, 0-9, _ and -"));
        }
        valid.then_some(name)
    });
    let condition = fields.require(decoder, "when", "the condition, such as \"lag_seconds > 5\"").and_then(|node| {
        let text = decoder.string(node, &fields.path("when"))?;
        Condition::parse(&text).map_err(|message| decoder.error(&fields.path("when"), node.line, message)).ok()
    });
    let for_secs = match fields.get("for_secs") {
        None => Some(0),
        Some(node) => decoder.unsigned(node, &fields.path("for_secs"), 7 * 86_400),
    };
    let notify = match fields.get("notify") {
        None => Some(Vec::new()),
        Some(node) => decode_notify(decoder, node, &fields.path("notify")),
    };
    Some(AlarmSpec { name: name?, condition: condition?, for_secs: for_secs?, notify: notify? })
}

fn decode_notify(decoder: &mut Decoder, node: &Node, path: &str) -> Option<Vec<Notify>> {
    let NodeKind::Sequence(items) = &node.kind else {
        decoder.error(path, node.line, format!("expected a list such as [{{webhook: URL}}], found {}", node.shape()));
        return None;
    };
    let mut targets = Vec::new();
    let mut valid = true;
    for (index, item) in items.iter().enumerate() {
        let path = format!("{path}[{index}]");
        let Some(fields) = decoder.mapping(item, &path, &["webhook", "slack"]) else {
            valid = false;
            continue;
        };
        let all = fields.keys().count();
        let kinds: Vec<_> =
            fields.keys().map(|(key, _)| key).filter(|key| ["webhook", "slack"].contains(key)).collect();
        if kinds.len() != 1 {
            // An unknown key alone was reported already.
            if !(kinds.is_empty() && all > 0) {
                decoder.error(&path, item.line, "expected exactly one of `webhook: URL` or `slack: URL`");
            }
            valid = false;
            continue;
        }
        let field = fields.get(kinds[0]).expect("a listed key");
        let Some(url) = decoder.string(field, &fields.path(kinds[0])) else {
            valid = false;
            continue;
        };
        // (A server checks the document once more with `${VAR}` left as written.)
        let placeholder = url.starts_with("${") && url.ends_with('}');
        if !(url.starts_with("http://") || url.starts_with("https://") || placeholder) {
            decoder.error(
                &fields.path(kinds[0]),
                field.line,
                format!("{} is not an http:// or https:// URL", describe(field)),
            );
            valid = false;
            continue;
        }
        let url = Secret::new(url);
        targets.push(if kinds[0] == "slack" { Notify::Slack(url) } else { Notify::Webhook(url) });
    }
    valid.then_some(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_parse_and_compare() {
        let condition = Condition::parse("lag_seconds > 5").unwrap();
        assert_eq!(condition.metric, AlarmMetric::LagSeconds);
        assert!(condition.holds(6.0) && !condition.holds(5.0));
        let condition = Condition::parse("rows_per_sec<=100.5").unwrap();
        assert!(condition.holds(100.5) && !condition.holds(101.0));
        assert_eq!(condition.to_string(), "rows_per_sec <= 100.5");
        assert!(Condition::parse("restarts >= 3").unwrap().holds(3.0));
        assert!(Condition::parse("lag > 5").unwrap_err().contains("expected one of: lag_seconds"));
        assert!(Condition::parse("lag_seconds 5").unwrap_err().contains("no comparison"));
        assert!(Condition::parse("lag_seconds > five").unwrap_err().contains("not a number"));
    }

    #[test]
    fn every_problem_of_a_rule_list_is_reported_at_its_line() {
        let text = "- {name: lag, when: \"lag_seconds > 5\", for_secs: 10, notify: [{webhook: \"http://h/x\"}]}\n\
                    - {name: lag, when: \"lag_seconds > 5\"}\n\
                    - {name: bad, when: \"speed > 1\", notify: [{email: x}]}\n\
                    - {name: worse, when: \"failed == 1\", notify: [{slack: \"ftp://x\"}]}\n";
        let node = super::super::parse_yaml(text).unwrap();
        let mut decoder = Decoder::new(&|name: &str| Err(crate::spec::unset_variable(name)));
        assert!(decode_alarms(&mut decoder, &node, "alarms").is_none());
        let errors: Vec<String> = decoder.into_errors().iter().map(ToString::to_string).collect();
        let joined = errors.join("\n");
        assert_eq!(errors.len(), 4, "{joined}");
        assert!(joined.contains("alarms[1].name") && joined.contains("named twice"), "{joined}");
        assert!(joined.contains("alarms[2].when") && joined.contains("`speed`"), "{joined}");
        assert!(joined.contains("alarms[2].notify[0].email"), "{joined}");
        assert!(joined.contains("alarms[3].notify[0].slack") && joined.contains("not an http"), "{joined}");

        let node = super::super::parse_yaml(text.lines().next().unwrap()).unwrap();
        let mut decoder = Decoder::new(&|name: &str| Err(crate::spec::unset_variable(name)));
        let alarms = decode_alarms(&mut decoder, &node, "alarms").expect("valid");
        assert_eq!(alarms[0].for_secs, 10);
        assert_eq!(alarms[0].notify, vec![Notify::Webhook(Secret::new("http://h/x"))]);
        assert!(!format!("{alarms:?}").contains("http://h/x"), "a webhook URL never prints");
        assert_eq!(written_out_targets(&alarms, "alarms").len(), 1, "written out, not as ${{VARIABLE}}");
    }
}
