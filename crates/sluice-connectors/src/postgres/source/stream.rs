//! The change stream of a logical replication slot: `pgoutput` messages turned into the engine's
//! transactions of row changes. With PostgreSQL 14 or later the stream asks for protocol 2 with
//! `streaming 'on'`: a transaction too large for the server's `logical_decoding_work_mem` comes
//! in chunks while it runs, is kept here (`streamed`) and handed on only once it committed, as
//! if it had come whole (protocol 1, and smaller transactions, come whole once committed).
//! Positions are WAL positions at transaction boundaries: the start of a transaction's commit
//! record before its changes, the end of it after them, and the server's position at a
//! keepalive between transactions. The slot confirms a position only once the target has stored
//! it (`ack`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sluice_core::change::{Change, ChangeKind, LogMark, Position};
use sluice_core::connector::{ChangeStream, SourceSchemaChange, StreamEvent};
use sluice_core::filter::TableFilter;
use sluice_core::{Column, Error, ErrorKind, Result, Row, Side, TableName, TableSchema, Value};
use tokio_postgres::Client;

use super::super::replication::{
    decode, LogicalMessage, Lsn, OldTuple, Relation, ReplicationConnection, ReplicationError, ReplicationMessage,
    Tuple, TupleValue,
};
use super::super::{endpoint, postgres_error};
use super::catalog::{self, data_type};
use super::pump::Pump;
use super::streamed::{Replay, StreamedError, StreamedTransactions};
use super::{format_lsn, values, PostgresSource, WalPosition};

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_SECONDS: i64 = 946_684_800;

/// Longer than the server's keepalive interval (half of `wal_sender_timeout`, 30 s by default):
/// a stream silent this long has lost its server.
const SILENCE_LIMIT: Duration = Duration::from_secs(120);

/// A slot's change stream.
pub(crate) struct WalChangeStream {
    /// The replication session, on a task of its own.
    pump: Pump,
    /// A plain session on the same database, for the catalog.
    client: Client,
    server: String,
    /// The slot's name, for messages.
    slot: String,
    filter: TableFilter,
    /// The tables as the job was planned (`discover`): what a table's first relation message
    /// in a stream is compared with. Empty when unknown (a node that only streams).
    planned: HashMap<TableName, Arc<TableSchema>>,
    /// Each relation of the publication as the stream decodes its rows; `None` for a table the
    /// job does not read.
    relations: HashMap<u32, Option<Arc<TableSchema>>>,
    /// The tables as last given to the engine in this stream, by name.
    shapes: HashMap<TableName, Arc<TableSchema>>,
    /// Events ready to return, in order.
    ready: VecDeque<StreamEvent>,
    /// Changes of the open transaction not yet returned.
    changes: Vec<Change>,
    batch_rows: usize,
    /// The open transaction has returned changes already (a schema change can no longer come
    /// before them).
    returned: bool,
    in_transaction: bool,
    /// The last transaction boundary returned.
    boundary: u64,
    /// The stream ends before the first transaction committed at or after this (seconds since
    /// the epoch; `source.stop_position: {time: …}`).
    stop_time: Option<u64>,
    /// The stream reached `stop_time`: it hands on nothing more.
    ended: bool,
    /// Transactions the server streams before they end.
    streamed: StreamedTransactions,
    /// A committed streamed transaction being handed on, and the end of its commit record
    /// and its commit time.
    replay: Option<(Replay, Lsn, i64)>,
    /// The publication the stream reads, and when it was last checked to publish the planned
    /// tables (`check_publication`).
    publication: String,
    publication_checked: Instant,
}

/// How often, between transactions, the stream checks that its publication still publishes
/// the job's tables: a table taken out of it sends no more changes, and nothing else says so.
const PUBLICATION_CHECK: Duration = Duration::from_secs(10);

/// The first major version whose `pgoutput` streams large transactions (protocol 2).
const STREAMING_SINCE: u32 = 14;

impl std::fmt::Debug for WalChangeStream {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("WalChangeStream")
            .field("server", &self.server)
            .field("boundary", &self.boundary)
            .finish()
    }
}

