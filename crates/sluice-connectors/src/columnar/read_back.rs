//! A table of a columnar target (a Parquet dataset, a Delta table) read back as a source of its
//! rows: what `sluice verify` compares the source with.
//!
//! The files hold Arrow types only, and one Arrow type can hold several logical ones (an `Int64`
//! is a `BIGINT` or a `TIME`'s microseconds; a `DECIMAL(20, 0)` a Delta table's `BIGINT
//! UNSIGNED`). So a table is read back by the job's mapped schema: each column's logical type
//! says what its Arrow values are, and they come back as the copy and the stream wrote them.
//!
//! Each data file is a split, read in a thread of its own a row group at a time. The files are
//! not in one key order across the table: verification pairs rows by key whatever their order,
//! at the cost of more rows waiting (docs/verify.md).

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Date64Type, Decimal128Type, Decimal256Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType, TimestampSecondType,
    UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType as Arrow, SchemaRef, TimeUnit};
use async_trait::async_trait;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::{Deserialize, Serialize};
use sluice_core::change::{Batch, Change, Position, Row};
use sluice_core::connector::{CheckItem, Reader, SnapshotSource, Source, Split, SplitHint};
use sluice_core::{DataType, Date, DateTime, Error, ErrorKind, Result, Side, TableSchema, Time, Value};
use tokio::sync::mpsc;

/// The data files that hold a table now, and the columns they hold.
pub(crate) struct DataFiles {
    /// The table's Arrow schema: the columns its files hold (partition columns included).
    pub schema: SchemaRef,
    pub files: Vec<DataFileToRead>,
}

/// One data file of a table.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct DataFileToRead {
    pub path: PathBuf,
    pub rows: u64,
    /// Values of partition columns, which the file does not hold, as text (`None`: NULL).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partition: Vec<(String, Option<String>)>,
}

/// Finds the data files of one table of a target, as of now.
#[async_trait]
pub(crate) trait Listing: Send + Sync {
    /// The table's files; `None` when the target has no such table.
    async fn list(&self) -> Result<Option<DataFiles>>;
}

/// A table of a columnar target as a source of its rows, typed by the mapped schema.
pub(crate) struct ColumnarTable {
    table: Arc<TableSchema>,
    listing: Box<dyn Listing>,
}

impl ColumnarTable {
    pub(crate) fn new(table: &Arc<TableSchema>, listing: impl Listing + 'static) -> ColumnarTable {
        ColumnarTable { table: table.clone(), listing: Box::new(listing) }
    }

    /// The mapped schema with only the columns the files hold: a column the target lacks is
    /// reported missing rather than read as NULL.
    fn held(&self, schema: &SchemaRef) -> TableSchema {
        let mut held = TableSchema::named(self.table.name.clone());
        let mut positions = Vec::new();
        for (index, column) in self.table.columns.iter().enumerate() {
            if schema.index_of(&column.name).is_ok() {
                positions.push(index);
                held.columns.push(column.clone());
            }
        }
        let key: Option<Vec<usize>> = self
            .table
            .primary_key
            .iter()
            .map(|column| positions.iter().position(|position| position == column))
            .collect();
        held.primary_key = key.unwrap_or_default();
        held
    }
}

#[async_trait]
impl Source for ColumnarTable {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        Ok(Vec::new())
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        Ok(self.listing.list().await?.map(|files| self.held(&files.schema)).into_iter().collect())
    }

    fn snapshot(&self) -> Option<&dyn SnapshotSource> {
        Some(self)
    }
}

#[async_trait]
impl SnapshotSource for ColumnarTable {
    /// One split per data file.
    async fn split(&self, table: &Arc<TableSchema>, _hint: SplitHint) -> Result<Vec<Split>> {
        let files = self.listing.list().await?.map(|files| files.files).unwrap_or_default();
        Ok(files
            .into_iter()
            .enumerate()
            .map(|(index, file)| {
                let rows = file.rows;
                Split::new(format!("{}#{index}", table.name), table.clone(), &file, rows)
            })
            .collect())
    }

