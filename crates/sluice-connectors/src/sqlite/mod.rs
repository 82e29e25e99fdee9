//! SQLite as a source and a target: type mapping, value conversion and connections.

pub(crate) mod connector;
mod sink;
mod source;

use std::path::Path;
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use sluice_core::{DataType, Date, DateTime, Decimal, Error, ErrorKind, Side, Time, Value};

pub use sink::SqliteSink;
pub use source::SqliteSource;

/// Opens a database for one side. The source opens read-only and must exist; the target is
/// created when missing. Both wait up to 30 s on a lock rather than fail.
fn open(path: &Path, side: Side) -> Result<Connection, Error> {
    let flags = match side {
        Side::Source => OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        _ => OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    };
    if side == Side::Source && !path.exists() {
        return Err(Error::new(ErrorKind::Connect, format!("SQLite database {} does not exist", path.display()))
            .on(side)
            .hint("check source.path"));
    }
    let connection = Connection::open_with_flags(path, flags).map_err(|error| {
        Error::new(ErrorKind::Connect, format!("cannot open SQLite database {}: {error}", path.display()))
            .on(side)
            .hint(format!("check {}.path and that the directory exists and is writable", side))
    })?;
    connection
        .busy_timeout(Duration::from_secs(30))
        .map_err(|error| sqlite_error(error, side, "set the busy timeout"))?;
    if side == Side::Target {
        connection
            .execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
            .map_err(|error| sqlite_error(error, side, &format!("prepare {} for writing", path.display())))?;
    }
    Ok(connection)
}

/// Classifies a SQLite error: a busy or locked database is worth a retry, a read-only or full
/// disk is not.
fn sqlite_error(error: rusqlite::Error, side: Side, doing: &str) -> Error {
    use rusqlite::ErrorCode;
    let kind = match error.sqlite_error_code() {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => ErrorKind::Unavailable,
        Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => ErrorKind::Connect,
        _ if side == Side::Source => ErrorKind::Read,
        _ => ErrorKind::Write,
    };
    let error = Error::new(kind, format!("{doing}: {error}")).on(side);
    if kind == ErrorKind::Connect {
        error.hint("check that the file and its directory are writable")
    } else {
        error
    }
}

/// Quotes an identifier for SQLite: wrapped in double quotes, inner quotes doubled.
fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// Maps a declared SQLite column type to a logical type. SQLite's own affinity rules decide
/// storage; the declared name carries the intent (`DATETIME`, `DECIMAL(10,2)`), so it decides
/// how values are read.
fn data_type(declared: &str) -> DataType {
    let upper = declared.to_ascii_uppercase();
    let arguments: Vec<u32> = upper
        .split_once('(')
        .map(|(_, rest)| rest.trim_end_matches(')').split(',').filter_map(|part| part.trim().parse().ok()).collect())
        .unwrap_or_default();
    let base = upper.split('(').next().unwrap_or("").trim();
    let has = |word: &str| base.split_whitespace().any(|part| part == word);
    match base {
        _ if base.starts_with("DECIMAL") || base.starts_with("NUMERIC") => {
            DataType::Decimal { precision: arguments.first().copied(), scale: arguments.get(1).copied() }
        }
        _ if has("UNSIGNED") && (base.contains("BIG") || has("U64")) => DataType::Integer { bytes: 8, unsigned: true },
        _ if base.starts_with("TINYINT") => DataType::Integer { bytes: 1, unsigned: has("UNSIGNED") },
        _ if base.starts_with("SMALLINT") => DataType::Integer { bytes: 2, unsigned: has("UNSIGNED") },
        _ if base.starts_with("MEDIUMINT") => DataType::Integer { bytes: 3, unsigned: has("UNSIGNED") },
        _ if base.contains("INT") => DataType::Integer { bytes: 8, unsigned: false },
        "BOOL" | "BOOLEAN" => DataType::Boolean,
        _ if base.starts_with("DATETIME") => DataType::DateTime { precision: 6 },
        _ if base.starts_with("TIMESTAMP") => DataType::Timestamp { precision: 6 },
        "DATE" => DataType::Date,
        "TIME" => DataType::Time { precision: 6 },
        "JSON" => DataType::Json,
        _ if base.contains("CHAR") || base.contains("CLOB") || base.contains("TEXT") => DataType::Text {
            length: arguments.first().copied(),
            fixed: base.starts_with("CHAR") || base.starts_with("CHARACTER"),
        },
        _ if base.contains("BLOB") || base.is_empty() && !declared.is_empty() => {
            DataType::Bytes { length: None, fixed: false }
        }
        _ if base.contains("REAL") || base.contains("FLOA") || base.contains("DOUB") => DataType::Float64,
        "" => DataType::Text { length: None, fixed: false },
        _ => DataType::Decimal { precision: None, scale: None },
    }
}

