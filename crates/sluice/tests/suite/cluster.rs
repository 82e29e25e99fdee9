//! The cluster on real etcd, with `sluice server` nodes as child processes: a snapshot+cdc job
//! under write load survives SIGKILLs of the node running its change stream (failover time
//! measured, 0 rows lost or duplicated); a SIGSTOPped worker's task moves and the worker cannot
//! commit when it wakes; losing the etcd leader member or every node at once does not stop a job;
//! a stream whose target is down for 25 s heals by itself; a whole etcd outage does not stop it.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_faults::{Fault, Proxy};
use support::cluster::{lease_secs, start_server, Etcd, Server};
use support::webhook::Webhook;
use support::workload::{assert_same, committed, create_tables, rows, source_position, stream_position, Load, Random};
use support::{address_of, mariadb, mysql_url, postgres_url, psql, signal, through, unique_name, wait_for, Workspace};

/// A snapshot+cdc job from a fresh MariaDB database into PostgreSQL, served by `nodes` nodes.
struct Cluster {
    workspace: Workspace,
    etcd: Etcd,
    nodes: Vec<Option<Server>>,
    database: String,
    job: String,
    /// The target's URL as the nodes reach it.
    target: String,
    /// More environment of every node.
    environment: Vec<(&'static str, String)>,
}

impl Cluster {
    fn start(etcd_members: usize, nodes: usize) -> Cluster {
        Cluster::start_with(etcd_members, nodes, "*")
    }

    /// A cluster whose job selects `tables` of the database (a glob or a table name).
    fn start_with(etcd_members: usize, nodes: usize, tables: &str) -> Cluster {
        Cluster::start_into(etcd_members, nodes, tables, postgres_url())
    }

    /// A cluster whose nodes reach the target PostgreSQL at `target`.
    fn start_into(etcd_members: usize, nodes: usize, tables: &str, target: String) -> Cluster {
        Cluster::start_job(etcd_members, nodes, tables, target, "", Vec::new())
    }

    /// A cluster whose job file ends with `more` (its own lines of YAML), its nodes with more
    /// `environment`.
    fn start_job(
        etcd_members: usize,
        nodes: usize,
        tables: &str,
        target: String,
        more: &str,
        environment: Vec<(&'static str, String)>,
    ) -> Cluster {
        let database = unique_name("cluster");
        create_tables(&database);
        let etcd = Etcd::start(etcd_members);
        let workspace = Workspace::new();
        let job = database.replace('_', "-");
        let mut cluster = Cluster { workspace, etcd, nodes: Vec::new(), job, database, target, environment };
        for index in 0..nodes {
            let node = cluster.start_node(index);
            cluster.nodes.push(Some(node));
        }
        let job = format!(
            "name: {}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{}.{tables}\"]\n\
             target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  namespace: {}\nparallelism: 2\n{more}",
            cluster.job, cluster.database, cluster.database
        );
        let (status, body) = cluster.any().call("POST", "/jobs", None, Some(("application/yaml", &job)));
        assert_eq!(status, 201, "{body}");
        cluster
    }

    fn start_node(&self, index: usize) -> Server {
        let mut environment = vec![("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", self.target.clone())];
        environment.extend(self.environment.iter().cloned());
        start_server(&self.workspace, &format!("node{index}"), Some(&self.etcd.endpoints), &environment)
    }

    fn any(&self) -> &Server {
        self.nodes.iter().flatten().next().expect("a live node")
    }

    fn show(&self) -> Value {
        self.any().call("GET", &format!("/jobs/{}", self.job), None, None).1
    }

    fn stream_task(&self) -> Value {
        self.show()["tasks"]
            .as_array()
            .and_then(|tasks| tasks.iter().find(|task| task["kind"] == "cdc").cloned())
            .unwrap_or_default()
    }

    /// Waits until the change stream runs, and returns the index of its node.
    fn wait_streaming(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last = self.stream_task();
        while !(last["state"] == "running" && last["epoch"].is_u64()) {
            assert!(Instant::now() < deadline, "the change stream does not run: {:#}\n{}", self.show(), self.logs());
            std::thread::sleep(Duration::from_millis(50));
            last = self.stream_task();
        }
        let worker = last["worker"].as_str().expect("a worker").to_owned();
        self.nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == worker)).expect("a known node")
    }

