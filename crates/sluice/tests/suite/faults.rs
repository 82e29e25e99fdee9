//! Network faults between sluice and its servers, injected by the in-repo fault proxy: the run
//! retries, resumes from the target's checkpoint, and the target ends exactly equal.

use crate::support;

use std::time::Duration;

use sluice_faults::{Fault, Proxy};
use support::{address_of, mariadb, mysql_url, postgres_url, psql, through, unique_name, Run, Workspace};

/// Waits until `done` holds, checking every 10 ms; fails if the run ends first or after `seconds`.
async fn until(child: &mut support::Guard, what: &str, seconds: u64, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds);
    while !done() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before: {what}");
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the job has committed `rows`; fails with the run's output if it ended first, or
/// after a minute instead of hanging.
async fn until_committed(job: &str, rows: u64, run: &mut tokio::task::JoinHandle<Run>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while committed(job) < rows {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {rows} committed rows");
        if run.is_finished() {
            let run = run.await.unwrap();
            panic!("the run ended before {rows} rows were committed:\n{}", run.all());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn committed(job: &str) -> u64 {
    let exists = psql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sluice'");
    if exists.trim() == "0" {
        return 0;
    }
    psql(&format!("SELECT coalesce(sum(rows_written), 0) FROM sluice.checkpoints WHERE job = '{job}'"))
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_reset_mid_copy_on_both_sides_are_retried_without_loss_or_duplicates() {
    let database = unique_name("faults");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.numbers (id INT PRIMARY KEY, v INT NOT NULL, pad CHAR(100));
         INSERT INTO {database}.numbers SELECT seq, seq * 3, REPEAT('p', 100) FROM {database}.seq_1_to_40000;"
    ));
    let source_proxy = Proxy::start(address_of(&mysql_url())).await.unwrap();
    let target_proxy = Proxy::start(address_of(&postgres_url())).await.unwrap();
    let workspace = Workspace::new();
    let job_name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nparallelism: 2\nlimits: {{split_rows: 5000, batch_rows: 500, rows_per_sec: 20000}}\nretry: {{max_attempts: 50, initial_backoff_ms: 20, max_backoff_ms: 200}}\n"
        ),
    );
    let mut command = workspace.command(&["run", job.to_str().unwrap(), "--summary-json", "summary.json"]);
    command.env("SOURCE", through(&mysql_url(), &source_proxy)).env("TARGET", through(&postgres_url(), &target_proxy));
    let mut child = tokio::task::spawn_blocking(move || Run::from(command.output().unwrap()));

    // Reset the target's connections three times and the source's twice, each while rows flow.
    for (round, threshold) in [4_000u64, 10_000, 16_000, 22_000, 28_000].into_iter().enumerate() {
        until_committed(&job_name, threshold, &mut child).await;
        if round % 2 == 0 {
            target_proxy.reset_all();
        } else {
            source_proxy.reset_all();
        }
    }
    // And cut every target connection after 200 kB (about three batches) for a while.
    target_proxy.set(Fault::ResetAfter { bytes: 200_000 });
    until_committed(&job_name, 32_000, &mut child).await;
    target_proxy.set(Fault::None);

    let run = child.await.unwrap();
    run.assert_code(0);
    assert!(run.stderr.contains("attempt 2 of 50"), "the faults were met and retried:\n{}", run.stderr);
    assert_eq!(
        psql(&format!("SELECT count(*), count(DISTINCT id), sum(v), min(id), max(id) FROM {database}.numbers")).trim(),
        format!("40000|40000|{}|1|40000", 3 * 40_000u64 * 40_001 / 2)
    );
    assert_eq!(committed(&job_name), 40_000, "every row committed exactly once");
    assert!(target_proxy.connections() > 4 && source_proxy.connections() > 2, "connections were re-opened");
}

