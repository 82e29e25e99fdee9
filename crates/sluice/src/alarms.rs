//! Alarms. The leader evaluates, every few seconds, each running job's rules (its `alarms:` and
//! the global rules of `PUT /api/v1/alarms`) against the job's figures as the API shows them.
//! A rule whose condition holds becomes `pending`, then `firing` once it held `for_secs`; it
//! `resolves` when the condition no longer holds (or the job stops).
//!
//! Each rule's state is kept in the coordination store and written under the leader's key
//! before anyone is told: a new leader carries on from it, so a transition is announced once
//! for the cluster, not once per node. Notifications (webhooks: the event as JSON, or Slack's
//! `{"text": …}`) are retried for about a minute; one that still fails is logged and kept in
//! the history as undelivered. The history keeps the last `HISTORY_KEPT` events.
//!
//! ```text
//! /sluice/alarms/rules                     the global rules, as the document was written
//! /sluice/alarms/state/{job}/{scope}.{name} RuleState
//! /sluice/alarms/history/{millis}-{n}      AlarmEvent
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sluice_core::spec::{AlarmMetric, AlarmSpec, Notify};
use sluice_core::{Error, Result};

use crate::cluster::model::*;
use crate::cluster::status::{job_view, JobState, JobView};
use crate::cluster::store::{Guard, Store};
use crate::job_text::DocumentRules;

pub const GLOBAL_RULES: &str = "/sluice/alarms/rules";
const STATES: &str = "/sluice/alarms/state/";
pub const HISTORY: &str = "/sluice/alarms/history/";
/// How many events the history keeps.
const HISTORY_KEPT: usize = 1_000;
/// How long a notification is retried.
const NOTIFY_ATTEMPTS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(15),
    Duration::from_secs(30),
];

/// Where a rule comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The job's own `alarms:`.
    Job,
    /// A global rule, evaluated for every job.
    Global,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Ok,
    /// The condition holds, for less than `for_secs` so far.
    Pending,
    Firing,
}

/// A rule's state for one job, as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RuleState {
    pub job: String,
    pub scope: Scope,
    pub name: String,
    pub when: String,
    pub for_secs: u64,
    pub phase: Phase,
    /// Unix seconds since the phase began.
    pub since: u64,
    /// The metric's value when last written.
    pub value: Option<f64>,
    /// Unix seconds of the last write.
    #[serde(default)]
    pub written: u64,
}

/// A rule firing or resolving.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AlarmEvent {
    /// Unique and ordered: a receiver drops an event it has seen.
    #[serde(default)]
    pub id: String,
    pub job: String,
    pub scope: Scope,
    pub name: String,
    /// `firing` or `resolved`.
    pub event: String,
    /// RFC 3339.
    pub at: String,
    pub when: String,
    pub value: Option<f64>,
    pub message: String,
    /// Whether every notification target took it (`null` while being sent).
    pub delivered: Option<bool>,
}

fn state_key(job: &str, scope: Scope, name: &str) -> String {
    let scope = if scope == Scope::Job { "job" } else { "global" };
    format!("{STATES}{job}/{scope}.{name}")
}

/// A metric's value for a job, from the figures the API shows.
pub fn value_of(metric: AlarmMetric, view: &JobView) -> Option<f64> {
    // Throughput means something while the job runs or heals, not once it ended or stopped.
    let running = matches!(view.state, JobState::Running | JobState::Restarting);
    Some(match metric {
        AlarmMetric::LagSeconds => view.stats.lag_secs? as f64,
        AlarmMetric::RowsPerSec => view.stats.rows_per_sec,
        // The target is behind and nothing is being applied: the stream is not moving.
        AlarmMetric::StalledSeconds => match view.stats.lag_secs {
            Some(lag) if view.stats.rows_per_sec == 0.0 && view.state != JobState::Stopped => lag as f64,
            _ => 0.0,
        },
        AlarmMetric::Restarts => f64::from(view.restarts),
        AlarmMetric::Failed => f64::from(u8::from(view.state == JobState::Failed)),
        AlarmMetric::Restarting => f64::from(u8::from(view.state == JobState::Restarting)),
        // (The evaluation counts them in the coordination store instead: discards lower it.)
        AlarmMetric::DirtyRecords => view.stats.rows_skipped as f64,
        AlarmMetric::LogBehindBytes => view.stats.log_behind_bytes? as f64,
        AlarmMetric::LogFilesToSpare => view.stats.log_files_to_spare? as f64,
        AlarmMetric::VerifyDifferences => view.stats.verify_differences? as f64,
    })
    .filter(|_| running || !matches!(metric, AlarmMetric::RowsPerSec))
}

