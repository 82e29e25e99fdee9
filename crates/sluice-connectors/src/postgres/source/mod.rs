//! PostgreSQL as a source: discovery from the catalog (`catalog`), primary-key range splits read
//! in REPEATABLE READ snapshots (`reader`), and the change stream of a logical replication slot
//! with `pgoutput` (`stream`), whose slot and publication `slot` manages.

mod catalog;
mod pump;
mod reader;
mod slot;
mod stream;
mod streamed;
pub(super) mod values;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::change::{LogMark, Position, RowEncoding};
use sluice_core::connector::{
    ChangeSource, ChangeStream, CheckItem, CopyRead, CursorSource, LogBacklog, Reader, SnapshotSource, Source, Split,
    SplitHint,
};
use sluice_core::cursor::{self, CursorWindow};
use sluice_core::filter::TableFilter;
use sluice_core::names::split_task;
use sluice_core::secret::Secret;
use sluice_core::spec::{CursorSpec, Mode};
use sluice_core::{DataType, Error, ErrorKind, Result, Row, Side, TableName, TableSchema};
use tokio::sync::Mutex;
use tokio_postgres::Client;

use super::{postgres_error, quote};
use catalog::{Described, ReplicaIdentity};
use reader::{Parts, PostgresReader, Selection, Snapshot};
use slot::Export;
pub use slot::{ExportedSnapshot, Replication};

/// A split of a PostgreSQL table: the key (text forms, key order) it starts strictly after and
/// the one it ends at, included; none for the first split's start and the last split's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyRange {
    pub after: Option<Vec<String>>,
    pub through: Option<Vec<String>>,
    /// Only these keys (a replay of the stream's dirty records, `SnapshotSource::key_split`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<Vec<String>>>,
    /// The snapshot the job's slot was created at, which the split's first read imports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<ExportedSnapshot>,
    /// A table without a key: read by this many connections at once, each a range of the
    /// table's pages (CTID ranges), all in one snapshot (`reader::Parts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<u32>,
}

/// Where a snapshot read of a split resumes: strictly after this key. A job that streams also
/// keeps where in the WAL each read of the split stood (`SnapshotSource::copy_reads`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyPosition {
    pub key: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<SplitRead>,
}

/// One read of a split in one snapshot: the keys strictly after `after` up to the next read's
/// start, as they stood at WAL position `lsn` (every transaction the snapshot saw committed
/// before it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitRead {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Vec<String>>,
    pub lsn: String,
}

/// A stream position: the end of a committed transaction in the WAL, `X/Y` as PostgreSQL
/// prints it. The stream resumes with the transactions that commit after it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WalPosition {
    pub lsn: String,
}

/// `X/Y` (two hexadecimal halves) as a 64-bit WAL position.
pub(crate) fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some(u64::from_str_radix(high, 16).ok()? << 32 | u64::from_str_radix(low, 16).ok()?)
}

/// A 64-bit WAL position as PostgreSQL prints it.
pub(crate) fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// A size setting as PostgreSQL shows it (`16MB`, `1GB`, `8kB`), in bytes.
fn parse_size(text: &str) -> Option<u64> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    let unit = match &text[digits.len()..] {
        "" | "B" => 1,
        "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    Some(digits.parse::<u64>().ok()? * unit)
}

/// The WAL position of a stream position, or of a copy's (`KeyPosition`: its last read's, which
/// is what the engine compares a table read whole with).
/// The cast of a bound on `column` after `::text`: to its own type, or none (compared as text).
fn cast(column: &sluice_core::Column) -> String {
    if column.native_type.is_empty() {
        String::new()
    } else {
        format!("::{}", column.native_type)
    }
}

fn position_lsn(position: &Position) -> Option<u64> {
    let lsn = match position.0.get("lsn") {
        Some(lsn) => lsn,
        None => position.0.get("reads")?.as_array()?.last()?.get("lsn")?,
    };
    lsn.as_str().and_then(parse_lsn)
}