/// The source goes silent in the middle of a snapshot read (no data, no TCP error): the read is
/// given up after `read_timeout_secs`, the split is read again from its checkpoint, and the copy
/// ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_silent_mid_snapshot_is_given_up_and_read_again() {
    let database = unique_name("quiet");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.numbers (id INT PRIMARY KEY, v INT NOT NULL);
         INSERT INTO {database}.numbers SELECT seq, seq * 7 FROM {database}.seq_1_to_20000;"
    ));
    let source_proxy = Proxy::start(address_of(&mysql_url())).await.unwrap();
    let workspace = Workspace::new();
    let job_name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n  read_timeout_secs: 1\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nparallelism: 2\nlimits: {{split_rows: 5000, batch_rows: 500, rows_per_sec: 5000}}\nretry: {{max_attempts: 50, initial_backoff_ms: 20, max_backoff_ms: 200}}\n"
        ),
    );
    let mut command = workspace.command(&["run", job.to_str().unwrap()]);
    // No TLS probe: every new connection through the proxy is then a read being retried.
    let source = through(&mysql_url(), &source_proxy) + "?ssl-mode=DISABLED";
    command.env("SOURCE", source).env("TARGET", postgres_url());
    let mut child = tokio::task::spawn_blocking(move || Run::from(command.output().unwrap()));

    until_committed(&job_name, 4_000, &mut child).await;
    let before = source_proxy.connections();
    source_proxy.set(Fault::Stall);
    // The silent reads are given up and the splits retried on new connections. A split that
    // ended just before the stall may open one connection for the next split, each of the two
    // in flight at most one: a third new connection is a retry of a read given up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while source_proxy.connections() <= before + 2 {
        assert!(tokio::time::Instant::now() < deadline, "no new connection after the source went silent");
        assert!(!child.is_finished(), "the run ended while the source was silent");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    source_proxy.set(Fault::None);

    let run = child.await.unwrap();
    run.assert_code(0);
    assert!(run.stderr.contains("the server sent nothing for 1 s"), "the silence was named:\n{}", run.stderr);
    assert_eq!(
        psql(&format!("SELECT count(*), count(DISTINCT id), sum(v) FROM {database}.numbers")).trim(),
        format!("20000|20000|{}", 7 * 20_000u64 * 20_001 / 2)
    );
    assert_eq!(committed(&job_name), 20_000, "every row committed exactly once");
}

/// The binlog connection is reset in the middle of one large source transaction: the stream
/// reconnects at the last transaction boundary, and a sampler on the target sees the
/// transaction either not at all or whole, then exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binlog_reset_inside_a_large_transaction_resumes_at_its_start() {
    const ROWS: u64 = 30_000;
    let database = unique_name("midtx");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.big (id INT PRIMARY KEY, pad CHAR(200))"));
    let source_proxy = Proxy::start(address_of(&mysql_url())).await.unwrap();
    let workspace = Workspace::new();
    let job_name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nlimits: {{batch_rows: 1000}}\nretry: {{max_attempts: 50, initial_backoff_ms: 20, max_backoff_ms: 200}}\n"
        ),
    );
    let mut child = workspace.start_run(&job, &through(&mysql_url(), &source_proxy), &postgres_url(), &[]);
    until(&mut child, "the stream starts", 60, || support::workload::stream_position("postgres", &job_name).is_some())
        .await;

    // About 6.6 MB of binlog in one transaction; the connection that carries it is cut after 2 MB.
    let before = source_proxy.connections();
    source_proxy.set(Fault::ResetAfter { bytes: 2_000_000 });
    mariadb(&format!("INSERT INTO {database}.big SELECT seq, REPEAT('x', 200) FROM {database}.seq_1_to_{ROWS}"));
    let count = || psql(&format!("SELECT count(*) FROM {database}.big")).trim().parse::<u64>().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut reconnected = false;
    loop {
        let seen = count();
        assert!(seen == 0 || seen == ROWS, "the target showed {seen} of the transaction's {ROWS} rows");
        if !reconnected && source_proxy.connections() > before {
            reconnected = true;
            source_proxy.set(Fault::None);
        }
        if seen == ROWS {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the transaction did not arrive");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let child = child.into_inner();
    support::signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(reconnected && stderr.contains("change stream: "), "the reset was met and retried:\n{stderr}");
    assert_eq!(
        psql(&format!("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {database}.big")).trim(),
        format!("{ROWS}|{ROWS}|1|{ROWS}")
    );
}

/// A binlog connection that goes silent (no data, no heartbeats, no TCP error) is noticed by the
/// missing heartbeats and replaced; rows written meanwhile arrive once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_binlog_connection_is_detected_and_replaced() {
    let database = unique_name("silent");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY)"));
    let source_proxy = Proxy::start(address_of(&mysql_url())).await.unwrap();
    let workspace = Workspace::new();
    let job_name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nretry: {{max_attempts: 50, initial_backoff_ms: 20, max_backoff_ms: 200}}\n"
        ),
    );
    let mut child = workspace.start_run(&job, &through(&mysql_url(), &source_proxy), &postgres_url(), &[]);
    until(&mut child, "the stream starts", 60, || support::workload::stream_position("postgres", &job_name).is_some())
        .await;
    let before = source_proxy.connections();
    source_proxy.set(Fault::Stall);
    mariadb(&format!("INSERT INTO {database}.t SELECT seq FROM {database}.seq_1_to_100"));
    // The stalled stream is given up after three missed heartbeats and a new connection opens.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while source_proxy.connections() <= before {
        assert!(tokio::time::Instant::now() < deadline, "no new connection after the stall");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    source_proxy.set(Fault::None);
    let count = || psql(&format!("SELECT count(*) FROM {database}.t")).trim().to_owned();
    until(&mut child, "the rows arrive", 60, || count() == "100").await;
    let child = child.into_inner();
    support::signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not even a heartbeat"), "the silence was detected:\n{stderr}");
}

