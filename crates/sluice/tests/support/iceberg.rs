//! Iceberg tables read by independent readers from the virtual environment `scripts/testdb
//! install` makes (`$SLUICE_TEST_LAKE_VENV`): pyiceberg over the job's SQL catalog, and DuckDB's
//! `iceberg` extension over a table's current metadata file; and the stream's position as the
//! tables' metadata records it (read with Python's own sqlite3 and json).

use std::path::Path;
use std::process::Command;

/// Rows of a table's current snapshot, sorted by the first column, as tab-separated lines with
/// `NULL` for nulls.
const ROWS: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
name, uri, table, columns = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
arrow = SqlCatalog(name, uri=uri).load_table(table).scan().to_arrow()
values = [arrow.column(name).to_pylist() if name in arrow.column_names else [None] * arrow.num_rows for name in columns]
for row in sorted(zip(*values), key=lambda row: row[0]):
    print("\t".join("NULL" if value is None else str(value) for value in row))
"#;

/// Rows of a table's current metadata file (from a SQLite catalog) read by DuckDB, as `ROWS` prints
/// them.
const DUCKDB_ROWS: &str = r#"
import os, sqlite3, sys, duckdb
database, namespace, table, columns = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
(location,) = sqlite3.connect(database).execute(
    "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?", (namespace, table)
).fetchone()
extensions = os.path.join(os.path.dirname(duckdb.__file__), "..", "duckdb_ext", "extensions")
connection = duckdb.connect(config={"extension_directory": extensions, "autoinstall_known_extensions": False})
connection.execute("LOAD avro")
connection.execute("LOAD iceberg")
names = [column[0] for column in connection.execute("DESCRIBE SELECT * FROM iceberg_scan(?)", [location]).fetchall()]
selected = ", ".join(f'"{name}"' if name in names else "NULL" for name in columns)
rows = connection.execute(f"SELECT {selected} FROM iceberg_scan(?)", [location]).fetchall()
for row in sorted(rows, key=lambda row: row[0]):
    print("\t".join("NULL" if value is None else str(value) for value in row))
"#;

/// Every snapshot of a table: `rows sum(column) distinct(key) operation` lines, oldest first.
const SNAPSHOTS: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
name, uri, table, key, summed = sys.argv[1:6]
loaded = SqlCatalog(name, uri=uri).load_table(table)
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
name, uri, table = sys.argv[1:4]
print(len(list(SqlCatalog(name, uri=uri).load_table(table).scan().plan_files())))
"#;

/// Whether a table is in the catalog: 1 or 0.
const EXISTS: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
name, uri, table = sys.argv[1:4]
print(int(SqlCatalog(name, uri=uri).table_exists(table)))
"#;

/// Creates a table `namespace.name (id long)` of a format version, partitioned by `bucket(4, id)`,
/// as another tool would.
const CREATE_PARTITIONED: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import LongType, NestedField
name, uri, table, warehouse, version = sys.argv[1:6]
catalog = SqlCatalog(name, uri=uri, warehouse="file://" + warehouse)
catalog.create_namespace_if_not_exists(table.split(".")[0])
schema = Schema(NestedField(1, "id", LongType(), required=True))
spec = PartitionSpec(PartitionField(source_id=1, field_id=1000, transform=BucketTransform(4), name="id_bucket"))
catalog.create_table(table, schema=schema, partition_spec=spec, properties={"format-version": version})
"#;

/// The distinct partitions of a table's current data files.
const PARTITIONS: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
name, uri, table = sys.argv[1:4]
files = SqlCatalog(name, uri=uri).load_table(table).inspect.files().to_pylist()
print(len({str(file["partition"]) for file in files}))
"#;

/// Deletes the rows matching a filter from a table, as another writer would.
const DELETE: &str = r#"
import sys
from pyiceberg.catalog.sql import SqlCatalog
name, uri, table, predicate = sys.argv[1:5]
SqlCatalog(name, uri=uri).load_table(table).delete(predicate)
"#;

/// The checkpoint a SQLite catalog records for a job's stream.
const POSITION: &str = r#"
import json, sqlite3, sys
database, job = sys.argv[1], sys.argv[2]
try:
    row = sqlite3.connect(database).execute("SELECT mark FROM sluice_streams WHERE job = ?", (job,)).fetchone()
except sqlite3.OperationalError:
    row = None
if row:
    position = json.loads(row[0])["checkpoint"].get("position")
    if position:
        print(json.dumps(position["at"]))
