//! Change events into NATS JetStream, exactly once and in order: a MariaDB workload whose every
//! statement gives its row a new `version`, transactions of one to four statements, while sluice
//! is SIGKILLed, aborted after the broker acknowledged a commit's events but before its
//! checkpoint, and the broker restarted. The stream must hold, per key, exactly the statements
//! issued (0 gaps, 0 duplicates, in order), each transaction whole with its event count.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::nats::NatsServer;
use support::workload::{Client, Random};
use support::{kill, mariadb, mysql_url, unique_name, wait_for, Workspace};

const KILLS: usize = 10;
const ABORTS: usize = 5;
const BROKER_RESTARTS: usize = 3;

/// One statement's effect on a key, as the events must show it: the kind and the row's version.
type Expected = BTreeMap<i64, Vec<(String, i64)>>;

/// Statements for `transactions` transactions over `keys` keys, and what each key must show.
fn workload(
    random: &mut Random,
    keys: i64,
    transactions: usize,
    expected: &mut Expected,
    versions: &mut BTreeMap<i64, i64>,
    exists: &mut BTreeMap<i64, bool>,
) -> Vec<String> {
    let mut batches = Vec::new();
    for _ in 0..transactions {
        let mut sql = String::from("BEGIN;");
        let statements = 1 + random.below(4);
        let mut touched = Vec::new();
        for _ in 0..statements {
            let key = 1 + random.below(keys as u64) as i64;
            if touched.contains(&key) {
                continue;
            }
            touched.push(key);
            let version = versions.entry(key).or_insert(-1);
            let present = exists.entry(key).or_insert(false);
            let events = expected.entry(key).or_default();
            if !*present {
                *version += 1;
                sql.push_str(&format!("INSERT INTO counters VALUES ({key}, {version}, 'new');"));
                events.push(("c".into(), *version));
                *present = true;
            } else if random.below(5) == 0 {
                sql.push_str(&format!("DELETE FROM counters WHERE id = {key};"));
                events.push(("d".into(), *version));
                *present = false;
            } else {
                *version += 1;
                sql.push_str(&format!(
                    "UPDATE counters SET version = {version}, note = 'v{version}' WHERE id = {key};"
                ));
                events.push(("u".into(), *version));
            }
        }
        sql.push_str("COMMIT;");
        batches.push(sql);
    }
    batches
}

