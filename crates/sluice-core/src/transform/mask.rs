//! Masks for personal data, applied to a rule's output columns after the projection.

use hmac::{KeyInit, Mac};

use crate::schema::{Column, DataType};
use crate::secret::Secret;
use crate::spec::MaskRule;
use crate::value::Value;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// A compiled mask of one column.
#[derive(Clone)]
pub(super) enum Mask {
    /// Keyed with the rule's salt once; cloned per value.
    Hash(Box<HmacSha256>),
    /// `***`, cut to the column's length; non-text columns become NULL.
    Redact { text: Option<String> },
    /// The first N characters (text) or bytes.
    Truncate(usize),
}

impl std::fmt::Debug for Mask {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mask::Hash(_) => formatter.write_str("Hash"),
            Mask::Redact { .. } => formatter.write_str("Redact"),
            Mask::Truncate(count) => write!(formatter, "Truncate({count})"),
        }
    }
}

impl Mask {
    pub(super) fn new(rule: &MaskRule, salt: Option<&Secret>, column: &Column) -> Result<Mask, String> {
        Ok(match rule {
            MaskRule::Hash => {
                let salt = salt.ok_or("the `hash` mask needs the rule's `salt`")?;
                let keyed = HmacSha256::new_from_slice(salt.expose().as_bytes()).map_err(|error| error.to_string())?;
                Mask::Hash(Box::new(keyed))
            }
            MaskRule::Redact => match &column.data_type {
                DataType::Text { length, .. } => {
                    let length = length.map_or(3, |length| (length as usize).min(3));
                    Mask::Redact { text: Some("*".repeat(length)) }
                }
                _ => Mask::Redact { text: None },
            },
            MaskRule::Truncate(count) => match &column.data_type {
                DataType::Text { .. } | DataType::Bytes { .. } => Mask::Truncate(*count),
                other => return Err(format!("truncate masks text and binary columns; `{}` is {other:?}", column.name)),
            },
        })
    }

    /// Whether equal inputs stay equal and different ones (practically) different, so a key
    /// column stays a key.
    pub(super) fn keeps_identity(&self) -> bool {
        matches!(self, Mask::Hash(_))
    }

    /// The column as the target holds it.
    pub(super) fn reshape(&self, column: &mut Column) {
        match self {
            Mask::Hash(_) => {
                column.data_type = DataType::Text { length: Some(64), fixed: true };
                column.native_type = String::new();
                column.collation = None;
                // A counter, a default or an ON UPDATE of the source type means nothing for a hash.
                column.details = Default::default();
            }
            Mask::Redact { text: None } => column.nullable = true,
            Mask::Redact { .. } | Mask::Truncate(_) => {}
        }
    }

    /// Masks a value. A value the source did not send stays unsent: the target keeps the masked
    /// value it holds.
    pub(super) fn apply(&self, value: &mut Value) {
        if value.is_null() || matches!(value, Value::Unchanged) {
            return;
        }
        match self {
            Mask::Hash(keyed) => {
                let mut mac = (**keyed).clone();
                match &*value {
                    Value::Bytes(bytes) => mac.update(bytes),
                    other => mac.update(super::expression::text_of(other).as_bytes()),
                }
                *value = Value::Text(super::expression::hex(&mac.finalize().into_bytes()));
            }
            Mask::Redact { text: Some(text) } => *value = Value::Text(text.clone()),
            Mask::Redact { text: None } => *value = Value::Null,
            Mask::Truncate(count) => match value {
                Value::Text(text) => {
                    if let Some((at, _)) = text.char_indices().nth(*count) {
                        text.truncate(at);
                    }
                }
                Value::Bytes(bytes) => bytes.truncate(*count),
                _ => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_is_hmac_sha256_of_the_text_with_the_salt() {
        let salt = Secret::new("0123456789abcdef");
        let column = Column::new("email", DataType::Text { length: None, fixed: false }, true);
        let mask = Mask::new(&MaskRule::Hash, Some(&salt), &column).unwrap();
        let mut value = Value::Text("what do ya want for nothing?".into());
        mask.apply(&mut value);
        // RFC 4231 style check computed independently: HMAC-SHA256(key, message).
        let mut reference = HmacSha256::new_from_slice(b"0123456789abcdef").unwrap();
        reference.update(b"what do ya want for nothing?");
        assert_eq!(value, Value::Text(super::super::expression::hex(&reference.finalize().into_bytes())));
    }

    #[test]
    fn redact_and_truncate_keep_the_column_valid() {
        let short = Column::new("code", DataType::Text { length: Some(2), fixed: true }, false);
        let mut value = Value::Text("AB".into());
        Mask::new(&MaskRule::Redact, None, &short).unwrap().apply(&mut value);
        assert_eq!(value, Value::Text("**".into()));
        let date = Column::new("born", DataType::Date, false);
        let redact = Mask::new(&MaskRule::Redact, None, &date).unwrap();
        let mut reshaped = date.clone();
        redact.reshape(&mut reshaped);
        assert!(reshaped.nullable);
        let mut value = Value::Text("Grüße".into());
        Mask::new(&MaskRule::Truncate(3), None, &short).unwrap().apply(&mut value);
        assert_eq!(value, Value::Text("Grü".into()));
        assert!(Mask::new(&MaskRule::Truncate(3), None, &date).is_err());
    }
}
