//! Schedules: a `sluice server` runs a scheduled snapshot job again as numbered batches, each a
//! fresh copy (rows deleted at the source are gone from the target after the next batch); a
//! cron schedule waits for its first firing; bad schedules are refused at their fields. On a
//! 3-node cluster the batches go on after the leader is killed, and no batch is fired twice.
//! Priorities: a worker without room claims the tasks of a higher-priority job first.

use crate::support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cluster::{start_server, Etcd, Server};
use support::workload::{assert_same, create_tables, rows};
use support::{
    assert_same_rows, make_source, mariadb, mysql_url, postgres_url, psql, unique_name, wait_for, Workspace,
};

fn show(server: &Server, name: &str) -> Value {
    server.call("GET", &format!("/jobs/{name}"), None, None).1
}

/// Waits until a batch numbered above `after` ended, and returns the job.
fn wait_batch_after(servers: &[&Server], name: &str, after: u64, logs: impl Fn() -> String) -> Value {
    let mut last = Value::Null;
    wait_for(&format!("a batch of job {name} after batch {after} to end"), Duration::from_secs(120), || {
        last = show(servers[0], name);
        last["schedule"]["history"].as_array().is_some_and(|history| {
            history.iter().any(|record| {
                record["batch"].as_u64().is_some_and(|batch| batch > after)
                    && (record["outcome"] == "succeeded" || record["outcome"] == "failed")
            })
        })
    });
    let ended = last["schedule"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|record| record["batch"].as_u64().is_some_and(|batch| batch > after) && record["outcome"] != "running")
        .cloned()
        .unwrap();
    assert_eq!(ended["outcome"], "succeeded", "{last:#}\n{}", logs());
    last
}

/// The batches fired are numbered 1, 2, 3 … without a gap or a repeat, each in a generation
/// of its own.
fn assert_batches_fired_once(job: &Value) {
    let history = job["schedule"]["history"].as_array().unwrap();
    let fired: Vec<u64> = history.iter().filter_map(|record| record["batch"].as_u64()).collect();
    let expected: Vec<u64> = (fired[0]..fired[0] + fired.len() as u64).collect();
    assert_eq!(fired, expected, "batches in order, once each: {job:#}");
    let generations: BTreeSet<u64> = history.iter().filter_map(|record| record["generation"].as_u64()).collect();
    assert_eq!(generations.len(), fired.len(), "a generation per batch: {job:#}");
    assert_eq!(job["schedule"]["batch"], *fired.last().unwrap(), "{job:#}");
}

#[test]
fn a_scheduled_snapshot_runs_again_as_numbered_batches_each_a_fresh_copy() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 300);
    let server = start_server(&workspace, "solo", None, &[]);
    let job = "name: nightly\nmode: snapshot\nsource: {type: sqlite, path: source.db}\n\
               target: {type: sqlite, path: target.db}\nschedule: {every_secs: 2}\n";
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", job)));
    assert_eq!(status, 201, "{body}");
    let first = wait_batch_after(&[&server], "nightly", 0, || server.output());
    for table in ["items", "events", "tags"] {
        assert_same_rows(&workspace.path("target.db"), &workspace.path("source.db"), table);
    }
    assert_eq!(first["schedule"]["schedule"], "every 2 s", "{first:#}");
    assert!(first["schedule"]["next_at"].is_string(), "{first:#}");

    // Rows deleted, changed and added at the source: the next batch copies afresh.
    let source = rusqlite::Connection::open(workspace.path("source.db")).unwrap();
    source.busy_timeout(Duration::from_secs(30)).unwrap();
    source
        .execute_batch(
            "DELETE FROM items WHERE id % 3 = 0; UPDATE items SET name = 'renamed' WHERE id % 3 = 1;
             INSERT INTO items (id, name) VALUES (10001, 'new'); DELETE FROM tags WHERE item_id < 50;",
        )
        .unwrap();
    drop(source);
    let changed_at = show(&server, "nightly")["schedule"]["batch"].as_u64().unwrap();
    let later = wait_batch_after(&[&server], "nightly", changed_at, || server.output());
    for table in ["items", "events", "tags"] {
        assert_same_rows(&workspace.path("target.db"), &workspace.path("source.db"), table);
    }
    assert_batches_fired_once(&later);

    // A cron schedule waits for its first firing, with nothing planned meanwhile.
    let yearly = "name: yearly\nmode: snapshot\nsource: {type: sqlite, path: source.db}\n\
                  target: {type: sqlite, path: yearly.db}\n\
                  schedule: {cron: \"0 3 1 1 *\", timezone: Asia/Tokyo, overlap: queue, missed: skip}\n";
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", yearly)));
    assert_eq!(status, 201, "{body}");
    let mut waiting = Value::Null;
    wait_for("the yearly job's first firing to be set", Duration::from_secs(30), || {
        waiting = show(&server, "yearly");
        waiting["schedule"]["next_at"].is_string()
    });
    assert_eq!(waiting["state"], "scheduled", "{waiting:#}");
    assert!(waiting["tasks"].as_array().unwrap().is_empty(), "{waiting:#}");
    // 03:00 in Tokyo on 1 January is 18:00 UTC on 31 December.
    assert!(waiting["schedule"]["next_at"].as_str().unwrap().ends_with("-12-31T18:00:00Z"), "{waiting:#}");
    assert!(!workspace.path("yearly.db").exists(), "nothing ran before the first firing");

    // Bad schedules: every problem at its field, at once.
    let bad = "name: bad\nmode: cdc\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: x.db}\n\
               schedule: {cron: \"61 * * * *\", timezone: Mars/Olympus, overlap: sometimes, every: 5}\n";
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", bad)));
    assert_eq!(status, 400, "{body}");
    let paths: BTreeSet<&str> =
        body["errors"].as_array().unwrap().iter().filter_map(|error| error["path"].as_str()).collect();
    for path in ["schedule.cron", "schedule.timezone", "schedule.overlap", "schedule.every"] {
        assert!(paths.contains(path), "{path} is reported: {body:#}");
    }
    let both =
        "name: both\nmode: snapshot+cdc\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: x.db}\n\
                schedule: {every_secs: 5}\n";
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", both)));
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("cannot be scheduled"), "{body:#}");
}

