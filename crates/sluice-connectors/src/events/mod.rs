//! Change events for stream targets (Kafka, NATS JetStream, stdout): the formats (`format`), one
//! sink that turns snapshot rows and a raw change stream into messages (`sink`), and the
//! contract a broker implements to carry them (`Transport`, `Channel`); and the same formats
//! read back for stream sources (`decode`, `source`).
//!
//! Exactly once rests on two things a transport provides: every message has an id that is the
//! same on every replay (derived from the job, the task and the source position, never from the
//! time), so a broker that de-duplicates by id drops what a crashed run had already sent; and the
//! checkpoint is written only after every message it covers is acknowledged, so a run resumes
//! from a position none of whose earlier events can be missing.
//!
//! A broker whose messages become visible before the checkpoint that covers them (NATS) may
//! hold snapshot rows of a batch a run sent and never committed; the next run reads the split
//! again from the checkpoint at a later position, and the broker drops its copies as
//! duplicates, keeping the earlier rows. So that the stream meets those rows where they were
//! read, the transport writes each batch's position and keys ahead of its messages
//! (`Channel::intend`), learns from its acknowledgements which of them it held, and keeps them
//! (`Transport::held`, `sluice_core::connector::HeldRows`).

pub mod decode;
pub mod format;
pub mod sink;
pub mod source;

use async_trait::async_trait;
use sluice_core::change::Position;
use sluice_core::connector::{CheckItem, Checkpoint, HeldRows};
use sluice_core::spec::{EndpointSpec, NodeKind, SpecError};
use sluice_core::{Result, TableName};

pub use format::{EventFormat, Origin};
pub use sink::EventSink;

/// One message for a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The topic or subject, from the endpoint's template.
    pub destination: String,
    /// The row's key document; messages with one key keep their order.
    pub key: String,
    pub payload: String,
    /// The same on every replay of the event, for the broker's de-duplication.
    pub id: String,
    /// A snapshot row's `change::key_identity`, for a table with a key (`Channel::intend`).
    pub identity: Option<String>,
}

/// A broker as a stream target: where messages go and where the checkpoints of the job's tasks
/// are kept.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Probes the broker without writing; an error names the target side.
    async fn check(&self) -> Result<Vec<CheckItem>>;

    /// Why the broker would refuse this destination name, if it would.
    fn refuse_destination(&self, _destination: &str) -> Option<String> {
        None
    }

    /// Makes sure the broker takes messages for these destinations (creates what is missing).
    /// Idempotent; called before any channel opens and again for a table the stream creates.
    async fn prepare(&self, destinations: &[String]) -> Result<()>;

    /// Opens the channel of one task.
    async fn open(&self, job: &str, task: &str) -> Result<Box<dyn Channel>>;

    /// Forgets the checkpoints of these tasks (`sluice reset`); the messages stay.
    async fn forget(&self, job: &str, tasks: &[String]) -> Result<()>;

    /// The rows of these snapshot tasks the broker holds as an interrupted read left them
    /// (`HeldRows`), read without claiming the tasks. The default holds none: a broker that makes
    /// a task's messages and checkpoint visible together.
    async fn held(&self, _job: &str, _tasks: &[String]) -> Result<Vec<HeldRows>> {
        Ok(Vec::new())
    }

    /// What `sluice schema` shows for a destination.
    fn describe(&self, destination: &str) -> String {
        destination.to_owned()
    }
}

/// One task's messages and its checkpoint on a broker.
#[async_trait]
pub trait Channel: Send {
    /// The task's checkpoint as the broker holds it, or `None` before its first commit.
    async fn recover(&mut self) -> Result<Option<Checkpoint>>;

    /// Whether the broker shows messages before the checkpoint that covers them, so a snapshot
    /// batch is written ahead (`intend`). The default: no (one transaction for both).
    fn writes_ahead(&self) -> bool {
        false
    }

    /// Called, when the channel `writes_ahead`, before the first message of a snapshot batch is
    /// sent, with the position the batch ends at and the batch's messages: the broker keeps the
    /// position and the messages' key identities first (see the module's documentation).
    async fn intend(&mut self, _position: &Position, _messages: &[Message]) -> Result<()> {
        Ok(())
    }

    /// Sends messages in order; they may still be in flight when it returns.
    async fn send(&mut self, messages: Vec<Message>) -> Result<()>;

    /// Waits until every message sent is acknowledged, then writes `checkpoint`. On `Err` the
    /// checkpoint is not written, and the next run sends again what it covers (with the same ids).
    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()>;
}

/// A destination name with `{db}` and `{table}` in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(String);

