//! What the lake targets (Delta, Iceberg) share: rows as Arrow record batches of a table
//! format's types (`rows.rs`), and a group of changes folded per key and located in the table's
//! data files for a copy-on-write merge (`keys.rs`).

pub(crate) mod keys;
pub(crate) mod rows;

use arrow_schema::DataType as Arrow;
use sluice_core::connector::SchemaChange;
use sluice_core::{DataType, Error, ErrorKind, Side, TableName};

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