/// Three `sluice server` nodes on one etcd, with the source and target URLs in their environment.
fn three_nodes(workspace: &Workspace, etcd: &Etcd) -> Vec<Option<Server>> {
    let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", postgres_url())];
    (0..3)
        .map(|index| Some(start_server(workspace, &format!("node{index}"), Some(&etcd.endpoints), &environment)))
        .collect()
}

/// The logs of the three nodes, one after the other.
fn node_logs(workspace: &Workspace) -> String {
    (0..3)
        .map(|index| {
            let log = std::fs::read_to_string(workspace.path(&format!("node{index}.log"))).unwrap_or_default();
            format!("--- node{index}\n{log}")
        })
        .collect()
}

/// SIGKILLs the node that leads the cluster.
fn kill_leader(nodes: &mut [Option<Server>]) {
    let (_, leader) = nodes.iter().flatten().next().expect("a live node").call("GET", "/leader", None, None);
    let leader = leader["leader"].as_str().expect("a leader").to_owned();
    let index = nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == leader)).unwrap();
    let mut killed = nodes[index].take().unwrap();
    support::kill(&mut killed.child);
}

#[test]
fn batches_go_on_after_the_leader_is_killed_and_none_is_fired_twice() {
    let database = unique_name("scheduled");
    create_tables(&database);
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let mut nodes = three_nodes(&workspace, &etcd);
    let name = database.replace('_', "-");
    let job = format!(
        "name: {name}\nmode: snapshot\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  namespace: {database}\nparallelism: 2\n\
         schedule: {{every_secs: 3, overlap: queue}}\n"
    );
    let logs = || node_logs(&workspace);
    let (status, body) = nodes[0].as_ref().unwrap().call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let servers: Vec<&Server> = nodes.iter().flatten().collect();
    let first = wait_batch_after(&servers, &name, 0, logs);
    let before_kill = first["schedule"]["batch"].as_u64().unwrap();

    // The leader dies; the source changes; a later batch copies the change.
    kill_leader(&mut nodes);
    mariadb(&format!(
        "DELETE FROM {database}.items WHERE id % 4 = 0; UPDATE {database}.accounts SET balance = balance + id;
         INSERT INTO {database}.items VALUES (900001, 1, 'after the kill')"
    ));
    let servers: Vec<&Server> = nodes.iter().flatten().collect();
    let changed_at = before_kill.max(
        servers.iter().map(|server| show(server, &name)["schedule"]["batch"].as_u64().unwrap_or(0)).max().unwrap(),
    );
    let later = wait_batch_after(&servers, &name, changed_at, logs);
    for (table, columns) in [("items", &["id", "v", "note"][..]), ("accounts", &["id", "balance"][..])] {
        let source = rows("mysql", &format!("{database}.{table}"), columns);
        // Each batch empties the target before it copies: the batch queued behind the one that
        // ended may be doing so now. The target equals the source between two batches.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut target = rows("postgres", &format!("{database}.{table}"), columns);
        while target != source && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            target = rows("postgres", &format!("{database}.{table}"), columns);
        }
        assert_same(table, &source, &target);
    }
    assert_batches_fired_once(&later);
    // Every batch was fired by one node, once.
    let all_logs = logs();
    for batch in later["schedule"]["history"].as_array().unwrap().iter().filter_map(|record| record["batch"].as_u64()) {
        let firings = all_logs.matches(&format!("job {name}: batch {batch} fires")).count();
        assert_eq!(firings, 1, "batch {batch} fired {firings} times:\n{all_logs}");
    }
    drop(servers);
    drop(nodes);
}

