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

/// `sluice ARGS` with `SOURCE` (the test MariaDB) and `TARGET` in its environment; asserts the
/// test password appears nowhere in its output.
fn sluice_into(workspace: &Workspace, arguments: &[&str], target: &str) -> support::Run {
    let output = workspace.command(arguments).env("SOURCE", mysql_url()).env("TARGET", target).output().unwrap();
    let run = support::Run::from(output);
    assert!(!run.all().contains(&support::canary()), "the password printed:\n{}", run.all());
    run
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
    // `sluice verify` reads ClickHouse back and finds it equal.
    let verified = support::Run::from(
        workspace
            .command(&["verify", file.to_str().unwrap(), "--json"])
            .env("SOURCE", mysql_url())
            .env("TARGET", clickhouse::url())
            .output()
            .unwrap(),
    );
    assert_eq!(verified.code, 0, "{}", verified.all());
    let report: serde_json::Value = serde_json::from_str(&verified.stdout).unwrap();
    let compared: u64 =
        report["tables"].as_array().unwrap().iter().map(|table| table["rows_target"].as_u64().unwrap()).sum();
    assert_eq!(compared as usize, items.len() + accounts.len(), "{}", verified.stdout);

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

/// MySQL's types and edge values, with the text ClickHouse's client shows for each.
const TYPES: &[(&str, &str, &str, &str)] = &[
    // (column, MySQL type, value, ClickHouse's text)
    ("c_tiny", "TINYINT", "-128", "-128"),
    ("c_utiny", "TINYINT UNSIGNED", "255", "255"),
    ("c_flag", "TINYINT(1)", "1", "1"),
    ("c_small", "SMALLINT", "-32768", "-32768"),
    ("c_umedium", "MEDIUMINT UNSIGNED", "16777215", "16777215"),
    ("c_int", "INT", "-2147483648", "-2147483648"),
    ("c_uint", "INT UNSIGNED", "4294967295", "4294967295"),
    ("c_big", "BIGINT", "-9223372036854775808", "-9223372036854775808"),
    ("c_ubig", "BIGINT UNSIGNED", "18446744073709551615", "18446744073709551615"),
    ("c_dec", "DECIMAL(10,2)", "-99999999.99", "-99999999.99"),
    ("c_wide", "DECIMAL(65,30)", "'-0.5'", "-0.500000000000000000000000000000"),
    ("c_float", "FLOAT", "1.5", "1.5"),
    ("c_double", "DOUBLE", "0.1", "0.1"),
    ("c_bit", "BIT(8)", "b'101'", "5"),
    ("c_date", "DATE", "'2024-02-29'", "2024-02-29"),
    ("c_datetime", "DATETIME", "'2105-12-31 23:59:59'", "2105-12-31 23:59:59"),
    ("c_precise", "DATETIME(6)", "'1960-02-29 01:02:03.123456'", "1960-02-29 01:02:03.123456"),
    ("c_stamp", "TIMESTAMP", "'2024-02-29 01:02:03'", "2024-02-29 01:02:03"),
    ("c_time", "TIME", "'-838:59:59'", "-838:59:59"),
    ("c_year", "YEAR", "2155", "2155"),
    ("c_char", "CHAR(5)", "'ab'", "ab"),
    ("c_text", "TEXT", "'tab\\there\\nline ü 😀'", "tab\\there\\nline ü 😀"),
    ("c_blob", "BLOB", "x'00ff5c09'", "00FF5C09"),
    ("c_json", "JSON", "'{\"a\": [1, 2.50]}'", "{\"a\": [1, 2.50]}"),
    ("c_enum", "ENUM('a','b')", "'b'", "b"),
    ("c_set", "SET('x','y','z')", "'x,z'", "x,z"),
];

/// Rows 1 and 3 (copied, then streamed) with every type's edge value, row 2 all NULL: equal
/// in ClickHouse as its client shows them. A date ClickHouse 18.16 cannot hold is refused,
/// naming the column, and kept as a dirty record.
#[test]
fn every_mysql_type_lands_in_clickhouse_equal_or_refused_by_name() {
    let database = unique_name("ch_types");
    let name = database.replace('_', "-");
    let columns: Vec<String> =
        TYPES.iter().map(|(column, data_type, _, _)| format!("{column} {data_type} NULL")).collect();
    let values: Vec<&str> = TYPES.iter().map(|(_, _, value, _)| *value).collect();
    let nulls = vec!["NULL"; TYPES.len()].join(", ");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database}; SET time_zone = '+00:00';
         CREATE TABLE types (id INT PRIMARY KEY, {});
         INSERT INTO types VALUES (1, {}), (2, {nulls});
         CREATE TABLE dates (id INT PRIMARY KEY, d DATE NOT NULL);
         INSERT INTO dates VALUES (1, '2000-01-01'), (2, '1969-12-31');",
        columns.join(", "),
        values.join(", ")
    ));
    let workspace = Workspace::new();
    let file = workspace.write("job.yaml", &job_text(&name, &database, "snapshot+cdc", "max_dirty_records: 5"));
    let mut child = workspace.start_run(&file, &mysql_url(), &clickhouse::url(), &[]);
    wait_for("the stream to start", Duration::from_secs(60), || stream_position(&name).is_some());
    mariadb(&format!(
        "USE {database}; SET time_zone = '+00:00'; INSERT INTO types VALUES (3, {}); INSERT INTO dates VALUES (3, '2105-12-31'), (4, '2106-01-01');",
        values.join(", ")
    ));
    let source = source_position();
    wait_for("the stream to reach the source", Duration::from_secs(60), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
        stream_position(&name).is_some_and(|at| at >= source)
    });
    // Stopped, not killed: the run lists its dirty records as it ends.
    support::signal(&child, "TERM");
    child.wait().unwrap();
    let output = child.stderr_text();
    assert!(output.contains("dirty record"), "{output}");
    assert!(!output.contains(&support::canary()), "the password printed:\n{output}");

    let selected: Vec<String> = TYPES
        .iter()
        .map(|(column, _, _, _)| if *column == "c_blob" { format!("hex({column})") } else { (*column).to_owned() })
        .collect();
    let answer =
        clickhouse::query(&format!("SELECT id, {} FROM {database}.types_live ORDER BY id", selected.join(", ")));
    let lines: Vec<&str> = answer.lines().collect();
    assert_eq!(lines.len(), 3, "{answer}");
    for (line, id) in [(lines[0], "1"), (lines[2], "3")] {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields[0], id);
        for ((column, data_type, value, expected), found) in TYPES.iter().zip(&fields[1..]) {
            assert_eq!(found, expected, "row {id}, {column} {data_type} = {value}");
        }
    }
    let nulls: Vec<&str> = lines[1].split('\t').skip(1).collect();
    // hex(NULL) is an empty text in ClickHouse 18.16; every other column shows \N.
    assert!(nulls.iter().all(|field| *field == "\\N" || field.is_empty()), "row 2: {}", lines[1]);

    let dates = clickhouse::query(&format!("SELECT id, d FROM {database}.dates_live ORDER BY id"));
    assert_eq!(dates, "1\t2000-01-01\n3\t2105-12-31\n", "the dates ClickHouse holds, the others refused");
    let dirty = std::fs::read_to_string(workspace.path(&format!(".sluice/{name}/dirty.jsonl"))).unwrap();
    let reasons: Vec<serde_json::Value> = dirty.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(reasons.len(), 2, "{dirty}");
    for (record, year) in reasons.iter().zip(["1969", "2106"]) {
        let reason = record["reason"].as_str().unwrap();
        assert!(reason.contains(&format!("column d: year {year} is outside the years")), "{reason}");
    }
}

