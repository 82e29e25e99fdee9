//! The connector conformance suite: every connector of the build (`sluice_connectors::CONNECTORS`)
//! is held to one contract, so a new connector is proven by adding its fixture here:
//!
//! - **options**: an unknown field and a missing required one are reported by path and line,
//!   all at once, on each side the connector can be;
//! - **capabilities are honest**: a job that needs a capability (a change stream, upserts, a
//!   cluster's fencing) is accepted exactly when the connector declares it;
//! - **exactly once through a kill**: a snapshot SIGKILLed while some splits are done and
//!   others not, then run again, leaves every row in the target once (no loss, no duplicate);
//! - **round trip**: a connector that is also a source gives back what it was given.
//!
//! Change sinks are held to the stream's contract (kills mid-stream, idempotent replay) by
//! `cdc.rs`, and every sink to the shared type matrix by `type_matrix.rs`.

use crate::support;

use std::path::Path;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sluice_core::connector::Fence;
use sluice_core::spec::{parse_job, parse_job_partially};
use support::{
    assert_same_rows, kill, make_source, mariadb, mysql_url, postgres_url, psql, unique_name, Run, Workspace,
};

const ROWS: i64 = 12_000;
const SPLITS: i64 = 8;

/// How the suite writes into one connector and reads it back.
struct Fixture {
    name: &'static str,
    /// The `target:` block of a job (two-space indented fields); `unique` names a schema or
    /// database of the run's own.
    target: fn(unique: &str) -> String,
    /// What `${TARGET}` is, for server targets.
    target_url: fn() -> Option<String>,
    /// The ids of `items` in the target, sorted, duplicates kept. The standard output of the
    /// run that completed the copy is in the workspace's `run.stdout`.
    item_ids: fn(&Workspace, unique: &str) -> Vec<i64>,
    /// The `source:` block that reads back what the target wrote, for connectors that are also
    /// sources.
    source: Option<fn(unique: &str) -> String>,
}

fn no_url() -> Option<String> {
    None
}

fn sqlite_ids(path: &Path) -> Vec<i64> {
    let connection = rusqlite::Connection::open(path).expect("open the database");
    let mut statement = connection.prepare("SELECT id FROM items ORDER BY id").expect("select");
    statement.query_map([], |row| row.get(0)).expect("query").map(Result::unwrap).collect()
}

fn sorted(mut ids: Vec<i64>) -> Vec<i64> {
    ids.sort_unstable();
    ids
}

fn lines_to_ids(text: &str) -> Vec<i64> {
    sorted(text.lines().map(|line| line.trim().parse().expect("an id")).collect())
}

/// Every whole file of a table's directory with this extension (a `.tmp` part is not whole).
fn parts(directory: &Path, extension: &str) -> Vec<std::path::PathBuf> {
    let mut parts: Vec<_> = std::fs::read_dir(directory)
        .expect("the table's directory")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|found| found == extension))
        .collect();
    parts.sort();
    parts
}

/// The `id` of an event's row image (`data` for Maxwell, `after` or `before` for Debezium).
fn event_id(line: &str, image: &str) -> i64 {
    let event: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}"));
    event[image]["id"].as_i64().unwrap_or_else(|| panic!("no {image}.id in {line}"))
}

