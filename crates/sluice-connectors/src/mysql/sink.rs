//! Writing into MySQL/MariaDB: created databases and tables, multi-row prepared INSERTs in one
//! transaction per commit that also updates the task's row in `sluice.checkpoints`.

use std::sync::Arc;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool};
use sluice_core::change::{Batch, Rejected};
use sluice_core::connector::{
    Binding, CheckItem, Checkpoint, Fence, FoldedChangeSink, FoldedChangeWriter, Refused, Sink, TableTasks, TableWriter,
};
use sluice_core::secret::Secret;
use sluice_core::spec::WriteMode;
use sluice_core::{DataType, Error, Result, Row, Side, TableName, TableSchema, Value};

use super::checkpoints::{
    commit_with_checkpoint, end_older_sessions, forget_binding, read_checkpoint, register_session, verify_binding,
    BINDING_TABLE, FENCE_TABLE, SESSION_TABLE,
};
use super::rows::{delete_keys, insert_rows};
use super::tables::{add_index_sql, add_missing_indexes, counter_sql, create_table_sql, move_counter, qualified};
use super::trial::{InsertTrial, Inserts};
use super::{endpoint, mysql_error, pool, quote, refuse_long_names};
use crate::sql::snapshot::{write_inserts, InsertTarget};
use crate::sql::target::{to_create, warn_keyless_upsert};
use crate::sql::task::WriterTask;

/// A MySQL or MariaDB server written as a target.
#[derive(Debug)]
pub struct MysqlSink {
    pool: Pool,
    /// The server takes `LOAD DATA LOCAL` (`local_infile`), found at `prepare`.
    local_infile: std::sync::atomic::AtomicBool,
    server: String,
    write_mode: WriteMode,
    create_tables: bool,
    /// Every table goes into this namespace when set.
    namespace: Option<String>,
    /// The cluster task's fence every checkpoint commit checks, when a worker runs this sink.
    fence: Option<Fence>,
    /// `mysql` or `mariadb`, found at `prepare`: how much of a MySQL source's definition the
    /// tables created take (`tables::Fidelity`).
    flavor: std::sync::OnceLock<String>,
}

impl MysqlSink {
    pub fn new(
        url: &Secret,
        server: String,
        write_mode: WriteMode,
        create_tables: bool,
        namespace: Option<String>,
        connections: usize,
    ) -> Result<MysqlSink> {
        Ok(MysqlSink {
            pool: pool(&endpoint(url, Side::Target)?, connections + 1)?,
            local_infile: std::sync::atomic::AtomicBool::new(false),
            flavor: std::sync::OnceLock::new(),
            server,
            write_mode,
            create_tables,
            namespace,
            fence: None,
        })
    }

    /// The same sink, committing only while `fence` (when given) holds in the target.
    pub fn fenced_if(self, fence: Option<Fence>) -> MysqlSink {
        MysqlSink { fence, ..self }
    }

    async fn connection(&self) -> Result<Conn> {
        let mut connection =
            self.pool.get_conn().await.map_err(|error| mysql_error(error, Side::Target, &self.server, "connect"))?;
        // Strict, so a value the column cannot hold fails (and becomes a dirty record) instead of
        // being truncated; zero dates allowed, so MySQL-to-MySQL copies carry them as they are;
        // an explicit 0 in an AUTO_INCREMENT column stays 0.
        connection
            .query_drop("SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_AUTO_VALUE_ON_ZERO,NO_ENGINE_SUBSTITUTION'")
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, "set the session's sql_mode"))?;
        if self.fence.is_some() {
            // A fenced session ends a transaction left idle for 10 s (MariaDB), so a worker
            // stalled in the middle of one cannot hold the row locks its task's new owner needs.
            // MySQL has no such setting (error 1193): there the locks last until the stalled
            // worker's connection ends.
            match connection.query_drop("SET SESSION idle_transaction_timeout = 10").await {
                Ok(()) => {}
                Err(mysql_async::Error::Server(error)) if error.code == 1193 => {}
                Err(error) => return Err(mysql_error(error, Side::Target, &self.server, "limit idle transactions")),
            }
        }
        Ok(connection)
    }

    /// The columns table `table` has (none when it does not exist).
    async fn columns(&self, connection: &mut Conn, table: &TableName) -> Result<Vec<String>> {
        let namespace = table.namespace.as_deref().unwrap_or("sluice_default");
        connection
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
                 ORDER BY ORDINAL_POSITION",
                (namespace, &table.name),
            )
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, &format!("describe table {table}")))
    }

    /// A connection for one of the job's task writers; a fenced task's is recorded, so the
    /// task's next owner can end it.
    async fn task_connection(&self, job: &str) -> Result<Conn> {
        let mut connection = self.connection().await?;
        if let Some(fence) = &self.fence {
            register_session(&mut connection, &self.server, job, fence).await?;
        }
        Ok(connection)
    }
}

