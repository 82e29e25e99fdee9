//! Lanes (`apply_parallelism`): a stream's groups are written on several target connections at
//! once and committed in the source's order. One client commits numbered transactions (a row of
//! `log` each, some with a transfer between accounts); a sampler reading the target while the
//! stream runs, through SIGKILLs, must never see a later transaction without every earlier one
//! (the ids in `log` have no gap) nor a transfer half done; the target ends equal to the source,
//! and more than one connection committed groups.

use crate::support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::workload::{assert_same, committed, rows, Client, Load};
use support::{kill, mariadb, mysql_url, postgres_url, unique_name, wait_for, Workspace};

const ACCOUNTS: u64 = 500;

/// What the sampler read in one statement: ids in `log`, the highest id, the sum of balances;
/// `None` while the tables are not there yet.
fn sample(target: &str, namespace: &str) -> Option<(u64, u64, i64)> {
    let sql = format!(
        "SELECT (SELECT count(*) FROM {namespace}.log), (SELECT coalesce(max(id), 0) FROM {namespace}.log), \
         (SELECT sum(balance) FROM {namespace}.accounts)"
    );
    let output = if target == "postgres" {
        std::process::Command::new("psql").args([postgres_url().as_str(), "-X", "-At", "-F", "\t", "-c", &sql]).output()
    } else {
        support::mariadb_client().args(["--skip-column-names", "-e", &sql]).output()
    }
    .expect("run the target's client");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("does not exist") || stderr.contains("doesn't exist"), "sampling failed: {stderr}");
        return None;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let fields: Vec<&str> = text.trim().split('\t').collect();
    let number = |index: usize| fields.get(index).and_then(|field| field.parse::<i64>().ok());
    Some((number(0)? as u64, number(1)? as u64, number(2)?))
}

fn lanes_commit_in_the_sources_order(target: &'static str) {
    let database = unique_name("lanes");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE log (id BIGINT PRIMARY KEY, account INT NOT NULL, note VARCHAR(40) NOT NULL, UNIQUE KEY (note));
         CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL);
         INSERT INTO accounts SELECT seq, 1000 FROM seq_1_to_{ACCOUNTS};"
    ));
    let namespace = format!("{database}_{target}");
    let name = namespace.replace('_', "-");
    let workspace = Workspace::new();
    // Small groups, so that many are in flight at once.
    let file = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {namespace}\napply_parallelism: 4\n\
             limits: {{batch_rows: 20}}\n"
        ),
    );
    let target_url = if target == "postgres" { postgres_url() } else { mysql_url() };
    // Numbered transactions from one client: the source commits them in id order. One in four
    // moves money between two accounts in the same transaction.
    let mut next = 0u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let load = Load::paced(Client::start(&database), 600, move || {
        next += 1;
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let (from, to) = (1 + seed % ACCOUNTS, 1 + (seed >> 20) % ACCOUNTS);
        if next.is_multiple_of(4) {
            format!(
                "BEGIN; INSERT INTO log VALUES ({next}, {from}, 'n{next}'); \
                 UPDATE accounts SET balance = balance - 7 WHERE id = {from}; \
                 UPDATE accounts SET balance = balance + 7 WHERE id = {to}; COMMIT;"
            )
        } else {
            format!("INSERT INTO log VALUES ({next}, {from}, 'n{next}');")
        }
    });
    let total = (ACCOUNTS * 1000) as i64;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, seen, namespace) = (stop.clone(), seen.clone(), namespace.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some((count, highest, sum)) = sample(target, &namespace) {
                    assert_eq!(
                        count, highest,
                        "the target holds {count} transactions up to id {highest}: one committed before an earlier one"
                    );
                    assert_eq!(sum, total, "a transfer was seen half applied");
                    seen.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let alive = || assert!(!sampler.is_finished(), "the sampler stopped: it saw a state the source never had");
    let mut progress = 0;
    for _ in 0..3 {
        let mut child = workspace.start_run(&file, &mysql_url(), &target_url, &[]);
        wait_for("progress in the target", Duration::from_secs(60), || {
            alive();
            committed(target, &name) > progress + 200
        });
        kill(&mut child);
        progress = committed(target, &name);
    }
    let child = workspace.start_run(&file, &mysql_url(), &target_url, &[]);
    // Each sample is a client process: under the whole suite's load one can take half a second.
    wait_for("samples of the streamed tables", Duration::from_secs(180), || {
        alive();
        seen.load(Ordering::Relaxed) >= 200
    });
    load.stop();
    let highest: u64 = mariadb(&format!("SELECT max(id) FROM {database}.log")).trim().parse().unwrap();
    wait_for("the target to hold every transaction", Duration::from_secs(120), || {
        alive();
        sample(target, &namespace).is_some_and(|(count, _, _)| count == highest)
    });
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("the sampler saw only states the source had");
    let child = child.into_inner();
    support::signal(&child, "TERM");
    let output = String::from_utf8_lossy(&child.wait_with_output().expect("the run ends").stderr).into_owned();
    assert!(output.contains("applies on 4 target connections"), "{output}");
    for (table, columns) in [("log", &["id", "account", "note"][..]), ("accounts", &["id", "balance"][..])] {
        let source = rows("mysql", &format!("{database}.{table}"), columns);
        let copy = rows(target, &format!("{namespace}.{table}"), columns);
        assert_same(table, &source, &copy);
    }
    if target == "mysql" {
        // Each lane counts its transactions in a row of its own.
        let lanes = mariadb(&format!(
            "SELECT count(*) FROM sluice.writes WHERE job = '{name}' AND task LIKE 'stream/%' AND transactions > 0"
        ));
        assert!(lanes.trim().parse::<u64>().unwrap() >= 1, "no lane but the first committed a group");
    }
}

#[test]
fn lanes_commit_in_the_sources_order_into_mysql() {
    lanes_commit_in_the_sources_order("mysql");
}

#[test]
fn lanes_commit_in_the_sources_order_into_postgres() {
    lanes_commit_in_the_sources_order("postgres");
}
