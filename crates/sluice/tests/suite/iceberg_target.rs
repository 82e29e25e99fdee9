//! MySQL (and PostgreSQL) into Iceberg tables of a SQL catalog, read back by pyiceberg and DuckDB: a `snapshot+cdc` job under
//! a mixed write load, killed again and again through its copy and its stream, with a column
//! added mid-stream, its small files joined as they gather.

#![cfg(feature = "iceberg")]

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use support::workload::{create_tables, source_position, Load, Random, ACCOUNTS};
use support::{iceberg, kill, mariadb, mysql_url, signal, unique_name, wait_for, Guard, Workspace};

/// A `snapshot+cdc` job from a MariaDB database into Iceberg tables of the catalog `catalog.db`
/// and the warehouse `warehouse` of its workspace.
struct IcebergJob {
    workspace: Workspace,
    file: PathBuf,
    name: String,
    database: String,
}

impl IcebergJob {
    fn new(database: &str, target: &str, limits: &str) -> IcebergJob {
        let workspace = Workspace::new();
        let name = database.replace('_', "-");
        let catalog = workspace.path("catalog.db");
        let text = format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: iceberg\n  catalog: {{type: sql, uri: \"sqlite:///{}\", name: lake}}\n  warehouse: warehouse\n{target}\
             parallelism: 2\nlimits: {{{limits}}}\n",
            catalog.display()
        );
        let file = workspace.write("job.yaml", &text);
        IcebergJob { workspace, file, name, database: database.to_owned() }
    }

    fn catalog(&self) -> PathBuf {
        self.workspace.path("catalog.db")
    }

    /// The catalog as pyiceberg names it.
    fn reader(&self) -> iceberg::Catalog {
        iceberg::Catalog::sqlite(&self.catalog())
    }

    fn table(&self, table: &str) -> String {
        format!("{}.{table}", self.database)
    }

    /// Waits until the stream has committed once.
    fn wait_streaming(&self, child: &mut Guard) {
        wait_for("the stream to start", Duration::from_secs(60), || {
            assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
            iceberg::stream_position(&self.catalog(), &self.name).is_some()
        });
    }

    fn start(&self) -> Guard {
        self.workspace.start_run(&self.file, &mysql_url(), "", &[])
    }

    /// Waits until the tables hold everything the source committed up to now.
    fn wait_converged(&self, child: &mut Guard) {
        let source = source_position();
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while iceberg::stream_position(&self.catalog(), &self.name).is_none_or(|at| at < source) {
            if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the stream did not reach the source's position {source:?} (at {:?}):\n{}",
                    iceberg::stream_position(&self.catalog(), &self.name),
                    child.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The source's rows of `columns`, as the reader prints them.
    fn source_rows(&self, table: &str, columns: &[&str]) -> Vec<String> {
        let list: Vec<String> = columns.iter().map(|column| format!("coalesce({column}, 'NULL')")).collect();
        mariadb(&format!("SELECT {} FROM {}.{table} ORDER BY {}", list.join(", "), self.database, columns[0]))
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Data files written so far (a measure of progress through the copy and the stream).
    fn data_files(&self) -> usize {
        self.files_ending(".parquet")
    }

    /// Metadata files written so far: one per commit.
    fn commits(&self) -> usize {
        self.files_ending(".metadata.json")
    }

    fn files_ending(&self, suffix: &str) -> usize {
        fn count(path: &std::path::Path, suffix: &str) -> usize {
            std::fs::read_dir(path)
                .into_iter()
                .flatten()
                .filter_map(|entry| entry.ok())
                .map(|entry| {
                    let path = entry.path();
                    if path.is_dir() {
                        count(&path, suffix)
                    } else {
                        usize::from(path.to_string_lossy().ends_with(suffix))
                    }
                })
                .sum()
        }
        count(&self.workspace.path("warehouse"), suffix)
    }
}

/// Under a mixed write load (inserts, updates, deletes, key moves, transfers between accounts),
/// the job is SIGKILLed 6 times through its copy and its stream, an account column is added and an
/// item column widened (INT to BIGINT, values past 32 bits) mid-stream; at the end each table's
/// current snapshot equals the source row for row (pyiceberg and DuckDB), and every snapshot of the
/// accounts table keeps the transfers' invariant (no partial transaction, no partial copy) and
/// each key once.
#[test]
fn an_iceberg_table_follows_the_source_through_kills_an_added_column_and_a_widened_one() {
    const KILLS: usize = 6;
    let database = unique_name("iceberg");
    create_tables(&database);
    let job = IcebergJob::new(
        &database,
        &format!(
            "  commit_interval_secs: 1\n  commit_rows: 2000\n  target_file_mb: 1\n  partition_by: {{\"{database}.items\": [\"bucket(4, id)\"]}}\n"
        ),
        "batch_rows: 100, split_rows: 50, rows_per_sec: 1500",
    );
    let mut random = Random::from_environment("an_iceberg_table_follows_the_source");
    let load = Load::start(&database, random.clone(), 300);
    let mut stream_kills = 0;
    let mut kill_number = 0;
    let mut altered = false;
    while kill_number < KILLS || stream_kills < 2 || !altered {
        kill_number += 1;
        let seen = job.data_files();
        let mut child = job.start();
        wait_for("progress in the Iceberg tables", Duration::from_secs(90), || {
            assert!(child.try_wait().unwrap().is_none(), "the run ended early:\n{}", child.stderr_text());
            job.data_files() > seen
        });
        std::thread::sleep(Duration::from_millis(500 + random.below(2500)));
        kill(&mut child);
        let streaming = iceberg::stream_position(&job.catalog(), &job.name).is_some();
        stream_kills += usize::from(streaming);
        // Mid-stream, once the copy is over (a loaded machine can stretch the copy past half the
        // kills): the copy's planned columns hold its rows, the stream takes the statements in.
        if !altered && streaming && kill_number > KILLS / 2 {
            altered = true;
            mariadb(&format!(
                "ALTER TABLE {database}.accounts ADD COLUMN note VARCHAR(20) NULL; UPDATE {database}.accounts SET note = CONCAT('n', id) WHERE id % 7 = 0; \
                 ALTER TABLE {database}.items MODIFY v BIGINT NOT NULL; UPDATE {database}.items SET v = v + 5000000000 WHERE id % 11 = 0"
            ));
        }
    }
    let mut child = job.start();
    load.stop();
    mariadb(&format!("UPDATE {database}.accounts SET note = 'last' WHERE id = 1"));
    job.wait_converged(&mut child);
    // Appends, each in a group of its own, each add a small file, which are joined as they gather.
    let first = mariadb(&format!("SELECT max(id) + 1 FROM {database}.items")).trim().parse::<u64>().unwrap();
    for append in 0..12 {
        let from = first + append * 10;
        mariadb(&format!(
            "INSERT INTO {database}.items SELECT seq, 1, 'appended' FROM {database}.seq_{from}_to_{}",
            from + 9
        ));
        job.wait_converged(&mut child);
    }
    signal(&child, "TERM");
    let output = child.into_inner().wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let catalog = job.reader();
    let accounts = ["id", "balance", "note"];
    assert_eq!(iceberg::rows(&catalog, &job.table("accounts"), &accounts), job.source_rows("accounts", &accounts));
    let items = ["id", "v", "note"];
    assert_eq!(iceberg::rows(&catalog, &job.table("items"), &items), job.source_rows("items", &items));
    // A second reader, DuckDB, reads the same rows from the current metadata file.
    assert_eq!(
        iceberg::duckdb_rows(&job.catalog(), &job.table("accounts"), &accounts),
        job.source_rows("accounts", &accounts)
    );
    assert_eq!(iceberg::duckdb_rows(&job.catalog(), &job.table("items"), &items), job.source_rows("items", &items));

    let total = (ACCOUNTS * 1000) as i64;
    let snapshots = iceberg::snapshots(&catalog, &job.table("accounts"), "id", "balance");
    assert!(snapshots.len() > 2, "{snapshots:?}");
    for (index, snapshot) in snapshots.iter().enumerate() {
        assert_eq!(
            (snapshot.rows, snapshot.distinct_keys, snapshot.sum),
            (ACCOUNTS, ACCOUNTS, total),
            "snapshot {index} of accounts is not a state the source had: {snapshots:?}"
        );
    }
    for (index, snapshot) in iceberg::snapshots(&catalog, &job.table("items"), "id", "v").iter().enumerate() {
        assert_eq!(snapshot.rows, snapshot.distinct_keys, "snapshot {index} of items holds a key twice");
    }
    assert!(snapshots.iter().any(|snapshot| snapshot.operation == "overwrite"), "no merge: {snapshots:?}");
    // Each group adds a file to the tables it changes; the small ones are joined as they gather.
    // Items are partitioned by bucket(4, id): every file in one of the four.
    let item_files = iceberg::data_files(&catalog, &job.table("items"));
    let item_snapshots = iceberg::snapshots(&catalog, &job.table("items"), "id", "v").len();
    assert_eq!(iceberg::partitions(&catalog, &job.table("items")), 4);
    assert!(item_files < 8 * 4, "items has {item_files} data files after {item_snapshots} snapshots");
    eprintln!("{} snapshots of accounts; items: {item_files} files after {item_snapshots} snapshots", snapshots.len());
}

/// The same job on a two-node cluster: the node running the stream is SIGKILLed, then the next
/// one is paused past its lease and woken once the stream moved (a zombie, whose commits the
/// catalog's fence must refuse); the tables end equal to the source, and every snapshot of the
/// accounts table is a state the source had.
#[test]
fn an_iceberg_job_on_a_cluster_survives_a_killed_and_a_paused_node() {
    use serde_json::Value;
    use support::cluster::{start_server, Etcd, Server};

    let database = unique_name("iceberg_cluster");
    create_tables(&database);
    let etcd = Etcd::start(1);
    let job = IcebergJob::new(&database, "  commit_interval_secs: 1\n", "batch_rows: 200, split_rows: 500");
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
                && iceberg::stream_position(&job.catalog(), &job.name).is_some()
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
    let load = Load::start(&database, Random::from_environment("an_iceberg_job_on_a_cluster"), 200);

    // A SIGKILL of the stream's node: the other node takes the stream over.
    let victim = streaming_node(&nodes);
    let before = job.commits();
    let mut killed = nodes[victim].take().unwrap();
    kill(&mut killed.child);
    wait_for("the stream to move after the kill", Duration::from_secs(60), || {
        stream_task(&nodes)["worker"].as_str().is_some_and(|worker| worker != killed.id) && job.commits() > before + 2
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
    let moved = job.commits();
    wait_for("the new owner to commit", Duration::from_secs(60), || job.commits() > moved + 2);
    signal(&zombie.child, "CONT");
    wait_for("the woken worker to stop its task", Duration::from_secs(30), || {
        let output = zombie.output();
        output.contains("lease ended") || output.contains("FENCED")
    });
    nodes[victim] = Some(zombie);
    load.stop();
    let source = source_position();
    wait_for("the tables to reach the source", Duration::from_secs(120), || {
        iceberg::stream_position(&job.catalog(), &job.name).is_some_and(|at| at >= source)
    });

    let catalog = job.reader();
    let accounts = ["id", "balance"];
    assert_eq!(
        iceberg::rows(&catalog, &job.table("accounts"), &accounts),
        job.source_rows("accounts", &accounts),
        "{}",
        logs(&nodes)
    );
    let items = ["id", "v", "note"];
    assert_eq!(iceberg::rows(&catalog, &job.table("items"), &items), job.source_rows("items", &items));
    let total = (ACCOUNTS * 1000) as i64;
    for (index, snapshot) in iceberg::snapshots(&catalog, &job.table("accounts"), "id", "balance").iter().enumerate() {
        assert_eq!((snapshot.rows, snapshot.sum), (ACCOUNTS, total), "snapshot {index} of accounts");
    }
}

/// Every MySQL type through the copy and the stream into an Iceberg table, read back by pyiceberg
/// as its types say and by `sluice verify` value by value; a row another writer (pyiceberg)
/// deletes is found missing, and not repaired.
#[test]
fn every_type_reaches_an_iceberg_table_as_readers_expect() {
    let database = unique_name("iceberg_types");
    let columns = "id INT PRIMARY KEY, tiny TINYINT UNSIGNED, big BIGINT UNSIGNED, money DECIMAL(10,2), \
                   wide DECIMAL(65,30), at DATETIME(6), stamp TIMESTAMP(3) NULL, d DATE, t TIME(6), \
                   name VARCHAR(20), raw VARBINARY(8), doc JSON, color ENUM('red','green'), tags SET('a','b'), \
                   bits BIT(64), y YEAR, f FLOAT, g DOUBLE, small SMALLINT, signed_tiny TINYINT";
    let row = |id: u32| {
        format!(
            "({id}, 255, 18446744073709551615, -12.5, '-99999999999999999999999999999999999.999999999999999999999999999999', \
             '2024-02-29 23:59:59.999999', '2024-03-01 10:00:00.250', '2024-02-{:02}', '-838:59:59.000001', 'ñandú ☃', \
             x'00ff', '{{\"a\": [1, 2]}}', 'green', 'a,b', b'1111111111111111111111111111111111111111111111111111111111111111', \
             2155, 1.5, -2.25, -32768, -128)",
            id
        )
    };
    mariadb(&format!(
        "SET time_zone = '+00:00'; CREATE DATABASE {database}; CREATE TABLE {database}.types ({columns});
         INSERT INTO {database}.types VALUES {}, {}; INSERT INTO {database}.types (id, d) VALUES (3, '2024-02-03')",
        row(1),
        row(2)
    ));
    let job = IcebergJob::new(
        &database,
        &format!("  commit_interval_secs: 1\n  partition_by: {{\"{database}.types\": [\"day(at)\", color]}}\n"),
        "",
    );
    let mut child = job.start();
    job.wait_streaming(&mut child);
    mariadb(&format!("SET time_zone = '+00:00'; INSERT INTO {database}.types VALUES {}; UPDATE {database}.types SET name = 'changed' WHERE id = 2", row(4)));
    job.wait_converged(&mut child);

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
    signal(&child, "TERM");
    child.into_inner().wait_with_output().unwrap();

    let names = [
        "id",
        "tiny",
        "big",
        "money",
        "wide",
        "at",
        "stamp",
        "d",
        "t",
        "name",
        "raw",
        "doc",
        "color",
        "tags",
        "bits",
        "y",
        "f",
        "g",
        "small",
        "signed_tiny",
    ];
    let rows = iceberg::rows(&job.reader(), &job.table("types"), &names);
    let full = |id: u32, name: &str| {
        format!(
            "{id}\t255\t18446744073709551615\t-12.50\t-99999999999999999999999999999999999.999999999999999999999999999999\t\
             2024-02-29 23:59:59.999999\t2024-03-01 10:00:00.250000+00:00\t2024-02-{id:02}\t-3020399000001\t{name}\t\
             b'\\x00\\xff'\t{{\"a\": [1, 2]}}\tgreen\ta,b\t18446744073709551615\t2155\t1.5\t-2.25\t-32768\t-128"
        )
    };
    let third = "3\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL\t2024-02-03\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL\tNULL";
    assert_eq!(rows, [full(1, "ñandú ☃"), full(2, "changed"), third.to_owned(), full(4, "ñandú ☃")]);

    // Another writer deletes a row through the catalog: verify finds it missing by its key, and
    // an Iceberg table is not repaired (its changes come from the job's stream alone).
    iceberg::delete(&job.reader(), &job.table("types"), "id = 3");
    let (found, report) = verify();
    assert_eq!(found.code, 1, "{}", found.all());
    assert_eq!(
        report["tables"][0]["differences"],
        serde_json::json!([{"kind": "missing", "key": {"id": 3}, "columns": []}]),
        "{}",
        found.stdout
    );
    let mut command = job.workspace.command(&["verify", job.file.to_str().unwrap(), "--json", "--repair"]);
    let refused = support::Run::from(command.env("SOURCE", mysql_url()).output().unwrap());
    assert_eq!(refused.code, 1, "{}", refused.all());
    let report: serde_json::Value = serde_json::from_str(&refused.stdout).unwrap();
    let problems = report["tables"][0]["problems"].to_string();
    assert!(problems.contains("an Iceberg target takes changes from its job's stream only"), "{problems}");
    assert_eq!(report["tables"][0]["repaired"], 0, "{}", refused.stdout);
}

/// The catalog in a PostgreSQL database instead of a SQLite file (its URI's password from a
/// variable): the copy and the stream under a load land in the catalog's tables, which pyiceberg
/// reads through the same database; the password appears in no output.
#[test]
fn an_iceberg_catalog_in_postgresql_takes_the_copy_and_the_stream() {
    let database = unique_name("iceberg_pg");
    create_tables(&database);
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let target = format!(
        "target:\n  type: iceberg\n  catalog: {{type: sql, uri: \"${{TARGET}}\", name: {database}}}\n  warehouse: warehouse\n  commit_interval_secs: 1\n"
    );
    let text = format!(
        "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n{target}limits: {{batch_rows: 100, split_rows: 50}}\n"
    );
    let file = workspace.write("job.yaml", &text);
    let load = Load::start(&database, Random::from_environment("an_iceberg_catalog_in_postgresql"), 200);
    let mut child = workspace.start_run(&file, &mysql_url(), &support::postgres_url(), &[]);
    let catalog = iceberg::Catalog::postgres(&support::postgres_url(), &database);
    let table = format!("{database}.accounts");
    wait_for("the tables in the PostgreSQL catalog", Duration::from_secs(120), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
        iceberg::exists(&catalog, &table)
    });
    load.stop();
    let accounts = ["id", "balance"];
    let source = || -> Vec<String> {
        mariadb(&format!("SELECT id, balance FROM {database}.accounts ORDER BY id"))
            .lines()
            .map(str::to_owned)
            .collect()
    };
    wait_for("the stream to reach the source", Duration::from_secs(120), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
        iceberg::rows(&catalog, &table, &accounts) == source()
    });
    signal(&child, "TERM");
    let output = child.into_inner().wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let password = std::env::var("SLUICE_TEST_PASSWORD").unwrap_or_else(|_| "sluice-test-pw".into());
    let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!printed.contains(&password), "the catalog's password was printed:\n{printed}");
    let total = (ACCOUNTS * 1000) as i64;
    for (index, snapshot) in iceberg::snapshots(&catalog, &table, "id", "balance").iter().enumerate() {
        assert_eq!((snapshot.rows, snapshot.sum), (ACCOUNTS, total), "snapshot {index} of accounts");
    }
}

/// Tables another tool made: one partitioned by `bucket(4, id)` takes the copy, each file in its
/// partition as pyiceberg reads them; one of format version 1 is refused by name before anything is
/// committed to it.
#[test]
fn tables_another_tool_made_are_written_by_their_spec_or_refused_by_name() {
    let database = unique_name("iceberg_foreign");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id BIGINT PRIMARY KEY); INSERT INTO {database}.t SELECT seq FROM {database}.seq_1_to_100"
    ));
    let workspace = Workspace::new();
    let catalog_file = workspace.path("catalog.db");
    let catalog = iceberg::Catalog::sqlite(&catalog_file);
    let table = format!("{database}.t");
    // A job per table, so the second one starts afresh without `--restart` (which would drop the
    // first table, made by the other tool, and make it anew).
    let run = |table: &str| {
        let text = format!(
            "name: foreign-{}\nmode: snapshot\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{table}\"]\n\
             target:\n  type: iceberg\n  catalog: {{type: sql, uri: \"sqlite:///{}\", name: lake}}\n  warehouse: warehouse\n",
            table.rsplit('.').next().unwrap(),
            catalog_file.display()
        );
        let file = workspace.write("job.yaml", &text);
        support::Run::from(
            workspace.command(&["run", file.to_str().unwrap()]).env("SOURCE", mysql_url()).output().unwrap(),
        )
    };
    iceberg::create_partitioned(&catalog, &table, &workspace.path("elsewhere"), 2);
    let copied = run(&table);
    assert_eq!(copied.code, 0, "{}", copied.all());
    let expected: Vec<String> = (1..=100).map(|id| id.to_string()).collect();
    assert_eq!(iceberg::rows(&catalog, &table, &["id"]), expected);
    assert_eq!(iceberg::partitions(&catalog, &table), 4);

