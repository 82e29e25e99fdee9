//! MySQL → Delta Lake, checked by an independent reader (Python's `deltalake`): the tables
//! follow the source through kills, compactions and an added column, and every version a reader
//! can open is a state the source had.

#![cfg(feature = "delta")]

mod support;

use std::path::PathBuf;
use std::time::Duration;

use support::workload::{create_tables, source_position, Load, Random, ACCOUNTS};
use support::{kill, lake, mariadb, mysql_url, signal, unique_name, wait_for, Guard, Workspace};

/// Whether a commit in a table's log holds `text`.
fn log_mentions(table: &std::path::Path, text: &str) -> bool {
    std::fs::read_dir(table.join("_delta_log")).into_iter().flatten().filter_map(|entry| entry.ok()).any(|entry| {
        entry.path().extension().is_some_and(|extension| extension == "json")
            && std::fs::read_to_string(entry.path()).is_ok_and(|commit| commit.contains(text))
    })
}

/// A `snapshot+cdc` job from a MariaDB database into Delta tables under the workspace's `lake`.
struct LakeJob {
    workspace: Workspace,
    file: PathBuf,
    name: String,
    database: String,
}

impl LakeJob {
    fn new(database: &str, target: &str, limits: &str) -> LakeJob {
        let workspace = Workspace::new();
        let name = database.replace('_', "-");
        let text = format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: delta\n  path: lake\n{target}parallelism: 2\nlimits: {{{limits}}}\n"
        );
        let file = workspace.write("job.yaml", &text);
        LakeJob { workspace, file, name, database: database.to_owned() }
    }

    fn lake(&self) -> PathBuf {
        self.workspace.path("lake")
    }

    fn table(&self, table: &str) -> PathBuf {
        self.lake().join(format!("{}.{table}", self.database))
    }

    fn start(&self) -> Guard {
        self.workspace.start_run(&self.file, &mysql_url(), "", &[])
    }

    /// Waits until the lake holds everything the source committed up to now.
    fn wait_converged(&self, child: &mut Guard) {
        let source = source_position();
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        while lake::stream_position(&self.lake(), &self.name).is_none_or(|at| at < source) {
            if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the stream did not reach the source's position {source:?} (at {:?}):\n{}",
                    lake::stream_position(&self.lake(), &self.name),
                    child.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The source's rows of `columns`, as the lake reader prints them.
    fn source_rows(&self, table: &str, columns: &[&str]) -> Vec<String> {
        let list: Vec<String> = columns.iter().map(|column| format!("coalesce({column}, 'NULL')")).collect();
        mariadb(&format!("SELECT {} FROM {}.{table} ORDER BY {}", list.join(", "), self.database, columns[0]))
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// Under a mixed write load (inserts, updates, deletes, key moves, transfers between accounts),
/// the job is SIGKILLed 6 times through its copy and its stream, an account column is added mid
/// stream and small files are compacted every few seconds; at the end each table read at its
/// latest version equals the source row for row, and at every version of the accounts table the
/// transfers' invariant holds (no partial transaction, no partial copy).
#[test]
fn a_lake_table_follows_the_source_through_kills_compactions_and_an_added_column() {
    const KILLS: usize = 6;
    let database = unique_name("lake");
    create_tables(&database);
    let job = LakeJob::new(
        &database,
        "  commit_interval_secs: 1\n  commit_rows: 2000\n  compact_every_secs: 2\n  target_file_mb: 1\n",
        "batch_rows: 100, split_rows: 50, rows_per_sec: 1500",
    );
    let mut random = Random::from_environment("a_lake_table_follows_the_source");
    let load = Load::start(&database, random.clone(), 300);
    let mut seen = 0;
    // At least two of the kills come while the stream runs.
    let mut kill_number = 0;
    let mut stream_kills = 0;
    while kill_number < KILLS || stream_kills < 2 {
        kill_number += 1;
        let mut child = job.start();
        wait_for("progress in the lake", Duration::from_secs(90), || {
            assert!(child.try_wait().unwrap().is_none(), "the run ended early:\n{}", child.stderr_text());
            lake::commits(&job.lake(), &job.name) > seen
        });
        std::thread::sleep(Duration::from_millis(500 + random.below(2500)));
        kill(&mut child);
        if lake::stream_position(&job.lake(), &job.name).is_some() {
            stream_kills += 1;
        }
        seen = lake::commits(&job.lake(), &job.name);
        if kill_number == KILLS / 2 + 1 {
            mariadb(&format!(
                "ALTER TABLE {database}.accounts ADD COLUMN note VARCHAR(20) NULL; UPDATE {database}.accounts SET note = CONCAT('n', id) WHERE id % 7 = 0"
            ));
        }
    }
    let mut child = job.start();
    load.stop();
    mariadb(&format!("UPDATE {database}.accounts SET note = 'last' WHERE id = 1"));
    job.wait_converged(&mut child);
    // Appends, each in a group of its own, leave small files for the compaction to join.
    let first = mariadb(&format!("SELECT max(id) + 1 FROM {database}.items")).trim().parse::<u64>().unwrap();
    for append in 0..8 {
        let from = first + append * 10;
        mariadb(&format!(
            "INSERT INTO {database}.items SELECT seq, 1, 'appended' FROM {database}.seq_{from}_to_{}",
            from + 9
        ));
        job.wait_converged(&mut child);
    }
    wait_for("a compaction of items", Duration::from_secs(60), || {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early:\n{}", child.stderr_text());
        log_mentions(&job.table("items"), "\"operation\":\"OPTIMIZE\"")
    });
    signal(&child, "TERM");
    let output = child.into_inner().wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let accounts = ["id", "balance", "note"];
    assert_eq!(lake::rows(&job.table("accounts"), &accounts), job.source_rows("accounts", &accounts));
    let items = ["id", "v", "note"];
    assert_eq!(lake::rows(&job.table("items"), &items), job.source_rows("items", &items));

    let total = (ACCOUNTS * 1000) as i64;
    let versions = lake::versions(&job.table("accounts"), "id", "balance");
    assert!(versions.len() > 3, "{versions:?}");
    for version in &versions {
        assert_eq!(
            (version.rows, version.distinct_keys, version.sum),
            (ACCOUNTS, ACCOUNTS, total),
            "version {} of accounts is not a state the source had: {versions:?}",
            version.version
        );
    }
    for version in lake::versions(&job.table("items"), "id", "v") {
        assert_eq!(version.rows, version.distinct_keys, "version {} of items holds a key twice", version.version);
    }
    let compactions = versions
        .iter()
        .chain(&lake::versions(&job.table("items"), "id", "v"))
        .filter(|version| version.operation == "OPTIMIZE")
        .count();
    assert!(compactions > 0, "no compaction ran: {versions:?}");
    eprintln!("{} versions of accounts, {compactions} compactions", versions.len());
}
