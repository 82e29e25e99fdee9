//! Change events into stream targets (NATS JetStream, Kafka), exactly once and in order: a
//! MariaDB workload whose every statement gives its row a new `version`, transactions of one to
//! four statements, while sluice is SIGKILLed, aborted after the broker acknowledged a commit's
//! events but before its checkpoint, and the broker restarted. The stream must hold, per key,
//! exactly the statements issued (0 gaps, 0 duplicates, in order), each transaction whole with
//! its event count.
//!
//! The scenarios that start a broker run one after the other in one test, `suite::brokers`.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::cluster::{start_server, Etcd, Server};
use support::kafka::KafkaBroker;
use support::nats::NatsServer;
use support::workload::{Client, Load, Random};
use support::{kill, mariadb, mysql_url, postgres_url, signal, unique_name, wait_for, Workspace};
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

/// A broker under test: where the job sends its events and how the test reads them back.
enum Bus {
    Nats(NatsServer),
    Kafka(KafkaBroker),
}

/// One event as the oracle compares it, whatever the format.
struct Seen {
    destination: String,
    /// The row's id as the message key gives it.
    key_id: i64,
    row: i64,
    op: String,
    version: i64,
    transaction: String,
    /// From 1.
    index: u64,
    count: u64,
}

impl Bus {
    /// The target section of the job; `${TARGET}` is `address()`.
    fn target(&self) -> &'static str {
        match self {
            Bus::Nats(_) => "  type: nats\n  url: ${TARGET}\n  stream: EVENTS\n  subject: \"cdc.{db}.{table}\"\n  format: debezium\n",
            Bus::Kafka(_) => "  type: kafka\n  brokers: ${TARGET}\n  topic: \"cdc.{db}.{table}\"\n  format: maxwell\n",
        }
    }

    fn address(&self) -> String {
        match self {
            Bus::Nats(server) => server.url(),
            Bus::Kafka(broker) => broker.bootstrap(),
        }
    }

    fn restart(&mut self) {
        match self {
            Bus::Nats(server) => server.restart(),
            Bus::Kafka(broker) => broker.restart(),
        }
    }

    /// The events of `topic` (Kafka) or the stream EVENTS (NATS); `None` before it exists.
    fn events(&self, topic: &str) -> Option<Vec<Seen>> {
        match self {
            Bus::Nats(server) => {
                server.message_count("EVENTS")?;
                Some(
                    server
                        .messages("EVENTS")
                        .iter()
                        .map(|message| debezium(&message.subject, &message.key, &message.payload))
                        .collect(),
                )
            }
            Bus::Kafka(broker) => {
                if !broker.topics().iter().any(|known| known == topic) {
                    return None;
                }
                Some(
                    broker
                        .records(&[topic])
                        .iter()
                        .map(|record| maxwell(&record.topic, &record.key, &record.value))
                        .collect(),
                )
            }
        }
    }

    /// Every event of `topic` (Kafka) or the stream EVENTS (NATS) as (id, operation, v), with
    /// snapshot rows as `r`, in the order a consumer of the row's key reads them.
    fn row_events(&self, topic: &str) -> Vec<(i64, String, i64)> {
        let row = |op: &str, image: &serde_json::Value| {
            (image["id"].as_i64().unwrap(), op.to_owned(), image["v"].as_i64().unwrap())
        };
        match self {
            Bus::Nats(server) => server
                .messages("EVENTS")
                .iter()
                .map(|message| {
                    let op = message.payload["op"].as_str().unwrap();
                    row(op, &message.payload[if op == "d" { "before" } else { "after" }])
                })
                .collect(),
            Bus::Kafka(broker) => broker
                .records(&[topic])
                .iter()
                .map(|record| {
                    let op = match record.value["type"].as_str().unwrap() {
                        "bootstrap-insert" => "r",
                        "insert" => "c",
                        "update" => "u",
                        "delete" => "d",
                        other => panic!("an event of type {other}"),
                    };
                    row(op, &record.value["data"])
                })
                .collect(),
        }
    }

    /// Waits until `topic` holds `count` events. tansu 0.6's last stable offset at times stops
    /// moving under load (see `suite::brokers`), and then no read_committed reader gets past it:
    /// a Kafka broker that made nothing new readable for 45 s is restarted, and the run with it
    /// (`start` runs the job again), so its producer starts afresh and ends what the broker
    /// still holds open: faults the job has to take anyway. `Err` when it stalled again after
    /// its last allowed restart (the caller runs its scenario again on a fresh broker).
    fn wait_for_events(
        &mut self,
        child: &mut support::Guard,
        start: &dyn Fn() -> support::Guard,
        what: &str,
        topic: &str,
        count: usize,
    ) -> Result<(), String> {
        let mut seen = self.count(topic);
        let mut progressed = std::time::Instant::now();
        let deadline = std::time::Instant::now() + Duration::from_secs(240);
        // Each look at a Kafka topic is two client processes (`kafka_read.py`) reading it whole:
        // looking every 50 ms kept a core busy under the suite's load, beside the test broker.
        let pause = Duration::from_millis(if matches!(self, Bus::Kafka(_)) { 1_000 } else { 50 });
        while seen < count {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}; the run says:\n{}",
                child.stderr_text()
            );
            std::thread::sleep(pause);
            let now = self.count(topic);
            if now > seen {
                (seen, progressed) = (now, std::time::Instant::now());
            } else if progressed.elapsed() > Duration::from_secs(45) {
                if let Bus::Kafka(broker) = self {
                    if !broker.restart_stalled() {
                        let said = child.stderr_text();
                        let tail: Vec<&str> =
                            said.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect();
                        return Err(format!(
                            "{what}: the test broker made nothing readable for 45 s after its restarts; the run's last lines:\n{}",
                            tail.join("\n")
                        ));
                    }
                    eprintln!("{what}: the test broker made nothing readable for 45 s; restarted it and the run");
                    kill(child);
                    *child = start();
                }
                progressed = std::time::Instant::now();
            }
        }
        Ok(())
    }

    /// How many events are in the stream now (0 before it exists).
    fn count(&self, topic: &str) -> usize {
        match self {
            Bus::Nats(server) => server.message_count("EVENTS").unwrap_or(0) as usize,
            Bus::Kafka(broker) => {
                if broker.topics().iter().any(|known| known == topic) {
                    broker.records(&[topic]).len()
                } else {
                    0
                }
            }
        }
    }
}

