//! The typed job: what a user asks for.

use std::collections::BTreeMap;
use std::fmt;

use super::alarm::{self, AlarmSpec};
use super::conflict::{self, ConflictPolicy};
use super::cursor::{self, CursorSpec};
use super::decode::{self, unset_variable, Decoder, Fields, SpecError, Variables};
use super::document::{self, Node};
use super::placement::{self, Placement};
use super::schedule::{self, Dependency, ScheduleSpec};
use super::transform::{self, RouteSpec, TransformSpec};
use crate::error::Side;
use crate::secret::{self, Secret};

/// A validated job.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub name: String,
    pub mode: Mode,
    /// The source; with `sources:`, the first of them.
    pub source: EndpointSpec,
    /// `sources:`: several named source servers merged into one target (fan-in; empty with
    /// `source:`). Each runs as a job of its own (`JobSpec::parts`), with its own position and
    /// checkpoints, into the same target tables.
    pub sources: Vec<NamedEndpoint>,
    /// The name of the source this job reads when it is one part of a job with `sources:`
    /// (`JobSpec::parts` sets it). Its rows share target tables with the other sources': a
    /// route's origin column says `SOURCE/db.table`, every table is prepared as merged, and no
    /// copy is hidden.
    pub fan_in: Option<String>,
    /// The target; with `targets:`, the first of them.
    pub target: EndpointSpec,
    /// `targets:`: several named targets fed by one job (empty with `target:`). Each runs as a
    /// job of its own (`JobSpec::parts`), with its own checkpoints in its target.
    pub targets: Vec<NamedEndpoint>,
    /// How many tasks run at once.
    pub parallelism: usize,
    pub limits: Limits,
    pub errors: ErrorPolicy,
    pub retry: RetryPolicy,
    /// `restart:`: how a failed task is run again from its checkpoint.
    pub restart: RestartPolicy,
    /// `route:`: source tables renamed, moved or merged into other target tables.
    pub routes: Vec<RouteSpec>,
    /// `transform:`: projections, filters and masks per source table.
    pub transforms: Vec<TransformSpec>,
    /// `schedule:`: when a server runs the job again, each run a numbered batch.
    pub schedule: Option<ScheduleSpec>,
    /// `after:`: the jobs whose batch N this job's batch N waits for (instead of a schedule).
    pub after: Vec<Dependency>,
    /// `priority:` (0 to 1,000, default 0): when a cluster lacks room, the tasks of higher
    /// priorities are claimed first.
    pub priority: u32,
    /// `placement:` (a cluster): the zone and labels a node needs to run the job's tasks.
    pub placement: Placement,
    /// `alarms:`: rules a server evaluates against the job's figures.
    pub alarms: Vec<AlarmSpec>,
    /// `verify:`: the job's target compared with its source every so often.
    pub verify: Option<VerifySpec>,
    /// `schema_changes:`: what the stream does with DDL on the job's tables. A `two_way` job
    /// that does not say stops at DDL: a pair carries DDL one way only, by the job that says
    /// `carry`.
    pub schema_changes: SchemaChanges,
    /// `two_way:` (MySQL to MySQL): the stream passes over the transactions Sluice itself wrote
    /// into the source (the other job of a two-way pair applied them), so nothing loops.
    pub two_way: bool,
    /// `conflict:`: what the stream does with a change whose row the target holds otherwise
    /// than the change found it. `None`: no check beyond the target's own (a missing row stops
    /// the job); a `two_way` job checks with `stop` unless it says.
    pub conflict: Option<ConflictPolicy>,
    /// `apply_parallelism:` (1 to 32): how many target connections apply the change stream's
    /// groups at once. `None`: one.
    pub apply_parallelism: Option<usize>,
    /// `consistency:`: `transaction` (lanes as `apply_parallelism` says) or `serial` (one
    /// connection, as before lanes existed).
    pub consistency: Consistency,
}

/// `consistency: transaction | serial`: what the stream's apply promises a reader of the target.
/// Both show every source transaction whole, and groups commit in the source's order either way;
/// `serial` also writes on one connection only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    /// Groups are written by several connections at once where they touch different rows, and
    /// committed in the source's order.
    #[default]
    Transaction,
    /// One connection writes and commits every group.
    Serial,
}

/// One of a job's `targets:` or `sources:`.
#[derive(Debug, Clone)]
pub struct NamedEndpoint {
    /// `name`: 1 to 32 of a-z, 0-9, _ and -, unique in the job.
    pub name: String,
    pub endpoint: EndpointSpec,
}

impl JobSpec {
    /// The names of the job's parts (`JobSpec::parts`): its targets' with `targets:`, its
    /// sources' with `sources:`; none for a job of one source and one target.
    pub fn part_names(&self) -> Vec<&str> {
        self.targets.iter().chain(&self.sources).map(|named| named.name.as_str()).collect()
    }

    /// The job as the jobs it runs: itself with one source and one target; with `targets:`, one
    /// per target, each with that target alone; with `sources:`, one per source, each reading
    /// that source alone (`fan_in`). Each part is named `JOB.PART` (a name no job of a file can
    /// take).
    pub fn parts(&self) -> Vec<JobSpec> {
        let part = |named: &NamedEndpoint| JobSpec {
            name: format!("{}.{}", self.name, named.name),
            targets: Vec::new(),
            sources: Vec::new(),
            ..self.clone()
        };
        if !self.targets.is_empty() {
            return self
                .targets
                .iter()
                .map(|target| JobSpec { target: target.endpoint.clone(), ..part(target) })
                .collect();
        }
        if !self.sources.is_empty() {
            return self
                .sources
                .iter()
                .map(|source| JobSpec {
                    source: source.endpoint.clone(),
                    fan_in: Some(source.name.clone()),
                    ..part(source)
                })
                .collect();
        }
        vec![self.clone()]
    }

    /// Every source endpoint of the job.
    pub fn source_endpoints(&self) -> Vec<&EndpointSpec> {
        if self.sources.is_empty() {
            vec![&self.source]
        } else {
            self.sources.iter().map(|source| &source.endpoint).collect()
        }
    }

    /// Every target endpoint of the job.
    pub fn target_endpoints(&self) -> Vec<&EndpointSpec> {
        if self.targets.is_empty() {
            vec![&self.target]
        } else {
            self.targets.iter().map(|target| &target.endpoint).collect()
        }
    }
}

