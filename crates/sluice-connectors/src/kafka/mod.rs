//! Kafka as a stream target, exactly once by Kafka's own transactions.
//!
//! Each task has a transactional producer whose `transactional.id` is derived from the job and
//! the task. Everything a checkpoint covers is produced in one transaction together with the
//! checkpoint itself, a record keyed by the task on the checkpoint topic (as Kafka Connect keeps
//! the offsets of exactly-once sources): a `read_committed` consumer sees both or neither. A run
//! killed mid-transaction leaves it open; the next run's `init_transactions` on the same id
//! aborts it and bumps the producer epoch, so the killed run's producer, should it still be
//! alive (a zombie), is refused by the broker on its next write (FENCED).
//!
//! librdkafka's transactional calls block: they run on tokio's blocking pool.

pub(crate) mod connector;
pub mod source;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message as _, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use sluice_core::connector::{CheckItem, Checkpoint};
use sluice_core::secret::Secret;
use sluice_core::{Error, ErrorKind, Result, Side};

use crate::events::{check_item, Channel, EventOptions, Message, Transport};

/// Deliveries awaited at most per channel before the next send waits for the oldest.
const IN_FLIGHT: usize = 65_536;
/// How long a metadata request, a topic creation or a transaction call may take.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long reading the checkpoint topic to its end may take.
const RECOVER_TIMEOUT: Duration = Duration::from_secs(120);
/// The header that carries a message's replay-stable id.
pub const ID_HEADER: &str = "sluice-id";

/// TLS and SASL settings of a `kafka` endpoint.
#[derive(Debug, Clone)]
pub struct KafkaSecurity {
    /// `require`, `verify-ca` or `verify-full` when encrypted.
    pub tls: Option<String>,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    /// The passphrase of an encrypted `key`.
    pub key_password: Option<Secret>,
    /// Mechanism, user and password.
    pub sasl: Option<(String, String, Secret)>,
}

/// A `kafka` target's options.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    pub brokers: String,
    pub checkpoint_topic: String,
    /// Partitions and replication factor of the topics sluice creates (-1: the broker's default).
    pub partitions: i32,
    pub replication: i32,
    pub security: KafkaSecurity,
    pub events: EventOptions,
}

/// Why Kafka would refuse a topic name, if it would.
pub(crate) fn topic_problem(name: &str) -> Option<String> {
    if name.is_empty() || name == "." || name == ".." {
        return Some(format!("`{name}` is not a Kafka topic name"));
    }
    if name.len() > 249 {
        return Some(format!("`{name}` is longer than Kafka's 249 characters"));
    }
    let bad: Vec<char> =
        name.chars().filter(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))).collect();
    (!bad.is_empty())
        .then(|| format!("`{name}` holds {bad:?}; a Kafka topic name takes letters, digits, `.`, `_` and `-`"))
}

fn unavailable(doing: &str, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("Kafka: {doing}: {error}")).on(Side::Target)
}

/// The codes with which the broker refuses a producer whose transactional id a newer producer
/// took over.
fn is_fenced(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch)
    )
}

fn fenced(transactional_id: &str) -> Error {
    Error::new(
        ErrorKind::Fenced,
        format!(
            "FENCED: another producer took over Kafka transactional id {transactional_id}: another run of the job writes to the same brokers; nothing more is written by this one"
        ),
    )
    .on(Side::Target)
    .hint("run a job in one place at a time; its committed events are in the topics")
}

/// Runs a blocking librdkafka call on the blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|error| unavailable("a blocking call failed", error))
}

/// The task's key on the checkpoint topic, and the base of its transactional id: a JSON array,
/// so no two (job, task) pairs share one.
fn task_key(job: &str, task: &str) -> String {
    serde_json::to_string(&[job, task]).expect("strings serialize")
}