#[test]
fn every_change_reaches_nats_exactly_once_in_order_across_kills_and_broker_restarts() {
    let mut broker = NatsServer::start();
    let database = unique_name("streams");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.counters (id BIGINT PRIMARY KEY, version BIGINT NOT NULL, note VARCHAR(32));"
    ));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: nats\n  url: ${{TARGET}}\n  stream: EVENTS\n  subject: \"cdc.{{db}}.{{table}}\"\n  format: debezium\n"
        ),
    );
    let mut random = Random::from_environment("every_change_reaches_nats_exactly_once");
    let (mut expected, mut versions, mut exists) = (Expected::new(), BTreeMap::new(), BTreeMap::new());
    // The same port after every broker restart.
    let broker_url = broker.url();
    let start = |workspace: &Workspace, failpoint: Option<&str>| {
        let mut command = workspace.command(&["run", job.to_str().unwrap()]);
        command.env("SOURCE", mysql_url()).env("TARGET", broker_url.as_str());
        if let Some(failpoint) = failpoint {
            command.env("SLUICE_FAILPOINT", failpoint);
        }
        support::Guard::new(
            command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(),
        )
    };

    // The first run plans the job at the source's position now; the stream exists once it has.
    let mut child = start(&workspace, None);
    wait_for("the events stream", Duration::from_secs(60), || stream_exists(&broker, "EVENTS"));
    let mut client = Client::start(&database);
    let mut sent = 0;
    let mut send = |client: &mut Client,
                    random: &mut Random,
                    expected: &mut Expected,
                    versions: &mut BTreeMap<i64, i64>,
                    exists: &mut BTreeMap<i64, bool>| {
        for sql in workload(random, 200, 100, expected, versions, exists) {
            client.send(&sql);
        }
        sent += 100;
    };
    for round in 0..(KILLS + ABORTS + BROKER_RESTARTS) {
        send(&mut client, &mut random, &mut expected, &mut versions, &mut exists);
        let seen = broker_messages(&broker);
        wait_for("events since the last fault", Duration::from_secs(90), || broker_messages(&broker) > seen);
        std::thread::sleep(Duration::from_millis(random.below(200)));
        if round < KILLS {
            kill(&mut child);
            child = start(&workspace, None);
        } else if round < KILLS + ABORTS {
            kill(&mut child);
            // Aborts after the broker acknowledged a commit's events, before the checkpoint.
            let mut aborting = start(&workspace, Some(&format!("events.acknowledged@{}", 2 + round % 3)));
            send(&mut client, &mut random, &mut expected, &mut versions, &mut exists);
            let status = wait_exit(&mut aborting);
            let output = aborting.stderr_text();
            assert!(
                !status.success() && output.contains("failpoint events.acknowledged"),
                "the run aborted at the crash point:\n{output}"
            );
            child = start(&workspace, None);
        } else {
            broker.restart();
        }
    }
    client.finish();
    let total: usize = expected.values().map(Vec::len).sum();
    wait_for("every change in the stream", Duration::from_secs(120), || broker_messages(&broker) as usize >= total);
    // A little longer: anything extra (a duplicate) would arrive now.
    kill(&mut child);

    let messages = broker.messages("EVENTS");
    let mut found = Expected::new();
    let mut transactions: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for message in &messages {
        let event = &message.payload;
        let op = event["op"].as_str().unwrap().to_owned();
        let image = if op == "d" { &event["before"] } else { &event["after"] };
        let key = image["id"].as_i64().unwrap();
        assert_eq!(message.key, format!("{{\"id\":{key}}}"), "the message key is the row's key");
        assert_eq!(message.subject, format!("cdc.{database}.counters"));
        found.entry(key).or_default().push((op, image["version"].as_i64().unwrap()));
        let transaction = &event["transaction"];
        transactions
            .entry(transaction["id"].as_str().unwrap().to_owned())
            .or_default()
            .push((transaction["total_order"].as_u64().unwrap(), transaction["event_count"].as_u64().unwrap()));
    }
    let mut wrong = Vec::new();
    for (key, events) in &expected {
        let got = found.get(key).cloned().unwrap_or_default();
        if &got != events {
            wrong.push(format!("key {key}: expected {events:?}, the stream holds {got:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} keys differ ({} messages for {total} changes, {sent} transactions):\n{}",
        wrong.len(),
        expected.len(),
        messages.len(),
        wrong.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    assert_eq!(messages.len(), total, "one message per change");
    for (id, events) in &transactions {
        let count = events[0].1;
        let orders: Vec<u64> = events.iter().map(|(order, _)| *order).collect();
        assert_eq!(orders, (1..=count).collect::<Vec<_>>(), "transaction {id} whole and in order");
    }
    assert!(transactions.values().any(|events| events.len() > 1), "some transactions have several events");
}

fn stream_exists(broker: &NatsServer, stream: &str) -> bool {
    stream_info(broker, stream).is_some()
}

fn broker_messages(broker: &NatsServer) -> u64 {
    stream_info(broker, "EVENTS").unwrap_or(0)
}

/// The number of messages in a stream, `None` when it does not exist.
fn stream_info(broker: &NatsServer, stream: &str) -> Option<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let url = broker.url();
    runtime.block_on(async move {
        let client = async_nats::connect(url).await.ok()?;
        let context = async_nats::jetstream::new(client);
        let mut stream = context.get_stream(stream).await.ok()?;
        Some(stream.info().await.ok()?.state.messages)
    })
}

fn wait_exit(child: &mut support::Guard) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the run did not reach its crash point:\n{}",
            child.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `sluice tail` prints a live job's changes as JSON lines on stdout, in order, and nothing else
/// there (the summary goes to stderr); SIGTERM ends it with 0.
#[test]
fn tail_prints_a_live_jobs_changes_as_json_lines() {
    let database = unique_name("tail");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.notes (id BIGINT PRIMARY KEY, body TEXT);"));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: tail-{}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: sqlite\n  path: never.db\n",
            database.replace('_', "-")
        ),
    );
    let child = workspace
        .command(&["tail", job.to_str().unwrap(), "--format", "debezium"])
        .env("SOURCE", mysql_url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let child = support::Guard::new(child);
    let stdout = child.stdout_view();
    // Changes made before the tail has planned are not its to print: write until one shows.
    let mut id = 0;
    wait_for("the tail's first event", Duration::from_secs(60), || {
        id += 1;
        mariadb(&format!("INSERT INTO {database}.notes VALUES ({id}, 'warm-up')"));
        std::thread::sleep(Duration::from_millis(100));
        !stdout().is_empty()
    });
    let first = id + 1;
    mariadb(&format!(
        "BEGIN; INSERT INTO {database}.notes VALUES ({first}, 'line\\nbreak'); UPDATE {database}.notes SET body = 'changed' WHERE id = {first}; COMMIT; DELETE FROM {database}.notes WHERE id = {first};"
    ));
    wait_for("the last event", Duration::from_secs(60), || stdout().contains("\"op\":\"d\""));
    let child = child.into_inner();
    support::signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{err}");
    let events: Vec<serde_json::Value> =
        out.lines().map(|line| serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}"))).collect();
    let mine: Vec<(String, serde_json::Value)> = events
        .iter()
        .filter(|event| event["after"]["id"] == first || event["before"]["id"] == first)
        .map(|event| (event["op"].as_str().unwrap().to_owned(), event["after"]["body"].clone()))
        .collect();
    assert_eq!(
        mine,
        vec![
            ("c".to_owned(), serde_json::json!("line\nbreak")),
            ("u".to_owned(), serde_json::json!("changed")),
            ("d".to_owned(), serde_json::Value::Null)
        ],
        "{out}"
    );
    assert_eq!(events.iter().filter(|event| event["op"] == "c" && event["after"]["id"] == first).count(), 1);
    assert!(err.contains("rows/s"), "the summary is on stderr: {err}");
    assert!(!workspace.path("never.db").exists(), "the job's own target is not touched");
}
