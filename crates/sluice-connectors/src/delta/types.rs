//! The Delta (Arrow) type of each logical type, and rows as Arrow record batches.
//!
//! Delta has no unsigned integers, decimals of more than 38 digits or times of day, so those take
//! the next type that holds every value: an unsigned integer the next wider signed one
//! (`BIGINT UNSIGNED` a `DECIMAL(20, 0)`), a wide decimal its text, MySQL `TIME` (±838 h) a
//! signed count of microseconds. `DATETIME` is `timestamp_ntz` (no zone), `TIMESTAMP` a UTC
//! `timestamp`. docs/types.md lists them.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType as Arrow, Field, Schema, SchemaRef};
use sluice_core::change::Row;
use sluice_core::{DataType, Result, TableSchema};

use crate::columnar::{self, ArrowTypes};
use crate::lake::{rows, Format};

/// The Arrow type a column of this logical type has in a Delta table: no unsigned integers,
/// decimals of at most 38 digits.
pub(super) fn arrow_type(data_type: &DataType) -> Arrow {
    columnar::arrow_type(data_type, ArrowTypes { unsigned: false, decimal256: false })
}

/// A table's Arrow schema in a Delta table: its columns in order, nullable as in the source.
pub(super) fn arrow_schema(table: &TableSchema) -> SchemaRef {
    Arc::new(Schema::new(
        table
            .columns
            .iter()
            .map(|column| Field::new(&column.name, arrow_type(&column.data_type), column.nullable))
            .collect::<Vec<_>>(),
    ))
}

/// Delta's types for the code lake targets share.
pub(super) const FORMAT: Format = Format { name: "Delta", article: "a", arrow_type };

/// Rows of `table` as a record batch of `schema` (the Delta table's, whose columns it matches by
/// name: a column the rows lack, one added since they were read, is NULL).
pub(super) fn batch<'a>(
    table: &TableSchema,
    schema: &SchemaRef,
    rows: impl Iterator<Item = &'a Row>,
) -> Result<RecordBatch> {
    rows::batch(FORMAT, table, schema, rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Column, TableName, Value};

    #[test]
    fn every_value_has_a_delta_type_that_holds_it() {
        assert_eq!(arrow_type(&DataType::Integer { bytes: 8, unsigned: true }), Arrow::Decimal128(20, 0));
        assert_eq!(arrow_type(&DataType::Integer { bytes: 4, unsigned: true }), Arrow::Int64);
        assert_eq!(arrow_type(&DataType::Decimal { precision: Some(65), scale: Some(2) }), Arrow::Utf8);
        let table = TableSchema {
            name: TableName::parse("d.t"),
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: true }, false),
                Column::new("small", DataType::Integer { bytes: 1, unsigned: true }, true),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        };
        let rows = [vec![Value::UInt(u64::MAX), Value::UInt(255)], vec![Value::UInt(1), Value::Null]];
        assert_eq!(rows::misfit(FORMAT, &table, &rows[0]), None);
        assert!(rows::misfit(FORMAT, &table, &vec![Value::Null, Value::Null]).is_some());
        let batch = batch(&table, &arrow_schema(&table), rows.iter()).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(1).null_count(), 1);
    }
}
