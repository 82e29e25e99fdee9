//! What an application finds on the target after a copy, against real servers: tables without a
//! key copied exactly once (with their duplicates) and streamed by their values, checkpoints that
//! hold only for the table they were written against, a job run again from scratch, and tables
//! a `cdc` job's source creates after it started.

use crate::support;

use std::time::Duration;

use support::workload::{source_position, stream_position, Client};
use support::{kill, mariadb, mysql_url, postgres_url, psql, signal, unique_name, wait_for, Guard, Run, Workspace};

/// Fails the test with the run's output when it ended.
fn still_running(child: &mut Guard) {
    if child.try_wait().unwrap().is_some() {
        let output = child.stderr_text();
        panic!("the run ended early:\n{output}");
    }
}

fn target_url(target: &str) -> String {
    if target == "postgres" {
        postgres_url()
    } else {
        mysql_url()
    }
}

/// Runs SQL on a target; the rows as the client prints them.
fn on_target(target: &str, sql: &str) -> String {
    if target == "postgres" {
        psql(sql)
    } else {
        mariadb(sql)
    }
}

fn job_file(
    workspace: &Workspace,
    name: &str,
    mode: &str,
    tables: &str,
    target: &str,
    extra: &str,
) -> std::path::PathBuf {
    job_file_with_source(workspace, name, mode, tables, "", target, extra)
}

/// A job file as `job_file` writes it, with more source options (`source_extra`: indented lines).
fn job_file_with_source(
    workspace: &Workspace,
    name: &str,
    mode: &str,
    tables: &str,
    source_extra: &str,
    target: &str,
    extra: &str,
) -> std::path::PathBuf {
    workspace.write(
        &format!("{name}.yaml"),
        &format!(
            "name: {name}\nmode: {mode}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{tables}\"]\n{source_extra}\
             target:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {namespace}\n{extra}",
            namespace = name.replace('-', "_"),
        ),
    )
}

fn run(workspace: &Workspace, job: &std::path::Path, target: &str, extra: &[&str]) -> Run {
    let mut arguments = vec!["run", job.to_str().unwrap()];
    arguments.extend_from_slice(extra);
    Run::from(
        workspace.command(&arguments).env("SOURCE", mysql_url()).env("TARGET", target_url(target)).output().unwrap(),
    )
}

/// The rows of the keyless test table as sorted text lines, the same on MariaDB and PostgreSQL.
fn keyless_rows(side: &str, table: &str) -> Vec<String> {
    let sql = if side == "postgres" {
        format!(
            "SELECT concat_ws('|', coalesce(a::text, 'NULL'), coalesce(b, 'NULL'), coalesce(d::text, 'NULL'), \
             coalesce(bits::text, 'NULL'), coalesce(e, 'NULL'), coalesce(s, 'NULL')) FROM {table}"
        )
    } else {
        format!(
            "SELECT concat_ws('|', coalesce(a, 'NULL'), coalesce(b, 'NULL'), coalesce(d, 'NULL'), \
             coalesce(lpad(bin(bits), 5, '0'), 'NULL'), coalesce(e, 'NULL'), coalesce(s, 'NULL')) FROM {table}"
        )
    };
    let mut rows: Vec<String> = on_target(side, &sql).lines().map(str::to_owned).collect();
    rows.sort();
    rows
}

const KEYLESS: &str =
    "CREATE TABLE keyless (a INT, b VARCHAR(20) CHARACTER SET latin1 COLLATE latin1_general_ci, d DATETIME(3), \
                       bits BIT(5), e ENUM('x','y'), s SET('p','q'))";

/// Inserts rows into the keyless table, many of them equal, or equal but for case; some text
/// outside ASCII in a latin1 column.
fn keyless_inserts(first: u32, count: u32) -> String {
    format!(
        "INSERT INTO keyless SELECT seq % 7, IF(seq % 5 = 0, 'é', IF(seq % 2 = 0, 'x', 'X')),          TIMESTAMP('2024-01-02 03:04:05') + INTERVAL (seq % 100 * 10 + 1) * 1000 MICROSECOND, seq % 32,          IF(seq % 3 = 0, 'x', 'y'), IF(seq % 4 = 0, 'p,q', 'q') FROM seq_{first}_to_{last};",
        last = first + count - 1
    )
}

