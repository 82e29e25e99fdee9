//! snapshot+cdc from MariaDB under a concurrent write load, with sluice SIGKILLed at 20 moments
//! spread over the copy and the stream: the target ends equal to the source, row for row, into
//! PostgreSQL and into MariaDB. And a sampler that reads the target while transfers run never
//! sees the sum of balances change: no source transaction is ever half applied.

mod support;

use std::process::Child;
use std::time::Duration;

use support::workload::{
    assert_same, committed, create_tables, rows, source_position, stream_position, Load, Random, ACCOUNTS,
};
use support::{kill, mariadb, mysql_url, postgres_url, psql, signal, unique_name, wait_for, Workspace};

const KILLS: usize = 20;

struct Job {
    workspace: Workspace,
    file: std::path::PathBuf,
    name: String,
    target: &'static str,
    /// Where the copies land: a PostgreSQL schema or a MariaDB database.
    namespace: String,
}

impl Job {
    fn new(database: &str, target: &'static str, limits: &str) -> Job {
        let workspace = Workspace::new();
        let namespace = format!("{database}_copy");
        let name = namespace.replace('_', "-");
        let text = format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {namespace}\nparallelism: 2\nlimits: {{{limits}}}\n"
        );
        let file = workspace.write("job.yaml", &text);
        Job { workspace, file, name, target, namespace }
    }

    fn start(&self) -> Child {
        let target_url = if self.target == "postgres" { postgres_url() } else { mysql_url() };
        self.workspace
            .command(&["run", self.file.to_str().unwrap(), "--summary-json", "summary.json"])
            .env("SOURCE", mysql_url())
            .env("TARGET", target_url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sluice starts")
    }

    /// Waits until the target holds everything the source committed up to now; on a timeout,
    /// ends the run and shows what it said.
    fn wait_converged(&self, child: &mut Child) {
        let source = source_position();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while stream_position(self.target, &self.name).is_none_or(|at| at < source) {
            let exited = child.try_wait().expect("poll the run").is_some();
            if exited || std::time::Instant::now() > deadline {
                let _ = child.kill();
                let output = std::mem::replace(child, std::process::Command::new("true").spawn().unwrap());
                let output = output.wait_with_output().expect("the run ends");
                panic!(
                    "the stream did not reach the source's position {source:?} (at {:?}):\n{}{}",
                    stream_position(self.target, &self.name),
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops a run with SIGTERM; returns its output.
    fn stop(&self, child: Child) -> String {
        signal(&child, "TERM");
        let output = child.wait_with_output().expect("the run ends");
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(!text.contains("panicked"), "{text}");
        text
    }

    fn assert_equal_to_source(&self, database: &str) {
        for (table, columns) in [("items", &["id", "v", "note"][..]), ("accounts", &["id", "balance"][..])] {
            let source = rows("mysql", &format!("{database}.{table}"), columns);
            let target = rows(self.target, &format!("{}.{table}", self.namespace), columns);
            assert_same(table, &source, &target);
        }
    }
}

/// The load runs throughout; each run is killed once the target shows progress since the last
/// kill, at a random extra delay, so kills land in the copy, at the switch and in the stream.
fn survives_kills(target: &'static str) {
    let database = unique_name("cdc");
    create_tables(&database);
    let mut random = Random::from_environment(&format!("survives_kills({target})"));
    let job = Job::new(&database, target, "batch_rows: 500, split_rows: 1000, rows_per_sec: 20000");
    let load = Load::start(&database, random.clone(), 1_000);
    let mut seen = 0;
    let (mut kills, mut streamed_kills) = (0, 0);
    while kills < KILLS || streamed_kills < KILLS / 2 {
        let mut child = job.start();
        wait_for("progress in the target", Duration::from_secs(60), || committed(target, &job.name) > seen);
        std::thread::sleep(Duration::from_millis(random.below(300)));
        kill(&mut child);
        kills += 1;
        seen = committed(target, &job.name);
        if stream_position(target, &job.name).is_some() {
            streamed_kills += 1;
        }
        assert!(kills < 3 * KILLS, "only {streamed_kills} of {kills} kills landed in the stream");
    }
    load.stop();
    let mut child = job.start();
    job.wait_converged(&mut child);
    let output = job.stop(child);
    job.assert_equal_to_source(&database);
    assert!(output.contains("stopped"), "{output}");
    let summary = support::summary(&job.workspace.path("summary.json"));
    assert_eq!(summary["stream"]["phase"], "streaming", "{summary}");
    assert!(summary["stream"]["latency_p99_ms"].is_u64(), "{summary}");
}

#[test]
fn snapshot_and_stream_survive_kills_into_postgres() {
    survives_kills("postgres");
}

#[test]
fn snapshot_and_stream_survive_kills_into_mysql() {
    survives_kills("mysql");
}

/// Transfers move money between accounts in multi-statement transactions while a sampler reads
/// the target's total again and again: every sample must see the whole of each transfer or none
/// of it.
#[test]
fn transfers_are_never_seen_half_applied() {
    let database = unique_name("bank");
    create_tables(&database);
    let job = Job::new(&database, "postgres", "batch_rows: 500");
    let mut child = job.start();
    // The stream is past the snapshot's replay window once its checkpoint forgets the window.
    wait_for("the stream to pass the snapshot", Duration::from_secs(60), || {
        let text =
            psql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sluice' AND table_name = 'checkpoints'");
        text.trim() == "1"
            && psql(&format!(
                "SELECT count(*) FROM sluice.checkpoints WHERE job = '{}' AND task = 'stream' AND position->'replay_until' = 'null'::jsonb",
                job.name
            ))
            .trim()
                == "1"
    });
    let total = (ACCOUNTS * 1000).to_string();
    let load = Load::start(&database, Random::from_environment("transfers_are_never_seen_half_applied"), 500);
    let mut samples = 0;
    let mut changed = std::collections::BTreeSet::new();
    wait_for("enough samples of the target", Duration::from_secs(120), || {
        let sample = psql(&format!(
            "SELECT sum(balance), string_agg(balance::text, ',' ORDER BY id) FROM {}.accounts",
            job.namespace
        ));
        let (sum, balances) = sample.trim().split_once('|').expect("two columns");
        assert_eq!(sum, total, "a sample saw part of a transfer");
        samples += 1;
        changed.insert(balances.to_owned());
        samples >= 200 && changed.len() >= 20
    });
    load.stop();
    job.wait_converged(&mut child);
    job.stop(child);
    job.assert_equal_to_source(&database);
    let transfers = mariadb(&format!("SELECT count(*) FROM {database}.items WHERE note = 'transfer'"));
    assert!(transfers.trim().parse::<u64>().unwrap() > 0, "the load made transfers");
}

/// The peak resident memory of a process, from /proc.
fn peak_rss_mb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kilobytes| kilobytes / 1024)
}

/// One source transaction far larger than the configured batches streams through in pieces:
/// memory stays bounded, and the target shows none of it until all of it.
#[test]
fn a_large_transaction_streams_in_bounded_memory_and_lands_whole() {
    const ROWS: u64 = 1_000_000;
    let database = unique_name("large");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.big (id INT PRIMARY KEY, pad VARCHAR(255))"));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let file = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nlimits: {{batch_rows: 2000, queue_batches: 2}}\n"
        ),
    );
    let mut child = workspace
        .command(&["run", file.to_str().unwrap()])
        .env("SOURCE", mysql_url())
        .env("TARGET", postgres_url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the stream to start", Duration::from_secs(60), || stream_position("postgres", &name).is_some());
    let baseline = peak_rss_mb(child.id());
    // About 110 MB of row images in one transaction.
    mariadb(&format!("INSERT INTO {database}.big SELECT seq, REPEAT(CHAR(97 + seq % 26), 100) FROM {database}.seq_1_to_{ROWS}"));
    let count = || psql(&format!("SELECT count(*) FROM {database}.big")).trim().parse::<u64>().unwrap();
    wait_for("the transaction in the target", Duration::from_secs(300), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        let seen = count();
        assert!(seen == 0 || seen == ROWS, "the target showed {seen} of the transaction's {ROWS} rows");
        seen == ROWS
    });
    let peak = peak_rss_mb(child.id());
    signal(&child, "TERM");
    child.wait().unwrap();
    eprintln!("peak RSS {peak} MB (at the stream's start {baseline} MB) for a {ROWS}-row transaction");
    assert!(peak < baseline + 60, "peak RSS {peak} MB (at the stream's start {baseline} MB)");
}
