//! Rows of `Value`s as Arrow columns: the builders the Parquet and Delta targets share. Each
//! target chooses the Arrow type of a logical type (a Parquet file holds unsigned integers, a
//! Delta table does not); a builder takes any value that fits its Arrow type exactly and says
//! why one does not.

pub(crate) mod read_back;

use arrow_array::builder::{
    ArrayBuilder, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Decimal256Builder, Float32Builder,
    Float64Builder, Int16Builder, Int32Builder, Int64Builder, Int8Builder, StringBuilder, TimestampMicrosecondBuilder,
    UInt16Builder, UInt32Builder, UInt64Builder, UInt8Builder,
};
use arrow_array::ArrayRef;
use arrow_schema::DataType as Arrow;
use arrow_schema::TimeUnit;
use sluice_core::{DataType, DateTime, Decimal, Value};

/// The Arrow types a columnar target holds beyond those every one does, which decide how it
/// stores the logical types that need them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ArrowTypes {
    /// Unsigned integers (Parquet). Without them an unsigned integer takes the next wider signed
    /// type, a 64-bit one (or a BIT of 64) a `DECIMAL(20, 0)`.
    pub unsigned: bool,
    /// 256-bit decimals, up to 76 digits (Parquet). Without them a decimal of more than 38 digits
    /// is its text.
    pub decimal256: bool,
}

/// The Arrow type a column of this logical type has in a target that holds `types`. Every
/// mapping holds every value: an unbounded decimal is its text, MySQL TIME (±838 h) a signed
/// count of microseconds, DATETIME a timestamp without zone, TIMESTAMP one in UTC.
pub(crate) fn arrow_type(data_type: &DataType, types: ArrowTypes) -> Arrow {
    match data_type {
        DataType::Boolean => Arrow::Boolean,
        DataType::Integer { bytes: 1, unsigned: false } => Arrow::Int8,
        DataType::Integer { bytes: 2, unsigned: false } => Arrow::Int16,
        DataType::Integer { bytes: 3 | 4, unsigned: false } => Arrow::Int32,
        DataType::Integer { unsigned: false, .. } => Arrow::Int64,
        DataType::Integer { bytes: 1, .. } if types.unsigned => Arrow::UInt8,
        DataType::Integer { bytes: 2, .. } if types.unsigned => Arrow::UInt16,
        DataType::Integer { bytes: 3 | 4, .. } if types.unsigned => Arrow::UInt32,
        DataType::Integer { .. } | DataType::Bits { .. } if types.unsigned => Arrow::UInt64,
        DataType::Integer { bytes: 1, .. } => Arrow::Int16,
        DataType::Integer { bytes: 2, .. } => Arrow::Int32,
        DataType::Integer { bytes: 3 | 4, .. } => Arrow::Int64,
        DataType::Bits { width } if *width < 64 => Arrow::Int64,
        DataType::Integer { .. } | DataType::Bits { .. } => Arrow::Decimal128(20, 0),
        DataType::Float32 => Arrow::Float32,
        DataType::Float64 => Arrow::Float64,
        DataType::Decimal { precision: Some(precision), scale } if *precision <= 38 => {
            Arrow::Decimal128(*precision as u8, scale.unwrap_or(0) as i8)
        }
        DataType::Decimal { precision: Some(precision), scale } if types.decimal256 && *precision <= 76 => {
            Arrow::Decimal256(*precision as u8, scale.unwrap_or(0) as i8)
        }
        DataType::Decimal { .. } => Arrow::Utf8,
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } | DataType::Json => Arrow::Utf8,
        DataType::Bytes { .. } | DataType::Geometry => Arrow::Binary,
        DataType::Date => Arrow::Date32,
        DataType::Time { .. } => Arrow::Int64,
        DataType::DateTime { .. } => Arrow::Timestamp(TimeUnit::Microsecond, None),
        DataType::Timestamp { .. } => Arrow::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        DataType::Year => Arrow::Int16,
    }
}

/// Microseconds since the Unix epoch of a civil date and time (no time zone applied).
pub(crate) fn microseconds(value: &DateTime) -> i64 {
    let seconds = value.date.days_since_epoch() * 86_400
        + i64::from(value.hour) * 3_600
        + i64::from(value.minute) * 60
        + i64::from(value.second);
    seconds * 1_000_000 + i64::from(value.microsecond)
}

