//! Sluice's connectors, one module per external system, each behind a cargo feature, and the
//! registry: the one place that maps a job's `type` to a connector.

pub mod blackhole;
#[cfg(feature = "clickhouse")]
pub mod clickhouse;
#[cfg(any(feature = "parquet", feature = "delta"))]
mod columnar;
mod declared;
#[cfg(feature = "delta")]
pub mod delta;
#[cfg(feature = "file")]
pub mod directory;
pub mod events;
#[cfg(feature = "file")]
pub mod file;
pub mod generate;
#[cfg(feature = "iceberg")]
pub mod iceberg;
pub mod json;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(any(feature = "delta", feature = "iceberg"))]
mod lake;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "mysql", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod stdout;
#[cfg(feature = "tcp")]
pub mod tcp;
pub mod tls;

use std::path::PathBuf;
use std::sync::Arc;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, Mode, NodeKind, SpecError, WriteMode};
use sluice_core::{Error, Result, Side, TableSchema};

/// Refuses names a target cannot hold as they are, all of them in one error: a target that
/// truncated them (PostgreSQL does, with only a notice) could merge two names into one.
pub(crate) fn refuse_long_names<'a>(
    tables: impl IntoIterator<Item = &'a sluice_core::TableSchema>,
    limit: usize,
    unit: &str,
    length: impl Fn(&str) -> usize + Copy,
    target: &str,
) -> Result<()> {
    let long: Vec<String> = tables.into_iter().flat_map(|table| table.names_longer_than(limit, length)).collect();
    if long.is_empty() {
        return Ok(());
    }
    Err(Error::new(
        sluice_core::ErrorKind::Schema,
        format!("{target} names are at most {limit} {unit}; these are longer: {}", long.join(", ")),
    )
    .on(sluice_core::Side::Target)
    .hint("rename them in the source, or choose a shorter target `namespace`; sluice does not shorten names"))
}

/// One connector type: its name, what it can do, and for each side it can be, the fields it
/// takes, how its own options are checked and how it is built. Each connector declares itself
/// in its folder (`mysql/connector.rs` …); [`CONNECTORS`] lists them. Adding a connector is its
/// folder and a line in that list.
#[derive(Debug)]
pub struct Connector {
    /// The `type` a job names.
    pub name: &'static str,
    /// The cargo feature that builds it.
    pub feature: &'static str,
    pub capabilities: Capabilities,
    /// The options (besides `url`, whose passwords the URL rules find) that hold a secret: a
    /// server refuses a document that writes one out instead of `${VARIABLE}`, and the value is
    /// registered so it never prints.
    pub secrets: &'static [&'static str],
    pub source: Option<SourceSide>,
    pub target: Option<TargetSide>,
}

/// A connector as a source.
#[derive(Debug)]
pub struct SourceSide {
    pub fields: &'static [&'static str],
    /// Checks the connector's own options (the registry checks the shared ones).
    pub validate: fn(&JobSpec, &EndpointSpec) -> Vec<SpecError>,
    pub build: fn(&JobSpec) -> Result<Arc<dyn Source>>,
}

/// A connector as a target; `build` gets the cluster task's fence, if any.
#[derive(Debug)]
pub struct TargetSide {
    pub fields: &'static [&'static str],
    pub validate: fn(&JobSpec, &EndpointSpec) -> Vec<SpecError>,
    pub build: BuildSink,
    /// How `sluice verify` reads a table of this target back, when the connector's source side
    /// does not (files of Arrow types, read by the mapped schema); `None`: by its source side.
    pub read_back: Option<ReadBackTable>,
}

/// Builds a target from a job, fenced for a cluster task when given a fence.
pub type BuildSink = fn(&JobSpec, Option<Fence>) -> Result<Arc<dyn Sink>>;

/// Builds a reader of one table of a job's target, the table as the job's mapping makes it.
pub type ReadBackTable = fn(&JobSpec, &Arc<TableSchema>) -> Result<Arc<dyn Source>>;

