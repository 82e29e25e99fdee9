//! Two-way replication between two MariaDB primaries: a pair of jobs, A → B and B → A, each
//! `two_way: true`, writers on both sides. Neither applies back what the other wrote, an idle
//! pair settles (neither binlog grows), conflicts are settled by the job's policy and kept as
//! dirty records, and `conflict: stop` stops naming the key. Two servers of this test alone.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::mariadb_server::MariadbServer;
use support::{signal, unique_name, wait_for, Guard, Run, Workspace};

/// One job of the pair: `from` → `to`, its own workspace (state directory).
struct Direction {
    workspace: Workspace,
    file: PathBuf,
    name: String,
}

impl Direction {
    fn new(name: &str, database: &str, extra: &str) -> Direction {
        let workspace = Workspace::new();
        let file = workspace.write(
            "job.yaml",
            &format!(
                "name: {name}\nmode: cdc\ntwo_way: true\n{extra}source:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: mysql\n  url: ${{TARGET}}\n"
            ),
        );
        Direction { workspace, file, name: name.to_owned() }
    }

    fn start(&self, from: &MariadbServer, to: &MariadbServer) -> Guard {
        let child = self.workspace.start_run(&self.file, from.url(), to.url(), &["--summary-json", "summary.json"]);
        let name = &self.name;
        wait_for(&format!("job {name} to stream"), Duration::from_secs(60), || {
            let sql = format!("SELECT count(*) FROM sluice.checkpoints WHERE job = '{name}'");
            // The table is made by the job's first start.
            let output = support::mariadb_client_at(&to.socket()).args(["-N", "-e", &sql]).output().unwrap();
            output.status.success() && String::from_utf8_lossy(&output.stdout).trim() != "0"
        });
        child
    }

    fn summary(&self) -> serde_json::Value {
        support::summary(&self.workspace.path("summary.json"))
    }
}

fn stop(child: Guard) -> Run {
    signal(&child, "TERM");
    Run::from(child.into_inner().wait_with_output().unwrap())
}

/// The number of transactions in a MariaDB server's binlog (its GTID sequence, one domain).
fn transactions(server: &MariadbServer) -> u64 {
    let position = server.sql("SELECT @@GLOBAL.gtid_binlog_pos");
    position.rsplit('-').next().unwrap_or("0").parse().unwrap_or(0)
}

const COLUMNS: &[&str] = &["id", "v", "n", "updated_at"];