#[test]
fn keyless_tables_copy_with_their_duplicates_and_stream_by_their_values() {
    for target in ["postgres", "mysql"] {
        let database = unique_name("keyless");
        mariadb(&format!(
            "CREATE DATABASE {database}; USE {database}; {KEYLESS};
             INSERT INTO keyless VALUES (1, 'x', '2024-01-02 03:04:05.501', b'101', 'x', 'p'), (1, 'x', '2024-01-02 03:04:05.501', b'101', 'x', 'p'),
                 (1, 'X', NULL, NULL, NULL, ''), (NULL, NULL, NULL, NULL, NULL, NULL);
             {inserts}
             CREATE TABLE unique_key (code VARCHAR(10) NOT NULL, v INT, UNIQUE KEY (code));
             INSERT INTO unique_key VALUES ('b', 2), ('a', 1);
             CREATE TABLE a_first (id INT PRIMARY KEY); INSERT INTO a_first SELECT seq FROM seq_1_to_8000;",
            inserts = keyless_inserts(0, 3000)
        ));
        let workspace = Workspace::new();
        let name = format!("{database}-{target}").replace('_', "-");
        let namespace = name.replace('-', "_");
        let job = job_file(
            &workspace,
            &name,
            "snapshot+cdc",
            &format!("{database}.*"),
            target,
            "parallelism: 1\nlimits: {batch_rows: 500, rows_per_sec: 4000}\n",
        );
        // Changes run while `a_first` is copied, after the job's snapshot began and before the
        // keyless table's copy: they are in that copy, and the stream must not apply them again.
        let mut child: Guard = workspace.start_run(&job, &mysql_url(), &target_url(target), &[]);
        wait_for("the copy to begin", Duration::from_secs(60), || support::workload::committed(target, &name) > 0);
        let mut client = Client::start(&database);
        for round in 0..20u32 {
            client.send(&keyless_inserts(10_000 + round * 10, 10));
            client.send("DELETE FROM keyless WHERE a = 3 LIMIT 1; UPDATE keyless SET e = 'y' WHERE e = 'x' LIMIT 2;");
            client.send(&format!("UPDATE unique_key SET v = v + 1 WHERE code = 'a'; INSERT INTO unique_key VALUES ('n{round}', {round});"));
            if round == 10 {
                // Before the keyless copy's position: the copy holds the truncation, and the
                // stream must not empty the copy again.
                client.send("TRUNCATE TABLE keyless;");
            }
        }
        client.finish();
        // These come once the copy is done, through the stream alone. Of two rows equal but for
        // case, the one the source deletes goes; so does a latin1 row with a non-ASCII value.
        wait_for("the stream to start", Duration::from_secs(120), || {
            still_running(&mut child);
            stream_position(target, &name).is_some()
        });
        mariadb(&format!(
            "USE {database}; DELETE FROM keyless WHERE BINARY b = 'X' AND a = 1 AND d IS NULL LIMIT 1;
             INSERT INTO keyless VALUES (1, 'x', '2024-01-02 03:04:05.501', b'101', 'x', 'p');
             UPDATE keyless SET a = 99 WHERE a IS NULL LIMIT 1;
             DELETE FROM keyless WHERE b = 'é' LIMIT 2; UPDATE keyless SET a = 98 WHERE b = 'é' LIMIT 1;"
        ));
        let source = source_position();
        wait_for("the stream to reach the source", Duration::from_secs(120), || {
            still_running(&mut child);
            stream_position(target, &name).is_some_and(|at| at >= source)
        });
        let child = child.into_inner();
        signal(&child, "TERM");
        let output = child.wait_with_output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert_eq!(output.status.code(), Some(0), "{text}");
        let expected = keyless_rows("mysql", &format!("{database}.keyless"));
        let copied = keyless_rows(target, &format!("{namespace}.keyless"));
        assert_eq!(copied.len(), expected.len(), "{target}: row count\n{text}");
        assert_eq!(copied, expected, "{target}: the keyless table");
        let unique = |side: &str, table: &str| on_target(side, &format!("SELECT code, v FROM {table} ORDER BY code"));
        assert_eq!(
            unique(target, &format!("{namespace}.unique_key")),
            unique("mysql", &format!("{database}.unique_key"))
                .replace('\t', if target == "postgres" { "|" } else { "\t" })
        );
    }
}

/// `write_mode: upsert` over tables some of which have no key: the keyed ones are upserted, the
/// keyless ones copied and streamed as multisets, and one warning names each keyless table as
/// the job names it (never the hidden copy a `snapshot+cdc` copy is written under).
#[test]
fn an_upsert_job_copies_keyless_tables_as_multisets_with_one_warning() {
    for target in ["postgres", "mysql"] {
        let database = unique_name("keyless_upsert");
        mariadb(&format!(
            "CREATE DATABASE {database}; USE {database}; CREATE TABLE keyed (id INT PRIMARY KEY, v INT);
             INSERT INTO keyed VALUES (1, 10), (2, 20);
             CREATE TABLE log (note TEXT); INSERT INTO log VALUES ('twice'), ('twice'), ('once');
             CREATE TABLE trail (note TEXT); INSERT INTO trail VALUES ('a');"
        ));
        let workspace = Workspace::new();
        let name = format!("{database}-{target}").replace('_', "-");
        let namespace = name.replace('-', "_");
        let job = job_file(&workspace, &name, "snapshot+cdc", &format!("{database}.*"), target, "");
        let job_text =
            std::fs::read_to_string(&job).unwrap().replace("  namespace:", "  write_mode: upsert\n  namespace:");
        std::fs::write(&job, job_text).unwrap();
        // The target's keyed table holds a row already: an upsert replaces it.
        let table = |name: &str| format!("{namespace}.{name}");
        let keyed = table("keyed");
        let existing = format!("CREATE TABLE {keyed} (id INT PRIMARY KEY, v INT); INSERT INTO {keyed} VALUES (1, -1)");
        if target == "postgres" {
            psql(&format!("CREATE SCHEMA {namespace}; {existing}"));
        } else {
            mariadb(&format!("CREATE DATABASE {namespace}; {existing}"));
        }
        let mut child: Guard = workspace.start_run(&job, &mysql_url(), &target_url(target), &[]);
        let count = |name: &str| {
            let found = on_target(
                target,
                &format!("SELECT count(*) FROM information_schema.tables WHERE table_schema = '{namespace}' AND table_name = '{name}'"),
            );
            if found.trim() != "1" {
                return String::new();
            }
            on_target(target, &format!("SELECT count(*) FROM {}", table(name))).trim().to_owned()
        };
        wait_for("the copy", Duration::from_secs(60), || {
            still_running(&mut child);
            count("trail") == "1" && count("log") == "3"
        });
        mariadb(&format!(
            "USE {database}; INSERT INTO log VALUES ('twice'); UPDATE keyed SET v = 21 WHERE id = 2; INSERT INTO trail VALUES ('b');"
        ));
        wait_for("the stream", Duration::from_secs(60), || {
            still_running(&mut child);
            count("log") == "4" && count("trail") == "2"
        });
        wait_for("the update", Duration::from_secs(30), || {
            let rows = on_target(target, &format!("SELECT id, v FROM {keyed} ORDER BY id"));
            let fields = rows.split(|character: char| character.is_whitespace() || character == '|');
            fields.filter(|field| !field.is_empty()).collect::<Vec<_>>() == ["1", "10", "2", "21"]
        });
        let twice = on_target(target, &format!("SELECT count(*) FROM {} WHERE note = 'twice'", table("log")));
        assert_eq!(twice.trim(), "3", "{target}: a multiset keeps equal rows");
        kill(&mut child);
        let output = child.stderr_text();
        let warning =
            format!("tables `{namespace}.log`, `{namespace}.trail` have no primary key, so write_mode: upsert");
        assert_eq!(output.matches(&warning).count(), 1, "{target}: one warning naming both:\n{output}");
        assert!(!output.contains("_sluice_copy_"), "{output}");
    }
}

