//! Reading MySQL/MariaDB tables: discovery from information_schema, primary-key range splits,
//! and keyset-paginated reads whose bounds the server compares in the key's own collation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Pool, Row};
use serde_json::json;
use sluice_core::change::{Batch, LogMark, Position};
use sluice_core::connector::{
    ChangeSource, ChangeStream, CheckItem, CopyRead, CursorSource, LogBacklog, Reader, SnapshotSource, Source, Split,
    SplitHint,
};
use sluice_core::cursor::{self, CursorWindow};
use sluice_core::filter::TableFilter;
use sluice_core::names::split_task;
use sluice_core::schema::{ColumnDetails, TableDetails};
use sluice_core::secret::Secret;
use sluice_core::spec::CursorSpec;
use sluice_core::spec::Mode;
use sluice_core::{Column, DataType, Error, ErrorKind, Index, Result, Side, TableName, TableSchema, Value};

use super::binlog::{BinlogChangeStream, LogPosition};
use super::decoded::DecodedRows;
use super::gtid::GtidSet;
use super::keyless::{
    no_snapshot_position, not_transactional, snapshot_position, KeylessReader, SNAPSHOT_STATUS, START_SNAPSHOT,
};
use super::log_time::LogReader;
use super::tables::qualified;
use super::wire::{WireConnection, WireError};
use super::{decode, endpoint, mysql_error, pool, quote, wire_error, ColumnType, Endpoint, SESSION_SETUP};

const SYSTEM_SCHEMAS: [&str; 4] = ["mysql", "information_schema", "performance_schema", "sys"];

/// A MySQL split: the key tuples (JSON, as `keys_to_json` writes them) it starts strictly after
/// and ends at, inclusive; none for the first split's start and the last split's end, so rows
/// outside the bounds seen at planning are still copied.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeyRange {
    pub after: Option<serde_json::Value>,
    pub through: Option<serde_json::Value>,
    /// Only these key tuples (a replay of the change stream's dirty records,
    /// `SnapshotSource::key_split`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<serde_json::Value>>,
}

/// Where a snapshot read of a split resumes: strictly after this key tuple. A job that streams
/// also keeps where in the binlog each read of the split stood (`SnapshotSource::copy_reads`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KeyPosition {
    pub key: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reads: Vec<SplitRead>,
}

/// One read of a split inside one consistent snapshot: the keys strictly after `after` (a key
/// tuple as `KeyPosition::key`; the split's start when `None`) up to the next read's start, as
/// they stood at binlog `file` and `position` (MariaDB's `binlog_snapshot_file` and
/// `_position`). A read starts when a task opens the split, and again when it resumes it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SplitRead {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<serde_json::Value>,
    pub file: String,
    pub position: u64,
}

/// How the change stream of a job reads the binlog.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Where a `cdc` job without a checkpoint starts; the current position when `None`.
    pub start_position: Option<LogMark>,
    /// Where the stream ends (`source.stop_position`), if anywhere.
    pub stop_position: Option<LogMark>,
    /// The replica id the stream registers with; unique among the source's replicas.
    pub server_id: u32,
    /// Changes per `StreamEvent::Changes`.
    pub batch_rows: usize,
    /// `two_way`: the transactions Sluice wrote into the source are passed over.
    pub two_way: bool,
}

/// A replica server id derived from the job name: stable across restarts (so a restarted
/// stream replaces its own stale connection) and unlikely to meet a real replica's id.
pub fn default_server_id(job: &str) -> u32 {
    // FNV-1a: stable across builds, unlike the standard library's hasher.
    let hash = job.bytes().fold(0x811c_9dc5u32, |hash, byte| (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193));
    0x4000_0000 | (hash & 0x3fff_ffff)
}

/// A MySQL or MariaDB server read as a source.
#[derive(Debug)]
pub struct MysqlSource {
    pool: Pool,
    endpoint: Endpoint,
    /// The URL without its password, for messages.
    server: String,
    filter: TableFilter,
    mode: Mode,
    stream: StreamOptions,
    /// Whether snapshot reads go through the lean client (`wire`); cleared, for the rest of the
    /// run, when it meets a connection it does not speak.
    lean_reads: AtomicBool,
    /// How long a snapshot read through the lean client waits for the server's next bytes.
    read_timeout: Duration,
}

impl MysqlSource {
    pub fn new(
        url: &Secret,
        display_url: String,
        filter: TableFilter,
        mode: Mode,
        connections: usize,
        stream: StreamOptions,
        read_timeout: Duration,
    ) -> Result<MysqlSource> {
        let endpoint = endpoint(url, Side::Source)?;
        Ok(MysqlSource {
            pool: pool(&endpoint, connections + 1)?,
            endpoint,
            server: display_url,
            filter,
            mode,
            stream,
            lean_reads: AtomicBool::new(true),
            read_timeout,
        })
    }

    async fn connection(&self) -> Result<Conn> {
        self.pool.get_conn().await.map_err(|error| mysql_error(error, Side::Source, &self.server, "connect"))
    }

    /// A connection for reading a split: the lean client where it can connect, else one from
    /// the driver's pool.
    async fn read_connection(&self) -> Result<ReadConnection> {
        if self.lean_reads.load(Ordering::Relaxed) {
            match WireConnection::connect(&self.endpoint, &SESSION_SETUP, self.read_timeout).await {
                Ok(connection) => return Ok(ReadConnection::Lean(Box::new(connection))),
                Err(WireError::Unsupported(what)) => {
                    log::info!("source {}: tables are read through the driver ({what})", self.server);
                    self.lean_reads.store(false, Ordering::Relaxed);
                }
                Err(error) => return Err(wire_error(error, Side::Source, &self.server, "connect")),
            }
        }
        Ok(ReadConnection::Driver(self.connection().await?))
    }

    /// Whether the source is MariaDB (else MySQL).
    async fn mariadb(&self, connection: &mut Conn) -> Result<bool> {
        Ok(super::flavor(connection, Side::Source, &self.server).await? == "mariadb")
    }

    fn error(&self, doing: &str) -> impl Fn(mysql_async::Error) -> Error + '_ {
        let doing = doing.to_owned();
        move |error| mysql_error(error, Side::Source, &self.server, &doing)
    }
}

