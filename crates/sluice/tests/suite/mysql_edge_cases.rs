//! MySQL tables at the edges: no primary key, empty, identifiers that need quoting, a 16 MB BLOB.

use crate::support;

use support::stream_job::StreamJob;
use support::{mariadb, mysql_url, postgres_url, psql, signal, unique_name, Run, Workspace};

fn run(workspace: &Workspace, name: &str, database: &str, tables: &str, target: &str) -> Run {
    let target_url = if target == "postgres" { postgres_url() } else { mysql_url() };
    let job = workspace.write(
        &format!("{name}.yaml"),
        &format!(
            "name: {name}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: {tables}\ntarget:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {database}_{name}\n"
        ),
    );
    Run::from(
        workspace
            .command(&["run", job.to_str().unwrap(), "--summary-json", &format!("{name}.json")])
            .env("SOURCE", mysql_url())
            .env("TARGET", target_url)
            .output()
            .unwrap(),
    )
}

#[test]
fn a_unique_not_null_key_stands_in_for_a_missing_primary_key_and_keyless_tables_copy_whole() {
    let database = unique_name("keys");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE keyless (a INT, b TEXT); INSERT INTO keyless VALUES (1, 'x'), (1, 'x');
         CREATE TABLE unique_key (code VARCHAR(10) NOT NULL, v INT, UNIQUE KEY (code)); INSERT INTO unique_key VALUES ('b', 2), ('a', 1);"
    ));
    let workspace = Workspace::new();
    run(&workspace, "unique", &database, &format!("[\"{database}.*\"]"), "postgres").assert_code(0);
    assert_eq!(psql(&format!("SELECT code || v FROM {database}_unique.unique_key ORDER BY code")), "a1\nb2\n");
    assert_eq!(psql(&format!("SELECT a || b FROM {database}_unique.keyless")), "1x\n1x\n");
}

#[test]
fn an_empty_table_is_created_and_copied_as_empty() {
    let database = unique_name("empty");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.nothing (id INT PRIMARY KEY, v VARCHAR(5))"));
    let workspace = Workspace::new();
    for target in ["postgres", "mysql"] {
        run(&workspace, target, &database, &format!("[\"{database}.nothing\"]"), target).assert_code(0);
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(workspace.path(&format!("{target}.json"))).unwrap()).unwrap();
        assert_eq!((summary["status"].as_str(), summary["rows_written"].as_u64()), (Some("succeeded"), Some(0)));
    }
    assert_eq!(psql(&format!("SELECT count(*) FROM {database}_postgres.nothing")), "0\n");
    assert_eq!(mariadb(&format!("SELECT count(*) FROM {database}_mysql.nothing")), "0\n");
}

#[test]
fn identifiers_that_need_quoting_are_copied_exactly() {
    let database = unique_name("names");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE `order` (`select` INT PRIMARY KEY, `a``b` TEXT, `q\"'` TEXT, `two words` TEXT, `café;--` TEXT, `x/*y*/` TEXT);
         INSERT INTO `order` VALUES (1, 'backtick', 'quotes', 'space', 'unicode', 'comment');
         CREATE TABLE `Mixed Case` (`Id` INT PRIMARY KEY); INSERT INTO `Mixed Case` VALUES (7);"
    ));
    let workspace = Workspace::new();
    run(&workspace, "pg", &database, &format!("[\"{database}.*\"]"), "postgres").assert_code(0);
    assert_eq!(
        psql(&format!("SELECT \"select\", \"a`b\", \"q\"\"'\", \"two words\", \"café;--\", \"x/*y*/\" FROM {database}_pg.\"order\"")),
        "1|backtick|quotes|space|unicode|comment\n"
    );
    assert_eq!(psql(&format!("SELECT \"Id\" FROM {database}_pg.\"Mixed Case\"")), "7\n");
    run(&workspace, "my", &database, &format!("[\"{database}.*\"]"), "mysql").assert_code(0);
    assert_eq!(
        mariadb(&format!(
            "SELECT `select`, `a``b`, `q\"'`, `two words`, `café;--`, `x/*y*/` FROM {database}_my.`order`"
        )),
        "1\tbacktick\tquotes\tspace\tunicode\tcomment\n"
    );
}

#[test]
fn a_16_megabyte_blob_arrives_whole() {
    let database = unique_name("blob");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.files (id INT PRIMARY KEY, body LONGBLOB);
         INSERT INTO {database}.files VALUES (1, REPEAT(UNHEX('00FF7F80'), 4 * 1024 * 1024)), (2, '');"
    ));
    let workspace = Workspace::new();
    let source = mariadb(&format!("SELECT id, LENGTH(body), MD5(body) FROM {database}.files ORDER BY id"));
    assert!(source.starts_with("1\t16777216\t"), "{source}");
    run(&workspace, "pg", &database, &format!("[\"{database}.*\"]"), "postgres").assert_code(0);
    assert_eq!(
        psql(&format!(
            "SELECT id || E'\\t' || length(body) || E'\\t' || md5(body) FROM {database}_pg.files ORDER BY id"
        )),
        source
    );
    run(&workspace, "my", &database, &format!("[\"{database}.*\"]"), "mysql").assert_code(0);
    assert_eq!(mariadb(&format!("SELECT id, LENGTH(body), MD5(body) FROM {database}_my.files ORDER BY id")), source);
}

