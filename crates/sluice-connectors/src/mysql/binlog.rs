//! The MySQL/MariaDB change stream: the binlog read as a replica, cut into whole transactions.
//!
//! - Row events are decoded with the table map that precedes them, which carries the table's
//!   schema at that point of the log (`binlog_row_metadata=FULL`: names, signedness, charsets,
//!   ENUM/SET members, primary key). The schema used is therefore the one valid at the event's
//!   position, whatever the table looks like now.
//! - Positions (file and offset) are only ever given after a commit (XID or COMMIT), a DDL
//!   statement, or between transactions (rotation, heartbeat), so a resume starts at a
//!   transaction boundary.
//! - Nothing is skipped silently: an event this reader does not understand stops the stream,
//!   unless the server marks it ignorable. Compressed events (`log_bin_compress`) are refused.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use mysql_async::binlog::events::{EventData, OptionalMetadataField, RowsEventData, TableMapEvent};
use mysql_async::binlog::row::BinlogRow;
use mysql_async::binlog::value::BinlogValue;
use mysql_async::consts::ColumnType as Wire;
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, OptsBuilder};
use serde_json::json;
use sluice_core::change::{Change, ChangeKind, Position, Row};
use sluice_core::connector::{ChangeStream, SourceSchemaChange, StreamEvent};
use sluice_core::filter::TableFilter;
use sluice_core::{Column, DataType, Date, DateTime, Error, ErrorKind, Result, Side, TableName, TableSchema, Value};

use super::gtid::{uuid, GtidSet};
use super::{decode, mysql_error};

/// How often the server sends a heartbeat on an idle stream; three missed ones mean the
/// connection is dead even if TCP has not noticed.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// MariaDB's event types that this reader handles by number (the driver does not know them).
const MARIADB_ANNOTATE_ROWS: u8 = 160;
const MARIADB_BINLOG_CHECKPOINT: u8 = 161;
const MARIADB_GTID: u8 = 162;
const MARIADB_GTID_LIST: u8 = 163;
const MARIADB_START_ENCRYPTION: u8 = 164;
/// Compressed query and row events (`log_bin_compress=ON`).
const MARIADB_COMPRESSED: std::ops::RangeInclusive<u8> = 165..=171;
/// The header flag of events a reader may skip (`LOG_EVENT_IGNORABLE_F`).
const IGNORABLE_FLAG: u16 = 0x80;

/// A binlog position: file and the offset of the next event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPosition {
    pub file: String,
    pub offset: u64,
}

impl LogPosition {
    /// Reads the `file` and `position` fields of a MySQL source position.
    pub fn from_position(position: &Position) -> Result<LogPosition> {
        let file = position.0.get("file").and_then(serde_json::Value::as_str);
        let offset = position.0.get("position").and_then(serde_json::Value::as_u64);
        match (file, offset) {
            (Some(file), Some(offset)) => Ok(LogPosition { file: file.to_owned(), offset }),
            _ => Err(Error::new(
                ErrorKind::Config,
                format!("position {} has no binlog `file` and `position`", position.0),
            )
            .on(Side::Source)
            .hint("give a position as {file: mysql-bin.000003, position: 4}")),
        }
    }

    /// Orders positions of one server: by the file's sequence number, then the offset.
    pub fn key(&self) -> (u64, &str, u64) {
        let sequence = self.file.rsplit('.').next().and_then(|suffix| suffix.parse().ok()).unwrap_or(0);
        (sequence, &self.file, self.offset)
    }
}

/// How a column's bytes are text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Charset {
    Utf8,
    /// MySQL's latin1, which is Windows-1252 with the five holes mapped to C1 controls.
    Latin1,
    Binary,
}

/// A selected table as its latest table map describes it.
#[derive(Debug)]
struct MappedTable {
    map: TableMapEvent<'static>,
    schema: Arc<TableSchema>,
    charsets: Vec<Charset>,
}

/// The stream of one job. Built by `MysqlSource::stream`.
pub struct BinlogChangeStream {
    events: BinlogStream,
    server: String,
    filter: TableFilter,
    batch_rows: usize,
    mariadb: bool,
    /// Collation id → character set name, from the server.
    collations: HashMap<u16, String>,
    /// Collation id → its name.
    collation_names: HashMap<u16, String>,
    file: String,
    /// The offset in `file` after the last whole transaction (or rotation): where a heartbeat
    /// says the stream stands.
    offset: u64,
    /// The server the binlog is read from (MariaDB's `server_id`, MySQL's `server_uuid`):
    /// file and offset mean something on it alone.
    identity: String,
    /// The server's binlog files when the stream started by GTID, to name the first file.
    files: Vec<String>,
    /// Bytes of checksum the driver leaves on the name of the fake rotation that starts a stream
    /// (it comes before the format description that says there are checksums).
    rotate_checksum: usize,
    /// MariaDB's GTID state: domain → `domain-server-sequence`, as `gtid_binlog_pos` shows it.
    gtids: std::collections::BTreeMap<u32, String>,
    /// MySQL's executed GTID set, kept exact (gaps included).
    gtid_set: GtidSet,
    /// The GTID of MySQL's open transaction.
    mysql_gtid: Option<(String, u64)>,
    tables: HashMap<u64, Option<MappedTable>>,
    /// Inside a transaction (after GTID or BEGIN, before its commit).
    in_transaction: bool,
    /// The GTID of the open transaction.
    gtid: Option<(u32, String)>,
    /// The open transaction has changes for this job.
    relevant: bool,
    changes: Vec<Change>,
    /// The effects of the DDL statement being committed, with its text.
    ddl: Option<(String, Vec<SourceSchemaChange>)>,
    ready: VecDeque<StreamEvent>,
    /// The stream ends before the first transaction dated at or after this (seconds since the
    /// epoch; `source.stop_position: {time: …}`).
    stop_time: Option<u64>,
    /// The stream reached `stop_time`: it reads on, but hands on nothing more.
    ended: bool,
    /// `two_way`: the transactions Sluice wrote (`super::writes`) are passed over as echoes.
    two_way: bool,
    /// The open transaction is one Sluice wrote, to be passed over.
    echo: bool,
}

