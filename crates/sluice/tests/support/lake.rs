//! Delta tables read by an independent reader, Python's `deltalake` package, from the virtual
//! environment `scripts/testdb install` makes (`$SLUICE_TEST_LAKE_VENV`, /tmp/sluice-lake-venv);
//! and the stream's position as the Delta target's journal records it.

use std::path::Path;
use std::process::Command;

/// The reader: rows of a table at its latest version (or `version`), sorted by the first
/// column, as tab-separated lines with `NULL` for nulls.
const ROWS: &str = r#"
import sys, deltalake
path, columns = sys.argv[1], sys.argv[2].split(",")
version = int(sys.argv[3]) if len(sys.argv) > 3 else None
table = deltalake.DeltaTable(path, version=version).to_pyarrow_table()
values = [table.column(name).to_pylist() if name in table.column_names else [None] * table.num_rows for name in columns]
rows = sorted(zip(*values), key=lambda row: row[0])
for row in rows:
    print("\t".join("NULL" if value is None else str(value) for value in row))
import os
sys.stdout.flush()
os._exit(0)
"#;

/// Every version of a table: `version rows sum(column) distinct(key) operation` lines.
const VERSIONS: &str = r#"
import sys, deltalake
path, key, summed = sys.argv[1], sys.argv[2], sys.argv[3]
latest = deltalake.DeltaTable(path)
operations = {entry["version"]: entry.get("operation", "") for entry in latest.history()}
for version in range(latest.version() + 1):
    table = deltalake.DeltaTable(path, version=version).to_pyarrow_table(columns=[key, summed])
    keys = table.column(key).to_pylist()
    total = sum(value for value in table.column(summed).to_pylist() if value is not None)
    print(version, table.num_rows, total, len(set(keys)), operations.get(version, "").replace(" ", "_"))
# The package's runtime can abort while the interpreter shuts down: leave at once.
import os
sys.stdout.flush()
os._exit(0)
"#;

/// Deletes the rows matching a predicate from a table, as another writer would.
const DELETE: &str = r#"
import sys, deltalake
deltalake.DeltaTable(sys.argv[1]).delete(sys.argv[2])
import os
sys.stdout.flush()
os._exit(0)
"#;

pub fn python() -> String {
    let venv = std::env::var("SLUICE_TEST_LAKE_VENV").unwrap_or_else(|_| "/tmp/sluice-lake-venv".into());
    format!("{venv}/bin/python")
}

fn run(script: &str, arguments: &[&str]) -> String {
    let output = Command::new(python()).arg("-c").arg(script).args(arguments).output().expect("the lake reader runs");
    assert!(output.status.success(), "the lake reader failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// Whether a Delta table is at `path`.
pub fn exists(path: &Path) -> bool {
    path.join("_delta_log").is_dir()
        && std::fs::read_dir(path.join("_delta_log")).is_ok_and(|mut entries| entries.next().is_some())
}

/// The rows of `columns`, sorted by the first, as `a\tb` lines.
pub fn rows(path: &Path, columns: &[&str]) -> Vec<String> {
    run(ROWS, &[path.to_str().unwrap(), &columns.join(",")]).lines().map(str::to_owned).collect()
}

/// Deletes the rows of the table at `path` that match `predicate` (SQL: `id = 3`), as a writer
/// other than sluice.
pub fn delete(path: &Path, predicate: &str) {
    run(DELETE, &[path.to_str().unwrap(), predicate]);
}

/// One version of a table as the reader sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub version: u64,
    pub rows: u64,
    pub sum: i64,
    pub distinct_keys: u64,
    pub operation: String,
}

/// Every version of a table, with its row count, the sum of `summed` and its distinct keys.
pub fn versions(path: &Path, key: &str, summed: &str) -> Vec<Version> {
    run(VERSIONS, &[path.to_str().unwrap(), key, summed])
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Version {
                version: fields[0].parse().unwrap(),
                rows: fields[1].parse().unwrap(),
                sum: fields[2].parse().unwrap(),
                distinct_keys: fields[3].parse().unwrap(),
                operation: fields.get(4).unwrap_or(&"").to_string(),
            }
        })
        .collect()
}

/// The source position of the stream's last commit in the journal of `job` under the target
/// `path`.
fn stream_at(path: &Path, job: &str) -> Option<serde_json::Value> {
    let directory = path.join(".sluice").join(job).join("stream");
    let last = std::fs::read_dir(&directory)
        .ok()?
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_suffix(".json")?.parse::<u64>().ok())
        .max()?;
    let text = std::fs::read_to_string(directory.join(format!("{last}.json"))).ok()?;
    let mut entry: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(entry["checkpoint"]["position"]["at"].take())
}

/// Every version of the accounts table at `path` (`id`, `balance`), after asserting that there
/// are more than `at_least` and that each is a state the source had: `accounts` rows, each key
/// once, the balances summing to `total` (no transfer half-applied, no copy half-published).
pub fn accounts_versions(path: &Path, at_least: usize, accounts: u64, total: i64) -> Vec<Version> {
    let versions = versions(path, "id", "balance");
    assert!(versions.len() > at_least, "{versions:?}");
    for version in &versions {
        assert_eq!(
            (version.rows, version.distinct_keys, version.sum),
            (accounts, accounts, total),
            "version {} of accounts is not a state the source had: {versions:?}",
            version.version
        );
    }
    versions
}

/// The stream's committed MySQL position (file sequence, offset) in the journal of `job` under
/// the target `path`.
pub fn stream_position(path: &Path, job: &str) -> Option<(u64, u64)> {
    let at = stream_at(path, job)?;
    let file = at["file"].as_str()?;
    Some((file.rsplit('.').next()?.parse().ok()?, at["position"].as_u64()?))
}

/// The stream's committed PostgreSQL WAL position in the journal of `job` under the target `path`.
pub fn stream_lsn(path: &Path, job: &str) -> Option<u64> {
    super::postgres_source::lsn(stream_at(path, job)?["lsn"].as_str()?)
}

/// The versions the Delta log of the table at `path` holds (`_delta_log/NNN.json`).
pub fn log_versions(path: &Path) -> usize {
    std::fs::read_dir(path.join("_delta_log"))
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok())
                .filter(|entry| {
                    entry
                        .file_name()
                        .to_str()
                        .and_then(|name| name.strip_suffix(".json"))
                        .is_some_and(|number| !number.is_empty() && number.bytes().all(|byte| byte.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Commits the job's copy tasks and stream made so far (a measure of progress).
pub fn commits(path: &Path, job: &str) -> u64 {
    let root = path.join(".sluice").join(job);
    let numbers = |directory: &Path| -> u64 {
        std::fs::read_dir(directory)
            .map(|entries| {
                entries
                    .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_suffix(".json")?.parse::<u64>().ok())
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    };
    let tasks: u64 = std::fs::read_dir(root.join("tasks"))
        .map(|entries| entries.filter_map(|entry| entry.ok()).map(|entry| numbers(&entry.path())).sum())
        .unwrap_or(0);
    tasks + numbers(&root.join("stream"))
}
