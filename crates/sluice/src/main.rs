//! The `sluice` binary: the command line, and the wiring of a standalone run.

/// `println!` that writes nothing more, instead of panicking, once standard output is closed
/// (`sluice job list | head -1`): the command still finishes its work and exits with its code.
#[macro_export]
macro_rules! out {
    ($($argument:tt)*) => {{
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, $($argument)*).and_then(|()| stdout.flush());
    }};
}

mod alarms;
mod api;
mod client;
mod cluster;
mod document_rules;
mod job_command;
mod job_text;
mod job_verification;
mod logger;
mod private_files;
mod progress;
mod server;
mod state_store;
mod verify_command;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sluice_core::connector::CheckItem;
use sluice_core::runner::Runner;
use sluice_core::shared_log::SharedLog;
use sluice_core::spec::{EndpointSpec, JobSpec};
use sluice_core::stats::{RunStatus, RunSummary};
use sluice_core::{Error, ErrorKind, Side, TableSchema};
use tokio::sync::watch;

use crate::state_store::SqliteStateStore;

/// Rows are many small allocations freed on other threads; mimalloc handles that pattern with a
/// fraction of glibc's cost (measured in BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sluice moves data between databases and files: a full copy (snapshot), the
/// changes from the source's log (cdc), or both with a seamless switch (snapshot+cdc), with no
/// loss, no disorder and no duplication across crashes and restarts.
///
/// Run a job from a YAML file on this machine (`sluice run job.yaml`), or start a server
/// (`sluice server`, a cluster with --etcd) and drive it with `sluice job`.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one job standalone; running it again resumes where it stopped.
    Run {
        /// The job file (YAML, or JSON when it ends in .json).
        job: PathBuf,
        /// Where checkpoints, the plan, dirty records and run history are kept.
        #[arg(long, default_value = ".sluice")]
        state_dir: PathBuf,
        /// Also write the run summary as JSON to this file.
        #[arg(long)]
        summary_json: Option<PathBuf>,
        /// Run the job from scratch: empty the target tables it copies into, forget its
        /// checkpoints (in the target and the state directory) and plan it again.
        #[arg(long)]
        restart: bool,
    },
    /// Forget a job's progress so its next run starts from scratch: empty the target tables it
    /// copies into, forget its checkpoints in the target and its plan in the state directory.
    Reset {
        /// The job file.
        job: PathBuf,
        /// The state directory of the job's runs.
        #[arg(long, default_value = ".sluice")]
        state_dir: PathBuf,
    },
    /// Write a standalone job's dirty records again after a fix: each row is read again from the
    /// source (a copied row from its split, a change the stream left out by its key, as the source
    /// has it now) and written by key with the job as it is now; the records written are
    /// forgotten, those refused again keep their new reason. Exit code 1 while some stay.
    Replay {
        /// The job file.
        job: PathBuf,
        /// The state directory of the job's runs, which keeps its dirty records.
        #[arg(long, default_value = ".sluice")]
        state_dir: PathBuf,
    },
    /// Compare the job's target with its source through the job's mapping (routes, projections,
    /// filters, masks, types) and name every missing, extra or different row by its key. While
    /// the job streams, differences are checked again once the stream has caught up. Exit code 0
    /// when they agree, 1 when something differs, 2 for a bad command line, 3 when it cannot
    /// compare.
    Verify(verify_command::VerifyArguments),
    /// Preflight: validate the job file, reach the source and the target, check their settings.
    Check {
        /// The job file.
        job: PathBuf,
    },
    /// Print the target DDL derived from the source schema; with --apply, create what is missing.
    Schema {
        /// The job file.
        job: PathBuf,
        /// Create the missing schemas and tables in the target.
        #[arg(long)]
        apply: bool,
    },
    /// Print a job's change events from now on as JSON lines on stdout (the job's source, its
    /// target replaced by `stdout`, mode cdc, nothing kept): Maxwell's stdout producer.
    Tail {
        /// The job file whose source to follow, or the name of a job on the server (--server),
        /// whose current version is followed; its `${VAR}`s come from this environment.
        job: String,
        /// maxwell, debezium or debezium-schema.
        #[arg(long, default_value = "maxwell")]
        format: String,
        /// Start after this source position instead of now, as `source.start_position` takes it
        /// (e.g. '{file: mysql-bin.000003, position: 4}').
        #[arg(long)]
        from: Option<String>,
        #[command(flatten)]
        connection: ConnectionArguments,
    },
    /// Run a server node: the HTTP API, a worker and a leader candidate. With --etcd, nodes form
    /// a cluster; without it, one node runs on embedded state.
    Server(Box<ServerArguments>),
    /// Manage the jobs of a server: submit, list, show, stop, start, update, roll back, delete;
    /// their dirty records and alarms.
    Job {
        #[command(flatten)]
        connection: ConnectionArguments,
        /// Print the API's JSON answer instead of tables.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        action: job_command::JobAction,
    },
    /// The server's audit trail, newest first (as `sluice job audit`).
    Audit {
        #[command(flatten)]
        connection: ConnectionArguments,
        /// Print the API's JSON answer instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        filter: job_command::AuditFilter,
    },
}