/// `schema_changes: stop`: the stream applies everything before a DDL statement and stops at it,
/// naming it; the job changed to `carry` goes on from there, the statement applied.
#[test]
fn a_job_that_stops_at_schema_changes_applies_up_to_the_statement_and_goes_on_with_carry() {
    let database = unique_name("ddl_stop");
    mariadb(&format!("CREATE DATABASE {database}; USE {database}; CREATE TABLE t (id INT PRIMARY KEY, v INT); INSERT INTO t VALUES (1, 1), (2, 2);"));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let job =
        job_file(&workspace, &name, "snapshot+cdc", &format!("{database}.*"), "postgres", "schema_changes: stop\n");
    let namespace = name.replace('-', "_");
    let rows = || psql(&format!("SELECT count(*) FROM {namespace}.t")).trim().to_owned();
    let mut child: Guard = workspace.start_run(&job, &mysql_url(), &postgres_url(), &[]);
    wait_for("the copy", Duration::from_secs(60), || {
        still_running(&mut child);
        psql(&format!("SELECT to_regclass('{namespace}.t') IS NOT NULL")).trim() == "t" && rows() == "2"
    });
    mariadb(&format!("USE {database}; INSERT INTO t VALUES (3, 3)"));
    wait_for("the row before the statement", Duration::from_secs(60), || rows() == "3");
    mariadb(&format!("USE {database}; ALTER TABLE t ADD COLUMN w INT; INSERT INTO t VALUES (4, 4, 40);"));
    wait_for("the stop", Duration::from_secs(60), || child.try_wait().unwrap().is_some());
    let output = child.stderr_text();
    assert_ne!(child.try_wait().unwrap().and_then(|status| status.code()), Some(0), "{output}");
    assert!(output.contains("ALTER TABLE t ADD COLUMN w INT") && output.contains("schema_changes: stop"), "{output}");
    assert_eq!(rows(), "3", "nothing at or after the statement is applied");
    let columns = psql(&format!(
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = '{namespace}' AND table_name = 't'"
    ));
    assert_eq!(columns.trim(), "2", "the target keeps its shape");
    // The operator applies the statement to the target, and the job changed to carry goes on
    // from it (the statement finds its effect there already).
    psql(&format!("ALTER TABLE {namespace}.t ADD COLUMN w INT"));
    let text = std::fs::read_to_string(&job).unwrap().replace("schema_changes: stop", "schema_changes: carry");
    std::fs::write(&job, text).unwrap();
    let mut child: Guard = workspace.start_run(&job, &mysql_url(), &postgres_url(), &[]);
    wait_for("the statement and the row after it", Duration::from_secs(60), || {
        still_running(&mut child);
        let widened = format!(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = '{namespace}' AND table_name = 't' AND column_name = 'w'"
        );
        psql(&widened).trim() == "1" && psql(&format!("SELECT coalesce(sum(w), 0) FROM {namespace}.t")).trim() == "40"
    });
    assert_eq!(rows(), "4");
    kill(&mut child);
}

/// `schema_changes: ignore`: statements that add, drop and retype columns or empty a table are
/// passed over; rows reach the target with the columns it has, through a restart after an added
/// column (the source has it, the target not); a table the source creates is created.
#[test]
fn a_job_that_ignores_schema_changes_keeps_the_target_shape_and_every_row() {
    for target in ["postgres", "mysql"] {
        let database = unique_name(&format!("ddl_ignore_{target}"));
        mariadb(&format!(
            "CREATE DATABASE {database}; USE {database}; CREATE TABLE t (id INT PRIMARY KEY, v INT, gone INT);
             CREATE TABLE emptied (id INT PRIMARY KEY); INSERT INTO t VALUES (1, 1, 1), (2, 2, 2); INSERT INTO emptied VALUES (1);"
        ));
        let workspace = Workspace::new();
        // The target's namespace is the job's name: on a MySQL target, not the source database.
        let name = format!("{database}-copy").replace('_', "-");
        let namespace = name.replace('-', "_");
        let job =
            job_file(&workspace, &name, "snapshot+cdc", &format!("{database}.*"), target, "schema_changes: ignore\n");
        let query = |sql: &str| on_target(target, sql).replace('|', "\t").trim().to_owned();
        let rows =
            |table: &str, columns: &str| query(&format!("SELECT {columns} FROM {namespace}.{table} ORDER BY id"));
        let count = |table: &str| query(&format!("SELECT count(*) FROM {namespace}.{table}"));
        let exists = |table: &str| {
            query(&format!(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{namespace}' AND table_name = '{table}'"
            )) == "1"
        };
        let mut child: Guard = workspace.start_run(&job, &mysql_url(), &target_url(target), &[]);
        wait_for("the copy", Duration::from_secs(60), || {
            still_running(&mut child);
            exists("t") && count("t") == "2"
        });
        mariadb(&format!(
            "USE {database}; ALTER TABLE t ADD COLUMN w INT; INSERT INTO t VALUES (3, 3, 3, 30);
             TRUNCATE emptied; INSERT INTO emptied VALUES (2);"
        ));
        wait_for("the rows after the statements", Duration::from_secs(60), || {
            still_running(&mut child);
            count("t") == "3" && count("emptied") == "2"
        });
        // Stopped with a column the source has and the target not: the next run starts all the same.
        kill(&mut child);
        mariadb(&format!(
            "USE {database}; INSERT INTO t VALUES (4, 4, 4, 40); ALTER TABLE t DROP COLUMN gone;
             INSERT INTO t VALUES (5, 5, 50); ALTER TABLE t MODIFY v BIGINT; UPDATE t SET v = v + 100 WHERE id = 2;
             CREATE TABLE born (id INT PRIMARY KEY, b INT); INSERT INTO born VALUES (1, 1);"
        ));
        let mut child: Guard = workspace.start_run(&job, &mysql_url(), &target_url(target), &[]);
        wait_for("every row", Duration::from_secs(60), || {
            still_running(&mut child);
            count("t") == "5"
                && exists("born")
                && count("born") == "1"
                && query(&format!("SELECT max(v) FROM {namespace}.t")) == "102"
        });
        kill(&mut child);
        let columns = query(&format!(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = '{namespace}' AND table_name = 't' \
             ORDER BY ordinal_position"
        ));
        assert_eq!(columns.split_whitespace().collect::<Vec<_>>().join(",").to_lowercase(), "id,v,gone", "{target}");
        assert_eq!(rows("t", "id, v"), "1\t1\n2\t102\n3\t3\n4\t4\n5\t5", "{target}");
        // The column the source dropped keeps what rows written before had; a row inserted since
        // (5) has it empty; a row updated since (2) keeps it where the update is made in place
        // (PostgreSQL) and has it empty where the row is replaced (MySQL).
        let gone = rows("t", "id, gone").replace("NULL", "");
        let gone: Vec<&str> = gone.lines().map(str::trim_end).collect();
        let updated = if target == "postgres" { "2\t2" } else { "2" };
        assert_eq!(gone, ["1\t1", updated, "3\t3", "4\t4", "5"], "{target}");
        assert_eq!(rows("emptied", "id"), "1\n2", "{target}: an emptied table keeps its rows");
        let output = child.stderr_text();
        assert!(output.contains("not carried to the target (schema_changes: ignore)"), "{target}: {output}");
    }
}