#[async_trait]
impl Source for MysqlSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let mut connection = self.connection().await?;
        let version: Option<String> =
            connection.query_first("SELECT VERSION()").await.map_err(self.error("read the server version"))?;
        let mut items = vec![CheckItem {
            what: "source connection".into(),
            ok: true,
            detail: format!("{} (server {})", self.server, version.unwrap_or_default()),
        }];
        if self.mode.streams() {
            items.push(self.check_binlog(&mut connection).await?);
            items.push(self.probe_binlog().await);
        }
        // Privileges: probe each selected table, so a missing grant is named with its table.
        let user: Option<String> =
            connection.query_first("SELECT CURRENT_USER()").await.map_err(self.error("read the user"))?;
        let user = user.unwrap_or_default();
        let mut missing = Vec::new();
        let tables = self.discover().await?;
        for table in &tables {
            let probe = format!("SELECT 1 FROM {} LIMIT 0", qualified(&table.name));
            if let Err(error) = connection.query_drop(probe).await {
                match mysql_error(error, Side::Source, &self.server, "probe") {
                    error if error.kind() == ErrorKind::Auth => missing.push(table.name.to_string()),
                    error => return Err(error),
                }
            }
        }
        items.push(if missing.is_empty() {
            CheckItem {
                what: "source privileges".into(),
                ok: true,
                detail: format!("{user} can read all {} selected tables", tables.len()),
            }
        } else {
            CheckItem {
                what: "source privileges".into(),
                ok: false,
                detail: format!(
                    "{user} lacks SELECT on {}; grant it, e.g. GRANT SELECT ON db.* TO {user}",
                    missing.join(", ")
                ),
            }
        });
        Ok(items)
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        let mut connection = self.connection().await?;
        let names: Vec<(String, String)> = connection
            .query("SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE'")
            .await
            .map_err(self.error("list tables"))?;
        let available = names
            .into_iter()
            .filter(|(schema, _)| !SYSTEM_SCHEMAS.contains(&schema.to_ascii_lowercase().as_str()))
            .map(|(schema, table)| TableName::new(Some(&schema), &table))
            .collect::<Vec<_>>();
        // information_schema hides tables the user has no privilege on: a named table missing
        // from it may exist. Ask the server, so the error says "no privilege", not "no table".
        let mut denied = Vec::new();
        for pattern in self.filter.unmatched_literals(&available) {
            let name = TableName::parse(pattern);
            if let Err(error) = connection.query_drop(format!("SELECT 1 FROM {} LIMIT 0", qualified(&name))).await {
                if matches!(&error, mysql_async::Error::Server(server) if server.code == 1142) {
                    denied.push(name.to_string());
                }
            }
        }
        if !denied.is_empty() {
            let user: Option<String> =
                connection.query_first("SELECT CURRENT_USER()").await.map_err(self.error("read the user"))?;
            let user = user.unwrap_or_default();
            return Err(Error::new(ErrorKind::Auth, format!("user {user} lacks SELECT on {}", denied.join(", ")))
                .on(Side::Source)
                .hint(format!("GRANT SELECT ON <database>.* TO {user}")));
        }
        // The binlog names a row by its PRIMARY KEY only, so a job that streams lets no unique
        // key stand in for one: such a table is keyless to the stream, and copied as keyless.
        let stand_in = !self.mode.streams();
        let mariadb = self.mariadb(&mut connection).await?;
        uncached_statistics(&mut connection).await;
        let mut tables = Vec::new();
        for name in self.filter.select(available)? {
            tables.push(describe_table(&mut connection, &name, &self.server, stand_in, mariadb).await?);
        }
        let keyless: Vec<String> =
            tables.iter().filter(|table| table.primary_key.is_empty()).map(|table| table.name.to_string()).collect();
        if self.mode == Mode::SnapshotAndCdc && !keyless.is_empty() {
            if !mariadb {
                return Err(no_snapshot_position(&keyless));
            }
            // A consistent snapshot holds for transactional tables only.
            let mut other_engines = Vec::new();
            for table in tables.iter().filter(|table| table.primary_key.is_empty()) {
                let engine: Option<Option<String>> = connection
                    .exec_first(
                        "SELECT ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                        (schema_of(&table.name), &table.name.name),
                    )
                    .await
                    .map_err(self.error("read the storage engines"))?;
                let engine = engine.flatten().unwrap_or_default();
                if !engine.eq_ignore_ascii_case("InnoDB") {
                    other_engines.push(format!("{} ({engine})", table.name));
                }
            }
            if !other_engines.is_empty() {
                return Err(not_transactional(&other_engines));
            }
        }
        if self.mode == Mode::Cdc && !keyless.is_empty() {
            log::warn!(
                "{} {} no primary key: the stream applies {} changes by whole rows; rows the target held before the stream's start cannot be told from the ones it inserts",
                keyless.join(", "),
                if keyless.len() == 1 { "has" } else { "have" },
                if keyless.len() == 1 { "its" } else { "their" }
            );
        }
        Ok(tables)
    }

    sluice_core::capabilities!(snapshot: SnapshotSource, changes: ChangeSource, cursor: CursorSource);
}

#[async_trait]
impl ChangeSource for MysqlSource {
    /// At a time (`start_position: {time: …}`): where the first transaction dated at or after
    /// it begins, found once, when the job is first planned.
    async fn start_log(&self) -> Result<Option<Position>> {
        let Some(LogMark::Time(time)) = self.stream.start_position else { return self.log_position().await };
        let reader =
            LogReader { opts: self.endpoint.opts.clone(), server: &self.server, server_id: self.stream.server_id };
        let position = reader.position_at(&mut self.connection().await?, time).await?;
        log::info!(
            "source.start_position {}: the first transaction dated at or after it begins at {}",
            sluice_core::clock::rfc3339(time),
            position.brief()
        );
        Ok(Some(position))
    }

    async fn start_position(&self) -> Result<Option<Position>> {
        Ok(match &self.stream.start_position {
            Some(LogMark::Position(position)) => Some(position.clone()),
            _ => None,
        })
    }

