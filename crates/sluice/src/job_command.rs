//! `sluice job …`: turns a subcommand into an API call and its answer into readable text (or
//! the answer's JSON with `--json`).

use std::path::Path;

use clap::Subcommand;
use reqwest::Method;
use serde_json::Value;

use crate::client::{self, Connection};

#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// Create a job from a job file (YAML, or JSON when it ends in .json).
    Submit {
        /// The job file; a unit file holds several jobs, separated by `---` lines.
        file: std::path::PathBuf,
    },
    /// Make a job file the next version of the job it names.
    Update {
        /// The job file.
        file: std::path::PathBuf,
    },
    /// The jobs: name, state, version, mode.
    List,
    /// One job: state, phase, statistics and tasks.
    Show {
        /// The job's name.
        name: String,
    },
    /// Stop a job: its tasks end after committing what they hold.
    Stop {
        /// The job's name.
        name: String,
    },
    /// Start a stopped job again; it resumes from its checkpoints.
    Start {
        /// The job's name.
        name: String,
    },
    /// Run the next batch of a job with `schedule` or `after` now (or when its batch ends).
    Batch {
        /// The job's name.
        name: String,
        /// Run these batches again instead (a backfill): `3` or `3-5`.
        #[arg(long, value_name = "A[-B]")]
        rerun: Option<String>,
    },
    /// Stop and start a job (a new generation of its tasks).
    Restart {
        /// The job's name.
        name: String,
    },
    /// Copy tables of a running job's stream again while it runs, each put in the table's place
    /// whole once copied (PostgreSQL and MySQL targets).
    Resync {
        /// The job's name.
        name: String,
        /// Source tables of the job (`db.table`).
        #[arg(required = true)]
        tables: Vec<String>,
    },
    /// The job's versions.
    Versions {
        /// The job's name.
        name: String,
    },
    /// A line diff of two versions.
    Diff {
        /// The job's name.
        name: String,
        /// The older version.
        from: u32,
        /// The newer version.
        to: u32,
    },
    /// Make an older version current again (as a new version).
    Rollback {
        /// The job's name.
        name: String,
        /// The version to go back to.
        version: u32,
    },
    /// Delete a job, its versions, its status and its dirty records (not the data it moved).
    Delete {
        /// The job's name.
        name: String,
    },
    /// The job's dirty records, from every node: table, key, reason, node.
    Dirty {
        /// The job's name.
        name: String,
    },
    /// Write dirty records again after a fix (a new version of the job, a change to the target):
    /// the splits that hold them are copied again by key with the job as it is now.
    Replay {
        /// The job's name.
        name: String,
        /// The records' ids (as `sluice job dirty` lists them); every record of the job when
        /// none is given.
        ids: Vec<String>,
    },
    /// Forget dirty records after dealing with them (kept in the server's audit log).
    Discard {
        /// The job's name.
        name: String,
        /// The records' ids (as `sluice job dirty` lists them).
        #[arg(required_unless_present = "all")]
        ids: Vec<String>,
        /// Every record of the job.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
    /// Every alarm rule's state, per job, and the latest firings and resolutions.
    Alarms,
    /// The audit trail, newest first: every change asked of the server, who asked, from where,
    /// and how it ended.
    Audit(AuditFilter),
}

/// Which records of the audit trail to show (`sluice job audit`, `sluice audit`).
#[derive(Debug, Clone, clap::Args)]
pub struct AuditFilter {
    /// Only this job's records.
    #[arg(long)]
    job: Option<String>,
    /// Only this token name's records.
    #[arg(long)]
    actor: Option<String>,
    /// The newest this many.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

/// `text` as a URL query value: unreserved characters kept, every other byte as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (byte as char).to_string(),
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// Reads a job file: its text and content type.
fn job_file(file: &Path) -> Result<(String, &'static str), String> {
    let text = std::fs::read_to_string(file).map_err(|error| format!("cannot read {}: {error}", file.display()))?;
    let json = file.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("json"));
    Ok((text, if json { "application/json" } else { "application/yaml" }))
}

/// The documents of a YAML file separated by `---` lines, empty ones left out.
fn documents(text: &str) -> Vec<String> {
    let mut documents = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            documents.push(String::new());
        } else {
            let current = documents.last_mut().expect("one document at least");
            current.push_str(line);
            current.push('\n');
        }
    }
    documents
        .retain(|document| document.lines().any(|line| !line.trim().is_empty() && !line.trim_start().starts_with('#')));
    documents
}