/// `source.stop_position`: a `cdc` job from one binlog position to another applies the
/// transactions before the stop, ends with exit 0 at the first that reaches it, and leaves what
/// follows alone; run again, it ends at once.
#[test]
fn a_cdc_job_between_two_positions_applies_what_lies_between_and_ends() {
    let database = unique_name("bounded");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT);"));
    let position = || {
        let status = mariadb("SHOW MASTER STATUS");
        let fields: Vec<&str> = status.lines().last().unwrap().split_whitespace().collect();
        (fields[0].to_owned(), fields[1].to_owned())
    };
    // The stop mark is one byte past the binlog's end after the first transaction: that one lies
    // before it; the next (of this job or, on a busy server, another's) reaches it; the last one
    // lies after it, whatever other sessions write meanwhile.
    let (file, start) = position();
    mariadb(&format!("INSERT INTO {database}.t VALUES (1, 1)"));
    let (stop_file, after_first) = position();
    let stop = after_first.parse::<u64>().unwrap() + 1;
    mariadb(&format!("INSERT INTO {database}.t VALUES (2, 2)"));
    mariadb(&format!("INSERT INTO {database}.t VALUES (3, 3)"));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let source_extra = format!(
        "  start_position: {{file: {file}, position: {start}}}\n  stop_position: {{file: {stop_file}, position: {stop}}}\n"
    );
    let job = job_file_with_source(&workspace, &name, "cdc", &format!("{database}.*"), &source_extra, "postgres", "");
    let finished = run(&workspace, &job, "postgres", &[]);
    finished.assert_code(0);
    assert!(finished.all().contains("reached source.stop_position"), "{}", finished.all());
    let namespace = name.replace('-', "_");
    let ids = || psql(&format!("SELECT string_agg(id::text, ',' ORDER BY id) FROM {namespace}.t"));
    let applied = ids();
    assert!(matches!(applied.trim(), "1" | "1,2"), "before the mark applied, after it not: {applied}");
    run(&workspace, &job, "postgres", &[]).assert_code(0);
    assert_eq!(ids(), applied, "a second run applies nothing more");
}

/// `start_position` and `stop_position` at times: a `cdc` job gets exactly the transactions the
/// binlog dates from the first time up to (not including) the second, and ends with exit 0.
#[test]
fn a_cdc_job_between_two_times_applies_the_transactions_dated_between_them() {
    let database = unique_name("dated");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT);"));
    // The server's clock, whose seconds date its binlog: once it has passed the second it is in,
    // the second it is in then as an RFC 3339 time (what was written before is dated before it).
    let next_second = || {
        let now: u64 = mariadb("SELECT UNIX_TIMESTAMP()").trim().parse().unwrap();
        wait_for("the source's clock to pass a second", Duration::from_secs(5), || {
            mariadb("SELECT UNIX_TIMESTAMP()").trim().parse::<u64>().unwrap() > now
        });
        mariadb("SELECT DATE_FORMAT(UTC_TIMESTAMP(), '%Y-%m-%dT%H:%i:%sZ')").trim().to_owned()
    };
    mariadb(&format!("INSERT INTO {database}.t VALUES (1, 1)"));
    let start = next_second();
    mariadb(&format!("INSERT INTO {database}.t VALUES (2, 2); INSERT INTO {database}.t VALUES (3, 3);"));
    let stop = next_second();
    mariadb(&format!("INSERT INTO {database}.t VALUES (4, 4)"));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let source_extra = format!("  start_position: {{time: \"{start}\"}}\n  stop_position: {{time: \"{stop}\"}}\n");
    let job = job_file_with_source(&workspace, &name, "cdc", &format!("{database}.*"), &source_extra, "postgres", "");
    let finished = run(&workspace, &job, "postgres", &[]);
    finished.assert_code(0);
    let output = finished.all();
    assert!(
        output.contains(&format!("source.start_position {start}: the first transaction dated at or after it")),
        "{output}"
    );
    assert!(output.contains("reached source.stop_position"), "{output}");
    let namespace = name.replace('-', "_");
    let ids = || psql(&format!("SELECT string_agg(id::text, ',' ORDER BY id) FROM {namespace}.t")).trim().to_owned();
    assert_eq!(ids(), "2,3", "the transactions dated from {start} up to {stop}");
    run(&workspace, &job, "postgres", &[]).assert_code(0);
    assert_eq!(ids(), "2,3", "a second run applies nothing more");
    // A time to come cannot be resolved yet: refused, naming it.
    let future = job_file_with_source(
        &workspace,
        &format!("{name}-later"),
        "cdc",
        &format!("{database}.*"),
        "  start_position: {time: \"2999-01-01T00:00:00Z\"}\n",
        "postgres",
        "",
    );
    let refused = run(&workspace, &future, "postgres", &[]);
    assert_ne!(refused.code, 0, "{}", refused.all());
    assert!(refused.all().contains("start_position time 2999-01-01T00:00:00Z is in the future"), "{}", refused.all());
}

