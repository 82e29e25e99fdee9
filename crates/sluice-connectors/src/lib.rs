//! Sluice's connectors, one module per external system, each behind a cargo feature, and the
//! registry: the one place that maps a job's `type` to a connector.

#[cfg(feature = "file")]
pub mod file;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "parquet")]
pub mod parquet;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod tls;

use std::path::PathBuf;
use std::sync::Arc;

use sluice_core::connector::{Fence, Sink, Source};
use sluice_core::filter::TableFilter;
use sluice_core::spec::{EndpointSpec, JobSpec, Mode, NodeKind, SpecError, WriteMode};
use sluice_core::{Error, Result};

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

/// A connector type a job may name, what it can be, and the fields it takes on each side.
struct Connector {
    name: &'static str,
    source_fields: Option<&'static [&'static str]>,
    target_fields: Option<&'static [&'static str]>,
    /// Whether the source can follow a change log (cdc, snapshot+cdc).
    change_capture: bool,
    /// Whether the target can replace rows by primary key.
    upsert: bool,
    /// Whether the target applies a change stream (updates and deletes, transactionally).
    change_apply: bool,
    /// Whether this build has it.
    built: bool,
}

const FILE_SOURCE: &[&str] = &["type", "path", "tables", "delimiter"];
const FILE_TARGET: &[&str] = &["type", "path", "write_mode", "create_tables", "delimiter"];
const PARQUET_TARGET: &[&str] = &["type", "path", "write_mode", "create_tables"];
const SQLITE_SOURCE: &[&str] = &["type", "path", "tables"];
const SQLITE_TARGET: &[&str] = &["type", "path", "write_mode", "create_tables"];
const MYSQL_SOURCE: &[&str] = &["type", "url", "tables", "start_position", "server_id", "read_timeout_secs"];
/// How long a snapshot read waits for the MySQL source's next bytes by default: far longer
/// than a primary-key range read is ever silent, far shorter than forever.
const MYSQL_READ_TIMEOUT_SECS: u64 = 120;
const SERVER_TARGET: &[&str] = &["type", "url", "write_mode", "create_tables", "namespace"];

const CONNECTORS: &[Connector] = &[
    Connector {
        name: "sqlite",
        source_fields: Some(SQLITE_SOURCE),
        target_fields: Some(SQLITE_TARGET),
        change_capture: false,
        upsert: true,
        change_apply: false,
        built: cfg!(feature = "sqlite"),
    },
    Connector {
        name: "mysql",
        source_fields: Some(MYSQL_SOURCE),
        target_fields: Some(SERVER_TARGET),
        change_capture: true,
        upsert: true,
        change_apply: true,
        built: cfg!(feature = "mysql"),
    },
    Connector {
        name: "postgres",
        source_fields: None,
        target_fields: Some(SERVER_TARGET),
        change_capture: false,
        upsert: true,
        change_apply: true,
        built: cfg!(feature = "postgres"),
    },
    Connector {
        name: "csv",
        source_fields: Some(FILE_SOURCE),
        target_fields: Some(FILE_TARGET),
        change_capture: false,
        upsert: false,
        change_apply: false,
        built: cfg!(feature = "file"),
    },
    Connector {
        name: "parquet",
        source_fields: None,
        target_fields: Some(PARQUET_TARGET),
        change_capture: false,
        upsert: false,
        change_apply: false,
        built: cfg!(feature = "parquet"),
    },
    Connector {
        name: "jsonl",
        source_fields: Some(FILE_SOURCE),
        target_fields: Some(FILE_TARGET),
        change_capture: false,
        upsert: false,
        change_apply: false,
        built: cfg!(feature = "file"),
    },
];

/// The connector types this build knows, for messages.
pub fn known_types() -> Vec<&'static str> {
    CONNECTORS.iter().map(|connector| connector.name).collect()
}

