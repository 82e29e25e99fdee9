//! Fan-in (`sources:`): two MariaDB servers, each a shard holding the same database and tables
//! with the same keys, merged by one job into one PostgreSQL schema (or MySQL database). Each source is a job of its
//! own with its own binlog position and checkpoints; a route's origin column (`SOURCE/db.table`)
//! keeps their rows apart. The run is SIGKILLed during the copy and during the stream while both
//! shards take a mixed load, and one shard adds a column before the other; in the end the target
//! holds the union of the shards, each row once, and `sluice verify` checks each shard's rows.

use crate::support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use support::mariadb_server::MariadbServer;
use support::workload::{self, Client, Load, Random, ACCOUNTS, ITEMS};
use support::{
    kill, mariadb, mariadb_client_at, mysql_url, postgres_url, psql, signal, unique_name, wait_running, Guard,
    Workspace,
};

const SHARDS: [&str; 2] = ["east", "west"];

/// The target the shards merge into.
#[derive(Clone, Copy)]
enum Target {
    Postgres,
    Mysql,
}

impl Target {
    fn kind(self) -> &'static str {
        match self {
            Target::Postgres => "postgres",
            Target::Mysql => "mysql",
        }
    }

    fn url(self) -> String {
        match self {
            Target::Postgres => postgres_url(),
            Target::Mysql => mysql_url(),
        }
    }

    fn sql(self, sql: &str) -> String {
        match self {
            Target::Postgres => psql(sql),
            Target::Mysql => mariadb(sql),
        }
    }

    fn has_table(self, schema: &str, table: &str) -> bool {
        self.sql(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{schema}' AND table_name = '{table}'"
        ))
        .trim()
            == "1"
    }
}

/// A shard's name and how to run SQL on it (its rows, one a line).
type Shard<'a> = (&'a str, &'a dyn Fn(&str) -> String);