/// What a server (MySQL, PostgreSQL) can do: as a source, copy tables, follow its change log and
/// read cursor windows; as a target, write a snapshot's rows and apply a change stream, replacing
/// rows by key, in transactions that check a cluster task's fence.
pub(crate) const SERVER_CAPABILITIES: Capabilities = Capabilities {
    snapshot_source: true,
    change_source: true,
    cursor_source: true,
    table_sink: true,
    change_sink: true,
    upsert: true,
    fencing: true,
    transactions: true,
    ..Capabilities::NONE
};

/// The fields of a server target (MySQL, PostgreSQL).
pub(crate) const SERVER_TARGET_FIELDS: &[&str] = &["type", "url", "write_mode", "create_tables", "namespace"];

/// The connectors of this build.
pub const CONNECTORS: &[&Connector] = &[
    #[cfg(feature = "sqlite")]
    &sqlite::connector::CONNECTOR,
    #[cfg(feature = "mysql")]
    &mysql::connector::CONNECTOR,
    #[cfg(feature = "postgres")]
    &postgres::connector::CONNECTOR,
    #[cfg(feature = "file")]
    &file::connector::CSV,
    #[cfg(feature = "parquet")]
    &parquet::CONNECTOR,
    #[cfg(feature = "file")]
    &file::connector::JSONL,
    #[cfg(feature = "file")]
    &directory::connector::CONNECTOR,
    #[cfg(feature = "tcp")]
    &tcp::connector::CONNECTOR,
    &stdout::CONNECTOR,
    &generate::connector::CONNECTOR,
    &blackhole::CONNECTOR,
    #[cfg(feature = "nats")]
    &nats::connector::CONNECTOR,
    #[cfg(feature = "kafka")]
    &kafka::connector::CONNECTOR,
    #[cfg(feature = "delta")]
    &delta::connector::CONNECTOR,
    #[cfg(feature = "iceberg")]
    &iceberg::connector::CONNECTOR,
    #[cfg(feature = "clickhouse")]
    &clickhouse::connector::CONNECTOR,
];

/// Every connector type with the cargo feature that builds it, built here or not, for messages.
const EVERY_TYPE: &[(&str, &str)] = &[
    ("sqlite", "sqlite"),
    ("mysql", "mysql"),
    ("postgres", "postgres"),
    ("csv", "file"),
    ("parquet", "parquet"),
    ("jsonl", "file"),
    ("directory", "file"),
    ("tcp", "tcp"),
    ("stdout", "default"),
    ("nats", "nats"),
    ("kafka", "kafka"),
    ("delta", "delta"),
    ("iceberg", "iceberg"),
    ("clickhouse", "clickhouse"),
    ("generate", "default"),
    ("blackhole", "default"),
];

/// The connector types a job may name, for messages.
pub fn known_types() -> Vec<&'static str> {
    EVERY_TYPE.iter().map(|(name, _)| *name).collect()
}

/// Whether a target of this type writes its events on standard output, so a command prints
/// everything else on standard error.
pub fn prints_events(target_type: &str) -> bool {
    target_type == stdout::CONNECTOR.name
}

/// The connector of a type, when this build has it.
pub fn connector(name: &str) -> Option<&'static Connector> {
    CONNECTORS.iter().copied().find(|connector| connector.name == name)
}

