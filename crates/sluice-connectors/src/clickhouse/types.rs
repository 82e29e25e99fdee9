//! The ClickHouse type of each logical type, by what the server has, and values in RowBinary.
//!
//! A server older than 21.9 has no `Date32` and no `DateTime64`: its `Date` holds 1970-01-01 to
//! 2105-12-31 and its `DateTime` whole seconds from 1970 to 2105, and it stores a value outside
//! those as another date without a word. So dates and times outside the range a column holds are
//! refused here, row by row, naming the column; times with a fraction of a second are text on such
//! a server. Every other type has a ClickHouse type that holds each value exactly; what has none
//! (MySQL `TIME`, JSON, sets, geometry, decimals of more than 38 digits) is text or bytes in a
//! `String`. docs/types.md lists them.

use sluice_core::change::Row;
use sluice_core::{Column, DataType, Date, DateTime, TableSchema, Value};

use super::server::Version;

/// The Sluice columns every table has after its own: the source position of the row's last
/// change (`ReplacingMergeTree` keeps the row of the largest), and whether that change deleted it.
pub const VERSION_COLUMN: &str = "_sluice_version";
pub const DELETED_COLUMN: &str = "_sluice_deleted";

/// What the server's types can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// `Date32` and `DateTime64` (21.9 and later), with their range 1900–2299.
    pub wide_dates: bool,
    /// `Bool` (22.1 and later).
    pub boolean: bool,
}

impl Features {
    pub fn of(version: Version) -> Features {
        Features { wide_dates: version.at_least(21, 9), boolean: version.at_least(22, 1) }
    }

    /// The years a date or time column holds.
    fn years(self) -> std::ops::RangeInclusive<u16> {
        if self.wide_dates {
            1900..=2299
        } else {
            1970..=2105
        }
    }
}

/// The ClickHouse type of a column, `Nullable(…)` when the column is.
pub fn column_type(column: &Column, features: Features) -> String {
    let base = base_type(&column.data_type, features);
    if column.nullable {
        format!("Nullable({base})")
    } else {
        base
    }
}

fn base_type(data_type: &DataType, features: Features) -> String {
    let text = || "String".to_owned();
    match data_type {
        DataType::Boolean if features.boolean => "Bool".to_owned(),
        DataType::Boolean => "UInt8".to_owned(),
        DataType::Integer { bytes, unsigned } => {
            let bits = match bytes {
                1 => 8,
                2 => 16,
                3 | 4 => 32,
                _ => 64,
            };
            format!("{}Int{bits}", if *unsigned { "U" } else { "" })
        }
        DataType::Float32 => "Float32".to_owned(),
        DataType::Float64 => "Float64".to_owned(),
        DataType::Decimal { precision: Some(precision), scale } if *precision <= 38 => {
            format!("Decimal({precision}, {})", scale.unwrap_or(0))
        }
        DataType::Decimal { .. } => text(),
        DataType::Bits { .. } => "UInt64".to_owned(),
        DataType::Year => "UInt16".to_owned(),
        DataType::Date if features.wide_dates => "Date32".to_owned(),
        DataType::Date => "Date".to_owned(),
        DataType::DateTime { precision } | DataType::Timestamp { precision } if features.wide_dates => {
            format!("DateTime64({precision}, 'UTC')")
        }
        DataType::DateTime { precision: 0 } | DataType::Timestamp { precision: 0 } => "DateTime('UTC')".to_owned(),
        DataType::DateTime { .. } | DataType::Timestamp { .. } => text(),
        DataType::Text { .. }
        | DataType::Bytes { .. }
        | DataType::Time { .. }
        | DataType::Json
        | DataType::Enum { .. }
        | DataType::Set { .. }
        | DataType::Geometry => text(),
    }
}

/// How a column's values are written in RowBinary: the ClickHouse type's own encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An integer of `bytes` bytes, little-endian (Bool and UInt8 are one byte).
    Integer {
        bytes: u8,
        signed: bool,
    },
    Float32,
    Float64,
    /// A decimal as its scaled integer in 4, 8 or 16 bytes.
    Decimal {
        bytes: u8,
        scale: u32,
    },
    /// Days since 1970-01-01: `Date` as UInt16, `Date32` as Int32.
    Date {
        wide: bool,
    },
    /// `DateTime`: seconds since 1970 (UTC) as UInt32.
    DateTime,
    /// `DateTime64(p)`: ticks of 10^-p s since 1970 (UTC) as Int64.
    DateTime64 {
        precision: u8,
    },
    /// A length (LEB128) and the bytes.
    String,
}

