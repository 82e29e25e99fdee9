//! Applying a change stream to PostgreSQL: per group and table one `DELETE ... USING unnest(...)`
//! with the keys bound as text arrays, one `UPDATE ... FROM unnest(...)` of the rows there before
//! and after the group, and one COPY of the rows that came, in a transaction that also moves the
//! stream's row in `sluice.checkpoints`.

use std::collections::HashMap;

use async_trait::async_trait;
use sluice_core::conflict::missing_rows;
use sluice_core::connector::{
    find_refused, ChangeWriter, Checkpoint, FoldedChangeWriter, Refused, RowTrial, SchemaChange, Updated,
};
use sluice_core::schema::{column_changes, ColumnChange};
use sluice_core::{Error, Result, Row, Side, TableName, TableSchema, Value};
use tokio_postgres::Client;

use super::checkpoints::{commit_with_checkpoint, read_checkpoint};
use super::tables::{
    add_column_sql, altered_table_sql, create_table_sql, definition_type, finish_sql, identity_columns, qualified,
    retype_column_sql, KeyBuilt,
};
use super::trial::{refusal, CopyTrial};
use super::{encode_copy, is_row_error, postgres_error, quote, refuse_long_names};
use crate::sql::catalog::{to_publish, to_rename, Catalog};
use crate::sql::task::WriterTask;

/// At most this many keys per DELETE or UPDATE; a larger set takes several statements.
const KEYS_PER_STATEMENT: usize = 10_000;

pub(super) struct PostgresChangeWriter {
    pub(super) client: Client,
    pub(super) server: String,
    pub(super) task: WriterTask,
    pub(super) in_transaction: bool,
    pub(super) buffer: String,
    /// The value each identity column's sequence was last set to, by table and column index.
    pub(super) sequences: HashMap<(TableName, usize), i64>,
}

/// A value in PostgreSQL's text input form, for a parameter: COPY's form without its escapes.
fn text_form(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::Text(text) | Value::Json(text) => Some(text.clone()),
        Value::Bytes(bytes) => {
            let mut text = String::with_capacity(2 + bytes.len() * 2);
            text.push_str("\\x");
            for byte in bytes {
                text.push_str(&format!("{byte:02x}"));
            }
            Some(text)
        }
        other => {
            let mut text = String::new();
            encode_copy(other, &mut text);
            Some(text)
        }
    }
}

/// Rows of one table updated in place by key inside the open transaction, tried under a
/// savepoint (`find_refused`). Which keys a try found counts only when the try held.
struct UpdateTrial<'a> {
    client: &'a Client,
    server: &'a str,
    table: &'a TableSchema,
    rows: &'a [Row],
    /// Per row: the target had its key.
    found: Vec<bool>,
}