    fn stop_position(&self) -> Option<Position> {
        match &self.stream.stop_position {
            Some(LogMark::Position(position)) => Some(position.clone()),
            _ => None,
        }
    }

    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
        // Refused at start as by `sluice check`: a stream on the wrong settings would be wrong.
        self.check_binlog(&mut self.connection().await?).await?;
        let stream = BinlogChangeStream::open(
            self.endpoint.opts.clone(),
            self.server.clone(),
            self.filter.clone(),
            after,
            self.stream.server_id,
            self.stream.batch_rows,
            match self.stream.stop_position {
                Some(LogMark::Time(time)) => Some(time),
                _ => None,
            },
        )
        .await?
        .passing_over_own_writes(self.stream.two_way);
        Ok(Box::new(stream))
    }

    /// The table map's schema completed by information_schema, read as `discover` reads it,
    /// column by column where the two agree (`logged::reconcile`); the table map alone when the
    /// table is gone from the source by now.
    async fn describe_logged(&self, logged: &TableSchema) -> Result<TableSchema> {
        let mut connection = self.connection().await?;
        let mariadb = self.mariadb(&mut connection).await?;
        uncached_statistics(&mut connection).await;
        let described = match describe_table(&mut connection, &logged.name, &self.server, false, mariadb).await {
            Ok(described) if !described.columns.is_empty() => described,
            // Dropped (or renamed) since the rows being applied.
            Ok(_) => return Ok(described_without(logged, "it is not in information_schema now")),
            Err(error) if error.kind() == ErrorKind::Schema => {
                return Ok(described_without(logged, error.message()));
            }
            Err(error) => return Err(error),
        };
        let (schema, disagreements) = super::logged::reconcile(logged, &described);
        if !disagreements.is_empty() {
            log::warn!(
                "table {}: the source describes it otherwise now than the binlog at the rows being applied ({}); what disagrees is created as the binlog's table map says, without the source's own type text, default or comment",
                logged.name,
                disagreements.join("; ")
            );
        }
        Ok(schema)
    }

    fn reached(&self, position: &Position, mark: &Position) -> bool {
        let field = |position: &Position, name: &str| {
            position.0.get(name).and_then(serde_json::Value::as_str).map(str::to_owned)
        };
        // Positions of two servers (across a failover) compare by their GTIDs alone.
        if let (Some(here), Some(there)) = (field(position, "server"), field(mark, "server")) {
            if here != there {
                let (at, until) =
                    (field(position, "gtid").unwrap_or_default(), field(mark, "gtid").unwrap_or_default());
                return match field(mark, "flavor").as_deref() {
                    Some("mariadb") => super::gtid::mariadb_reached(&at, &until),
                    _ => match (GtidSet::parse(&at), GtidSet::parse(&until)) {
                        (Some(at), Some(until)) => at.includes(&until),
                        _ => false,
                    },
                };
            }
        }
        match (LogPosition::from_position(position), LogPosition::from_position(mark)) {
            (Ok(position), Ok(mark)) => position.key() >= mark.key(),
            _ => false,
        }
    }

    async fn log_backlog(&self, position: &Position) -> Result<Option<LogBacklog>> {
        let Ok(at) = LogPosition::from_position(position) else { return Ok(None) };
        let mut connection = self.connection().await?;
        let rows: Vec<Row> = connection.query("SHOW BINARY LOGS").await.map_err(self.error("list the binary logs"))?;
        let files: Vec<(String, u64)> =
            rows.iter().filter_map(|row| Some((row.get::<String, _>(0)?, row.get::<u64, _>(1)?))).collect();
        Ok(backlog(&files, &at))
    }

    async fn log_position(&self) -> Result<Option<Position>> {
        let mut connection = self.connection().await?;
        let mariadb = self.mariadb(&mut connection).await?;
        let status: std::result::Result<Option<Row>, _> = connection.query_first("SHOW MASTER STATUS").await;
        let (file, offset) = match status {
            Ok(Some(row)) => (row.get::<String, _>(0), row.get::<u64, _>(1)),
            Ok(None) => {
                log::warn!(
                    "the source has no binary log (log_bin is off): no position to continue a change stream from"
                );
                return Ok(None);
            }
            Err(error) if !self.mode.streams() => {
                log::warn!("cannot read the source's binlog position ({error}); a snapshot does not need it");
                return Ok(None);
            }
            Err(error) => {
                return Err(mysql_error(error, Side::Source, &self.server, "read the binlog position")
                    .hint("grant REPLICATION CLIENT (BINLOG MONITOR on MariaDB)"))
            }
        };
        let gtid_query = if mariadb { "SELECT @@GLOBAL.gtid_binlog_pos" } else { "SELECT @@GLOBAL.gtid_executed" };
        let gtid: Option<String> =
            connection.query_first(gtid_query).await.map_err(self.error("read the GTID position"))?;
        let identity = super::binlog::server_identity(&mut connection, mariadb, &self.server).await?;
        Ok(Some(Position(json!({
            "flavor": if mariadb { "mariadb" } else { "mysql" },
            "gtid": gtid.unwrap_or_default(),
            "file": file,
            "position": offset,
            "server": identity,
        }))))
    }
}

#[async_trait]
impl SnapshotSource for MysqlSource {
    /// A split of exactly these keys: `KeyRange::keys`, read in key order like any split.
    fn key_split(&self, table: &Arc<TableSchema>, keys: &[sluice_core::Row]) -> Result<Split> {
        if table.primary_key.is_empty() {
            return Err(sluice_core::connector::no_key_to_read_by(&table.name));
        }
        let tuple = |key: &sluice_core::Row| {
            serde_json::Value::Array(
                key.iter()
                    .map(|value| match value {
                        // Bound as text, which the server reads in the session's zone.
                        Value::Timestamp(instant) => json!(instant.to_string()),
                        value => key_to_json(value),
                    })
                    .collect(),
            )
        };
        let range = KeyRange { after: None, through: None, keys: Some(keys.iter().map(tuple).collect()) };
        Ok(Split::new(split_task(&table.name, "keys"), table.clone(), &range, keys.len() as u64))
    }

    async fn split(&self, table: &Arc<TableSchema>, hint: SplitHint) -> Result<Vec<Split>> {
        let mut connection = self.connection().await?;
        let estimated: Option<u64> = connection
            .exec_first(
                "SELECT TABLE_ROWS FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                (schema_of(&table.name), &table.name.name),
            )
            .await
            .map_err(self.error("estimate the table size"))?;
        let estimated = estimated.unwrap_or(0);
        if table.primary_key.is_empty() {
            // Nothing to resume by: one split, read whole (`keyless`).
            let range = KeyRange { after: None, through: None, keys: None };
            return Ok(vec![Split::new(split_task(&table.name, 0), table.clone(), &range, estimated).read_whole()]);
        }
        let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        let integer_key =
            key.len() == 1 && matches!(table.columns[table.primary_key[0]].data_type, DataType::Integer { .. });
        let bounds: Vec<(Option<serde_json::Value>, Option<serde_json::Value>)> = if integer_key {
            self.integer_bounds(&mut connection, table, estimated, hint).await?
        } else if estimated > hint.rows_per_split.saturating_mul(3) / 2 {
            self.sampled_bounds(&mut connection, table, hint).await?
        } else {
            vec![(None, None)]
        };
        let count = bounds.len() as u64;
        // The first split has no lower bound and the last none upper, so rows inserted outside
        // the bounds seen at planning are still copied.
        Ok(bounds
            .into_iter()
            .enumerate()
            .map(|(index, (after, through))| {
                let range = KeyRange { after, through, keys: None };
                Split::new(split_task(&table.name, index), table.clone(), &range, estimated / count)
            })
            .collect())
    }