#[test]
fn a_two_way_pair_converges_without_loops_settles_conflicts_and_comes_to_rest() {
    let a = MariadbServer::start();
    let b = MariadbServer::start();
    let database = unique_name("twoway");
    let table = format!("{database}.t");
    for server in [&a, &b] {
        server.sql(&format!(
            "CREATE DATABASE {database}; CREATE TABLE {table} (id INT PRIMARY KEY, v VARCHAR(40), n INT, \
             updated_at DATETIME(6) NOT NULL)"
        ));
    }
    let newer = "conflict: {newer_wins: updated_at}\n";
    // A → B carries DDL (named in the job); B → A passes over what A → B carried.
    let ab = Direction::new("pair-ab", &database, &format!("{newer}schema_changes: carry\n"));
    let ba = Direction::new("pair-ba", &database, newer);
    let ab_run = ab.start(&a, &b);
    let ba_run = ba.start(&b, &a);

    // Writers on both sides at once, on distinct keys: inserts, updates, deletes.
    let writers = [(&a, 0), (&b, 1000)].map(|(server, base)| {
        let url_socket = server.socket();
        let table = table.clone();
        std::thread::spawn(move || {
            for round in 0..20 {
                let id = base + round * 5;
                let sql = format!(
                    "START TRANSACTION; \
                     INSERT INTO {table} VALUES ({id}, 'one', 1, NOW(6)), ({}, 'two', 2, NOW(6)), ({}, 'three', 3, NOW(6)); \
                     UPDATE {table} SET n = n + 10, v = 'updated' WHERE id = {}; COMMIT; \
                     DELETE FROM {table} WHERE id = {};",
                    id + 1,
                    id + 2,
                    id + 1,
                    id + 2
                );
                let output = support::mariadb_client_at(&url_socket).args(["-N", "-e", &sql]).output().unwrap();
                assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            }
        })
    });
    for writer in writers {
        writer.join().unwrap();
    }
    let converged = |what: &str| {
        wait_for(what, Duration::from_secs(60), || a.rows(&table, COLUMNS) == b.rows(&table, COLUMNS));
    };
    converged("both servers to hold the same rows");
    assert_eq!(a.rows(&table, COLUMNS).len(), 80, "each side's 40 rows, on both");

    // No loop: a row written on A reaches B once, and then neither binlog grows.
    let (a_before, b_before) = (transactions(&a), transactions(&b));
    a.sql(&format!("INSERT INTO {table} VALUES (5000, 'sentinel', 0, NOW(6))"));
    wait_for("the sentinel on B", Duration::from_secs(30), || {
        b.sql(&format!("SELECT count(*) FROM {table} WHERE id = 5000")) == "1"
    });
    let at_rest = Instant::now();
    while at_rest.elapsed() < Duration::from_secs(4) {
        // Four heartbeats of each stream: an echo would have come back within one.
        assert_eq!(transactions(&a), a_before + 1, "A's binlog holds the sentinel, and nothing came back");
        assert_eq!(transactions(&b), b_before + 1, "B's binlog holds the sentinel's one application");
        std::thread::sleep(Duration::from_millis(100));
    }

    // DDL carried one way: A → B carries it (the new column with the table's next rows), B → A
    // passes it over as its own.
    a.sql(&format!("ALTER TABLE {table} ADD COLUMN note VARCHAR(20) NULL"));
    a.sql(&format!("UPDATE {table} SET note = 'from a' WHERE id = 0"));
    wait_for("the new column on B", Duration::from_secs(30), || {
        b.sql(&format!("SELECT count(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{database}' AND COLUMN_NAME = 'note'")) == "1"
    });
    b.sql(&format!("UPDATE {table} SET note = 'from b' WHERE id = 1000"));
    wait_for("B's row with the new column on A", Duration::from_secs(30), || {
        a.sql(&format!("SELECT coalesce(note, '') FROM {table} WHERE id = 1000")) == "from b"
    });

    // Conflicts: with A → B stopped, the same key changes on both sides; the later write wins
    // on both, and each job keeps its conflict as a dirty record.
    let ab_stopped = stop(ab_run);
    a.sql(&format!("UPDATE {table} SET v = 'older on a', updated_at = '2030-01-01 00:00:00' WHERE id = 0"));
    b.sql(&format!("UPDATE {table} SET v = 'newer on b', updated_at = '2030-01-02 00:00:00' WHERE id = 0"));
    b.sql(&format!("UPDATE {table} SET v = 'older on b', updated_at = '2030-01-01 00:00:00' WHERE id = 1000"));
    a.sql(&format!("UPDATE {table} SET v = 'newer on a', updated_at = '2030-01-02 00:00:00' WHERE id = 1000"));
    let ab_run = ab.start(&a, &b);
    converged("both servers to settle the conflicts the same way");
    assert_eq!(a.sql(&format!("SELECT v FROM {table} WHERE id = 0")), "newer on b");
    assert_eq!(a.sql(&format!("SELECT v FROM {table} WHERE id = 1000")), "newer on a");
    let ab_stopped_again = stop(ab_run);
    let ba_stopped = stop(ba_run);
    let logs = format!("{}{}{}", ab_stopped.all(), ab_stopped_again.all(), ba_stopped.all());
    assert!(logs.contains("conflict (newer_wins: updated_at)"), "{logs}");
    let conflicts =
        ab.summary()["stream"]["conflicts"].as_u64().unwrap() + ba.summary()["stream"]["conflicts"].as_u64().unwrap();
    assert!(conflicts >= 2, "each changed key is a conflict on one side at least: {conflicts}\n{logs}");
    assert!(ba.summary()["stream"]["echoes"].as_u64().unwrap() > 0, "B → A passed over A → B's writes");

    // `conflict: stop` (a two_way job's default): the stream stops before the change, naming
    // the key and both rows; nothing of it is applied.
    a.sql(&format!("UPDATE {table} SET v = 'a wrote this' WHERE id = 5"));
    b.sql(&format!("UPDATE {table} SET v = 'b wrote this' WHERE id = 5"));
    let text = std::fs::read_to_string(&ab.file).unwrap().replace(newer, "");
    let strict = ab.workspace.write("strict.yaml", &text);
    let mut run = ab.workspace.start_run(&strict, a.url(), b.url(), &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the stream did not stop at the conflict: {}", run.stderr_text());
        std::thread::sleep(Duration::from_millis(50));
    }
    let failed = Run::from(run.into_inner().wait_with_output().unwrap());
    assert_ne!(failed.code, 0, "{}", failed.all());
    assert!(failed.all().contains("(id=5): conflict"), "{}", failed.all());
    assert!(failed.all().contains("b wrote this") && failed.all().contains("a wrote this"), "{}", failed.all());
    assert_eq!(b.sql(&format!("SELECT v FROM {table} WHERE id = 5")), "b wrote this");
}