/// The declared type a logical type gets in a created SQLite table. Types SQLite would convert
/// with loss under numeric affinity (exact decimals, unsigned 64-bit) get a name with TEXT
/// affinity that `data_type` maps back.
fn declared_type(data_type: &DataType) -> String {
    match data_type {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Integer { bytes: 8, unsigned: true } => "UNSIGNED BIG TEXT".into(),
        DataType::Integer { bytes: 1, unsigned } => {
            format!("TINYINT{}", if *unsigned { " UNSIGNED" } else { "" })
        }
        DataType::Integer { bytes: 2, unsigned } => {
            format!("SMALLINT{}", if *unsigned { " UNSIGNED" } else { "" })
        }
        DataType::Integer { .. } | DataType::Year => "INTEGER".into(),
        DataType::Float32 | DataType::Float64 => "REAL".into(),
        DataType::Decimal { precision: Some(precision), scale } => {
            format!("DECIMAL TEXT({precision},{})", scale.unwrap_or(0))
        }
        DataType::Decimal { .. } => "DECIMAL TEXT".into(),
        DataType::Text { length: Some(length), fixed: false } => format!("VARCHAR({length})"),
        DataType::Text { length: Some(length), fixed: true } => format!("CHAR({length})"),
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } => "TEXT".into(),
        DataType::Bytes { .. } | DataType::Geometry => "BLOB".into(),
        DataType::Bits { .. } => "INTEGER".into(),
        DataType::Date => "DATE".into(),
        DataType::Time { .. } => "TIME".into(),
        DataType::DateTime { .. } => "DATETIME".into(),
        DataType::Timestamp { .. } => "TIMESTAMP".into(),
        DataType::Json => "JSON".into(),
    }
}

/// Reads one stored value as the column's logical type, or says why it cannot be.
fn read_value(value: ValueRef<'_>, data_type: &DataType) -> Result<Value, String> {
    let text = |value: ValueRef<'_>| -> Result<String, String> {
        match value {
            ValueRef::Text(bytes) => {
                String::from_utf8(bytes.to_vec()).map_err(|_| "text is not valid UTF-8".to_owned())
            }
            ValueRef::Integer(integer) => Ok(integer.to_string()),
            ValueRef::Real(real) => Ok(real.to_string()),
            ValueRef::Blob(_) => Err("a BLOB is stored in a text column".to_owned()),
            ValueRef::Null => unreachable!("NULL is handled first"),
        }
    };
    if let ValueRef::Null = value {
        return Ok(Value::Null);
    }
    let mismatch = |expected: &str| Err(format!("expected {expected}, found {}", describe(value)));
    Ok(match data_type {
        DataType::Boolean => match value {
            ValueRef::Integer(0) => Value::Bool(false),
            ValueRef::Integer(1) => Value::Bool(true),
            _ => return mismatch("a boolean (0 or 1)"),
        },
        DataType::Integer { unsigned: true, .. } => match value {
            ValueRef::Integer(integer) if integer >= 0 => Value::UInt(integer as u64),
            ValueRef::Text(_) => match text(value)?.parse::<u64>() {
                Ok(integer) => Value::UInt(integer),
                Err(_) => return mismatch("an unsigned integer"),
            },
            _ => return mismatch("an unsigned integer"),
        },
        DataType::Integer { .. } | DataType::Year | DataType::Bits { .. } => match value {
            ValueRef::Integer(integer) => Value::Int(integer),
            _ => return mismatch("an integer"),
        },
        DataType::Float32 | DataType::Float64 => match value {
            ValueRef::Real(real) => Value::Float64(real),
            ValueRef::Integer(integer) => Value::Float64(integer as f64),
            _ => return mismatch("a number"),
        },
        DataType::Decimal { scale, .. } => match Decimal::parse(&text(value)?) {
            // SQLite's numeric affinity stores 1.50 as the real 1.5; the declared scale restores
            // the trailing zeros. Digits are only ever added, never dropped.
            Some(decimal) => Value::Decimal(match scale {
                Some(scale) => decimal.with_minimum_scale(*scale as usize),
                None => decimal,
            }),
            None => return mismatch("a decimal number"),
        },
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } => Value::Text(text(value)?),
        DataType::Json => Value::Json(text(value)?),
        DataType::Bytes { .. } | DataType::Geometry => match value {
            ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Value::Bytes(bytes.to_vec()),
            _ => return mismatch("bytes"),
        },
        DataType::Date => match Date::parse(&text(value)?) {
            Some(date) => Value::Date(date),
            None => return mismatch("a date YYYY-MM-DD"),
        },
        DataType::Time { .. } => match Time::parse(&text(value)?) {
            Some(time) => Value::Time(time),
            None => return mismatch("a time HH:MM:SS[.ffffff]"),
        },
        DataType::DateTime { .. } => match DateTime::parse(&text(value)?) {
            Some(date_time) => Value::DateTime(date_time),
            None => return mismatch("a date-time YYYY-MM-DD HH:MM:SS[.ffffff]"),
        },
        DataType::Timestamp { .. } => {
            let text = text(value)?;
            match DateTime::parse(text.strip_suffix("+00:00").unwrap_or(&text)) {
                Some(date_time) => Value::Timestamp(date_time),
                None => return mismatch("a UTC timestamp YYYY-MM-DD HH:MM:SS[.ffffff]"),
            }
        }
    })
}