/// The global rules, their `${NAME}`s read by this node's rule.
pub async fn global_rules(store: &dyn Store, document_rules: &DocumentRules) -> Result<Vec<AlarmSpec>> {
    let Some(entry) = store.get(GLOBAL_RULES).await? else {
        return Ok(Vec::new());
    };
    parse_rules(&entry.value, &|name| document_rules.variable(name)).map_err(|errors| {
        Error::config(format!("the global alarm rules are not valid on this node: {}", errors.join("; ")))
            .hint("an environment variable the rules name may be missing on this node")
    })
}

/// Checks a document of global rules as a server keeps it: valid with this node's variables,
/// and every webhook written as `${VARIABLE}`. How many rules it has, or every problem.
pub fn checked_rules(
    text: &str,
    document_rules: &DocumentRules,
) -> std::result::Result<usize, Vec<sluice_core::spec::SpecError>> {
    let as_error = |message: String| sluice_core::spec::SpecError { path: String::new(), line: None, message };
    let written = parse_rules(text, &|name| Ok(format!("${{{name}}}")))
        .map(|rules| sluice_core::spec::written_out_targets(&rules, "alarms"))
        .map_err(|errors| errors.into_iter().map(as_error).collect::<Vec<_>>())?;
    if !written.is_empty() {
        return Err(written);
    }
    parse_rules(text, &|name| document_rules.variable(name))
        .map(|rules| rules.len())
        .map_err(|errors| errors.into_iter().map(as_error).collect())
}

/// Parses a rule document: a list of rules, or `{alarms: [...]}`, in YAML or JSON.
pub fn parse_rules(
    text: &str,
    variables: sluice_core::spec::Variables<'_>,
) -> std::result::Result<Vec<AlarmSpec>, Vec<String>> {
    let node = sluice_core::spec::parse_yaml(text).map_err(|error| vec![error.message])?;
    let node = match &node.kind {
        sluice_core::spec::NodeKind::Mapping(entries) if entries.len() == 1 && entries[0].0 == "alarms" => {
            entries[0].1.clone()
        }
        _ => node,
    };
    let mut decoder = sluice_core::spec::Decoder::new(variables);
    let rules = sluice_core::spec::decode_alarms(&mut decoder, &node, "alarms");
    let errors: Vec<String> = decoder.into_errors().iter().map(ToString::to_string).collect();
    match rules {
        Some(rules) if errors.is_empty() => Ok(rules),
        _ => Err(errors),
    }
}

/// Each job version's own rules, parsed once (with this node's environment).
#[derive(Debug, Default)]
pub struct RulesCache(std::sync::Mutex<RulesByVersion>);

/// A job's rules by (job, version).
type RulesByVersion = BTreeMap<(String, u32), Arc<Vec<AlarmSpec>>>;

