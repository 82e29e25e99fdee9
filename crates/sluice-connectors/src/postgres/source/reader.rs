//! Reading one split of a PostgreSQL table: one ordered query per read, streamed in batches,
//! inside a REPEATABLE READ snapshot whose WAL position says which changes its rows hold. A table
//! without a key, read whole, may be read by several connections at once, each a range of its
//! pages, all in the first connection's snapshot (`Parts`).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::stream::{ReadyChunks, SelectAll};
use futures_util::StreamExt;
use sluice_core::change::{Batch, Change, ChangeKind, EncodedRows, Position, Rejected, RowEncoding};
use sluice_core::connector::Reader;
use sluice_core::{Result, Side, TableSchema, Value};
use tokio_postgres::{Client, CopyOutStream};

use super::super::{postgres_error, quote};
use super::catalog::qualified;
use super::slot::ExportedSnapshot;
use super::{values, KeyPosition, KeyRange, SplitRead};

/// How a split's rows are selected beyond its key range.
#[derive(Debug, Clone, Default)]
pub(crate) struct Selection {
    /// Strictly after this key (text forms, key order): the split's start or where it resumes.
    pub after: Option<Vec<String>>,
    /// Up to this key, included.
    pub through: Option<Vec<String>>,
    /// Only these keys (a replay's `SnapshotSource::key_split`).
    pub keys: Option<Vec<Vec<String>>>,
    /// A cursor batch's condition on its column, with `?` for each value (text forms, in order).
    pub window: Option<(String, Vec<String>)>,
    /// Only the rows stored in these pages of the table: from the first, up to the second
    /// (excluded; none: to the end). One part of a keyless table read by several connections.
    pub pages: Option<(u64, Option<u64>)>,
}

impl Selection {
    pub(crate) fn of(range: &KeyRange, resumed: Option<&KeyPosition>) -> Selection {
        Selection {
            after: resumed.map(|resumed| resumed.key.clone()).or_else(|| range.after.clone()),
            through: range.through.clone(),
            keys: range.keys.clone(),
            window: None,
            pages: None,
        }
    }
}

/// `COPY (SELECT <every column> FROM t WHERE <selection> ORDER BY <key>) TO STDOUT`: the rows in
/// COPY's text form, the server's cheapest way out (about half the work of a query whose
/// columns are cast to text). Bounds are cast to the key columns' own types, so the server
/// compares them in its own order and collation, as the ORDER BY does. COPY takes no
/// parameters: the bounds, key values the source itself gave, are written as escaped string
/// literals (`literal`).
fn statement(table: &TableSchema, selection: &Selection) -> String {
    let key_types: Vec<String> = table.primary_key.iter().map(|&index| super::cast(&table.columns[index])).collect();
    let key: Vec<String> = table.primary_key.iter().map(|&index| key_expression(table, index)).collect();
    let bound = |values: &[String]| -> String {
        let values: Vec<String> =
            values.iter().zip(&key_types).map(|(value, cast)| format!("{}{cast}", literal(value))).collect();
        format!("ROW({})", values.join(", "))
    };
    let mut conditions = Vec::new();
    let key_row = format!("ROW({})", key.join(", "));
    if let Some(after) = &selection.after {
        conditions.push(format!("{key_row} > {}", bound(after)));
    }
    if let Some(through) = &selection.through {
        conditions.push(format!("{key_row} <= {}", bound(through)));
    }
    if let Some(keys) = &selection.keys {
        let rows: Vec<String> = keys.iter().map(|tuple| bound(tuple)).collect();
        conditions.push(if rows.is_empty() {
            "false".to_owned()
        } else {
            format!("{key_row} IN ({})", rows.join(", "))
        });
    }
    if let Some((condition, values)) = &selection.window {
        let mut condition = condition.clone();
        for value in values {
            condition = condition.replacen('?', &literal(value), 1);
        }
        conditions.push(condition);
    }
    if let Some((first, end)) = selection.pages {
        conditions.push(format!("row.ctid >= '({first},0)'::tid"));
        if let Some(end) = end {
            conditions.push(format!("row.ctid < '({end},0)'::tid"));
        }
    }
    let columns: Vec<String> = table.columns.iter().map(|column| format!("row.{}", quote(&column.name))).collect();
    let filter = if conditions.is_empty() { String::new() } else { format!(" WHERE {}", conditions.join(" AND ")) };
    let order = if key.is_empty() { String::new() } else { format!(" ORDER BY {}", key.join(", ")) };
    // Columns are named through the table's alias: an unqualified ORDER BY name could be taken
    // for an output column.
    format!("COPY (SELECT {} FROM {} AS row{filter}{order}) TO STDOUT", columns.join(", "), qualified(&table.name))
}

