//! Bad input gets a clear error that names the field or the side, with the right exit code, and
//! never echoes a secret.

use crate::support;

use support::{canary, mariadb, mysql_url, postgres_url, unique_name, Run, Workspace};

const GOOD_TARGET: &str = "target:\n  type: jsonl\n  path: out\n";

/// `sluice run` of `job`, its source `${URL}` the test MariaDB, its target `${TARGET}` the test
/// PostgreSQL.
fn run_into_postgres(workspace: &Workspace, job: &std::path::Path) -> Run {
    Run::from(
        workspace
            .command(&["run", job.to_str().unwrap()])
            .env("URL", mysql_url())
            .env("TARGET", postgres_url())
            .output()
            .unwrap(),
    )
}

fn assert_no_secret(run: &Run) {
    let output = run.all();
    assert!(!output.contains(&canary()), "the password leaked:\n{output}");
    assert!(!output.contains("wrong-CANARY"), "the wrong password leaked:\n{output}");
}

#[test]
fn malformed_yaml_names_the_line_and_column() {
    let workspace = Workspace::new();
    let job =
        workspace.write("job.yaml", "name: broken\nsource:\n  type: sqlite\n  tables: [a, b\ntarget: {type: jsonl}\n");
    let run = workspace.sluice(&["run", job.to_str().unwrap()]);
    run.assert_code(2);
    assert!(run.stderr.contains("not valid YAML at line 5, column"), "{}", run.stderr);
    workspace.sluice(&["check", job.to_str().unwrap()]).assert_code(2);
}

#[test]
fn unknown_fields_are_named_with_their_path_and_line() {
    let workspace = Workspace::new();
    let job = workspace.write("job.yaml", "name: typo\nsource:\n  type: sqlite\n  path: a.db\n  tabels: [x]\ntarget:\n  type: jsonl\n  path: out\nparalelism: 2\n");
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(2);
    assert!(run.stderr.contains("paralelism (line 9): unknown field `paralelism`"), "{}", run.stderr);
    assert!(
        run.stderr.contains("source.tabels (line 5): unknown field `tabels` for a `sqlite` source"),
        "{}",
        run.stderr
    );
}

#[test]
fn an_unknown_connector_type_lists_the_known_ones() {
    let workspace = Workspace::new();
    let job =
        workspace.write("job.yaml", &format!("name: x\nsource:\n  type: oracle\n  url: oracle://h\n{GOOD_TARGET}"));
    let run = workspace.sluice(&["run", job.to_str().unwrap()]);
    run.assert_code(2);
    assert!(
        run.stderr.contains(
            "source.type (line 3): unknown connector type `oracle`; known types: sqlite, mysql, postgres, csv, parquet, jsonl"
        ),
        "{}",
        run.stderr
    );
}

#[test]
fn a_missing_source_table_is_named() {
    let workspace = Workspace::new();
    support::make_source(&workspace.path("source.db"), 10);
    let job = workspace.write(
        "job.yaml",
        &format!("name: x\nsource:\n  type: sqlite\n  path: source.db\n  tables: [items, itmes]\n{GOOD_TARGET}"),
    );
    let run = workspace.sluice(&["run", job.to_str().unwrap()]);
    run.assert_code(1);
    assert!(run.stderr.contains("source: table `itmes` named in source.tables[1] does not exist"), "{}", run.stderr);
}

#[test]
fn a_missing_mysql_table_is_named() {
    let database = unique_name("missing");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.present (id INT PRIMARY KEY)"));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: x\nsource:\n  type: mysql\n  url: ${{SOURCE_URL}}\n  tables: [{database}.absent]\n{GOOD_TARGET}"
        ),
    );
    let run =
        Run::from(workspace.command(&["run", job.to_str().unwrap()]).env("SOURCE_URL", mysql_url()).output().unwrap());
    run.assert_code(1);
    assert!(
        run.stderr.contains(&format!("source: table `{database}.absent` named in source.tables[0] does not exist")),
        "{}",
        run.stderr
    );
    assert_no_secret(&run);
}

