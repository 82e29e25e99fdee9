//! Values as verification compares them: each value brought to one form per target column
//! type, so that two values are equal exactly when the type mapping says they are.
//!
//! The source row has passed the job's mapping (the values the target was given); the target
//! row is read back from the target by a reader of its own engine, whose decoding may differ
//! in form (a `BIGINT UNSIGNED` read back from a `numeric(20)` as a decimal, a `DECIMAL(10,2)`
//! as `1.5`, a JSON document with its keys in another order). The column's type in the
//! mapped target schema decides what is the same:
//!
//! - numbers are equal when their values are (an integer, a decimal or a float of the column's
//!   own precision: a `FLOAT` column compares as `f32`);
//! - text is compared byte for byte, a trailing space included; only a fixed-width `CHAR`
//!   column ignores the trailing spaces its type pads with;
//! - bytes byte for byte; bit strings, booleans and years as numbers;
//! - dates and times by their fields, to the microsecond; a `Timestamp` is an instant in UTC;
//! - a JSON document by its content: objects as sets of keys, numbers by value.
//!
//! A value that does not read as its column's type keeps its own text, prefixed by its kind,
//! so it equals only the same oddity on the other side.

use crate::schema::DataType;
use crate::value::{Date, DateTime, Decimal, Time, Value};

/// One value in the form verification compares.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Canonical {
    Null,
    Bool(bool),
    Integer(i128),
    /// An exact number without trailing fraction zeros (`1.50` and `1.5` are one value).
    Decimal(String),
    /// The bits of an `f32` or `f64` (negative zero as zero, every NaN as one).
    Float(u64),
    Text(String),
    Bytes(Vec<u8>),
    /// A date, time or date-time by its fields, to the microsecond, packed into one number
    /// (`Moment::pack`).
    Temporal(Moment, i128),
    /// A JSON document written with sorted keys and numbers as exact decimals.
    Json(String),
    /// A value that did not read as its column's type: its kind and text.
    Other(String),
}

impl Canonical {
    /// The value as JSON, for a record of a row replaced: numbers as numbers when they fit,
    /// exact decimals and times as strings, bytes in base64, a JSON document embedded.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        match self {
            Canonical::Null => serde_json::Value::Null,
            Canonical::Bool(value) => serde_json::Value::Bool(*value),
            Canonical::Integer(value) => match i64::try_from(*value) {
                Ok(value) => serde_json::Value::from(value),
                Err(_) => serde_json::Value::String(value.to_string()),
            },
            Canonical::Float(bits) => serde_json::Value::from(f64::from_bits(*bits)),
            Canonical::Decimal(text) | Canonical::Text(text) | Canonical::Other(text) => {
                serde_json::Value::String(text.clone())
            }
            Canonical::Temporal(moment, packed) => serde_json::Value::String(moment.text(*packed)),
            Canonical::Bytes(bytes) => serde_json::Value::String(crate::json::base64_encode(bytes)),
            Canonical::Json(text) => {
                serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.clone()))
            }
        }
    }
}

impl Canonical {
    /// A value of `data_type` with this canonical form, for a key read or deleted by key (a
    /// decimal's scale and a fixed-width text's padding, which the form drops, stay dropped).
    pub(crate) fn to_value(&self, data_type: &DataType) -> Value {
        match (self, data_type) {
            (Canonical::Null, _) => Value::Null,
            (Canonical::Bool(value), _) => Value::Bool(*value),
            (Canonical::Integer(value), DataType::Integer { unsigned: true, .. }) => {
                u64::try_from(*value).map_or_else(|_| Value::Decimal(decimal_of(*value)), Value::UInt)
            }
            (Canonical::Integer(value), DataType::Bits { width }) => {
                Value::Bits { width: *width, value: u64::try_from(*value).unwrap_or_default() }
            }
            (Canonical::Integer(value), _) => {
                i64::try_from(*value).map_or_else(|_| Value::Decimal(decimal_of(*value)), Value::Int)
            }
            (Canonical::Decimal(text), _) => {
                Decimal::parse(text).map_or_else(|| Value::Text(text.clone()), Value::Decimal)
            }
            (Canonical::Float(bits), DataType::Float32) => Value::Float32(f64::from_bits(*bits) as f32),
            (Canonical::Float(bits), _) => Value::Float64(f64::from_bits(*bits)),
            (Canonical::Text(text), _) | (Canonical::Other(text), _) => Value::Text(text.clone()),
            (Canonical::Bytes(bytes), _) => Value::Bytes(bytes.clone()),
            (Canonical::Json(text), _) => Value::Json(text.clone()),
            (Canonical::Temporal(moment, packed), data_type) => {
                let text = moment.text(*packed);
                let parsed = match (moment, data_type) {
                    (Moment::Date, _) => Date::parse(&text).map(Value::Date),
                    (Moment::Time, _) => Time::parse(&text).map(Value::Time),
                    (Moment::DateTime, DataType::Timestamp { .. }) => DateTime::parse(&text).map(Value::Timestamp),
                    (Moment::DateTime, _) => DateTime::parse(&text).map(Value::DateTime),
                };
                parsed.unwrap_or(Value::Text(text))
            }
        }
    }
}