/// A string literal PostgreSQL reads back as `text` whatever `standard_conforming_strings` says.
fn literal(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// A key column as the reads compare and order it, through the table's alias `row`: itself,
/// or its text form when its type has no name a bound could be cast to (`Column::native_type`
/// empty: an enum, a user's type).
pub(crate) fn key_expression(table: &TableSchema, index: usize) -> String {
    let column = &table.columns[index];
    if column.native_type.is_empty() {
        format!("row.{}::text", quote(&column.name))
    } else {
        format!("row.{}", quote(&column.name))
    }
}

/// The snapshot a split's read is taken in, in a job that streams.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// The split's earlier reads (`KeyPosition::reads`), kept in its position.
    pub earlier: Vec<SplitRead>,
    /// The slot's exported snapshot, which a first read imports while it lives.
    pub import: Option<ExportedSnapshot>,
    /// The split is the whole of a table without a key: a snapshot of its own is taken under a
    /// SHARE lock, so its position is exact (`begin_snapshot`).
    pub lock: bool,
}

/// Begins a REPEATABLE READ snapshot and returns the WAL position its rows stand at: the
/// slot's own when the exported snapshot is imported (exactly the rows before the slot's first
/// change), else the WAL insert position read inside a snapshot of its own (every transaction
/// it sees committed before that position; the stream's changes up to it are applied again
/// by key).
///
/// A table without a key is copied whole and its changes before the copy's position are left
/// out, not applied again: its position must be exact. Without the exported snapshot, the read
/// takes `LOCK TABLE … IN SHARE MODE` before its snapshot: writers of the table still open have
/// finished (and are in the snapshot, their commits before the position read), later ones wait
/// until the copy ends (their commits after it).
async fn begin_snapshot(
    client: &Client,
    table: &TableSchema,
    snapshot: &Snapshot,
) -> std::result::Result<String, tokio_postgres::Error> {
    if let Some(import) = snapshot.import.as_ref() {
        client.batch_execute(BEGIN_SNAPSHOT).await?;
        let name = import.name.replace('\'', "''");
        match client.batch_execute(&format!("SET TRANSACTION SNAPSHOT '{name}'")).await {
            Ok(()) => return Ok(import.lsn.clone()),
            Err(error) => {
                // The exporting session ended (the copy resumed after a restart): a snapshot
                // of the read's own.
                log::debug!("snapshot {} is no longer exported ({error}); reading in a new one", import.name);
                client.batch_execute("ROLLBACK").await?;
            }
        }
    }
    client.batch_execute(BEGIN_SNAPSHOT).await?;
    if snapshot.lock {
        client.batch_execute(&format!("LOCK TABLE {} IN SHARE MODE", qualified(&table.name))).await?;
    }
    let row = client.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await?;
    Ok(row.get(0))
}

/// The connections that read a split: the first, which takes the snapshot, and the others,
/// each reading a range of the table's pages in it (a table without a key, `KeyRange::parts`).
pub(crate) struct Parts {
    pub first: Client,
    pub others: Vec<Client>,
}