fn kind(data_type: &DataType, features: Features) -> Kind {
    match data_type {
        DataType::Boolean => Kind::Integer { bytes: 1, signed: false },
        DataType::Integer { bytes, unsigned } => {
            Kind::Integer { bytes: if *bytes == 3 { 4 } else { (*bytes).min(8) }, signed: !unsigned }
        }
        DataType::Float32 => Kind::Float32,
        DataType::Float64 => Kind::Float64,
        DataType::Decimal { precision: Some(precision), scale } if *precision <= 38 => Kind::Decimal {
            bytes: match precision {
                0..=9 => 4,
                10..=18 => 8,
                _ => 16,
            },
            scale: scale.unwrap_or(0),
        },
        DataType::Bits { .. } => Kind::Integer { bytes: 8, signed: false },
        DataType::Year => Kind::Integer { bytes: 2, signed: false },
        DataType::Date => Kind::Date { wide: features.wide_dates },
        DataType::DateTime { precision } | DataType::Timestamp { precision } if features.wide_dates => {
            Kind::DateTime64 { precision: *precision }
        }
        DataType::DateTime { precision: 0 } | DataType::Timestamp { precision: 0 } => Kind::DateTime,
        _ => Kind::String,
    }
}

/// Writes rows in RowBinary, ClickHouse's bulk format: each value in its type's own binary
/// encoding, so the server parses nothing, and a value its column cannot hold is refused here.
#[derive(Debug)]
pub struct Encoder {
    features: Features,
}

impl Encoder {
    pub fn new(features: Features) -> Encoder {
        Encoder { features }
    }

    /// Appends `row`'s values. A value its column cannot hold leaves `out` as it was and is
    /// the reason, naming the column.
    pub fn values(&self, table: &TableSchema, row: &Row, out: &mut Vec<u8>) -> Result<(), String> {
        let start = out.len();
        for (value, column) in row.iter().zip(&table.columns) {
            if let Err(reason) = self.value(column, value, out) {
                out.truncate(start);
                return Err(format!("column {}: {reason}", column.name));
            }
        }
        Ok(())
    }

    /// Appends a tombstone's values: the key's values (given in key order) in the key columns,
    /// and in the others NULL or, where the column is not nullable, the type's zero, so a row
    /// and a tombstone go in one INSERT.
    pub fn tombstone(&self, table: &TableSchema, key: &Row, out: &mut Vec<u8>) -> Result<(), String> {
        let start = out.len();
        for (index, column) in table.columns.iter().enumerate() {
            match table.primary_key.iter().position(|&key_column| key_column == index) {
                Some(position) => {
                    if let Err(reason) = self.value(column, &key[position], out) {
                        out.truncate(start);
                        return Err(format!("column {}: {reason}", column.name));
                    }
                }
                None if column.nullable => out.push(1),
                None => zero(kind(&column.data_type, self.features), out),
            }
        }
        Ok(())
    }

