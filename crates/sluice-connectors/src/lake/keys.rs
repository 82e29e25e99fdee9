//! Changes merged into a lake table by key, copy-on-write, as Delta and Iceberg tables share it:
//! a group's changes are folded per key as they come (`StagedChanges`), then `locate` finds the
//! data files holding a removed key, and which of their rows go; the table format writes those
//! files again without them, and the added rows as new files, all in one commit.
//!
//! A row is known by its key's bytes in Arrow's row format (`KeyCodec`), which compares values
//! of every type exactly; a table without a primary key is a multiset of rows known by all their
//! columns. Files are pruned by the bounds of the key's first column, so a key found nowhere
//! else costs one look at its files' bounds. Only the key columns of a candidate file are read to
//! find its rows; the file is read whole only when it holds one.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::DataType as Arrow;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use sluice_core::change::{key_text, Row};
use sluice_core::{Error, ErrorKind, Result, Side, TableSchema, Value};

use super::Format;
use crate::columnar::ColumnBuilder;

/// Rows read at a time from a data file.
pub(crate) const READ_BATCH_ROWS: usize = 65_536;

/// How a table's rows are known: the bytes of their key columns (every column without a key).
pub(crate) struct KeyCodec {
    /// The columns (indexes into the table's columns) that make the key.
    columns: Vec<usize>,
    names: Vec<String>,
    types: Vec<Arrow>,
    converter: RowConverter,
    keyless: bool,
}

impl KeyCodec {
    pub(crate) fn new(table: &TableSchema, format: Format) -> Result<KeyCodec> {
        let keyless = table.primary_key.is_empty();
        let columns: Vec<usize> = if keyless { (0..table.columns.len()).collect() } else { table.primary_key.clone() };
        let names = columns.iter().map(|&index| table.columns[index].name.clone()).collect();
        let types: Vec<Arrow> =
            columns.iter().map(|&index| (format.arrow_type)(&table.columns[index].data_type)).collect();
        let converter = RowConverter::new(types.iter().map(|arrow| SortField::new(arrow.clone())).collect())
            .map_err(|error| internal(format!("table {}: its key cannot be compared: {error}", table.name)))?;
        Ok(KeyCodec { columns, names, types, converter, keyless })
    }

    /// The key of a whole row (the row itself when keyless).
    pub(crate) fn key_of(&self, row: &Row) -> Row {
        self.columns.iter().map(|&index| row[index].clone()).collect()
    }

    /// The bytes of each key (values in key order).
    pub(crate) fn encode(&self, keys: &[Row]) -> Result<Vec<Vec<u8>>> {
        let mut arrays = Vec::with_capacity(self.types.len());
        for (position, arrow) in self.types.iter().enumerate() {
            let mut builder = ColumnBuilder::new(arrow, keys.len());
            for key in keys {
                builder.append(&key[position]).map_err(|reason| {
                    Error::new(ErrorKind::Data, format!("key column {}: {reason}", self.names[position]))
                        .on(Side::Target)
                })?;
            }
            arrays.push(builder.finish());
        }
        self.rows(&arrays)
    }

    /// The bytes of each row's key in a batch read from a data file.
    pub(crate) fn encode_batch(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let mut arrays = Vec::with_capacity(self.types.len());
        for (name, arrow) in self.names.iter().zip(&self.types) {
            let column =
                batch.column_by_name(name).ok_or_else(|| internal(format!("a data file lacks key column {name}")))?;
            let column = if column.data_type() == arrow {
                column.clone()
            } else {
                arrow_cast::cast(column, arrow).map_err(|error| internal(error.to_string()))?
            };
            arrays.push(column);
        }
        self.rows(&arrays)
    }

    fn rows(&self, arrays: &[ArrayRef]) -> Result<Vec<Vec<u8>>> {
        let rows = self.converter.convert_columns(arrays).map_err(|error| internal(error.to_string()))?;
        Ok(rows.iter().map(|row| row.as_ref().to_vec()).collect())
    }
}

fn internal(message: String) -> Error {
    Error::new(ErrorKind::Write, message).on(Side::Target)
}

/// A key (or keyless row) the group removes from the table.
#[derive(Clone)]
struct Removal {
    key: Row,
    /// The table must hold it (a strict change); else it may be missing (a replay).
    expected: bool,
    /// Copies to remove (keyless rows; always 1 with a key).
    copies: u64,
}

/// One table's changes in the open group, folded per key as they come: what goes from the
/// table, and the rows that come.
pub(crate) struct StagedChanges {
    pub table: Arc<TableSchema>,
    codec: KeyCodec,
    removed: HashMap<Vec<u8>, Removal>,
    /// Key bytes → indexes into `rows` of the rows added under it.
    added: HashMap<Vec<u8>, Vec<usize>>,
    /// The rows added, each with the index of its schema in `schemas` (`None` once removed again).
    rows: Vec<Option<(usize, Row)>>,
    /// The table's schemas in the group, the last one current.
    schemas: Vec<Arc<TableSchema>>,
}