/// Checks a parsed job against the connectors: known types, the fields each takes, required
/// fields, and what the mode and write mode ask of them. Returns every problem found.
pub fn validate(job: &JobSpec) -> Vec<SpecError> {
    let mut errors = Vec::new();
    for endpoint in [&job.source, &job.target] {
        let is_source = endpoint.role == "source";
        let Some(connector) = CONNECTORS.iter().find(|connector| connector.name == endpoint.connector) else {
            errors.push(endpoint.error(
                "type",
                format!("unknown connector type `{}`; known types: {}", endpoint.connector, known_types().join(", ")),
            ));
            continue;
        };
        let fields = if is_source { connector.source_fields } else { connector.target_fields };
        let Some(fields) = fields else {
            errors.push(endpoint.error("type", format!("`{}` cannot be a {}", connector.name, endpoint.role)));
            continue;
        };
        if !connector.built {
            errors.push(endpoint.error(
                "type",
                format!(
                    "connector `{}` is not in this build; rebuild with `--features {}`",
                    connector.name, connector.name
                ),
            ));
        }
        for (field, line) in &endpoint.present {
            if !fields.contains(&field.as_str()) {
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
        if fields.contains(&"path") && endpoint.path.is_none() {
            errors.push(endpoint.error(
                "path",
                format!(
                    "missing required field `path` (the {} {})",
                    connector.name,
                    if connector.name == "sqlite" { "database file" } else { "directory" }
                ),
            ));
        }
        if fields.contains(&"url") && endpoint.url.is_none() {
            errors.push(endpoint.error(
                "url",
                format!("missing required field `url` (e.g. {}://user:${{PASSWORD}}@host:port)", connector.name),
            ));
        }
        if is_source && job.mode != Mode::Snapshot && !connector.change_capture {
            errors.push(SpecError {
                path: "mode".into(),
                line: None,
                message: format!(
                    "mode {} needs a source with a change log; a `{}` source supports snapshot only",
                    job.mode, connector.name
                ),
            });
        }
        if !is_source && job.mode != Mode::Snapshot && !connector.change_apply {
            errors.push(SpecError {
                path: "mode".into(),
                line: None,
                message: format!(
                    "mode {} needs a target that applies updates and deletes in transactions (mysql, postgres); a `{}` target takes snapshots only",
                    job.mode, connector.name
                ),
            });
        }
        if let Some(node) = endpoint.options.get("start_position") {
            if let Err(message) = start_position(node) {
                errors.push(endpoint.error("start_position", message));
            } else if job.mode != Mode::Cdc {
                errors.push(endpoint.error(
                    "start_position",
                    "only a cdc job starts from a given position; snapshot+cdc starts where its snapshot was taken",
                ));
            }
        }
        if let Some(node) = endpoint.options.get("server_id") {
            if server_id(node).is_none() {
                errors.push(endpoint.error(
                    "server_id",
                    "expected a replica server id from 1 to 4294967295, unique among the source's replicas",
                ));
            }
        }
        if let Some(url) = &endpoint.url {
            let parameters = match connector.name {
                #[cfg(feature = "mysql")]
                "mysql" => Some(&mysql::TLS_PARAMETERS),
                #[cfg(feature = "postgres")]
                "postgres" => Some(&postgres::TLS_PARAMETERS),
                _ => None,
            };
            for problem in parameters.map(|parameters| parameters.problems(url.expose())).unwrap_or_default() {
                errors.push(endpoint.error("url", problem));
            }
        }
        if let Some(node) = endpoint.options.get("read_timeout_secs") {
            if read_timeout_secs(node).is_none() {
                errors.push(endpoint.error("read_timeout_secs", "expected a whole number of seconds from 1 to 86400"));
            }
        }
        if !is_source && endpoint.write_mode == WriteMode::Upsert && !connector.upsert {
            errors.push(endpoint.error(
                "write_mode",
                format!("a `{}` target appends; it supports write_mode: insert only", connector.name),
            ));
        }
        if let Some(node) = endpoint.options.get("delimiter") {
            let valid =
                matches!(&node.kind, NodeKind::Scalar { text, .. } if text.len() == 1 && text != "\"" && text != "\n");
            if !valid {
                errors.push(
                    endpoint.error("delimiter", "expected one ASCII character other than a quote or a line break"),
                );
            }
        }
    }
    errors
}

/// `start_position: {file: mysql-bin.000003, position: 4}` as a source position.
fn start_position(node: &sluice_core::spec::Node) -> std::result::Result<sluice_core::Position, String> {
    let expected = "expected a mapping {file: <binlog file>, position: <offset>}";
    let NodeKind::Mapping(entries) = &node.kind else { return Err(expected.to_owned()) };
    let mut file = None;
    let mut offset = None;
    for (key, value) in entries {
        let NodeKind::Scalar { text, .. } = &value.kind else { return Err(expected.to_owned()) };
        match key.as_str() {
            "file" => file = Some(text.clone()),
            "position" => {
                offset = Some(text.parse::<u64>().map_err(|_| format!("position `{text}` is not an offset"))?)
            }
            "gtid" => {}
            other => return Err(format!("unknown field `{other}`; {expected}")),
        }
    }
    match (file, offset) {
        (Some(file), Some(offset)) => {
            Ok(sluice_core::Position(serde_json::json!({"file": file, "position": offset, "gtid": ""})))
        }
        _ => Err(expected.to_owned()),
    }
}

fn server_id(node: &sluice_core::spec::Node) -> Option<u32> {
    match &node.kind {
        NodeKind::Scalar { text, .. } => text.parse::<u32>().ok().filter(|id| *id > 0),
        _ => None,
    }
}

fn read_timeout_secs(node: &sluice_core::spec::Node) -> Option<u64> {
    match &node.kind {
        NodeKind::Scalar { text, .. } => text.parse::<u64>().ok().filter(|secs| (1..=86_400).contains(secs)),
        _ => None,
    }
}

/// Builds the source of a validated job.
pub fn source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    let endpoint = &job.source;
    let filter = TableFilter::new(&endpoint.tables);
    match endpoint.connector.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(sqlite::SqliteSource::new(path(endpoint)?, filter))),
        #[cfg(feature = "file")]
        "csv" | "jsonl" => Ok(Arc::new(file::FileSource::new(path(endpoint)?, file_format(endpoint), filter))),
        #[cfg(feature = "mysql")]
        "mysql" => Ok(Arc::new(mysql::MysqlSource::new(
            url(endpoint)?,
            endpoint.display_url(),
            filter,
            job.mode,
            job.parallelism,
            mysql::StreamOptions {
                start_position: endpoint
                    .options
                    .get("start_position")
                    .map(start_position)
                    .transpose()
                    .map_err(Error::config)?,
                server_id: endpoint
                    .options
                    .get("server_id")
                    .and_then(server_id)
                    .unwrap_or_else(|| mysql::default_server_id(&job.name)),
                batch_rows: job.limits.batch_rows,
            },
            std::time::Duration::from_secs(
                endpoint
                    .options
                    .get("read_timeout_secs")
                    .and_then(read_timeout_secs)
                    .unwrap_or(MYSQL_READ_TIMEOUT_SECS),
            ),
        )?)),
        other => Err(Error::config(format!("source.type: `{other}` is not available as a source in this build"))),
    }
}