#[async_trait]
impl Sink for MysqlSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let mut connection = self.connection().await?;
        let version: Option<String> = connection
            .query_first("SELECT VERSION()")
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, "read the server version"))?;
        Ok(vec![CheckItem {
            what: "target connection".into(),
            ok: true,
            detail: format!("{} (server {})", self.server, version.unwrap_or_default()),
        }])
    }

    /// `db.table` lands as database `db` (or the job's `namespace`), table `table`.
    fn target_name(&self, source: &TableName) -> TableName {
        let namespace = self.namespace.as_deref().or(source.namespace.as_deref()).unwrap_or("sluice_default");
        TableName::new(Some(namespace), &source.name)
    }

    /// Zero dates are stored as they are (MySQL with a session sql_mode that allows them;
    /// SQLite and files as text).
    fn holds_zero_dates(&self) -> bool {
        true
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables
            .iter()
            .flat_map(|table| {
                std::iter::once(create_table_sql(table, self.flavor.get().map(String::as_str)))
                    .chain(table.indexes.iter().map(|index| add_index_sql(table, index)))
            })
            .collect()
    }

    /// Adds the secondary indexes the tables lack and moves their counters.
    async fn finish(&self, tables: &[TableSchema]) -> Result<()> {
        if tables.iter().all(|table| table.indexes.is_empty() && counter_sql(table).is_none()) {
            return Ok(());
        }
        let mut connection = self.connection().await?;
        for table in tables {
            add_missing_indexes(&mut connection, &self.server, table).await?;
            move_counter(&mut connection, &self.server, table).await?;
        }
        Ok(())
    }

    async fn verify_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<Vec<(TableName, Binding)>> {
        let mut connection = self.connection().await?;
        connection
            .query_drop(BINDING_TABLE)
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, "create the table sluice.bindings"))?;
        let mut judged = Vec::with_capacity(tables.len());
        for table in tables {
            let binding = verify_binding(&mut connection, &self.server, job, &table.table, &table.tasks).await?;
            judged.push((table.table.clone(), binding));
        }
        Ok(judged)
    }

    async fn forget_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let mut connection = self.connection().await?;
        for table in tables {
            forget_binding(&mut connection, &self.server, job, &table.table, &table.tasks).await?;
        }
        Ok(())
    }

    /// The tables are emptied first (TRUNCATE commits on its own): a reset cut short leaves
    /// empty tables whose checkpoints the next run forgets (`verify_checkpoints`).
    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let mut connection = self.connection().await?;
        let error = |doing: &str| {
            let doing = doing.to_owned();
            move |error| mysql_error(error, Side::Target, &self.server, &doing)
        };
        connection.query_drop(BINDING_TABLE).await.map_err(error("create the table sluice.bindings"))?;
        for table in tables {
            let exists: Option<u8> = connection
                .exec_first(
                    "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                    (table.table.namespace.as_deref().unwrap_or(""), &table.table.name),
                )
                .await
                .map_err(error("look for the job's tables"))?;
            if exists.is_some() {
                connection
                    .query_drop(format!("TRUNCATE TABLE {}", qualified(&table.table)))
                    .await
                    .map_err(error(&format!("empty table {}", table.table)))?;
            }
        }
        connection
            .exec_drop("DELETE FROM sluice.checkpoints WHERE job = ?", (job,))
            .await
            .map_err(error("forget the job's checkpoints"))?;
        connection
            .exec_drop("DELETE FROM sluice.bindings WHERE job = ?", (job,))
            .await
            .map_err(error("forget the job's table identities"))
    }

    async fn table_columns(&self, table: &TableName) -> Result<Option<Vec<String>>> {
        let mut connection = self.connection().await?;
        Ok(Some(self.columns(&mut connection, table).await?))
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        refuse_long_names(tables)?;
        let mut connection = self.connection().await?;
        let error = |doing: &str| {
            let doing = doing.to_owned();
            move |error| mysql_error(error, Side::Target, &self.server, &doing)
        };
        let local_infile: Option<bool> =
            connection.query_first("SELECT @@GLOBAL.local_infile").await.map_err(error("read local_infile"))?;
        self.local_infile.store(local_infile.unwrap_or(false), std::sync::atomic::Ordering::Relaxed);
        let flavor = super::flavor(&mut connection, Side::Target, &self.server).await?;
        let _ = self.flavor.set(flavor.to_owned());
        connection
            .query_drop(
                "CREATE DATABASE IF NOT EXISTS sluice CHARACTER SET utf8mb4;
                 CREATE TABLE IF NOT EXISTS sluice.checkpoints (job VARCHAR(128) NOT NULL, task VARCHAR(512) NOT NULL,
                     position LONGTEXT, done TINYINT(1) NOT NULL, rows_written BIGINT UNSIGNED NOT NULL,
                     updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), PRIMARY KEY (job, task)) DEFAULT CHARSET = utf8mb4",
            )
            .await
            .map_err(error("create the checkpoint table sluice.checkpoints"))?;
        // Made here too, once, before the tasks of a cluster job claim their fences at once.
        connection.query_drop(FENCE_TABLE).await.map_err(error("create the fence table sluice.fences"))?;
        connection.query_drop(SESSION_TABLE).await.map_err(error("create the session table sluice.sessions"))?;
        connection.query_drop(super::writes::WRITES_TABLE).await.map_err(error("create the table sluice.writes"))?;
        warn_keyless_upsert(tables, self.write_mode);
        for table in tables {
            let existing = self.columns(&mut connection, &table.name).await?;
            if to_create(table, &existing, self.create_tables, |known, name| known.eq_ignore_ascii_case(name))? {
                connection
                    .query_drop(create_table_sql(table, self.flavor.get().map(String::as_str)))
                    .await
                    .map_err(error(&format!("create table {}", table.name)))?;
            }
        }
        Ok(())
    }

    async fn claim(&self, job: &str) -> Result<()> {
        let Some(fence) = &self.fence else { return Ok(()) };
        let mut connection = self.connection().await?;
        let error = |doing: &'static str| move |error| mysql_error(error, Side::Target, &self.server, doing);
        connection.query_drop(FENCE_TABLE).await.map_err(error("create the fence table sluice.fences"))?;
        connection.query_drop(SESSION_TABLE).await.map_err(error("create the session table sluice.sessions"))?;
        // Before the fence is locked: a stalled older owner may hold its row.
        end_older_sessions(&mut connection, &self.server, job, fence).await?;
        // The row exists before it is locked: locking a missing row takes a gap lock, and two
        // tasks claiming at once would deadlock on the gap.
        connection
            .exec_drop("INSERT IGNORE INTO sluice.fences (job, task, epoch) VALUES (?, ?, 0)", (job, &fence.task))
            .await
            .map_err(error("make the fence"))?;
        connection.query_drop("BEGIN").await.map_err(error("begin"))?;
        let held: Option<u64> = connection
            .exec_first("SELECT epoch FROM sluice.fences WHERE job = ? AND task = ? FOR UPDATE", (job, &fence.task))
            .await
            .map_err(error("read the fence"))?;
        if let Some(held) = held.filter(|held| *held > fence.epoch) {
            let _ = connection.query_drop("ROLLBACK").await;
            return Err(fence.moved(job, held));
        }
        connection
            .exec_drop("UPDATE sluice.fences SET epoch = ? WHERE job = ? AND task = ?", (fence.epoch, job, &fence.task))
            .await
            .map_err(error("take the fence"))?;
        connection.query_drop("COMMIT").await.map_err(error("commit the fence"))
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        let connection = self.task_connection(job).await?;
        Ok(Box::new(MysqlWriter {
            connection,
            server: self.server.clone(),
            task: WriterTask::new(job, task, self.fence.as_ref()),
            upsert: self.write_mode == WriteMode::Upsert && !table.primary_key.is_empty(),
            load_data: self.local_infile.load(std::sync::atomic::Ordering::Relaxed) && loadable(&table),
            table,
            in_transaction: false,
            buffer: Vec::new(),
        }))
    }

    sluice_core::capabilities!(folded_changes: FoldedChangeSink);
}

