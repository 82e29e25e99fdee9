//! Parquet files as a target: one dataset (directory) per table, one `part-N.parquet` per split,
//! typed columns, snappy-compressed row groups. Like the other file targets, a part is written
//! to `*.tmp` and renamed when its split is done, so a part that exists is whole. Once every
//! split is done the dataset is made whole by `_manifest.json`, written last, which lists its
//! parts; on a cluster each task's claim is a fence file, checked before its part is renamed.

use std::fs::{self, File};
use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType as Arrow, Field, Schema};
use async_trait::async_trait;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice_core::change::{key_text, Batch, ChangeKind, Rejected};
use sluice_core::connector::{Capabilities, CheckItem, Checkpoint, Fence, Sink, Source, TableTasks, TableWriter};
use sluice_core::spec::JobSpec;

use crate::columnar::read_back::{ColumnarTable, DataFileToRead, DataFiles, Listing};
use crate::columnar::{self, ArrowTypes, ColumnBuilder};
use crate::file::fence::Fences;
use crate::file::{check_directory, write_manifest, Part};
use sluice_core::{DataType, Error, ErrorKind, Result, Side, TableName, TableSchema};

/// Rows per row group: large enough for good compression and scans, small enough to bound the
/// writer's memory.
const ROW_GROUP_ROWS: usize = 128 * 1024;

fn io_error(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("{doing}: {error}")).on(Side::Target)
}

/// The Arrow type a logical type is written as: unsigned integers keep their width, decimals up
/// to 76 digits are exact decimals (wider or unbounded ones are strings).
fn arrow_type(data_type: &DataType) -> Arrow {
    columnar::arrow_type(data_type, ArrowTypes { unsigned: true, decimal256: true })
}

fn arrow_schema(table: &TableSchema) -> Arc<Schema> {
    Arc::new(Schema::new(
        table
            .columns
            .iter()
            .map(|column| {
                let field = Field::new(&column.name, arrow_type(&column.data_type), column.nullable);
                // The source type travels as field metadata, so a reader can tell TIME from INT.
                field.with_metadata([("sluice.native_type".to_owned(), column.native_type.clone())].into())
            })
            .collect::<Vec<_>>(),
    ))
}

/// Writes each table as a directory of Parquet parts.
#[derive(Debug)]
pub struct ParquetSink {
    directory: PathBuf,
    /// A cluster task's claim.
    fence: Option<Fence>,
}

