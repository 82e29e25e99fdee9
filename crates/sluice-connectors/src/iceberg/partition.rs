//! Partitioning: `partition_by` entries (`column`, `year(column)`, `month(…)`, `day(…)`,
//! `hour(…)`, `bucket(16, column)`, `truncate(4, column)`) as an Iceberg partition spec, and the
//! rows of a record batch grouped by the partition the table's spec gives them (Iceberg's own
//! transforms, value by value).

use std::collections::HashMap;

use arrow_array::{
    Array, BinaryArray, BooleanArray, Date32Array, Int32Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, UInt32Array,
};
use arrow_schema::{DataType as Arrow, SchemaRef, TimeUnit};
use iceberg::spec::{Datum, Literal, PartitionSpec, Schema, Struct, Transform, UnboundPartitionSpec};
use iceberg::transform::{create_transform_function, BoxedTransformFunction};
use sluice_core::{Error, ErrorKind, Result, Side, TableName};

/// One entry of `partition_by`: a transform of a column.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PartitionField {
    pub column: String,
    pub transform: Transform,
}

/// An entry as written: `column`, `day(column)`, `bucket(16, column)`, `truncate(4, column)`.
pub(super) fn parse(entry: &str) -> std::result::Result<PartitionField, String> {
    let entry = entry.trim();
    let Some((function, rest)) = entry.split_once('(') else {
        return Ok(PartitionField { column: entry.to_owned(), transform: Transform::Identity });
    };
    let inside = rest.strip_suffix(')').ok_or_else(|| format!("`{entry}`: a closing parenthesis is missing"))?;
    let arguments: Vec<&str> = inside.split(',').map(str::trim).collect();
    let (transform, column) = match (function.trim(), arguments.as_slice()) {
        ("year", [column]) => (Transform::Year, column),
        ("month", [column]) => (Transform::Month, column),
        ("day", [column]) => (Transform::Day, column),
        ("hour", [column]) => (Transform::Hour, column),
        ("identity", [column]) => (Transform::Identity, column),
        ("bucket", [count, column]) => {
            (Transform::Bucket(count.parse().map_err(|_| format!("`{entry}`: {count} is not a bucket count"))?), column)
        }
        ("truncate", [width, column]) => {
            (Transform::Truncate(width.parse().map_err(|_| format!("`{entry}`: {width} is not a width"))?), column)
        }
        _ => {
            return Err(format!(
                "`{entry}` is not a partition field: expected column, year(column), month(column), day(column), hour(column), bucket(N, column) or truncate(W, column)"
            ))
        }
    };
    if column.is_empty() {
        return Err(format!("`{entry}`: the column is missing"));
    }
    Ok(PartitionField { column: (*column).to_owned(), transform })
}

/// The partition spec of `fields` over a new table's schema: each field named after its column
/// (`column_day`, `column_bucket`; the column's own name for identity). Every problem at once.
pub(super) fn spec(table: &TableName, schema: &Schema, fields: &[PartitionField]) -> Result<UnboundPartitionSpec> {
    let mut problems = Vec::new();
    let mut valid = Vec::with_capacity(fields.len());
    for field in fields {
        let Some(source) = schema.field_by_name(&field.column) else {
            problems.push(format!("no column {}", field.column));
            continue;
        };
        if let Err(error) = field.transform.result_type(&source.field_type) {
            problems.push(format!(
                "{} cannot partition column {} of type {}: {error}",
                field.transform, field.column, source.field_type
            ));
            continue;
        }
        let name = match field.transform {
            Transform::Identity => field.column.clone(),
            Transform::Bucket(_) => format!("{}_bucket", field.column),
            Transform::Truncate(_) => format!("{}_trunc", field.column),
            other => format!("{}_{other}", field.column),
        };
        valid.push((source.id, name, field.transform));
    }
    let refused = |problems: Vec<String>| {
        Error::new(ErrorKind::Config, format!("target.partition_by: Iceberg table {table}: {}", problems.join("; ")))
            .on(Side::Target)
            .hint("name columns of the target table (after route and transform), with transforms their types take")
    };
    if !problems.is_empty() {
        return Err(refused(problems));
    }
    let mut builder = UnboundPartitionSpec::builder();
    for (source, name, transform) in valid {
        builder =
            builder.add_partition_field(source, name, transform).map_err(|error| refused(vec![error.to_string()]))?;
    }
    Ok(builder.build())
}

/// A column value as an Iceberg datum, or `None` for NULL or a type partitions do not take here.
fn datum(column: &dyn Array, row: usize) -> Option<Datum> {
    if column.is_null(row) {
        return None;
    }
    let any = column.as_any();
    Some(match column.data_type() {
        Arrow::Boolean => Datum::bool(any.downcast_ref::<BooleanArray>()?.value(row)),
        Arrow::Int32 => Datum::int(any.downcast_ref::<Int32Array>()?.value(row)),
        Arrow::Int64 => Datum::long(any.downcast_ref::<Int64Array>()?.value(row)),
        Arrow::Utf8 => Datum::string(any.downcast_ref::<StringArray>()?.value(row)),
        Arrow::Binary => Datum::binary(any.downcast_ref::<BinaryArray>()?.value(row).iter().copied()),
        Arrow::Date32 => Datum::date(any.downcast_ref::<Date32Array>()?.value(row)),
        Arrow::Timestamp(TimeUnit::Microsecond, None) => {
            Datum::timestamp_micros(any.downcast_ref::<TimestampMicrosecondArray>()?.value(row))
        }
        Arrow::Timestamp(TimeUnit::Microsecond, Some(_)) => {
            Datum::timestamptz_micros(any.downcast_ref::<TimestampMicrosecondArray>()?.value(row))
        }
        _ => return None,
    })
}

