//! Rows COPYed under a savepoint, so a row whose content PostgreSQL refuses is found and left out
//! (`sluice_core::connector::find_refused`) instead of failing the transaction: the copy's
//! batches and the stream's groups share it.

use async_trait::async_trait;
use sluice_core::connector::{find_refused, Refused, RowTrial};
use sluice_core::{Error, ErrorKind, Result, Row, Side, TableSchema, Value};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::{copy_rows, is_row_error, postgres_error};

/// Rows of one table tried into the open transaction by `COPY` (and `then`, a statement run
/// after it, e.g. an upsert's merge of the staged rows).
pub(super) struct CopyTrial<'a> {
    pub client: &'a Client,
    pub server: &'a str,
    pub table: &'a TableSchema,
    pub copy: &'a str,
    pub then: Option<&'a str>,
    pub rows: &'a [&'a Row],
    pub buffer: &'a mut String,
    /// A row whose primary key exists stops the job (the change stream) instead of being refused.
    pub key_conflicts: bool,
}

impl CopyTrial<'_> {
    /// Writes the rows; returns those refused for their content, the others written.
    pub async fn run(mut self) -> Result<Vec<Refused>> {
        let count = self.rows.len();
        find_refused(&mut self, count).await
    }

    fn error(&self, doing: &str) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
        let doing = doing.to_owned();
        move |error| postgres_error(error, Side::Target, self.server, &doing)
    }

    async fn write(&mut self, rows: &[&Row]) -> std::result::Result<(), tokio_postgres::Error> {
        copy_rows(self.client, self.copy, rows.iter().copied(), self.buffer).await?;
        if let Some(then) = self.then {
            self.client.batch_execute(then).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl RowTrial for CopyTrial<'_> {
    async fn try_rows(&mut self, range: std::ops::Range<usize>) -> Result<Option<String>> {
        self.client.batch_execute("SAVEPOINT trial").await.map_err(self.error("set a savepoint"))?;
        let all = self.rows;
        let rows = &all[range];
        let Err(error) = self.write(rows).await else { return Ok(None) };
        if !is_row_error(&error) {
            return Err(postgres_error(error, Side::Target, self.server, &format!("copy into {}", self.table.name)));
        }
        self.client.batch_execute("ROLLBACK TO SAVEPOINT trial").await.map_err(self.error("roll back refused rows"))?;
        if self.key_conflicts && error.code() == Some(&SqlState::UNIQUE_VIOLATION) {
            let detail = error.as_db_error().and_then(|database| database.detail()).unwrap_or("").to_owned();
            return Err(Error::new(
                ErrorKind::Conflict,
                format!("table {}: a row the source inserted already exists in the target: {detail}", self.table.name),
            )
            .on(Side::Target)
            .hint("the target was changed outside this job; remove the row (or copy the table again) and restart"));
        }
        let row = (rows.len() == 1).then(|| rows[0]);
        Ok(Some(refusal(&error, self.table, row)))
    }
}

/// Why PostgreSQL refused a row, for its dirty record: the server's message, after the column
/// when the server names it (a NOT NULL violation, a value that does not convert) or when the
/// row holds a NUL byte, which no PostgreSQL text can.
pub(super) fn refusal(error: &tokio_postgres::Error, table: &TableSchema, row: Option<&Row>) -> String {
    let Some(database) = error.as_db_error() else { return format!("target: {error}") };
    // COPY names the column in its context: `COPY t, line 1, column d: "2020-02-31"`.
    let from_context = || {
        let context = database.where_()?;
        let start = context.find(", column ")? + ", column ".len();
        let end = context[start..].find(": ").map_or(context.len(), |end| start + end);
        Some(context[start..end].to_owned())
    };
    let with_nul = || {
        let row = row?;
        table.columns.iter().zip(row).find_map(|(column, value)| match value {
            Value::Text(text) | Value::Json(text) if text.contains('\0') => Some(column.name.clone()),
            _ => None,
        })
    };
    match database.column().map(str::to_owned).or_else(from_context).or_else(with_nul) {
        Some(column) => format!("target: column {column}: {}", database.message()),
        None => format!("target: {}", database.message()),
    }
}
