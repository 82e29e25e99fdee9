//! Verifications of a server's jobs: asked for (`POST /jobs/NAME/verify`, run by the node that
//! was asked) or on the job's schedule (`verify: {every_secs}`, run by the leader), on the job's
//! current version; the last report of each job is kept in the coordination store
//! (`/sluice/verifications/{job}`), where any node finds it for the API, the console, the
//! metrics and the alarms (`verify_differences`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::runner::VerifyOptions;
use sluice_core::spec::VerifySpec;
use sluice_core::Result;

use super::model::{
    encode, last_verification, load_all, load_spec, repairs_prefix, runs_prefix, verification_key, Desired, JobRecord,
    LastVerification, RepairRecord, ROOT,
};
use super::status::{job_view, JobState};
use super::store::Store;
use crate::job_text::DocumentRules;

/// Verifies `job` as its current version says, keeps the report as its last verification, and
/// returns it.
pub async fn verify(
    store: &dyn Store,
    document_rules: &DocumentRules,
    job: &JobRecord,
    options: &VerifyOptions,
    node: &str,
) -> Result<LastVerification> {
    let spec = Arc::new(load_spec(store, document_rules, &job.name, job.version).await?);
    let report = crate::job_verification::verify(&spec, options).await?;
    let last = LastVerification {
        at: sluice_core::clock::unix_seconds(),
        node: node.to_owned(),
        version: job.version,
        report,
    };
    store.put(&verification_key(&job.name), &encode(&last), None).await?;
    keep_repairs(store, &job.name, &last).await?;
    let run_key = format!("{}{}-verify", runs_prefix(&job.name), crate::logger::timestamp());
    store.put(&run_key, &history_entry(&last).to_string(), None).await?;
    log::info!(
        "job {}: verified, {} differences ({} repaired)",
        job.name,
        last.report.differences_total,
        last.report.tables.iter().map(|table| table.repaired).sum::<u64>()
    );
    Ok(last)
}

/// Keeps each row the verification repaired as a record of the job's repairs, beside its dirty
/// records: the report holds the last verification's only.
async fn keep_repairs(store: &dyn Store, job: &str, last: &LastVerification) -> Result<()> {
    let stamp = crate::logger::timestamp();
    let mut number = 0;
    for table in &last.report.tables {
        for repair in &table.repairs {
            let record = RepairRecord {
                at: last.at,
                node: last.node.clone(),
                version: last.version,
                table: table.table.clone(),
                repair: repair.clone(),
            };
            number += 1;
            let key = format!("{}{stamp}-{}-{number:06}", repairs_prefix(job), last.node);
            store.put(&key, &encode(&record), None).await?;
        }
    }
    Ok(())
}

/// A verification as an entry of the job's run history (`GET /jobs/NAME/runs`), in the fields
/// of a run's summary (`mode: verify`, `status: succeeded` when nothing differs, else `differs`)
/// with the reconciliation per table under `verify`.
fn history_entry(last: &LastVerification) -> serde_json::Value {
    let report = &last.report;
    let sum = |count: fn(&sluice_core::runner::TableVerdict) -> u64| report.tables.iter().map(count).sum::<u64>();
    let rows_read = sum(|table| table.rows_source + table.rows_target);
    let problems: Vec<String> = report
        .tables
        .iter()
        .flat_map(|table| table.problems.iter().map(move |problem| format!("{}: {problem}", table.table)))
        .collect();
    let tables: Vec<serde_json::Value> = report
        .tables
        .iter()
        .map(|table| {
            serde_json::json!({
                "table": table.table, "rows_source": table.rows_source, "rows_target": table.rows_target,
                "chunks": table.chunks, "missing": table.missing, "extra": table.extra, "different": table.different,
                "unsettled": table.unsettled, "repaired": table.repaired,
                "sample": table.differences.iter().take(10).map(|difference| &difference.key).collect::<Vec<_>>(),
            })
        })
        .collect();
    let seconds = report.elapsed_ms as f64 / 1000.0;
    serde_json::json!({
        "job": report.job,
        "mode": "verify",
        "status": if report.agrees() { "succeeded" } else { "differs" },
        "error": if problems.is_empty() { serde_json::Value::Null } else { serde_json::Value::from(problems.join("; ")) },
        "elapsed_secs": seconds,
        "rows_read": rows_read,
        "rows_written": sum(|table| table.repaired),
        "rows_per_sec": if seconds > 0.0 { rows_read as f64 / seconds } else { 0.0 },
        "node": last.node,
        "version": last.version,
        "verify": { "differences_total": report.differences_total, "tables": tables },
    })
}

/// What the leader keeps between rounds of scheduled verifications.
#[derive(Debug, Default)]
pub struct Schedules {
    /// Each job version's `verify:`, read once.
    specs: Mutex<BTreeMap<(String, u32), Option<VerifySpec>>>,
    /// When each job's scheduled verification last failed to run, so it waits its period before
    /// the next try.
    failures: Mutex<BTreeMap<String, Instant>>,
}

/// The guarded value of a mutex, whether or not a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Schedules {
    async fn of(&self, store: &dyn Store, document_rules: &DocumentRules, job: &JobRecord) -> Option<VerifySpec> {
        let key = (job.name.clone(), job.version);
        if let Some(known) = lock(&self.specs).get(&key) {
            return known.clone();
        }
        let schedule = load_spec(store, document_rules, &job.name, job.version).await.ok()?.verify;
        lock(&self.specs).insert(key, schedule.clone());
        schedule
    }
}

/// As leader: verifies, one after the other, each job whose `verify:` is due — running, copied
/// (succeeded, or streaming), and last verified `every_secs` ago or never. A verification that
/// cannot run (a server down) is logged and tried again a period later.
pub async fn run_due(
    store: &dyn Store,
    document_rules: &DocumentRules,
    node: &str,
    schedules: &Schedules,
) -> Result<()> {
    let jobs: Vec<(String, JobRecord, _)> = load_all(store, &format!("{ROOT}jobs/")).await?;
    let now = sluice_core::clock::unix_seconds();
    for (_, job, _) in jobs {
        if job.desired != Desired::Running {
            continue;
        }
        let Some(schedule) = schedules.of(store, document_rules, &job).await else { continue };
        let period = Duration::from_secs(schedule.every_secs);
        let failed_lately = lock(&schedules.failures).get(&job.name).is_some_and(|failed| failed.elapsed() < period);
        let verified_lately =
            last_verification(store, &job.name).await?.is_some_and(|last| last.at + schedule.every_secs > now);
        if failed_lately || verified_lately {
            continue;
        }
        let view = job_view(store, &job).await?;
        let copied = view.state == JobState::Succeeded
            || (view.state == JobState::Running && view.phase.as_deref() == Some("streaming"));
        if !copied {
            continue;
        }
        let options = VerifyOptions { tables: schedule.tables, repair: schedule.repair, ..VerifyOptions::default() };
        match verify(store, document_rules, &job, &options, node).await {
            Ok(_) => {
                lock(&schedules.failures).remove(&job.name);
            }
            Err(error) => {
                log::warn!(
                    "job {}: its scheduled verification failed: {error}; trying again in {} s",
                    job.name,
                    schedule.every_secs
                );
                lock(&schedules.failures).insert(job.name.clone(), Instant::now());
            }
        }
    }
    Ok(())
}