/// The client settings every connection shares: brokers, TLS, SASL.
pub(crate) fn client_config(brokers: &str, security: &KafkaSecurity) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers).set("client.id", "sluice");
    let protocol = match (security.tls.is_some(), security.sasl.is_some()) {
        (false, false) => "plaintext",
        (true, false) => "ssl",
        (false, true) => "sasl_plaintext",
        (true, true) => "sasl_ssl",
    };
    config.set("security.protocol", protocol);
    if let Some(mode) = &security.tls {
        // As libpq: `require` with a CA given checks the chain to it (`verify-ca`), without one
        // it only encrypts.
        let chain = mode != "require" || security.ca.is_some();
        config.set("enable.ssl.certificate.verification", if chain { "true" } else { "false" });
        config.set("ssl.endpoint.identification.algorithm", if mode == "verify-full" { "https" } else { "none" });
        if let Some(ca) = &security.ca {
            config.set("ssl.ca.location", ca);
        }
        if let (Some(cert), Some(key)) = (&security.cert, &security.key) {
            config.set("ssl.certificate.location", cert).set("ssl.key.location", key);
        }
        if let Some(passphrase) = &security.key_password {
            config.set("ssl.key.password", passphrase.expose());
        }
    }
    if let Some((mechanism, user, password)) = &security.sasl {
        config.set("sasl.mechanism", mechanism).set("sasl.username", user).set("sasl.password", password.expose());
    }
    config
}

/// Kafka as a transport.
pub struct KafkaTransport {
    options: KafkaOptions,
}

impl std::fmt::Debug for KafkaTransport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("KafkaTransport").field("brokers", &self.options.brokers).finish()
    }
}

impl KafkaTransport {
    pub fn new(options: KafkaOptions) -> KafkaTransport {
        KafkaTransport { options }
    }

    fn config(&self) -> ClientConfig {
        client_config(&self.options.brokers, &self.options.security)
    }

    fn admin(&self) -> Result<AdminClient<DefaultClientContext>> {
        self.config().create().map_err(|error| client_error(Side::Target, &self.options.brokers, error))
    }

    /// The topics of `names` that exist, read from the brokers' metadata.
    async fn existing(&self, names: Vec<String>) -> Result<Vec<String>> {
        let admin = self.admin()?;
        blocking(move || {
            let metadata = admin.inner().fetch_metadata(None, REQUEST_TIMEOUT)?;
            let known: Vec<String> = metadata
                .topics()
                .iter()
                .filter(|topic| topic.error().is_none())
                .map(|topic| topic.name().to_owned())
                .collect();
            Ok::<_, KafkaError>(names.into_iter().filter(|name| known.contains(name)).collect())
        })
        .await?
        .map_err(|error| connect_error(Side::Target, &self.options.brokers, error))
    }

    async fn create_topics(&self, names: &[String], partitions: i32, compact: bool) -> Result<()> {
        let admin = self.admin()?;
        let topics: Vec<NewTopic> = names
            .iter()
            .map(|name| {
                // -1: the brokers' default.
                let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(self.options.replication));
                if compact {
                    topic.set("cleanup.policy", "compact")
                } else {
                    topic
                }
            })
            .collect();
        let results = admin
            .create_topics(&topics, &AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT)))
            .await
            .map_err(|error| connect_error(Side::Target, &self.options.brokers, error))?;
        let mut refused = Vec::new();
        for result in results {
            match result {
                Ok(name) => log::info!("created Kafka topic {name}"),
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => refused.push(format!("{name}: {code}")),
            }
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::Config, format!("Kafka: cannot create topics: {}", refused.join("; ")))
                .on(Side::Target)
                .hint("create them yourself, or give the user the right to create topics (and check target.partitions and target.replication_factor)"))
        }
    }

    async fn channel(&self, job: &str, task: &str) -> Result<KafkaChannel> {
        let key = task_key(job, task);
        let transactional_id = format!("sluice:{key}");
        let producer = self.producer(&transactional_id).await?;
        Ok(KafkaChannel {
            producer,
            reader: self.config(),
            brokers: self.options.brokers.clone(),
            checkpoint_topic: self.options.checkpoint_topic.clone(),
            key,
            transactional_id,
            in_transaction: false,
            in_flight: VecDeque::new(),
            committed: None,
        })
    }

    /// A transactional producer of one task, its pending transaction (if a killed run left one)
    /// aborted and every older producer of the task fenced.
    async fn producer(&self, transactional_id: &str) -> Result<FutureProducer> {
        let producer: FutureProducer = self
            .config()
            .set("transactional.id", transactional_id)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("batch.size", "1000000")
            .set("queue.buffering.max.messages", "1000000")
            // A message the brokers do not take within this fails its delivery, and the run
            // starts again from its checkpoint (librdkafka's 300 s default would stall it).
            .set("message.timeout.ms", "30000")
            .set("transaction.timeout.ms", "60000")
            .create()
            .map_err(|error| client_error(Side::Target, &self.options.brokers, error))?;
        let initialising = producer.clone();
        let id = transactional_id.to_owned();
        blocking(move || initialising.init_transactions(REQUEST_TIMEOUT)).await?.map_err(|error| {
            if is_fenced(&error) {
                fenced(&id)
            } else {
                connect_error(Side::Target, &self.options.brokers, error)
                    .hint("check target.brokers, and that the brokers support transactions (Kafka 0.11 or later, a transaction coordinator)")
            }
        })?;
        Ok(producer)
    }
}