    async fn open(&self, split: &Split, resume_after: Option<&Position>, batch_rows: usize) -> Result<Box<dyn Reader>> {
        if split.whole {
            let connection = self.connection().await?;
            // A job that streams applies the table's changes from the copy's position on.
            let position_needed = self.mode.streams();
            let table = split.table.clone();
            return Ok(Box::new(KeylessReader::start(
                connection,
                self.server.clone(),
                table,
                batch_rows,
                position_needed,
            )));
        }
        let mut connection = self.read_connection().await?;
        let resumed = resume_after.map(|position| position.read::<KeyPosition>(&split.id)).transpose()?;
        let after = match &resumed {
            Some(resumed) => Some(keys_from_json(&serde_json::Value::Array(resumed.key.clone()))?),
            None => None,
        };
        let range: KeyRange = split.read_descriptor()?;
        // A job that streams reads the split in one consistent snapshot whose binlog position
        // says which changes its rows hold; a resumed read is a new snapshot from its key on.
        // A split resumed from a position without reads (copied before they were kept, or
        // from a server that does not say) stays without: reads must cover the whole split.
        let mut reads = resumed.as_ref().map(|resumed| resumed.reads.clone()).unwrap_or_default();
        let known = resumed.as_ref().is_none_or(|resumed| !resumed.reads.is_empty());
        let snapshot = self.mode.streams() && split.window.is_none();
        if snapshot {
            match connection.begin_snapshot(&self.server, &split.table.name).await? {
                Some((file, position)) if known => {
                    let start = resumed.map(|resumed| serde_json::Value::Array(resumed.key)).or(range.after.clone());
                    reads.push(SplitRead { after: start, file, position });
                }
                _ => reads.clear(),
            }
        }
        let bound = |keys: &Option<serde_json::Value>| -> Result<Option<Vec<mysql_async::Value>>> {
            match keys {
                Some(keys @ serde_json::Value::Array(_)) => Ok(Some(keys_from_json(keys)?)),
                _ => Ok(None),
            }
        };
        let key: Vec<String> =
            split.table.primary_key.iter().map(|&index| quote(&split.table.columns[index].name)).collect();
        let only = range.keys.as_deref().map(|tuples| keys_condition(&key, tuples)).transpose()?;
        let window = match &split.window {
            Some(window) => {
                let (condition, values) = window.condition(&quote(&window.column), |_| "?".to_owned());
                Some((condition, keys_from_json(&serde_json::Value::Array(values.into_iter().cloned().collect()))?))
            }
            None => None,
        };
        Ok(Box::new(MysqlReader {
            connection,
            server: self.server.clone(),
            table: split.table.clone(),
            after: after.or(bound(&range.after)?),
            through: bound(&range.through)?,
            window,
            only,
            batch_rows,
            finished: false,
            snapshot,
            reads,
        }))
    }

    fn copy_reads(&self, split: &Split, copied: Option<&Position>) -> Result<Vec<CopyRead>> {
        if split.whole {
            return Ok(Vec::new());
        }
        let Some(copied) = copied else {
            // Nothing copied: the copy holds none of the split's keys.
            let range: KeyRange = split.read_descriptor()?;
            return Ok(vec![CopyRead { after: self.key_values(split, range.after.as_ref())?, as_of: None }]);
        };
        let reads = copied.read::<KeyPosition>(&split.id)?.reads;
        reads
            .into_iter()
            .map(|read| {
                Ok(CopyRead {
                    after: self.key_values(split, read.after.as_ref())?,
                    as_of: Some(Position(json!({"file": read.file, "position": read.position}))),
                })
            })
            .collect()
    }
}

#[async_trait]
impl CursorSource for MysqlSource {
    async fn cursor_window(
        &self,
        table: &TableSchema,
        cursor: &CursorSpec,
        mark: Option<&serde_json::Value>,
    ) -> Result<CursorWindow> {
        let column = cursor::column(table, cursor)?;
        let doing = format!("read the highest {} of table {}", cursor.column, table.name);
        let mut connection = self.connection().await?;
        let highest: Option<Row> = connection
            .query_first(format!("SELECT MAX({}) FROM {}", quote(&column.name), qualified(&table.name)))
            .await
            .map_err(self.error(&doing))?;
        let as_json = |row: Option<Row>, data_type: &DataType| -> Result<Option<serde_json::Value>> {
            let Some(value) = row.and_then(|mut row| row.take::<mysql_async::Value, _>(0)) else { return Ok(None) };
            match decode(value, data_type) {
                Ok(Value::Null) => Ok(None),
                // Bound again as text, which the server reads in the session's zone.
                Ok(Value::Timestamp(instant)) => Ok(Some(json!(instant.to_string()))),
                Ok(value) => Ok(Some(key_to_json(&value))),
                Err(reason) => Err(Error::new(ErrorKind::Read, format!("{doing}: {reason}")).on(Side::Source)),
            }
        };
        let through = as_json(highest, &column.data_type)?;
        // A time's lookback is taken by the server, in its own types.
        let after = match mark {
            Some(mark) if cursor.lookback_secs > 0 => {
                let mark = keys_from_json(&serde_json::Value::Array(vec![mark.clone()]))?.remove(0);
                let lowered: Option<Row> = connection
                    .exec_first("SELECT CAST(? AS DATETIME(6)) - INTERVAL ? SECOND", (mark, cursor.lookback_secs))
                    .await
                    .map_err(self.error(&doing))?;
                as_json(lowered, &DataType::DateTime { precision: 6 })?
            }
            _ => mark.cloned(),
        };
        Ok(CursorWindow {
            column: column.name.clone(),
            through: through.or_else(|| mark.cloned()),
            after,
            mark: mark.cloned(),
            rerun: false,
        })
    }
}

impl MysqlSource {
    /// A key tuple kept as JSON (`KeyPosition::key`, `KeyRange`) as the values the change
    /// stream decodes for the same key.
    fn key_values(&self, split: &Split, keys: Option<&serde_json::Value>) -> Result<Option<Vec<Value>>> {
        let Some(keys) = keys else { return Ok(None) };
        let table = &split.table;
        keys_from_json(keys)?
            .into_iter()
            .zip(&table.primary_key)
            .map(|(value, &index)| {
                let column = &table.columns[index];
                decode(value, &column.data_type).map_err(|reason| {
                    Error::new(
                        ErrorKind::State,
                        format!("split {}: stored key of column {} does not read: {reason}", split.id, column.name),
                    )
                    .on(Side::Source)
                })
            })
            .collect::<Result<Vec<Value>>>()
            .map(Some)
    }