fn fixtures() -> Vec<Fixture> {
    vec![
        Fixture {
            name: "sqlite",
            target: |_| "  type: sqlite\n  path: out.db\n".into(),
            target_url: no_url,
            item_ids: |workspace, _| sqlite_ids(&workspace.path("out.db")),
            source: Some(|_| "  type: sqlite\n  path: out.db\n  tables: [items]\n".into()),
        },
        Fixture {
            name: "csv",
            target: |_| "  type: csv\n  path: out-csv\n".into(),
            target_url: no_url,
            // Read back through sluice's CSV reader (quoted line breaks make lines no rows).
            item_ids: |workspace, _| {
                let job = workspace.write(
                    "read-csv.yaml",
                    "name: read-csv\nsource:\n  type: csv\n  path: out-csv\n  tables: [items]\ntarget:\n  type: sqlite\n  path: read-csv.db\n",
                );
                workspace.sluice(&["run", job.to_str().unwrap(), "--state-dir", "read-state"]).assert_code(0);
                sqlite_ids(&workspace.path("read-csv.db"))
            },
            source: Some(|_| "  type: csv\n  path: out-csv\n  tables: [items]\n".into()),
        },
        Fixture {
            name: "jsonl",
            target: |_| "  type: jsonl\n  path: out-jsonl\n".into(),
            target_url: no_url,
            item_ids: |workspace, _| {
                let mut ids = Vec::new();
                for part in parts(&workspace.path("out-jsonl/items"), "jsonl") {
                    for line in std::fs::read_to_string(part).unwrap().lines() {
                        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
                        ids.push(row["id"].as_i64().expect("an integer id"));
                    }
                }
                sorted(ids)
            },
            source: Some(|_| "  type: jsonl\n  path: out-jsonl\n  tables: [items]\n".into()),
        },
        Fixture {
            name: "parquet",
            target: |_| "  type: parquet\n  path: out-parquet\n".into(),
            target_url: no_url,
            // Through the manifest, which lists the dataset's parts once the copy is done.
            item_ids: |workspace, _| {
                let directory = workspace.path("out-parquet/items");
                let manifest: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(directory.join("_manifest.json")).unwrap()).unwrap();
                let listed: Vec<std::path::PathBuf> = manifest["parts"]
                    .as_array()
                    .expect("a list of parts")
                    .iter()
                    .map(|part| directory.join(part["path"].as_str().unwrap()))
                    .collect();
                assert_eq!(listed, parts(&directory, "parquet"), "the manifest lists every whole part");
                let mut ids = Vec::new();
                for part in listed {
                    let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(part).unwrap())
                        .unwrap()
                        .build()
                        .unwrap();
                    for batch in reader {
                        let batch = batch.unwrap();
                        let column = batch.column_by_name("id").expect("an id column");
                        ids.extend(column.as_primitive::<Int64Type>().values().iter().copied());
                    }
                }
                sorted(ids)
            },
            source: None,
        },
        Fixture {
            name: "stdout",
            // No checkpoint: the run after the kill prints every row again, each once.
            target: |_| "  type: stdout\n  format: maxwell\n".into(),
            target_url: no_url,
            item_ids: |workspace, _| {
                let text = std::fs::read_to_string(workspace.path("run.stdout")).unwrap();
                sorted(text.lines().map(|line| event_id(line, "data")).collect())
            },
            source: None,
        },
        Fixture {
            name: "nats",
            target: |unique| {
                format!("  type: nats\n  url: ${{TARGET}}\n  stream: S_{unique}\n  subject: \"{unique}.{{table}}\"\n")
            },
            // The test starts a broker of its own (`a_snapshot_into_nats_…`) and notes its URL
            // in the workspace's `broker`.
            target_url: no_url,
            item_ids: |workspace, unique| {
                let url = std::fs::read_to_string(workspace.path("broker")).unwrap();
                let messages = support::nats::messages(&url, &format!("S_{unique}"));
                sorted(
                    messages.iter().map(|message| message.payload["data"]["id"].as_i64().expect("data.id")).collect(),
                )
            },
            source: None,
        },
        #[cfg(feature = "kafka")]
        Fixture {
            name: "kafka",
            target: |unique| {
                format!(
                    "  type: kafka\n  brokers: ${{TARGET}}\n  topic: \"{unique}.{{table}}\"\n  checkpoint_topic: checkpoints_{unique}\n"
                )
            },
            // The test starts a broker of its own (`a_snapshot_into_kafka_…`) and notes its
            // address in the workspace's `broker`.
            target_url: no_url,
            item_ids: |workspace, unique| {
                let bootstrap = std::fs::read_to_string(workspace.path("broker")).unwrap();
                let records = support::kafka::records(&bootstrap, &[&format!("{unique}.items")]);
                sorted(records.iter().map(|record| record.value["data"]["id"].as_i64().expect("data.id")).collect())
            },
            source: None,
        },
        #[cfg(feature = "delta")]
        Fixture {
            name: "delta",
            target: |_| "  type: delta\n  path: out-delta\n".into(),
            target_url: no_url,
            // Read by an independent reader, Python's deltalake.
            item_ids: |workspace, _| {
                let rows = support::lake::rows(&workspace.path("out-delta/items"), &["id"]);
                sorted(rows.iter().map(|line| line.parse().expect("an id")).collect())
            },
            source: None,
        },
        #[cfg(feature = "iceberg")]
        Fixture {
            name: "iceberg",
            target: |_| {
                "  type: iceberg\n  catalog: {type: sql, uri: \"sqlite:///out-iceberg/catalog.db\", name: lake}\n  warehouse: out-iceberg\n"
                    .into()
            },
            target_url: no_url,
            // Read by an independent reader, pyiceberg.
            item_ids: |workspace, _| {
                let catalog = support::iceberg::Catalog::sqlite(&workspace.path("out-iceberg/catalog.db"));
                let rows = support::iceberg::rows(&catalog, "default.items", &["id"]);
                sorted(rows.iter().map(|line| line.parse().expect("an id")).collect())
            },
            source: None,
        },
        Fixture {
            name: "postgres",
            target: |unique| format!("  type: postgres\n  url: ${{TARGET}}\n  namespace: {unique}\n"),
            target_url: || Some(postgres_url()),
            item_ids: |_, unique| lines_to_ids(&psql(&format!("SELECT id FROM {unique}.items"))),
            source: None,
        },
        Fixture {
            name: "clickhouse",
            target: |unique| format!("  type: clickhouse\n  url: ${{TARGET}}\n  namespace: {unique}\n"),
            target_url: || Some(support::clickhouse::url()),
            // Read by ClickHouse's own client, through the view of the live rows (FINAL).
            item_ids: |_, unique| {
                lines_to_ids(&support::clickhouse::query(&format!("SELECT id FROM {unique}.items_live")))
            },
            source: None,
        },
        Fixture {
            name: "mysql",
            target: |unique| format!("  type: mysql\n  url: ${{TARGET}}\n  namespace: {unique}\n"),
            target_url: || Some(mysql_url()),
            item_ids: |_, unique| lines_to_ids(&mariadb(&format!("SELECT id FROM {unique}.items"))),
            source: None,
        },
    ]
}

