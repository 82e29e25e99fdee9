//! How one target table is compared: the mapped schema's columns found in the table read back,
//! the type each column is compared as, and the key rows pair by.

use std::sync::Arc;

use super::canonical::{canonical, Canonical};
use super::comparison::Entry;
use crate::change::Row;
use crate::schema::{DataType, TableSchema};
use crate::value::Value;

/// How a target table is compared: the mapped schema, where each of its columns is in the
/// table read back, and the key rows pair by.
pub(super) struct Layout {
    pub(super) mapped: Arc<TableSchema>,
    /// `(column of the mapped schema, column of the table read back)` for each compared column,
    /// the key's first.
    columns: Vec<(usize, usize)>,
    /// The type each compared column is compared as: the mapped type, except that text is
    /// padded to a fixed width only when the target stores it so (a MySQL `CHAR` lands in a
    /// PostgreSQL `varchar`, where a trailing space is a difference).
    types: Vec<DataType>,
    /// How many of `columns` are the key (all of them when the table has none).
    key: usize,
}

impl Layout {
    pub(super) fn of(mapped: Arc<TableSchema>, target: Option<&TableSchema>, problems: &mut Vec<String>) -> Layout {
        let mut columns = Vec::new();
        for (index, column) in mapped.columns.iter().enumerate() {
            let found = target.and_then(|target| {
                target
                    .column_index(&column.name)
                    .or_else(|| target.columns.iter().position(|other| other.name.eq_ignore_ascii_case(&column.name)))
            });
            match (found, target) {
                (Some(found), _) => columns.push((index, found)),
                (None, Some(target)) => problems
                    .push(format!("column {} is missing in target table {}: not compared", column.name, target.name)),
                // No target table: every source row is missing; compare what the source has.
                (None, None) => columns.push((index, index)),
            }
        }
        let key: Vec<usize> = mapped
            .primary_key
            .iter()
            .filter_map(|column| columns.iter().position(|(mapped_column, _)| mapped_column == column))
            .collect();
        let key =
            if key.len() == mapped.primary_key.len() && !key.is_empty() { key } else { (0..columns.len()).collect() };
        // The key's columns first, in key order: a row's key is its first columns.
        let order = key.iter().copied().chain((0..columns.len()).filter(|compared| !key.contains(compared)));
        let columns: Vec<(usize, usize)> = order.map(|compared| columns[compared]).collect();
        let types = columns
            .iter()
            .map(|&(mapped_column, target_column)| {
                let stored = target.map(|target| &target.columns[target_column].data_type);
                match (&mapped.columns[mapped_column].data_type, stored) {
                    (DataType::Text { length, fixed: true }, Some(DataType::Text { fixed, .. })) => {
                        DataType::Text { length: *length, fixed: *fixed }
                    }
                    (data_type, _) => data_type.clone(),
                }
            })
            .collect();
        Layout { mapped, columns, types, key: key.len() }
    }

    fn data_type(&self, compared: usize) -> &DataType {
        &self.types[compared]
    }

    /// A row of the mapped schema as an entry, with its values when `values`.
    pub(super) fn source_entry(&self, row: Row, values: bool) -> Entry {
        let kept = values.then(|| row.clone());
        let mut entry = self.entry(row, |compared| self.columns[compared].0);
        entry.values = kept;
        entry
    }

    /// A row read back from the target as an entry.
    pub(super) fn target_entry(&self, row: Row) -> Entry {
        self.entry(row, |compared| self.columns[compared].1)
    }

    /// The entry of `row`, whose compared column `compared` is at `column_of(compared)`. The
    /// row's values move into the entry (no text is copied).
    fn entry(&self, mut row: Row, column_of: impl Fn(usize) -> usize) -> Entry {
        let compared = (0..self.columns.len())
            .map(|compared| {
                let value = std::mem::replace(&mut row[column_of(compared)], Value::Null);
                canonical(value, self.data_type(compared))
            })
            .collect();
        Entry { row: compared, values: None }
    }

    /// How many of a compared row's first columns are its key.
    pub(super) fn key_columns(&self) -> usize {
        self.key
    }

    /// Whether every column of the mapped schema is in the target table.
    pub(super) fn complete(&self) -> bool {
        self.columns.len() == self.mapped.columns.len()
    }

    /// Whether the table has no key, so rows pair by all their compared columns.
    pub(super) fn keyless(&self) -> bool {
        self.mapped.primary_key.is_empty()
    }

    /// The key of a difference as JSON, by column name.
    pub(super) fn key_json(&self, key: &[Canonical]) -> serde_json::Map<String, serde_json::Value> {
        key.iter().enumerate().map(|(compared, value)| (self.name(compared), value.to_json())).collect()
    }

    /// The key of a difference as values of the mapped schema's types (for reads and deletes by
    /// key).
    pub(super) fn key_values(&self, key: &[Canonical]) -> Row {
        key.iter()
            .enumerate()
            .map(|(compared, value)| value.to_value(&self.mapped.columns[self.columns[compared].0].data_type))
            .collect()
    }

    /// A row of the mapped schema as JSON, by column name.
    pub(super) fn row_json(&self, row: &Row) -> serde_json::Map<String, serde_json::Value> {
        self.mapped.columns.iter().zip(row).map(|(column, value)| (column.name.clone(), value_json(value))).collect()
    }

    /// A compared row's canonical values as JSON, by column name: how a repair records the
    /// target's row it replaced.
    pub(super) fn image_json(&self, image: &[Canonical]) -> serde_json::Map<String, serde_json::Value> {
        image.iter().enumerate().map(|(compared, value)| (self.name(compared), value.to_json())).collect()
    }

    /// A row of the mapped schema holding only this key's values, nulls elsewhere: what a
    /// mapping traces back to its source key.
    pub(super) fn key_row(&self, key: &[Canonical]) -> Row {
        let mut row = vec![Value::Null; self.mapped.columns.len()];
        for (compared, value) in self.key_values(key).into_iter().enumerate() {
            row[self.columns[compared].0] = value;
        }
        row
    }

    /// A key's values as the target table's own primary key orders them, when the target's key
    /// is the mapped key.
    pub(super) fn target_key(&self, target: &TableSchema, key: &[Canonical]) -> Option<Row> {
        if self.keyless() || target.primary_key.len() != self.key {
            return None;
        }
        let values = self.key_values(key);
        target
            .primary_key
            .iter()
            .map(|&column| {
                let position =
                    self.columns[..self.key].iter().position(|&(_, target_column)| target_column == column)?;
                values.get(position).cloned()
            })
            .collect()
    }

    fn name(&self, compared: usize) -> String {
        self.mapped.columns[self.columns[compared].0].name.clone()
    }

    pub(super) fn column_names(&self, compared: &[usize]) -> Vec<String> {
        compared.iter().map(|&index| self.name(index)).collect()
    }
}

/// A value as JSON, as files and change events write it.
fn value_json(value: &Value) -> serde_json::Value {
    let mut text = String::new();
    crate::json::encode_value(value, &mut text);
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(value.to_string()))
}