impl BinlogChangeStream {
    /// Connects as a replica and asks for the binlog after `after`. A file the server no longer
    /// has is refused here, before streaming, with `ErrorKind::PositionLost`. The binlog settings
    /// are the caller's to check first (`MysqlSource::check_binlog`).
    ///
    /// A position read from another server (the source failed over to a replica, or the job
    /// points at a new primary) resumes after its GTIDs: MariaDB's `@slave_connect_state`,
    /// MySQL's `COM_BINLOG_DUMP_GTID`. Without GTIDs it is refused as lost: a file and offset
    /// mean nothing on another server.
    pub async fn open(
        opts: Opts,
        server: String,
        filter: TableFilter,
        after: &Position,
        server_id: u32,
        batch_rows: usize,
        stop_time: Option<u64>,
    ) -> Result<BinlogChangeStream> {
        let start = LogPosition::from_position(after)?;
        let server_name = server.clone();
        let error = move |doing: &'static str| {
            let server = server_name.clone();
            move |error| mysql_error(error, Side::Source, &server, doing)
        };
        let mut connection = Conn::new(OptsBuilder::from_opts(opts).prefer_socket(false))
            .await
            .map_err(error("connect for the binlog"))?;
        let mariadb = super::flavor(&mut connection, Side::Source, &server).await? == "mariadb";
        let files: Vec<mysql_async::Row> = connection.query("SHOW BINARY LOGS").await.map_err(|error| {
            mysql_error(error, Side::Source, &server, "list the binary logs")
                .hint("grant REPLICATION CLIENT (BINLOG MONITOR on MariaDB)")
        })?;
        let files: Vec<String> = files.iter().filter_map(|row| row.get::<String, _>(0)).collect();
        let identity = server_identity(&mut connection, mariadb, &server).await?;
        let gtid = after.0.get("gtid").and_then(serde_json::Value::as_str).unwrap_or_default().trim().to_owned();
        let elsewhere = after
            .0
            .get("server")
            .and_then(serde_json::Value::as_str)
            .filter(|read_on| *read_on != identity)
            .map(str::to_owned);
        let by_gtid = match &elsewhere {
            None => None,
            Some(read_on) => {
                Some(gtid_start(&mut connection, mariadb, &server, &identity, read_on, &start, &gtid).await?)
            }
        };
        if by_gtid.is_none() && !files.contains(&start.file) {
            return Err(position_lost(&start, &format!("the server's binary logs are {}", files.join(", "))));
        }
        let collations: Vec<(u16, String, String)> = connection
            .query("SELECT ID, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLLATIONS WHERE ID IS NOT NULL AND CHARACTER_SET_NAME IS NOT NULL")
            .await
            .map_err(error("read the collations"))?;
        let heartbeat_ns = HEARTBEAT.as_nanos().to_string();
        let mut setup = vec![format!("SET @master_heartbeat_period = {heartbeat_ns}")];
        if mariadb {
            // GTID events as they are, instead of rewritten as BEGIN.
            setup.push("SET @mariadb_slave_capability = 4".to_owned());
            if by_gtid.is_some() {
                // The server starts after these GTIDs, whatever file and offset are asked for.
                setup.push(format!("SET @slave_connect_state = '{gtid}'"));
            }
        }
        for statement in setup {
            connection.query_drop(statement).await.map_err(error("set up the replica session"))?;
        }
        let rotate_checksum = match by_gtid {
            Some(_) => {
                let checksum: Option<String> = connection
                    .query_first("SELECT @@GLOBAL.binlog_checksum")
                    .await
                    .map_err(error("read binlog_checksum"))?;
                if checksum.is_some_and(|checksum| checksum.eq_ignore_ascii_case("NONE")) {
                    0
                } else {
                    4
                }
            }
            None => 0,
        };
        let request = match &by_gtid {
            None => BinlogStreamRequest::new(server_id).with_filename(start.file.as_bytes()).with_pos(start.offset),
            Some(GtidStart::MariaDb) => BinlogStreamRequest::new(server_id).with_filename(b"").with_pos(4),
            Some(GtidStart::MySql(set)) => BinlogStreamRequest::new(server_id)
                .with_gtid()
                .with_filename(b"")
                .with_pos(4)
                .with_gtid_set(set.clone()),
        };
        let events = connection.get_binlog_stream(request).await.map_err(error("request the binlog"))?;
        let gtids = after
            .0
            .get("gtid")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .split(',')
            .filter_map(|gtid| {
                let gtid = gtid.trim();
                let domain = gtid.split('-').next()?.parse().ok()?;
                Some((domain, gtid.to_owned()))
            })
            .collect();
        Ok(BinlogChangeStream {
            events,
            server,
            filter,
            batch_rows: batch_rows.max(1),
            mariadb,
            collation_names: collations.iter().map(|(id, _, name)| (*id, name.clone())).collect(),
            collations: collations.into_iter().map(|(id, charset, _)| (id, charset)).collect(),
            offset: if by_gtid.is_some() { 4 } else { start.offset },
            file: if by_gtid.is_some() { String::new() } else { start.file },
            identity,
            files: if by_gtid.is_some() { files } else { Vec::new() },
            rotate_checksum,
            gtid_set: if mariadb {
                GtidSet::default()
            } else {
                GtidSet::parse(after.0.get("gtid").and_then(serde_json::Value::as_str).unwrap_or_default())
                    .unwrap_or_default()
            },
            mysql_gtid: None,
            gtids: if mariadb { gtids } else { Default::default() },
            tables: HashMap::new(),
            in_transaction: false,
            gtid: None,
            relevant: false,
            changes: Vec::new(),
            ddl: None,
            ready: VecDeque::new(),
            stop_time,
            ended: false,
            two_way: false,
            echo: false,
        })
    }

    /// Passes over the transactions Sluice wrote into this server (a `two_way` job).
    pub fn passing_over_own_writes(mut self, two_way: bool) -> BinlogChangeStream {
        self.two_way = two_way;
        self
    }

    /// A transaction begins with an event dated `at`. At or past the stream's stop time, the
    /// stream ends before it, where the last one ended (returns true).
    fn reaches_stop(&mut self, at: u64) -> bool {
        if self.in_transaction || self.stop_time.is_none_or(|stop| at < stop) {
            return false;
        }
        self.ended = true;
        let position = self.position(self.offset);
        self.ready.push_back(StreamEvent::End { position, committed_at: at });
        true
    }

    fn position(&self, offset: u64) -> Position {
        let gtid = if self.mariadb {
            self.gtids.values().map(String::as_str).collect::<Vec<_>>().join(",")
        } else {
            self.gtid_set.to_string()
        };
        Position(json!({
            "flavor": if self.mariadb { "mariadb" } else { "mysql" },
            "gtid": gtid,
            "file": self.file,
            "position": offset,
            "server": self.identity,
        }))
    }

    fn read_error(&self, message: String) -> Error {
        Error::new(ErrorKind::Read, format!("binlog of {} at {}: {message}", self.server, self.file)).on(Side::Source)
    }

    /// Ends the open transaction at `offset`: its changes and a `Commit`, or an `Advance` when
    /// it had nothing for this job.
    fn commit(&mut self, offset: u64, committed_at: u64) {
        if let Some((domain, gtid)) = self.gtid.take() {
            self.gtids.insert(domain, gtid);
        }
        if let Some((server, number)) = self.mysql_gtid.take() {
            self.gtid_set.add(&server, number);
        }
        self.offset = offset;
        let position = self.position(offset);
        if std::mem::take(&mut self.echo) {
            self.changes.clear();
            self.ddl = None;
            self.ready.push_back(StreamEvent::Echo { position, committed_at });
        } else if let Some((statement, changes)) = self.ddl.take() {
            self.ready.push_back(StreamEvent::SchemaChange { statement, changes, position, committed_at });
        } else if self.relevant {
            if !self.changes.is_empty() {
                self.ready.push_back(StreamEvent::Changes(std::mem::take(&mut self.changes)));
            }
            self.ready.push_back(StreamEvent::Commit { position, committed_at });
        } else {
            self.ready.push_back(StreamEvent::Advance { position, committed_at });
        }
        self.in_transaction = false;
        self.relevant = false;
    }

    /// Handles one event; whatever it completes lands in `ready`.
    fn handle(&mut self, event: mysql_async::binlog::events::Event) -> Result<()> {
        let header = event.header();
        let kind = header.event_type_raw();
        let offset = u64::from(header.log_pos());
        let committed_at = u64::from(header.timestamp());
        if self.ended {
            return Ok(());
        }
        if MARIADB_COMPRESSED.contains(&kind) {
            return Err(self.read_error(format!("event type {kind} at {offset} is compressed (log_bin_compress=ON), which this reader does not inflate"))
                .hint("SET GLOBAL log_bin_compress = OFF on the source; the compressed events already written cannot be streamed"));
        }
        match kind {
            MARIADB_GTID => {
                let data = event.data();
                if data.len() < 13 {
                    return Err(self.read_error(format!("a GTID event at {offset} is truncated")));
                }
                let sequence = u64::from_le_bytes(data[0..8].try_into().expect("8 bytes"));
                let domain = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
                // A standalone GTID announces one statement (DDL); otherwise it stands for BEGIN.
                let standalone = data[12] & 1 != 0;
                if self.reaches_stop(committed_at) {
                    return Ok(());
                }
                self.in_transaction = !standalone;
                self.gtid = Some((domain, format!("{domain}-{}-{sequence}", header.server_id())));
                return Ok(());
            }
            MARIADB_ANNOTATE_ROWS | MARIADB_BINLOG_CHECKPOINT | MARIADB_GTID_LIST | MARIADB_START_ENCRYPTION => {
                return Ok(())
            }
            _ => {}
        }
        let data = event.read_data().map_err(|error| self.read_error(format!("event at {offset}: {error}")))?;
        let Some(data) = data else {
            if header.flags_raw() & IGNORABLE_FLAG != 0 {
                return Ok(());
            }
            return Err(self
                .read_error(format!("event type {kind} at {offset} is unknown to this reader; refusing to skip it")));
        };
        match data {
            EventData::RotateEvent(rotate) => {
                // The stream starts with a fake rotation (offset 0) that only names the file. It
                // comes before the format description, so the driver leaves its checksum on the
                // name: keep the file asked for, which it names.
                let fake = header.log_pos() == 0;
                let name = rotate.name();
                if fake && self.file.is_empty() {
                    // Started by GTID: the file is the server's that the name begins with, or,
                    // for one made since the files were listed, the name without its checksum.
                    let known =
                        self.files.iter().filter(|file| name.starts_with(file.as_str())).max_by_key(|file| file.len());
                    self.file = match known {
                        Some(file) => file.clone(),
                        None => {
                            let raw = rotate.name_raw();
                            String::from_utf8_lossy(&raw[..raw.len().saturating_sub(self.rotate_checksum)]).into_owned()
                        }
                    };
                } else if !(fake && name.starts_with(self.file.as_str())) {
                    self.file = name.into_owned();
                }
                if !self.in_transaction && !fake {
                    self.offset = rotate.position();
                    let position = self.position(rotate.position());
                    self.ready.push_back(StreamEvent::Advance { position, committed_at });
                }
            }
            EventData::HeartbeatEvent => {
                if !self.in_transaction {
                    // The server's own position in the file (the end of the last event it sent):
                    // past the events that are no transaction (a new file's format description
                    // and GTID list), so an idle stream still reaches a position read from SHOW
                    // MASTER STATUS, which closes a snapshot's replay window.
                    self.offset = self.offset.max(u64::from(header.log_pos()));
                    let position = self.position(self.offset);
                    self.ready.push_back(StreamEvent::Advance { position, committed_at: 0 });
                }
            }
            EventData::XidEvent(_) => self.commit(offset, committed_at),
            EventData::QueryEvent(query) => {
                let statement = query.query();
                let keyword = statement.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
                let begins = keyword != "COMMIT" && keyword != "ROLLBACK";
                if begins && self.gtid.is_none() && self.mysql_gtid.is_none() && self.reaches_stop(committed_at) {
                    return Ok(());
                }
                match keyword.as_str() {
                    "BEGIN" => self.in_transaction = true,
                    // A transaction on non-transactional tables that "rolled back" kept its rows.
                    "COMMIT" | "ROLLBACK" if statement.trim().len() <= 8 => self.commit(offset, committed_at),
                    "SAVEPOINT" | "ROLLBACK" | "RELEASE" if self.in_transaction => {}
                    "XA" => {
                        return Err(self
                            .read_error(format!("XA transaction at {offset} (`{statement}`) is not supported"))
                            .hint("exclude the tables written by XA transactions"))
                    }
                    _ => {
                        let schema = query.schema().into_owned();
                        self.statement(&schema, &statement, offset)?;
                        // DDL outside BEGIN is a transaction of its own (and commits implicitly).
                        if !self.in_transaction {
                            self.commit(offset, committed_at);
                        }
                    }
                }
            }
            EventData::TableMapEvent(map) => self.map_table(map.into_owned())?,
            EventData::RowsEvent(rows) => self.rows(&rows, offset)?,
            EventData::FormatDescriptionEvent(_)
            | EventData::PreviousGtidsEvent(_)
            | EventData::RowsQueryEvent(_)
            | EventData::IntvarEvent(_)
            | EventData::RandEvent(_)
            | EventData::UserVarEvent(_)
            | EventData::TransactionPayloadEvent(_)
            | EventData::IgnorableEvent(_)
            | EventData::StopEvent => {}
            // MySQL announces each transaction with a GTID, then BEGIN (DML) or the statement
            // (DDL); the set grows at the commit. The stream resumes from the file position.
            EventData::GtidEvent(gtid) => {
                if !self.reaches_stop(committed_at) {
                    self.mysql_gtid = Some((uuid(gtid.sid()), gtid.gno()));
                }
            }
            EventData::AnonymousGtidEvent(_) => {
                self.reaches_stop(committed_at);
            }
            other => {
                if header.flags_raw() & IGNORABLE_FLAG == 0 {
                    let name = format!("{other:?}");
                    let name = name.split('(').next().unwrap_or("an event").to_owned();
                    return Err(self.read_error(format!("{name} at {offset} is not supported; refusing to skip it")));
                }
            }
        }
        Ok(())
    }

    /// A statement other than BEGIN/COMMIT: DDL. On selected tables its effects wait in
    /// `ddl` for the commit that ends the statement's transaction; on other tables it only moves
    /// the position. DDL this stream cannot carry stops it, naming the statement.
    fn statement(&mut self, schema: &str, statement: &str, offset: u64) -> Result<()> {
        if self.two_way && super::writes::is_marked(statement) {
            self.echo = true;
            return Ok(());
        }
        let touched = super::ddl::tables_named(statement, schema);
        let Some(table) = touched.iter().find(|table| self.filter.matches(table)).cloned() else {
            return Ok(());
        };
        let unsupported = |reason: &str| {
            Error::new(
                ErrorKind::Schema,
                format!("unsupported DDL on {table} at {}:{offset}: `{statement}`: {reason}", self.file),
            )
            .on(Side::Source)
            .hint(format!(
                "carry the change to the target by hand, then continue with a cdc job whose source.start_position is {{file: {}, position: {offset}}}; or exclude the table from source.tables",
                self.file
            ))
        };
        if self.in_transaction {
            return Err(unsupported("DDL inside a transaction (CREATE TABLE ... SELECT?) is not supported"));
        }
        let mut kept = Vec::new();
        for change in super::ddl::parse(statement, schema).map_err(|reason| unsupported(&reason))? {
            let selected = match &change {
                SourceSchemaChange::Rename { from, to } => match (self.filter.matches(from), self.filter.matches(to)) {
                    (true, true) => true,
                    (false, false) => false,
                    _ => return Err(unsupported("it renames a table into or out of source.tables")),
                },
                SourceSchemaChange::Create(table)
                | SourceSchemaChange::Drop(table)
                | SourceSchemaChange::Truncate(table)
                | SourceSchemaChange::Alter { table, .. } => self.filter.matches(table),
            };
            if selected {
                kept.push(change);
            }
        }
        if !kept.is_empty() {
            self.ddl = Some((statement.to_owned(), kept));
        }
        Ok(())
    }

    fn map_table(&mut self, map: TableMapEvent<'static>) -> Result<()> {
        let name = TableName::new(Some(&map.database_name()), &map.table_name());
        if self.two_way && self.in_transaction && super::writes::is_writes_table(&name) {
            self.echo = true;
        }
        let table_id = map.table_id();
        if !self.filter.matches(&name) {
            self.tables.insert(table_id, None);
            return Ok(());
        }
        if let Some(Some(known)) = self.tables.get(&table_id) {
            if known.map == map {
                return Ok(());
            }
        }
        let (schema, charsets) = self.describe(&name, &map)?;
        self.tables.insert(table_id, Some(MappedTable { map, schema: Arc::new(schema), charsets }));
        Ok(())
    }

    /// The table's schema as the table map states it.
    fn describe(&self, name: &TableName, map: &TableMapEvent<'static>) -> Result<(TableSchema, Vec<Charset>)> {
        let count = map.columns_count() as usize;
        let mut names = Vec::new();
        let mut unsigned = Vec::new();
        let mut charsets = Vec::new();
        let mut primary_key = Vec::new();
        let mut enums: VecDeque<Vec<String>> = VecDeque::new();
        let mut sets: VecDeque<Vec<String>> = VecDeque::new();
        let bad = |what: &str| self.read_error(format!("table map of {name}: {what}"));
        let extractor = mysql_async::binlog::events::OptionalMetaExtractor::new(map.iter_optional_meta())
            .map_err(|error| bad(&error.to_string()))?;
        for column in extractor.iter_column_name() {
            names.push(column.map_err(|error| bad(&error.to_string()))?.name().into_owned());
        }
        unsigned.extend(extractor.iter_signedness());
        let mut charset_iterator = extractor.iter_charset();
        let mut enum_charset_iterator = extractor.iter_enum_and_set_charset();
        for index in extractor.iter_primary_key() {
            primary_key.push(index.map_err(|error| bad(&error.to_string()))? as usize);
        }
        for field in map.iter_optional_meta() {
            match field.map_err(|error| bad(&error.to_string()))? {
                OptionalMetadataField::EnumStrValue(values) => {
                    for members in values.iter_values() {
                        let members = members.map_err(|error| bad(&error.to_string()))?;
                        enums.push_back(members.values().iter().map(|value| value.value().into_owned()).collect());
                    }
                }
                OptionalMetadataField::SetStrValue(values) => {
                    for members in values.iter_values() {
                        let members = members.map_err(|error| bad(&error.to_string()))?;
                        sets.push_back(members.values().iter().map(|value| value.value().into_owned()).collect());
                    }
                }
                _ => {}
            }
        }
        if names.len() != count {
            return Err(bad("it has no column names; the source needs binlog_row_metadata=FULL"));
        }
        let mut columns = Vec::with_capacity(count);
        let mut numeric = unsigned.into_iter();
        for (index, name) in names.into_iter().enumerate() {
            let wire = map
                .get_column_type(index)
                .map_err(|error| bad(&error.to_string()))?
                .ok_or_else(|| bad("a column has no type"))?;
            let metadata = map.get_column_metadata(index).unwrap_or(&[]);
            let is_unsigned = if wire.is_numeric_type() { numeric.next().unwrap_or(false) } else { false };
            let collation = if wire.is_character_type() {
                charset_iterator.next().transpose().map_err(|error| bad(&error.to_string()))?
            } else if wire.is_enum_or_set_type() {
                enum_charset_iterator.next().transpose().map_err(|error| bad(&error.to_string()))?
            } else {
                None
            };
            let charset = match collation {
                None | Some(63) => Charset::Binary,
                Some(id) => match self.collations.get(&id).map(String::as_str) {
                    Some("utf8mb4" | "utf8mb3" | "utf8" | "ascii") => Charset::Utf8,
                    Some("latin1") => Charset::Latin1,
                    Some("binary") => Charset::Binary,
                    other => {
                        return Err(Error::new(
                            ErrorKind::Schema,
                            format!(
                                "column {name} of {name_table}: character set {} is not supported by the change stream",
                                other.unwrap_or("(unknown collation)"),
                                name_table = map.table_name()
                            ),
                        )
                        .on(Side::Source)
                        .hint("convert the column to utf8mb4, or exclude the table"))
                    }
                },
            };
            let byte = |index: usize| u32::from(metadata.get(index).copied().unwrap_or(0));
            // Lengths in the table map are in bytes; a column's type counts characters.
            let bytes_per_character = match collation.and_then(|id| self.collations.get(&id)).map(String::as_str) {
                Some("utf8mb4") => 4,
                Some("utf8mb3" | "utf8") => 3,
                _ => 1,
            };
            let text = |fixed: bool, bytes: Option<u32>| {
                if charset == Charset::Binary {
                    DataType::Bytes { length: bytes, fixed }
                } else {
                    DataType::Text { length: bytes.map(|bytes| bytes / bytes_per_character), fixed }
                }
            };
            // CHAR(n)'s byte length, as the server packs it into two bytes.
            let fixed_length = if byte(0) & 0x30 != 0x30 { byte(1) | ((byte(0) & 0x30) ^ 0x30) << 4 } else { byte(1) };
            let data_type = match wire {
                Wire::MYSQL_TYPE_TINY => DataType::Integer { bytes: 1, unsigned: is_unsigned },
                Wire::MYSQL_TYPE_SHORT => DataType::Integer { bytes: 2, unsigned: is_unsigned },
                Wire::MYSQL_TYPE_INT24 => DataType::Integer { bytes: 3, unsigned: is_unsigned },
                Wire::MYSQL_TYPE_LONG => DataType::Integer { bytes: 4, unsigned: is_unsigned },
                Wire::MYSQL_TYPE_LONGLONG => DataType::Integer { bytes: 8, unsigned: is_unsigned },
                Wire::MYSQL_TYPE_FLOAT => DataType::Float32,
                Wire::MYSQL_TYPE_DOUBLE => DataType::Float64,
                Wire::MYSQL_TYPE_NEWDECIMAL => DataType::Decimal { precision: Some(byte(0)), scale: Some(byte(1)) },
                Wire::MYSQL_TYPE_DATE | Wire::MYSQL_TYPE_NEWDATE => DataType::Date,
                Wire::MYSQL_TYPE_TIME => DataType::Time { precision: 0 },
                Wire::MYSQL_TYPE_TIME2 => DataType::Time { precision: byte(0) as u8 },
                Wire::MYSQL_TYPE_DATETIME => DataType::DateTime { precision: 0 },
                Wire::MYSQL_TYPE_DATETIME2 => DataType::DateTime { precision: byte(0) as u8 },
                Wire::MYSQL_TYPE_TIMESTAMP => DataType::Timestamp { precision: 0 },
                Wire::MYSQL_TYPE_TIMESTAMP2 => DataType::Timestamp { precision: byte(0) as u8 },
                Wire::MYSQL_TYPE_YEAR => DataType::Year,
                Wire::MYSQL_TYPE_BIT => DataType::Bits { width: (byte(1) * 8 + byte(0)).clamp(1, 64) as u8 },
                Wire::MYSQL_TYPE_ENUM => DataType::Enum { values: enums.pop_front().unwrap_or_default() },
                Wire::MYSQL_TYPE_SET => DataType::Set { values: sets.pop_front().unwrap_or_default() },
                // The binlog drops BINARY(n)'s trailing zero bytes; the length restores them.
                Wire::MYSQL_TYPE_STRING => text(true, Some(fixed_length)),
                Wire::MYSQL_TYPE_VARCHAR | Wire::MYSQL_TYPE_VAR_STRING => text(false, Some(byte(0) | byte(1) << 8)),
                Wire::MYSQL_TYPE_BLOB => text(false, None),
                Wire::MYSQL_TYPE_GEOMETRY => DataType::Geometry,
                Wire::MYSQL_TYPE_JSON => DataType::Json,
                other => {
                    return Err(Error::new(
                        ErrorKind::Schema,
                        format!("column {name} of {}: binlog type {other:?} is not supported", map.table_name()),
                    )
                    .on(Side::Source))
                }
            };
            let nullable = map.null_bitmask().get(index).is_some_and(|bit| *bit);
            let collation = match (&data_type, collation) {
                (DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. }, Some(id)) => {
                    self.collation_names.get(&id).cloned()
                }
                _ => None,
            };
            columns.push(Column {
                name,
                data_type,
                nullable,
                native_type: String::new(),
                collation,
                details: Default::default(),
            });
            charsets.push(charset);
        }
        Ok((
            TableSchema { name: name.clone(), columns, primary_key, indexes: Vec::new(), details: Default::default() },
            charsets,
        ))
    }

    fn rows(&mut self, rows: &RowsEventData<'_>, offset: u64) -> Result<()> {
        let table_id = rows.table_id();
        let Some(mapped) = self.tables.get(&table_id) else {
            return Err(self.read_error(format!("a rows event at {offset} has no table map before it")));
        };
        let Some(mapped) = mapped.as_ref().filter(|_| !self.echo) else { return Ok(()) };
        if matches!(rows, RowsEventData::PartialUpdateRowsEvent(_)) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("a partial JSON update of {} at {offset}", mapped.schema.name),
            )
            .on(Side::Source)
            .hint("SET GLOBAL binlog_row_value_options = ''; the change stream needs full row images"));
        }
        let mut decoded = Vec::new();
        for pair in rows.rows(&mapped.map) {
            let (before, after) =
                pair.map_err(|error| self.read_error(format!("rows of {} at {offset}: {error}", mapped.schema.name)))?;
            let image = |row: Option<BinlogRow>| -> Result<Option<Row>> {
                row.map(|row| to_row(row, mapped, &self.server)).transpose()
            };
            let kind = match (image(before)?, image(after)?) {
                (None, Some(after)) => ChangeKind::Insert { after },
                (Some(before), Some(after)) => ChangeKind::Update { before, after },
                (Some(before), None) => ChangeKind::Delete { before },
                (None, None) => continue,
            };
            decoded.push(Change { table: mapped.schema.clone(), kind });
        }
        self.relevant = true;
        for change in decoded {
            self.changes.push(change);
            if self.changes.len() >= self.batch_rows {
                self.ready.push_back(StreamEvent::Changes(std::mem::take(&mut self.changes)));
            }
        }
        Ok(())
    }
}