/// A replication error as the engine's: an I/O failure is worth a new stream, a slot taken by
/// another reader too (it may be this job's previous stream, still ending), a server error on
/// the slot stops the job saying why.
fn replication_error(error: ReplicationError, server: &str, slot: &str) -> Error {
    let (kind, hint) = match error.code() {
        Some("42704") => (ErrorKind::PositionLost, Some("the slot is gone: reset the job and run it again".to_owned())),
        Some("55006") => {
            (ErrorKind::Unavailable, Some(format!("another client reads slot {slot}; each job needs its own slot")))
        }
        Some("58P01") => (ErrorKind::PositionLost, Some("the WAL the slot needs is gone: reset the job".to_owned())),
        Some("28P01" | "28000") => (ErrorKind::Auth, Some("check the user and password in source.url".to_owned())),
        Some("42501") => (ErrorKind::Auth, Some("grant the user the REPLICATION attribute".to_owned())),
        // Connection exceptions, operator intervention (a terminated backend, a shutdown):
        // the server or its reader went away, not the stream's place.
        Some(code) if code.starts_with("08") || code.starts_with("57") => (ErrorKind::Unavailable, None),
        Some(_) => (ErrorKind::Read, None),
        None => match &error {
            ReplicationError::Tls(_) | ReplicationError::Auth(_) => (ErrorKind::Auth, None),
            ReplicationError::Protocol(_) => (ErrorKind::Read, None),
            _ => (ErrorKind::Unavailable, None),
        },
    };
    let error = Error::new(kind, format!("replication slot {slot} on {server}: {error}")).on(Side::Source);
    match hint {
        Some(hint) => error.hint(hint),
        None => error,
    }
}

impl WalChangeStream {
    /// Starts streaming the slot strictly after `after` (a commit's end).
    pub(crate) async fn open(source: &PostgresSource, client: Client, after: u64) -> Result<WalChangeStream> {
        let (server, replication) = (source.server.clone(), &source.replication);
        // The tables `discover` found: one the stream meets that was not among them was created
        // since, and the target gets it first. (A node that only streams discovered nothing,
        // and leaves that to the tables' planning.)
        let planned: HashMap<TableName, Arc<TableSchema>> = source
            .described
            .lock()
            .await
            .iter()
            .map(|(name, described)| (name.clone(), Arc::new(described.schema.clone())))
            .collect();
        let (mut config, mode, tls) = endpoint(&source.url, Side::Source)?;
        // pgoutput writes values with the session's output functions: the forms `values` reads.
        let session = super::session_options();
        let options = match config.get_options() {
            Some(given) => format!("{given} {session}"),
            None => session,
        };
        config.options(&options);
        let error = |error| replication_error(error, &server, &replication.slot);
        let mut connection = ReplicationConnection::connect(&config, mode, &tls).await.map_err(error)?;
        let publication = format!("\"{}\"", replication.publication.replace('"', "\"\""));
        // The session reports the stored position often enough for the server's timeout.
        let timeout = match connection.simple_query("SHOW wal_sender_timeout").await {
            Ok(rows) => rows.get(0, "wal_sender_timeout").and_then(super::pump::parse_timeout),
            Err(error) => {
                log::debug!("reading wal_sender_timeout on {server}: {error}");
                None
            }
        };
        let major = connection.server_version().and_then(|version| {
            version.split(|c: char| !c.is_ascii_digit()).next().and_then(|major| major.parse::<u32>().ok())
        });
        let mut options = vec![("publication_names", publication.as_str())];
        if major.is_some_and(|major| major >= STREAMING_SINCE) {
            options.extend([("proto_version", "2"), ("streaming", "on")]);
        } else {
            options.push(("proto_version", "1"));
        }
        connection.start_logical(&replication.slot, Lsn(after), &options).await.map_err(error)?;
        Ok(WalChangeStream {
            pump: Pump::start(connection, after, timeout),
            client,
            server,
            slot: replication.slot.clone(),
            filter: source.filter.clone(),
            planned,
            relations: HashMap::new(),
            shapes: HashMap::new(),
            ready: VecDeque::new(),
            changes: Vec::new(),
            batch_rows: source.batch_rows.max(1),
            returned: false,
            in_transaction: false,
            boundary: after,
            stop_time: match source.stop_position {
                Some(LogMark::Time(time)) => Some(time),
                _ => None,
            },
            ended: false,
            streamed: StreamedTransactions::default(),
            replay: None,
            publication: replication.publication.clone(),
            publication_checked: Instant::now(),
        })
    }

