//! The `kafka` connector (Kafka as a target): its capabilities, options and construction.

use std::sync::Arc;

use sluice_core::connector::{Capabilities, Fence, Sink, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::Result;

use super::source::{KafkaSource, KafkaSourceOptions};
use super::{topic_problem, KafkaOptions, KafkaSecurity, KafkaTransport};
use crate::events::source::SourceOptions;
use crate::events::{count_option, text_option, EventOptions, EventSink};
use crate::{Connector, SourceSide, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "kafka",
    feature: "kafka",
    secrets: &["password", "tls_key_password"],
    capabilities: Capabilities {
        // Topics of change events, read back (`source.rs`).
        change_source: true,
        table_sink: true,
        event_sink: true,
        transactions: true,
        // Fenced by Kafka itself: a task's transactional id is the same on every node, and a new
        // owner's `init_transactions` aborts what an older producer left open and refuses its
        // further writes (FENCED, which ends that task); the new owner reads the checkpoint only
        // then (`mod.rs`).
        fencing: true,
        ..Capabilities::NONE
    },
    source: Some(SourceSide { fields: SOURCE_FIELDS, validate: validate_source, build: build_source }),
    target: Some(TargetSide { fields: FIELDS, validate, build, read_back: None }),
};

const SOURCE_FIELDS: &[&str] = &[
    "type",
    "brokers",
    "topic",
    "format",
    "tables",
    "start_position",
    "user",
    "password",
    "sasl_mechanism",
    "tls",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "tls_key_password",
];

const FIELDS: &[&str] = &[
    "type",
    "brokers",
    "topic",
    "format",
    "max_transaction_events",
    "checkpoint_topic",
    "partitions",
    "replication_factor",
    "user",
    "password",
    "sasl_mechanism",
    "tls",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "tls_key_password",
];

/// The topic that keeps the checkpoints when `checkpoint_topic` is not given.
const DEFAULT_CHECKPOINT_TOPIC: &str = "sluice_checkpoints";
const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];
const TLS_MODES: &[&str] = &["disable", "require", "verify-ca", "verify-full"];

fn options(endpoint: &EndpointSpec) -> std::result::Result<KafkaOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let events = EventOptions::of(endpoint, Some("topic"), "{db}.{table}").map_err(|found| errors.extend(found)).ok();
    let brokers = brokers(endpoint, &mut errors);
    let checkpoint_topic = text_option(endpoint, "checkpoint_topic").unwrap_or_else(|| DEFAULT_CHECKPOINT_TOPIC.into());
    if let Some(problem) = topic_problem(&checkpoint_topic) {
        errors.push(endpoint.error("checkpoint_topic", problem));
    }
    let partitions = count_option(endpoint, "partitions", 1).map_err(|error| errors.push(error)).ok();
    let replication = match text_option(endpoint, "replication_factor") {
        None => Some(-1),
        Some(_) => count_option(endpoint, "replication_factor", 1)
            .map(|value| value as i32)
            .map_err(|error| errors.push(error))
            .ok(),
    };
    let security = security(endpoint, &mut errors);
    match (brokers, events, partitions, replication, security) {
        (Some(brokers), Some(events), Some(partitions), Some(replication), Some(security)) if errors.is_empty() => {
            Ok(KafkaOptions {
                brokers,
                checkpoint_topic,
                partitions: partitions.min(i32::MAX as u64) as i32,
                replication,
                security,
                events,
            })
        }
        _ => Err(errors),
    }
}

/// `brokers`: `host:port,host:port`, required.
fn brokers(endpoint: &EndpointSpec, errors: &mut Vec<SpecError>) -> Option<String> {
    let brokers = text_option(endpoint, "brokers");
    match &brokers {
        None => errors.push(endpoint.error("brokers", "missing required field `brokers` (host:port,host:port)")),
        Some(list) => {
            let bad: Vec<&str> = list
                .split(',')
                .map(str::trim)
                .filter(|broker| {
                    broker.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
                })
                .collect();
            if !bad.is_empty() || list.contains("://") {
                errors.push(endpoint.error(
                    "brokers",
                    format!("expected host:port,host:port (no scheme; TLS and SASL have fields of their own), found `{list}`"),
                ));
            }
        }
    }
    brokers.map(|list| list.split(',').map(str::trim).collect::<Vec<_>>().join(","))
}