/// The shards' rows of `table` (in `schema` of each) as the target should hold them:
/// `origin|id|…` lines, sorted.
fn union(shards: &[Shard<'_>], schema: &str, table: &str, columns: &str) -> Vec<String> {
    let mut rows: Vec<String> = shards
        .iter()
        .flat_map(|(name, sql)| {
            sql(&format!("SELECT concat_ws('|', '{name}/{schema}.{table}', {columns}) FROM {schema}.{table}"))
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    rows.sort();
    rows
}

/// The target's rows of `table` as `origin|id|…` lines, sorted (none before the copy made it).
fn target_rows(target: Target, schema: &str, table: &str, columns: &str) -> Vec<String> {
    if !target.has_table(schema, table) {
        return Vec::new();
    }
    let mut rows: Vec<String> = target
        .sql(&format!("SELECT concat_ws('|', _source, {columns}) FROM {schema}.{table}"))
        .lines()
        .map(str::to_owned)
        .collect();
    rows.sort();
    rows
}

/// The binlog position a shard's stream committed in the target, as (file sequence, offset).
fn stream_at(target: Target, job: &str, shard: &str) -> Option<(u64, u64)> {
    workload::stream_position(target.kind(), &format!("{job}.{shard}"))
}

/// A shard's binlog position now, as (file sequence, offset).
fn binlog_at(server: &MariadbServer) -> (u64, u64) {
    let status = server.sql("SHOW MASTER STATUS");
    let mut fields = status.split('\t');
    let file = fields.next().expect("a binlog file");
    let offset = fields.next().expect("an offset").trim().parse().expect("a number");
    (file.rsplit('.').next().unwrap().parse().expect("a file sequence"), offset)
}

#[test]
fn two_shards_on_two_servers_merge_into_one_postgres_schema_exactly_once_through_kills() {
    merge_two_shards(Target::Postgres);
}

#[test]
fn two_shards_on_two_servers_merge_into_one_mysql_database_exactly_once_through_kills() {
    merge_two_shards(Target::Mysql);
}

fn merge_two_shards(target: Target) {
    let (east, west) = (MariadbServer::start(), MariadbServer::start());
    let shards = [(SHARDS[0], &east), (SHARDS[1], &west)];
    let (east_sql, west_sql) = (|sql: &str| east.sql(sql), |sql: &str| west.sql(sql));
    let readers: [Shard<'_>; 2] = [(SHARDS[0], &east_sql), (SHARDS[1], &west_sql)];
    let database = unique_name("shard");
    for (_, server) in &shards {
        server.sql(&workload::create_tables_sql(&database));
    }
    let schema = format!("{database}_all");
    let name = database.replace('_', "-");
    let workspace = Workspace::new();
    let sources = format!(
        "sources:\n  - name: east\n    type: mysql\n    url: ${{EAST}}\n    tables: [\"{database}.*\"]\n\
         \x20 - name: west\n    type: mysql\n    url: ${{WEST}}\n    tables: [\"{database}.*\"]\n"
    );
    let target_text = format!("target:\n  type: {}\n  url: ${{TARGET}}\n", target.kind());
    let command = |arguments: &[&str]| {
        let mut command = workspace.command(arguments);
        command.env("EAST", east.url()).env("WEST", west.url()).env("TARGET", target.url());
        command
    };

    // Both shards hold keys 1..: without an origin column their rows would overwrite each other.
    let bare = workspace.write("bare.yaml", &format!("name: {name}\nmode: snapshot+cdc\n{sources}{target_text}"));
    let checked = support::Run::from(command(&["check", bare.to_str().unwrap()]).output().unwrap());
    checked.assert_code(1);
    for (shard, table) in [("east", "accounts"), ("east", "items"), ("west", "items")] {
        let expected = format!("sources[{shard}]: table {database}.{table} goes into");
        assert!(checked.stdout.contains(&expected), "{expected}:\n{}", checked.stdout);
    }
    assert!(checked.stdout.contains("origin_column"), "{}", checked.stdout);

    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\n{sources}{target_text}limits: {{batch_rows: 200}}\n\
             route:\n  - source_table: \"{database}\\\\..*\"\n    sink_table: \"{schema}.<>\"\n    replace_symbol: \"<>\"\n    origin_column: _source\n"
        ),
    );
    let checked = support::Run::from(command(&["check", job.to_str().unwrap()]).output().unwrap());
    checked.assert_code(0);
    let arrow = format!("mysql + mysql → {}", target.kind());
    assert!(checked.stdout.contains(&arrow), "{}", checked.stdout);
    assert!(checked.stdout.contains("source east:") && checked.stdout.contains("source west:"), "{}", checked.stdout);

    let loads: Vec<Load> = shards
        .iter()
        .map(|(shard, server)| {
            let client = Client::start_with(mariadb_client_at(&server.socket()), &database);
            Load::start_with(client, Random::from_environment(&format!("fan_in_{shard}")), 150, ITEMS + 1)
        })
        .collect();
    let start = || {
        let job = job.to_str().unwrap();
        let child = command(&["run", job, "--summary-json", "summary.json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice starts");
        Guard::new(child)
    };
    let limit = Duration::from_secs(120);
    let committed = |shard: &str| workload::committed(target.kind(), &format!("{name}.{shard}"));

    // Killed once rows of the copy are in, whatever else is.
    let mut run = start();
    wait_running("the copy", limit, &mut run, || SHARDS.iter().all(|shard| committed(shard) > 0));
    kill(&mut run);
    // Killed again once both streams moved past where the shards stood after the first kill.
    let mut run = start();
    let stood: BTreeMap<&str, (u64, u64)> = shards.iter().map(|(shard, server)| (*shard, binlog_at(server))).collect();
    wait_running("both streams", limit, &mut run, || {
        SHARDS.iter().all(|shard| stream_at(target, &name, shard).is_some_and(|at| at > stood[shard]))
    });
    kill(&mut run);

    let mut run = start();
    let stood: BTreeMap<&str, (u64, u64)> = shards.iter().map(|(shard, server)| (*shard, binlog_at(server))).collect();
    wait_running("both streams again", limit, &mut run, || {
        SHARDS.iter().all(|shard| stream_at(target, &name, shard).is_some_and(|at| at > stood[shard]))
    });
    // A column one shard adds reaches the shared table at once; the other shard's rows leave it
    // empty until that shard adds it too, under the load.
    east.sql(&format!(
        "ALTER TABLE {database}.accounts ADD COLUMN owner VARCHAR(20) NULL; \
         UPDATE {database}.accounts SET owner = 'east' WHERE id <= 10"
    ));
    let owners = |shard: &str| {
        target.sql(&format!("SELECT count(*) FROM {schema}.accounts WHERE owner = '{shard}'")).trim().to_owned()
    };
    wait_running("the column east added", limit, &mut run, || {
        target
            .sql(&format!(
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = '{schema}' \
             AND table_name = 'accounts' AND column_name = 'owner'"
            ))
            .trim()
            == "1"
            && owners("east") == "10"
    });
    west.sql(&format!(
        "ALTER TABLE {database}.accounts ADD COLUMN owner VARCHAR(20) NULL; \
         UPDATE {database}.accounts SET owner = 'west' WHERE id <= 5"
    ));
    wait_running("the column west added", limit, &mut run, || owners("west") == "5");
    for load in loads {
        load.stop();
    }
    let items = "id, v, coalesce(note, 'NULL')";
    let accounts = "id, balance, coalesce(owner, 'NULL')";
    let (expected_items, expected_accounts) =
        (union(&readers, &database, "items", items), union(&readers, &database, "accounts", accounts));
    assert!(expected_items.len() as u64 > ITEMS, "the shards hold their items");
    wait_running("the target to hold both shards", limit, &mut run, || {
        target_rows(target, &schema, "items", items) == expected_items
            && target_rows(target, &schema, "accounts", accounts) == expected_accounts
    });
    // Each shard's transfers keep its balances' sum; the target's rows of each say so too.
    let sums = target
        .sql(&format!("SELECT concat(_source, '=', sum(balance)) FROM {schema}.accounts GROUP BY _source ORDER BY 1"));
    let expected_sums: Vec<String> =
        SHARDS.iter().map(|shard| format!("{shard}/{database}.accounts={}", ACCOUNTS * 1000)).collect();
    assert_eq!(sums.lines().collect::<Vec<_>>(), expected_sums);
    signal(&run, "TERM");
    let output = run.into_inner().wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{printed}");
    // Each source's progress names it, with how far behind its server it is.
    for shard in SHARDS {
        let line = format!("{name}.{shard}: stream: streaming");
        assert!(
            printed.lines().any(|printed| printed.contains(&line) && printed.contains("behind the source")),
            "{line}: {printed}"
        );
    }
    let summary = support::summary(&workspace.path("summary.json"));
    assert_eq!(summary["job"], name.as_str());
    for shard in SHARDS {
        assert_eq!(summary["sources"][shard]["job"], format!("{name}.{shard}"), "{summary}");
    }

    // Each source is verified against its own rows of the shared tables.
    let verify = || {
        let verified = support::Run::from(command(&["verify", job.to_str().unwrap(), "--json"]).output().unwrap());
        let report: serde_json::Value =
            serde_json::from_str(&verified.stdout).unwrap_or_else(|error| panic!("{error}: {}", verified.all()));
        (verified.code, report)
    };
    let (code, report) = verify();
    assert_eq!(code, 0, "{report}");
    for (shard, server) in &shards {
        let tables = report["sources"][shard]["tables"].as_array().expect("tables per source");
        let items = tables.iter().find(|table| table["table"] == format!("{schema}.items")).expect("items verified");
        let rows: u64 = server.sql(&format!("SELECT count(*) FROM {database}.items")).parse().unwrap();
        assert_eq!(
            (items["rows_source"].as_u64(), items["rows_target"].as_u64()),
            (Some(rows), Some(rows)),
            "{report}"
        );
    }
    let west = format!("west/{database}.items");
    let lowest = target.sql(&format!("SELECT min(id) FROM {schema}.items WHERE _source = '{west}'"));
    target.sql(&format!("DELETE FROM {schema}.items WHERE _source = '{west}' AND id = {}", lowest.trim()));
    let (code, report) = verify();
    assert_eq!(code, 1, "{report}");
    let differences = |shard: &str| -> u64 {
        let tables = report["sources"][shard]["tables"].as_array().expect("tables per source");
        tables.iter().map(|table| table["differences_total"].as_u64().unwrap()).sum()
    };
    assert_eq!((differences("east"), differences("west")), (0, 1), "{report}");

    // `--restart` empties the shared tables once, then every source copies again: no source's
    // reset empties what another had copied (the deleted row is back, nothing else is lost).
    let restarted = command(&["run", job.to_str().unwrap(), "--restart"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice starts");
    let mut run = Guard::new(restarted);
    wait_running("the copies after a restart", limit, &mut run, || {
        target_rows(target, &schema, "items", items) == expected_items
            && target_rows(target, &schema, "accounts", accounts) == expected_accounts
    });
    signal(&run, "TERM");
    let output = run.into_inner().wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(verify().0, 0);
}

/// Two PostgreSQL databases as two shards (each its own slot and publication, its own WAL
/// position in the target), the same schema, tables and keys in both, under the transfer load
/// with large values the server does not send again, merged into one PostgreSQL schema through
/// a kill; a table without a key is refused first, by name.
#[test]
fn two_postgres_shards_merge_into_one_postgres_schema_exactly_once_through_a_kill() {
    use support::postgres_source::{self, SourceDatabase};
    let databases = [SourceDatabase::create("fanin_east"), SourceDatabase::create("fanin_west")];
    for database in &databases {
        database.sql(&postgres_source::create_tables_sql("shard", 2_000));
    }
    let (east_sql, west_sql) = (|sql: &str| databases[0].sql(sql), |sql: &str| databases[1].sql(sql));
    let readers: [Shard<'_>; 2] = [(SHARDS[0], &east_sql), (SHARDS[1], &west_sql)];
    let schema = unique_name("fanin_pg");
    let name = schema.replace('_', "-");
    let workspace = Workspace::new();
    let job_text = |tables: &str| {
        format!(
            "name: {name}\nmode: snapshot+cdc\nsources:\n  - {{name: east, type: postgres, url: \"${{EAST}}\", tables: {tables}}}\n\
             \x20 - {{name: west, type: postgres, url: \"${{WEST}}\", tables: {tables}}}\n\
             target: {{type: postgres, url: \"${{TARGET}}\"}}\nlimits: {{batch_rows: 200}}\n\
             route:\n  - {{source_table: \"shard\\\\..*\", sink_table: \"{schema}.<>\", replace_symbol: \"<>\", origin_column: _source}}\n"
        )
    };
    let start = |job: &std::path::Path| {
        let child = workspace
            .command(&["run", job.to_str().unwrap()])
            .env("EAST", databases[0].url())
            .env("WEST", databases[1].url())
            .env("TARGET", postgres_url())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice starts");
        Guard::new(child)
    };

    // The keyless `events` would be copied again by emptying the table the other shard fills too.
    let keyless = workspace.write("keyless.yaml", &job_text("[\"shard.*\"]"));
    let refused = support::Run::from(start(&keyless).into_inner().wait_with_output().unwrap());
    assert_eq!(refused.code, 2, "{}", refused.all());
    assert!(
        refused
            .stderr
            .contains("tables without a key cannot be merged with other sources' tables (source east): shard.events"),
        "{}",
        refused.stderr
    );

    let job = workspace.write("job.yaml", &job_text("[\"shard.*\", \"!shard.events\"]"));
    let loads: Vec<Load> = databases
        .iter()
        .zip(SHARDS)
        .map(|(database, shard)| {
            postgres_source::load(
                database,
                "shard",
                Random::from_environment(&format!("fan_in_pg_{shard}")),
                150,
                2_001,
            )
        })
        .collect();
    let stored = |shard: &str| postgres_source::stream_lsn(&format!("{name}.{shard}"));
    let limit = Duration::from_secs(120);
    let mut run = start(&job);
    wait_running("both streams", limit, &mut run, || SHARDS.iter().all(|shard| stored(shard).is_some()));
    let stood: Vec<u64> = databases.iter().map(SourceDatabase::wal_position).collect();
    wait_running("both streams to move on", limit, &mut run, || {
        SHARDS.iter().zip(&stood).all(|(shard, at)| stored(shard).is_some_and(|stored| stored > *at))
    });
    kill(&mut run);
    let mut run = start(&job);
    let stood: Vec<u64> = databases.iter().map(SourceDatabase::wal_position).collect();
    wait_running("both streams again", limit, &mut run, || {
        SHARDS.iter().zip(&stood).all(|(shard, at)| stored(shard).is_some_and(|stored| stored > *at))
    });
    for load in loads {
        load.stop();
    }
    let tables = [
        ("accounts", "id, balance"),
        ("items", "id, v, coalesce(note, 'NULL'), coalesce(tags::text, 'NULL'), coalesce(uid::text, 'NULL'), coalesce(at::text, 'NULL')"),
        ("docs", "id, small, md5(body)"),
        ("pairs", "a, b, v"),
    ];
    let expected: Vec<Vec<String>> =
        tables.iter().map(|(table, columns)| union(&readers, "shard", table, columns)).collect();
    wait_running("the target to hold both shards", limit, &mut run, || {
        tables
            .iter()
            .zip(&expected)
            .all(|((table, columns), expected)| target_rows(Target::Postgres, &schema, table, columns) == *expected)
    });
    let verified = support::Run::from(
        workspace
            .command(&["verify", job.to_str().unwrap()])
            .env("EAST", databases[0].url())
            .env("WEST", databases[1].url())
            .env("TARGET", postgres_url())
            .output()
            .unwrap(),
    );
    verified.assert_code(0);
    for shard in SHARDS {
        assert!(
            verified.stdout.contains(&format!("job {name}.{shard}: the target equals the source")),
            "{}",
            verified.stdout
        );
    }
    signal(&run, "TERM");
    let output = run.into_inner().wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}
