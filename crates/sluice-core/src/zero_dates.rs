//! The zero-date policy: MySQL stores `0000-00-00` and `2020-00-15`, most targets cannot. For
//! such a target the runner rejects the row or stores NULL, as the job says, and counts either.

use crate::change::{Batch, ChangeKind, Rejected};
use crate::schema::DataType;
use crate::spec::ZeroDates;
use crate::value::Value;

fn is_zero_date(value: &Value) -> bool {
    match value {
        Value::Date(date) => date.is_zero_or_partial(),
        Value::DateTime(date_time) | Value::Timestamp(date_time) => date_time.date.is_zero_or_partial(),
        _ => false,
    }
}

fn holds_dates(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Date | DataType::DateTime { .. } | DataType::Timestamp { .. })
}

/// What the policy made of a batch.
#[derive(Debug)]
pub struct Outcome {
    pub batch: Batch,
    pub rejected: Vec<Rejected>,
    /// The index in the batch of each change of `rejected`, in the same order.
    pub left_out: Vec<usize>,
    /// Zero dates stored as NULL.
    pub nulled: u64,
}

/// Applies the policy to the new images of a batch. Returns `None` when the batch holds no zero
/// date, which is the common case and costs one scan.
pub fn apply(batch: &Batch, policy: ZeroDates, target: &str) -> Option<Outcome> {
    // Only date columns are looked at: the values of a table without any are not touched.
    let has_zero = batch.changes.iter().any(|change| match &change.kind {
        ChangeKind::Insert { after } | ChangeKind::Update { after, .. } => change
            .table
            .columns
            .iter()
            .zip(after)
            .any(|(column, value)| holds_dates(&column.data_type) && is_zero_date(value)),
        ChangeKind::Delete { .. } => false,
    });
    if !has_zero {
        return None;
    }
    let mut outcome = Outcome {
        batch: Batch { changes: Vec::with_capacity(batch.changes.len()), ..batch.clone() },
        rejected: Vec::new(),
        left_out: Vec::new(),
        nulled: 0,
    };
    outcome.batch.changes.clear();
    for (position, change) in batch.changes.iter().enumerate() {
        let mut change = change.clone();
        let table = change.table.clone();
        let after = match &mut change.kind {
            ChangeKind::Insert { after } | ChangeKind::Update { after, .. } => after,
            ChangeKind::Delete { .. } => {
                outcome.batch.changes.push(change);
                continue;
            }
        };
        let mut refusal = None;
        for (index, value) in after.iter_mut().enumerate() {
            if !is_zero_date(value) {
                continue;
            }
            let column = &table.columns[index];
            match policy {
                ZeroDates::Null if column.nullable => {
                    *value = Value::Null;
                    outcome.nulled += 1;
                }
                _ => {
                    let advice = if policy == ZeroDates::Null {
                        "the column is NOT NULL"
                    } else {
                        "set errors.zero_dates: null to store NULL"
                    };
                    refusal.get_or_insert(format!(
                        "column {}: zero date '{value}' cannot be stored in {target}; {advice}",
                        column.name
                    ));
                }
            }
        }
        match refusal {
            None => outcome.batch.changes.push(change),
            Some(reason) => {
                outcome.rejected.push(Rejected::row(&table, change.row(), reason));
                outcome.left_out.push(position);
            }
        }
    }
    Some(outcome)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::change::{Change, Position};
    use crate::schema::{Column, DataType, TableName, TableSchema};
    use crate::value::Date;

    fn batch() -> Batch {
        let column = |name: &str, nullable| Column::new(name, DataType::Date, nullable);
        let table = Arc::new(TableSchema {
            name: TableName::parse("d.t"),
            columns: vec![column("a", true), column("b", false)],
            primary_key: vec![],
            indexes: vec![],
            details: Default::default(),
        });
        let zero = Value::Date(Date { year: 0, month: 0, day: 0 });
        let fine = Value::Date(Date { year: 2024, month: 1, day: 1 });
        Batch::new(
            vec![
                Change::insert(table.clone(), vec![zero.clone(), fine.clone()]),
                Change::insert(table.clone(), vec![fine.clone(), zero]),
                Change::insert(table, vec![fine.clone(), fine]),
            ],
            Position(serde_json::json!(1)),
        )
    }

    #[test]
    fn reject_makes_every_zero_date_row_dirty() {
        let outcome = apply(&batch(), ZeroDates::Reject, "postgres").unwrap();
        assert_eq!((outcome.batch.changes.len(), outcome.rejected.len(), outcome.nulled), (1, 2, 0));
        assert_eq!(outcome.left_out, vec![0, 1], "which changes of the batch were refused");
        assert!(outcome.rejected[0].reason.contains("column a: zero date '0000-00-00' cannot be stored in postgres"));
    }

    #[test]
    fn null_stores_null_where_the_column_allows_it_and_counts_it() {
        let outcome = apply(&batch(), ZeroDates::Null, "postgres").unwrap();
        assert_eq!((outcome.batch.changes.len(), outcome.rejected.len(), outcome.nulled), (2, 1, 1));
        assert_eq!(outcome.left_out, vec![1]);
        assert_eq!(outcome.batch.changes[0].row()[0], Value::Null);
        assert!(outcome.rejected[0].reason.contains("column b") && outcome.rejected[0].reason.contains("NOT NULL"));
    }

    #[test]
    fn a_batch_without_zero_dates_is_left_alone() {
        let mut clean = batch();
        clean.changes.truncate(0);
        assert!(apply(&clean, ZeroDates::Reject, "postgres").is_none());
    }
}
