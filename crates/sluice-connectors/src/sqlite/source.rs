//! Reading SQLite tables in parallel chunks: rowid ranges for rowid tables, one keyset-paginated
//! split for `WITHOUT ROWID` tables.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rusqlite::types::ValueRef;
use rusqlite::Connection;
use serde_json::json;
use sluice_core::change::{key_text, Batch, Change, Position, Rejected};
use sluice_core::connector::{CheckItem, CursorSource, Reader, SnapshotSource, Source, Split, SplitHint};
use sluice_core::cursor::{self, CursorWindow};
use sluice_core::filter::TableFilter;
use sluice_core::names::split_task;
use sluice_core::spec::CursorSpec;
use sluice_core::{Column, Error, ErrorKind, Result, Side, TableName, TableSchema, Value};

use super::{data_type, open, quote, read_value, sqlite_error};

/// A SQLite database file read as a source.
#[derive(Debug)]
pub struct SqliteSource {
    path: PathBuf,
    filter: TableFilter,
}

impl SqliteSource {
    pub fn new(path: PathBuf, filter: TableFilter) -> SqliteSource {
        SqliteSource { path, filter }
    }

    /// Runs blocking SQLite work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || work(open(&path, Side::Source)?))
            .await
            .map_err(|error| Error::new(ErrorKind::Read, format!("SQLite worker failed: {error}")).on(Side::Source))?
    }
}

#[async_trait]
impl Source for SqliteSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let path = self.path.clone();
        self.blocking(move |connection| {
            let tables: i64 = connection
                .query_row("SELECT count(*) FROM sqlite_schema WHERE type = 'table'", [], |row| row.get(0))
                .map_err(|error| {
                    sqlite_error(error, Side::Source, &format!("read the schema of {}", path.display()))
                })?;
            Ok(vec![CheckItem {
                what: "source database".into(),
                ok: true,
                detail: format!("{} opened; {tables} tables", path.display()),
            }])
        })
        .await
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        let filter = self.filter.clone();
        self.blocking(move |connection| {
            let names = table_names(&connection)?;
            filter.select(names)?.into_iter().map(|name| describe_table(&connection, name)).collect()
        })
        .await
    }

    sluice_core::capabilities!(snapshot: SnapshotSource, cursor: CursorSource);
}

#[async_trait]
impl SnapshotSource for SqliteSource {
    async fn split(&self, table: &Arc<TableSchema>, hint: SplitHint) -> Result<Vec<Split>> {
        let table = table.clone();
        self.blocking(move |connection| {
            let quoted = quote(&table.name.name);
            let bounds =
                connection.query_row(&format!("SELECT min(rowid), max(rowid), count(*) FROM {quoted}"), [], |row| {
                    Ok((row.get::<_, Option<i64>>(0)?, row.get::<_, Option<i64>>(1)?, row.get::<_, u64>(2)?))
                });
            let split = |index: usize, descriptor: SqliteSplit, estimated_rows: u64| {
                Split::new(split_task(&table.name, index), table.clone(), &descriptor, estimated_rows)
            };
            match bounds {
                Ok((Some(min), Some(max), count)) => {
                    let splits = count.div_ceil(hint.rows_per_split.max(1)).max(1);
                    let width = ((max as i128 - min as i128 + 1) / splits as i128).max(1);
                    let per_split = count / splits;
                    // The first split has no lower bound and the last none upper, so rows added
                    // outside the bounds seen at planning are still copied.
                    Ok((0..splits)
                        .map(|index| {
                            let from = (index > 0).then(|| (min as i128 + width * index as i128) as i64);
                            let to = (index + 1 < splits).then(|| (min as i128 + width * (index as i128 + 1)) as i64);
                            split(index as usize, SqliteSplit::Rowids { rowid_from: from, rowid_to: to }, per_split)
                        })
                        .collect())
                }
                Ok((_, _, count)) => {
                    Ok(vec![split(0, SqliteSplit::Rowids { rowid_from: None, rowid_to: None }, count)])
                }
                // WITHOUT ROWID tables have no rowid: one split, paginated on the primary key.
                Err(_) => {
                    let count: u64 = connection
                        .query_row(&format!("SELECT count(*) FROM {quoted}"), [], |row| row.get(0))
                        .map_err(|error| sqlite_error(error, Side::Source, &format!("count table {}", table.name)))?;
                    Ok(vec![split(0, SqliteSplit::PrimaryKey { primary_key: true }, count)])
                }
            }
        })
        .await
    }

