//! CSV and JSON Lines files as sources and targets.
//!
//! Layout: a target directory holds one directory per table, named after it (`shop.orders/`),
//! with a `_schema.json` and one `part-N.<ext>` per split. A part is written to `part-N.<ext>.tmp`
//! and renamed when the split is complete, so a part file that exists is whole: that is the
//! checkpoint. A source directory may hold such table directories or plain `<table>.<ext>` files.

pub(crate) mod connector;
pub(crate) mod fence;
mod format;
mod part;

use std::fs::{self, File};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::json::inferred_type;
use async_trait::async_trait;
use sluice_core::change::{Batch, Change, ChangeKind, Position, Rejected};
use sluice_core::connector::{
    CheckItem, Checkpoint, Reader, Sink, SnapshotSource, Source, Split, SplitHint, TableTasks, TableWriter,
};
use sluice_core::filter::TableFilter;
use sluice_core::names::split_task;
use sluice_core::{Column, DataType, Error, ErrorKind, Result, Side, TableName, TableSchema};

pub(crate) use format::decode_json;
pub use format::Format;
pub(crate) use part::{check_directory, write_manifest, Part};

const SCHEMA_FILE: &str = "_schema.json";

fn io_error(side: Side, doing: impl std::fmt::Display, error: std::io::Error) -> Error {
    let kind = match error.kind() {
        std::io::ErrorKind::PermissionDenied
        | std::io::ErrorKind::NotFound
        | std::io::ErrorKind::ReadOnlyFilesystem => ErrorKind::Connect,
        _ if side == Side::Source => ErrorKind::Read,
        _ => ErrorKind::Write,
    };
    let error = Error::new(kind, format!("{doing}: {error}")).on(side);
    if kind == ErrorKind::Connect {
        error.hint(format!("check {side}.path and its permissions"))
    } else {
        error
    }
}

/// A file split: one input file, and its size when planned (for progress).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct FileSplit {
    file: PathBuf,
    bytes: u64,
}

/// Where a file read resumes: after this many records of its file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct RecordsPosition {
    records: u64,
}

/// The directory name of a table: its qualified name with `/`, `%` and a leading `.` escaped.
pub(crate) fn directory_name(table: &TableName) -> String {
    let mut name = table.to_string().replace('%', "%25").replace('/', "%2F").replace('\\', "%5C");
    if name.starts_with('.') {
        name.replace_range(0..1, "%2E");
    }
    name
}

fn table_from_directory_name(name: &str) -> TableName {
    TableName::parse(&name.replace("%2F", "/").replace("%5C", "\\").replace("%2E", ".").replace("%25", "%"))
}

async fn blocking<T: Send + 'static>(side: Side, work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| Error::new(ErrorKind::Write, format!("file worker failed: {error}")).on(side))?
}

/// Writes each table as a directory of part files.
#[derive(Debug)]
pub struct FileSink {
    directory: PathBuf,
    format: Format,
}

impl FileSink {
    pub fn new(directory: PathBuf, format: Format) -> FileSink {
        FileSink { directory, format }
    }
}

#[async_trait]
impl Sink for FileSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let directory = self.directory.clone();
        blocking(Side::Target, move || check_directory(&directory)).await
    }

    fn target_name(&self, source: &TableName) -> TableName {
        source.clone()
    }

    /// Zero dates are stored as they are (MySQL with a session sql_mode that allows them;
    /// SQLite and files as text).
    fn holds_zero_dates(&self) -> bool {
        true
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables
            .iter()
            .map(|table| {
                let path = self.directory.join(directory_name(&table.name)).join(SCHEMA_FILE);
                format!("-- {}\n{}", path.display(), serde_json::to_string_pretty(table).expect("schemas serialize"))
            })
            .collect()
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        let (directory, tables) = (self.directory.clone(), tables.to_vec());
        blocking(Side::Target, move || {
            for table in &tables {
                let table_directory = directory.join(directory_name(&table.name));
                fs::create_dir_all(&table_directory)
                    .map_err(|error| io_error(Side::Target, format!("create {}", table_directory.display()), error))?;
                let schema = serde_json::to_string_pretty(table).expect("schemas serialize");
                write_atomically(&table_directory.join(SCHEMA_FILE), schema.as_bytes())
                    .map_err(|error| io_error(Side::Target, format!("write the schema of {}", table.name), error))?;
            }
            Ok(())
        })
        .await
    }

    /// Removes the tables' parts: a part is its split's checkpoint.
    async fn reset(&self, _job: &str, tables: &[TableTasks]) -> Result<()> {
        for table in tables {
            Part::remove_all(&self.directory, &table.table, self.format.extension())?;
        }
        Ok(())
    }

    async fn open(&self, _job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        Ok(Box::new(FileWriter {
            format: self.format,
            part: Part::new(&self.directory, &table.name, task, self.format.extension()),
            table,
            output: None,
            buffer: String::new(),
        }))
    }
}

fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let temporary = path.with_extension("tmp");
    let mut file = File::create(&temporary)?;
    file.write_all(contents)?;
    file.sync_all()?;
    fs::rename(&temporary, path)
}

struct FileWriter {
    format: Format,
    table: Arc<TableSchema>,
    part: Part,
    output: Option<BufWriter<File>>,
    buffer: String,
}

impl FileWriter {
    fn output(&mut self) -> Result<&mut BufWriter<File>> {
        if self.output.is_none() {
            let path = self.part.temporary_path();
            let mut file = File::create(path)
                .map_err(|error| io_error(Side::Target, format!("create {}", path.display()), error))?;
            file.write_all(self.format.header(&self.table).as_bytes())
                .map_err(|error| io_error(Side::Target, format!("write {}", path.display()), error))?;
            self.output = Some(BufWriter::with_capacity(1 << 20, file));
        }
        Ok(self.output.as_mut().expect("opened above"))
    }
}

#[async_trait]
impl TableWriter for FileWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.part.recover()
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.clear();
        for change in &batch.changes {
            let ChangeKind::Insert { after } = &change.kind else {
                return Err(
                    Error::new(ErrorKind::Write, "file targets take inserts only (snapshot mode)").on(Side::Target)
                );
            };
            self.format.encode(&self.table, after, &mut buffer);
        }
        let path = self.part.temporary_path().display().to_string();
        let result = self
            .output()?
            .write_all(buffer.as_bytes())
            .map_err(|error| io_error(Side::Target, format!("write {path}"), error));
        self.buffer = buffer;
        result.map(|()| Vec::new())
    }

    /// Files are not transactional: a batch commit only hands data to the OS. The part becomes
    /// durable and visible, atomically, with the commit that marks the split done.
    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        if !checkpoint.done {
            return Ok(());
        }
        let path = self.part.temporary_path().display().to_string();
        let output = self.output()?;
        output.flush().map_err(|error| io_error(Side::Target, format!("flush {path}"), error))?;
        let file = self.output.take().expect("opened above").into_inner().map_err(|error| error.into_error());
        let file = file.map_err(|error| io_error(Side::Target, format!("flush {path}"), error))?;
        self.part.publish(&file)?;
        Ok(())
    }

    /// `recover` already started the part over.
    async fn replace_all(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A table found in a source directory: its files and its schema file, if any.
struct FileTable {
    name: TableName,
    files: Vec<PathBuf>,
    schema_file: Option<PathBuf>,
}

/// Reads tables from a directory of part directories or plain files.
#[derive(Debug)]
pub struct FileSource {
    path: PathBuf,
    format: Format,
    filter: TableFilter,
}

impl FileSource {
    pub fn new(path: PathBuf, format: Format, filter: TableFilter) -> FileSource {
        FileSource { path, format, filter }
    }

    /// The tables found under the path, sorted.
    fn tables(&self) -> Result<Vec<FileTable>> {
        let extension = self.format.extension();
        let read_directory = |path: &Path| -> Result<Vec<PathBuf>> {
            let mut entries: Vec<PathBuf> = fs::read_dir(path)
                .and_then(|entries| entries.map(|entry| entry.map(|entry| entry.path())).collect())
                .map_err(|error| io_error(Side::Source, format!("list {}", path.display()), error))?;
            entries.sort();
            Ok(entries)
        };
        if self.path.is_file() {
            let name = self.path.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
            return Ok(vec![FileTable {
                name: table_from_directory_name(&name),
                files: vec![self.path.clone()],
                schema_file: None,
            }]);
        }
        let mut tables = Vec::new();
        for entry in read_directory(&self.path)? {
            let name = entry.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
            if entry.is_dir() {
                let parts: Vec<PathBuf> = read_directory(&entry)?
                    .into_iter()
                    .filter(|part| part.extension().is_some_and(|found| found == extension))
                    .collect();
                let schema = entry.join(SCHEMA_FILE);
                tables.push(FileTable {
                    name: table_from_directory_name(&name),
                    files: parts,
                    schema_file: schema.exists().then_some(schema),
                });
            } else if entry.extension().is_some_and(|found| found == extension) {
                let stem = entry.file_stem().map(|stem| stem.to_string_lossy().into_owned()).unwrap_or_default();
                tables.push(FileTable {
                    name: table_from_directory_name(&stem),
                    files: vec![entry],
                    schema_file: None,
                });
            }
        }
        Ok(tables)
    }
}

/// A table's schema: its `_schema.json` when present, otherwise the CSV header (all text) or
/// the first JSON object's keys (types from its values).
pub(crate) fn table_schema(
    format: Format,
    name: &TableName,
    files: &[PathBuf],
    schema_file: Option<&Path>,
) -> Result<TableSchema> {
    if let Some(schema_file) = schema_file {
        let text = fs::read_to_string(schema_file)
            .map_err(|error| io_error(Side::Source, format!("read {}", schema_file.display()), error))?;
        let mut schema: TableSchema = serde_json::from_str(&text).map_err(|error| {
            Error::new(ErrorKind::Schema, format!("{} is not a valid table schema: {error}", schema_file.display()))
                .on(Side::Source)
        })?;
        schema.name = name.clone();
        let problems = schema.problems();
        if !problems.is_empty() {
            return Err(Error::new(
                ErrorKind::Schema,
                format!("{} is not a usable table schema: {}", schema_file.display(), problems.join("; ")),
            )
            .on(Side::Source)
            .hint("fix the file (keys and indexes name columns by their 0-based position) or remove it"));
        }
        return Ok(schema);
    }
    let mut columns = Vec::new();
    if let Some(first) = files.first() {
        let file =
            File::open(first).map_err(|error| io_error(Side::Source, format!("open {}", first.display()), error))?;
        let mut input = BufReader::new(file);
        match format {
            Format::Csv { delimiter } => {
                let header = format::read_csv_record(&mut input, delimiter).map_err(|error| {
                    io_error(Side::Source, format!("read the header of {}", first.display()), error)
                })?;
                columns = header
                    .unwrap_or_default()
                    .into_iter()
                    .map(|field| Column::new(field.text, DataType::Text { length: None, fixed: false }, true))
                    .collect();
            }
            Format::Jsonl => {
                let mut line = String::new();
                input
                    .read_line(&mut line)
                    .map_err(|error| io_error(Side::Source, format!("read {}", first.display()), error))?;
                if let Ok(serde_json::Value::Object(object)) = serde_json::from_str::<serde_json::Value>(&line) {
                    columns =
                        object.into_iter().map(|(key, value)| Column::new(key, inferred_type(&value), true)).collect();
                }
            }
        }
    }
    Ok(TableSchema {
        name: name.clone(),
        columns,
        primary_key: Vec::new(),
        indexes: Vec::new(),
        details: Default::default(),
    })
}

#[async_trait]
impl Source for FileSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        if !self.path.exists() {
            return Err(Error::new(ErrorKind::Connect, format!("{} does not exist", self.path.display()))
                .on(Side::Source)
                .hint("check source.path"));
        }
        let count = self.tables()?.len();
        Ok(vec![CheckItem {
            what: "source files".into(),
            ok: true,
            detail: format!("{}: {count} tables", self.path.display()),
        }])
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        self.check().await?;
        let tables = self.tables()?;
        let selected = self.filter.select(tables.iter().map(|table| table.name.clone()).collect())?;
        tables
            .iter()
            .filter(|table| selected.contains(&table.name))
            .map(|table| table_schema(self.format, &table.name, &table.files, table.schema_file.as_deref()))
            .collect()
    }

    sluice_core::capabilities!(snapshot: SnapshotSource);
}

