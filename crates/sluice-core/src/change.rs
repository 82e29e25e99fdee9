//! Changes and batches: what flows from a reader to a writer.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::schema::TableSchema;
use crate::value::Value;

/// A row's values, in the order of its table's columns.
pub type Row = Vec<Value>;

/// One row-level change to one table.
#[derive(Debug, Clone)]
pub struct Change {
    pub table: Arc<TableSchema>,
    pub kind: ChangeKind,
}

/// The row images a change carries. Snapshots produce only inserts.
#[derive(Debug, Clone)]
pub enum ChangeKind {
    Insert { after: Row },
    Update { before: Row, after: Row },
    Delete { before: Row },
}

impl Change {
    pub fn insert(table: Arc<TableSchema>, after: Row) -> Change {
        Change { table, kind: ChangeKind::Insert { after } }
    }

    /// The image that identifies the row: the new one for inserts and updates, the old one for
    /// deletes.
    pub fn row(&self) -> &Row {
        match &self.kind {
            ChangeKind::Insert { after } | ChangeKind::Update { after, .. } => after,
            ChangeKind::Delete { before } => before,
        }
    }

    /// The image that identifies the row (`row`), taken out of the change.
    pub fn into_row(self) -> Row {
        match self.kind {
            ChangeKind::Insert { after } | ChangeKind::Update { after, .. } => after,
            ChangeKind::Delete { before } => before,
        }
    }

    /// The primary-key values rendered as `col=value, ...`, or the whole row for keyless tables.
    pub fn key_text(&self) -> String {
        key_text(&self.table, self.row())
    }

    pub fn approximate_size(&self) -> usize {
        let images = match &self.kind {
            ChangeKind::Insert { after } => after.iter().map(Value::approximate_size).sum(),
            ChangeKind::Update { before, after } => before.iter().chain(after).map(Value::approximate_size).sum(),
            ChangeKind::Delete { before } => before.iter().map(Value::approximate_size).sum(),
        };
        images
    }
}