/// The unscaled digits of a decimal at `scale` (`1.5` at scale 2 is `150`).
pub(crate) fn unscaled(value: &Decimal, scale: usize) -> String {
    let text = value.as_str();
    let (integer, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut digits = format!("{integer}{fraction}");
    digits.push_str(&"0".repeat(scale.saturating_sub(fraction.len())));
    digits
}

/// Digits after the decimal point.
fn fraction_digits(value: &Decimal) -> usize {
    value.as_str().split_once('.').map_or(0, |(_, fraction)| fraction.len())
}

/// One column being filled for a record batch.
pub(crate) struct ColumnBuilder {
    arrow: Arrow,
    builder: Box<dyn ArrayBuilder>,
}

impl ColumnBuilder {
    pub(crate) fn new(arrow: &Arrow, capacity: usize) -> ColumnBuilder {
        let builder: Box<dyn ArrayBuilder> = match arrow {
            Arrow::Boolean => Box::new(BooleanBuilder::with_capacity(capacity)),
            Arrow::Int8 => Box::new(Int8Builder::with_capacity(capacity)),
            Arrow::Int16 => Box::new(Int16Builder::with_capacity(capacity)),
            Arrow::Int32 => Box::new(Int32Builder::with_capacity(capacity)),
            Arrow::Int64 => Box::new(Int64Builder::with_capacity(capacity)),
            Arrow::UInt8 => Box::new(UInt8Builder::with_capacity(capacity)),
            Arrow::UInt16 => Box::new(UInt16Builder::with_capacity(capacity)),
            Arrow::UInt32 => Box::new(UInt32Builder::with_capacity(capacity)),
            Arrow::UInt64 => Box::new(UInt64Builder::with_capacity(capacity)),
            Arrow::Float32 => Box::new(Float32Builder::with_capacity(capacity)),
            Arrow::Float64 => Box::new(Float64Builder::with_capacity(capacity)),
            arrow @ Arrow::Decimal128(..) => {
                Box::new(Decimal128Builder::with_capacity(capacity).with_data_type(arrow.clone()))
            }
            arrow @ Arrow::Decimal256(..) => {
                Box::new(Decimal256Builder::with_capacity(capacity).with_data_type(arrow.clone()))
            }
            Arrow::Binary => Box::new(BinaryBuilder::with_capacity(capacity, capacity * 16)),
            Arrow::Date32 => Box::new(Date32Builder::with_capacity(capacity)),
            Arrow::Timestamp(_, None) => Box::new(TimestampMicrosecondBuilder::with_capacity(capacity)),
            Arrow::Timestamp(_, Some(zone)) => {
                Box::new(TimestampMicrosecondBuilder::with_capacity(capacity).with_timezone(zone.clone()))
            }
            _ => Box::new(StringBuilder::with_capacity(capacity, capacity * 16)),
        };
        ColumnBuilder { arrow: arrow.clone(), builder }
    }

    /// Appends a value, or says why it does not fit the column's Arrow type (nothing is
    /// appended then).
    pub(crate) fn append(&mut self, value: &Value) -> std::result::Result<(), String> {
        macro_rules! builder {
            ($type:ty) => {
                self.builder.as_any_mut().downcast_mut::<$type>().expect("the builder matches the column type")
            };
        }
        let out_of_range = || format!("{value} is out of range for {:?}", self.arrow);
        // Integers of either sign go into any integer column they fit.
        let signed = |value: &Value| match value {
            Value::Int(value) => Some(i128::from(*value)),
            Value::UInt(value) | Value::Bits { value, .. } => Some(i128::from(*value)),
            _ => None,
        };
        match (&self.arrow, value) {
            (Arrow::Boolean, Value::Null) => builder!(BooleanBuilder).append_null(),
            (Arrow::Boolean, Value::Bool(value)) => builder!(BooleanBuilder).append_value(*value),
            (Arrow::Int8, Value::Null) => builder!(Int8Builder).append_null(),
            (Arrow::Int16, Value::Null) => builder!(Int16Builder).append_null(),
            (Arrow::Int32, Value::Null) => builder!(Int32Builder).append_null(),
            (Arrow::Int64, Value::Null) => builder!(Int64Builder).append_null(),
            (Arrow::Int64, Value::Time(time)) => {
                let magnitude = ((i64::from(time.hours) * 60 + i64::from(time.minutes)) * 60 + i64::from(time.seconds))
                    * 1_000_000
                    + i64::from(time.microseconds);
                builder!(Int64Builder).append_value(if time.negative { -magnitude } else { magnitude })
            }
            (Arrow::Int8, value) if signed(value).is_some() => builder!(Int8Builder)
                .append_value(i8::try_from(signed(value).expect("checked")).map_err(|_| out_of_range())?),
            (Arrow::Int16, value) if signed(value).is_some() => builder!(Int16Builder)
                .append_value(i16::try_from(signed(value).expect("checked")).map_err(|_| out_of_range())?),
            (Arrow::Int32, value) if signed(value).is_some() => builder!(Int32Builder)
                .append_value(i32::try_from(signed(value).expect("checked")).map_err(|_| out_of_range())?),
            (Arrow::Int64, value) if signed(value).is_some() => builder!(Int64Builder)
                .append_value(i64::try_from(signed(value).expect("checked")).map_err(|_| out_of_range())?),
            (Arrow::UInt8, Value::Null) => builder!(UInt8Builder).append_null(),
            (Arrow::UInt8, Value::UInt(value)) => {
                builder!(UInt8Builder).append_value(u8::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::UInt16, Value::Null) => builder!(UInt16Builder).append_null(),
            (Arrow::UInt16, Value::UInt(value)) => {
                builder!(UInt16Builder).append_value(u16::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::UInt32, Value::Null) => builder!(UInt32Builder).append_null(),
            (Arrow::UInt32, Value::UInt(value)) => {
                builder!(UInt32Builder).append_value(u32::try_from(*value).map_err(|_| out_of_range())?)
            }
            (Arrow::UInt64, Value::Null) => builder!(UInt64Builder).append_null(),
            (Arrow::UInt64, Value::UInt(value)) | (Arrow::UInt64, Value::Bits { value, .. }) => {
                builder!(UInt64Builder).append_value(*value)
            }
            (Arrow::Float32, Value::Null) => builder!(Float32Builder).append_null(),
            (Arrow::Float32, Value::Float32(value)) => builder!(Float32Builder).append_value(*value),
            (Arrow::Float64, Value::Null) => builder!(Float64Builder).append_null(),
            (Arrow::Float64, Value::Float64(value)) => builder!(Float64Builder).append_value(*value),
            (Arrow::Float64, Value::Float32(value)) => builder!(Float64Builder).append_value(f64::from(*value)),
            (Arrow::Decimal128(..), Value::Null) => builder!(Decimal128Builder).append_null(),
            (Arrow::Decimal128(precision, scale), Value::Decimal(value)) => {
                if fraction_digits(value) > *scale as usize {
                    return Err(out_of_range());
                }
                let digits = unscaled(value, *scale as usize);
                let parsed = digits.parse::<i128>().map_err(|_| out_of_range())?;
                if digits.trim_start_matches(['-', '0']).len() > *precision as usize {
                    return Err(out_of_range());
                }
                builder!(Decimal128Builder).append_value(parsed)
            }
            // An unsigned 64-bit integer in a DECIMAL(20, 0) column (Delta has no unsigned type).
            (Arrow::Decimal128(_, 0), value) if signed(value).is_some() => {
                builder!(Decimal128Builder).append_value(signed(value).expect("checked"))
            }
            (Arrow::Decimal256(..), Value::Null) => builder!(Decimal256Builder).append_null(),
            (Arrow::Decimal256(_, scale), Value::Decimal(value)) => {
                if fraction_digits(value) > *scale as usize {
                    return Err(out_of_range());
                }
                let digits = unscaled(value, *scale as usize);
                let parsed = arrow_buffer::i256::from_string(&digits).ok_or_else(out_of_range)?;
                builder!(Decimal256Builder).append_value(parsed)
            }
            (Arrow::Binary, Value::Null) => builder!(BinaryBuilder).append_null(),
            (Arrow::Binary, Value::Bytes(bytes)) => builder!(BinaryBuilder).append_value(bytes),
            (Arrow::Date32, Value::Null) => builder!(Date32Builder).append_null(),
            (Arrow::Date32, Value::Date(date)) if !date.is_zero_or_partial() => {
                builder!(Date32Builder).append_value(date.days_since_epoch() as i32)
            }
            (Arrow::Timestamp(..), Value::Null) => builder!(TimestampMicrosecondBuilder).append_null(),
            (Arrow::Timestamp(..), Value::DateTime(value) | Value::Timestamp(value))
                if !value.date.is_zero_or_partial() =>
            {
                builder!(TimestampMicrosecondBuilder).append_value(microseconds(value))
            }
            (Arrow::Utf8, Value::Null) => builder!(StringBuilder).append_null(),
            (Arrow::Utf8, Value::Text(text) | Value::Json(text)) => builder!(StringBuilder).append_value(text),
            (Arrow::Utf8, Value::Decimal(value)) => builder!(StringBuilder).append_value(value.as_str()),
            (arrow, value) => return Err(format!("{value} cannot be written as {arrow:?}")),
        }
        Ok(())
    }

    /// Whether `value` fits, without appending it.
    pub(crate) fn fits(arrow: &Arrow, value: &Value) -> std::result::Result<(), String> {
        ColumnBuilder::new(arrow, 1).append(value)
    }

    /// The column so far; the builder starts empty again.
    pub(crate) fn finish(&mut self) -> ArrayRef {
        self.builder.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::Array;

    #[test]
    fn decimals_are_scaled_to_their_column() {
        let decimal = |text| Decimal::parse(text).unwrap();
        assert_eq!(unscaled(&decimal("1.5"), 2), "150");
        assert_eq!(unscaled(&decimal("-0.01"), 2), "-001");
        assert_eq!(unscaled(&decimal("42"), 0), "42");
    }

    #[test]
    fn integers_go_into_any_column_they_fit() {
        let mut wide = ColumnBuilder::new(&Arrow::Int64, 2);
        wide.append(&Value::UInt(u64::from(u32::MAX))).unwrap();
        assert!(wide.append(&Value::UInt(u64::MAX)).is_err());
        assert_eq!(wide.finish().len(), 1);
        let mut decimal = ColumnBuilder::new(&Arrow::Decimal128(20, 0), 1);
        decimal.append(&Value::UInt(u64::MAX)).unwrap();
        assert!(ColumnBuilder::fits(&Arrow::Int16, &Value::Int(70_000)).is_err());
        assert!(
            ColumnBuilder::fits(&Arrow::Decimal128(4, 2), &Value::Decimal(Decimal::parse("123.45").unwrap())).is_err()
        );
    }
}
