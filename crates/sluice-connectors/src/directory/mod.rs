//! A watched directory as a change source (`type: directory`): every file that arrives complete
//! is loaded once, as one source transaction, into any target that applies changes.
//!
//! - **Complete files only.** With `ready: rename` (the default) a file counts once it has the
//!   format's extension (`.jsonl`, `.csv`): a producer writes `x.jsonl.tmp` (or any other name)
//!   and renames it. With `ready: marker`, `x.jsonl` counts once `x.jsonl.done` exists. Names
//!   starting with `.` or `_` are never read.
//! - **Each file once.** A file is known by the SHA-256 of its content. The hashes of the files
//!   loaded are the stream's position, committed by the target in the same transaction as the
//!   file's rows, so after a crash the stream resumes knowing exactly which files are in: a file
//!   sent again, under its own name or another, is passed over; a file whose content changed is
//!   new content and is loaded.
//! - **Tables.** Each subdirectory is a table named after it (`orders/`, `shop.orders/`); with
//!   `table: NAME` the files directly in the directory are that table. Columns come from the
//!   table's `_schema.json` if present, else from its first complete file; `key: [columns]`
//!   names the primary key, by which a file's rows replace earlier ones.

pub(crate) mod connector;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::connector::{ChangeSource, ChangeStream, CheckItem, Source};
use sluice_core::filter::TableFilter;
use sluice_core::{Error, ErrorKind, Position, Result, Side, TableName, TableSchema};

use crate::file::{table_schema, Format};

/// When a file in the directory is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// Once it has the format's extension: written under another name, then renamed.
    Rename,
    /// Once `<file>.done` exists beside it.
    Marker,
}

/// A `directory` source's options.
#[derive(Debug, Clone)]
pub struct DirectoryOptions {
    pub path: PathBuf,
    pub format: Format,
    /// The one table of the files directly in `path`; `None`: each subdirectory is a table.
    pub table: Option<TableName>,
    pub ready: Ready,
    /// How often the directory is looked at when nothing is waiting.
    pub poll: Duration,
    /// Primary key columns, for every table without a `_schema.json` that names one.
    pub key: Vec<String>,
    pub filter: TableFilter,
}

/// The stream's position: the content hashes of the files loaded, hex, sorted, and their count
/// first (what a log line shows of it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Manifest {
    #[serde(default)]
    loaded: usize,
    files: std::collections::BTreeSet<String>,
}

impl Manifest {
    fn of(files: std::collections::BTreeSet<String>) -> Manifest {
        Manifest { loaded: files.len(), files }
    }
}

/// One table of the directory: its schema and where its files arrive.
#[derive(Debug, Clone)]
struct WatchedTable {
    schema: Arc<TableSchema>,
    directory: PathBuf,
}

/// A watched directory as a source.
#[derive(Debug)]
pub struct DirectorySource {
    options: DirectoryOptions,
    tables: Mutex<Vec<WatchedTable>>,
}

impl DirectorySource {
    pub fn new(options: DirectoryOptions) -> DirectorySource {
        DirectorySource { options, tables: Mutex::new(Vec::new()) }
    }

    fn missing(&self) -> Error {
        Error::new(ErrorKind::Connect, format!("{} is not a directory", self.options.path.display()))
            .on(Side::Source)
            .hint("check source.path: the directory files arrive in")
    }