/// The settings every source session reads in, SQL and replication alike: values in the text
/// forms `values` reads (`connect` pins the SQL sessions' TimeZone to UTC). Floats in their
/// exact form: the shortest that reads back equal from PostgreSQL 12 on (any value above 0),
/// 17 significant digits before (3); a PostgreSQL target reads the COPY text as it is.
const SESSION_SETTINGS: [(&str, &str); 5] = [
    ("DateStyle", "ISO"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("bytea_output", "hex"),
    ("extra_float_digits", "3"),
];

/// `SESSION_SETTINGS` as SQL.
fn session_setup() -> String {
    SESSION_SETTINGS.iter().map(|(name, value)| format!("SET {name} = {value}")).collect::<Vec<_>>().join("; ")
}

/// `SESSION_SETTINGS` as a session's startup `options` (`-c name=value ...`).
fn session_options() -> String {
    SESSION_SETTINGS.iter().map(|(name, value)| format!("-c {name}={value}")).collect::<Vec<_>>().join(" ")
}

/// A cursor mark or bound (JSON) as the text form it is bound with.
fn json_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The most connections that read one table without a key at once.
const MAX_PARTS: u32 = 4;

/// The first version that scans a range of CTIDs by itself (a TID Range Scan, `server_version_num`).
const TID_RANGE_SCAN_SINCE: i32 = 140_000;

/// A PostgreSQL server read as a source.
#[derive(Debug)]
pub struct PostgresSource {
    url: Secret,
    /// The URL without its password, for messages.
    server: String,
    filter: TableFilter,
    mode: Mode,
    replication: Replication,
    batch_rows: usize,
    /// Where the stream ends (`source.stop_position`), if anywhere.
    stop_position: Option<LogMark>,
    /// The tables as `discover` described them, for splits and checks.
    described: Mutex<BTreeMap<TableName, Described>>,
    /// The snapshot of the slot this run created, kept exported until the stream starts.
    export: Mutex<Option<Export>>,
}

impl PostgresSource {
    pub fn new(
        url: Secret,
        server: String,
        filter: TableFilter,
        mode: Mode,
        replication: Replication,
        batch_rows: usize,
        stop_position: Option<LogMark>,
    ) -> PostgresSource {
        PostgresSource {
            url,
            server,
            filter,
            mode,
            replication,
            batch_rows,
            stop_position,
            described: Mutex::new(BTreeMap::new()),
            export: Mutex::new(None),
        }
    }

    async fn connection(&self) -> Result<Client> {
        let client = super::connect(&self.url, Side::Source, &self.server).await?;
        client
            .batch_execute(&session_setup())
            .await
            .map_err(|error| postgres_error(error, Side::Source, &self.server, "set up the session"))?;
        Ok(client)
    }

    /// A reader of `split` from `resume_after`, its rows decoded unless made `encoded`.
    async fn reader(
        &self,
        split: &Split,
        resume_after: Option<&Position>,
        batch_rows: usize,
    ) -> Result<PostgresReader> {
        let client = self.connection().await?;
        let range: KeyRange = split.read_descriptor()?;
        let resumed = if split.whole {
            None
        } else {
            resume_after.map(|position| position.read::<KeyPosition>(&split.id)).transpose()?
        };
        let mut selection = Selection::of(&range, resumed.as_ref());
        let mut others = Vec::new();
        if split.whole && split.window.is_none() {
            for _ in 1..range.parts.unwrap_or(1) {
                others.push(self.connection().await?);
            }
        }
        if let Some(window) = &split.window {
            let column = cursor::column(&split.table, &CursorSpec { column: window.column.clone(), lookback_secs: 0 })?;
            let (condition, values) =
                window.condition(&format!("row.{}", quote(&column.name)), |_| format!("?::text{}", cast(column)));
            selection.window = Some((condition, values.into_iter().map(json_text).collect()));
        }
        // A job that streams reads each split in one snapshot whose WAL position says which
        // changes its rows hold. A resumed read whose earlier reads were not kept stays without.
        let known = resumed.as_ref().is_none_or(|resumed| !resumed.reads.is_empty());
        let snapshot =
            (self.mode.streams() && split.window.is_none() && range.keys.is_none() && known).then(|| match resumed {
                Some(resumed) => Snapshot { earlier: resumed.reads, import: None, lock: split.whole },
                None => Snapshot { earlier: Vec::new(), import: range.snapshot.clone(), lock: split.whole },
            });
        PostgresReader::start(
            Parts { first: client, others },
            self.server.clone(),
            split.table.clone(),
            selection,
            batch_rows,
            snapshot,
        )
        .await
    }

    fn error<'a>(&'a self, doing: &'a str) -> impl Fn(tokio_postgres::Error) -> Error + 'a {
        move |error| postgres_error(error, Side::Source, &self.server, doing)
    }

    /// The selected tables, described.
    async fn describe_selected(&self, client: &Client) -> Result<Vec<Described>> {
        let available = catalog::table_names(client, &self.server).await?;
        let mut described = Vec::new();
        for name in self.filter.select(available)? {
            described.push(catalog::describe(client, &name, &self.server).await?);
        }
        Ok(described)
    }

    /// The tables whose updates and deletes the stream cannot identify, with the fix.
    fn unidentified(described: &[Described]) -> Vec<String> {
        described
            .iter()
            .filter(|table| match table.identity {
                ReplicaIdentity::Nothing => true,
                ReplicaIdentity::Default => table.schema.primary_key.is_empty(),
                _ => false,
            })
            .map(|table| format!("ALTER TABLE {} REPLICA IDENTITY FULL;", catalog::qualified(&table.schema.name)))
            .collect()
    }

    /// Key tuples kept as text (`KeyPosition::key`, `KeyRange`) as the values the stream
    /// decodes for the same key.
    fn key_values(table: &TableSchema, keys: Option<&Vec<String>>) -> Result<Option<Row>> {
        let Some(keys) = keys else { return Ok(None) };
        table
            .primary_key
            .iter()
            .zip(keys)
            .map(|(&index, text)| {
                values::parse(text, &table.columns[index].data_type).map_err(|reason| {
                    Error::new(ErrorKind::State, format!("a stored key of table {}: {reason}", table.name))
                })
            })
            .collect::<Result<Row>>()
            .map(Some)
    }

    /// How many connections read a table without a key at once (`KeyRange::parts`): one per
    /// `rows_per_split` rows, at most `MAX_PARTS`; one (`None`) for a small table or a server
    /// older than PostgreSQL 14, which cannot scan a CTID range without reading the whole table.
    async fn parts_of_keyless(&self, client: &Client, estimated: u64, hint: SplitHint) -> Result<Option<u32>> {
        let parts = (estimated / hint.rows_per_split.max(1)).min(u64::from(MAX_PARTS)) as u32;
        if parts < 2 {
            return Ok(None);
        }
        let version: i32 = client
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(self.error("read the server's version"))?
            .get(0);
        Ok((version >= TID_RANGE_SCAN_SINCE).then_some(parts))
    }

    async fn integer_bounds(
        &self,
        client: &Client,
        table: &TableSchema,
        estimated: u64,
        hint: SplitHint,
    ) -> Result<Vec<(Option<Vec<String>>, Option<Vec<String>>)>> {
        let key = quote(&table.columns[table.primary_key[0]].name);
        let doing = format!("read the key range of table {}", table.name);
        let row = client
            .query_one(
                &format!("SELECT min({key})::int8, max({key})::int8 FROM {}", catalog::qualified(&table.name)),
                &[],
            )
            .await
            .map_err(self.error(&doing))?;
        let (Some(low), Some(high)) = (row.get::<_, Option<i64>>(0), row.get::<_, Option<i64>>(1)) else {
            return Ok(vec![(None, None)]);
        };
        let count = estimated.div_ceil(hint.rows_per_split.max(1)).clamp(1, 10_000);
        let width = ((i128::from(high) - i128::from(low)) / i128::from(count)).max(1);
        let mut bounds = Vec::new();
        let mut after: Option<i128> = None;
        for index in 1..=count {
            let through = if index == count { None } else { Some(i128::from(low) + width * i128::from(index)) };
            if through.is_some_and(|through| through >= i128::from(high)) {
                bounds.push((after.map(|after| vec![after.to_string()]), None));
                return Ok(bounds);
            }
            bounds.push((after.map(|after| vec![after.to_string()]), through.map(|through| vec![through.to_string()])));
            after = through;
        }
        Ok(bounds)
    }

    /// Bounds from a sample of the table's pages, sorted by the key as the server orders it.
    async fn sampled_bounds(
        &self,
        client: &Client,
        table: &TableSchema,
        estimated: u64,
        hint: SplitHint,
    ) -> Result<Vec<(Option<Vec<String>>, Option<Vec<String>>)>> {
        let count = estimated.div_ceil(hint.rows_per_split.max(1)).clamp(1, 10_000);
        let wanted = count * 20;
        let mut percent = (100.0 * wanted as f64 / estimated.max(1) as f64).clamp(0.001, 100.0);
        let key: Vec<String> =
            (0..table.primary_key.len()).map(|index| reader::key_expression(table, table.primary_key[index])).collect();
        let texts: Vec<String> = key.iter().map(|expression| format!("({expression})::text")).collect();
        let doing = format!("sample the keys of table {}", table.name);
        // SYSTEM sampling takes whole pages: a table of a few hundred pages may give none at a
        // small percentage, so a sample too small is taken again, ten times larger.
        let rows = loop {
            let sql = format!(
                "SELECT {} FROM {} AS row TABLESAMPLE SYSTEM ({percent}) ORDER BY {}",
                texts.join(", "),
                catalog::qualified(&table.name),
                key.join(", ")
            );
            let rows = client.query(&sql, &[]).await.map_err(self.error(&doing))?;
            if rows.len() as u64 >= wanted / 2 || percent >= 100.0 {
                break rows;
            }
            percent = (percent * 10.0).min(100.0);
        };
        let step = (rows.len() / count as usize).max(1);
        let mut bounds = Vec::new();
        let mut after: Option<Vec<String>> = None;
        for row in rows.iter().skip(step - 1).step_by(step) {
            let through: Vec<String> = (0..key.len()).map(|index| row.get(index)).collect();
            if after.as_ref() == Some(&through) {
                continue;
            }
            bounds.push((after.replace(through.clone()), Some(through)));
        }
        bounds.push((after, None));
        Ok(bounds)
    }
}

#[async_trait]
impl Source for PostgresSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let client = self.connection().await?;
        let mut items = vec![CheckItem { what: "source connection".into(), ok: true, detail: self.server.clone() }];
        let described = self.describe_selected(&client).await?;
        let readable: Vec<String> = {
            let mut denied = Vec::new();
            for table in &described {
                let relation = catalog::qualified(&table.schema.name);
                let row = client
                    .query_one("SELECT has_table_privilege($1::text::regclass, 'SELECT')", &[&relation])
                    .await
                    .map_err(self.error("read the table privileges"))?;
                if !row.get::<_, bool>(0) {
                    denied.push(table.schema.name.to_string());
                }
            }
            denied
        };
        items.push(CheckItem {
            what: "source tables readable".into(),
            ok: readable.is_empty(),
            detail: if readable.is_empty() {
                format!("{} tables", described.len())
            } else {
                format!("the user lacks SELECT on {}; grant it", readable.join(", "))
            },
        });
        if self.mode.streams() {
            items.extend(self.replication.check(&client, &self.server, &described).await?);
            let unidentified = Self::unidentified(&described);
            let toasted: Vec<String> = described
                .iter()
                .filter(|table| table.identity != ReplicaIdentity::Full && !table.toasted.is_empty())
                .map(|table| table.schema.name.to_string())
                .collect();
            if !toasted.is_empty() {
                items.push(CheckItem {
                    what: "source large values".into(),
                    ok: true,
                    detail: format!(
                        "{} may store values out of line, which an UPDATE that leaves them unchanged does not send without REPLICA IDENTITY FULL: PostgreSQL and MySQL targets keep their own value (the row is updated in place); an event or Delta target stops the stream",
                        toasted.join(", ")
                    ),
                });
            }
            items.push(CheckItem {
                what: "source replica identity".into(),
                ok: unidentified.is_empty(),
                detail: if unidentified.is_empty() {
                    "every table's updates and deletes name their rows".into()
                } else {
                    format!(
                        "these tables' updates and deletes cannot be identified in the stream; run: {}",
                        unidentified.join(" ")
                    )
                },
            });
        }
        Ok(items)
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        let client = self.connection().await?;
        let described = self.describe_selected(&client).await?;
        if self.mode.streams() {
            let unidentified = Self::unidentified(&described);
            if !unidentified.is_empty() {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "{} table(s) have no primary key and no replica identity that names their rows in the change stream",
                        unidentified.len()
                    ),
                )
                .on(Side::Source)
                .hint(format!("give them one: {}", unidentified.join(" "))));
            }
        }
        let schemas = described.iter().map(|table| table.schema.clone()).collect();
        let mut kept = self.described.lock().await;
        for table in described {
            kept.insert(table.schema.name.clone(), table);
        }
        Ok(schemas)
    }

    async fn forget(&self) -> Result<()> {
        if !self.mode.streams() {
            return Ok(());
        }
        if let Some(export) = self.export.lock().await.take() {
            drop(export.session);
        }
        self.replication.forget(&self.connection().await?, &self.server).await
    }

    sluice_core::capabilities!(snapshot: SnapshotSource, changes: ChangeSource, cursor: CursorSource);
}