impl UpdateTrial<'_> {
    /// `UPDATE t SET c = v.s0::type, ... FROM unnest($1::text[], ..., $n::int[]) AS v(...)
    /// WHERE t.k = v.k0::type ... RETURNING v.ordinal`: the columns `set`, then the key.
    fn statement(&self, set: &[usize]) -> String {
        let table = self.table;
        let typed = |alias: &str, index: usize| format!("v.{alias}::{}", definition_type(table, &table.columns[index]));
        let assignments: Vec<String> = set
            .iter()
            .enumerate()
            .map(|(number, &index)| {
                format!("{} = {}", quote(&table.columns[index].name), typed(&format!("s{number}"), index))
            })
            .collect();
        let conditions: Vec<String> = table
            .primary_key
            .iter()
            .enumerate()
            .map(|(number, &index)| {
                format!("t.{} = {}", quote(&table.columns[index].name), typed(&format!("k{number}"), index))
            })
            .collect();
        let aliases: Vec<String> = (0..set.len())
            .map(|number| format!("s{number}"))
            .chain((0..table.primary_key.len()).map(|number| format!("k{number}")))
            .collect();
        let arrays: Vec<String> = (1..=aliases.len()).map(|number| format!("${number}::text[]")).collect();
        format!(
            "UPDATE {} AS t SET {} FROM unnest({}, ${}::int[]) AS v({}, ordinal) WHERE {} RETURNING v.ordinal",
            qualified(&table.name),
            assignments.join(", "),
            arrays.join(", "),
            aliases.len() + 1,
            aliases.join(", "),
            conditions.join(" AND ")
        )
    }

    /// Updates `rows` (indexes into all the rows); returns the indexes whose key had a row.
    async fn write(&self, rows: std::ops::Range<usize>) -> std::result::Result<Vec<usize>, tokio_postgres::Error> {
        let mut found = Vec::new();
        let offset = rows.start;
        for (set, indexes) in crate::sql::update::by_shape(self.table, &self.rows[rows]) {
            let sql = self.statement(&set);
            for chunk in indexes.chunks(KEYS_PER_STATEMENT) {
                let columns: Vec<Vec<Option<String>>> = set
                    .iter()
                    .chain(&self.table.primary_key)
                    .map(|&column| chunk.iter().map(|&index| text_form(&self.rows[offset + index][column])).collect())
                    .collect();
                let ordinals: Vec<i32> = chunk.iter().map(|&index| (offset + index) as i32).collect();
                let mut parameters: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    columns.iter().map(|column| column as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
                parameters.push(&ordinals);
                for row in self.client.query(&sql, &parameters).await? {
                    found.push(row.get::<_, i32>(0) as usize);
                }
            }
        }
        Ok(found)
    }
}

#[async_trait]
impl RowTrial for UpdateTrial<'_> {
    async fn try_rows(&mut self, rows: std::ops::Range<usize>) -> Result<Option<String>> {
        let (client, server, table, all) = (self.client, self.server, self.table, self.rows);
        let doing = format!("update rows of {} in place", table.name);
        let error = |error| postgres_error(error, Side::Target, server, &doing);
        client.batch_execute("SAVEPOINT trial").await.map_err(error)?;
        let single = (rows.len() == 1).then(|| &all[rows.start]);
        match self.write(rows).await {
            Ok(found) => {
                for index in found {
                    self.found[index] = true;
                }
                Ok(None)
            }
            Err(failure) if is_row_error(&failure) => {
                client.batch_execute("ROLLBACK TO SAVEPOINT trial").await.map_err(error)?;
                Ok(Some(refusal(&failure, table, single)))
            }
            Err(failure) => Err(error(failure)),
        }
    }
}

#[async_trait]
impl Catalog for PostgresChangeWriter {
    async fn columns(&mut self, table: &TableName) -> Result<Vec<String>> {
        let namespace = table.namespace.as_deref().unwrap_or("public");
        let rows = self
            .client
            .query(
                "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2",
                &[&namespace, &table.name],
            )
            .await
            .map_err(|error| postgres_error(error, Side::Target, &self.server, &format!("describe table {table}")))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    async fn holds_rows(&mut self, table: &TableName) -> Result<bool> {
        let doing = format!("look into table {table}");
        let held = self
            .client
            .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {})", qualified(table)), &[])
            .await
            .map_err(self.error(&doing))?;
        Ok(held.get(0))
    }

    async fn drop_empty(&mut self, table: &TableName) -> Result<()> {
        self.execute(&format!("DROP TABLE {}", qualified(table)), &format!("drop the empty table {table}")).await
    }
}

/// Sets a sequence to a value written into its column unless it stands past it already; nothing
/// for a column without a sequence, or whose sequence the user may not change.
const ADVANCE_SEQUENCE_SQL: &str = "\
SELECT setval(seq, GREATEST($1::bigint, coalesce(pg_sequence_last_value(seq), 0)))
FROM (SELECT pg_get_serial_sequence($2, $3)::regclass AS seq) s
WHERE seq IS NOT NULL AND has_sequence_privilege(seq, 'UPDATE')";