/// The target's connections are reset again and again while the stream applies a write load,
/// some of them at commit time: every commit either landed with its checkpoint or not at all,
/// so the resumed stream ends with the target equal to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_resets_during_the_stream_lose_and_duplicate_nothing() {
    use support::workload::{
        assert_same, committed, create_tables, rows, source_position, stream_position, Load, Random,
    };
    let database = unique_name("streamreset");
    create_tables(&database);
    let target_proxy = Proxy::start(address_of(&postgres_url())).await.unwrap();
    let workspace = Workspace::new();
    let job_name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nlimits: {{batch_rows: 300}}\nretry: {{max_attempts: 50, initial_backoff_ms: 20, max_backoff_ms: 200}}\n"
        ),
    );
    let mut child = workspace.start_run(&job, &mysql_url(), &through(&postgres_url(), &target_proxy), &[]);
    let load = Load::start(&database, Random::from_environment("target_resets_during_the_stream"), 800);
    let mut seen = 0;
    for _ in 0..6 {
        until(&mut child, "progress", 60, || {
            stream_position("postgres", &job_name).is_some() && committed("postgres", &job_name) > seen
        })
        .await;
        target_proxy.reset_all();
        seen = committed("postgres", &job_name);
    }
    load.stop();
    let source = source_position();
    until(&mut child, "the stream converges", 120, || {
        stream_position("postgres", &job_name).is_some_and(|at| at >= source)
    })
    .await;
    let child = child.into_inner();
    support::signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("change stream: "), "the resets were met and retried:\n{stderr}");
    for (table, columns) in [("items", &["id", "v", "note"][..]), ("accounts", &["id", "balance"][..])] {
        let expected = rows("mysql", &format!("{database}.{table}"), columns);
        let actual = rows("postgres", &format!("{database}.{table}"), columns);
        assert_same(table, &expected, &actual);
    }
}

/// A cdc job killed before its first commit starts, when run again, from the position captured
/// when it was first planned: rows written in between arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_job_killed_before_its_first_commit_misses_nothing() {
    let database = unique_name("firstrun");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY)"));
    let target_proxy = Proxy::start(address_of(&postgres_url())).await.unwrap();
    let workspace = Workspace::new();
    let job_name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\n"
        ),
    );
    let target = through(&postgres_url(), &target_proxy);
    let mut child = workspace.start_run(&job, &mysql_url(), &target, &[]);
    // As soon as the plan (with the source's position) is in the state directory, the target
    // goes silent: the stream cannot commit a first checkpoint.
    let planned = || {
        rusqlite::Connection::open(workspace.path(".sluice/state.db"))
            .and_then(|state| {
                state.query_row("SELECT count(*) FROM plans WHERE job = ?1", [&job_name], |row| row.get::<_, i64>(0))
            })
            .unwrap_or(0)
            == 1
    };
    until(&mut child, "the job is planned", 60, planned).await;
    target_proxy.set(Fault::Stall);
    support::kill(&mut child);
    assert!(support::workload::stream_position("postgres", &job_name).is_none(), "no checkpoint was committed");
    mariadb(&format!("INSERT INTO {database}.t SELECT seq FROM {database}.seq_1_to_50"));
    target_proxy.set(Fault::None);
    target_proxy.reset_all();
    let mut child = workspace.start_run(&job, &mysql_url(), &target, &[]);
    let count = || {
        let exists = psql(&format!("SELECT count(*) FROM information_schema.tables WHERE table_schema = '{database}'"));
        if exists.trim() == "0" {
            return "0".to_owned();
        }
        psql(&format!("SELECT count(*) FROM {database}.t")).trim().to_owned()
    };
    until(&mut child, "the rows arrive", 60, || count() == "50").await;
}

