//! Rows as Arrow record batches of a lake table, and batches read from its data files made to
//! fit the table's schema again.

use arrow_array::{new_null_array, ArrayRef, RecordBatch};
use arrow_schema::SchemaRef;
use sluice_core::change::{key_text, Batch, ChangeKind, Rejected, Row};
use sluice_core::connector::Refused;
use sluice_core::{Error, ErrorKind, Result, Side, TableSchema, Value};

use super::Format;
use crate::columnar::ColumnBuilder;

/// Why a row cannot be written as it is (the first column that does not fit), if it cannot.
pub(crate) fn misfit(format: Format, table: &TableSchema, row: &Row) -> Option<String> {
    row.iter().zip(&table.columns).find_map(|(value, column)| {
        if matches!(value, Value::Null) && !column.nullable {
            return Some(format!("column {}: NULL in a column that is not nullable", column.name));
        }
        ColumnBuilder::fits(&(format.arrow_type)(&column.data_type), value)
            .err()
            .map(|reason| format!("column {}: {reason}", column.name))
    })
}

/// Rows of `table` as a record batch of `schema` (the lake table's, whose columns it matches by
/// name: a column the rows lack, one added since they were read, is NULL). Rows are checked with
/// `misfit` first.
pub(crate) fn batch<'a>(
    format: Format,
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
            format!("{} table {} has no column {}, which its rows carry", format.name, table.name, missing.join(", ")),
        )
        .on(Side::Target)
        .hint("the source table changed since the lake table was made; copy it again with run --restart"));
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
pub(crate) fn conform(
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

/// A copy's batch split into the rows the table takes and those it refuses for their content
/// (rejected with their key and reason). A change other than an insert is an error.
pub(crate) fn copied_rows<'a>(
    format: Format,
    table: &TableSchema,
    batch: &'a Batch,
) -> Result<(Vec<&'a Row>, Vec<Rejected>)> {
    let mut rejected = Vec::new();
    let mut rows = Vec::with_capacity(batch.changes.len());
    for change in &batch.changes {
        let ChangeKind::Insert { after } = &change.kind else {
            return Err(Error::new(
                ErrorKind::Write,
                format!("a copy into a {} table takes inserts only", format.name),
            )
            .on(Side::Target));
        };
        match misfit(format, table, after) {
            Some(reason) => rejected.push(Rejected {
                table: table.name.to_string(),
                key: key_text(table, after),
                reason: format!("target: {reason}"),
                record: None,
                change: None,
            }),
            None => rows.push(after),
        }
    }
    Ok((rows, rejected))
}

/// A change stream's inserted rows split into those the table takes and those it refuses for
/// their content (with their index and reason).
pub(crate) fn inserted_rows(format: Format, table: &TableSchema, rows: &[Row]) -> (Vec<Row>, Vec<Refused>) {
    let mut refused = Vec::new();
    let mut kept = Vec::with_capacity(rows.len());
    for (index, row) in rows.iter().enumerate() {
        match misfit(format, table, row) {
            Some(reason) => refused.push(Refused { index, reason: format!("target: {reason}") }),
            None => kept.push(row.clone()),
        }
    }
    (kept, refused)
}

/// The error of an update whose rows keep values the source's log did not carry: a lake table's
/// files hold whole rows, so such a row cannot be written.
pub(crate) fn partial_update(format: Format, table: &TableSchema, rows: usize) -> Error {
    Error::new(
        ErrorKind::Write,
        format!(
            "table {}: {rows} updated row(s) keep values the source's log did not carry; a {} table's files hold whole rows",
            table.name, format.name
        ),
    )
    .on(Side::Target)
    .hint("make the source log whole rows (PostgreSQL: ALTER TABLE ... REPLICA IDENTITY FULL), then reset the job")
}
