//! Writing into SQLite: created tables, one transaction per commit holding the rows and the
//! task's checkpoint row, so a crash leaves the target before or after a whole batch.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::{Connection, ErrorCode, OptionalExtension};
use sluice_core::change::{key_text, Batch, ChangeKind, Position, Rejected};
use sluice_core::connector::{Binding, CheckItem, Checkpoint, Sink, TableTasks, TableWriter};
use sluice_core::spec::WriteMode;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use super::{declared_type, open, quote, sqlite_error};

/// The table, in the target database, that holds each task's checkpoint.
const CHECKPOINTS: &str = "_sluice_checkpoints";

/// A SQLite database file written as a target.
#[derive(Debug)]
pub struct SqliteSink {
    path: PathBuf,
    write_mode: WriteMode,
    create_tables: bool,
}

impl SqliteSink {
    pub fn new(path: PathBuf, write_mode: WriteMode, create_tables: bool) -> SqliteSink {
        SqliteSink { path, write_mode, create_tables }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || work(open(&path, Side::Target)?))
            .await
            .map_err(|error| Error::new(ErrorKind::Write, format!("SQLite worker failed: {error}")).on(Side::Target))?
    }
}

#[async_trait]
impl Sink for SqliteSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let path = self.path.clone();
        self.blocking(move |connection| {
            // BEGIN IMMEDIATE takes the write lock: it fails on a read-only file or directory.
            connection
                .execute_batch("BEGIN IMMEDIATE; ROLLBACK;")
                .map_err(|error| sqlite_error(error, Side::Target, &format!("open {} for writing", path.display())))?;
            Ok(vec![CheckItem {
                what: "target database".into(),
                ok: true,
                detail: format!("{} is writable", path.display()),
            }])
        })
        .await
    }

    /// SQLite has one namespace: `shop.orders` becomes `orders`.
    fn target_name(&self, source: &TableName) -> TableName {
        TableName::new(None, &source.name)
    }

    /// Zero dates are stored as they are (MySQL with a session sql_mode that allows them;
    /// SQLite and files as text).
    fn holds_zero_dates(&self) -> bool {
        true
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables.iter().map(create_table_sql).collect()
    }

    async fn table_columns(&self, table: &TableName) -> Result<Option<Vec<String>>> {
        let table = table.clone();
        self.blocking(move |connection| columns(&connection, &table).map(Some)).await
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        let tables = tables.to_vec();
        let (write_mode, create_tables) = (self.write_mode, self.create_tables);
        self.blocking(move |connection| {
            let ddl_error = |error| sqlite_error(error, Side::Target, "create the checkpoint table");
            connection
                .execute_batch(&format!(
                    "CREATE TABLE IF NOT EXISTS {CHECKPOINTS} (job TEXT NOT NULL, task TEXT NOT NULL, position TEXT, done INTEGER NOT NULL, rows_written INTEGER NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (job, task))"
                ))
                .map_err(ddl_error)?;
            crate::sql::target::warn_keyless_upsert(&tables, write_mode);
            for table in &tables {
                if table_exists(&connection, &table.name)? {
                    check_columns(&connection, table)?;
                } else if create_tables {
                    connection.execute_batch(&create_table_sql(table)).map_err(|error| sqlite_error(error, Side::Target, &format!("create table {}", table.name)))?;
                } else {
                    return Err(Error::new(ErrorKind::Schema, format!("table `{}` does not exist", table.name))
                        .on(Side::Target)
                        .hint("create it, or set target.create_tables: true"));
                }
            }
            Ok(())
        })
        .await
    }

    /// SQLite keeps no identity a VACUUM leaves alone: a table is judged by its rows alone (an
    /// emptied or re-created table has its checkpoints forgotten).
    async fn verify_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<Vec<(TableName, Binding)>> {
        let (job, tables) = (job.to_owned(), tables.to_vec());
        self.blocking(move |connection| {
            let mut judged = Vec::with_capacity(tables.len());
            for table in tables {
                let error = |doing: &str| {
                    let doing = format!("{doing} ({})", table.table);
                    move |error| sqlite_error(error, Side::Target, &doing)
                };
                if !table_exists(&connection, &table.table)? {
                    continue;
                }
                let has_rows: bool = connection
                    .query_row(&format!("SELECT EXISTS (SELECT 1 FROM {})", quote(&table.table.name)), [], |row| {
                        row.get(0)
                    })
                    .map_err(error("look for rows"))?;
                let mut claimed = 0u64;
                for task in &table.tasks {
                    let rows: Option<u64> = connection
                        .query_row(
                            &format!("SELECT rows_written FROM {CHECKPOINTS} WHERE job = ?1 AND task = ?2"),
                            [&job, task],
                            |row| row.get(0),
                        )
                        .optional()
                        .map_err(error("read the table's checkpoints"))?;
                    claimed += rows.unwrap_or(0);
                }
                judged.push((table.table, Binding::judge(claimed, None, None, has_rows)));
            }
            Ok(judged)
        })
        .await
    }

    async fn checkpoints(&self, job: &str, tasks: &[String]) -> Result<Vec<Checkpoint>> {
        let (job, tasks) = (job.to_owned(), tasks.to_vec());
        self.blocking(move |connection| {
            let mut found = Vec::with_capacity(tasks.len());
            if !table_exists(&connection, &TableName::new(None, CHECKPOINTS))? {
                return Ok(found);
            }
            for task in tasks {
                let row = connection
                    .query_row(
                        &format!("SELECT position, done, rows_written FROM {CHECKPOINTS} WHERE job = ?1 AND task = ?2"),
                        [&job, &task],
                        |row| Ok((row.get::<_, Option<String>>(0)?, row.get::<_, bool>(1)?, row.get::<_, u64>(2)?)),
                    )
                    .optional()
                    .map_err(|error| {
                        sqlite_error(error, Side::Target, &format!("read the checkpoint of task {task}"))
                    })?;
                if let Some((position, done, rows_written)) = row {
                    let position = position.and_then(|text| serde_json::from_str(&text).ok().map(Position));
                    found.push(Checkpoint { task, position, done, rows_written });
                }
            }
            Ok(found)
        })
        .await
    }

    async fn forget_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let (job, tables) = (job.to_owned(), tables.to_vec());
        self.blocking(move |connection| {
            for table in &tables {
                for task in &table.tasks {
                    connection
                        .execute(&format!("DELETE FROM {CHECKPOINTS} WHERE job = ?1 AND task = ?2"), [&job, task])
                        .map_err(|error| {
                            sqlite_error(error, Side::Target, &format!("forget the checkpoints of {}", table.table))
                        })?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let (job, tables) = (job.to_owned(), tables.to_vec());
        self.blocking(move |connection| {
            for table in &tables {
                if table_exists(&connection, &table.table)? {
                    connection
                        .execute_batch(&format!("DELETE FROM {}", quote(&table.table.name)))
                        .map_err(|error| sqlite_error(error, Side::Target, &format!("empty table {}", table.table)))?;
                }
            }
            connection
                .execute(&format!("DELETE FROM {CHECKPOINTS} WHERE job = ?1"), [&job])
                .map_err(|error| sqlite_error(error, Side::Target, "forget the job's checkpoints"))?;
            Ok(())
        })
        .await
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        let path = self.path.clone();
        let connection = tokio::task::spawn_blocking(move || open(&path, Side::Target)).await.map_err(|error| {
            Error::new(ErrorKind::Write, format!("SQLite worker failed: {error}")).on(Side::Target)
        })??;
        let insert = insert_sql(&table, self.write_mode);
        Ok(Box::new(SqliteWriter {
            state: Some(WriterState {
                connection,
                job: job.to_owned(),
                task: task.to_owned(),
                table,
                insert,
                in_transaction: false,
            }),
        }))
    }
}

/// Checks that an existing target table has every column the source sends.
/// The columns table `table` has (none when it does not exist).
fn columns(connection: &Connection, table: &TableName) -> Result<Vec<String>> {
    let described = |error| sqlite_error(error, Side::Target, &format!("describe table {table}"));
    let mut statement = connection.prepare("SELECT name FROM pragma_table_info(?1) ORDER BY cid").map_err(described)?;
    statement.query_map([&table.name], |row| row.get(0)).and_then(|rows| rows.collect()).map_err(described)
}

fn check_columns(connection: &Connection, table: &TableSchema) -> Result<()> {
    let existing = columns(connection, &table.name)?;
    let missing: Vec<&str> = table
        .columns
        .iter()
        .map(|column| column.name.as_str())
        .filter(|name| !existing.iter().any(|existing| existing == name))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::new(ErrorKind::Schema, format!("table `{}` lacks columns {}", table.name, missing.join(", ")))
            .on(Side::Target)
            .hint("add the columns or drop the table so it is created"))
    }
}