impl RulesCache {
    async fn rules(
        &self,
        store: &dyn Store,
        document_rules: &DocumentRules,
        job: &JobRecord,
    ) -> Result<Arc<Vec<AlarmSpec>>> {
        let key = (job.name.clone(), job.version);
        if let Some(rules) = self.lock().get(&key) {
            return Ok(rules.clone());
        }
        let rules = Arc::new(load_spec(store, document_rules, &job.name, job.version).await?.alarms);
        let mut cache = self.lock();
        cache.retain(|(name, _), _| *name != job.name);
        cache.insert(key, rules.clone());
        Ok(rules)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RulesByVersion> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A stored state is rewritten when its phase or rule changes, or its value moved and it was
/// last written this long ago: a value for the console, without a write per rule every 2 s.
const VALUE_REFRESH_SECS: u64 = 10;

/// One evaluation of every job's rules, as leader (`guard`). A job whose rules or figures
/// cannot be read now keeps its states as they are until the next evaluation. A job without
/// rules (its own or global) is not looked at.
pub async fn evaluate(
    store: Arc<dyn Store>,
    document_rules: &DocumentRules,
    guard: Guard,
    client: reqwest::Client,
    cache: &RulesCache,
) -> Result<()> {
    let global = global_rules(&*store, document_rules).await;
    if let Err(error) = &global {
        log::warn!("alarms: {error}");
    }
    let jobs: Vec<(String, JobRecord, _)> = load_all(&*store, &format!("{ROOT}jobs/")).await?;
    let mut states: BTreeMap<String, RuleState> =
        load_all::<RuleState>(&*store, STATES).await?.into_iter().map(|(_, state, entry)| (entry.key, state)).collect();
    let now = sluice_core::clock::unix_seconds();
    let mut recorded = false;
    let no_global_rules = global.as_ref().is_ok_and(Vec::is_empty);
    for (name, job, _) in &jobs {
        let figures = async {
            let own = cache.rules(&*store, document_rules, job).await?;
            if own.is_empty() && no_global_rules {
                return Ok(None);
            }
            let view = job_view(&*store, job).await?;
            let dirty = store.count(&crate::cluster::dirty::dirty_prefix(name)).await?;
            Ok::<_, Error>(Some((view, dirty, own)))
        };
        let (view, dirty, own) = match figures.await {
            Ok(Some(figures)) => figures,
            // No rule: the states of rules removed since are forgotten below.
            Ok(None) => continue,
            Err(error) => {
                log::debug!("alarms of job {name}: not evaluated now: {error}");
                states.retain(|key, _| !key.starts_with(&format!("{STATES}{name}/")));
                continue;
            }
        };
        let global = match &global {
            Ok(global) => global.as_slice(),
            Err(_) => {
                states.retain(|key, state| {
                    !(key.starts_with(&format!("{STATES}{name}/")) && state.scope == Scope::Global)
                });
                &[]
            }
        };
        let rules = own.iter().map(|rule| (Scope::Job, rule)).chain(global.iter().map(|rule| (Scope::Global, rule)));
        for (scope, rule) in rules {
            let key = state_key(name, scope, &rule.name);
            let previous = states.remove(&key);
            let value = match rule.condition.metric {
                AlarmMetric::DirtyRecords => Some(dirty as f64),
                metric => value_of(metric, &view),
            };
            let holds = job.desired == Desired::Running && value.is_some_and(|value| rule.condition.holds(value));
            let (phase, since) = match (previous.as_ref().map(|state| (state.phase, state.since)), holds) {
                (Some((Phase::Firing, since)), true) => (Phase::Firing, since),
                (Some((Phase::Pending, since)), true) if now >= since + rule.for_secs => (Phase::Firing, now),
                (Some((Phase::Pending, since)), true) => (Phase::Pending, since),
                (_, true) if rule.for_secs == 0 => (Phase::Firing, now),
                (_, true) => (Phase::Pending, now),
                (Some((Phase::Ok, since)), false) => (Phase::Ok, since),
                (_, false) => (Phase::Ok, now),
            };
            let was = previous.as_ref().map_or(Phase::Ok, |state| state.phase);
            let state = RuleState {
                job: name.clone(),
                scope,
                name: rule.name.clone(),
                when: rule.condition.to_string(),
                for_secs: rule.for_secs,
                phase,
                since,
                value,
                written: now,
            };
            let changed = previous.as_ref().is_none_or(|stored| {
                stored.phase != phase
                    || stored.when != state.when
                    || (stored.value != value && now >= stored.written + VALUE_REFRESH_SECS)
            });
            if changed && !store.put_guarded(&key, &encode(&state), &guard).await? {
                return Ok(()); // no longer the leader: the next one carries on
            }
            let event = match (was, phase) {
                (Phase::Firing, Phase::Ok) => "resolved",
                (Phase::Ok | Phase::Pending, Phase::Firing) => "firing",
                _ => continue,
            };
            let message = match event {
                "firing" => format!("job {name}: alarm {} fires: {} (now {})", rule.name, state.when, shown(value)),
                _ if job.desired != Desired::Running => {
                    format!("job {name}: alarm {} resolved: the job stopped", rule.name)
                }
                _ => format!(
                    "job {name}: alarm {} resolved: {} no longer holds (now {})",
                    rule.name,
                    state.when,
                    shown(value)
                ),
            };
            log::warn!("{message}");
            let event = AlarmEvent {
                id: String::new(),
                job: name.clone(),
                scope,
                name: rule.name.clone(),
                event: event.to_owned(),
                at: crate::logger::timestamp(),
                when: state.when.clone(),
                value,
                message,
                delivered: None,
            };
            let event = record(&*store, event, &guard).await?;
            recorded = true;
            tokio::spawn(deliver(store.clone(), event, rule.notify.clone(), client.clone(), guard.clone()));
        }
    }
    // Rules that are gone (the job or the rule was removed): forgotten; a firing one is recorded
    // as resolved, though nobody can be told (its targets went with the rule).
    for (key, state) in states {
        if state.phase == Phase::Firing {
            let event = AlarmEvent {
                id: String::new(),
                job: state.job.clone(),
                scope: state.scope,
                name: state.name.clone(),
                event: "resolved".into(),
                at: crate::logger::timestamp(),
                when: state.when.clone(),
                value: None,
                message: format!(
                    "job {}: alarm {} resolved: the rule or the job was removed (not sent: its targets went with it)",
                    state.job, state.name
                ),
                delivered: Some(false),
            };
            record(&*store, event, &guard).await?;
            recorded = true;
        }
        if !store.delete_while(&key, &guard).await? {
            return Ok(());
        }
    }
    if recorded {
        let history = store.list(HISTORY).await?;
        for old in history.iter().take(history.len().saturating_sub(HISTORY_KEPT)) {
            store.delete(&old.key).await?;
        }
    }
    Ok(())
}

fn shown(value: Option<f64>) -> String {
    value.map_or_else(|| "unknown".into(), |value| format!("{value}"))
}

/// Appends an event to the history under a new key, which becomes its id.
async fn record(store: &dyn Store, mut event: AlarmEvent, guard: &Guard) -> Result<AlarmEvent> {
    let millis = sluice_core::clock::unix_millis();
    for attempt in 0..1_000 {
        let key = format!("{HISTORY}{millis:020}-{attempt:03}");
        event.id = key[HISTORY.len()..].to_owned();
        if store.get(&key).await?.is_none() {
            store.put_guarded(&key, &encode(&event), guard).await?;
            return Ok(event);
        }
    }
    Err(Error::new(sluice_core::ErrorKind::State, "alarms: a thousand events in one millisecond"))
}

/// Sends an event to every target of its rule at once, each with retries; records whether all
/// took it.
async fn deliver(
    store: Arc<dyn Store>,
    mut event: AlarmEvent,
    targets: Vec<Notify>,
    client: reqwest::Client,
    guard: Guard,
) {
    let mut sending = tokio::task::JoinSet::new();
    for target in targets {
        let (event, client) = (event.clone(), client.clone());
        sending.spawn(async move { send(&client, &target, &event).await });
    }
    let mut delivered = true;
    while let Some(sent) = sending.join_next().await {
        delivered &= sent.unwrap_or(false);
    }
    event.delivered = Some(delivered);
    let key = format!("{HISTORY}{}", event.id);
    // Only while the event is still kept (the history may have been trimmed past it).
    match store.get(&key).await {
        Ok(Some(_)) => {
            if let Err(error) = store.put_guarded(&key, &encode(&event), &guard).await {
                log::warn!("alarm {} of job {}: cannot record its delivery: {error}", event.name, event.job);
            }
        }
        Ok(None) => {}
        Err(error) => log::warn!("alarm {} of job {}: cannot record its delivery: {error}", event.name, event.job),
    }
}

/// Posts an event to one target, retried over about a minute; whether it took it.
async fn send(client: &reqwest::Client, target: &Notify, event: &AlarmEvent) -> bool {
    let body = match target {
        Notify::Webhook(_) => serde_json::to_value(event).expect("events serialize"),
        Notify::Slack(_) => {
            let icon = if event.event == "firing" { ":rotating_light:" } else { ":white_check_mark:" };
            serde_json::json!({ "text": format!("{icon} {}", event.message) })
        }
    };
    for (attempt, pause) in NOTIFY_ATTEMPTS.iter().enumerate() {
        let problem = match client.post(target.url()).json(&body).send().await {
            Ok(response) if response.status().is_success() => return true,
            Ok(response) => format!("answered {}", response.status()),
            Err(error) => {
                format!("cannot be reached: {}", sluice_core::secret::scrub(&error.without_url().to_string()))
            }
        };
        log::warn!(
            "alarm {} of job {}: the {} target at {} {problem} (attempt {} of {})",
            event.name,
            event.job,
            target.field(),
            host_of(target.url()),
            attempt + 1,
            NOTIFY_ATTEMPTS.len()
        );
        if attempt + 1 < NOTIFY_ATTEMPTS.len() {
            tokio::time::sleep(*pause).await;
        }
    }
    false
}

/// The host of a webhook URL, for logs: its path and query may hold a token (Slack's do).
pub fn host_of(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned))
        .unwrap_or_else(|| "(bad URL)".into())
}

