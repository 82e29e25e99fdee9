//! Crash points (`SLUICE_FAILPOINT`, built into the test command's binary): sluice aborts at each
//! step of a copy's commit, of the publishing of hidden copies, of a stream group's commit, of a
//! DDL statement, of a table taking its new schema and inside a lane's commit (the job applies on
//! 4 connections: `apply_parallelism`), at its first pass, then its second ...,
//! until a run passes every one. Every run after a crash resumes from what the target holds and
//! converges: no Conflict, no lost or doubled row, the target equal to the source. Into
//! PostgreSQL (DDL inside the group's transaction) and MySQL (DDL commits on its own).

use crate::support;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use support::workload::{rows, source_position, stream_position};
use support::{mariadb, mysql_url, postgres_url, psql, signal, unique_name, wait_for, Guard, Workspace};

/// SIGABRT: how a crash point ends the process.
const ABORTED: i32 = 6;

fn target_url(target: &str) -> String {
    if target == "postgres" {
        postgres_url()
    } else {
        mysql_url()
    }
}

struct Job {
    workspace: Workspace,
    file: std::path::PathBuf,
    name: String,
    target: &'static str,
    namespace: String,
}

impl Job {
    fn new(database: &str, target: &'static str) -> Job {
        let workspace = Workspace::new();
        let namespace = format!("{database}_{target}");
        let name = namespace.replace('_', "-");
        let file = workspace.write(
            "job.yaml",
            &format!(
                "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
                 target:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {namespace}\n\
                 parallelism: 1\napply_parallelism: 4\nlimits: {{batch_rows: 100, split_rows: 100}}\n"
            ),
        );
        Job { workspace, file, name, target, namespace }
    }

    fn start(&self, failpoint: &str) -> Guard {
        let child = self
            .workspace
            .command(&["run", self.file.to_str().unwrap()])
            .env("SOURCE", mysql_url())
            .env("TARGET", target_url(self.target))
            .env("SLUICE_FAILPOINT", failpoint)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("sluice starts");
        Guard::new(child)
    }

    /// Runs until a run passes no crash point: each run crashes at the next pass of `point`
    /// or converges (the stream holds everything the source committed). A point after a commit
    /// crashes at its first pass each time, since each crash leaves one step done; a point
    /// before one (`redone`) at its second once the first crashed, since the next run first
    /// does again the step that crashed, and one pass later each time a run left the stream
    /// where it was. Returns how many runs crashed.
    fn crash_at_every_pass(&self, point: &str, redone: bool) -> u32 {
        let mut crashes = 0;
        let mut previous = String::new();
        let mut pass = 1;
        loop {
            let before = stream_position(self.target, &self.name);
            let mut child = self.start(&format!("{point}@{pass}"));
            let source = source_position();
            let mut crashed = false;
            wait_for(&format!("a crash at {point} or the stream to converge"), Duration::from_secs(60), || {
                if let Some(status) = child.try_wait().expect("poll the run") {
                    assert_eq!(
                        status.signal(),
                        Some(ABORTED),
                        "the run ended by itself ({status}), not at {point}:\n{}\nThe run before:\n{previous}",
                        child.stderr_text()
                    );
                    crashed = true;
                    return true;
                }
                // Converged once this run's stream runs (so it takes SIGTERM as a stop) and the
                // target holds everything.
                child.stderr_text().contains("change stream starts after")
                    && stream_position(self.target, &self.name).is_some_and(|at| at >= source)
                    && self.hidden_tables() == 0
            });
            let child = child.into_inner();
            if !crashed {
                signal(&child, "TERM");
            }
            let output = child.wait_with_output().expect("the run ends");
            let text = String::from_utf8_lossy(&output.stderr).into_owned();
            if !crashed {
                // A converged run may still have crashed: at the commit of its stop, or at the
                // point right after what showed it converged. Else it stops cleanly.
                if output.status.signal() == Some(ABORTED) {
                    return crashes + 1;
                }
                assert_eq!(output.status.code(), Some(0), "a stopped stream exits 0:\n{text}");
                return crashes;
            }
            previous = text;
            if redone {
                pass = if stream_position(self.target, &self.name) == before { pass + 1 } else { 2 };
            }
            crashes += 1;
            assert!(crashes < 60, "{point} still crashes after 60 runs; the last run:\n{previous}");
        }
    }

    /// The target's rows of a table against the source's.
    fn assert_table(&self, database: &str, table: &str, columns: &[&str]) {
        let source = rows("mysql", &format!("{database}.{table}"), columns);
        let target = rows(self.target, &format!("{}.{table}", self.namespace), columns);
        assert_eq!(source, target, "{} table {table}", self.target);
    }

    /// How many hidden copies the target's namespace holds.
    fn hidden_tables(&self) -> u64 {
        let sql = format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name LIKE '\\_sluice\\_copy\\_%'",
            self.namespace
        );
        let found = if self.target == "postgres" { psql(&sql) } else { mariadb(&sql) };
        found.trim().parse().expect("a count")
    }

    fn assert_absent(&self, table: &str) {
        let sql = format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name = '{table}'",
            self.namespace
        );
        let found = if self.target == "postgres" { psql(&sql) } else { mariadb(&sql) };
        assert_eq!(found.trim(), "0", "{} still has table {table}", self.target);
    }
}

