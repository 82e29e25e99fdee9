//! snapshot+cdc from MariaDB under a concurrent write load, with sluice SIGKILLed at 20 moments
//! spread over the copy and the stream: the target ends equal to the source, row for row, into
//! PostgreSQL and into MariaDB. And a sampler that reads the target while transfers run never
//! sees the sum of balances change: no source transaction is ever half applied.

use crate::support;

use std::time::Duration;

use support::workload::{
    assert_same, committed, create_tables, rows, source_position, stream_position, Load, Random, ACCOUNTS,
};
use support::{kill, mariadb, mysql_url, postgres_url, psql, signal, unique_name, wait_for, Guard, Workspace};

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
        let namespace = format!("{database}_{target}");
        let name = namespace.replace('_', "-");
        let text = format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {namespace}\nparallelism: 2\nlimits: {{{limits}}}\n"
        );
        let file = workspace.write("job.yaml", &text);
        Job { workspace, file, name, target, namespace }
    }

    fn start(&self) -> Guard {
        let target_url = if self.target == "postgres" { postgres_url() } else { mysql_url() };
        self.workspace.start_run(&self.file, &mysql_url(), &target_url, &["--summary-json", "summary.json"])
    }

    /// Waits until the target holds everything the source committed up to now; on a timeout,
    /// ends the run and shows what it said.
    fn wait_converged(&self, child: &mut Guard) {
        let source = source_position();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while stream_position(self.target, &self.name).is_none_or(|at| at < source) {
            let exited = child.try_wait().expect("poll the run").is_some();
            if exited || std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                let output = child.stderr_text();
                panic!(
                    "the stream did not reach the source's position {source:?} (at {:?}):\n{output}",
                    stream_position(self.target, &self.name),
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops a run with SIGTERM, which for a stream is its normal end; returns its output.
    fn stop(&self, child: Guard) -> String {
        let child = child.into_inner();
        signal(&child, "TERM");
        let output = child.wait_with_output().expect("the run ends");
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(!text.contains("panicked"), "{text}");
        assert_eq!(output.status.code(), Some(0), "a stopped stream exits 0:\n{text}");
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
    // The last run catches up with the source as it stood at its start before it may say it is
    // streaming: a row written once this run has committed (so has read that start) makes it
    // commit past it, whatever other tests write meanwhile.
    let before = stream_position(target, &job.name);
    let mut child = job.start();
    let marker = |id: u64| mariadb(&format!("INSERT INTO {database}.items VALUES ({id}, 0, 'marker {id}')"));
    marker(1_000_000_001);
    wait_for("a commit of the last run", Duration::from_secs(60), || stream_position(target, &job.name) != before);
    marker(1_000_000_002);
    job.wait_converged(&mut child);
    let output = job.stop(child);
    job.assert_equal_to_source(&database);
    assert!(output.contains("stopped"), "{output}");
    let summary = support::summary(&job.workspace.path("summary.json"));
    assert_eq!(summary["stream"]["phase"], "streaming", "{summary}");
    assert!(summary["stream"]["latency_p99_ms"].is_u64(), "{summary}");
    // The state directory holds the stream's last status too, lag included.
    let state = rusqlite::Connection::open(job.workspace.path(".sluice/state.db")).unwrap();
    let status: String =
        state.query_row("SELECT status FROM stream_status WHERE job = ?1", [&job.name], |row| row.get(0)).unwrap();
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(status["lag_seconds"].is_u64() && status["rows_applied"].as_u64() > Some(0), "{status}");
}

#[test]
fn snapshot_and_stream_survive_kills_into_postgres() {
    survives_kills("postgres");
}

#[test]
fn snapshot_and_stream_survive_kills_into_mysql() {
    survives_kills("mysql");
}

/// What a sampler found in the target's accounts table: nothing yet, or a row count, the sum of
/// balances and the balances themselves.
#[derive(Debug, Clone, PartialEq)]
enum Sample {
    Absent,
    Present { count: u64, sum: String, balances: String },
}

/// Reads the target's accounts in one statement; a table that does not exist yet is `Absent`.
fn sample(target: &str, namespace: &str) -> Sample {
    let sql = format!(
        "SELECT count(*), sum(balance), {} FROM {namespace}.accounts",
        if target == "postgres" {
            "string_agg(balance::text, ',' ORDER BY id)"
        } else {
            "group_concat(balance ORDER BY id SEPARATOR ',')"
        }
    );
    let output = if target == "postgres" {
        std::process::Command::new("psql")
            .args([postgres_url().as_str(), "-X", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-c", &sql])
            .output()
    } else {
        support::mariadb_client()
            .args(["--skip-column-names", "-e", &format!("SET SESSION group_concat_max_len = 1000000; {sql}")])
            .output()
    }
    .expect("run the target's client");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        assert!(stderr.contains("does not exist") || stderr.contains("doesn't exist"), "sampling failed: {stderr}");
        return Sample::Absent;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.trim_end_matches('\n').split('\t');
    let count = fields.next().and_then(|count| count.parse().ok()).unwrap_or_else(|| panic!("a count in {text:?}"));
    Sample::Present {
        count,
        sum: fields.next().unwrap_or_default().to_owned(),
        balances: fields.next().unwrap_or_default().to_owned(),
    }
}

/// Whether the target holds the accounts' copy under its hidden name.
fn hidden_copy_exists(target: &str, namespace: &str) -> bool {
    let sql = format!(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{namespace}' AND table_name = '_sluice_copy_accounts'"
    );
    let found = if target == "postgres" { psql(&sql) } else { mariadb(&sql) };
    found.trim() == "1"
}

/// Fails at once when the sampler thread ended (its assertion failed).
fn sampling<T>(sampler: &std::thread::JoinHandle<T>) {
    assert!(!sampler.is_finished(), "the sampler stopped: it saw a state the source never had (its message is above)");
}

/// Transfers move money between accounts in multi-statement transactions from before the job
/// starts, while a sampler reads the target from the job's first moment on, through SIGKILLs
/// during the copy and the replay window: every sample that finds the accounts table sees every
/// account and the source's total. The copy is published whole once the stream passes the
/// copy's end; before that the table is not there.
fn transfers_are_never_seen_half_applied(target: &'static str) {
    const KILLS: usize = 6;
    let database = unique_name("bank");
    create_tables(&database);
    // Small splits read slowly: the copy takes seconds, and transfers land between its reads.
    let job = Job::new(&database, target, "batch_rows: 100, split_rows: 40, rows_per_sec: 1500");
    let mut random = Random::from_environment(&format!("transfers_are_never_seen_half_applied({target})"));
    let load = Load::start(&database, random.clone(), 500);
    let total = (ACCOUNTS * 1000).to_string();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let published_samples = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let (stop, namespace, total) = (stop.clone(), job.namespace.clone(), total.clone());
        let published_samples = published_samples.clone();
        std::thread::spawn(move || {
            let (mut absent, mut present) = (0u64, 0u64);
            let mut states = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match sample(target, &namespace) {
                    Sample::Absent => {
                        assert_eq!(present, 0, "the accounts table went away after it was published");
                        absent += 1;
                    }
                    Sample::Present { count, sum, balances } => {
                        assert_eq!(
                            (count, sum.as_str()),
                            (ACCOUNTS, total.as_str()),
                            "a sample saw a state the source never had"
                        );
                        present += 1;
                        published_samples.store(present, std::sync::atomic::Ordering::Relaxed);
                        states.insert(balances);
                    }
                }
                // Paced, so the sampler's clients leave the machine's two cores to the run.
                std::thread::sleep(Duration::from_millis(5));
            }
            (absent, present, states.len())
        })
    };
    // Kills while the copy runs and while the stream replays the window: each run is killed
    // once it committed more than the last one, after a random moment more.
    let mut seen = 0;
    let mut hidden_seen = 0;
    for _ in 0..KILLS {
        let mut child = job.start();
        wait_for("progress in the target", Duration::from_secs(60), || {
            sampling(&sampler);
            committed(target, &job.name) > seen
        });
        // While the copy runs it is there under its hidden name only.
        if sample(target, &job.namespace) == Sample::Absent && hidden_copy_exists(target, &job.namespace) {
            hidden_seen += 1;
        }
        std::thread::sleep(Duration::from_millis(random.below(400)));
        kill(&mut child);
        seen = committed(target, &job.name);
    }
    let mut child = job.start();
    let published = || matches!(sample(target, &job.namespace), Sample::Present { .. });
    wait_for("the copy to be published", Duration::from_secs(120), || {
        sampling(&sampler);
        published()
    });
    // Transfers go on streaming under the sampler for a while.
    wait_for("samples of the published table", Duration::from_secs(120), || {
        sampling(&sampler);
        published_samples.load(std::sync::atomic::Ordering::Relaxed) >= 100
    });
    load.stop();
    job.wait_converged(&mut child);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (absent, present, states) = sampler.join().expect("the sampler saw only source states");
    eprintln!("{target}: {absent} samples before the copy was published, {present} after ({states} distinct states)");
    assert!(present >= 100 && states >= 10, "{present} samples of {states} states after the copy was published");
    assert!(absent > 0, "the sampler started before the copy was published");
    assert!(hidden_seen > 0, "the copy was never seen under its hidden name");
    job.stop(child);
    job.assert_equal_to_source(&database);
    let transfers = mariadb(&format!("SELECT count(*) FROM {database}.items WHERE note = 'transfer'"));
    assert!(transfers.trim().parse::<u64>().unwrap() > 0, "the load made transfers");
}

#[test]
fn transfers_are_never_seen_half_applied_in_postgres() {
    transfers_are_never_seen_half_applied("postgres");
}

#[test]
fn transfers_are_never_seen_half_applied_in_mysql() {
    transfers_are_never_seen_half_applied("mysql");
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
    let mut child = workspace.start_run(&file, &mysql_url(), &postgres_url(), &[]);
    // On a loaded machine (a cold CI run) the stream once took over 60 s to commit its first
    // checkpoint: wait longer, and say what the run printed if it never does.
    let started = std::time::Instant::now();
    while stream_position("postgres", &name).is_none() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
        let waited = started.elapsed();
        assert!(waited < Duration::from_secs(180), "the stream did not start in {waited:?}:\n{}", child.stderr_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let baseline = peak_rss_mb(child.id());
    // About 110 MB of row images in one transaction.
    mariadb(&format!(
        "INSERT INTO {database}.big SELECT seq, REPEAT(CHAR(97 + seq % 26), 100) FROM {database}.seq_1_to_{ROWS}"
    ));
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

/// Schema changes with rows before and after each: added, retyped, renamed and dropped columns,
/// a renamed table, a created, truncated and dropped table, all carried into PostgreSQL and
/// MySQL; then a change the binlog cannot carry stops both jobs naming the statement.
#[test]
fn ddl_during_the_stream_is_carried_or_stops_precisely() {
    let database = unique_name("ddl");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, a VARCHAR(20), b INT);
         INSERT INTO {database}.t VALUES (1, 'a', 1)"
    ));
    let jobs: Vec<Job> = ["postgres", "mysql"].into_iter().map(|target| Job::new(&database, target, "")).collect();
    let mut children: Vec<Guard> = jobs.iter().map(Job::start).collect();
    for job in &jobs {
        wait_for("the stream to start", Duration::from_secs(60), || stream_position(job.target, &job.name).is_some());
    }
    mariadb(&format!(
        "USE {database};
         INSERT INTO t VALUES (2, 'b', 2);
         ALTER TABLE t ADD COLUMN c VARCHAR(10) NULL;
         INSERT INTO t VALUES (3, 'c', 3, 'x'); UPDATE t SET c = 'y' WHERE id = 1;
         ALTER TABLE t MODIFY COLUMN b BIGINT;
         INSERT INTO t VALUES (4, 'd', 5000000000, 'z');
         ALTER TABLE t CHANGE COLUMN a a2 VARCHAR(30);
         INSERT INTO t VALUES (5, 'longer than twenty characters', 5, NULL);
         ALTER TABLE t DROP COLUMN c;
         INSERT INTO t VALUES (6, 'f', 6); DELETE FROM t WHERE id = 2;
         RENAME TABLE t TO t_renamed;
         INSERT INTO t_renamed VALUES (7, 'g', 7);
         CREATE TABLE t2 (id INT PRIMARY KEY, v VARCHAR(10));
         INSERT INTO t2 VALUES (1, 'one'), (2, 'two');
         TRUNCATE TABLE t2;
         INSERT INTO t2 VALUES (3, 'three');
         CREATE TABLE t3 (id INT PRIMARY KEY); INSERT INTO t3 VALUES (1); DROP TABLE t3;"
    ));
    for (job, child) in jobs.iter().zip(&mut children) {
        job.wait_converged(child);
        for (table, columns) in [("t_renamed", &["id", "a2", "b"][..]), ("t2", &["id", "v"][..])] {
            let source = rows("mysql", &format!("{database}.{table}"), columns);
            let target = rows(job.target, &format!("{}.{table}", job.namespace), columns);
            assert_same(&format!("{} {table}", job.target), &source, &target);
        }
        let gone = if job.target == "postgres" {
            psql(&format!(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name IN ('t', 't3')",
                job.namespace
            ))
        } else {
            mariadb(&format!(
                "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{}' AND TABLE_NAME IN ('t', 't3')",
                job.namespace
            ))
        };
        assert_eq!(gone.trim(), "0", "{}: the renamed and dropped tables are gone", job.target);
    }

    mariadb(&format!("ALTER TABLE {database}.t_renamed ADD COLUMN d INT NOT NULL DEFAULT 5"));
    for mut child in children {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "the job did not stop at the unsupported DDL");
            std::thread::sleep(Duration::from_millis(50));
        }
        let output = child.into_inner().wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("unsupported DDL") && stderr.contains("ADD COLUMN d INT NOT NULL DEFAULT 5"),
            "{stderr}"
        );
    }
}

