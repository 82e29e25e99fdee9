//! Applying a change stream to PostgreSQL: per group and table one `DELETE ... USING unnest(...)`
//! with the keys bound as text arrays, and one COPY of the final rows, in a transaction that
//! also moves the stream's row in `sluice.checkpoints`.

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::SinkExt;
use sluice_core::connector::{ChangeWriter, Checkpoint};
use sluice_core::net_changes::missing_rows;
use sluice_core::{Error, ErrorKind, Result, Row, Side, TableSchema, Value};
use tokio_postgres::Client;

use super::sink::{commit_with_checkpoint, qualified, read_checkpoint};
use super::{column_type, encode_copy, postgres_error, quote};

/// At most this many keys per DELETE; a larger set takes several statements.
const KEYS_PER_STATEMENT: usize = 10_000;

pub(super) struct PostgresChangeWriter {
    pub(super) client: Client,
    pub(super) server: String,
    pub(super) job: String,
    pub(super) task: String,
    pub(super) in_transaction: bool,
    pub(super) buffer: String,
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

impl PostgresChangeWriter {
    fn error<'a>(&'a self, doing: &'a str) -> impl Fn(tokio_postgres::Error) -> Error + 'a {
        move |error| postgres_error(error, Side::Target, &self.server, doing)
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
                format!("t.{} = k.k{index}::{}", quote(&column.name), column_type(&column.data_type))
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
}

#[async_trait]
impl ChangeWriter for PostgresChangeWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        read_checkpoint(&self.client, &self.server, &self.job, &self.task).await
    }

    async fn delete(&mut self, table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()> {
        self.begin().await?;
        let mut missing = Vec::new();
        for (chunk_number, chunk) in keys.chunks(KEYS_PER_STATEMENT).enumerate() {
            let offset = chunk_number * KEYS_PER_STATEMENT;
            missing.extend(self.delete_chunk(table, chunk).await?.into_iter().map(|index| &keys[offset + index]));
        }
        if expect_all && !missing.is_empty() {
            return Err(missing_rows(table, &missing));
        }
        Ok(())
    }

    async fn insert(&mut self, table: &TableSchema, rows: &[Row]) -> Result<()> {
        self.begin().await?;
        self.buffer.clear();
        for row in rows {
            for (index, value) in row.iter().enumerate() {
                if index > 0 {
                    self.buffer.push('\t');
                }
                encode_copy(value, &mut self.buffer);
            }
            self.buffer.push('\n');
        }
        let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
        let copy = format!("COPY {} ({}) FROM STDIN", qualified(&table.name), columns.join(", "));
        let data = Bytes::from(std::mem::take(&mut self.buffer));
        let copied = async {
            let sink = self.client.copy_in::<_, Bytes>(copy.as_str()).await?;
            futures_util::pin_mut!(sink);
            sink.send(data).await?;
            sink.finish().await
        }
        .await;
        match copied {
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                let detail = error.as_db_error().and_then(|database| database.detail()).unwrap_or("").to_owned();
                Err(Error::new(
                    ErrorKind::Conflict,
                    format!("table {}: a row the source inserted already exists in the target: {detail}", table.name),
                )
                .on(Side::Target)
                .hint("the target was changed outside this job; remove the row (or copy the table again) and restart"))
            }
            Err(error) => Err(postgres_error(error, Side::Target, &self.server, &format!("copy into {}", table.name))),
        }
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        self.begin().await?;
        self.in_transaction = false;
        commit_with_checkpoint(&self.client, &self.server, &self.job, checkpoint).await
    }
}
