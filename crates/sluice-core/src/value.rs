//! Typed values that carry every MySQL, PostgreSQL and SQLite value without loss.
//!
//! Decimals are kept as validated decimal strings (never through `f64`); unsigned 64-bit integers
//! have their own variant; dates and times are plain calendar fields with microseconds, so MySQL
//! zero dates and out-of-range `TIME` values survive; text and bytes are distinct; `NULL` is
//! distinct from the empty string.

use std::fmt;

use crate::schema::DataType;

/// One column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// Any signed integer up to 64 bits.
    Int(i64),
    /// An unsigned integer that may exceed `i64::MAX` (MySQL `BIGINT UNSIGNED`).
    UInt(u64),
    /// A single-precision float, kept as such so `0.1` does not print as `0.100000001490116`.
    Float32(f32),
    Float64(f64),
    Decimal(Decimal),
    Text(String),
    Bytes(Vec<u8>),
    /// A bit string of `width` bits (MySQL `BIT(n)`), right-aligned in `value`.
    Bits {
        width: u8,
        value: u64,
    },
    Date(Date),
    /// A signed duration of the day clock (MySQL `TIME`: -838:59:59 to 838:59:59).
    Time(Time),
    /// A wall-clock date and time with no zone (MySQL `DATETIME`, PostgreSQL `timestamp`).
    DateTime(DateTime),
    /// An instant in UTC (MySQL `TIMESTAMP`, PostgreSQL `timestamptz`).
    Timestamp(DateTime),
    /// A JSON document, kept as the source's text so big numbers and key order survive.
    Json(String),
    /// A column an update left as it was, whose value the source's log does not carry
    /// (PostgreSQL's unchanged out-of-line values under `REPLICA IDENTITY DEFAULT`). Only in the
    /// after-image of an update: the fold of a group fills it from an earlier image of the key,
    /// else the target keeps its own value (`FoldedChangeWriter::update`).
    Unchanged,
}