impl Parts {
    fn all(&self) -> impl Iterator<Item = &Client> {
        std::iter::once(&self.first).chain(&self.others)
    }
}

/// How every read in a snapshot begins.
const BEGIN_SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// The connections of `parts` with what each reads: the whole selection on the first alone,
/// else one range of the table's pages each, cut evenly over the pages the table has now (the
/// last range open-ended), every other connection in the first one's snapshot, which it
/// exports. A table whose pages are fewer than the connections (or a partitioned one, whose
/// rows are in its partitions' pages) is read by the first alone.
async fn part_selections<'a>(
    parts: &'a Parts,
    table: &TableSchema,
    selection: Selection,
) -> std::result::Result<Vec<(&'a Client, Selection)>, tokio_postgres::Error> {
    let first = &parts.first;
    let count = parts.others.len() as u64 + 1;
    if count == 1 {
        return Ok(vec![(first, selection)]);
    }
    let pages: i64 = first
        .query_one(
            "SELECT pg_relation_size($1::text::regclass) / current_setting('block_size')::bigint",
            &[&qualified(&table.name)],
        )
        .await?
        .get(0);
    let pages = pages.max(0) as u64;
    if pages < count {
        return Ok(vec![(first, selection)]);
    }
    let exported: String = first.query_one("SELECT pg_export_snapshot()", &[]).await?.get(0);
    for other in &parts.others {
        other.batch_execute(BEGIN_SNAPSHOT).await?;
        other.batch_execute(&format!("SET TRANSACTION SNAPSHOT '{}'", exported.replace('\'', "''"))).await?;
    }
    log::info!("table {}: read by {count} connections at once, each a range of its {pages} pages", table.name);
    Ok(parts
        .all()
        .enumerate()
        .map(|(index, client)| {
            let index = index as u64;
            let end = (index + 1 < count).then(|| pages * (index + 1) / count);
            let pages = Some((pages * index / count, end));
            (client, Selection { pages, ..selection.clone() })
        })
        .collect())
}

/// The open queries' lines, taken from whichever has some, as many as it has ready at once: a
/// selection over streams costs about as much per item as decoding a row, so it is paid per
/// chunk.
type Lines = SelectAll<ReadyChunks<Pin<Box<CopyOutStream>>>>;

/// Lines a query hands over at most at once.
const READY_LINES: usize = 1024;

/// A split being read: the open queries' rows, turned into batches.
pub(crate) struct PostgresReader {
    parts: Parts,
    server: String,
    table: Arc<TableSchema>,
    rows: Option<Lines>,
    /// Lines taken from the queries and not yet in a batch.
    pending: VecDeque<std::result::Result<bytes::Bytes, tokio_postgres::Error>>,
    batch_rows: usize,
    /// The rows are read in a snapshot, ended once the split is read.
    snapshot: bool,
    /// The split's reads so far, this one last (`KeyPosition::reads`).
    reads: Vec<SplitRead>,
    /// The key of the last row read, as text.
    last_key: Option<Vec<String>>,
    /// Rows are handed on as COPY text (`encoded`).
    encoded: bool,
    /// The COPY text of the last batch handed on, in bytes: the next one's first guess.
    encoded_bytes: usize,
}

impl std::fmt::Debug for PostgresReader {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("PostgresReader").field("table", &self.table.name).finish_non_exhaustive()
    }
}

