//! `sluice verify`: the target compared with the source through the job's mapping, against real
//! servers, with corruptions the test injects into the target.

use std::collections::BTreeSet;
use std::path::Path;

use crate::support;

use support::stream_job::StreamJob;
use support::workload::{create_tables, Load, Random};
use support::{mariadb, mariadb_client, mysql_url, postgres_url, psql, unique_name, Run, Workspace};

/// `sluice verify` of a job file with the test servers as `SOURCE` and `TARGET` (`TARGET` a
/// PostgreSQL URL unless `target` names another).
fn verify(workspace: &Workspace, job: &Path, target: &str, extra: &[&str]) -> Run {
    let mut arguments = vec!["verify", job.to_str().unwrap()];
    arguments.extend_from_slice(extra);
    Run::from(workspace.command(&arguments).env("SOURCE", mysql_url()).env("TARGET", target).output().unwrap())
}

/// The differences of a `--json` report's table `index` as `(kind, id, columns)`.
fn differences(report: &serde_json::Value, index: usize) -> BTreeSet<(String, i64, Vec<String>)> {
    report["tables"][index]["differences"]
        .as_array()
        .expect("a list of differences")
        .iter()
        .map(|difference| {
            let columns = difference["columns"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_owned());
            (
                difference["kind"].as_str().unwrap().to_owned(),
                difference["key"]["id"].as_i64().expect("an id in the key"),
                columns.collect(),
            )
        })
        .collect()
}

fn report_of(run: &Run) -> serde_json::Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|error| panic!("not one JSON document ({error}):\n{}", run.all()))
}