#[async_trait]
impl SnapshotSource for PostgresSource {
    async fn split(&self, table: &Arc<TableSchema>, hint: SplitHint) -> Result<Vec<Split>> {
        let client = self.connection().await?;
        let estimated = match self.described.lock().await.get(&table.name) {
            Some(described) => described.estimated_rows,
            None => catalog::describe(&client, &table.name, &self.server).await?.estimated_rows,
        };
        let snapshot = self.export.lock().await.as_ref().map(|export| export.snapshot.clone());
        if table.primary_key.is_empty() {
            let parts = self.parts_of_keyless(&client, estimated, hint).await?;
            let range = KeyRange { after: None, through: None, keys: None, snapshot, parts };
            return Ok(vec![Split::new(split_task(&table.name, 0), table.clone(), &range, estimated).read_whole()]);
        }
        let integer_key = table.primary_key.len() == 1
            && matches!(table.columns[table.primary_key[0]].data_type, DataType::Integer { .. });
        let bounds = if estimated <= hint.rows_per_split.saturating_mul(3) / 2 {
            vec![(None, None)]
        } else if integer_key {
            self.integer_bounds(&client, table, estimated, hint).await?
        } else {
            self.sampled_bounds(&client, table, estimated, hint).await?
        };
        let count = bounds.len() as u64;
        Ok(bounds
            .into_iter()
            .enumerate()
            .map(|(index, (after, through))| {
                let range = KeyRange { after, through, keys: None, snapshot: snapshot.clone(), parts: None };
                Split::new(split_task(&table.name, index), table.clone(), &range, estimated / count)
            })
            .collect())
    }