impl ParquetSink {
    pub fn new(directory: PathBuf, fence: Option<Fence>) -> ParquetSink {
        ParquetSink { directory, fence }
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

    async fn claim(&self, job: &str) -> Result<()> {
        match &self.fence {
            Some(fence) => Fences::new(&self.directory, job).claim(job, fence),
            None => Ok(()),
        }
    }

    /// Every split of the tables is done: their manifests list the parts.
    async fn finish(&self, tables: &[TableSchema]) -> Result<()> {
        for table in tables {
            write_manifest(&self.directory, &table.name, "parquet", |path| {
                let file = File::open(path).ok()?;
                let reader = parquet::file::reader::SerializedFileReader::new(file).ok()?;
                use parquet::file::reader::FileReader;
                Some(reader.metadata().file_metadata().num_rows() as u64)
            })?;
        }
        Ok(())
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        let part = Part::new(&self.directory, &table.name, task, "parquet");
        let fence = self.fence.clone().map(|fence| (Fences::new(&self.directory, job), job.to_owned(), fence));
        Ok(Box::new(ParquetWriter { table, part, writer: None, fence }))
    }
}

struct ParquetWriter {
    table: Arc<TableSchema>,
    part: Part,
    writer: Option<ArrowWriter<File>>,
    /// A cluster task's claim, checked before the part is renamed (the job's name with it).
    fence: Option<(Fences, String, Fence)>,
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
impl TableWriter for ParquetWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.part.recover()
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        let mut columns: Vec<ColumnBuilder> = self
            .table
            .columns
            .iter()
            .map(|column| ColumnBuilder::new(&arrow_type(&column.data_type), batch.changes.len()))
            .collect();
        let mut rejected = Vec::new();
        for change in &batch.changes {
            let ChangeKind::Insert { after } = &change.kind else {
                return Err(Error::new(ErrorKind::Write, "the Parquet target takes inserts only (snapshot mode)")
                    .on(Side::Target));
            };
            // Check the whole row first, so a refused row leaves no value behind in any column.
            let problem = after.iter().zip(&self.table.columns).find_map(|(value, column)| {
                ColumnBuilder::fits(&arrow_type(&column.data_type), value)
                    .err()
                    .map(|reason| format!("column {}: {reason}", column.name))
            });
            if let Some(reason) = problem {
                rejected.push(Rejected {
                    table: self.table.name.to_string(),
                    key: key_text(&self.table, after),
                    reason: format!("target: {reason}"),
                    record: None,
                    change: None,
                });
                continue;
            }
            for (builder, value) in columns.iter_mut().zip(after) {
                builder.append(value).expect("checked above");
            }
        }
        let arrays: Vec<ArrayRef> = columns.iter_mut().map(ColumnBuilder::finish).collect();
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
        if let Some((fences, job, fence)) = &self.fence {
            fences.check(job, fence)?;
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

/// The parts of one table's dataset, read back for verification: every whole part (a part that
/// exists is whole; `*.tmp` files are not parts yet).
struct Dataset {
    directory: PathBuf,
}

#[async_trait]
impl Listing for Dataset {
    async fn list(&self) -> Result<Option<DataFiles>> {
        let directory = self.directory.clone();
        tokio::task::spawn_blocking(move || Dataset::list_now(&directory))
            .await
            .map_err(|error| io_error("list the dataset", error))?
    }
}

impl Dataset {
    fn list_now(directory: &std::path::Path) -> Result<Option<DataFiles>> {
        let entries = match fs::read_dir(directory) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io_error(format!("list {}", directory.display()), error)),
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| path.extension().is_some_and(|extension| extension == "parquet"))
            .collect();
        paths.sort();
        let mut fields: Vec<Arc<Field>> = Vec::new();
        let mut files = Vec::new();
        for path in paths {
            let opened = File::open(&path).map_err(|error| io_error(format!("open {}", path.display()), error))?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(opened)
                .map_err(|error| io_error(format!("read the footer of {}", path.display()), error))?;
            for field in builder.schema().fields() {
                if !fields.iter().any(|known| known.name() == field.name()) {
                    fields.push(field.clone());
                }
            }
            let rows = builder.metadata().file_metadata().num_rows().max(0) as u64;
            files.push(DataFileToRead { path, rows, partition: Vec::new() });
        }
        Ok(Some(DataFiles { schema: Arc::new(Schema::new(fields)), files }))
    }
}

/// A table of a Parquet target read back by the mapped schema.
fn read_back(job: &JobSpec, table: &Arc<TableSchema>) -> Result<Arc<dyn Source>> {
    let directory = crate::path(&job.target)?.join(crate::file::directory_name(&table.name));
    Ok(Arc::new(ColumnarTable::new(table, Dataset { directory })))
}

/// The `parquet` connector: a snapshot target, one dataset directory per table.
pub(crate) const CONNECTOR: crate::Connector = crate::Connector {
    name: "parquet",
    feature: "parquet",
    secrets: &[],
    capabilities: Capabilities {
        table_sink: true,
        // A moved task's part is refused by its fence file, or is a whole copy of the same split
        // under its own name; the manifest lists one part per split.
        fencing: true,
        ..Capabilities::NONE
    },
    source: None,
    target: Some(crate::TargetSide {
        fields: &["type", "path", "write_mode", "create_tables"],
        validate: |_, _| Vec::new(),
        build: |job, fence| Ok(Arc::new(ParquetSink::new(crate::path(&job.target)?, fence))),
        read_back: Some(read_back),
    }),
};