#[async_trait]
impl FoldedChangeSink for MysqlSink {
    fn hides_copies(&self) -> bool {
        true
    }

    async fn existing_tables(&self, tables: &[TableName]) -> Result<Vec<TableName>> {
        let mut connection = self.connection().await?;
        let mut existing = Vec::new();
        for table in tables {
            let found: Option<u8> = connection
                .exec_first(
                    "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                    (table.namespace.as_deref().unwrap_or(""), &table.name),
                )
                .await
                .map_err(|error| mysql_error(error, Side::Target, &self.server, &format!("look up table {table}")))?;
            if found.is_some() {
                existing.push(table.clone());
            }
        }
        Ok(existing)
    }

    async fn open_folded(&self, job: &str, task: &str) -> Result<Box<dyn FoldedChangeWriter>> {
        let mut connection = self.task_connection(job).await?;
        super::changes::read_committed(&mut connection, &self.server).await?;
        Ok(Box::new(super::changes::MysqlChangeWriter::new(
            connection,
            &self.server,
            WriterTask::new(job, task, self.fence.as_ref()),
            0,
        )))
    }

    async fn open_lane(&self, job: &str, task: &str, lane: usize) -> Result<Option<Box<dyn FoldedChangeWriter>>> {
        let mut connection = self.task_connection(job).await?;
        if !super::changes::read_committed(&mut connection, &self.server).await? {
            return Ok(None);
        }
        let task = WriterTask::new(job, task, self.fence.as_ref());
        Ok(Some(Box::new(super::changes::MysqlChangeWriter::new(connection, &self.server, task, lane))))
    }
}

