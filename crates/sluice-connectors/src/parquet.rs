//! Parquet files as a target: one dataset (directory) per table, one `part-N.parquet` per split,
//! typed columns, snappy-compressed row groups. Like the other file targets, a part is written
//! to `*.tmp` and renamed when its split is done, so a part that exists is whole.

use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Decimal256Builder, Float32Builder,
    Float64Builder, Int16Builder, Int32Builder, Int64Builder, Int8Builder, StringBuilder, TimestampMicrosecondBuilder,
    UInt16Builder, UInt32Builder, UInt64Builder, UInt8Builder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType as Arrow, Field, Schema, TimeUnit};
use async_trait::async_trait;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice_core::change::{key_text, Batch, ChangeKind, Rejected};
use sluice_core::connector::{CheckItem, Checkpoint, Sink, TableTasks, Writer};

use crate::file::{check_directory, Part};
use sluice_core::{DataType, DateTime, Error, ErrorKind, Result, Side, TableName, TableSchema, Value};

/// Rows per row group: large enough for good compression and scans, small enough to bound the
/// writer's memory.
const ROW_GROUP_ROWS: usize = 128 * 1024;

fn io_error(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("{doing}: {error}")).on(Side::Target)
}

/// The Arrow type a logical type is written as. Every mapping holds every value: unsigned
/// integers keep their width, decimals up to 76 digits are exact decimals (wider or unbounded ones
/// are strings), MySQL TIME (±838 h) is a signed count of microseconds.
fn arrow_type(data_type: &DataType) -> Arrow {
    match data_type {
        DataType::Boolean => Arrow::Boolean,
        DataType::Integer { bytes: 1, unsigned: false } => Arrow::Int8,
        DataType::Integer { bytes: 2, unsigned: false } => Arrow::Int16,
        DataType::Integer { bytes: 3 | 4, unsigned: false } => Arrow::Int32,
        DataType::Integer { unsigned: false, .. } => Arrow::Int64,
        DataType::Integer { bytes: 1, unsigned: true } => Arrow::UInt8,
        DataType::Integer { bytes: 2, unsigned: true } => Arrow::UInt16,
        DataType::Integer { bytes: 3 | 4, unsigned: true } => Arrow::UInt32,
        DataType::Integer { .. } | DataType::Bits { .. } => Arrow::UInt64,
        DataType::Float32 => Arrow::Float32,
        DataType::Float64 => Arrow::Float64,
        DataType::Decimal { precision: Some(precision), scale } if *precision <= 38 => {
            Arrow::Decimal128(*precision as u8, scale.unwrap_or(0) as i8)
        }
        DataType::Decimal { precision: Some(precision), scale } if *precision <= 76 => {
            Arrow::Decimal256(*precision as u8, scale.unwrap_or(0) as i8)
        }
        DataType::Decimal { .. } => Arrow::Utf8,
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } | DataType::Json => Arrow::Utf8,
        DataType::Bytes { .. } | DataType::Geometry => Arrow::Binary,
        DataType::Date => Arrow::Date32,
        DataType::Time { .. } => Arrow::Int64,
        DataType::DateTime { .. } => Arrow::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp { .. } => Arrow::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        DataType::Year => Arrow::Int16,
    }
}

fn arrow_schema(table: &TableSchema) -> Arc<Schema> {
    Arc::new(Schema::new(
        table
            .columns
            .iter()
            .map(|column| {
                let field = Field::new(&column.name, arrow_type(&column.data_type), column.nullable);
                // The source type travels as field metadata, so a reader can tell TIME from INT.
                field.with_metadata([("sluice.native_type", column.native_type.as_str())])
            })
            .collect::<Vec<_>>(),
    ))
}

fn microseconds(value: &DateTime) -> i64 {
    let seconds = value.date.days_since_epoch() * 86_400
        + i64::from(value.hour) * 3_600
        + i64::from(value.minute) * 60
        + i64::from(value.second);
    seconds * 1_000_000 + i64::from(value.microsecond)
}

