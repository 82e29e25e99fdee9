//! The `sluice` binary: the command line, and the wiring of a standalone run.

mod api;
mod client;
mod cluster;
mod job_file;
mod logger;
mod progress;
mod server;
mod state_store;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sluice_core::connector::CheckItem;
use sluice_core::runner::Runner;
use sluice_core::spec::JobSpec;
use sluice_core::stats::RunSummary;
use sluice_core::{Error, ErrorKind, Side, TableSchema};
use tokio::sync::watch;

use crate::state_store::SqliteStateStore;

/// Rows are many small allocations freed on other threads; mimalloc handles that pattern with a
/// fraction of glibc's cost (measured in BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Sluice moves data between databases and files: snapshot, cdc, or both.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
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
    },
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
    /// Run a server node: the HTTP API, a worker and a leader candidate. With --etcd, nodes form
    /// a cluster; without it, one node runs on embedded state.
    Server {
        /// etcd members, comma separated (http://host:port,…).
        #[arg(long)]
        etcd: Option<String>,
        /// Where the API listens.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: std::net::SocketAddr,
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
        /// Seconds a node may stay silent before its tasks move to other nodes.
        #[arg(long, default_value_t = 5)]
        lease_secs: u64,
        /// A file of `admin TOKEN` / `read TOKEN` lines (besides SLUICE_ADMIN_TOKEN, SLUICE_READ_TOKEN).
        #[arg(long)]
        tokens_file: Option<PathBuf>,
    },
    /// Manage the jobs of a server.
    Job {
        /// The server's address.
        #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:7070")]
        server: String,
        /// A bearer token (admin to change things, read to look).
        #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[command(subcommand)]
        action: JobAction,
    },
}

#[derive(Debug, Subcommand)]
enum JobAction {
    /// Create a job from a job file (YAML, or JSON when it ends in .json).
    Submit {
        file: PathBuf,
    },
    /// Make a job file the job's next version.
    Update {
        file: PathBuf,
    },
    /// The jobs and their states.
    List,
    /// One job: state, phase, statistics and tasks.
    Show {
        name: String,
    },
    Stop {
        name: String,
    },
    Start {
        name: String,
    },
    Restart {
        name: String,
    },
    /// The job's versions.
    Versions {
        name: String,
    },
    /// A line diff of two versions.
    Diff {
        name: String,
        from: u32,
        to: u32,
    },
    /// Make an older version current again (as a new version).
    Rollback {
        name: String,
        version: u32,
    },
    Delete {
        name: String,
    },
}

fn main() -> ExitCode {
    logger::install();
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
            Command::Run { job, state_dir, summary_json } => run(job, state_dir, summary_json).await,
            Command::Check { job } => check(job).await,
            Command::Schema { job, apply } => schema(job, apply).await,
            Command::Server { etcd, listen, node_id, state_dir, capacity, weight, lease_secs, tokens_file } => {
                let options =
                    server::Options { etcd, listen, node_id, state_dir, capacity, weight, lease_secs, tokens_file };
                server::serve(options).await
            }
            Command::Job { server, token, action } => job_command(&server, token.as_deref(), action).await,
        }
    });
    ExitCode::from(code)
}

/// Loads and validates a job, printing every error; `None` means exit 2.
fn load(path: &std::path::Path) -> Option<JobSpec> {
    match job_file::load(path) {
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
    println!(
        "ok    job file: {} is valid ({} → {}, {})",
        path.display(),
        job.source.connector,
        job.target.connector,
        job.mode
    );
    let (source, sink) = match (sluice_connectors::source(&job), sluice_connectors::sink(&job)) {
        (Ok(source), Ok(sink)) => (source, sink),
        (Err(error), _) | (_, Err(error)) => return fail(&error),
    };
    let source_ok = report(source.check().await);
    let sink_ok = report(sink.check().await);
    u8::from(!(source_ok && sink_ok))
}

async fn schema(path: PathBuf, apply: bool) -> u8 {
    let Some(mut job) = load(&path) else { return 2 };
    // Applying is an explicit request to create, whatever the job says for runs.
    job.target.create_tables |= apply;
    let result = async {
        let source = sluice_connectors::source(&job)?;
        let sink = sluice_connectors::sink(&job)?;
        let tables: Vec<TableSchema> = source
            .discover()
            .await?
            .into_iter()
            .map(|table| TableSchema { name: sink.target_name(&table.name), ..table })
            .collect();
        for statement in sink.create_statements(&tables) {
            println!("{statement};");
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
                println!("{}  {}: {}", if item.ok { "ok  " } else { "FAIL" }, item.what, item.detail);
            }
            items.iter().all(|item| item.ok)
        }
        Err(error) => {
            println!("FAIL  {error}");
            false
        }
    }
}

