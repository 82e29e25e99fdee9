//! ClickHouse as a target: MySQL's snapshot and change stream through SIGKILLs under load, and
//! MySQL's types, read back with ClickHouse's own client.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::workload::{create_tables, rows, source_position, Load, Random, ACCOUNTS};
use support::{clickhouse, kill, mariadb, mysql_url, unique_name, wait_for, Guard, Workspace};

fn job_text(name: &str, database: &str, mode: &str, errors: &str) -> String {
    format!(
        "name: {name}\nmode: {mode}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: clickhouse\n  url: ${{TARGET}}\n  create_tables: true\n  commit_interval_secs: 1\n\
         limits: {{split_rows: 500, batch_rows: 200}}\nerrors: {{{errors}}}\n"
    )
}

/// The stream's position in ClickHouse's `sluice.checkpoints`, as (file sequence, offset).
fn stream_position(job: &str) -> Option<(u64, u64)> {
    let text = clickhouse::try_query(&format!(
        "SELECT argMax(position, written) FROM sluice.checkpoints WHERE job = '{job}' AND task = 'stream'"
    ))?;
    let position: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let at = &position["at"];
    Some((at["file"].as_str()?.rsplit('.').next()?.parse().ok()?, at["position"].as_u64()?))
}

/// Rows the job's tasks have committed (each task's latest checkpoint), growing with each commit.
fn committed(job: &str) -> u64 {
    clickhouse::try_query(&format!(
        "SELECT sum(rows) FROM (SELECT argMax(rows_written, written) AS rows FROM sluice.checkpoints \
         WHERE job = '{job}' GROUP BY task)"
    ))
    .and_then(|text| text.trim().parse().ok())
    .unwrap_or(0)
}

/// Reads the tables' `FINAL` rows every 100 ms while the test runs, failing on a key seen
/// twice; counts the samples that found rows.
struct Sampler {
    stop: Arc<AtomicBool>,
    samples: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(database: &str) -> Sampler {
        let (stop, samples) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (flag, counter, database) = (stop.clone(), samples.clone(), database.to_owned());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                for table in ["items", "accounts"] {
                    let sql = format!(
                        "SELECT count(), uniqExact(id) FROM {database}.{table} FINAL WHERE _sluice_deleted = 0"
                    );
                    if let Some(answer) = clickhouse::try_query(&sql) {
                        let (rows, keys) = answer.trim().split_once('\t').expect("two numbers");
                        assert_eq!(rows, keys, "{table}: a key is seen twice in FINAL ({rows} rows, {keys} keys)");
                        if rows != "0" {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Sampler { stop, samples, thread: Some(thread) }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            if let Err(panic) = thread.join() {
                std::panic::resume_unwind(panic);
            }
        }
        self.samples.load(Ordering::Relaxed)
    }
}

#[test]
fn mysql_into_clickhouse_through_kills_shows_each_key_once_and_ends_equal() {
    let database = unique_name("ch_kills");
    let name = database.replace('_', "-");
    create_tables(&database);
    let workspace = Workspace::new();
    let file = workspace.write("job.yaml", &job_text(&name, &database, "snapshot+cdc", ""));
    let start = || workspace.start_run(&file, &mysql_url(), &clickhouse::url(), &[]);
    let mut random = Random::from_environment("clickhouse kills");
    let load = Load::start(&database, random.clone(), 300);
    let sampler = Sampler::start(&database);

    for run in 0..6 {
        let mut child: Guard = start();
        // Killed after a random number of rows more, so the kills fall at different places:
        // in the copy, between the rows of a commit and its checkpoint, in the stream.
        let wanted = committed(&name) + 1 + random.below(1_500);
        let output = child.stderr_view();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while committed(&name) < wanted {
            assert!(child.try_wait().unwrap().is_none(), "run {run} ended:\n{}", child.stderr_text());
            assert!(std::time::Instant::now() < deadline, "run {run}: no commit in 60 s:\n{}", output());
            std::thread::sleep(Duration::from_millis(50));
        }
        kill(&mut child);
        if run == 2 {
            // A column added while the job is down: the stream carries it on the next run.
            mariadb(&format!(
                "ALTER TABLE {database}.accounts ADD COLUMN note VARCHAR(20) NULL; \
                 UPDATE {database}.accounts SET note = CONCAT('n', id) WHERE id <= 10"
            ));
        }
    }
    load.stop();
    let source = source_position();
    let mut child = start();
    wait_for("the stream to reach the source", Duration::from_secs(120), || {
        assert!(child.try_wait().unwrap().is_none(), "the last run ended:\n{}", child.stderr_text());
        stream_position(&name).is_some_and(|at| at >= source)
    });
    kill(&mut child);
    let samples = sampler.finish();
    assert!(samples > 20, "only {samples} samples read rows");

    let items = rows("mysql", &format!("{database}.items"), &["id", "v", "note"]);
    let copied = clickhouse::query(&format!(
        "SELECT concat(toString(id), '|', toString(v), '|', ifNull(note, 'NULL')) FROM {database}.items_live ORDER BY id"
    ));
    support::workload::assert_same("items", &items, &copied.lines().map(str::to_owned).collect::<Vec<_>>());
    let accounts = rows("mysql", &format!("{database}.accounts"), &["id", "balance", "note"]);
    let copied = clickhouse::query(&format!(
        "SELECT concat(toString(id), '|', toString(balance), '|', ifNull(note, 'NULL')) FROM {database}.accounts_live ORDER BY id"
    ));
    support::workload::assert_same("accounts", &accounts, &copied.lines().map(str::to_owned).collect::<Vec<_>>());
    let total = clickhouse::query(&format!("SELECT sum(balance) FROM {database}.accounts_live"));
    assert_eq!(total.trim(), (ACCOUNTS * 1000).to_string(), "the transfers' invariant");

    // In the table's every row (not merged yet): a key's rows of one version are one row written
    // again (a replay after a kill), never two states, so FINAL's choice cannot depend on the order
    // the rows reached the server in; the stream's rows have versions above the copy's 0, and
    // deleted keys have tombstones.
    for (table, values) in [("items", "v, ifNull(note, '')"), ("accounts", "balance, ifNull(note, '')")] {
        let clashes = clickhouse::query(&format!(
            "SELECT count() FROM (SELECT id, _sluice_version, uniqExact({values}, _sluice_deleted) AS states \
             FROM {database}.{table} GROUP BY id, _sluice_version HAVING states > 1)"
        ));
        assert_eq!(clashes.trim(), "0", "{table}: keys with two states at one version");
    }
    let kinds = clickhouse::query(&format!(
        "SELECT countIf(_sluice_version = 0) > 0, countIf(_sluice_version > 0) > 0, countIf(_sluice_deleted = 1) > 0 \
         FROM {database}.items"
    ));
    assert_eq!(kinds.trim(), "1\t1\t1", "copied rows, streamed rows and tombstones");
}
