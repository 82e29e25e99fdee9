//! The MySQL tables sluice creates: names, column types and definitions, `CREATE TABLE` and
//! index text, shared by the snapshot writer and the change writer.

use sluice_core::{DataType, TableName, TableSchema};

use super::quote;

pub(super) fn qualified(name: &TableName) -> String {
    match &name.namespace {
        Some(namespace) => format!("{}.{}", quote(namespace), quote(&name.name)),
        None => quote(&name.name),
    }
}

/// The MySQL type a logical type is created as.
pub(super) fn column_type(data_type: &DataType) -> String {
    let unsigned = |unsigned: &bool| if *unsigned { " UNSIGNED" } else { "" };
    let list = |values: &[String]| {
        values
            .iter()
            .map(|value| format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(",")
    };
    match data_type {
        DataType::Boolean => "TINYINT(1)".into(),
        DataType::Integer { bytes: 1, unsigned: sign } => format!("TINYINT{}", unsigned(sign)),
        DataType::Integer { bytes: 2, unsigned: sign } => format!("SMALLINT{}", unsigned(sign)),
        DataType::Integer { bytes: 3, unsigned: sign } => format!("MEDIUMINT{}", unsigned(sign)),
        DataType::Integer { bytes: 4, unsigned: sign } => format!("INT{}", unsigned(sign)),
        DataType::Integer { unsigned: sign, .. } => format!("BIGINT{}", unsigned(sign)),
        DataType::Float32 => "FLOAT".into(),
        DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal { precision: Some(precision), scale } if *precision <= 65 => {
            format!("DECIMAL({precision},{})", scale.unwrap_or(0).min(30))
        }
        DataType::Decimal { .. } => "DECIMAL(65,30)".into(),
        DataType::Text { length: Some(length), fixed: true } if *length <= 255 => format!("CHAR({length})"),
        DataType::Text { length: Some(length), .. } if *length <= 16_383 => format!("VARCHAR({length})"),
        DataType::Text { .. } => "LONGTEXT".into(),
        DataType::Bytes { length: Some(length), fixed: true } if *length <= 255 => format!("BINARY({length})"),
        DataType::Bytes { length: Some(length), .. } if *length <= 65_535 => format!("VARBINARY({length})"),
        DataType::Bytes { .. } => "LONGBLOB".into(),
        DataType::Bits { width } => format!("BIT({width})"),
        DataType::Date => "DATE".into(),
        DataType::Time { precision } => format!("TIME({precision})"),
        DataType::DateTime { precision } => format!("DATETIME({precision})"),
        DataType::Timestamp { precision } => format!("TIMESTAMP({precision})"),
        DataType::Year => "YEAR".into(),
        DataType::Json => "JSON".into(),
        DataType::Enum { values } => format!("ENUM({})", list(values)),
        DataType::Set { values } => format!("SET({})", list(values)),
        DataType::Geometry => "GEOMETRY".into(),
    }
}

/// A column as `CREATE TABLE` and `ALTER TABLE` spell it: name, type, the source's collation
/// for text (so keys compare as they did), and an explicit NULL or NOT NULL (TIMESTAMP columns
/// get no implicit default).
pub(super) fn column_definition(column: &sluice_core::Column) -> String {
    let collation = match (&column.data_type, &column.collation) {
        (DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. }, Some(collation))
            if !collation.is_empty()
                && collation.chars().all(|character| character.is_ascii_alphanumeric() || character == '_') =>
        {
            format!(" COLLATE {collation}")
        }
        _ => String::new(),
    };
    let nullability = if column.nullable { " NULL" } else { " NOT NULL" };
    format!("{} {}{collation}{nullability}", quote(&column.name), column_type(&column.data_type))
}

pub(super) fn create_table_sql(table: &TableSchema) -> String {
    let mut definitions: Vec<String> = table.columns.iter().map(column_definition).collect();
    if !table.primary_key.is_empty() {
        let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        definitions.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    let database = table.name.namespace.as_deref().unwrap_or("sluice_default");
    format!(
        "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4; CREATE TABLE IF NOT EXISTS {} ({}) DEFAULT CHARSET = utf8mb4",
        quote(database),
        qualified(&table.name),
        definitions.join(", ")
    )
}

pub(super) fn add_index_sql(table: &TableSchema, index: &sluice_core::Index) -> String {
    let columns: Vec<String> = index.columns.iter().map(|&column| quote(&table.columns[column].name)).collect();
    format!(
        "ALTER TABLE {} ADD {}INDEX {} ({})",
        qualified(&table.name),
        if index.unique { "UNIQUE " } else { "" },
        quote(&index.name),
        columns.join(", ")
    )
}
