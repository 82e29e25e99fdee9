//! Standalone runs of the real binary: SQLite and file connectors, resume after SIGKILL, graceful
//! stop, dirty records, summaries.

use crate::support;

use std::time::Duration;

use support::{assert_same_rows, committed_rows, count, kill, make_source, signal, summary, wait_for, Workspace};

fn sqlite_job(name: &str, extra: &str) -> String {
    format!(
        "name: {name}\nmode: snapshot\nsource:\n  type: sqlite\n  path: source.db\ntarget:\n  type: sqlite\n  path: target.db\n  create_tables: true\n{extra}"
    )
}

#[test]
fn a_snapshot_copies_every_row_and_a_second_run_adds_none() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 5_000);
    let job = workspace
        .write("job.yaml", &sqlite_job("copy", "parallelism: 3\nlimits: {split_rows: 1000, batch_rows: 300}\n"));
    let run = workspace.sluice(&["run", job.to_str().unwrap(), "--summary-json", "summary.json"]);
    run.assert_code(0);
    assert!(run.stdout.contains("job copy: succeeded"), "{}", run.stdout);
    for table in ["items", "events", "tags"] {
        assert_same_rows(&workspace.path("target.db"), &workspace.path("source.db"), table);
    }
    let first = summary(&workspace.path("summary.json"));
    assert_eq!(first["status"], "succeeded");
    let source_rows = count(&workspace.path("source.db"), "items")
        + count(&workspace.path("source.db"), "events")
        + count(&workspace.path("source.db"), "tags");
    assert_eq!(first["rows_read"], source_rows);
    assert_eq!(first["rows_written"], source_rows);
    assert_eq!(first["rows_skipped"], 0);
    let items = first["tables"].as_array().unwrap().iter().find(|table| table["source"] == "items").unwrap();
    assert_eq!((items["target"].as_str(), items["rows_written"].as_u64()), (Some("items"), Some(5_000)));

    workspace.sluice(&["run", job.to_str().unwrap(), "--summary-json", "again.json"]).assert_code(0);
    let second = summary(&workspace.path("again.json"));
    assert_eq!((second["status"].as_str(), second["rows_written"].as_u64()), (Some("succeeded"), Some(0)));
    assert_eq!(count(&workspace.path("target.db"), "events"), 5_000, "the keyless table got no duplicates");
}

#[test]
fn sigkill_at_any_moment_then_resume_leaves_the_target_equal_to_the_source() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 30_000);
    // Throttled so the kills land mid-copy; the keyless `events` table would show any replay.
    let slow = workspace.write(
        "slow.yaml",
        &sqlite_job("resume", "parallelism: 2\nlimits: {split_rows: 4000, batch_rows: 250, rows_per_sec: 20000}\n"),
    );
    let fast = workspace
        .write("fast.yaml", &sqlite_job("resume", "parallelism: 2\nlimits: {split_rows: 4000, batch_rows: 250}\n"));
    let target = workspace.path("target.db");
    for threshold in [2_000, 9_000, 21_000] {
        let mut child = workspace.spawn(&["run", slow.to_str().unwrap()]);
        wait_for("rows committed in the target", Duration::from_secs(60), || {
            committed_rows(&target, "resume") >= threshold
        });
        kill(&mut child);
    }
    let before = committed_rows(&target, "resume");
    assert!(before < 63_000, "the kills landed before the end ({before} rows committed)");
    workspace.sluice(&["run", fast.to_str().unwrap(), "--summary-json", "summary.json"]).assert_code(0);
    for table in ["items", "events", "tags"] {
        assert_same_rows(&target, &workspace.path("source.db"), table);
    }
    let summary = summary(&workspace.path("summary.json"));
    assert_eq!(
        summary["rows_written"].as_u64().unwrap() + before,
        30_000 + 30_000 + 6_000,
        "resumed rows plus earlier rows are the whole source"
    );
}

#[test]
fn sigkill_then_resume_into_json_lines_writes_every_row_once() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 20_000);
    let job = |limits: &str| {
        format!("name: export\nsource:\n  type: sqlite\n  path: source.db\n  tables: [items]\ntarget:\n  type: jsonl\n  path: out\nparallelism: 2\nlimits: {{split_rows: 2000, batch_rows: 200{limits}}}\n")
    };
    let slow = workspace.write("slow.yaml", &job(", rows_per_sec: 10000"));
    let fast = workspace.write("fast.yaml", &job(""));
    let mut child = workspace.spawn(&["run", slow.to_str().unwrap()]);
    let parts = workspace.path("out/items");
    let finished_parts = || {
        std::fs::read_dir(&parts)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|entry| entry.path().extension().is_some_and(|extension| extension == "jsonl"))
                    .count()
            })
            .unwrap_or(0)
    };
    wait_for("a finished part", Duration::from_secs(60), || finished_parts() >= 2);
    kill(&mut child);
    assert!(finished_parts() < 10, "killed mid-copy");
    workspace.sluice(&["run", fast.to_str().unwrap()]).assert_code(0);
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(&parts).unwrap() {
        let path = entry.unwrap().path();
        assert!(!path.to_string_lossy().ends_with(".tmp"), "no partial file is left: {}", path.display());
        if path.extension().is_some_and(|extension| extension == "jsonl") {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let record: serde_json::Value = serde_json::from_str(line).unwrap();
                ids.push(record["id"].as_u64().unwrap());
            }
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=20_000).collect::<Vec<u64>>());
}

