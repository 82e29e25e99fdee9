//! A PostgreSQL source database of its own on the test server (`scripts/test.sh` starts it with
//! `wal_level = logical`), SQL on it, its WAL position, and a load of transactions on it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::workload::{Client, Load, Random};
use super::{kill, postgres_url, psql, psql_at, signal, unique_name, wait_running, Workspace};

/// A database created for one test; its replication slots are dropped with it.
pub struct SourceDatabase {
    pub name: String,
    /// The URL of the server's `sluice` database, through which it was created.
    server: String,
}

impl SourceDatabase {
    /// The transfer load's tables (`create_tables_sql`) as lake readers print them: per table,
    /// the columns read and each row's values joined by tabs (a NULL note as `NULL`), by key.
    pub fn accounts_and_items(&self, schema: &str) -> [(&'static str, &'static [&'static str], Vec<String>); 2] {
        let rows = |table: &str, listed: &str| -> Vec<String> {
            self.sql(&format!("SELECT concat_ws(E'\\t', {listed}) FROM {schema}.{table} ORDER BY id"))
                .lines()
                .map(str::to_owned)
                .collect()
        };
        [
            ("accounts", &["id", "balance"], rows("accounts", "id, balance")),
            ("items", &["id", "v", "note"], rows("items", "id, v, coalesce(note, 'NULL')")),
        ]
    }

    /// A database on the shared test server.
    pub fn create(prefix: &str) -> SourceDatabase {
        SourceDatabase::create_on(&postgres_url(), prefix)
    }

    /// A database on the server whose `sluice` database is at `server`.
    pub fn create_on(server: &str, prefix: &str) -> SourceDatabase {
        let name = unique_name(prefix);
        psql_at(server, &format!("CREATE DATABASE {name}"));
        SourceDatabase { name, server: server.to_owned() }
    }

    /// The database's URL, with the test server's user and password.
    pub fn url(&self) -> String {
        let (base, _) = self.server.rsplit_once('/').expect("the test URL names a database");
        format!("{base}/{}", self.name)
    }

    /// Runs SQL in the database; the rows, `|`-separated.
    pub fn sql(&self, sql: &str) -> String {
        psql_at(&self.url(), sql)
    }

    /// The server's WAL write position now, as a number.
    pub fn wal_position(&self) -> u64 {
        lsn(self.sql("SELECT pg_current_wal_lsn()").trim()).expect("a WAL position")
    }

    /// Waits until no replication slot of this database is read (a stopped job's reader has
    /// ended on the server too).
    pub fn wait_slots_released(&self) {
        let reading = format!("SELECT count(*) FROM pg_replication_slots WHERE database = '{}' AND active", self.name);
        super::wait_for("the slots' readers to end", std::time::Duration::from_secs(30), || {
            self.sql(&reading).trim() == "0"
        });
    }

    /// The slots of this database.
    pub fn slots(&self) -> Vec<String> {
        let sql = format!("SELECT slot_name FROM pg_replication_slots WHERE database = '{}'", self.name);
        psql_at(&self.server, &sql).lines().map(str::to_owned).collect()
    }
}

impl Drop for SourceDatabase {
    fn drop(&mut self) {
        let sql = format!(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = '{0}' AND active_pid IS NOT NULL; \
             SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '{0}' AND NOT active",
            self.name
        );
        let _ = Command::new("psql").args([self.server.as_str(), "-X", "-q", "-c", &sql]).output();
    }
}

/// `X/Y` as a number.
pub fn lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some(u64::from_str_radix(high, 16).ok()? << 32 | u64::from_str_radix(low, 16).ok()?)
}

/// The WAL position a job's stream has stored in a PostgreSQL target's checkpoints.
pub fn stream_lsn(job: &str) -> Option<u64> {
    stream_lsn_in("postgres", job)
}

/// SQL on the test target server of `target` (`postgres` or `mysql`); the rows, one a line.
pub fn target_sql(target: &str, sql: &str) -> String {
    match target {
        "postgres" => psql(sql),
        _ => super::mariadb(sql),
    }
}

/// The WAL position a job's stream has stored in the checkpoints of a `postgres` or `mysql`
/// target.
pub fn stream_lsn_in(target: &str, job: &str) -> Option<u64> {
    stored_stream_lsn(&|sql| target_sql(target, sql), job)
}

/// The WAL position a job's stream has stored in the checkpoints of the target `sql` runs on.
pub fn stored_stream_lsn(sql: &dyn Fn(&str) -> String, job: &str) -> Option<u64> {
    let exists =
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sluice' AND table_name = 'checkpoints'";
    if sql(exists).trim() == "0" {
        return None;
    }
    let text = sql(&format!("SELECT position FROM sluice.checkpoints WHERE job = '{job}' AND task = 'stream'"));
    let position: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    lsn(position["at"]["lsn"].as_str()?)
}

pub const ACCOUNTS: u64 = 100;

/// `accounts (id, balance)`, `items (id, v, note, tags, uid, at)` with `items` rows, `docs (id,
/// small, body)` with 20 values of 40 kB that PostgreSQL stores out of line (the default replica
/// identity: an update of `small` alone does not send `body`), `pairs (a text, b int)` with a
/// composite text key and `events (k, note)` without a key (REPLICA IDENTITY FULL); in schema
/// `schema`.
pub fn create_tables_sql(schema: &str, items: u64) -> String {
    format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, {ACCOUNTS}) g;
         CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL, note text, tags int[], uid uuid, at timestamptz);
         INSERT INTO items SELECT g, g % 1000, 'item ' || g, ARRAY[g, NULL], md5(g::text)::uuid, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 second' FROM generate_series(1, {items}) g;
         CREATE TABLE docs (id int PRIMARY KEY, small int NOT NULL, body text);
         INSERT INTO docs SELECT g, 0, (SELECT string_agg(md5(g::text || '-' || i), '') FROM generate_series(1, 1250) i) FROM generate_series(1, 20) g;
         CREATE TABLE pairs (a text, b int, v int, PRIMARY KEY (a, b));
         INSERT INTO pairs SELECT 'k' || (g % 37), g, 0 FROM generate_series(1, 2000) g;
         CREATE TABLE events (k int, note text);
         ALTER TABLE events REPLICA IDENTITY FULL;
         INSERT INTO events SELECT g % 100, 'event' FROM generate_series(1, {items} / 4) g;"
    )
}