fn create_source(database: &str) {
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE a (id INT PRIMARY KEY, v INT NOT NULL, KEY (v));
         CREATE TABLE b (id INT PRIMARY KEY, v INT NOT NULL);
         INSERT INTO a SELECT seq, seq FROM seq_1_to_300;
         INSERT INTO b SELECT seq, seq FROM seq_1_to_300;"
    ));
}

/// Schema changes with rows around them, `round` making names and keys its own: a column
/// added, then rows of `b` (more than a batch, so the open target transaction holds some) and
/// the first rows of `a` with the new column in one transaction (a target whose DDL commits on
/// its own must not commit `b`'s rows with it), a column retyped, a
/// table created, emptied, renamed and dropped, the added column dropped.
fn schema_changes(database: &str, round: u32) {
    let key = 1_000 * (round + 1);
    mariadb(&format!(
        "USE {database};
         ALTER TABLE a ADD COLUMN c{round} INT NULL;
         BEGIN; INSERT INTO b VALUES ({key}, 1); INSERT INTO b SELECT {key} + 100 + seq, 1 FROM seq_1_to_250;
         INSERT INTO a VALUES ({key}, 1, 7); UPDATE b SET v = v + 1 WHERE id = 1; COMMIT;
         UPDATE a SET c{round} = id WHERE id <= 5;
         ALTER TABLE b MODIFY COLUMN v BIGINT NOT NULL;
         INSERT INTO b VALUES ({key} + 1, 5000000000);
         CREATE TABLE t{round} (id INT PRIMARY KEY, v INT); INSERT INTO t{round} VALUES (1, 1), (2, 2);
         TRUNCATE TABLE t{round}; INSERT INTO t{round} VALUES (3, 3);
         RENAME TABLE t{round} TO r{round}; INSERT INTO r{round} VALUES (4, 4);
         CREATE TABLE gone{round} (id INT PRIMARY KEY); INSERT INTO gone{round} VALUES (1); DROP TABLE gone{round};
         ALTER TABLE a DROP COLUMN c{round};
         INSERT INTO a VALUES ({key} + 1, 2); DELETE FROM b WHERE id = {key};"
    ));
}

fn crashes_converge(target: &'static str) {
    if !cfg!(feature = "failpoints") {
        panic!("crash points need the failpoints feature: cargo test --features sluice/failpoints (scripts/test.sh builds with it)");
    }
    // Kills inside the copy: at each batch's commit.
    let copied = unique_name("crash_copy");
    create_source(&copied);
    let job = Job::new(&copied, target);
    let crashes = job.crash_at_every_pass("copy.batch.committed", false);
    eprintln!("{target}: {crashes} crashes at copy.batch.committed");
    assert!(crashes >= 4, "a crash at every batch of the copy");
    job.assert_table(&copied, "a", &["id", "v"]);
    job.assert_table(&copied, "b", &["id", "v"]);

    // Kills while the copies are published, then at every step of the stream's groups and DDL.
    let database = unique_name("crash_stream");
    create_source(&database);
    let job = Job::new(&database, target);
    let publish = if target == "mysql" { "stream.publish.renamed" } else { "stream.group.committed" };
    assert!(job.crash_at_every_pass(publish, target == "mysql") >= 1, "a crash while the copies are published");
    let points = [
        ("stream.group.written", true),
        ("stream.group.committed", false),
        ("stream.ddl.applied", true),
        ("stream.schema.applied", true),
    ];
    for (round, (point, redone)) in points.into_iter().enumerate() {
        schema_changes(&database, round as u32);
        let crashes = job.crash_at_every_pass(point, redone);
        eprintln!("{target}: {crashes} crashes at {point}");
        assert!(crashes >= 2, "{point} was passed {crashes} times");
        job.assert_table(&database, "a", &["id", "v"]);
        job.assert_table(&database, "b", &["id", "v"]);
        job.assert_table(&database, &format!("r{round}"), &["id", "v"]);
        job.assert_absent(&format!("t{round}"));
        job.assert_absent(&format!("gone{round}"));
    }
    // Kills inside the lanes' commits: independent transactions make groups that several
    // connections write at once; each run crashes at the next lane whose turn came.
    independent_transactions(&database);
    let crashes = job.crash_at_every_pass("stream.lane.turn", true);
    eprintln!("{target}: {crashes} crashes at stream.lane.turn");
    assert!(crashes >= 2, "stream.lane.turn was passed {crashes} times");
    job.assert_table(&database, "a", &["id", "v"]);
    job.assert_table(&database, "b", &["id", "v"]);
    assert_eq!(job.hidden_tables(), 0, "hidden copies left behind");
}

/// Transactions that touch different keys of `a` and `b`, one or two rows each: a backlog the
/// stream folds into several groups, written side by side by its lanes.
fn independent_transactions(database: &str) {
    let mut sql = format!("USE {database};");
    for index in 0..400u64 {
        let key = 100_000 + index;
        if index.is_multiple_of(3) {
            sql.push_str(&format!(
                "BEGIN; INSERT INTO a VALUES ({key}, 1); UPDATE b SET v = v + 1 WHERE id = {}; COMMIT;",
                1 + index % 300
            ));
        } else {
            sql.push_str(&format!("INSERT INTO b VALUES ({key}, {index});"));
        }
    }
    mariadb(&sql);
}

#[test]
fn crashes_at_every_step_converge_into_postgres() {
    crashes_converge("postgres");
}

#[test]
fn crashes_at_every_step_converge_into_mysql() {
    crashes_converge("mysql");
}
