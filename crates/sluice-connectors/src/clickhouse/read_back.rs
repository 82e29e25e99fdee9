//! A table of a ClickHouse target read back as a source of its rows, what `sluice verify`
//! compares the source with: the live rows (`<table>_live`: `FINAL`, tombstones left out) of the
//! columns the table has, in TabSeparated, typed by the job's mapped schema. One split per table,
//! streamed as the server sends it.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::change::{Batch, Change, Position, Row};
use sluice_core::connector::{CheckItem, Reader, SnapshotSource, Source, Split, SplitHint};
use sluice_core::{DataType, Date, DateTime, Decimal, Error, ErrorKind, Result, Side, TableSchema, Time, Value};

use super::server::{quote, Server};
use super::tables::{self, live_view, qualified};
use super::ClickHouseOptions;

/// One table of the target.
pub(crate) struct ClickHouseTable {
    server: Server,
    table: Arc<TableSchema>,
}

impl ClickHouseTable {
    /// The reader of `table` of the target these options reach.
    pub(crate) fn new(options: &ClickHouseOptions, table: &Arc<TableSchema>) -> Result<ClickHouseTable> {
        let server = Server::new(options.url.expose(), options.shown.clone())?;
        Ok(ClickHouseTable { server, table: table.clone() })
    }

    /// The mapped schema with only the columns the table has; `None` when it does not exist.
    async fn held(&self) -> Result<Option<TableSchema>> {
        let columns = tables::columns(&self.server, &self.table.name).await?;
        if columns.is_empty() {
            return Ok(None);
        }
        let has = |name: &str| columns.iter().any(|(column, _)| column == name);
        Ok(Some(self.table.keeping(&has)))
    }
}

#[async_trait]
impl Source for ClickHouseTable {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        Ok(Vec::new())
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        Ok(self.held().await?.into_iter().collect())
    }

    fn snapshot(&self) -> Option<&dyn SnapshotSource> {
        Some(self)
    }
}

#[async_trait]
impl SnapshotSource for ClickHouseTable {
    async fn split(&self, table: &Arc<TableSchema>, _hint: SplitHint) -> Result<Vec<Split>> {
        Ok(vec![Split::new(format!("{}#0", table.name), table.clone(), &serde_json::Value::Null, 0)])
    }

    async fn open(
        &self,
        split: &Split,
        _resume_after: Option<&Position>,
        batch_rows: usize,
    ) -> Result<Box<dyn Reader>> {
        let table = split.table.clone();
        let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
        let statement =
            format!("SELECT {} FROM {} FORMAT TabSeparated", columns.join(", "), qualified(&live_view(&table.name)));
        let response = self.server.stream(&statement).await?;
        Ok(Box::new(LiveRows { response, table, batch_rows: batch_rows.max(1), pending: Vec::new(), done: false }))
    }
}

/// The rows of one table as the server sends them.
struct LiveRows {
    response: reqwest::Response,
    table: Arc<TableSchema>,
    batch_rows: usize,
    /// Bytes received and not yet read as whole lines.
    pending: Vec<u8>,
    done: bool,
}

#[async_trait]
impl Reader for LiveRows {
    async fn next(&mut self) -> Result<Option<Batch>> {
        let mut rows = Vec::new();
        loop {
            while rows.len() < self.batch_rows {
                let Some(end) = self.pending.iter().position(|&byte| byte == b'\n') else { break };
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                rows.push(row(&self.table, &line[..end])?);
            }
            if rows.len() >= self.batch_rows || self.done {
                break;
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.pending.extend_from_slice(&chunk),
                Ok(None) => self.done = true,
                Err(error) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("reading {} back from ClickHouse: {}", self.table.name, crate::tls::describe(&error)),
                    )
                    .on(Side::Target))
                }
            }
        }
        if rows.is_empty() {
            return Ok(None);
        }
        let changes = rows.into_iter().map(|row| Change::insert(self.table.clone(), row)).collect();
        Ok(Some(Batch::new(changes, Position(serde_json::Value::Null))))
    }
}