/// A load on the tables of `create_tables_sql` in `schema` of `database`, at about `per_second`
/// statements a second: inserts, updates, deletes and key moves of `items`; updates of `docs`'
/// small column beside large out-of-line values the server does not send, new large values, and
/// new documents updated in the transaction that inserts them; rows of the keyless `events`, and transfers
/// between `accounts` in transactions that keep the balances' sum at `ACCOUNTS * 1000`; new
/// items take ids from `first_id` on.
pub fn load(database: &SourceDatabase, schema: &str, mut random: Random, per_second: u64, first_id: u64) -> Load {
    let mut client = Client::spawn({
        let mut psql = Command::new("psql");
        psql.args([database.url().as_str(), "-X", "-q"]);
        psql
    });
    client.send(&format!("SET search_path = {schema};"));
    let mut next_id = first_id;
    Load::paced(client, per_second, move || {
        let id = 1 + random.below(next_id);
        let sql = match random.below(20) {
            0..=5 => {
                next_id += 1;
                format!(
                    "INSERT INTO items VALUES ({}, {}, 'new {}', '{{1,2}}', NULL, now());",
                    next_id - 1,
                    random.below(1000),
                    random.next()
                )
            }
            6..=8 => format!("UPDATE items SET v = v + 1, note = 'u{}' WHERE id = {id};", random.below(1000)),
            9 => match random.below(8) {
                // A new large value; an update of the row in the same transaction, which does
                // not send it again; a large value that leaves the table.
                0 => format!(
                    "UPDATE docs SET body = (SELECT string_agg(md5('{}' || i), '') FROM generate_series(1, 1250) i) WHERE id = {};",
                    random.next(),
                    1 + random.below(20)
                ),
                1 => {
                    next_id += 1;
                    format!(
                        "BEGIN; INSERT INTO docs SELECT {id}, 0, string_agg(md5('{id}-' || i), '') FROM generate_series(1, 1250) i; \
                         UPDATE docs SET small = 1 WHERE id = {id}; COMMIT;",
                        id = next_id - 1
                    )
                }
                2 => format!("DELETE FROM docs WHERE id > 20 AND id < {id};"),
                _ => format!("UPDATE docs SET small = small + 1 WHERE id = {};", 1 + random.below(20)),
            },
            10 => format!("UPDATE pairs SET v = v + 1 WHERE a = 'k{}';", random.below(37)),
            // A table without a key: duplicates, and one of two equal rows deleted.
            15 => format!("INSERT INTO events VALUES ({}, 'new');", random.below(100)),
            16 => format!(
                "DELETE FROM events WHERE ctid = (SELECT ctid FROM events WHERE k = {} LIMIT 1);",
                random.below(100)
            ),
            11..=12 => format!("DELETE FROM items WHERE id = {id};"),
            13 => {
                next_id += 1;
                format!("UPDATE items SET id = {} WHERE id = {id};", next_id - 1)
            }
            _ => {
                let (from, to) = (1 + random.below(ACCOUNTS), 1 + random.below(ACCOUNTS));
                let amount = 1 + random.below(50);
                next_id += 1;
                format!(
                    "BEGIN; UPDATE accounts SET balance = balance - {amount} WHERE id = {from}; \
                     INSERT INTO items VALUES ({}, 0, 'transfer', NULL, NULL, NULL); \
                     UPDATE accounts SET balance = balance + {amount} WHERE id = {to}; COMMIT;",
                    next_id - 1
                )
            }
        };
        sql
    })
}

/// Runs `job` (`snapshot+cdc` from `source`) under the transfer load on `schema` (`seed`),
/// SIGKILLs it once it streams and its stored WAL position (`stored`) moved on, runs it again,
/// stops the load, waits until the stored position passes the source's, and stops the run with
/// SIGTERM: a lake's journal holds a group's position before each table has taken its commit (a
/// run killed in between finishes it when it starts again), so the run ends on its own before
/// the tables are read.
pub fn stream_through_a_kill(
    workspace: &Workspace,
    job: &Path,
    source: &SourceDatabase,
    schema: &str,
    seed: &str,
    stored: impl Fn() -> Option<u64>,
) {
    let limit = Duration::from_secs(120);
    let load = load(source, schema, Random::from_environment(seed), 200, 1_000_000);
    let mut run = workspace.start_run(job, &source.url(), "", &[]);
    wait_running("the stream", limit, &mut run, || stored().is_some());
    let started = source.wal_position();
    wait_running("the stream to move on", limit, &mut run, || stored().is_some_and(|at| at > started));
    kill(&mut run);
    let mut run = workspace.start_run(job, &source.url(), "", &[]);
    let again = source.wal_position();
    wait_running("the stream again", limit, &mut run, || stored().is_some_and(|at| at > again));
    load.stop();
    let stopped = source.wal_position();
    wait_running("the stream to reach the source", limit, &mut run, || stored().is_some_and(|at| at >= stopped));
    signal(&run, "TERM");
    let output = run.into_inner().wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}