impl Value {
    /// Approximate in-memory payload size in bytes, used for byte counters and byte limits.
    pub fn approximate_size(&self) -> usize {
        match self {
            Value::Null | Value::Unchanged => 1,
            Value::Bool(_) => 1,
            Value::Int(_) | Value::UInt(_) | Value::Float64(_) | Value::Bits { .. } => 8,
            Value::Float32(_) => 4,
            Value::Decimal(decimal) => decimal.as_str().len(),
            Value::Text(text) | Value::Json(text) => text.len(),
            Value::Bytes(bytes) => bytes.len(),
            Value::Date(_) => 4,
            Value::Time(_) | Value::DateTime(_) | Value::Timestamp(_) => 8,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

/// Renders a value the way a human reads it in an error message or a key: text as is, bytes as
/// hex, temporal values in ISO form.
impl fmt::Display for Value {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Null => formatter.write_str("NULL"),
            Value::Unchanged => formatter.write_str("(unchanged)"),
            Value::Bool(value) => write!(formatter, "{value}"),
            Value::Int(value) => write!(formatter, "{value}"),
            Value::UInt(value) => write!(formatter, "{value}"),
            Value::Float32(value) => write!(formatter, "{value}"),
            Value::Float64(value) => write!(formatter, "{value}"),
            Value::Decimal(value) => formatter.write_str(value.as_str()),
            Value::Text(value) | Value::Json(value) => formatter.write_str(value),
            Value::Bytes(bytes) => {
                formatter.write_str("0x")?;
                for byte in bytes {
                    write!(formatter, "{byte:02x}")?;
                }
                Ok(())
            }
            Value::Bits { width, value } => {
                write!(formatter, "b'{value:0width$b}'", width = *width as usize)
            }
            Value::Date(value) => write!(formatter, "{value}"),
            Value::Time(value) => write!(formatter, "{value}"),
            Value::DateTime(value) => write!(formatter, "{value}"),
            Value::Timestamp(value) => write!(formatter, "{value}Z"),
        }
    }
}

/// Reads a value of `data_type` from its text form (the form `Display` writes), as files carry
/// it. Bytes are not handled here: their text form depends on the file format.
pub(crate) fn parse_text(text: &str, data_type: &DataType) -> Result<Value, String> {
    let invalid = |expected: &str| {
        let shown: String = text.chars().take(64).collect();
        Err(format!("expected {expected}, found '{shown}'"))
    };
    Ok(match data_type {
        DataType::Boolean => match text {
            "true" | "TRUE" | "True" | "1" | "t" => Value::Bool(true),
            "false" | "FALSE" | "False" | "0" | "f" => Value::Bool(false),
            _ => return invalid("a boolean"),
        },
        DataType::Integer { unsigned: true, .. } => match text.parse() {
            Ok(value) => Value::UInt(value),
            Err(_) => return invalid("an unsigned integer"),
        },
        DataType::Integer { .. } | DataType::Year => match text.parse() {
            Ok(value) => Value::Int(value),
            Err(_) => return invalid("an integer"),
        },
        DataType::Float32 => match text.parse() {
            Ok(value) => Value::Float32(value),
            Err(_) => return invalid("a number"),
        },
        DataType::Float64 => match text.parse() {
            Ok(value) => Value::Float64(value),
            Err(_) => return invalid("a number"),
        },
        DataType::Decimal { .. } => match Decimal::parse(text) {
            Some(value) => Value::Decimal(value),
            None => return invalid("a decimal number"),
        },
        DataType::Bits { width } => match text.strip_prefix("b'").and_then(|bits| bits.strip_suffix('\'')) {
            Some(bits) => match u64::from_str_radix(bits, 2) {
                Ok(value) => Value::Bits { width: *width, value },
                Err(_) => return invalid("a bit string b'0101'"),
            },
            None => return invalid("a bit string b'0101'"),
        },
        DataType::Date => match Date::parse(text) {
            Some(value) => Value::Date(value),
            None => return invalid("a date YYYY-MM-DD"),
        },
        DataType::Time { .. } => match Time::parse(text) {
            Some(value) => Value::Time(value),
            None => return invalid("a time HH:MM:SS[.ffffff]"),
        },
        DataType::DateTime { .. } => match DateTime::parse(text) {
            Some(value) => Value::DateTime(value),
            None => return invalid("a date-time YYYY-MM-DD HH:MM:SS[.ffffff]"),
        },
        DataType::Timestamp { .. } => match DateTime::parse(text.strip_suffix("+00:00").unwrap_or(text)) {
            Some(value) => Value::Timestamp(value),
            None => return invalid("a UTC timestamp YYYY-MM-DD HH:MM:SS[.ffffff]Z"),
        },
        DataType::Json => Value::Json(text.to_owned()),
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } => Value::Text(text.to_owned()),
        DataType::Bytes { .. } | DataType::Geometry => return Err("bytes have no plain text form".to_owned()),
    })
}

/// An exact decimal number kept as its canonical text: optional `-`, digits, optional `.` and
/// digits. No exponent, no leading `+`, no float conversion anywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Decimal(String);