    async fn open(&self, split: &Split, resume_after: Option<&Position>, batch_rows: usize) -> Result<Box<dyn Reader>> {
        let path = self.path.clone();
        let split = split.clone();
        let resume_after = resume_after.cloned();
        let state = tokio::task::spawn_blocking(move || {
            ChunkReader::new(open(&path, Side::Source)?, split, resume_after, batch_rows)
        })
        .await
        .map_err(|error| Error::new(ErrorKind::Read, format!("SQLite worker failed: {error}")).on(Side::Source))??;
        Ok(Box::new(SqliteReader { state: Some(state) }))
    }
}

#[async_trait]
impl CursorSource for SqliteSource {
    async fn cursor_window(
        &self,
        table: &TableSchema,
        cursor: &CursorSpec,
        mark: Option<&serde_json::Value>,
    ) -> Result<CursorWindow> {
        cursor::column(table, cursor)?;
        let (name, column, lookback) = (table.name.clone(), cursor.column.clone(), cursor.lookback_secs);
        let mark = mark.cloned();
        self.blocking(move |connection| {
            let doing = format!("read the highest {column} of table {name}");
            let column_quoted = quote(&column);
            let through = connection
                .query_row(&format!("SELECT max({column_quoted}) FROM {}", quote(&name.name)), [], |row| {
                    sql_to_json(row.get_ref(0))
                })
                .map_err(|error| sqlite_error(error, Side::Source, &doing))?;
            // Times are text in SQLite: the lookback is taken in SQLite's own format.
            let after = match &mark {
                Some(mark) if lookback > 0 => connection
                    .query_row(
                        "SELECT datetime(?1, ?2)",
                        rusqlite::params![json_to_sql(mark), format!("-{lookback} seconds")],
                        |row| sql_to_json(row.get_ref(0)),
                    )
                    .map_err(|error| sqlite_error(error, Side::Source, &doing))?,
                _ => mark.clone().unwrap_or(serde_json::Value::Null),
            };
            let through = if through.is_null() { mark.clone() } else { Some(through) };
            Ok(CursorWindow { column, after: (!after.is_null()).then_some(after), through, mark, rerun: false })
        })
        .await
    }
}

fn table_names(connection: &Connection) -> Result<Vec<TableName>> {
    let mut statement = connection
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name NOT LIKE '\\_sluice\\_%' ESCAPE '\\'")
        .map_err(|error| sqlite_error(error, Side::Source, "list tables"))?;
    let names = statement
        .query_map([], |row| row.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|error| sqlite_error(error, Side::Source, "list tables"))?;
    Ok(names.into_iter().map(|name| TableName::new(None, &name)).collect())
}

fn describe_table(connection: &Connection, name: TableName) -> Result<TableSchema> {
    let mut statement = connection
        .prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?1) ORDER BY cid")
        .map_err(|error| sqlite_error(error, Side::Source, &format!("describe table {name}")))?;
    let rows = statement
        .query_map([&name.name], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?, row.get::<_, bool>(2)?, row.get::<_, usize>(3)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(|error| sqlite_error(error, Side::Source, &format!("describe table {name}")))?;
    let mut key: Vec<(usize, usize)> = Vec::new();
    let columns = rows
        .into_iter()
        .enumerate()
        .map(|(index, (column, declared, not_null, key_position))| {
            if key_position > 0 {
                key.push((key_position, index));
            }
            Column {
                name: column,
                data_type: data_type(&declared),
                nullable: !not_null && key_position == 0,
                native_type: declared,
                collation: None,
                details: Default::default(),
            }
        })
        .collect();
    key.sort();
    Ok(TableSchema {
        name,
        columns,
        primary_key: key.into_iter().map(|(_, index)| index).collect(),
        indexes: Vec::new(),
        details: Default::default(),
    })
}

/// The async face of a `ChunkReader`, which runs on a blocking thread between calls.
struct SqliteReader {
    state: Option<ChunkReader>,
}