#[test]
fn secondary_indexes_are_built_after_the_rows_are_in() {
    let database = unique_name("indexes");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE people (id INT PRIMARY KEY, email VARCHAR(80) NOT NULL, city VARCHAR(40), born DATE,
                              bio TEXT, UNIQUE KEY email_unique (email), KEY city_born (city, born), KEY bio_prefix (bio(10)));
         INSERT INTO people VALUES (1, 'a@x', 'Lisboa', '1990-01-01', 'a'), (2, 'b@x', 'Lisboa', '1991-01-01', 'b');"
    ));
    let workspace = Workspace::new();
    run(&workspace, "pg", &database, &format!("[\"{database}.people\"]"), "postgres").assert_code(0);
    assert_eq!(
        psql(&format!("SELECT indexdef FROM pg_indexes WHERE schemaname = '{database}_pg' ORDER BY indexname")),
        format!(
            "CREATE INDEX people_city_born ON {database}_pg.people USING btree (city, born)\n\
             CREATE UNIQUE INDEX people_email_unique ON {database}_pg.people USING btree (email)\n\
             CREATE UNIQUE INDEX people_pkey ON {database}_pg.people USING btree (id)\n"
        )
    );
    run(&workspace, "my", &database, &format!("[\"{database}.people\"]"), "mysql").assert_code(0);
    assert_eq!(
        mariadb(&format!(
            "SELECT INDEX_NAME, NON_UNIQUE, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) FROM information_schema.STATISTICS
             WHERE TABLE_SCHEMA = '{database}_my' GROUP BY INDEX_NAME, NON_UNIQUE ORDER BY INDEX_NAME"
        )),
        "city_born\t1\tcity,born\nemail_unique\t0\temail\nPRIMARY\t0\tid\n"
    );
}

#[test]
fn rows_a_target_refuses_become_dirty_records_and_the_rest_of_their_batch_lands() {
    let database = unique_name("refused");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT NOT NULL);
         INSERT INTO {database}.t SELECT seq, seq FROM {database}.seq_1_to_1000;"
    ));
    // Existing target tables that refuse v > 990: ten rows inside one batch of a thousand.
    psql(&format!("CREATE SCHEMA {database}_pg; CREATE TABLE {database}_pg.t (id int PRIMARY KEY, v int NOT NULL CHECK (v <= 990))"));
    mariadb(&format!("CREATE DATABASE {database}_my; CREATE TABLE {database}_my.t (id INT PRIMARY KEY, v INT NOT NULL CHECK (v <= 990))"));
    let workspace = Workspace::new();
    for (name, target) in [("pg", "postgres"), ("my", "mysql")] {
        let target_url = if target == "postgres" { postgres_url() } else { mysql_url() };
        let job = workspace.write(
            &format!("{name}.yaml"),
            &format!(
                "name: refused-{name}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.t\"]\ntarget:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {database}_{name}\n  create_tables: false\nlimits: {{batch_rows: 1000}}\nerrors: {{max_dirty_records: 10}}\n"
            ),
        );
        let run = Run::from(
            workspace
                .command(&["run", job.to_str().unwrap(), "--summary-json", &format!("{name}.json")])
                .env("SOURCE", mysql_url())
                .env("TARGET", target_url)
                .output()
                .unwrap(),
        );
        run.assert_code(0);
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(workspace.path(&format!("{name}.json"))).unwrap()).unwrap();
        assert_eq!(
            (summary["rows_written"].as_u64(), summary["rows_skipped"].as_u64()),
            (Some(990), Some(10)),
            "{target}"
        );
        let dirty = std::fs::read_to_string(workspace.path(&format!(".sluice/refused-{name}/dirty.jsonl"))).unwrap();
        assert_eq!(dirty.lines().count(), 10, "{target}: {dirty}");
        assert!(dirty.contains("\"key\":\"id=991\""), "{target}: {dirty}");
    }
    assert_eq!(psql(&format!("SELECT count(*), max(v) FROM {database}_pg.t")), "990|990\n");
    assert_eq!(mariadb(&format!("SELECT count(*), max(v) FROM {database}_my.t")), "990\t990\n");
}