/// Whether a column of this Arrow type can be a partition's source here.
fn takes(arrow: &Arrow) -> bool {
    matches!(
        arrow,
        Arrow::Boolean
            | Arrow::Int32
            | Arrow::Int64
            | Arrow::Utf8
            | Arrow::Binary
            | Arrow::Date32
            | Arrow::Timestamp(TimeUnit::Microsecond, _)
    )
}

/// A table's partition spec applied to its record batches.
pub(super) struct Partitioner {
    /// For each partition field: the index of its source column in the batches, and its transform.
    fields: Vec<(usize, BoxedTransformFunction)>,
}

impl Partitioner {
    /// The partitioner of a table's spec over batches of `arrow` (the table's columns in order);
    /// `None` for an unpartitioned table.
    pub(super) fn new(
        name: &TableName,
        spec: &PartitionSpec,
        schema: &Schema,
        arrow: &SchemaRef,
    ) -> Result<Option<Partitioner>> {
        if spec.is_unpartitioned() {
            return Ok(None);
        }
        let refuse = |what: String| {
            Error::new(
                ErrorKind::Schema,
                format!("Iceberg table {name} is partitioned by {what}, which Sluice cannot write"),
            )
            .on(Side::Target)
            .hint("let the job create the table: drop it from the catalog, or set target.namespace to one without it")
        };
        let mut fields = Vec::with_capacity(spec.fields().len());
        for field in spec.fields() {
            let source = schema
                .field_by_id(field.source_id)
                .ok_or_else(|| refuse(format!("{} of a column the table no longer has", field.name)))?;
            let index = arrow
                .index_of(&source.name)
                .map_err(|_| refuse(format!("{} of column {}", field.name, source.name)))?;
            if !takes(arrow.field(index).data_type()) {
                return Err(refuse(format!(
                    "{} ({}) of column {} of type {}",
                    field.name, field.transform, source.name, source.field_type
                )));
            }
            let function = create_transform_function(&field.transform)
                .map_err(|error| refuse(format!("{} ({}): {error}", field.name, field.transform)))?;
            fields.push((index, function));
        }
        Ok(Some(Partitioner { fields }))
    }

    /// The partition of one row.
    fn partition(&self, batch: &RecordBatch, row: usize) -> Result<Struct> {
        let mut values = Vec::with_capacity(self.fields.len());
        for (index, function) in &self.fields {
            let value = match datum(batch.column(*index).as_ref(), row) {
                Some(value) => function.transform_literal(&value).map_err(|error| {
                    Error::new(ErrorKind::Write, format!("partition value: {error}")).on(Side::Target)
                })?,
                None => None,
            };
            values.push(value.map(Literal::from));
        }
        Ok(Struct::from_iter(values))
    }

    /// The batch's rows grouped by partition, each group in the rows' order.
    pub(super) fn split(&self, batch: &RecordBatch) -> Result<Vec<(Struct, RecordBatch)>> {
        let mut groups: Vec<(Struct, Vec<u32>)> = Vec::new();
        let mut positions: HashMap<Struct, usize> = HashMap::new();
        for row in 0..batch.num_rows() {
            let partition = self.partition(batch, row)?;
            let position = *positions.entry(partition.clone()).or_insert_with(|| {
                groups.push((partition, Vec::new()));
                groups.len() - 1
            });
            groups[position].1.push(row as u32);
        }
        groups
            .into_iter()
            .map(|(partition, rows)| {
                let rows = UInt32Array::from(rows);
                let columns = batch
                    .columns()
                    .iter()
                    .map(|column| arrow_select::take::take(column.as_ref(), &rows, None))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .and_then(|columns| RecordBatch::try_new(batch.schema(), columns))
                    .map_err(|error| {
                        Error::new(ErrorKind::Write, format!("partition rows: {error}")).on(Side::Target)
                    })?;
                Ok((partition, columns))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Column, DataType, TableSchema};

    #[test]
    fn a_spec_names_every_column_it_cannot_partition_by() {
        let table = TableSchema {
            name: TableName::parse("d.t"),
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                Column::new("name", DataType::Text { length: Some(20), fixed: false }, true),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        };
        let schema = super::super::types::iceberg_schema(&table).unwrap();
        let fields = [parse("day(name)").unwrap(), parse("nope").unwrap()];
        let error = spec(&table.name, &schema, &fields).unwrap_err().to_string();
        assert!(error.contains("day cannot partition column name of type string"), "{error}");
        assert!(error.contains("no column nope"), "{error}");
        let spec = spec(&table.name, &schema, &[parse("bucket(8, id)").unwrap(), parse("name").unwrap()]).unwrap();
        assert_eq!(spec.fields().iter().map(|field| field.name.as_str()).collect::<Vec<_>>(), ["id_bucket", "name"]);
    }

    #[test]
    fn entries_name_a_column_and_a_transform() {
        assert_eq!(
            parse("region").unwrap(),
            PartitionField { column: "region".into(), transform: Transform::Identity }
        );
        assert_eq!(parse("day(at)").unwrap().transform, Transform::Day);
        assert_eq!(
            parse("bucket(16, id)").unwrap(),
            PartitionField { column: "id".into(), transform: Transform::Bucket(16) }
        );
        assert_eq!(parse("truncate(4,name)").unwrap().transform, Transform::Truncate(4));
        assert!(parse("week(at)").unwrap_err().contains("not a partition field"));
        assert!(parse("bucket(x, id)").unwrap_err().contains("not a bucket count"));
        assert!(parse("day(at").unwrap_err().contains("closing parenthesis"));
    }
}