#[test]
fn sigterm_stops_gracefully_and_the_next_run_completes() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 20_000);
    let slow = workspace.write(
        "slow.yaml",
        &sqlite_job("graceful", "parallelism: 2\nlimits: {split_rows: 2000, batch_rows: 200, rows_per_sec: 10000}\n"),
    );
    let fast = workspace
        .write("fast.yaml", &sqlite_job("graceful", "parallelism: 2\nlimits: {split_rows: 2000, batch_rows: 200}\n"));
    let target = workspace.path("target.db");
    let child = workspace.spawn(&["run", slow.to_str().unwrap(), "--summary-json", "stopped.json"]);
    wait_for("rows committed in the target", Duration::from_secs(60), || committed_rows(&target, "graceful") >= 3_000);
    signal(&child, "TERM");
    let run = support::Run::from(child.wait_with_output().unwrap());
    run.assert_code(1);
    assert!(run.stderr.contains("stopping: finishing the batches in flight"), "{}", run.stderr);
    let stopped = summary(&workspace.path("stopped.json"));
    assert_eq!(stopped["status"], "stopped");
    assert_eq!(
        stopped["rows_written"].as_u64(),
        Some(committed_rows(&target, "graceful")),
        "the summary counts exactly what was committed"
    );
    workspace.sluice(&["run", fast.to_str().unwrap()]).assert_code(0);
    for table in ["items", "events", "tags"] {
        assert_same_rows(&target, &workspace.path("source.db"), table);
    }
}

#[test]
fn dirty_records_are_kept_counted_and_fail_the_job_past_the_limit() {
    let workspace = Workspace::new();
    let source = workspace.path("source.db");
    make_source(&source, 100);
    let connection = rusqlite::Connection::open(&source).unwrap();
    connection.execute_batch("UPDATE items SET created = 'not a date' WHERE id IN (7, 8)").unwrap();
    drop(connection);

    let strict = workspace.write("strict.yaml", &sqlite_job("strict", "errors: {max_dirty_records: 1}\n"));
    let run = workspace.sluice(&["run", strict.to_str().unwrap()]);
    run.assert_code(1);
    assert!(run.stderr.contains("2 dirty records exceed errors.max_dirty_records = 1"), "{}", run.stderr);
    assert!(run.stderr.contains("table items, key id=8"), "{}", run.stderr);

    let tolerant = workspace.write(
        "tolerant.yaml",
        &sqlite_job("tolerant", "errors: {max_dirty_records: 5}\n").replace("target.db", "tolerant.db"),
    );
    workspace.sluice(&["run", tolerant.to_str().unwrap(), "--summary-json", "summary.json"]).assert_code(0);
    let summary = summary(&workspace.path("summary.json"));
    assert_eq!(
        (summary["rows_read"].as_u64(), summary["rows_written"].as_u64(), summary["rows_skipped"].as_u64()),
        (Some(220), Some(218), Some(2))
    );
    let dirty = std::fs::read_to_string(workspace.path(".sluice/tolerant/dirty.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = dirty.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["table"], "items");
    assert_eq!(records[0]["key"], "id=7");
    assert!(records[0]["reason"].as_str().unwrap().contains("column created: expected a date-time"), "{dirty}");
    assert_eq!(count(&workspace.path("tolerant.db"), "items"), 98);
}

#[test]
fn csv_export_and_import_round_trip_every_value() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 2_000);
    let export = workspace.write("export.yaml", "name: to-csv\nsource:\n  type: sqlite\n  path: source.db\ntarget:\n  type: csv\n  path: csv\nlimits: {split_rows: 500}\n");
    workspace.sluice(&["run", export.to_str().unwrap()]).assert_code(0);
    let import = workspace.write(
        "import.yaml",
        "name: from-csv\nsource:\n  type: csv\n  path: csv\ntarget:\n  type: sqlite\n  path: back.db\n",
    );
    workspace.sluice(&["run", import.to_str().unwrap()]).assert_code(0);
    for table in ["items", "events", "tags"] {
        assert_same_rows(&workspace.path("back.db"), &workspace.path("source.db"), table);
    }
}