/// A run waiting out a long restart backoff asks its target meanwhile whether it answers, and
/// restarts as soon as it does again after an outage, not when the backoff ends: here the first
/// restart's wait is a minute, and the stream applies again within seconds of the target's return.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_restarts_as_soon_as_its_target_answers_again_not_when_its_backoff_ends() {
    let database = unique_name("answers");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT)"));
    let target_proxy = Proxy::start(address_of(&postgres_url())).await.unwrap();
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nretry: {{max_attempts: 2, initial_backoff_ms: 20, max_backoff_ms: 100}}\nrestart: {{initial_backoff_ms: 60000, max_backoff_ms: 60000}}\n",
            database.replace('_', "-")
        ),
    );
    let mut child = workspace.start_run(&job, &mysql_url(), &through(&postgres_url(), &target_proxy), &[]);
    let count = || psql(&format!("SELECT count(*) FROM {database}.t")).trim().to_owned();
    let exists = || {
        psql(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{database}' AND table_name = 't'"
        ))
        .trim()
            == "1"
    };
    mariadb(&format!("INSERT INTO {database}.t VALUES (1, 1)"));
    until(&mut child, "the first row", 60, || exists() && count() == "1").await;
    target_proxy.set(Fault::Down);
    mariadb(&format!("INSERT INTO {database}.t VALUES (2, 2)"));
    let stderr = child.stderr_view();
    until(&mut child, "a restart after a minute", 60, || stderr().contains("restarting from its checkpoints in 60s"))
        .await;
    // The wait's asks meet the outage: each is a connection the proxy refuses.
    let refused = target_proxy.connections();
    until(&mut child, "an ask during the outage", 30, || target_proxy.connections() > refused).await;
    target_proxy.set(Fault::None);
    until(&mut child, "the row after the outage, long before the minute is out", 20, || count() == "2").await;
    assert!(stderr().contains("the target answers again; restarting now"), "{}", stderr());
    let child = child.into_inner();
    support::signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
}

/// A run whose target goes down for longer than its steps retry fails, and is run again from its
/// checkpoints by itself (`restart:`) until the target is back: the process never exits, and the
/// target ends equal to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_target_is_down_for_a_while_restarts_from_its_checkpoints() {
    use support::workload::{
        assert_same, committed, create_tables, rows, source_position, stream_position, Load, Random,
    };
    let database = unique_name("targetdown");
    create_tables(&database);
    let target_proxy = Proxy::start(address_of(&postgres_url())).await.unwrap();
    let workspace = Workspace::new();
    let job_name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nretry: {{max_attempts: 2, initial_backoff_ms: 20, max_backoff_ms: 100}}\nrestart: {{initial_backoff_ms: 200, max_backoff_ms: 1000}}\n"
        ),
    );
    let summary = workspace.path("summary.json");
    let target = through(&postgres_url(), &target_proxy);
    let mut child = workspace.start_run(&job, &mysql_url(), &target, &["--summary-json", summary.to_str().unwrap()]);
    let load = Load::start(&database, Random::from_environment("target_down_for_a_while"), 200);
    until(&mut child, "the stream applies", 60, || {
        stream_position("postgres", &job_name).is_some() && committed("postgres", &job_name) > 0
    })
    .await;
    target_proxy.set(Fault::Down);
    let stderr = child.stderr_view();
    until(&mut child, "a restart", 60, || stderr().contains("restarting from its checkpoints")).await;
    let down = tokio::time::Instant::now();
    // Down for several restarts; the run waits instead of ending.
    until(&mut child, "eight seconds of outage", 20, || down.elapsed() > Duration::from_secs(8)).await;
    let stalled = committed("postgres", &job_name);
    target_proxy.set(Fault::None);
    until(&mut child, "the stream applies again", 60, || committed("postgres", &job_name) > stalled).await;
    load.stop();
    let source = source_position();
    until(&mut child, "the stream converges", 120, || {
        stream_position("postgres", &job_name).is_some_and(|at| at >= source)
    })
    .await;
    let child = child.into_inner();
    support::signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let restarts = support::summary(&summary)["restarts"].as_u64().unwrap_or(0);
    assert!(restarts >= 2, "the summary counts the restarts: {restarts}");
    for (table, columns) in [("items", &["id", "v", "note"][..]), ("accounts", &["id", "balance"][..])] {
        let expected = rows("mysql", &format!("{database}.{table}"), columns);
        let actual = rows("postgres", &format!("{database}.{table}"), columns);
        assert_same(table, &expected, &actual);
    }
}