/// Checks a parsed job against the connectors: known types, the fields each takes, required
/// fields, what the mode and write mode ask of their capabilities, and each connector's own
/// options. Returns every problem found.
pub fn validate(job: &JobSpec) -> Vec<SpecError> {
    let mut errors = Vec::new();
    for endpoint in job.source_endpoints().into_iter().chain(job.target_endpoints()) {
        let is_source = endpoint.role == Side::Source;
        let Some(connector) = connector(&endpoint.connector) else {
            let message = match EVERY_TYPE.iter().find(|(name, _)| *name == endpoint.connector) {
                Some((name, feature)) => {
                    format!("connector `{name}` is not in this build; rebuild with `--features {feature}`")
                }
                None => {
                    format!(
                        "unknown connector type `{}`; known types: {}",
                        endpoint.connector,
                        known_types().join(", ")
                    )
                }
            };
            errors.push(endpoint.error("type", message));
            continue;
        };
        let (fields, validate) = match (is_source, &connector.source, &connector.target) {
            (true, Some(side), _) => (side.fields, side.validate),
            (false, _, Some(side)) => (side.fields, side.validate),
            _ => {
                errors.push(endpoint.error("type", format!("`{}` cannot be a {}", connector.name, endpoint.role)));
                continue;
            }
        };
        for (field, line) in &endpoint.present {
            // `cursor` is every cursor source's, and checked with the mode below.
            let allowed = fields.contains(&field.as_str()) || (is_source && field == "cursor");
            if !allowed {
                errors.push(SpecError {
                    path: endpoint.path_of(field),
                    line: *line,
                    message: format!(
                        "unknown field `{field}` for a `{}` {}; expected one of: {}",
                        connector.name,
                        endpoint.role,
                        fields.join(", ")
                    ),
                });
            }
        }
        if endpoint.options.contains_key("tables") && connector.name != generate::connector::CONNECTOR.name {
            errors.push(endpoint.error(
                "tables",
                "expected a list of table names or globs; tables declared with their columns are the `generate` source's",
            ));
        }
        if fields.contains(&"path") && endpoint.path.is_none() {
            errors.push(endpoint.error(
                "path",
                match connector.name {
                    "sqlite" => "missing required field `path` (the sqlite database file)".to_owned(),
                    "directory" => "missing required field `path` (the directory files arrive in)".to_owned(),
                    name => format!("missing required field `path` (the {name} directory)"),
                },
            ));
        }
        if fields.contains(&"url") && endpoint.url.is_none() {
            errors.push(endpoint.error(
                "url",
                format!(
                    "missing required field `url` (e.g. {}://user:${{PASSWORD}}@host:port)",
                    // ClickHouse is reached over its HTTP interface.
                    if connector.name == "clickhouse" { "http" } else { connector.name }
                ),
            ));
        }
        let capabilities = &connector.capabilities;
        if is_source && job.mode.streams() && !capabilities.change_source {
            errors.push(SpecError {
                path: "mode".into(),
                line: None,
                message: format!(
                    "mode {} needs a source with a change log; a `{}` source supports snapshot only",
                    job.mode, connector.name
                ),
            });
        }
        if is_source && job.mode != Mode::Cdc && !capabilities.snapshot_source {
            errors.push(SpecError {
                path: "mode".into(),
                line: None,
                message: format!(
                    "mode {} copies tables, and a `{}` source has no snapshot: use mode: cdc",
                    job.mode, connector.name
                ),
            });
        }
        if !is_source && job.mode.streams() && !(capabilities.change_sink || capabilities.event_sink) {
            let able: Vec<&str> = CONNECTORS
                .iter()
                .filter(|other| {
                    other.target.is_some() && (other.capabilities.change_sink || other.capabilities.event_sink)
                })
                .map(|other| other.name)
                .collect();
            errors.push(SpecError {
                path: "mode".into(),
                line: None,
                message: format!(
                    "mode {} needs a target that applies changes ({}); a `{}` target takes snapshots only",
                    job.mode,
                    able.join(", "),
                    connector.name
                ),
            });
        }
        let incremental = job.mode == Mode::IncrementalCursor;
        if is_source && incremental && !capabilities.cursor_source {
            let able: Vec<&str> =
                CONNECTORS.iter().filter(|other| other.capabilities.cursor_source).map(|other| other.name).collect();
            errors.push(SpecError {
                path: "mode".into(),
                line: None,
                message: format!(
                    "mode incremental-cursor reads tables by a cursor column ({}); a `{}` source cannot",
                    able.join(", "),
                    connector.name
                ),
            });
        }
        if !is_source && incremental && !capabilities.upsert {
            errors.push(endpoint.error(
                "type",
                format!(
                    "mode incremental-cursor upserts changed rows by key; a `{}` target only appends",
                    connector.name
                ),
            ));
        } else if !is_source && endpoint.write_mode == WriteMode::Upsert && !capabilities.upsert {
            errors.push(endpoint.error(
                "write_mode",
                format!("a `{}` target appends; it supports write_mode: insert only", connector.name),
            ));
        }
        errors.extend(validate(job, endpoint));
    }
    errors.extend(two_way_problems(job));
    errors.extend(lane_problems(job));
    errors.extend(fan_in_problems(job));
    errors
}

/// The targets several sources may write into at once (`sources:`): they create and alter
/// shared tables safely from several jobs, and their tables take a key with the origin column.
const FAN_IN_TARGETS: &[&str] = &["mysql", "postgres"];