    /// Stops the stream when a table the job was planned with still exists but is no longer
    /// in the publication: its changes since were not sent, so the stream cannot go on as if
    /// nothing was missed. A table dropped from the source is not this (PostgreSQL does not
    /// say that either; README).
    async fn check_publication(&mut self) -> Result<()> {
        self.publication_checked = Instant::now();
        if self.planned.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = self.planned.keys().map(catalog::qualified).collect();
        let missing = super::slot::unpublished(&self.client, &self.server, &self.publication, &names).await?;
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Config,
            format!(
                "publication {} no longer publishes {}: their changes since it stopped are not in the stream",
                self.publication,
                missing.join(", ")
            ),
        )
        .on(Side::Source)
        .hint(format!(
            "ALTER PUBLICATION {} ADD TABLE {}, run the job again, and copy those tables again (on a server `sluice job resync JOB TABLE…`; alone, `sluice reset` and a new run)",
            super::super::quote(&self.publication),
            missing.join(", ")
        )))
    }

    fn streamed_error(&self, error: StreamedError) -> Error {
        match error {
            StreamedError::Protocol(message) => self.slot_error(format!("streamed transactions: {message}")),
            StreamedError::Io(error) => Error::new(
                ErrorKind::Unavailable,
                format!("keeping a transaction {} streams before it commits on local disk: {error}", self.server),
            )
            .on(Side::Source)
            .hint("free space in the temporary directory ($TMPDIR, else /tmp)"),
        }
    }

    /// A transaction starts; `false` when it is past the stream's stop time (the stream ends
    /// where it begins).
    fn begin(&mut self, final_lsn: Lsn, commit_time: i64) -> bool {
        let committed_at = (commit_time / 1_000_000 + POSTGRES_EPOCH_SECONDS).max(0) as u64;
        if self.stop_time.is_some_and(|stop| committed_at >= stop) {
            // The stop time: this transaction, committed at or after it, is not the job's.
            let position = Position::of(&WalPosition { lsn: Lsn(self.boundary.max(final_lsn.0)).to_string() });
            self.ready.push_back(StreamEvent::End { position, committed_at });
            self.ended = true;
            return false;
        }
        // The start of the transaction's commit record is a place to resume from with the
        // transaction ahead (the server skips only transactions committed before it): the
        // engine compares the copy's positions with it, so a transaction counts as after a
        // snapshot exactly when it commits after the snapshot's position.
        if final_lsn.0 > self.boundary {
            self.boundary = final_lsn.0;
            let position = Position::of(&WalPosition { lsn: final_lsn.to_string() });
            self.ready.push_back(StreamEvent::Advance { position, committed_at });
        }
        self.in_transaction = true;
        self.returned = false;
        true
    }

    /// The open transaction committed; `end_lsn` is past its commit record.
    fn commit(&mut self, end_lsn: Lsn, commit_time: i64) {
        self.in_transaction = false;
        self.boundary = end_lsn.0;
        let position = Position::of(&WalPosition { lsn: end_lsn.to_string() });
        let committed_at = (commit_time / 1_000_000 + POSTGRES_EPOCH_SECONDS).max(0) as u64;
        if self.changes.is_empty() && !self.returned {
            self.ready.push_back(StreamEvent::Advance { position, committed_at });
        } else {
            if !self.changes.is_empty() {
                self.ready.push_back(StreamEvent::Changes(std::mem::take(&mut self.changes)));
            }
            self.ready.push_back(StreamEvent::Commit { position, committed_at });
        }
    }

    fn slot_error(&self, message: String) -> Error {
        Error::new(ErrorKind::Read, message).on(Side::Source)
    }

    /// Takes one message of the slot's stream into `ready` / `changes`.
    async fn take(&mut self, message: LogicalMessage) -> Result<()> {
        if self.ended {
            return Ok(());
        }
        match message {
            LogicalMessage::Begin { final_lsn, commit_time, .. } => {
                self.begin(final_lsn, commit_time);
            }
            LogicalMessage::Commit { end_lsn, commit_time, .. } => self.commit(end_lsn, commit_time),
            LogicalMessage::Relation(relation) => self.relation(relation).await?,
            LogicalMessage::Insert { relation, new, .. } => {
                if let Some(table) = self.table(relation)? {
                    let after = self.row(&table, relation, &new, None)?;
                    self.push(Change { table, kind: ChangeKind::Insert { after } });
                }
            }
            LogicalMessage::Update { relation, old, new, .. } => {
                if let Some(table) = self.table(relation)? {
                    let old_values = old.as_ref().map(OldTuple::values);
                    let after = self.row(&table, relation, &new, old_values)?;
                    let before = match &old {
                        Some(old) => self.row(&table, relation, old.values(), None)?,
                        // The key did not change: the row before has the same key.
                        None => after.clone(),
                    };
                    self.push(Change { table, kind: ChangeKind::Update { before, after } });
                }
            }
            LogicalMessage::Delete { relation, old, .. } => {
                if let Some(table) = self.table(relation)? {
                    let before = self.row(&table, relation, old.values(), None)?;
                    self.push(Change { table, kind: ChangeKind::Delete { before } });
                }
            }
            LogicalMessage::Truncate { relations, .. } => {
                let mut truncated = Vec::new();
                for relation in relations {
                    if let Some(table) = self.table(relation)? {
                        truncated.push(table.name.clone());
                    }
                }
                if !truncated.is_empty() {
                    self.before_changes("TRUNCATE", &truncated)?;
                    // Changes of the same tables earlier in the transaction are emptied anyway.
                    self.changes.retain(|change| !truncated.contains(&change.table.name));
                    let statement = format!(
                        "TRUNCATE {}",
                        truncated.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                    );
                    let changes = truncated.into_iter().map(SourceSchemaChange::Truncate).collect();
                    self.ready.push_back(self.schema_event(statement, changes));
                }
            }
            LogicalMessage::Type { .. } | LogicalMessage::Origin { .. } | LogicalMessage::Message { .. } => {}
            LogicalMessage::StreamStart { xid, first_segment } => {
                self.streamed.start(xid, first_segment).map_err(|error| self.streamed_error(error))?
            }
            LogicalMessage::StreamStop => self.streamed.stop(),
            LogicalMessage::StreamCommit { xid, commit_lsn, end_lsn, commit_time } => {
                let replay = self.streamed.commit(xid).map_err(|error| self.streamed_error(error))?;
                if self.begin(commit_lsn, commit_time) {
                    self.replay = Some((replay, end_lsn, commit_time));
                }
            }
            LogicalMessage::StreamAbort { xid, subxid, .. } => self.streamed.abort(xid, subxid),
        }
        Ok(())
    }

    fn push(&mut self, change: Change) {
        self.changes.push(change);
        if self.changes.len() >= self.batch_rows {
            self.ready.push_back(StreamEvent::Changes(std::mem::take(&mut self.changes)));
            self.returned = true;
        }
    }

    /// A schema change must reach the engine before any change of its transaction; one that
    /// comes after some were returned (a transaction of more than a batch of rows changed the
    /// table's shape part-way) stops the stream, naming the table.
    fn before_changes(&self, what: &str, tables: &[TableName]) -> Result<()> {
        if !self.returned {
            return Ok(());
        }
        let names: Vec<String> = tables.iter().map(ToString::to_string).collect();
        Err(Error::new(
            ErrorKind::Schema,
            format!(
                "{what} of {} comes after more than {} row changes of the same source transaction; sluice applies it only before them",
                names.join(", "),
                self.batch_rows
            ),
        )
        .on(Side::Source)
        .hint("raise limits.batch_rows above the transaction's row changes, or run the schema change in a transaction of its own"))
    }

    /// A schema change event, placed at the last boundary: it is applied before the open
    /// transaction, and read again with it after a restart (applying it twice changes nothing).
    fn schema_event(&self, statement: String, changes: Vec<SourceSchemaChange>) -> StreamEvent {
        StreamEvent::SchemaChange {
            statement,
            changes,
            position: Position::of(&WalPosition { lsn: format_lsn(self.boundary) }),
            committed_at: sluice_core::clock::unix_seconds(),
        }
    }

    fn table(&self, relation: u32) -> Result<Option<Arc<TableSchema>>> {
        match self.relations.get(&relation) {
            Some(table) => Ok(table.clone()),
            None => Err(self.slot_error(format!("the stream sent a row of relation {relation} before describing it"))),
        }
    }

    /// A row's values from a tuple, in the table's columns. A TOASTed value the update did not
    /// touch is taken from the old row when the server sent it (REPLICA IDENTITY FULL), else it
    /// is `Value::Unchanged`: the target keeps its own (`FoldedChangeWriter::update`).
    fn row(&self, table: &TableSchema, relation: u32, tuple: &Tuple, old: Option<&Tuple>) -> Result<Row> {
        let mut row = Vec::with_capacity(table.columns.len());
        for (index, (column, value)) in table.columns.iter().zip(tuple).enumerate() {
            let value = match value {
                TupleValue::Null => Value::Null,
                TupleValue::Text(bytes) => self.value(table, column, bytes)?,
                TupleValue::Binary(_) => {
                    return Err(
                        self.slot_error(format!("relation {relation} sent a binary value, which was not asked for"))
                    )
                }
                TupleValue::UnchangedToast => match old.and_then(|old| old.get(index)) {
                    Some(TupleValue::Text(bytes)) => self.value(table, column, bytes)?,
                    _ => Value::Unchanged,
                },
            };
            row.push(value);
        }
        if row.len() != table.columns.len() {
            return Err(self.slot_error(format!(
                "a row of table {} has {} values for {} columns",
                table.name,
                row.len(),
                table.columns.len()
            )));
        }
        Ok(row)
    }

    fn value(&self, table: &TableSchema, column: &Column, bytes: &[u8]) -> Result<Value> {
        let text = std::str::from_utf8(bytes).map_err(|_| {
            self.slot_error(format!("table {} column {}: a value is not UTF-8", table.name, column.name))
        })?;
        values::parse(text, &column.data_type).map_err(|reason| {
            Error::new(ErrorKind::Read, format!("table {} column {}: {reason}", table.name, column.name))
                .on(Side::Source)
        })
    }

    /// Takes a table's description: the catalog's when it agrees with the relation (keys,
    /// indexes, defaults as a snapshot has them), else the relation's own columns. A shape
    /// other than the one last given for the table is a schema change: columns added, or
    /// dropped, or retyped; a column dropped and another added in one step could be a rename,
    /// which the stream cannot tell, and stops it.
    async fn relation(&mut self, relation: Relation) -> Result<()> {
        let name = TableName::new(
            Some(if relation.namespace.is_empty() { "pg_catalog" } else { &relation.namespace }),
            &relation.name,
        );
        if !self.filter.matches(&name) {
            self.relations.insert(relation.oid, None);
            return Ok(());
        }
        let shape = Arc::new(self.shape(&name, &relation).await?);
        let previous = self.shapes.get(&name).or_else(|| self.planned.get(&name)).cloned();
        let change = match &previous {
            Some(previous) => column_changes(previous, &shape),
            None => None,
        };
        if previous.is_none() && !self.planned.is_empty() {
            // Created since the job was planned (a publication of whole schemas publishes it):
            // the target creates it before its first rows.
            self.before_changes("CREATE TABLE", std::slice::from_ref(&name))?;
            let statement = format!("CREATE TABLE {name} (from the stream's first relation message for it)");
            self.ready.push_back(self.schema_event(statement, vec![SourceSchemaChange::Create(name.clone())]));
        }
        if let Some((added, dropped, retyped)) = change {
            if !added.is_empty() && !dropped.is_empty() {
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!(
                        "table {name} lost columns {} and gained {} in one change: a rename cannot be told from a drop and an add in PostgreSQL's stream",
                        dropped.join(", "),
                        added.join(", ")
                    ),
                )
                .on(Side::Source)
                .hint("add and drop columns in separate transactions, or reset the job to copy the table again"));
            }
            self.before_changes("a schema change", std::slice::from_ref(&name))?;
            if self.changes.iter().any(|change| change.table.name == name) {
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!(
                        "a source transaction changed rows of table {name}, then its columns (added {added:?}, dropped {dropped:?}, retyped {retyped:?}), then more rows: sluice applies a schema change only before a transaction's rows of the table"
                    ),
                )
                .on(Side::Source)
                .hint("run the ALTER TABLE in a transaction of its own (or before the transaction's first change of the table)"));
            }
            let statement = format!(
                "ALTER TABLE {name} (from the stream's relation message: added {:?}, dropped {:?}, retyped {:?})",
                added, dropped, retyped
            );
            let changes = vec![SourceSchemaChange::Alter { table: name.clone(), renamed: Vec::new(), retyped }];
            self.ready.push_back(self.schema_event(statement, changes));
        }
        self.shapes.insert(name, shape.clone());
        self.relations.insert(relation.oid, Some(shape));
        Ok(())
    }

    /// The table's schema at the relation: the catalog's description if its columns are the
    /// relation's, else one built from the relation (types looked up by oid). Whether its old
    /// rows are whole is the relation's say: the catalog now may have changed since.
    async fn shape(&self, name: &TableName, relation: &Relation) -> Result<TableSchema> {
        let described = match catalog::describe(&self.client, name, &self.server).await {
            Ok(mut described) => {
                described.schema.details.old_values_unknown = relation.replica_identity != b'f';
                Some(described.schema)
            }
            Err(error) if error.kind() == ErrorKind::Schema => None,
            Err(error) => return Err(error),
        };
        let mut columns = Vec::with_capacity(relation.columns.len());
        for column in &relation.columns {
            let described =
                described.as_ref().and_then(|table| table.columns.iter().find(|known| known.name == column.name));
            let (data_type, native_type) = self.column_type(column.type_oid, column.type_modifier).await?;
            match described {
                Some(known) if known.data_type == data_type => columns.push(known.clone()),
                _ => columns.push(Column { native_type, ..Column::new(column.name.clone(), data_type, !column.key) }),
            }
        }
        let Some(described) = described else {
            let details = sluice_core::schema::TableDetails {
                dialect: Some(catalog::DIALECT.to_owned()),
                old_values_unknown: relation.replica_identity != b'f',
                ..Default::default()
            };
            return Ok(TableSchema {
                name: name.clone(),
                columns,
                primary_key: key_of(relation),
                indexes: Vec::new(),
                details,
            });
        };
        if described.columns == columns {
            return Ok(described);
        }
        let names: Vec<&str> = columns.iter().map(|column| column.name.as_str()).collect();
        let key: Option<Vec<usize>> = described
            .primary_key
            .iter()
            .map(|&index| names.iter().position(|name| *name == described.columns[index].name))
            .collect();
        let primary_key = key.filter(|key| !key.is_empty()).unwrap_or_else(|| key_of(relation));
        let indexes = described
            .indexes
            .iter()
            .filter_map(|index| {
                let columns: Option<Vec<usize>> = index
                    .columns
                    .iter()
                    .map(|&column| names.iter().position(|name| *name == described.columns[column].name))
                    .collect();
                Some(sluice_core::Index { columns: columns?, ..index.clone() })
            })
            .collect();
        Ok(TableSchema { name: name.clone(), columns, primary_key, indexes, details: described.details })
    }

    /// A type oid and modifier as the catalog module maps it, with the built-in type's name.
    async fn column_type(&self, oid: u32, modifier: i32) -> Result<(sluice_core::DataType, String)> {
        let row = self
            .client
            .query_one(
                "SELECT COALESCE(bt.typname, t.typname)::text, COALESCE(bt.typtype, t.typtype)::text, \
                 COALESCE(bt.typcategory, t.typcategory)::text, COALESCE(bt.typnamespace, t.typnamespace) = 'pg_catalog'::regnamespace, \
                 CASE WHEN t.typtype = 'd' THEN format_type(t.typbasetype, t.typtypmod) ELSE format_type(t.oid, $2) END, \
                 CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE $2 END, \
                 (SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = COALESCE(bt.oid, t.oid)) \
                 FROM pg_type t LEFT JOIN pg_type bt ON t.typtype = 'd' AND bt.oid = t.typbasetype WHERE t.oid = $1",
                &[&oid, &modifier],
            )
            .await
            .map_err(|error| postgres_error(error, Side::Source, &self.server, "read a column's type"))?;
        let builtin: bool = row.get(3);
        let data_type = data_type(row.get(0), row.get(5), row.get(1), row.get(2), row.get(6));
        Ok((data_type, if builtin { row.get(4) } else { String::new() }))
    }
}

