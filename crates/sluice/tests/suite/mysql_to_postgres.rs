//! MySQL/MariaDB into PostgreSQL through the real binary and real servers.

use crate::support;

use std::time::Duration;

use support::stream_job::StreamJob;
use support::workload::rows;
use support::{canary, mariadb, mysql_url, postgres_url, psql, signal, unique_name, wait_for, Run, Workspace};

#[test]
fn a_mysql_snapshot_lands_in_postgres_value_for_value_and_resumes_without_duplicates() {
    let database = unique_name("shop");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE orders (id BIGINT UNSIGNED PRIMARY KEY, amount DECIMAL(65,30), note VARCHAR(50) CHARACTER SET latin1,
             created DATETIME(6), ts TIMESTAMP(3) NULL, t TIME(6), y YEAR, b BIT(10), e ENUM('a','b'), s SET('x','y'),
             bin VARBINARY(10), f FLOAT, d DOUBLE, flag TINYINT(1), emoji VARCHAR(20) CHARACTER SET utf8mb4);
         INSERT INTO orders VALUES
           (18446744073709551615, '12345678901234567890123456789012345.123456789012345678901234567890', 'café',
            '2024-01-02 03:04:05.000006', '2038-01-19 03:14:07.999', '-838:59:59', 2155, b'1010101010', 'b', 'x,y',
            0x00FF, 0.1, 0.1, 1, '😀𠀀'),
           (1, NULL, '', '1000-01-01 00:00:00', NULL, '00:00:00', 1901, b'0', 'a', '', '', -1e38, 1e308, 0, NULL);
         CREATE TABLE `we\"ird name` (k VARCHAR(10) COLLATE utf8mb4_general_ci, n INT, PRIMARY KEY (k, n));
         INSERT INTO `we\"ird name` VALUES ('a ', 1), ('B', 1), ('b', 2);
         CREATE TABLE numbers (id INT PRIMARY KEY, v INT);
         INSERT INTO numbers SELECT seq, seq * 2 FROM seq_1_to_5000;"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!("name: m2p\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\nlimits: {{split_rows: 1000, batch_rows: 300}}\n"),
    );
    let run = |summary: &str| {
        Run::from(
            workspace
                .command(&["run", job.to_str().unwrap(), "--summary-json", summary])
                .env("SOURCE", mysql_url())
                .env("TARGET", postgres_url())
                .output()
                .unwrap(),
        )
    };
    let first = run("first.json");
    first.assert_code(0);
    assert!(!first.all().contains(&canary()));
    let rows = psql(&format!("SELECT id, amount, note, created, ts, t, y, b, e, s, bin, f, d, flag, emoji FROM {database}.orders ORDER BY id"));
    assert_eq!(
        rows,
        "1|||1000-01-01 00:00:00||00:00:00|1901|0000000000|a||\\x|-1e+38|1e+308|0|\n\
         18446744073709551615|12345678901234567890123456789012345.123456789012345678901234567890|café|2024-01-02 03:04:05.000006|2038-01-19 03:14:07.999+00|-838:59:59|2155|1010101010|b|x,y|\\x00ff|0.1|0.1|1|😀𠀀\n"
    );
    assert_eq!(
        psql(&format!("SELECT k || '|' || n FROM {database}.\"we\"\"ird name\" ORDER BY n, k")),
        "B|1\na |1\nb|2\n"
    );
    assert_eq!(psql(&format!("SELECT count(*), sum(v) FROM {database}.numbers")), "5000|25005000\n");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workspace.path("first.json")).unwrap()).unwrap();
    assert_eq!(summary["rows_written"], 5_005);
    let position = &summary["source_position"];
    assert_eq!(position["flavor"], "mariadb", "the snapshot records where a change stream continues: {position}");
    assert!(
        position["file"].as_str().is_some_and(|file| !file.is_empty()) && position["position"].as_u64().is_some(),
        "{position}"
    );

    let again = run("second.json");
    again.assert_code(0);
    assert_eq!(psql(&format!("SELECT count(*) FROM {database}.numbers")), "5000\n");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workspace.path("second.json")).unwrap()).unwrap();
    assert_eq!(summary["rows_written"], 0);
}

/// Rows of `database.table` with these ids, as `rows` renders them (`id|note|day`).
fn with_ids(side: &str, table: &str, ids: &[i64]) -> Vec<String> {
    let all = rows(side, table, &["id", "note", "day"]);
    all.into_iter().filter(|row| ids.iter().any(|id| row.starts_with(&format!("{id}|")))).collect()
}

