//! A write load on the test MariaDB for change-stream tests: one `mariadb` client fed SQL
//! through a pipe, so thousands of statements a second cost no process start each.

use std::io::Write;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{mariadb, psql};

/// A small deterministic generator (xorshift64*), seeded per test so a failure can be replayed.
#[derive(Debug, Clone)]
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed.max(1))
    }

    /// A seed from the clock, printed so a failing run can be repeated with `SLUICE_TEST_SEED`.
    pub fn from_environment(test: &str) -> Random {
        let seed = std::env::var("SLUICE_TEST_SEED").ok().and_then(|text| text.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
        eprintln!("{test}: SLUICE_TEST_SEED={seed}");
        Random::new(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }
}

/// A `mariadb` client reading statements from a pipe; errors (a duplicate key from a random
/// update) are printed and the client goes on.
pub struct Client {
    child: Child,
    input: ChildStdin,
}

impl Client {
    pub fn start(database: &str) -> Client {
        Client::start_with(super::mariadb_client(), database)
    }

    /// A client of the server `client` (a `mariadb` command) reaches.
    pub fn start_with(mut client: std::process::Command, database: &str) -> Client {
        client.args(["--force", database]);
        Client::spawn(client)
    }

    /// Any SQL client that reads statements from its standard input and goes on after an
    /// error (`mariadb --force`, `psql`).
    pub fn spawn(mut client: std::process::Command) -> Client {
        let mut child = client
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the SQL client");
        let input = child.stdin.take().expect("a piped stdin");
        Client { child, input }
    }

    pub fn send(&mut self, sql: &str) {
        self.input.write_all(sql.as_bytes()).expect("the client reads");
        self.input.write_all(b"\n").expect("the client reads");
    }

    /// Waits until every statement sent has run.
    pub fn finish(self) {
        let Client { mut child, input } = self;
        drop(input);
        child.wait().expect("the client ends");
    }
}

/// Tables `items (id, v, note)` and `accounts (id, balance)` and a load on them: inserts,
/// updates (a tenth on five hot keys), deletes, primary-key moves, and transfers between accounts
/// in multi-statement transactions that keep the sum of balances at `ACCOUNTS * 1000`.
pub struct Load {
    stop: Arc<AtomicBool>,
    pub statements: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

pub const ACCOUNTS: u64 = 200;
pub const ITEMS: u64 = 3_000;

/// Creates the tables with their first rows.
pub fn create_tables(database: &str) {
    mariadb(&create_tables_sql(database));
}

/// The statements that create the tables with their first rows.
pub fn create_tables_sql(database: &str) -> String {
    format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE items (id BIGINT PRIMARY KEY, v INT NOT NULL, note VARCHAR(64) NULL, KEY (v));
         INSERT INTO items SELECT seq, seq % 1000, CONCAT('item ', seq) FROM seq_1_to_{ITEMS};
         CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL);
         INSERT INTO accounts SELECT seq, 1000 FROM seq_1_to_{ACCOUNTS};"
    )
}

impl Load {
    /// Starts the load at about `per_second` statements a second; it runs until `stop`.
    pub fn start(database: &str, random: Random, per_second: u64) -> Load {
        Load::start_with(Client::start(database), random, per_second, ITEMS + 1)
    }

    /// The load through `client`, making new items from `first_id` on.
    pub fn start_with(client: Client, mut random: Random, per_second: u64, first_id: u64) -> Load {
        let mut next_id = first_id;
        Load::paced(client, per_second, move || {
            let id = 1 + random.below(next_id);
            let sql = match random.below(20) {
                0..=5 => {
                    next_id += 1;
                    format!(
                        "INSERT INTO items VALUES ({}, {}, 'new {}');",
                        next_id - 1,
                        random.below(1000),
                        random.next()
                    )
                }
                6..=9 => format!("UPDATE items SET v = v + 1, note = 'u{}' WHERE id = {id};", random.below(1000)),
                10..=11 => format!("UPDATE items SET v = v + 1 WHERE id = {};", 1 + random.below(5)),
                12..=13 => format!("DELETE FROM items WHERE id = {id};"),
                14 => {
                    // A primary-key move, to a key no one else uses.
                    next_id += 1;
                    format!("UPDATE items SET id = {} WHERE id = {id};", next_id - 1)
                }
                _ => {
                    let (from, to) = (1 + random.below(ACCOUNTS), 1 + random.below(ACCOUNTS));
                    let amount = 1 + random.below(50);
                    format!(
                        "BEGIN; UPDATE accounts SET balance = balance - {amount} WHERE id = {from}; \
                     INSERT INTO items VALUES ({}, 0, 'transfer'); \
                     UPDATE accounts SET balance = balance + {amount} WHERE id = {to}; COMMIT;",
                        {
                            next_id += 1;
                            next_id - 1
                        }
                    )
                }
            };
            sql
        })
    }