    /// Reads the binlog for a moment from the current position, as a job's stream will: the
    /// replication privileges are named when they are missing.
    async fn probe_binlog(&self) -> CheckItem {
        let what = "binlog access".to_owned();
        let user: String = match self.connection().await {
            Ok(mut connection) => {
                connection.query_first("SELECT CURRENT_USER()").await.ok().flatten().unwrap_or_default()
            }
            Err(_) => String::new(),
        };
        let missing = |detail: String| {
            CheckItem {
            what: what.clone(),
            ok: false,
            detail: format!("{detail}; GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO {user} (BINLOG MONITOR on MariaDB 10.5+)"),
        }
        };
        let position = match self.log_position().await {
            Ok(Some(position)) => position,
            Ok(None) => return missing("the source has no binary log (log_bin is off)".into()),
            Err(error) => return missing(format!("{user} cannot read the binlog position: {}", error.message())),
        };
        let opened = BinlogChangeStream::open(
            self.endpoint.opts.clone(),
            self.server.clone(),
            self.filter.clone(),
            &position,
            self.stream.server_id ^ 0x2000_0000,
            1,
            None,
        )
        .await;
        let read = match opened {
            Ok(mut stream) => tokio::time::timeout(std::time::Duration::from_secs(5), stream.next()).await,
            Err(error) => return missing(format!("{user} cannot stream the binlog: {}", error.message())),
        };
        match read {
            Err(_) | Ok(Ok(_)) => CheckItem { what, ok: true, detail: format!("{user} can stream the binlog") },
            Ok(Err(error)) => missing(format!("{user} cannot stream the binlog: {}", error.message())),
        }
    }

    /// The binlog settings change data capture needs, or an error naming the wrong one.
    async fn check_binlog(&self, connection: &mut Conn) -> Result<CheckItem> {
        let settings: Option<(String, String, String)> = connection
            .query_first("SELECT @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image, @@GLOBAL.binlog_row_metadata")
            .await
            .map_err(|error| {
                mysql_error(error, Side::Source, &self.server, "read the binlog settings")
                    .hint("change data capture needs MySQL 8.0.1+ or MariaDB 10.5+ (binlog_row_metadata)")
            })?;
        let (format, image, metadata) = settings.unwrap_or_default();
        let wrong: Vec<String> = [
            ("binlog_format", &format, "ROW"),
            ("binlog_row_image", &image, "FULL"),
            ("binlog_row_metadata", &metadata, "FULL"),
        ]
        .iter()
        .filter(|(_, value, wanted)| !value.eq_ignore_ascii_case(wanted))
        .map(|(name, value, wanted)| format!("{name} is {value}, not {wanted}"))
        .collect();
        if !wrong.is_empty() {
            return Err(Error::new(ErrorKind::Config, format!("{}; change data capture needs ROW, FULL and FULL", wrong.join(", ")))
                .on(Side::Source)
                .hint("SET GLOBAL binlog_format = 'ROW'; SET GLOBAL binlog_row_image = 'FULL'; SET GLOBAL binlog_row_metadata = 'FULL' (and in the server config)"));
        }
        Ok(CheckItem {
            what: "binlog settings".into(),
            ok: true,
            detail: format!("binlog_format={format}, binlog_row_image={image}, binlog_row_metadata={metadata}"),
        })
    }
}

/// Makes MySQL 8 read information_schema's table figures (AUTO_INCREMENT) afresh: it caches
/// them for a day. Other servers have no such setting, and need none.
async fn uncached_statistics(connection: &mut Conn) {
    let _ = connection.query_drop("SET SESSION information_schema_stats_expiry = 0").await;
}

/// `logged` as it is, when information_schema cannot describe the table (`why`).
fn described_without(logged: &TableSchema, why: &str) -> TableSchema {
    log::warn!(
        "table {}: the source cannot describe it ({why}); it is created as the binlog's table map says, without the source's own type text, defaults, comments or indexes",
        logged.name
    );
    logged.clone()
}

fn schema_of(name: &TableName) -> &str {
    name.namespace.as_deref().unwrap_or("")
}

/// A row of SHOW INDEX: index, position, column, unique, prefix length.
type IndexRow = (String, u64, Option<String>, bool, Option<u64>);

type ColumnRow = (
    String,
    String,
    String,
    String,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    String,
    Option<String>,
    Option<String>,
    String,
);

/// A column's default as DDL writes it. MariaDB's information_schema gives that already
/// (`'text'`, `5`, `NULL`, `current_timestamp()`); MySQL gives a literal bare and flags an
/// expression with DEFAULT_GENERATED.
fn default_clause(default: Option<String>, extra: &str, nullable: bool, mariadb: bool) -> Option<String> {
    if mariadb {
        return default;
    }
    let Some(default) = default else { return nullable.then(|| "NULL".to_owned()) };
    let timestamp = default.to_ascii_uppercase().starts_with("CURRENT_TIMESTAMP");
    if extra.to_ascii_uppercase().contains("DEFAULT_GENERATED") {
        // MySQL 8 writes the quotes inside an expression escaped: `_utf8mb4\'[]\'`.
        let expression = default.replace("\\'", "'");
        return Some(if timestamp { expression } else { format!("({expression})") });
    }
    // MySQL 5.7 flags neither CURRENT_TIMESTAMP nor a BIT literal.
    if timestamp || default.starts_with("b'") {
        return Some(default);
    }
    Some(super::tables::string_literal(&default))
}

/// The expression of an `on update ...` in a column's EXTRA.
fn on_update_clause(extra: &str) -> Option<String> {
    let at = extra.to_ascii_lowercase().find("on update ")?;
    Some(extra[at + "on update ".len()..].trim().to_owned())
}

