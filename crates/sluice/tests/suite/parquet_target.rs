//! MySQL into Parquet: one dataset per table, typed columns, every value read back exactly.

use crate::support;

use arrow_array::cast::AsArray;
use arrow_array::types::{Date32Type, Decimal128Type, Decimal256Type, Int64Type, TimestampMicrosecondType, UInt64Type};
use arrow_array::{Array, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use support::{mariadb, mysql_url, unique_name, Run, Workspace};

/// The dataset's rows, read through its manifest (written last, it lists every whole part), with
/// no other file beside them.
fn read_dataset(directory: &std::path::Path) -> Vec<RecordBatch> {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(directory.join("_manifest.json")).expect("a manifest")).unwrap();
    let mut listed: Vec<String> =
        manifest["parts"].as_array().unwrap().iter().map(|part| part["path"].as_str().unwrap().to_owned()).collect();
    listed.sort();
    let mut files: Vec<String> = std::fs::read_dir(directory)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "_manifest.json")
        .collect();
    files.sort();
    assert_eq!(files, listed, "only the whole parts the manifest lists: {manifest:#}");
    listed
        .iter()
        .flat_map(|part| {
            let file = std::fs::File::open(directory.join(part)).unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
            reader.map(Result::unwrap).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_mysql_snapshot_lands_in_parquet_with_exact_typed_values() {
    let database = unique_name("parquet");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE t (id BIGINT UNSIGNED PRIMARY KEY, wide DECIMAL(65,30), money DECIMAL(10,2), at DATETIME(6),
                         instant TIMESTAMP(6) NULL, day DATE, span TIME(6), name VARCHAR(20), raw VARBINARY(4));
         INSERT INTO t VALUES
           (18446744073709551615, '-99999999999999999999999999999999999.999999999999999999999999999999', 1.5,
            '1000-01-01 00:00:00.000001', '2038-01-19 03:14:07.999999', '9999-12-31', '-838:59:59.000001', '😀𠀀', 0x00FF),
           (1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
         CREATE TABLE numbers (id INT PRIMARY KEY);
         INSERT INTO numbers SELECT seq FROM seq_1_to_2500;"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!("name: to-parquet\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: parquet\n  path: lake\nlimits: {{split_rows: 1000, batch_rows: 300}}\n"),
    );
    let run =
        Run::from(workspace.command(&["run", job.to_str().unwrap()]).env("SOURCE", mysql_url()).output().unwrap());
    run.assert_code(0);

    let numbers = read_dataset(&workspace.path(&format!("lake/{database}.numbers")));
    let mut ids: Vec<i32> = numbers
        .iter()
        .flat_map(|batch| batch.column(0).as_primitive::<arrow_array::types::Int32Type>().values().to_vec())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=2500).collect::<Vec<_>>(), "three splits, every row once");

    let batches = read_dataset(&workspace.path(&format!("lake/{database}.t")));
    assert_eq!(batches.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);
    let (batch, row) = batches
        .iter()
        .flat_map(|batch| (0..batch.num_rows()).map(move |row| (batch, row)))
        .find(|(batch, row)| batch.column(0).as_primitive::<UInt64Type>().value(*row) == u64::MAX)
        .expect("the u64 max row");
    let wide = batch.column(1).as_primitive::<Decimal256Type>();
    assert_eq!(wide.value_as_string(row), "-99999999999999999999999999999999999.999999999999999999999999999999");
    assert_eq!(batch.column(2).as_primitive::<Decimal128Type>().value_as_string(row), "1.50");
    // 1000-01-01 00:00:00.000001 in microseconds since the epoch.
    assert_eq!(batch.column(3).as_primitive::<TimestampMicrosecondType>().value(row), -30_610_224_000_000_000 + 1);
    assert_eq!(batch.column(4).as_primitive::<TimestampMicrosecondType>().value(row), 2_147_483_647_999_999);
    assert_eq!(batch.column(5).as_primitive::<Date32Type>().value(row), 2_932_896);
    assert_eq!(batch.column(6).as_primitive::<Int64Type>().value(row), -(838 * 3600 + 59 * 60 + 59) * 1_000_000 - 1);
    assert_eq!(batch.column(7).as_string::<i32>().value(row), "😀𠀀");
    assert_eq!(batch.column(8).as_binary::<i32>().value(row), &[0x00, 0xFF]);
    let (other, other_row) = batches
        .iter()
        .flat_map(|batch| (0..batch.num_rows()).map(move |row| (batch, row)))
        .find(|(batch, row)| batch.column(0).as_primitive::<UInt64Type>().value(*row) == 1)
        .expect("the row of NULLs");
    assert!((1..9).all(|column| other.column(column).is_null(other_row)), "NULLs stay NULL");
}