fn decimal_of(value: i128) -> Decimal {
    Decimal::parse(&value.to_string()).expect("an integer is a decimal")
}

/// `value` as verification compares it in a column of type `data_type`. Text and bytes move
/// into the canonical form as they are.
pub(crate) fn canonical(value: Value, data_type: &DataType) -> Canonical {
    match (data_type, value) {
        (_, Value::Null) => Canonical::Null,
        (DataType::Text { fixed, .. }, Value::Text(mut text)) => {
            if *fixed {
                text.truncate(text.trim_end_matches(' ').len());
            }
            Canonical::Text(text)
        }
        (DataType::Enum { .. } | DataType::Set { .. }, Value::Text(text)) => Canonical::Text(text),
        (DataType::Bytes { .. } | DataType::Geometry, Value::Bytes(bytes)) => Canonical::Bytes(bytes),
        (DataType::Bytes { .. } | DataType::Geometry, Value::Text(text)) => Canonical::Bytes(text.into_bytes()),
        (data_type, value) => converted(&value, data_type).unwrap_or_else(|| Canonical::Other(format!("{value:?}"))),
    }
}

/// Any other value in its column's form; `None` when it does not read as the column's type.
fn converted(value: &Value, data_type: &DataType) -> Option<Canonical> {
    match data_type {
        DataType::Boolean => boolean(value).map(Canonical::Bool),
        DataType::Integer { .. } | DataType::Year => integer(value).map(Canonical::Integer),
        DataType::Bits { .. } => bits(value).map(Canonical::Integer),
        DataType::Float32 => number(value).map(|number| Canonical::Float(float_bits(f64::from(number as f32)))),
        DataType::Float64 => number(value).map(|number| Canonical::Float(float_bits(number))),
        DataType::Decimal { .. } => decimal(value).map(Canonical::Decimal),
        DataType::Text { fixed, .. } => text(value)
            .map(|text| Canonical::Text(if *fixed { text.trim_end_matches(' ').to_owned() } else { text.to_owned() })),
        DataType::Enum { .. } | DataType::Set { .. } => text(value).map(|text| Canonical::Text(text.to_owned())),
        DataType::Bytes { .. } | DataType::Geometry => None,
        DataType::Date => date(value).map(|date| Canonical::Temporal(Moment::Date, Moment::pack_date(&date))),
        DataType::Time { .. } => time(value).map(|time| Canonical::Temporal(Moment::Time, time.signed_microseconds())),
        DataType::DateTime { .. } | DataType::Timestamp { .. } => {
            date_time(value).map(|moment| Canonical::Temporal(Moment::DateTime, Moment::pack_date_time(&moment)))
        }
        DataType::Json => match value {
            Value::Json(text) | Value::Text(text) => Some(Canonical::Json(json(text))),
            _ => None,
        },
    }
}

/// What a packed temporal value is, to write it back as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Moment {
    Date,
    Time,
    DateTime,
}

/// Microseconds in a second, seconds in a minute and minutes in an hour, as packing factors.
const MICROS: i128 = 1_000_000;

