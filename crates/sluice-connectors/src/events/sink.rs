//! The sink of every stream target: snapshot rows become snapshot events, a raw change stream
//! becomes one event per row change, each transaction whole, and a `Transport` carries them.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use sluice_core::change::key_identity;
use sluice_core::connector::{
    ChangeWriter, CheckItem, Checkpoint, EventChangeSink, EventWriter, HeldRows, SchemaChange, Sink, TableTasks,
    TableWriter, TransactionEnd,
};
use sluice_core::{Batch, Change, Error, ErrorKind, Rejected, Result, Side, TableName, TableSchema};

use super::format::{Event, EventKind, TransactionInfo};
use super::{Channel, EventOptions, Message, Origin, Transport};

/// Messages sent to the transport in one call, so a large group is pipelined, not held.
const SEND_BATCH: usize = 1024;

/// A stream target: the options, the origin written in each event and the broker.
#[derive(Clone)]
pub struct EventSink {
    options: EventOptions,
    /// The source connector type, for Debezium's `source.connector`.
    source_connector: String,
    transport: Arc<dyn Transport>,
}

impl EventSink {
    pub fn new(options: EventOptions, source_connector: &str, transport: Arc<dyn Transport>) -> EventSink {
        EventSink { options, source_connector: source_connector.to_owned(), transport }
    }

    fn origin(&self, job: &str) -> Origin {
        Origin { job: job.to_owned(), connector: self.source_connector.clone() }
    }

    /// The destinations of these tables, or every name the broker would refuse, at once.
    fn destinations(&self, tables: &[&TableName]) -> Result<Vec<String>> {
        let mut destinations = Vec::new();
        let mut refused = Vec::new();
        for table in tables {
            let destination = self.options.template.render(table);
            if let Some(reason) = self.transport.refuse_destination(&destination) {
                refused.push(format!("table {table} would go to `{destination}`: {reason}"));
            }
            if !destinations.contains(&destination) {
                destinations.push(destination);
            }
        }
        if refused.is_empty() {
            Ok(destinations)
        } else {
            Err(Error::new(ErrorKind::Config, refused.join("; "))
                .on(Side::Target)
                .hint("change the target's destination template, or leave these tables out of `source.tables`"))
        }
    }
}

/// A message id: a SHA-256 of its parts, hex, 32 characters. The parts never include a time.
impl std::fmt::Debug for EventSink {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("EventSink").field("options", &self.options).finish_non_exhaustive()
    }
}

fn message_id(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = hasher.finalize();
    let mut id = String::with_capacity(32);
    for byte in &digest[..16] {
        id.push(HEX[usize::from(byte >> 4)] as char);
        id.push(HEX[usize::from(byte & 15)] as char);
    }
    id
}

fn now_ms() -> u64 {
    sluice_core::clock::unix_millis()
}

#[async_trait]
impl Sink for EventSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        self.transport.check().await
    }

    fn target_name(&self, source: &TableName) -> TableName {
        source.clone()
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables
            .iter()
            .map(|table| {
                let destination = self.options.template.render(&table.name);
                format!(
                    "-- {}: events of {} go to {}",
                    self.options.format.name(),
                    table.name,
                    self.transport.describe(&destination)
                )
            })
            .collect()
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        let names: Vec<&TableName> = tables.iter().map(|table| &table.name).collect();
        let destinations = self.destinations(&names)?;
        self.transport.prepare(&destinations).await
    }

    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let mut tasks: Vec<String> = tables.iter().flat_map(|table| table.tasks.iter().cloned()).collect();
        tasks.push(sluice_core::names::STREAM_TASK.to_owned());
        self.transport.forget(job, &tasks).await
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        let destination = self.destinations(&[&table.name])?.remove(0);
        Ok(Box::new(SnapshotWriter {
            channel: self.transport.open(job, task).await?,
            options: self.options.clone(),
            origin: self.origin(job),
            job: job.to_owned(),
            task: task.to_owned(),
            table,
            destination,
            ordinal: 0,
            staged: Vec::new(),
        }))
    }

    sluice_core::capabilities!(event_changes: EventChangeSink);
}

#[async_trait]
impl EventChangeSink for EventSink {
    async fn open_events(&self, job: &str, task: &str) -> Result<Box<dyn EventWriter>> {
        Ok(Box::new(ChangeEventWriter {
            channel: self.transport.open(job, task).await?,
            sink: self.clone(),
            origin: self.origin(job),
            job: job.to_owned(),
            task: task.to_owned(),
            destinations: HashMap::new(),
            open: Vec::new(),
            ready: Vec::new(),
        }))
    }

    async fn held_rows(&self, job: &str, tasks: &[String]) -> Result<Vec<HeldRows>> {
        self.transport.held(job, tasks).await
    }
}

/// Writes one snapshot task's rows as snapshot events.
struct SnapshotWriter {
    channel: Box<dyn Channel>,
    options: EventOptions,
    origin: Origin,
    job: String,
    task: String,
    table: Arc<TableSchema>,
    destination: String,
    /// Rows of the task written before this batch's: the id of a row of a table with no key.
    ordinal: u64,
    staged: Vec<Message>,
}

