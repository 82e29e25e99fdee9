//! Source failover by GTID, on a real MariaDB primary and replica of their own (started here by
//! scripts/testdb): the replica is promoted while a write load runs, the job is pointed at it and
//! resumes after the GTIDs of its checkpoint with nothing lost or doubled; a promoted replica
//! that lacks transactions the job already has is refused as a lost position, writing nothing.

use crate::support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use support::mariadb_server::MariadbServer as Server;
use support::workload::{assert_same, create_tables_sql, Client, Load, Random, ITEMS};
use support::{mariadb_client_at, postgres_url, psql, signal, unique_name, wait_for, Guard, Workspace};

/// A target table's rows as `a|b|c` lines ordered by `id`; none while the table is not there.
fn target_rows(table: &str, columns: &[&str]) -> Vec<String> {
    if psql(&format!("SELECT to_regclass('{table}') IS NULL")).trim() == "t" {
        return Vec::new();
    }
    let list: Vec<String> = columns.iter().map(|column| format!("coalesce({column}::text, 'NULL')")).collect();
    psql(&format!("SELECT concat_ws('|', {}) FROM {table} ORDER BY id", list.join(", ")))
        .lines()
        .map(str::to_owned)
        .collect()
}

const TABLES: [(&str, &[&str]); 2] = [("items", &["id", "v", "note"]), ("accounts", &["id", "balance"])];

/// A primary with tables and a replica of it, and a snapshot+cdc job from the primary into
/// PostgreSQL.
struct Pair {
    primary: Server,
    replica: Server,
    database: String,
    workspace: Workspace,
    job: PathBuf,
}

impl Pair {
    fn start() -> Pair {
        let (primary, replica) = (Server::start(), Server::start());
        replica.replicate(&primary);
        let database = unique_name("failover");
        primary.sql(&create_tables_sql(&database));
        replica.catch_up(&primary);
        let workspace = Workspace::new();
        let name = database.replace('_', "-");
        let job = workspace.write(
            "job.yaml",
            &format!(
                "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  namespace: {database}\nlimits: {{batch_rows: 200}}\n"
            ),
        );
        Pair { primary, replica, database, workspace, job }
    }

    fn run(&self, source: &Server) -> Guard {
        self.workspace.start_run(&self.job, source.url(), &postgres_url(), &[])
    }

    fn load(&self, server: &Server, first_id: u64) -> Load {
        let client = Client::start_with(mariadb_client_at(&server.socket()), &self.database);
        Load::start_with(client, Random::from_environment("failover"), 200, first_id)
    }

    fn target_has(&self, server: &Server) -> bool {
        TABLES.iter().all(|(table, columns)| {
            let name = format!("{}.{table}", self.database);
            target_rows(&name, columns) == server.rows(&name, columns)
        })
    }

    fn committed(&self) -> u64 {
        psql(&format!(
            "SELECT coalesce(sum(rows_written), 0) FROM sluice.checkpoints WHERE job = '{}' AND task = 'stream'",
            self.database.replace('_', "-")
        ))
        .trim()
        .parse()
        .unwrap_or(0)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| psql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.database)));
    }
}

#[test]
fn a_job_pointed_at_the_promoted_replica_resumes_by_gtid_with_nothing_lost_or_doubled() {
    let pair = Pair::start();
    let first = pair.run(&pair.primary);
    let load = pair.load(&pair.primary, ITEMS + 1);
    wait_for("the stream to apply the load", Duration::from_secs(120), || pair.committed() > 200);
    // A switchover: the load pauses while the replica catches up and takes over, then goes on
    // against it; the old primary dies.
    load.stop();
    pair.replica.catch_up(&pair.primary);
    pair.replica.promote();
    let load = pair.load(&pair.replica, 10_000_000);
    pair.primary.kill();
    // The job is pointed at the new primary (its URL changed) and runs again.
    let first = first.into_inner();
    signal(&first, "TERM");
    first.wait_with_output().unwrap();
    let mut second = pair.run(&pair.replica);
    let stderr = second.stderr_view();
    wait_for("the stream to resume on the new primary", Duration::from_secs(60), || {
        stderr().contains("resuming after GTID")
    });
    let resumed = pair.committed();
    wait_for("the stream to apply the new primary's load", Duration::from_secs(60), || {
        pair.committed() > resumed + 100
    });
    load.stop();
    let deadline = Instant::now() + Duration::from_secs(120);
    while !pair.target_has(&pair.replica) {
        assert!(second.try_wait().unwrap().is_none(), "the run ended:\n{}", stderr());
        assert!(Instant::now() < deadline, "the target did not converge:\n{}", stderr());
        std::thread::sleep(Duration::from_millis(200));
    }
    for (table, columns) in TABLES {
        let name = format!("{}.{table}", pair.database);
        assert_same(table, &pair.replica.rows(&name, columns), &target_rows(&name, columns));
    }
    let sum = psql(&format!("SELECT sum(balance) FROM {}.accounts", pair.database));
    assert_eq!(sum.trim(), "200000", "the transfers kept the sum");
    let second = second.into_inner();
    signal(&second, "TERM");
    let output = second.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn a_promoted_replica_without_the_jobs_last_transactions_is_refused_and_nothing_is_written() {
    let pair = Pair::start();
    let run = pair.run(&pair.primary);
    wait_for("the copy and the stream", Duration::from_secs(120), || pair.target_has(&pair.primary));
    // The replica stops applying; the primary commits more, which the job streams, then dies.
    pair.replica.sql("STOP SLAVE");
    pair.primary.sql(&format!("INSERT INTO {}.items VALUES (99999999, 1, 'only on the old primary')", pair.database));
    let items = format!("{}.items", pair.database);
    wait_for("the job to apply the last row", Duration::from_secs(60), || {
        psql(&format!("SELECT count(*) FROM {items} WHERE id = 99999999")).trim() == "1"
    });
    pair.replica.promote();
    pair.primary.kill();
    let run = run.into_inner();
    signal(&run, "TERM");
    run.wait_with_output().unwrap();
    let before = target_rows(&items, &["id", "v", "note"]);
    let output = pair
        .workspace
        .start_run(&pair.job, pair.replica.url(), &postgres_url(), &[])
        .into_inner()
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("SOURCE_POSITION_LOST") && stderr.contains("not in the master's binlog"), "{stderr}");
    assert!(!stderr.contains("restarting from its checkpoints"), "a lost position is not restarted: {stderr}");
    assert_eq!(target_rows(&items, &["id", "v", "note"]), before, "nothing was written");
}