#[test]
fn a_keyless_copy_cut_short_is_copied_again_whole() {
    let database = unique_name("cut");
    let rows = 20_000;
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database}; CREATE TABLE bag (a INT, b VARCHAR(10));
         INSERT INTO bag SELECT seq % 10, 'same' FROM seq_1_to_{rows};"
    ));
    for target in ["postgres", "mysql"] {
        let workspace = Workspace::new();
        let name = format!("{database}-{target}").replace('_', "-");
        let namespace = name.replace('-', "_");
        let job = job_file(
            &workspace,
            &name,
            "snapshot",
            &format!("{database}.bag"),
            target,
            "limits: {batch_rows: 500, rows_per_sec: 4000}\n",
        );
        let mut child = workspace.start_run(&job, &mysql_url(), &target_url(target), &[]);
        wait_for("part of the table to be committed", Duration::from_secs(60), || {
            support::workload::committed(target, &name) > 0
        });
        kill(&mut child);
        let committed = support::workload::committed(target, &name);
        assert!(committed > 0 && committed < rows, "killed part-way: {committed} rows committed");
        run(&workspace, &job, target, &[]).assert_code(0);
        let count = on_target(target, &format!("SELECT count(*), sum(a) FROM {namespace}.bag"));
        let expected = mariadb(&format!("SELECT count(*), sum(a) FROM {database}.bag"));
        assert_eq!(count.replace('|', "\t"), expected, "{target}: every row once");
    }
}

#[test]
fn a_target_table_dropped_emptied_or_replaced_is_not_trusted_to_its_old_checkpoints() {
    let database = unique_name("bound");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database}; CREATE TABLE t (id INT PRIMARY KEY, v INT);
         INSERT INTO t SELECT seq, seq * 2 FROM seq_1_to_5000;"
    ));
    for target in ["postgres", "mysql"] {
        let workspace = Workspace::new();
        let name = format!("{database}-{target}").replace('_', "-");
        let table = format!("{}.t", name.replace('-', "_"));
        let job =
            job_file(&workspace, &name, "snapshot", &format!("{database}.t"), target, "limits: {split_rows: 1000}\n");
        let count = || on_target(target, &format!("SELECT count(*) FROM {table}"));
        run(&workspace, &job, target, &[]).assert_code(0);
        assert_eq!(count(), "5000\n");

        on_target(target, &format!("DROP TABLE {table}"));
        let again = run(&workspace, &job, target, &[]);
        again.assert_code(0);
        assert_eq!(count(), "5000\n", "{target}: a dropped table is copied again\n{}", again.stderr);
        assert!(again.stderr.contains("copied again"), "{}", again.stderr);

        let empty = if target == "postgres" { format!("TRUNCATE {table}") } else { format!("TRUNCATE TABLE {table}") };
        on_target(target, &empty);
        run(&workspace, &job, target, &[]).assert_code(0);
        assert_eq!(count(), "5000\n", "{target}: an emptied table is copied again");

        // Another table with rows of its own: the job stops and says what to do.
        let replace = format!(
            "DROP TABLE {table}; CREATE TABLE {table} (id INT PRIMARY KEY, v INT); INSERT INTO {table} VALUES (1, 1)"
        );
        on_target(target, &replace);
        let refused = run(&workspace, &job, target, &[]);
        assert_ne!(refused.code, 0, "{}", refused.all());
        assert!(refused.stderr.contains(&table) && refused.stderr.contains("--restart"), "{}", refused.stderr);
        assert_eq!(count(), "1\n", "{target}: nothing was written into the replaced table");

        let restarted = run(&workspace, &job, target, &["--restart"]);
        restarted.assert_code(0);
        assert_eq!(count(), "5000\n", "{target}: --restart copies everything again\n{}", restarted.stderr);
        assert_eq!(on_target(target, &format!("SELECT sum(v) FROM {table}")), "25005000\n");

        // `sluice reset` empties the tables and forgets the checkpoints: the next run copies all.
        let reset = Run::from(
            workspace
                .command(&["reset", job.to_str().unwrap()])
                .env("SOURCE", mysql_url())
                .env("TARGET", target_url(target))
                .output()
                .unwrap(),
        );
        reset.assert_code(0);
        assert_eq!(count(), "0\n", "{target}: reset empties the job's tables");
        run(&workspace, &job, target, &[]).assert_code(0);
        assert_eq!(count(), "5000\n", "{target}: the run after a reset copies everything");
    }
}

#[test]
fn a_cdc_job_over_no_table_yet_takes_in_the_tables_the_source_creates() {
    for target in ["postgres", "mysql"] {
        let database = unique_name("later");
        mariadb(&format!("CREATE DATABASE {database}"));
        let workspace = Workspace::new();
        let name = format!("{database}-{target}").replace('_', "-");
        let namespace = name.replace('-', "_");
        let job = job_file(&workspace, &name, "cdc", &format!("{database}.*"), target, "");
        let mut child = workspace.start_run(&job, &mysql_url(), &target_url(target), &[]);
        wait_for("the stream to start", Duration::from_secs(60), || {
            still_running(&mut child);
            stream_position(target, &name).is_some()
        });
        mariadb(&format!(
            "USE {database}; CREATE TABLE orders (id INT PRIMARY KEY, note VARCHAR(20));
             INSERT INTO orders VALUES (1, 'one'), (2, 'two'); UPDATE orders SET note = 'uno' WHERE id = 1;
             {KEYLESS}; {inserts} DELETE FROM keyless WHERE a = 2 LIMIT 1;",
            inserts = keyless_inserts(0, 20)
        ));
        let source = source_position();
        wait_for("the stream to reach the source", Duration::from_secs(60), || {
            still_running(&mut child);
            stream_position(target, &name).is_some_and(|at| at >= source)
        });
        let child = child.into_inner();
        signal(&child, "TERM");
        let output = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(0), "{text}");
        assert!(text.contains("no table matches `source.tables` yet"), "{text}");
        let orders = on_target(target, &format!("SELECT id, note FROM {namespace}.orders ORDER BY id"));
        assert_eq!(orders.replace('|', "\t"), "1\tuno\n2\ttwo\n", "{target}\n{text}");
        assert_eq!(
            keyless_rows(target, &format!("{namespace}.keyless")),
            keyless_rows("mysql", &format!("{database}.keyless")),
            "{target}"
        );
    }
}

/// `SHOW CREATE TABLE` without the table's name and its counter, for comparison.
fn show_create(table: &str) -> String {
    let text = mariadb(&format!("SHOW CREATE TABLE {table}"));
    let definition = text.split_once('\t').map_or(text.as_str(), |(_, definition)| definition);
    let definition = definition.replace("\\n", "\n");
    definition.lines().skip(1).map(str::to_owned).collect::<Vec<_>>().join("\n")
}