impl Decimal {
    /// Parses a decimal literal, accepting an exponent (`1.5E+3`) and normalising it away.
    pub fn parse(text: &str) -> Option<Decimal> {
        if is_canonical_decimal(text) {
            return Some(Decimal(text.to_owned()));
        }
        let text = text.trim();
        let (negative, unsigned) = match text.as_bytes().first()? {
            b'-' => (true, &text[1..]),
            b'+' => (false, &text[1..]),
            _ => (false, text),
        };
        let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
            Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i32>().ok()?),
            None => (unsigned, 0),
        };
        let (integer, fraction) = match mantissa.split_once('.') {
            Some((integer, fraction)) => (integer, fraction),
            None => (mantissa, ""),
        };
        if integer.is_empty() && fraction.is_empty()
            || !integer.bytes().all(|byte| byte.is_ascii_digit())
            || !fraction.bytes().all(|byte| byte.is_ascii_digit())
        {
            return None;
        }
        let mut digits: String = format!("{integer}{fraction}");
        // The decimal point sits `point` digits from the left of `digits`.
        let mut point = integer.len() as i64 + i64::from(exponent);
        if point < 0 {
            digits.insert_str(0, &"0".repeat((-point) as usize));
            point = 0;
        }
        let point = point as usize;
        if point > digits.len() {
            digits.push_str(&"0".repeat(point - digits.len()));
        }
        let (integer, fraction) = digits.split_at(point);
        let integer = integer.trim_start_matches('0');
        let integer = if integer.is_empty() { "0" } else { integer };
        // Trailing fraction zeros carry the scale (DECIMAL(10,2) prints 1.50); keep them unless
        // an exponent moved the point, in which case the scale is the literal's own.
        let mut canonical = String::with_capacity(digits.len() + 2);
        let is_zero = integer == "0" && fraction.bytes().all(|byte| byte == b'0');
        if negative && !is_zero {
            canonical.push('-');
        }
        canonical.push_str(integer);
        if !fraction.is_empty() {
            canonical.push('.');
            canonical.push_str(fraction);
        }
        Some(Decimal(canonical))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same number with at least `scale` digits after the point (`1.5` → `1.50`).
    pub fn with_minimum_scale(self, scale: usize) -> Decimal {
        let current = self.scale();
        if current >= scale {
            return self;
        }
        let mut text = self.0;
        if current == 0 {
            text.push('.');
        }
        text.push_str(&"0".repeat(scale - current));
        Decimal(text)
    }

    /// Number of digits after the point.
    pub fn scale(&self) -> usize {
        self.0.split_once('.').map_or(0, |(_, fraction)| fraction.len())
    }
}

/// Whether `text` is already a decimal's canonical form, as servers print them: an optional
/// `-` (not on zero), digits without a leading zero (but a lone one), and an optional point
/// followed by digits.
fn is_canonical_decimal(text: &str) -> bool {
    let bytes = text.as_bytes();
    let unsigned = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let integer_end = unsigned.iter().position(|byte| !byte.is_ascii_digit()).unwrap_or(unsigned.len());
    let (integer, rest) = unsigned.split_at(integer_end);
    let fraction = match rest {
        [] => &[][..],
        [b'.', fraction @ ..] if !fraction.is_empty() && fraction.iter().all(u8::is_ascii_digit) => fraction,
        _ => return false,
    };
    let integer_ok = matches!(integer, [b'0'] | [b'1'..=b'9', ..]);
    let negative_zero = unsigned.len() < bytes.len() && integer == b"0" && fraction.iter().all(|&digit| digit == b'0');
    integer_ok && !negative_zero
}

impl fmt::Display for Decimal {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

/// A calendar date. Zero parts are allowed because MySQL stores `0000-00-00` and `2020-00-15`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date {
    pub year: u16,
    pub month: u8,
    pub day: u8,
}

impl Date {
    /// Parses `YYYY-MM-DD`; zero months and days are accepted (MySQL zero dates).
    pub fn parse(text: &str) -> Option<Date> {
        let bytes = text.as_bytes();
        if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
            return None;
        }
        let date = Date {
            year: parse_digits(&text[0..4])? as u16,
            month: parse_digits(&text[5..7])? as u8,
            day: parse_digits(&text[8..10])? as u8,
        };
        (date.month <= 12 && date.day <= 31).then_some(date)
    }

    /// True for dates with a zero year, month or day, which only MySQL accepts.
    pub fn is_zero_or_partial(&self) -> bool {
        self.year == 0 || self.month == 0 || self.day == 0
    }

    /// Days from 1970-01-01 to this (valid) date, negative before it (Howard Hinnant's
    /// `days_from_civil`, proleptic Gregorian).
    pub fn days_since_epoch(&self) -> i64 {
        let (year, month, day) = (i64::from(self.year), i64::from(self.month), i64::from(self.day));
        let year = if month <= 2 { year - 1 } else { year };
        let era = year.div_euclid(400);
        let year_of_era = year - era * 400;
        let month_index = (month + 9) % 12;
        let day_of_year = (153 * month_index + 2) / 5 + day - 1;
        let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
        era * 146_097 + day_of_era - 719_468
    }

    /// The date `days` after 1970-01-01 (`civil_from_days`); the inverse of `days_since_epoch`
    /// for years 0 to 9999.
    pub fn from_days_since_epoch(days: i64) -> Date {
        let shifted = days + 719_468;
        let era = shifted.div_euclid(146_097);
        let day_of_era = shifted.rem_euclid(146_097);
        let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let month_index = (5 * day_of_year + 2) / 153;
        let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u8;
        let month = if month_index < 10 { month_index + 3 } else { month_index - 9 } as u8;
        let year = (year_of_era + era * 400 + i64::from(month <= 2)) as u16;
        Date { year, month, day }
    }
}

