//! What the lake targets (Delta, Iceberg) share: rows as Arrow record batches of a table
//! format's types (`rows.rs`), and a group of changes folded per key and located in the table's
//! data files for a copy-on-write merge (`keys.rs`).

pub(crate) mod keys;
pub(crate) mod rows;

use arrow_schema::DataType as Arrow;
use sluice_core::connector::SchemaChange;
use sluice_core::spec::{EndpointSpec, NodeKind, SpecError};
use sluice_core::{DataType, Error, ErrorKind, Side, TableName};

/// Every problem found before a run at once: none, the one as it is (with its hint), or one
/// error listing them all.
pub(crate) fn every_problem(mut problems: Vec<Error>) -> sluice_core::Result<()> {
    match problems.len() {
        0 => Ok(()),
        1 => Err(problems.remove(0)),
        _ => {
            let messages: Vec<&str> = problems.iter().map(Error::message).collect();
            Err(Error::new(problems[0].kind(), messages.join("; "))
                .on(Side::Target)
                .hint("fix each of them, then run again"))
        }
    }
}

/// Partitioning (`partition_by`): the same columns (or partition fields) for every table, or per
/// table.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum PartitionBy {
    #[default]
    None,
    /// Every table, by these.
    Every(Vec<String>),
    /// These tables (target names), each by its own.
    Tables(Vec<(String, Vec<String>)>),
}

impl PartitionBy {
    /// The entries of table `named` (`namespace.table`, its own name).
    pub(crate) fn of(&self, named: &str) -> Vec<String> {
        match self {
            PartitionBy::None => Vec::new(),
            PartitionBy::Every(entries) => entries.clone(),
            PartitionBy::Tables(tables) => {
                tables.iter().find(|(name, _)| name == named).map(|(_, entries)| entries.clone()).unwrap_or_default()
            }
        }
    }
}

/// Column names (or partition fields): `[a, b]` or one.
fn names(
    endpoint: &EndpointSpec,
    node: &sluice_core::spec::Node,
    field: &str,
) -> std::result::Result<Vec<String>, SpecError> {
    let name = |node: &sluice_core::spec::Node| match &node.kind {
        NodeKind::Scalar { text, .. } if !text.is_empty() => Some(text.clone()),
        _ => None,
    };
    let expected = || endpoint.error(field, "expected a column name or a list of column names");
    match &node.kind {
        NodeKind::Sequence(items) => items.iter().map(|item| name(item).ok_or_else(expected)).collect(),
        _ => name(node).map(|one| vec![one]).ok_or_else(expected),
    }
}

/// `partition_by: [column, ...]` for every table, or `{table: [column, ...], ...}`.
pub(crate) fn partition_by(endpoint: &EndpointSpec) -> std::result::Result<PartitionBy, Vec<SpecError>> {
    let Some(node) = endpoint.options.get("partition_by") else { return Ok(PartitionBy::None) };
    match &node.kind {
        NodeKind::Mapping(entries) => {
            let mut errors = Vec::new();
            let mut tables = Vec::new();
            for (table, columns) in entries {
                match names(endpoint, columns, &format!("partition_by.{table}")) {
                    Ok(columns) => tables.push((table.clone(), columns)),
                    Err(error) => errors.push(error),
                }
            }
            if errors.is_empty() {
                Ok(PartitionBy::Tables(tables))
            } else {
                Err(errors)
            }
        }
        _ => names(endpoint, node, "partition_by").map(PartitionBy::Every).map_err(|error| vec![error]),
    }
}

/// A lake table format as the shared code needs it: its name and article, for messages, and the
/// Arrow type each logical type takes in its tables.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    pub name: &'static str,
    /// "a" or "an", as the name wants.
    pub article: &'static str,
    pub arrow_type: fn(&DataType) -> Arrow,
}

impl Format {
    /// The error of a schema change the format's tables do not take: they take added columns
    /// (and created tables, and TRUNCATE) only.
    pub(crate) fn unsupported(self, table: &TableName, what: &str) -> Error {
        Error::new(
            ErrorKind::Schema,
            format!("table {table}: {what}; {} {} target takes added columns only", self.article, self.name),
        )
        .on(Side::Target)
        .hint(format!(
            "copy the table again with its new schema: run the job with --restart (the {} table is made anew)",
            self.name
        ))
    }

    /// The refusal of a change beyond what the format's tables take: a renamed column, a dropped
    /// or renamed table. `None` for the others (a changed type is the format's to judge).
    pub(crate) fn refusal(self, change: &SchemaChange) -> Option<Error> {
        match change {
            SchemaChange::Alter { table, renamed, .. } => {
                let (old, new) = renamed.first()?;
                Some(self.unsupported(&table.name, &format!("column {old} is renamed to {new}")))
            }
            SchemaChange::Drop(name) => Some(self.unsupported(name, "the table is dropped")),
            SchemaChange::Rename { from, to } => Some(self.unsupported(from, &format!("the table is renamed to {to}"))),
            SchemaChange::Create(_) | SchemaChange::Truncate(_) => None,
        }
    }
}