/// The relation's key columns, unless every column is one (REPLICA IDENTITY FULL).
fn key_of(relation: &Relation) -> Vec<usize> {
    let key: Vec<usize> =
        relation.columns.iter().enumerate().filter(|(_, column)| column.key).map(|(index, _)| index).collect();
    if relation.replica_identity == b'f' || key.len() == relation.columns.len() {
        Vec::new()
    } else {
        key
    }
}

/// Columns added, dropped and retyped from `before` to `after`; `None` when none.
fn column_changes(before: &TableSchema, after: &TableSchema) -> Option<(Vec<String>, Vec<String>, Vec<String>)> {
    let named = |table: &TableSchema, name: &str| table.columns.iter().find(|column| column.name == name).cloned();
    let added: Vec<String> = after
        .columns
        .iter()
        .filter(|column| named(before, &column.name).is_none())
        .map(|column| column.name.clone())
        .collect();
    let dropped: Vec<String> = before
        .columns
        .iter()
        .filter(|column| named(after, &column.name).is_none())
        .map(|column| column.name.clone())
        .collect();
    let retyped: Vec<String> = after
        .columns
        .iter()
        .filter(|column| named(before, &column.name).is_some_and(|old| old.data_type != column.data_type))
        .map(|column| column.name.clone())
        .collect();
    (!added.is_empty() || !dropped.is_empty() || !retyped.is_empty()).then_some((added, dropped, retyped))
}

