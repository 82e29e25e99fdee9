//! Rows updated in place by key, for the rows of a change stream whose update left values
//! unchanged that the source's log did not carry (`Value::Unchanged`): the target keeps its own.

use std::collections::HashMap;

use sluice_core::{Row, TableSchema, Value};

/// The columns an in-place update sets: every column the row carries but its key. A row that
/// carries none but its key sets its first key column to itself, so the statement still tells
/// whether the row is there.
pub(crate) fn assigned(table: &TableSchema, row: &Row) -> Vec<usize> {
    let set: Vec<usize> = (0..row.len())
        .filter(|index| !matches!(row[*index], Value::Unchanged) && !table.primary_key.contains(index))
        .collect();
    if set.is_empty() {
        table.primary_key.iter().take(1).copied().collect()
    } else {
        set
    }
}

/// The rows of `rows` by the columns they set (`assigned`), in first appearance: one prepared
/// statement per shape.
pub(crate) fn by_shape(table: &TableSchema, rows: &[Row]) -> Vec<(Vec<usize>, Vec<usize>)> {
    let mut shapes: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    let mut known: HashMap<Vec<usize>, usize> = HashMap::new();
    for (index, row) in rows.iter().enumerate() {
        let set = assigned(table, row);
        let next = shapes.len();
        let position = *known.entry(set.clone()).or_insert(next);
        if position == next {
            shapes.push((set, Vec::new()));
        }
        shapes[position].1.push(index);
    }
    shapes
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Column, DataType, TableName};

    fn table() -> TableSchema {
        TableSchema {
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                Column::new("n", DataType::Integer { bytes: 8, unsigned: false }, true),
                Column::new("big", DataType::Text { length: None, fixed: false }, true),
            ],
            primary_key: vec![0],
            ..TableSchema::named(TableName::new(Some("s"), "t"))
        }
    }

    #[test]
    fn rows_are_grouped_by_the_columns_they_carry() {
        let table = table();
        let rows = vec![
            vec![Value::Int(1), Value::Int(10), Value::Unchanged],
            vec![Value::Int(2), Value::Null, Value::Text("x".into())],
            vec![Value::Int(3), Value::Int(30), Value::Unchanged],
            vec![Value::Int(4), Value::Unchanged, Value::Unchanged],
        ];
        assert_eq!(by_shape(&table, &rows), vec![(vec![1], vec![0, 2]), (vec![1, 2], vec![1]), (vec![0], vec![3])]);
    }
}
