//! NATS JetStream as a change source: a stream of change events (Maxwell or Debezium JSON, from
//! Sluice or from the tools themselves) read back into row changes for any table target.
//!
//! The position is the stream sequence to read next, kept by the target in the same
//! transaction as the rows, so a target applies each message exactly once across crashes. The
//! messages are read by an ordered consumer of the tables' subjects (ephemeral: nothing is left
//! on the server). A table's columns come from the first message on its subject.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::jetstream::{self, consumer};
use async_trait::async_trait;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sluice_core::change::Change;
use sluice_core::connector::{ChangeSource, ChangeStream, CheckItem, Source, StreamEvent};
use sluice_core::{Error, ErrorKind, Position, Result, Side, TableName, TableSchema};

use super::{connect, shown_url};
use crate::events::check_item;
use crate::events::decode::read_event;
use crate::events::source::{no_events_yet, now_seconds, FoundTables, SourceOptions};

/// A `nats` source's options; `events.template` renders a table's subject.
#[derive(Debug, Clone)]
pub struct NatsSourceOptions {
    /// May hold a password or token: never printed.
    pub url: String,
    pub stream: String,
    pub events: SourceOptions,
}

/// Where the stream stands: the next stream sequence to read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Sequence {
    next: u64,
}

fn unavailable(doing: &str, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("NATS: {doing}: {error}")).on(Side::Source)
}

fn bad_event(stream: &str, sequence: u64, reason: &str) -> Error {
    Error::new(ErrorKind::Schema, format!("NATS stream {stream}, sequence {sequence}: {reason}"))
        .on(Side::Source)
        .hint("check source.format against what the producer writes; a message that cannot be applied stops the stream at its sequence")
}

/// The row key a message carries: Sluice's `Sluice-Key` header (the key document).
fn key(headers: Option<&async_nats::HeaderMap>) -> Option<Vec<u8>> {
    headers?.get("Sluice-Key").map(|value| value.as_str().as_bytes().to_vec())
}

/// A JetStream stream of change events as a source.
pub struct NatsSource {
    options: NatsSourceOptions,
    schemas: FoundTables,
}

impl std::fmt::Debug for NatsSource {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("NatsSource").field("url", &shown_url(&self.options.url)).finish()
    }
}

impl NatsSource {
    pub fn new(options: NatsSourceOptions) -> NatsSource {
        NatsSource { options, schemas: FoundTables::default() }
    }

    async fn stream(&self) -> Result<jetstream::stream::Stream> {
        let context = connect(&self.options.url, Side::Source).await?;
        context.get_stream(&self.options.stream).await.map_err(|error| {
            let missing = super::stream_not_found(&error);
            Error::new(
                if missing { ErrorKind::Schema } else { ErrorKind::Unavailable },
                format!("NATS at {}: stream {}: {error}", shown_url(&self.options.url), self.options.stream),
            )
            .on(Side::Source)
            .hint("start the job that writes the events first, or fix source.stream")
        })
    }

    /// The consumer's subject filter: the one subject of the tables, else the template with
    /// wildcards when it covers every table's subject, else none (every message is read; those
    /// of other tables are passed over). One filter only: servers before 2.10 take no more.
    fn filter(&self) -> String {
        let subjects = self.subjects();
        if let [only] = subjects.as_slice() {
            return only.clone();
        }
        let wildcard = self.options.events.template.with_wildcards("*");
        if subjects.iter().all(|subject| super::covers(&wildcard, subject)) {
            wildcard
        } else {
            String::new()
        }
    }

    fn subjects(&self) -> Vec<String> {
        let mut subjects: Vec<String> =
            self.options.events.tables.iter().map(|table| self.options.events.template.render(table)).collect();
        subjects.sort();
        subjects.dedup();
        subjects
    }
}

