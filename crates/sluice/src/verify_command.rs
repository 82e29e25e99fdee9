//! `sluice verify JOB`: the job's target compared with its source through the job's mapping
//! (`Runner::verify`), as a text report or one JSON document; the report is also kept in the
//! state directory as the job's last verification.
//!
//! Exit codes: 0 when source and target agree, 1 when something differs, 2 for a bad command
//! line or job, 3 when the comparison could not be made (a server unreachable, a table that
//! cannot be read).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::runner::{DifferenceKind, TableVerdict, VerifyOptions, VerifyReport};
use sluice_core::ErrorKind;

/// What the command line asked for.
#[derive(Debug, clap::Args)]
pub struct VerifyArguments {
    /// The job file.
    job: PathBuf,
    /// The state directory of the job's runs; the report is kept there as `verify-JOB.json`.
    #[arg(long, default_value = ".sluice")]
    state_dir: PathBuf,
    /// Print the report as one JSON document.
    #[arg(long)]
    json: bool,
    /// Verify only these tables: source or target names, or globs (`shop.*`, `!shop.audit`).
    #[arg(long, num_args = 1..)]
    tables: Vec<String>,
    /// Write the source's current rows over the differing ones (insert the missing, replace the
    /// different, delete the extra) through the job's writer, then compare them again; the exit
    /// code says whether something still differs. Each repair is kept in the state directory
    /// (`JOB/repairs.jsonl`).
    #[arg(long)]
    repair: bool,
    /// List at most this many differences per table (all are counted).
    #[arg(long, default_value_t = 10_000)]
    max_differences: usize,
    /// While a stream runs: how long to wait for it to reach the source's position before a
    /// difference is checked again.
    #[arg(long, default_value_t = 60)]
    settle_secs: u64,
}

/// Runs `sluice verify` and returns its exit code. A job with `sources:` or `targets:` is
/// verified part by part (`JobSpec::parts`): each source's rows, or each target, on its own.
pub async fn verify(arguments: VerifyArguments) -> u8 {
    let Some(job) = crate::load(&arguments.job) else { return 2 };
    let options = VerifyOptions {
        tables: arguments.tables.clone(),
        max_differences: arguments.max_differences,
        settle: Duration::from_secs(arguments.settle_secs),
        repair: arguments.repair,
        ..VerifyOptions::default()
    };
    let names = job.part_names();
    let mut code = 0;
    let mut reports = serde_json::Map::new();
    for (index, part) in job.parts().into_iter().enumerate() {
        let part = Arc::new(part);
        let report = match crate::job_verification::verify(&part, &options).await {
            Ok(report) => report,
            Err(error) => {
                eprintln!("error: job {}: cannot verify: {error}", part.name);
                code = code.max(if error.kind() == ErrorKind::Config { 2 } else { 3 });
                continue;
            }
        };
        if let Err(error) = crate::job_verification::keep(&arguments.state_dir, &report) {
            eprintln!("warning: the report could not be kept in {}: {error}", arguments.state_dir.display());
        }
        code = code.max(u8::from(!report.agrees()));
        match names.get(index) {
            Some(name) if arguments.json => {
                reports.insert((*name).to_owned(), serde_json::to_value(&report).expect("reports serialize"));
            }
            _ if arguments.json => out!("{}", serde_json::to_string_pretty(&report).expect("reports serialize")),
            _ => print_report(&report),
        }
    }
    if !reports.is_empty() {
        let field = if job.sources.is_empty() { "targets" } else { "sources" };
        let document = serde_json::json!({"job": job.name, field: reports});
        out!("{}", serde_json::to_string_pretty(&document).expect("reports serialize"));
    }
    code
}

fn print_report(report: &VerifyReport) {
    for table in &report.tables {
        print_table(table);
    }
    let rows: u64 = report.tables.iter().map(|table| table.rows_source.max(table.rows_target)).sum();
    let seconds = report.elapsed_ms as f64 / 1000.0;
    let verdict = if report.agrees() { "the target equals the source" } else { "the target differs from the source" };
    out!(
        "job {}: {verdict}: {} tables, {} differences, {rows} rows in {seconds:.2}s ({:.0} rows/s)",
        report.job,
        report.tables.len(),
        report.differences_total,
        rows as f64 / seconds.max(0.001)
    );
}

fn print_table(table: &TableVerdict) {
    let sources = table.sources.join(", ");
    out!(
        "{} (from {sources}): {} source rows, {} target rows, {} chunks, {} differences{} ({} missing, {} extra, {} different){}",
        table.table,
        table.rows_source,
        table.rows_target,
        table.chunks,
        table.differences_total,
        if table.repaired > 0 { format!(" left after repairing {} rows", table.repaired) } else { String::new() },
        table.missing,
        table.extra,
        table.different,
        if table.rechecks > 0 { format!(", checked again {} times", table.rechecks) } else { String::new() }
    );
    if table.rows_refused > 0 {
        out!("  {} source rows are refused by the job (dirty records), not expected in the target", table.rows_refused);
    }
    if table.unsettled > 0 {
        out!(
            "  {} rows changed in every one of {} rounds (the source writes them faster than they settle): not counted as differences; verify again when they are quieter",
            table.unsettled,
            table.rechecks
        );
    }
    for problem in &table.problems {
        out!("  problem: {problem}");
    }
    for repair in &table.repairs {
        let key = serde_json::Value::Object(repair.key.clone());
        let what = match (repair.kind, &repair.after) {
            (_, None) => "deleted (the source has no such row)",
            (DifferenceKind::Missing, Some(_)) => "inserted from the source",
            (_, Some(_)) => "replaced by the source's row",
        };
        out!("  repaired   {key}: {what}");
    }
    for difference in &table.differences {
        let key = serde_json::Value::Object(difference.key.clone());
        match difference.kind {
            DifferenceKind::Missing => out!("  missing    {key}"),
            DifferenceKind::Extra => out!("  extra      {key}"),
            DifferenceKind::Different => out!("  different  {key}: {}", difference.columns.join(", ")),
        }
    }
    let listed = table.differences.len() as u64;
    if table.differences_total > listed {
        out!("  … and {} more (--max-differences)", table.differences_total - listed);
    }
}