/// A table's columns and keys. With `stand_in`, a unique key whose columns are all NOT NULL is
/// the key when there is no primary key (for a snapshot, which resumes by it).
async fn describe_table(
    connection: &mut Conn,
    name: &TableName,
    server: &str,
    stand_in: bool,
    mariadb: bool,
) -> Result<TableSchema> {
    let schema = schema_of(name);
    let rows: Vec<ColumnRow> = connection
        .exec(
            "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE,
                    CHARACTER_MAXIMUM_LENGTH, DATETIME_PRECISION, EXTRA, COLLATION_NAME, COLUMN_DEFAULT, COLUMN_COMMENT
             FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
            (schema, &name.name),
        )
        .await
        .map_err(|error| mysql_error(error, Side::Source, server, &format!("describe table {name}")))?;
    let mut generated = Vec::new();
    let columns: Vec<Column> = rows
        .into_iter()
        .filter_map(
            |(
                column,
                data_type,
                column_type,
                nullable,
                precision,
                scale,
                length,
                datetime_precision,
                extra,
                collation,
                default,
                comment,
            )| {
                // Generated columns are computed by the target's own definition, never written
                // (MySQL's DEFAULT_GENERATED marks an expression default, not one of them).
                let flags = extra.to_ascii_uppercase();
                if flags.contains("VIRTUAL") || flags.contains("STORED") || flags.contains("PERSISTENT") {
                    generated.push(column);
                    return None;
                }
                let nullable = nullable == "YES";
                let details = ColumnDetails {
                    default: default_clause(default, &extra, nullable, mariadb),
                    auto_increment: flags.contains("AUTO_INCREMENT"),
                    on_update: on_update_clause(&extra),
                    comment: Some(comment).filter(|comment| !comment.is_empty()),
                };
                let logical = ColumnType {
                    data_type: &data_type.to_ascii_lowercase(),
                    column_type: &column_type.to_ascii_lowercase(),
                    precision,
                    scale,
                    length,
                    datetime_precision,
                }
                .logical();
                Some(Column {
                    name: column,
                    data_type: logical,
                    nullable,
                    native_type: column_type,
                    collation,
                    details,
                })
            },
        )
        .collect();
    if !generated.is_empty() {
        log::info!("table {name}: generated columns {} are not copied", generated.join(", "));
    }
    let mut columns = columns;
    // MariaDB's JSON is LONGTEXT with a `json_valid(column)` check: carry it as JSON.
    let checks: Vec<String> = connection
        .exec(
            "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?",
            (schema, &name.name),
        )
        .await
        .unwrap_or_default();
    for column in columns.iter_mut().filter(|column| matches!(column.data_type, DataType::Text { length: None, .. })) {
        let check = format!("json_valid(`{}`)", column.name.replace('`', "``"));
        if checks.iter().any(|clause| clause.eq_ignore_ascii_case(&check)) {
            column.data_type = DataType::Json;
        }
    }
    // Every B-tree index in the table's own order (the primary key, unique keys, the others), so
    // a target that builds them in this order lists them as the source does. Prefix indexes
    // (Sub_part), full-text and spatial indexes, and indexes on generated columns or expressions
    // are left out: they do not carry over as columns.
    let shown: Vec<Row> = connection
        .query(format!("SHOW INDEX FROM {}", qualified(name)))
        .await
        .map_err(|error| mysql_error(error, Side::Source, server, &format!("read the keys of {name}")))?;
    let rows: Vec<IndexRow> = shown
        .into_iter()
        .filter(|row| matches!(row.get::<String, _>("Index_type").as_deref(), Some("BTREE" | "HASH")))
        .filter_map(|row| {
            let unique = row.get::<u8, _>("Non_unique")? == 0;
            Some((
                row.get("Key_name")?,
                row.get("Seq_in_index")?,
                row.get("Column_name")?,
                unique,
                row.get("Sub_part")?,
            ))
        })
        .collect();
    let mut indexes: Vec<(String, bool, Option<Vec<usize>>)> = Vec::new();
    for (index, _, column, unique, prefix) in rows {
        let position = column
            .filter(|_| prefix.is_none())
            .and_then(|column| columns.iter().position(|known| known.name == column));
        match indexes.last_mut() {
            Some((last, _, members)) if *last == index => {
                *members = members.take().and_then(|mut members| {
                    position.map(|position| {
                        members.push(position);
                        members
                    })
                })
            }
            _ => indexes.push((index, unique, position.map(|position| vec![position]))),
        }
    }
    let usable: Vec<(String, bool, Vec<usize>)> =
        indexes.into_iter().filter_map(|(index, unique, members)| Some((index, unique, members?))).collect();
    // The primary key, else (`stand_in`) the first unique key whose columns are all NOT NULL.
    let key_position = usable.iter().position(|(index, unique, members)| {
        *unique && members.iter().all(|&column| !columns[column].nullable) && (stand_in || index == "PRIMARY")
    });
    let primary_key = key_position.map(|position| usable[position].2.clone()).unwrap_or_default();
    let indexes = usable
        .into_iter()
        .enumerate()
        .filter(|(position, (index, _, _))| Some(*position) != key_position && index != "PRIMARY")
        .map(|(_, (name, unique, columns))| Index { name, columns, unique })
        .collect();
    let options: Option<(Option<String>, Option<String>, Option<u64>)> = connection
        .exec_first(
            "SELECT TABLE_COLLATION, TABLE_COMMENT, AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (schema, &name.name),
        )
        .await
        .map_err(|error| mysql_error(error, Side::Source, server, &format!("read the options of {name}")))?;
    let (collation, comment, next_auto_increment) = options.unwrap_or_default();
    let details = TableDetails {
        dialect: Some(if mariadb { "mariadb" } else { "mysql" }.to_owned()),
        comment: comment.filter(|comment| !comment.is_empty()),
        collation,
        next_auto_increment: next_auto_increment.filter(|_| columns.iter().any(|column| column.details.auto_increment)),
        generated: Vec::new(),
        old_values_unknown: false,
    };
    Ok(TableSchema { name: name.clone(), columns, primary_key, indexes, details })
}

/// Positions keep the last key read as JSON values.
fn key_to_json(value: &Value) -> serde_json::Value {
    match value {
        Value::Int(integer) => json!(integer),
        Value::UInt(integer) => json!({"u": integer.to_string()}),
        Value::Bytes(bytes) => json!({"b": bytes}),
        other => json!(other.to_string()),
    }
}

/// An integer key as it is kept in positions.
fn integer_json(value: i128) -> serde_json::Value {
    match i64::try_from(value) {
        Ok(value) => json!(value),
        Err(_) => json!({"u": value.to_string()}),
    }
}

fn keys_from_json(keys: &serde_json::Value) -> Result<Vec<mysql_async::Value>> {
    let corrupt = || Error::new(ErrorKind::Read, format!("stored key {keys} is not a key")).on(Side::Source);
    let values = keys.as_array().ok_or_else(corrupt)?;
    values
        .iter()
        .map(|value| match value {
            serde_json::Value::Number(number) => number.as_i64().map(mysql_async::Value::Int).ok_or_else(corrupt),
            serde_json::Value::String(text) => Ok(mysql_async::Value::Bytes(text.clone().into_bytes())),
            serde_json::Value::Object(object) => {
                if let Some(serde_json::Value::String(digits)) = object.get("u") {
                    return digits.parse().map(mysql_async::Value::UInt).map_err(|_| corrupt());
                }
                let bytes = object
                    .get("b")
                    .and_then(|bytes| serde_json::from_value::<Vec<u8>>(bytes.clone()).ok())
                    .ok_or_else(corrupt)?;
                Ok(mysql_async::Value::Bytes(bytes))
            }
            _ => Err(corrupt()),
        })
        .collect()
}