/// Changes whose new rows PostgreSQL cannot hold (zero dates under `zero_dates: reject`, a NUL
/// byte in text, inserted or updated in place, a date MariaDB took with ALLOW_INVALID_DATES) are
/// left out as dirty records,
/// within the budget, while the stream goes on: the good changes around them, a later change of
/// a key left out, a row the copy left out and changed since, and a table created after them all
/// arrive. The records show position, key and both images; `sluice replay` writes the rows as
/// the source has them now, and forgets the records it wrote.
#[test]
fn changes_postgres_cannot_hold_become_dirty_records_and_the_stream_goes_on() {
    let database = unique_name("dirty");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE events (id INT PRIMARY KEY, note VARCHAR(40), day DATE);
         INSERT INTO events VALUES (1, 'copied', '2024-01-01'), (7, 'copied zero', '0000-00-00');"
    ));
    let job = StreamJob::new("snapshot+cdc", &database, "postgres", "", "max_dirty_records: 10, zero_dates: reject");
    let mut child = job.start();
    mariadb(&format!(
        "USE {database}; SET SESSION sql_mode = CONCAT(@@sql_mode, ',ALLOW_INVALID_DATES');
         INSERT INTO events VALUES (2, 'good', '2024-02-02');
         INSERT INTO events VALUES (3, 'zero date', '0000-00-00');
         START TRANSACTION;
           INSERT INTO events VALUES (4, CONCAT('nul', CHAR(0), 'byte'), '2024-03-03');
           INSERT INTO events VALUES (5, 'good beside it', '2024-03-04');
         COMMIT;
         INSERT INTO events VALUES (6, 'invalid date', '2023-02-30');
         UPDATE events SET note = 'updated', day = '0000-00-00' WHERE id = 1;"
    ));
    // Applied in groups of their own: folded with the changes above, the NUL byte would never
    // reach the target.
    job.wait_converged(&mut child);
    mariadb(&format!(
        "USE {database};
         UPDATE events SET note = 'clean' WHERE id = 4;
         UPDATE events SET note = CONCAT('nul', CHAR(0), 'again') WHERE id = 2;
         UPDATE events SET day = '2024-07-07' WHERE id = 7;
         CREATE TABLE later (id INT PRIMARY KEY, v INT); INSERT INTO later VALUES (1, 10), (2, 20);"
    ));
    job.wait_converged(&mut child);
    let events = format!("{database}.events");
    assert_eq!(
        rows("postgres", &events, &["id", "note", "day"]),
        with_ids("mysql", &events, &[4, 5, 7]),
        "the good rows arrive, a later change of a key left out too; the rows left out are not in the target"
    );
    let later = format!("{database}.later");
    assert_eq!(rows("postgres", &later, &["id", "v"]), rows("mysql", &later, &["id", "v"]));

    let child = child.into_inner();
    signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains(&canary()));
    for id in [1, 2, 3, 4, 6] {
        assert!(stderr.contains(&format!("dirty record in {events} (id={id})")), "logged with table and key: {stderr}");
    }
    let summary = support::summary(&job.workspace.path("summary.json"));
    assert_eq!(summary["stream"]["dirty_records"], 5, "{summary}");
    assert_eq!(summary["dirty_records_total"], 6, "the copy's record and the stream's: {summary}");

    let dirty = job.dirty();
    let record = |id: i64| {
        dirty.iter().find(|record| record["key"] == format!("id={id}")).unwrap_or_else(|| panic!("id={id}: {dirty:?}"))
    };
    assert_eq!(dirty.len(), 6, "{dirty:?}");
    assert!(record(7)["change"].is_null(), "the copy's record: {dirty:?}");
    for (id, column) in [(1, "day"), (2, "note"), (3, "day"), (4, "note"), (6, "day")] {
        let record = record(id);
        assert_eq!(record["table"], events.as_str(), "{record}");
        assert!(record["reason"].as_str().unwrap().contains(&format!("column {column}")), "{record}");
        let change = &record["change"];
        assert!(change["position"]["file"].is_string() && change["position"]["position"].is_u64(), "{record}");
        assert_eq!(change["source"], serde_json::json!({"table": events, "key": [id]}), "{record}");
        let after: serde_json::Value = serde_json::from_str(record["record"].as_str().unwrap()).unwrap();
        assert_eq!(after["id"], id, "{record}");
    }
    assert!(record(3)["reason"].as_str().unwrap().contains("zero date '0000-00-00' cannot be stored in postgres"));
    assert!(record(6)["reason"].as_str().unwrap().contains("out of range"), "{:?}", record(6));
    assert!(record(4)["record"].as_str().unwrap().contains("\\u0000"), "{:?}", record(4));
    let before: serde_json::Value = serde_json::from_str(record(1)["change"]["before"].as_str().unwrap()).unwrap();
    assert_eq!(before, serde_json::json!({"id": 1, "note": "copied", "day": "2024-01-01"}));
    let after: serde_json::Value = serde_json::from_str(record(1)["record"].as_str().unwrap()).unwrap();
    assert_eq!(after, serde_json::json!({"id": 1, "note": "updated", "day": "0000-00-00"}));
    assert!(record(3)["change"]["before"].is_null(), "an insert has no row before it");
    // Refused by PostgreSQL itself when updated in place: the record holds both images.
    let before: serde_json::Value = serde_json::from_str(record(2)["change"]["before"].as_str().unwrap()).unwrap();
    assert_eq!(before, serde_json::json!({"id": 2, "note": "good", "day": "2024-02-02"}));
    assert!(record(2)["record"].as_str().unwrap().contains("\\u0000"), "{:?}", record(2));

    // Fixed at the source, but for one row: those are written as the source has them now, and
    // forgotten; the one still refused stays, with its reason.
    mariadb(&format!(
        "UPDATE {events} SET day = '2024-01-11' WHERE id = 1; UPDATE {events} SET day = '2024-03-13' WHERE id = 3;
         UPDATE {events} SET note = 'good again' WHERE id = 2"
    ));
    let replayed = job.replay();
    replayed.assert_code(1);
    assert!(replayed.stderr.contains(&format!("still dirty: {events} (id=6)")), "{}", replayed.stderr);
    assert!(replayed.stderr.contains("5 of 6 dirty records replayed"), "{}", replayed.stderr);
    assert_eq!(
        rows("postgres", &events, &["id", "note", "day"]),
        with_ids("mysql", &events, &[1, 2, 3, 4, 5, 7]),
        "{}",
        replayed.stderr
    );
    let dirty = job.dirty();
    assert_eq!(dirty.len(), 1, "{dirty:?}");
    assert_eq!(dirty[0]["key"], "id=6");
    mariadb(&format!("UPDATE {events} SET day = '2023-02-28' WHERE id = 6"));
    job.replay().assert_code(0);
    assert_eq!(rows("postgres", &events, &["id", "note", "day"]), rows("mysql", &events, &["id", "note", "day"]));
    assert!(job.dirty().is_empty());
}

