//! What the lake targets (Delta, Iceberg) share: rows as Arrow record batches of a table
//! format's types (`rows.rs`), and a group of changes folded per key and located in the table's
//! data files for a copy-on-write merge (`keys.rs`).

pub(crate) mod keys;
pub(crate) mod rows;

use arrow_schema::DataType as Arrow;
use sluice_core::DataType;

/// A lake table format as the shared code needs it: its name, for messages, and the Arrow type
/// each logical type takes in its tables.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Format {
    pub name: &'static str,
    pub arrow_type: fn(&DataType) -> Arrow,
}