impl StagedChanges {
    pub(crate) fn new(table: Arc<TableSchema>, format: Format) -> Result<StagedChanges> {
        let codec = KeyCodec::new(&table, format)?;
        let schemas = vec![table.clone()];
        Ok(StagedChanges { table, codec, removed: HashMap::new(), added: HashMap::new(), rows: Vec::new(), schemas })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty()
    }

    /// The table's schema from now on (rows staged before keep theirs; the key stays).
    pub(crate) fn reshape(&mut self, table: &TableSchema) {
        if self.table.columns != table.columns {
            self.table = Arc::new(table.clone());
            self.schemas.push(self.table.clone());
        }
    }

    /// Rows removed and added so far, for the commit's metrics.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.removed.values().map(|removal| removal.copies).sum(),
            self.added.values().map(|rows| rows.len() as u64).sum(),
        )
    }

    /// Removes the rows of these keys (whole rows when keyless): a row added earlier in the group
    /// goes from the group, any other from the table.
    pub(crate) fn delete(&mut self, keys: &[Row], expect_all: bool) -> Result<()> {
        let codes = self.codec.encode(keys)?;
        for (code, key) in codes.into_iter().zip(keys) {
            if let Some(added) = self.added.get_mut(&code) {
                let index = added.pop().expect("added keys have rows");
                self.rows[index] = None;
                if added.is_empty() {
                    self.added.remove(&code);
                }
                continue;
            }
            let removal =
                self.removed.entry(code).or_insert(Removal { key: key.clone(), expected: expect_all, copies: 0 });
            removal.copies += 1;
            if self.codec.keyless {
                continue;
            }
            if removal.copies > 1 {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "table {}, key {}: deleted twice in one group",
                        self.table.name,
                        key_text_of(&self.table, key)
                    ),
                )
                .on(Side::Source));
            }
        }
        Ok(())
    }

    /// Adds rows. A key added twice without a delete between is a conflict.
    pub(crate) fn insert(&mut self, rows: &[Row]) -> Result<()> {
        let keys: Vec<Row> = rows.iter().map(|row| self.codec.key_of(row)).collect();
        let codes = self.codec.encode(&keys)?;
        for (code, row) in codes.into_iter().zip(rows) {
            let index = self.rows.len();
            let added = self.added.entry(code).or_default();
            if !added.is_empty() && !self.codec.keyless {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "table {}, key {}: inserted twice in one group",
                        self.table.name,
                        key_text(&self.table, row)
                    ),
                )
                .on(Side::Source));
            }
            added.push(index);
            self.rows.push(Some((self.schemas.len() - 1, row.clone())));
        }
        Ok(())
    }
}

/// A key's text for messages, from its values alone.
fn key_text_of(table: &TableSchema, key: &Row) -> String {
    let names: Vec<&str> = if table.primary_key.is_empty() {
        table.columns.iter().map(|column| column.name.as_str()).collect()
    } else {
        table.primary_key.iter().map(|&index| table.columns[index].name.as_str()).collect()
    };
    let parts: Vec<String> = names.iter().zip(key).map(|(name, value)| format!("{name}={value}")).collect();
    format!("({})", parts.join(", "))
}

/// Whether a key's first value may lie in a file's bounds for that column (always, when the
/// file has no usable bounds or the type is not one the bounds can be compared with).
fn may_hold(value: &Value, bounds: Option<&(serde_json::Value, serde_json::Value)>) -> bool {
    let Some((low, high)) = bounds else { return true };
    match value {
        Value::Int(value) => match (low.as_i64(), high.as_i64()) {
            (Some(low), Some(high)) => low <= *value && *value <= high,
            _ => true,
        },
        Value::UInt(value) => match (low.as_u64(), high.as_u64()) {
            (Some(low), Some(high)) => low <= *value && *value <= high,
            _ => true,
        },
        // Text bounds may be truncated: the low bound is a prefix of the smallest value, the high
        // one a prefix of (or above) the largest.
        Value::Text(value) => match (low.as_str(), high.as_str()) {
            (Some(low), Some(high)) => low <= value.as_str() && (value.as_str() <= high || value.starts_with(high)),
            _ => true,
        },
        _ => true,
    }
}

/// Reads a data file's rows (only `columns` of them when given).
pub(crate) fn read_file(path: &Path, columns: Option<&[String]>) -> Result<Vec<RecordBatch>> {
    let failed = |error: &dyn std::fmt::Display| {
        Error::new(ErrorKind::Write, format!("read data file {}: {error}", path.display())).on(Side::Target)
    };
    let opened = File::open(path).map_err(|error| failed(&error))?;
    let mut builder = ParquetRecordBatchReaderBuilder::try_new(opened).map_err(|error| failed(&error))?;
    if let Some(columns) = columns {
        let schema = builder.schema().clone();
        let indexes: Vec<usize> = columns.iter().filter_map(|name| schema.index_of(name).ok()).collect();
        let mask = ProjectionMask::roots(builder.parquet_schema(), indexes);
        builder = builder.with_projection(mask);
    }
    let reader = builder.with_batch_size(READ_BATCH_ROWS).build().map_err(|error| failed(&error))?;
    reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|error| failed(&error))
}