fn client_error(side: Side, brokers: &str, error: KafkaError) -> Error {
    Error::config(format!("Kafka at {brokers}: the client settings are refused: {error}"))
        .on(side)
        .hint(format!("check {side}.tls, {side}.tls_ca, {side}.user and {side}.sasl_mechanism"))
}

fn connect_error(side: Side, brokers: &str, error: KafkaError) -> Error {
    let text = error.to_string();
    let kind = if text.contains("SASL") || text.contains("uthenticat") {
        ErrorKind::Auth
    } else if text.contains("SSL") || text.contains("certificate") {
        ErrorKind::Config
    } else {
        ErrorKind::Unavailable
    };
    Error::new(kind, format!("Kafka at {brokers}: {text}"))
        .on(side)
        .hint(format!("check {side}.brokers, {side}.tls and the credentials, and that the brokers run"))
}

#[async_trait]
impl Transport for KafkaTransport {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let topics = [self.options.checkpoint_topic.clone()];
        let existing = self.existing(topics.to_vec()).await?;
        let mut items = vec![check_item("target Kafka", true, format!("connected to {}", self.options.brokers))];
        for topic in topics {
            let detail = if existing.contains(&topic) {
                format!("topic {topic} exists")
            } else {
                format!("topic {topic} does not exist; the first run creates it")
            };
            items.push(check_item(&format!("target topic {topic}"), true, detail));
        }
        Ok(items)
    }

    fn refuse_destination(&self, destination: &str) -> Option<String> {
        if destination == self.options.checkpoint_topic {
            return Some("it is the checkpoint topic".into());
        }
        topic_problem(destination)
    }

    async fn prepare(&self, destinations: &[String]) -> Result<()> {
        let checkpoint = vec![self.options.checkpoint_topic.clone()];
        if self.existing(checkpoint.clone()).await?.is_empty() {
            self.create_topics(&checkpoint, 1, true).await?;
        }
        let existing = self.existing(destinations.to_vec()).await?;
        let missing: Vec<String> = destinations.iter().filter(|name| !existing.contains(name)).cloned().collect();
        if !missing.is_empty() {
            self.create_topics(&missing, self.options.partitions, false).await?;
        }
        Ok(())
    }

    async fn open(&self, job: &str, task: &str) -> Result<Box<dyn Channel>> {
        Ok(Box::new(self.channel(job, task).await?))
    }

    async fn forget(&self, job: &str, tasks: &[String]) -> Result<()> {
        if self.existing(vec![self.options.checkpoint_topic.clone()]).await?.is_empty() {
            return Ok(());
        }
        for task in tasks {
            self.channel(job, task).await?.forget().await?;
        }
        Ok(())
    }

    fn describe(&self, destination: &str) -> String {
        format!("Kafka topic {destination}")
    }
}