fn create_table_sql(table: &TableSchema) -> String {
    let mut definitions: Vec<String> = table
        .columns
        .iter()
        .map(|column| {
            let not_null = if column.nullable { "" } else { " NOT NULL" };
            format!("{} {}{not_null}", quote(&column.name), declared_type(&column.data_type))
        })
        .collect();
    if !table.primary_key.is_empty() {
        let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        definitions.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    format!("CREATE TABLE IF NOT EXISTS {} ({})", quote(&table.name.name), definitions.join(", "))
}

/// The row statement: a plain insert, or an upsert that matches the primary key only — a
/// conflict on another unique key still fails, and becomes a dirty record.
fn insert_sql(table: &TableSchema, write_mode: WriteMode) -> String {
    let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
    let placeholders = vec!["?"; columns.len()].join(", ");
    let mut sql = format!("INSERT INTO {} ({}) VALUES ({placeholders})", quote(&table.name.name), columns.join(", "));
    // A table without a key is a multiset: its rows are inserted (`warn_keyless_upsert`).
    if write_mode == WriteMode::Upsert && !table.primary_key.is_empty() {
        let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        let updates: Vec<String> = (0..table.columns.len())
            .filter(|index| !table.primary_key.contains(index))
            .map(|index| format!("{0} = excluded.{0}", quote(&table.columns[index].name)))
            .collect();
        sql.push_str(&format!(" ON CONFLICT ({}) DO ", key.join(", ")));
        sql.push_str(&if updates.is_empty() {
            "NOTHING".to_owned()
        } else {
            format!("UPDATE SET {}", updates.join(", "))
        });
    }
    sql
}

struct SqliteWriter {
    state: Option<WriterState>,
}

struct WriterState {
    connection: Connection,
    job: String,
    task: String,
    table: Arc<TableSchema>,
    insert: String,
    in_transaction: bool,
}

impl WriterState {
    /// Opens the task's transaction unless one is open; `BEGIN IMMEDIATE` takes the write lock.
    fn begin(&mut self) -> Result<()> {
        if !self.in_transaction {
            self.connection
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(|error| sqlite_error(error, Side::Target, "begin a transaction"))?;
            self.in_transaction = true;
        }
        Ok(())
    }
}

/// Whether the database has this table.
fn table_exists(connection: &Connection, table: &TableName) -> Result<bool> {
    connection
        .query_row("SELECT count(*) > 0 FROM sqlite_schema WHERE type = 'table' AND name = ?1", [&table.name], |row| {
            row.get(0)
        })
        .map_err(|error| sqlite_error(error, Side::Target, &format!("look up table {table}")))
}

impl SqliteWriter {
    async fn blocking<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut WriterState) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let mut state = self.state.take().expect("a writer is not used after an error");
        let (state, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut state);
            (state, result)
        })
        .await
        .map_err(|error| Error::new(ErrorKind::Write, format!("SQLite worker failed: {error}")).on(Side::Target))?;
        self.state = Some(state);
        result
    }
}

