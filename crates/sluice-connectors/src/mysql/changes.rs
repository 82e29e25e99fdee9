//! Applying a change stream to MySQL/MariaDB: per group and table one multi-row DELETE by
//! primary key and one multi-row INSERT, in a transaction that also moves the stream's row in
//! `sluice.checkpoints`.

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use sluice_core::connector::{ChangeWriter, Checkpoint, FoldedChangeWriter, Refused, SchemaChange, Updated};
use sluice_core::schema::{column_changes, ColumnChange};
use sluice_core::{Error, ErrorKind, Result, Row, Side, TableName, TableSchema};

use super::checkpoints::{check_fence, commit_with_checkpoint, read_checkpoint};
use super::rows::{delete_keys, delete_rows};
use super::tables::{
    add_column_sql, add_missing_indexes, create_table_sql, modify_column_sql, move_counter, qualified,
    table_comment_sql, Fidelity,
};
use super::trial::{InsertTrial, TableInserts};
use super::writes::{mark_transaction, DDL_MARK};
use super::{decode, mysql_error, quote, refuse_long_names};
use sluice_core::conflict::missing_rows;

use crate::sql::catalog::{to_publish, to_rename, Catalog};
use crate::sql::task::WriterTask;

pub(super) struct MysqlChangeWriter {
    pub(super) connection: Conn,
    pub(super) server: String,
    pub(super) task: WriterTask,
    pub(super) in_transaction: bool,
    /// The target server's flavor (`mysql`, `mariadb`), read when a table is first created or
    /// altered: which of the source's own types and defaults it takes (`Fidelity`).
    pub(super) flavor: Option<&'static str>,
    /// The writer's row in `sluice.writes`: the task's name, with the lane's number past the
    /// first lane (lanes write side by side, so each counts its transactions in a row of its
    /// own).
    pub(super) marker: String,
}

impl MysqlChangeWriter {
    pub(super) fn new(connection: Conn, server: &str, task: WriterTask, lane: usize) -> MysqlChangeWriter {
        let marker = if lane == 0 { task.name.clone() } else { format!("{}/{lane}", task.name) };
        MysqlChangeWriter { connection, server: server.to_owned(), task, in_transaction: false, flavor: None, marker }
    }
}

/// Puts a change writer's session in READ COMMITTED where the server's binlog allows it (off,
/// or logging rows), and says whether it did. Lanes write different keys side by side; under
/// REPEATABLE READ a delete of an absent key locks the gap around it, and two lanes' inserts
/// into each other's gaps would deadlock.
pub(super) async fn read_committed(connection: &mut Conn, server: &str) -> Result<bool> {
    let failed = |error| mysql_error(error, Side::Target, server, "read the binlog settings");
    let (log_bin, format): (i64, String) =
        connection.query_first("SELECT @@log_bin, @@binlog_format").await.map_err(failed)?.unwrap_or_default();
    if log_bin != 0 && format.eq_ignore_ascii_case("STATEMENT") {
        return Ok(false);
    }
    connection
        .query_drop("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, "set the isolation level"))?;
    Ok(true)
}

#[async_trait]
impl Catalog for MysqlChangeWriter {
    async fn columns(&mut self, table: &TableName) -> Result<Vec<String>> {
        self.connection
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (table.namespace.as_deref().unwrap_or(""), &table.name),
            )
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, &format!("describe table {table}")))
    }

    async fn holds_rows(&mut self, table: &TableName) -> Result<bool> {
        let held: Option<u8> = self
            .connection
            .query_first(format!("SELECT 1 FROM {} LIMIT 1", qualified(table)))
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, &format!("look into table {table}")))?;
        Ok(held.is_some())
    }

    async fn drop_empty(&mut self, table: &TableName) -> Result<()> {
        self.execute(&format!("DROP TABLE {}", qualified(table)), &format!("drop the empty table {table}")).await
    }
}

