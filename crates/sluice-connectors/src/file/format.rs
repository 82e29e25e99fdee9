//! The two record formats: CSV (RFC 4180, NULL as an empty unquoted field, the empty string as
//! `""`) and JSON Lines (one object per line). Bytes are base64 in both.

use std::io::BufRead;

use crate::json::{base64_encode, decode_text, decode_value};
use sluice_core::{Row, TableSchema, Value};

/// How records are laid out in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv { delimiter: u8 },
    Jsonl,
}

impl Format {
    pub fn extension(&self) -> &'static str {
        match self {
            Format::Csv { .. } => "csv",
            Format::Jsonl => "jsonl",
        }
    }

    /// The text a file starts with: the header line for CSV.
    pub fn header(&self, table: &TableSchema) -> String {
        match self {
            Format::Csv { delimiter } => {
                let names: Vec<String> =
                    table.columns.iter().map(|column| csv_field(&column.name, *delimiter)).collect();
                format!("{}\n", names.join(&(*delimiter as char).to_string()))
            }
            Format::Jsonl => String::new(),
        }
    }

    /// Appends one record to `output`.
    pub fn encode(&self, table: &TableSchema, row: &Row, output: &mut String) {
        match self {
            Format::Csv { delimiter } => {
                for (index, value) in row.iter().enumerate() {
                    if index > 0 {
                        output.push(*delimiter as char);
                    }
                    match value {
                        Value::Null => {}
                        Value::Text(text) | Value::Json(text) => output.push_str(&csv_field(text, *delimiter)),
                        Value::Bytes(bytes) => output.push_str(&csv_field(&base64_encode(bytes), *delimiter)),
                        other => output.push_str(&csv_field(&other.to_string(), *delimiter)),
                    }
                }
            }
            Format::Jsonl => {
                output.push('{');
                for (index, (column, value)) in table.columns.iter().zip(row).enumerate() {
                    if index > 0 {
                        output.push(',');
                    }
                    output.push_str(&serde_json::Value::from(column.name.as_str()).to_string());
                    output.push(':');
                    crate::json::encode_value(value, output);
                }
                output.push('}');
            }
        }
        output.push('\n');
    }
}

/// Quotes a CSV field when it must be: empty (to tell it from NULL), or holding the delimiter, a
/// quote, a line break, or edge spaces.
fn csv_field(text: &str, delimiter: u8) -> String {
    let needs_quotes = text.is_empty()
        || text.bytes().any(|byte| byte == delimiter || byte == b'"' || byte == b'\n' || byte == b'\r')
        || text.starts_with(' ')
        || text.ends_with(' ');
    if needs_quotes {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// One CSV field as read: its text and whether it was quoted (an unquoted empty field is NULL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvField {
    pub text: String,
    pub quoted: bool,
}

/// Reads the next CSV record, which may span lines inside quotes. `None` at the end of input.
pub fn read_csv_record(input: &mut impl BufRead, delimiter: u8) -> std::io::Result<Option<Vec<CsvField>>> {
    let mut line = String::new();
    if input.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut fields = Vec::new();
    let mut field = CsvField { text: String::new(), quoted: false };
    let mut in_quotes = false;
    let delimiter = delimiter as char;
    loop {
        let mut characters = line.chars().peekable();
        while let Some(character) = characters.next() {
            if in_quotes {
                match character {
                    '"' if characters.peek() == Some(&'"') => {
                        characters.next();
                        field.text.push('"');
                    }
                    '"' => in_quotes = false,
                    other => field.text.push(other),
                }
            } else {
                match character {
                    '"' if field.text.is_empty() && !field.quoted => {
                        in_quotes = true;
                        field.quoted = true;
                    }
                    character if character == delimiter => {
                        fields.push(std::mem::replace(&mut field, CsvField { text: String::new(), quoted: false }))
                    }
                    '\n' => {}
                    '\r' if characters.peek() == Some(&'\n') => {}
                    other => field.text.push(other),
                }
            }
        }
        if !in_quotes {
            break;
        }
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a quoted field is not closed before the end of the file",
            ));
        }
    }
    fields.push(field);
    Ok(Some(fields))
}