"#;

/// A SQL catalog as pyiceberg names it: its name and its SQLAlchemy URI.
pub struct Catalog {
    pub name: String,
    pub uri: String,
}

impl Catalog {
    /// The catalog `lake` in a SQLite file.
    pub fn sqlite(path: &Path) -> Catalog {
        Catalog { name: "lake".into(), uri: format!("sqlite:///{}", path.display()) }
    }

    /// The catalog `name` in the PostgreSQL database of `url` (`postgres://…`).
    pub fn postgres(url: &str, name: &str) -> Catalog {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        Catalog { name: name.into(), uri: format!("postgresql+psycopg2://{rest}") }
    }

    fn run(&self, script: &str, arguments: &[&str]) -> String {
        let mut all = vec![self.name.as_str(), self.uri.as_str()];
        all.extend_from_slice(arguments);
        run(&super::lake::python(), script, &all)
    }
}

fn run(python: &str, script: &str, arguments: &[&str]) -> String {
    let output = Command::new(python).arg("-c").arg(script).args(arguments).output().expect("the Iceberg reader runs");
    assert!(output.status.success(), "the Iceberg reader failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The rows of `columns` of `table` (`namespace.name`), sorted by the first, as `a\tb` lines.
pub fn rows(catalog: &Catalog, table: &str, columns: &[&str]) -> Vec<String> {
    catalog.run(ROWS, &[table, &columns.join(",")]).lines().map(str::to_owned).collect()
}

/// Creates `table` (`namespace.name`, one `long` column `id`) of Iceberg format `version`,
/// partitioned by `bucket(4, id)`, with pyiceberg, its files under `warehouse`.
pub fn create_partitioned(catalog: &Catalog, table: &str, warehouse: &Path, version: u8) {
    catalog.run(CREATE_PARTITIONED, &[table, warehouse.to_str().unwrap(), &version.to_string()]);
}

/// The distinct partitions of `table`'s current data files, as pyiceberg lists them.
pub fn partitions(catalog: &Catalog, table: &str) -> usize {
    catalog.run(PARTITIONS, &[table]).trim().parse().expect("a count")
}

/// Whether `table` is in the catalog.
pub fn exists(catalog: &Catalog, table: &str) -> bool {
    catalog.run(EXISTS, &[table]).trim() == "1"
}

/// Deletes the rows of `table` matching `predicate` (pyiceberg's filter syntax) with pyiceberg.
pub fn delete(catalog: &Catalog, table: &str, predicate: &str) {
    catalog.run(DELETE, &[table, predicate]);
}

/// The data files of `table`'s current snapshot.
pub fn data_files(catalog: &Catalog, table: &str) -> usize {
    catalog.run(FILES, &[table]).trim().parse().expect("a count")
}

/// The rows of `columns` of `table` (`namespace.name`) in a SQLite catalog, read by DuckDB, as
/// `rows` prints them.
pub fn duckdb_rows(catalog: &Path, table: &str, columns: &[&str]) -> Vec<String> {
    let (namespace, name) = table.split_once('.').expect("namespace.table");
    run(&super::lake::python(), DUCKDB_ROWS, &[catalog.to_str().unwrap(), namespace, name, &columns.join(",")])
        .lines()
        .map(str::to_owned)
        .collect()
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
pub fn snapshots(catalog: &Catalog, table: &str, key: &str, summed: &str) -> Vec<Snapshot> {
    catalog
        .run(SNAPSHOTS, &[table, key, summed])
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

/// The stream's committed position in a SQLite catalog (the source's own JSON), if it committed.
fn stream_at(catalog: &Path, job: &str) -> Option<serde_json::Value> {
    serde_json::from_str(run("python3", POSITION, &[catalog.to_str().unwrap(), job]).trim()).ok()
}

/// A MySQL stream's committed position (binlog file sequence, offset), if it committed.
pub fn stream_position(catalog: &Path, job: &str) -> Option<(u64, u64)> {
    let at = stream_at(catalog, job)?;
    Some((at["file"].as_str()?.rsplit_once('.')?.1.parse().ok()?, at["position"].as_u64()?))
}

/// A PostgreSQL stream's committed WAL position, if it committed.
pub fn stream_lsn(catalog: &Path, job: &str) -> Option<u64> {
    super::postgres_source::lsn(stream_at(catalog, job)?["lsn"].as_str()?)
}