/// A unit file: several job documents, checked together first (none is sent while one is
/// invalid), then each submitted (or updated) in order.
async fn submit_unit(connection: &Connection, json: bool, update: bool, file: &Path, documents: Vec<String>) -> u8 {
    let mut names = Vec::new();
    let mut invalid = false;
    for (index, document) in documents.iter().enumerate() {
        // `${VAR}` is the server's to resolve: any value stands in for it here.
        let (job, errors) = sluice_core::spec::parse_job_partially(document, false, |_| Some("1".to_owned()));
        let name = job.map(|job| job.name).unwrap_or_default();
        for error in &errors {
            eprintln!(
                "error: {} document {} ({}): {error}",
                file.display(),
                index + 1,
                if name.is_empty() { "no name" } else { &name }
            );
        }
        invalid |= !errors.is_empty() || name.is_empty();
        names.push(name);
    }
    if invalid {
        eprintln!("error: {}: nothing was submitted", file.display());
        return 2;
    }
    let mut code = 0;
    for (name, document) in names.iter().zip(&documents) {
        let (method, path) =
            if update { (Method::PUT, format!("/jobs/{name}")) } else { (Method::POST, "/jobs".to_owned()) };
        match client::request(connection, method, &path, Some(("application/yaml", document))).await {
            Ok(response) if (200..300).contains(&response.status) => {
                if json {
                    out!("{}", response.body);
                } else {
                    let value: Value = serde_json::from_str(&response.body).unwrap_or(Value::Null);
                    out!("{name}: version {}", cell(value.get("version")));
                }
            }
            Ok(response) => {
                let value: Value = serde_json::from_str(&response.body).unwrap_or(Value::String(response.body.clone()));
                let message = value.get("error").map(describe_error).unwrap_or_else(|| response.body.clone());
                eprintln!("error: {name}: {message} (HTTP {})", response.status);
                for error in value.get("errors").and_then(Value::as_array).into_iter().flatten() {
                    eprintln!("  {}", describe_error(error));
                }
                code = code.max(if response.status == 400 { 2 } else { 1 });
            }
            Err(error) => {
                eprintln!("error: {name}: {error}");
                code = 1;
            }
        }
    }
    code
}