struct MysqlWriter {
    connection: Conn,
    server: String,
    task: WriterTask,
    table: Arc<TableSchema>,
    upsert: bool,
    /// Batches go in by `LOAD DATA LOCAL` (single rows, to find a refused one, by INSERT).
    load_data: bool,
    in_transaction: bool,
    buffer: Vec<u8>,
}

/// Whether `LOAD DATA`'s text format carries every column of the table exactly. BIT and spatial
/// columns would take their bytes as text; text columns in a charset other than UTF-8 would take
/// the UTF-8 bytes unconverted (the file is loaded as `binary`, so blobs stay byte-exact). Such
/// tables go by INSERT, whose bound strings the server converts.
fn loadable(table: &TableSchema) -> bool {
    table.columns.iter().all(|column| match &column.data_type {
        DataType::Bits { .. } | DataType::Geometry => false,
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } | DataType::Json => column
            .collation
            .as_deref()
            .is_none_or(|collation| collation.starts_with("utf8") || collation.starts_with("ascii")),
        _ => true,
    })
}

/// Appends rows in `LOAD DATA`'s default text format: fields separated by tabs, rows by line
/// feeds, `\N` for NULL, and backslash escapes for backslash, tab, line feed and NUL.
fn encode_load_data(table: &TableSchema, rows: &[&Row], output: &mut Vec<u8>) {
    fn escaped(bytes: &[u8], output: &mut Vec<u8>) {
        // Most values need no escape: a branch-free scan (which the compiler vectorizes) finds
        // out before the byte-by-byte pass.
        let special = bytes.iter().fold(false, |found, &byte| found | matches!(byte, b'\\' | b'\t' | b'\n' | 0));
        if !special {
            output.extend_from_slice(bytes);
            return;
        }
        let mut start = 0;
        for (index, &byte) in bytes.iter().enumerate() {
            let escape: &[u8] = match byte {
                b'\\' => b"\\\\",
                b'\t' => b"\\t",
                b'\n' => b"\\n",
                0 => b"\\0",
                _ => continue,
            };
            output.extend_from_slice(&bytes[start..index]);
            output.extend_from_slice(escape);
            start = index + 1;
        }
        output.extend_from_slice(&bytes[start..]);
    }
    for row in rows {
        for (index, value) in row.iter().enumerate() {
            if index > 0 {
                output.push(b'\t');
            }
            match value {
                Value::Null => output.extend_from_slice(b"\\N"),
                Value::Bool(value) => output.push(if *value { b'1' } else { b'0' }),
                Value::Bytes(bytes) => escaped(bytes, output),
                Value::Text(text) | Value::Json(text) => escaped(text.as_bytes(), output),
                Value::Timestamp(date_time) => output.extend_from_slice(date_time.to_string().as_bytes()),
                // Text `0` is the year 2000 to YEAR; the stored zero year is `0000`.
                Value::Int(0) if table.columns[index].data_type == DataType::Year => output.extend_from_slice(b"0000"),
                Value::Int(value) => output.extend_from_slice(itoa::Buffer::new().format(*value).as_bytes()),
                Value::UInt(value) => output.extend_from_slice(itoa::Buffer::new().format(*value).as_bytes()),
                other => escaped(other.to_string().as_bytes(), output),
            }
        }
        output.push(b'\n');
    }
}