impl MysqlChangeWriter {
    /// Runs a DDL statement, marked as Sluice's (`writes::DDL_MARK`).
    async fn execute(&mut self, sql: &str, doing: &str) -> Result<()> {
        self.connection
            .query_drop(format!("{DDL_MARK}{sql}"))
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, doing))
    }

    async fn flavor(&mut self) -> Result<&'static str> {
        match self.flavor {
            Some(flavor) => Ok(flavor),
            None => Ok(*self.flavor.insert(super::flavor(&mut self.connection, Side::Target, &self.server).await?)),
        }
    }

    /// Creates `table` as a snapshot's copy would be: its columns and key, its indexes, its
    /// counter where the source's stands.
    async fn create(&mut self, table: &TableSchema) -> Result<()> {
        let sql = create_table_sql(table, Some(self.flavor().await?));
        self.execute(&sql, &format!("create table {}", table.name)).await?;
        add_missing_indexes(&mut self.connection, &self.server, table).await?;
        move_counter(&mut self.connection, &self.server, table).await
    }

    /// Brings the table's columns to `table`'s (see `column_changes`), each as a snapshot's copy
    /// would define it, and builds the indexes it lacks.
    async fn alter(&mut self, table: &TableSchema, renamed: &[(String, String)], retyped: &[String]) -> Result<()> {
        let name = qualified(&table.name);
        let doing = format!("alter table {}", table.name);
        let fidelity = Fidelity::of(table, Some(self.flavor().await?));
        let existing = self.columns(&table.name).await?;
        for step in column_changes(&existing, table, renamed, retyped) {
            let statements = match step {
                ColumnChange::Rename { from, to } => {
                    vec![format!("ALTER TABLE {name} RENAME COLUMN {} TO {}", quote(from), quote(to))]
                }
                ColumnChange::Add(column) => add_column_sql(table, column, fidelity),
                ColumnChange::Retype(column) => vec![modify_column_sql(table, column, fidelity)],
                ColumnChange::Drop(column) => {
                    vec![format!("ALTER TABLE {name} DROP COLUMN IF EXISTS {}", quote(&column))]
                }
            };
            for sql in statements {
                self.execute(&sql, &doing).await?;
            }
        }
        if let Some(sql) = table_comment_sql(table, fidelity) {
            self.execute(&sql, &doing).await?;
        }
        add_missing_indexes(&mut self.connection, &self.server, table).await
    }

    async fn begin(&mut self) -> Result<()> {
        if !self.in_transaction {
            self.connection
                .query_drop("START TRANSACTION")
                .await
                .map_err(|error| mysql_error(error, Side::Target, &self.server, "begin a transaction"))?;
            self.in_transaction = true;
            mark_transaction(&mut self.connection, &self.server, &self.task.job, &self.marker).await?;
        }
        Ok(())
    }

    /// After a short delete: rolls the transaction back and finds which keys the target lacks,
    /// so the error names them.
    async fn missing_keys<'a>(&mut self, table: &TableSchema, keys: &'a [Row]) -> Result<Vec<&'a Row>> {
        self.in_transaction = false;
        let failed = |error| mysql_error(error, Side::Target, &self.server, &format!("look up keys of {}", table.name));
        self.connection.query_drop("ROLLBACK").await.map_err(failed)?;
        let key_columns: Vec<&sluice_core::Column> =
            table.primary_key.iter().map(|&index| &table.columns[index]).collect();
        let present = self.select_by_key(table, keys, &key_columns, "").await?;
        Ok(keys.iter().filter(|key| !present.contains(key)).collect())
    }

    /// The `columns` of the rows of `table` under `keys` (`suffix`: a locking clause).
    async fn select_by_key(
        &mut self,
        table: &TableSchema,
        keys: &[Row],
        columns: &[&sluice_core::Column],
        suffix: &str,
    ) -> Result<Vec<Row>> {
        let failed =
            |error| mysql_error(error, Side::Target, &self.server, &format!("read rows of {} by key", table.name));
        let key_names: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        let names: Vec<String> = columns.iter().map(|column| quote(&column.name)).collect();
        let placeholder = format!("({})", vec!["?"; key_names.len()].join(", "));
        let mut found = Vec::new();
        for chunk in keys.chunks(1_000) {
            let sql = format!(
                "SELECT {} FROM {} WHERE ({}) IN ({}){suffix}",
                names.join(", "),
                qualified(&table.name),
                key_names.join(", "),
                vec![placeholder.as_str(); chunk.len()].join(", ")
            );
            let parameters: Vec<mysql_async::Value> = chunk.iter().flatten().map(super::rows::encode).collect();
            let rows: Vec<mysql_async::Row> = self.connection.exec(sql, parameters).await.map_err(failed)?;
            for row in rows {
                let values: std::result::Result<Row, String> = row
                    .unwrap()
                    .into_iter()
                    .zip(columns)
                    .map(|(value, column)| decode(value, &column.data_type))
                    .collect();
                found.push(values.map_err(|reason| Error::new(ErrorKind::Write, reason).on(Side::Target))?);
            }
        }
        Ok(found)
    }
}