/// A row image as values in the table's column order; an image that lacks columns (a row image
/// other than FULL) is refused.
fn to_row(mut row: BinlogRow, table: &MappedTable, server: &str) -> Result<Row> {
    let columns = &table.schema.columns;
    if row.len() != columns.len() {
        return Err(Error::new(
            ErrorKind::Config,
            format!("a row image of {} has {} of its {} columns", table.schema.name, row.len(), columns.len()),
        )
        .on(Side::Source)
        .hint(format!("set binlog_row_image = FULL on {server}")));
    }
    let mut values = Vec::with_capacity(columns.len());
    for (index, column) in columns.iter().enumerate() {
        let value = row.take(index).unwrap_or(BinlogValue::Value(mysql_async::Value::NULL));
        let value = to_value(value, &column.data_type, table.charsets[index]).map_err(|reason| {
            Error::new(ErrorKind::Data, format!("column {} of {}: {reason}", column.name, table.schema.name))
                .on(Side::Source)
        })?;
        values.push(value);
    }
    Ok(values)
}

/// Decodes a binlog value as the column's type. The binlog differs from the binary protocol for
/// TIMESTAMP (epoch seconds), YEAR (offset from 1900), ENUM (member index), SET (bit mask), JSON
/// (binary JSON) and text (bytes in the column's charset); the rest shares `decode`.
fn to_value(value: BinlogValue<'_>, data_type: &DataType, charset: Charset) -> std::result::Result<Value, String> {
    use mysql_async::Value as My;
    let value = match value {
        BinlogValue::Value(value) => value,
        BinlogValue::Jsonb(json) => {
            let json = serde_json::Value::try_from(json).map_err(|error| format!("binary JSON: {error}"))?;
            return Ok(Value::Json(json.to_string()));
        }
        BinlogValue::JsonDiff(_) => return Err("a partial JSON update cannot be applied".to_owned()),
    };
    Ok(match (value, data_type) {
        (My::NULL, _) => Value::Null,
        // The driver reads a signed MEDIUMINT without extending its sign bit.
        (My::Int(value), DataType::Integer { bytes: 3, unsigned: false }) if value > 0x7f_ffff => {
            Value::Int(value - 0x100_0000)
        }
        (My::Int(seconds), DataType::Timestamp { .. }) => timestamp(seconds, 0),
        (My::Bytes(bytes), DataType::Timestamp { .. }) => {
            let text = String::from_utf8_lossy(&bytes);
            let (seconds, fraction) = text.split_once('.').unwrap_or((&text, "0"));
            let seconds = seconds.parse().map_err(|_| format!("timestamp `{text}`"))?;
            timestamp(seconds, fraction.parse().map_err(|_| format!("timestamp `{text}`"))?)
        }
        (My::Bytes(bytes), DataType::Year) => {
            let year: i64 = String::from_utf8_lossy(&bytes).parse().map_err(|_| "YEAR is not a number".to_owned())?;
            // YEAR stores 0 as 0 and 1901..=2155 as an offset from 1900.
            Value::Int(if year == 1900 { 0 } else { year })
        }
        (My::Int(index), DataType::Enum { values }) => match index {
            0 => Value::Text(String::new()),
            index => Value::Text(
                values.get(index as usize - 1).cloned().ok_or_else(|| format!("ENUM index {index} out of range"))?,
            ),
        },
        (My::Bytes(bytes), DataType::Set { values }) => {
            let mask = bytes.iter().rev().fold(0u64, |mask, byte| mask << 8 | u64::from(*byte));
            let members: Vec<&str> = values
                .iter()
                .enumerate()
                .filter(|(bit, _)| mask & (1 << bit) != 0)
                .map(|(_, member)| member.as_str())
                .collect();
            Value::Text(members.join(","))
        }
        (My::Bytes(bytes), DataType::Text { .. }) => Value::Text(text(bytes, charset)?),
        (My::Bytes(mut bytes), DataType::Bytes { length: Some(length), fixed: true }) => {
            bytes.resize(bytes.len().max(*length as usize), 0);
            Value::Bytes(bytes)
        }
        (value, data_type) => decode(value, data_type)?,
    })
}