/// One task's transactions.
struct KafkaChannel {
    producer: FutureProducer,
    /// Settings for the consumer that reads the checkpoint back.
    reader: ClientConfig,
    brokers: String,
    checkpoint_topic: String,
    /// The task's key on the checkpoint topic.
    key: String,
    transactional_id: String,
    in_transaction: bool,
    in_flight: VecDeque<DeliveryFuture>,
    /// The checkpoint last committed or recovered: committing it again with nothing sent since
    /// is skipped (a transaction costs round trips, and an idle stream commits every tick).
    committed: Option<Checkpoint>,
}

impl KafkaChannel {
    fn begin(&mut self) -> Result<()> {
        if !self.in_transaction {
            self.producer.begin_transaction().map_err(|error| self.failure("beginning a transaction", error))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    fn failure(&self, doing: &str, error: KafkaError) -> Error {
        if is_fenced(&error) {
            fenced(&self.transactional_id)
        } else {
            unavailable(doing, error)
        }
    }

    async fn settle_one(&mut self) -> Result<()> {
        let Some(delivery) = self.in_flight.pop_front() else { return Ok(()) };
        match delivery.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((error, _))) => Err(self.failure("a message was not delivered", error)),
            Err(_) => Err(unavailable("a message was not delivered", "the producer was dropped")),
        }
    }

    /// Queues one record; waits for deliveries while librdkafka's queue is full.
    async fn produce(&mut self, topic: &str, key: &str, payload: Option<&str>, id: Option<&str>) -> Result<()> {
        loop {
            while self.in_flight.len() >= IN_FLIGHT {
                self.settle_one().await?;
            }
            let mut record = FutureRecord::to(topic).key(key);
            if let Some(payload) = payload {
                record = record.payload(payload);
            }
            if let Some(id) = id {
                record = record.headers(OwnedHeaders::new().insert(Header { key: ID_HEADER, value: Some(id) }));
            }
            match self.producer.send_result(record) {
                Ok(delivery) => {
                    self.in_flight.push_back(delivery);
                    return Ok(());
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    if self.in_flight.is_empty() {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        self.settle_one().await?;
                    }
                }
                Err((error, _)) => return Err(self.failure(&format!("producing to topic {topic}"), error)),
            }
        }
    }

    /// Commits the open transaction; on failure aborts it, so nothing of it is ever read.
    async fn commit_transaction(&mut self) -> Result<()> {
        let producer = self.producer.clone();
        let committed = blocking(move || producer.commit_transaction(REQUEST_TIMEOUT)).await?;
        self.in_transaction = false;
        if let Err(error) = committed {
            let failure = self.failure("committing a transaction", error);
            if failure.kind() != ErrorKind::Fenced {
                let producer = self.producer.clone();
                let _ = blocking(move || producer.abort_transaction(REQUEST_TIMEOUT)).await;
            }
            return Err(failure);
        }
        Ok(())
    }

    /// Writes a tombstone for the task's checkpoint (`sluice reset`).
    async fn forget(&mut self) -> Result<()> {
        self.begin()?;
        let (topic, key) = (self.checkpoint_topic.clone(), self.key.clone());
        self.produce(&topic, &key, None, None).await?;
        while !self.in_flight.is_empty() {
            self.settle_one().await?;
        }
        self.commit_transaction().await
    }
}

