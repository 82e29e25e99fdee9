//! The ClickHouse type of each logical type, by what the server has, and values as TabSeparated.
//!
//! A server older than 21.9 has no `Date32` and no `DateTime64`: its `Date` holds 1970-01-01 to
//! 2105-12-31 and its `DateTime` whole seconds from 1970 to 2105, and it stores a value outside
//! those as another date without a word. So dates and times outside the range a column holds are
//! refused here, row by row, naming the column; times with a fraction of a second are text on such
//! a server. Every other type has a ClickHouse type that holds each value exactly; what has none
//! (MySQL `TIME`, JSON, sets, geometry, decimals of more than 38 digits) is text or bytes in a
//! `String`. docs/types.md lists them.

use sluice_core::change::Row;
use sluice_core::{Column, DataType, DateTime, TableSchema, Value};

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

/// Writes rows as TabSeparated lines for their columns (and the Sluice columns after them).
#[derive(Debug)]
pub struct Encoder {
    features: Features,
}

impl Encoder {
    pub fn new(features: Features) -> Encoder {
        Encoder { features }
    }

    /// Appends `row`'s values, each followed by a tab. A value its column cannot hold leaves
    /// `out` as it was and is the reason, naming the column.
    pub fn values(&self, table: &TableSchema, row: &Row, out: &mut Vec<u8>) -> Result<(), String> {
        self.fields(row.iter().zip(&table.columns), out)
    }

    /// Appends a tombstone's values, each followed by a tab: the key's values (given in key
    /// order) in the key columns, and in the others NULL or, where the column is not nullable,
    /// the type's zero, so a row and a tombstone go in one INSERT.
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
                None if column.nullable => out.extend_from_slice(b"\\N"),
                None => out.extend_from_slice(zero(&base_type(&column.data_type, self.features)).as_bytes()),
            }
            out.push(b'\t');
        }
        Ok(())
    }

    fn fields<'a>(
        &self,
        fields: impl Iterator<Item = (&'a Value, &'a Column)>,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let start = out.len();
        for (value, column) in fields {
            if let Err(reason) = self.value(column, value, out) {
                out.truncate(start);
                return Err(format!("column {}: {reason}", column.name));
            }
            out.push(b'\t');
        }
        Ok(())
    }

    /// Ends a line with the Sluice columns: the version, and whether the key is deleted.
    pub fn end(version: u64, deleted: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(itoa::Buffer::new().format(version).as_bytes());
        out.extend_from_slice(if deleted { b"\t1\n" } else { b"\t0\n" });
    }

    fn value(&self, column: &Column, value: &Value, out: &mut Vec<u8>) -> Result<(), String> {
        match value {
            Value::Null if column.nullable => out.extend_from_slice(b"\\N"),
            Value::Null => return Err("NULL in a column that is not nullable".to_owned()),
            Value::Bool(value) => out.push(if *value { b'1' } else { b'0' }),
            Value::Int(value) => out.extend_from_slice(itoa::Buffer::new().format(*value).as_bytes()),
            Value::UInt(value) => out.extend_from_slice(itoa::Buffer::new().format(*value).as_bytes()),
            Value::Bits { value, .. } => out.extend_from_slice(itoa::Buffer::new().format(*value).as_bytes()),
            Value::Float32(value) => float(f64::from(*value), &value.to_string(), out),
            Value::Float64(value) => float(*value, &value.to_string(), out),
            Value::Decimal(decimal) => out.extend_from_slice(decimal.as_str().as_bytes()),
            Value::Text(text) | Value::Json(text) => escape(text.as_bytes(), out),
            Value::Bytes(bytes) => escape(bytes, out),
            Value::Date(date) => {
                if self.calendar(&column.data_type) {
                    self.in_range(date.year, date.month, date.day)?;
                }
                escape(date.to_string().as_bytes(), out)
            }
            Value::DateTime(time) | Value::Timestamp(time) => {
                if self.calendar(&column.data_type) {
                    self.in_range(time.date.year, time.date.month, time.date.day)?;
                    escape(time.to_string().as_bytes(), out)
                } else {
                    // Text, as the source shows it: the column's digits of a second.
                    let digits = match column.data_type {
                        DataType::DateTime { precision } | DataType::Timestamp { precision } => precision.min(6),
                        _ => 6,
                    };
                    let whole = DateTime { microsecond: 0, ..*time }.to_string();
                    out.extend_from_slice(whole.as_bytes());
                    if digits > 0 {
                        let fraction = format!("{:06}", time.microsecond);
                        out.push(b'.');
                        out.extend_from_slice(&fraction.as_bytes()[..usize::from(digits)]);
                    }
                }
            }
            Value::Time(time) => escape(time.to_string().as_bytes(), out),
            Value::Unchanged => {
                return Err("the source's log did not carry this value (an update left it unchanged)".to_owned())
            }
        }
        Ok(())
    }

    /// Whether the column's ClickHouse type is a date or time type (else text, which holds any).
    fn calendar(&self, data_type: &DataType) -> bool {
        match data_type {
            DataType::Date => true,
            DataType::DateTime { precision } | DataType::Timestamp { precision } => {
                self.features.wide_dates || *precision == 0
            }
            _ => false,
        }
    }

    /// Refuses a date the server would store as another one.
    fn in_range(&self, year: u16, month: u8, day: u8) -> Result<(), String> {
        let years = self.features.years();
        if month == 0 || day == 0 {
            return Err(format!("{year:04}-{month:02}-{day:02} is not a calendar date"));
        }
        if !years.contains(&year) {
            return Err(format!(
                "year {year} is outside the years {} to {} this ClickHouse server's dates hold",
                years.start(),
                years.end()
            ));
        }
        Ok(())
    }
}