fn text(bytes: Vec<u8>, charset: Charset) -> std::result::Result<String, String> {
    match charset {
        Charset::Latin1 => Ok(bytes.iter().map(|&byte| latin1(byte)).collect()),
        Charset::Utf8 | Charset::Binary => String::from_utf8(bytes).map_err(|_| "text is not valid UTF-8".to_owned()),
    }
}

/// MySQL's latin1 (Windows-1252; the five bytes it leaves undefined map to C1 controls).
fn latin1(byte: u8) -> char {
    const HIGH: [u16; 32] = [
        0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x008D,
        0x017D, 0x008F, 0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A,
        0x0153, 0x009D, 0x017E, 0x0178,
    ];
    match byte {
        0x80..=0x9F => char::from_u32(u32::from(HIGH[usize::from(byte - 0x80)])).expect("valid code points"),
        byte => char::from(byte),
    }
}

/// A TIMESTAMP from epoch seconds, in UTC; 0 is MySQL's zero timestamp.
fn timestamp(seconds: i64, microsecond: u32) -> Value {
    if seconds == 0 && microsecond == 0 {
        let date = Date { year: 0, month: 0, day: 0 };
        return Value::Timestamp(DateTime { date, hour: 0, minute: 0, second: 0, microsecond: 0 });
    }
    let days = seconds.div_euclid(86_400);
    let second_of_day = seconds.rem_euclid(86_400) as u32;
    Value::Timestamp(DateTime {
        date: Date::from_days_since_epoch(days),
        hour: (second_of_day / 3600) as u8,
        minute: (second_of_day / 60 % 60) as u8,
        second: (second_of_day % 60) as u8,
        microsecond,
    })
}