impl PostgresChangeWriter {
    /// Moves each identity column's sequence past the highest value the stream wrote into it,
    /// so an application that inserts without a value once it writes to the target (after a
    /// cutover) gets a new key rather than one the stream already used. One statement per
    /// column, only when a value passes the last one set.
    async fn advance_sequences(&mut self, table: &TableSchema, rows: &[Row]) -> Result<()> {
        for index in identity_columns(table) {
            let highest = rows
                .iter()
                .filter_map(|row| match row.get(index) {
                    Some(Value::Int(value)) => Some(*value),
                    Some(Value::UInt(value)) => i64::try_from(*value).ok(),
                    _ => None,
                })
                .max();
            let key = (table.name.clone(), index);
            let Some(highest) = highest.filter(|highest| self.sequences.get(&key).is_none_or(|set| set < highest))
            else {
                continue;
            };
            let doing =
                format!("move the sequence of {}.{} past the values written", table.name, table.columns[index].name);
            self.client
                .execute(ADVANCE_SEQUENCE_SQL, &[&highest, &qualified(&table.name), &table.columns[index].name])
                .await
                .map_err(self.error(&doing))?;
            self.sequences.insert(key, highest);
        }
        Ok(())
    }

    async fn execute(&mut self, sql: &str, doing: &str) -> Result<()> {
        self.client.batch_execute(sql).await.map_err(|error| postgres_error(error, Side::Target, &self.server, doing))
    }

    fn error<'a>(&'a self, doing: &'a str) -> impl Fn(tokio_postgres::Error) -> Error + 'a {
        move |error| postgres_error(error, Side::Target, &self.server, doing)
    }

    /// Brings the table's columns to `table`'s (see `column_changes`), each as a snapshot's copy
    /// would define it, then what else the source's ALTER TABLE changed (`altered_table_sql`).
    async fn alter(&mut self, table: &TableSchema, renamed: &[(String, String)], retyped: &[String]) -> Result<()> {
        let name = qualified(&table.name);
        let doing = format!("alter table {}", table.name);
        let existing = self.columns(&table.name).await?;
        for step in column_changes(&existing, table, renamed, retyped) {
            let statements = match step {
                ColumnChange::Rename { from, to } => {
                    vec![format!("ALTER TABLE {name} RENAME COLUMN {} TO {}", quote(from), quote(to))]
                }
                ColumnChange::Add(column) => add_column_sql(table, column),
                ColumnChange::Retype(column) => retype_column_sql(table, column),
                ColumnChange::Drop(column) => {
                    vec![format!("ALTER TABLE {name} DROP COLUMN IF EXISTS {}", quote(&column))]
                }
            };
            for sql in statements {
                self.execute(&sql, &doing).await?;
            }
        }
        for sql in altered_table_sql(table) {
            self.execute(&sql, &doing).await?;
        }
        Ok(())
    }