    /// Waits until the target holds everything the source committed so far.
    fn wait_converged(&self) {
        let source = source_position();
        let deadline = Instant::now() + Duration::from_secs(120);
        while stream_position("postgres", &self.job).is_none_or(|at| at < source) {
            assert!(
                Instant::now() < deadline,
                "the stream did not reach {source:?}: {:#}\n{}",
                self.show(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn assert_same(&self) {
        for (table, columns) in [("items", &["id", "v", "note"][..]), ("accounts", &["id", "balance"][..])] {
            let source = rows("mysql", &format!("{}.{table}", self.database), columns);
            let target = rows("postgres", &format!("{}.{table}", self.database), columns);
            assert_same(table, &source, &target);
        }
    }

    /// Waits until the stream committed more than `rows` rows past `before`; on a timeout,
    /// shows the job and every node's log.
    fn wait_applying(&self, what: &str, before: u64, rows: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while committed("postgres", &self.job) <= before + rows {
            assert!(Instant::now() < deadline, "timed out waiting for {what}: {:#}\n{}", self.show(), self.logs());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn logs(&self) -> String {
        self.nodes.iter().flatten().map(|node| format!("--- {}\n{}", node.id, node.output())).collect()
    }

    /// SIGKILLs the node running the stream and returns how long until the stream applied
    /// changes again elsewhere (its committed row count moved, under a running load).
    fn kill_stream_node(&mut self) -> Duration {
        let victim = self.wait_streaming();
        let mut node = self.nodes[victim].take().expect("the node lives");
        let killed = Instant::now();
        node.child.kill().expect("SIGKILL the node");
        node.child.wait().expect("reap it");
        // Applying again elsewhere: another node owns the stream and the target's committed
        // rows moved past what they were once the killed node was gone.
        let before = committed("postgres", &self.job);
        let deadline = killed + Duration::from_secs(60);
        loop {
            let owner = self.stream_task()["worker"].clone();
            if owner.is_string() && owner != Value::String(node.id.clone()) && committed("postgres", &self.job) > before
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the stream did not resume within 60 s: {:#}\n{}",
                self.show(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let elapsed = killed.elapsed();
        self.nodes[victim] = Some(self.start_node(victim));
        elapsed
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::panic::catch_unwind(|| {
            mariadb(&format!("DROP DATABASE IF EXISTS {}", self.database));
            psql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.database));
        });
    }
}

fn quantile(sorted: &[Duration], quantile: f64) -> Duration {
    sorted[((sorted.len() as f64 * quantile).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Kills the stream's node `SLUICE_FAILOVER_TRIALS` times (3 by default; the benchmark runs
/// 20) under a write load, and checks the target against the source at the end.
#[test]
fn the_stream_fails_over_when_its_node_is_killed_and_nothing_is_lost_or_doubled() {
    let trials: usize = std::env::var("SLUICE_FAILOVER_TRIALS").ok().and_then(|text| text.parse().ok()).unwrap_or(3);
    let mut cluster = Cluster::start(1, 3);
    let load = Load::start(&cluster.database, Random::from_environment("failover"), 200);
    let mut times = Vec::new();
    for trial in 0..trials {
        let time = cluster.kill_stream_node();
        eprintln!("failover trial {}: {:.2} s", trial + 1, time.as_secs_f64());
        times.push(time);
    }
    load.stop();
    cluster.wait_converged();
    cluster.assert_same();
    times.sort();
    let (p50, p99) = (quantile(&times, 0.5), quantile(&times, 0.99));
    eprintln!(
        "failover over {trials} trials: p50 {:.2} s, p99 {:.2} s, max {:.2} s",
        p50.as_secs_f64(),
        p99.as_secs_f64(),
        times.last().unwrap().as_secs_f64()
    );
    if let Ok(path) = std::env::var("SLUICE_FAILOVER_REPORT") {
        let seconds: Vec<f64> = times.iter().map(Duration::as_secs_f64).collect();
        std::fs::write(path, serde_json::json!({ "trials": trials, "lease_secs": lease_secs(), "seconds": seconds, "p50": p50.as_secs_f64(), "p99": p99.as_secs_f64() }).to_string()).unwrap();
    }
    // The target is p99 ≤ 3 s at the default 2 s lease (`bench/failover.sh`); a test, on a 5 s
    // lease, asserts only a loose bound (BENCHMARKS.md has the measured figures).
    assert!(times.last().unwrap() < &Duration::from_secs(30), "a failover took {:?}", times.last());
}

#[test]
fn a_paused_worker_whose_task_moved_cannot_commit_when_it_wakes() {
    let mut cluster = Cluster::start(1, 2);
    let load = Load::start(&cluster.database, Random::from_environment("zombie"), 200);
    let victim = cluster.wait_streaming();
    // Paused while it applies changes, so it wakes with work in hand.
    let before = committed("postgres", &cluster.job);
    cluster.wait_applying("the stream to apply", before, 20);
    let epoch = cluster.stream_task()["epoch"].as_u64().unwrap();
    let zombie = cluster.nodes[victim].take().unwrap();
    signal(&zombie.child, "STOP");
    // Past its lease, the task is claimed by the other node with a newer epoch.
    wait_for("the stream to move", Duration::from_secs(60), || {
        let task = cluster.stream_task();
        task["worker"] != Value::String(zombie.id.clone())
            && task["epoch"].as_u64().is_some_and(|new| new > epoch)
            && task["rows_written"].as_u64().is_some()
    });
    let moved = committed("postgres", &cluster.job);
    wait_for("the new owner to apply", Duration::from_secs(30), || committed("postgres", &cluster.job) > moved);
    signal(&zombie.child, "CONT");
    // The woken worker learns that its lease ended, or has a commit refused by the fence.
    wait_for("the woken worker to stop its task", Duration::from_secs(30), || {
        let output = zombie.output();
        output.contains("lease ended") || output.contains("FENCED")
    });
    load.stop();
    cluster.nodes[victim] = Some(zombie);
    cluster.wait_converged();
    cluster.assert_same();
    // Nothing the woken worker did changed who owns the stream.
    let task = cluster.stream_task();
    assert_ne!(task["worker"], Value::String(cluster.nodes[victim].as_ref().unwrap().id.clone()), "{task:#}");
}

#[test]
fn jobs_keep_running_when_the_etcd_leader_dies_and_resume_when_every_node_restarts() {
    let mut cluster = Cluster::start(3, 2);
    let load = Load::start(&cluster.database, Random::from_environment("etcd-leader"), 200);
    cluster.wait_streaming();
    let leader = cluster.etcd.leader().expect("an etcd leader");
    cluster.etcd.kill(leader);
    // The stream keeps applying: its committed rows move after the leader is gone.
    let before = committed("postgres", &cluster.job);
    cluster.wait_applying("the stream to apply after the etcd leader died", before, 50);
    // Every node killed at once, then started again: the job resumes by itself.
    for index in 0..cluster.nodes.len() {
        if let Some(mut node) = cluster.nodes[index].take() {
            node.child.kill().unwrap();
            node.child.wait().unwrap();
        }
    }
    let stopped_at = committed("postgres", &cluster.job);
    for index in 0..2 {
        cluster.nodes[index] = Some(cluster.start_node(index));
    }
    cluster.wait_applying("the stream to resume after every node restarted", stopped_at, 50);
    load.stop();
    cluster.wait_converged();
    cluster.assert_same();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let job = cluster.show();
        if job["state"] == "running" && job["phase"] == "streaming" && job["stats"]["lag_secs"].is_u64() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the job does not show as running and streaming: {job:#}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_stream_whose_target_is_down_for_25_seconds_heals_by_itself() {
    // The nodes reach the target through a fault proxy that can take it down.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy = runtime.block_on(Proxy::start(address_of(&postgres_url()))).expect("a proxy");
    let cluster = Cluster::start_into(1, 2, "*", through(&postgres_url(), &proxy));
    let load = Load::start(&cluster.database, Random::from_environment("target-outage"), 200);
    cluster.wait_streaming();
    let before = committed("postgres", &cluster.job);
    cluster.wait_applying("the stream to apply", before, 20);
    // The default restart policy: nothing in the job file says how to heal.
    proxy.set(Fault::Down);
    let down = Instant::now();
    let mut seen = Value::Null;
    wait_for("the job to show its stream restarting", Duration::from_secs(60), || {
        seen = cluster.show();
        assert_ne!(seen["state"], "failed", "the job failed instead of restarting:\n{}", cluster.logs());
        seen["state"] == "restarting"
    });
    let task = cluster.stream_task();
    assert_eq!(task["state"], "restarting", "{seen:#}");
    assert!(task["restarts"].as_u64().is_some_and(|count| count >= 1), "{seen:#}");
    assert_eq!(seen["error"]["side"], "target", "the last error names the target: {seen:#}");
    assert!(seen["restarts"].as_u64().is_some_and(|count| count >= 1), "{seen:#}");
    while down.elapsed() < Duration::from_secs(25) {
        assert_ne!(cluster.show()["state"], "failed", "the job gave up during the outage:\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    // The default policy moves the task after 3 restarts in a row on one worker.
    let logs = cluster.logs();
    assert!(logs.contains("handing it over to another worker"), "the stream never moved:\n{logs}");
    let stalled = committed("postgres", &cluster.job);
    proxy.set(Fault::None);
    let up = Instant::now();
    cluster.wait_applying("the stream to apply again after the target came back", stalled, 20);
    eprintln!("the stream applied again {:.1} s after the target came back", up.elapsed().as_secs_f64());
    load.stop();
    cluster.wait_converged();
    cluster.assert_same();
    let job = cluster.show();
    assert_eq!(job["state"], "running", "{job:#}");
    assert!(job["error"].is_null(), "a healed job shows no error: {job:#}");
}

#[test]
fn a_stream_keeps_applying_through_a_whole_etcd_outage_with_one_owner_after_it() {
    let mut cluster = Cluster::start(1, 2);
    let load = Load::start(&cluster.database, Random::from_environment("etcd-outage"), 200);
    cluster.wait_streaming();
    cluster.etcd.kill(0);
    let down = Instant::now();
    // Longer than the nodes' 5 s lease: the stream goes on committing all along.
    let deadline = down + Duration::from_secs(60);
    let mut last = committed("postgres", &cluster.job);
    let mut advanced_after_lease = false;
    while down.elapsed() < Duration::from_secs(15) || !advanced_after_lease {
        assert!(Instant::now() < deadline, "the stream stopped applying while etcd was down:\n{}", cluster.logs());
        let now = committed("postgres", &cluster.job);
        if now > last && down.elapsed() > Duration::from_secs(10) {
            advanced_after_lease = true;
        }
        last = now;
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.etcd.restart(0);
    // Back to one owner per task: the stream runs on one node, listed by one worker only.
    let mut job = Value::Null;
    wait_for("the job to show running again", Duration::from_secs(60), || {
        job = cluster.show();
        job["state"] == "running" && cluster.stream_task()["state"] == "running"
    });
    let after = committed("postgres", &cluster.job);
    cluster.wait_applying("the stream to apply after etcd came back", after, 20);
    let (_, workers) = cluster.any().call("GET", "/workers", None, None);
    let listed: Vec<String> = workers
        .as_array()
        .expect("a list of workers")
        .iter()
        .flat_map(|worker| worker["tasks"].as_array().cloned().unwrap_or_default())
        .filter_map(|task| task.as_str().map(str::to_owned))
        .collect();
    let stream = format!("{}/stream", cluster.job);
    assert_eq!(listed.iter().filter(|task| **task == stream).count(), 1, "{workers:#}\n{}", cluster.logs());
    load.stop();
    cluster.wait_converged();
    cluster.assert_same();
}

#[test]
fn tables_added_to_a_running_stream_are_copied_online_and_join_it() {
    let cluster = Cluster::start_with(1, 2, "items");
    let load = Load::start(&cluster.database, Random::from_environment("add-tables"), 200);
    cluster.wait_streaming();
    let add = |tables: &str| {
        let body = format!(r#"{{"tables": [{tables}]}}"#);
        cluster.any().call("POST", &format!("/jobs/{}/tables", cluster.job), None, Some(("application/json", &body)))
    };
    let (status, body) = add(&format!("\"{}.items\"", cluster.database));
    assert_eq!(status, 400, "a table of the job already: {body}");
    assert!(body["error"].as_str().unwrap().contains("already"), "{body}");
    assert_eq!(add("\"no_dot\"").0, 400);
    let (status, body) = add(&format!("\"{}.accounts\"", cluster.database));
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["version"], 2);
    // The copy runs while the stream goes on, then the stream takes the table in.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job = cluster.show();
        let tasks = job["tasks"].as_array().cloned().unwrap_or_default();
        if job["backfill"].is_null() && job["state"] == "running" && tasks.len() == 1 && tasks[0]["state"] == "running"
        {
            break;
        }
        assert!(Instant::now() < deadline, "the added table did not join the stream: {job:#}\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = committed("postgres", &cluster.job);
    cluster.wait_applying("the stream with the added table", before, 50);
    load.stop();
    cluster.wait_converged();
    cluster.assert_same();
    let (_, versions) = cluster.any().call("GET", &format!("/jobs/{}/versions", cluster.job), None, None);
    assert!(versions[1]["origin"].as_str().unwrap().starts_with("add tables"), "{versions}");
    // A stream that was past where the copy began goes back for the added table alone, and
    // says when it is back where it was; one still behind it (a slow machine) just goes on.
    let logs = cluster.logs();
    let joined = logs.lines().find_map(|line| line.split_once("their changes since ")).map(|(_, rest)| rest.to_owned());
    let joined = joined.unwrap_or_else(|| panic!("the stream says the table joined:\n{logs}"));
    let (replayed_from, resumed_after) = joined.split_once(" are replayed, the other tables resume after ").unwrap();
    if replayed_from != resumed_after {
        wait_for("the stream to say it caught up", Duration::from_secs(60), || {
            cluster.logs().contains("caught up; every table streams again")
        });
    }
}

/// A plan far larger than one etcd value when every split carried its table's schema (2,500
/// splits of a 14-column table, ~4 MB; etcd refuses requests over 1.5 MiB) is stored apart
/// from its record, in pieces: the job runs to the end instead of staying `pending`.
#[test]
fn a_plan_of_thousands_of_splits_is_stored_in_pieces() {
    let database = unique_name("pieces");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v VARCHAR(20){}); \
         USE {database}; INSERT INTO t (id, v) SELECT seq, CONCAT('v', seq) FROM seq_1_to_2500;",
        // Wide enough that the plan (each split names its table's columns) is ~4 MB.
        (1..=12)
            .map(|index| format!(", a_rather_long_column_name_number_{index} VARCHAR(20) DEFAULT 'x'"))
            .collect::<String>()
    ));
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", postgres_url())];
    let node = start_server(&workspace, "pieces0", Some(&etcd.endpoints), &environment);
    let name = database.replace('_', "-");
    let job = format!(
        "name: {name}\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\nparallelism: 4\nlimits: {{ split_rows: 1 }}\n"
    );
    let (status, body) = node.call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let mut last = Value::Null;
    wait_for("the job to end", Duration::from_secs(180), || {
        last = node.call("GET", &format!("/jobs/{name}"), None, None).1;
        last["state"] == "succeeded" || last["state"] == "failed"
    });
    assert_eq!(last["state"], "succeeded", "{last:#}\n{}", node.output());
    assert_eq!(psql(&format!("SELECT count(*), count(DISTINCT id) FROM {database}.t")).trim(), "2500|2500");
    let pieces = etcd
        .etcdctl()
        .args(["get", &format!("/sluice/plan-pieces/{name}/"), "--prefix", "--keys-only"])
        .output()
        .unwrap();
    let pieces = String::from_utf8_lossy(&pieces.stdout).lines().filter(|line| !line.is_empty()).count();
    // Each piece names a table's columns once: these 2,500 splits fit one piece (the unit
    // test in cluster/model.rs cuts and joins many).
    assert!(pieces >= 1, "the splits are kept apart from the record: {pieces}");
    let record = etcd.etcdctl().args(["get", &format!("/sluice/plans/{name}"), "--print-value-only"]).output().unwrap();
    assert!(record.stdout.len() < 16 * 1024, "the plan record itself stays small: {} bytes", record.stdout.len());
}

/// One large table is shared by every node (groups of splits), and a node killed while it
/// copies a group loses nothing: its group is copied again from the target's checkpoints.
#[test]
fn one_large_table_is_copied_by_every_node_and_survives_a_kill() {
    let database = unique_name("shared");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.big (id INT PRIMARY KEY, v INT NOT NULL, KEY by_v (v)); \
         USE {database}; INSERT INTO big SELECT seq, seq % 1000 FROM seq_1_to_2000000;"
    ));
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", postgres_url())];
    let mut nodes: Vec<Option<Server>> = (0..3)
        .map(|index| Some(start_server(&workspace, &format!("share{index}"), Some(&etcd.endpoints), &environment)))
        .collect();
    let name = database.replace('_', "-");
    let job = format!(
        "name: {name}\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\nparallelism: 2\nlimits: {{ split_rows: 100000, rows_per_sec: 300000 }}\n"
    );
    let any = |nodes: &[Option<Server>]| -> Value {
        let node = nodes.iter().flatten().next().expect("a live node");
        node.call("GET", &format!("/jobs/{name}"), None, None).1
    };
    let (status, body) = nodes[0].as_ref().unwrap().call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let groups = |view: &Value| -> Vec<Value> {
        view["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|task| task["id"].as_str().unwrap_or("").contains(".."))
            .cloned()
            .collect()
    };
    // Every node takes a share of the table.
    let mut workers = std::collections::BTreeSet::new();
    let mut view = Value::Null;
    wait_for("every node to copy a group of splits", Duration::from_secs(120), || {
        view = any(&nodes);
        for task in groups(&view) {
            if let Some(worker) = task["worker"].as_str() {
                workers.insert(worker.to_owned());
            }
        }
        workers.len() == 3 || view["state"] == "succeeded"
    });
    assert!(groups(&view).len() >= 5, "the table is cut into groups: {view:#}");
    assert_eq!(workers.len(), 3, "every node copied part of the table: {view:#}");
    // Kill a node while it copies a group.
    let mut victim = None;
    wait_for("a node copying a group", Duration::from_secs(60), || {
        view = any(&nodes);
        victim = groups(&view)
            .iter()
            .find(|task| task["state"] == "running")
            .and_then(|task| task["worker"].as_str().map(str::to_owned));
        victim.is_some() || view["state"] == "succeeded"
    });
    let victim = victim.unwrap_or_else(|| panic!("the copy ended before a node could be killed in it: {view:#}"));
    let index = nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == victim)).unwrap();
    let mut node = nodes[index].take().unwrap();
    node.child.kill().expect("SIGKILL the node");
    node.child.wait().expect("reap it");
    let victim_log = node.output();
    wait_for("the job to end", Duration::from_secs(240), || {
        view = any(&nodes);
        view["state"] == "succeeded" || view["state"] == "failed"
    });
    let logs: String = nodes.iter().flatten().map(|node| node.output()).collect();
    assert_eq!(view["state"], "succeeded", "{view:#}\n{logs}");
    assert_eq!(
        psql(&format!("SELECT count(*), count(DISTINCT id), sum(v) FROM {database}.big")).trim(),
        format!("2000000|2000000|{}", (0..2_000_000u64).map(|seq| (seq + 1) % 1000).sum::<u64>())
    );
    let indexes =
        psql(&format!("SELECT count(*) FROM pg_indexes WHERE schemaname = '{database}' AND indexname LIKE '%by_v%'"));
    assert_eq!(indexes.trim(), "1", "the table's index is built");
    let builds = (logs + &victim_log).matches("building secondary indexes").count();
    assert_eq!(builds, 1, "indexes are built once, by the table's task, after every group");
}

/// A Parquet dataset copied by two nodes, one of them killed while it copies a group of
/// splits: the manifest written last lists one whole part per split, and the parts it lists
/// hold every row once.
#[test]
fn a_parquet_dataset_on_a_cluster_is_whole_by_its_manifest_through_a_kill() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int32Type;

    const ROWS: u64 = 300_000;
    let database = unique_name("dataset");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.big (id INT PRIMARY KEY, v INT NOT NULL); \
         USE {database}; INSERT INTO big SELECT seq, seq % 1000 FROM seq_1_to_{ROWS};"
    ));
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let environment = [("SLUICE_VAR_SOURCE", mysql_url())];
    let mut nodes: Vec<Option<Server>> = (0..2)
        .map(|index| Some(start_server(&workspace, &format!("files{index}"), Some(&etcd.endpoints), &environment)))
        .collect();
    let name = database.replace('_', "-");
    let job = format!(
        "name: {name}\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: parquet\n  path: dataset\nparallelism: 2\nlimits: {{ split_rows: 20000, rows_per_sec: 60000 }}\n"
    );
    let any = |nodes: &[Option<Server>]| -> Value {
        nodes.iter().flatten().next().expect("a live node").call("GET", &format!("/jobs/{name}"), None, None).1
    };
    let (status, body) = nodes[0].as_ref().unwrap().call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let mut victim = None;
    let mut view = Value::Null;
    wait_for("a node copying a group", Duration::from_secs(60), || {
        view = any(&nodes);
        victim = view["tasks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|task| task["id"].as_str().unwrap_or("").contains("..") && task["state"] == "running")
            .and_then(|task| task["worker"].as_str().map(str::to_owned));
        victim.is_some() || view["state"] == "succeeded"
    });
    let victim = victim.unwrap_or_else(|| panic!("the copy ended before a node could be killed in it: {view:#}"));
    let index = nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == victim)).unwrap();
    let mut node = nodes[index].take().unwrap();
    support::kill(&mut node.child);
    assert!(!workspace.path(&format!("dataset/{database}.big/_manifest.json")).exists(), "a manifest before the end");
    wait_for("the job to end", Duration::from_secs(180), || {
        view = any(&nodes);
        view["state"] == "succeeded" || view["state"] == "failed"
    });
    assert_eq!(view["state"], "succeeded", "{view:#}");
    let directory = workspace.path(&format!("dataset/{database}.big"));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(directory.join("_manifest.json")).expect("a manifest")).unwrap();
    let parts = manifest["parts"].as_array().expect("parts");
    // One part per split: as many as the planner cut (at least ROWS / split_rows), each whole.
    assert!(parts.len() as u64 >= ROWS / 20_000, "one part per split of at most 20000 rows: {manifest:#}");
    assert_eq!(manifest["rows"], ROWS, "{manifest:#}");
    let mut ids = Vec::new();
    for part in parts {
        let file = std::fs::File::open(directory.join(part["path"].as_str().unwrap())).unwrap();
        for batch in
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap()
        {
            ids.extend(
                batch.unwrap().column_by_name("id").unwrap().as_primitive::<Int32Type>().values().iter().copied(),
            );
        }
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len() as u64, ROWS, "every row once in the listed parts");
}

/// A lag alarm on a three-node cluster: it fires when the target goes down, its leader is killed
/// while it fires and the next leader carries its state on, and it resolves when the target is
/// back; the webhook hears each of the two exactly once.
#[test]
fn an_alarm_fires_and_resolves_once_on_three_nodes_through_a_leader_kill() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy = runtime.block_on(Proxy::start(address_of(&postgres_url()))).expect("a proxy");
    let webhook = Webhook::start();
    let alarms =
        "alarms:\n  - {name: lag, when: \"lag_seconds > 8\", for_secs: 3, notify: [{webhook: \"${SLUICE_VAR_ALARM_HOOK}\"}]}\n";
    let environment = vec![("SLUICE_VAR_ALARM_HOOK", webhook.url.clone())];
    let mut cluster = Cluster::start_job(1, 3, "*", through(&postgres_url(), &proxy), alarms, environment);
    let load = Load::start(&cluster.database, Random::from_environment("alarm"), 100);
    cluster.wait_streaming();
    let before = committed("postgres", &cluster.job);
    cluster.wait_applying("the stream to apply", before, 20);
    let rule = |cluster: &Cluster| -> Value {
        let (_, alarms) = cluster.any().call("GET", "/alarms", None, None);
        alarms["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|rule| rule["job"] == cluster.job.as_str())
            .cloned()
            .unwrap_or_default()
    };
    wait_for("the leader to evaluate the rule", Duration::from_secs(30), || rule(&cluster)["state"] == "ok");
    assert!(webhook.received().is_empty(), "an alarm while the stream keeps up: {:?}", webhook.received());

    proxy.set(Fault::Down);
    wait_for("the lag alarm to fire", Duration::from_secs(90), || !webhook.events("lag").is_empty());
    let fired = webhook.received()[0].clone();
    assert_eq!(fired["job"], cluster.job.as_str(), "{fired:#}");
    assert!(fired["value"].as_f64().is_some_and(|lag| lag > 8.0), "{fired:#}");
    let (_, leader) = cluster.any().call("GET", "/leader", None, None);
    let leader = leader["leader"].as_str().expect("a leader").to_owned();
    let index = cluster.nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == leader)).unwrap();
    let mut killed = cluster.nodes[index].take().unwrap();
    signal(&killed.child, "KILL");
    let _ = killed.child.wait();
    let lag_at_kill = rule(&cluster)["value"].as_f64().unwrap_or(0.0);
    // Another node leads and evaluates the firing rule: its lag moved on, still firing.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, now) = cluster.any().call("GET", "/leader", None, None);
        let state = rule(&cluster);
        if now["leader"].as_str().is_some_and(|now| now != leader)
            && state["state"] == "firing"
            && state["value"].as_f64().is_some_and(|lag| lag > lag_at_kill + 2.0)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no new leader evaluated the firing alarm (lag {lag_at_kill} at the kill of {leader}): {now:#} {state:#}\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(webhook.events("lag"), ["firing"], "the new leader did not fire it again");

    load.stop();
    proxy.set(Fault::None);
    wait_for("the lag alarm to resolve", Duration::from_secs(120), || webhook.events("lag").len() >= 2);
    cluster.wait_converged();
    wait_for("the history to show both", Duration::from_secs(30), || {
        let (_, alarms) = cluster.any().call("GET", "/alarms", None, None);
        let events: Vec<&str> =
            alarms["history"].as_array().into_iter().flatten().filter_map(|event| event["event"].as_str()).collect();
        events == ["resolved", "firing"] && rule(&cluster)["state"] == "ok"
    });
    assert_eq!(webhook.events("lag"), ["firing", "resolved"], "each once: {:#?}", webhook.received());
    assert!(!cluster.logs().contains(&webhook.token), "the webhook's secret in the logs");
    let (_, alarms) = cluster.any().call("GET", "/alarms", None, None);
    assert!(!alarms.to_string().contains(&webhook.token), "the webhook's secret in GET /alarms: {alarms}");
}

/// A table whose rows two nodes copy, with zero dates the default policy refuses on both: the
/// dirty records of both nodes are in one list, and together they exceed the job's budget,
/// which neither node's share does alone: the job fails. One is discarded (audited); after the
/// fix (version 2 stores zero dates as NULL) the others are replayed through the CLI.
#[test]
fn dirty_records_of_two_nodes_are_one_list_and_one_budget() {
    const ROWS: u64 = 100_000;
    let database = unique_name("dirty");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.events (id INT PRIMARY KEY, day DATE NULL); \
         SET SESSION sql_mode = ''; USE {database}; \
         INSERT INTO events SELECT seq, IF(seq % 5000 = 0, '0000-00-00', '2024-01-01') FROM seq_1_to_{ROWS};"
    ));
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", postgres_url())];
    let nodes: Vec<Server> = (0..2)
        .map(|index| start_server(&workspace, &format!("dirty{index}"), Some(&etcd.endpoints), &environment))
        .collect();
    let name = database.replace('_', "-");
    let job = format!(
        "name: {name}\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  namespace: {database}\nparallelism: 2\n\
         limits: {{ split_rows: 5000, rows_per_sec: 20000 }}\nerrors: {{ max_dirty_records: 17 }}\n"
    );
    let (status, body) = nodes[0].call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let mut view = Value::Null;
    wait_for("the job to end", Duration::from_secs(120), || {
        view = nodes[1].call("GET", &format!("/jobs/{name}"), None, None).1;
        view["state"] == "failed" || view["state"] == "succeeded"
    });
    let logs = || nodes.iter().map(|node| format!("--- {}\n{}", node.id, node.output())).collect::<String>();
    assert_eq!(view["state"], "failed", "20 dirty records exceed a budget of 17: {view:#}\n{}", logs());
    assert!(
        view["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("exceed errors.max_dirty_records = 17")),
        "{view:#}"
    );
    let (status, dirty) = nodes[1].call("GET", &format!("/jobs/{name}/dirty"), None, None);
    assert_eq!(status, 200, "{dirty}");
    let records = dirty["records"].as_array().expect("records");
    assert!(records.len() > 17 && dirty["total"].as_u64() == Some(records.len() as u64), "{dirty:#}");
    assert_eq!(dirty["limit"], 17, "{dirty:#}");
    let from: std::collections::BTreeSet<&str> = records.iter().filter_map(|record| record["node"].as_str()).collect();
    assert_eq!(from.len(), 2, "both nodes' records, in one list: {dirty:#}\n{}", logs());
    for node in &from {
        let share = records.iter().filter(|record| record["node"] == *node).count();
        assert!(share <= 17, "node {node} alone exceeds the budget ({share}): the test proves nothing: {dirty:#}");
    }
    for record in records {
        let id: u64 =
            record["key"].as_str().and_then(|key| key.strip_prefix("id=")).and_then(|id| id.parse().ok()).unwrap_or(0);
        assert_eq!(id % 5000, 0, "only zero-date rows are dirty: {record:#}");
        assert!(
            record["reason"].as_str().is_some_and(|reason| reason.contains("day")),
            "the reason names the column: {record:#}"
        );
    }
    // One is discarded through the CLI, kept in the audit log.
    let discarded = records[0]["id"].as_str().unwrap().to_owned();
    let discarded_key = records[0]["key"].as_str().unwrap().to_owned();
    workspace.sluice(&["job", "--server", &nodes[0].url, "discard", &name, &discarded]).assert_code(0);
    let audit = etcd.etcdctl().args(["get", "--prefix", "/sluice/audit/", "--print-value-only"]).output().unwrap();
    let audit = String::from_utf8_lossy(&audit.stdout);
    assert!(audit.contains("\"action\":\"discard\"") && audit.contains(&discarded), "{audit}");

    // The fix: zero dates are stored as NULL from version 2 on, which finishes the copy.
    let fixed = job.replace("max_dirty_records: 17 }", "max_dirty_records: 100, zero_dates: \"null\" }");
    let (status, body) = nodes[0].call("PUT", &format!("/jobs/{name}"), None, Some(("application/yaml", &fixed)));
    assert_eq!(status, 200, "{body}");
    wait_for("version 2 to finish the copy", Duration::from_secs(120), || {
        view = nodes[0].call("GET", &format!("/jobs/{name}"), None, None).1;
        view["version"] == 2 && (view["state"] == "succeeded" || view["state"] == "failed")
    });
    assert_eq!(view["state"], "succeeded", "{view:#}\n{}", logs());
    let (_, dirty) = nodes[0].call("GET", &format!("/jobs/{name}/dirty"), None, None);
    let left = dirty["total"].as_u64().unwrap();
    assert!(left > 0, "records of splits that version 1 committed stay dirty until replayed: {dirty:#}");

    // Replayed through the CLI: written by key with version 2's policy, none left.
    let run = workspace.sluice(&["job", "--server", &nodes[1].url, "replay", &name]);
    run.assert_code(0);
    assert!(run.stdout.contains(&format!("replayed {left} ")), "{}", run.all());
    let (_, dirty) = nodes[0].call("GET", &format!("/jobs/{name}/dirty"), None, None);
    assert_eq!(dirty["total"], 0, "{dirty:#}");
    let nulls = psql(&format!("SELECT string_agg(id::text, ',' ORDER BY id) FROM {database}.events WHERE day IS NULL"));
    let nulls: Vec<u64> = nulls.trim().split(',').filter_map(|id| id.parse().ok()).collect();
    let expected: Vec<u64> = (1..=ROWS / 5000)
        .map(|n| n * 5000)
        .filter(|id| format!("id={id}") != discarded_key || nulls.contains(id))
        .collect();
    assert_eq!(nulls, expected, "every zero-date row but the discarded one is in the target, its day NULL");
    let total: u64 = psql(&format!("SELECT count(*) FROM {database}.events")).trim().parse().unwrap();
    assert!(total >= ROWS - 1, "{total} rows");
}

/// `placement:` keeps a job on the nodes of its zone and labels. The stream runs on the one node
/// of zone `east`; that node killed, the stream waits (and says for what) while a node of zone
/// `west` with every other label idles beside it, and goes to the next `east` node that starts,
/// which brings the target level with the source. A job asking for a label no node carries
/// waits from the start.
#[test]
fn a_job_placed_in_a_zone_runs_only_on_its_nodes_and_waits_for_one() {
    let database = unique_name("zoned");
    create_tables(&database);
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", postgres_url())];
    let node = |id: &str, zone: &str| {
        let arguments = ["--etcd", etcd.endpoints.as_str(), "--zone", zone, "--label", "disk=ssd"];
        support::cluster::start_server_with(&workspace, id, &arguments, &environment)
    };
    let west = node("west0", "west");
    let east = node("east0", "east");
    let job = |name: &str, namespace: &str, placement: &str| {
        format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  namespace: {namespace}\nplacement: {placement}\n"
        )
    };
    let name = database.replace('_', "-");
    let jobs = [
        (name.clone(), database.clone(), "{zone: east, labels: {disk: ssd}}"),
        (format!("{name}-hdd"), format!("{database}_hdd"), "{labels: {disk: hdd}}"),
    ];
    for (name, namespace, placement) in jobs {
        let document = job(&name, &namespace, placement);
        let (status, body) = west.call("POST", "/jobs", None, Some(("application/yaml", &document)));
        assert_eq!(status, 201, "{body}");
    }
    let stream = |name: &str| {
        let (_, job) = west.call("GET", &format!("/jobs/{name}"), None, None);
        job["tasks"].as_array().and_then(|tasks| tasks.iter().find(|task| task["kind"] == "cdc").cloned())
    };
    let logs =
        |nodes: &[&Server]| nodes.iter().map(|node| format!("--- {}\n{}", node.id, node.output())).collect::<String>();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !stream(&name).is_some_and(|task| task["state"] == "running" && task["worker"] == "east0") {
        let (_, job) = west.call("GET", &format!("/jobs/{name}"), None, None);
        assert!(Instant::now() < deadline, "the stream runs on the east node: {job:#}\n{}", logs(&[&west, &east]));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, job_view) = west.call("GET", &format!("/jobs/{name}"), None, None);
    for task in job_view["tasks"].as_array().unwrap() {
        assert_eq!(task["worker"], "east0", "every task of the job ran in its zone: {job_view:#}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, hdd) = west.call("GET", &format!("/jobs/{name}-hdd"), None, None);
        let tasks = hdd["tasks"].as_array().cloned().unwrap_or_default();
        let waiting = |task: &Value| task["waiting_for"].as_str().is_some_and(|why| why.contains("label disk=hdd"));
        if !tasks.is_empty() && tasks.iter().all(|task| task["state"] == "pending" && waiting(task)) {
            break;
        }
        assert!(Instant::now() < deadline, "a job no node can run says so: {hdd:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let shown = workspace.sluice(&["job", "show", &format!("{name}-hdd"), "--server", &west.url]);
    shown.assert_code(0);
    assert!(shown.stdout.contains("waiting_for") && shown.stdout.contains("label disk=hdd"), "{}", shown.all());

    drop(east);
    mariadb(&format!("INSERT INTO {database}.items VALUES (900001, 1, 'while east is down')"));
    // Past the dead node's lease the stream is pending, and says it waits for its zone; the
    // west node never takes it meanwhile.
    wait_for("the stream to wait for its zone", Duration::from_secs(60), || {
        let task = stream(&name).unwrap_or_default();
        assert_ne!(task["worker"], "west0", "the stream ran outside its zone:\n{}", logs(&[&west]));
        task["state"] == "pending" && task["waiting_for"].as_str().is_some_and(|why| why.contains("zone east"))
    });
    let east = node("east1", "east");
    wait_for("the stream on the new east node", Duration::from_secs(60), || {
        let task = stream(&name).unwrap_or_default();
        assert_ne!(task["worker"], "west0", "the stream ran outside its zone:\n{}", logs(&[&west, &east]));
        task["state"] == "running" && task["worker"] == "east1"
    });
    let source = source_position();
    wait_for("the target to catch up", Duration::from_secs(60), || {
        stream_position("postgres", &name).is_some_and(|at| at >= source)
    });
    for (table, columns) in [("items", &["id", "v", "note"][..]), ("accounts", &["id", "balance"][..])] {
        let source = rows("mysql", &format!("{database}.{table}"), columns);
        let target = rows("postgres", &format!("{database}.{table}"), columns);
        assert_same(table, &source, &target);
    }
    drop((west, east));
    mariadb(&format!("DROP DATABASE IF EXISTS {database}"));
    psql(&format!("DROP SCHEMA IF EXISTS {database} CASCADE; DROP SCHEMA IF EXISTS {database}_hdd CASCADE"));
}