/// Builds the sink of a validated job.
pub fn sink(job: &JobSpec) -> Result<Arc<dyn Sink>> {
    build_sink(job, None)
}

/// Builds the sink of a cluster task: every checkpoint commit checks `fence` in the target, so
/// a worker whose task moved cannot commit. Only transactional targets can hold a fence.
pub fn fenced_sink(job: &JobSpec, fence: Fence) -> Result<Arc<dyn Sink>> {
    build_sink(job, Some(fence))
}

/// Whether jobs into this target type can run on a cluster (their commits can be fenced).
pub fn fences(target_type: &str) -> bool {
    matches!(target_type, "mysql" | "postgres")
}

fn build_sink(job: &JobSpec, fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let endpoint = &job.target;
    if fence.is_some() && !fences(&endpoint.connector) {
        return Err(Error::config(format!(
            "target.type: `{}` cannot run on a cluster: its writes cannot be fenced against a worker whose task moved; use a mysql or postgres target, or run the job standalone (sluice run)",
            endpoint.connector
        )));
    }
    match endpoint.connector.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(Arc::new(sqlite::SqliteSink::new(path(endpoint)?, endpoint.write_mode, endpoint.create_tables))),
        #[cfg(feature = "file")]
        "csv" | "jsonl" => Ok(Arc::new(file::FileSink::new(path(endpoint)?, file_format(endpoint)))),
        #[cfg(feature = "parquet")]
        "parquet" => Ok(Arc::new(parquet::ParquetSink::new(path(endpoint)?))),
        #[cfg(feature = "mysql")]
        "mysql" => Ok(Arc::new(
            mysql::MysqlSink::new(
                url(endpoint)?,
                endpoint.display_url(),
                endpoint.write_mode,
                endpoint.create_tables,
                namespace(endpoint),
                job.parallelism,
            )
            .map(|sink| sink.fenced_if(fence))?,
        )),
        #[cfg(feature = "postgres")]
        "postgres" => Ok(Arc::new(
            postgres::PostgresSink::new(
                url(endpoint)?.clone(),
                endpoint.display_url(),
                endpoint.write_mode,
                endpoint.create_tables,
                namespace(endpoint),
            )
            .fenced_if(fence),
        )),
        other => Err(Error::config(format!("target.type: `{other}` is not available as a target in this build"))),
    }
}

/// `namespace:` puts every table into one target database (MySQL) or schema (PostgreSQL)
/// instead of the source's own.
#[allow(dead_code)]
fn namespace(endpoint: &EndpointSpec) -> Option<String> {
    match endpoint.options.get("namespace").map(|node| &node.kind) {
        Some(NodeKind::Scalar { text, .. }) => Some(text.clone()),
        _ => None,
    }
}

#[allow(dead_code)]
fn url(endpoint: &EndpointSpec) -> Result<&sluice_core::secret::Secret> {
    endpoint.url.as_ref().ok_or_else(|| Error::config(format!("{}.url: missing", endpoint.role)))
}

#[allow(dead_code)]
fn path(endpoint: &EndpointSpec) -> Result<PathBuf> {
    endpoint.path.as_ref().map(PathBuf::from).ok_or_else(|| Error::config(format!("{}.path: missing", endpoint.role)))
}

#[cfg(feature = "file")]
fn file_format(endpoint: &EndpointSpec) -> file::Format {
    match endpoint.connector.as_str() {
        "csv" => {
            let delimiter = match endpoint.options.get("delimiter").map(|node| &node.kind) {
                Some(NodeKind::Scalar { text, .. }) => text.as_bytes().first().copied().unwrap_or(b','),
                _ => b',',
            };
            file::Format::Csv { delimiter }
        }
        _ => file::Format::Jsonl,
    }
}
