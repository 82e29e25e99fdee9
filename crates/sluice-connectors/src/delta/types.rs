//! The Delta (Arrow) type of each logical type, and rows as Arrow record batches.
//!
//! Delta has no unsigned integers, decimals of more than 38 digits or times of day, so those take
//! the next type that holds every value: an unsigned integer the next wider signed one
//! (`BIGINT UNSIGNED` a `DECIMAL(20, 0)`), a wide decimal its text, MySQL `TIME` (±838 h) a
//! signed count of microseconds. `DATETIME` is `timestamp_ntz` (no zone), `TIMESTAMP` a UTC
//! `timestamp`. docs/types.md lists them.

use std::sync::Arc;

use arrow_array::{new_null_array, ArrayRef, RecordBatch};
use arrow_schema::{DataType as Arrow, Field, Schema, SchemaRef};
use sluice_core::change::Row;
use sluice_core::{DataType, Error, ErrorKind, Result, Side, TableSchema, Value};

use crate::columnar::{self, ArrowTypes, ColumnBuilder};

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

/// Why a row cannot be written as it is (the first column that does not fit), if it cannot.
pub(super) fn misfit(table: &TableSchema, row: &Row) -> Option<String> {
    row.iter().zip(&table.columns).find_map(|(value, column)| {
        if matches!(value, Value::Null) && !column.nullable {
            return Some(format!("column {}: NULL in a column that is not nullable", column.name));
        }
        ColumnBuilder::fits(&arrow_type(&column.data_type), value)
            .err()
            .map(|reason| format!("column {}: {reason}", column.name))
    })
}

/// Rows of `table` as a record batch of `schema` (the Delta table's, whose columns it matches by
/// name: a column the rows lack, one added since they were read, is NULL). Rows are checked with
/// `misfit` first.
pub(super) fn batch<'a>(
    table: &TableSchema,
    schema: &SchemaRef,
    rows: impl Iterator<Item = &'a Row>,
) -> Result<RecordBatch> {
    let rows: Vec<&Row> = rows.collect();
    let missing: Vec<&str> = table
        .columns
        .iter()
        .filter(|column| schema.field_with_name(&column.name).is_err())
        .map(|column| column.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(Error::new(
            ErrorKind::Schema,
            format!("Delta table {} has no column {}, which its rows carry", table.name, missing.join(", ")),
        )
        .on(Side::Target)
        .hint("the source table changed since the Delta table was made; copy it again with run --restart"));
    }
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let array: ArrayRef = match table.columns.iter().position(|column| column.name == *field.name()) {
            Some(index) => {
                let mut builder = ColumnBuilder::new(field.data_type(), rows.len());
                for row in &rows {
                    builder.append(&row[index]).map_err(|reason| {
                        Error::new(ErrorKind::Data, format!("table {}, column {}: {reason}", table.name, field.name()))
                            .on(Side::Target)
                    })?;
                }
                builder.finish()
            }
            None => new_null_array(field.data_type(), rows.len()),
        };
        columns.push(array);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|error| {
        Error::new(ErrorKind::Write, format!("table {}: rows do not make a record batch: {error}", table.name))
            .on(Side::Target)
    })
}

/// A record batch read from a data file, made to fit `schema`: its columns matched by name and
/// cast where the file has another type (a file written before a column was added lacks it, so it
/// reads as NULL), `constants` (partition values, which a file does not hold) filled in.
pub(super) fn conform(
    batch: &RecordBatch,
    schema: &SchemaRef,
    constants: &[(String, ArrayRef)],
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut columns = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let array = match batch.schema().index_of(field.name()) {
            Ok(index) => {
                let column = batch.column(index).clone();
                if column.data_type() == field.data_type() {
                    column
                } else {
                    arrow_cast::cast(&column, field.data_type()).map_err(|error| read_error(field.name(), error))?
                }
            }
            Err(_) => match constants.iter().find(|(name, _)| name == field.name()) {
                Some((_, value)) => {
                    let indexes = arrow_array::UInt32Array::from(vec![0u32; rows]);
                    arrow_select::take::take(value, &indexes, None).map_err(|error| read_error(field.name(), error))?
                }
                None => new_null_array(field.data_type(), rows),
            },
        };
        columns.push(array);
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|error| {
        Error::new(ErrorKind::Write, format!("a data file's rows do not fit the table: {error}")).on(Side::Target)
    })
}

fn read_error(column: &str, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("column {column} of a data file cannot be read as the table's type: {error}"))
        .on(Side::Target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Column, TableName};

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
        assert_eq!(misfit(&table, &rows[0]), None);
        assert!(misfit(&table, &vec![Value::Null, Value::Null]).is_some());
        let batch = batch(&table, &arrow_schema(&table), rows.iter()).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(1).null_count(), 1);
    }
}