#[derive(Debug, clap::Args)]
struct ServerArguments {
    /// etcd members, comma separated (http://host:port or https://host:port, …).
    #[arg(long)]
    etcd: Option<String>,
    /// The CA certificate (PEM) that signed the etcd members' certificates.
    #[arg(long, requires = "etcd")]
    etcd_ca: Option<PathBuf>,
    /// A client certificate (PEM) for etcd members that require one; with --etcd-key.
    #[arg(long, requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// An etcd user (its password in SLUICE_ETCD_PASSWORD).
    #[arg(long, requires = "etcd")]
    etcd_user: Option<String>,
    /// Where the API listens.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: std::net::SocketAddr,
    /// Serve the API over HTTPS with this certificate chain (PEM); with --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The API's open connections at most; more wait to be accepted until one closes.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Seconds a connection may take to send a request's head, or stay idle between requests,
    /// before the API closes it (a TLS handshake has 10 s).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout_secs: u64,
    /// This node's worker id, stable across restarts (default: host name and port).
    #[arg(long)]
    node_id: Option<String>,
    /// The node's own state (and, without --etcd, the jobs).
    #[arg(long, default_value = ".sluice-server")]
    state_dir: PathBuf,
    /// How many tasks this node runs at once.
    #[arg(long, default_value_t = 4)]
    capacity: usize,
    /// This node's share of the work against nodes of the same capacity (2 for a machine
    /// twice as big).
    #[arg(long, default_value_t = 1.0)]
    weight: f64,
    /// The zone this node is in (a data centre, a region): jobs with `placement: {zone: …}` run
    /// their tasks only on nodes of that zone.
    #[arg(long)]
    zone: Option<String>,
    /// A label of this node, NAME=VALUE (repeatable): jobs with `placement: {labels: …}` run their
    /// tasks only on nodes carrying every label they name.
    #[arg(long = "label", value_name = "NAME=VALUE")]
    labels: Vec<String>,
    /// Seconds a node may stay silent before its tasks move to other nodes (renewed every
    /// 0.55 of it: under one request a second at the default).
    #[arg(long, default_value_t = 2)]
    lease_secs: u64,
    /// A file of `admin TOKEN` / `read TOKEN` lines (besides SLUICE_ADMIN_TOKEN, SLUICE_READ_TOKEN).
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// Serve /metrics without a token even when tokens are set (for a scraper on a trusted
    /// network).
    #[arg(long)]
    open_metrics: bool,
    /// Global alarm rules (YAML or JSON, as a job's `alarms:`), evaluated for every job; they
    /// replace the cluster's global rules when this node starts (also `PUT /api/v1/alarms`).
    #[arg(long, value_name = "FILE")]
    alarms: Option<PathBuf>,
    /// The `${NAME}`s of submitted jobs and alarm rules read only environment variables whose
    /// name starts with this (an empty prefix: every variable), or files of --secrets-dir.
    #[arg(long, default_value = job_text::DEFAULT_PREFIX)]
    env_prefix: String,
    /// A directory of secrets, one file per name (as orchestrators mount them): `${NAME}` in a
    /// job reads the file NAME first, whatever its prefix.
    #[arg(long, value_name = "DIRECTORY")]
    secrets_dir: Option<PathBuf>,
    /// Every path a submitted job names (files, SQLite, directories, Parquet, Delta) resolves
    /// inside this directory, symbolic links followed (default: the state directory's data/).
    #[arg(long, value_name = "DIRECTORY")]
    data_root: Option<PathBuf>,
}

/// How `sluice job` reaches a server; accepted anywhere on the command line.
#[derive(Debug, clap::Args)]
struct ConnectionArguments {
    /// The server's address (http://host:port or https://host:port).
    #[arg(long, global = true, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:7070")]
    server: String,
    /// A bearer token (admin to change things, read to look).
    #[arg(long, global = true, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The CA certificate (PEM) that signed an HTTPS server's certificate.
    #[arg(long, global = true, env = "SLUICE_CA")]
    ca: Option<PathBuf>,
}

impl From<ConnectionArguments> for client::Connection {
    fn from(arguments: ConnectionArguments) -> client::Connection {
        client::Connection { server: arguments.server, token: arguments.token, ca: arguments.ca }
    }
}