    async fn open(&self, split: &Split, resume_after: Option<&Position>, batch_rows: usize) -> Result<Box<dyn Reader>> {
        Ok(Box::new(self.reader(split, resume_after, batch_rows).await?))
    }

    /// COPY text as the server writes it, for a PostgreSQL target: unless a column's text form
    /// follows the server's locale (`money`: `lc_monetary`), which another server may read
    /// otherwise. The session's other settings that shape text forms are the same on both sides
    /// (`super::connect`).
    async fn open_encoded(
        &self,
        split: &Split,
        resume_after: Option<&Position>,
        batch_rows: usize,
        encoding: RowEncoding,
    ) -> Result<Option<Box<dyn Reader>>> {
        let by_locale = split.table.columns.iter().any(|column| column.native_type.starts_with("money"));
        if encoding != RowEncoding::PostgresCopyText || by_locale {
            return Ok(None);
        }
        Ok(Some(Box::new(self.reader(split, resume_after, batch_rows).await?.encoded())))
    }

    fn copy_reads(&self, split: &Split, copied: Option<&Position>) -> Result<Vec<CopyRead>> {
        if split.whole {
            return Ok(Vec::new());
        }
        let Some(copied) = copied else {
            let range: KeyRange = split.read_descriptor()?;
            return Ok(vec![CopyRead { after: Self::key_values(&split.table, range.after.as_ref())?, as_of: None }]);
        };
        copied
            .read::<KeyPosition>(&split.id)?
            .reads
            .into_iter()
            .map(|read| {
                Ok(CopyRead {
                    after: Self::key_values(&split.table, read.after.as_ref())?,
                    as_of: Some(Position::of(&WalPosition { lsn: read.lsn })),
                })
            })
            .collect()
    }