/// `targets:` or `sources:` (`field`): a list of what `target:` or `source:` takes, each with a
/// `name`.
fn decode_named(decoder: &mut Decoder, node: &Node, field: &str, role: Side) -> Option<Vec<NamedEndpoint>> {
    let noun = role.to_string();
    let document::NodeKind::Sequence(items) = &node.kind else {
        decoder.error(
            field,
            node.line,
            format!("expected a list of {noun}s, each with a name, found {}", node.shape()),
        );
        return None;
    };
    if items.is_empty() {
        decoder.error(field, node.line, format!("expected at least one {noun}"));
        return None;
    }
    let mut named = Vec::new();
    let mut valid = true;
    for (index, item) in items.iter().enumerate() {
        let document::NodeKind::Mapping(entries) = &item.kind else {
            decoder.error(
                &format!("{field}[{index}]"),
                item.line,
                format!("expected a mapping with `name` and `type`, found {}", item.shape()),
            );
            valid = false;
            continue;
        };
        let name = match entries.iter().find(|(key, _)| key == "name") {
            None => {
                decoder.error(
                    &format!("{field}[{index}].name"),
                    item.line,
                    format!("missing required field `name` (the {noun}'s name in the job, [a-z0-9_-]+)"),
                );
                None
            }
            Some((_, value)) => decoder.string(value, &format!("{field}[{index}].name")).and_then(|name| {
                let valid = !name.is_empty()
                    && name.len() <= 32
                    && name
                        .bytes()
                        .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_' || byte == b'-');
                if !valid {
                    decoder.error(
                        &format!("{field}[{index}].name"),
                        value.line,
                        format!("`{name}` is not a valid {noun} name; use 1 to 32 of a-z, 0-9, _ and -"),
                    );
                } else if named.iter().any(|known: &NamedEndpoint| known.name == name) {
                    decoder.error(
                        &format!("{field}[{index}].name"),
                        value.line,
                        format!("two {noun}s are named `{name}`; each needs its own name"),
                    );
                    return None;
                }
                valid.then_some(name)
            }),
        };
        let rest = Node {
            kind: document::NodeKind::Mapping(entries.iter().filter(|(key, _)| key != "name").cloned().collect()),
            line: item.line,
        };
        let at = format!("{field}[{}]", name.as_deref().unwrap_or(&index.to_string()));
        match (name, decode_endpoint(decoder, &rest, role, &at)) {
            (Some(name), Some(endpoint)) => named.push(NamedEndpoint { name, endpoint }),
            _ => valid = false,
        }
    }
    valid.then_some(named)
}

/// `schema_changes: carry | ignore | stop` (Flink CDC's evolve, ignore and exception behaviours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchemaChanges {
    /// The target follows: tables created, altered, renamed, dropped and emptied as the source's.
    #[default]
    Carry,
    /// The target keeps its shape: a statement that alters, drops or empties a table is passed
    /// over, and rows reach the target with the columns it has (a column it lacks is left out, one
    /// the rows lack is not written). A statement that creates or renames a table is carried,
    /// since its rows need a table.
    Ignore,
    /// The stream stops before the statement, naming it and its position; nothing of it or
    /// after it is applied until the job is changed.
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Mode {
    #[serde(rename = "snapshot")]
    Snapshot,
    #[serde(rename = "cdc")]
    Cdc,
    #[serde(rename = "snapshot+cdc")]
    SnapshotAndCdc,
    /// A copy of the rows whose `source.cursor` column passed the last batch's mark, upserted
    /// by key: a batch job for sources without a change log.
    #[serde(rename = "incremental-cursor")]
    IncrementalCursor,
}

/// `verify: {every_secs: 3600, repair: false, tables: [GLOB]}`: a server verifies the job (as
/// `POST /jobs/NAME/verify` does) once `every_secs` have passed since its last verification;
/// `sluice run` verifies a streaming job every `every_secs` while it streams, and a job that
/// copies and ends once, when its copy succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifySpec {
    pub every_secs: u64,
    /// Write the source's rows over the differing ones.
    pub repair: bool,
    /// Only these tables (source or target names, globs); empty: every table.
    pub tables: Vec<String>,
}

impl JobSpec {
    /// Whether the job runs as numbered batches on a server (`schedule` or `after`).
    pub fn batched(&self) -> bool {
        self.schedule.is_some() || !self.after.is_empty()
    }
}

impl Mode {
    /// Whether the job follows the source's change log (and so runs without end, unless batched).
    pub fn streams(self) -> bool {
        matches!(self, Mode::Cdc | Mode::SnapshotAndCdc)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Mode::Snapshot => "snapshot",
            Mode::Cdc => "cdc",
            Mode::SnapshotAndCdc => "snapshot+cdc",
            Mode::IncrementalCursor => "incremental-cursor",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    Insert,
    /// Insert or replace the row with the same primary key (never another unique key).
    Upsert,
}

/// A source or target: its connector type, the fields every connector shares, and the
/// connector's own options, which the connector registry validates.
#[derive(Debug, Clone)]
pub struct EndpointSpec {
    /// Which end of the job it is (`Side::Source` or `Side::Target`); its name is the field path
    /// prefix of messages.
    pub role: Side,
    /// Where it stands in the document (`source`, `target`, `targets[warehouse]`): the prefix of
    /// its fields' paths in messages.
    pub at: String,
    pub connector: String,
    /// The server URL; it may hold a password, so it never prints.
    pub url: Option<Secret>,
    /// A file or directory path, for embedded databases and files.
    pub path: Option<String>,
    /// Include globs; a leading `!` excludes.
    pub tables: Vec<String>,
    pub write_mode: WriteMode,
    pub create_tables: bool,
    /// `cursor:` (sources of `incremental-cursor` jobs): the column that says which rows changed.
    pub cursor: Option<CursorSpec>,
    /// The fields present, with their lines, so the registry can reject the ones its connector
    /// does not take.
    pub present: Vec<(String, Option<usize>)>,
    /// Connector-specific fields, decoded by the connector.
    pub options: BTreeMap<String, Node>,
    pub line: Option<usize>,
}

impl EndpointSpec {
    /// The line of a field, for messages.
    pub fn line_of(&self, field: &str) -> Option<usize> {
        self.present.iter().find(|(name, _)| name == field).and_then(|(_, line)| *line).or(self.line)
    }

    pub fn path_of(&self, field: &str) -> String {
        format!("{}.{field}", self.at)
    }

    /// An error about one of this endpoint's fields.
    pub fn error(&self, field: &str, message: impl Into<String>) -> SpecError {
        SpecError { path: self.path_of(field), line: self.line_of(field), message: message.into() }
    }