fn debezium(destination: &str, key: &str, event: &serde_json::Value) -> Seen {
    let op = event["op"].as_str().unwrap().to_owned();
    let image = if op == "d" { &event["before"] } else { &event["after"] };
    let transaction = &event["transaction"];
    // Debezium's key document: the key columns.
    let key: serde_json::Value = serde_json::from_str(key).unwrap();
    Seen {
        destination: destination.to_owned(),
        key_id: key["id"].as_i64().unwrap(),
        row: image["id"].as_i64().unwrap(),
        version: image["version"].as_i64().unwrap(),
        op,
        transaction: transaction["id"].as_str().unwrap().to_owned(),
        index: transaction["total_order"].as_u64().unwrap(),
        count: transaction["event_count"].as_u64().unwrap(),
    }
}

fn maxwell(destination: &str, key: &str, event: &serde_json::Value) -> Seen {
    let op = match event["type"].as_str().unwrap() {
        "insert" => "c",
        "update" => "u",
        "delete" => "d",
        other => panic!("a change event of type {other}"),
    };
    let image = &event["data"];
    // Maxwell's key document: database, table and `pk.<column>`.
    let key: serde_json::Value = serde_json::from_str(key).unwrap();
    Seen {
        destination: destination.to_owned(),
        key_id: key["pk.id"].as_i64().unwrap(),
        row: image["id"].as_i64().unwrap(),
        version: image["version"].as_i64().unwrap(),
        op: op.to_owned(),
        transaction: event["transaction_id"].as_str().unwrap().to_owned(),
        index: event["xoffset"].as_u64().unwrap() + 1,
        count: event["xcount"].as_u64().unwrap(),
    }
}

pub(super) fn every_change_reaches_nats_exactly_once_in_order_across_kills_and_broker_restarts() {
    exactly_once_across_faults(Bus::Nats(NatsServer::start()), "streams", BROKER_RESTARTS).unwrap();
}

#[cfg(feature = "kafka")]
pub(super) fn every_change_reaches_kafka_exactly_once_in_order_across_kills_and_broker_restarts() {
    // One broker restart only: the test broker (tansu 0.6 on an S3 store) itself loses a
    // partition after a second or third restart under load (an independent reader cannot read
    // it to its end either), whatever wrote to it.
    fails_naming_a_stall(|| exactly_once_across_faults(Bus::Kafka(KafkaBroker::start()), "kafka_streams", 1));
}

/// A pipeline split across a bus: MySQL → the bus by one job, the bus → PostgreSQL by another,
/// killed again and again under a mixed load (inserts, updates, deletes, primary-key moves,
/// multi-table transfers). The consumer's position is committed in PostgreSQL with the rows, so
/// PostgreSQL ends equal to MySQL: no change lost, none applied twice (an insert applied twice
/// would stop the job on its key), none out of order.
#[cfg(feature = "kafka")]
pub(super) fn mysql_to_kafka_to_postgres_ends_equal_to_the_source_across_kills_of_the_consumer() {
    fails_naming_a_stall(|| split_across(Bus::Kafka(KafkaBroker::start()), "maxwell", Place::Run));
}

/// The split pipeline with its consumer (Kafka → PostgreSQL) on a cluster of two nodes, the node
/// applying it SIGKILLed again and again: the target's fence and checkpoints carry it over.
#[cfg(feature = "kafka")]
pub(super) fn mysql_to_kafka_to_postgres_on_a_cluster_ends_equal_to_the_source_across_kills_of_the_consuming_node() {
    fails_naming_a_stall(|| split_across(Bus::Kafka(KafkaBroker::start()), "maxwell", Place::Cluster));
}

/// What the failure of a scenario says when the Kafka test broker itself stalled (made nothing
/// new readable through its restarts: tansu 0.6 at times keeps a transaction open across
/// restarts), which `suite::brokers` looks for before running a failed scenario again on a
/// fresh broker.
pub(super) const STALLED: &str = "the Kafka test broker stalled";

/// Runs a Kafka scenario, which returns `Err` only when an independent reader saw the test
/// broker stall: then it fails naming the stall (`STALLED`). Every check holds for a run that ends.
#[cfg(feature = "kafka")]
fn fails_naming_a_stall(pipeline: impl Fn() -> Result<(), String>) {
    if let Err(stalled) = pipeline() {
        panic!("{stalled} ({STALLED})");
    }
}