/// `sluice verify` reads a Parquet target's parts back by the job's mapped schema: every value
/// of every type equal to the source's; then rows changed at the source are named by key.
#[test]
fn verify_reads_a_parquet_target_back_and_names_the_rows_that_differ() {
    let database = unique_name("parquet_verify");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE t (id BIGINT UNSIGNED PRIMARY KEY, wide DECIMAL(65,30), money DECIMAL(10,2), at DATETIME(6),
                         instant TIMESTAMP(6) NULL, day DATE, span TIME(6), name CHAR(20), raw VARBINARY(4),
                         doc JSON, small TINYINT UNSIGNED, bits BIT(10), f FLOAT, y YEAR);
         INSERT INTO t VALUES
           (18446744073709551615, '-99999999999999999999999999999999999.999999999999999999999999999999', 1.5,
            '1000-01-01 00:00:00.000001', '2038-01-19 03:14:07.999999', '9999-12-31', '-838:59:59.000001', '😀𠀀', 0x00FF,
            '{{\"b\": 1, \"a\": [2.50, null]}}', 255, b'1010101010', 0.1, 1901),
           (1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
         CREATE TABLE numbers (id INT PRIMARY KEY, label VARCHAR(10));
         INSERT INTO numbers SELECT seq, CONCAT('n', seq) FROM seq_1_to_2500;"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!("name: verify-parquet\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: parquet\n  path: lake\nlimits: {{split_rows: 1000, batch_rows: 300}}\n"),
    );
    let verify = || {
        Run::from(
            workspace
                .command(&["verify", job.to_str().unwrap(), "--json"])
                .env("SOURCE", mysql_url())
                .output()
                .unwrap(),
        )
    };
    Run::from(workspace.command(&["run", job.to_str().unwrap()]).env("SOURCE", mysql_url()).output().unwrap())
        .assert_code(0);
    let clean = verify();
    assert_eq!(clean.code, 0, "{}", clean.all());
    let report: serde_json::Value = serde_json::from_str(&clean.stdout).unwrap();
    let counts: Vec<(u64, u64, u64)> = report["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|table| {
            let count = |field: &str| table[field].as_u64().unwrap();
            (count("rows_source"), count("rows_target"), count("chunks"))
        })
        .collect();
    assert_eq!(counts, [(2500, 2500, 3), (2, 2, 1)], "{}", clean.stdout);

    mariadb(&format!(
        "USE {database}; UPDATE t SET name = 'changed', span = '00:00:01' WHERE id = 1;
         DELETE FROM numbers WHERE id = 7; INSERT INTO numbers VALUES (2501, 'new'); UPDATE numbers SET label = 'x' WHERE id = 2000"
    ));
    let found = verify();
    assert_eq!(found.code, 1, "{}", found.all());
    let report: serde_json::Value = serde_json::from_str(&found.stdout).unwrap();
    let listed = |index: usize| -> Vec<(String, u64, Vec<String>)> {
        report["tables"][index]["differences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|difference| {
                let kind = difference["kind"].as_str().unwrap().to_owned();
                let columns = difference["columns"].as_array().unwrap().iter();
                (
                    kind,
                    difference["key"]["id"].as_u64().unwrap(),
                    columns.map(|c| c.as_str().unwrap().to_owned()).collect(),
                )
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    let names = |names: &[&str]| names.iter().map(|name| name.to_string()).collect::<Vec<_>>();
    assert_eq!(
        listed(0),
        [
            ("different".to_owned(), 2000, names(&["label"])),
            ("extra".to_owned(), 7, names(&[])),
            ("missing".to_owned(), 2501, names(&[]))
        ],
        "{}",
        found.stdout
    );
    assert_eq!(listed(1), [("different".to_owned(), 1, names(&["span", "name"]))], "{}", found.stdout);
}
