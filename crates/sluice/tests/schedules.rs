//! Schedules: a `sluice server` runs a scheduled snapshot job again as numbered batches, each a
//! fresh copy (rows deleted at the source are gone from the target after the next batch); a
//! cron schedule waits for its first firing; bad schedules are refused at their fields. On a
//! 3-node cluster the batches go on after the leader is killed, and no batch is fired twice.
//! Priorities: a worker without room claims the tasks of a higher-priority job first.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use support::cluster::{start_server, Etcd, Server};
use support::workload::{assert_same, create_tables, rows};
use support::{assert_same_rows, make_source, mariadb, mysql_url, postgres_url, unique_name, wait_for, Workspace};

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
    let both = "name: both\nmode: cdc\nsource: {type: sqlite, path: source.db}\ntarget: {type: sqlite, path: x.db}\n\
                schedule: {every_secs: 5}\n";
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", both)));
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("cannot be scheduled"), "{body:#}");
}

#[test]
fn batches_go_on_after_the_leader_is_killed_and_none_is_fired_twice() {
    let database = unique_name("scheduled");
    create_tables(&database);
    let etcd = Etcd::start(1);
    let workspace = Workspace::new();
    let environment = [("SOURCE", mysql_url()), ("TARGET", postgres_url())];
    let mut nodes: Vec<Option<Server>> = (0..3)
        .map(|index| Some(start_server(&workspace, &format!("node{index}"), Some(&etcd.endpoints), &environment)))
        .collect();
    let name = database.replace('_', "-");
    let job = format!(
        "name: {name}\nmode: snapshot\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nparallelism: 2\n\
         schedule: {{every_secs: 3, overlap: queue}}\n"
    );
    let logs = || -> String {
        (0..3)
            .map(|index| {
                format!(
                    "--- node{index}\n{}",
                    std::fs::read_to_string(workspace.path(&format!("node{index}.log"))).unwrap_or_default()
                )
            })
            .collect()
    };
    let (status, body) = nodes[0].as_ref().unwrap().call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let servers: Vec<&Server> = nodes.iter().flatten().collect();
    let first = wait_batch_after(&servers, &name, 0, logs);
    let before_kill = first["schedule"]["batch"].as_u64().unwrap();

    // The leader dies; the source changes; a later batch copies the change.
    let (_, leader) = nodes[0].as_ref().unwrap().call("GET", "/leader", None, None);
    let leader = leader["leader"].as_str().expect("a leader").to_owned();
    let index = nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == leader)).unwrap();
    let mut killed = nodes[index].take().unwrap();
    support::kill(&mut killed.child);
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
        let target = rows("postgres", &format!("{database}.{table}"), columns);
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
    wait_batch_after(&[&server], "manual", 0, || server.output());
    assert_same_rows(&workspace.path("manual.db"), &workspace.path("source.db"), "items");
    let (status, _) = server.call("POST", "/jobs/x/batches", None, None);
    assert_eq!(status, 202);
}
