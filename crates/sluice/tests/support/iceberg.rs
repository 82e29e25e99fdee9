//! Iceberg tables read by independent readers: pyiceberg over the job's SQL catalog (from the
//! virtual environment `scripts/testdb install` makes, `$SLUICE_TEST_LAKE_VENV`), and the
//! stream's position as the tables' metadata records it (read with Python's own sqlite3 and json).

use std::path::Path;
use std::process::Command;

/// Rows of a table's current snapshot, sorted by the first column, as tab-separated lines with
/// `NULL` for nulls.
const ROWS: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
database, table, columns = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
catalog = SqlCatalog("lake", uri="sqlite:///" + database)
arrow = catalog.load_table(table).scan().to_arrow()
values = [arrow.column(name).to_pylist() if name in arrow.column_names else [None] * arrow.num_rows for name in columns]
for row in sorted(zip(*values), key=lambda row: row[0]):
    print("\t".join("NULL" if value is None else str(value) for value in row))
"#;

/// Every snapshot of a table: `rows sum(column) distinct(key) operation` lines, oldest first.
const SNAPSHOTS: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
database, table, key, summed = sys.argv[1:5]
loaded = SqlCatalog("lake", uri="sqlite:///" + database).load_table(table)
for snapshot in sorted(loaded.snapshots(), key=lambda snapshot: snapshot.sequence_number):
    arrow = loaded.scan(snapshot_id=snapshot.snapshot_id, selected_fields=(key, summed)).to_arrow()
    keys = arrow.column(key).to_pylist()
    total = sum(value for value in arrow.column(summed).to_pylist() if value is not None)
    print(arrow.num_rows, total, len(set(keys)), snapshot.summary.operation.value)
"#;

/// The number of data files a scan of a table's current snapshot reads.
const FILES: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
database, table = sys.argv[1], sys.argv[2]
print(len(list(SqlCatalog("lake", uri="sqlite:///" + database).load_table(table).scan().plan_files())))
"#;

/// Deletes the rows matching a filter from a table, as another writer would.
const DELETE: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
database, table, predicate = sys.argv[1], sys.argv[2], sys.argv[3]
SqlCatalog("lake", uri="sqlite:///" + database).load_table(table).delete(predicate)
"#;

/// The stream's checkpoint with the largest group among the catalog's tables.
const POSITION: &str = r#"
import json, sqlite3, sys
database, job = sys.argv[1], sys.argv[2]
best = None
try:
    rows = sqlite3.connect(database).execute("SELECT metadata_location FROM iceberg_tables").fetchall()
except sqlite3.OperationalError:
    rows = []
for (location,) in rows:
    with open(location.removeprefix("file://")) as file:
        text = json.load(file).get("properties", {}).get("sluice.stream." + job)
    if text:
        mark = json.loads(text)
        if best is None or mark["group"] > best["group"]:
            best = mark
if best and best["checkpoint"].get("position"):
    at = best["checkpoint"]["position"]["at"]
    print(at["file"].rsplit(".", 1)[1], at["position"])
"#;

fn run(python: &str, script: &str, arguments: &[&str]) -> String {
    let output = Command::new(python).arg("-c").arg(script).args(arguments).output().expect("the Iceberg reader runs");
    assert!(output.status.success(), "the Iceberg reader failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The rows of `columns` of `table` (`namespace.name`), sorted by the first, as `a\tb` lines.
pub fn rows(catalog: &Path, table: &str, columns: &[&str]) -> Vec<String> {
    run(&super::lake::python(), ROWS, &[catalog.to_str().unwrap(), table, &columns.join(",")])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Deletes the rows of `table` matching `predicate` (pyiceberg's filter syntax) with pyiceberg.
pub fn delete(catalog: &Path, table: &str, predicate: &str) {
    run(&super::lake::python(), DELETE, &[catalog.to_str().unwrap(), table, predicate]);
}

/// The data files of `table`'s current snapshot.
pub fn data_files(catalog: &Path, table: &str) -> usize {
    run(&super::lake::python(), FILES, &[catalog.to_str().unwrap(), table]).trim().parse().expect("a count")
}

/// One snapshot of a table as `snapshots` reads it.
#[derive(Debug)]
pub struct Snapshot {
    pub rows: u64,
    pub sum: i64,
    pub distinct_keys: u64,
    pub operation: String,
}

/// Every snapshot of `table`, oldest first.
pub fn snapshots(catalog: &Path, table: &str, key: &str, summed: &str) -> Vec<Snapshot> {
    run(&super::lake::python(), SNAPSHOTS, &[catalog.to_str().unwrap(), table, key, summed])
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Snapshot {
                rows: fields[0].parse().unwrap(),
                sum: fields[1].parse().unwrap(),
                distinct_keys: fields[2].parse().unwrap(),
                operation: fields[3].to_owned(),
            }
        })
        .collect()
}

/// The stream's committed position (file sequence, offset), if it committed.
pub fn stream_position(catalog: &Path, job: &str) -> Option<(u64, u64)> {
    let text = run("python3", POSITION, &[catalog.to_str().unwrap(), job]);
    let mut fields = text.split_whitespace();
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}