/// Past the budget the stream stops, naming the table, the key and the column of the last
/// change it could not carry; what came before it stays applied.
#[test]
fn past_the_dirty_record_budget_the_stream_stops_naming_table_key_and_column() {
    let database = unique_name("budget");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, d DATE)"));
    let job = StreamJob::new("cdc", &database, "postgres", "", "max_dirty_records: 1");
    let mut child = job.start();
    mariadb(&format!("INSERT INTO {database}.t VALUES (1, '2024-01-01')"));
    job.wait_converged(&mut child);
    mariadb(&format!("USE {database}; INSERT INTO t VALUES (2, '0000-00-00'); INSERT INTO t VALUES (3, '0000-00-00')"));
    wait_for("the job to stop", Duration::from_secs(60), || child.try_wait().unwrap().is_some());
    let output = child.into_inner().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "2 dirty records exceed errors.max_dirty_records = 1; the last: table {database}.t, key id=3: column d: zero date"
        )),
        "{stderr}"
    );
    assert_eq!(psql(&format!("SELECT id FROM {database}.t ORDER BY id")), "1\n");
}

/// A copy of hundreds of tables builds their keys and indexes a few tables at a time: one
/// connection per table at once would take more than the target server allows (the test
/// server's `max_connections` is 200), and every table ends with its primary key and index.
#[test]
fn a_copy_of_three_hundred_tables_builds_their_keys_within_the_targets_connections() {
    const TABLES: usize = 300;
    let database = unique_name("many");
    let mut sql = format!("CREATE DATABASE {database}; USE {database};");
    for table in 0..TABLES {
        sql.push_str(&format!(
            "CREATE TABLE t{table} (id INT PRIMARY KEY, v INT, KEY by_v (v)); INSERT INTO t{table} VALUES (1, {table}), (2, {table});"
        ));
    }
    mariadb(&sql);
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        // A failure fails the run at once (refused connections would otherwise be retried).
        &format!("name: many\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\nrestart: {{max_restarts: 0}}\nretry: {{max_attempts: 1}}\n"),
    );
    workspace.run_job(&job, &mysql_url(), &postgres_url()).assert_code(0);
    let built = psql(&format!(
        "SELECT count(*) FILTER (WHERE contype = 'p'), (SELECT count(*) FROM pg_indexes WHERE schemaname = '{database}' \
         AND indexname LIKE '%by_v') FROM pg_constraint WHERE connamespace = '{database}'::regnamespace"
    ));
    assert_eq!(built.trim(), format!("{TABLES}|{TABLES}"), "every table has its primary key and its index");
    let rows = psql(&format!("SELECT sum(v) FROM {database}.t{}", TABLES - 1));
    assert_eq!(rows.trim(), format!("{}", 2 * (TABLES - 1)));
}