#[test]
fn an_unreachable_host_names_the_side() {
    let workspace = Workspace::new();
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let source = workspace.write(
        "source.yaml",
        &format!("name: x\nsource:\n  type: mysql\n  url: mysql://sluice:${{PW}}@127.0.0.1:1\n{GOOD_TARGET}"),
    );
    let run = Run::from(workspace.command(&["check", source.to_str().unwrap()]).env("PW", canary()).output().unwrap());
    run.assert_code(1);
    assert!(run.stdout.contains("FAIL  source: connect on mysql://sluice:***@127.0.0.1:1"), "{}", run.stdout);
    assert!(run.stdout.contains("check that the server at mysql://sluice:***@127.0.0.1:1 is up"), "{}", run.stdout);
    assert_no_secret(&run);

    let target = workspace.write("target.yaml", "name: x\nsource:\n  type: sqlite\n  path: s.db\ntarget:\n  type: postgres\n  url: postgres://sluice:${PW}@127.0.0.1:1/db\n");
    support::make_source(&workspace.path("s.db"), 1);
    let run = Run::from(workspace.command(&["run", target.to_str().unwrap()]).env("PW", canary()).output().unwrap());
    run.assert_code(1);
    assert!(run.stderr.contains("error: target: connect on postgres://sluice:***@127.0.0.1:1/db"), "{}", run.stderr);
    assert_no_secret(&run);
}

#[test]
fn a_wrong_password_is_refused_without_echoing_it() {
    let workspace = Workspace::new();
    let wrong_source = mysql_url().replace(&canary(), "wrong-CANARY-4e1d");
    let job =
        workspace.write("source.yaml", &format!("name: x\nsource:\n  type: mysql\n  url: ${{URL}}\n{GOOD_TARGET}"));
    let run = Run::from(workspace.command(&["run", job.to_str().unwrap()]).env("URL", &wrong_source).output().unwrap());
    run.assert_code(1);
    assert!(run.stderr.contains("error: source: connect on mysql://sluice:***@"), "{}", run.stderr);
    assert!(run.stderr.contains("Access denied"), "{}", run.stderr);
    assert!(run.stderr.contains("hint: check the user and password in source.url"), "{}", run.stderr);
    assert_no_secret(&run);

    let wrong_target = postgres_url().replace(&canary(), "wrong-CANARY-4e1d");
    support::make_source(&workspace.path("s.db"), 1);
    let job = workspace.write(
        "target.yaml",
        "name: x\nsource:\n  type: sqlite\n  path: s.db\ntarget:\n  type: postgres\n  url: ${URL}\n",
    );
    let run =
        Run::from(workspace.command(&["check", job.to_str().unwrap()]).env("URL", &wrong_target).output().unwrap());
    run.assert_code(1);
    assert!(run.stdout.contains("FAIL  target: connect on postgres://sluice:***@"), "{}", run.stdout);
    assert!(run.stdout.contains("password authentication failed"), "{}", run.stdout);
    assert_no_secret(&run);
}

#[test]
fn an_unwritable_target_names_the_side() {
    let workspace = Workspace::new();
    support::make_source(&workspace.path("s.db"), 1);
    // A path below a regular file cannot be created, even by root.
    workspace.write("file", "");
    let job = workspace.write(
        "job.yaml",
        "name: x\nsource:\n  type: sqlite\n  path: s.db\ntarget:\n  type: sqlite\n  path: file/target.db\n",
    );
    let run = workspace.sluice(&["run", job.to_str().unwrap()]);
    run.assert_code(1);
    assert!(run.stderr.contains("error: target: cannot open SQLite database file/target.db"), "{}", run.stderr);
    let job = workspace.write(
        "files.yaml",
        "name: x\nsource:\n  type: sqlite\n  path: s.db\ntarget:\n  type: jsonl\n  path: file/out\n",
    );
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(1);
    assert!(run.stdout.contains("FAIL  target: create file/out"), "{}", run.stdout);
}