/// TLS and SASL from their fields.
fn security(endpoint: &EndpointSpec, errors: &mut Vec<SpecError>) -> Option<KafkaSecurity> {
    let before = errors.len();
    let tls = text_option(endpoint, "tls");
    if let Some(mode) = &tls {
        if !TLS_MODES.contains(&mode.as_str()) {
            errors.push(endpoint.error("tls", format!("expected one of {}, found `{mode}`", TLS_MODES.join(", "))));
        }
    }
    let file = |field: &str, errors: &mut Vec<SpecError>| {
        let path = text_option(endpoint, field)?;
        if !std::path::Path::new(&path).is_file() {
            errors.push(endpoint.error(field, format!("`{path}` is not a readable file")));
        }
        Some(path)
    };
    let ca = file("tls_ca", errors);
    let cert = file("tls_cert", errors);
    let key = file("tls_key", errors);
    if cert.is_some() != key.is_some() {
        errors.push(
            endpoint.error(if cert.is_some() { "tls_key" } else { "tls_cert" }, "tls_cert and tls_key go together"),
        );
    }
    // The passphrase of an encrypted `tls_key`.
    let key_password = text_option(endpoint, "tls_key_password");
    if let Some(passphrase) = &key_password {
        sluice_core::secret::register(passphrase);
        if key.is_none() {
            errors.push(endpoint.error("tls_key_password", "is the passphrase of tls_key, which is not given"));
        }
    }
    let user = text_option(endpoint, "user");
    let password = text_option(endpoint, "password");
    if let Some(password) = &password {
        sluice_core::secret::register(password);
    }
    if user.is_some() != password.is_some() {
        errors.push(endpoint.error(if user.is_some() { "password" } else { "user" }, "user and password go together"));
    }
    let mechanism = text_option(endpoint, "sasl_mechanism").map(|name| name.to_uppercase());
    if let Some(name) = &mechanism {
        if !SASL_MECHANISMS.contains(&name.as_str()) {
            errors.push(
                endpoint
                    .error("sasl_mechanism", format!("expected one of {}, found `{name}`", SASL_MECHANISMS.join(", "))),
            );
        }
        if user.is_none() {
            errors.push(endpoint.error("sasl_mechanism", "needs user and password"));
        }
    }
    let encrypted = match tls.as_deref() {
        Some("disable") => {
            if ca.is_some() || cert.is_some() {
                errors.push(endpoint.error("tls", "is `disable`, but tls_ca or tls_cert is given"));
            }
            false
        }
        Some(_) => true,
        None => ca.is_some() || cert.is_some(),
    };
    (errors.len() == before).then(|| KafkaSecurity {
        tls: encrypted.then(|| tls.unwrap_or_else(|| "verify-full".into())),
        ca,
        cert,
        key,
        key_password: key_password.map(sluice_core::secret::Secret::new),
        sasl: user.zip(password).map(|(user, password)| {
            (mechanism.unwrap_or_else(|| "PLAIN".into()), user, sluice_core::secret::Secret::new(password))
        }),
    })
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec, _fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    let events = options.events.clone();
    Ok(Arc::new(EventSink::new(events, &job.source.connector, Arc::new(KafkaTransport::new(options)))))
}

fn source_options(endpoint: &EndpointSpec) -> std::result::Result<KafkaSourceOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let stream = SourceOptions::of(endpoint, "topic", topic_problem).map_err(|found| errors.extend(found)).ok();
    let brokers = brokers(endpoint, &mut errors);
    let security = security(endpoint, &mut errors);
    match (brokers, stream, security) {
        (Some(brokers), Some(stream), Some(security)) if errors.is_empty() => {
            Ok(KafkaSourceOptions { brokers, security, stream })
        }
        _ => Err(errors),
    }
}

fn validate_source(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    source_options(endpoint).err().unwrap_or_default()
}

fn build_source(job: &JobSpec) -> Result<Arc<dyn Source>> {
    let options = source_options(&job.source).map_err(crate::invalid)?;
    Ok(Arc::new(KafkaSource::new(options)))
}