fn main() -> ExitCode {
    logger::install();
    // Every TLS configuration of the process (ours and the drivers') uses this provider.
    sluice_connectors::tls::provider();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::from(1);
        }
    };
    let code = runtime.block_on(async {
        match cli.command {
            Command::Run { job, state_dir, summary_json, restart } => run(job, state_dir, summary_json, restart).await,
            Command::Reset { job, state_dir } => reset(job, state_dir).await,
            Command::Replay { job, state_dir } => replay(job, state_dir).await,
            Command::Check { job } => check(job).await,
            Command::Verify(arguments) => verify_command::verify(arguments).await,
            Command::Tail { job, format, from, connection } => {
                let connection = client::Connection::from(connection);
                tail(job, format, from, &connection).await
            }
            Command::Schema { job, apply } => schema(job, apply).await,
            Command::Server(arguments) => server::serve(server_options(*arguments)).await,
            Command::Job { connection, json, action } => {
                let connection = client::Connection::from(connection);
                job_command::run(&connection, json, action).await
            }
            Command::Audit { connection, json, filter } => {
                let connection = client::Connection::from(connection);
                job_command::run(&connection, json, job_command::JobAction::Audit(filter)).await
            }
        }
    });
    ExitCode::from(code)
}

fn server_options(arguments: ServerArguments) -> server::Options {
    let etcd = arguments.etcd.map(|members| cluster::etcd::EtcdOptions {
        members,
        ca: arguments.etcd_ca,
        cert: arguments.etcd_cert,
        key: arguments.etcd_key,
        user: arguments.etcd_user,
        password: std::env::var("SLUICE_ETCD_PASSWORD").ok().map(sluice_core::secret::Secret::new),
    });
    server::Options {
        etcd,
        listen: arguments.listen,
        tls: arguments.tls_cert.zip(arguments.tls_key),
        max_connections: arguments.max_connections as usize,
        header_timeout: std::time::Duration::from_secs(arguments.header_timeout_secs),
        node_id: arguments.node_id,
        state_dir: arguments.state_dir,
        capacity: arguments.capacity,
        weight: arguments.weight,
        zone: arguments.zone,
        labels: arguments.labels,
        lease_secs: arguments.lease_secs,
        tokens_file: arguments.tokens_file,
        open_metrics: arguments.open_metrics,
        alarms: arguments.alarms,
        env_prefix: arguments.env_prefix,
        secrets_dir: arguments.secrets_dir,
        data_root: arguments.data_root,
    }
}

/// Loads and validates a job, printing every error; `None` means exit 2.
pub(crate) fn load(path: &std::path::Path) -> Option<JobSpec> {
    match job_text::load(path) {
        Ok(job) => Some(job),
        Err(errors) => {
            eprintln!("error: invalid job {}:", path.display());
            for error in errors {
                eprintln!("  {error}");
            }
            None
        }
    }
}

fn fail(error: &Error) -> u8 {
    eprintln!("error: {error}");
    error.exit_code() as u8
}

async fn check(path: PathBuf) -> u8 {
    let Some(job) = load(&path) else { return 2 };
    let connectors = |endpoints: Vec<&EndpointSpec>| {
        endpoints.iter().map(|endpoint| endpoint.connector.as_str()).collect::<Vec<_>>().join(" + ")
    };
    out!(
        "ok    job file: {} is valid ({} → {}, {})",
        path.display(),
        connectors(job.source_endpoints()),
        connectors(job.target_endpoints()),
        job.mode
    );
    let part = if job.sources.is_empty() { "target" } else { "source" };
    let mut code = 0;
    for (index, each) in job.parts().into_iter().enumerate() {
        if let Some(name) = job.part_names().get(index) {
            out!("{part} {name}:");
        }
        code = code.max(check_job(each).await);
    }
    code
}

/// `sluice check` of one job of one target.
async fn check_job(job: JobSpec) -> u8 {
    let (source, sink) = match (sluice_connectors::source(&job), sluice_connectors::sink(&job)) {
        (Ok(source), Ok(sink)) => (source, sink),
        (Err(error), _) | (_, Err(error)) => return fail(&error),
    };
    let source_ok = report(source.check().await);
    let sink_ok = report(sink.check().await);
    let transforms = sluice_core::transform::Transforms::of(&job);
    let mut rules_ok = true;
    // A source of several (`sources:`) writes tables the others write too: each needs an origin
    // column where the job needs keys, whatever the routes say.
    if source_ok && (!transforms.is_empty() || job.fan_in.is_some()) {
        // What the routes and transforms make of each table, or every problem they have.
        let mapped = async { transforms.map_all(source.discover().await?, &|name| sink.target_name(name)) }.await;
        match mapped {
            Ok(mappings) => {
                for mapping in mappings.iter().filter(|mapping| !mapping.rules.is_empty()) {
                    let columns: Vec<&str> = mapping.target.columns.iter().map(|column| column.name.as_str()).collect();
                    out!(
                        "ok    {} → {} ({}): {}{}",
                        mapping.source.name,
                        mapping.target.name,
                        mapping.rules.join(", "),
                        columns.join(", "),
                        if mapping.has_filter() { "; filtered" } else { "" }
                    );
                }
            }
            Err(error) => {
                out!("FAIL  transform: {error}");
                rules_ok = false;
            }
        }
    }
    u8::from(!(source_ok && sink_ok && rules_ok))
}