fn describe(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(integer) => format!("integer {integer}"),
        ValueRef::Real(real) => format!("real {real}"),
        ValueRef::Text(bytes) => format!("text '{}'", String::from_utf8_lossy(&bytes[..bytes.len().min(64)])),
        ValueRef::Blob(bytes) => format!("a {}-byte BLOB", bytes.len()),
    }
}

/// The SQLite value a logical value is stored as.
fn to_sql(value: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as Sql;
    match value {
        Value::Null => Sql::Null,
        Value::Unchanged => unreachable!(
            "a value the source did not send never reaches a writer: the fold fills it or updates its row in place"
        ),
        Value::Bool(value) => Sql::Integer(i64::from(*value)),
        Value::Int(value) => Sql::Integer(*value),
        Value::UInt(value) => match i64::try_from(*value) {
            Ok(value) => Sql::Integer(value),
            Err(_) => Sql::Text(value.to_string()),
        },
        Value::Float32(value) => Sql::Real(f64::from(*value)),
        Value::Float64(value) => Sql::Real(*value),
        Value::Bits { value, .. } => match i64::try_from(*value) {
            Ok(value) => Sql::Integer(value),
            Err(_) => Sql::Text(value.to_string()),
        },
        Value::Bytes(bytes) => Sql::Blob(bytes.clone()),
        Value::Timestamp(value) => Sql::Text(format!("{value}+00:00")),
        Value::Decimal(_) | Value::Text(_) | Value::Json(_) | Value::Date(_) | Value::Time(_) | Value::DateTime(_) => {
            Sql::Text(value.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_types_round_trip_through_the_mapping() {
        let types = [
            DataType::Boolean,
            DataType::Integer { bytes: 8, unsigned: true },
            DataType::Integer { bytes: 8, unsigned: false },
            DataType::Float64,
            DataType::Decimal { precision: Some(65), scale: Some(30) },
            DataType::Text { length: Some(20), fixed: false },
            DataType::Text { length: None, fixed: false },
            DataType::Bytes { length: None, fixed: false },
            DataType::Date,
            DataType::Time { precision: 6 },
            DataType::DateTime { precision: 6 },
            DataType::Timestamp { precision: 6 },
            DataType::Json,
        ];
        for data_type in types {
            assert_eq!(super::data_type(&declared_type(&data_type)), data_type, "{}", declared_type(&data_type));
        }
    }

    #[test]
    fn values_that_numeric_affinity_would_round_survive_a_table() {
        let connection = Connection::open_in_memory().unwrap();
        let decimal = DataType::Decimal { precision: Some(65), scale: Some(30) };
        let unsigned = DataType::Integer { bytes: 8, unsigned: true };
        connection
            .execute_batch(&format!("CREATE TABLE t (d {}, u {})", declared_type(&decimal), declared_type(&unsigned)))
            .unwrap();
        let wide = Value::Decimal(
            Decimal::parse("12345678901234567890123456789012345.123456789012345678901234567890").unwrap(),
        );
        let max = Value::UInt(u64::MAX);
        connection.execute("INSERT INTO t VALUES (?1, ?2)", [to_sql(&wide), to_sql(&max)]).unwrap();
        let (d, u) = connection
            .query_row("SELECT d, u FROM t", [], |row| {
                Ok((read_value(row.get_ref(0)?, &decimal).unwrap(), read_value(row.get_ref(1)?, &unsigned).unwrap()))
            })
            .unwrap();
        assert_eq!((d, u), (wide, max));
    }

    #[test]
    fn a_value_that_does_not_fit_its_column_says_why() {
        let reason = read_value(ValueRef::Text(b"soon"), &DataType::DateTime { precision: 6 }).unwrap_err();
        assert_eq!(reason, "expected a date-time YYYY-MM-DD HH:MM:SS[.ffffff], found text 'soon'");
    }
}