impl fmt::Display for Date {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// A time of day or a signed duration up to MySQL's ±838:59:59.999999.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time {
    pub negative: bool,
    pub hours: u32,
    pub minutes: u8,
    pub seconds: u8,
    pub microseconds: u32,
}

impl Time {
    /// The time as a signed count of microseconds (hours past a day stay hours): the order of
    /// times, and one number per time.
    pub fn signed_microseconds(&self) -> i128 {
        let magnitude = ((i128::from(self.hours) * 60 + i128::from(self.minutes)) * 60 + i128::from(self.seconds))
            * 1_000_000
            + i128::from(self.microseconds);
        if self.negative {
            -magnitude
        } else {
            magnitude
        }
    }

    /// Parses `[-]H+:MM:SS[.ffffff]`.
    pub fn parse(text: &str) -> Option<Time> {
        let (negative, text) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let mut parts = text.splitn(3, ':');
        let hours = parse_digits(parts.next()?)?;
        let minutes = parse_digits(parts.next()?)? as u8;
        let (seconds, microseconds) = parse_seconds(parts.next()?)?;
        (minutes < 60 && seconds < 60).then_some(Time { negative, hours, minutes, seconds, microseconds })
    }
}

impl fmt::Display for Time {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.negative {
            formatter.write_str("-")?;
        }
        write!(formatter, "{:02}:{:02}:{:02}", self.hours, self.minutes, self.seconds)?;
        write_microseconds(formatter, self.microseconds)
    }
}

/// A date and a time of day with microseconds and no zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DateTime {
    pub date: Date,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
    pub microsecond: u32,
}

impl DateTime {
    /// Parses `YYYY-MM-DD[ T]HH:MM:SS[.ffffff]`, and a bare date as midnight.
    pub fn parse(text: &str) -> Option<DateTime> {
        let text = text.strip_suffix('Z').unwrap_or(text);
        if text.len() == 10 {
            return Some(DateTime { date: Date::parse(text)?, hour: 0, minute: 0, second: 0, microsecond: 0 });
        }
        if text.len() < 19 || !matches!(text.as_bytes()[10], b' ' | b'T') {
            return None;
        }
        let date = Date::parse(&text[..10])?;
        let clock = &text[11..];
        let mut parts = clock.splitn(3, ':');
        let hour = parse_digits(parts.next()?)? as u8;
        let minute = parse_digits(parts.next()?)? as u8;
        let (second, microsecond) = parse_seconds(parts.next()?)?;
        (hour < 24 && minute < 60 && second < 60).then_some(DateTime { date, hour, minute, second, microsecond })
    }
}

impl fmt::Display for DateTime {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{} {:02}:{:02}:{:02}", self.date, self.hour, self.minute, self.second)?;
        write_microseconds(formatter, self.microsecond)
    }
}

/// Writes `.ffffff` (all six digits, as MySQL prints DATETIME(6)) when there is a fraction.
fn write_microseconds(formatter: &mut fmt::Formatter<'_>, microseconds: u32) -> fmt::Result {
    if microseconds == 0 {
        return Ok(());
    }
    write!(formatter, ".{microseconds:06}")
}