#[test]
fn the_canary_password_appears_in_no_output_and_no_file_a_run_writes() {
    let database = unique_name("canary");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, d DATE); INSERT INTO {database}.t VALUES (1, '2024-01-01')"));
    let workspace = Workspace::new();
    let good = workspace.write("good.yaml", &format!("name: canary\nsource:\n  type: mysql\n  url: ${{URL}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n"));
    // Fails at the target: the table exists with a missing column, and creating is off.
    support::psql(&format!("CREATE SCHEMA {database}_failing; CREATE TABLE {database}_failing.t (id int)"));
    mariadb(&format!(
        "CREATE DATABASE {database}_failing; CREATE TABLE {database}_failing.t (id INT PRIMARY KEY, d DATE)"
    ));
    let failing = workspace.write(
        "failing.yaml",
        &format!("name: canary-failing\nsource:\n  type: mysql\n  url: ${{URL}}\n  tables: [\"{database}_failing.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  create_tables: false\n"),
    );
    // The same password as a `?password=` parameter (libpq's form) is kept as secret.
    let password = format!(":{}@", support::canary());
    let query_form = postgres_url().replacen(&password, "@", 1) + "?password=" + &support::canary();
    assert!(query_form.contains("sluice@"), "{query_form}");
    let mut outputs = String::new();
    for (job, code, target) in [(&good, 0, postgres_url()), (&failing, 1, postgres_url()), (&good, 0, query_form)] {
        for command in ["check", "run"] {
            let run = Run::from(
                workspace
                    .command(
                        &[command, job.to_str().unwrap(), "--summary-json", "summary.json"]
                            [..if command == "run" { 4 } else { 2 }],
                    )
                    .env("URL", mysql_url())
                    .env("TARGET", &target)
                    .env("SLUICE_LOG", "debug")
                    .output()
                    .unwrap(),
            );
            if command == "run" {
                run.assert_code(code);
            }
            outputs.push_str(&run.all());
        }
    }
    assert!(outputs.contains("lacks columns d"), "the failing run failed for the expected reason:\n{outputs}");
    assert!(!outputs.contains(&canary()), "the password leaked into the output:\n{outputs}");
    let mut files = vec![workspace.directory.path().to_path_buf()];
    let mut scanned = 0;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|entry| entry.unwrap().path()));
        } else if path.extension().is_none_or(|extension| extension != "yaml") {
            let bytes = std::fs::read(&path).unwrap();
            scanned += 1;
            assert!(
                !String::from_utf8_lossy(&bytes).contains(&canary()),
                "the password leaked into {}",
                path.display()
            );
        }
    }
    assert!(
        scanned >= 2 && workspace.path(".sluice/state.db").exists(),
        "the summary and the state store were scanned ({scanned} files)"
    );
    // The state is the user's alone, whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    let mode = |name: &str| std::fs::metadata(workspace.path(name)).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(".sluice"), 0o700, "the state directory");
    // (SQLite removes its WAL file when the last connection closes; the database stays.)
    for file in [".sluice/state.db", ".sluice/state.db-wal"].into_iter().filter(|file| workspace.path(file).exists()) {
        assert_eq!(mode(file), 0o600, "{file}");
    }
}

#[test]
fn a_missing_select_privilege_is_named_with_its_table() {
    let database = unique_name("grants");
    let user = unique_name("limited");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE DATABASE {database}_hidden;
         CREATE TABLE {database}.open (id INT PRIMARY KEY); CREATE TABLE {database}_hidden.secret (id INT PRIMARY KEY);
         CREATE USER '{user}'@'%' IDENTIFIED BY 'limited-pw'; GRANT SELECT ON {database}.* TO '{user}'@'%';"
    ));
    let url = mysql_url();
    let (_, host) = url.rsplit_once('@').unwrap();
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!("name: x\nsource:\n  type: mysql\n  url: mysql://{user}:limited-pw@{host}\n  tables: [{database}.open, {database}_hidden.secret]\n{GOOD_TARGET}"),
    );
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(1);
    assert!(
        run.stdout.contains(&format!("FAIL  source: user {user}@% lacks SELECT on {database}_hidden.secret")),
        "{}",
        run.stdout
    );
    assert!(!run.all().contains("limited-pw"), "the password leaked:\n{}", run.all());
}