/// `sources:` needs a target several jobs write into at once.
fn fan_in_problems(job: &JobSpec) -> Vec<SpecError> {
    if job.sources.is_empty() || FAN_IN_TARGETS.contains(&job.target.connector.as_str()) {
        return Vec::new();
    }
    vec![job.target.error(
        "type",
        format!(
            "several sources merge into a {} target; a `{}` target takes one source (write one job per source)",
            FAN_IN_TARGETS.join(" or "),
            job.target.connector
        ),
    )]
}

/// The targets whose stream writer applies on several connections (`apply_parallelism`).
const LANE_TARGETS: &[&str] = &["mysql", "postgres"];

/// `apply_parallelism` above 1 needs a target that writes one stream on several connections.
fn lane_problems(job: &JobSpec) -> Vec<SpecError> {
    let Some(lanes) = job.apply_parallelism.filter(|lanes| *lanes > 1) else { return Vec::new() };
    job.target_endpoints()
        .into_iter()
        .filter(|target| !LANE_TARGETS.contains(&target.connector.as_str()))
        .map(|target| SpecError {
            path: "apply_parallelism".into(),
            line: None,
            message: format!(
                "apply_parallelism: {lanes} needs a target that applies on several connections ({}); {} is a `{}` target, which applies on one (leave the field out)",
                LANE_TARGETS.join(", "),
                target.at,
                target.connector
            ),
        })
        .collect()
}

/// The targets that read their rows back to judge a change against them (`conflict:`).
const CONFLICT_TARGETS: &[&str] = &["mysql"];

/// `two_way` is for a MySQL source and target (the source's binlog shows which transactions
/// Sluice wrote); `conflict` needs a target that reads its rows back.
fn two_way_problems(job: &JobSpec) -> Vec<SpecError> {
    let mut errors = Vec::new();
    if job.two_way && !job.part_names().is_empty() {
        errors.push(SpecError {
            path: "two_way".into(),
            line: None,
            message: "a two-way pair is two jobs of one source and one target each; this job names several".into(),
        });
    }
    if job.two_way {
        for endpoint in [&job.source, &job.target] {
            if endpoint.connector != "mysql" {
                errors.push(SpecError {
                    path: "two_way".into(),
                    line: None,
                    message: format!(
                        "a two-way pair runs between MySQL or MariaDB servers; {}.type is `{}`",
                        endpoint.role, endpoint.connector
                    ),
                });
            }
        }
    }
    let unable =
        job.target_endpoints().into_iter().filter(|target| !CONFLICT_TARGETS.contains(&target.connector.as_str()));
    for target in unable.filter(|_| job.conflict.is_some() && !job.two_way) {
        errors.push(SpecError {
            path: "conflict".into(),
            line: None,
            message: format!(
                "a conflict policy reads the target's rows back ({} targets); {} is a `{}` target",
                CONFLICT_TARGETS.join(", "),
                target.at,
                target.connector
            ),
        });
    }
    errors
}

/// A job's connector options turned into an error at build time (validation reports them first).
pub(crate) fn invalid(errors: Vec<SpecError>) -> Error {
    let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
    Error::config(listed.join("; "))
}

/// Builds the source of a validated job.
pub fn source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    match connector(&job.source.connector).and_then(|connector| connector.source.as_ref()) {
        Some(side) => (side.build)(job),
        None => Err(Error::config(format!(
            "source.type: `{}` is not available as a source in this build",
            job.source.connector
        ))),
    }
}

