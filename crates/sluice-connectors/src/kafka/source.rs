//! Kafka as a change source: topics of change events (Maxwell or Debezium JSON, from Sluice or
//! from the tools themselves) read back into row changes for any table target.
//!
//! The position is the next offset of every partition read, kept by the target in the same
//! transaction as the rows (never in a consumer group), so a target applies each record exactly
//! once across crashes. Records are read `read_committed`: an aborted Kafka transaction is never
//! applied. A table's columns come from the first event of its topic: a schema carried by the
//! event (`debezium-schema`), else the row's columns with types inferred from their JSON values.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sluice_core::change::Change;
use sluice_core::connector::{ChangeSource, ChangeStream, CheckItem, Source, StreamEvent};
use sluice_core::{Error, ErrorKind, Position, Result, Side, TableName, TableSchema};

use super::{blocking, client_config, client_error, connect_error, KafkaSecurity, REQUEST_TIMEOUT};
use crate::events::check_item;
use crate::events::decode::read_event;
use crate::events::source::{no_events_yet, now_seconds, FoundTables, SourceOptions};

/// How long reading the first event of every table's topic may take.
const DISCOVER_TIMEOUT: Duration = Duration::from_secs(60);

/// A `kafka` source's options; `stream.template` renders a table's topic.
#[derive(Debug, Clone)]
pub struct KafkaSourceOptions {
    pub brokers: String,
    pub security: KafkaSecurity,
    pub stream: SourceOptions,
}

/// Where the stream stands: the next offset to read of each partition (topic → partition →
/// offset). A partition not in it is read from its beginning.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Offsets(BTreeMap<String, BTreeMap<i32, i64>>);

impl Offsets {
    fn of(position: &Position) -> Result<Offsets> {
        position.read("the Kafka source's stream")
    }

    fn next(&self, topic: &str, partition: i32) -> Option<i64> {
        self.0.get(topic)?.get(&partition).copied()
    }

    fn set(&mut self, topic: &str, partition: i32, offset: i64) {
        self.0.entry(topic.to_owned()).or_default().insert(partition, offset);
    }
}

fn unavailable(doing: &str, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("Kafka: {doing}: {error}")).on(Side::Source)
}

/// Kafka topics of change events as a source.
pub struct KafkaSource {
    options: KafkaSourceOptions,
    /// Tables as their first events describe them, filled by `discover`.
    schemas: FoundTables,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("KafkaSource").field("brokers", &self.options.brokers).finish()
    }
}

impl KafkaSource {
    pub fn new(options: KafkaSourceOptions) -> KafkaSource {
        KafkaSource { options, schemas: FoundTables::default() }
    }

    fn topics(&self) -> BTreeSet<String> {
        self.options.stream.tables.iter().map(|table| self.options.stream.template.render(table)).collect()
    }

    fn consumer<C: rdkafka::config::FromClientConfig>(&self) -> Result<C> {
        client_config(&self.options.brokers, &self.options.security)
            // librdkafka wants a group id; nothing is ever committed to it.
            .set("group.id", "sluice-source")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .create()
            .map_err(|error| client_error(Side::Source, &self.options.brokers, error))
    }

