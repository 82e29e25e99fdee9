//! MySQL → Delta Lake, checked by an independent reader (Python's `deltalake`): the tables
//! follow the source through kills, compactions and an added column, and every version a reader
//! can open is a state the source had.

#![cfg(feature = "delta")]

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use support::workload::{create_tables, source_position, Load, Random, ACCOUNTS};
use support::{kill, lake, mariadb, mysql_url, signal, unique_name, wait_for, Guard, Workspace};

/// Whether a commit in a table's log holds `text`.
fn log_mentions(table: &std::path::Path, text: &str) -> bool {
    std::fs::read_dir(table.join("_delta_log")).into_iter().flatten().filter_map(|entry| entry.ok()).any(|entry| {
        entry.path().extension().is_some_and(|extension| extension == "json")
            && std::fs::read_to_string(entry.path()).is_ok_and(|commit| commit.contains(text))
    })
}

/// A `snapshot+cdc` job from a MariaDB database into Delta tables under the workspace's `lake`.
struct LakeJob {
    workspace: Workspace,
    file: PathBuf,
    name: String,
    database: String,
}

impl LakeJob {
    fn new(database: &str, target: &str, limits: &str) -> LakeJob {
        let workspace = Workspace::new();
        let name = database.replace('_', "-");
        let text = format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: delta\n  path: lake\n{target}parallelism: 2\nlimits: {{{limits}}}\n"
        );
        let file = workspace.write("job.yaml", &text);
        LakeJob { workspace, file, name, database: database.to_owned() }
    }

    fn lake(&self) -> PathBuf {
        self.workspace.path("lake")
    }

    fn table(&self, table: &str) -> PathBuf {
        self.lake().join(format!("{}.{table}", self.database))
    }

    fn start(&self) -> Guard {
        self.workspace.start_run(&self.file, &mysql_url(), "", &[])
    }

    /// Waits until the stream has committed once.
    fn wait_streaming(&self, child: &mut Guard) {
        wait_for("the stream to start", Duration::from_secs(60), || {
            assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
            lake::stream_position(&self.lake(), &self.name).is_some()
        });
    }

    /// Waits until the lake holds everything the source committed up to now.
    fn wait_converged(&self, child: &mut Guard) {
        let source = source_position();
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while lake::stream_position(&self.lake(), &self.name).is_none_or(|at| at < source) {
            if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the stream did not reach the source's position {source:?} (at {:?}):\n{}",
                    lake::stream_position(&self.lake(), &self.name),
                    child.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The source's rows of `columns`, as the lake reader prints them.
    fn source_rows(&self, table: &str, columns: &[&str]) -> Vec<String> {
        let list: Vec<String> = columns.iter().map(|column| format!("coalesce({column}, 'NULL')")).collect();
        mariadb(&format!("SELECT {} FROM {}.{table} ORDER BY {}", list.join(", "), self.database, columns[0]))
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// Under a mixed write load (inserts, updates, deletes, key moves, transfers between accounts),
/// the job is SIGKILLed 6 times through its copy and its stream, an account column is added mid
/// stream and small files are compacted every few seconds; at the end each table read at its
/// latest version equals the source row for row, and at every version of the accounts table the
/// transfers' invariant holds (no partial transaction, no partial copy).
#[test]
fn a_lake_table_follows_the_source_through_kills_compactions_and_an_added_column() {
    const KILLS: usize = 6;
    let database = unique_name("lake");
    create_tables(&database);
    let job = LakeJob::new(
        &database,
        "  commit_interval_secs: 1\n  commit_rows: 2000\n  compact_every_secs: 2\n  target_file_mb: 1\n",
        "batch_rows: 100, split_rows: 50, rows_per_sec: 1500",
    );
    let mut random = Random::from_environment("a_lake_table_follows_the_source");
    let load = Load::start(&database, random.clone(), 300);
    let mut seen = 0;
    // At least two of the kills come while the stream runs.
    let mut kill_number = 0;
    let mut stream_kills = 0;
    while kill_number < KILLS || stream_kills < 2 {
        kill_number += 1;
        let mut child = job.start();
        wait_for("progress in the lake", Duration::from_secs(90), || {
            assert!(child.try_wait().unwrap().is_none(), "the run ended early:\n{}", child.stderr_text());
            lake::commits(&job.lake(), &job.name) > seen
        });
        std::thread::sleep(Duration::from_millis(500 + random.below(2500)));
        kill(&mut child);
        if lake::stream_position(&job.lake(), &job.name).is_some() {
            stream_kills += 1;
        }
        seen = lake::commits(&job.lake(), &job.name);
        if kill_number == KILLS / 2 + 1 {
            mariadb(&format!(
                "ALTER TABLE {database}.accounts ADD COLUMN note VARCHAR(20) NULL; UPDATE {database}.accounts SET note = CONCAT('n', id) WHERE id % 7 = 0"
            ));
        }
    }
    let mut child = job.start();
    // The stream commits accounts a few times under the load before it stops, so the versions
    // checked below are more than the copy's (however slowly the kills let the stream go).
    wait_for("the stream to commit accounts under the load", Duration::from_secs(120), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early:\n{}", child.stderr_text());
        lake::log_versions(&job.table("accounts")) > 4
    });
    load.stop();
    mariadb(&format!("UPDATE {database}.accounts SET note = 'last' WHERE id = 1"));
    job.wait_converged(&mut child);
    // Appends, each in a group of its own, leave small files for the compaction to join.
    let first = mariadb(&format!("SELECT max(id) + 1 FROM {database}.items")).trim().parse::<u64>().unwrap();
    for append in 0..8 {
        let from = first + append * 10;
        mariadb(&format!(
            "INSERT INTO {database}.items SELECT seq, 1, 'appended' FROM {database}.seq_{from}_to_{}",
            from + 9
        ));
        job.wait_converged(&mut child);
    }
    wait_for("a compaction of items", Duration::from_secs(60), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early:\n{}", child.stderr_text());
        log_mentions(&job.table("items"), "\"operation\":\"OPTIMIZE\"")
    });
    signal(&child, "TERM");
    let output = child.into_inner().wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let accounts = ["id", "balance", "note"];
    assert_eq!(lake::rows(&job.table("accounts"), &accounts), job.source_rows("accounts", &accounts));
    let items = ["id", "v", "note"];
    assert_eq!(lake::rows(&job.table("items"), &items), job.source_rows("items", &items));

    let versions = lake::accounts_versions(&job.table("accounts"), 3, ACCOUNTS, (ACCOUNTS * 1000) as i64);
    for version in lake::versions(&job.table("items"), "id", "v") {
        assert_eq!(version.rows, version.distinct_keys, "version {} of items holds a key twice", version.version);
    }
    let compactions = versions
        .iter()
        .chain(&lake::versions(&job.table("items"), "id", "v"))
        .filter(|version| version.operation == "OPTIMIZE")
        .count();
    assert!(compactions > 0, "no compaction ran: {versions:?}");
    eprintln!("{} versions of accounts, {compactions} compactions", versions.len());
}

/// The same job on a two-node cluster sharing the lake directory: the node running the stream is
/// SIGKILLed, then the next one is paused past its lease and woken once the stream moved (a
/// zombie, which must not commit); the lake ends equal to the source, and every version of the
/// accounts table is a state the source had.
#[test]
fn a_lake_job_on_a_cluster_survives_a_killed_and_a_paused_node() {
    use serde_json::Value;
    use support::cluster::{start_server, Etcd, Server};

    let database = unique_name("lake_cluster");
    create_tables(&database);
    let etcd = Etcd::start(1);
    let job = LakeJob::new(
        &database,
        "  commit_interval_secs: 1\n  compact_every_secs: 3\n",
        "batch_rows: 200, split_rows: 500",
    );
    let start_node = |index: usize| -> Server {
        start_server(
            &job.workspace,
            &format!("node{index}"),
            Some(&etcd.endpoints),
            &[("SLUICE_VAR_SOURCE", mysql_url())],
        )
    };
    let mut nodes: Vec<Option<Server>> = (0..2).map(|index| Some(start_node(index))).collect();
    // A server's documents read only variables named with its prefix (`sluice run` reads any).
    let text = std::fs::read_to_string(&job.file).unwrap().replace("${SOURCE}", "${SLUICE_VAR_SOURCE}");
    let any = |nodes: &[Option<Server>]| -> Value {
        let node = nodes.iter().flatten().next().expect("a live node");
        node.call("GET", &format!("/jobs/{}", job.name), None, None).1
    };
    let (status, body) = nodes[0].as_ref().unwrap().call("POST", "/jobs", None, Some(("application/yaml", &text)));
    assert_eq!(status, 201, "{body}");
    let logs = |nodes: &[Option<Server>]| -> String {
        nodes.iter().flatten().map(|node| format!("--- {}\n{}", node.id, node.output())).collect()
    };
    let stream_task = |nodes: &[Option<Server>]| -> Value {
        any(nodes)["tasks"]
            .as_array()
            .and_then(|tasks| tasks.iter().find(|task| task["kind"] == "cdc").cloned())
            .unwrap_or_default()
    };
    let streaming_node = |nodes: &[Option<Server>]| -> usize {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let task = stream_task(nodes);
            if task["state"] == "running"
                && task["epoch"].is_u64()
                && lake::stream_position(&job.lake(), &job.name).is_some()
            {
                let worker = task["worker"].as_str().unwrap().to_owned();
                if let Some(index) = nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == worker)) {
                    return index;
                }
            }
            assert!(std::time::Instant::now() < deadline, "the stream does not run: {task:#}\n{}", logs(nodes));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let load = Load::start(&database, Random::from_environment("a_lake_job_on_a_cluster"), 200);

    // A SIGKILL of the stream's node: the other node takes the stream over.
    let victim = streaming_node(&nodes);
    let before = lake::commits(&job.lake(), &job.name);
    let mut killed = nodes[victim].take().unwrap();
    kill(&mut killed.child);
    wait_for("the stream to move after the kill", Duration::from_secs(60), || {
        stream_task(&nodes)["worker"].as_str().is_some_and(|worker| worker != killed.id)
            && lake::commits(&job.lake(), &job.name) > before + 2
    });
    nodes[victim] = Some(start_node(victim));

    // A pause past the lease: the woken worker must not commit after the new owner's claim.
    let victim = streaming_node(&nodes);
    let epoch = stream_task(&nodes)["epoch"].as_u64().unwrap();
    let zombie = nodes[victim].take().unwrap();
    signal(&zombie.child, "STOP");
    wait_for("the stream to move after the pause", Duration::from_secs(60), || {
        let task = stream_task(&nodes);
        task["worker"].as_str().is_some_and(|worker| worker != zombie.id)
            && task["epoch"].as_u64().is_some_and(|new| new > epoch)
    });
    let moved = lake::commits(&job.lake(), &job.name);
    wait_for("the new owner to commit", Duration::from_secs(60), || lake::commits(&job.lake(), &job.name) > moved + 2);
    signal(&zombie.child, "CONT");
    wait_for("the woken worker to stop its task", Duration::from_secs(30), || {
        let output = zombie.output();
        output.contains("lease ended") || output.contains("FENCED")
    });
    nodes[victim] = Some(zombie);
    load.stop();
    let source = source_position();
    wait_for("the lake to reach the source", Duration::from_secs(120), || {
        lake::stream_position(&job.lake(), &job.name).is_some_and(|at| at >= source)
    });

    let accounts = ["id", "balance"];
    assert_eq!(
        lake::rows(&job.table("accounts"), &accounts),
        job.source_rows("accounts", &accounts),
        "{}",
        logs(&nodes)
    );
    let items = ["id", "v", "note"];
    assert_eq!(lake::rows(&job.table("items"), &items), job.source_rows("items", &items));
    let total = (ACCOUNTS * 1000) as i64;
    for version in lake::versions(&job.table("accounts"), "id", "balance") {
        assert_eq!((version.rows, version.sum), (ACCOUNTS, total), "version {} of accounts", version.version);
    }
}