fn fixture(name: &str) -> Fixture {
    fixtures().into_iter().find(|fixture| fixture.name == name).expect("a fixture")
}

/// A fixture describes writing into a connector; a source-only one (`directory`, `tcp`) is
/// held here to its options and capabilities, and to exactly once by `file_inputs.rs`.
#[test]
fn every_connector_of_the_build_has_a_fixture() {
    let names: Vec<&str> = fixtures().iter().map(|fixture| fixture.name).collect();
    // The blackhole keeps nothing to read back: `generated_rows_…` holds it to its counts.
    let kept = |connector: &&&sluice_connectors::Connector| connector.target.is_some() && connector.name != "blackhole";
    for connector in sluice_connectors::CONNECTORS.iter().filter(kept) {
        assert!(
            names.contains(&connector.name),
            "connector `{}` has no conformance fixture: add one to tests/conformance.rs",
            connector.name
        );
    }
}

/// A job with `side` as the connector under test (and the other side a SQLite file).
fn job_with(connector: &sluice_connectors::Connector, source_side: bool, extra: &str, mode: &str) -> String {
    let fields = |side: &'static [&'static str]| -> String {
        let mut text = format!("  type: {}\n", connector.name);
        if side.contains(&"url") {
            // Parameters that keep a sink from reaching for the server when it is built.
            match connector.name {
                "clickhouse" => text.push_str("  url: \"http://u@127.0.0.1:9\"\n"),
                name => {
                    let tls = if name == "postgres" { "sslmode=disable" } else { "ssl-mode=DISABLED" };
                    text.push_str(&format!("  url: \"{name}://u@127.0.0.1:9/d?{tls}\"\n"));
                }
            }
        }
        if side.contains(&"path") {
            text.push_str("  path: somewhere\n");
        }
        text
    };
    let other = "  type: sqlite\n  path: other.db\n";
    let (source, target) = if source_side {
        (fields(connector.source.as_ref().unwrap().fields) + extra, other.to_owned())
    } else {
        (other.to_owned(), fields(connector.target.as_ref().unwrap().fields) + extra)
    };
    let mode = if mode.is_empty() { String::new() } else { format!("mode: {mode}\n") };
    format!("name: conformance\n{mode}source:\n{source}target:\n{target}")
}