#[async_trait]
impl ChangeWriter for MysqlChangeWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        read_checkpoint(&mut self.connection, &self.server, &self.task.job, &self.task.name).await
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        self.begin().await?;
        self.in_transaction = false;
        commit_with_checkpoint(&mut self.connection, &self.server, &self.task.job, self.task.fence.as_ref(), checkpoint)
            .await
    }

    /// MySQL commits DDL on its own, before the checkpoint: each change is written to be a
    /// no-op when replayed after a crash in between.
    async fn apply_schema_change(&mut self, change: &SchemaChange) -> Result<()> {
        match change {
            SchemaChange::Create(table) | SchemaChange::Alter { table, .. } => refuse_long_names([table])?,
            SchemaChange::Rename { to, .. } => refuse_long_names([&TableSchema::named(to.clone())])?,
            SchemaChange::Drop(_) | SchemaChange::Truncate(_) => {}
        }
        // DDL commits on its own, outside the checkpoint's fence: a task whose fence moved
        // applies none (its sessions also ended when the new owner claimed the task).
        check_fence(&mut self.connection, &self.server, &self.task.job, self.task.fence.as_ref()).await?;
        match change {
            SchemaChange::Create(table) => self.create(table).await?,
            SchemaChange::Drop(table) => {
                self.execute(&format!("DROP TABLE IF EXISTS {}", qualified(table)), &format!("drop table {table}"))
                    .await?
            }
            SchemaChange::Truncate(table) => {
                self.execute(&format!("TRUNCATE TABLE {}", qualified(table)), &format!("truncate table {table}"))
                    .await?
            }
            SchemaChange::Rename { from, to } => {
                if !to_rename(self, from, to).await? {
                    return Ok(());
                }
                let database = quote(to.namespace.as_deref().unwrap_or("sluice_default"));
                let renamed = format!(
                    "CREATE DATABASE IF NOT EXISTS {database}; RENAME TABLE {} TO {}",
                    qualified(from),
                    qualified(to)
                );
                self.execute(&renamed, &format!("rename table {from} to {to}")).await?;
            }
            SchemaChange::Alter { table, renamed, retyped } => self.alter(table, renamed, retyped).await?,
        }
        Ok(())
    }
}