#[test]
fn a_worker_without_room_claims_the_higher_priority_tasks_first() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 600);
    let server = support::cluster::start_server_with(&workspace, "solo", &["--capacity", "1"], &[]);
    let job = |name: &str, priority: u32| {
        format!(
            "name: {name}\nmode: snapshot\npriority: {priority}\nsource: {{type: sqlite, path: source.db}}\n\
             target: {{type: sqlite, path: {name}.db}}\nlimits: {{rows_per_sec: 200}}\n"
        )
    };
    let claims = |server: &Server| -> Vec<String> {
        server
            .output()
            .lines()
            .filter_map(|line| line.split("claimed task ").nth(1))
            .map(|rest| rest.split('/').next().unwrap_or_default().to_owned())
            .collect()
    };
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", &job("low", 0))));
    assert_eq!(status, 201, "{body}");
    wait_for("the low job's first task to be claimed", Duration::from_secs(30), || !claims(&server).is_empty());
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", &job("high", 10))));
    assert_eq!(status, 201, "{body}");
    for name in ["low", "high"] {
        wait_for(&format!("job {name} to succeed"), Duration::from_secs(90), || {
            show(&server, name)["state"] == "succeeded"
        });
    }
    // One task at a time: the low job's first (its second too, if the high one was planned
    // only after it), then every task of the high one, then the rest of the low one.
    let order = claims(&server);
    let first_high = order.iter().position(|name| name == "high").expect("high claimed");
    assert!((1..=2).contains(&first_high), "{order:?}\n{}", server.output());
    assert_eq!(order[first_high..first_high + 3], ["high", "high", "high"], "{order:?}\n{}", server.output());
    assert!(order[first_high + 3..].iter().all(|name| name == "low") && order.len() == 6, "{order:?}");
    assert_eq!(show(&server, "high")["priority"], 10);
    for table in ["items", "events", "tags"] {
        assert_same_rows(&workspace.path("low.db"), &workspace.path("source.db"), table);
        assert_same_rows(&workspace.path("high.db"), &workspace.path("source.db"), table);
    }
}

