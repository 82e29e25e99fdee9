//! A batch's rows as a split reads them: each row decoded into the change it becomes, or
//! rejected with the reason, and the key the next batch starts after.

use std::sync::Arc;

use sluice_core::change::{key_text, Change, Rejected};
use sluice_core::{TableSchema, Value};

use super::decode;

/// A batch's rows, decoded one by one as they are read.
pub(super) struct DecodedRows<'a> {
    table: &'a Arc<TableSchema>,
    pub(super) changes: Vec<Change>,
    pub(super) rejected: Vec<Rejected>,
    /// The key of the last row read, as the server sent it: the next batch starts after it.
    pub(super) last_key: Vec<mysql_async::Value>,
    pub(super) count: usize,
    /// The approximate size of the changes' values ([`Change::approximate_size`]).
    pub(super) bytes: u64,
}

impl<'a> DecodedRows<'a> {
    pub(super) fn new(table: &'a Arc<TableSchema>, capacity: usize) -> DecodedRows<'a> {
        DecodedRows {
            table,
            changes: Vec::with_capacity(capacity),
            rejected: Vec::new(),
            last_key: Vec::new(),
            count: 0,
            bytes: 0,
        }
    }

    /// Decodes a row read from the server, emptying `raw` (so its buffer can be reused). A value
    /// that does not decode rejects its row, with the reason.
    pub(super) fn push(&mut self, raw: &mut Vec<mysql_async::Value>) {
        self.count += 1;
        self.last_key.clear();
        self.last_key.extend(self.table.primary_key.iter().map(|&index| raw[index].clone()));
        let mut values = Vec::with_capacity(raw.len());
        let mut problem = None;
        for (value, column) in raw.drain(..).zip(&self.table.columns) {
            match decode(value, &column.data_type) {
                Ok(value) => values.push(value),
                Err(reason) => {
                    problem.get_or_insert(format!("column {}: {reason}", column.name));
                    values.push(Value::Null);
                }
            }
        }
        match problem {
            None => {
                self.bytes += values.iter().map(Value::approximate_size).sum::<usize>() as u64;
                self.changes.push(Change::insert(self.table.clone(), values));
            }
            Some(reason) => self.rejected.push(Rejected {
                table: self.table.name.to_string(),
                key: key_text(self.table, &values),
                reason: format!("source: {reason}"),
                record: None,
                change: None,
            }),
        }
    }
}
