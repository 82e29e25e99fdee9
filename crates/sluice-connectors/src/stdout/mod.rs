//! The `stdout` target: change events as JSON lines on standard output, for people and scripts
//! (`sluice tail`, `sluice run job.yaml | jq`). Each line is one event's value; a task's lines
//! are written together at its commit, so lines of parallel tasks never interleave. It keeps no
//! checkpoint: every run starts its tasks over (a `cdc` job from the position it plans).

use std::io::Write;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::connector::{Capabilities, CheckItem, Checkpoint, Fence, Sink};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::{Error, ErrorKind, Result, Side};

use crate::events::{check_item, Channel, EventOptions, EventSink, Message, Transport};
use crate::{Connector, TargetSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "stdout",
    feature: "default",
    secrets: &[],
    capabilities: Capabilities { table_sink: true, event_sink: true, ..Capabilities::NONE },
    source: None,
    target: Some(TargetSide { fields: FIELDS, validate, build, read_back: None }),
};

const FIELDS: &[&str] = &["type", "format", "max_transaction_events"];

fn options(endpoint: &EndpointSpec) -> std::result::Result<EventOptions, Vec<SpecError>> {
    EventOptions::of(endpoint, None, "{db}.{table}")
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec, _fence: Option<Fence>) -> Result<Arc<dyn Sink>> {
    let options = options(&job.target).map_err(crate::invalid)?;
    Ok(Arc::new(EventSink::new(options, &job.source.connector, Arc::new(Stdout))))
}

/// Standard output as a transport.
struct Stdout;

#[async_trait]
impl Transport for Stdout {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        Ok(vec![check_item("target stdout", true, "events as JSON lines on standard output")])
    }

    async fn prepare(&self, _destinations: &[String]) -> Result<()> {
        Ok(())
    }

    async fn open(&self, _job: &str, _task: &str) -> Result<Box<dyn Channel>> {
        Ok(Box::new(Lines { pending: String::new() }))
    }

    async fn forget(&self, _job: &str, _tasks: &[String]) -> Result<()> {
        Ok(())
    }

    fn describe(&self, destination: &str) -> String {
        format!("standard output (destination {destination} not printed)")
    }
}

/// A task's lines not yet printed.
struct Lines {
    pending: String,
}

#[async_trait]
impl Channel for Lines {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        self.pending.clear();
        Ok(None)
    }

    async fn send(&mut self, messages: Vec<Message>) -> Result<()> {
        for message in messages {
            self.pending.push_str(&message.payload);
            self.pending.push('\n');
        }
        Ok(())
    }

    async fn commit(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
        let text = std::mem::take(&mut self.pending);
        tokio::task::spawn_blocking(move || {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        })
        .await
        .map_err(|error| Error::new(ErrorKind::Write, format!("writing to standard output: {error}")))?
        .map_err(|error| {
            Error::new(ErrorKind::Write, format!("writing events to standard output: {error}"))
                .on(Side::Target)
                .hint("standard output was closed (a pipe whose reader ended?); nothing after the last line printed was lost from the source")
        })
    }
}