    /// Ends a row with the Sluice columns: the version, and whether the key is deleted.
    pub fn end(version: u64, deleted: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&version.to_le_bytes());
        out.push(u8::from(deleted));
    }

    fn value(&self, column: &Column, value: &Value, out: &mut Vec<u8>) -> Result<(), String> {
        if column.nullable {
            if matches!(value, Value::Null) {
                out.push(1);
                return Ok(());
            }
            out.push(0);
        }
        let kind = kind(&column.data_type, self.features);
        match (kind, value) {
            (_, Value::Null) => return Err("NULL in a column that is not nullable".to_owned()),
            (_, Value::Unchanged) => {
                return Err("the source's log did not carry this value (an update left it unchanged)".to_owned())
            }
            (Kind::Integer { bytes, signed }, value) => {
                let number: i128 = match value {
                    Value::Bool(value) => i128::from(*value),
                    Value::Int(value) => i128::from(*value),
                    Value::UInt(value) => i128::from(*value),
                    Value::Bits { value, .. } => i128::from(*value),
                    other => return Err(format!("a {} value is not an integer", described(other))),
                };
                integer(number, bytes, signed, out)?;
            }
            (Kind::Float32, Value::Float32(value)) => out.extend_from_slice(&value.to_le_bytes()),
            (Kind::Float32, Value::Float64(value)) => out.extend_from_slice(&(*value as f32).to_le_bytes()),
            (Kind::Float64, Value::Float64(value)) => out.extend_from_slice(&value.to_le_bytes()),
            (Kind::Float64, Value::Float32(value)) => out.extend_from_slice(&f64::from(*value).to_le_bytes()),
            (Kind::Decimal { bytes, scale }, Value::Decimal(decimal)) => {
                let scaled = scaled(decimal.as_str(), scale)?;
                integer(scaled, bytes, true, out)?;
            }
            (Kind::Date { wide }, Value::Date(date)) => {
                let days = self.days(date)?;
                if wide {
                    out.extend_from_slice(&(days as i32).to_le_bytes());
                } else {
                    out.extend_from_slice(&(days as u16).to_le_bytes());
                }
            }
            (Kind::DateTime, Value::DateTime(time) | Value::Timestamp(time)) => {
                let seconds = self.seconds(time)?;
                out.extend_from_slice(&(seconds as u32).to_le_bytes());
            }
            (Kind::DateTime64 { precision }, Value::DateTime(time) | Value::Timestamp(time)) => {
                let precision = u32::from(precision.min(6));
                let ticks = self.seconds(time)? * 10_i64.pow(precision)
                    + i64::from(time.microsecond) / 10_i64.pow(6 - precision);
                out.extend_from_slice(&ticks.to_le_bytes());
            }
            (Kind::String, value) => string(&text(column, value), out),
            (_, other) => {
                let column_type = base_type(&column.data_type, self.features);
                return Err(format!("a {} value in a column of type {column_type}", described(other)));
            }
        }
        Ok(())
    }

    /// Days since 1970-01-01 of a date the column holds; another is refused, as the server
    /// would store it as another date.
    fn days(&self, date: &Date) -> Result<i64, String> {
        let years = self.features.years();
        if date.month == 0 || date.day == 0 {
            return Err(format!("{date} is not a calendar date"));
        }
        if !years.contains(&date.year) {
            return Err(format!(
                "year {} is outside the years {} to {} this ClickHouse server's dates hold",
                date.year,
                years.start(),
                years.end()
            ));
        }
        Ok(date.days_since_epoch())
    }

    /// Seconds since 1970 (UTC) of a date and time the column holds.
    fn seconds(&self, time: &DateTime) -> Result<i64, String> {
        let days = self.days(&time.date)?;
        Ok(days * 86_400 + i64::from(time.hour) * 3_600 + i64::from(time.minute) * 60 + i64::from(time.second))
    }
}

/// A value as the text a `String` column holds: text and bytes as they are, a date or time as
/// the source shows it (with its column's digits of a second), numbers in decimal.
fn text<'a>(column: &Column, value: &'a Value) -> std::borrow::Cow<'a, [u8]> {
    use std::borrow::Cow;
    match value {
        Value::Text(text) | Value::Json(text) => Cow::Borrowed(text.as_bytes()),
        Value::Bytes(bytes) => Cow::Borrowed(bytes),
        Value::Decimal(decimal) => Cow::Borrowed(decimal.as_str().as_bytes()),
        Value::DateTime(time) | Value::Timestamp(time) => {
            let digits = match column.data_type {
                DataType::DateTime { precision } | DataType::Timestamp { precision } => precision.min(6),
                _ => 6,
            };
            let mut shown = DateTime { microsecond: 0, ..*time }.to_string();
            if digits > 0 {
                let fraction = format!("{:06}", time.microsecond);
                shown.push('.');
                shown.push_str(&fraction[..usize::from(digits)]);
            }
            Cow::Owned(shown.into_bytes())
        }
        other => Cow::Owned(other.to_string().into_bytes()),
    }
}

/// A length as LEB128 and the bytes.
fn string(bytes: &[u8], out: &mut Vec<u8>) {
    let mut length = bytes.len() as u64;
    loop {
        let low = (length & 0x7f) as u8;
        length >>= 7;
        if length == 0 {
            out.push(low);
            break;
        }
        out.push(low | 0x80);
    }
    out.extend_from_slice(bytes);
}