fn problems(text: &str) -> Vec<String> {
    let (job, mut errors) = parse_job_partially(text, false, |_| None);
    if let Some(job) = job {
        errors.extend(sluice_connectors::validate(&job));
    }
    errors.iter().map(ToString::to_string).collect()
}

#[test]
fn every_connector_reports_bad_options_by_path_and_line_all_at_once() {
    for connector in sluice_connectors::CONNECTORS {
        for (source_side, role, side) in [
            (true, "source", connector.source.as_ref().map(|side| side.fields)),
            (false, "target", connector.target.as_ref().map(|side| side.fields)),
        ] {
            let Some(fields) = side else { continue };
            let text = job_with(connector, source_side, "  bogus: 1\n  also_bogus: 2\n", "");
            let line = text.lines().position(|line| line.trim_start().starts_with("bogus:")).unwrap() + 1;
            let found = problems(&text);
            assert!(
                found
                    .iter()
                    .any(|problem| problem.starts_with(&format!("{role}.bogus (line {line}): unknown field `bogus`"))),
                "{}: {found:?}",
                connector.name
            );
            assert!(found.iter().any(|problem| problem.starts_with(&format!("{role}.also_bogus"))), "{found:?}");
            // A required field left out is named, beside the unknown ones.
            for required in ["url", "path"].into_iter().filter(|required| fields.contains(required)) {
                let without: String = text
                    .lines()
                    .filter(|line| {
                        !line.trim_start().starts_with(&format!("{required}:"))
                            || !line.contains(if required == "url" { "://" } else { "somewhere" })
                    })
                    .map(|line| format!("{line}\n"))
                    .collect();
                let found = problems(&without);
                assert!(
                    found.iter().any(|problem| problem.starts_with(&format!("{role}.{required}"))
                        && problem.contains("missing required field")),
                    "{} without {required}: {found:?}",
                    connector.name
                );
                assert!(found.iter().any(|problem| problem.contains("bogus")), "every problem at once: {found:?}");
            }
        }
    }
}

#[test]
fn capabilities_are_the_ones_the_registry_enforces() {
    for connector in sluice_connectors::CONNECTORS {
        let capabilities = connector.capabilities;
        assert_eq!(
            connector.source.is_some(),
            capabilities.snapshot_source || capabilities.change_source,
            "{}: a source copies tables or follows a log",
            connector.name
        );
        if connector.source.is_some() {
            let refused = format!("a `{}` source has no snapshot", connector.name);
            let accepted =
                problems(&job_with(connector, true, "", "snapshot")).iter().all(|problem| !problem.contains(&refused));
            assert_eq!(accepted, capabilities.snapshot_source, "{}: a snapshot from it", connector.name);
        }
        assert_eq!(connector.target.is_some(), capabilities.table_sink, "{}: a target takes tables", connector.name);
        if connector.source.is_some() {
            let refused = format!("a `{}` source", connector.name);
            let accepted =
                problems(&job_with(connector, true, "", "cdc")).iter().all(|problem| !problem.contains(&refused));
            assert_eq!(accepted, capabilities.change_source, "{}: cdc as a source", connector.name);
        }
        if connector.target.is_some() {
            let refused = format!("a `{}` target", connector.name);
            let accepted = problems(&job_with(connector, false, "", "snapshot+cdc"))
                .iter()
                .all(|problem| !problem.contains(&refused));
            assert_eq!(
                accepted,
                capabilities.change_sink || capabilities.event_sink,
                "{}: a change stream as a target",
                connector.name
            );
            let upsert = job_with(connector, false, "  write_mode: upsert\n", "");
            let accepted = problems(&upsert).iter().all(|problem| !problem.contains("write_mode"));
            assert_eq!(accepted, capabilities.upsert, "{}: upserts", connector.name);
            let built = job_with(connector, false, required_fields(connector.name, false), "");
            let job = parse_job(&built, false, |_| None).unwrap();
            let fenced = sluice_connectors::fenced_sink(&job, Fence { task: "t".into(), epoch: 1 });
            assert_eq!(
                fenced.is_ok(),
                capabilities.fencing,
                "{}: a fenced sink for a cluster ({:?})",
                connector.name,
                fenced.err()
            );
            assert_eq!(sluice_connectors::fences(connector.name), capabilities.fencing);
        }
    }
}

