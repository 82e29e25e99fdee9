//! Data files: record batches written as Parquet files under a table's `data/` directory by
//! Sluice's own Parquet writer (the Arrow and Parquet the other columnar targets use), each
//! described for the table's manifests with its row count, size and the bounds of its integer and
//! short text columns (which readers prune by, and the key merge too).

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::{Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType as Arrow, SchemaRef};
use iceberg::spec::{DataContentType, DataFile, DataFileBuilder, DataFileFormat, Datum, PrimitiveLiteral, Struct};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice_core::{Error, ErrorKind, Result, Side};

use super::partition::Partitioner;

/// Text bounds longer than this are left out (a bound must be a real value, or a prefix with care).
const TEXT_BOUND_BYTES: usize = 64;

fn write_error(path: &str, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("write Iceberg data file {path}: {error}")).on(Side::Target)
}

/// The local path of a location, which another writer may have written as a `file:` URI.
pub(super) fn local(location: &str) -> std::path::PathBuf {
    let path = location.strip_prefix("file://").or_else(|| location.strip_prefix("file:")).unwrap_or(location);
    std::path::PathBuf::from(path)
}

/// A name no other file has: the time, the process and a counter (and `.extension`, unless empty).
pub(super) fn unique_name(prefix: &str, extension: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    let name = format!("{prefix}{nanos:x}-{:x}-{:x}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    if extension.is_empty() {
        name
    } else {
        format!("{name}.{extension}")
    }
}

/// The smallest and largest value of one column so far.
#[derive(Debug, Clone)]
enum Bound {
    Int(i32, i32),
    Long(i64, i64),
    Text(String, String),
    /// A column without usable bounds (a value too long, or none compared yet).
    Unusable,
}

impl Bound {
    fn widen(current: Option<Bound>, column: &dyn Array) -> Option<Bound> {
        let next = match column.data_type() {
            Arrow::Int32 => {
                let values = column.as_any().downcast_ref::<Int32Array>()?;
                let (low, high) = values.iter().flatten().fold(None, |bounds: Option<(i32, i32)>, value| {
                    Some(bounds.map_or((value, value), |(low, high)| (low.min(value), high.max(value))))
                })?;
                Bound::Int(low, high)
            }
            Arrow::Int64 => {
                let values = column.as_any().downcast_ref::<Int64Array>()?;
                let (low, high) = values.iter().flatten().fold(None, |bounds: Option<(i64, i64)>, value| {
                    Some(bounds.map_or((value, value), |(low, high)| (low.min(value), high.max(value))))
                })?;
                Bound::Long(low, high)
            }
            Arrow::Utf8 => {
                let values = column.as_any().downcast_ref::<StringArray>()?;
                if values.iter().flatten().any(|value| value.len() > TEXT_BOUND_BYTES) {
                    Bound::Unusable
                } else {
                    let (low, high) = values.iter().flatten().fold(None, |bounds: Option<(&str, &str)>, value| {
                        Some(bounds.map_or((value, value), |(low, high)| (low.min(value), high.max(value))))
                    })?;
                    Bound::Text(low.to_owned(), high.to_owned())
                }
            }
            _ => return None,
        };
        Some(match (current, next) {
            (None, next) => next,
            (Some(Bound::Int(a, b)), Bound::Int(c, d)) => Bound::Int(a.min(c), b.max(d)),
            (Some(Bound::Long(a, b)), Bound::Long(c, d)) => Bound::Long(a.min(c), b.max(d)),
            (Some(Bound::Text(a, b)), Bound::Text(c, d)) => Bound::Text(a.min(c), b.max(d)),
            _ => Bound::Unusable,
        })
    }

    fn datums(self) -> Option<(Datum, Datum)> {
        match self {
            Bound::Int(low, high) => Some((Datum::int(low), Datum::int(high))),
            Bound::Long(low, high) => Some((Datum::long(low), Datum::long(high))),
            Bound::Text(low, high) => Some((Datum::string(low), Datum::string(high))),
            Bound::Unusable => None,
        }
    }
}

/// A data file's bound of a column as JSON (numbers, text), as the key merge compares them.
pub(super) fn bound_json(datum: &Datum) -> Option<serde_json::Value> {
    match datum.literal() {
        PrimitiveLiteral::Int(value) => Some(serde_json::json!(value)),
        PrimitiveLiteral::Long(value) => Some(serde_json::json!(value)),
        PrimitiveLiteral::String(value) => Some(serde_json::json!(value)),
        _ => None,
    }
}