fn id_list(ids: &[i64]) -> String {
    ids.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

const ROWS: i64 = 200_000;

#[test]
fn verify_finds_every_corruption_injected_into_the_target_by_key_and_column_and_nothing_else() {
    let database = unique_name("verify");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(40) NULL, made DATETIME(6) NOT NULL, doc JSON NULL,
             price DECIMAL(12,2) NOT NULL, code CHAR(6) NOT NULL, big BIGINT UNSIGNED NOT NULL, ratio FLOAT NOT NULL);
         INSERT INTO items SELECT seq, IF(seq % 10 = 0, '', CONCAT('name ', seq)),
             '2024-01-02 03:04:05.123456' + INTERVAL seq SECOND, JSON_OBJECT('k', seq, 'tag', 'x'),
             seq / 8, 'ab', 18446744073709551615 - seq, seq / 3 FROM seq_1_to_{ROWS};
         CREATE TABLE quiet (id INT PRIMARY KEY, v INT);
         INSERT INTO quiet SELECT seq, seq FROM seq_1_to_100;"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: verify-corruptions\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\nlimits: {{split_rows: 20000}}\n"
        ),
    );
    let copied = workspace
        .command(&["run", job.to_str().unwrap()])
        .env("SOURCE", mysql_url())
        .env("TARGET", postgres_url())
        .output()
        .unwrap();
    Run::from(copied).assert_code(0);
    let clean = verify(&workspace, &job, &postgres_url(), &["--json"]);
    clean.assert_code(0);
    let report = report_of(&clean);
    assert_eq!(report["differences_total"], 0, "{}", clean.stdout);
    assert_eq!(report["tables"][0]["rows_source"], ROWS);
    assert_eq!(report["tables"][0]["rows_target"], ROWS);
    assert!(report["tables"][0]["chunks"].as_u64().unwrap() >= 6, "{}", clean.stdout);

    // 1,000 corruptions of eight kinds on distinct random rows; a JSON document with its keys
    // reordered is the same document, so 875 differences.
    let mut random = Random::from_environment("verify_finds_every_corruption");
    let mut free: Vec<i64> = (1..=ROWS).collect();
    let mut take = |count: usize, rule: &dyn Fn(i64) -> bool| -> Vec<i64> {
        let mut taken = Vec::with_capacity(count);
        while taken.len() < count {
            let at = random.below(free.len() as u64) as usize;
            if rule(free[at]) {
                taken.push(free.swap_remove(at));
            }
        }
        taken
    };
    let deleted = take(125, &|_| true);
    let renamed = take(125, &|id| id % 10 != 0);
    let later = take(125, &|_| true);
    let padded = take(125, &|_| true);
    let nulled = take(125, &|id| id % 10 == 0);
    let reordered = take(125, &|_| true);
    let rewritten = take(125, &|_| true);
    let extra: Vec<i64> = (0..125).map(|index| ROWS + 1_000 + index * 7).collect();
    let table = format!("{database}.items");
    psql(&format!(
        "BEGIN;
         DELETE FROM {table} WHERE id IN ({});
         UPDATE {table} SET name = name || 'x' WHERE id IN ({});
         UPDATE {table} SET made = made + interval '1 microsecond' WHERE id IN ({});
         UPDATE {table} SET name = name || ' ' WHERE id IN ({});
         UPDATE {table} SET name = NULL WHERE id IN ({});
         UPDATE {table} SET doc = json_build_object('tag', 'x', 'k', id) WHERE id IN ({});
         UPDATE {table} SET doc = json_build_object('k', id, 'tag', 'y') WHERE id IN ({});
         INSERT INTO {table} (id, name, made, price, code, big, ratio)
             SELECT id, 'extra', '2024-01-01', 1, 'ab', 1, 1 FROM unnest(ARRAY[{}]) AS id;
         COMMIT;",
        id_list(&deleted),
        id_list(&renamed),
        id_list(&later),
        id_list(&padded),
        id_list(&nulled),
        id_list(&reordered),
        id_list(&rewritten),
        id_list(&extra),
    ));
    let mut expected = BTreeSet::new();
    let mut expect = |kind: &str, ids: &[i64], columns: &[&str]| {
        for id in ids {
            expected.insert((kind.to_owned(), *id, columns.iter().map(|column| (*column).to_owned()).collect()));
        }
    };
    expect("missing", &deleted, &[]);
    expect("different", &renamed, &["name"]);
    expect("different", &later, &["made"]);
    expect("different", &padded, &["name"]);
    expect("different", &nulled, &["name"]);
    expect("different", &rewritten, &["doc"]);
    expect("extra", &extra, &[]);

    let found = verify(&workspace, &job, &postgres_url(), &["--json", "--tables", &table]);
    found.assert_code(1);
    let report = report_of(&found);
    assert_eq!(report["tables"].as_array().unwrap().len(), 1, "--tables selects one table");
    assert_eq!(report["differences_total"], 875);
    let table_report = &report["tables"][0];
    assert_eq!(
        (&table_report["missing"], &table_report["extra"], &table_report["different"]),
        (&serde_json::json!(125), &serde_json::json!(125), &serde_json::json!(625))
    );
    let listed = differences(&report, 0);
    assert_eq!(listed.len(), 875);
    let unexpected: Vec<_> = listed.difference(&expected).collect();
    let unfound: Vec<_> = expected.difference(&listed).collect();
    assert!(
        unexpected.is_empty() && unfound.is_empty(),
        "found but not injected: {unexpected:?}\ninjected but not found: {unfound:?}"
    );

    // The text report names the rows too, and lists no more than asked.
    let text = verify(&workspace, &job, &postgres_url(), &["--max-differences", "3"]);
    text.assert_code(1);
    assert!(text.stdout.contains(&format!("{table} (from {table}): {ROWS} source rows")), "{}", text.stdout);
    assert!(text.stdout.contains("875 differences (125 missing, 125 extra, 625 different)"), "{}", text.stdout);
    assert!(text.stdout.contains("… and 872 more (--max-differences)"), "{}", text.stdout);
    assert_eq!(text.stdout.lines().filter(|line| line.starts_with("  missing ")).count(), 3, "{}", text.stdout);
    assert!(text
        .stdout
        .contains(&format!("{database}.quiet (from {database}.quiet): 100 source rows, 100 target rows")));
    let kept = std::fs::read_to_string(workspace.path(".sluice/verify-verify-corruptions.json")).unwrap();
    assert!(kept.contains("\"differences_total\": 875"), "the last report is kept in the state directory");

    // --repair writes the source's rows over exactly those rows, records each, and compares
    // them again: nothing is left to differ.
    let repaired = verify(&workspace, &job, &postgres_url(), &["--json", "--repair"]);
    repaired.assert_code(0);
    let report = report_of(&repaired);
    assert_eq!(report["tables"][0]["repaired"], 875, "{}", repaired.stdout);
    assert_eq!(report["differences_total"], 0, "{}", repaired.stdout);
    let records = std::fs::read_to_string(workspace.path(".sluice/verify-corruptions/repairs.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = records.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len(), 875);
    let extra_record = records.iter().find(|record| record["key"]["id"] == extra[0]).expect("the extra row's repair");
    assert_eq!(
        (&extra_record["kind"], &extra_record["before"]["name"], &extra_record["after"]),
        (&serde_json::json!("extra"), &serde_json::json!("extra"), &serde_json::Value::Null)
    );
    let nulled_record = records.iter().find(|record| record["key"]["id"] == nulled[0]).expect("a nulled row's repair");
    assert_eq!(
        (&nulled_record["before"]["name"], &nulled_record["after"]["name"]),
        (&serde_json::Value::Null, &serde_json::json!(""))
    );
    assert_eq!(psql(&format!("SELECT count(*) FROM {table}")).trim(), ROWS.to_string());
    verify(&workspace, &job, &postgres_url(), &[]).assert_code(0);

    // A table without differences passes; a bad command line is exit code 2.
    verify(&workspace, &job, &postgres_url(), &["--tables", &format!("{database}.quiet")]).assert_code(0);
    verify(&workspace, &job, &postgres_url(), &["--max-differences", "many"]).assert_code(2);
    let unknown = verify(&workspace, &job, &postgres_url(), &["--tables", "no_such.table"]);
    unknown.assert_code(2);
    assert!(unknown.stderr.contains("no table of the job matches --tables"), "{}", unknown.all());
}

#[test]
fn verify_reads_mysql_and_sqlite_targets_back_and_sees_through_routes_and_computed_columns() {
    let base = unique_name("verify_shards");
    for shard in 0..2 {
        // The same keys in both shards: the origin column tells their rows apart in the target.
        mariadb(&format!(
            "CREATE DATABASE {base}_s{shard}; USE {base}_s{shard};
             CREATE TABLE orders (id INT PRIMARY KEY, customer VARCHAR(40) NOT NULL, amount DECIMAL(12,2) NOT NULL,
                 placed TIMESTAMP(3) NULL, note TEXT NULL);
             INSERT INTO orders SELECT seq, CONCAT('c', seq % 17, ' '), seq * 1.25 + {shard},
                 '2024-03-04 05:06:07.891' + INTERVAL seq MINUTE, IF(seq % 5 = 0, NULL, 'ok') FROM seq_1_to_500;"
        ));
    }
    let workspace = Workspace::new();
    let mapping = format!(
        "route:\n  - source_table: \"{base}_s[0-9]+\\\\.orders\"\n    sink_table: {base}_all.orders\n    origin_column: shard\n\
         transform:\n  - source_table: \"{base}_s[0-9]+\\\\.orders\"\n    projection: \"id, customer, amount * 100 AS cents, placed, note\"\n"
    );
    let sqlite = workspace.path("target.db");
    let jobs = [
        ("mysql", "  type: mysql\n  url: ${TARGET}\n".to_owned(), mysql_url()),
        ("sqlite", format!("  type: sqlite\n  path: {}\n", sqlite.display()), String::new()),
        ("postgres", "  type: postgres\n  url: ${TARGET}\n".to_owned(), postgres_url()),
    ];
    for (kind, target, url) in jobs {
        let job = workspace.write(
            &format!("{kind}.yaml"),
            &format!(
                "name: {}-{kind}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{base}_s*.orders\"]\ntarget:\n{target}\
                 limits: {{split_rows: 200}}\n{mapping}",
                base.replace('_', "-")
            ),
        );
        let run = workspace
            .command(&["run", job.to_str().unwrap(), "--state-dir", kind])
            .env("SOURCE", mysql_url())
            .env("TARGET", &url)
            .output()
            .unwrap();
        Run::from(run).assert_code(0);
        let clean = verify(&workspace, &job, &url, &["--json", "--state-dir", kind]);
        assert_eq!(clean.code, 0, "{kind}: {}", clean.all());
        let report = report_of(&clean);
        assert_eq!(report["tables"][0]["rows_source"], 1000, "{kind}: {}", clean.stdout);
        assert_eq!(report["tables"][0]["rows_target"], 1000, "{kind}: {}", clean.stdout);
        assert_eq!(report["tables"][0]["sources"].as_array().unwrap().len(), 2, "{kind}: {}", clean.stdout);

        // One shard's row changed at the source: its computed column differs, under its
        // shard's key alone.
        mariadb(&format!("UPDATE {base}_s1.orders SET amount = amount + 1 WHERE id = 42"));
        let found = verify(&workspace, &job, &url, &["--json", "--state-dir", kind]);
        assert_eq!(found.code, 1, "{kind}: {}", found.all());
        let report = report_of(&found);
        let listed = report["tables"][0]["differences"].as_array().unwrap();
        assert_eq!(listed.len(), 1, "{kind}: {}", found.stdout);
        assert_eq!(listed[0]["kind"], "different");
        assert_eq!(listed[0]["key"]["id"], 42);
        assert_eq!(listed[0]["key"]["shard"], format!("{base}_s1.orders"), "{kind}: {}", found.stdout);
        assert_eq!(listed[0]["columns"], serde_json::json!(["cents"]));
        if kind != "sqlite" {
            // Repaired through the target's change writer: the row takes the source's value.
            let repaired = verify(&workspace, &job, &url, &["--json", "--repair", "--state-dir", kind]);
            assert_eq!(repaired.code, 0, "{kind}: {}", repaired.all());
            assert_eq!(report_of(&repaired)["tables"][0]["repaired"], 1, "{kind}: {}", repaired.stdout);
            let cents = format!("SELECT cents FROM {base}_all.orders WHERE id = 42 AND shard = '{base}_s1.orders'");
            let held = if kind == "mysql" { mariadb(&cents) } else { psql(&cents) };
            let expected = mariadb(&format!("SELECT amount * 100 FROM {base}_s1.orders WHERE id = 42"));
            let number = |text: &str| text.trim().parse::<f64>().unwrap();
            assert_eq!(number(&held), number(&expected), "{kind}: the target holds the source's value");
        }
        mariadb(&format!("UPDATE {base}_s1.orders SET amount = amount - 1 WHERE id = 42"));
    }
}

#[test]
fn verify_while_a_stream_applies_a_mixed_load_reports_no_false_difference_and_still_finds_corruptions() {
    let database = unique_name("verify_live");
    create_tables(&database);
    mariadb(&format!("USE {database}; CREATE TABLE still (id INT PRIMARY KEY, v VARCHAR(20)); INSERT INTO still SELECT seq, 'v' FROM seq_1_to_300;"));
    let job = StreamJob::new("snapshot+cdc", &database, "postgres", "", "max_dirty_records: 0");
    let mut child = job.start();
    job.wait_converged(&mut child);
    let client = support::workload::Client::start_with(mariadb_client(), &database);
    let load = Load::start_with(client, Random::from_environment("verify_while_a_stream"), 150, 1_000_000);
    for round in 0..10 {
        let run = verify(&job.workspace, &job.file, &postgres_url(), &["--json"]);
        let report = report_of(&run);
        assert_eq!(run.code, 0, "round {round}: a difference while the stream runs:\n{}", run.all());
        assert_eq!(report["differences_total"], 0, "round {round}");
    }
    assert!(load.statements.load(std::sync::atomic::Ordering::Relaxed) > 50, "the load ran during the verifications");

    // Corruptions in the target are still found while the load runs.
    psql(&format!(
        "INSERT INTO {database}.items (id, v, note) VALUES (999999999999, 1, 'extra');
         UPDATE {database}.still SET v = 'w' WHERE id = 7;"
    ));
    let run = verify(&job.workspace, &job.file, &postgres_url(), &["--json"]);
    run.assert_code(1);
    let report = report_of(&run);
    let tables = report["tables"].as_array().unwrap();
    let by_name = |name: &str| tables.iter().position(|table| table["table"] == format!("{database}.{name}")).unwrap();
    assert_eq!(differences(&report, by_name("items")), BTreeSet::from([("extra".to_owned(), 999_999_999_999, vec![])]));
    assert_eq!(
        differences(&report, by_name("still")),
        BTreeSet::from([("different".to_owned(), 7, vec!["v".to_owned()])])
    );
    assert!(report["tables"][by_name("still")]["rechecks"].as_u64().unwrap() >= 1, "checked again: {}", run.stdout);

    // Repaired while the stream runs, beside it: the two rows, and nothing differs after.
    let repaired = verify(&job.workspace, &job.file, &postgres_url(), &["--json", "--repair"]);
    repaired.assert_code(0);
    let report = report_of(&repaired);
    let repairs: u64 =
        report["tables"].as_array().unwrap().iter().map(|table| table["repaired"].as_u64().unwrap()).sum();
    assert_eq!(repairs, 2, "{}", repaired.stdout);
    verify(&job.workspace, &job.file, &postgres_url(), &[]).assert_code(0);
    load.stop();
    drop(child);
}

/// `verify: {every_secs}` on `sluice run`: a streaming job is verified on its schedule while it
/// streams (a row deleted from the target behind its back is found by key in a later report),
/// and a job that copies and ends is verified once its copy succeeded.
#[test]
fn sluice_run_verifies_a_streaming_job_on_its_schedule_and_a_copy_once_it_succeeded() {
    let database = unique_name("verify_scheduled");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE items (id INT PRIMARY KEY, v VARCHAR(20)); INSERT INTO items SELECT seq, CONCAT('v', seq) FROM seq_1_to_500;"
    ));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let job = |mode: &str, every: u64| {
        format!(
            "name: {name}-{}\nmode: {mode}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}_{}\nverify: {{every_secs: {every}}}\n",
            mode.replace('+', "-"),
            mode.replace('+', "_")
        )
    };
    let report = |job: &str| -> Option<serde_json::Value> {
        let text = std::fs::read_to_string(workspace.path(&format!(".sluice/verify-{job}.json"))).ok()?;
        serde_json::from_str(&text).ok()
    };

    // A copy: verified once it succeeded, the report kept, exit 0.
    let copy = workspace.write("copy.yaml", &job("snapshot", 3600));
    let run = workspace.run_job(&copy, &mysql_url(), &postgres_url());
    run.assert_code(0);
    assert!(run.stderr.contains("verified: the target equals the source"), "{}", run.all());
    let copied = report(&format!("{name}-snapshot")).expect("the copy's report is kept");
    assert_eq!(
        (copied["differences_total"].as_u64(), copied["tables"][0]["rows_target"].as_u64()),
        (Some(0), Some(500))
    );

    // A stream: verified every second while it streams.
    let stream = workspace.write("stream.yaml", &job("snapshot+cdc", 1));
    let stream_job = format!("{name}-snapshot-cdc");
    let mut child = workspace.start_run(&stream, &mysql_url(), &postgres_url(), &[]);
    support::wait_for("a scheduled verification", std::time::Duration::from_secs(90), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
        report(&stream_job).is_some_and(|report| report["differences_total"] == 0)
    });
    psql(&format!("DELETE FROM {database}_snapshot_cdc.items WHERE id = 42"));
    support::wait_for("a scheduled verification to find the deleted row", std::time::Duration::from_secs(120), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended:\n{}", child.stderr_text());
        report(&stream_job).is_some_and(|report| {
            report["tables"][0]["differences"]
                == serde_json::json!([{"kind": "missing", "key": {"id": 42}, "columns": []}])
        })
    });
    support::signal(&child, "TERM");
    let output = child.into_inner().wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains(&format!("table {database}_snapshot_cdc.items differs: 1 missing")), "{log}");
}