#[async_trait]
impl SnapshotSource for FileSource {
    async fn split(&self, table: &Arc<TableSchema>, _hint: SplitHint) -> Result<Vec<Split>> {
        let tables = self.tables()?;
        let files =
            tables.into_iter().find(|found| found.name == table.name).map(|found| found.files).unwrap_or_default();
        Ok(files
            .into_iter()
            .enumerate()
            .map(|(index, file)| {
                let size = fs::metadata(&file).map(|metadata| metadata.len()).unwrap_or(0);
                Split::new(split_task(&table.name, index), table.clone(), &FileSplit { file, bytes: size }, 0)
            })
            .collect())
    }

    async fn open(&self, split: &Split, resume_after: Option<&Position>, batch_rows: usize) -> Result<Box<dyn Reader>> {
        let path = split.read_descriptor::<FileSplit>()?.file;
        let mut reader = FileReader::open(path, self.format, split.table.clone(), batch_rows)?;
        let skip = match resume_after {
            Some(position) => position.read::<RecordsPosition>(&split.id)?.records,
            None => 0,
        };
        while reader.records < skip {
            if reader.next_record()?.is_none() {
                break;
            }
        }
        Ok(Box::new(reader))
    }
}

/// Reads one file's records in order.
pub(crate) struct FileReader {
    input: BufReader<File>,
    path: PathBuf,
    format: Format,
    table: Arc<TableSchema>,
    /// Records consumed so far: the position.
    pub(crate) records: u64,
    batch_rows: usize,
    line: String,
}