/// Renders a row's identity for dirty records and error messages: the primary key when the table
/// has one, otherwise every column.
pub fn key_text(table: &TableSchema, row: &Row) -> String {
    let indexes: Vec<usize> =
        if table.primary_key.is_empty() { (0..table.columns.len()).collect() } else { table.primary_key.clone() };
    indexes
        .iter()
        .filter_map(|&index| Some(format!("{}={}", table.columns.get(index)?.name, row.get(index)?)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A row's primary-key values alone, one per line of text (column names left out, so a source
/// row and the same row under a target's column names agree): how a stream target names the
/// keys it holds as an earlier read of the copy left them (`connector::HeldRows`).
pub fn key_identity(table: &TableSchema, row: &Row) -> String {
    table.primary_key.iter().filter_map(|&index| row.get(index)).map(ToString::to_string).collect::<Vec<_>>().join("\n")
}

/// A primary key's values (in key order) rendered as `key_text` renders its row.
pub(crate) fn key_values_text(table: &TableSchema, key: &[crate::value::Value]) -> String {
    table
        .primary_key
        .iter()
        .zip(key)
        .filter_map(|(&index, value)| Some(format!("{}={value}", table.columns.get(index)?.name)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A place in a source's change log that a job names (`source.start_position`,
/// `source.stop_position`): a position, or a time.
#[derive(Debug, Clone, PartialEq)]
pub enum LogMark {
    /// A position as the connector writes it.
    Position(Position),
    /// Seconds since the epoch: where the first transaction the log dates at or after it begins.
    Time(u64),
}

/// A source position: opaque to the engine, owned and interpreted by the connector that made it.
/// It is stored in checkpoints and served by the API, so it is plain JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Position(pub serde_json::Value);

impl Position {
    /// A position from the connector's typed form.
    pub fn of(position: &impl Serialize) -> Position {
        Position(serde_json::to_value(position).expect("positions serialize"))
    }

    /// The position as text for a log line: whole when short, else its first 120 characters
    /// and its length (a watched directory's position lists every file it loaded).
    pub fn brief(&self) -> String {
        brief_json(&self.0)
    }

    /// The position as the connector's type; one that does not read is an error naming `what`
    /// (e.g. the task whose checkpoint holds it).
    pub fn read<T: serde::de::DeserializeOwned>(&self, what: &str) -> crate::error::Result<T> {
        serde_json::from_value(self.0.clone()).map_err(|error| {
            crate::error::Error::new(
                crate::error::ErrorKind::State,
                format!("the position of {what} is not one this connector wrote: {error}"),
            )
        })
    }
}

/// JSON text for a log line: whole when short, else its start and its length.
pub fn brief_json(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.len() <= 160 {
        return text;
    }
    let mut end = 120;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

/// A record that could not be read or written, kept for inspection instead of being dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejected {
    /// The table as named on the side that rejected it.
    pub table: String,
    /// The row's key (`id=5`), or its location when no key is known (`line 17`).
    pub key: String,
    /// Why, naming the column and side.
    pub reason: String,
    /// The record itself, as JSON text, when it could be rendered. For a change of the stream,
    /// the row after it (`None` when the change deleted the row).
    pub record: Option<String>,
    /// A change of the stream left out of the target: where it is in the source's log, the row
    /// before it, and the source row to read again on a replay. `None` for a copied row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<RejectedChange>,
}

/// What a dirty record of the change stream says beyond its row (`Rejected::change`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RejectedChange {
    /// The commit position of the source transaction that made the change: the stream
    /// resumes after it.
    pub position: Position,
    /// The row before the change, as JSON text in the target's columns; `None` when the change
    /// inserted it.
    pub before: Option<String>,
    /// The source row the change belongs to, for a replay; `None` when the key the target sees
    /// cannot be traced back to the source's (a transform computes or masks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceKey>,
}

/// A row of a source table, by its primary key: its values in key order, as JSON
/// (`crate::json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceKey {
    pub table: String,
    pub key: Vec<serde_json::Value>,
}

impl Rejected {
    /// A row of `table` refused for `reason`, keyed by its primary key.
    pub fn row(table: &TableSchema, row: &Row, reason: String) -> Rejected {
        Rejected { table: table.name.to_string(), key: key_text(table, row), reason, record: None, change: None }
    }

    /// Whether this is a change of the stream (replayed by its source key, not by its split).
    pub fn of_stream(&self) -> bool {
        self.change.is_some()
    }
}

/// A row as a JSON object of its columns (`{"id": 5, "name": "x"}`), for dirty records.
pub(crate) fn row_json(table: &TableSchema, row: &Row) -> String {
    let mut text = String::from("{");
    for (index, (column, value)) in table.columns.iter().zip(row).enumerate() {
        if index > 0 {
            text.push_str(", ");
        }
        text.push_str(&serde_json::Value::from(column.name.as_str()).to_string());
        text.push_str(": ");
        crate::json::encode_value(value, &mut text);
    }
    text.push('}');
    text
}

/// An ordered group of changes of one split, and the position at which the source resumes after
/// them. Source-side rejects found while reading the batch travel with it, so they are recorded
/// before the position that passes them is committed.
#[derive(Debug, Clone)]
pub struct Batch {
    pub changes: Vec<Change>,
    pub position: Position,
    pub rejected: Vec<Rejected>,
    /// Bytes the source read for this batch (payload size, not wire size).
    pub bytes: u64,
    /// Rows handed on as the source wrote them, in a format the target reads itself (then
    /// `changes` is empty): see [`EncodedRows`].
    pub encoded: Option<EncodedRows>,
}

impl Batch {
    pub fn new(changes: Vec<Change>, position: Position) -> Batch {
        let bytes = changes.iter().map(|change| change.approximate_size() as u64).sum();
        Batch { changes, position, rejected: Vec::new(), bytes, encoded: None }
    }

    /// A batch whose reader summed [`Change::approximate_size`] while decoding, when the values
    /// were at hand, sparing a second pass over them.
    pub fn counted(changes: Vec<Change>, position: Position, bytes: u64) -> Batch {
        Batch { changes, position, rejected: Vec::new(), bytes, encoded: None }
    }

    /// A batch of rows left in the source's own format.
    pub fn encoded(rows: EncodedRows, position: Position) -> Batch {
        let bytes = rows.data.len() as u64;
        Batch { changes: Vec::new(), position, rejected: Vec::new(), bytes, encoded: Some(rows) }
    }

    /// The rows (changes) the batch carries, decoded or not.
    pub fn rows(&self) -> usize {
        self.changes.len() + self.encoded.as_ref().map_or(0, |encoded| encoded.rows)
    }
}

/// A bulk format in which a source can hand on a snapshot's rows without decoding them and a
/// target can take them without encoding them again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowEncoding {
    /// PostgreSQL's `COPY` text format: a line per row, the table's columns in order, each value
    /// in its type's text form as a session in UTC with ISO dates, the `postgres` interval style
    /// and exact floats writes it.
    PostgresCopyText,
}

impl std::fmt::Display for RowEncoding {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            RowEncoding::PostgresCopyText => "PostgreSQL COPY text",
        })
    }
}

/// Rows of one split as the source wrote them in `encoding`, for a copy whose table the job maps
/// to the target unchanged, into a target that reads the format (`TableWriter::takes_encoded`).
/// No value was decoded: the target, not Sluice, judges them, and a row it refuses is found by
/// decoding the batch then.
#[derive(Debug, Clone)]
pub struct EncodedRows {
    pub encoding: RowEncoding,
    /// The rows, each one line ending in `\n`; shared, so a writer sends them without a copy.
    pub data: bytes::Bytes,
    pub rows: usize,
}