/// A reader of the job's target table `table` (as the job's mapping makes it), for `sluice
/// verify`: the target's own engine as a source whose tables are exactly that one, on the
/// target's connection (URL, TLS, path); for file targets of Arrow types (Parquet, Delta), their
/// files read by the mapped schema. Targets that cannot be read back (streams) are a
/// configuration error that names those that can.
pub fn read_back(job: &JobSpec, table: &Arc<TableSchema>) -> Result<Arc<dyn Source>> {
    let target = &job.target;
    let found = connector(&target.connector);
    if let Some(read_back) = found.and_then(|connector| connector.target.as_ref()?.read_back) {
        return read_back(job, table).map_err(|error| error.on(Side::Target));
    }
    let side = found
        .filter(|connector| connector.capabilities.snapshot_source)
        .and_then(|connector| connector.source.as_ref());
    let Some(side) = side else {
        let readable: Vec<&str> = CONNECTORS
            .iter()
            .filter(|connector| {
                connector.target.as_ref().is_some_and(|target| {
                    target.read_back.is_some() || connector.capabilities.snapshot_source && connector.source.is_some()
                })
            })
            .map(|connector| connector.name)
            .collect();
        return Err(Error::config(format!(
            "target.type: a `{}` target cannot be read back to verify it yet; verify reads {} targets",
            target.connector,
            readable.join(", ")
        ))
        .on(Side::Target));
    };
    let mut reading = job.clone();
    reading.mode = Mode::Snapshot;
    reading.source = EndpointSpec { tables: vec![table.name.to_string()], cursor: None, ..target.clone() };
    (side.build)(&reading).map_err(|error| error.on(Side::Target))
}

/// Every secret a job document (parsed with its `${VARIABLE}`s left as written) writes out: a
/// connector's secret options and the transform rules' salts. A server keeps documents at rest,
/// so it refuses these; `sluice run` reads the user's own file and takes them.
pub fn written_out_secrets(written: &JobSpec) -> Vec<SpecError> {
    let message = |field: &str| {
        format!(
            "`{field}` is a secret, which the server would keep at rest: write it as ${{VARIABLE}} (a variable the \
             server lets documents read, or a file of its --secrets-dir)"
        )
    };
    let mut errors = Vec::new();
    for endpoint in std::iter::once(&written.source).chain(written.target_endpoints()) {
        // A URL inside an option (an Iceberg catalog's `uri`) with a password written out.
        for (field, node) in &endpoint.options {
            let NodeKind::Mapping(entries) = &node.kind else { continue };
            for (key, value) in entries.iter().filter(|(key, _)| key == "uri" || key == "url") {
                if let NodeKind::Scalar { text, .. } = &value.kind {
                    if sluice_core::secret::has_literal_password(text) {
                        let path = format!("{field}.{key}");
                        errors.push(endpoint.error(&path, message(&path)));
                    }
                }
            }
        }
        let Some(connector) = connector(&endpoint.connector) else { continue };
        for field in connector.secrets {
            let written_out = match endpoint.options.get(*field).map(|node| &node.kind) {
                Some(NodeKind::Scalar { text, .. }) => !sluice_core::spec::is_placeholder(text),
                Some(_) => true,
                None => false,
            };
            if written_out {
                errors.push(endpoint.error(field, message(field)));
            }
        }
    }
    for rule in &written.transforms {
        if rule.salt.as_ref().is_some_and(|salt| !sluice_core::spec::is_placeholder(salt.expose())) {
            errors.push(SpecError { path: format!("{}.salt", rule.path), line: rule.line, message: message("salt") });
        }
    }
    errors
}

/// Builds the sink of a validated job.
pub fn sink(job: &JobSpec) -> Result<Arc<dyn Sink>> {
    build_sink(job, None)
}

/// Builds the sink of a cluster task: every checkpoint commit checks `fence` in the target, so
/// a worker whose task moved cannot commit. Only connectors with the `fencing` capability can.
pub fn fenced_sink(job: &JobSpec, fence: Fence) -> Result<Arc<dyn Sink>> {
    build_sink(job, Some(fence))
}

/// Whether jobs into this target type can run on a cluster (their commits can be fenced).
pub fn fences(target_type: &str) -> bool {
    connector(target_type).is_some_and(|connector| connector.capabilities.fencing)
}

/// The target types of this build that can run on a cluster, for messages: `a, b or c`.
pub fn fencing_targets() -> String {
    let able: Vec<&str> = CONNECTORS
        .iter()
        .filter(|connector| connector.capabilities.fencing && connector.target.is_some())
        .map(|connector| connector.name)
        .collect();
    match able.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "none".to_owned(),
    }
}