async fn run(path: PathBuf, state_dir: PathBuf, summary_json: Option<PathBuf>) -> u8 {
    let Some(job) = load(&path) else { return 2 };
    let job = Arc::new(job);
    let prepared = async {
        let source = sluice_connectors::source(&job)?;
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
                status: "failed".into(),
                error: Some(error.to_string()),
                ..RunSummary::new(&job.name, &job.mode.to_string(), &Default::default())
            };
            write_summary(summary_json.as_deref(), &summary);
            return fail(&error);
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
    let runner = Arc::new(Runner::new(job.clone(), source, sink, state.clone(), stop_requested));
    let (display_done, display_wait) = watch::channel(false);
    let display = tokio::spawn(progress::display(runner.stats(), display_wait));
    let (summary, error) = runner.run().await;
    display_done.send_replace(true);
    let _ = display.await;

    if summary.dirty_records_total > 0 {
        match state.export_dirty(&job.name) {
            Ok(path) => log::warn!("{} dirty records kept; listed in {}", summary.dirty_records_total, path.display()),
            Err(error) => log::error!("{error}"),
        }
    }
    print_summary(&summary);
    write_summary(summary_json.as_deref(), &summary);
    match error {
        None => 0,
        // A change stream runs until it is stopped: that is its normal end.
        Some(_) if summary.status == "stopped" && job.mode != sluice_core::spec::Mode::Snapshot => {
            eprintln!("stopped; run the job again to continue from the last checkpoint");
            0
        }
        Some(error) if error.kind() == ErrorKind::Interrupted => {
            eprintln!("stopped: {error}");
            1
        }
        Some(error) => fail(&error),
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

async fn job_command(server: &str, token: Option<&str>, action: JobAction) -> u8 {
    let read = |file: &std::path::Path| -> Result<(String, &'static str), String> {
        let text = std::fs::read_to_string(file).map_err(|error| format!("cannot read {}: {error}", file.display()))?;
        let json = file.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("json"));
        Ok((text, if json { "application/json" } else { "application/yaml" }))
    };
    let (method, path, body) = match &action {
        JobAction::Submit { file } | JobAction::Update { file } => match read(file) {
            Ok(body) => {
                let path = match &action {
                    JobAction::Update { .. } => {
                        let name =
                            sluice_core::spec::parse_job_partially(&body.0, body.1 == "application/json", |_| None)
                                .0
                                .map(|job| job.name)
                                .unwrap_or_default();
                        format!("/jobs/{name}")
                    }
                    _ => "/jobs".to_owned(),
                };
                (if matches!(action, JobAction::Update { .. }) { "PUT" } else { "POST" }, path, Some(body))
            }
            Err(error) => {
                eprintln!("error: {error}");
                return 2;
            }
        },
        JobAction::List => ("GET", "/jobs".to_owned(), None),
        JobAction::Show { name } => ("GET", format!("/jobs/{name}"), None),
        JobAction::Stop { name } => ("POST", format!("/jobs/{name}/stop"), None),
        JobAction::Start { name } => ("POST", format!("/jobs/{name}/start"), None),
        JobAction::Restart { name } => ("POST", format!("/jobs/{name}/restart"), None),
        JobAction::Versions { name } => ("GET", format!("/jobs/{name}/versions"), None),
        JobAction::Diff { name, from, to } => ("GET", format!("/jobs/{name}/versions/{from}/diff/{to}"), None),
        JobAction::Rollback { name, version } => (
            "POST",
            format!("/jobs/{name}/rollback"),
            Some((format!("{{\"version\": {version}}}"), "application/json")),
        ),
        JobAction::Delete { name } => ("DELETE", format!("/jobs/{name}"), None),
    };
    let body = body.as_ref().map(|(text, content_type)| (*content_type, text.as_str()));
    match client::request(server, token, method, &path, body).await {
        Ok(response) => {
            let value: serde_json::Value =
                serde_json::from_str(&response.body).unwrap_or(serde_json::Value::String(response.body.clone()));
            if let (JobAction::Diff { .. }, Some(diff)) = (&action, value.get("diff").and_then(|diff| diff.as_str())) {
                print!("{diff}");
            } else if let (JobAction::List, Some(jobs)) = (&action, value.as_array()) {
                println!("{:<32}  {:<10}  {:>7}  mode", "name", "state", "version");
                for job in jobs {
                    let field = |name: &str| {
                        job.get(name)
                            .map(|value| value.as_str().map(str::to_owned).unwrap_or(value.to_string()))
                            .unwrap_or_default()
                    };
                    println!(
                        "{:<32}  {:<10}  {:>7}  {}",
                        field("name"),
                        field("state"),
                        field("version"),
                        field("mode")
                    );
                }
            } else if !response.body.is_empty() {
                println!("{}", serde_json::to_string_pretty(&value).unwrap_or(response.body.clone()));
            }
            match response.status {
                200..=299 => 0,
                400 => 2,
                _ => 1,
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            1
        }
    }
}

fn print_summary(summary: &RunSummary) {
    use progress::group;
    println!("job {}: {} in {:.2}s", summary.job, summary.status, summary.elapsed_secs);
    let width =
        summary.tables.iter().map(|table| table.source.len().max(table.target.len())).max().unwrap_or(5).clamp(6, 48);
    println!(
        "  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>8}",
        "source", "target", "rows read", "rows written", "skipped"
    );
    for table in &summary.tables {
        println!(
            "  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>8}",
            table.source,
            table.target,
            group(table.rows_read),
            group(table.rows_written),
            group(table.rows_skipped)
        );
    }
    println!(
        "  {:<width$}  {:<width$}  {:>12}  {:>12}  {:>8}",
        "total",
        "",
        group(summary.rows_read),
        group(summary.rows_written),
        group(summary.rows_skipped)
    );
    println!("  {} rows/s; {} bytes read", group(summary.rows_per_sec as u64), group(summary.bytes_read));
    if summary.splits_resumed_done > 0 {
        println!(
            "  {} splits were already complete from an earlier run and were not copied again",
            summary.splits_resumed_done
        );
    }
    if let Some(stream) = &summary.stream {
        let rate = if summary.elapsed_secs > 0.0 { stream.rows_applied as f64 / summary.elapsed_secs } else { 0.0 };
        println!("  {}", progress::stream_line(stream, rate));
        if stream.schema_changes > 0 {
            println!("  {} DDL statements carried to the target", stream.schema_changes);
        }
    }
}

fn write_summary(path: Option<&std::path::Path>, summary: &RunSummary) {
    let Some(path) = path else { return };
    let text = serde_json::to_string_pretty(summary).expect("summaries serialize");
    if let Err(error) = std::fs::write(path, text + "\n") {
        log::error!("cannot write the summary to {}: {error}", path.display());
    }
}