/// An integer in `bytes` bytes, little-endian, refused when it does not fit.
fn integer(number: i128, bytes: u8, signed: bool, out: &mut Vec<u8>) -> Result<(), String> {
    let bits = u32::from(bytes) * 8;
    let (low, high) = if signed {
        (-(1_i128 << (bits - 1)), (1_i128 << (bits - 1)) - 1)
    } else if bits == 128 {
        (0, i128::MAX)
    } else {
        (0, (1_i128 << bits) - 1)
    };
    if number < low || number > high {
        return Err(format!(
            "{number} is outside the range of a {}{bits}-bit integer",
            if signed { "signed " } else { "unsigned " }
        ));
    }
    out.extend_from_slice(&number.to_le_bytes()[..usize::from(bytes)]);
    Ok(())
}

/// A decimal's text as an integer of `scale` digits after the point; more digits than the
/// scale, or more than 38 in all, are refused.
fn scaled(text: &str, scale: u32) -> Result<i128, String> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let fraction = fraction.trim_end_matches('0');
    if fraction.len() > scale as usize {
        return Err(format!("{text} has more digits after the point than the column's {scale}"));
    }
    let mut value: i128 = 0;
    let padded = fraction.bytes().chain(std::iter::repeat_n(b'0', scale as usize - fraction.len()));
    for byte in whole.bytes().chain(padded) {
        value = value
            .checked_mul(10)
            .and_then(|value| value.checked_add(i128::from(byte - b'0')))
            .ok_or_else(|| format!("{text} has more digits than a ClickHouse decimal holds"))?;
    }
    Ok(if negative { -value } else { value })
}

/// What a value is, for a message.
fn described(value: &Value) -> &'static str {
    match value {
        Value::Null => "NULL",
        Value::Bool(_) => "boolean",
        Value::Int(_) | Value::UInt(_) => "integer",
        Value::Float32(_) | Value::Float64(_) => "float",
        Value::Decimal(_) => "decimal",
        Value::Text(_) => "text",
        Value::Bytes(_) => "bytes",
        Value::Bits { .. } => "bit",
        Value::Date(_) => "date",
        Value::Time(_) => "time",
        Value::DateTime(_) | Value::Timestamp(_) => "date-time",
        Value::Json(_) => "JSON",
        Value::Unchanged => "unsent",
    }
}