/// The text of a ClickHouse type's zero, what a tombstone holds in a column it does not key.
fn zero(clickhouse_type: &str) -> &'static str {
    if clickhouse_type == "String" {
        ""
    } else if clickhouse_type.starts_with("DateTime") {
        "1970-01-01 00:00:00"
    } else if clickhouse_type.starts_with("Date") {
        "1970-01-01"
    } else {
        "0"
    }
}

/// A float as ClickHouse reads it: `inf`, `-inf` and `nan` by those names.
fn float(value: f64, shown: &str, out: &mut Vec<u8>) {
    if value.is_nan() {
        out.extend_from_slice(b"nan");
    } else if value.is_infinite() {
        out.extend_from_slice(if value > 0.0 { b"inf" } else { b"-inf" });
    } else {
        out.extend_from_slice(shown.as_bytes());
    }
}

/// Bytes as a TabSeparated field: backslash, tab and newline escaped, every other byte as it is.
pub fn escape(bytes: &[u8], out: &mut Vec<u8>) {
    for &byte in bytes {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            other => out.push(other),
        }
    }
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
    fn rows_are_escaped_and_dates_out_of_range_refused() {
        let encoder = Encoder::new(OLD);
        let table = table();
        let date = Date { year: 2024, month: 2, day: 29 };
        let seen = DateTime { date, hour: 1, minute: 2, second: 3, microsecond: 0 };
        let mut out = Vec::new();
        let row = vec![Value::Int(7), Value::Text("a\tb\\c\nd".into()), Value::Date(date), Value::DateTime(seen)];
        encoder.values(&table, &row, &mut out).unwrap();
        Encoder::end(42, false, &mut out);
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            "7\ta\\tb\\\\c\\nd\t2024-02-29\t2024-02-29 01:02:03\t42\t0\n"
        );
        let old = vec![Value::Int(8), Value::Null, Value::Date(Date { year: 1969, month: 12, day: 31 }), Value::Null];
        let reason = encoder.values(&table, &old, &mut out).unwrap_err();
        assert!(reason.starts_with("column born: year 1969 is outside"), "{reason}");
        assert!(out.ends_with(b"\t0\n"), "a refused row leaves nothing behind");
        let mut keyed = table.clone();
        keyed.columns[1].nullable = false;
        let mut tombstone = Vec::new();
        encoder.tombstone(&keyed, &vec![Value::Int(9)], &mut tombstone).unwrap();
        Encoder::end(43, true, &mut tombstone);
        assert_eq!(String::from_utf8(tombstone).unwrap(), "9\t\t\\N\t\\N\t43\t1\n", "key, zeros and NULLs");
        let mut fraction = table.clone();
        fraction.columns[3].data_type = DataType::DateTime { precision: 3 };
        let mut text = Vec::new();
        let precise = DateTime { microsecond: 123_456, ..seen };
        let early = DateTime { date: Date { year: 1960, month: 1, day: 1 }, ..seen };
        encoder
            .values(&fraction, &vec![Value::Int(1), Value::Null, Value::Null, Value::DateTime(precise)], &mut text)
            .unwrap();
        encoder
            .values(&fraction, &vec![Value::Int(2), Value::Null, Value::Null, Value::DateTime(early)], &mut text)
            .unwrap();
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "1\t\\N\t\\N\t2024-02-29 01:02:03.123\t2\t\\N\t\\N\t1960-01-01 01:02:03.000\t",
            "text on a server without DateTime64, any year, the column's digits"
        );
        let missing = vec![Value::Null, Value::Null, Value::Null, Value::Null];
        assert!(encoder.values(&table, &missing, &mut out).unwrap_err().contains("not nullable"));
    }
}