    mariadb(&format!("CREATE TABLE {database}.v1 (id BIGINT PRIMARY KEY); INSERT INTO {database}.v1 VALUES (1)"));
    let old = format!("{database}.v1");
    iceberg::create_partitioned(&catalog, &old, &workspace.path("elsewhere"), 1);
    let refused = run(&old);
    assert_ne!(refused.code, 0, "{}", refused.all());
    assert!(
        refused
            .all()
            .contains(&format!("Iceberg table {old} cannot take Sluice's commits: it is of Iceberg format version v1")),
        "{}",
        refused.all()
    );
    assert_eq!(iceberg::rows(&catalog, &old, &["id"]), Vec::<String>::new());
}

/// `snapshot+cdc` from PostgreSQL into Iceberg tables under transfers, inserts, updates, deletes
/// and key moves, killed once while streaming: read by pyiceberg (not by Sluice), each table's
/// current snapshot equals the source, and every snapshot of the accounts keeps the transfers'
/// sum and each key once (no transaction half-applied, no copy half-published).
#[test]
fn a_postgres_source_copies_and_streams_into_iceberg_tables_exactly_once() {
    use support::postgres_source::{create_tables_sql, SourceDatabase, ACCOUNTS};
    let source = SourceDatabase::create("pgiceberg");
    let schema = source.name.clone();
    source.sql(&create_tables_sql(&schema, 5_000));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let catalog = workspace.path("catalog.db");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  \
             tables: [\"{schema}.accounts\", \"{schema}.items\"]\ntarget:\n  type: iceberg\n  \
             catalog: {{type: sql, uri: \"sqlite:///{}\", name: lake}}\n  warehouse: warehouse\n  \
             commit_interval_secs: 1\nlimits: {{split_rows: 1000, batch_rows: 250}}\n",
            catalog.display()
        ),
    );
    support::postgres_source::stream_through_a_kill(&workspace, &job, &source, &schema, "pg-source-iceberg", || {
        iceberg::stream_lsn(&catalog, &name)
    });

    let reader = iceberg::Catalog::sqlite(&catalog);
    for (table, columns, expected) in source.accounts_and_items(&schema) {
        assert_eq!(iceberg::rows(&reader, &format!("{schema}.{table}"), columns), expected, "{table}");
    }
    let snapshots = iceberg::snapshots(&reader, &format!("{schema}.accounts"), "id", "balance");
    assert!(snapshots.len() > 2, "{snapshots:?}");
    for (index, snapshot) in snapshots.iter().enumerate() {
        assert_eq!(
            (snapshot.rows, snapshot.distinct_keys, snapshot.sum),
            (ACCOUNTS, ACCOUNTS, (ACCOUNTS * 1000) as i64),
            "snapshot {index} of accounts is not a state the source had: {snapshots:?}"
        );
    }
}