    /// The URL with its password replaced by `***`, for messages.
    pub fn display_url(&self) -> String {
        self.url.as_ref().map_or_else(String::new, |url| secret::redact_url_passwords(url.expose()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// 0 = unlimited.
    pub rows_per_sec: u64,
    /// 0 = unlimited.
    pub bytes_per_sec: u64,
    /// Rows per batch read from the source.
    pub batch_rows: usize,
    /// Batches buffered between a reader and its writer; with `batch_rows` and `parallelism` this
    /// bounds memory.
    pub queue_batches: usize,
    /// Rows per split when a table is cut into parallel chunks.
    pub split_rows: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorPolicy {
    /// Dirty records tolerated before the job fails; 0 fails on the first.
    pub max_dirty_records: u64,
    /// What to do with a MySQL zero date (`0000-00-00`, `2020-00-15`) that the target cannot
    /// hold.
    pub zero_dates: ZeroDates,
}

/// The zero-date policy. Neither choice is silent: rejected rows are dirty records, nulled
/// values are counted per table in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroDates {
    /// The row is a dirty record (and fails the job past `max_dirty_records`).
    Reject,
    /// The value is stored as NULL where the column allows it; otherwise the row is dirty.
    Null,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts of one task step before the job fails; 1 = no retry.
    pub max_attempts: u32,
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

/// How a task that failed for a reason that can heal (a server down, a connection cut) is run
/// again from its checkpoint, after its steps used up their own retries (`RetryPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts in a row, without rows written in between, before the task fails for good;
    /// 0 = a failed task stays failed.
    pub max_restarts: u32,
    /// The wait before the first restart; it doubles with each restart in a row.
    pub initial_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// A task failing for this long without writing a row fails for good; 0 = no time limit.
    pub give_up_after_secs: u64,
    /// Restarts in a row on one cluster worker before the task moves to another worker.
    pub move_after: u32,
}

impl Default for RestartPolicy {
    fn default() -> RestartPolicy {
        RestartPolicy {
            max_restarts: 20,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 60_000,
            give_up_after_secs: 1_800,
            move_after: 3,
        }
    }
}

const ENDPOINT_FIELDS: [&str; 7] = ["type", "url", "path", "tables", "write_mode", "create_tables", "cursor"];

/// Parses a job document (YAML, or JSON when `json` is set) and validates its structure,
/// returning every error found. Connector-specific checks are the registry's.
pub fn parse_job(text: &str, json: bool, environment: fn(&str) -> Option<String>) -> Result<JobSpec, Vec<SpecError>> {
    match parse_job_partially(text, json, environment) {
        (Some(job), errors) if errors.is_empty() => Ok(job),
        (_, errors) => Err(errors),
    }
}

/// Like `parse_job`, but also returns the job when every field could be read despite errors
/// elsewhere (an unknown field), so later checks can still report their own errors.
pub fn parse_job_partially(
    text: &str,
    json: bool,
    environment: fn(&str) -> Option<String>,
) -> (Option<JobSpec>, Vec<SpecError>) {
    parse_job_with(text, json, &|name| environment(name).ok_or_else(|| unset_variable(name)))
}

/// `parse_job_partially` with the `${NAME}`s taking their values by `variables`' rule.
pub fn parse_job_with(text: &str, json: bool, variables: Variables<'_>) -> (Option<JobSpec>, Vec<SpecError>) {
    let root = if json { document::parse_json(text) } else { document::parse_yaml(text) };
    let root = match root {
        Ok(root) => root,
        Err(error) => {
            let location = match (error.line, error.column) {
                (Some(line), Some(column)) => format!(" at line {line}, column {column}"),
                _ => String::new(),
            };
            let format = if json { "JSON" } else { "YAML" };
            let message = format!("the job file is not valid {format}{location}: {}", error.message);
            return (None, vec![SpecError { path: String::new(), line: error.line, message }]);
        }
    };
    let mut decoder = Decoder::new(variables);
    let job = decode_job(&mut decoder, &root);
    (job, decoder.into_errors())
}

fn decode_job(decoder: &mut Decoder, root: &Node) -> Option<JobSpec> {
    let fields = decoder.mapping(
        root,
        "",
        &[
            "name",
            "mode",
            "source",
            "sources",
            "target",
            "targets",
            "parallelism",
            "limits",
            "errors",
            "retry",
            "restart",
            "route",
            "transform",
            "schedule",
            "priority",
            "placement",
            "after",
            "alarms",
            "verify",
            "schema_changes",
            "two_way",
            "conflict",
            "apply_parallelism",
            "consistency",
        ],
    )?;
    let name = decode_name(decoder, &fields);
    let mode = decode_mode(decoder, &fields);
    let (source, sources) = decode_one_or_several(decoder, &fields, Side::Source);
    let (mut target, mut targets) = decode_one_or_several(decoder, &fields, Side::Target);
    let parallelism = decode_parallelism(decoder, &fields);
    let limits = decode_limits(decoder, &fields);
    let errors = decode_error_policy(decoder, &fields);
    let retry = decode_retry(decoder, &fields);
    let restart = decode_restart(decoder, &fields);
    let routes = fields.get("route").map(|node| transform::decode_routes(decoder, node)).unwrap_or_default();
    let transforms =
        fields.get("transform").map(|node| transform::decode_transforms(decoder, node)).unwrap_or_default();
    let priority = match fields.get("priority") {
        None => Some(0),
        Some(node) => decoder.unsigned(node, "priority", 1_000).map(|priority| priority as u32),
    };
    let placement = match fields.get("placement") {
        None => Some(Placement::default()),
        Some(node) => placement::decode_placement(decoder, node),
    };
    let alarms = match fields.get("alarms") {
        None => Some(Vec::new()),
        Some(node) => alarm::decode_alarms(decoder, node, "alarms"),
    };
    let verify = match fields.get("verify") {
        None => Some(None),
        Some(node) => decode_verify(decoder, node).map(Some),
    };
    let two_way = match fields.get("two_way") {
        None => Some(false),
        Some(node) => decoder.boolean(node, "two_way"),
    };
    let conflict = match fields.get("conflict") {
        None => Some(two_way.unwrap_or(false).then_some(ConflictPolicy::Stop)),
        Some(node) => conflict::decode_conflict(decoder, node).map(Some),
    };
    let schema_changes = decode_schema_changes(decoder, &fields, two_way);
    let (apply_parallelism, consistency) = decode_apply(decoder, &fields);
    let schedule = schedule::decode_schedule(decoder, &fields);
    let after = schedule::decode_after(decoder, &fields, name.as_deref());
    check_schedule(decoder, &fields, mode, &schedule, &after);
    if let Some(mode) = mode.filter(|mode| !mode.streams()) {
        check_no_stream_fields(decoder, &fields, mode);
    }
    if let (Some(mode), Some(source)) = (mode, &source) {
        check_cursors(decoder, mode, source, target.as_mut(), targets.as_mut());
    }
    check_parts(decoder, &fields, mode, sources.as_deref(), targets.as_deref());
    Some(JobSpec {
        name: name?,
        mode: mode?,
        source: source?,
        sources: sources?,
        fan_in: None,
        target: target?,
        targets: targets?,
        parallelism: parallelism?,
        limits: limits?,
        errors: errors?,
        retry: retry?,
        restart: restart?,
        routes,
        transforms,
        schedule: schedule?,
        priority: priority?,
        placement: placement?,
        after: after?,
        alarms: alarms?,
        verify: verify?,
        schema_changes: schema_changes?,
        two_way: two_way?,
        conflict: conflict?,
        apply_parallelism: apply_parallelism?,
        consistency: consistency?,
    })
}

/// A job has several sources or several targets, not both; several sources merge in every mode
/// but `incremental-cursor`.
fn check_parts(
    decoder: &mut Decoder,
    fields: &Fields<'_>,
    mode: Option<Mode>,
    sources: Option<&[NamedEndpoint]>,
    targets: Option<&[NamedEndpoint]>,
) {
    let several_sources = sources.is_some_and(|sources| !sources.is_empty());
    if several_sources && targets.is_some_and(|targets| !targets.is_empty()) {
        decoder.error(
            "targets",
            fields.get("targets").and_then(|node| node.line),
            "a job merges several `sources:` into one target or feeds several `targets:` from one source, not both; write one job per target",
        );
    }
    if several_sources && mode == Some(Mode::IncrementalCursor) {
        decoder.error(
            "sources",
            fields.get("sources").and_then(|node| node.line),
            "several sources merge in snapshot, cdc and snapshot+cdc jobs; an incremental-cursor job reads one source (write one job per source)",
        );
    }
}

/// `target:` (one) or `targets:` (several, the first of them also as `target`); `source:` or
/// `sources:` the same way.
fn decode_one_or_several(
    decoder: &mut Decoder,
    fields: &Fields<'_>,
    role: Side,
) -> (Option<EndpointSpec>, Option<Vec<NamedEndpoint>>) {
    let (one, several) = match role {
        Side::Source => ("source", "sources"),
        _ => ("target", "targets"),
    };
    match (fields.get(one), fields.get(several)) {
        (Some(node), None) => (decode_endpoint(decoder, node, role, one), Some(Vec::new())),
        (None, Some(node)) => match decode_named(decoder, node, several, role) {
            Some(named) => (named.first().map(|first| first.endpoint.clone()), Some(named)),
            None => (None, None),
        },
        (Some(_), Some(node)) => {
            decoder.error(several, node.line, format!("give `{one}:` (one) or `{several}:` (several), not both"));
            (None, None)
        }
        (None, None) => {
            let what = match role {
                Side::Source => "where data comes from (or `sources:`, a list of several servers merged into the target, each with a name)",
                _ => "where data goes (or `targets:`, a list of several, each with a name)",
            };
            fields.require(decoder, one, what);
            (None, None)
        }
    }
}

/// `schema_changes:` carry (the default), ignore or stop (the default of a two-way job).
fn decode_schema_changes(decoder: &mut Decoder, fields: &Fields<'_>, two_way: Option<bool>) -> Option<SchemaChanges> {
    match fields.get("schema_changes") {
        None if two_way == Some(true) => Some(SchemaChanges::Stop),
        None => Some(SchemaChanges::Carry),
        Some(node) => decoder.string(node, "schema_changes").and_then(|text| match text.as_str() {
            "carry" => Some(SchemaChanges::Carry),
            "stop" => Some(SchemaChanges::Stop),
            "ignore" => Some(SchemaChanges::Ignore),
            other => {
                decoder.error("schema_changes", node.line, format!("expected carry, ignore or stop, found `{other}`"));
                None
            }
        }),
    }
}

/// Every field of the change stream that a job of `mode` (without one) names, as an error.
fn check_no_stream_fields(decoder: &mut Decoder, fields: &Fields<'_>, mode: Mode) {
    for field in ["two_way", "conflict", "apply_parallelism", "consistency"] {
        if let Some(node) = fields.get(field) {
            decoder.error(
                field,
                node.line,
                format!("mode {mode} has no change stream; `{field}` is for cdc and snapshot+cdc jobs"),
            );
        }
    }
}

/// The cursor's rules for the source and each target; a cursor job's targets upsert.
fn check_cursors(
    decoder: &mut Decoder,
    mode: Mode,
    source: &EndpointSpec,
    mut target: Option<&mut EndpointSpec>,
    targets: Option<&mut Vec<NamedEndpoint>>,
) {
    if let Some(target) = &mut target {
        check_cursor(decoder, mode, source, target);
    }
    let named = targets.into_iter().flatten().map(|target| &mut target.endpoint);
    for (index, target) in target.into_iter().chain(named).enumerate() {
        if index > 1 {
            // The first named target is `target`, checked above with the source.
            check_target_cursor(decoder, mode, target);
        }
        if mode == Mode::IncrementalCursor {
            target.write_mode = WriteMode::Upsert;
        }
    }
}

/// `verify:`: how often (at least a second, at most 30 days), whether to repair, which tables.
fn decode_verify(decoder: &mut Decoder, node: &Node) -> Option<VerifySpec> {
    let fields = decoder.mapping(node, "verify", &["every_secs", "repair", "tables"])?;
    let every_secs = fields
        .require(decoder, "every_secs", "how often a server verifies the job, in seconds")
        .and_then(|node| decoder.unsigned(node, &fields.path("every_secs"), 30 * 86_400))
        .and_then(|every| match every {
            0 => {
                decoder.error(&fields.path("every_secs"), node.line, "expected at least 1 second, found 0");
                None
            }
            every => Some(every),
        });
    let repair = match fields.get("repair") {
        None => Some(false),
        Some(node) => decoder.boolean(node, &fields.path("repair")),
    };
    let tables = match fields.get("tables") {
        None => Some(Vec::new()),
        Some(node) => decoder.string_list(node, &fields.path("tables")),
    };
    Some(VerifySpec { every_secs: every_secs?, repair: repair?, tables: tables? })
}

/// The job's name: 1 to 128 of a-z, 0-9, _ and -.
fn decode_name(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<String> {
    fields.require(decoder, "name", "the job's name, [a-z0-9_-]+").and_then(|node| {
        let name = decoder.string(node, "name")?;
        let valid = !name.is_empty()
            && name.len() <= 128
            && name
                .bytes()
                .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_' || byte == b'-');
        if !valid {
            decoder.error(
                "name",
                node.line,
                format!("`{name}` is not a valid job name; use 1 to 128 of a-z, 0-9, _ and -"),
            );
        }
        valid.then_some(name)
    })
}

/// The job's mode (snapshot when it names none), by its name or an alias.
fn decode_mode(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<Mode> {
    match fields.get("mode") {
        None => Some(Mode::Snapshot),
        Some(node) => decoder.string(node, "mode").and_then(|text| {
            let mode = match text.as_str() {
                "snapshot" | "full" => Some(Mode::Snapshot),
                "cdc" | "incremental" => Some(Mode::Cdc),
                "snapshot+cdc" | "full+incremental" => Some(Mode::SnapshotAndCdc),
                "incremental-cursor" => Some(Mode::IncrementalCursor),
                _ => None,
            };
            if mode.is_none() {
                decoder.error("mode", node.line, format!("unknown mode {}; expected snapshot, cdc, snapshot+cdc or incremental-cursor (aliases: full, incremental, full+incremental)", decode::describe(node)));
            }
            mode
        }),
    }
}

/// `apply_parallelism` (1 to 32) and `consistency`; `serial` with more than one connection is
/// a contradiction.
fn decode_apply(decoder: &mut Decoder, fields: &Fields<'_>) -> (Option<Option<usize>>, Option<Consistency>) {
    let parallelism = match fields.get("apply_parallelism") {
        None => Some(None),
        Some(node) => count_at_least_one(decoder, node, "apply_parallelism", 32).map(Some),
    };
    let consistency = match fields.get("consistency") {
        None => Some(Consistency::Transaction),
        Some(node) => decoder.string(node, "consistency").and_then(|text| match text.as_str() {
            "transaction" => Some(Consistency::Transaction),
            "serial" => Some(Consistency::Serial),
            other => {
                decoder.error("consistency", node.line, format!("expected transaction or serial, found `{other}`"));
                None
            }
        }),
    };
    if let (Some(Some(lanes)), Some(Consistency::Serial), Some(node)) =
        (parallelism, consistency, fields.get("apply_parallelism"))
    {
        if lanes > 1 {
            decoder.error(
                "apply_parallelism",
                node.line,
                format!("consistency: serial applies on one connection; apply_parallelism says {lanes} (drop one of the two)"),
            );
        }
    }
    (parallelism, consistency)
}

/// How many copy tasks run at once: 4 unless the job says, and at least 1.
fn decode_parallelism(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<usize> {
    match fields.get("parallelism") {
        None => Some(4),
        Some(node) => count_at_least_one(decoder, node, "parallelism", 256),
    }
}

/// A count of connections or tasks: 1 to `max`.
fn count_at_least_one(decoder: &mut Decoder, node: &Node, field: &str, max: u64) -> Option<usize> {
    decoder.unsigned(node, field, max).and_then(|value| {
        if value == 0 {
            decoder.error(field, node.line, "must be at least 1");
            return None;
        }
        Some(value as usize)
    })
}

/// `schedule` and `after` are for jobs that end (not `snapshot+cdc`), and a job takes one of the
/// two, not both.
fn check_schedule(
    decoder: &mut Decoder,
    fields: &Fields<'_>,
    mode: Option<Mode>,
    schedule: &Option<Option<ScheduleSpec>>,
    after: &Option<Vec<Dependency>>,
) {
    for (field, present) in [
        ("schedule", matches!(&schedule, Some(Some(_)))),
        ("after", after.as_ref().is_some_and(|after| !after.is_empty())),
    ] {
        match mode {
            Some(mode) if present && mode == Mode::SnapshotAndCdc => decoder.error(
                field,
                fields.get(field).and_then(|node| node.line),
                format!("a {mode} job runs without end and cannot be scheduled; snapshot, incremental-cursor and cdc jobs run again by `schedule` or `after` (a cdc batch applies the changes up to where the source stood at its start)"),
            ),
            _ => {}
        }
    }
    if matches!(&schedule, Some(Some(_))) && after.as_ref().is_some_and(|after| !after.is_empty()) {
        decoder.error(
            "after",
            fields.get("after").and_then(|node| node.line),
            "a job with `after` runs when those jobs' batches end; it takes no `schedule` of its own",
        );
    }
}

/// An `incremental-cursor` job needs `source.cursor` and upserts; no other job takes a cursor.
fn check_cursor(decoder: &mut Decoder, mode: Mode, source: &EndpointSpec, target: &EndpointSpec) {
    let incremental = mode == Mode::IncrementalCursor;
    if incremental && source.cursor.is_none() {
        decoder.error(
            &source.path_of("cursor"),
            source.line,
            "an incremental-cursor job needs `source.cursor: {column: ..., lookback_secs: ...}`: the column that tells which rows changed",
        );
    }
    if !incremental && source.cursor.is_some() {
        decoder.error(
            &source.path_of("cursor"),
            source.line_of("cursor"),
            format!("a {mode} job reads no cursor; `source.cursor` belongs to `mode: incremental-cursor`"),
        );
    }
    check_target_cursor(decoder, mode, target);
}

/// A target's part of `check_cursor`.
fn check_target_cursor(decoder: &mut Decoder, mode: Mode, target: &EndpointSpec) {
    let incremental = mode == Mode::IncrementalCursor;
    if target.cursor.is_some() {
        decoder.error(
            &target.path_of("cursor"),
            target.line_of("cursor"),
            "a cursor is read from the source; remove it from the target",
        );
    }
    if incremental
        && target.present.iter().any(|(field, _)| field == "write_mode")
        && target.write_mode == WriteMode::Insert
    {
        decoder.error(
            &target.path_of("write_mode"),
            target.line_of("write_mode"),
            "an incremental-cursor job reads changed rows again and upserts them by key; remove `write_mode: insert`",
        );
    }
}

fn decode_endpoint(decoder: &mut Decoder, node: &Node, side: Side, at: &str) -> Option<EndpointSpec> {
    let role = at;
    // Connector-specific keys are allowed here and checked by the registry, which knows them.
    let document::NodeKind::Mapping(entries) = &node.kind else {
        decoder.error(role, node.line, format!("expected a mapping with at least `type`, found {}", node.shape()));
        return None;
    };
    let every_key: Vec<&str> = entries.iter().map(|(key, _)| key.as_str()).collect();
    let fields = decoder.mapping(node, role, &every_key)?;
    let connector = fields
        .require(decoder, "type", "the connector, e.g. sqlite, mysql, postgres, jsonl")
        .and_then(|node| decoder.string(node, &fields.path("type")));
    let url = fields.get("url").and_then(|node| decoder.string(node, &fields.path("url"))).map(|url| {
        register_url_password(&url);
        Secret::new(url)
    });
    let path = fields.get("path").and_then(|node| decoder.string(node, &fields.path("path")));
    // A list of table declarations (mappings: the `generate` source's) is the connector's to read.
    let tables = match fields.get("tables") {
        Some(node) if declares_tables(node) => Vec::new(),
        Some(node) => decoder.string_list(node, &fields.path("tables"))?,
        None => Vec::new(),
    };
    let write_mode = match fields.get("write_mode") {
        None => Some(WriteMode::Insert),
        Some(node) => decoder.string(node, &fields.path("write_mode")).and_then(|text| match text.as_str() {
            "insert" => Some(WriteMode::Insert),
            "upsert" => Some(WriteMode::Upsert),
            _ => {
                decoder.error(
                    &fields.path("write_mode"),
                    node.line,
                    format!("unknown write mode {}; expected insert or upsert", decode::describe(node)),
                );
                None
            }
        }),
    };
    let create_tables = match fields.get("create_tables") {
        None => Some(true),
        Some(node) => decoder.boolean(node, &fields.path("create_tables")),
    };
    let cursor = cursor::decode_cursor(decoder, &fields);
    let options = entries
        .iter()
        .filter(|(key, value)| {
            (!ENDPOINT_FIELDS.contains(&key.as_str()) || (key == "tables" && declares_tables(value)))
                && !value.is_null()
        })
        .map(|(key, value)| (key.clone(), decoder.substituted(value, &fields.path(key))))
        .collect();
    Some(EndpointSpec {
        role: side,
        at: at.to_owned(),
        connector: connector?,
        url,
        path,
        tables,
        write_mode: write_mode?,
        create_tables: create_tables?,
        cursor: cursor?,
        present: fields.keys().map(|(key, line)| (key.to_owned(), line)).collect(),
        options,
        line: node.line,
    })
}

/// Whether `tables:` declares tables (a list holding mappings) instead of naming them.
fn declares_tables(node: &Node) -> bool {
    matches!(&node.kind, document::NodeKind::Sequence(items) if items.iter().any(|item| matches!(item.kind, document::NodeKind::Mapping(_))))
}

/// Registers the password part of a connection URL so no message can leak it, even one a driver
/// wrote.
fn register_url_password(url: &str) {
    for password in secret::url_passwords(url) {
        secret::register(password);
        if let Some(decoded) = percent_decode(password) {
            secret::register(&decoded);
        }
    }
}

fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return None;
    }
    let bytes = text.as_bytes();
    let mut output = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' && index + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).ok()?;
            output.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            output.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(output).ok()
}

fn decode_limits(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<Limits> {
    let defaults =
        Limits { rows_per_sec: 0, bytes_per_sec: 0, batch_rows: 5_000, queue_batches: 4, split_rows: 100_000 };
    let Some(node) = fields.get("limits") else {
        return Some(defaults);
    };
    let limits = decoder.mapping(
        node,
        "limits",
        &["rows_per_sec", "bytes_per_sec", "batch_rows", "queue_batches", "split_rows"],
    )?;
    let mut read = |key: &str, default: u64, minimum: u64, maximum: u64| match limits.get(key) {
        None => Some(default),
        Some(node) => {
            let value = decoder.unsigned(node, &limits.path(key), maximum)?;
            if value < minimum {
                decoder.error(&limits.path(key), node.line, format!("must be at least {minimum}"));
                return None;
            }
            Some(value)
        }
    };
    let rows_per_sec = read("rows_per_sec", 0, 0, u64::MAX);
    let bytes_per_sec = read("bytes_per_sec", 0, 0, u64::MAX);
    let batch_rows = read("batch_rows", defaults.batch_rows as u64, 1, 1_000_000);
    let queue_batches = read("queue_batches", defaults.queue_batches as u64, 1, 1_024);
    let split_rows = read("split_rows", defaults.split_rows, 1, u64::MAX);
    Some(Limits {
        rows_per_sec: rows_per_sec?,
        bytes_per_sec: bytes_per_sec?,
        batch_rows: batch_rows? as usize,
        queue_batches: queue_batches? as usize,
        split_rows: split_rows?,
    })
}

fn decode_error_policy(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<ErrorPolicy> {
    let defaults = ErrorPolicy { max_dirty_records: 0, zero_dates: ZeroDates::Reject };
    let Some(node) = fields.get("errors") else {
        return Some(defaults);
    };
    let errors = decoder.mapping(node, "errors", &["max_dirty_records", "zero_dates"])?;
    let max_dirty_records = match errors.get("max_dirty_records") {
        None => Some(0),
        Some(node) => decoder.unsigned(node, "errors.max_dirty_records", u64::MAX),
    };
    let zero_dates = match errors.get("zero_dates") {
        None => Some(ZeroDates::Reject),
        Some(node) => decoder.string(node, "errors.zero_dates").and_then(|text| match text.as_str() {
            "reject" => Some(ZeroDates::Reject),
            "null" => Some(ZeroDates::Null),
            _ => {
                decoder.error(
                    "errors.zero_dates",
                    node.line,
                    format!("unknown policy {}; expected reject or null", decode::describe(node)),
                );
                None
            }
        }),
    };
    Some(ErrorPolicy { max_dirty_records: max_dirty_records?, zero_dates: zero_dates? })
}

fn decode_retry(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<RetryPolicy> {
    let defaults = RetryPolicy { max_attempts: 5, initial_backoff_ms: 200, max_backoff_ms: 10_000 };
    let Some(node) = fields.get("retry") else {
        return Some(defaults);
    };
    let retry = decoder.mapping(node, "retry", &["max_attempts", "initial_backoff_ms", "max_backoff_ms"])?;
    let mut read = |key: &str, default: u64, maximum: u64| match retry.get(key) {
        None => Some(default),
        Some(node) => decoder.unsigned(node, &retry.path(key), maximum),
    };
    let max_attempts = read("max_attempts", defaults.max_attempts.into(), 1_000);
    let initial_backoff_ms = read("initial_backoff_ms", defaults.initial_backoff_ms, 3_600_000);
    let max_backoff_ms = read("max_backoff_ms", defaults.max_backoff_ms, 3_600_000);
    Some(RetryPolicy {
        max_attempts: (max_attempts?.max(1)) as u32,
        initial_backoff_ms: initial_backoff_ms?,
        max_backoff_ms: max_backoff_ms?,
    })
}

fn decode_restart(decoder: &mut Decoder, fields: &Fields<'_>) -> Option<RestartPolicy> {
    let defaults = RestartPolicy::default();
    let Some(node) = fields.get("restart") else {
        return Some(defaults);
    };
    let restart = decoder.mapping(
        node,
        "restart",
        &["max_restarts", "initial_backoff_ms", "max_backoff_ms", "give_up_after_secs", "move_after"],
    )?;
    let mut read = |key: &str, default: u64, maximum: u64| match restart.get(key) {
        None => Some(default),
        Some(node) => decoder.unsigned(node, &restart.path(key), maximum),
    };
    let max_restarts = read("max_restarts", defaults.max_restarts.into(), 1_000_000);
    let initial_backoff_ms = read("initial_backoff_ms", defaults.initial_backoff_ms, 3_600_000);
    let max_backoff_ms = read("max_backoff_ms", defaults.max_backoff_ms, 3_600_000);
    let give_up_after_secs = read("give_up_after_secs", defaults.give_up_after_secs, 30 * 86_400);
    let move_after = read("move_after", defaults.move_after.into(), 1_000_000);
    Some(RestartPolicy {
        max_restarts: max_restarts? as u32,
        initial_backoff_ms: initial_backoff_ms?,
        max_backoff_ms: max_backoff_ms?,
        give_up_after_secs: give_up_after_secs?,
        move_after: (move_after?.max(1)) as u32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::NodeKind;

    fn environment(name: &str) -> Option<String> {
        (name == "PASSWORD").then(|| "CANARY-spec-91c2".to_owned())
    }

    fn parse(text: &str) -> Result<JobSpec, Vec<SpecError>> {
        parse_job(text, false, environment)
    }

    const MINIMAL: &str = "name: copy\nsource:\n  type: sqlite\n  path: a.db\ntarget:\n  type: jsonl\n  path: out\n";

    #[test]
    fn apply_parallelism_and_consistency_default_to_one_connection_and_refuse_contradictions() {
        let stream = "name: s\nmode: cdc\nsource: {type: mysql, url: \"mysql://a\"}\ntarget: {type: postgres, url: \"postgres://b\"}\n";
        let job = parse(stream).unwrap();
        assert_eq!((job.apply_parallelism, job.consistency), (None, Consistency::Transaction));
        let job = parse(&format!("{stream}apply_parallelism: 8\n")).unwrap();
        assert_eq!(job.apply_parallelism, Some(8));
        let job = parse(&format!("{stream}consistency: serial\n")).unwrap();
        assert_eq!(job.consistency, Consistency::Serial);
        let errors = parse(&format!("{stream}apply_parallelism: 0\nconsistency: eventual\n")).unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert!(
            text.iter().any(|error| error.contains("apply_parallelism") && error.contains("at least 1")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|error| error.contains("expected transaction or serial, found `eventual`")),
            "{text:?}"
        );
        let errors = parse(&format!("{stream}apply_parallelism: 4\nconsistency: serial\n")).unwrap_err();
        assert!(errors[0].to_string().contains("consistency: serial applies on one connection"), "{}", errors[0]);
        let errors = parse(&format!("{MINIMAL}apply_parallelism: 2\n")).unwrap_err();
        assert!(
            errors[0].to_string().contains("`apply_parallelism` is for cdc and snapshot+cdc jobs"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn several_targets_each_have_a_name_and_become_one_job_each() {
        let text = "name: fan\nsource: {type: sqlite, path: a.db}\ntargets:\n  - {name: one, type: jsonl, path: out1}\n  - name: two\n    type: csv\n    path: out2\n";
        let job = parse(text).unwrap();
        assert_eq!(job.target.connector, "jsonl", "`target` is the first of them");
        let each: Vec<(String, String, String)> = job
            .parts()
            .into_iter()
            .map(|job| (job.target.path_of("path"), job))
            .map(|(path, job)| (job.name, job.target.connector, path))
            .collect();
        assert_eq!(
            each,
            [
                ("fan.one".into(), "jsonl".into(), "targets[one].path".into()),
                ("fan.two".into(), "csv".into(), "targets[two].path".into())
            ]
        );
        assert!(each.iter().all(|(name, _, _)| name.starts_with("fan.")));
        assert_eq!(parse(MINIMAL).unwrap().parts().len(), 1);

        let errors = |text: &str| -> Vec<String> { parse(text).unwrap_err().iter().map(ToString::to_string).collect() };
        let both = errors("name: x\nsource: {type: sqlite, path: a.db}\ntarget: {type: jsonl, path: o}\ntargets: [{name: a, type: jsonl, path: o}]\n");
        assert!(both.iter().any(|error| error.contains("not both")), "{both:?}");
        let bad = errors("name: x\nsource: {type: sqlite, path: a.db}\ntargets:\n  - {type: jsonl, path: o}\n  - {name: Two, type: jsonl, path: o}\n  - {name: c, type: jsonl, path: o}\n  - {name: c, type: jsonl, path: o}\n  - {name: d, path: o}\n");
        for expected in
            ["targets[0].name", "`Two` is not a valid target name", "two targets are named `c`", "targets[d].type"]
        {
            assert!(bad.iter().any(|error| error.contains(expected)), "{expected}: {bad:?}");
        }
        let none = errors("name: x\nsource: {type: sqlite, path: a.db}\n");
        assert!(none.iter().any(|error| error.contains("target")), "{none:?}");
    }

    #[test]
    fn several_sources_each_have_a_name_and_become_one_job_each_reading_one() {
        let text = "name: shards\nmode: cdc\nsources:\n  - {name: east, type: mysql, url: 'mysql://a/'}\n  - name: west\n    type: mysql\n    url: 'mysql://b/'\ntarget: {type: postgres, url: 'postgres://t/'}\n";
        let job = parse(text).unwrap();
        assert_eq!(job.source.path_of("url"), "sources[east].url", "`source` is the first of them");
        assert_eq!(job.part_names(), ["east", "west"]);
        let each: Vec<(String, Option<String>, String)> = job
            .parts()
            .into_iter()
            .map(|part| (part.name.clone(), part.fan_in.clone(), part.source.path_of("url")))
            .collect();
        assert_eq!(
            each,
            [
                ("shards.east".into(), Some("east".into()), "sources[east].url".into()),
                ("shards.west".into(), Some("west".into()), "sources[west].url".into())
            ]
        );
        assert!(job.parts().iter().all(|part| part.sources.is_empty() && part.target.connector == "postgres"));
        assert_eq!(parse(MINIMAL).unwrap().parts()[0].fan_in, None);

        let errors = |text: &str| -> Vec<String> { parse(text).unwrap_err().iter().map(ToString::to_string).collect() };
        let both = errors("name: x\nsource: {type: sqlite, path: a.db}\nsources: [{name: a, type: sqlite, path: b.db}]\ntarget: {type: jsonl, path: o}\n");
        assert!(
            both.iter().any(|error| error.contains("give `source:` (one) or `sources:` (several), not both")),
            "{both:?}"
        );
        let crossed = errors("name: x\nsources: [{name: a, type: sqlite, path: a.db}, {name: b, type: sqlite, path: b.db}]\ntargets: [{name: c, type: jsonl, path: o}]\n");
        assert!(crossed.iter().any(|error| error.contains("not both; write one job per target")), "{crossed:?}");
        let bad = errors("name: x\nsources:\n  - {type: sqlite, path: a.db}\n  - {name: b, type: sqlite, path: b.db}\n  - {name: b, type: sqlite, path: c.db}\ntarget: {type: jsonl, path: o}\n");
        for expected in
            ["sources[0].name", "missing required field `name` (the source's name", "two sources are named `b`"]
        {
            assert!(bad.iter().any(|error| error.contains(expected)), "{expected}: {bad:?}");
        }
        let cursor = errors("name: x\nmode: incremental-cursor\nsources: [{name: a, type: mysql, url: 'mysql://a/', cursor: {column: c}}]\ntarget: {type: postgres, url: 'postgres://t/'}\n");
        assert!(cursor.iter().any(|error| error.contains("an incremental-cursor job reads one source")), "{cursor:?}");
        let none = errors("name: x\ntarget: {type: jsonl, path: o}\n");
        assert!(none.iter().any(|error| error.contains("`sources:`")), "{none:?}");
    }

    #[test]
    fn a_minimal_job_gets_defaults() {
        let job = parse(MINIMAL).unwrap();
        assert_eq!(job.mode, Mode::Snapshot);
        assert_eq!(job.parallelism, 4);
        assert_eq!(job.target.write_mode, WriteMode::Insert);
        assert_eq!(job.errors.max_dirty_records, 0);
    }

    #[test]
    fn every_error_is_reported_with_its_path_and_line() {
        let text = "name: Bad Name\nmode: sometimes\nsource:\n  type: sqlite\ntarget:\n  type: jsonl\n  write_mode: merge\nparallelism: zero\nlimits: {rows_per_sec: -1}\nextra: 1\n";
        let errors = parse(text).unwrap_err();
        let located: Vec<(&str, Option<usize>)> =
            errors.iter().map(|error| (error.path.as_str(), error.line)).collect();
        assert_eq!(
            located,
            vec![
                ("extra", Some(10)),
                ("name", Some(1)),
                ("mode", Some(2)),
                ("target.write_mode", Some(7)),
                ("parallelism", Some(8)),
                ("limits.rows_per_sec", Some(9)),
            ]
        );
        assert!(errors[0].message.contains("unknown field `extra`"), "{}", errors[0]);
    }

    #[test]
    fn a_placement_names_a_zone_and_labels_and_every_bad_word_is_reported() {
        let job = parse(&format!("{MINIMAL}placement: {{zone: east, labels: {{disk: ssd}}}}\n")).unwrap();
        assert_eq!(job.placement.zone.as_deref(), Some("east"));
        assert_eq!(job.placement.labels.get("disk").map(String::as_str), Some("ssd"));
        assert!(parse(MINIMAL).unwrap().placement.is_any());
        let errors = parse(&format!(
            "{MINIMAL}placement: {{zone: east coast, labels: {{\"a b\": x, rack: \"\"}}, region: 1}}\n"
        ))
        .unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|error| error.path.as_str()).collect();
        assert_eq!(
            paths,
            vec!["placement.region", "placement.zone", "placement.labels.a b", "placement.labels.rack"],
            "{errors:?}"
        );
    }

    #[test]
    fn environment_variables_are_substituted_and_missing_ones_named() {
        let text = "name: copy\nsource:\n  type: mysql\n  url: mysql://u:${PASSWORD}@h:3306\ntarget:\n  type: jsonl\n  path: ${NOPE}\n";
        let errors = parse(text).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!((errors[0].path.as_str(), errors[0].line), ("target.path", Some(7)));
        assert!(errors[0].message.contains("`NOPE` is not set"));
        let job = parse(&text.replace("${NOPE}", "out")).unwrap();
        assert_eq!(job.source.url.as_ref().unwrap().expose(), "mysql://u:CANARY-spec-91c2@h:3306");
        assert_eq!(job.source.display_url(), "mysql://u:***@h:3306");
        assert!(!format!("{job:?}").contains("CANARY"));
        assert_eq!(secret::scrub("x CANARY-spec-91c2 y"), "x *** y");
    }

    #[test]
    fn connector_options_take_environment_variables_too() {
        let text = "name: copy\nsource:\n  type: sqlite\n  path: a.db\ntarget:\n  type: kafka\n  brokers: h:${PASSWORD}\n  nested: [{x: \"$${PASSWORD}\"}]\n  missing: ${NOPE}\n";
        let errors = parse(text).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!((errors[0].path.as_str(), errors[0].line), ("target.missing", Some(9)));
        let job = parse(&text.replace("${NOPE}", "x")).unwrap();
        let text_of = |node: &Node| match &node.kind {
            NodeKind::Scalar { text, .. } => text.clone(),
            NodeKind::Sequence(items) => match &items[0].kind {
                NodeKind::Mapping(entries) => format!("{:?}", entries[0].1.kind),
                other => format!("{other:?}"),
            },
            other => format!("{other:?}"),
        };
        assert_eq!(text_of(&job.target.options["brokers"]), "h:CANARY-spec-91c2");
        assert!(text_of(&job.target.options["nested"]).contains("\"${PASSWORD}\""), "$$ is a literal $");
    }

    #[test]
    fn json_documents_are_accepted() {
        let text = r#"{"name": "copy", "mode": "full", "source": {"type": "sqlite", "path": "a.db"}, "target": {"type": "jsonl", "path": "out"}, "parallelism": 2}"#;
        let job = parse_job(text, true, environment).unwrap();
        assert_eq!((job.mode, job.parallelism), (Mode::Snapshot, 2));
        let errors = parse_job(r#"{"name": 5"#, true, environment).unwrap_err();
        assert!(errors[0].message.contains("not valid JSON at line 1"), "{}", errors[0]);
    }
}