impl PostgresReader {
    /// Starts the read; in a job that streams, inside a snapshot (`begin_snapshot`) whose
    /// position the read's batches carry.
    pub(crate) async fn start(
        parts: Parts,
        server: String,
        table: Arc<TableSchema>,
        selection: Selection,
        batch_rows: usize,
        snapshot: Option<Snapshot>,
    ) -> Result<PostgresReader> {
        let doing = format!("read table {}", table.name);
        let error = |error| postgres_error(error, Side::Source, &server, &doing);
        let client = &parts.first;
        let mut reads = Vec::new();
        if let Some(snapshot) = snapshot.as_ref() {
            let lsn = begin_snapshot(client, &table, snapshot).await.map_err(error)?;
            reads = snapshot.earlier.clone();
            reads.push(SplitRead { after: selection.after.clone(), lsn });
        } else if !parts.others.is_empty() {
            client.batch_execute(BEGIN_SNAPSHOT).await.map_err(error)?;
        }
        let mut rows = SelectAll::new();
        for (client, selection) in part_selections(&parts, &table, selection).await.map_err(error)? {
            let lines = Box::pin(client.copy_out(&statement(&table, &selection)).await.map_err(error)?);
            rows.push(lines.ready_chunks(READY_LINES));
        }
        let snapshot = snapshot.is_some() || !parts.others.is_empty();
        Ok(PostgresReader {
            parts,
            server,
            table,
            rows: Some(rows),
            pending: VecDeque::new(),
            batch_rows,
            snapshot,
            reads,
            last_key: None,
            encoded: false,
            encoded_bytes: 0,
        })
    }

    /// Hands the rows on as COPY text (`Batch::encoded`), undecoded but for each batch's last
    /// row, whose key is the batch's position.
    pub(crate) fn encoded(mut self) -> PostgresReader {
        self.encoded = true;
        self
    }

    /// The next batch of rows as COPY text, `None` once the split is read.
    async fn next_encoded(&mut self, rows: &mut Lines) -> Result<(Option<Batch>, bool)> {
        let mut data = Vec::with_capacity(self.encoded_bytes + self.encoded_bytes / 8);
        let mut count = 0;
        let mut last = None;
        let mut finished = false;
        while count < self.batch_rows {
            let line = match self.pending.pop_front() {
                Some(line) => line,
                None => match rows.next().await {
                    Some(lines) => {
                        self.pending.extend(lines);
                        continue;
                    }
                    None => {
                        finished = true;
                        break;
                    }
                },
            };
            let line = line.map_err(|error| self.read_error(error))?;
            data.extend_from_slice(&line);
            count += 1;
            last = Some(line);
        }
        let Some(last) = last else { return Ok((None, finished)) };
        let values = match values::decode_line(&self.table, &last) {
            Ok(values) | Err((values, _)) => values,
        };
        self.last_key = Some(key_text(&self.table, &values));
        self.encoded_bytes = data.len();
        let rows = EncodedRows { encoding: RowEncoding::PostgresCopyText, data: data.into(), rows: count };
        Ok((Some(Batch::encoded(rows, self.position())), finished))
    }

    /// Where a read resumes after the last row read.
    fn position(&self) -> Position {
        let key = self.last_key.clone().unwrap_or_default();
        Position::of(&KeyPosition { key, reads: self.reads.clone() })
    }

    fn read_error(&self, error: tokio_postgres::Error) -> sluice_core::Error {
        postgres_error(error, Side::Source, &self.server, &format!("read table {}", self.table.name))
    }

    /// Ends the snapshot the split was read in, once it is read.
    async fn finish(&self) -> Result<()> {
        if !self.snapshot {
            return Ok(());
        }
        for client in self.parts.all() {
            client.batch_execute("COMMIT").await.map_err(|error| {
                postgres_error(
                    error,
                    Side::Source,
                    &self.server,
                    &format!("end the snapshot of table {}", self.table.name),
                )
            })?;
        }
        Ok(())
    }
}