/// Runs one `sluice job` action; the exit code (0 done, 1 refused or failed, 2 bad input).
pub async fn run(connection: &Connection, json: bool, action: JobAction) -> u8 {
    if let JobAction::Submit { file } | JobAction::Update { file } = &action {
        if let Ok((text, "application/yaml")) = job_file(file) {
            let documents = documents(&text);
            if documents.len() > 1 {
                return submit_unit(connection, json, matches!(action, JobAction::Update { .. }), file, documents)
                    .await;
            }
        }
    }
    let (method, path, body) = match &action {
        JobAction::Submit { file } | JobAction::Update { file } => match job_file(file) {
            Ok(body) => {
                if let JobAction::Update { .. } = action {
                    let parsed =
                        sluice_core::spec::parse_job_partially(&body.0, body.1 == "application/json", |_| None).0;
                    match parsed.map(|job| job.name).filter(|name| !name.is_empty()) {
                        Some(name) => (Method::PUT, format!("/jobs/{name}"), Some(body)),
                        None => {
                            eprintln!("error: {}: the job file has no valid `name`", file.display());
                            return 2;
                        }
                    }
                } else {
                    (Method::POST, "/jobs".to_owned(), Some(body))
                }
            }
            Err(error) => {
                eprintln!("error: {error}");
                return 2;
            }
        },
        JobAction::List => (Method::GET, "/jobs".to_owned(), None),
        JobAction::Show { name } => (Method::GET, format!("/jobs/{name}"), None),
        JobAction::Stop { name } => (Method::POST, format!("/jobs/{name}/stop"), None),
        JobAction::Start { name } => (Method::POST, format!("/jobs/{name}/start"), None),
        JobAction::Restart { name } => (Method::POST, format!("/jobs/{name}/restart"), None),
        JobAction::Batch { name, rerun } => {
            let body = match rerun.as_deref().map(batch_range) {
                None => None,
                Some(Some((from, to))) => Some((format!("{{\"from\": {from}, \"to\": {to}}}"), "application/json")),
                Some(None) => {
                    eprintln!("error: --rerun takes a batch number or a range such as 3-5");
                    return 2;
                }
            };
            (Method::POST, format!("/jobs/{name}/batches"), body)
        }
        JobAction::Resync { name, tables } => (
            Method::POST,
            format!("/jobs/{name}/resync"),
            Some((serde_json::json!({ "tables": tables }).to_string(), "application/json")),
        ),
        JobAction::Versions { name } => (Method::GET, format!("/jobs/{name}/versions"), None),
        JobAction::Diff { name, from, to } => (Method::GET, format!("/jobs/{name}/versions/{from}/diff/{to}"), None),
        JobAction::Rollback { name, version } => (
            Method::POST,
            format!("/jobs/{name}/rollback"),
            Some((format!("{{\"version\": {version}}}"), "application/json")),
        ),
        JobAction::Delete { name } => (Method::DELETE, format!("/jobs/{name}"), None),
        JobAction::Dirty { name } => (Method::GET, format!("/jobs/{name}/dirty"), None),
        JobAction::Discard { name, ids, all } => {
            let body = if *all { serde_json::json!({ "all": true }) } else { serde_json::json!({ "ids": ids }) };
            (Method::POST, format!("/jobs/{name}/dirty/discard"), Some((body.to_string(), "application/json")))
        }
        JobAction::Replay { name, ids } => {
            let body =
                if ids.is_empty() { serde_json::json!({ "all": true }) } else { serde_json::json!({ "ids": ids }) };
            (Method::POST, format!("/jobs/{name}/dirty/replay"), Some((body.to_string(), "application/json")))
        }
        JobAction::Alarms => (Method::GET, "/alarms".to_owned(), None),
        JobAction::Audit(AuditFilter { job, actor, limit }) => {
            let mut query = format!("/audit?limit={limit}");
            for (name, value) in [("job", job), ("actor", actor)] {
                if let Some(value) = value {
                    query.push_str(&format!("&{name}={}", percent_encode(value)));
                }
            }
            (Method::GET, query, None)
        }
    };
    let body = body.as_ref().map(|(text, content_type)| (*content_type, text.as_str()));
    let response = match client::request(connection, method, &path, body).await {
        Ok(response) => response,
        Err(error) => {
            eprintln!("error: {error}");
            return 1;
        }
    };
    let value: Value = serde_json::from_str(&response.body).unwrap_or(Value::String(response.body.clone()));
    let success = (200..300).contains(&response.status);
    if json {
        out!("{}", serde_json::to_string_pretty(&value).unwrap_or(response.body.clone()));
    } else if !success {
        let message = value.get("error").map(describe_error).unwrap_or_else(|| response.body.clone());
        eprintln!("error: {message} (HTTP {})", response.status);
        if let Some(errors) = value.get("errors").and_then(Value::as_array) {
            for error in errors {
                eprintln!("  {}", describe_error(error));
            }
        }
    } else {
        match &action {
            JobAction::List => print_table(&["name", "state", "version", "mode"], value.as_array()),
            JobAction::Versions { .. } => {
                print_table(&["version", "current", "created_at", "origin"], value.as_array());
            }
            JobAction::Show { .. } => print_job(&value),
            JobAction::Dirty { .. } => {
                out!("{} dirty records (budget: {})", cell(value.get("total")), cell(value.get("limit")));
                print_table(&["id", "table", "key", "reason", "node", "created_at"], value["records"].as_array());
            }
            JobAction::Replay { .. } => {
                out!(
                    "replayed {} ({} rows written again)",
                    cell(value.get("replayed")),
                    cell(value.get("rows_written"))
                );
                for failure in value["failed"].as_array().into_iter().flatten() {
                    out!("refused again: {}: {}", cell(failure.get("id")), cell(failure.get("error")));
                }
            }
            JobAction::Audit(_) => {
                let rows: Vec<Value> = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|record| {
                        let mut row = record.clone();
                        row["at"] = Value::String(crate::logger::format_millis(record["at_ms"].as_u64().unwrap_or(0)));
                        row
                    })
                    .collect();
                print_table(
                    &["at", "actor", "role", "from", "action", "job", "version", "status", "result"],
                    Some(&rows),
                );
            }
            JobAction::Alarms => {
                print_table(&["job", "name", "when", "for_secs", "state", "value", "since"], value["rules"].as_array());
                let history: Vec<Value> = value["history"].as_array().into_iter().flatten().take(20).cloned().collect();
                if !history.is_empty() {
                    out!("");
                    print_table(&["at", "job", "name", "event", "value", "delivered"], Some(&history));
                }
            }
            JobAction::Diff { .. } => match value.get("diff").and_then(Value::as_str) {
                Some(diff) => out!("{}", diff.trim_end_matches('\n')),
                None => out!("{value:#}"),
            },
            _ => print_fields(&value),
        }
    }
    match response.status {
        200..=299 => 0,
        400 => 2,
        _ => 1,
    }
}

/// An error object of the API (`{message, hint, path, …}`) or a plain string, on one line.
fn describe_error(error: &Value) -> String {
    match error {
        Value::String(text) => text.clone(),
        Value::Object(fields) => {
            let text = |name: &str| fields.get(name).and_then(Value::as_str);
            let mut line = String::new();
            if let Some(path) = text("path") {
                line.push_str(path);
                if let Some(number) = fields.get("line").and_then(Value::as_u64) {
                    line.push_str(&format!(" (line {number})"));
                }
                line.push_str(": ");
            }
            line.push_str(text("message").unwrap_or(&error.to_string()));
            if let Some(hint) = text("hint") {
                line.push_str(&format!("; {hint}"));
            }
            line
        }
        other => other.to_string(),
    }
}