const RICH: &str = "CREATE TABLE rich (
    id INT(10) UNSIGNED NOT NULL AUTO_INCREMENT COMMENT 'the key',
    code CHAR(4) CHARACTER SET latin1 COLLATE latin1_bin NOT NULL DEFAULT 'ab''c',
    price DECIMAL(12,3) UNSIGNED ZEROFILL DEFAULT 1.500,
    ratio FLOAT(10,5) UNSIGNED DEFAULT NULL,
    score DOUBLE(8,2) NOT NULL DEFAULT -1.25,
    note VARCHAR(40) COLLATE utf8mb4_unicode_ci DEFAULT NULL COMMENT 'free text',
    flags SET('a','b') NOT NULL DEFAULT 'a,b',
    kind ENUM('x','y') DEFAULT 'y',
    created DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    touched TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
    small TINYINT(3) UNSIGNED ZEROFILL NOT NULL DEFAULT 7,
    PRIMARY KEY (id),
    UNIQUE KEY code_unique (code),
    KEY note_kind (note, kind),
    KEY by_price (price)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci COMMENT='rich table'";

#[test]
fn a_mysql_copy_carries_the_schema_and_applications_insert_without_an_id() {
    let database = unique_name("schema");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database}; {RICH};
         INSERT INTO rich (code, price, ratio, note) VALUES ('a', 2.5, 30.123456, 'one'), ('b', NULL, NULL, 'two'), ('c', 1, 1, NULL);
         DELETE FROM rich WHERE code = 'c';"
    ));
    let workspace = Workspace::new();
    // MySQL → MySQL: the target's table is the source's, counter included.
    let name = format!("{database}-mysql").replace('_', "-");
    let namespace = name.replace('-', "_");
    let job = job_file(&workspace, &name, "snapshot", &format!("{database}.rich"), "mysql", "");
    run(&workspace, &job, "mysql", &[]).assert_code(0);
    let source = show_create(&format!("{database}.rich"));
    let target = show_create(&format!("{namespace}.rich"));
    assert_eq!(target, source, "SHOW CREATE TABLE of the target equals the source's");
    assert!(source.contains("AUTO_INCREMENT=4"), "{source}");
    assert_eq!(
        mariadb(&format!("SELECT id, code, price, ratio FROM {namespace}.rich ORDER BY id")),
        mariadb(&format!("SELECT id, code, price, ratio FROM {database}.rich ORDER BY id"))
    );
    mariadb(&format!("INSERT INTO {namespace}.rich (code) VALUES ('new')"));
    assert_eq!(mariadb(&format!("SELECT id FROM {namespace}.rich WHERE code = 'new'")), "4\n");

    // MySQL → PostgreSQL: an identity column past the copied counter, defaults, comments.
    let name = format!("{database}-postgres").replace('_', "-");
    let namespace = name.replace('-', "_");
    let job = job_file(&workspace, &name, "snapshot", &format!("{database}.rich"), "postgres", "");
    run(&workspace, &job, "postgres", &[]).assert_code(0);
    psql(&format!("INSERT INTO {namespace}.rich (code) VALUES ('new')"));
    assert_eq!(
        psql(&format!("SELECT id, code, flags, kind, score, small FROM {namespace}.rich WHERE code = 'new'")),
        "4|new|a,b|y|-1.25|7\n"
    );
    assert_eq!(psql(&format!("SELECT col_description('{namespace}.rich'::regclass, 1)")), "the key\n");
    assert_eq!(psql(&format!("SELECT obj_description('{namespace}.rich'::regclass, 'pg_class')")), "rich table\n");
}

/// The edge table's rows as sorted text, binary values in hex.
fn edge_rows(table: &str) -> Vec<String> {
    let text = mariadb(&format!(
        "SELECT CONCAT_WS('|', IFNULL(d, 'NULL'), IFNULL(dt, 'NULL'), IFNULL(t, 'NULL'), IFNULL(y, 'NULL'), IFNULL(f, 'NULL'),
                IFNULL(g, 'NULL'), IFNULL(n, 'NULL'), IFNULL(HEX(bits), 'NULL'), IFNULL(j, 'NULL'), IFNULL(HEX(lat), 'NULL'),
                IFNULL(HEX(raw), 'NULL'), IFNULL(e, 'NULL'), IFNULL(s, 'NULL')) FROM {table}"
    ));
    let mut rows: Vec<String> = text.lines().map(str::to_owned).collect();
    rows.sort();
    rows
}

#[test]
fn keyless_edge_values_copy_and_stream_exactly_into_mysql() {
    let database = unique_name("edge");
    let row = "('0000-00-00', '2020-00-15 00:00:00.000001', '-838:59:59.000', 0, 30.12346, 1e-300, -12345678901234.123456, \
               b'1111111111111111111111111111111111111111111111111111111111111111', '{\"a\": [1, 2]}', 'ÿé', 0x00ff, 'b', 'x,y')";
    let other = "('2024-02-29', '1999-12-31 23:59:59.999999', '12:00:00.500', 2155, -0.5, 2.5, 0.000001, b'0', '[]', 'a ', '', 'a', '')";
    mariadb(&format!(
        "SET SESSION sql_mode = ''; CREATE DATABASE {database}; USE {database};
         CREATE TABLE edge (d DATE, dt DATETIME(6), t TIME(3), y YEAR, f FLOAT, g DOUBLE, n DECIMAL(20,6), bits BIT(64),
             j JSON, lat VARCHAR(10) CHARACTER SET latin1, raw VARBINARY(8), e ENUM('a','b'), s SET('x','y'));
         INSERT INTO edge VALUES {row}, {row}, {other}, (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);"
    ));
    let workspace = Workspace::new();
    let name = format!("{database}-mysql").replace('_', "-");
    let namespace = name.replace('-', "_");
    let job = job_file(&workspace, &name, "snapshot+cdc", &format!("{database}.*"), "mysql", "");
    let mut child = workspace.start_run(&job, &mysql_url(), &mysql_url(), &[]);
    wait_for("the stream to start", Duration::from_secs(60), || {
        still_running(&mut child);
        stream_position("mysql", &name).is_some()
    });
    // Each edge value must find its row again: one of the duplicates goes, another changes.
    mariadb(&format!(
        "SET SESSION sql_mode = ''; USE {database};
         INSERT INTO edge VALUES {row}, {other};
         DELETE FROM edge WHERE d = '0000-00-00' LIMIT 1;
         UPDATE edge SET e = 'a' WHERE d = '0000-00-00' LIMIT 1;
         DELETE FROM edge WHERE y = 2155 LIMIT 1;
         UPDATE edge SET f = 1.5 WHERE d IS NULL;"
    ));
    let source = source_position();
    wait_for("the stream to reach the source", Duration::from_secs(60), || {
        still_running(&mut child);
        stream_position("mysql", &name).is_some_and(|at| at >= source)
    });
    let child = child.into_inner();
    signal(&child, "TERM");
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(edge_rows(&format!("{namespace}.edge")), edge_rows(&format!("{database}.edge")));
}