#[async_trait]
impl Reader for PostgresReader {
    async fn next(&mut self) -> Result<Option<Batch>> {
        let Some(mut rows) = self.rows.take() else { return Ok(None) };
        if self.encoded {
            let (batch, finished) = self.next_encoded(&mut rows).await?;
            if finished {
                self.finish().await?;
            } else {
                self.rows = Some(rows);
            }
            return Ok(batch);
        }
        let mut changes = Vec::with_capacity(self.batch_rows);
        let mut rejected = Vec::new();
        let mut bytes = 0u64;
        let mut finished = false;
        // The key of the batch's last row, written once the batch ends: the last row read is
        // the last change unless a rejected row came after it.
        let mut last_is_change = false;
        while changes.len() + rejected.len() < self.batch_rows {
            let line = match self.pending.pop_front() {
                Some(line) => Some(line),
                None => match rows.next().await {
                    Some(lines) => {
                        self.pending.extend(lines);
                        continue;
                    }
                    None => None,
                },
            };
            match line {
                Some(Ok(line)) => match values::decode_line(&self.table, &line) {
                    Ok(values) => {
                        bytes += line.len() as u64;
                        last_is_change = true;
                        changes.push(Change::insert(self.table.clone(), values));
                    }
                    Err((values, reason)) => {
                        self.last_key = Some(key_text(&self.table, &values));
                        last_is_change = false;
                        rejected.push(Rejected::row(&self.table, &values, reason));
                    }
                },
                Some(Err(error)) => return Err(self.read_error(error)),
                None => {
                    finished = true;
                    break;
                }
            }
        }
        if finished {
            self.finish().await?;
        } else {
            self.rows = Some(rows);
        }
        if changes.is_empty() && rejected.is_empty() {
            return Ok(None);
        }
        if let Some(ChangeKind::Insert { after }) = changes.last().filter(|_| last_is_change).map(|change| &change.kind)
        {
            self.last_key = Some(key_text(&self.table, after));
        }
        let mut batch = Batch::counted(changes, self.position(), bytes);
        batch.rejected = rejected;
        Ok(Some(batch))
    }
}

/// A row's key as the text forms its bounds are written in.
fn key_text(table: &TableSchema, values: &[Value]) -> Vec<String> {
    table.primary_key.iter().map(|&index| values::text_form(&values[index]).unwrap_or_default()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Column, DataType, TableName};

    #[test]
    fn a_part_of_a_keyless_table_reads_a_range_of_its_pages_unordered() {
        let table = TableSchema {
            columns: vec![Column::new("a", DataType::Integer { bytes: 4, unsigned: false }, true)],
            ..TableSchema::named(TableName::new(Some("app"), "t"))
        };
        let part = |pages| statement(&table, &Selection { pages: Some(pages), ..Selection::default() });
        assert_eq!(
            part((10, Some(20))),
            "COPY (SELECT row.\"a\" FROM \"app\".\"t\" AS row WHERE row.ctid >= '(10,0)'::tid AND row.ctid < '(20,0)'::tid) TO STDOUT"
        );
        assert_eq!(
            part((20, None)),
            "COPY (SELECT row.\"a\" FROM \"app\".\"t\" AS row WHERE row.ctid >= '(20,0)'::tid) TO STDOUT"
        );
    }

    #[test]
    fn bounds_are_escaped_literals_cast_to_the_key_types() {
        let mut name = Column::new("name", DataType::Text { length: None, fixed: false }, false);
        name.native_type = "text".into();
        let mut id = Column::new("id", DataType::Integer { bytes: 4, unsigned: false }, false);
        id.native_type = "integer".into();
        let table = TableSchema {
            primary_key: vec![0, 1],
            columns: vec![name, id],
            ..TableSchema::named(TableName::new(Some("app"), "t"))
        };
        let selection = Selection { after: Some(vec!["o'k\\".into(), "7".into()]), ..Selection::default() };
        assert_eq!(
            statement(&table, &selection),
            "COPY (SELECT row.\"name\", row.\"id\" FROM \"app\".\"t\" AS row WHERE ROW(row.\"name\", row.\"id\") > \
             ROW(E'o''k\\\\'::text, E'7'::integer) ORDER BY row.\"name\", row.\"id\") TO STDOUT"
        );
    }
}