/// Reads a whole data file.
pub(crate) async fn read_whole(path: &Path) -> Result<Vec<RecordBatch>> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || read_file(&path, None))
        .await
        .map_err(|error| internal(format!("file reader failed: {error}")))?
}

/// A data file of a lake table as `locate` needs it.
#[derive(Debug, Clone)]
pub(crate) struct FileBounds {
    pub path: PathBuf,
    pub rows: u64,
    /// The smallest and largest value of the key's first column in the file (numbers, text), when
    /// the table's statistics have them.
    pub first_key: Option<(serde_json::Value, serde_json::Value)>,
}

/// Where a group's changes land in a table: the files to write again without some of their
/// rows, and the rows to add.
pub(crate) struct Located {
    /// Indexes into the files given to `locate`, each with one flag per row of the file, in file
    /// order: whether the row goes.
    pub rewrites: Vec<(usize, Vec<bool>)>,
    /// The rows added, grouped by the schema they were read with (the last one current).
    pub added: Vec<(Arc<TableSchema>, Vec<Row>)>,
}

impl StagedChanges {
    /// The name of the key's first column (the first column when keyless).
    pub(crate) fn first_key(&self) -> &str {
        &self.codec.names[0]
    }

    /// Finds the rows of `files` the group removes. A strict removal the table lacks, or an added
    /// key the table holds and the group did not remove, is a conflict naming table and key.
    pub(crate) async fn locate(&self, files: &[FileBounds]) -> Result<Located> {
        let StagedChanges { table: target, codec, removed, added, rows, schemas } = self;
        let mut removed = removed.clone();
        // The keys to look for: those removed, and those added that nothing removed (which must
        // not be there already).
        let new_keys: HashMap<&Vec<u8>, &Row> = if codec.keyless {
            HashMap::new()
        } else {
            added
                .iter()
                .filter(|(code, _)| !removed.contains_key(*code))
                .filter_map(|(code, indexes)| Some((code, &rows[*indexes.first()?].as_ref()?.1)))
                .collect()
        };
        let mut rewrites = Vec::new();
        if !removed.is_empty() || !new_keys.is_empty() {
            let mut firsts: Vec<Value> = removed.values().map(|removal| removal.key[0].clone()).collect();
            firsts.extend(new_keys.values().map(|row| row[codec.columns[0]].clone()));
            for (index, file) in files.iter().enumerate() {
                if !codec.keyless && !firsts.iter().any(|value| may_hold(value, file.first_key.as_ref())) {
                    continue;
                }
                let key_columns = codec.names.clone();
                let path = file.path.clone();
                let batches = tokio::task::spawn_blocking(move || read_file(&path, Some(&key_columns)))
                    .await
                    .map_err(|error| internal(format!("file reader failed: {error}")))??;
                let mut drop_rows = Vec::with_capacity(file.rows as usize);
                let mut any = false;
                for batch in &batches {
                    for code in codec.encode_batch(batch)? {
                        let mut dropped = false;
                        if let Some(removal) = removed.get_mut(&code) {
                            if removal.copies > 0 {
                                removal.copies -= 1;
                                dropped = true;
                                any = true;
                            }
                        } else if let Some(row) = new_keys.get(&code) {
                            return Err(Error::new(
                                ErrorKind::Conflict,
                                format!(
                                    "table {}, key {}: the target has a row with this key already",
                                    target.name,
                                    key_text(target, row)
                                ),
                            )
                            .on(Side::Target)
                            .hint("the target was changed outside the job; copy the table again (run the job with --restart)"));
                        }
                        drop_rows.push(dropped);
                    }
                }
                if any {
                    rewrites.push((index, drop_rows));
                }
            }
            if let Some(missing) = removed.values().find(|removal| removal.expected && removal.copies > 0) {
                return Err(Error::new(
                    ErrorKind::Conflict,
                    format!(
                        "table {}, key {}: the target lacks the row this change deletes or updates",
                        target.name,
                        key_text_of(target, &missing.key)
                    ),
                )
                .on(Side::Target)
                .hint("the target was changed outside the job; copy the table again (run the job with --restart)"));
            }
        }
        let added = schemas
            .iter()
            .enumerate()
            .map(|(index, schema)| {
                let rows: Vec<Row> =
                    rows.iter().flatten().filter(|(of, _)| *of == index).map(|(_, row)| row.clone()).collect();
                (schema.clone(), rows)
            })
            .filter(|(_, rows)| !rows.is_empty())
            .collect();
        Ok(Located { rewrites, added })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_prune_integer_and_text_keys() {
        let bounds = Some((serde_json::json!(10), serde_json::json!(20)));
        assert!(may_hold(&Value::Int(15), bounds.as_ref()));
        assert!(!may_hold(&Value::Int(21), bounds.as_ref()));
        assert!(may_hold(&Value::Int(21), None));
        let text = Some((serde_json::json!("b"), serde_json::json!("d")));
        assert!(!may_hold(&Value::Text("a".into()), text.as_ref()));
        // A truncated high bound is a prefix of the largest value.
        assert!(may_hold(&Value::Text("dz".into()), text.as_ref()));
        assert!(!may_hold(&Value::Text("e".into()), text.as_ref()));
    }
}