fn parse_digits(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 9 || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Parses `SS[.f{1,6}]` into seconds and microseconds.
fn parse_seconds(text: &str) -> Option<(u8, u32)> {
    let (seconds, fraction) = text.split_once('.').unwrap_or((text, ""));
    if seconds.len() != 2 || fraction.len() > 6 {
        return None;
    }
    let microseconds =
        if fraction.is_empty() { 0 } else { parse_digits(fraction)? * 10u32.pow(6 - fraction.len() as u32) };
    Some((parse_digits(seconds)? as u8, microseconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_count_days_from_the_epoch_both_ways() {
        let date = |year, month, day| Date { year, month, day };
        for (civil, days) in [
            (date(1970, 1, 1), 0),
            (date(2000, 3, 1), 11_017),
            (date(1000, 1, 1), -354_285),
            (date(9999, 12, 31), 2_932_896),
            (date(1969, 12, 31), -1),
            (date(2024, 2, 29), 19_782),
        ] {
            assert_eq!(civil.days_since_epoch(), days, "{civil}");
            assert_eq!(Date::from_days_since_epoch(days), civil, "{days}");
        }
    }

    #[test]
    fn decimals_keep_every_digit_and_their_scale() {
        let widest = "12345678901234567890123456789012345.123456789012345678901234567890";
        assert_eq!(Decimal::parse(widest).unwrap().as_str(), widest);
        assert_eq!(Decimal::parse("-0.00").unwrap().as_str(), "0.00");
        assert_eq!(Decimal::parse("1.50").unwrap().scale(), 2);
        assert_eq!(Decimal::parse("007.5").unwrap().as_str(), "7.5");
        assert_eq!(Decimal::parse("1.5E+3").unwrap().as_str(), "1500");
        assert_eq!(Decimal::parse("-25e-3").unwrap().as_str(), "-0.025");
        assert_eq!(Decimal::parse(".5").unwrap().as_str(), "0.5");
        assert_eq!(Decimal::parse("1.5").unwrap().with_minimum_scale(2).as_str(), "1.50");
        assert_eq!(Decimal::parse("7").unwrap().with_minimum_scale(1).as_str(), "7.0");
        assert_eq!(Decimal::parse("1.234").unwrap().with_minimum_scale(2).as_str(), "1.234");
        // Canonical forms (as servers print them) are kept as they are; others are made so.
        for (text, canonical) in [
            ("-12.50", "-12.50"),
            ("0", "0"),
            ("10", "10"),
            ("-0", "0"),
            ("-0.000", "0.000"),
            ("0.001", "0.001"),
            ("1.", "1"),
            ("00", "0"),
        ] {
            assert_eq!(Decimal::parse(text).unwrap().as_str(), canonical, "{text}");
        }
        for bad in ["", "-", "1.2.3", "abc", "1e", "NaN", "1,5", "-.", "."] {
            assert_eq!(Decimal::parse(bad), None, "{bad:?} must be refused");
        }
    }

    #[test]
    fn zero_dates_and_long_times_survive_a_round_trip() {
        for text in ["0000-00-00", "2020-00-15", "9999-12-31"] {
            assert_eq!(Date::parse(text).unwrap().to_string(), text);
        }
        assert!(Date::parse("0000-00-00").unwrap().is_zero_or_partial());
        for text in ["-838:59:59", "838:59:59.000001", "00:00:00", "-00:00:01.500000"] {
            assert_eq!(Time::parse(text).unwrap().to_string(), text);
        }
        for text in ["1000-01-01 00:00:00", "2038-01-19 03:14:07.999999", "0000-00-00 00:00:00"] {
            assert_eq!(DateTime::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(DateTime::parse("2024-02-29T12:00:00.25").unwrap().to_string(), "2024-02-29 12:00:00.250000");
        assert_eq!(DateTime::parse("2024-02-29 24:00:00"), None);
        assert_eq!(Time::parse("12:60:00"), None);
    }

    #[test]
    fn display_distinguishes_null_empty_text_and_bytes() {
        assert_eq!(Value::Null.to_string(), "NULL");
        assert_eq!(Value::Text(String::new()).to_string(), "");
        assert_eq!(Value::Bytes(vec![0, 255]).to_string(), "0x00ff");
        assert_eq!(Value::UInt(u64::MAX).to_string(), "18446744073709551615");
        assert_eq!(Value::Bits { width: 4, value: 5 }.to_string(), "b'0101'");
    }
}
