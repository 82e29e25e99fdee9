//! Rows written by key into MySQL: deletes by primary key and multi-row prepared inserts, with
//! values bound as parameters; shared by upserts and the change writer.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use sluice_core::{DataType, Row, TableSchema, Value};

use super::quote;
use super::tables::qualified;

/// The most placeholders one MySQL statement may hold.
const MAX_PLACEHOLDERS: usize = 65_535;

/// Deletes the rows with these primary keys (in key-column order); returns how many went.
pub(super) async fn delete_keys(
    connection: &mut Conn,
    table: &TableSchema,
    keys: &[Vec<Value>],
) -> std::result::Result<u64, mysql_async::Error> {
    let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
    // A one-column key as a plain IN list, which every server turns into index lookups.
    let key_placeholder =
        if key.len() == 1 { "?".to_owned() } else { format!("({})", vec!["?"; key.len()].join(", ")) };
    let mut deleted = 0;
    for chunk in keys.chunks((MAX_PLACEHOLDERS / key.len().max(1)).clamp(1, 1_000)) {
        let sql = format!(
            "DELETE FROM {} WHERE ({}) IN ({})",
            qualified(&table.name),
            key.join(", "),
            vec![key_placeholder.as_str(); chunk.len()].join(", ")
        );
        let parameters: Vec<mysql_async::Value> = chunk.iter().flatten().map(encode).collect();
        connection.exec_drop(sql, parameters).await?;
        deleted += connection.affected_rows();
    }
    Ok(deleted)
}

/// A table without a primary key: deletes one row equal to each of `rows` in every column (so
/// of duplicates one goes); returns the indexes of those that found none. Each column compares
/// exactly, whatever its collation: variable-length text by its bytes in the column's character
/// set (no case folding, no PAD SPACE), CHAR in that set's binary collation (CHAR drops trailing
/// spaces anyway), decimals as decimals, JSON as JSON (MySQL's native type equals no string).
pub(super) async fn delete_rows(
    connection: &mut Conn,
    table: &TableSchema,
    rows: &[Row],
) -> std::result::Result<Vec<usize>, mysql_async::Error> {
    let conditions: Vec<String> = table.columns.iter().map(row_condition).collect();
    let sql = format!("DELETE FROM {} WHERE {} LIMIT 1", qualified(&table.name), conditions.join(" AND "));
    let statement = connection.prep(sql).await?;
    let mut missing = Vec::new();
    for (index, row) in rows.iter().enumerate() {
        let parameters: Vec<mysql_async::Value> = row.iter().map(encode).collect();
        connection.exec_drop(&statement, parameters).await?;
        if connection.affected_rows() == 0 {
            missing.push(index);
        }
    }
    Ok(missing)
}

/// One column's condition of `delete_rows`, with one placeholder.
fn row_condition(column: &sluice_core::Column) -> String {
    let name = quote(&column.name);
    let charset = column.collation.as_deref().and_then(|collation| collation.split('_').next()).filter(|charset| {
        !charset.is_empty() && *charset != "binary" && charset.chars().all(|c| c.is_ascii_alphanumeric())
    });
    match (&column.data_type, charset) {
        (DataType::Json, _) => format!("JSON_EXTRACT({name}, '$') <=> JSON_EXTRACT(?, '$')"),
        (DataType::Decimal { precision: Some(precision), scale }, _) => {
            format!("{name} <=> CAST(? AS DECIMAL({}, {}))", (*precision).min(65), scale.unwrap_or(0).min(30))
        }
        (DataType::Text { fixed: false, .. }, Some(charset)) => {
            format!("CAST({name} AS BINARY) <=> CAST(CONVERT(? USING {charset}) AS BINARY)")
        }
        (DataType::Text { fixed: true, .. }, Some(charset)) => {
            format!("{name} COLLATE {charset}_bin <=> CONVERT(? USING {charset})")
        }
        (DataType::Text { .. }, None) => format!("CAST({name} AS BINARY) <=> CAST(? AS BINARY)"),
        _ => format!("{name} <=> ?"),
    }
}

/// Inserts rows with multi-row prepared statements.
pub(super) async fn insert_rows(
    connection: &mut Conn,
    table: &TableSchema,
    rows: &[&Row],
) -> std::result::Result<(), mysql_async::Error> {
    let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
    let row_placeholder = format!("({})", vec!["?"; columns.len()].join(", "));
    for chunk in rows.chunks((MAX_PLACEHOLDERS / columns.len().max(1)).clamp(1, 1_000)) {
        let sql = format!(
            "INSERT INTO {} ({}) VALUES {}",
            qualified(&table.name),
            columns.join(", "),
            vec![row_placeholder.as_str(); chunk.len()].join(", ")
        );
        let parameters: Vec<mysql_async::Value> = chunk.iter().flat_map(|row| row.iter().map(encode)).collect();
        connection.exec_drop(sql, parameters).await?;
    }
    Ok(())
}

/// The parameter a value is bound as.
pub(super) fn encode(value: &Value) -> mysql_async::Value {
    use mysql_async::Value as My;
    match value {
        Value::Null => My::NULL,
        Value::Unchanged => unreachable!(
            "a value the source did not send never reaches a writer: the fold fills it or updates its row in place"
        ),
        Value::Bool(value) => My::Int(i64::from(*value)),
        Value::Int(value) => My::Int(*value),
        Value::UInt(value) => My::UInt(*value),
        Value::Float32(value) => My::Float(*value),
        Value::Float64(value) => My::Double(*value),
        Value::Bits { value, .. } => My::UInt(*value),
        Value::Bytes(bytes) => My::Bytes(bytes.clone()),
        Value::Date(date) => My::Date(date.year, date.month, date.day, 0, 0, 0, 0),
        Value::DateTime(value) | Value::Timestamp(value) => My::Date(
            value.date.year,
            value.date.month,
            value.date.day,
            value.hour,
            value.minute,
            value.second,
            value.microsecond,
        ),
        Value::Time(time) => My::Time(
            time.negative,
            time.hours / 24,
            (time.hours % 24) as u8,
            time.minutes,
            time.seconds,
            time.microseconds,
        ),
        Value::Decimal(_) | Value::Text(_) | Value::Json(_) => My::Bytes(value.to_string().into_bytes()),
    }
}