/// DDL a Delta table can take (a created table, an added column, a TRUNCATE) is carried; any
/// other (a dropped column) stops the job naming the statement and what to do.
#[test]
fn ddl_beyond_added_columns_stops_the_stream_precisely() {
    let database = unique_name("lake_ddl");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, a VARCHAR(20), b INT);
         INSERT INTO {database}.t VALUES (1, 'a', 1)"
    ));
    let job = LakeJob::new(&database, "  commit_interval_secs: 1\n", "");
    let mut child = job.start();
    job.wait_streaming(&mut child);
    mariadb(&format!(
        "USE {database};
         INSERT INTO t VALUES (2, 'b', 2);
         ALTER TABLE t ADD COLUMN c VARCHAR(10) NULL;
         INSERT INTO t VALUES (3, 'c', 3, 'x'); UPDATE t SET c = 'y' WHERE id = 1;
         CREATE TABLE t2 (id INT PRIMARY KEY, v VARCHAR(10));
         INSERT INTO t2 VALUES (1, 'one'), (2, 'two');
         TRUNCATE TABLE t2;
         INSERT INTO t2 VALUES (3, 'three');"
    ));
    job.wait_converged(&mut child);
    assert_eq!(lake::rows(&job.table("t"), &["id", "a", "b", "c"]), job.source_rows("t", &["id", "a", "b", "c"]));
    assert_eq!(lake::rows(&job.table("t2"), &["id", "v"]), job.source_rows("t2", &["id", "v"]));

    mariadb(&format!("ALTER TABLE {database}.t DROP COLUMN b; INSERT INTO {database}.t VALUES (4, 'd', 'z')"));
    let output = child.into_inner().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("column b is gone; a Delta target takes added columns only"), "{stderr}");
    assert!(stderr.contains("--restart"), "{stderr}");
    // The table is as it was before the statement.
    assert_eq!(lake::rows(&job.table("t"), &["id"]), ["1", "2", "3"]);
}

