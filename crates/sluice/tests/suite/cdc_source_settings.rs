//! The change stream fails closed: a binlog purged past the job's checkpoint stops the job at
//! once with SOURCE_POSITION_LOST, and binlog settings that would lose data are refused by
//! `sluice check` and at start. These tests change the server's global state (purged logs,
//! global settings), so they run on a MariaDB server of their own.

use crate::support;

use std::time::{Duration, Instant};

use support::mariadb_server::MariadbServer;
use support::workload::stream_position;
use support::{postgres_url, psql, signal, unique_name, wait_for, Run, Workspace};

fn cdc_job(workspace: &Workspace, database: &str) -> (std::path::PathBuf, String) {
    let name = format!("{database}-cdc").replace('_', "-");
    let file = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\n"
        ),
    );
    (file, name)
}

fn run(workspace: &Workspace, server: &MariadbServer, job: &std::path::Path, command: &str) -> Run {
    Run::from(
        workspace
            .command(&[command, job.to_str().unwrap()])
            .env("SOURCE", server.url())
            .env("TARGET", postgres_url())
            .output()
            .unwrap(),
    )
}

#[test]
fn the_stream_fails_closed_on_lost_positions_and_wrong_settings() {
    // Purged logs and global settings: a server of this test alone.
    let server = MariadbServer::start();
    let database = unique_name("purged");
    server.sql(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT)"));
    let workspace = Workspace::new();
    let (job, name) = cdc_job(&workspace, &database);

    // A first run streams a row and keeps its position in the target.
    let mut child = workspace.start_run(&job, server.url(), &postgres_url(), &[]);
    wait_for("the stream to start", Duration::from_secs(60), || stream_position("postgres", &name).is_some());
    server.sql(&format!("INSERT INTO {database}.t VALUES (1, 1)"));
    wait_for("the row in the target", Duration::from_secs(60), || {
        psql(&format!("SELECT count(*) FROM {database}.t")).trim() == "1"
    });
    signal(&child, "TERM");
    child.wait().unwrap();

    // Meanwhile the source moves to new binlog files and purges the one the job stands in.
    server.sql(&format!("FLUSH BINARY LOGS; INSERT INTO {database}.t VALUES (2, 2); FLUSH BINARY LOGS"));
    let current = server.sql("SHOW MASTER STATUS");
    let current = current.split('\t').next().unwrap().to_owned();
    // A file a replica still reads is not purged: wait until the stopped run's dump thread is gone.
    wait_for("the old binlog reader to leave", Duration::from_secs(30), || {
        !server.sql("SHOW PROCESSLIST").contains("Binlog Dump")
    });
    // MariaDB keeps a file until its binlog checkpoint has passed it: purge until it is gone.
    wait_for("the older binlogs to be purged", Duration::from_secs(30), || {
        server.sql(&format!("PURGE BINARY LOGS TO '{current}'"));
        server.sql("SHOW BINARY LOGS").starts_with(&current)
    });

    let started = Instant::now();
    let mut child = workspace.start_run(&job, server.url(), &postgres_url(), &[]);
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("the run did not fail within 30 s: {:?}", child.into_inner().wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed();
    let failed = Run::from(child.into_inner().wait_with_output().unwrap());
    failed.assert_code(1);
    assert!(failed.all().contains("SOURCE_POSITION_LOST"), "{}", failed.all());
    assert!(elapsed < Duration::from_secs(30), "failing took {elapsed:?}");
    // Nothing after the lost position was applied: the row written meanwhile is not guessed.
    assert_eq!(psql(&format!("SELECT count(*) FROM {database}.t")).trim(), "1");

    // A row image other than FULL is refused by `check` and at start, naming the setting.
    server.sql("SET GLOBAL binlog_row_image = 'MINIMAL'");
    let checked = run(&workspace, &server, &job, "check");
    let started = run(&workspace, &server, &job, "run");
    server.sql("SET GLOBAL binlog_row_image = 'FULL'");
    assert_ne!(checked.code, 0, "{}", checked.all());
    assert!(checked.all().contains("binlog_row_image is MINIMAL, not FULL"), "{}", checked.all());
    assert_ne!(started.code, 0, "{}", started.all());
    assert!(started.all().contains("binlog_row_image is MINIMAL, not FULL"), "{}", started.all());

    // Compressed binlog events are refused loudly, never skipped: a fresh job streams, then the
    // source starts compressing.
    let database = unique_name("compressed");
    server.sql(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v TEXT)"));
    let workspace = Workspace::new();
    let (job, name) = cdc_job(&workspace, &database);
    let mut child = workspace.start_run(&job, server.url(), &postgres_url(), &[]);
    wait_for("the stream to start", Duration::from_secs(60), || stream_position("postgres", &name).is_some());
    server.sql("SET GLOBAL log_bin_compress = ON; SET GLOBAL log_bin_compress_min_len = 10");
    server.sql(&format!("INSERT INTO {database}.t VALUES (1, REPEAT('compress me ', 100))"));
    server.sql("SET GLOBAL log_bin_compress = OFF");
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the stream did not stop at the compressed event");
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = Run::from(child.into_inner().wait_with_output().unwrap());
    stopped.assert_code(1);
    assert!(stopped.all().contains("log_bin_compress"), "{}", stopped.all());
    assert_eq!(psql(&format!("SELECT count(*) FROM {database}.t")).trim(), "0", "nothing was guessed");
}