    /// The partitions of every topic, from the brokers' metadata; a missing topic is an error
    /// naming every one missing.
    fn partitions(&self, consumer: &BaseConsumer) -> Result<BTreeMap<String, Vec<i32>>> {
        let metadata = consumer
            .fetch_metadata(None, REQUEST_TIMEOUT)
            .map_err(|error| connect_error(Side::Source, &self.options.brokers, error))?;
        let mut found = BTreeMap::new();
        for topic in metadata.topics().iter().filter(|topic| topic.error().is_none()) {
            found.insert(topic.name().to_owned(), topic.partitions().iter().map(|partition| partition.id()).collect());
        }
        let missing: Vec<String> = self.topics().into_iter().filter(|topic| !found.contains_key(topic)).collect();
        if !missing.is_empty() {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "Kafka at {}: no topic {} (source.topic renders source.tables into them)",
                    self.options.brokers,
                    missing.join(", ")
                ),
            )
            .on(Side::Source)
            .hint("start the job that writes the events first, or fix source.topic or source.tables"));
        }
        Ok(found.into_iter().filter(|(topic, _)| self.topics().contains(topic)).collect())
    }

    /// Reads each topic from its beginning until each of its tables has an event (or every
    /// partition is at its end), and makes the tables' schemas from their first events.
    fn first_events(&self) -> Result<HashMap<TableName, TableSchema>> {
        let probe: BaseConsumer = self.consumer()?;
        let partitions = self.partitions(&probe)?;
        let mut schemas = HashMap::new();
        let deadline = Instant::now() + DISCOVER_TIMEOUT;
        for (topic, ids) in &partitions {
            let wanted: BTreeSet<&TableName> = self
                .options
                .stream
                .tables
                .iter()
                .filter(|table| &self.options.stream.template.render(table) == topic)
                .collect();
            // One consumer per topic: librdkafka names the partition at its end by number only.
            let consumer: BaseConsumer = self.consumer()?;
            let mut assignment = TopicPartitionList::new();
            for id in ids {
                assignment
                    .add_partition_offset(topic, *id, Offset::Beginning)
                    .map_err(|error| unavailable("assigning partitions", error))?;
            }
            consumer.assign(&assignment).map_err(|error| unavailable("assigning partitions", error))?;
            let mut pending: BTreeSet<i32> = ids.iter().copied().collect();
            while !pending.is_empty() && wanted.iter().any(|table| !schemas.contains_key(*table)) {
                if Instant::now() > deadline {
                    return Err(unavailable(
                        &format!("reading the first events of topic {topic}"),
                        format!("partitions {pending:?} did not reach their end in {} s", DISCOVER_TIMEOUT.as_secs()),
                    ));
                }
                match consumer.poll(Duration::from_millis(200)) {
                    None => {}
                    Some(Err(KafkaError::PartitionEOF(partition))) => {
                        pending.remove(&partition);
                    }
                    Some(Err(error)) => return Err(unavailable(&format!("reading topic {topic}"), error)),
                    Some(Ok(message)) => {
                        let at = |reason: &str| bad_event(topic, message.partition(), message.offset(), reason);
                        let event = read_event(self.options.stream.format, message.key(), message.payload())
                            .map_err(|reason| at(&reason))?;
                        if let Some(event) = event {
                            if wanted.contains(&event.table) && !schemas.contains_key(&event.table) {
                                let schema = event.schema().map_err(|reason| at(&reason))?;
                                schemas.insert(event.table.clone(), schema);
                            }
                        }
                    }
                }
            }
        }
        let missing: Vec<String> = self
            .options
            .stream
            .tables
            .iter()
            .filter(|table| !schemas.contains_key(*table))
            .map(|table| format!("{table} (topic {})", self.options.stream.template.render(table)))
            .collect();
        if !missing.is_empty() {
            return Err(no_events_yet("Kafka", &missing));
        }
        Ok(schemas)
    }

    fn watermarks(&self) -> Result<Offsets> {
        let consumer: BaseConsumer = self.consumer()?;
        let mut offsets = Offsets::default();
        for (topic, ids) in self.partitions(&consumer)? {
            for id in ids {
                let (_, high) = consumer
                    .fetch_watermarks(&topic, id, REQUEST_TIMEOUT)
                    .map_err(|error| connect_error(Side::Source, &self.options.brokers, error))?;
                offsets.set(&topic, id, high);
            }
        }
        Ok(offsets)
    }
}

fn bad_event(topic: &str, partition: i32, offset: i64, reason: &str) -> Error {
    Error::new(ErrorKind::Schema, format!("Kafka topic {topic}, partition {partition}, offset {offset}: {reason}"))
        .on(Side::Source)
        .hint("check source.format against what the producer writes; a record that cannot be applied stops the stream at its offset")
}

#[async_trait]
impl Source for KafkaSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let consumer: BaseConsumer = self.consumer()?;
        let this = KafkaSource::new(self.options.clone());
        let partitions = blocking(move || this.partitions(&consumer)).await??;
        Ok(partitions
            .into_iter()
            .map(|(topic, ids)| check_item(&format!("topic {topic}"), true, format!("{} partitions", ids.len())))
            .collect())
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        let this = KafkaSource::new(self.options.clone());
        let found = blocking(move || this.first_events()).await??;
        Ok(self.schemas.keep(found.into_values().collect()))
    }

    sluice_core::capabilities!(changes: ChangeSource);
}