    fn key_split(&self, table: &Arc<TableSchema>, keys: &[Row]) -> Result<Split> {
        if table.primary_key.is_empty() {
            return Err(sluice_core::connector::no_key_to_read_by(&table.name));
        }
        let tuples = keys
            .iter()
            .map(|key| key.iter().map(|value| values::text_form(value).unwrap_or_default()).collect())
            .collect();
        let range = KeyRange { after: None, through: None, keys: Some(tuples), snapshot: None, parts: None };
        Ok(Split::new(split_task(&table.name, "keys"), table.clone(), &range, keys.len() as u64))
    }
}

#[async_trait]
impl ChangeSource for PostgresSource {
    /// The job's slot and publication made (or the user's checked), then the position the
    /// stream starts from: a slot created now gives its own, where the snapshot it exports
    /// stands; an existing one the WAL's insert position now (the copy is read after it).
    async fn start_log(&self) -> Result<Option<Position>> {
        if !self.mode.streams() {
            return Ok(None);
        }
        let client = self.connection().await?;
        let described = self.describe_selected(&client).await?;
        let tables: Vec<TableName> = described.iter().map(|table| table.schema.name.clone()).collect();
        let schemas = self.filter.whole_namespaces();
        match self.replication.prepare(&self.url, &client, &self.server, &tables, schemas).await? {
            Some(export) => {
                let lsn = export.snapshot.lsn.clone();
                *self.export.lock().await = Some(export);
                Ok(Some(Position::of(&WalPosition { lsn })))
            }
            None => self.log_position().await,
        }
    }

