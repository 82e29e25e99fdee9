//! The transform stage against real servers: eight MariaDB shards merged into one PostgreSQL
//! table under snapshot+cdc with a write load (the target ends equal to the union of the
//! sources), and a filtered, masked copy that ends equal to the same rules computed
//! independently (SQL on the source, HMAC-SHA-256 by the `hmac` crate); `check` and `schema`
//! show the transformed target, and a broken rule is named with its line.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use hmac::{KeyInit, Mac};
use support::workload::{source_position, stream_position, Client, Random};
use support::{mariadb, mysql_url, postgres_url, psql, signal, unique_name, Guard, Workspace};

const SHARDS: u64 = 8;
const ROWS_PER_SHARD: u64 = 1_000;
const SALT: &str = "test-salt-0123456789abcdef";

/// Starts `sluice run` with its output in a file (read at the end, never left to fill a pipe).
fn start(workspace: &Workspace, job: &Path) -> (Guard, PathBuf) {
    let log = workspace.path("run.log");
    let file = std::fs::File::create(&log).expect("create the run log");
    let child = workspace
        .command(&["run", job.to_str().unwrap(), "--summary-json", "summary.json"])
        .env("SOURCE", mysql_url())
        .env("TARGET", postgres_url())
        .env("MASK_SALT", SALT)
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("sluice starts");
    (Guard::new(child), log)
}

