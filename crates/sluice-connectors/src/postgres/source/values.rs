//! A PostgreSQL value's text form (what `::text`, COPY and `pgoutput` give, in a session with
//! `DateStyle = ISO`, `TimeZone = UTC`, `bytea_output = hex`) read as a sluice value of its
//! column's type. The snapshot and the change stream read values through this one function, so
//! a key read by one compares equal to the same key read by the other.

use std::borrow::Cow;

use sluice_core::value::{Date, DateTime, Decimal, Time};
use sluice_core::{DataType, TableSchema, Value};

/// One row of COPY text (tab-separated fields, `\\N` for NULL, backslash escapes) as the values
/// of `table`'s columns; a value its column's type cannot hold makes the row refused, with the
/// values read and the reason.
pub(crate) fn decode_line(table: &TableSchema, line: &[u8]) -> Result<Vec<Value>, (Vec<Value>, String)> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let mut values = Vec::with_capacity(table.columns.len());
    let mut problem = None;
    let mut fields = line.split(|byte| *byte == b'\t');
    for column in table.columns.iter() {
        let value = match fields.next().map(unescape_copy) {
            None => {
                problem.get_or_insert(format!("the source sent fewer fields than the {} columns", table.columns.len()));
                Value::Null
            }
            Some(None) => Value::Null,
            Some(Some(Err(reason))) => {
                problem.get_or_insert(format!("source column {}: {reason}", column.name));
                Value::Null
            }
            Some(Some(Ok(text))) => match parse(&text, &column.data_type) {
                Ok(value) => value,
                Err(reason) => {
                    problem.get_or_insert(format!("source column {}: {reason}", column.name));
                    Value::Text(text.into_owned())
                }
            },
        };
        values.push(value);
    }
    match problem {
        None => Ok(values),
        Some(reason) => Err((values, reason)),
    }
}

/// The value of `text` for a column of `data_type`. A value the logical type cannot hold (a
/// date or timestamp BC, past year 9999 or `infinity`; a numeric `NaN` or `Infinity`) is kept
/// as the server's text, unchanged: a PostgreSQL target stores it as it was, a target that
/// cannot refuses the row naming the column.
pub(crate) fn parse(text: &str, data_type: &DataType) -> Result<Value, String> {
    match typed(text, data_type) {
        Err(_) if beyond_the_logical_type(data_type) => Ok(Value::Text(text.to_owned())),
        result => result,
    }
}

/// Types whose PostgreSQL values reach past what sluice's value holds.
fn beyond_the_logical_type(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Decimal { .. }
            | DataType::Date
            | DataType::Time { .. }
            | DataType::DateTime { .. }
            | DataType::Timestamp { .. }
            | DataType::Float32
            | DataType::Float64
    )
}

fn typed(text: &str, data_type: &DataType) -> Result<Value, String> {
    let invalid = |expected: &str| {
        let shown: String = text.chars().take(64).collect();
        Err(format!("'{shown}' is not {expected} this target column can hold"))
    };
    Ok(match data_type {
        DataType::Boolean => match text {
            "t" | "true" => Value::Bool(true),
            "f" | "false" => Value::Bool(false),
            _ => return invalid("a boolean"),
        },
        DataType::Integer { .. } => match text.parse() {
            Ok(value) => Value::Int(value),
            Err(_) => return invalid("an integer"),
        },
        DataType::Float32 => match float(text) {
            Some(value) => Value::Float32(value as f32),
            None => return invalid("a number"),
        },
        DataType::Float64 => match float(text) {
            Some(value) => Value::Float64(value),
            None => return invalid("a number"),
        },
        DataType::Decimal { .. } => match Decimal::parse(text) {
            Some(value) => Value::Decimal(value),
            None => return invalid("a finite decimal number"),
        },
        DataType::Bytes { .. } => match hex_bytes(text) {
            Some(bytes) => Value::Bytes(bytes),
            None => return invalid("a bytea in hex form"),
        },
        DataType::Bits { width } => match u64::from_str_radix(text, 2) {
            Ok(value) if text.len() <= 64 => Value::Bits { width: *width, value },
            _ => return invalid("a bit string"),
        },
        DataType::Date => match Date::parse(text) {
            Some(value) => Value::Date(value),
            None => return invalid("a date of years 1 to 9999"),
        },
        DataType::Time { .. } => match Time::parse(text) {
            Some(value) => Value::Time(value),
            None => return invalid("a time of day"),
        },
        DataType::DateTime { .. } => match DateTime::parse(text) {
            Some(value) => Value::DateTime(value),
            None => return invalid("a timestamp of years 1 to 9999"),
        },
        DataType::Timestamp { .. } => match text.strip_suffix("+00").and_then(DateTime::parse) {
            Some(value) => Value::Timestamp(value),
            None => return invalid("a UTC timestamp of years 1 to 9999"),
        },
        DataType::Json => Value::Json(text.to_owned()),
        DataType::Year => match text.parse() {
            Ok(value) => Value::Int(value),
            Err(_) => return invalid("a year"),
        },
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } | DataType::Geometry => {
            Value::Text(text.to_owned())
        }
    })
}