async fn schema(path: PathBuf, apply: bool) -> u8 {
    let Some(job) = load(&path) else { return 2 };
    let mut code = 0;
    for job in job.parts() {
        code = code.max(schema_of(job, apply).await);
    }
    code
}

async fn schema_of(mut job: JobSpec, apply: bool) -> u8 {
    // Applying is an explicit request to create, whatever the job says for runs.
    job.target.create_tables |= apply;
    let result = async {
        let source = sluice_connectors::source(&job)?;
        let sink = sluice_connectors::sink(&job)?;
        let transforms = sluice_core::transform::Transforms::of(&job);
        let mappings = transforms.map_all(source.discover().await?, &|name| sink.target_name(name))?;
        let tables: Vec<TableSchema> = sluice_core::transform::target_tables(&mappings);
        for statement in sink.create_statements(&tables) {
            out!("{statement};");
        }
        if apply {
            sink.prepare(&tables).await?;
            eprintln!("applied: {} tables exist in the target", tables.len());
        }
        Ok::<_, Error>(())
    }
    .await;
    match result {
        Ok(()) => 0,
        Err(error) => fail(&error),
    }
}

/// Prints the lines of one side's check; false when it failed.
fn report(result: Result<Vec<CheckItem>, Error>) -> bool {
    match result {
        Ok(items) => {
            for item in &items {
                out!("{}  {}: {}", if item.ok { "ok  " } else { "FAIL" }, item.what, item.detail);
            }
            items.iter().all(|item| item.ok)
        }
        Err(error) => {
            out!("FAIL  {error}");
            false
        }
    }
}

/// `sluice reset`: the job's target tables emptied (a `cdc` job copies none: its tables are left
/// alone), its checkpoints and plan forgotten.
async fn reset(path: PathBuf, state_dir: PathBuf) -> u8 {
    let Some(job) = load(&path) else { return 2 };
    let mut code = 0;
    for (each, state_dir) in per_part_state(&job, &state_dir) {
        code = code.max(reset_job(each, state_dir).await);
    }
    code
}

/// Each part of a job (`JobSpec::parts`) with its state directory: the job's own with one
/// source and one target, one per target or source (named after it) with `targets:` or
/// `sources:`.
fn per_part_state(job: &JobSpec, state_dir: &std::path::Path) -> Vec<(JobSpec, PathBuf)> {
    let names = job.part_names();
    if names.is_empty() {
        return vec![(job.clone(), state_dir.to_path_buf())];
    }
    job.parts().into_iter().zip(names).map(|(each, name)| (each, state_dir.join(name))).collect()
}

async fn reset_job(job: JobSpec, state_dir: PathBuf) -> u8 {
    let job = Arc::new(job);
    let result = async {
        let source = sluice_connectors::source(&job)?;
        let sink = sluice_connectors::sink(&job)?;
        let state = SqliteStateStore::open(&state_dir)?;
        let previous = sluice_core::state::StateStore::load_plan(&state, &job.name)?;
        let planned =
            sluice_core::planner::Planner::new(job.clone(), source.clone(), sink.clone()).plan(previous).await?;
        let hidden = sluice_core::hidden::HiddenCopies::of(&planned.plan, &*sink, &job.name).await?;
        sink.prepare(&hidden.schemas(&planned.targets)).await?;
        let mut tables = hidden.tasks(planned.plan.table_tasks());
        if job.mode == sluice_core::spec::Mode::Cdc {
            tables.clear();
        }
        sink.reset(&job.name, &tables).await?;
        source.forget().await?;
        sluice_core::state::StateStore::forget(&state, &job.name)?;
        Ok::<_, Error>(tables.len())
    }
    .await;
    match result {
        Ok(emptied) => {
            eprintln!(
                "job {}: {emptied} target tables emptied, checkpoints and plan forgotten; its next run starts from scratch",
                job.name
            );
            0
        }
        Err(error) => fail(&error),
    }
}

/// `sluice replay`: the job's dirty records written again by key (`Runner::replay_records`),
/// their outcome kept in the state directory and `dirty.jsonl` written anew.
async fn replay(path: PathBuf, state_dir: PathBuf) -> u8 {
    let Some(job) = load(&path) else { return 2 };
    let mut code = 0;
    for (each, state_dir) in per_part_state(&job, &state_dir) {
        code = code.max(replay_job(each, state_dir).await);
    }
    code
}