/// A file being written, of one partition.
struct OpenFile {
    partition: Struct,
    path: String,
    writer: ArrowWriter<File>,
    rows: u64,
    /// Field id → bounds.
    bounds: HashMap<i32, Option<Bound>>,
}

/// Writes a table's rows into data files of about `file_bytes` each, a file per partition.
pub(super) struct DataWriter {
    directory: String,
    schema: SchemaRef,
    /// The field id of each column of `schema`.
    ids: Vec<i32>,
    spec_id: i32,
    file_bytes: u64,
    partitioner: Option<Partitioner>,
    open: Vec<OpenFile>,
    written: Vec<DataFile>,
}

impl DataWriter {
    /// A writer into `<table location>/data/` of batches with `schema` (which carries field ids),
    /// their rows partitioned by `partitioner` (none: one partition).
    pub(super) fn new(
        location: &str,
        schema: SchemaRef,
        spec_id: i32,
        file_bytes: u64,
        partitioner: Option<Partitioner>,
    ) -> DataWriter {
        let ids = schema
            .fields()
            .iter()
            .map(|field| field.metadata().get("PARQUET:field_id").and_then(|id| id.parse().ok()).unwrap_or_default())
            .collect();
        DataWriter {
            directory: format!("{}/data", location.trim_end_matches('/')),
            schema,
            ids,
            spec_id,
            file_bytes,
            partitioner,
            open: Vec::new(),
            written: Vec::new(),
        }
    }

    pub(super) fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Bytes held by the open files, written or buffered.
    pub(super) fn held_bytes(&self) -> u64 {
        self.open.iter().map(|open| (open.writer.bytes_written() + open.writer.in_progress_size()) as u64).sum()
    }

    pub(super) fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        match &self.partitioner {
            Some(partitioner) => {
                for (partition, rows) in partitioner.split(batch)? {
                    self.write_part(partition, &rows)?;
                }
                Ok(())
            }
            None => self.write_part(Struct::empty(), batch),
        }
    }

    /// Writes rows of one partition into its open file (opened when it has none).
    fn write_part(&mut self, partition: Struct, batch: &RecordBatch) -> Result<()> {
        let index = match self.open.iter().position(|open| open.partition == partition) {
            Some(index) => index,
            None => {
                std::fs::create_dir_all(local(&self.directory)).map_err(|error| write_error(&self.directory, error))?;
                let path = format!("{}/{}", self.directory, unique_name("", "parquet"));
                let file = File::create(local(&path)).map_err(|error| write_error(&path, error))?;
                let properties = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .set_max_row_group_row_count(Some(128 * 1024))
                    .build();
                let writer = ArrowWriter::try_new(file, self.schema.clone(), Some(properties))
                    .map_err(|error| write_error(&path, error))?;
                self.open.push(OpenFile { partition, path, writer, rows: 0, bounds: HashMap::new() });
                self.open.len() - 1
            }
        };
        let open = &mut self.open[index];
        open.writer.write(batch).map_err(|error| write_error(&open.path, error))?;
        open.rows += batch.num_rows() as u64;
        for (column, id) in self.ids.iter().enumerate() {
            let current = open.bounds.remove(id).flatten();
            open.bounds.insert(*id, Bound::widen(current, batch.column(column).as_ref()));
        }
        if (open.writer.bytes_written() + open.writer.in_progress_size()) as u64 >= self.file_bytes {
            self.close_file(index)?;
        }
        Ok(())
    }

    fn close_file(&mut self, index: usize) -> Result<()> {
        let OpenFile { partition, path, writer, rows, bounds } = self.open.remove(index);
        writer.close().map_err(|error| write_error(&path, error))?;
        let size = std::fs::metadata(local(&path)).map_err(|error| write_error(&path, error))?.len();
        let mut lower = HashMap::new();
        let mut upper = HashMap::new();
        for (id, bound) in bounds {
            if let Some((low, high)) = bound.and_then(Bound::datums) {
                lower.insert(id, low);
                upper.insert(id, high);
            }
        }
        let file = DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path(path.clone())
            .file_format(DataFileFormat::Parquet)
            .partition(partition)
            .partition_spec_id(self.spec_id)
            .record_count(rows)
            .file_size_in_bytes(size)
            .lower_bounds(lower)
            .upper_bounds(upper)
            .build()
            .map_err(|error| write_error(&path, error))?;
        self.written.push(file);
        Ok(())
    }

    /// Closes the open files; the files written since the last `finish`.
    pub(super) fn finish(&mut self) -> Result<Vec<DataFile>> {
        while !self.open.is_empty() {
            self.close_file(self.open.len() - 1)?;
        }
        Ok(std::mem::take(&mut self.written))
    }
}