#[async_trait]
impl Reader for SqliteReader {
    async fn next(&mut self) -> Result<Option<Batch>> {
        let mut state = self.state.take().expect("a reader is not used after an error");
        let (state, batch) = tokio::task::spawn_blocking(move || {
            let batch = state.next_batch();
            (state, batch)
        })
        .await
        .map_err(|error| Error::new(ErrorKind::Read, format!("SQLite worker failed: {error}")).on(Side::Source))?;
        self.state = Some(state);
        batch
    }
}

/// Where a chunk reader continues from.
enum Cursor {
    /// Rowid tables: after this rowid, below the split's upper bound.
    Rowid { after: Option<i64>, to: Option<i64> },
    /// `WITHOUT ROWID` tables: after this primary-key tuple.
    Key { after: Option<Vec<serde_json::Value>> },
}

struct ChunkReader {
    connection: Connection,
    table: Arc<TableSchema>,
    cursor: Cursor,
    /// A cursor-incremental batch's condition on the rows read, and its values.
    window: Option<(String, Vec<rusqlite::types::Value>)>,
    batch_rows: usize,
    finished: bool,
}

/// A SQLite split: a rowid range (bounds inclusive; none at the ends), or, for a `WITHOUT ROWID`
/// table, the whole table in primary-key order.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum SqliteSplit {
    PrimaryKey { primary_key: bool },
    Rowids { rowid_from: Option<i64>, rowid_to: Option<i64> },
}

/// Where a rowid read resumes: after this rowid.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct RowidPosition {
    rowid: Option<i64>,
}

/// Where a primary-key read resumes: after this key (its values as JSON).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct KeyPosition {
    key: Option<Vec<serde_json::Value>>,
}

impl ChunkReader {
    fn new(
        connection: Connection,
        split: Split,
        resume_after: Option<Position>,
        batch_rows: usize,
    ) -> Result<ChunkReader> {
        let cursor = match split.read_descriptor::<SqliteSplit>()? {
            SqliteSplit::PrimaryKey { .. } => {
                let after = match resume_after {
                    Some(position) => position.read::<KeyPosition>(&split.id)?.key,
                    None => None,
                };
                Cursor::Key { after }
            }
            SqliteSplit::Rowids { rowid_from, rowid_to } => {
                let resume = match resume_after {
                    Some(position) => position.read::<RowidPosition>(&split.id)?.rowid,
                    None => None,
                };
                // The lower bound is inclusive; "after" is exclusive.
                Cursor::Rowid { after: resume.or(rowid_from.map(|from| from - 1)), to: rowid_to }
            }
        };
        let window = split.window.as_ref().map(|window| {
            let (condition, values) = window.condition(&quote(&window.column), |_| "?".to_owned());
            (condition, values.into_iter().map(json_to_sql).collect())
        });
        Ok(ChunkReader { connection, table: split.table.clone(), cursor, window, batch_rows, finished: false })
    }