/// Tables of every kind a migration meets, each with the key its rows are ordered by, and the
/// statements that make and fill them on the source, in order. `altered` takes rows, then an
/// ALTER (a column added, one widened with a new default, an index, a table comment), then more
/// rows: the stream creates it and alters it, the snapshot copies it as it ends up.
const CORPUS: [(&str, &str); 9] = [
    ("floats", "id"),
    ("decimals", "id"),
    ("integers", "id"),
    ("times", "id"),
    ("texts", "code"),
    ("binaries", "id"),
    ("docs", "id"),
    ("order_lines", "order_id, line"),
    ("altered", "id"),
];

const CORPUS_SQL: &str = "
CREATE TABLE floats (id INT AUTO_INCREMENT PRIMARY KEY, f1 FLOAT DEFAULT 5.6, f2 FLOAT(10,2) DEFAULT 7.8,
    f3 FLOAT(35,5), f4 FLOAT(23), f5 FLOAT(24), f6 FLOAT(25), weight FLOAT UNSIGNED DEFAULT '0');
INSERT INTO floats (f1, f2, f3, f4, f5, f6, weight) VALUES (5.6, 7.123, 30.123456789, 1.2345678, 1.2345678, 1.23456789012, 3.3),
    (-1.5e-7, -12345678.9, -0.000012345, 1e30, -1e-30, 1.7976931348623157e308, 0);
INSERT INTO floats () VALUES ();
CREATE TABLE decimals (id BIGINT UNSIGNED NOT NULL PRIMARY KEY, d1 DECIMAL(10,2) NOT NULL DEFAULT 0.00,
    d2 DECIMAL(65,30), d3 DECIMAL(5,0) UNSIGNED, d4 NUMERIC(12,4) DEFAULT -1.5);
INSERT INTO decimals VALUES (18446744073709551615, 12345678.91, -99999999999999999999999999999999999.999999999999999999999999999999, 99999, 0.0001),
    (1, DEFAULT, NULL, NULL, DEFAULT);
CREATE TABLE integers (id INT UNSIGNED NOT NULL AUTO_INCREMENT, flag TINYINT(1) NOT NULL DEFAULT 1, tiny TINYINT UNSIGNED,
    small SMALLINT DEFAULT -3, medium MEDIUMINT UNSIGNED, padded INT(5) ZEROFILL, big BIGINT UNSIGNED DEFAULT 18446744073709551615,
    bits BIT(5) DEFAULT b'101', y YEAR, PRIMARY KEY (id)) AUTO_INCREMENT=100;
INSERT INTO integers (flag, tiny, small, medium, padded, big, bits, y) VALUES (0, 255, -32768, 16777215, 42, 0, b'11111', 2155), (1, 0, 32767, 0, 0, 9223372036854775808, b'0', 1901);
INSERT INTO integers () VALUES ();
CREATE TABLE times (id INT AUTO_INCREMENT PRIMARY KEY, created DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    touched TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    t TIME(3) DEFAULT '12:34:56.789', d DATE DEFAULT '2024-02-29', dt DATETIME DEFAULT NULL);
INSERT INTO times (created, touched, t, d, dt) VALUES ('2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.123', '-838:59:59.000', '1000-01-01', '9999-12-31 23:59:59');
INSERT INTO times () VALUES ();
CREATE TABLE texts (code CHAR(4) CHARACTER SET latin1 COLLATE latin1_bin NOT NULL,
    name VARCHAR(100) COLLATE utf8mb4_unicode_ci NOT NULL DEFAULT '' COMMENT 'display name', note TEXT CHARACTER SET utf8mb3,
    body MEDIUMTEXT, tiny TINYTEXT, kind ENUM('a','b','c') NOT NULL DEFAULT 'b', tags SET('x','y','z') DEFAULT 'x,z',
    PRIMARY KEY (code), UNIQUE KEY name_unique (name), KEY kind_tags (kind, tags))
    DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci COMMENT='text columns';
INSERT INTO texts VALUES ('ab', 'Zoë', 'naïve', REPEAT('x', 70000), 'tiny', 'c', 'y,z'), ('AB', 'Zed', NULL, '', NULL, 'a', '');
INSERT INTO texts (code) VALUES ('def');
CREATE TABLE binaries (id INT PRIMARY KEY, fixed BINARY(4), var VARBINARY(16) NOT NULL, data BLOB, UNIQUE KEY var_unique (var));
INSERT INTO binaries VALUES (1, 0x00ff, 0x0001, 0xdeadbeef), (2, 'a', '', NULL), (3, NULL, 0xff, '');
CREATE TABLE docs (id INT AUTO_INCREMENT PRIMARY KEY, doc JSON NOT NULL, meta JSON DEFAULT NULL COMMENT 'optional');
INSERT INTO docs (doc, meta) VALUES ('{\"b\": 1, \"a\": [1, 2.50, \"x\"]}', NULL), ('[]', '{\"k\": null}');
CREATE TABLE order_lines (order_id INT NOT NULL, line SMALLINT UNSIGNED NOT NULL, sku VARCHAR(20) NOT NULL,
    qty INT NOT NULL DEFAULT 1, price DECIMAL(10,2), PRIMARY KEY (order_id, line), KEY by_sku (sku), UNIQUE KEY order_sku (order_id, sku));