/// The text form of a value as PostgreSQL reads it back (`$1::text::type`): how a key read by
/// the snapshot or the stream is bound in the next read's bounds.
pub(crate) fn text_form(value: &Value) -> Option<String> {
    use std::fmt::Write;
    Some(match value {
        Value::Null => return None,
        Value::Unchanged => unreachable!(
            "a value the source did not send never reaches a writer: the fold fills it or updates its row in place"
        ),
        Value::Bool(value) => if *value { "t" } else { "f" }.to_owned(),
        Value::Int(value) => value.to_string(),
        Value::UInt(value) => value.to_string(),
        Value::Float32(value) => value.to_string(),
        Value::Float64(value) => value.to_string(),
        Value::Decimal(value) => value.to_string(),
        Value::Text(text) | Value::Json(text) => text.clone(),
        Value::Bytes(bytes) => {
            let mut text = String::with_capacity(2 + bytes.len() * 2);
            text.push_str("\\x");
            for byte in bytes {
                let _ = write!(text, "{byte:02x}");
            }
            text
        }
        Value::Bits { width, value } => format!("{value:0width$b}", width = *width as usize),
        Value::Date(value) => value.to_string(),
        Value::Time(value) => value.to_string(),
        Value::DateTime(value) => value.to_string(),
        Value::Timestamp(value) => format!("{value}+00"),
    })
}

/// A float's text form, with PostgreSQL's words for the values that are no numbers.
fn float(text: &str) -> Option<f64> {
    match text {
        "NaN" => Some(f64::NAN),
        "Infinity" => Some(f64::INFINITY),
        "-Infinity" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

/// `\x0aff` as its bytes.
fn hex_bytes(text: &str) -> Option<Vec<u8>> {
    let digits = text.strip_prefix("\\x")?.as_bytes();
    if digits.len() % 2 != 0 {
        return None;
    }
    let nibble = |digit: u8| (digit as char).to_digit(16).map(|value| value as u8);
    digits.chunks(2).map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?)).collect()
}

/// A COPY text field with its backslash escapes undone (a field without any is borrowed from the
/// line); `None` for `\N` (NULL).
pub(crate) fn unescape_copy(field: &[u8]) -> Option<Result<Cow<'_, str>, String>> {
    if field == b"\\N" {
        return None;
    }
    fn not_utf8<E>(_: E) -> String {
        "a value is not UTF-8".to_owned()
    }
    if !field.contains(&b'\\') {
        return Some(std::str::from_utf8(field).map(Cow::Borrowed).map_err(not_utf8));
    }
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).map(Cow::Owned).map_err(not_utf8);
    let mut bytes = Vec::with_capacity(field.len());
    let mut rest = field.iter().copied().peekable();
    while let Some(byte) = rest.next() {
        if byte != b'\\' {
            bytes.push(byte);
            continue;
        }
        let Some(escaped) = rest.next() else {
            bytes.push(byte);
            break;
        };
        bytes.push(match escaped {
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'b' => 8,
            b'f' => 12,
            b'v' => 11,
            b'0'..=b'7' => {
                let mut value = u32::from(escaped - b'0');
                for _ in 0..2 {
                    match rest.peek() {
                        Some(digit @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(digit - b'0');
                            rest.next();
                        }
                        _ => break,
                    }
                }
                value as u8
            }
            other => other,
        });
    }
    Some(text(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_read_as_their_types_and_back() {
        let cases = [
            ("t", DataType::Boolean),
            ("-42", DataType::Integer { bytes: 8, unsigned: false }),
            ("1.50", DataType::Decimal { precision: Some(5), scale: Some(2) }),
            ("\\x00ff", DataType::Bytes { length: None, fixed: false }),
            ("0101", DataType::Bits { width: 4 }),
            ("2024-02-29", DataType::Date),
            ("2024-02-29 23:59:59.000001", DataType::DateTime { precision: 6 }),
            ("2024-02-29 23:59:59.5+00", DataType::Timestamp { precision: 6 }),
            ("{\"b\": 1, \"a\": [1.0]}", DataType::Json),
        ];
        for (text, data_type) in cases {
            let value = parse(text, &data_type).unwrap();
            let back = text_form(&value).unwrap();
            assert_eq!(parse(&back, &data_type).unwrap(), value, "{text}");
        }
        assert!(matches!(parse("NaN", &DataType::Float64), Ok(Value::Float64(value)) if value.is_nan()));
    }

    #[test]
    fn copy_escapes_are_undone() {
        assert_eq!(unescape_copy(b"\\N"), None);
        assert_eq!(unescape_copy(b"plain").unwrap().unwrap(), "plain");
        assert_eq!(unescape_copy(b"a\\tb\\\\c\\nd\\101").unwrap().unwrap(), "a\tb\\c\ndA");
        assert_eq!(unescape_copy(b"\\\\x00ff").unwrap().unwrap(), "\\x00ff");
    }

    #[test]
    fn values_beyond_the_logical_type_stay_the_servers_text() {
        let decimal = DataType::Decimal { precision: None, scale: None };
        for (text, data_type) in [
            ("NaN", decimal.clone()),
            ("-Infinity", decimal),
            ("infinity", DataType::Date),
            ("0044-03-15 BC", DataType::Date),
            ("12024-01-01", DataType::Date),
            ("2024-01-01 00:00:00+00 BC", DataType::Timestamp { precision: 6 }),
        ] {
            assert_eq!(parse(text, &data_type), Ok(Value::Text(text.to_owned())), "{text}");
        }
        assert!(parse("maybe", &DataType::Boolean).unwrap_err().contains("'maybe'"));
    }
}