/// The job's change stream task as a node's API shows it.
fn stream_task(node: &support::cluster::Server, job: &str) -> serde_json::Value {
    let view = node.call("GET", &format!("/jobs/{job}"), None, None).1;
    view["tasks"]
        .as_array()
        .and_then(|tasks| tasks.iter().find(|task| task["kind"] == "cdc").cloned())
        .unwrap_or_default()
}

/// A MySQL → ClickHouse `snapshot+cdc` job on two nodes under load: the stream's node SIGKILLed,
/// then the next one SIGSTOPped past its lease and woken: the stream moves each time, the woken
/// worker stops (its lease ended, or its commit is FENCED), FINAL never shows a key twice, and
/// ClickHouse ends equal to the source.
#[test]
fn a_clickhouse_job_fails_over_on_a_cluster_and_a_woken_worker_is_fenced() {
    use support::cluster::{start_server, Etcd, Server};
    let database = unique_name("ch_cluster");
    let job = database.replace('_', "-");
    create_tables(&database);
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", clickhouse::url())];
    let start = |index: usize| start_server(&workspace, &format!("node{index}"), Some(&etcd.endpoints), &environment);
    let mut nodes: Vec<Option<Server>> = vec![Some(start(0)), Some(start(1))];
    let text = format!(
        "name: {job}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: clickhouse\n  url: ${{SLUICE_VAR_TARGET}}\n  create_tables: true\nparallelism: 2\n"
    );
    let any = |nodes: &[Option<Server>]| -> usize { nodes.iter().position(Option::is_some).expect("a live node") };
    let (status, body) = nodes[0].as_ref().unwrap().call("POST", "/jobs", None, Some(("application/yaml", &text)));
    assert_eq!(status, 201, "{body}");
    let load = Load::start(&database, Random::from_environment("clickhouse cluster"), 200);
    let sampler = Sampler::start(&database);
    let logs = |nodes: &[Option<Server>]| -> String {
        nodes.iter().flatten().map(|node| format!("--- {}\n{}", node.id, node.output())).collect()
    };
    // The stream's node, once it runs and applies.
    let owner = |nodes: &[Option<Server>]| -> (usize, u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let task = stream_task(nodes[any(nodes)].as_ref().unwrap(), &job);
            if task["state"] == "running" && task["epoch"].is_u64() {
                let worker = task["worker"].as_str().unwrap_or_default();
                if let Some(index) = nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == worker)) {
                    return (index, task["epoch"].as_u64().unwrap());
                }
            }
            assert!(std::time::Instant::now() < deadline, "the stream does not run: {task:#}\n{}", logs(nodes));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Waits until the stream applied more changes since `before`, owned by a node not `old`.
    let moved = |nodes: &[Option<Server>], old: &str, epoch: u64| {
        let before = committed(&job);
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let task = stream_task(nodes[any(nodes)].as_ref().unwrap(), &job);
            let elsewhere = task["worker"].is_string() && task["worker"] != old;
            if elsewhere && task["epoch"].as_u64().is_some_and(|new| new > epoch) && committed(&job) > before {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the stream did not move: {task:#}\n{}", logs(nodes));
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    let (victim, epoch) = owner(&nodes);
    let before = committed(&job);
    wait_for("the stream to apply", Duration::from_secs(60), || committed(&job) > before);
    let mut killed = nodes[victim].take().unwrap();
    kill(&mut killed.child);
    moved(&nodes, &killed.id, epoch);
    drop(killed);
    nodes[victim] = Some(start(victim));

    let (victim, epoch) = owner(&nodes);
    let zombie = nodes[victim].take().unwrap();
    support::signal(&zombie.child, "STOP");
    moved(&nodes, &zombie.id, epoch);
    support::signal(&zombie.child, "CONT");
    wait_for("the woken worker to stop its task", Duration::from_secs(30), || {
        let output = zombie.output();
        output.contains("lease ended") || output.contains("FENCED")
    });
    nodes[victim] = Some(zombie);

    load.stop();
    let source = source_position();
    wait_for("the stream to reach the source", Duration::from_secs(120), || {
        stream_position(&job).is_some_and(|at| at >= source)
    });
    let samples = sampler.finish();
    assert!(samples > 10, "only {samples} samples read rows");
    let items = rows("mysql", &format!("{database}.items"), &["id", "v", "note"]);
    let copied = clickhouse::query(&format!(
        "SELECT concat(toString(id), '|', toString(v), '|', ifNull(note, 'NULL')) FROM {database}.items_live ORDER BY id"
    ));
    support::workload::assert_same("items", &items, &copied.lines().map(str::to_owned).collect::<Vec<_>>());
    let total = clickhouse::query(&format!("SELECT sum(balance), count() FROM {database}.accounts_live"));
    assert_eq!(total.trim(), format!("{}\t{ACCOUNTS}", ACCOUNTS * 1000), "the transfers' invariant");
}

/// A ClickHouse that speaks HTTPS only: a job reaches it with the CA that signed its certificate
/// and the host name the certificate holds; another CA, another host name or plain HTTP fail
/// at once, naming TLS or HTTPS, and print no password.
#[test]
fn a_clickhouse_over_https_is_reached_with_its_ca_and_refused_otherwise() {
    let certs = std::env::var("SLUICE_TEST_TLS_DIR").expect("SLUICE_TEST_TLS_DIR is set by scripts/test.sh");
    let server = support::testdb::start_with("clickhouse", &["--tls", &certs]);
    let url = server.url().to_owned();
    let database = unique_name("ch_tls");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.items (id INT PRIMARY KEY, name VARCHAR(20)); \
         INSERT INTO {database}.items VALUES (1, 'one'), (2, 'two');"
    ));
    let workspace = Workspace::new();
    let run = |name: &str, target: String| {
        let file = workspace.write(
            &format!("{name}.yaml"),
            &format!(
                "name: {name}\nmode: snapshot\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
                 target:\n  type: clickhouse\n  url: ${{TARGET}}\n  create_tables: true\n"
            ),
        );
        sluice_into(&workspace, &["run", file.to_str().unwrap(), "--state-dir", &format!("state-{name}")], &target)
    };
    let at = |host: &str, query: &str| {
        let url = url.replace("@127.0.0.1:", &format!("@{host}:"));
        format!("{url}{query}")
    };
    let ca = format!("?ca={certs}/ca.pem");
    run("verified", at("localhost", &ca)).assert_code(0);
    let rows = clickhouse::query_on(&server, &format!("SELECT id, name FROM {database}.items_live ORDER BY id"));
    assert_eq!(rows, "1\tone\n2\ttwo\n");

    for (name, target, said) in [
        ("other-ca", at("localhost", &format!("?ca={certs}/other-ca.pem")), "the TLS handshake failed"),
        ("wrong-host", at("127.0.0.1", &ca), "the TLS handshake failed"),
        ("no-ca", at("localhost", ""), "the TLS handshake failed"),
        ("plain", at("localhost", "").replacen("https://", "http://", 1), "needs https://"),
    ] {
        let started = std::time::Instant::now();
        let refused = run(name, target);
        assert_ne!(refused.code, 0, "{name}: {}", refused.all());
        assert!(refused.all().contains(said), "{name}: {}", refused.all());
        assert!(started.elapsed() < Duration::from_secs(30), "{name}: not at once ({:?})", started.elapsed());
    }
}