/// Edge values of the MySQL types, copied and streamed into a Delta table partitioned by a date
/// column, as Python's deltalake reads them (docs/types.md lists the mapping).
#[test]
fn every_type_reaches_a_partitioned_delta_table_as_readers_expect() {
    let database = unique_name("lake_types");
    let columns = "id INT PRIMARY KEY, tiny TINYINT UNSIGNED, big BIGINT UNSIGNED, money DECIMAL(10,2), \
                   wide DECIMAL(65,30), at DATETIME(6), stamp TIMESTAMP(3) NULL, d DATE, t TIME(6), \
                   name VARCHAR(20), raw VARBINARY(8), doc JSON, color ENUM('red','green'), tags SET('a','b'), \
                   bits BIT(64), y YEAR, f FLOAT, g DOUBLE";
    let row = |id: u32| {
        format!(
            "({id}, 255, 18446744073709551615, -12.5, '-99999999999999999999999999999999999.999999999999999999999999999999', \
             '2024-02-29 23:59:59.999999', '2024-03-01 10:00:00.250', '2024-02-{:02}', '-838:59:59.000001', 'ñandú ☃', \
             x'00ff', '{{\"a\": [1, 2]}}', 'green', 'a,b', b'1111111111111111111111111111111111111111111111111111111111111111', \
             2155, 1.5, -2.25)",
            id
        )
    };
    mariadb(&format!(
        "SET time_zone = '+00:00'; CREATE DATABASE {database}; CREATE TABLE {database}.types ({columns});
         INSERT INTO {database}.types VALUES {}, {}; INSERT INTO {database}.types (id, d) VALUES (3, '2024-02-03')",
        row(1),
        row(2)
    ));
    let job = LakeJob::new(&database, &format!("  partition_by: {{\"{database}.types\": [d]}}\n"), "");
    let mut child = job.start();
    job.wait_streaming(&mut child);
    mariadb(&format!("SET time_zone = '+00:00'; INSERT INTO {database}.types VALUES {}; UPDATE {database}.types SET name = 'changed' WHERE id = 2", row(4)));
    job.wait_converged(&mut child);

    // `sluice verify` reads the table back by the job's types, the partition column included:
    // every value equal; a row another writer deletes is found missing by its key.
    let verify = || {
        let mut command =
            job.workspace.command(&["verify", job.file.to_str().unwrap(), "--json", "--settle-secs", "30"]);
        let run = support::Run::from(command.env("SOURCE", mysql_url()).output().unwrap());
        let report: serde_json::Value = serde_json::from_str(&run.stdout)
            .unwrap_or_else(|error| panic!("not one JSON document ({error}):\n{}", run.all()));
        (run, report)
    };
    let (clean, report) = verify();
    assert_eq!(clean.code, 0, "{}", clean.all());
    assert_eq!(
        (report["tables"][0]["rows_source"].as_u64(), report["tables"][0]["rows_target"].as_u64()),
        (Some(4), Some(4))
    );
    lake::delete(&job.table("types"), "id = 3");
    let (found, report) = verify();
    assert_eq!(found.code, 1, "{}", found.all());
    let table = &report["tables"][0];
    assert_eq!(
        table["differences"],
        serde_json::json!([{"kind": "missing", "key": {"id": 3}, "columns": []}]),
        "{}",
        found.stdout
    );
    assert_eq!(table["problems"], serde_json::json!([]), "{}", found.stdout);
    // A Delta table is not repaired (its changes come from the job's stream alone): said, and
    // nothing written.
    let mut command = job.workspace.command(&["verify", job.file.to_str().unwrap(), "--json", "--repair"]);
    let refused = support::Run::from(command.env("SOURCE", mysql_url()).output().unwrap());
    assert_eq!(refused.code, 1, "{}", refused.all());
    let report: serde_json::Value = serde_json::from_str(&refused.stdout).unwrap();
    let problems = report["tables"][0]["problems"].to_string();
    assert!(
        problems.contains("not repaired: target: a Delta target takes changes from its job's stream only"),
        "{problems}"
    );
    assert_eq!(report["tables"][0]["repaired"], 0, "{}", refused.stdout);
    signal(&child, "TERM");
    child.into_inner().wait_with_output().unwrap();

    let names = [
        "id", "tiny", "big", "money", "wide", "at", "stamp", "d", "t", "name", "raw", "doc", "color", "tags", "bits",
        "y", "f", "g",
    ];
    let rows = lake::rows(&job.table("types"), &names);
    let full = |id: u32, name: &str| {
        format!(
            "{id}\t255\t18446744073709551615\t-12.50\t-99999999999999999999999999999999999.999999999999999999999999999999\t\
             2024-02-29 23:59:59.999999\t2024-03-01 10:00:00.250000+00:00\t2024-02-{id:02}\t-3020399000001\t{name}\t\
             b'\\x00\\xff'\t{{\"a\": [1, 2]}}\tgreen\ta,b\t18446744073709551615\t2155\t1.5\t-2.25"
        )
    };
    assert_eq!(rows, [full(1, "ñandú ☃"), full(2, "changed"), full(4, "ñandú ☃")]);
    // Partitioned by the date: a directory per day (the published copy's under sluice_copy/).
    let mut days = std::collections::BTreeSet::new();
    for directory in [job.table("types"), job.table("types").join("sluice_copy")] {
        for entry in std::fs::read_dir(directory).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("d=") {
                days.insert(name);
            }
        }
    }
    assert_eq!(days.len(), 4, "{days:?}");
}