/// Runs `sluice ARGS` against the test servers (with the mask salt): its exit code, its
/// standard output, and both outputs together.
fn sluice(workspace: &Workspace, arguments: &[&str]) -> (Option<i32>, String, String) {
    let output = workspace
        .command(arguments)
        .env("SOURCE", mysql_url())
        .env("TARGET", postgres_url())
        .env("MASK_SALT", SALT)
        .output()
        .expect("sluice runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let all = stdout.clone() + &String::from_utf8_lossy(&output.stderr);
    (output.status.code(), stdout, all)
}

/// Waits until the stream's checkpoint is at the source's position now, then stops the run
/// (SIGTERM, a stream's normal end) and returns what it logged.
fn converge_and_stop(mut child: Guard, log: &Path, job: &str) -> String {
    let source = source_position();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while stream_position("postgres", job).is_none_or(|at| at < source) {
        let exited = child.try_wait().expect("poll the run").is_some();
        if exited || std::time::Instant::now() > deadline {
            panic!(
                "the stream did not reach {source:?} (at {:?}):\n{}",
                stream_position("postgres", job),
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut child = child.into_inner();
    signal(&child, "TERM");
    let status = child.wait().expect("the run ends");
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "a stopped stream exits 0:\n{text}");
    assert!(!text.contains("panicked"), "{text}");
    text
}

fn sorted(text: String) -> Vec<String> {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

#[test]
fn eight_shards_merge_into_one_table_under_snapshot_and_cdc_with_a_write_load() {
    let base = unique_name("merge");
    let shards: Vec<String> = (0..SHARDS).map(|shard| format!("{base}_s{shard}")).collect();
    for shard in &shards {
        // The same keys in every shard: only the origin column tells their rows apart.
        mariadb(&format!(
            "CREATE DATABASE {shard}; USE {shard};
             CREATE TABLE orders (id BIGINT PRIMARY KEY, customer VARCHAR(40) NOT NULL, amount DECIMAL(12,2) NOT NULL, note VARCHAR(64) NULL, KEY (customer));
             INSERT INTO orders SELECT seq, CONCAT('c', seq % 97), seq * 1.25, IF(seq % 7 = 0, NULL, CONCAT('n', seq)) FROM seq_1_to_{ROWS_PER_SHARD};"
        ));
    }
    let workspace = Workspace::new();
    let name = base.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{base}_s*.orders\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\nparallelism: 3\nlimits: {{batch_rows: 200, split_rows: 400}}\n\
             route:\n  - source_table: \"{base}_s[0-9]+\\\\.orders\"\n    sink_table: {base}_all.orders\n    origin_column: shard\n"
        ),
    );
    let (child, log) = start(&workspace, &job);

    // A write load on every shard while the copy and then the stream run: inserts, updates,
    // deletes, and key moves, the same keys in different shards.
    let mut random = Random::from_environment("merge");
    let mut clients: Vec<Client> = shards.iter().map(|shard| Client::start(shard)).collect();
    let mut next_id = ROWS_PER_SHARD + 1;
    for round in 0..1_600u64 {
        let shard = random.below(SHARDS) as usize;
        let id = 1 + random.below(next_id);
        let sql = match random.below(10) {
            0..=2 => {
                next_id += 1;
                format!("INSERT INTO orders VALUES ({}, 'new', {}.50, 'r{round}');", next_id - 1, random.below(900))
            }
            3..=5 => format!("UPDATE orders SET amount = amount + 1, note = 'u{round}' WHERE id = {id};"),
            6..=7 => format!("DELETE FROM orders WHERE id = {id};"),
            8 => {
                next_id += 1;
                format!("UPDATE orders SET id = {} WHERE id = {id};", next_id - 1)
            }
            _ => format!(
                "BEGIN; UPDATE orders SET amount = amount - 5 WHERE id = {id}; INSERT INTO orders VALUES ({}, 'tx', 5, NULL); COMMIT;",
                {
                    next_id += 1;
                    next_id - 1
                }
            ),
        };
        clients[shard].send(&sql);
        if round % 100 == 0 {
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    for client in clients {
        client.finish();
    }
    let text = converge_and_stop(child, &log, &name);

    let mut expected = Vec::new();
    for shard in &shards {
        expected.extend(sorted(mariadb(&format!(
            "SELECT concat_ws('|', id, customer, amount, coalesce(note, 'NULL'), '{shard}.orders') FROM {shard}.orders"
        ))));
    }
    expected.sort();
    let actual = sorted(psql(&format!(
        "SELECT concat_ws('|', id, customer, amount, coalesce(note, 'NULL'), shard) FROM {base}_all.orders"
    )));
    assert!(expected.len() > (SHARDS * ROWS_PER_SHARD) as usize / 2, "the sources hold rows");
    if actual != expected {
        let missing: Vec<&String> = expected.iter().filter(|row| !actual.contains(row)).take(5).collect();
        let extra: Vec<&String> = actual.iter().filter(|row| !expected.contains(row)).take(5).collect();
        panic!(
            "the merged table differs from the union of the shards ({} rows vs {}); missing: {missing:?}; extra: {extra:?}\n{text}",
            actual.len(),
            expected.len()
        );
    }
    // The origin column is part of the key, and the unique and secondary indexes were built.
    let key = psql(&format!(
        "SELECT string_agg(a.attname, ',' ORDER BY array_position(i.indkey::int2[], a.attnum)) FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey::int2[]) WHERE i.indrelid = '{base}_all.orders'::regclass AND i.indisprimary"
    ));
    assert_eq!(key.trim(), "id,shard");
    let indexes =
        psql(&format!("SELECT count(*) FROM pg_indexes WHERE schemaname = '{base}_all' AND tablename = 'orders'"));
    assert_eq!(indexes.trim(), "2", "the primary key and the customer index");
}

/// The rules of the masked copy, computed without sluice: the filter and the projection in
/// MariaDB's SQL, the hash by the `hmac` crate.
fn expected_masked_rows(database: &str) -> Vec<String> {
    let rows = mariadb(&format!(
        "SELECT id, LEFT(UPPER(name), 4), coalesce(email, 'NULLMARK'), balance * 100, country FROM {database}.people WHERE balance >= 500 AND country <> 'XX'"
    ));
    let mut expected: Vec<String> = rows
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            let contact = if fields[2] == "NULLMARK" {
                "NULL".to_owned()
            } else {
                let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SALT.as_bytes()).unwrap();
                mac.update(fields[2].as_bytes());
                mac.finalize().into_bytes().iter().map(|byte| format!("{byte:02x}")).collect()
            };
            format!("{}|{}|{contact}|{}|{}", fields[0], fields[1], fields[3], fields[4])
        })
        .collect();
    expected.sort();
    expected
}

#[test]
fn a_filtered_masked_copy_equals_the_rules_computed_independently() {
    let database = unique_name("masked");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE people (id INT PRIMARY KEY, name VARCHAR(50) NOT NULL, email VARCHAR(80) NULL, balance DECIMAL(10,2) NOT NULL, country CHAR(2) NOT NULL);
         INSERT INTO people SELECT seq, CONCAT('person ', seq), IF(seq % 5 = 0, NULL, CONCAT('p', seq, '@example.org')), (seq * 37) % 1000, ELT(1 + seq % 4, 'FR', 'DE', 'XX', 'ES') FROM seq_1_to_2000;"
    ));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let namespace = format!("{database}_out");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.people\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {namespace}\nlimits: {{batch_rows: 300, split_rows: 500}}\n\
             transform:\n  - source_table: {database}\\.people\n    projection: \"id, upper(name) AS name, email AS contact, balance * 100 AS cents, country\"\n\
             \x20   filter: \"balance >= 500 AND country <> 'XX'\"\n    mask: {{contact: hash, name: truncate(4)}}\n    salt: ${{MASK_SALT}}\n"
        ),
    );

    // `check` and `schema` show the transformed target.
    let (code, _, checked_text) = sluice(&workspace, &["check", job.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{checked_text}");
    assert!(
        checked_text.contains(&format!(
            "{database}.people → {namespace}.people (transform[0]): id, name, contact, cents, country; filtered"
        )),
        "{checked_text}"
    );
    assert!(!checked_text.contains(SALT), "the salt never prints:\n{checked_text}");
    let (code, schema_text, all) = sluice(&workspace, &["schema", job.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{all}");
    assert!(
        schema_text.contains("\"contact\"") && schema_text.contains("\"cents\"") && !schema_text.contains("\"email\""),
        "{schema_text}"
    );

    let (child, log) = start(&workspace, &job);
    // Changes that move rows into and out of the filter, and ones that stay outside it.
    let mut client = Client::start(&database);
    let mut random = Random::from_environment("masked");
    for round in 0..800u64 {
        let id = 1 + random.below(2_200);
        let sql = match random.below(8) {
            0 | 1 => format!("UPDATE people SET balance = 999 - balance WHERE id = {id};"),
            2 => format!("UPDATE people SET email = CONCAT('e', {round}, '@example.net') WHERE id = {id};"),
            3 => format!("UPDATE people SET country = IF(country = 'XX', 'FR', 'XX') WHERE id = {id};"),
            4 => format!("DELETE FROM people WHERE id = {id};"),
            5 => format!(
                "INSERT IGNORE INTO people VALUES ({}, 'late {round}', NULL, {}, 'DE');",
                2_000 + round,
                random.below(1000)
            ),
            _ => format!("UPDATE people SET name = CONCAT('renamed ', {round}) WHERE id = {id};"),
        };
        client.send(&sql);
        if round % 100 == 0 {
            std::thread::sleep(Duration::from_millis(150));
        }
    }
    client.finish();
    let text = converge_and_stop(child, &log, &name);

    let expected = expected_masked_rows(&database);
    let actual = sorted(psql(&format!(
        "SELECT concat_ws('|', id, name, coalesce(contact, 'NULL'), cents, country) FROM {namespace}.people"
    )));
    assert!(expected.len() > 500, "the filter keeps rows: {}", expected.len());
    if actual != expected {
        let missing: Vec<&String> = expected.iter().filter(|row| !actual.contains(row)).take(5).collect();
        let extra: Vec<&String> = actual.iter().filter(|row| !expected.contains(row)).take(5).collect();
        panic!(
            "the masked copy differs ({} rows vs {}); missing: {missing:?}; extra: {extra:?}\n{text}",
            actual.len(),
            expected.len()
        );
    }
    let leaked = psql(&format!("SELECT count(*) FROM {namespace}.people WHERE contact LIKE '%@%'"));
    assert_eq!(leaked.trim(), "0", "no e-mail address reaches the target");
    let summary = support::summary(&workspace.path("summary.json"));
    assert!(summary["rows_filtered"].as_u64().unwrap() > 0, "{summary}");
    assert!(summary["stream"]["changes_filtered"].as_u64().unwrap() > 0, "{summary}");
    assert!(!text.contains(SALT) && !std::fs::read_to_string(workspace.path("summary.json")).unwrap().contains(SALT));
}

#[test]
fn a_broken_rule_is_named_with_its_line_by_check() {
    let database = unique_name("badrule");
    mariadb(&format!("CREATE DATABASE {database}; CREATE TABLE {database}.t (id INT PRIMARY KEY, v INT NOT NULL);"));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: bad-rule\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\ntransform:\n  - source_table: \"{database}\\\\.t\"\n    projection: \"v, missing\"\n    filter: \"v >\"\n"
        ),
    );
    let (code, _, text) = sluice(&workspace, &["check", job.to_str().unwrap()]);
    assert_eq!(code, Some(2), "a syntax error is a bad job file:\n{text}");
    assert!(text.contains("transform[0].filter (line 13): not a valid predicate"), "{text}");

    // Fixed syntax, wrong columns: `check` reaches the source and names each problem.
    std::fs::write(&job, std::fs::read_to_string(&job).unwrap().replace("v >", "v > 1")).unwrap();
    let (code, _, text) = sluice(&workspace, &["check", job.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("transform[0].projection (line 12): table") && text.contains("has no column `missing`"),
        "{text}"
    );
    assert!(text.contains("primary key column(s) id"), "{text}");
}

/// `events: [insert, update]` keeps a table's deletes out of the target (a warehouse copy that
/// keeps every row ever seen) while its inserts and updates stream, and other tables stream
/// whole; the run summary counts the changes left out.
#[test]
fn an_event_filter_keeps_deletes_out_of_one_table_and_not_the_others() {
    let database = unique_name("events");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE kept (id INT PRIMARY KEY, v INT); INSERT INTO kept VALUES (1, 1), (2, 2), (3, 3);
         CREATE TABLE whole (id INT PRIMARY KEY, v INT); INSERT INTO whole VALUES (1, 1), (2, 2);"
    ));
    let workspace = Workspace::new();
    let name = database.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\n\
             transform:\n  - source_table: {database}\\.kept\n    events: [insert, update]\n"
        ),
    );
    let (child, log) = start(&workspace, &job);
    support::wait_for("the copy", Duration::from_secs(60), || {
        let copied = |table: &str, rows: &str| {
            psql(&format!("SELECT to_regclass('{database}.{table}') IS NOT NULL")).trim() == "t"
                && psql(&format!("SELECT count(*) FROM {database}.{table}")).trim() == rows
        };
        copied("kept", "3") && copied("whole", "2")
    });
    mariadb(&format!(
        "USE {database}; DELETE FROM kept WHERE id = 1; UPDATE kept SET v = 20 WHERE id = 2; INSERT INTO kept VALUES (4, 4);
         UPDATE kept SET id = 30 WHERE id = 3; DELETE FROM whole WHERE id = 1; INSERT INTO whole VALUES (3, 3);"
    ));
    let output = converge_and_stop(child, &log, &name);
    let kept = sorted(psql(&format!("SELECT id || ':' || v FROM {database}.kept")));
    // A change of key is an update: the row moves. Only the delete is left out.
    assert_eq!(kept, ["1:1", "2:20", "30:3", "4:4"], "{output}");
    let whole = sorted(psql(&format!("SELECT id || ':' || v FROM {database}.whole")));
    assert_eq!(whole, ["2:2", "3:3"], "{output}");
}