/// What a connector needs beyond `job_with`'s fields to be built, as a source and a target.
fn required_fields(name: &str, source_side: bool) -> &'static str {
    match (name, source_side) {
        ("tcp", true) => "  listen: 127.0.0.1:9\n  table: lines\n  columns: {id: bigint}\n",
        ("nats", true) => "  stream: events\n  tables: [db.t]\n",
        ("nats", false) => "  stream: events\n",
        ("kafka", true) => "  brokers: 127.0.0.1:9\n  tables: [db.t]\n",
        ("kafka", false) => "  brokers: 127.0.0.1:9\n",
        ("iceberg", false) => "  catalog: {type: sql, uri: \"sqlite:///catalog.db\"}\n  warehouse: warehouse\n",
        ("generate", true) => "  tables: [{name: t, rows: 10, columns: {id: bigint}}]\n",
        _ => "",
    }
}

/// A built connector implements exactly the capability traits the registry declares for it: the
/// engine asks the built source and target for them (`Source::snapshot`, `Sink::folded_changes`,
/// …), the registry judges jobs by the declaration before anything is built.
#[tokio::test]
async fn built_connectors_have_the_capability_traits_the_registry_declares() {
    for connector in sluice_connectors::CONNECTORS {
        let capabilities = connector.capabilities;
        if connector.source.is_some() {
            let job = parse_job(&job_with(connector, true, required_fields(connector.name, true), ""), false, |_| None)
                .unwrap();
            let source = sluice_connectors::source(&job).unwrap_or_else(|error| panic!("{}: {error}", connector.name));
            assert_eq!(source.snapshot().is_some(), capabilities.snapshot_source, "{}: snapshot", connector.name);
            assert_eq!(source.changes().is_some(), capabilities.change_source, "{}: change log", connector.name);
            assert_eq!(source.cursor().is_some(), capabilities.cursor_source, "{}: cursor reads", connector.name);
        }
        if connector.target.is_some() {
            let job =
                parse_job(&job_with(connector, false, required_fields(connector.name, false), ""), false, |_| None)
                    .unwrap();
            let sink = sluice_connectors::sink(&job).unwrap_or_else(|error| panic!("{}: {error}", connector.name));
            assert_eq!(sink.folded_changes().is_some(), capabilities.change_sink, "{}: folded changes", connector.name);
            assert_eq!(sink.event_changes().is_some(), capabilities.event_sink, "{}: change events", connector.name);
        }
    }
}