impl Moment {
    /// `YYYYMMDD`: the fields of a date, zero ones included (MySQL's `0000-00-00`).
    fn pack_date(date: &Date) -> i128 {
        (i128::from(date.year) * 100 + i128::from(date.month)) * 100 + i128::from(date.day)
    }

    /// The date's fields, then the clock's, then the microseconds.
    fn pack_date_time(moment: &DateTime) -> i128 {
        let clock = (i128::from(moment.hour) * 100 + i128::from(moment.minute)) * 100 + i128::from(moment.second);
        (Moment::pack_date(&moment.date) * 1_000_000 + clock) * MICROS + i128::from(moment.microsecond)
    }

    /// The packed value as its usual text.
    fn text(self, packed: i128) -> String {
        let date = |packed: i128| format!("{:04}-{:02}-{:02}", packed / 10_000, packed / 100 % 100, packed % 100);
        let fraction = |micros: i128| if micros == 0 { String::new() } else { format!(".{micros:06}") };
        match self {
            Moment::Date => date(packed),
            Moment::Time => {
                let magnitude = packed.abs();
                let seconds = magnitude / MICROS;
                format!(
                    "{}{:02}:{:02}:{:02}{}",
                    if packed < 0 { "-" } else { "" },
                    seconds / 3600,
                    seconds / 60 % 60,
                    seconds % 60,
                    fraction(magnitude % MICROS)
                )
            }
            Moment::DateTime => {
                let (fields, micros) = (packed / MICROS, packed % MICROS);
                let (day, clock) = (fields / 1_000_000, fields % 1_000_000);
                format!(
                    "{} {:02}:{:02}:{:02}{}",
                    date(day),
                    clock / 10_000,
                    clock / 100 % 100,
                    clock % 100,
                    fraction(micros)
                )
            }
        }
    }
}

fn boolean(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(value) => Some(*value),
        Value::Text(text) => match text.as_str() {
            "t" | "true" | "TRUE" | "1" => Some(true),
            "f" | "false" | "FALSE" | "0" => Some(false),
            _ => None,
        },
        other => integer(other).map(|number| number != 0),
    }
}

fn integer(value: &Value) -> Option<i128> {
    match value {
        Value::Bool(value) => Some(i128::from(*value)),
        Value::Int(value) => Some(i128::from(*value)),
        Value::UInt(value) => Some(i128::from(*value)),
        Value::Bits { value, .. } => Some(i128::from(*value)),
        Value::Decimal(decimal) => exact_integer(decimal.as_str()),
        Value::Text(text) => exact_integer(text.trim()),
        Value::Float64(value) if value.fract() == 0.0 && value.abs() < 1e38 => Some(*value as i128),
        Value::Float32(value) if value.fract() == 0.0 && value.abs() < 1e38 => Some(*value as i128),
        _ => None,
    }
}

/// An integer written as a decimal without a fraction (`12`, `12.00`).
fn exact_integer(text: &str) -> Option<i128> {
    let normalized = normalized_decimal(text)?;
    normalized.parse().ok()
}

fn bits(value: &Value) -> Option<i128> {
    match value {
        Value::Bytes(bytes) if bytes.len() <= 8 => {
            Some(bytes.iter().fold(0i128, |number, byte| (number << 8) | i128::from(*byte)))
        }
        Value::Text(text) if !text.is_empty() && text.bytes().all(|byte| byte == b'0' || byte == b'1') => {
            u64::from_str_radix(text, 2).ok().map(i128::from)
        }
        other => integer(other),
    }
}

fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Float32(value) => Some(f64::from(*value)),
        Value::Float64(value) => Some(*value),
        Value::Int(value) => Some(*value as f64),
        Value::UInt(value) => Some(*value as f64),
        Value::Decimal(decimal) => decimal.as_str().parse().ok(),
        Value::Text(text) => text.trim().parse().ok(),
        _ => None,
    }
}

fn float_bits(number: f64) -> u64 {
    if number == 0.0 {
        0
    } else if number.is_nan() {
        f64::NAN.to_bits()
    } else {
        number.to_bits()
    }
}