/// `a IN (?, …)` or `(a, b) IN ((?, ?), …)`: exactly these key tuples (JSON, as `key_to_json`
/// writes their values), with their parameters.
fn keys_condition(key: &[String], tuples: &[serde_json::Value]) -> Result<(String, Vec<mysql_async::Value>)> {
    let (columns, placeholder) = match key {
        [column] => (column.clone(), "?".to_owned()),
        _ => (format!("({})", key.join(", ")), format!("({})", vec!["?"; key.len()].join(", "))),
    };
    let mut parameters = Vec::with_capacity(tuples.len() * key.len());
    for tuple in tuples {
        parameters.extend(keys_from_json(tuple)?);
    }
    Ok((format!("{columns} IN ({})", vec![placeholder.as_str(); tuples.len()].join(", ")), parameters))
}

/// A condition on a key tuple, expanded so every server uses the index: strictly after `values`
/// (`a > ? OR (a = ? AND b > ?)`), or up to and including them (`a < ? OR (a = ? AND b <= ?)`).
fn key_condition(
    key: &[String],
    values: &[mysql_async::Value],
    after: bool,
    parameters: &mut Vec<mysql_async::Value>,
) -> String {
    let mut alternatives = Vec::new();
    for length in 1..=key.len() {
        let mut terms = Vec::new();
        for index in 0..length {
            let operator = match (index + 1 == length, after, length == key.len()) {
                (false, _, _) => "=",
                (true, true, _) => ">",
                (true, false, false) => "<",
                (true, false, true) => "<=",
            };
            terms.push(format!("{} {operator} ?", key[index]));
            parameters.push(values[index].clone());
        }
        alternatives.push(format!("({})", terms.join(" AND ")));
    }
    format!("({})", alternatives.join(" OR "))
}

impl MysqlSource {
    /// Even ranges between the key's minimum and maximum.
    async fn integer_bounds(
        &self,
        connection: &mut Conn,
        table: &TableSchema,
        estimated: u64,
        hint: SplitHint,
    ) -> Result<Vec<(Option<serde_json::Value>, Option<serde_json::Value>)>> {
        let key = quote(&table.columns[table.primary_key[0]].name);
        let range: Option<(Option<String>, Option<String>)> = connection
            .query_first(format!(
                "SELECT CAST(MIN({key}) AS CHAR), CAST(MAX({key}) AS CHAR) FROM {}",
                qualified(&table.name)
            ))
            .await
            .map_err(self.error(&format!("read the key range of {}", table.name)))?;
        let parse = |text: Option<String>| text.and_then(|text| text.parse::<i128>().ok());
        let Some((Some(min), Some(max))) = range.map(|(min, max)| (parse(min), parse(max))) else {
            return Ok(vec![(None, None)]);
        };
        let count = if estimated > 0 { estimated } else { (max - min + 1) as u64 };
        let splits = count.div_ceil(hint.rows_per_split.max(1)).clamp(1, 10_000);
        let width = ((max - min + 1) / i128::from(splits)).max(1);
        Ok((0..splits)
            .map(|index| {
                let boundary = |index: u64| json!([integer_json(min + width * i128::from(index) - 1)]);
                ((index > 0).then(|| boundary(index)), (index + 1 < splits).then(|| boundary(index + 1)))
            })
            .collect())
    }

    /// Boundaries every `rows_per_split` keys, found by skipping through the key in its own
    /// order (and collation), so any key shape splits evenly.
    async fn sampled_bounds(
        &self,
        connection: &mut Conn,
        table: &TableSchema,
        hint: SplitHint,
    ) -> Result<Vec<(Option<serde_json::Value>, Option<serde_json::Value>)>> {
        let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        let mut boundaries: Vec<serde_json::Value> = Vec::new();
        let mut after: Option<Vec<mysql_async::Value>> = None;
        while boundaries.len() < 10_000 {
            let mut parameters = Vec::new();
            let filter = match &after {
                Some(values) => format!(" WHERE {}", key_condition(&key, values, true, &mut parameters)),
                None => String::new(),
            };
            let sql = format!(
                "SELECT {} FROM {}{filter} ORDER BY {} LIMIT 1 OFFSET {}",
                key.join(", "),
                qualified(&table.name),
                key.join(", "),
                hint.rows_per_split.max(1) - 1
            );
            let row: Option<Row> = connection
                .exec_first(sql, parameters)
                .await
                .map_err(self.error(&format!("split table {}", table.name)))?;
            let Some(row) = row else { break };
            let raw = row.unwrap();
            let keys: Vec<serde_json::Value> = raw
                .iter()
                .zip(&table.primary_key)
                .map(|(value, &index)| {
                    decode(value.clone(), &table.columns[index].data_type)
                        .map(|value| key_to_json(&value))
                        .unwrap_or_default()
                })
                .collect();
            boundaries.push(serde_json::Value::Array(keys));
            after = Some(raw);
        }
        let mut bounds = Vec::with_capacity(boundaries.len() + 1);
        let mut previous = None;
        for boundary in boundaries {
            bounds.push((previous.take(), Some(boundary.clone())));
            previous = Some(boundary);
        }
        bounds.push((previous, None));
        Ok(bounds)
    }
}

/// The connection a reader reads its split through.
enum ReadConnection {
    Lean(Box<WireConnection>),
    Driver(Conn),
}

impl ReadConnection {
    /// Begins a consistent snapshot that the split's reads then share, and returns the binlog
    /// file and position it stands at; `None` when the server does not say (only MariaDB does).
    async fn begin_snapshot(&mut self, server: &str, table: &TableName) -> Result<Option<(String, u64)>> {
        let doing = format!("begin a consistent snapshot to read table {table}");
        let status: Vec<(String, String)> = match self {
            ReadConnection::Lean(connection) => {
                let wire = |error| wire_error(error, Side::Source, server, &doing);
                connection.query(START_SNAPSHOT).await.map_err(wire)?;
                let mut status = Vec::new();
                let read = connection
                    .execute(SNAPSHOT_STATUS, &[], |row| {
                        if let [mysql_async::Value::Bytes(name), mysql_async::Value::Bytes(value)] = &row[..] {
                            status.push((
                                String::from_utf8_lossy(name).into_owned(),
                                String::from_utf8_lossy(value).into_owned(),
                            ));
                        }
                    })
                    .await;
                match read {
                    Ok(()) => status,
                    // A server that cannot prepare the statement keeps no such status either.
                    Err(WireError::Server { .. }) => Vec::new(),
                    Err(error) => return Err(wire(error)),
                }
            }
            ReadConnection::Driver(connection) => {
                let error = |error| mysql_error(error, Side::Source, server, &doing);
                connection.query_drop(START_SNAPSHOT).await.map_err(error)?;
                connection.query(SNAPSHOT_STATUS).await.map_err(error)?
            }
        };
        Ok(snapshot_position(&status))
    }

