//! Tables declared in a job file rather than read from a server: columns as a mapping of name to
//! type (`{id: bigint, v: text}`) and a key among them, as the `tcp` and `generate` sources take
//! them.

use sluice_core::spec::{Node, NodeKind, SpecError};
use sluice_core::{Column, DataType};

/// The type names `columns` takes, for messages.
const TYPE_NAMES: &str = "boolean, integer, bigint, float, decimal, text, bytes, date, datetime, timestamp or json";

/// A column type by the name `columns` gives it.
pub fn column_type(name: &str) -> Option<DataType> {
    Some(match name.to_ascii_lowercase().as_str() {
        "boolean" | "bool" => DataType::Boolean,
        "integer" | "int" => DataType::Integer { bytes: 4, unsigned: false },
        "bigint" | "long" => DataType::Integer { bytes: 8, unsigned: false },
        "float" | "double" => DataType::Float64,
        "decimal" | "numeric" => DataType::Decimal { precision: None, scale: None },
        "text" | "string" => DataType::Text { length: None, fixed: false },
        "bytes" => DataType::Bytes { length: None, fixed: false },
        "date" => DataType::Date,
        "datetime" => DataType::DateTime { precision: 6 },
        "timestamp" => DataType::Timestamp { precision: 6 },
        "json" => DataType::Json,
        _ => return None,
    })
}

/// The columns of `node`, a mapping of column name to type at `path` (`line` when it is
/// missing); every problem is pushed to `errors`.
pub(crate) fn declared_columns(
    node: Option<&Node>,
    path: &str,
    line: Option<usize>,
    errors: &mut Vec<SpecError>,
) -> Vec<Column> {
    let mut columns = Vec::new();
    match node.map(|node| &node.kind) {
        Some(NodeKind::Mapping(entries)) if !entries.is_empty() => {
            for (name, node) in entries {
                let type_name = match &node.kind {
                    NodeKind::Scalar { text, .. } => text.as_str(),
                    _ => "",
                };
                match column_type(type_name) {
                    Some(data_type) => columns.push(Column::new(name.clone(), data_type, true)),
                    None => errors.push(SpecError {
                        path: format!("{path}.{name}"),
                        line: node.line,
                        message: format!("unknown type `{type_name}`; expected {TYPE_NAMES}"),
                    }),
                }
            }
        }
        _ => errors.push(SpecError {
            path: path.to_owned(),
            line: node.and_then(|node| node.line).or(line),
            message:
                "missing required field `columns`: a mapping of column name to type, e.g. {id: bigint, name: text}"
                    .to_owned(),
        }),
    }
    columns
}

/// The positions of the key columns `names` among `columns`, each made NOT NULL; a name that is
/// not a column is an error at `path`.
pub(crate) fn declared_key(
    columns: &mut [Column],
    names: &[String],
    path: &str,
    line: Option<usize>,
    errors: &mut Vec<SpecError>,
) -> Vec<usize> {
    let mut key = Vec::new();
    for name in names {
        match columns.iter().position(|column| &column.name == name) {
            Some(index) => {
                columns[index].nullable = false;
                key.push(index);
            }
            None => errors.push(SpecError {
                path: path.to_owned(),
                line,
                message: format!("`{name}` is not one of `columns`"),
            }),
        }
    }
    key
}