fn decimal(value: &Value) -> Option<String> {
    match value {
        // Already canonical but for its scale.
        Value::Decimal(decimal) => Some(without_trailing_zeros(decimal.as_str())),
        Value::Int(value) => Some(value.to_string()),
        Value::UInt(value) => Some(value.to_string()),
        Value::Text(text) => normalized_decimal(text),
        Value::Float64(value) if value.is_finite() => normalized_decimal(&value.to_string()),
        Value::Float32(value) if value.is_finite() => normalized_decimal(&value.to_string()),
        _ => None,
    }
}

/// A decimal literal without trailing fraction zeros, a point without digits after it, or a
/// sign on zero.
fn normalized_decimal(text: &str) -> Option<String> {
    Decimal::parse(text).map(|parsed| without_trailing_zeros(parsed.as_str()))
}

/// A canonical decimal (`Decimal::parse`'s form) without its scale: `1.50` → `1.5`, `-0.0` → `0`.
fn without_trailing_zeros(text: &str) -> String {
    let text = match text.split_once('.') {
        Some((integer, fraction)) => match fraction.trim_end_matches('0') {
            "" => integer,
            _ => text.trim_end_matches('0'),
        },
        None => text,
    };
    if text == "-0" {
        "0".to_owned()
    } else {
        text.to_owned()
    }
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::Text(text) | Value::Json(text) => Some(text),
        Value::Bytes(bytes) => std::str::from_utf8(bytes).ok(),
        _ => None,
    }
}

fn date(value: &Value) -> Option<Date> {
    match value {
        Value::Date(date) => Some(*date),
        Value::DateTime(moment) | Value::Timestamp(moment)
            if moment.hour == 0 && moment.minute == 0 && moment.second == 0 && moment.microsecond == 0 =>
        {
            Some(moment.date)
        }
        Value::Text(text) => Date::parse(text.trim()),
        _ => None,
    }
}

fn time(value: &Value) -> Option<Time> {
    match value {
        Value::Time(time) => Some(*time),
        Value::Text(text) => Time::parse(text.trim()),
        _ => None,
    }
}

fn date_time(value: &Value) -> Option<DateTime> {
    match value {
        Value::DateTime(moment) | Value::Timestamp(moment) => Some(*moment),
        Value::Date(date) => Some(DateTime { date: *date, hour: 0, minute: 0, second: 0, microsecond: 0 }),
        Value::Text(text) => {
            let text = text.trim();
            DateTime::parse(text.strip_suffix("+00:00").or_else(|| text.strip_suffix("+00")).unwrap_or(text))
        }
        _ => None,
    }
}

/// A JSON document with its object keys sorted and its numbers as normalized decimals; text
/// that does not parse stays as it is.
fn json(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(document) => {
            let mut written = String::with_capacity(text.len());
            write_json(&document, &mut written);
            written
        }
        Err(_) => format!("(not JSON) {text}"),
    }
}