INSERT INTO order_lines VALUES (1, 1, 'apple', 3, 0.50), (1, 2, 'pear', 1, NULL), (2, 1, 'apple', 10, 4.99);
CREATE TABLE altered (id INT AUTO_INCREMENT PRIMARY KEY, a VARCHAR(10), b INT);
INSERT INTO altered (a, b) VALUES ('one', 1), ('two', 2);
ALTER TABLE altered ADD COLUMN c DECIMAL(8,3) COMMENT 'added', MODIFY b BIGINT UNSIGNED DEFAULT 7 COMMENT 'widened',
    ADD INDEX by_a (a), COMMENT 'altered after rows';
INSERT INTO altered (a, c) VALUES ('three', 3.5);
";

/// What a target says of a table's definition: `SHOW CREATE TABLE` on MySQL; on PostgreSQL its
/// columns (type, width, precision and scale, nullability, default, identity, comment), its
/// comment and its indexes (the schema's name taken out of their definitions).
fn definition(target: &str, namespace: &str, table: &str) -> String {
    if target == "mysql" {
        return mariadb(&format!("SHOW CREATE TABLE {namespace}.{table}"));
    }
    let columns = psql(&format!(
        "SELECT column_name, data_type, udt_name, character_maximum_length, numeric_precision, numeric_scale,
                datetime_precision, is_nullable, column_default, is_identity, identity_generation,
                col_description('{namespace}.{table}'::regclass, ordinal_position::int)
         FROM information_schema.columns WHERE table_schema = '{namespace}' AND table_name = '{table}' ORDER BY ordinal_position"
    ));
    let comment = psql(&format!("SELECT obj_description('{namespace}.{table}'::regclass, 'pg_class')"));
    let indexes = psql(&format!(
        "SELECT indexname, replace(indexdef, '{namespace}.', 'SCHEMA.') FROM pg_indexes
         WHERE schemaname = '{namespace}' AND tablename = '{table}' ORDER BY indexname"
    ));
    format!("{columns}comment: {comment}indexes:\n{indexes}")
}

/// A table's rows in key order, as the target's client prints them (PostgreSQL: each row as
/// its text).
fn ordered_rows(side: &str, table: &str, key: &str) -> Vec<u8> {
    if side == "postgres" {
        return psql(&format!("SELECT t::text FROM {table} AS t ORDER BY {key}")).into_bytes();
    }
    support::mariadb_bytes(&format!("SELECT * FROM {table} ORDER BY {key}"))
}

/// Asserts two outputs are the same bytes, showing both as text when they are not.
fn assert_same_bytes(actual: &[u8], expected: &[u8], what: &str) {
    let text = String::from_utf8_lossy;
    assert!(actual == expected, "{what}:\n{}\n--- expected:\n{}", text(actual), text(expected));
}

/// Starts a `cdc` job over `database` into `target`, named `{database}-{target}-{kind}`, from
/// `start` (source options) or where the source stands; returns its name once its stream runs.
fn start_stream(workspace: &Workspace, database: &str, target: &str, kind: &str, start: &str) -> (String, Guard) {
    let name = format!("{database}-{target}-{kind}").replace('_', "-");
    let job = job_file_with_source(workspace, &name, "cdc", &format!("{database}.*"), start, target, "");
    let mut child = workspace.start_run(&job, &mysql_url(), &target_url(target), &[]);
    wait_for("the stream to start", Duration::from_secs(60), || {
        still_running(&mut child);
        stream_position(target, &name).is_some()
    });
    (name, child)
}

#[test]
fn tables_the_stream_creates_or_alters_are_the_tables_a_snapshot_copies() {
    let database = unique_name("created");
    mariadb(&format!("CREATE DATABASE {database}"));
    let status = mariadb("SHOW MASTER STATUS");
    let mut fields = status.split('\t');
    let (file, offset) = (fields.next().unwrap(), fields.next().unwrap().trim());
    let before = format!("  start_position: {{file: {file}, position: {offset}}}\n");
    let workspace = Workspace::new();
    let targets = ["mysql", "postgres"];
    // Per target: a cdc job over the empty database while the source makes and fills its tables
    // (`live`); one started after that from before it (`late`), which finds each table as it
    // ends up, `altered` with its wider column already; then a snapshot of them (`copy`).
    let mut streams: Vec<(&str, &str, String, Guard)> = Vec::new();
    for target in targets {
        let (name, child) = start_stream(&workspace, &database, target, "live", "");
        streams.push((target, "live", name, child));
    }
    mariadb(&format!("USE {database}; {CORPUS_SQL}"));
    for target in targets {
        let (name, child) = start_stream(&workspace, &database, target, "late", &before);
        streams.push((target, "late", name, child));
    }
    let source = source_position();
    for (target, _, name, child) in &mut streams {
        wait_for("the stream to reach the source", Duration::from_secs(60), || {
            still_running(child);
            stream_position(target, name).is_some_and(|at| at >= source)
        });
    }
    for (target, kind, _, child) in streams {
        let child = child.into_inner();
        signal(&child, "TERM");
        let output = child.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{target} {kind}: {log}");
        if kind == "late" {
            // Created from the table map as to `b`, then altered to the description.
            assert!(log.contains("column b is Integer { bytes: 8, unsigned: true } now"), "{target}: {log}");
        }
    }
    for target in targets {
        let name = format!("{database}-{target}-copy").replace('_', "-");
        let job = job_file(&workspace, &name, "snapshot", &format!("{database}.*"), target, "");
        run(&workspace, &job, target, &[]).assert_code(0);
        let copied = name.replace('-', "_");
        for kind in ["live", "late"] {
            let streamed = format!("{database}_{target}_{kind}");
            for (table, key) in CORPUS {
                assert_eq!(
                    definition(target, &streamed, table),
                    definition(target, &copied, table),
                    "{target}: table {table} as the {kind} stream made it, and as the snapshot did"
                );
                let rows = |namespace: &str| ordered_rows(target, &format!("{namespace}.{table}"), key);
                let streamed_rows = rows(&streamed);
                assert!(!streamed_rows.is_empty(), "{target}: {table} has rows");
                let what = format!("{target}: the rows of {table} the {kind} stream wrote");
                assert_same_bytes(&streamed_rows, &rows(&copied), &what);
                if target == "mysql" {
                    // As the source shows them: FLOAT(M,D) values with their decimals.
                    assert_same_bytes(&streamed_rows, &rows(&database), &format!("{what}, as the source shows them"));
                }
            }
        }
    }
}