#[async_trait]
impl TableWriter for SnapshotWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        let checkpoint = self.channel.recover().await?;
        self.ordinal = checkpoint.as_ref().map_or(0, |checkpoint| checkpoint.rows_written);
        Ok(checkpoint)
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        let ts_ms = now_ms();
        let keyed = !self.table.primary_key.is_empty();
        let ahead = keyed && self.channel.writes_ahead();
        for change in &batch.changes {
            let event = Event {
                table: &self.table,
                kind: EventKind::Snapshot { after: change.row() },
                ts_ms,
                position: None,
                transaction: None,
            };
            // A row with a key is named by it; a keyless table's rows by their place in the split,
            // which a split read whole keeps on every run.
            let identity = if keyed { event.key_text() } else { self.ordinal.to_string() };
            self.ordinal += 1;
            self.staged.push(Message {
                destination: self.destination.clone(),
                key: self.options.format.key(&event),
                payload: self.options.format.value(&event, &self.origin),
                id: message_id(&[&self.job, &self.task, "row", &identity]),
                identity: ahead.then(|| key_identity(&self.table, change.row())),
            });
        }
        if ahead {
            self.channel.intend(&batch.position, &self.staged).await?;
        }
        while !self.staged.is_empty() {
            let rest = self.staged.split_off(self.staged.len().min(SEND_BATCH));
            self.channel.send(std::mem::replace(&mut self.staged, rest)).await?;
        }
        Ok(Vec::new())
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        if !self.staged.is_empty() {
            self.channel.send(std::mem::take(&mut self.staged)).await?;
        }
        self.channel.commit(checkpoint).await
    }

    async fn replace_all(&mut self) -> Result<()> {
        // Events cannot be taken back: the split's events are sent again, with the same ids.
        self.ordinal = 0;
        Ok(())
    }
}

/// Writes a raw change stream, a whole transaction at a time.
struct ChangeEventWriter {
    channel: Box<dyn Channel>,
    sink: EventSink,
    origin: Origin,
    job: String,
    task: String,
    destinations: HashMap<TableName, String>,
    /// The row events of the open source transaction.
    open: Vec<Change>,
    /// Messages of ended transactions not yet sent.
    ready: Vec<Message>,
}

impl ChangeEventWriter {
    fn destination(&mut self, table: &TableName) -> Result<String> {
        if let Some(destination) = self.destinations.get(table) {
            return Ok(destination.clone());
        }
        let destination = self.sink.destinations(&[table])?.remove(0);
        self.destinations.insert(table.clone(), destination.clone());
        Ok(destination)
    }
}

#[async_trait]
impl ChangeWriter for ChangeEventWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.open.clear();
        self.ready.clear();
        self.channel.recover().await
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        if !self.ready.is_empty() {
            self.channel.send(std::mem::take(&mut self.ready)).await?;
        }
        self.channel.commit(checkpoint).await
    }

    /// Events carry each row's columns, so a schema change needs nothing but the destination
    /// of a table the stream creates or renames.
    async fn apply_schema_change(&mut self, change: &SchemaChange) -> Result<()> {
        let table = match change {
            SchemaChange::Create(table) => table.name.clone(),
            SchemaChange::Rename { to, .. } => to.clone(),
            _ => return Ok(()),
        };
        let destination = self.destination(&table)?;
        self.sink.transport.prepare(&[destination]).await
    }
}

#[async_trait]
impl EventWriter for ChangeEventWriter {
    async fn events(&mut self, changes: &[Change]) -> Result<()> {
        let limit = self.sink.options.max_transaction_events;
        if (self.open.len() + changes.len()) as u64 > limit {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "a source transaction has more than {limit} row events; a stream target holds a transaction whole before it sends it (each event carries the transaction's event count)"
                ),
            )
            .on(Side::Target)
            .hint("raise target.max_transaction_events (memory grows with it), or split the transaction at the source"));
        }
        self.open.extend_from_slice(changes);
        Ok(())
    }

    async fn transaction_end(&mut self, end: &TransactionEnd) -> Result<()> {
        let open = std::mem::take(&mut self.open);
        let format = self.sink.options.format;
        let events: Vec<(&Change, EventKind<'_>)> = open
            .iter()
            .flat_map(|change| format.events_of(change).into_iter().map(move |kind| (change, kind)))
            .collect();
        let count = events.len() as u64;
        let ts_ms = end.committed_at * 1000;
        let position = end.position.0.to_string();
        for (index, (change, kind)) in events.into_iter().enumerate() {
            let event = Event {
                table: &change.table,
                kind,
                ts_ms,
                position: Some(&position),
                transaction: Some(TransactionInfo { id: &end.id, index: index as u64, count }),
            };
            let message = Message {
                destination: self.destination(&change.table.name)?,
                key: format.key(&event),
                payload: format.value(&event, &self.origin),
                id: message_id(&[&self.job, &self.task, &end.id, &index.to_string()]),
                identity: None,
            };
            self.ready.push(message);
        }
        if self.ready.len() >= SEND_BATCH {
            self.channel.send(std::mem::take(&mut self.ready)).await?;
        }
        Ok(())
    }
}