    async fn open(
        &self,
        split: &Split,
        _resume_after: Option<&Position>,
        batch_rows: usize,
    ) -> Result<Box<dyn Reader>> {
        let file: DataFileToRead = serde_json::from_value(split.descriptor.clone())
            .map_err(|error| Error::new(ErrorKind::State, format!("a data file split: {error}")).on(Side::Target))?;
        let (sender, receiver) = mpsc::channel(2);
        let table = split.table.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(error) = read_file(&file, &table, batch_rows.max(1), &sender) {
                let _ = sender.blocking_send(Err(error));
            }
        });
        Ok(Box::new(FileReader { receiver }))
    }
}

/// Reads a data file's row groups into batches of `table`'s rows, sending each.
fn read_file(
    file: &DataFileToRead,
    table: &Arc<TableSchema>,
    batch_rows: usize,
    sender: &mpsc::Sender<Result<Batch>>,
) -> Result<()> {
    let failed = |error: &dyn std::fmt::Display| {
        Error::new(ErrorKind::Read, format!("read data file {}: {error}", file.path.display()))
            .on(Side::Target)
            .hint("the target's files changed while they were read (a compaction or vacuum), or are damaged")
    };
    let opened = File::open(&file.path).map_err(|error| failed(&error))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(opened)
        .and_then(|builder| builder.with_batch_size(batch_rows).build())
        .map_err(|error| failed(&error))?;
    for record_batch in reader {
        let record_batch = record_batch.map_err(|error| failed(&error))?;
        let rows = rows_of(&record_batch, table, &file.partition).map_err(|error| failed(&error))?;
        let changes = rows.into_iter().map(|row| Change::insert(table.clone(), row)).collect();
        if sender.blocking_send(Ok(Batch::new(changes, Position(serde_json::Value::Null)))).is_err() {
            break;
        }
    }
    Ok(())
}

struct FileReader {
    receiver: mpsc::Receiver<Result<Batch>>,
}

#[async_trait]
impl Reader for FileReader {
    async fn next(&mut self) -> Result<Option<Batch>> {
        self.receiver.recv().await.transpose()
    }
}

/// The rows of a record batch as `table`'s columns: found by name, a partition value where the
/// file does not hold the column, NULL where neither has it.
fn rows_of(
    batch: &RecordBatch,
    table: &TableSchema,
    partition: &[(String, Option<String>)],
) -> std::result::Result<Vec<Row>, String> {
    let mut rows: Vec<Row> = (0..batch.num_rows()).map(|_| Vec::with_capacity(table.columns.len())).collect();
    for column in &table.columns {
        match batch.schema().index_of(&column.name) {
            Ok(index) => {
                let array = batch.column(index);
                for (at, row) in rows.iter_mut().enumerate() {
                    let value = value_at(array.as_ref(), at, &column.data_type)
                        .map_err(|error| format!("column {}: {error}", column.name))?;
                    row.push(value);
                }
            }
            Err(_) => {
                let constant = partition
                    .iter()
                    .find(|(name, _)| *name == column.name)
                    .and_then(|(_, value)| value.clone())
                    .map_or(Value::Null, Value::Text);
                rows.iter_mut().for_each(|row| row.push(constant.clone()));
            }
        }
    }
    Ok(rows)
}