impl Template {
    pub const PLACEHOLDERS: &'static [&'static str] = &["{db}", "{table}"];

    /// The template, or what is wrong with it.
    pub fn parse(text: &str) -> std::result::Result<Template, String> {
        if text.is_empty() {
            return Err("is empty".into());
        }
        let mut rest = text;
        while let Some(start) = rest.find('{') {
            let end = rest[start..].find('}').map(|end| start + end + 1);
            let Some(end) = end else { return Err(format!("`{text}` has a `{{` that is not closed")) };
            let placeholder = &rest[start..end];
            if !Template::PLACEHOLDERS.contains(&placeholder) {
                return Err(format!(
                    "`{text}` names {placeholder}; the placeholders are {}",
                    Template::PLACEHOLDERS.join(" and ")
                ));
            }
            rest = &rest[end..];
        }
        Ok(Template(text.to_owned()))
    }

    /// The destination of a table's events.
    pub fn render(&self, table: &TableName) -> String {
        self.0.replace("{db}", table.namespace.as_deref().unwrap_or("default")).replace("{table}", &table.name)
    }

    /// The template with each placeholder replaced by `wildcard`.
    pub fn with_wildcards(&self, wildcard: &str) -> String {
        self.0.replace("{db}", wildcard).replace("{table}", wildcard)
    }
}

/// A scalar option's text.
pub(crate) fn text_option(endpoint: &EndpointSpec, field: &str) -> Option<String> {
    match endpoint.options.get(field).map(|node| &node.kind) {
        Some(NodeKind::Scalar { text, .. }) => Some(text.clone()),
        _ => None,
    }
}

/// A list of names (`[a, b]`, or one name alone), or the error naming the field.
pub(crate) fn names_option(endpoint: &EndpointSpec, field: &str) -> std::result::Result<Vec<String>, SpecError> {
    let name = |node: &sluice_core::spec::Node| match &node.kind {
        NodeKind::Scalar { text, .. } => Some(text.clone()),
        _ => None,
    };
    match endpoint.options.get(field) {
        None => Ok(Vec::new()),
        Some(node) => match &node.kind {
            NodeKind::Sequence(items) => items
                .iter()
                .map(|item| name(item).ok_or_else(|| endpoint.error(field, "expected a list of column names")))
                .collect(),
            _ => {
                name(node).map(|one| vec![one]).ok_or_else(|| endpoint.error(field, "expected a list of column names"))
            }
        },
    }
}

/// A positive integer option, its default when absent, or the error naming the field.
pub(crate) fn count_option(endpoint: &EndpointSpec, field: &str, default: u64) -> std::result::Result<u64, SpecError> {
    match endpoint.options.get(field).map(|node| &node.kind) {
        None => Ok(default),
        Some(NodeKind::Scalar { text, quoted: false }) => match text.replace('_', "").parse::<u64>() {
            Ok(value) if value > 0 => Ok(value),
            _ => Err(endpoint.error(field, format!("expected a positive whole number, found `{text}`"))),
        },
        Some(_) => Err(endpoint.error(field, "expected a positive whole number")),
    }
}

/// The largest transaction a stream target holds before it sends it: each event carries its
/// transaction's event count, so a transaction is whole before its first event goes.
pub const DEFAULT_MAX_TRANSACTION_EVENTS: u64 = 1_000_000;

/// The options every stream target takes: the format, the destination template (its field named
/// by the connector: `subject`, `topic`) and the transaction bound.
#[derive(Debug, Clone)]
pub struct EventOptions {
    pub format: EventFormat,
    pub template: Template,
    pub max_transaction_events: u64,
}

/// The fields of `EventOptions`, for a connector's field list.
pub const EVENT_FIELDS: &[&str] = &["format", "max_transaction_events"];

impl EventOptions {
    /// Reads the options; every problem at once.
    pub fn of(
        endpoint: &EndpointSpec,
        template_field: Option<&str>,
        default_template: &str,
    ) -> std::result::Result<EventOptions, Vec<SpecError>> {
        let mut errors = Vec::new();
        let format = EventFormat::of(endpoint).map_err(|error| errors.push(error)).ok();
        let template_text = template_field.and_then(|field| text_option(endpoint, field));
        let template = Template::parse(template_text.as_deref().unwrap_or(default_template))
            .map_err(|problem| errors.push(endpoint.error(template_field.unwrap_or("type"), problem)))
            .ok();
        let max_transaction_events = count_option(endpoint, "max_transaction_events", DEFAULT_MAX_TRANSACTION_EVENTS)
            .map_err(|error| errors.push(error))
            .ok();
        match (format, template, max_transaction_events) {
            (Some(format), Some(template), Some(max_transaction_events)) if errors.is_empty() => {
                Ok(EventOptions { format, template, max_transaction_events })
            }
            _ => Err(errors),
        }
    }
}

/// One line of a check report.
pub(crate) fn check_item(what: &str, ok: bool, detail: impl Into<String>) -> CheckItem {
    CheckItem { what: what.into(), ok, detail: detail.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_take_db_and_table_only() {
        let template = Template::parse("cdc.{db}.{table}").unwrap();
        assert_eq!(template.render(&TableName::new(Some("shop"), "items")), "cdc.shop.items");
        assert_eq!(template.with_wildcards("*"), "cdc.*.*");
        assert!(Template::parse("{schema}.{table}").unwrap_err().contains("{schema}"));
        assert!(Template::parse("x.{table").unwrap_err().contains("not closed"));
        assert!(Template::parse("").is_err());
    }
}
