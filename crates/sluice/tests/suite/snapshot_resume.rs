//! SIGKILL a MySQL snapshot at several moments, run it again, and find the target exactly equal
//! to the source: no row lost, none duplicated, including a composite string key whose order
//! exists only in its case-insensitive collation.

use crate::support;

use std::time::Duration;

use support::{kill, mariadb, mysql_url, postgres_url, psql, unique_name, wait_for, Run, Workspace};

const ROWS: u64 = 30_000;
const KEYED_ROWS: u64 = 3_000;

/// `numbers` (integer key, range splits) and `words` (composite key of a case-insensitive string
/// with trailing spaces and an integer: one keyset-paginated split).
fn create_source(database: &str) {
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE numbers (id BIGINT PRIMARY KEY, v BIGINT NOT NULL, note VARCHAR(40));
         INSERT INTO numbers SELECT seq, seq * 7, CONCAT('row ', seq) FROM seq_1_to_{ROWS};
         CREATE TABLE words (w VARCHAR(20) COLLATE utf8mb4_general_ci NOT NULL, n INT NOT NULL, PRIMARY KEY (w, n));
         INSERT INTO words SELECT CONCAT(IF(seq % 2 = 0, UPPER(CHAR(97 + seq % 26)), CHAR(97 + seq % 26)),
                                         CHAR(97 + (seq DIV 26) % 26), REPEAT(' ', seq % 3)), seq
                           FROM seq_1_to_{KEYED_ROWS};"
    ));
}

/// Rows committed by the job in the target, from its checkpoint table.
fn committed(target: &str, job: &str) -> u64 {
    let sql = format!("SELECT coalesce(sum(rows_written), 0) FROM sluice.checkpoints WHERE job = '{job}'");
    let text = if target == "postgres" {
        // The checkpoint table appears with the first run's prepare.
        let exists = psql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sluice'");
        if exists.trim() == "0" {
            return 0;
        }
        psql(&sql)
    } else {
        let exists = mariadb("SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'sluice'");
        if exists.trim() == "0" {
            return 0;
        }
        mariadb(&sql)
    };
    text.trim().parse().unwrap_or(0)
}

fn resumes_exactly(target: &str) {
    let database = unique_name("resume");
    create_source(&database);
    let copy = format!("{database}_{target}");
    let job_name = copy.replace('_', "-");
    let workspace = Workspace::new();
    let job = |limits: &str| {
        format!(
            "name: {job_name}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {copy}\nparallelism: 3\nlimits: {{split_rows: 1000, batch_rows: 250{limits}}}\n"
        )
    };
    let slow = workspace.write("slow.yaml", &job(", rows_per_sec: 15000"));
    let fast = workspace.write("fast.yaml", &job(""));
    let target_url = if target == "postgres" { postgres_url() } else { mysql_url() };
    for threshold in [1_500, 8_000, 20_000] {
        let mut child = workspace
            .command(&["run", slow.to_str().unwrap()])
            .env("SOURCE", mysql_url())
            .env("TARGET", &target_url)
            .spawn()
            .unwrap();
        wait_for("rows committed in the target", Duration::from_secs(60), || committed(target, &job_name) >= threshold);
        kill(&mut child);
    }
    let before = committed(target, &job_name);
    assert!(before < ROWS + KEYED_ROWS, "the kills landed mid-copy ({before} rows committed)");
    // PostgreSQL builds a created table's primary key once its rows are in, so a copy cut short
    // left both tables without one; the run that completes the copy builds them.
    let primary_keys = || {
        psql(&format!(
            "SELECT conrelid::regclass::text || ':' || pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE contype = 'p' AND connamespace = '{copy}'::regnamespace ORDER BY 1"
        ))
    };
    if target == "postgres" {
        assert_eq!(primary_keys().trim(), "", "no primary key while the copy is cut short");
    }
    let run = Run::from(
        workspace
            .command(&["run", fast.to_str().unwrap()])
            .env("SOURCE", mysql_url())
            .env("TARGET", &target_url)
            .output()
            .unwrap(),
    );
    run.assert_code(0);

    let (numbers, words) = if target == "postgres" {
        (
            psql(&format!("SELECT count(*), count(DISTINCT id), sum(v), min(id), max(id) FROM {copy}.numbers")),
            psql(&format!("SELECT w || '|' || n FROM {copy}.words ORDER BY n")),
        )
    } else {
        (
            mariadb(&format!(
                "SELECT CONCAT_WS('|', count(*), count(DISTINCT id), sum(v), min(id), max(id)) FROM {copy}.numbers"
            )),
            mariadb(&format!("SELECT CONCAT(w, '|', n) FROM {copy}.words ORDER BY n")),
        )
    };
    assert_eq!(numbers.trim(), format!("{ROWS}|{ROWS}|{}|1|{ROWS}", 7 * ROWS * (ROWS + 1) / 2));
    if target == "postgres" {
        assert_eq!(
            primary_keys().trim(),
            format!("{copy}.numbers:PRIMARY KEY (id)\n{copy}.words:PRIMARY KEY (w, n)"),
            "the completed copy built each table's primary key"
        );
    }
    let expected_words = mariadb(&format!("SELECT CONCAT(w, '|', n) FROM {database}.words ORDER BY n"));
    assert!(
        words == expected_words,
        "the composite-key table differs ({} vs {} bytes)",
        words.len(),
        expected_words.len()
    );
    assert_eq!(committed(target, &job_name), ROWS + KEYED_ROWS, "the checkpoints account for every row exactly once");
    // Both tables were cut into several splits: integer ranges, and sampled string-key ranges.
    let state = rusqlite::Connection::open(workspace.path(".sluice/state.db")).unwrap();
    let plan: String = state.query_row("SELECT plan FROM plans WHERE job = ?1", [&job_name], |row| row.get(0)).unwrap();
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    for table in plan["tables"].as_array().unwrap() {
        let splits = table["splits"].as_array().unwrap().len();
        assert!(splits >= 3, "{} has {splits} splits", table["target"]);
    }
}

#[test]
fn a_mysql_snapshot_into_postgres_killed_three_times_resumes_exactly() {
    resumes_exactly("postgres");
}

#[test]
fn a_mysql_snapshot_into_mysql_killed_three_times_resumes_exactly() {
    resumes_exactly("mysql");
}