/// A snapshot+cdc job into a PostgreSQL database no job has written to (no `sluice` schema yet)
/// copies and streams: looking for its checkpoints before it made their table finds none.
#[test]
fn a_snapshot_and_stream_into_a_postgres_database_no_job_used_starts() {
    let database = unique_name("freshdb");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY); INSERT INTO {database}.t VALUES (1), (2)"
    ));
    psql(&format!("CREATE DATABASE {database}"));
    let base = postgres_url();
    let target = format!("{}/{database}", base.rsplit_once('/').expect("a database in the URL").0);
    let count = || {
        let output = std::process::Command::new("psql")
            .args([target.as_str(), "-X", "-At", "-c", &format!("SELECT count(*) FROM {database}.t")])
            .output()
            .expect("run psql");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let workspace = Workspace::new();
    let file = workspace.write(
        "job.yaml",
        &format!(
            "name: fresh\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n"
        ),
    );
    let child = workspace.start_run(&file, &mysql_url(), &target, &[]);
    let stderr = child.stderr_view();
    wait_for("the copy", Duration::from_secs(60), || count() == "2" || stderr().contains("ERROR"));
    mariadb(&format!("INSERT INTO {database}.t VALUES (3)"));
    wait_for("the streamed row", Duration::from_secs(60), || count() == "3" || stderr().contains("ERROR"));
    let child = child.into_inner();
    signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(count(), "3", "{stderr}");
    mariadb(&format!("DROP DATABASE {database}"));
    psql(&format!("DROP DATABASE {database} WITH (FORCE)"));
}