#[test]
fn change_capture_is_refused_where_a_side_cannot_do_it() {
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        "name: x\nmode: snapshot+cdc\nsource:\n  type: sqlite\n  path: a.db\ntarget:\n  type: parquet\n  path: out\n",
    );
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(2);
    assert!(run.stderr.contains("a `sqlite` source supports snapshot only"), "{}", run.stderr);
    assert!(run.stderr.contains("a `parquet` target takes snapshots only"), "{}", run.stderr);
    let job = workspace.write(
        "given.yaml",
        "name: x\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: mysql://u@h\n  start_position: {file: b.000001}\ntarget:\n  type: postgres\n  url: postgres://u@h/d\n",
    );
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(2);
    assert!(
        run.stderr
            .contains("source.start_position (line 6): expected a mapping {file: <binlog file>, position: <offset>}"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_read_timeout_out_of_range_is_refused_with_its_field() {
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        "name: x\nsource:\n  type: mysql\n  url: mysql://u@h\n  tables: [\"d.*\"]\n  read_timeout_secs: 0\ntarget:\n  type: postgres\n  url: postgres://u@h/d\n",
    );
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(2);
    assert!(
        run.stderr.contains("source.read_timeout_secs (line 6): expected a whole number of seconds from 1 to 86400"),
        "{}",
        run.stderr
    );
}

#[test]
fn missing_replication_privileges_are_named_by_check() {
    let database = unique_name("replgrants");
    let user = unique_name("noslave");
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY);
         CREATE USER '{user}'@'%' IDENTIFIED BY 'limited-pw'; GRANT SELECT ON {database}.* TO '{user}'@'%';"
    ));
    let url = mysql_url();
    let (_, host) = url.rsplit_once('@').unwrap();
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!("name: x\nmode: cdc\nsource:\n  type: mysql\n  url: mysql://{user}:limited-pw@{host}\n  tables: [{database}.t]\ntarget:\n  type: postgres\n  url: {}\n", support::postgres_url()),
    );
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(1);
    assert!(run.stdout.contains(&format!("FAIL  binlog access: {user}@% cannot read the binlog")), "{}", run.stdout);
    assert!(run.stdout.contains("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.*"), "{}", run.stdout);
    assert!(!run.all().contains("limited-pw"), "the password leaked:\n{}", run.all());
    // The test user of the suite has them: its check passes the probe.
    let job = workspace.write(
        "granted.yaml",
        &format!("name: x\nmode: cdc\nsource:\n  type: mysql\n  url: {url}\n  tables: [{database}.t]\ntarget:\n  type: postgres\n  url: {}\n", support::postgres_url()),
    );
    let run = workspace.sluice(&["check", job.to_str().unwrap()]);
    run.assert_code(0);
    assert!(run.stdout.contains("can stream the binlog"), "{}", run.stdout);
}

#[test]
fn names_longer_than_postgresql_allows_are_refused_all_at_once() {
    let database = unique_name("long");
    let table = "t".repeat(64);
    let column = "c".repeat(64);
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.{table} (id INT PRIMARY KEY, {column} INT); \
         CREATE TABLE {database}.short (id INT PRIMARY KEY)"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: long\nsource:\n  type: mysql\n  url: ${{URL}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n"
        ),
    );
    let run = run_into_postgres(&workspace, &job);
    run.assert_code(1);
    let text = run.all();
    assert!(text.contains("PostgreSQL names are at most 63 bytes"), "{text}");
    assert!(text.contains(&format!("table `{database}.{table}` (64)")), "every long name is listed: {text}");
    assert!(text.contains(&format!("column `{column}`")), "every long name is listed: {text}");
    let created =
        support::psql(&format!("SELECT count(*) FROM information_schema.tables WHERE table_schema = '{database}'"));
    assert_eq!(created.trim(), "0", "nothing was created or truncated");
    assert_no_secret(&run);
}