/// The unscaled digits of a decimal at `scale` (`1.5` at scale 2 is `150`).
fn unscaled(value: &sluice_core::Decimal, scale: usize) -> String {
    let text = value.as_str();
    let (integer, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut digits = format!("{integer}{fraction}");
    digits.push_str(&"0".repeat(scale.saturating_sub(fraction.len())));
    digits
}

/// One column being filled for a record batch.
struct ColumnBuilder {
    data_type: DataType,
    builder: Box<dyn ArrayBuilder>,
}

impl ColumnBuilder {
    fn new(data_type: &DataType, capacity: usize) -> ColumnBuilder {
        let builder: Box<dyn ArrayBuilder> = match arrow_type(data_type) {
            Arrow::Boolean => Box::new(BooleanBuilder::with_capacity(capacity)),
            Arrow::Int8 => Box::new(Int8Builder::with_capacity(capacity)),
            Arrow::Int16 => Box::new(Int16Builder::with_capacity(capacity)),
            Arrow::Int32 => Box::new(Int32Builder::with_capacity(capacity)),
            Arrow::Int64 => Box::new(Int64Builder::with_capacity(capacity)),
            Arrow::UInt8 => Box::new(UInt8Builder::with_capacity(capacity)),
            Arrow::UInt16 => Box::new(UInt16Builder::with_capacity(capacity)),
            Arrow::UInt32 => Box::new(UInt32Builder::with_capacity(capacity)),
            Arrow::UInt64 => Box::new(UInt64Builder::with_capacity(capacity)),
            Arrow::Float32 => Box::new(Float32Builder::with_capacity(capacity)),
            Arrow::Float64 => Box::new(Float64Builder::with_capacity(capacity)),
            arrow @ Arrow::Decimal128(..) => Box::new(Decimal128Builder::with_capacity(capacity).with_data_type(arrow)),
            arrow @ Arrow::Decimal256(..) => Box::new(Decimal256Builder::with_capacity(capacity).with_data_type(arrow)),
            Arrow::Binary => Box::new(BinaryBuilder::with_capacity(capacity, capacity * 16)),
            Arrow::Date32 => Box::new(Date32Builder::with_capacity(capacity)),
            Arrow::Timestamp(_, None) => Box::new(TimestampMicrosecondBuilder::with_capacity(capacity)),
            Arrow::Timestamp(_, Some(_)) => {
                Box::new(TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone("UTC"))
            }
            _ => Box::new(StringBuilder::with_capacity(capacity, capacity * 16)),
        };
        ColumnBuilder { data_type: data_type.clone(), builder }
    }

    /// Appends a value, or says why it does not fit the column's Arrow type.
    fn append(&mut self, value: &Value) -> std::result::Result<(), String> {
        macro_rules! builder {
            ($type:ty) => {
                self.builder.as_any_mut().downcast_mut::<$type>().expect("the builder matches the column type")
            };
        }
        let out_of_range = || format!("{value} is out of range for {:?}", arrow_type(&self.data_type));
        match (arrow_type(&self.data_type), value) {
            (Arrow::Boolean, Value::Null) => builder!(BooleanBuilder).append_null(),
            (Arrow::Boolean, Value::Bool(value)) => builder!(BooleanBuilder).append_value(*value),
            (Arrow::Int8, Value::Null) => builder!(Int8Builder).append_null(),
            (Arrow::Int8, Value::Int(value)) => {
                builder!(Int8Builder).append_value(i8::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::Int16, Value::Null) => builder!(Int16Builder).append_null(),
            (Arrow::Int16, Value::Int(value)) => {
                builder!(Int16Builder).append_value(i16::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::Int32, Value::Null) => builder!(Int32Builder).append_null(),
            (Arrow::Int32, Value::Int(value)) => {
                builder!(Int32Builder).append_value(i32::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::Int64, Value::Null) => builder!(Int64Builder).append_null(),
            (Arrow::Int64, Value::Int(value)) => builder!(Int64Builder).append_value(*value),
            (Arrow::Int64, Value::Time(time)) => {
                let magnitude = ((i64::from(time.hours) * 60 + i64::from(time.minutes)) * 60 + i64::from(time.seconds))
                    * 1_000_000
                    + i64::from(time.microseconds);
                builder!(Int64Builder).append_value(if time.negative { -magnitude } else { magnitude })
            }
            (Arrow::UInt8, Value::Null) => builder!(UInt8Builder).append_null(),
            (Arrow::UInt8, Value::UInt(value)) => {
                builder!(UInt8Builder).append_value(u8::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::UInt16, Value::Null) => builder!(UInt16Builder).append_null(),
            (Arrow::UInt16, Value::UInt(value)) => {
                builder!(UInt16Builder).append_value(u16::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::UInt32, Value::Null) => builder!(UInt32Builder).append_null(),
            (Arrow::UInt32, Value::UInt(value)) => {
                builder!(UInt32Builder).append_value(u32::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::UInt64, Value::Null) => builder!(UInt64Builder).append_null(),
            (Arrow::UInt64, Value::UInt(value)) | (Arrow::UInt64, Value::Bits { value, .. }) => {
                builder!(UInt64Builder).append_value(*value)
            }
            (Arrow::Float32, Value::Null) => builder!(Float32Builder).append_null(),
            (Arrow::Float32, Value::Float32(value)) => builder!(Float32Builder).append_value(*value),
            (Arrow::Float64, Value::Null) => builder!(Float64Builder).append_null(),
            (Arrow::Float64, Value::Float64(value)) => builder!(Float64Builder).append_value(*value),
            (Arrow::Float64, Value::Float32(value)) => builder!(Float64Builder).append_value(f64::from(*value)),
            (Arrow::Decimal128(..), Value::Null) => builder!(Decimal128Builder).append_null(),
            (Arrow::Decimal128(_, scale), Value::Decimal(value)) => {
                let digits = unscaled(value, scale as usize);
                builder!(Decimal128Builder).append_value(digits.parse::<i128>().map_err(|_| out_of_range())?)
            }
            (Arrow::Decimal256(..), Value::Null) => builder!(Decimal256Builder).append_null(),
            (Arrow::Decimal256(_, scale), Value::Decimal(value)) => {
                let digits = unscaled(value, scale as usize);
                let parsed = arrow_buffer::i256::from_string(&digits).ok_or_else(out_of_range)?;
                builder!(Decimal256Builder).append_value(parsed)
            }
            (Arrow::Binary, Value::Null) => builder!(BinaryBuilder).append_null(),
            (Arrow::Binary, Value::Bytes(bytes)) => builder!(BinaryBuilder).append_value(bytes),
            (Arrow::Date32, Value::Null) => builder!(Date32Builder).append_null(),
            (Arrow::Date32, Value::Date(date)) if !date.is_zero_or_partial() => {
                builder!(Date32Builder).append_value(date.days_since_epoch() as i32)
            }
            (Arrow::Timestamp(..), Value::Null) => builder!(TimestampMicrosecondBuilder).append_null(),
            (Arrow::Timestamp(..), Value::DateTime(value) | Value::Timestamp(value))
                if !value.date.is_zero_or_partial() =>
            {
                builder!(TimestampMicrosecondBuilder).append_value(microseconds(value))
            }
            (Arrow::Utf8, Value::Null) => builder!(StringBuilder).append_null(),
            (Arrow::Utf8, Value::Text(text) | Value::Json(text)) => builder!(StringBuilder).append_value(text),
            (Arrow::Utf8, Value::Decimal(value)) => builder!(StringBuilder).append_value(value.as_str()),
            (arrow, value) => return Err(format!("{value} cannot be written as {arrow:?}")),
        }
        Ok(())
    }
}

/// Writes each table as a directory of Parquet parts.
#[derive(Debug)]
pub struct ParquetSink {
    directory: PathBuf,
}

impl ParquetSink {
    pub fn new(directory: PathBuf) -> ParquetSink {
        ParquetSink { directory }
    }

    fn table_directory(&self, table: &TableName) -> PathBuf {
        self.directory.join(crate::file::directory_name(table))
    }
}

#[async_trait]
impl Sink for ParquetSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        check_directory(&self.directory)
    }

    fn target_name(&self, source: &TableName) -> TableName {
        source.clone()
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables
            .iter()
            .map(|table| format!("-- {}\n{:#?}", self.table_directory(&table.name).display(), arrow_schema(table)))
            .collect()
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        for table in tables {
            let directory = self.table_directory(&table.name);
            fs::create_dir_all(&directory)
                .map_err(|error| io_error(format!("create {}", directory.display()), error))?;
        }
        Ok(())
    }

    /// Removes the tables' parts: a part is its split's checkpoint.
    async fn reset(&self, _job: &str, tables: &[TableTasks]) -> Result<()> {
        for table in tables {
            Part::remove_all(&self.directory, &table.table, "parquet")?;
        }
        Ok(())
    }

    async fn open(&self, _job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn Writer>> {
        let part = Part::new(&self.directory, &table.name, task, "parquet");
        Ok(Box::new(ParquetWriter { table, part, writer: None }))
    }
}

struct ParquetWriter {
    table: Arc<TableSchema>,
    part: Part,
    writer: Option<ArrowWriter<File>>,
}

impl ParquetWriter {
    fn writer(&mut self) -> Result<&mut ArrowWriter<File>> {
        if self.writer.is_none() {
            let path = self.part.temporary_path();
            let file = File::create(path).map_err(|error| io_error(format!("create {}", path.display()), error))?;
            let properties = WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
                .build();
            let writer = ArrowWriter::try_new(file, arrow_schema(&self.table), Some(properties))
                .map_err(|error| io_error(format!("start {}", path.display()), error))?;
            self.writer = Some(writer);
        }
        Ok(self.writer.as_mut().expect("opened above"))
    }
}

#[async_trait]
impl Writer for ParquetWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.part.recover()
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        let mut columns: Vec<ColumnBuilder> = self
            .table
            .columns
            .iter()
            .map(|column| ColumnBuilder::new(&column.data_type, batch.changes.len()))
            .collect();
        let mut rejected = Vec::new();
        for change in &batch.changes {
            let ChangeKind::Insert { after } = &change.kind else {
                return Err(Error::new(ErrorKind::Write, "the Parquet target takes inserts only (snapshot mode)")
                    .on(Side::Target));
            };
            // Check the whole row first, so a refused row leaves no value behind in any column.
            let problem = after.iter().zip(&self.table.columns).find_map(|(value, column)| {
                let mut probe = ColumnBuilder::new(&column.data_type, 1);
                probe.append(value).err().map(|reason| format!("column {}: {reason}", column.name))
            });
            if let Some(reason) = problem {
                rejected.push(Rejected {
                    table: self.table.name.to_string(),
                    key: key_text(&self.table, after),
                    reason: format!("target: {reason}"),
                    record: None,
                });
                continue;
            }
            for (builder, value) in columns.iter_mut().zip(after) {
                builder.append(value).expect("checked above");
            }
        }
        let arrays: Vec<ArrayRef> = columns.iter_mut().map(|column| column.builder.finish()).collect();
        let record_batch = RecordBatch::try_new(arrow_schema(&self.table), arrays)
            .map_err(|error| io_error(format!("assemble a batch of {}", self.table.name), error))?;
        let path = self.part.temporary_path().display().to_string();
        self.writer()?.write(&record_batch).map_err(|error| io_error(format!("write {path}"), error))?;
        Ok(rejected)
    }

    /// A batch commit hands data to the writer; the part becomes durable and visible, atomically,
    /// with the commit that marks the split done.
    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        if !checkpoint.done {
            return Ok(());
        }
        self.writer()?;
        let writer = self.writer.take().expect("opened above");
        let path = self.part.temporary_path().display().to_string();
        let file = writer.into_inner().map_err(|error| io_error(format!("finish {path}"), error))?;
        self.part.publish(&file)?;
        Ok(())
    }

    /// `recover` already started the part over.
    async fn replace_all(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The `parquet` connector: a snapshot target, one dataset directory per table.
pub(crate) const CONNECTOR: crate::Connector = crate::Connector {
    name: "parquet",
    feature: "parquet",
    capabilities: sluice_core::connector::Capabilities {
        snapshot_source: false,
        change_source: false,
        cursor_source: false,
        table_sink: true,
        change_sink: false,
        event_sink: false,
        upsert: false,
        fencing: false,
        transactions: false,
    },
    source: None,
    target: Some(crate::TargetSide {
        fields: &["type", "path", "write_mode", "create_tables"],
        validate: |_, _| Vec::new(),
        build: |job, _fence| Ok(Arc::new(ParquetSink::new(crate::path(&job.target)?))),
    }),
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_scaled_to_their_column() {
        let decimal = |text| sluice_core::Decimal::parse(text).unwrap();
        assert_eq!(unscaled(&decimal("1.5"), 2), "150");
        assert_eq!(unscaled(&decimal("-0.01"), 2), "-001");
        assert_eq!(unscaled(&decimal("42"), 0), "42");
    }
}