/// Every rule's state, per job.
pub async fn states(store: &dyn Store) -> Result<Vec<RuleState>> {
    Ok(load_all::<RuleState>(store, STATES).await?.into_iter().map(|(_, state, _)| state).collect())
}

/// What `GET /alarms` shows: every rule's state and the history, newest first.
pub async fn overview(store: &dyn Store) -> Result<(Vec<RuleState>, Vec<AlarmEvent>)> {
    let states = states(store).await?;
    let mut history: Vec<AlarmEvent> =
        load_all::<AlarmEvent>(store, HISTORY).await?.into_iter().map(|(_, event, _)| event).collect();
    history.reverse();
    Ok((states, history))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::store::MemoryStore;

    #[test]
    fn rule_documents_parse_as_a_list_or_under_alarms() {
        let rules = parse_rules("- {name: lag, when: \"lag_seconds > 5\"}\n", &|name| {
            Err(sluice_core::spec::unset_variable(name))
        })
        .unwrap();
        assert_eq!(rules[0].name, "lag");
        let rules = parse_rules(
            "{\"alarms\": [{\"name\": \"stall\", \"when\": \"stalled_seconds >= 60\", \"for_secs\": 5}]}",
            &|name| Err(sluice_core::spec::unset_variable(name)),
        )
        .unwrap();
        assert_eq!((rules[0].name.as_str(), rules[0].for_secs), ("stall", 5));
        let errors =
            parse_rules("- {name: x, when: \"nope > 1\"}\n", &|name| Err(sluice_core::spec::unset_variable(name)))
                .unwrap_err();
        assert!(errors[0].contains("alarms[0].when"), "{errors:?}");
    }

    #[test]
    fn hosts_are_shown_without_paths() {
        assert_eq!(host_of("https://hooks.slack.com/services/T000/B000/XXXX"), "hooks.slack.com");
    }

    #[tokio::test]
    async fn events_in_one_millisecond_keep_their_own_ids() {
        let store = MemoryStore::open(None).unwrap();
        store.put(LEADER, "me", None).await.unwrap();
        let guard =
            Guard { key: LEADER.into(), create_revision: store.get(LEADER).await.unwrap().unwrap().create_revision };
        let event = AlarmEvent {
            id: String::new(),
            job: "j".into(),
            scope: Scope::Job,
            name: "lag".into(),
            event: "firing".into(),
            at: String::new(),
            when: "lag_seconds > 5".into(),
            value: Some(6.0),
            message: "m".into(),
            delivered: None,
        };
        let first = record(&store, event.clone(), &guard).await.unwrap();
        let second = record(&store, event, &guard).await.unwrap();
        assert!(first.id < second.id, "{} then {}", first.id, second.id);
        let history = overview(&store).await.unwrap().1;
        assert_eq!(history.iter().map(|event| event.id.clone()).collect::<Vec<_>>(), [second.id, first.id]);
    }
}