async fn replay_job(mut job: JobSpec, state_dir: PathBuf) -> u8 {
    job.target.write_mode = sluice_core::spec::WriteMode::Upsert;
    if let Some(error) = sluice_connectors::validate(&job).into_iter().find(|error| error.path.starts_with("target")) {
        let error = Error::config(format!("job {}: its dirty records cannot be replayed: {error}", job.name))
            .hint("a replay writes rows again by key; fix them in the target by hand instead");
        return fail(&error);
    }
    let job = Arc::new(job);
    let result = async {
        let state = SqliteStateStore::open(&state_dir)?;
        let entries = state.dirty_entries(&job.name)?;
        if entries.is_empty() {
            return Ok((entries, sluice_core::runner::ReplayReport::default()));
        }
        let plan = sluice_core::state::StateStore::load_plan(&state, &job.name)?;
        let runner = Runner::outside_run(job.clone(), sluice_connectors::source(&job)?, sluice_connectors::sink(&job)?);
        let report = runner.replay_records(plan.as_ref(), &entries).await?;
        state.settle_replay(&job.name, &report)?;
        state.export_dirty(&job.name)?;
        Ok::<_, Error>((entries, report))
    }
    .await;
    let (entries, report) = match result {
        Ok(done) => done,
        Err(error) => return fail(&error),
    };
    let mut kept = 0;
    for (id, verdict) in &report.verdicts {
        let why = match verdict {
            sluice_core::runner::Verdict::Written => continue,
            sluice_core::runner::Verdict::Refused(reason) => reason,
            sluice_core::runner::Verdict::Kept(why) => why,
        };
        kept += 1;
        if let Some(entry) = entries.iter().find(|entry| entry.id == *id) {
            eprintln!("still dirty: {} ({}): {why}", entry.record.table, entry.record.key);
        }
    }
    eprintln!(
        "job {}: {} of {} dirty records replayed ({} rows written again); {kept} still dirty",
        job.name,
        report.verdicts.len() - kept,
        entries.len(),
        report.rows_written
    );
    u8::from(kept > 0)
}

/// The current version of a job on the server: its document and whether it is JSON.
async fn server_job(connection: &client::Connection, name: &str) -> Result<(String, job_text::DocumentFormat), String> {
    let get = |path: String| async move {
        let response = client::request(connection, reqwest::Method::GET, &path, None).await?;
        let value: serde_json::Value = serde_json::from_str(&response.body).unwrap_or_default();
        if response.status != 200 {
            let message = value["error"]["message"].as_str().map_or(response.body.clone(), str::to_owned);
            return Err(format!("{} {path}: {message} (HTTP {})", connection.server, response.status));
        }
        Ok(value)
    };
    let job = get(format!("/jobs/{name}")).await?;
    let version = job["version"].as_u64().ok_or_else(|| format!("job {name}: the server gave no version"))?;
    let document = get(format!("/jobs/{name}/versions/{version}")).await?;
    let text = document["document"].as_str().ok_or_else(|| format!("job {name}: the server gave no document"))?;
    let format = serde_json::from_value(document["format"].clone())
        .map_err(|_| format!("job {name}: the server gave no known format (`yaml` or `json`)"))?;
    Ok((text.to_owned(), format))
}

/// `sluice tail`: the job's source followed from now (or `from`) into a `stdout` target, with a
/// state directory of its own that is removed at the end. `job` is a job file, or else the
/// name of a job on the server.
async fn tail(job: String, format: String, from: Option<String>, connection: &client::Connection) -> u8 {
    use sluice_core::spec::{parse_yaml, Mode, Node, NodeKind, WriteMode};
    let path = PathBuf::from(&job);
    let loaded = if path.exists() || job.contains('/') || job.ends_with(".yaml") || job.ends_with(".yml") {
        load(&path)
    } else {
        match server_job(connection, &job).await {
            Ok((text, format)) => match job_text::parse(&text, format, &job_text::DocumentRules::Standalone) {
                Ok(spec) => Some(spec),
                Err(errors) => {
                    eprintln!("error: job {job} from {} is not valid here:", connection.server);
                    for error in errors {
                        eprintln!("  {error}");
                    }
                    None
                }
            },
            Err(error) => {
                eprintln!("error: cannot tail {job}: no such file, and {error}");
                return if error.contains("HTTP 404") { 2 } else { 1 };
            }
        }
    };
    let Some(mut job) = loaded else { return 2 };
    let scalar = |text: &str| Node { kind: NodeKind::Scalar { text: text.to_owned(), quoted: true }, line: None };
    job.mode = Mode::Cdc;
    job.target = EndpointSpec {
        role: sluice_core::Side::Target,
        at: "target".into(),
        connector: "stdout".into(),
        url: None,
        path: None,
        tables: Vec::new(),
        write_mode: WriteMode::Insert,
        create_tables: false,
        cursor: None,
        present: vec![("type".into(), None), ("format".into(), None)],
        options: [("format".to_owned(), scalar(&format))].into_iter().collect(),
        line: None,
    };
    job.targets.clear();
    let mut errors = Vec::new();
    if let Some(from) = from {
        match parse_yaml(&from) {
            Ok(node) => {
                job.source.options.insert("start_position".into(), node);
                if !job.source.present.iter().any(|(field, _)| field == "start_position") {
                    job.source.present.push(("start_position".into(), None));
                }
            }
            Err(error) => errors.push(format!("--from: {}", error.message)),
        }
    }
    errors.extend(sluice_connectors::validate(&job).iter().map(|error| {
        let text = error.to_string();
        match text.strip_prefix("target.format") {
            Some(rest) => format!("--format{rest}"),
            None => text.replace("source.start_position", "--from"),
        }
    }));
    if !errors.is_empty() {
        eprintln!("error: cannot tail {}:", path.display());
        for error in errors {
            eprintln!("  {error}");
        }
        return 2;
    }
    // A directory of its own (0700, a name no other user can guess), removed at the end.
    let state_dir = match tempfile::Builder::new().prefix(&format!("sluice-tail-{}-", job.name)).tempdir() {
        Ok(directory) => directory,
        Err(error) => {
            eprintln!(
                "error: cannot create a state directory for tail under {}: {error}",
                std::env::temp_dir().display()
            );
            return 1;
        }
    };
    run_job(job, state_dir.path().to_path_buf(), None, false).await
}