/// A change of the stream that a MySQL target refuses (a CHECK of a table made by hand) is left
/// out as a dirty record while the rows around it, of its own transaction too, land; a later
/// change of its key applies on top of what the target has.
#[test]
fn changes_a_mysql_target_refuses_are_left_out_of_the_stream_as_dirty_records() {
    let database = unique_name("refusedcdc");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT NOT NULL);
         CREATE DATABASE {database}_my; CREATE TABLE {database}_my.t (id INT PRIMARY KEY, v INT NOT NULL CHECK (v <= 990))"
    ));
    let options = format!("  namespace: {database}_my\n  create_tables: false\n");
    let job = StreamJob::new("cdc", &database, "mysql", &options, "max_dirty_records: 5");
    let mut child = job.start();
    mariadb(&format!("USE {database}; INSERT INTO t VALUES (1, 1), (2, 991), (3, 3); INSERT INTO t VALUES (4, 4)"));
    job.wait_converged(&mut child);
    let target = || mariadb(&format!("SELECT id, v FROM {database}_my.t ORDER BY id"));
    assert_eq!(target(), "1\t1\n3\t3\n4\t4\n");
    mariadb(&format!("UPDATE {database}.t SET v = 2 WHERE id = 2"));
    job.wait_converged(&mut child);
    assert_eq!(target(), "1\t1\n2\t2\n3\t3\n4\t4\n");
    let child = child.into_inner();
    signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let dirty = job.dirty();
    let [record] = dirty.as_slice() else { panic!("{dirty:?}") };
    assert_eq!(
        (record["table"].as_str(), record["key"].as_str()),
        (Some(format!("{database}_my.t").as_str()), Some("id=2"))
    );
    assert!(record["reason"].as_str().is_some_and(|reason| reason.contains("CONSTRAINT")), "{record}");
    assert!(record["change"]["position"]["file"].is_string(), "{record}");
}

#[test]
fn collations_carry_into_mysql_so_case_sensitive_keys_stay_distinct() {
    let database = unique_name("collated");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE words (w VARCHAR(10) COLLATE utf8mb4_bin PRIMARY KEY, l VARCHAR(10) CHARACTER SET latin1 COLLATE latin1_swedish_ci,
                             e ENUM('x','y') COLLATE utf8mb4_unicode_ci);
         INSERT INTO words VALUES ('a', 'é', 'x'), ('A', 'É', 'y'), ('b', NULL, NULL);"
    ));
    let workspace = Workspace::new();
    run(&workspace, "my", &database, &format!("[\"{database}.words\"]"), "mysql").assert_code(0);
    let collations = |schema: &str| {
        mariadb(&format!(
            "SELECT COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = '{schema}' AND TABLE_NAME = 'words' ORDER BY ORDINAL_POSITION"
        ))
    };
    assert_eq!(collations(&format!("{database}_my")), collations(&database));
    assert_eq!(
        mariadb(&format!("SELECT w, l FROM {database}_my.words ORDER BY w")),
        mariadb(&format!("SELECT w, l FROM {database}.words ORDER BY w"))
    );
}

/// A column dropped while its table is copied: the copy's next read fails naming the column, with
/// the hint that the table changed since its copy was planned and how to copy it again; a run
/// with `--restart` then copies every row in the table's shape now.
#[test]
fn a_column_dropped_during_the_copy_stops_it_naming_the_column_and_a_restart_copies_the_table_again() {
    let database = unique_name("dropped");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, a INT, b VARCHAR(10));
         INSERT INTO {database}.t SELECT seq, seq, 'x' FROM {database}.seq_1_to_20000;"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "dropped.yaml",
        &format!(
            "name: dropped\nmode: snapshot\nsource: {{type: mysql, url: \"${{SOURCE}}\", tables: [\"{database}.t\"]}}\n\
             target: {{type: postgres, url: \"${{TARGET}}\", namespace: {database}}}\n\
             limits: {{batch_rows: 100, split_rows: 1000, rows_per_sec: 4000}}\n"
        ),
    );
    let child = workspace.start_run(&job, &mysql_url(), &postgres_url(), &[]);
    let copied = || psql(&format!("SELECT count(*) FROM {database}.t")).trim().parse::<u64>().unwrap_or(0);
    support::wait_for("the first rows in the target", std::time::Duration::from_secs(60), || {
        psql(&format!("SELECT to_regclass('{database}.t') IS NOT NULL")).trim() == "t" && copied() > 0
    });
    mariadb(&format!("ALTER TABLE {database}.t DROP COLUMN b"));
    let output = child.into_inner().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(copied() < 20_000, "the copy ended before the column was dropped: {stderr}");
    assert!(stderr.contains("Unknown column 'b'") && stderr.contains(&format!("table {database}.t")), "{stderr}");
    assert!(stderr.contains("changed since its copy was planned") && stderr.contains("--restart"), "{stderr}");
    let again = Run::from(
        workspace
            .command(&["run", job.to_str().unwrap(), "--restart"])
            .env("SOURCE", mysql_url())
            .env("TARGET", postgres_url())
            .output()
            .unwrap(),
    );
    again.assert_code(0);
    assert_eq!(psql(&format!("SELECT count(*), sum(a) FROM {database}.t")), "20000|200010000\n");
}