/// Done splits of the job in the run's state directory.
fn splits_done(workspace: &Workspace, job: &str) -> i64 {
    let Ok(connection) = rusqlite::Connection::open_with_flags(
        workspace.path(".sluice/state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    ) else {
        return 0;
    };
    connection
        .query_row("SELECT count(*) FROM checkpoints WHERE job = ?1 AND done = 1", [job], |row| row.get(0))
        .unwrap_or(0)
}

/// Copies a SQLite fixture into the connector, SIGKILLs the run while some splits are done and
/// others not, runs it again, and checks every row is there once; then reads the copy back
/// through the connector when it is also a source.
fn exactly_once_through_a_kill(name: &str) {
    exactly_once_through_a_kill_at(name, &Workspace::new());
}

/// The same, in a workspace prepared by the test (a broker's URL noted in it).
fn exactly_once_through_a_kill_at(name: &str, workspace: &Workspace) {
    let fixture = fixture(name);
    let target_url = || (fixture.target_url)().or_else(|| std::fs::read_to_string(workspace.path("broker")).ok());
    make_source(&workspace.path("source.db"), ROWS as u64);
    let unique = unique_name(&format!("conform_{name}"));
    let job_name = unique.replace('_', "-");
    // One task at a time into Kafka: the test broker (tansu 0.6) sometimes leaves a partition's
    // last stable offset at a transaction that a second producer's restart aborted, while other
    // producers write the same partition, so read_committed readers stop there (seen with its
    // abort marker in place; a broker fault, not the writer's).
    let parallelism = if name == "kafka" { 1 } else { 2 };
    let job = |limits: &str| {
        format!(
            "name: {job_name}\nsource:\n  type: sqlite\n  path: source.db\n  tables: [items]\ntarget:\n{}parallelism: {parallelism}\nlimits: {{split_rows: {}, batch_rows: 250{limits}}}\n",
            (fixture.target)(&unique),
            ROWS / SPLITS
        )
    };
    let slow = workspace.write("slow.yaml", &job(", rows_per_sec: 6000"));
    let fast = workspace.write("fast.yaml", &job(""));
    let mut command = workspace.command(&["run", slow.to_str().unwrap()]);
    if let Some(url) = target_url() {
        command.env("TARGET", url);
    }
    let mut child = command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while splits_done(workspace, &job_name) == 0 {
        assert!(std::time::Instant::now() < deadline, "{name}: no split finished");
        assert!(child.try_wait().unwrap().is_none(), "{name}: the slow run ended before the kill");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(&mut child);
    let done = splits_done(workspace, &job_name);
    assert!(done < SPLITS, "{name}: the kill came after the copy ({done} splits done)");

    let mut command = workspace.command(&["run", fast.to_str().unwrap()]);
    if let Some(url) = target_url() {
        command.env("TARGET", url);
    }
    let output = command.output().unwrap();
    assert!(output.status.success(), "{name}: {}", String::from_utf8_lossy(&output.stderr));
    std::fs::write(workspace.path("run.stdout"), &output.stdout).unwrap();
    let ids = (fixture.item_ids)(workspace, &unique);
    if ids != (1..=ROWS).collect::<Vec<_>>() {
        let duplicates = ids.windows(2).filter(|pair| pair[0] == pair[1]).count();
        panic!(
            "{name}: {} rows after the kill and the resume, {duplicates} duplicated, expected {ROWS} once each",
            ids.len()
        );
    }

    // Every target `sluice verify` reads back: the copy equals the source by it too.
    if ["sqlite", "csv", "jsonl", "parquet", "delta", "iceberg", "postgres", "mysql", "clickhouse"].contains(&name) {
        let mut command = workspace.command(&["verify", fast.to_str().unwrap(), "--json"]);
        if let Some(url) = target_url() {
            command.env("TARGET", url);
        }
        let verified = Run::from(command.output().unwrap());
        assert_eq!(verified.code, 0, "{name}: {}", verified.all());
        let report: serde_json::Value = serde_json::from_str(&verified.stdout).unwrap();
        assert_eq!(report["tables"][0]["rows_target"], ROWS, "{name}: {}", verified.stdout);
    }

    if let Some(source) = fixture.source {
        let back = workspace.write(
            "back.yaml",
            &format!("name: back\nsource:\n{}target:\n  type: sqlite\n  path: back.db\n", source(&unique)),
        );
        workspace.sluice(&["run", back.to_str().unwrap(), "--state-dir", "back-state"]).assert_code(0);
        assert_same_rows(&workspace.path("back.db"), &workspace.path("source.db"), "items");
    }
}

#[test]
fn a_snapshot_into_sqlite_is_exact_through_a_kill_and_reads_back() {
    exactly_once_through_a_kill("sqlite");
}

#[test]
fn a_snapshot_into_csv_is_exact_through_a_kill_and_reads_back() {
    exactly_once_through_a_kill("csv");
}

#[test]
fn a_snapshot_into_jsonl_is_exact_through_a_kill_and_reads_back() {
    exactly_once_through_a_kill("jsonl");
}

#[test]
fn a_snapshot_into_parquet_is_exact_through_a_kill() {
    exactly_once_through_a_kill("parquet");
}

#[test]
fn a_snapshot_into_stdout_prints_every_row_once_after_a_kill() {
    exactly_once_through_a_kill("stdout");
}

#[test]
fn a_snapshot_into_nats_is_exact_through_a_kill() {
    let broker = support::nats::NatsServer::start();
    let workspace = Workspace::new();
    workspace.write("broker", &broker.url());
    exactly_once_through_a_kill_at("nats", &workspace);
}

/// A snapshot batch's keys go with the NATS checkpoint before its events (decision 0064): a
/// server that takes smaller messages than they need stops the copy at its first batch with an
/// error naming what to lower, and the same job with smaller batches copies every row.
#[test]
fn a_nats_server_too_small_for_a_batchs_keys_gets_an_error_naming_batch_rows() {
    let broker = support::nats::NatsServer::start_with("max_payload: 16384\n");
    let workspace = Workspace::new();
    let job = |batch_rows: u32| {
        workspace.write(
            "job.yaml",
            &format!(
                "name: small-messages\nmode: snapshot\nsource: {{type: generate, seed: 3, tables: [{{name: t, rows: 6000, key: [id], columns: {{id: bigint, v: text}}}}]}}\n\
                 target: {{type: nats, url: \"{}\", stream: EVENTS, subject: \"rows.{{table}}\"}}\nlimits: {{batch_rows: {batch_rows}}}\n",
                broker.url()
            ),
        )
    };
    let refused = workspace.sluice(&["run", job(6000).to_str().unwrap()]);
    assert_ne!(refused.code, 0, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("max_payload 16384") && refused.stderr.contains("lower limits.batch_rows"),
        "the error names the server's limit and what to lower:\n{}",
        refused.stderr
    );
    workspace.sluice(&["run", job(500).to_str().unwrap()]).assert_code(0);
    assert_eq!(broker.messages("EVENTS").len(), 6000);
}

/// Run by `suite::brokers`, never beside another broker.
#[cfg(feature = "kafka")]
pub(super) fn a_snapshot_into_kafka_is_exact_through_a_kill() {
    let broker = support::kafka::KafkaBroker::start();
    let workspace = Workspace::new();
    workspace.write("broker", &broker.bootstrap());
    exactly_once_through_a_kill_at("kafka", &workspace);
}

#[cfg(feature = "delta")]
#[test]
fn a_snapshot_into_delta_is_exact_through_a_kill() {
    exactly_once_through_a_kill("delta");
}

#[cfg(feature = "iceberg")]
#[test]
fn a_snapshot_into_iceberg_is_exact_through_a_kill() {
    exactly_once_through_a_kill("iceberg");
}

#[test]
fn a_snapshot_into_postgres_is_exact_through_a_kill() {
    exactly_once_through_a_kill("postgres");
}

#[test]
fn a_snapshot_into_mysql_is_exact_through_a_kill() {
    exactly_once_through_a_kill("mysql");
}

#[test]
fn a_snapshot_into_clickhouse_is_exact_through_a_kill() {
    exactly_once_through_a_kill("clickhouse");
}

/// The `generate` source and the `blackhole` target: the job file of the issue that asked for
/// them runs as written, every row made once and counted by the blackhole; the same seed makes
/// the same rows on every run (into SQLite twice), another seed other rows; and a copy into
/// PostgreSQL killed halfway resumes into every key exactly once.
#[test]
fn generated_rows_are_the_same_for_a_seed_and_the_blackhole_counts_each_once() {
    let workspace = Workspace::new();
    let gen1 = workspace.write(
        "gen1.yaml",
        "name: gen1\nmode: snapshot\nsource: {type: generate, seed: 1, tables: [{name: t, rows: 100000, columns: {id: bigint, v: text}}]}\ntarget: {type: blackhole}\nlimits: {split_rows: 10000}\n",
    );
    workspace.sluice(&["run", gen1.to_str().unwrap(), "--summary-json", "gen1.json"]).assert_code(0);
    let summary = support::summary(&workspace.path("gen1.json"));
    assert_eq!(
        (summary["rows_read"].as_u64(), summary["rows_written"].as_u64()),
        (Some(100_000), Some(100_000)),
        "{summary}"
    );
    assert_eq!(splits_done(&workspace, "gen1"), 10, "split_rows: 10000 cuts 100,000 rows in 10 splits");

    let into_sqlite = |seed: u64, file: &str| {
        let job = workspace.write(
            &format!("{file}.yaml"),
            &format!(
                "name: {file}\nsource: {{type: generate, seed: {seed}, tables: [{{name: items, rows: 5000, key: [code], columns: {{code: text, amount: decimal, at: timestamp, ok: boolean, doc: json, day: date, ratio: double, n: int, raw: bytes}}}}]}}\n\
                 target: {{type: sqlite, path: {file}.db}}\nlimits: {{split_rows: 700, batch_rows: 128}}\n"
            ),
        );
        workspace.sluice(&["run", job.to_str().unwrap(), "--state-dir", &format!("{file}-state")]).assert_code(0);
        workspace.path(&format!("{file}.db"))
    };
    let (first, again, other) = (into_sqlite(7, "first"), into_sqlite(7, "again"), into_sqlite(8, "other"));
    assert_same_rows(&again, &first, "items");
    let digest = |path: &Path| -> String {
        let connection = rusqlite::Connection::open(path).unwrap();
        connection
            .query_row(
                "SELECT group_concat(amount || '/' || at || '/' || n, ',') FROM (SELECT * FROM items ORDER BY code)",
                [],
                |row| row.get(0),
            )
            .unwrap()
    };
    assert_ne!(digest(&other), digest(&first), "another seed makes other values");
    let codes: Vec<String> = {
        let connection = rusqlite::Connection::open(&first).unwrap();
        let mut statement = connection.prepare("SELECT code FROM items ORDER BY code").unwrap();
        statement.query_map([], |row| row.get(0)).unwrap().map(Result::unwrap).collect()
    };
    assert_eq!(codes.len(), 5000);
    assert_eq!((codes[0].as_str(), codes[4999].as_str()), ("000000000001", "000000005000"));

    // Into PostgreSQL, killed once some splits are done: every key once after the resume.
    let unique = unique_name("generated");
    let job = |limits: &str| {
        format!(
            "name: generated\nsource: {{type: generate, seed: 3, tables: [{{name: items, rows: {ROWS}, columns: {{id: bigint, v: text}}}}]}}\n\
             target: {{type: postgres, url: \"${{TARGET}}\", namespace: {unique}}}\nparallelism: 2\nlimits: {{split_rows: {}, batch_rows: 250{limits}}}\n",
            ROWS / SPLITS
        )
    };
    let slow = workspace.write("slow.yaml", &job(", rows_per_sec: 6000"));
    let fast = workspace.write("fast.yaml", &job(""));
    let mut child = workspace
        .command(&["run", slow.to_str().unwrap(), "--state-dir", "pg-state"])
        .env("TARGET", postgres_url())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let done = |workspace: &Workspace| {
        rusqlite::Connection::open_with_flags(
            workspace.path("pg-state/state.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .and_then(|connection| {
            connection.query_row("SELECT count(*) FROM checkpoints WHERE job = 'generated' AND done = 1", [], |row| {
                row.get::<_, i64>(0)
            })
        })
        .unwrap_or(0)
    };
    support::wait_for("a split done", Duration::from_secs(60), || done(&workspace) > 0);
    kill(&mut child);
    assert!(done(&workspace) < SPLITS, "the kill came before the end");
    let resumed = workspace
        .command(&["run", fast.to_str().unwrap(), "--state-dir", "pg-state"])
        .env("TARGET", postgres_url())
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let ids = lines_to_ids(&psql(&format!("SELECT id FROM {unique}.items ORDER BY id")));
    assert_eq!(ids, (1..=ROWS).collect::<Vec<_>>(), "every key once after the kill and the resume");
    psql(&format!("DROP SCHEMA {unique} CASCADE"));
}