async fn run(path: PathBuf, state_dir: PathBuf, summary_json: Option<PathBuf>, restart: bool) -> u8 {
    let Some(job) = load(&path) else { return 2 };
    if job.part_names().is_empty() {
        return run_job(job, state_dir, summary_json, restart).await;
    }
    run_parts(job, state_dir, summary_json, restart).await
}

/// A job with `targets:` or `sources:`: each target or source as a job of its own
/// (`JobSpec::parts`), side by side, each with its state in a directory named after it; one that
/// fails or lags does not hold the others. The summary file holds each part's summary under its
/// name (in `targets` or `sources`); the exit code is the worst of theirs.
async fn run_parts(job: JobSpec, state_dir: PathBuf, summary_json: Option<PathBuf>, mut restart: bool) -> u8 {
    let names: Vec<String> = job.part_names().into_iter().map(str::to_owned).collect();
    let (field, what) = if job.sources.is_empty() {
        ("targets", "targets, each with its own checkpoints")
    } else {
        ("sources", "sources merged into one target, each with its own position and checkpoints")
    };
    log::info!("job {}: {} {what} ({})", job.name, names.len(), names.join(", "));
    // A binlog is read once for every target: by a reader of the job's own name, which each
    // target's stream joins once it stands where that reader passed (`SharedLog`).
    let shares_a_log = job.sources.is_empty() && job.source.connector == "mysql" && job.mode.streams();
    let shared = shares_a_log
        .then(|| sluice_connectors::source(&job).ok())
        .flatten()
        .map(|source| SharedLog::new(source, sluice_core::shared_log::SHARED_EVENTS));
    let parts = per_part_state(&job, &state_dir);
    if restart && !job.sources.is_empty() {
        // The sources share the target's tables: every part empties them before any copies into
        // them, or a later part's reset would empty what an earlier one had copied.
        for (each, state_dir) in &parts {
            let code = reset_job(each.clone(), state_dir.clone()).await;
            if code != 0 {
                return code;
            }
        }
        restart = false;
    }
    let runs: Vec<_> = parts
        .into_iter()
        .map(|(each, state_dir)| tokio::spawn(run_job_summarized(each, state_dir, restart, shared.clone(), true)))
        .collect();
    let mut ended = Vec::with_capacity(runs.len());
    for run in runs {
        ended.push(run.await.expect("a part's run does not panic"));
    }
    if let Some(shared) = &shared {
        log::info!(
            "job {}: the targets' streams joined the shared read of the source's log {} times",
            job.name,
            shared.joins()
        );
    }
    let code = ended.iter().map(|(code, _)| *code).max().unwrap_or(0);
    if let Some(path) = summary_json {
        let parts: serde_json::Map<String, serde_json::Value> = names
            .into_iter()
            .zip(ended)
            .map(|(name, (_, summary))| (name, serde_json::to_value(summary).expect("summaries serialize")))
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({"job": job.name, field: parts}))
            .expect("summaries serialize");
        if let Err(error) = std::fs::write(&path, text + "\n") {
            log::error!("cannot write the summary to {}: {error}", path.display());
        }
    }
    code
}

/// Runs a validated job standalone, restarting it after failures that may heal, and prints its
/// summary.
async fn run_job(job: JobSpec, state_dir: PathBuf, summary_json: Option<PathBuf>, restart: bool) -> u8 {
    let (code, summary) = run_job_summarized(job, state_dir, restart, None, false).await;
    write_summary(summary_json.as_deref(), &summary);
    code
}