/// Decodes a CSV record into a row of `table`, or says which column is wrong.
pub fn decode_csv(table: &TableSchema, fields: Vec<CsvField>) -> Result<Row, String> {
    if fields.len() != table.columns.len() {
        return Err(format!("expected {} fields, found {}", table.columns.len(), fields.len()));
    }
    table
        .columns
        .iter()
        .zip(fields)
        .map(|(column, field)| {
            if field.text.is_empty() && !field.quoted {
                return Ok(Value::Null);
            }
            decode_text(&field.text, &column.data_type).map_err(|reason| format!("column {}: {reason}", column.name))
        })
        .collect()
}

/// Decodes a JSON Lines record into a row of `table`. Missing keys are NULL; unknown keys are an
/// error, since dropping them would lose data silently.
pub fn decode_json(table: &TableSchema, line: &str) -> Result<Row, String> {
    let object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(line).map_err(|error| format!("not a JSON object: {error}"))?;
    if let Some(unknown) = object.keys().find(|key| table.column_index(key).is_none()) {
        return Err(format!("field `{unknown}` is not a column of the table"));
    }
    table
        .columns
        .iter()
        .map(|column| {
            let value = object.get(&column.name).unwrap_or(&serde_json::Value::Null);
            decode_value(value, &column.data_type).map_err(|reason| format!("column {}: {reason}", column.name))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::json::base64_decode;
    use std::io::Cursor;

    use sluice_core::{Column, DataType, TableName};

    use super::*;

    fn table() -> TableSchema {
        let column = |name: &str, data_type| Column::new(name, data_type, true);
        TableSchema {
            name: TableName::parse("t"),
            columns: vec![
                column("id", DataType::Integer { bytes: 8, unsigned: true }),
                column("note", DataType::Text { length: None, fixed: false }),
                column("raw", DataType::Bytes { length: None, fixed: false }),
                column("price", DataType::Decimal { precision: Some(65), scale: Some(30) }),
            ],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        }
    }

    fn rows() -> Vec<Row> {
        let decimal = |text| Value::Decimal(sluice_core::Decimal::parse(text).unwrap());
        vec![
            vec![
                Value::UInt(u64::MAX),
                Value::Text("a,\"b\"\nc ".into()),
                Value::Bytes(vec![0, 255, 10]),
                decimal("0.000000000000000000000000000001"),
            ],
            vec![Value::UInt(0), Value::Text(String::new()), Value::Bytes(vec![]), Value::Null],
            vec![Value::UInt(1), Value::Null, Value::Null, decimal("-99999999999999999999999999999999999.5")],
        ]
    }

    #[test]
    fn csv_round_trips_nulls_empty_strings_and_line_breaks() {
        let format = Format::Csv { delimiter: b',' };
        let mut text = format.header(&table());
        for row in rows() {
            format.encode(&table(), &row, &mut text);
        }
        let mut input = Cursor::new(text);
        let header = read_csv_record(&mut input, b',').unwrap().unwrap();
        assert_eq!(header.len(), 4);
        for row in rows() {
            let fields = read_csv_record(&mut input, b',').unwrap().unwrap();
            assert_eq!(decode_csv(&table(), fields).unwrap(), row);
        }
        assert_eq!(read_csv_record(&mut input, b',').unwrap(), None);
    }

    #[test]
    fn jsonl_round_trips_every_value_exactly() {
        for row in rows() {
            let mut line = String::new();
            Format::Jsonl.encode(&table(), &row, &mut line);
            assert_eq!(decode_json(&table(), line.trim_end()).unwrap(), row);
        }
        assert_eq!(
            decode_json(&table(), r#"{"id": 1, "extra": 2}"#).unwrap_err(),
            "field `extra` is not a column of the table"
        );
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64_encode(b"Man"), "TWFu");
        assert_eq!(base64_encode(b"Ma"), "TWE=");
        assert_eq!(base64_encode(b"M"), "TQ==");
        for length in 0..20 {
            let bytes: Vec<u8> = (0..length).map(|index| (index * 37) as u8).collect();
            assert_eq!(base64_decode(&base64_encode(&bytes)).unwrap(), bytes);
        }
    }
}
