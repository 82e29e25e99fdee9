//! One job, several targets (`targets:`): a MySQL source copied and streamed into PostgreSQL,
//! MySQL and a second PostgreSQL schema at once, each target with its own checkpoints, the
//! source's binlog read once for all of them. A target held up (its table locked) does not hold
//! the others, and catches up once it is free. The source is a MariaDB server of this test alone,
//! so its binlog readers can be counted.

use crate::support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::mariadb_server::MariadbServer;
use support::{postgres_url, psql, signal, unique_name, wait_for, Run, Workspace};

fn source_rows(server: &MariadbServer, database: &str) -> Vec<String> {
    let exists = server.sql(&format!(
        "SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '{database}' AND TABLE_NAME = 't'"
    ));
    if exists != "1" {
        return Vec::new();
    }
    server
        .sql(&format!("SELECT concat_ws('|', id, v) FROM {database}.t ORDER BY id"))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The binlog readers connected to `server`.
fn binlog_readers(server: &MariadbServer) -> usize {
    server.sql("SHOW PROCESSLIST").lines().filter(|line| line.contains("Binlog Dump")).count()
}

/// The rows of `schema.t` (none before the copy made the table).
fn postgres_rows(schema: &str) -> Vec<String> {
    if psql(&format!("SELECT to_regclass('{schema}.t') IS NOT NULL")).trim() != "t" {
        return Vec::new();
    }
    psql(&format!("SELECT concat_ws('|', id, v) FROM {schema}.t ORDER BY id")).lines().map(str::to_owned).collect()
}

#[test]
fn one_job_feeds_three_targets_and_a_held_up_one_does_not_hold_the_others() {
    let server = MariadbServer::start();
    let database = unique_name("fanout");
    server.sql(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v VARCHAR(40)); \
         INSERT INTO {database}.t VALUES (1, 'one'), (2, 'two')"
    ));
    let workspace = Workspace::new();
    let audit = format!("{database}_audit");
    let name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             limits: {{batch_rows: 50, queue_batches: 2}}\n\
             targets:\n  - name: warehouse\n    type: postgres\n    url: ${{TARGET}}\n    namespace: {database}\n\
             \x20 - name: replica\n    type: mysql\n    url: ${{SOURCE}}\n    namespace: {database}_copy\n\
             \x20 - name: audit\n    type: postgres\n    url: ${{TARGET}}\n    namespace: {database}_audit\n"
        ),
    );
    let checked = Run::from(
        workspace
            .command(&["check", job.to_str().unwrap()])
            .env("SOURCE", server.url())
            .env("TARGET", postgres_url())
            .output()
            .unwrap(),
    );
    checked.assert_code(0);
    assert!(checked.stdout.contains("mysql → postgres + mysql + postgres"), "{}", checked.stdout);
    for target in ["warehouse", "replica", "audit"] {
        assert!(checked.stdout.contains(&format!("target {target}:")), "{}", checked.stdout);
    }

    let run = workspace.start_run(&job, server.url(), &postgres_url(), &["--summary-json", "summary.json"]);
    let copy = format!("{database}_copy");
    let everywhere = |what: &str| {
        let expected = source_rows(&server, &database);
        wait_for(what, Duration::from_secs(60), || {
            postgres_rows(&database) == expected
                && source_rows(&server, &copy) == expected
                && postgres_rows(&audit) == expected
        });
    };
    everywhere("the copy in all three targets");
    server.sql(&format!("INSERT INTO {database}.t VALUES (10000, 'streamed')"));
    everywhere("a streamed row in all three targets");
    wait_for("one binlog reader for the three targets", Duration::from_secs(60), || binlog_readers(&server) == 1);

    // The warehouse is held up: a session holds its table locked. The two others go on.
    let lock = Command::new("psql")
        .args([postgres_url().as_str(), "-X", "-At", "-v", "ON_ERROR_STOP=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lock = lock;
    {
        use std::io::Write;
        let input = lock.stdin.as_mut().unwrap();
        writeln!(input, "BEGIN; LOCK TABLE {database}.t IN ACCESS EXCLUSIVE MODE; SELECT 'locked';").unwrap();
        input.flush().unwrap();
    }
    wait_for("the warehouse table locked", Duration::from_secs(30), || {
        psql(&format!("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE c.relname = 't' AND l.mode = 'AccessExclusiveLock' AND l.granted AND c.relnamespace = '{database}'::regnamespace")).trim() == "1"
    });
    // 400 transactions of 300 inserted rows and an update: more than the warehouse's stream
    // holds read ahead (its limits let 100 events wait) and the shared read keeps for a target
    // behind the others (`SHARED_EVENTS` row changes), so the warehouse falls out of it and reads
    // the log again on its own.
    let statements: String = (1..=400)
        .map(|batch| {
            let first = 1_000 * batch;
            format!(
                "INSERT INTO {database}.t SELECT {first} + seq, concat('row ', {first} + seq) FROM {database}.seq_1_to_300; \
                 UPDATE {database}.t SET v = 'changed' WHERE id = {first} + 1;"
            )
        })
        .collect();
    server.sql(&statements);
    let expected = source_rows(&server, &database);
    wait_for("the replica and the audit copy to follow while the warehouse is held", Duration::from_secs(60), || {
        source_rows(&server, &copy) == expected && postgres_rows(&audit) == expected
    });
    // The warehouse's table is still locked: none of it reached there yet.
    assert!(lock.try_wait().unwrap().is_none(), "the lock is still held");
    {
        use std::io::Write;
        writeln!(lock.stdin.as_mut().unwrap(), "COMMIT;").unwrap();
    }
    drop(lock.stdin.take());
    lock.wait().unwrap();
    everywhere("the warehouse to catch up once free");
    wait_for("one binlog reader again once the warehouse caught up", Duration::from_secs(60), || {
        binlog_readers(&server) == 1
    });

    signal(&run, "TERM");
    let stopped = Run::from(run.into_inner().wait_with_output().unwrap());
    assert_eq!(stopped.code, 0, "{}", stopped.all());
    let summary = support::summary(&workspace.path("summary.json"));
    for target in ["warehouse", "replica", "audit"] {
        let each = &summary["targets"][target];
        assert_eq!(each["status"], "stopped", "{summary}");
        assert!(each["stream"]["rows_applied"].as_u64().unwrap() > 0, "{target}: {summary}");
    }
    assert_eq!(summary["job"], name.as_str());
    // Each of the three targets joined the shared read at least once.
    let logs = stopped.all();
    let joins: u64 = logs
        .split("joined the shared read of the source's log ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no count of joins: {logs}"));
    assert!(joins >= 4, "each target joined, and the warehouse again after it fell behind: {joins} joins\n{logs}");
    assert!(logs.contains("fell behind the other targets' shared read"), "{logs}");
    eprintln!("{joins} joins of the shared read");
}