/// `run_job`, the summary handed back instead of written; with `shared`, the job's change stream
/// reads the source's log through it. A `part` of a job file's several targets or sources runs
/// beside the others: its progress lines name it.
async fn run_job_summarized(
    job: JobSpec,
    state_dir: PathBuf,
    restart: bool,
    shared: Option<Arc<SharedLog>>,
    part: bool,
) -> (u8, RunSummary) {
    let job = Arc::new(job);
    let part = part.then(|| job.name.clone());
    let source_of = |job: &JobSpec| {
        sluice_connectors::source(job).map(|source| match &shared {
            Some(shared) => shared.wrap(source),
            None => source,
        })
    };
    let prepared = async {
        let source = source_of(&job)?;
        let sink = sluice_connectors::sink(&job)?;
        for (side, items) in [(Side::Source, source.check().await?), (Side::Target, sink.check().await?)] {
            if let Some(item) = items.iter().find(|item| !item.ok) {
                return Err(Error::new(ErrorKind::Auth, format!("{}: {}", item.what, item.detail)).on(side));
            }
        }
        let state = Arc::new(SqliteStateStore::open(&state_dir)?);
        Ok::<_, Error>((source, sink, state))
    }
    .await;
    let (source, sink, state) = match prepared {
        Ok(parts) => parts,
        Err(error) => {
            let summary = RunSummary {
                status: RunStatus::Failed,
                error: Some(error.to_string()),
                ..RunSummary::new(&job.name, &job.mode.to_string(), &Default::default())
            };
            return (fail(&error), summary);
        }
    };

    let (stop, stop_requested) = watch::channel(false);
    tokio::spawn(watch_signals(stop));
    log::info!(
        "job {} ({}): {} → {}, state in {}",
        job.name,
        job.mode,
        job.source.connector,
        job.target.connector,
        state_dir.display()
    );
    if let Some(schedule) = &job.schedule {
        log::info!(
            "the job's schedule ({schedule}) is fired by `sluice server`; `sluice run` runs it once (--restart copies afresh)"
        );
    }
    let (mut source, mut sink, mut restart) = (source, sink, restart);
    let mut restarts = sluice_core::retry::Restarts::default();
    let (mut summary, error) = loop {
        let runner = Runner::new(job.clone(), source, sink, state.clone(), stop_requested.clone());
        let runner = Arc::new(if restart { runner.restarting() } else { runner });
        let (display_done, display_wait) = watch::channel(false);
        let display = tokio::spawn(progress::display(runner.stats(), part.clone(), display_wait));
        let verification = (job.verify.is_some() && job.mode.streams()).then(|| {
            let (job, state_dir, stop) = (job.clone(), state_dir.clone(), stop_requested.clone());
            tokio::spawn(job_verification::on_schedule(job, state_dir, runner.stats(), stop))
        });
        let (summary, error) = runner.run().await;
        display_done.send_replace(true);
        let _ = display.await;
        if let Some(verification) = verification {
            verification.abort();
        }
        let Some(failure) = error.as_ref().filter(|_| !*stop_requested.borrow()) else { break (summary, error) };
        let progressed = sluice_core::retry::ran_well(&job.restart, &summary);
        let wait = match restarts.failed(&job.restart, failure, progressed, sluice_core::clock::unix_seconds()) {
            sluice_core::retry::Restart::After(wait) => {
                log::warn!(
                    "job {}: {failure}; restarting from its checkpoints in {wait:?} (restart {}, {} in a row of at most {})",
                    job.name,
                    restarts.total,
                    restarts.in_a_row,
                    job.restart.max_restarts
                );
                wait
            }
            sluice_core::retry::Restart::GiveUp(reason) => {
                if restarts.total > 0 {
                    log::error!("job {}: not restarted again: {reason}", job.name);
                }
                break (summary, error);
            }
        };
        // Fresh connections for the new run; meanwhile they ask the side that failed whether it
        // answers again, which ends the wait early.
        let (fresh_source, fresh_sink) =
            match source_of(&job).and_then(|source| Ok((source, sluice_connectors::sink(&job)?))) {
                Ok(parts) => parts,
                Err(error) => break (summary, Some(error)),
            };
        let probe = sluice_core::retry::probe_of(failure, &*fresh_source, &*fresh_sink);
        let mut stopping = stop_requested.clone();
        tokio::select! {
            waited = sluice_core::retry::wait_to_restart(wait, probe) => {
                if waited == sluice_core::retry::Waited::Answers {
                    log::info!("job {}: the {} answers again; restarting now", job.name, failure.side().map_or("", Side::name));
                }
            }
            _ = stopping.wait_for(|stopped| *stopped) => {
                let stopped = Error::new(ErrorKind::Interrupted, "stopped while waiting to restart");
                let summary = RunSummary { status: RunStatus::Stopped, error: Some(stopped.to_string()), ..summary };
                break (summary, Some(stopped));
            }
        }
        restart = runner.still_restarting();
        (source, sink) = (fresh_source, fresh_sink);
    };
    summary.restarts = restarts.total;

    if summary.dirty_records_total > 0 {
        match state.export_dirty(&job.name) {
            Ok(path) => log::warn!("{} dirty records kept; listed in {}", summary.dirty_records_total, path.display()),
            Err(error) => log::error!("{error}"),
        }
    }
    print_summary(&summary, sluice_connectors::prints_events(&job.target.connector));
    let code = match error {
        None if job.verify.is_some() => verify_after_copy(&job, &state_dir).await,
        None => 0,
        // A change stream runs until it is stopped: that is its normal end.
        Some(_) if summary.status == RunStatus::Stopped && job.mode.streams() => {
            eprintln!("stopped; run the job again to continue from the last checkpoint");
            0
        }
        Some(error) if error.kind() == ErrorKind::Interrupted => {
            eprintln!("stopped: {error}");
            1
        }
        Some(error) => fail(&error),
    };
    (code, summary)
}