impl MysqlWriter {
    fn error(&self, doing: &str) -> impl Fn(mysql_async::Error) -> Error + '_ {
        let doing = doing.to_owned();
        move |error| mysql_error(error, Side::Target, &self.server, &doing)
    }

    async fn insert_rows(&mut self, rows: &[&Row]) -> std::result::Result<(), mysql_async::Error> {
        if self.upsert {
            let keys: Vec<Vec<Value>> = rows
                .iter()
                .map(|row| self.table.primary_key.iter().map(|&index| row[index].clone()).collect())
                .collect();
            delete_keys(&mut self.connection, &self.table, &keys).await?;
        }
        if self.load_data && rows.len() > 1 {
            return self.load_rows(rows).await;
        }
        insert_rows(&mut self.connection, &self.table, rows).await
    }

    /// Loads rows with `LOAD DATA LOCAL`. LOCAL turns data errors into warnings and skips
    /// duplicate keys, so any warning, or fewer rows than sent, fails the batch as a row error:
    /// the caller rolls back and inserts row by row, which names the refused row.
    async fn load_rows(&mut self, rows: &[&Row]) -> std::result::Result<(), mysql_async::Error> {
        use futures_util::StreamExt;
        self.buffer.clear();
        encode_load_data(&self.table, rows, &mut self.buffer);
        let capacity = self.buffer.len() + self.buffer.len() / 8;
        let data = bytes::Bytes::from(std::mem::replace(&mut self.buffer, Vec::with_capacity(capacity)));
        self.connection
            .set_infile_handler(async move { Ok(futures_util::stream::once(async move { Ok(data) }).boxed()) });
        let columns: Vec<String> = self.table.columns.iter().map(|column| quote(&column.name)).collect();
        let statement = format!(
            "LOAD DATA LOCAL INFILE 'sluice-batch' INTO TABLE {} CHARACTER SET binary FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' ({})",
            qualified(&self.table.name),
            columns.join(", ")
        );
        self.connection.query_drop(statement).await?;
        let (loaded, warnings) = (self.connection.affected_rows(), self.connection.get_warnings());
        if warnings > 0 || loaded != rows.len() as u64 {
            return Err(mysql_async::Error::Server(mysql_async::ServerError {
                code: 1265,
                message: format!("LOAD DATA took {loaded} of {} rows with {warnings} warnings", rows.len()),
                state: "01000".to_owned(),
            }));
        }
        Ok(())
    }
}