/// A field's value as a table cell.
fn cell(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// Rows of objects as an aligned table of the given columns.
fn print_table(columns: &[&str], rows: Option<&Vec<Value>>) {
    let rows: Vec<Vec<String>> =
        rows.into_iter().flatten().map(|row| columns.iter().map(|column| cell(row.get(*column))).collect()).collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            rows.iter().map(|row| row[index].chars().count()).chain([column.len()]).max().unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> =
            cells.iter().zip(&widths).map(|(text, width)| format!("{text:<width$}", width = *width)).collect();
        out!("{}", padded.join("  ").trim_end());
    };
    line(columns.iter().map(|column| column.to_string()).collect());
    for row in rows {
        line(row);
    }
}

/// A job: its fields, its statistics, then its tasks as a table.
fn print_job(job: &Value) {
    for field in ["name", "state", "phase", "version", "mode", "generation", "updated_at"] {
        if let Some(value) = job.get(field).filter(|value| !value.is_null()) {
            out!("{:<12} {}", format!("{field}:"), cell(Some(value)));
        }
    }
    if let Some(error) = job.get("error").filter(|error| !error.is_null()) {
        out!("{:<12} {}", "error:", describe_error(error));
    }
    if let Some(stats) = job.get("stats").and_then(Value::as_object) {
        let parts: Vec<String> = stats.iter().map(|(name, value)| format!("{name} {}", cell(Some(value)))).collect();
        out!("{:<12} {}", "stats:", parts.join(", "));
    }
    if let Some(held) = job.get("held_log").filter(|held| !held.is_null()) {
        out!(
            "{:<12} its source holds {:.1} MiB of change log for it (a replication slot) until it runs again or is reset; measured {}",
            "warning:",
            held["bytes"].as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64,
            cell(held.get("at"))
        );
    }
    if let Some(schedule) = job.get("schedule").filter(|schedule| !schedule.is_null()) {
        out!(
            "{:<12} {}; batch {}; next {}{}",
            "schedule:",
            cell(schedule.get("schedule")),
            cell(schedule.get("batch")),
            cell(schedule.get("next_at")),
            if schedule["queued"] == true { " (a firing waits)" } else { "" }
        );
    }
    if let Some(tasks) = job.get("tasks").and_then(Value::as_array).filter(|tasks| !tasks.is_empty()) {
        out!("");
        let mut columns = vec!["id", "kind", "state", "worker", "rows_written", "lag_secs", "error"];
        // A job whose `placement:` no live node meets: what its tasks wait for.
        if tasks.iter().any(|task| task.get("waiting_for").is_some_and(|why| !why.is_null())) {
            columns.push("waiting_for");
        }
        print_table(&columns, Some(tasks));
    }
    if let Some(history) =
        job.pointer("/schedule/history").and_then(Value::as_array).filter(|history| !history.is_empty())
    {
        out!("");
        let rows: Vec<Value> = history
            .iter()
            .map(|record| {
                let mut record = record.clone();
                let written = record.pointer("/rows/written").cloned().unwrap_or(Value::Null);
                let rerun = match (record.pointer("/rerun_of/from"), record.pointer("/rerun_of/to")) {
                    (Some(from), Some(to)) => Value::String(format!("{from}-{to}")),
                    _ => Value::Null,
                };
                record["rows_written"] = written;
                record["rerun_of"] = rerun;
                record
            })
            .collect();
        print_table(&["batch", "due_at", "fired_at", "ended_at", "rows_written", "rerun_of", "outcome"], Some(&rows));
    }
}

/// `3` or `3-5`, as (from, to).
fn batch_range(text: &str) -> Option<(u64, u64)> {
    match text.split_once('-') {
        Some((from, to)) => Some((from.trim().parse().ok()?, to.trim().parse().ok()?)),
        None => text.trim().parse().ok().map(|batch| (batch, batch)),
    }
}

/// Any other answer: its fields one per line.
fn print_fields(value: &Value) {
    match value.as_object() {
        Some(fields) => {
            for (name, value) in fields {
                out!("{:<12} {}", format!("{name}:"), cell(Some(value)));
            }
        }
        None if !value.is_null() => out!("{}", cell(Some(value))),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_file_is_cut_at_its_document_lines_and_empty_documents_are_left_out() {
        let text = "# a unit\n---\nname: a\n---\n\nname: b\nafter: [a]\n--- # last\nname: c\n---\n";
        assert_eq!(documents(text), ["name: a\n", "\nname: b\nafter: [a]\n", "name: c\n"]);
        assert_eq!(documents("name: alone\n").len(), 1);
    }

    #[test]
    fn a_rerun_is_one_batch_or_a_range() {
        assert_eq!((batch_range("3"), batch_range("3-5"), batch_range("x")), (Some((3, 3)), Some((3, 5)), None));
    }
}