    /// The tables' directories, by table name.
    fn directories(&self) -> Result<Vec<(TableName, PathBuf)>> {
        if !self.options.path.is_dir() {
            return Err(self.missing());
        }
        if let Some(table) = &self.options.table {
            return Ok(vec![(table.clone(), self.options.path.clone())]);
        }
        let entries = std::fs::read_dir(&self.options.path).map_err(|error| {
            Error::new(ErrorKind::Connect, format!("list {}: {error}", self.options.path.display())).on(Side::Source)
        })?;
        let mut found = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() && !name.starts_with('.') && !name.starts_with('_') {
                found.push((TableName::parse(&name), path));
            }
        }
        found.sort();
        Ok(found)
    }

    /// A table's schema from its `_schema.json` or its first complete file, with `key` applied.
    fn schema(&self, name: &TableName, directory: &Path) -> Result<TableSchema> {
        let schema_file = directory.join("_schema.json");
        let first = stream::complete_files(directory, self.options.format, self.options.ready)?.into_iter().next();
        if !schema_file.exists() && first.is_none() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("table {name}: no complete file in {} yet to take its columns from", directory.display()),
            )
            .on(Side::Source)
            .hint(format!("put a first file there, or describe the columns in {}", schema_file.display())));
        }
        let files: Vec<PathBuf> = first.into_iter().collect();
        let mut schema =
            table_schema(self.options.format, name, &files, schema_file.exists().then_some(schema_file.as_path()))?;
        if schema.primary_key.is_empty() && !self.options.key.is_empty() {
            let mut key = Vec::new();
            for column in &self.options.key {
                match schema.columns.iter().position(|known| &known.name == column) {
                    Some(index) => key.push(index),
                    None => {
                        return Err(Error::new(
                            ErrorKind::Schema,
                            format!("source.key: table {name} has no column {column}"),
                        )
                        .on(Side::Source)
                        .hint("name columns every table's files carry"))
                    }
                }
            }
            for &index in &key {
                schema.columns[index].nullable = false;
            }
            schema.primary_key = key;
        }
        Ok(schema)
    }
}

#[async_trait]
impl Source for DirectorySource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let tables = self.directories()?;
        Ok(vec![CheckItem {
            what: "watched directory".into(),
            ok: true,
            detail: format!("{}: {} tables", self.options.path.display(), tables.len()),
        }])
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        let directories = self.directories()?;
        let selected = self.options.filter.select(directories.iter().map(|(name, _)| name.clone()).collect())?;
        let mut tables = Vec::new();
        let mut problems = Vec::new();
        for (name, directory) in directories.into_iter().filter(|(name, _)| selected.contains(name)) {
            match self.schema(&name, &directory) {
                Ok(schema) => tables.push(WatchedTable { schema: Arc::new(schema), directory }),
                Err(error) => problems.push(error),
            }
        }
        if let Some(first) = problems.first() {
            let kind = first.kind();
            let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
            return Err(Error::new(kind, all.join("; ")).on(Side::Source));
        }
        let schemas = tables.iter().map(|table| (*table.schema).clone()).collect();
        *self.tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = tables;
        Ok(schemas)
    }

    sluice_core::capabilities!(changes: ChangeSource);
}

#[async_trait]
impl ChangeSource for DirectorySource {
    /// The files complete now, as the manifest that has them all: where a batch ends.
    async fn log_position(&self) -> Result<Option<Position>> {
        let mut files = std::collections::BTreeSet::new();
        for (_, directory) in self.directories()? {
            for path in stream::complete_files(&directory, self.options.format, self.options.ready)? {
                files.insert(stream::content_hash(&path)?);
            }
        }
        Ok(Some(Position::of(&Manifest::of(files))))
    }

    /// A new job loads every file there is, those already there included.
    async fn start_position(&self) -> Result<Option<Position>> {
        Ok(Some(Position::of(&Manifest::default())))
    }

    /// Every file of `mark` is loaded.
    fn reached(&self, position: &Position, mark: &Position) -> bool {
        match (position.read::<Manifest>("the position"), mark.read::<Manifest>("the mark")) {
            (Ok(position), Ok(mark)) => mark.files.is_subset(&position.files),
            _ => false,
        }
    }

    /// A file sent again replaces its rows by key; a keyless table takes each file once anyway.
    fn applies_by_key(&self) -> bool {
        true
    }

    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
        let manifest: Manifest = after.read("the directory source's manifest")?;
        if self.tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).is_empty() {
            self.discover().await?;
        }
        let tables = self.tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
        Ok(Box::new(stream::DirectoryStream::new(tables, &self.options, manifest.files)))
    }
}
