//! The standalone state store: one SQLite database, `state.db`, under `--state-dir`.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use sluice_core::change::{Position, Rejected};
use sluice_core::connector::Checkpoint;
use sluice_core::runner::{DirtyEntry, ReplayReport, Verdict};
use sluice_core::state::{Plan, StateStore};
use sluice_core::stats::{RunSummary, StreamSummary};
use sluice_core::{Error, Result};

/// Version of the stored layout; bumped when tables change, checked on open.
const LAYOUT_VERSION: i64 = 1;

#[derive(Debug)]
pub struct SqliteStateStore {
    connection: Mutex<Connection>,
    directory: PathBuf,
}

fn state_error(doing: &str, error: impl std::fmt::Display) -> Error {
    Error::state(format!("{doing}: {error}"))
}

impl SqliteStateStore {
    /// Opens (creating when missing) the store in `directory`.
    pub fn open(directory: &Path) -> Result<SqliteStateStore> {
        crate::private_files::create_dir(directory).map_err(|error| {
            state_error(&format!("cannot create the state directory {}", directory.display()), error)
                .hint("choose a writable --state-dir")
        })?;
        let path = directory.join("state.db");
        let connection =
            Connection::open(&path).map_err(|error| state_error(&format!("cannot open {}", path.display()), error))?;
        // SQLite gives the WAL and shared-memory files it creates the database file's mode.
        for file in ["state.db", "state.db-wal", "state.db-shm"].map(|name| directory.join(name)) {
            if file.exists() {
                crate::private_files::restrict(&file)
                    .map_err(|error| state_error(&format!("cannot make {} private", file.display()), error))?;
            }
        }
        connection
            .busy_timeout(std::time::Duration::from_secs(30))
            .and_then(|()| {
                connection.execute_batch(
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
                     CREATE TABLE IF NOT EXISTS layout (version INTEGER NOT NULL);
                     CREATE TABLE IF NOT EXISTS plans (job TEXT PRIMARY KEY, plan TEXT NOT NULL, updated_at TEXT NOT NULL);
                     CREATE TABLE IF NOT EXISTS checkpoints (job TEXT NOT NULL, task TEXT NOT NULL, position TEXT, done INTEGER NOT NULL,
                         rows_written INTEGER NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (job, task));
                     CREATE TABLE IF NOT EXISTS dirty_records (id INTEGER PRIMARY KEY, job TEXT NOT NULL, task TEXT NOT NULL,
                         table_name TEXT NOT NULL, key TEXT NOT NULL, reason TEXT NOT NULL, record TEXT, change TEXT, created_at TEXT NOT NULL,
                         UNIQUE (job, task, table_name, key));
                     CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY, job TEXT NOT NULL, status TEXT NOT NULL,
                         summary TEXT NOT NULL, finished_at TEXT NOT NULL);
                     CREATE TABLE IF NOT EXISTS stream_status (job TEXT PRIMARY KEY, status TEXT NOT NULL, updated_at TEXT NOT NULL);",
                )
            })
            .map_err(|error| state_error(&format!("cannot prepare {}", path.display()), error))?;
        add_change_column(&connection)
            .map_err(|error| state_error(&format!("cannot prepare {}", path.display()), error))?;
        let version: Option<i64> = connection
            .query_row("SELECT version FROM layout", [], |row| row.get(0))
            .optional()
            .map_err(|error| state_error("cannot read the state layout", error))?;
        match version {
            None => {
                connection
                    .execute("INSERT INTO layout (version) VALUES (?1)", [LAYOUT_VERSION])
                    .map_err(|error| state_error("cannot write the state layout", error))?;
            }
            Some(LAYOUT_VERSION) => {}
            Some(other) => {
                return Err(Error::state(format!(
                    "{} has layout version {other}; this sluice reads version {LAYOUT_VERSION}",
                    path.display()
                ))
                .hint("use the sluice version that wrote it, or a new --state-dir"))
            }
        }
        Ok(SqliteStateStore { connection: Mutex::new(connection), directory: directory.to_owned() })
    }

    /// The job's dirty records with their ids and tasks, oldest first, for a replay.
    pub fn dirty_entries(&self, job: &str) -> Result<Vec<DirtyEntry>> {
        let connection = self.connection();
        let mut statement = connection
            .prepare(&format!("SELECT id, task, {RECORD_COLUMNS} FROM dirty_records WHERE job = ?1 ORDER BY id"))
            .map_err(|error| state_error("cannot read dirty records", error))?;
        let entries = statement
            .query_map([job], |row| {
                Ok(DirtyEntry { id: row.get::<_, i64>(0)?.to_string(), task: row.get(1)?, record: rejected(row, 2)? })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|error| state_error("cannot read dirty records", error))?;
        Ok(entries)
    }

    /// Keeps what a replay of the job's dirty records found, in one transaction: the records
    /// written go, those refused again take their new reason, rows refused under another key
    /// are kept too.
    pub fn settle_replay(&self, job: &str, report: &ReplayReport) -> Result<()> {
        let mut connection = self.connection();
        let settle = |connection: &mut Connection| -> rusqlite::Result<()> {
            let transaction = connection.transaction()?;
            for (id, verdict) in &report.verdicts {
                match verdict {
                    Verdict::Written => {
                        transaction
                            .execute("DELETE FROM dirty_records WHERE job = ?1 AND id = ?2", params![job, id])?;
                    }
                    Verdict::Refused(reason) => {
                        transaction.execute(
                            "UPDATE dirty_records SET reason = ?3 WHERE job = ?1 AND id = ?2",
                            params![job, id, reason],
                        )?;
                    }
                    Verdict::Kept(_) => {}
                }
            }
            for (task, reject) in &report.others {
                insert_dirty(&transaction, job, task, reject)?;
            }
            transaction.commit()
        };
        settle(&mut connection).map_err(|error| state_error("cannot keep the replay's outcome", error))
    }

    fn connection(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Writes the job's dirty records as JSON Lines to `<state-dir>/<job>/dirty.jsonl`, for
    /// operators to read with any tool. Returns the file's path.
    pub fn export_dirty(&self, job: &str) -> Result<PathBuf> {
        let records = self.dirty_records(job)?;
        let directory = self.directory.join(job);
        let path = directory.join("dirty.jsonl");
        let mut text = String::new();
        for record in &records {
            text.push_str(&serde_json::to_string(record).expect("records serialize"));
            text.push('\n');
        }
        crate::private_files::create_dir(&directory)
            .and_then(|()| crate::private_files::write(&path, text.as_bytes()))
            .map_err(|error| state_error(&format!("cannot write {}", path.display()), error))?;
        Ok(path)
    }
}

/// The columns of a dirty record that `rejected` reads, in its order.
const RECORD_COLUMNS: &str = "table_name, key, reason, record, change";

/// A dirty record read from `RECORD_COLUMNS`, starting at column `first`.
fn rejected(row: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Rejected> {
    let change: Option<String> = row.get(first + 4)?;
    Ok(Rejected {
        table: row.get(first)?,
        key: row.get(first + 1)?,
        reason: row.get(first + 2)?,
        record: row.get(first + 3)?,
        change: change.and_then(|text| serde_json::from_str(&text).ok()),
    })
}

/// Keeps one dirty record: a copied row's first rejection stays (a batch replayed after a crash
/// does not count it twice); a change the stream left out replaces the record of its key.
fn insert_dirty(connection: &Connection, job: &str, task: &str, record: &Rejected) -> rusqlite::Result<usize> {
    let change = record.change.as_ref().map(|change| serde_json::to_string(change).expect("records serialize"));
    let conflict = if record.of_stream() {
        "DO UPDATE SET reason = excluded.reason, record = excluded.record, change = excluded.change"
    } else {
        "DO NOTHING"
    };
    connection.execute(
        &format!(
            "INSERT INTO dirty_records (job, task, table_name, key, reason, record, change, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, strftime('%Y-%m-%dT%H:%M:%fZ'))
             ON CONFLICT (job, task, table_name, key) {conflict}"
        ),
        params![job, task, record.table, record.key, record.reason, record.record, change],
    )
}

/// Gives `dirty_records` the column of a stream's change (its position and row before), which
/// state directories made before it lack.
fn add_change_column(connection: &Connection) -> rusqlite::Result<()> {
    let present: bool = connection.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info('dirty_records') WHERE name = 'change'",
        [],
        |row| row.get(0),
    )?;
    if !present {
        connection.execute_batch("ALTER TABLE dirty_records ADD COLUMN change TEXT")?;
    }
    Ok(())
}

impl StateStore for SqliteStateStore {
    fn load_plan(&self, job: &str) -> Result<Option<Plan>> {
        let text: Option<String> = self
            .connection()
            .query_row("SELECT plan FROM plans WHERE job = ?1", [job], |row| row.get(0))
            .optional()
            .map_err(|error| state_error("cannot read the plan", error))?;
        text.map(|text| {
            serde_json::from_str(&text).map_err(|error| {
                state_error(&format!("the stored plan of job {job} is unreadable"), error).hint("use a new --state-dir")
            })
        })
        .transpose()
    }

    fn save_plan(&self, job: &str, plan: &Plan) -> Result<()> {
        let text = serde_json::to_string(plan).expect("plans serialize");
        self.connection()
            .execute(
                "INSERT INTO plans (job, plan, updated_at) VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ'))
                 ON CONFLICT (job) DO UPDATE SET plan = excluded.plan, updated_at = excluded.updated_at",
                params![job, text],
            )
            .map_err(|error| state_error("cannot save the plan", error))?;
        Ok(())
    }

    fn save_checkpoint(&self, job: &str, checkpoint: &Checkpoint) -> Result<()> {
        let position = checkpoint.position.as_ref().map(|position| position.0.to_string());
        // Saved after every batch: the statement is prepared once per connection.
        self.connection()
            .prepare_cached(
                "INSERT INTO checkpoints (job, task, position, done, rows_written, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, strftime('%Y-%m-%dT%H:%M:%fZ'))
                 ON CONFLICT (job, task) DO UPDATE SET position = excluded.position, done = excluded.done,
                     rows_written = excluded.rows_written, updated_at = excluded.updated_at
                 WHERE excluded.rows_written >= checkpoints.rows_written",
            )
            .and_then(|mut statement| {
                statement.execute(params![job, checkpoint.task, position, checkpoint.done, checkpoint.rows_written])
            })
            .map_err(|error| state_error("cannot save a checkpoint", error))?;
        Ok(())
    }

    fn checkpoints(&self, job: &str) -> Result<Vec<Checkpoint>> {
        let connection = self.connection();
        let mut statement = connection
            .prepare("SELECT task, position, done, rows_written FROM checkpoints WHERE job = ?1 ORDER BY task")
            .map_err(|error| state_error("cannot read checkpoints", error))?;
        let rows = statement
            .query_map([job], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<String>>(1)?,
                    row.get::<_, bool>(2)?,
                    row.get::<_, u64>(3)?,
                ))
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|error| state_error("cannot read checkpoints", error))?;
        Ok(rows
            .into_iter()
            .map(|(task, position, done, rows_written)| Checkpoint {
                task,
                position: position.and_then(|text| serde_json::from_str(&text).ok()).map(Position),
                done,
                rows_written,
            })
            .collect())
    }

    fn record_dirty(&self, job: &str, task: &str, records: &[Rejected]) -> Result<u64> {
        let mut connection = self.connection();
        let transaction = connection.transaction().map_err(|error| state_error("cannot store dirty records", error))?;
        for record in records {
            insert_dirty(&transaction, job, task, record)
                .map_err(|error| state_error("cannot store a dirty record", error))?;
        }
        let total: u64 = transaction
            .query_row("SELECT count(*) FROM dirty_records WHERE job = ?1", [job], |row| row.get(0))
            .map_err(|error| state_error("cannot count dirty records", error))?;
        transaction.commit().map_err(|error| state_error("cannot store dirty records", error))?;
        Ok(total)
    }

    fn dirty_records(&self, job: &str) -> Result<Vec<Rejected>> {
        let connection = self.connection();
        let mut statement = connection
            .prepare(&format!("SELECT {RECORD_COLUMNS} FROM dirty_records WHERE job = ?1 ORDER BY id"))
            .map_err(|error| state_error("cannot read dirty records", error))?;
        let records = statement
            .query_map([job], |row| rejected(row, 0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
            .map_err(|error| state_error("cannot read dirty records", error))?;
        Ok(records)
    }

    fn record_run(&self, summary: &RunSummary) -> Result<()> {
        let text = serde_json::to_string(summary).expect("summaries serialize");
        self.connection()
            .execute(
                "INSERT INTO runs (job, status, summary, finished_at) VALUES (?1, ?2, ?3, strftime('%Y-%m-%dT%H:%M:%fZ'))",
                params![summary.job, summary.status.to_string(), text],
            )
            .map_err(|error| state_error("cannot record the run", error))?;
        Ok(())
    }

    fn save_stream_status(&self, job: &str, status: &StreamSummary) -> Result<()> {
        let text = serde_json::to_string(status).expect("summaries serialize");
        self.connection()
            .execute(
                "INSERT INTO stream_status (job, status, updated_at) VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ'))
                 ON CONFLICT (job) DO UPDATE SET status = excluded.status, updated_at = excluded.updated_at",
                params![job, text],
            )
            .map_err(|error| state_error("cannot save the stream status", error))?;
        Ok(())
    }

    fn stream_status(&self, job: &str) -> Result<Option<serde_json::Value>> {
        let text: Option<String> = self
            .connection()
            .query_row("SELECT status FROM stream_status WHERE job = ?1", [job], |row| row.get(0))
            .optional()
            .map_err(|error| state_error("cannot read the stream status", error))?;
        Ok(text.and_then(|text| serde_json::from_str(&text).ok()))
    }

    fn forget(&self, job: &str) -> Result<()> {
        let connection = self.connection();
        let forget = || -> rusqlite::Result<()> {
            let transaction = connection.unchecked_transaction()?;
            for table in ["plans", "checkpoints", "dirty_records", "stream_status"] {
                transaction.execute(&format!("DELETE FROM {table} WHERE job = ?1"), [job])?;
            }
            transaction.commit()
        };
        forget().map_err(|error| state_error(&format!("cannot forget the state of job {job}"), error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_records_are_idempotent_and_checkpoints_never_go_back() {
        let directory = tempfile::tempdir().unwrap();
        let store = SqliteStateStore::open(directory.path()).unwrap();
        let record = Rejected {
            table: "t".into(),
            key: "id=1".into(),
            reason: "target: NOT NULL".into(),
            record: None,
            change: None,
        };
        assert_eq!(store.record_dirty("job", "t#0", std::slice::from_ref(&record)).unwrap(), 1);
        assert_eq!(store.record_dirty("job", "t#0", std::slice::from_ref(&record)).unwrap(), 1);
        let ahead = Checkpoint {
            task: "t#0".into(),
            position: Some(Position(serde_json::json!({"rowid": 10}))),
            done: false,
            rows_written: 10,
        };
        let behind =
            Checkpoint { rows_written: 5, position: Some(Position(serde_json::json!({"rowid": 5}))), ..ahead.clone() };
        store.save_checkpoint("job", &ahead).unwrap();
        store.save_checkpoint("job", &behind).unwrap();
        assert_eq!(store.checkpoints("job").unwrap(), vec![ahead]);
        let exported = std::fs::read_to_string(store.export_dirty("job").unwrap()).unwrap();
        assert!(exported.contains("\"key\":\"id=1\""), "{exported}");
    }

    /// A change the stream leaves out again replaces its record (one count, the last change);
    /// a replay's verdicts forget the written records and keep the refused ones' new reason;
    /// a state directory made before the stream's records had their column gets it.
    #[test]
    fn stream_records_count_once_per_key_and_a_replay_settles_them() {
        let directory = tempfile::tempdir().unwrap();
        let old = Connection::open(directory.path().join("state.db")).unwrap();
        old.execute_batch(
            "CREATE TABLE dirty_records (id INTEGER PRIMARY KEY, job TEXT NOT NULL, task TEXT NOT NULL,
                 table_name TEXT NOT NULL, key TEXT NOT NULL, reason TEXT NOT NULL, record TEXT, created_at TEXT NOT NULL,
                 UNIQUE (job, task, table_name, key));",
        )
        .unwrap();
        drop(old);
        let store = SqliteStateStore::open(directory.path()).unwrap();
        let left_out = |key: &str, at: u64| Rejected {
            table: "d.t".into(),
            key: key.into(),
            reason: format!("column d: refused at {at}"),
            record: Some("{}".into()),
            change: Some(sluice_core::change::RejectedChange {
                position: Position(serde_json::json!(at)),
                before: None,
                source: None,
            }),
        };
        assert_eq!(store.record_dirty("job", "stream", &[left_out("id=1", 1)]).unwrap(), 1);
        assert_eq!(store.record_dirty("job", "stream", &[left_out("id=1", 1)]).unwrap(), 1, "a group applied again");
        assert_eq!(store.record_dirty("job", "stream", &[left_out("id=1", 5), left_out("id=2", 5)]).unwrap(), 2);
        let entries = store.dirty_entries("job").unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].record, left_out("id=1", 5), "the last change of the key");
        assert_eq!(entries[0].task, "stream");
        let report = ReplayReport {
            verdicts: vec![
                (entries[0].id.clone(), Verdict::Written),
                (entries[1].id.clone(), Verdict::Refused("again".into())),
            ],
            ..ReplayReport::default()
        };
        store.settle_replay("job", &report).unwrap();
        let left = store.dirty_records("job").unwrap();
        assert_eq!(left, vec![Rejected { reason: "again".into(), ..left_out("id=2", 5) }]);
    }
}