    /// The WAL's insert position now: past every transaction a snapshot taken before sees. The
    /// job's tables are published first, so a stream that must cover them from here does (a
    /// table added to a running job).
    async fn log_position(&self) -> Result<Option<Position>> {
        if !self.mode.streams() {
            return Ok(None);
        }
        let client = self.connection().await?;
        let tables = self.filter.select(catalog::table_names(&client, &self.server).await?)?;
        self.replication.publish(&client, &self.server, &tables, self.filter.whole_namespaces()).await?;
        let row = client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .map_err(self.error("read the WAL position"))?;
        Ok(Some(Position::of(&WalPosition { lsn: row.get(0) })))
    }

    /// The WAL past the stream's checkpoint, and how much more the server keeps for the slot
    /// before `max_slot_wal_keep_size` lets it go (unlimited when that is unset), in WAL
    /// segments.
    async fn held_log(&self) -> Result<Option<u64>> {
        let client = self.connection().await?;
        self.replication.held_bytes(&client, &self.server).await
    }

    async fn log_backlog(&self, position: &Position) -> Result<Option<LogBacklog>> {
        let Some(at) = position_lsn(position) else { return Ok(None) };
        let client = self.connection().await?;
        let row = client
            .query_one(
                "SELECT pg_current_wal_lsn()::text, current_setting('wal_segment_size')::text, \
                 (SELECT safe_wal_size FROM pg_replication_slots WHERE slot_name = $1)",
                &[&self.replication.slot],
            )
            .await
            .map_err(self.error("read the WAL position"))?;
        let current = parse_lsn(row.get(0)).unwrap_or(at);
        let segment = parse_size(row.get(1)).unwrap_or(16 << 20).max(1);
        let safe: Option<i64> = row.get(2);
        let bytes_behind = current.saturating_sub(at);
        Ok(Some(LogBacklog {
            files_behind: bytes_behind.div_ceil(segment),
            bytes_behind,
            files_to_spare: safe.map_or(u64::MAX, |safe| safe.max(0) as u64 / segment),
        }))
    }