fn build_sink(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let endpoint = &job.target;
    let Some((connector, side)) =
        connector(&endpoint.connector).and_then(|connector| Some((connector, connector.target.as_ref()?)))
    else {
        return Err(Error::config(format!(
            "target.type: `{}` is not available as a target in this build",
            endpoint.connector
        )));
    };
    if fence.is_some() && !connector.capabilities.fencing {
        return Err(Error::config(format!(
            "target.type: `{}` cannot run on a cluster: its writes cannot be fenced against a worker whose task moved; use a {} target, or run the job standalone (sluice run)",
            endpoint.connector,
            fencing_targets()
        )));
    }
    (side.build)(job, fence)
}

/// A whole number of at least `least` (0 allowed when `least` is 0), `default` when the field is
/// absent, or the error naming the field.
#[allow(dead_code)]
pub(crate) fn whole_number(
    endpoint: &EndpointSpec,
    field: &str,
    default: u64,
    least: u64,
) -> std::result::Result<u64, SpecError> {
    match endpoint.options.get(field).map(|node| &node.kind) {
        None => Ok(default),
        Some(NodeKind::Scalar { text, quoted: false }) => match text.replace('_', "").parse::<u64>() {
            Ok(value) if value >= least => Ok(value),
            _ => Err(endpoint.error(field, format!("expected a whole number of at least {least}, found `{text}`"))),
        },
        Some(_) => Err(endpoint.error(field, format!("expected a whole number of at least {least}"))),
    }
}

/// `namespace:` puts every table into one target database (MySQL) or schema (PostgreSQL)
/// instead of the source's own.
#[allow(dead_code)]
pub(crate) fn namespace(endpoint: &EndpointSpec) -> Option<String> {
    match endpoint.options.get("namespace").map(|node| &node.kind) {
        Some(NodeKind::Scalar { text, .. }) => Some(text.clone()),
        _ => None,
    }
}

#[allow(dead_code)]
pub(crate) fn url(endpoint: &EndpointSpec) -> Result<&sluice_core::secret::Secret> {
    endpoint.url.as_ref().ok_or_else(|| Error::config(format!("{}.url: missing", endpoint.role)))
}

#[allow(dead_code)]
pub(crate) fn path(endpoint: &EndpointSpec) -> Result<PathBuf> {
    endpoint.path.as_ref().map(PathBuf::from).ok_or_else(|| Error::config(format!("{}.path: missing", endpoint.role)))
}

#[cfg(test)]
mod tests {
    use sluice_core::spec::parse_job;

    #[test]
    fn a_password_written_out_in_a_nested_uri_is_a_secret_a_server_refuses() {
        let written = |uri: &str| {
            let text = format!(
                "name: s\nsource: {{type: mysql, url: \"mysql://a\"}}\ntarget: {{type: iceberg, catalog: {{type: sql, uri: \"{uri}\"}}, warehouse: w}}\n"
            );
            let job = parse_job(&text, false, |name| Some(format!("${{{name}}}"))).expect("a valid job file");
            super::written_out_secrets(&job).iter().map(ToString::to_string).collect::<Vec<String>>()
        };
        let found = written("postgresql://iceberg:hunter22@h/db");
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("target.catalog.uri"), "{found:?}");
        assert!(!found[0].contains("hunter22"), "{found:?}");
        assert!(written("postgresql://iceberg:${PW}@h/db").is_empty());
        assert!(written("sqlite:////data/catalog.db").is_empty());
    }

    #[test]
    fn apply_parallelism_above_one_needs_a_target_that_writes_on_several_connections() {
        let job = |target: &str| {
            let text = format!(
                "name: s\nmode: cdc\napply_parallelism: 3\nsource: {{type: mysql, url: \"mysql://a\"}}\ntarget: {target}\n"
            );
            let job = parse_job(&text, false, |_| None).expect("a valid job file");
            super::validate(&job).iter().map(ToString::to_string).collect::<Vec<String>>()
        };
        let errors = job("{type: sqlite, path: out.db}");
        assert!(
            errors
                .iter()
                .any(|error| error.contains("apply_parallelism: 3 needs a target that applies on several connections")
                    && error.contains("`sqlite` target")),
            "{errors:?}"
        );
        for target in ["{type: postgres, url: \"postgres://b\"}", "{type: mysql, url: \"mysql://b\"}"] {
            let errors = job(target);
            assert!(!errors.iter().any(|error| error.contains("apply_parallelism")), "{target}: {errors:?}");
        }
    }
}