#[async_trait]
impl FoldedChangeWriter for MysqlChangeWriter {
    async fn delete(&mut self, table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()> {
        self.begin().await?;
        if table.primary_key.is_empty() {
            let missing = delete_rows(&mut self.connection, table, keys).await.map_err(|error| {
                mysql_error(error, Side::Target, &self.server, &format!("delete from {}", table.name))
            })?;
            if expect_all && !missing.is_empty() {
                return Err(missing_rows(table, &missing.iter().map(|&index| &keys[index]).collect::<Vec<_>>()));
            }
            return Ok(());
        }
        let deleted = delete_keys(&mut self.connection, table, keys)
            .await
            .map_err(|error| mysql_error(error, Side::Target, &self.server, &format!("delete from {}", table.name)))?;
        if expect_all && deleted < keys.len() as u64 {
            let missing = self.missing_keys(table, keys).await?;
            return Err(missing_rows(table, &missing));
        }
        Ok(())
    }

    /// One `UPDATE ... SET` by key a row, prepared once per set of columns the rows carry. A row
    /// the statement changed nothing in (MySQL counts changed rows) is looked up by its key.
    async fn update(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Updated> {
        self.begin().await?;
        let doing = format!("update rows of {} in place", table.name);
        let equals = |index: &usize| format!("{} = ?", quote(&table.columns[*index].name));
        let keys: Vec<String> = table.primary_key.iter().map(equals).collect();
        let mut missing = Vec::new();
        for (set, indexes) in crate::sql::update::by_shape(table, rows) {
            let assignments: Vec<String> = set.iter().map(equals).collect();
            let sql = format!(
                "UPDATE {} SET {} WHERE {}",
                qualified(&table.name),
                assignments.join(", "),
                keys.join(" AND ")
            );
            let lookup = format!("SELECT 1 FROM {} WHERE {}", qualified(&table.name), keys.join(" AND "));
            for index in indexes {
                let row = &rows[index];
                let parameters: Vec<mysql_async::Value> =
                    set.iter().chain(&table.primary_key).map(|&column| super::rows::encode(&row[column])).collect();
                let error = |error| mysql_error(error, Side::Target, &self.server, &doing);
                self.connection.exec_drop(&sql, parameters).await.map_err(error)?;
                if self.connection.affected_rows() == 0 {
                    let key: Vec<mysql_async::Value> =
                        table.primary_key.iter().map(|&column| super::rows::encode(&row[column])).collect();
                    let found: Option<u8> = self
                        .connection
                        .exec_first(&lookup, key)
                        .await
                        .map_err(|error| mysql_error(error, Side::Target, &self.server, &doing))?;
                    if found.is_none() {
                        missing.push(index);
                    }
                }
            }
        }
        Ok(Updated { missing, refused: Vec::new() })
    }

    /// Inserts the rows under savepoints: a row whose content MySQL refuses is found and left
    /// out (`InsertTrial`), a row whose key exists stops the stream.
    async fn insert(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Vec<Refused>> {
        self.begin().await?;
        let rows: Vec<&Row> = rows.iter().collect();
        let mut inserts = TableInserts { connection: &mut self.connection, server: &self.server, table };
        InsertTrial { inserts: &mut inserts, rows: &rows, key_conflicts: true }.run().await
    }

    async fn rows_by_key(&mut self, table: &TableSchema, keys: &[Row]) -> Result<Vec<Row>> {
        self.begin().await?;
        let columns: Vec<&sluice_core::Column> = table.columns.iter().collect();
        self.select_by_key(table, keys, &columns, " FOR UPDATE").await
    }

    fn ddl_commits(&self) -> bool {
        true
    }

    /// One `RENAME TABLE` of every pair: MySQL renames them together, so a reader waits and
    /// then sees every published table.
    async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()> {
        check_fence(&mut self.connection, &self.server, &self.task.job, self.task.fence.as_ref()).await?;
        let renames: Vec<String> = to_publish(self, tables)
            .await?
            .into_iter()
            .map(|(hidden, own)| format!("{} TO {}", qualified(hidden), qualified(own)))
            .collect();
        if renames.is_empty() {
            return Ok(());
        }
        self.execute(&format!("RENAME TABLE {}", renames.join(", ")), "publish the copied tables").await
    }

    /// One `RENAME TABLE` moves the table aside and the copy into its place, so a reader sees
    /// the one or the other; the old table is dropped after. Run again after a crash, it finds
    /// the copy gone and only drops what is left.
    async fn replace(&mut self, hidden: &TableName, own: &TableName) -> Result<()> {
        check_fence(&mut self.connection, &self.server, &self.task.job, self.task.fence.as_ref()).await?;
        let old = TableName { namespace: own.namespace.clone(), name: format!("_sluice_old_{}", own.name) };
        if !self.columns(hidden).await?.is_empty() {
            let moves = if self.columns(own).await?.is_empty() {
                format!("RENAME TABLE {} TO {}", qualified(hidden), qualified(own))
            } else {
                format!(
                    "DROP TABLE IF EXISTS {old}; RENAME TABLE {own} TO {old}, {hidden} TO {own}",
                    old = qualified(&old),
                    own = qualified(own),
                    hidden = qualified(hidden)
                )
            };
            self.execute(&moves, &format!("put the copy {hidden} in the place of {own}")).await?;
        }
        self.execute(&format!("DROP TABLE IF EXISTS {}", qualified(&old)), &format!("drop the replaced table {own}"))
            .await
    }
}