    /// Ends the snapshot `begin_snapshot` began.
    async fn end_snapshot(&mut self, server: &str, table: &TableName) -> Result<()> {
        let doing = format!("end the consistent snapshot of table {table}");
        match self {
            ReadConnection::Lean(connection) => {
                connection.query("COMMIT").await.map_err(|error| wire_error(error, Side::Source, server, &doing))
            }
            ReadConnection::Driver(connection) => {
                connection.query_drop("COMMIT").await.map_err(|error| mysql_error(error, Side::Source, server, &doing))
            }
        }
    }
}

struct MysqlReader {
    connection: ReadConnection,
    server: String,
    table: Arc<TableSchema>,
    /// The last key read (or the split's lower bound): the next batch starts strictly after it.
    after: Option<Vec<mysql_async::Value>>,
    /// The split's last key, included; `None` for the last split.
    through: Option<Vec<mysql_async::Value>>,
    /// A cursor-incremental batch's condition on the rows read, and its values.
    window: Option<(String, Vec<mysql_async::Value>)>,
    /// The condition of a split of given keys (`KeyRange::keys`), and its values.
    only: Option<(String, Vec<mysql_async::Value>)>,
    batch_rows: usize,
    finished: bool,
    /// The reads share a consistent snapshot, ended once the split is read (a driver
    /// connection goes back to its pool).
    snapshot: bool,
    /// The split's reads so far, this one last (`KeyPosition::reads`).
    reads: Vec<SplitRead>,
}

impl MysqlReader {
    /// `SELECT ... WHERE <after the last key> AND <up to the split's last key> ORDER BY key
    /// LIMIT n`: the server compares the bounds in the key's own collation.
    fn statement(&self) -> (String, Vec<mysql_async::Value>) {
        let key: Vec<String> =
            self.table.primary_key.iter().map(|&index| quote(&self.table.columns[index].name)).collect();
        let columns: Vec<String> = self.table.columns.iter().map(|column| quote(&column.name)).collect();
        let mut conditions = Vec::new();
        let mut parameters = Vec::new();
        if let Some(after) = &self.after {
            conditions.push(key_condition(&key, after, true, &mut parameters));
        }
        if let Some(through) = &self.through {
            conditions.push(key_condition(&key, through, false, &mut parameters));
        }
        for (condition, values) in self.window.iter().chain(&self.only) {
            conditions.push(condition.clone());
            parameters.extend(values.iter().cloned());
        }
        let filter = if conditions.is_empty() { String::new() } else { format!(" WHERE {}", conditions.join(" AND ")) };
        let sql = format!(
            "SELECT {} FROM {}{filter} ORDER BY {} LIMIT {}",
            columns.join(", "),
            qualified(&self.table.name),
            key.join(", "),
            self.batch_rows
        );
        (sql, parameters)
    }
}

#[async_trait]
impl Reader for MysqlReader {
    async fn next(&mut self) -> Result<Option<Batch>> {
        if self.finished {
            return Ok(None);
        }
        let (sql, parameters) = self.statement();
        let doing = || format!("read table {}", self.table.name);
        // Each row is decoded as it arrives, while its bytes are still in the cache.
        let mut rows = DecodedRows::new(&self.table, self.batch_rows);
        match &mut self.connection {
            ReadConnection::Lean(connection) => connection
                .execute(&sql, &parameters, |raw| rows.push(raw))
                .await
                .map_err(|error| wire_error(error, Side::Source, &self.server, &doing()))?,
            ReadConnection::Driver(connection) => {
                let result: Vec<Row> = connection
                    .exec(sql, parameters)
                    .await
                    .map_err(|error| mysql_error(error, Side::Source, &self.server, &doing()))?;
                for row in result {
                    rows.push(&mut row.unwrap());
                }
            }
        }
        let DecodedRows { changes, rejected, last_key, count, bytes, .. } = rows;
        if count < self.batch_rows {
            self.finished = true;
            if self.snapshot {
                self.connection.end_snapshot(&self.server, &self.table.name).await?;
            }
        }
        if count == 0 {
            return Ok(None);
        }
        let key_json: Vec<serde_json::Value> = last_key
            .iter()
            .zip(&self.table.primary_key)
            .map(|(value, &index)| {
                decode(value.clone(), &self.table.columns[index].data_type)
                    .map(|value| key_to_json(&value))
                    .unwrap_or(serde_json::Value::Null)
            })
            .collect();
        self.after = Some(last_key);
        let position = Position::of(&KeyPosition { key: key_json, reads: self.reads.clone() });
        let mut batch = Batch::counted(changes, position, bytes);
        batch.rejected = rejected;
        Ok(Some(batch))
    }
}

/// The log past `at` among the server's binary logs (name and size, oldest first); `None` when
/// the server no longer lists `at`'s file (the stream fails on that by itself).
fn backlog(files: &[(String, u64)], at: &LogPosition) -> Option<LogBacklog> {
    let index = files.iter().position(|(name, _)| *name == at.file)?;
    let rest: u64 = files[index + 1..].iter().map(|(_, size)| size).sum();
    Some(LogBacklog {
        files_behind: (files.len() - index) as u64,
        bytes_behind: files[index].1.saturating_sub(at.offset) + rest,
        files_to_spare: index as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_counts_from_the_checkpoint_and_the_files_kept_before_it() {
        let files = [("b.000001".to_owned(), 1_000), ("b.000002".to_owned(), 500), ("b.000003".to_owned(), 300)];
        let at = LogPosition { file: "b.000002".into(), offset: 200 };
        assert_eq!(backlog(&files, &at), Some(LogBacklog { files_behind: 2, bytes_behind: 600, files_to_spare: 1 }));
        let at = LogPosition { file: "b.000001".into(), offset: 4 };
        assert_eq!(backlog(&files, &at).unwrap().files_to_spare, 0, "the oldest file: the next purge loses it");
        let at = LogPosition { file: "b.000000".into(), offset: 4 };
        assert_eq!(backlog(&files, &at), None, "purged already");
    }
}