impl FileReader {
    /// Opens a file of `table`'s records, past its CSV header.
    pub(crate) fn open(
        path: PathBuf,
        format: Format,
        table: Arc<TableSchema>,
        batch_rows: usize,
    ) -> Result<FileReader> {
        let file =
            File::open(&path).map_err(|error| io_error(Side::Source, format!("open {}", path.display()), error))?;
        let mut reader = FileReader {
            input: BufReader::with_capacity(1 << 20, file),
            path,
            format,
            table,
            records: 0,
            batch_rows,
            line: String::new(),
        };
        if let Format::Csv { delimiter } = format {
            format::read_csv_record(&mut reader.input, delimiter).map_err(|error| {
                io_error(Side::Source, format!("read the header of {}", reader.path.display()), error)
            })?;
        }
        Ok(reader)
    }

    /// The next record decoded, or the reason it cannot be; `None` at the end of the file.
    pub(crate) fn next_record(&mut self) -> Result<Option<Result<sluice_core::Row, String>>> {
        let read_error = |error| io_error(Side::Source, format!("read {}", self.path.display()), error);
        let record = match self.format {
            Format::Csv { delimiter } => {
                match format::read_csv_record(&mut self.input, delimiter).map_err(read_error)? {
                    None => return Ok(None),
                    Some(fields) => format::decode_csv(&self.table, fields),
                }
            }
            Format::Jsonl => loop {
                self.line.clear();
                if self.input.read_line(&mut self.line).map_err(read_error)? == 0 {
                    return Ok(None);
                }
                if !self.line.trim().is_empty() {
                    break format::decode_json(&self.table, self.line.trim_end());
                }
            },
        };
        self.records += 1;
        Ok(Some(record))
    }
}

#[async_trait]
impl Reader for FileReader {
    async fn next(&mut self) -> Result<Option<Batch>> {
        // File reads are local and buffered; blocking briefly here is cheaper than a thread hop.
        let mut changes = Vec::with_capacity(self.batch_rows);
        let mut rejected = Vec::new();
        while changes.len() + rejected.len() < self.batch_rows {
            match self.next_record()? {
                None => break,
                Some(Ok(row)) => changes.push(Change::insert(self.table.clone(), row)),
                Some(Err(reason)) => rejected.push(Rejected {
                    table: self.table.name.to_string(),
                    key: format!("{} record {}", self.path.display(), self.records),
                    reason: format!("source: {reason}"),
                    record: (self.format == Format::Jsonl).then(|| self.line.trim_end().to_owned()),
                    change: None,
                }),
            }
        }
        if changes.is_empty() && rejected.is_empty() {
            return Ok(None);
        }
        let mut batch = Batch::new(changes, Position::of(&RecordsPosition { records: self.records }));
        batch.rejected = rejected;
        Ok(Some(batch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_directory_names_escape_path_characters_and_round_trip() {
        for name in ["shop.orders", "a/b", "..x", "100%"] {
            let table = TableName::parse(name);
            let directory = directory_name(&table);
            assert!(!directory.contains('/') && !directory.starts_with('.'), "{directory}");
            assert_eq!(table_from_directory_name(&directory), table);
        }
    }
}