    fn stop_position(&self) -> Option<Position> {
        match &self.stop_position {
            Some(LogMark::Position(position)) => Some(position.clone()),
            _ => None,
        }
    }

    fn reached(&self, position: &Position, mark: &Position) -> bool {
        match (position_lsn(position), position_lsn(mark)) {
            (Some(position), Some(mark)) => position >= mark,
            _ => false,
        }
    }

    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
        let Some(after) = position_lsn(after) else {
            return Err(Error::new(ErrorKind::State, format!("{} is not a PostgreSQL WAL position", after.brief()))
                .on(Side::State)
                .hint("reset the job: its checkpoint was written by another source"));
        };
        // The copy is read: the exported snapshot may go.
        if let Some(export) = self.export.lock().await.take() {
            if let Err(error) = export.session.close().await {
                log::debug!("closing the session that exported the slot's snapshot: {error}");
            }
        }
        let client = self.connection().await?;
        self.replication.verify(&client, &self.server, after).await?;
        let stream = stream::WalChangeStream::open(self, client, after).await?;
        Ok(Box::new(stream))
    }
}

#[async_trait]
impl CursorSource for PostgresSource {
    /// From `mark` (lowered by the lookback, by the server, in the column's own type) through
    /// the column's highest value now; values are the server's text forms.
    async fn cursor_window(
        &self,
        table: &TableSchema,
        spec: &CursorSpec,
        mark: Option<&serde_json::Value>,
    ) -> Result<CursorWindow> {
        let column = cursor::column(table, spec)?;
        let doing = format!("read the highest {} of table {}", spec.column, table.name);
        let client = self.connection().await?;
        let highest = client
            .query_one(
                &format!(
                    "SELECT max(row.{})::text FROM {} AS row",
                    quote(&column.name),
                    catalog::qualified(&table.name)
                ),
                &[],
            )
            .await
            .map_err(self.error(&doing))?;
        let through: Option<String> = highest.get(0);
        let after = match mark {
            Some(mark) if spec.lookback_secs > 0 => {
                let sql = format!("SELECT ($1::text{} - make_interval(secs => $2::float8))::text", cast(column));
                let lowered = client
                    .query_one(&sql, &[&json_text(mark), &(spec.lookback_secs as f64)])
                    .await
                    .map_err(self.error(&doing))?;
                lowered.get::<_, Option<String>>(0).map(serde_json::Value::String)
            }
            _ => mark.cloned(),
        };
        Ok(CursorWindow {
            column: column.name.clone(),
            through: through.map(serde_json::Value::String).or_else(|| mark.cloned()),
            after,
            mark: mark.cloned(),
            rerun: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wal_positions_and_sizes_read_as_postgresql_prints_them() {
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("16"), None);
        assert_eq!(parse_size("16MB"), Some(16 << 20));
        assert_eq!(parse_size("8kB"), Some(8 << 10));
        assert_eq!(parse_size("1GB"), Some(1 << 30));
        assert_eq!(parse_size("-1"), None);
    }
}