#[async_trait]
impl Source for NatsSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let mut stream = self.stream().await?;
        let info = stream.info().await.map_err(|error| unavailable("reading the stream", error))?;
        Ok(vec![check_item(
            &format!("stream {}", self.options.stream),
            true,
            format!("{} messages", info.state.messages),
        )])
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        let stream = self.stream().await?;
        let mut tables = Vec::new();
        let mut missing = Vec::new();
        for table in &self.options.events.tables {
            let subject = self.options.events.template.render(table);
            // The first message of the subject that is an event of this table.
            let mut from = 1;
            let schema =
                loop {
                    match stream.get_first_raw_message_by_subject(&subject, from).await {
                        Ok(message) => {
                            let key = key(Some(&message.headers));
                            let event = read_event(self.options.events.format, key.as_deref(), Some(&message.payload))
                                .map_err(|reason| bad_event(&self.options.stream, message.sequence, &reason))?;
                            match event {
                                Some(event) if &event.table == table => {
                                    break Some(event.schema().map_err(|reason| {
                                        bad_event(&self.options.stream, message.sequence, &reason)
                                    })?)
                                }
                                _ => from = message.sequence + 1,
                            }
                        }
                        Err(error) if error.to_string().contains("no message found") => break None,
                        Err(error) => return Err(unavailable(&format!("reading subject {subject}"), error)),
                    }
                };
            match schema {
                Some(schema) => tables.push(schema),
                None => missing.push(format!("{table} (subject {subject})")),
            }
        }
        if !missing.is_empty() {
            return Err(no_events_yet(&format!("NATS stream {}", self.options.stream), &missing));
        }
        Ok(self.schemas.keep(tables))
    }

    sluice_core::capabilities!(changes: ChangeSource);
}

#[async_trait]
impl ChangeSource for NatsSource {
    async fn log_position(&self) -> Result<Option<Position>> {
        let mut stream = self.stream().await?;
        let info = stream.info().await.map_err(|error| unavailable("reading the stream", error))?;
        Ok(Some(Position::of(&Sequence { next: info.state.last_sequence + 1 })))
    }

    async fn start_position(&self) -> Result<Option<Position>> {
        Ok((!self.options.events.latest).then(|| Position::of(&Sequence { next: 1 })))
    }

    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
        let start: Sequence = after.read("the NATS source's stream")?;
        let schemas = self.schemas.or_discover(self.discover()).await?;
        let stream = self.stream().await?;
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: self.filter(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: start.next.max(1) },
                ..Default::default()
            })
            .await
            .map_err(|error| unavailable("creating the consumer", error))?;
        let messages = consumer.messages().await.map_err(|error| unavailable("reading messages", error))?;
        Ok(Box::new(NatsStream {
            messages,
            format: self.options.events.format,
            stream: self.options.stream.clone(),
            schemas,
            pending: None,
        }))
    }

    /// The producer's snapshot rows and the changes around them overlap (docs/events.md):
    /// events are applied by key.
    fn applies_by_key(&self) -> bool {
        true
    }

    fn reached(&self, position: &Position, mark: &Position) -> bool {
        match (position.read::<Sequence>("a position"), mark.read::<Sequence>("a position")) {
            (Ok(position), Ok(mark)) => position.next >= mark.next,
            _ => false,
        }
    }
}

/// The stream's messages on the tables' subjects, one transaction each, in stream order.
struct NatsStream {
    messages: consumer::pull::Ordered,
    format: crate::events::EventFormat,
    stream: String,
    schemas: HashMap<TableName, Arc<TableSchema>>,
    pending: Option<StreamEvent>,
}

#[async_trait]
impl ChangeStream for NatsStream {
    async fn next(&mut self) -> Result<StreamEvent> {
        if let Some(commit) = self.pending.take() {
            return Ok(commit);
        }
        let message = match self.messages.next().await {
            Some(Ok(message)) => message,
            Some(Err(error)) => return Err(unavailable("reading messages", error)),
            None => return Err(unavailable("reading messages", "the consumer ended")),
        };
        let sequence =
            message.info().map_err(|error| unavailable("reading a message's sequence", error))?.stream_sequence;
        let position = Position::of(&Sequence { next: sequence + 1 });
        let key = key(message.headers.as_ref());
        let event = read_event(self.format, key.as_deref(), Some(&message.payload))
            .map_err(|reason| bad_event(&self.stream, sequence, &reason))?;
        let selected = event.and_then(|event| Some((self.schemas.get(&event.table)?.clone(), event)));
        let Some((schema, event)) = selected else {
            return Ok(StreamEvent::Advance { position, committed_at: now_seconds() });
        };
        let kind = event.change_kind(&schema).map_err(|reason| bad_event(&self.stream, sequence, &reason))?;
        self.pending = Some(StreamEvent::Commit { position, committed_at: event.committed_at() });
        Ok(StreamEvent::Changes(vec![Change { table: schema, kind }]))
    }
}