/// A type's zero in RowBinary: what a tombstone holds in a column it does not key.
fn zero(kind: Kind, out: &mut Vec<u8>) {
    let bytes = match kind {
        Kind::Integer { bytes, .. } | Kind::Decimal { bytes, .. } => usize::from(bytes),
        Kind::Float32 | Kind::DateTime => 4,
        Kind::Float64 | Kind::DateTime64 { .. } => 8,
        Kind::Date { wide: false } => 2,
        Kind::Date { wide: true } => 4,
        // An empty string: its length, 0.
        Kind::String => 1,
    };
    out.extend(std::iter::repeat_n(0, bytes));
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::value::Date;
    use sluice_core::TableName;

    const OLD: Features = Features { wide_dates: false, boolean: false };

    fn table() -> TableSchema {
        TableSchema {
            primary_key: vec![0],
            columns: vec![
                Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
                Column::new("note", DataType::Text { length: None, fixed: false }, true),
                Column::new("born", DataType::Date, true),
                Column::new("seen", DataType::DateTime { precision: 0 }, true),
            ],
            ..TableSchema::named(TableName::new(Some("shop"), "people"))
        }
    }

    #[test]
    fn types_follow_what_the_server_has() {
        let wide = Features { wide_dates: true, boolean: true };
        let column = |data_type, nullable| Column::new("c", data_type, nullable);
        assert_eq!(column_type(&column(DataType::DateTime { precision: 3 }, true), OLD), "Nullable(String)");
        assert_eq!(column_type(&column(DataType::DateTime { precision: 3 }, false), wide), "DateTime64(3, 'UTC')");
        assert_eq!(column_type(&column(DataType::Timestamp { precision: 0 }, false), OLD), "DateTime('UTC')");
        assert_eq!(column_type(&column(DataType::Date, false), wide), "Date32");
        assert_eq!(column_type(&column(DataType::Boolean, false), OLD), "UInt8");
        assert_eq!(column_type(&column(DataType::Integer { bytes: 3, unsigned: true }, false), OLD), "UInt32");
        let wide_decimal = DataType::Decimal { precision: Some(65), scale: Some(30) };
        assert_eq!(column_type(&column(wide_decimal, false), OLD), "String");
        let decimal = DataType::Decimal { precision: Some(12), scale: Some(2) };
        assert_eq!(column_type(&column(decimal, true), OLD), "Nullable(Decimal(12, 2))");
    }

    #[test]
    fn rows_are_row_binary_and_what_a_column_cannot_hold_is_refused() {
        let encoder = Encoder::new(OLD);
        let table = table();
        let date = Date { year: 2024, month: 2, day: 29 };
        let seen = DateTime { date, hour: 1, minute: 2, second: 3, microsecond: 0 };
        let mut out = Vec::new();
        let row = vec![Value::Int(7), Value::Text("ab".into()), Value::Date(date), Value::DateTime(seen)];
        encoder.values(&table, &row, &mut out).unwrap();
        Encoder::end(42, false, &mut out);
        let mut expected = 7_i64.to_le_bytes().to_vec();
        expected.extend([0, 2, b'a', b'b']);
        expected.push(0);
        expected.extend(19_782_u16.to_le_bytes()); // 2024-02-29
        expected.push(0);
        expected.extend(1_709_168_523_u32.to_le_bytes()); // 2024-02-29 01:02:03 UTC
        expected.extend(42_u64.to_le_bytes());
        expected.push(0);
        assert_eq!(out, expected);

        let old = vec![Value::Int(8), Value::Null, Value::Date(Date { year: 1969, month: 12, day: 31 }), Value::Null];
        let reason = encoder.values(&table, &old, &mut out).unwrap_err();
        assert!(reason.starts_with("column born: year 1969 is outside"), "{reason}");
        assert_eq!(out, expected, "a refused row leaves nothing behind");
        let missing = vec![Value::Null, Value::Null, Value::Null, Value::Null];
        assert!(encoder.values(&table, &missing, &mut out).unwrap_err().contains("not nullable"));

        // A tombstone: the key, the zero of a column that is not nullable, NULLs.
        let mut keyed = table.clone();
        keyed.columns[1].nullable = false;
        let mut tombstone = Vec::new();
        encoder.tombstone(&keyed, &vec![Value::Int(9)], &mut tombstone).unwrap();
        let mut expected = 9_i64.to_le_bytes().to_vec();
        expected.extend([0, 1, 1]);
        assert_eq!(tombstone, expected);

        // Text where the server has no DateTime64: any year, the column's digits of a second.
        let mut fraction = table.clone();
        fraction.columns[3].data_type = DataType::DateTime { precision: 3 };
        let early = DateTime { date: Date { year: 1960, month: 1, day: 1 }, microsecond: 123_456, ..seen };
        let mut text = Vec::new();
        encoder
            .values(&fraction, &vec![Value::Int(1), Value::Null, Value::Null, Value::DateTime(early)], &mut text)
            .unwrap();
        assert_eq!(&text[10..], b"\x00\x171960-01-01 01:02:03.123");
    }

    #[test]
    fn decimals_are_scaled_integers_and_integers_must_fit() {
        assert_eq!(scaled("-1.5", 2), Ok(-150));
        assert_eq!(scaled("12345678901234567890.0123456789", 10), Ok(123_456_789_012_345_678_900_123_456_789));
        assert_eq!(scaled("0.10", 1), Ok(1), "trailing zeros are no digits");
        assert!(scaled("0.123", 2).unwrap_err().contains("more digits after the point"));
        let mut out = Vec::new();
        integer(-128, 1, true, &mut out).unwrap();
        integer(65_535, 2, false, &mut out).unwrap();
        assert_eq!(out, [0x80, 0xff, 0xff]);
        assert!(integer(128, 1, true, &mut out).unwrap_err().contains("outside the range of a signed 8-bit"));
        assert!(integer(-1, 8, false, &mut out).is_err());
        let mut long = Vec::new();
        string(&[b'x'; 300], &mut long);
        assert_eq!(&long[..2], [0xac, 0x02], "300 as LEB128");
    }
}
