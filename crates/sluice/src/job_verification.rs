//! Verifying a job outside its run: the runner and the target's reader built from the job
//! (`Runner::verify`), for `sluice verify`, a server's verifications, and the `verify:` schedule
//! of a job that `sluice run` streams; and the report kept in a state directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_core::runner::{ReadBack, Runner, VerifyOptions, VerifyReport};
use sluice_core::spec::JobSpec;
use sluice_core::stats::{JobStats, StreamPhase};
use sluice_core::{Error, Result};
use tokio::sync::watch;

/// Compares the job's target with its source through the job's mapping.
pub async fn verify(job: &Arc<JobSpec>, options: &VerifyOptions) -> Result<VerifyReport> {
    let runner = Runner::outside_run(job.clone(), sluice_connectors::source(job)?, sluice_connectors::sink(job)?);
    let reading = job.clone();
    let read_back: ReadBack = Arc::new(move |table| sluice_connectors::read_back(&reading, table));
    runner.verify(read_back, options).await
}

/// The options of a job's `verify:` schedule.
pub fn scheduled_options(job: &JobSpec) -> Option<(Duration, VerifyOptions)> {
    let schedule = job.verify.as_ref()?;
    let options =
        VerifyOptions { tables: schedule.tables.clone(), repair: schedule.repair, ..VerifyOptions::default() };
    Some((Duration::from_secs(schedule.every_secs), options))
}

/// Keeps the report as the job's last verification in the state directory
/// (`verify-JOB.json`), and appends its repairs, one JSON line each with the table and the time,
/// to `JOB/repairs.jsonl`.
pub fn keep(state_dir: &Path, report: &VerifyReport) -> Result<()> {
    let failed = |error: std::io::Error| Error::state(error.to_string());
    crate::private_files::create_dir(state_dir).map_err(failed)?;
    let text = serde_json::to_vec_pretty(report).expect("reports serialize");
    crate::private_files::write(&state_dir.join(format!("verify-{}.json", report.job)), &text).map_err(failed)?;
    let mut lines = String::new();
    let at = sluice_core::clock::unix_seconds();
    for table in &report.tables {
        for repair in &table.repairs {
            let mut line = serde_json::json!({"table": table.table, "at": at});
            if let (Some(line), serde_json::Value::Object(repair)) =
                (line.as_object_mut(), serde_json::to_value(repair).expect("repairs serialize"))
            {
                line.extend(repair);
            }
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
    }
    if lines.is_empty() {
        return Ok(());
    }
    let directory = state_dir.join(&report.job);
    crate::private_files::create_dir(&directory).map_err(failed)?;
    let path = directory.join("repairs.jsonl");
    let mut kept = std::fs::read(&path).unwrap_or_default();
    kept.extend_from_slice(lines.as_bytes());
    crate::private_files::write(&path, &kept).map_err(failed)
}

/// The `verify:` schedule of a job `sluice run` streams: every `every_secs` while the stream is
/// streaming (its copy done, its backlog applied once), the job is verified as `sluice verify`
/// would, the report kept in the state directory and its verdict logged, until `stop`.
pub async fn on_schedule(job: Arc<JobSpec>, state_dir: PathBuf, stats: Arc<JobStats>, mut stop: watch::Receiver<bool>) {
    let Some((period, options)) = scheduled_options(&job) else { return };
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        if stats.stream.phase() != StreamPhase::Streaming {
            continue;
        }
        let verified = tokio::select! {
            verified = verify(&job, &options) => verified,
            _ = stop.wait_for(|stopped| *stopped) => return,
        };
        match verified {
            Ok(report) => log_verdict(&state_dir, &report),
            Err(error) => {
                log::warn!("job {}: its scheduled verification failed: {error}; trying again in {period:?}", job.name)
            }
        }
    }
}

/// Keeps a scheduled verification's report and logs its verdict: the differences by table and
/// their first keys, where the report is.
pub fn log_verdict(state_dir: &Path, report: &VerifyReport) {
    if let Err(error) = keep(state_dir, report) {
        log::warn!("job {}: the verification's report could not be kept: {error}", report.job);
    }
    let repaired: u64 = report.tables.iter().map(|table| table.repaired).sum();
    let kept = state_dir.join(format!("verify-{}.json", report.job));
    if report.agrees() {
        log::info!(
            "job {}: verified: the target equals the source ({} tables{}; report in {})",
            report.job,
            report.tables.len(),
            if repaired > 0 { format!(", {repaired} rows repaired") } else { String::new() },
            kept.display()
        );
        return;
    }
    for table in report.tables.iter().filter(|table| table.differences_total > 0 || !table.problems.is_empty()) {
        let keys: Vec<String> = table
            .differences
            .iter()
            .take(5)
            .map(|found| serde_json::Value::Object(found.key.clone()).to_string())
            .collect();
        log::error!(
            "job {}: verified: table {} differs: {} missing, {} extra, {} different (first keys: {}){}",
            report.job,
            table.table,
            table.missing,
            table.extra,
            table.different,
            keys.join(", "),
            table.problems.iter().map(|problem| format!("; {problem}")).collect::<String>()
        );
    }
    log::error!(
        "job {}: verified: the target differs from the source in {} rows; report in {}; `sluice verify --repair` rewrites them",
        report.job,
        report.differences_total,
        kept.display()
    );
}