pub(super) fn mysql_to_nats_to_postgres_ends_equal_to_the_source_across_kills_of_the_consumer() {
    split_across(Bus::Nats(NatsServer::start()), "debezium", Place::Run).unwrap();
}

pub(super) fn mysql_to_nats_to_postgres_on_a_cluster_ends_equal_to_the_source_across_kills_of_the_consuming_node() {
    split_across(Bus::Nats(NatsServer::start()), "debezium", Place::Cluster).unwrap();
}

/// Where the split pipeline's consumer runs.
#[derive(Clone, Copy, PartialEq)]
enum Place {
    /// `sluice run`, killed and run again.
    Run,
    /// A job of a cluster of two nodes; the node applying it is killed, and started again once
    /// the other node took the job over.
    Cluster,
}

/// The split pipeline's consumer, running.
enum Consuming<'a> {
    Run(support::Guard),
    Cluster { nodes: Nodes, start: Box<dyn Fn(usize) -> Server + 'a> },
}

impl Consuming<'_> {
    /// Kills the consumer: the process, or the node that applies the job (then waits until the
    /// other node took it over and starts the killed one again).
    fn kill(&mut self, again: impl FnOnce() -> support::Guard) {
        match self {
            Consuming::Run(child) => {
                kill(child);
                *child = again();
            }
            Consuming::Cluster { nodes, start } => {
                let mut owner = None;
                wait_for("the consumer's owner", Duration::from_secs(60), || {
                    owner = nodes.owner();
                    owner.is_some()
                });
                let (worker, epoch) = owner.unwrap();
                let index = nodes.index_of(&worker);
                let mut node = nodes.nodes[index].take().unwrap();
                node.child.kill().unwrap();
                node.child.wait().unwrap();
                wait_for("the consumer to move", Duration::from_secs(60), || {
                    nodes.owner().is_some_and(|(other, new)| other != worker && new > epoch)
                });
                nodes.nodes[index] = Some(start(index));
            }
        }
    }

    fn output(&self) -> String {
        match self {
            Consuming::Run(child) => child.stderr_view()(),
            Consuming::Cluster { nodes, .. } => nodes.logs(),
        }
    }
}