#[async_trait]
impl ChangeStream for WalChangeStream {
    async fn next(&mut self) -> Result<StreamEvent> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(event);
            }
            if !self.in_transaction && self.replay.is_none() && self.publication_checked.elapsed() >= PUBLICATION_CHECK
            {
                self.check_publication().await?;
            }
            if let Some((replay, end_lsn, commit_time)) = &mut self.replay {
                // A committed streamed transaction: its messages as if they had come now.
                match replay.next_message() {
                    Ok(Some(data)) => {
                        let decoded =
                            decode(data, true).map_err(|error| replication_error(error, &self.server, &self.slot))?;
                        self.take(decoded).await?;
                    }
                    Ok(None) => {
                        let (end_lsn, commit_time) = (*end_lsn, *commit_time);
                        self.replay = None;
                        self.commit(end_lsn, commit_time);
                    }
                    Err(error) => return Err(self.streamed_error(StreamedError::Io(error))),
                }
                continue;
            }
            let message = match tokio::time::timeout(SILENCE_LIMIT, self.pump.recv()).await {
                Ok(Some(Ok(message))) => message,
                Ok(Some(Err(error))) => return Err(replication_error(error, &self.server, &self.slot)),
                Ok(None) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("the replication session with {} ended", self.server),
                    )
                    .on(Side::Source))
                }
                Err(_) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "the replication stream of {} was silent for {} s",
                            self.server,
                            SILENCE_LIMIT.as_secs()
                        ),
                    )
                    .on(Side::Source))
                }
            };
            match message {
                ReplicationMessage::XLogData { data, .. }
                    if self.streamed.in_chunk() && data.first() != Some(&b'E') =>
                {
                    self.streamed.keep(data).map_err(|error| self.streamed_error(error))?
                }
                ReplicationMessage::XLogData { data, .. } => {
                    let decoded =
                        decode(data, false).map_err(|error| replication_error(error, &self.server, &self.slot))?;
                    self.take(decoded).await?;
                }
                ReplicationMessage::Keepalive { wal_end, .. } => {
                    // Between transactions the server has sent everything before `wal_end`:
                    // the job's place may move there, so the slot frees the WAL of other
                    // tables' changes.
                    if !self.in_transaction && wal_end.0 > self.boundary && self.changes.is_empty() {
                        self.boundary = wal_end.0;
                        return Ok(StreamEvent::Advance {
                            position: Position::of(&WalPosition { lsn: wal_end.to_string() }),
                            committed_at: sluice_core::clock::unix_seconds(),
                        });
                    }
                }
            }
        }
    }

    async fn ack(&mut self, position: &Position) -> Result<()> {
        if let Some(lsn) = super::position_lsn(position) {
            self.pump.stored(lsn);
        }
        Ok(())
    }
}
