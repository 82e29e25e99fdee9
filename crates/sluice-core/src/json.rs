//! Values as JSON, shared by the JSON Lines files, the change events and the rows of dirty
//! records: numbers as numbers, exact decimals, dates and times as strings (with their
//! precision), bytes as base64, JSON columns embedded as they are. `docs/types.md` and `docs/events.md` describe the rendering.

use crate::value::parse_text;
use crate::{DataType, Value};

/// Appends one value as JSON.
pub fn encode_value(value: &Value, output: &mut String) {
    let string = |text: &str| serde_json::Value::from(text).to_string();
    match value {
        Value::Null => output.push_str("null"),
        Value::Bool(value) => output.push_str(if *value { "true" } else { "false" }),
        Value::Int(value) => output.push_str(&value.to_string()),
        Value::UInt(value) => output.push_str(&value.to_string()),
        Value::Bits { value, .. } => output.push_str(&value.to_string()),
        Value::Float32(value) if value.is_finite() => output.push_str(&value.to_string()),
        Value::Float64(value) if value.is_finite() => output.push_str(&value.to_string()),
        // Exact decimals are strings: most JSON readers would round a number through f64.
        Value::Float32(_)
        | Value::Float64(_)
        | Value::Decimal(_)
        | Value::Date(_)
        | Value::Time(_)
        | Value::DateTime(_)
        | Value::Timestamp(_) => output.push_str(&string(&value.to_string())),
        Value::Text(text) => output.push_str(&string(text)),
        Value::Bytes(bytes) => output.push_str(&string(&base64_encode(bytes))),
        Value::Json(text) => output.push_str(text),
        // Only in a dirty record's image (an event never carries one): marked, not guessed.
        Value::Unchanged => output.push_str(r#"{"unchanged":true}"#),
    }
}

/// A value as a JSON string.
pub(crate) fn to_text(value: &Value) -> String {
    let mut output = String::new();
    encode_value(value, &mut output);
    output
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut output = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let word = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for index in 0..4 {
            if index <= chunk.len() {
                output.push(BASE64[(word >> (18 - 6 * index) & 63) as usize] as char);
            } else {
                output.push('=');
            }
        }
    }
    output
}

/// Standard base64 with or without padding; `None` for a character outside the alphabet.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut output = Vec::with_capacity(text.len() * 3 / 4);
    let mut word = 0u32;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = BASE64.iter().position(|&known| known == byte)? as u32;
        word = (word << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            output.push((word >> bits) as u8);
            word &= (1 << bits) - 1;
        }
    }
    Some(output)
}

/// Reads one JSON value as a value of `data_type`, the inverse of `encode_value`.
pub fn decode_value(value: &serde_json::Value, data_type: &DataType) -> Result<Value, String> {
    use serde_json::Value as Json;
    match (value, data_type) {
        (Json::Null, _) => Ok(Value::Null),
        (_, DataType::Json) => Ok(Value::Json(value.to_string())),
        (Json::Bool(value), DataType::Boolean) => Ok(Value::Bool(*value)),
        (Json::String(text), _) => decode_text(text, data_type),
        (Json::Number(number), _) => decode_text(&number.to_string(), data_type),
        (other, _) => Err(format!("expected a scalar, found {other}")),
    }
}

/// Reads a value of `data_type` from text; bytes are base64, as `encode_value` writes them.
pub fn decode_text(text: &str, data_type: &DataType) -> Result<Value, String> {
    match data_type {
        DataType::Bytes { .. } | DataType::Geometry => {
            base64_decode(text).map(Value::Bytes).ok_or_else(|| "expected base64 bytes".to_owned())
        }
        _ => parse_text(text, data_type),
    }
}

/// The type a JSON value suggests when nothing else says: whole numbers are 64-bit integers,
/// other numbers doubles, objects and arrays JSON, everything else text.
pub fn inferred_type(value: &serde_json::Value) -> DataType {
    match value {
        serde_json::Value::Bool(_) => DataType::Boolean,
        serde_json::Value::Number(number) if number.is_i64() || number.is_u64() => {
            DataType::Integer { bytes: 8, unsigned: !number.is_i64() }
        }
        serde_json::Value::Number(_) => DataType::Float64,
        serde_json::Value::Array(_) | serde_json::Value::Object(_) => DataType::Json,
        serde_json::Value::Null | serde_json::Value::String(_) => DataType::Text { length: None, fixed: false },
    }
}