/// Runs the split pipeline; `Err` only when the Kafka test broker made nothing new readable to
/// an independent reader for a minute, after its restarts, while the load ran.
fn split_across(mut bus: Bus, format: &str, consumer_at: Place) -> Result<(), String> {
    use support::workload::{committed, create_tables, rows, ACCOUNTS};

    let database = unique_name("split");
    create_tables(&database);
    let workspace = Workspace::new();
    let producer_name = database.replace('_', "-");
    let consumer_name = format!("{producer_name}-pg");
    // The bus's fields, the same on both sides; `${BUS}` is its address.
    let (kind, place) = match bus {
        Bus::Kafka(_) => ("kafka", "  brokers: ${BUS}\n  topic: \"split.{db}.{table}\"\n"),
        Bus::Nats(_) => ("nats", "  url: ${BUS}\n  stream: SPLIT\n  subject: \"split.{db}.{table}\"\n"),
    };
    let producer = workspace.write(
        "producer.yaml",
        &format!(
            "name: {producer_name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: {kind}\n{place}  format: {format}\n"
        ),
    );
    let consumer = workspace.write(
        "consumer.yaml",
        &format!(
            "name: {consumer_name}\nmode: cdc\nsource:\n  type: {kind}\n{place}  format: {format}\n\
             \x20 tables: [{database}.items, {database}.accounts]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n"
        ),
    );
    let address = bus.address();
    let run = |job: &std::path::Path, state: &str| {
        let state = workspace.path(state);
        let mut command = workspace.command(&["run", job.to_str().unwrap(), "--state-dir", &state.to_string_lossy()]);
        command.env("SOURCE", mysql_url()).env("TARGET", postgres_url()).env("BUS", &address);
        support::Guard::new(
            command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(),
        )
    };
    let mut producing = run(&producer, "producer-state");
    let accounts = format!("split.{database}.accounts");
    wait_on(&producing, "the snapshot's events", 90, || match &bus {
        Bus::Kafka(broker) => broker.topics().contains(&accounts),
        Bus::Nats(server) => server.message_count("SPLIT").is_some_and(|messages| messages > 0),
    });
    let load = Load::start(&database, Random::from_environment("split"), 300);
    let etcd = (consumer_at == Place::Cluster).then(|| Etcd::start(1));
    let mut consuming = match &etcd {
        None => Consuming::Run(run(&consumer, "consumer-state")),
        Some(etcd) => {
            let environment = [("SLUICE_VAR_TARGET", postgres_url()), ("SLUICE_VAR_BUS", address.clone())];
            let workspace = &workspace;
            let start = move |index: usize| {
                start_server(workspace, &format!("node{index}"), Some(&etcd.endpoints), &environment)
            };
            let nodes = Nodes {
                nodes: (0..2).map(|index| Some(start(index))).collect(),
                paused: None,
                job: consumer_name.clone(),
            };
            let document = std::fs::read_to_string(&consumer)
                .unwrap()
                .replace("${TARGET}", "${SLUICE_VAR_TARGET}")
                .replace("${BUS}", "${SLUICE_VAR_BUS}");
            let (status, body) = nodes.asking().call("POST", "/jobs", None, Some(("application/yaml", &document)));
            assert_eq!(status, 201, "{body}");
            Consuming::Cluster { nodes, start: Box::new(start) }
        }
    };
    // A node takes a few seconds to take a job over: fewer rounds on a cluster.
    let rounds = if consumer_at == Place::Cluster { 3 } else { KILLS };
    // tansu 0.6's last stable offset at times stops moving under load, and then no
    // read_committed reader gets past it (see `suite::brokers`): a stalled Kafka broker is
    // restarted, and the producer with it (its new session with the same transactional id ends
    // the transaction the broker still counts as open), faults the jobs have to take anyway.
    for round in 0..rounds {
        let before = committed("postgres", &consumer_name);
        let started = std::time::Instant::now();
        let mut deadline = started + Duration::from_secs(90);
        let mut stalled_since = started;
        while committed("postgres", &consumer_name) <= before {
            if let Bus::Kafka(broker) = &mut bus {
                if stalled_since.elapsed() > Duration::from_secs(45) && broker.restart_stalled() {
                    eprintln!(
                        "round {round}: the test broker made nothing readable for 45 s; restarted it and the producer"
                    );
                    kill(&mut producing);
                    producing = run(&producer, "producer-state");
                    stalled_since = std::time::Instant::now();
                    deadline = stalled_since + Duration::from_secs(90);
                }
                if std::time::Instant::now() >= deadline && broker_stalled(broker, &database) {
                    load.stop();
                    return Err(format!("round {round}: the test broker made nothing new readable for a minute"));
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no rows in PostgreSQL after kill {round}; the consumer says:\n{}\nthe producer says:\n{}",
                consuming.output(),
                producing.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        consuming.kill(|| run(&consumer, "consumer-state"));
    }
    load.stop();
    let columns: [(&str, &[&str]); 2] = [("items", &["id", "v", "note"]), ("accounts", &["id", "balance"])];
    let source: Vec<Vec<String>> =
        columns.iter().map(|(table, names)| rows("mysql", &format!("{database}.{table}"), names)).collect();
    // The last events may stall in the test broker too: as in the rounds above.
    let equal = || {
        columns
            .iter()
            .zip(&source)
            .all(|((table, names), expected)| &rows("postgres", &format!("{database}.{table}"), names) == expected)
    };
    let mut deadline = std::time::Instant::now() + Duration::from_secs(180);
    let (mut applied, mut stalled_since) = (committed("postgres", &consumer_name), std::time::Instant::now());
    while !equal() {
        let now = committed("postgres", &consumer_name);
        if now != applied {
            (applied, stalled_since) = (now, std::time::Instant::now());
        }
        if let Bus::Kafka(broker) = &mut bus {
            if stalled_since.elapsed() > Duration::from_secs(45) && broker.restart_stalled() {
                eprintln!(
                    "the last events: the test broker made nothing readable for 45 s; restarted it and the producer"
                );
                kill(&mut producing);
                producing = run(&producer, "producer-state");
                stalled_since = std::time::Instant::now();
                deadline = stalled_since + Duration::from_secs(180);
            }
            if std::time::Instant::now() >= deadline && broker_stalled(broker, &database) {
                return Err("the last events: the test broker made nothing new readable for a minute".to_owned());
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for PostgreSQL equal to MySQL; the consumer says:\n{}\nthe producer says:\n{}",
            consuming.output(),
            producing.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(consuming);
    kill(&mut producing);
    for ((table, names), expected) in columns.iter().zip(&source) {
        support::workload::assert_same(table, expected, &rows("postgres", &format!("{database}.{table}"), names));
    }
    let total = support::psql(&format!("SELECT sum(balance::bigint) FROM {database}.accounts"));
    assert_eq!(total.trim(), (ACCOUNTS * 1000).to_string(), "transfers kept the sum of balances");
    Ok(())
}

/// Whether the broker makes nothing new readable to an independent `read_committed` reader of
/// the split topics of `database` for a minute while the load writes to them.
fn broker_stalled(broker: &KafkaBroker, database: &str) -> bool {
    let topics = [format!("split.{database}.items"), format!("split.{database}.accounts")];
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let readable = broker.records(&topics).len();
    std::thread::sleep(Duration::from_secs(60));
    broker.records(&topics).len() == readable
}

fn exactly_once_across_faults(mut bus: Bus, prefix: &str, broker_restarts: usize) -> Result<(), String> {
    let database = unique_name(prefix);
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.counters (id BIGINT PRIMARY KEY, version BIGINT NOT NULL, note VARCHAR(32));"
    ));
    let topic = format!("cdc.{database}.counters");
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n{}",
            bus.target()
        ),
    );
    let mut random = Random::from_environment(prefix);
    let (mut expected, mut versions, mut exists) = (Expected::new(), BTreeMap::new(), BTreeMap::new());
    // The same address after every broker restart.
    let address = bus.address();
    let start = |workspace: &Workspace, failpoint: Option<&str>| {
        let mut command = workspace.command(&["run", job.to_str().unwrap()]);
        command.env("SOURCE", mysql_url()).env("TARGET", address.as_str());
        if let Some(failpoint) = failpoint {
            command.env("SLUICE_FAILPOINT", failpoint);
        }
        support::Guard::new(
            command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(),
        )
    };

    // The first run plans the job at the source's position now; the stream exists once it has.
    let mut child = start(&workspace, None);
    wait_on(&child, "the events stream", 60, || bus.events(&topic).is_some());
    let mut client = Client::start(&database);
    let mut sent = 0;
    let mut send = |client: &mut Client,
                    random: &mut Random,
                    expected: &mut Expected,
                    versions: &mut BTreeMap<i64, i64>,
                    exists: &mut BTreeMap<i64, bool>,
                    transactions: usize| {
        for sql in workload(random, 200, transactions, expected, versions, exists) {
            client.send(&sql);
        }
        sent += transactions;
    };
    for round in 0..(KILLS + ABORTS + broker_restarts) {
        send(&mut client, &mut random, &mut expected, &mut versions, &mut exists, 100);
        let seen = bus.count(&topic);
        let again = || start(&workspace, None);
        bus.wait_for_events(&mut child, &again, &format!("events after fault {round}"), &topic, seen + 1)?;
        std::thread::sleep(Duration::from_millis(random.below(200)));
        if round < KILLS {
            kill(&mut child);
            child = start(&workspace, None);
        } else if round < KILLS + ABORTS {
            kill(&mut child);
            // Aborts after the broker acknowledged a commit's events, before the checkpoint.
            let mut aborting = start(&workspace, Some(&format!("events.acknowledged@{}", 2 + round % 3)));
            // Changes in steps, each committed before the next, until the run reaches its
            // crash point (a commit with nothing new is not a commit).
            for _ in 0..10 {
                let seen = bus.count(&topic);
                send(&mut client, &mut random, &mut expected, &mut versions, &mut exists, 20);
                let deadline = std::time::Instant::now() + Duration::from_secs(90);
                while aborting.try_wait().unwrap().is_none() && bus.count(&topic) <= seen {
                    assert!(std::time::Instant::now() < deadline, "no commit:\n{}", aborting.stderr_text());
                    std::thread::sleep(Duration::from_millis(50));
                }
                if aborting.try_wait().unwrap().is_some() {
                    break;
                }
            }
            let status = wait_exit(&mut aborting);
            let output = aborting.stderr_text();
            assert!(
                !status.success() && output.contains("failpoint events.acknowledged"),
                "the run aborted at the crash point:\n{output}"
            );
            child = start(&workspace, None);
        } else {
            bus.restart();
        }
    }
    client.finish();
    let total: usize = expected.values().map(Vec::len).sum();
    let again = || start(&workspace, None);
    bus.wait_for_events(&mut child, &again, "every change in the stream", &topic, total)?;
    kill(&mut child);
    assert_exactly_once_in_order(&bus, &topic, &expected, sent);
    Ok(())
}

/// The events of `topic` hold, per key, exactly the changes `expected`, in order, one message a
/// change, each transaction whole and in order.
fn assert_exactly_once_in_order(bus: &Bus, topic: &str, expected: &Expected, sent: usize) {
    let total: usize = expected.values().map(Vec::len).sum();
    let events = bus.events(topic).expect("the stream exists");
    let mut found = Expected::new();
    let mut transactions: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
    for event in &events {
        assert_eq!(event.key_id, event.row, "the message key is the row's key");
        assert_eq!(event.destination, topic);
        found.entry(event.row).or_default().push((event.op.clone(), event.version));
        transactions.entry(event.transaction.clone()).or_default().push((event.index, event.count));
    }
    let mut wrong = Vec::new();
    for (key, changes) in expected {
        let got = found.get(key).cloned().unwrap_or_default();
        if &got != changes {
            wrong.push(format!("key {key}: expected {changes:?}, the stream holds {got:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} keys differ ({} messages for {total} changes, {sent} transactions):\n{}",
        wrong.len(),
        expected.len(),
        events.len(),
        wrong.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    assert_eq!(events.len(), total, "one message per change");
    for (id, parts) in &transactions {
        let count = parts[0].1;
        let orders: Vec<u64> = parts.iter().map(|(order, _)| *order).collect();
        assert_eq!(orders, (1..=count).collect::<Vec<_>>(), "transaction {id} whole and in order");
    }
    assert!(transactions.values().any(|parts| parts.len() > 1), "some transactions have several events");
}

/// The same workload and oracle with the job on a cluster of three nodes: the node streaming it
/// is SIGKILLed; then its successor is SIGSTOPped past its lease and woken once the third node
/// owns the task. The woken node writes nothing more: Kafka's producer epoch (the task's
/// transactional id is the same on every node) or NATS's claim in the task's checkpoint message
/// fences it, so the stream holds every change once, in order.
fn exactly_once_on_a_cluster(mut bus: Bus, prefix: &str) {
    let database = unique_name(prefix);
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.counters (id BIGINT PRIMARY KEY, version BIGINT NOT NULL, note VARCHAR(32));"
    ));
    let topic = format!("cdc.{database}.counters");
    let workspace = Workspace::new();
    let etcd = Etcd::start(1);
    let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", bus.address())];
    let start = |index: usize| start_server(&workspace, &format!("node{index}"), Some(&etcd.endpoints), &environment);
    let mut cluster = Nodes {
        nodes: (0..3).map(|index| Some(start(index))).collect(),
        paused: None,
        job: database.replace('_', "-"),
    };
    let job = format!(
        "name: {}\nmode: cdc\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n{}",
        cluster.job,
        bus.target().replace("${TARGET}", "${SLUICE_VAR_TARGET}")
    );
    let (status, body) = cluster.asking().call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    // The job is planned at the source's position once its task runs and the stream exists.
    wait_for("the stream task", Duration::from_secs(60), || cluster.owner().is_some() && bus.events(&topic).is_some());

    let mut random = Random::from_environment(prefix);
    let (mut expected, mut versions, mut exists) = (Expected::new(), BTreeMap::new(), BTreeMap::new());
    let mut client = Client::start(&database);
    let mut sent = 0;
    let mut send = |client: &mut Client, random: &mut Random, expected: &mut Expected, transactions: usize| {
        for sql in workload(random, 200, transactions, expected, &mut versions, &mut exists) {
            client.send(&sql);
        }
        sent += transactions;
    };
    // Waits until the stream holds `count` events. A Kafka test broker that made nothing
    // readable for 45 s is restarted (see `Bus::wait_for_events`), and so is the node streaming
    // into it.
    let progress = |bus: &mut Bus, cluster: &mut Nodes, what: &str, count: usize| {
        let deadline = std::time::Instant::now() + Duration::from_secs(240);
        let (mut seen, mut progressed) = (bus.count(&topic), std::time::Instant::now());
        let mut stalls = 0;
        while seen < count {
            // Named as the stall it followed, if any: `suite::brokers` runs such a scenario again.
            let stalled = if stalls > 0 { format!(" ({STALLED} {stalls} times)") } else { String::new() };
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}{stalled}:\n{}", cluster.logs());
            std::thread::sleep(Duration::from_millis(50));
            let now = bus.count(&topic);
            if now > seen {
                (seen, progressed) = (now, std::time::Instant::now());
            } else if progressed.elapsed() > Duration::from_secs(45) {
                if let Bus::Kafka(broker) = bus {
                    if let (true, Some((worker, _))) = (broker.restart_stalled(), cluster.owner()) {
                        stalls += 1;
                        eprintln!("{what}: the test broker made nothing readable for 45 s; restarted it and {worker}");
                        let index = cluster.index_of(&worker);
                        cluster.nodes[index] = None;
                        cluster.nodes[index] = Some(start(index));
                    }
                }
                progressed = std::time::Instant::now();
            }
        }
    };

    // Every change sent so far, which the stream must come to hold.
    let changes = |expected: &Expected| expected.values().map(Vec::len).sum::<usize>();

    // The owner is SIGKILLed while it streams; another node takes the task over and streams
    // what it left and what comes after.
    send(&mut client, &mut random, &mut expected, 100);
    progress(&mut bus, &mut cluster, "events before the kill", 1);
    let (first, epoch) = cluster.owner().expect("an owner");
    let killed = cluster.index_of(&first);
    let mut node = cluster.nodes[killed].take().unwrap();
    node.child.kill().unwrap();
    node.child.wait().unwrap();
    send(&mut client, &mut random, &mut expected, 100);
    wait_for("the task to move after the kill", Duration::from_secs(60), || {
        cluster.owner().is_some_and(|(worker, new)| worker != first && new > epoch)
    });
    progress(&mut bus, &mut cluster, "every change after the kill", changes(&expected));
    cluster.nodes[killed] = Some(start(killed));

    // The new owner is paused while it streams: the task moves past its lease to the third
    // node, which streams everything, and the paused node wakes to find itself fenced.
    let (second, epoch) = cluster.owner().expect("an owner");
    let paused = cluster.index_of(&second);
    send(&mut client, &mut random, &mut expected, 50);
    signal(&cluster.nodes[paused].as_ref().unwrap().child, "STOP");
    cluster.paused = Some(paused);
    send(&mut client, &mut random, &mut expected, 100);
    wait_for("the task to move past the paused node's lease", Duration::from_secs(60), || {
        cluster.owner().is_some_and(|(worker, new)| worker != second && new > epoch)
    });
    progress(&mut bus, &mut cluster, "every change from the third owner", changes(&expected));
    signal(&cluster.nodes[paused].as_ref().unwrap().child, "CONT");
    cluster.paused = None;
    wait_for("the woken node to stop its task", Duration::from_secs(60), || {
        let output = cluster.nodes[paused].as_ref().unwrap().output();
        output.contains("lease ended") || output.contains("FENCED")
    });
    send(&mut client, &mut random, &mut expected, 100);
    client.finish();
    progress(&mut bus, &mut cluster, "every change in the stream", changes(&expected));
    assert_exactly_once_in_order(&bus, &topic, &expected, sent);
}

/// The nodes of a cluster test and the one it paused (asked nothing while paused).
struct Nodes {
    nodes: Vec<Option<Server>>,
    paused: Option<usize>,
    job: String,
}

impl Nodes {
    fn asking(&self) -> &Server {
        let live = self.nodes.iter().enumerate().filter(|(index, _)| Some(*index) != self.paused);
        live.filter_map(|(_, node)| node.as_ref()).next().expect("a live node")
    }

    /// The stream task's owner and epoch while it runs.
    fn owner(&self) -> Option<(String, u64)> {
        let (_, job) = self.asking().call("GET", &format!("/jobs/{}", self.job), None, None);
        let task = job["tasks"].as_array()?.iter().find(|task| task["kind"] == "cdc")?.clone();
        if task["state"] != "running" {
            return None;
        }
        Some((task["worker"].as_str()?.to_owned(), task["epoch"].as_u64()?))
    }

    fn index_of(&self, id: &str) -> usize {
        self.nodes.iter().position(|node| node.as_ref().is_some_and(|node| node.id == id)).expect("a known node")
    }

    fn logs(&self) -> String {
        self.nodes.iter().flatten().map(|node| format!("--- {}\n{}", node.id, node.output())).collect()
    }
}

pub(super) fn every_change_reaches_nats_exactly_once_in_order_on_a_cluster_through_a_kill_and_a_pause() {
    exactly_once_on_a_cluster(Bus::Nats(NatsServer::start()), "cluster_nats");
}

#[cfg(feature = "kafka")]
pub(super) fn every_change_reaches_kafka_exactly_once_in_order_on_a_cluster_through_a_kill_and_a_pause() {
    exactly_once_on_a_cluster(Bus::Kafka(KafkaBroker::start()), "cluster_kafka");
}

pub(super) fn a_copy_then_stream_into_nats_never_takes_a_key_back_in_time() {
    // NATS shows a batch's events before its checkpoint: a run crashes once every event of a
    // batch is acknowledged, and one part-way through sending a batch.
    let crashes = ["events.acknowledged@3", "events.published@250"];
    copy_then_stream_in_order(Bus::Nats(NatsServer::start()), "switch", &crashes).unwrap();
}

#[cfg(feature = "kafka")]
pub(super) fn a_copy_then_stream_into_kafka_never_takes_a_key_back_in_time() {
    fails_naming_a_stall(|| copy_then_stream_in_order(Bus::Kafka(KafkaBroker::start()), "kafka_switch", &[]));
}

/// A `snapshot+cdc` job copies a table in small splits while every key keeps being updated
/// (each update adds one to `v`), crashes at each of `crashes` (failpoints) and is SIGKILLed
/// twice during the copy. Per key, the events must be exactly its copied row and then every
/// update after it: `v` rising by one from the copied value to the source's last, never back,
/// none missing, none twice.
fn copy_then_stream_in_order(mut bus: Bus, prefix: &str, crashes: &[&str]) -> Result<(), String> {
    const KEYS: u64 = 4_000;
    let database = unique_name(prefix);
    let values: Vec<String> = (1..=KEYS).map(|id| format!("({id}, 0)")).collect();
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.counters (id BIGINT PRIMARY KEY, v BIGINT NOT NULL); \
         INSERT INTO {database}.counters VALUES {};",
        values.join(",")
    ));
    let topic = format!("cdc.{database}.counters");
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    // Small splits and batches, throttled: the copy takes seconds, its reads far apart.
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n{}parallelism: 2\nlimits: {{split_rows: 500, batch_rows: 100, rows_per_sec: 800}}\n",
            bus.target()
        ),
    );
    let address = bus.address();
    let start = || {
        let mut command = workspace.command(&["run", job.to_str().unwrap()]);
        command.env("SOURCE", mysql_url()).env("TARGET", address.as_str());
        support::Guard::new(
            command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap(),
        )
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let (stop, database) = (stop.clone(), database.clone());
        std::thread::spawn(move || {
            let mut client = Client::start(&database);
            let mut random = Random::from_environment("switch");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let keys: Vec<u64> = (0..4).map(|_| 1 + random.below(KEYS)).collect();
                let updates: Vec<String> =
                    keys.iter().map(|key| format!("UPDATE counters SET v = v + 1 WHERE id = {key};")).collect();
                client.send(&format!("BEGIN;{}COMMIT;", updates.join("")));
                std::thread::sleep(Duration::from_millis(5));
            }
            client.finish();
        })
    };
    wait_for("the updates", Duration::from_secs(30), || {
        mariadb(&format!("SELECT SUM(v) FROM {database}.counters")).trim().parse::<u64>().is_ok_and(|sum| sum > 0)
    });
    for crash in crashes {
        let mut command = workspace.command(&["run", job.to_str().unwrap()]);
        command.env("SOURCE", mysql_url()).env("TARGET", address.as_str()).env("SLUICE_FAILPOINT", crash);
        let output = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("failpoint"), "the run did not crash at {crash}:\n{stderr}");
    }
    let mut child = start();
    for copied in [1_000, 2_000] {
        let stderr = child.stderr_view();
        wait_on(&child, &format!("{copied} rows copied"), 120, || rows_copied(&stderr()) >= copied);
        kill(&mut child);
        child = start();
    }
    // Updates keep coming once the stream runs, then stop.
    let stderr = child.stderr_view();
    wait_on(&child, "the stream", 120, || stderr().contains("rows applied in"));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    load.join().unwrap();
    let last: BTreeMap<i64, i64> = mariadb(&format!("SELECT id, v FROM {database}.counters"))
        .lines()
        .map(|line| {
            let (id, v) = line.split_once('\t').unwrap();
            (id.parse().unwrap(), v.parse().unwrap())
        })
        .collect();
    let per_key = |bus: &Bus| {
        let mut per_key: BTreeMap<i64, Vec<(String, i64)>> = BTreeMap::new();
        for (id, op, v) in bus.row_events(&topic) {
            per_key.entry(id).or_default().push((op, v));
        }
        per_key
    };
    // As `Bus::wait_for_events`: a Kafka test broker whose events stopped growing for 45 s is
    // restarted, and the run with it (tansu at times stops making anything readable under load).
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    let (mut seen, mut progressed) = (0, std::time::Instant::now());
    loop {
        let events = per_key(&bus);
        if last.iter().all(|(id, v)| events.get(id).and_then(|events| events.last()).is_some_and(|(_, seen)| seen == v))
        {
            break;
        }
        if std::time::Instant::now() >= deadline {
            // The check below names the keys whose events end short of the source.
            eprintln!(
                "timed out waiting for every key's last update in the stream; the run says:\n{}",
                child.stderr_text()
            );
            break;
        }
        let count: usize = events.values().map(Vec::len).sum();
        if count > seen {
            (seen, progressed) = (count, std::time::Instant::now());
        } else if progressed.elapsed() > Duration::from_secs(45) {
            if let Bus::Kafka(broker) = &mut bus {
                if !broker.restart_stalled() {
                    return Err(
                        "the last updates: the test broker made nothing readable for 45 s after its restarts".into()
                    );
                }
                eprintln!("the last updates: the test broker made nothing readable for 45 s; restarted it and the run");
                kill(&mut child);
                child = start();
            }
            progressed = std::time::Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    kill(&mut child);
    let per_key = per_key(&bus);
    let mut wrong = Vec::new();
    // Keys updated both before and after their copy: the ones the switch could take back.
    let mut straddling = 0;
    for (id, &final_v) in &last {
        let events = per_key.get(id).cloned().unwrap_or_default();
        let copied = events.first().filter(|(op, _)| op == "r").map(|(_, v)| *v);
        straddling += usize::from(copied.is_some_and(|copied| copied > 0 && final_v > copied));
        let good = copied.is_some_and(|copied| {
            let updates: Vec<(String, i64)> = ((copied + 1)..=final_v).map(|v| ("u".to_owned(), v)).collect();
            events[1..] == updates[..]
        });
        if !good {
            wrong.push(format!("key {id} (last v {final_v}): {events:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {KEYS} keys are not their copied row then every later update in order:\n{}",
        wrong.len(),
        wrong.iter().take(10).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(straddling >= 100, "only {straddling} keys were updated both before and after their copy");
    Ok(())
}

/// The rows a run's last progress line says it copied.
fn rows_copied(output: &str) -> u64 {
    output
        .lines()
        .rev()
        .find_map(|line| line.split_once("progress: ")?.1.split_once(" of")?.0.replace(',', "").parse().ok())
        .unwrap_or(0)
}

/// Waits for `condition`; on timeout, fails with what the running job printed.
fn wait_on(child: &support::Guard, what: &str, seconds: u64, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(seconds);
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; the run says:\n{}",
            child.stderr_view()()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
    let workspace = Workspace::new();
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.notes (id BIGINT PRIMARY KEY, body TEXT);"));
    let job = workspace.write("job.yaml", &tail_job(&database));
    tail_prints_changes(&workspace, &database, &[job.to_str().unwrap()]);
    assert!(!workspace.path("never.db").exists(), "the job's own target is not touched");
}

/// `sluice tail NAME` follows the current version of a job on a server, its `${VAR}`s from the
/// tail's own environment.
#[test]
fn tail_follows_a_job_of_the_server_by_name() {
    const READ: &str = "read-token-for-tail-0123";
    let database = unique_name("tail_server");
    let workspace = Workspace::new();
    const ADMIN: &str = "admin-token-for-tail-0123";
    let environment = [
        ("SLUICE_ADMIN_TOKEN", ADMIN.to_owned()),
        ("SLUICE_READ_TOKEN", READ.to_owned()),
        ("SLUICE_VAR_SOURCE", mysql_url()),
    ];
    let server = support::cluster::start_server(&workspace, "solo", None, &environment);
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.notes (id BIGINT PRIMARY KEY, body TEXT);"));
    let yaml = tail_job(&database);
    let (status, created) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &yaml)));
    assert_eq!(status, 201, "{created}");
    let name = created["name"].as_str().unwrap().to_owned();
    let (status, stopped) = server.call("POST", &format!("/jobs/{name}/stop"), Some(ADMIN), None);
    assert!(status < 300, "{stopped}");
    tail_prints_changes(&workspace, &database, &[&name, "--server", &server.url, "--token", READ]);
    let missing = workspace.sluice(&["tail", "no-such-job", "--server", &server.url, "--token", READ]);
    missing.assert_code(2);
    assert!(missing.all().contains("no-such-job"), "{}", missing.all());
}

/// A `snapshot` job on the table `notes` of `database`, whose own target is never touched.
fn tail_job(database: &str) -> String {
    format!(
        "name: tail-{}\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: sqlite\n  path: never.db\n",
        database.replace('_', "-")
    )
}

/// Runs `sluice tail ARGUMENTS --format debezium` and checks it prints one transaction's
/// insert and update and a delete, in order, once each.
fn tail_prints_changes(workspace: &Workspace, database: &str, arguments: &[&str]) {
    let mut command_line = vec!["tail"];
    command_line.extend_from_slice(arguments);
    command_line.extend(["--format", "debezium"]);
    let child = workspace
        .command(&command_line)
        .env("SLUICE_VAR_SOURCE", mysql_url())
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
}
