//! The Iceberg type of each logical type, the Iceberg schema of a table, and the Arrow schema its
//! Parquet data files are written with (each column carrying its Iceberg field id, which is how
//! Iceberg readers match a file's columns to the table's).
//!
//! Iceberg has no 8- or 16-bit integers, no unsigned integers, decimals of more than 38 digits or
//! times of day beyond 24 hours, so those take the next type that holds every value: a small
//! integer an `int`, an unsigned one the next wider signed one (`BIGINT UNSIGNED` a
//! `decimal(20, 0)`), a wide decimal its text, MySQL `TIME` (±838 h) a `long` count of
//! microseconds. `DATETIME` is `timestamp` (no zone), `TIMESTAMP` a `timestamptz`. docs/types.md
//! lists them.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType as Arrow, Field, Schema as ArrowSchema, SchemaRef, TimeUnit};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use sluice_core::{DataType, Error, ErrorKind, Result, Side, TableName, TableSchema};

use crate::columnar::{self, ArrowTypes};
use crate::lake::Format;

/// The metadata key that carries a column's Iceberg field id in a Parquet file's schema.
const FIELD_ID: &str = "PARQUET:field_id";

/// The Arrow type a column of this logical type has in an Iceberg table.
pub(super) fn arrow_type(data_type: &DataType) -> Arrow {
    match columnar::arrow_type(data_type, ArrowTypes { unsigned: false, decimal256: false }) {
        Arrow::Int8 | Arrow::Int16 => Arrow::Int32,
        other => other,
    }
}

/// Iceberg's types for the code lake targets share.
pub(super) const FORMAT: Format = Format { name: "Iceberg", article: "an", arrow_type };

/// The Iceberg type of an Arrow type `arrow_type` gives.
fn iceberg_type(arrow: &Arrow) -> Option<PrimitiveType> {
    Some(match arrow {
        Arrow::Boolean => PrimitiveType::Boolean,
        Arrow::Int32 => PrimitiveType::Int,
        Arrow::Int64 => PrimitiveType::Long,
        Arrow::Float32 => PrimitiveType::Float,
        Arrow::Float64 => PrimitiveType::Double,
        Arrow::Decimal128(precision, scale) => {
            PrimitiveType::Decimal { precision: u32::from(*precision), scale: (*scale).max(0) as u32 }
        }
        Arrow::Utf8 => PrimitiveType::String,
        Arrow::Binary => PrimitiveType::Binary,
        Arrow::Date32 => PrimitiveType::Date,
        Arrow::Timestamp(TimeUnit::Microsecond, None) => PrimitiveType::Timestamp,
        Arrow::Timestamp(TimeUnit::Microsecond, Some(_)) => PrimitiveType::Timestamptz,
        _ => return None,
    })
}

/// The Arrow type of an Iceberg column (the inverse of `iceberg_type`).
fn arrow_of(primitive: &PrimitiveType) -> Option<Arrow> {
    Some(match primitive {
        PrimitiveType::Boolean => Arrow::Boolean,
        PrimitiveType::Int => Arrow::Int32,
        PrimitiveType::Long => Arrow::Int64,
        PrimitiveType::Float => Arrow::Float32,
        PrimitiveType::Double => Arrow::Float64,
        PrimitiveType::Decimal { precision, scale } => Arrow::Decimal128(*precision as u8, *scale as i8),
        PrimitiveType::String => Arrow::Utf8,
        PrimitiveType::Binary => Arrow::Binary,
        PrimitiveType::Date => Arrow::Date32,
        PrimitiveType::Timestamp => Arrow::Timestamp(TimeUnit::Microsecond, None),
        PrimitiveType::Timestamptz => Arrow::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        _ => return None,
    })
}

fn schema_error(table: &TableName, message: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Schema, format!("Iceberg table {table}: {message}")).on(Side::Target)
}

/// The Iceberg fields of `table`'s columns, numbered from `first_id`.
pub(super) fn fields(table: &TableSchema, first_id: i32) -> Result<Vec<NestedField>> {
    table
        .columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            let arrow = arrow_type(&column.data_type);
            let primitive = iceberg_type(&arrow).ok_or_else(|| {
                schema_error(
                    &table.name,
                    format_args!("column {} has type {arrow}, which has no Iceberg type", column.name),
                )
            })?;
            let id = first_id + index as i32;
            Ok(if column.nullable {
                NestedField::optional(id, &column.name, Type::Primitive(primitive))
            } else {
                NestedField::required(id, &column.name, Type::Primitive(primitive))
            })
        })
        .collect()
}

/// The Iceberg schema of a new table: its columns numbered from 1, its primary key as the
/// identifier fields.
pub(super) fn iceberg_schema(table: &TableSchema) -> Result<Schema> {
    let fields = fields(table, 1)?;
    let key: Vec<i32> = if table.primary_key.iter().all(|&index| !table.columns[index].nullable) {
        table.primary_key.iter().map(|&index| fields[index].id).collect()
    } else {
        Vec::new()
    };
    Schema::builder()
        .with_fields(fields.into_iter().map(Arc::new))
        .with_identifier_field_ids(key)
        .build()
        .map_err(|error| schema_error(&table.name, error))
}

/// The Arrow schema of an Iceberg schema's data files: one field per column, carrying its id.
pub(super) fn arrow_schema(name: &TableName, schema: &Schema) -> Result<SchemaRef> {
    let fields = schema
        .as_struct()
        .fields()
        .iter()
        .map(|field| {
            let Type::Primitive(primitive) = field.field_type.as_ref() else {
                return Err(schema_error(name, format_args!("column {} is not of a primitive type", field.name)));
            };
            let arrow = arrow_of(primitive).ok_or_else(|| {
                schema_error(
                    name,
                    format_args!("column {} has type {primitive}, which Sluice does not write", field.name),
                )
            })?;
            Ok(Field::new(&field.name, arrow, !field.required)
                .with_metadata(HashMap::from([(FIELD_ID.to_owned(), field.id.to_string())])))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(ArrowSchema::new(fields)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Column;

    #[test]
    fn every_value_has_an_iceberg_type_that_holds_it() {
        let table = TableSchema {
            name: TableName::parse("d.t"),
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: true }, false),
                Column::new("small", DataType::Integer { bytes: 1, unsigned: false }, true),
                Column::new("wide", DataType::Decimal { precision: Some(65), scale: Some(2) }, true),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        };
        let schema = iceberg_schema(&table).unwrap();
        assert_eq!(schema.identifier_field_ids().collect::<Vec<_>>(), vec![1]);
        let arrow = arrow_schema(&table.name, &schema).unwrap();
        assert_eq!(arrow.field(0).data_type(), &Arrow::Decimal128(20, 0));
        assert_eq!(arrow.field(1).data_type(), &Arrow::Int32);
        assert_eq!(arrow.field(2).data_type(), &Arrow::Utf8);
        assert_eq!(arrow.field(1).metadata().get(FIELD_ID).map(String::as_str), Some("2"));
    }
}