/// `verify:` of a job that copies and ends: the target verified once the copy succeeded; exit 1
/// when it differs.
async fn verify_after_copy(job: &Arc<JobSpec>, state_dir: &std::path::Path) -> u8 {
    let Some((_, options)) = job_verification::scheduled_options(job) else { return 0 };
    match job_verification::verify(job, &options).await {
        Ok(report) => {
            job_verification::log_verdict(state_dir, &report);
            u8::from(!report.agrees())
        }
        Err(error) => {
            eprintln!("error: job {}: the copy succeeded but cannot be verified: {error}", job.name);
            1
        }
    }
}

/// The first SIGINT or SIGTERM asks for a graceful stop; a second one exits at once.
async fn watch_signals(stop: watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        log::error!("cannot listen for signals; stop with SIGKILL and run again to resume");
        return;
    };
    for count in 1.. {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        if count == 1 {
            log::warn!("stopping: finishing the batches in flight and saving checkpoints (signal again to exit now)");
            stop.send_replace(true);
        } else {
            log::error!("exiting without waiting; run the job again to resume from the last checkpoint");
            std::process::exit(1);
        }
    }
}

/// Prints the run summary on standard output, or on standard error when the job's events go to
/// standard output (a `stdout` target, `sluice tail`), so the output stays JSON lines.
fn print_summary(summary: &RunSummary, to_stderr: bool) {
    use progress::group;
    use std::fmt::Write as _;
    let mut text = String::new();
    macro_rules! out {
        ($($argument:tt)*) => {{
            let _ = writeln!(text, $($argument)*);
        }};
    }
    out!("job {}: {} in {:.2}s", summary.job, summary.status, summary.elapsed_secs);
    let width =
        summary.tables.iter().map(|table| table.source.len().max(table.target.len())).max().unwrap_or(5).clamp(6, 48);
    out!("  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>8}", "source", "target", "rows read", "rows written", "skipped");
    for table in &summary.tables {
        out!(
            "  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>8}",
            table.source,
            table.target,
            group(table.rows_read),
            group(table.rows_written),
            group(table.rows_skipped)
        );
    }
    out!(
        "  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>8}",
        "total",
        "",
        group(summary.rows_read),
        group(summary.rows_written),
        group(summary.rows_skipped)
    );
    out!("  {} rows/s; {} bytes read", group(summary.rows_per_sec as u64), group(summary.bytes_read));
    if summary.splits_resumed_done > 0 {
        out!(
            "  {} splits were already complete from an earlier run and were not copied again",
            summary.splits_resumed_done
        );
    }
    if let Some(stream) = &summary.stream {
        let rate = if summary.elapsed_secs > 0.0 { stream.rows_applied as f64 / summary.elapsed_secs } else { 0.0 };
        out!("  {}", progress::stream_line(stream, rate));
        if stream.schema_changes > 0 {
            out!("  {} DDL statements carried to the target", stream.schema_changes);
        }
        if stream.schema_changes_ignored > 0 {
            out!("  {} DDL statements not carried (schema_changes: ignore)", stream.schema_changes_ignored);
        }
        if stream.dirty_records > 0 {
            out!("  {} changes left out of the target as dirty records", group(stream.dirty_records));
        }
        if stream.conflicts > 0 {
            out!("  {} conflicts settled by the job's policy, kept as dirty records", group(stream.conflicts));
        }
        if stream.echoes > 0 {
            out!("  {} transactions Sluice wrote into the source passed over (two_way)", group(stream.echoes));
        }
    }
    if to_stderr {
        eprint!("{text}");
    } else {
        out_text(&text);
    }
}

/// Writes text on standard output, nothing once it is closed.
fn out_text(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush());
}

fn write_summary(path: Option<&std::path::Path>, summary: &RunSummary) {
    let Some(path) = path else { return };
    let text = serde_json::to_string_pretty(summary).expect("summaries serialize");
    if let Err(error) = std::fs::write(path, text + "\n") {
        log::error!("cannot write the summary to {}: {error}", path.display());
    }
}