fn write_json(document: &serde_json::Value, written: &mut String) {
    match document {
        serde_json::Value::Object(members) => {
            let mut sorted: Vec<(&String, &serde_json::Value)> = members.iter().collect();
            sorted.sort_by(|one, other| one.0.cmp(other.0));
            written.push('{');
            for (index, (key, member)) in sorted.into_iter().enumerate() {
                if index > 0 {
                    written.push(',');
                }
                written.push_str(&serde_json::Value::from(key.as_str()).to_string());
                written.push(':');
                write_json(member, written);
            }
            written.push('}');
        }
        serde_json::Value::Array(items) => {
            written.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    written.push(',');
                }
                write_json(item, written);
            }
            written.push(']');
        }
        serde_json::Value::Number(number) => {
            let text = number.to_string();
            written.push_str(&normalized_decimal(&text).unwrap_or(text));
        }
        other => written.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(one: Value, other: Value, data_type: DataType) -> bool {
        canonical(one, &data_type) == canonical(other, &data_type)
    }

    fn decimal_value(text: &str) -> Value {
        Value::Decimal(Decimal::parse(text).unwrap())
    }

    #[test]
    fn numbers_are_equal_by_value_whatever_form_they_are_read_in() {
        let big = DataType::Integer { bytes: 8, unsigned: true };
        assert!(same(Value::UInt(u64::MAX), decimal_value("18446744073709551615"), big.clone()));
        assert!(!same(Value::UInt(7), Value::Int(8), big));
        let money = DataType::Decimal { precision: Some(10), scale: Some(2) };
        assert!(same(decimal_value("1.50"), decimal_value("1.5"), money.clone()));
        assert!(same(decimal_value("-0.00"), Value::Int(0), money.clone()));
        assert!(!same(decimal_value("1.50"), decimal_value("1.51"), money));
        assert!(same(Value::Float32(0.1), Value::Text("0.1".into()), DataType::Float32));
        assert!(!same(Value::Float64(0.1), Value::Float64(0.1000001), DataType::Float64));
        assert!(same(Value::Int(1), Value::Bool(true), DataType::Boolean));
        assert!(same(
            Value::Bits { width: 12, value: 5 },
            Value::Text("000000000101".into()),
            DataType::Bits { width: 12 }
        ));
    }

    #[test]
    fn text_is_compared_byte_for_byte_except_the_padding_of_a_fixed_width_column() {
        let varchar = DataType::Text { length: Some(20), fixed: false };
        assert!(!same(Value::Text("abc".into()), Value::Text("abc ".into()), varchar.clone()));
        assert!(!same(Value::Text(String::new()), Value::Null, varchar.clone()));
        assert!(!same(Value::Text("Abc".into()), Value::Text("abc".into()), varchar));
        let char_column = DataType::Text { length: Some(5), fixed: true };
        assert!(same(Value::Text("abc".into()), Value::Text("abc  ".into()), char_column));
    }

    #[test]
    fn times_are_equal_to_the_microsecond_whatever_text_form_they_are_read_in() {
        let moment = DateTime::parse("2024-02-29 13:14:15.000001").unwrap();
        let precise = DataType::DateTime { precision: 6 };
        assert!(same(Value::DateTime(moment), Value::Text("2024-02-29T13:14:15.000001".into()), precise.clone()));
        let later = DateTime::parse("2024-02-29 13:14:15.000002").unwrap();
        assert!(!same(Value::DateTime(moment), Value::DateTime(later), precise));
        let instant = DataType::Timestamp { precision: 0 };
        assert!(same(Value::Timestamp(moment), Value::Text("2024-02-29 13:14:15.000001+00".into()), instant));
        assert!(same(Value::Date(moment.date), Value::Text("2024-02-29".into()), DataType::Date));
        let negative = Value::Time(Time::parse("-838:59:59.5").unwrap());
        assert!(same(negative.clone(), Value::Text("-838:59:59.500000".into()), DataType::Time { precision: 6 }));
        assert!(!same(negative.clone(), Value::Text("838:59:59.5".into()), DataType::Time { precision: 6 }));
        // Written back as text for a repair's record.
        for (value, data_type, text) in [
            (Value::DateTime(moment), precise_type(), "2024-02-29 13:14:15.000001"),
            (negative, DataType::Time { precision: 6 }, "-838:59:59.500000"),
            (Value::Date(Date::parse("0000-00-00").unwrap()), DataType::Date, "0000-00-00"),
        ] {
            assert_eq!(canonical(value, &data_type).to_json(), serde_json::json!(text));
        }
    }

    fn precise_type() -> DataType {
        DataType::DateTime { precision: 6 }
    }

    #[test]
    fn json_documents_are_equal_by_content_not_by_key_order_or_spacing() {
        let one = Value::Json(r#"{"b": [1, 2.50], "a": {"y": true, "x": null}}"#.into());
        let reordered = Value::Json(r#"{"a":{"x":null,"y":true},"b":[1,2.5]}"#.into());
        assert!(same(one.clone(), reordered, DataType::Json));
        let changed = Value::Json(r#"{"a":{"x":null,"y":false},"b":[1,2.5]}"#.into());
        assert!(!same(one, changed, DataType::Json));
        let swapped = Value::Json("[2.5,1]".into());
        assert!(!same(Value::Json("[1,2.5]".into()), swapped, DataType::Json));
    }
}