/// How a stream resumes by GTID.
enum GtidStart {
    MariaDb,
    MySql(Vec<mysql_async::Sid<'static>>),
}

/// The identity of the server a binlog is read from: MariaDB's `server_id`, MySQL's
/// `server_uuid`. Positions carry it, so a file and offset are never used on another server.
pub(super) async fn server_identity(connection: &mut Conn, mariadb: bool, server: &str) -> Result<String> {
    let query = if mariadb { "SELECT CAST(@@GLOBAL.server_id AS CHAR)" } else { "SELECT @@GLOBAL.server_uuid" };
    let identity: Option<String> = connection
        .query_first(query)
        .await
        .map_err(|error| mysql_error(error, Side::Source, server, "read the server's identity"))?;
    Ok(identity.unwrap_or_default())
}

/// Checks that a position read on server `read_on` can resume on this one (`identity`) by its
/// GTIDs, and says how.
async fn gtid_start(
    connection: &mut Conn,
    mariadb: bool,
    server: &str,
    identity: &str,
    read_on: &str,
    start: &LogPosition,
    gtid: &str,
) -> Result<GtidStart> {
    let refused = |why: String| {
        Error::new(
            ErrorKind::PositionLost,
            format!(
                "SOURCE_POSITION_LOST: the job's position {} {} was read on server {read_on}, and {server} is server {identity}: {why}",
                start.file, start.offset
            ),
        )
        .on(Side::Source)
        .hint("a binlog file and offset mean nothing on another server, and only GTIDs can follow a failover: turn GTIDs on (MySQL: gtid_mode=ON, enforce_gtid_consistency=ON) before a failover, or point the job back at its server, or copy the tables again with a new snapshot+cdc job")
    };
    if gtid.is_empty() {
        return Err(refused("the position has no GTID".into()));
    }
    let start = if mariadb {
        if super::gtid::mariadb_sequences(gtid).is_none() {
            return Err(refused(format!("its GTID position `{gtid}` is not MariaDB's")));
        }
        GtidStart::MariaDb
    } else {
        let mode: Option<String> = connection
            .query_first("SELECT @@GLOBAL.gtid_mode")
            .await
            .map_err(|error| mysql_error(error, Side::Source, server, "read gtid_mode"))?;
        if !mode.unwrap_or_default().eq_ignore_ascii_case("ON") {
            return Err(refused("this server's gtid_mode is not ON".into()));
        }
        match GtidSet::parse(gtid).and_then(|set| set.sids()) {
            Some(sids) => GtidStart::MySql(sids),
            None => return Err(refused(format!("its GTID set `{gtid}` is not MySQL's"))),
        }
    };
    log::info!(
        "change stream: the source is now server {identity} ({server}), not server {read_on} where the position was read; resuming after GTID {gtid}"
    );
    Ok(start)
}

fn gtid_lost(server: &str, detail: &str) -> Error {
    Error::new(
        ErrorKind::PositionLost,
        format!("SOURCE_POSITION_LOST: {server} cannot stream from the job's GTID position ({detail})"),
    )
    .on(Side::Source)
    .hint("the server lacks transactions the job has, or purged ones it still needs (a replica promoted before it caught up, or binlogs expired): copy the tables again with a new snapshot+cdc job")
}

fn position_lost(start: &LogPosition, detail: &str) -> Error {
    Error::new(
        ErrorKind::PositionLost,
        format!(
            "SOURCE_POSITION_LOST: the source no longer has binlog {} position {} ({detail})",
            start.file, start.offset
        ),
    )
    .on(Side::Source)
    .hint("the binlog was purged past the job's position: the changes in between are gone. Copy the tables again with a new snapshot+cdc job (drop the target tables and the job's rows in sluice.checkpoints), and keep binlogs longer (binlog_expire_logs_seconds)")
}

#[async_trait]
impl ChangeStream for BinlogChangeStream {
    async fn next(&mut self) -> Result<StreamEvent> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(event);
            }
            let event = match tokio::time::timeout(HEARTBEAT * 3, self.events.next()).await {
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "the binlog stream of {} sent nothing for {:?}, not even a heartbeat",
                            self.server,
                            HEARTBEAT * 3
                        ),
                    )
                    .on(Side::Source))
                }
                Ok(None) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("the binlog stream of {} ended", self.server),
                    )
                    .on(Side::Source))
                }
                Ok(Some(Err(mysql_async::Error::Server(server)))) if server.code == 1236 => {
                    if self.file.is_empty() {
                        return Err(gtid_lost(&self.server, &server.message));
                    }
                    let start = LogPosition { file: self.file.clone(), offset: 0 };
                    return Err(position_lost(&start, &server.message));
                }
                Ok(Some(Err(mysql_async::Error::Server(server)))) if server.code == 4052 => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "another binlog reader with this job's server_id connected to {}: {}",
                            self.server, server.message
                        ),
                    )
                    .on(Side::Source)
                    .hint("give each job reading this source its own name or source.server_id"));
                }
                Ok(Some(Err(error))) => {
                    let error = mysql_error(error, Side::Source, &self.server, "read the binlog");
                    // A broken stream is retried from the last durable position.
                    return Err(match error.kind() {
                        ErrorKind::Read | ErrorKind::Connect => {
                            Error::new(ErrorKind::Unavailable, error.message().to_owned()).on(Side::Source)
                        }
                        _ => error,
                    });
                }
                Ok(Some(Ok(event))) => event,
            };
            self.handle(event)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_seconds_become_utc_timestamps() {
        assert_eq!(timestamp(1, 0).to_string(), "1970-01-01 00:00:01Z");
        assert_eq!(timestamp(2_147_483_647, 999_999).to_string(), "2038-01-19 03:14:07.999999Z");
        assert_eq!(timestamp(951_782_400, 0).to_string(), "2000-02-29 00:00:00Z");
        assert_eq!(timestamp(0, 0).to_string(), "0000-00-00 00:00:00Z");
    }

    #[test]
    fn latin1_is_windows_1252_with_mysql_holes() {
        assert_eq!(text(vec![0x80, 0x81, 0xE9, 0x9F], Charset::Latin1).unwrap(), "\u{20AC}\u{81}\u{E9}\u{178}");
    }

    #[test]
    fn positions_order_by_file_sequence_then_offset() {
        let at = |file: &str, offset| LogPosition { file: file.into(), offset };
        assert!(at("bin.000010", 4).key() > at("bin.000009", 900).key());
        assert!(at("bin.000009", 901).key() > at("bin.000009", 900).key());
    }

    #[test]
    fn a_negative_mediumint_keeps_its_sign() {
        let medium = DataType::Integer { bytes: 3, unsigned: false };
        let value = to_value(BinlogValue::Value(mysql_async::Value::Int(0x80_0000)), &medium, Charset::Binary).unwrap();
        assert_eq!(value, Value::Int(-8_388_608));
    }

    #[test]
    fn set_and_enum_values_decode_to_their_members() {
        let set = DataType::Set { values: vec!["a".into(), "b".into(), "c".into()] };
        let value = to_value(BinlogValue::Value(mysql_async::Value::Bytes(vec![0b101])), &set, Charset::Utf8).unwrap();
        assert_eq!(value, Value::Text("a,c".into()));
        let members = DataType::Enum { values: vec!["x".into(), "y".into()] };
        let value = to_value(BinlogValue::Value(mysql_async::Value::Int(2)), &members, Charset::Utf8).unwrap();
        assert_eq!(value, Value::Text("y".into()));
    }
}