/// A PostgreSQL source into ClickHouse: `snapshot+cdc` of keyed tables under a load of inserts,
/// updates, deletes, key moves and transfers, killed once in the stream; ClickHouse ends equal
/// to the source by `sluice verify` and by its own client, the transfers' sum intact.
#[test]
fn a_postgres_source_streams_into_clickhouse_exactly_once_through_a_kill() {
    use support::postgres_source::SourceDatabase;
    use support::workload::Client;
    let source = SourceDatabase::create("pgch");
    let schema = source.name.clone();
    let job = schema.replace('_', "-");
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, {ACCOUNTS}) g;
         CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL, note text, amount numeric(12,2), at timestamptz);
         INSERT INTO items SELECT g, g % 1000, 'item ' || g, g * 1.25, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 second'
         FROM generate_series(1, 5000) g;"
    ));
    let workspace = Workspace::new();
    let file = workspace.write(
        "job.yaml",
        &format!(
            "name: {job}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\n\
             target:\n  type: clickhouse\n  url: ${{TARGET}}\n  create_tables: true\n  commit_interval_secs: 1\n"
        ),
    );
    let mut client = Client::spawn({
        let mut psql = std::process::Command::new("psql");
        psql.args([source.url().as_str(), "-X", "-q"]);
        psql
    });
    client.send(&format!("SET search_path = {schema};"));
    let mut random = Random::from_environment("postgres into clickhouse");
    let mut next_id = 5_001;
    let load = Load::paced(client, 200, move || {
        let id = 1 + random.below(next_id);
        next_id += 1;
        match random.below(10) {
            0..=2 => format!("INSERT INTO items VALUES ({}, 1, 'new', 9.99, now());", next_id - 1),
            3..=4 => format!(
                "UPDATE items SET v = v + 1, note = 'u{}', amount = amount + 0.01 WHERE id = {id};",
                random.below(100)
            ),
            5 => format!("DELETE FROM items WHERE id = {id};"),
            6 => format!("UPDATE items SET id = {} WHERE id = {id};", next_id - 1),
            _ => {
                let (from, to) = (1 + random.below(ACCOUNTS), 1 + random.below(ACCOUNTS));
                format!(
                    "BEGIN; UPDATE accounts SET balance = balance - 7 WHERE id = {from}; \
                     UPDATE accounts SET balance = balance + 7 WHERE id = {to}; COMMIT;"
                )
            }
        }
    });
    let sampler = Sampler::start(&schema);
    let start = || workspace.start_run(&file, &source.url(), &clickhouse::url(), &[]);
    let stored = || {
        let text = clickhouse::try_query(&format!(
            "SELECT argMax(position, (epoch, written)) FROM sluice.checkpoints WHERE job = '{job}' AND task = 'stream'"
        ))?;
        let position: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
        support::postgres_source::lsn(position["at"]["lsn"].as_str()?)
    };
    let mut run = start();
    wait_for("the stream to apply", Duration::from_secs(120), || {
        assert!(run.try_wait().unwrap().is_none(), "the run ended:\n{}", run.stderr_text());
        stored().is_some_and(|at| at > 0) && committed(&job) > 5_000 + ACCOUNTS
    });
    kill(&mut run);
    let mut run = start();
    load.stop();
    let now = source.wal_position();
    wait_for("the stream to reach the source", Duration::from_secs(120), || {
        assert!(run.try_wait().unwrap().is_none(), "the run ended:\n{}", run.stderr_text());
        stored().is_some_and(|at| at >= now)
    });
    kill(&mut run);
    assert!(sampler.finish() > 0, "the sampler read rows");

    let total = clickhouse::query(&format!("SELECT sum(balance), count() FROM {schema}.accounts_live"));
    assert_eq!(total.trim(), format!("{}\t{ACCOUNTS}", ACCOUNTS * 1000), "the transfers' invariant");
    let count = clickhouse::query(&format!("SELECT count() FROM {schema}.items_live"));
    assert_eq!(count.trim(), source.sql(&format!("SELECT count(*) FROM {schema}.items")).trim());
    let verified = support::Run::from(
        workspace
            .command(&["verify", file.to_str().unwrap(), "--json"])
            .env("SOURCE", source.url())
            .env("TARGET", clickhouse::url())
            .output()
            .unwrap(),
    );
    assert_eq!(verified.code, 0, "{}", verified.all());
}