/// The value at `row` of an Arrow column holding `data_type` (as `columnar::arrow_type` stores
/// it, or another Arrow type a writer chose for it).
fn value_at(array: &dyn Array, row: usize, data_type: &DataType) -> std::result::Result<Value, String> {
    if array.is_null(row) {
        return Ok(Value::Null);
    }
    let integer = |value: i128| match data_type {
        DataType::Time { .. } => time_of(value),
        DataType::Bits { width } => Value::Bits { width: *width, value: value as u64 },
        DataType::Integer { unsigned: true, .. } => u64::try_from(value).map_or(Value::Int(value as i64), Value::UInt),
        _ => i64::try_from(value).map_or(Value::UInt(value as u64), Value::Int),
    };
    Ok(match array.data_type() {
        Arrow::Boolean => Value::Bool(array.as_boolean().value(row)),
        Arrow::Int8 => integer(i128::from(array.as_primitive::<Int8Type>().value(row))),
        Arrow::Int16 => integer(i128::from(array.as_primitive::<Int16Type>().value(row))),
        Arrow::Int32 => integer(i128::from(array.as_primitive::<Int32Type>().value(row))),
        Arrow::Int64 => integer(i128::from(array.as_primitive::<Int64Type>().value(row))),
        Arrow::UInt8 => integer(i128::from(array.as_primitive::<UInt8Type>().value(row))),
        Arrow::UInt16 => integer(i128::from(array.as_primitive::<UInt16Type>().value(row))),
        Arrow::UInt32 => integer(i128::from(array.as_primitive::<UInt32Type>().value(row))),
        Arrow::UInt64 => integer(i128::from(array.as_primitive::<UInt64Type>().value(row))),
        Arrow::Float32 => Value::Float32(array.as_primitive::<Float32Type>().value(row)),
        Arrow::Float64 => Value::Float64(array.as_primitive::<Float64Type>().value(row)),
        Arrow::Decimal128(_, scale) => {
            let unscaled = array.as_primitive::<Decimal128Type>().value(row);
            match (data_type, *scale) {
                (DataType::Integer { .. } | DataType::Bits { .. }, 0) => integer(unscaled),
                _ => decimal(unscaled.to_string(), *scale)?,
            }
        }
        Arrow::Decimal256(_, scale) => decimal(array.as_primitive::<Decimal256Type>().value(row).to_string(), *scale)?,
        Arrow::Utf8 => text(array.as_string::<i32>().value(row), data_type),
        Arrow::LargeUtf8 => text(array.as_string::<i64>().value(row), data_type),
        Arrow::Binary => Value::Bytes(array.as_binary::<i32>().value(row).to_vec()),
        Arrow::LargeBinary => Value::Bytes(array.as_binary::<i64>().value(row).to_vec()),
        Arrow::Date32 => {
            Value::Date(Date::from_days_since_epoch(i64::from(array.as_primitive::<Date32Type>().value(row))))
        }
        Arrow::Date64 => date_time(i128::from(array.as_primitive::<Date64Type>().value(row)) * 1_000, data_type),
        Arrow::Timestamp(unit, _) => {
            let micros = match unit {
                TimeUnit::Second => i128::from(array.as_primitive::<TimestampSecondType>().value(row)) * 1_000_000,
                TimeUnit::Millisecond => {
                    i128::from(array.as_primitive::<TimestampMillisecondType>().value(row)) * 1_000
                }
                TimeUnit::Microsecond => i128::from(array.as_primitive::<TimestampMicrosecondType>().value(row)),
                TimeUnit::Nanosecond => i128::from(array.as_primitive::<TimestampNanosecondType>().value(row)) / 1_000,
            };
            date_time(micros, data_type)
        }
        other => return Err(format!("Arrow type {other} cannot be read back")),
    })
}

/// A decimal from its unscaled digits.
fn decimal(digits: String, scale: i8) -> std::result::Result<Value, String> {
    let (negative, digits) = match digits.strip_prefix('-') {
        Some(digits) => (true, digits.to_owned()),
        None => (false, digits),
    };
    let scale = usize::try_from(scale).map_err(|_| format!("a decimal of negative scale {scale}"))?;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (integer, fraction) = padded.split_at(padded.len() - scale);
    let text = match fraction.is_empty() {
        true => format!("{}{integer}", if negative { "-" } else { "" }),
        false => format!("{}{integer}.{fraction}", if negative { "-" } else { "" }),
    };
    sluice_core::Decimal::parse(&text).map(Value::Decimal).ok_or_else(|| format!("{text} is not a decimal"))
}

/// Text as the column's type has it: a JSON document, a decimal too wide for an Arrow decimal
/// (kept as its text), or text.
fn text(text: &str, data_type: &DataType) -> Value {
    match data_type {
        DataType::Json => Value::Json(text.to_owned()),
        DataType::Decimal { .. } => {
            sluice_core::Decimal::parse(text).map_or_else(|| Value::Text(text.to_owned()), Value::Decimal)
        }
        _ => Value::Text(text.to_owned()),
    }
}