#[async_trait]
impl Channel for KafkaChannel {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        let consumer: BaseConsumer = self
            .reader
            .clone()
            .set("group.id", "sluice-checkpoint-reader")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .create()
            .map_err(|error| client_error(Side::Target, &self.brokers, error))?;
        let (topic, key, brokers) = (self.checkpoint_topic.clone(), self.key.clone(), self.brokers.clone());
        let found = blocking(move || -> Result<Option<Vec<u8>>> {
            let metadata = consumer
                .fetch_metadata(Some(&topic), REQUEST_TIMEOUT)
                .map_err(|error| connect_error(Side::Target, &brokers, error))?;
            let partitions: Vec<i32> = metadata
                .topics()
                .iter()
                .filter(|found| found.name() == topic)
                .flat_map(|found| found.partitions().iter().map(|partition| partition.id()))
                .collect();
            let mut assignment = TopicPartitionList::new();
            for partition in &partitions {
                assignment
                    .add_partition_offset(&topic, *partition, Offset::Beginning)
                    .map_err(|error| unavailable("reading the checkpoints", error))?;
            }
            consumer.assign(&assignment).map_err(|error| unavailable("reading the checkpoints", error))?;
            let mut pending = partitions;
            let mut last = None;
            let deadline = Instant::now() + RECOVER_TIMEOUT;
            while !pending.is_empty() {
                if Instant::now() > deadline {
                    return Err(unavailable(
                        &format!("reading checkpoint topic {topic}"),
                        format!("partitions {pending:?} did not reach their end in {} s", RECOVER_TIMEOUT.as_secs()),
                    ));
                }
                match consumer.poll(Duration::from_millis(500)) {
                    None => {}
                    Some(Err(KafkaError::PartitionEOF(partition))) => pending.retain(|known| *known != partition),
                    Some(Err(error)) => return Err(unavailable(&format!("reading checkpoint topic {topic}"), error)),
                    Some(Ok(message)) if message.key() == Some(key.as_bytes()) => {
                        last = message.payload().map(<[u8]>::to_vec);
                    }
                    Some(Ok(_)) => {}
                }
            }
            Ok(last)
        })
        .await??;
        let checkpoint = match found {
            None => None,
            Some(payload) => Some(serde_json::from_slice(&payload).map_err(|error| {
                Error::new(
                    ErrorKind::State,
                    format!(
                        "the checkpoint keyed {} on Kafka topic {} is not one sluice wrote: {error}",
                        self.key, self.checkpoint_topic
                    ),
                )
                .on(Side::Target)
                .hint("write a tombstone for that key (or sluice reset) to start the task over")
            })?),
        };
        self.committed = checkpoint.clone();
        Ok(checkpoint)
    }

    async fn send(&mut self, messages: Vec<Message>) -> Result<()> {
        self.begin()?;
        for message in messages {
            self.produce(&message.destination, &message.key, Some(&message.payload), Some(&message.id)).await?;
        }
        Ok(())
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        if !self.in_transaction && self.committed.as_ref() == Some(checkpoint) {
            return Ok(());
        }
        self.begin()?;
        let payload = serde_json::to_string(checkpoint).expect("checkpoints serialize");
        let (topic, key) = (self.checkpoint_topic.clone(), self.key.clone());
        self.produce(&topic, &key, Some(&payload), None).await?;
        while !self.in_flight.is_empty() {
            self.settle_one().await?;
        }
        sluice_core::failpoint::hit("events.acknowledged");
        self.commit_transaction().await?;
        self.committed = Some(checkpoint.clone());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka() {
        assert_eq!(topic_problem("shop.items_1-a"), None);
        assert!(topic_problem("shop/items").unwrap().contains("'/'"));
        assert!(topic_problem("").is_some());
        assert!(topic_problem("..").is_some());
        assert!(topic_problem(&"x".repeat(250)).is_some());
    }

    #[test]
    fn require_with_a_ca_checks_the_chain_as_libpq_does() {
        let security = |tls: &str, ca: Option<&str>| KafkaSecurity {
            tls: Some(tls.to_owned()),
            ca: ca.map(str::to_owned),
            cert: None,
            key: None,
            key_password: None,
            sasl: None,
        };
        let checks = |security: &KafkaSecurity| {
            let config = client_config("127.0.0.1:9092", security);
            (
                config.get("enable.ssl.certificate.verification").unwrap().to_owned(),
                config.get("ssl.endpoint.identification.algorithm").unwrap().to_owned(),
            )
        };
        assert_eq!(checks(&security("require", None)), ("false".into(), "none".into()), "encrypts only");
        assert_eq!(checks(&security("require", Some("ca.pem"))), ("true".into(), "none".into()), "the chain");
        assert_eq!(checks(&security("verify-ca", Some("ca.pem"))), ("true".into(), "none".into()));
        assert_eq!(checks(&security("verify-full", None)), ("true".into(), "https".into()));
    }

    #[test]
    fn task_keys_are_distinct() {
        assert_ne!(task_key("a.b", "c"), task_key("a", "b.c"));
        assert_eq!(task_key("job", "items#0"), r#"["job","items#0"]"#);
    }
}