/// A table emptied in ClickHouse behind the job's back has its checkpoints forgotten: the next
/// run copies it again instead of trusting checkpoints that say it is done.
#[test]
fn a_clickhouse_table_emptied_behind_the_jobs_back_is_copied_again() {
    let database = unique_name("ch_emptied");
    let name = database.replace('_', "-");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.items (id INT PRIMARY KEY, v INT); \
         USE {database}; INSERT INTO items SELECT seq, seq FROM seq_1_to_1000;"
    ));
    let workspace = Workspace::new();
    let file = workspace.write("job.yaml", &job_text(&name, &database, "snapshot", ""));
    let count = || clickhouse::query(&format!("SELECT count(), sum(v) FROM {database}.items_live"));
    workspace.run_job(&file, &mysql_url(), &clickhouse::url()).assert_code(0);
    assert_eq!(count(), "1000\t500500\n");
    clickhouse::query(&format!("TRUNCATE TABLE {database}.items"));
    let again = workspace.run_job(&file, &mysql_url(), &clickhouse::url());
    again.assert_code(0);
    assert_eq!(count(), "1000\t500500\n", "{}", again.all());
}

/// `sluice check` only reads a ClickHouse target: on a fresh server it says the first run makes
/// the checkpoints' tables and makes nothing itself; a read-only session (`?readonly=1`) fails
/// the check naming the setting, and so does a run (which checks first).
#[test]
fn check_reads_a_clickhouse_target_without_writing_and_refuses_a_read_only_user() {
    let server = support::testdb::start_with("clickhouse", &[]);
    let url = server.url().to_owned();
    let database = unique_name("ch_check");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.items (id INT PRIMARY KEY);"));
    let workspace = Workspace::new();
    let file = workspace.write("job.yaml", &job_text("ch-check", &database, "snapshot", ""));
    let check = |target: String| sluice_into(&workspace, &["check", file.to_str().unwrap()], &target);
    let fresh = check(url.clone());
    fresh.assert_code(0);
    assert!(fresh.all().contains("the first run creates the database `sluice`"), "{}", fresh.all());
    let databases =
        clickhouse::query_on(&server, "SELECT name FROM system.databases WHERE name NOT IN ('system', 'default')");
    assert_eq!(databases, "", "check made a database");

    let read_only = check(format!("{url}/?readonly=1"));
    assert_eq!(read_only.code, 1, "{}", read_only.all());
    assert!(read_only.all().contains("the user is read-only (readonly = 1)"), "{}", read_only.all());
    // A run checks first, so it is refused before it reads a row, with the same fix.
    let run = workspace.run_job(&file, &mysql_url(), &format!("{url}/?readonly=1"));
    assert_ne!(run.code, 0, "{}", run.all());
    assert!(run.all().contains("the user is read-only (readonly = 1)"), "{}", run.all());
}