/// A signed count of microseconds as a time of day or duration.
fn time_of(micros: i128) -> Value {
    let magnitude = micros.unsigned_abs();
    let seconds = magnitude / 1_000_000;
    Value::Time(Time {
        negative: micros < 0,
        hours: (seconds / 3_600) as u32,
        minutes: (seconds / 60 % 60) as u8,
        seconds: (seconds % 60) as u8,
        microseconds: (magnitude % 1_000_000) as u32,
    })
}

/// Microseconds since the Unix epoch as the date and time `data_type` holds.
fn date_time(micros: i128, data_type: &DataType) -> Value {
    let day = micros.div_euclid(86_400_000_000);
    let within = micros.rem_euclid(86_400_000_000);
    let seconds = within / 1_000_000;
    let moment = DateTime {
        date: Date::from_days_since_epoch(day as i64),
        hour: (seconds / 3_600) as u8,
        minute: (seconds / 60 % 60) as u8,
        second: (seconds % 60) as u8,
        microsecond: (within % 1_000_000) as u32,
    };
    match data_type {
        DataType::Timestamp { .. } => Value::Timestamp(moment),
        DataType::Date if within == 0 => Value::Date(moment.date),
        _ => Value::DateTime(moment),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columnar::{arrow_type, ArrowTypes, ColumnBuilder};

    /// Every logical value written by the columnar builders reads back as an equal value.
    #[test]
    fn values_written_by_the_builders_read_back_as_they_were() {
        let cases: Vec<(DataType, Value)> = vec![
            (DataType::Boolean, Value::Bool(true)),
            (DataType::Integer { bytes: 8, unsigned: false }, Value::Int(-42)),
            (DataType::Integer { bytes: 8, unsigned: true }, Value::UInt(u64::MAX)),
            (DataType::Integer { bytes: 1, unsigned: true }, Value::UInt(200)),
            (DataType::Bits { width: 12 }, Value::Bits { width: 12, value: 0b1010_1111_0000 }),
            (DataType::Float32, Value::Float32(0.1)),
            (DataType::Float64, Value::Float64(-2.5e300)),
            (DataType::Decimal { precision: Some(12), scale: Some(4) }, Value::Decimal("-12.0050".parse_decimal())),
            (DataType::Decimal { precision: Some(12), scale: Some(4) }, Value::Decimal("0.0001".parse_decimal())),
            (
                DataType::Decimal { precision: Some(60), scale: Some(2) },
                Value::Decimal("123456789012345678901234567890.25".parse_decimal()),
            ),
            (DataType::Decimal { precision: None, scale: None }, Value::Decimal("3.14159".parse_decimal())),
            (DataType::Text { length: None, fixed: false }, Value::Text("a trailing space ".into())),
            (DataType::Json, Value::Json(r#"{"b":1,"a":[2]}"#.into())),
            (DataType::Bytes { length: None, fixed: false }, Value::Bytes(vec![0, 255, 7])),
            (DataType::Date, Value::Date(Date { year: 1969, month: 7, day: 20 })),
            (DataType::Time { precision: 6 }, Value::Time(Time::parse("-838:59:58.000001").unwrap())),
            (
                DataType::DateTime { precision: 6 },
                Value::DateTime(DateTime::parse("1901-02-03 04:05:06.789012").unwrap()),
            ),
            (DataType::Timestamp { precision: 0 }, Value::Timestamp(DateTime::parse("2038-01-19 03:14:08").unwrap())),
        ];
        for types in
            [ArrowTypes { unsigned: true, decimal256: true }, ArrowTypes { unsigned: false, decimal256: false }]
        {
            for (data_type, value) in &cases {
                let arrow = arrow_type(data_type, types);
                let mut builder = ColumnBuilder::new(&arrow, 2);
                builder.append(value).unwrap();
                builder.append(&Value::Null).unwrap();
                let array = builder.finish();
                assert_eq!(value_at(array.as_ref(), 0, data_type).unwrap(), *value, "{data_type:?} as {arrow:?}");
                assert_eq!(value_at(array.as_ref(), 1, data_type).unwrap(), Value::Null);
            }
        }
    }

    trait ParseDecimal {
        fn parse_decimal(&self) -> sluice_core::Decimal;
    }

    impl ParseDecimal for str {
        fn parse_decimal(&self) -> sluice_core::Decimal {
            sluice_core::Decimal::parse(self).unwrap()
        }
    }
}