    async fn begin(&mut self) -> Result<()> {
        if !self.in_transaction {
            self.client.batch_execute("BEGIN").await.map_err(self.error("begin a transaction"))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    /// Deletes one chunk of keys; returns the indexes (into `keys`) of the keys that had no row.
    async fn delete_chunk(&mut self, table: &TableSchema, keys: &[Row]) -> Result<Vec<usize>> {
        let key_columns: Vec<&sluice_core::Column> =
            table.primary_key.iter().map(|&index| &table.columns[index]).collect();
        let arrays: Vec<String> = (1..=key_columns.len()).map(|number| format!("${number}::text[]")).collect();
        let aliases: Vec<String> = (0..key_columns.len()).map(|index| format!("k{index}")).collect();
        let conditions: Vec<String> = key_columns
            .iter()
            .enumerate()
            .map(|(index, column)| {
                format!("t.{} = k.k{index}::{}", quote(&column.name), definition_type(table, column))
            })
            .collect();
        let sql = format!(
            "DELETE FROM {} AS t USING unnest({}, ${}::int[]) AS k({}, ordinal) WHERE {} RETURNING k.ordinal",
            qualified(&table.name),
            arrays.join(", "),
            key_columns.len() + 1,
            aliases.join(", "),
            conditions.join(" AND ")
        );
        let mut columns: Vec<Vec<Option<String>>> = vec![Vec::with_capacity(keys.len()); key_columns.len()];
        for key in keys {
            for (column, value) in columns.iter_mut().zip(key) {
                column.push(text_form(value));
            }
        }
        let ordinals: Vec<i32> = (0..keys.len() as i32).collect();
        let mut parameters: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            columns.iter().map(|column| column as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
        parameters.push(&ordinals);
        let deleted = self.client.query(&sql, &parameters).await.map_err(|error| {
            postgres_error(error, Side::Target, &self.server, &format!("delete from {}", table.name))
        })?;
        let mut found = vec![false; keys.len()];
        for row in deleted {
            found[row.get::<_, i32>(0) as usize] = true;
        }
        Ok(found.iter().enumerate().filter(|(_, found)| !**found).map(|(index, _)| index).collect())
    }

    /// A table without a primary key: deletes one row equal to each of `rows` in every column
    /// (found by its `ctid`, so of duplicates one goes); returns the indexes of those with none.
    async fn delete_rows(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Vec<usize>> {
        let conditions: Vec<String> = table
            .columns
            .iter()
            .enumerate()
            .map(|(index, column)| match column.data_type {
                // `json` has no equality: its text, which it keeps as written, has.
                sluice_core::DataType::Json => {
                    format!("{}::text IS NOT DISTINCT FROM ${}::text", quote(&column.name), index + 1)
                }
                _ => format!(
                    "{} IS NOT DISTINCT FROM ${}::text::{}",
                    quote(&column.name),
                    index + 1,
                    definition_type(table, column)
                ),
            })
            .collect();
        let sql = format!(
            "DELETE FROM {table} WHERE ctid = (SELECT ctid FROM {table} WHERE {} LIMIT 1)",
            conditions.join(" AND "),
            table = qualified(&table.name)
        );
        let statement = self.client.prepare(&sql).await.map_err(|error| {
            postgres_error(error, Side::Target, &self.server, &format!("delete from {}", table.name))
        })?;
        let mut missing = Vec::new();
        for (index, row) in rows.iter().enumerate() {
            let values: Vec<Option<String>> = row.iter().map(text_form).collect();
            let parameters: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                values.iter().map(|value| value as &(dyn tokio_postgres::types::ToSql + Sync)).collect();
            let deleted = self.client.execute(&statement, &parameters).await.map_err(|error| {
                postgres_error(error, Side::Target, &self.server, &format!("delete from {}", table.name))
            })?;
            if deleted == 0 {
                missing.push(index);
            }
        }
        Ok(missing)
    }
}

#[async_trait]
impl ChangeWriter for PostgresChangeWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        read_checkpoint(&self.client, &self.server, &self.task.job, &self.task.name).await
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        self.begin().await?;
        self.in_transaction = false;
        commit_with_checkpoint(&self.client, &self.server, &self.task.job, self.task.fence.as_ref(), checkpoint).await
    }

    /// PostgreSQL's DDL is transactional: the change commits with the checkpoint.
    async fn apply_schema_change(&mut self, change: &SchemaChange) -> Result<()> {
        match change {
            SchemaChange::Create(table) | SchemaChange::Alter { table, .. } => refuse_long_names([table])?,
            SchemaChange::Rename { to, .. } => refuse_long_names([&TableSchema::named(to.clone())])?,
            SchemaChange::Drop(_) | SchemaChange::Truncate(_) => {}
        }
        self.begin().await?;
        match change {
            SchemaChange::Create(table) => {
                self.execute(&create_table_sql(table, KeyBuilt::WithTable), &format!("create table {}", table.name))
                    .await?;
                for statement in finish_sql(table) {
                    self.execute(&statement, &format!("build the indexes and sequences of {}", table.name)).await?;
                }
            }
            SchemaChange::Drop(table) => {
                self.execute(&format!("DROP TABLE IF EXISTS {}", qualified(table)), &format!("drop table {table}"))
                    .await?
            }
            SchemaChange::Truncate(table) => {
                self.execute(&format!("TRUNCATE {}", qualified(table)), &format!("truncate table {table}")).await?
            }
            SchemaChange::Rename { from, to } => {
                if !to_rename(self, from, to).await? {
                    return Ok(());
                }
                let doing = format!("rename table {from} to {to}");
                if from.namespace != to.namespace {
                    let schema = quote(to.namespace.as_deref().unwrap_or("public"));
                    let moved = format!(
                        "CREATE SCHEMA IF NOT EXISTS {schema}; ALTER TABLE {} SET SCHEMA {schema}",
                        qualified(from)
                    );
                    self.execute(&moved, &doing).await?;
                }
                if from.name != to.name {
                    let moved = TableName { namespace: to.namespace.clone(), name: from.name.clone() };
                    let renamed = format!("ALTER TABLE {} RENAME TO {}", qualified(&moved), quote(&to.name));
                    self.execute(&renamed, &doing).await?;
                }
            }
            SchemaChange::Alter { table, renamed, retyped } => self.alter(table, renamed, retyped).await?,
        }
        Ok(())
    }
}

#[async_trait]
impl FoldedChangeWriter for PostgresChangeWriter {
    async fn delete(&mut self, table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()> {
        self.begin().await?;
        let mut missing = Vec::new();
        if table.primary_key.is_empty() {
            missing.extend(self.delete_rows(table, keys).await?.into_iter().map(|index| &keys[index]));
        } else {
            for (chunk_number, chunk) in keys.chunks(KEYS_PER_STATEMENT).enumerate() {
                let offset = chunk_number * KEYS_PER_STATEMENT;
                missing.extend(self.delete_chunk(table, chunk).await?.into_iter().map(|index| &keys[offset + index]));
            }
        }
        if expect_all && !missing.is_empty() {
            return Err(missing_rows(table, &missing));
        }
        Ok(())
    }

    /// Per set of columns the rows carry, one `UPDATE ... FROM unnest(...)` with the values bound
    /// as text arrays (`KEYS_PER_STATEMENT` rows at a time), under savepoints: a row whose
    /// content PostgreSQL refuses is found and left as it was (`UpdateTrial`).
    async fn update(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Updated> {
        self.begin().await?;
        let mut trial =
            UpdateTrial { client: &self.client, server: &self.server, table, rows, found: vec![false; rows.len()] };
        let refused = find_refused(&mut trial, rows.len()).await?;
        let missing = (0..rows.len())
            .filter(|&index| !trial.found[index] && !refused.iter().any(|refused| refused.index == index))
            .collect();
        self.advance_sequences(table, rows).await?;
        Ok(Updated { missing, refused })
    }

    /// An update that sets no indexed column writes no new index entry (a heap-only tuple),
    /// where a delete and an insert write one per index.
    fn updates_in_place(&self) -> bool {
        true
    }

    /// COPYs the rows under savepoints: a row whose content PostgreSQL refuses is found and
    /// left out (`CopyTrial`), a row whose key exists stops the stream.
    async fn insert(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Vec<Refused>> {
        self.begin().await?;
        let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
        let copy = format!("COPY {} ({}) FROM STDIN", qualified(&table.name), columns.join(", "));
        let listed: Vec<&Row> = rows.iter().collect();
        let refused = CopyTrial {
            client: &self.client,
            server: &self.server,
            table,
            copy: &copy,
            then: None,
            rows: &listed,
            buffer: &mut self.buffer,
            key_conflicts: true,
        }
        .run()
        .await?;
        self.advance_sequences(table, rows).await?;
        Ok(refused)
    }

    /// Renames inside the open transaction, which commits with the checkpoint that ends the
    /// replay window: readers see no table, then the published one. The key, identity sequences
    /// and indexes of a hidden copy are named after its own name already (`tables.rs`).
    async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()> {
        self.begin().await?;
        for (hidden, own) in to_publish(self, tables).await? {
            let doing = format!("publish table {own}");
            self.execute(&format!("ALTER TABLE {} RENAME TO {}", qualified(hidden), quote(&own.name)), &doing).await?;
        }
        Ok(())
    }
}