#[async_trait]
impl TableWriter for SqliteWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.blocking(|state| {
            let row = state
                .connection
                .query_row(
                    &format!("SELECT position, done, rows_written FROM {CHECKPOINTS} WHERE job = ?1 AND task = ?2"),
                    [&state.job, &state.task],
                    |row| Ok((row.get::<_, Option<String>>(0)?, row.get::<_, bool>(1)?, row.get::<_, u64>(2)?)),
                )
                .optional()
                .map_err(|error| sqlite_error(error, Side::Target, "read the checkpoint"))?;
            let Some((position, done, rows_written)) = row else { return Ok(None) };
            let position =
                position.map(|text| serde_json::from_str(&text).map(Position)).transpose().map_err(|error| {
                    Error::new(ErrorKind::Write, format!("checkpoint of task {} is corrupt: {error}", state.task))
                        .on(Side::Target)
                })?;
            Ok(Some(Checkpoint { task: state.task.clone(), position, done, rows_written }))
        })
        .await
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        // The batch moves to the blocking thread; the caller keeps its own copy for the position.
        let batch = batch.clone();
        self.blocking(move |state| {
            state.begin()?;
            let write_error = |error| sqlite_error(error, Side::Target, &format!("write table {}", state.table.name));
            let mut statement = state.connection.prepare_cached(&state.insert).map_err(write_error)?;
            let mut rejected = Vec::new();
            for change in &batch.changes {
                let ChangeKind::Insert { after } = &change.kind else {
                    return Err(Error::new(ErrorKind::Write, "the SQLite target applies inserts only (snapshot mode)")
                        .on(Side::Target));
                };
                let values = after.iter().map(super::to_sql);
                match statement.execute(rusqlite::params_from_iter(values)) {
                    Ok(_) => {}
                    // A constraint refuses this row only; SQLite rolls back just the statement.
                    Err(error) if error.sqlite_error_code() == Some(ErrorCode::ConstraintViolation) => {
                        rejected.push(Rejected {
                            table: state.table.name.to_string(),
                            key: key_text(&state.table, after),
                            reason: format!("target: {error}"),
                            record: None,
                            change: None,
                        })
                    }
                    Err(error) => return Err(write_error(error)),
                }
            }
            Ok(rejected)
        })
        .await
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let checkpoint = checkpoint.clone();
        self.blocking(move |state| {
                state.begin()?;
                let position = checkpoint.position.as_ref().map(|position| position.0.to_string());
                let saved = state
                    .connection
                    .execute(
                        &format!(
                            "INSERT INTO {CHECKPOINTS} (job, task, position, done, rows_written, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, strftime('%Y-%m-%dT%H:%M:%fZ')) \
                             ON CONFLICT (job, task) DO UPDATE SET position = excluded.position, done = excluded.done, rows_written = excluded.rows_written, updated_at = excluded.updated_at"
                        ),
                        rusqlite::params![state.job, state.task, position, checkpoint.done, checkpoint.rows_written],
                    )
                    .and_then(|_| state.connection.execute_batch("COMMIT"));
                state.in_transaction = false;
                if let Err(error) = saved {
                    // Leave no half-open transaction behind: neither the rows nor the checkpoint land.
                    let _ = state.connection.execute_batch("ROLLBACK");
                    return Err(sqlite_error(error, Side::Target, "commit"));
                }
                Ok(())
            })
        .await
    }

    async fn replace_all(&mut self) -> Result<()> {
        self.blocking(|state| {
            state.begin()?;
            let statement = format!("DELETE FROM {}", quote(&state.table.name.name));
            state
                .connection
                .execute_batch(&statement)
                .map_err(|error| sqlite_error(error, Side::Target, &format!("empty table {}", state.table.name)))
        })
        .await
    }
}