/// The batches of `name` that ended, with their outcome.
fn outcomes(job: &Value) -> Vec<(Option<u64>, String)> {
    job["schedule"]["history"]
        .as_array()
        .map(|history| {
            history
                .iter()
                .map(|record| (record["batch"].as_u64(), record["outcome"].as_str().unwrap_or_default().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn jobs_run_after_others_batch_by_batch_and_follow_each_dependency_policy() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 300);
    let server = start_server(&workspace, "solo", None, &[]);
    let submit = |document: &str| {
        let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", document)));
        assert_eq!(status, 201, "{body}");
    };
    submit(
        "name: extract\nmode: snapshot\nsource: {type: sqlite, path: source.db}\n\
         target: {type: sqlite, path: stage.db}\nschedule: {every_secs: 2, overlap: queue}\n",
    );
    submit(
        "name: load\nmode: snapshot\nsource: {type: sqlite, path: stage.db, tables: [\"!_sluice*\"]}\n\
         target: {type: sqlite, path: final.db}\nafter: [extract]\n",
    );
    let first = wait_batch_after(&[&server], "load", 0, || server.output());
    assert!(first["schedule"]["schedule"].as_str().unwrap().starts_with("after extract"), "{first:#}");
    // The source changes; a later batch of both carries it through.
    let source = rusqlite::Connection::open(workspace.path("source.db")).unwrap();
    // A batch may be reading it.
    source.busy_timeout(Duration::from_secs(30)).unwrap();
    source
        .execute_batch("DELETE FROM items WHERE id % 2 = 0; UPDATE items SET name = 'moved' WHERE id % 5 = 1; DELETE FROM tags WHERE item_id % 5 = 0;")
        .unwrap();
    let changed_at = show(&server, "extract")["schedule"]["batch"].as_u64().unwrap();
    let load = wait_batch_after(&[&server], "load", changed_at, || server.output());
    for table in ["items", "events", "tags"] {
        assert_same_rows(&workspace.path("final.db"), &workspace.path("source.db"), table);
    }
    // Every batch of load ran after the same batch of extract succeeded.
    let extract = outcomes(&show(&server, "extract"));
    for (batch, outcome) in outcomes(&load) {
        let Some(batch) = batch else { continue };
        if outcome == "running" {
            continue;
        }
        assert!(
            extract.iter().any(|(theirs, outcome)| *theirs == Some(batch) && outcome == "succeeded"),
            "load batch {batch} without extract batch {batch}: {extract:?}"
        );
    }

    // A dependency that fails: one dependant skips its batch, one stops.
    submit(
        "name: broken\nmode: snapshot\nsource: {type: sqlite, path: source.db, tables: [missing_table]}\n\
         target: {type: sqlite, path: broken.db}\nschedule: {every_secs: 3600}\n",
    );
    submit(
        "name: skipper\nmode: snapshot\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: skipper.db}\n\
         after: [{job: broken, on_failure: skip}]\n",
    );
    submit(
        "name: stopper\nmode: snapshot\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: stopper.db}\n\
         after: [{job: broken, on_failure: stop}]\n",
    );
    let mut skipped = Value::Null;
    wait_for("skipper to skip its batch 1", Duration::from_secs(60), || {
        skipped = show(&server, "skipper");
        outcomes(&skipped).iter().any(|(batch, outcome)| {
            *batch == Some(1) && outcome.starts_with("skipped: job broken batch 1 ended failed")
        })
    });
    let mut stopped = Value::Null;
    wait_for("stopper to stop", Duration::from_secs(60), || {
        stopped = show(&server, "stopper");
        stopped["state"] == "stopped"
    });
    assert!(
        outcomes(&stopped).iter().any(|(_, outcome)| outcome.starts_with("stopped: job broken batch 1")),
        "{stopped:#}"
    );
    assert!(!workspace.path("skipper.db").exists() && !workspace.path("stopper.db").exists(), "neither ran");

    // Jobs that would wait for each other are refused.
    submit("name: x\nmode: snapshot\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: x.db}\nafter: [y]\n");
    let (status, body) = server.call(
        "POST",
        "/jobs",
        None,
        Some(("application/yaml", "name: y\nmode: snapshot\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: y.db}\nafter: [x]\n")),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("y → x → y"), "{body:#}");

    // A batch asked for runs now, whatever the schedule says.
    submit(
        "name: manual\nmode: snapshot\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: manual.db}\n\
         schedule: {cron: \"0 0 1 1 *\"}\n",
    );
    let (status, body) = server.call("POST", "/jobs/manual/batches", None, None);
    assert_eq!((status, body["batch"].as_u64()), (202, Some(1)), "{body}");
    let manual = wait_batch_after(&[&server], "manual", 0, || server.output());
    // Asked for right after submission: the yearly schedule still fires on 1 January.
    assert!(manual["schedule"]["next_at"].as_str().is_some_and(|at| at.ends_with("-01-01T00:00:00Z")), "{manual:#}");
    assert_same_rows(&workspace.path("manual.db"), &workspace.path("source.db"), "items");
    let (status, _) = server.call("POST", "/jobs/x/batches", None, None);
    assert_eq!(status, 202);
}

/// The rows of a summary's run, read and written.
fn rows_read(workspace: &Workspace, file: &str) -> u64 {
    support::summary(&workspace.path(file))["rows_read"].as_u64().unwrap()
}

#[test]
fn incremental_cursor_batches_copy_the_rows_changed_since_the_mark_and_late_ones_within_the_lookback() {
    let database = unique_name("cursor");
    // 1,000 orders a second apart from 2026-01-01 00:00:01 (the last, id 1000, at 00:16:40),
    // and one without a cursor value.
    mariadb(&format!(
        "CREATE DATABASE {database};
         CREATE TABLE {database}.orders (id INT PRIMARY KEY, note VARCHAR(40), updated_at DATETIME(3) NULL, KEY (updated_at));
         INSERT INTO {database}.orders SELECT seq, CONCAT('n', seq), '2026-01-01 00:00:00' + INTERVAL seq SECOND FROM {database}.seq_1_to_1000;
         INSERT INTO {database}.orders VALUES (5000, 'no cursor', NULL)"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: cursor\nmode: incremental-cursor\nsource:\n  type: mysql\n  url: {}\n  tables: [{database}.orders]\n  \
             cursor: {{column: updated_at, lookback_secs: 60}}\ntarget:\n  type: postgres\n  url: {}\n  namespace: {database}\n",
            mysql_url(),
            postgres_url()
        ),
    );
    let run = |summary: &str| {
        workspace.sluice(&["run", job.to_str().unwrap(), "--summary-json", summary]).assert_code(0);
    };
    let compare = || {
        let source = rows("mysql", &format!("{database}.orders"), &["id", "note"]);
        let target = rows("postgres", &format!("{database}.orders"), &["id", "note"]);
        (source, target)
    };
    run("first.json");
    let (source, target) = compare();
    assert_same("orders", &source, &target);
    assert_eq!(rows_read(&workspace, "first.json"), 1_001);

    // Ten rows changed, five added, one committed late 30 s below the mark (caught by the
    // lookback) and one an hour below (not), one deleted and one changed without its cursor
    // (neither visible to this mode).
    mariadb(&format!(
        "UPDATE {database}.orders SET note = CONCAT(note, ' changed'), updated_at = '2026-01-02 00:00:00' WHERE id <= 10;
         INSERT INTO {database}.orders SELECT seq, 'new', '2026-01-02 00:00:01' FROM {database}.seq_2001_to_2005;
         INSERT INTO {database}.orders VALUES (3001, 'late', '2026-01-01 00:16:10'), (3002, 'too late', '2026-01-01 00:10:00');
         DELETE FROM {database}.orders WHERE id = 500;
         UPDATE {database}.orders SET note = 'silent' WHERE id = 600"
    ));
    run("second.json");
    // The window (00:15:40, 2026-01-02 00:00:01]: ids 941 to 1000, the ten changed, the five
    // new and the late one.
    assert_eq!(rows_read(&workspace, "second.json"), 60 + 10 + 5 + 1);
    let (source, target) = compare();
    let expected: Vec<String> = source
        .iter()
        .filter(|row| !row.starts_with("3002|"))
        .map(|row| if row.starts_with("600|") { "600|n600".to_owned() } else { row.clone() })
        .chain(std::iter::once("500|n500".to_owned()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let target_sorted: Vec<String> = target.iter().cloned().collect::<BTreeSet<_>>().into_iter().collect();
    assert_eq!(target_sorted, expected, "changed, new and late rows copied; deletes and silent changes not seen");

    // Nothing changed: the next batch reads only its lookback window again.
    run("third.json");
    assert_eq!(rows_read(&workspace, "third.json"), 15);

    // Bad cursors are named with their table and column.
    mariadb(&format!("CREATE TABLE {database}.plain (id INT PRIMARY KEY)"));
    let bad = workspace.write(
        "bad.yaml",
        &format!(
            "name: bad\nmode: incremental-cursor\nsource:\n  type: mysql\n  url: {}\n  tables: [\"{database}.*\"]\n  \
             cursor: {{column: updated_at}}\ntarget:\n  type: postgres\n  url: {}\n  namespace: {database}_bad\n",
            mysql_url(),
            postgres_url()
        ),
    );
    let failed = workspace.sluice(&["run", bad.to_str().unwrap()]);
    assert!(failed.all().contains(&format!("table {database}.plain has no column updated_at")), "{}", failed.all());
    let refused = workspace.write(
        "refused.yaml",
        "name: refused\nmode: incremental-cursor\nsource: {type: sqlite, path: s.db}\n\
         target: {type: jsonl, path: out, write_mode: insert}\n",
    );
    let refused = workspace.sluice(&["run", refused.to_str().unwrap()]);
    for expected in ["source.cursor", "target.write_mode", "a `jsonl` target only appends"] {
        assert!(refused.all().contains(expected), "{expected}: {}", refused.all());
    }
}

/// When each batch of a job was fired and seen to end, by batch number.
fn batch_times(job: &Value) -> std::collections::BTreeMap<u64, (String, Option<String>)> {
    job["schedule"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|record| {
            let batch = record["batch"].as_u64()?;
            Some((batch, (record["fired_at"].as_str()?.to_owned(), record["ended_at"].as_str().map(str::to_owned))))
        })
        .collect()
}

/// The unit of the issue: two snapshots into a staging database feed a cursor-incremental job
/// into PostgreSQL, every 3 s, on a 3-node cluster whose leader is killed between batches.
#[test]
fn a_unit_of_two_snapshots_feeding_a_cursor_job_runs_its_batches_in_order_through_a_leader_kill() {
    let database = unique_name("unit");
    let stage = format!("{database}_stage");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE DATABASE {stage};
         CREATE TABLE {database}.customers (id INT PRIMARY KEY, name VARCHAR(40), updated_at DATETIME(3) NOT NULL);
         CREATE TABLE {database}.orders (id INT PRIMARY KEY, customer_id INT, amount INT, updated_at DATETIME(3) NOT NULL);
         INSERT INTO {database}.customers SELECT seq, CONCAT('c', seq), NOW(3) FROM {database}.seq_1_to_300;
         INSERT INTO {database}.orders SELECT seq, seq % 300 + 1, seq, NOW(3) FROM {database}.seq_1_to_3000"
    ));
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let mut nodes = three_nodes(&workspace, &etcd);
    let prefix = database.replace('_', "-");
    let [customers, orders, load] = ["customers", "orders", "load"].map(|job| format!("{prefix}-{job}"));
    let snapshot = |table: &str| {
        format!(
            "mode: snapshot\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [{database}.{table}]\n\
             target:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  namespace: {stage}\n"
        )
    };
    let jobs = [
        format!("name: {customers}\n{}schedule: {{every_secs: 3, overlap: queue}}\n", snapshot("customers")),
        format!("name: {orders}\n{}after: [{customers}]\n", snapshot("orders")),
        format!(
            "name: {load}\nmode: incremental-cursor\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{stage}.*\"]\n  \
             cursor: {{column: updated_at, lookback_secs: 5}}\ntarget:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  \
             namespace: {database}\nafter: [{customers}, {orders}]\n"
        ),
    ];
    // One unit file, its jobs separated by `---`; one bad document and none is submitted.
    let url = nodes[0].as_ref().unwrap().url.clone();
    let submit = |file: &str, text: &str| {
        workspace.write(file, text);
        support::Run::from(workspace.command(&["job", "--server", &url, "submit", file]).output().unwrap())
    };
    let broken = format!("{}---\n{}  bogus: 1\n", jobs[0], jobs[1]);
    let refused = submit("broken-unit.yaml", &broken);
    refused.assert_code(2);
    assert!(
        refused.all().contains("document 2") && refused.all().contains("nothing was submitted"),
        "{}",
        refused.all()
    );
    assert_eq!(nodes[0].as_ref().unwrap().call("GET", &format!("/jobs/{customers}"), None, None).0, 404);
    submit("unit.yaml", &format!("# the unit\n---\n{}", jobs.join("---\n"))).assert_code(0);
    let logs = || node_logs(&workspace);
    let change = |round: u64| {
        mariadb(&format!(
            "UPDATE {database}.customers SET name = CONCAT(name, '+{round}'), updated_at = NOW(3) WHERE id % 7 = {round};
             UPDATE {database}.orders SET amount = amount + {round}, updated_at = NOW(3) WHERE id % 11 = {round};
             INSERT INTO {database}.orders SELECT 10000 * {round} + seq, seq, seq, NOW(3) FROM {database}.seq_1_to_50"
        ));
    };
    let servers: Vec<&Server> = nodes.iter().flatten().collect();
    wait_batch_after(&servers, &load, 0, logs);
    change(1);
    let second = wait_batch_after(&servers, &load, 1, logs);
    change(2);
    drop(servers);

    // The leader dies between batches; the source changes once more.
    kill_leader(&mut nodes);
    change(3);
    let servers: Vec<&Server> = nodes.iter().flatten().collect();
    let changed_at =
        servers.iter().map(|server| show(server, &customers)["schedule"]["batch"].as_u64().unwrap_or(0)).max();
    let last = wait_batch_after(
        &servers,
        &load,
        changed_at.unwrap().max(4).max(second["schedule"]["batch"].as_u64().unwrap()),
        logs,
    );

    // Targets equal their sources (the cursor job cannot see deletes, and there are none).
    for (table, columns) in [("customers", &["id", "name"][..]), ("orders", &["id", "customer_id", "amount"][..])] {
        let source = rows("mysql", &format!("{database}.{table}"), columns);
        assert!(source.len() > 100, "{table}: {} rows", source.len());
        assert_same(table, &source, &rows("postgres", &format!("{database}.{table}"), columns));
    }
    // Five batches or more, none fired twice, each one's dependencies ended first.
    let [customers_job, orders_job] = [&customers, &orders].map(|name| show(servers[0], name));
    for job in [&customers_job, &orders_job, &last] {
        assert_batches_fired_once(job);
    }
    let all_logs = logs();
    let (first_batches, order_batches, load_batches) =
        (batch_times(&customers_job), batch_times(&orders_job), batch_times(&last));
    assert!(load_batches.len() >= 5, "{last:#}");
    for (batch, (fired, _)) in &load_batches {
        for (name, upstream) in [(&customers, &first_batches), (&orders, &order_batches)] {
            let ended = upstream.get(batch).and_then(|(_, ended)| ended.as_ref());
            let ended = ended.unwrap_or_else(|| panic!("{name} has no ended batch {batch}: {upstream:?}"));
            assert!(fired > ended, "{load} batch {batch} fired at {fired}, before {name} ended it at {ended}");
        }
        assert_eq!(
            last["schedule"]["history"].as_array().unwrap().iter().find(|record| record["batch"] == *batch).unwrap()
                ["outcome"],
            "succeeded"
        );
        for name in [&customers, &orders, &load] {
            let firings = all_logs.matches(&format!("job {name}: batch {batch} fires")).count();
            assert_eq!(firings, 1, "{name} batch {batch} fired {firings} times:\n{all_logs}");
        }
    }

    // A backfill: rows lost in the target come back when every batch so far runs again, and the
    // batch after it goes on from the marks.
    psql(&format!("DELETE FROM {database}.orders WHERE id % 3 = 0; DELETE FROM {database}.customers WHERE id < 50"));
    let current = last["schedule"]["batch"].as_u64().unwrap();
    wait_for("the leader records the last batch's end", Duration::from_secs(30), || {
        let job = show(servers[0], &load);
        job["schedule"]["history"]
            .as_array()
            .unwrap()
            .iter()
            .any(|record| record["batch"] == current && record["ended_at"].is_string())
    });
    for bad in [r#"{"from": 0}"#.to_owned(), format!(r#"{{"from": 1, "to": {}}}"#, current + 5), "[]".to_owned()] {
        let (status, body) =
            servers[0].call("POST", &format!("/jobs/{load}/batches"), None, Some(("application/json", &bad)));
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let rerun = format!(r#"{{"from": 1, "to": {current}}}"#);
    let (status, body) =
        servers[0].call("POST", &format!("/jobs/{load}/batches"), None, Some(("application/json", &rerun)));
    assert_eq!(status, 202, "{body}");
    let asked = body["batch"].as_u64().unwrap();
    wait_batch_after(&servers, &load, asked, logs);
    for (table, columns) in [("customers", &["id", "name"][..]), ("orders", &["id", "customer_id", "amount"][..])] {
        let source = rows("mysql", &format!("{database}.{table}"), columns);
        assert_same(table, &source, &rows("postgres", &format!("{database}.{table}"), columns));
    }
    let mut history = Vec::new();
    wait_for("the leader records both batches' rows", Duration::from_secs(30), || {
        history = show(servers[0], &load)["schedule"]["history"].as_array().unwrap().clone();
        [asked, asked + 1]
            .iter()
            .all(|batch| history.iter().any(|record| record["batch"] == *batch && record["rows"].is_object()))
    });
    let record = |batch: u64| history.iter().find(|record| record["batch"] == batch).unwrap().clone();
    let (again, next) = (record(asked), record(asked + 1));
    assert_eq!(again["rerun_of"], serde_json::json!({"from": 1, "to": current}), "{again}");
    let (read_again, read_next) = (again["rows"]["read"].as_u64().unwrap(), next["rows"]["read"].as_u64().unwrap());
    assert!(read_again >= 3_000 + 300, "the rerun read every row: {again}");
    assert!(read_next < read_again / 2, "the batch after it reads from the marks: {next}");
    drop(servers);
    drop(nodes);
}