    /// A load of the statements `next` makes, sent through `client` at about `per_second` a
    /// second (a rate, not whatever the client can take) until `stop`.
    pub fn paced(mut client: Client, per_second: u64, mut next: impl FnMut() -> String + Send + 'static) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let statements = Arc::new(AtomicU64::new(0));
        let (flag, counter) = (stop.clone(), statements.clone());
        let thread = std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let mut sent = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let due = started + std::time::Duration::from_secs_f64(sent as f64 / per_second as f64);
                if let Some(early) = due.checked_duration_since(std::time::Instant::now()) {
                    std::thread::sleep(early);
                }
                sent += 1;
                client.send(&next());
                counter.fetch_add(1, Ordering::Relaxed);
            }
            client.finish();
        });
        Load { stop, statements, thread: Some(thread) }
    }

    /// Stops the load and waits until every statement sent has run.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the load thread ends");
        }
    }
}

/// The source's binlog position now, as (file sequence, offset).
pub fn source_position() -> (u64, u64) {
    let status = mariadb("SHOW MASTER STATUS");
    let mut fields = status.split('\t');
    let file = fields.next().expect("a binlog file");
    let offset = fields.next().expect("an offset").trim().parse().expect("a number");
    (file.rsplit('.').next().unwrap().parse().expect("a file sequence"), offset)
}

/// The stream's committed position in the target, as (file sequence, offset).
pub fn stream_position(target: &str, job: &str) -> Option<(u64, u64)> {
    let sql = format!("SELECT position FROM sluice.checkpoints WHERE job = '{job}' AND task = 'stream'");
    let text = if target == "postgres" {
        if psql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sluice'").trim() == "0" {
            return None;
        }
        psql(&sql)
    } else {
        if mariadb("SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'sluice'").trim() == "0" {
            return None;
        }
        mariadb(&sql)
    };
    let position: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let at = &position["at"];
    let file = at["file"].as_str()?;
    Some((file.rsplit('.').next()?.parse().ok()?, at["position"].as_u64()?))
}

/// Rows written by a job's tasks in the target (snapshot splits and the stream).
pub fn committed(target: &str, job: &str) -> u64 {
    let sql = format!("SELECT coalesce(sum(rows_written), 0) FROM sluice.checkpoints WHERE job = '{job}'");
    let text = if target == "postgres" {
        if psql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sluice'").trim() == "0" {
            return 0;
        }
        psql(&sql)
    } else {
        if mariadb("SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'sluice'").trim() == "0" {
            return 0;
        }
        mariadb(&sql)
    };
    text.trim().parse().unwrap_or(0)
}

/// A table's rows as `a|b|c` lines ordered by `id`, from the source or a target.
pub fn rows(side: &str, table: &str, columns: &[&str]) -> Vec<String> {
    let cast = if side == "postgres" { "::text" } else { "" };
    let list: Vec<String> = columns.iter().map(|column| format!("coalesce({column}{cast}, 'NULL')")).collect();
    let text = if side == "postgres" {
        psql(&format!("SELECT concat_ws('|', {}) FROM {table} ORDER BY id", list.join(", ")))
    } else {
        mariadb(&format!("SELECT concat_ws('|', {}) FROM {table} ORDER BY id", list.join(", ")))
    };
    text.lines().map(str::to_owned).collect()
}

/// Asserts two tables hold the same rows; on a difference, shows the first rows that differ.
pub fn assert_same(table: &str, source: &[String], target: &[String]) {
    if source == target {
        return;
    }
    let missing: Vec<&String> = source.iter().filter(|row| !target.contains(row)).take(5).collect();
    let extra: Vec<&String> = target.iter().filter(|row| !source.contains(row)).take(5).collect();
    panic!(
        "{table}: the target differs from the source ({} rows vs {}); missing or different in the target: {missing:?}; extra or different: {extra:?}",
        source.len(),
        target.len()
    );
}