    fn next_batch(&mut self) -> Result<Option<Batch>> {
        if self.finished {
            return Ok(None);
        }
        let columns: Vec<String> = self.table.columns.iter().map(|column| quote(&column.name)).collect();
        let table = quote(&self.table.name.name);
        let mut parameters: Vec<rusqlite::types::Value> = Vec::new();
        let mut conditions = Vec::new();
        let sql = match &self.cursor {
            Cursor::Rowid { after, to } => {
                if let Some(after) = after {
                    conditions.push("rowid > ?".to_owned());
                    parameters.push((*after).into());
                }
                if let Some(to) = to {
                    conditions.push("rowid < ?".to_owned());
                    parameters.push((*to).into());
                }
                let filter = where_clause(&mut conditions, &mut parameters, &self.window);
                format!(
                    "SELECT rowid, {} FROM {table}{filter} ORDER BY rowid LIMIT {}",
                    columns.join(", "),
                    self.batch_rows
                )
            }
            Cursor::Key { after } => {
                let key: Vec<String> =
                    self.table.primary_key.iter().map(|&index| quote(&self.table.columns[index].name)).collect();
                if let Some(values) = after {
                    parameters.extend(values.iter().map(json_to_sql));
                    let placeholders = vec!["?"; values.len()].join(", ");
                    conditions.push(format!("({}) > ({placeholders})", key.join(", ")));
                }
                let filter = where_clause(&mut conditions, &mut parameters, &self.window);
                format!(
                    "SELECT NULL, {} FROM {table}{filter} ORDER BY {} LIMIT {}",
                    columns.join(", "),
                    key.join(", "),
                    self.batch_rows
                )
            }
        };
        let read_error = |error| sqlite_error(error, Side::Source, &format!("read table {}", self.table.name));
        let mut statement = self.connection.prepare_cached(&sql).map_err(read_error)?;
        let mut rows = statement.query(rusqlite::params_from_iter(parameters)).map_err(read_error)?;
        let mut changes = Vec::with_capacity(self.batch_rows);
        let mut rejected = Vec::new();
        let mut last_rowid = None;
        let mut last_key = None;
        let mut count = 0;
        while let Some(row) = rows.next().map_err(read_error)? {
            count += 1;
            last_rowid = row.get::<_, Option<i64>>(0).map_err(read_error)?;
            let mut values = Vec::with_capacity(self.table.columns.len());
            let mut problem = None;
            for (index, column) in self.table.columns.iter().enumerate() {
                let stored = row.get_ref(index + 1).map_err(read_error)?;
                match read_value(stored, &column.data_type) {
                    Ok(value) => values.push(value),
                    Err(reason) => {
                        problem.get_or_insert(format!("column {}: {reason}", column.name));
                        values.push(Value::Null);
                    }
                }
            }
            if matches!(self.cursor, Cursor::Key { .. }) {
                let key = self
                    .table
                    .primary_key
                    .iter()
                    .map(|&index| sql_to_json(row.get_ref(index + 1)))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(read_error)?;
                last_key = Some(key);
            }
            match problem {
                None => changes.push(Change::insert(self.table.clone(), values)),
                Some(reason) => rejected.push(Rejected {
                    table: self.table.name.to_string(),
                    key: match last_rowid {
                        Some(rowid) if self.table.primary_key.is_empty() => {
                            format!("rowid={rowid}")
                        }
                        _ => key_text(&self.table, &values),
                    },
                    reason: format!("source: {reason}"),
                    record: None,
                    change: None,
                }),
            }
        }
        if count < self.batch_rows {
            self.finished = true;
        }
        if count == 0 {
            return Ok(None);
        }
        let position = match &mut self.cursor {
            Cursor::Rowid { after, .. } => {
                *after = last_rowid;
                Position::of(&RowidPosition { rowid: last_rowid })
            }
            Cursor::Key { after } => {
                *after = last_key.clone();
                Position::of(&KeyPosition { key: last_key })
            }
        };
        let mut batch = Batch::new(changes, position);
        batch.rejected = rejected;
        Ok(Some(batch))
    }
}

/// ` WHERE a AND b ...` of the split's conditions and the batch's cursor window, or nothing.
fn where_clause(
    conditions: &mut Vec<String>,
    parameters: &mut Vec<rusqlite::types::Value>,
    window: &Option<(String, Vec<rusqlite::types::Value>)>,
) -> String {
    if let Some((condition, values)) = window {
        conditions.push(condition.clone());
        parameters.extend(values.iter().cloned());
    }
    if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    }
}

/// Key values are kept in positions as JSON: integers and reals as numbers, text as strings,
/// blobs as `{"blob": [bytes]}`.
fn sql_to_json(value: rusqlite::Result<ValueRef<'_>>) -> rusqlite::Result<serde_json::Value> {
    Ok(match value? {
        ValueRef::Null => serde_json::Value::Null,
        ValueRef::Integer(integer) => json!(integer),
        ValueRef::Real(real) => json!(real),
        ValueRef::Text(text) => json!(String::from_utf8_lossy(text)),
        ValueRef::Blob(bytes) => json!({"blob": bytes}),
    })
}

fn json_to_sql(value: &serde_json::Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as Sql;
    match value {
        serde_json::Value::Number(number) => {
            number.as_i64().map_or_else(|| Sql::Real(number.as_f64().unwrap_or(0.0)), Sql::Integer)
        }
        serde_json::Value::String(text) => Sql::Text(text.clone()),
        serde_json::Value::Object(object) => {
            let bytes = object
                .get("blob")
                .and_then(|bytes| serde_json::from_value::<Vec<u8>>(bytes.clone()).ok())
                .unwrap_or_default();
            Sql::Blob(bytes)
        }
        _ => Sql::Null,
    }
}
