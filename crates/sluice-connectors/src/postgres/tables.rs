//! The PostgreSQL tables sluice creates: names, `CREATE TABLE` and `CREATE INDEX` text, shared by
//! the snapshot writer and the change writer.

use sluice_core::{TableName, TableSchema};

use super::{bounded_name, column_type, quote};

pub(super) fn qualified(name: &TableName) -> String {
    match &name.namespace {
        Some(namespace) => format!("{}.{}", quote(namespace), quote(&name.name)),
        None => quote(&name.name),
    }
}

pub(super) fn create_table_sql(table: &TableSchema) -> String {
    let mut definitions: Vec<String> = table
        .columns
        .iter()
        .map(|column| {
            format!(
                "{} {}{}",
                quote(&column.name),
                column_type(&column.data_type),
                if column.nullable { "" } else { " NOT NULL" }
            )
        })
        .collect();
    if !table.primary_key.is_empty() {
        let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        definitions.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    let schema = table.name.namespace.as_deref().unwrap_or("public");
    format!(
        "CREATE SCHEMA IF NOT EXISTS {}; CREATE TABLE IF NOT EXISTS {} ({})",
        quote(schema),
        qualified(&table.name),
        definitions.join(", ")
    )
}

/// `CREATE INDEX` for each secondary index. PostgreSQL index names are per schema, so each is
/// prefixed with its table's name (and bounded to the 63-byte limit by `bounded_name`).
pub(super) fn create_index_sql(table: &TableSchema) -> Vec<String> {
    table
        .indexes
        .iter()
        .map(|index| {
            let name = bounded_name(&format!("{}_{}", table.name.name, index.name));
            let columns: Vec<String> = index.columns.iter().map(|&column| quote(&table.columns[column].name)).collect();
            format!(
                "CREATE {}INDEX IF NOT EXISTS {} ON {} ({})",
                if index.unique { "UNIQUE " } else { "" },
                quote(&name),
                qualified(&table.name),
                columns.join(", ")
            )
        })
        .collect()
}