#[test]
fn a_file_schema_with_a_key_past_its_columns_is_refused_not_a_panic() {
    let workspace = Workspace::new();
    support::make_source(&workspace.path("source.db"), 10);
    let copy = workspace.write("copy.yaml", "name: keys\nsource:\n  type: sqlite\n  path: source.db\n  tables: [items]\ntarget:\n  type: jsonl\n  path: in\n");
    workspace.sluice(&["run", copy.to_str().unwrap()]).assert_code(0);
    // The schema the file target wrote, with its key and an index pointing past the columns.
    let schema_path = std::fs::read_dir(workspace.path("in"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("_schema.json"))
        .find(|path| path.exists())
        .expect("a _schema.json");
    let mut schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    schema["primary_key"] = serde_json::json!([5000]);
    schema["indexes"] = serde_json::json!([{"name": "by_x", "columns": [0, 9000], "unique": false}]);
    std::fs::write(&schema_path, schema.to_string()).unwrap();
    let job = workspace
        .write("job.yaml", "name: keys2\nsource:\n  type: jsonl\n  path: in\ntarget:\n  type: jsonl\n  path: out\n");
    let run = workspace.sluice(&["run", job.to_str().unwrap()]);
    let text = run.all();
    assert!(!text.contains("panicked"), "{text}");
    assert_ne!(run.code, 0, "{text}");
    assert!(text.contains("_schema.json is not a usable table schema"), "{text}");
    assert!(
        text.contains("primary_key[0] is 5000") && text.contains("index by_x: columns[1] is 9000"),
        "every problem: {text}"
    );
}

#[test]
fn a_closed_standard_output_ends_printing_not_the_process() {
    let workspace = Workspace::new();
    support::make_source(&workspace.path("source.db"), 10);
    let job = workspace.write(
        "job.yaml",
        "name: pipe\nsource:\n  type: sqlite\n  path: source.db\ntarget:\n  type: jsonl\n  path: out\n",
    );
    for arguments in [&["schema", job.to_str().unwrap()][..], &["run", job.to_str().unwrap()], &["--help"]] {
        // The reading end is closed before the child starts: every write it makes meets a
        // broken pipe.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = workspace.command(arguments).stdout(writer).stderr(std::process::Stdio::piped()).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{arguments:?}: {stderr}");
        assert_eq!(output.status.code(), Some(0), "{arguments:?}: {stderr}");
    }
}

#[test]
fn tls_settings_in_urls_are_checked_with_the_job_file() {
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        "name: tls\nsource:\n  type: mysql\n  url: mysql://u:${PW}@h:3306?ssl-mode=SOMETIMES&ssl-cert=c.pem\n  tables: [\"d.*\"]\n\
         target:\n  type: postgres\n  url: postgres://u:${PW}@h/db?sslmode=verify&sslrootcert=\n",
    );
    let run = Run::from(workspace.command(&["check", job.to_str().unwrap()]).env("PW", canary()).output().unwrap());
    run.assert_code(2);
    for expected in [
        "source.url (line 4): ssl-mode=SOMETIMES is not one of DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY",
        "source.url (line 4): ssl-cert and ssl-key go together",
        "target.url (line 8): sslmode=verify is not one of disable, allow, prefer, require, verify-ca, verify-full",
        "target.url (line 8): sslrootcert is empty",
    ] {
        assert!(run.stderr.contains(expected), "{expected}:\n{}", run.stderr);
    }
    assert_no_secret(&run);
}