#[async_trait]
impl Inserts for MysqlWriter {
    fn connection(&mut self) -> &mut Conn {
        &mut self.connection
    }

    fn server(&self) -> &str {
        &self.server
    }

    fn table(&self) -> &TableSchema {
        &self.table
    }

    /// By `LOAD DATA` or INSERT, after deleting the rows' keys for an upsert.
    async fn insert(&mut self, rows: &[&Row]) -> std::result::Result<(), mysql_async::Error> {
        self.insert_rows(rows).await
    }
}

#[async_trait]
impl InsertTarget for MysqlWriter {
    const TARGET: &'static str = "MySQL";

    fn table(&self) -> &TableSchema {
        &self.table
    }

    fn in_transaction(&mut self) -> &mut bool {
        &mut self.in_transaction
    }

    /// Begins a transaction marked as Sluice's (`super::writes`), so that a `two_way` job
    /// reading this server passes the copy's rows over as it does the stream's.
    async fn start_transaction(&mut self) -> Result<()> {
        self.connection.query_drop("START TRANSACTION").await.map_err(self.error("begin a transaction"))?;
        super::writes::mark_transaction(&mut self.connection, &self.server, &self.task.job, &self.task.name).await
    }

    /// Inserted under savepoints: a row whose content fails the batch is found and left out,
    /// the rest kept.
    async fn write_rows(&mut self, rows: &[&Row]) -> Result<Vec<Refused>> {
        InsertTrial { inserts: self, rows, key_conflicts: false }.run().await
    }
}

#[async_trait]
impl TableWriter for MysqlWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        read_checkpoint(&mut self.connection, &self.server, &self.task.job, &self.task.name).await
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        write_inserts(self, batch).await
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        self.begin().await?;
        self.in_transaction = false;
        commit_with_checkpoint(&mut self.connection, &self.server, &self.task.job, self.task.fence.as_ref(), checkpoint)
            .await
    }

    /// `DELETE` in the open transaction (`TRUNCATE` would commit on its own).
    async fn replace_all(&mut self) -> Result<()> {
        self.begin().await?;
        let statement = format!("DELETE FROM {}", qualified(&self.table.name));
        self.connection.query_drop(statement).await.map_err(self.error(&format!("empty table {}", self.table.name)))
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::{Column, TableName};

    use super::*;

    #[test]
    fn load_data_text_escapes_exactly_what_the_format_reads_specially() {
        let column = |name: &str, data_type| Column::new(name, data_type, true);
        let table = TableSchema {
            name: TableName::parse("t"),
            columns: vec![
                column("id", DataType::Integer { bytes: 8, unsigned: false }),
                column("big", DataType::Integer { bytes: 8, unsigned: true }),
                column("year", DataType::Year),
                column("note", DataType::Text { length: None, fixed: false }),
                column("raw", DataType::Bytes { length: None, fixed: false }),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        };
        let rows = [
            vec![
                Value::Int(i64::MIN),
                Value::UInt(u64::MAX),
                Value::Int(0),
                Value::Text("tab\there\\ line\nend".into()),
                Value::Bytes(vec![0, b'a', b'\\']),
            ],
            vec![Value::Int(7), Value::Null, Value::Int(1999), Value::Text("plain é".into()), Value::Bytes(Vec::new())],
        ];
        let mut output = Vec::new();
        encode_load_data(&table, &rows.iter().collect::<Vec<_>>(), &mut output);
        let expected = "-9223372036854775808\t18446744073709551615\t0000\ttab\\there\\\\ line\\nend\t\\0a\\\\\n\
                        7\t\\N\t1999\tplain é\t\n";
        assert_eq!(String::from_utf8(output).unwrap(), expected);
    }
}