/// One TabSeparated line as the table's row.
fn row(table: &TableSchema, line: &[u8]) -> Result<Row> {
    let fields: Vec<&[u8]> = line.split(|&byte| byte == b'\t').collect();
    if fields.len() != table.columns.len() {
        return Err(Error::new(
            ErrorKind::Read,
            format!(
                "ClickHouse sent {} fields for the {} columns of {}",
                fields.len(),
                table.columns.len(),
                table.name
            ),
        )
        .on(Side::Target));
    }
    fields
        .into_iter()
        .zip(&table.columns)
        .map(|(field, column)| {
            value(field, &column.data_type).ok_or_else(|| {
                Error::new(
                    ErrorKind::Read,
                    format!(
                        "{}, column {}: ClickHouse sent `{}`, which is no {:?}",
                        table.name,
                        column.name,
                        String::from_utf8_lossy(field),
                        column.data_type
                    ),
                )
                .on(Side::Target)
            })
        })
        .collect()
}

/// A field as the value of a column of `data_type`, as the writer wrote it.
fn value(field: &[u8], data_type: &DataType) -> Option<Value> {
    if field == b"\\N" {
        return Some(Value::Null);
    }
    let bytes = tables::unescape_bytes(field);
    if let DataType::Bytes { .. } | DataType::Geometry = data_type {
        return Some(Value::Bytes(bytes));
    }
    let text = String::from_utf8(bytes).ok()?;
    Some(match data_type {
        DataType::Boolean => Value::Bool(matches!(text.as_str(), "1" | "true")),
        DataType::Integer { unsigned: true, .. } => Value::UInt(text.parse().ok()?),
        DataType::Integer { .. } | DataType::Year => Value::Int(text.parse().ok()?),
        DataType::Bits { width } => Value::Bits { width: *width, value: text.parse().ok()? },
        DataType::Float32 => Value::Float32(float(&text)? as f32),
        DataType::Float64 => Value::Float64(float(&text)?),
        DataType::Decimal { .. } => Value::Decimal(Decimal::parse(&text)?),
        DataType::Date => Value::Date(Date::parse(&text)?),
        DataType::DateTime { .. } => Value::DateTime(DateTime::parse(&text)?),
        DataType::Timestamp { .. } => Value::Timestamp(DateTime::parse(&text)?),
        DataType::Time { .. } => Value::Time(Time::parse(&text)?),
        DataType::Json => Value::Json(text),
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } => Value::Text(text),
        DataType::Bytes { .. } | DataType::Geometry => unreachable!("read as bytes above"),
    })
}

/// A float as ClickHouse prints it (`inf`, `-inf`, `nan` by those names).
fn float(text: &str) -> Option<f64> {
    match text {
        "inf" | "+inf" => Some(f64::INFINITY),
        "-inf" => Some(f64::NEG_INFINITY),
        "nan" | "-nan" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_as_the_values_written() {
        assert_eq!(value(b"\\N", &DataType::Json), Some(Value::Null));
        let bytes = DataType::Bytes { length: None, fixed: false };
        assert_eq!(value(b"\\0\xff\\\\\\t", &bytes), Some(Value::Bytes(vec![0, 0xff, b'\\', b'\t'])));
        let unsigned = DataType::Integer { bytes: 8, unsigned: true };
        assert_eq!(value(b"18446744073709551615", &unsigned), Some(Value::UInt(u64::MAX)));
        assert_eq!(value(b"-inf", &DataType::Float64), Some(Value::Float64(f64::NEG_INFINITY)));
        let text = DataType::Text { length: None, fixed: false };
        assert_eq!(value(b"a\\nb", &text), Some(Value::Text("a\nb".into())));
        assert_eq!(value(b"x", &DataType::Date), None, "a field that is not its type");
    }
}
