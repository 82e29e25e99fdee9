//! What every stream source shares (Kafka topics, JetStream streams of change events): its
//! options beside the broker's own, the errors of a source without a snapshot or still without
//! events, and the change an event makes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_core::change::ChangeKind;
use sluice_core::spec::{EndpointSpec, SpecError};
use sluice_core::{Error, ErrorKind, Result, TableName, TableSchema};

use super::decode::{Operation, ReadEvent};
use super::{text_option, EventFormat, Template};

/// The fields of `SourceOptions`, for a connector's field list.
pub const SOURCE_FIELDS: &[&str] = &["format", "tables", "start_position"];

/// A stream source's options: the format, the destination template (its field named by the
/// connector), the tables and where a new job starts.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    pub format: EventFormat,
    pub template: Template,
    /// The tables to read, by their names in the events.
    pub tables: Vec<TableName>,
    /// Start at the end instead of the beginning (`start_position: latest`).
    pub latest: bool,
}

impl SourceOptions {
    /// Reads the options; every problem at once.
    pub fn of(
        endpoint: &EndpointSpec,
        template_field: &str,
        destination_problem: fn(&str) -> Option<String>,
    ) -> std::result::Result<SourceOptions, Vec<SpecError>> {
        let mut errors = Vec::new();
        let format = EventFormat::of(endpoint).map_err(|error| errors.push(error)).ok();
        let template = Template::parse(text_option(endpoint, template_field).as_deref().unwrap_or("{db}.{table}"))
            .map_err(|problem| errors.push(endpoint.error(template_field, problem)))
            .ok();
        let patterns: Vec<&str> =
            endpoint.tables.iter().filter(|name| name.contains(['*', '?', '[', '!'])).map(String::as_str).collect();
        if endpoint.tables.is_empty() {
            errors.push(endpoint.error(
                "tables",
                format!("a stream source names its tables (`tables: [db.table, ...]`); their destinations come from `{template_field}`"),
            ));
        } else if !patterns.is_empty() {
            errors.push(
                endpoint.error(
                    "tables",
                    format!("a stream source takes table names, not patterns: {}", patterns.join(", ")),
                ),
            );
        }
        let latest = match text_option(endpoint, "start_position").as_deref() {
            None | Some("earliest") => false,
            Some("latest") => true,
            Some(other) => {
                errors.push(endpoint.error("start_position", format!("expected earliest or latest, found `{other}`")));
                false
            }
        };
        let tables: Vec<TableName> = endpoint.tables.iter().map(|name| TableName::parse(name)).collect();
        if let Some(template) = &template {
            for table in &tables {
                if let Some(problem) = destination_problem(&template.render(table)) {
                    errors.push(endpoint.error(template_field, format!("table {table}: {problem}")));
                }
            }
        }
        match (format, template) {
            (Some(format), Some(template)) if errors.is_empty() => {
                Ok(SourceOptions { format, template, tables, latest })
            }
            _ => Err(errors),
        }
    }
}

/// The source's clock, for positions that carry no commit time (a tombstone, the end reached).
pub fn now_seconds() -> u64 {
    sluice_core::clock::unix_seconds()
}

/// The tables a stream source found at `discover` (each from its first event), kept for the
/// streams it opens.
#[derive(Debug, Default)]
pub struct FoundTables(Mutex<HashMap<TableName, Arc<TableSchema>>>);

impl FoundTables {
    /// Keeps `tables`, in place of those kept before; returns them sorted by name.
    pub fn keep(&self, mut tables: Vec<TableSchema>) -> Vec<TableSchema> {
        tables.sort_by(|left, right| left.name.cmp(&right.name));
        *self.0.lock().expect("schemas lock") =
            tables.iter().map(|table| (table.name.clone(), Arc::new(table.clone()))).collect();
        tables
    }

    /// The tables kept, after `discover` (which keeps them) when none are yet.
    pub async fn or_discover(
        &self,
        discover: impl std::future::Future<Output = Result<Vec<TableSchema>>>,
    ) -> Result<HashMap<TableName, Arc<TableSchema>>> {
        if self.0.lock().expect("schemas lock").is_empty() {
            discover.await?;
        }
        Ok(self.0.lock().expect("schemas lock").clone())
    }
}

/// The error of tables whose events are not there yet: `Unavailable`, so a run waits (with the
/// retry's backoff) for the producing job. `missing` names each table and its destination.
pub fn no_events_yet(broker: &str, missing: &[String]) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "no event of {} in {broker} yet: a {broker} source takes a table's columns from its first event",
            missing.join(", ")
        ),
    )
    .on(sluice_core::Side::Source)
    .hint("start the job that writes these tables' events first (its snapshot writes one per row), then this one")
}

impl ReadEvent {
    /// The change this event makes to a row of `table`. An update without its old image
    /// (Debezium from a table without full replica identity) keeps its key: the new image
    /// stands for the old one.
    pub fn change_kind(&self, table: &TableSchema) -> std::result::Result<ChangeKind, String> {
        let image = |image: &Option<serde_json::Map<String, serde_json::Value>>| {
            ReadEvent::row(table, image.as_ref().ok_or("a row image is missing")?)
        };
        Ok(match self.operation {
            Operation::Snapshot | Operation::Insert => ChangeKind::Insert { after: image(&self.after)? },
            Operation::Update => {
                let after = image(&self.after)?;
                let before = if self.before.is_some() { image(&self.before)? } else { after.clone() };
                ChangeKind::Update { before, after }
            }
            Operation::Delete => ChangeKind::Delete { before: image(&self.before)? },
        })
    }

    /// The source's commit time of the event in Unix seconds, the clock's when it has none.
    pub fn committed_at(&self) -> u64 {
        if self.ts_ms > 0 {
            self.ts_ms / 1000
        } else {
            now_seconds()
        }
    }
}