#[async_trait]
impl ChangeSource for KafkaSource {
    async fn log_position(&self) -> Result<Option<Position>> {
        let this = KafkaSource::new(self.options.clone());
        let offsets = blocking(move || this.watermarks()).await??;
        Ok(Some(Position::of(&offsets)))
    }

    async fn start_position(&self) -> Result<Option<Position>> {
        Ok((!self.options.stream.latest).then(|| Position::of(&Offsets::default())))
    }

    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
        let offsets = Offsets::of(after)?;
        let schemas = self.schemas.or_discover(self.discover()).await?;
        let probe: BaseConsumer = self.consumer()?;
        let this = KafkaSource::new(self.options.clone());
        let partitions = blocking(move || this.partitions(&probe)).await??;
        let consumer: StreamConsumer = self.consumer()?;
        let mut assignment = TopicPartitionList::new();
        for (topic, ids) in &partitions {
            for id in ids {
                let offset = offsets.next(topic, *id).map_or(Offset::Beginning, Offset::Offset);
                assignment
                    .add_partition_offset(topic, *id, offset)
                    .map_err(|error| unavailable("assigning partitions", error))?;
            }
        }
        consumer.assign(&assignment).map_err(|error| unavailable("assigning partitions", error))?;
        Ok(Box::new(KafkaStream { consumer, format: self.options.stream.format, schemas, offsets, pending: None }))
    }

    /// The producer's snapshot rows and the changes around them overlap (docs/events.md):
    /// events are applied by key.
    fn applies_by_key(&self) -> bool {
        true
    }

    fn reached(&self, position: &Position, mark: &Position) -> bool {
        let (Ok(position), Ok(mark)) = (Offsets::of(position), Offsets::of(mark)) else { return false };
        mark.0.iter().all(|(topic, partitions)| {
            partitions.iter().all(|(id, offset)| position.next(topic, *id).unwrap_or(0) >= *offset)
        })
    }
}

/// The records of the source's topics, one transaction each, in each partition's order.
struct KafkaStream {
    consumer: StreamConsumer,
    format: crate::events::EventFormat,
    schemas: HashMap<TableName, Arc<TableSchema>>,
    offsets: Offsets,
    /// The commit that follows the changes just returned.
    pending: Option<StreamEvent>,
}

impl KafkaStream {
    /// The partition's position after its end was reached: past the control records that
    /// close Kafka transactions, which carry no message.
    fn caught_up(&mut self, partition: i32) -> bool {
        let Ok(positions) = self.consumer.position() else { return false };
        let mut moved = false;
        for element in positions.elements().iter().filter(|element| element.partition() == partition) {
            if let Offset::Offset(offset) = element.offset() {
                if self.offsets.next(element.topic(), partition).is_none_or(|known| offset > known) {
                    self.offsets.set(element.topic(), partition, offset);
                    moved = true;
                }
            }
        }
        moved
    }
}

#[async_trait]
impl ChangeStream for KafkaStream {
    async fn next(&mut self) -> Result<StreamEvent> {
        if let Some(commit) = self.pending.take() {
            return Ok(commit);
        }
        loop {
            let message = match self.consumer.recv().await {
                Ok(message) => message.detach(),
                Err(KafkaError::PartitionEOF(partition)) => {
                    if self.caught_up(partition) {
                        return Ok(StreamEvent::Advance {
                            position: Position::of(&self.offsets),
                            committed_at: now_seconds(),
                        });
                    }
                    continue;
                }
                Err(error) => return Err(unavailable("reading records", error)),
            };
            let (topic, partition, offset) = (message.topic().to_owned(), message.partition(), message.offset());
            let event = read_event(self.format, message.key(), message.payload())
                .map_err(|reason| bad_event(&topic, partition, offset, &reason))?;
            self.offsets.set(&topic, partition, offset + 1);
            let position = Position::of(&self.offsets);
            let selected = event.and_then(|event| Some((self.schemas.get(&event.table)?.clone(), event)));
            let Some((schema, event)) = selected else {
                // A tombstone, a marker, or a table this job does not read.
                return Ok(StreamEvent::Advance { position, committed_at: now_seconds() });
            };
            let kind = event.change_kind(&schema).map_err(|reason| bad_event(&topic, partition, offset, &reason))?;
            self.pending = Some(StreamEvent::Commit { position, committed_at: event.committed_at() });
            return Ok(StreamEvent::Changes(vec![Change { table: schema, kind }]));
        }
    }
}
