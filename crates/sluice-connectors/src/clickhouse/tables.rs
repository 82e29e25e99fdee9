//! The tables Sluice makes in ClickHouse: each source table as a `ReplacingMergeTree` ordered by
//! its primary key, whose version column (`_sluice_version`) keeps a key's latest row and whose
//! tombstone column (`_sluice_deleted`) marks a deleted key, and beside it a view
//! (`<table>_live`) of the rows as the source has them: `FINAL`, tombstones left out.

use sluice_core::schema::{column_changes, ColumnChange};
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use super::server::{literal, quote, Server};
use super::types::{column_type, Features, DELETED_COLUMN, VERSION_COLUMN};

/// The suffix of the view of a table's live rows.
pub const LIVE_SUFFIX: &str = "_live";

/// `database`.`table`, quoted.
pub fn qualified(name: &TableName) -> String {
    match &name.namespace {
        Some(database) => format!("{}.{}", quote(database), quote(&name.name)),
        None => quote(&name.name),
    }
}

/// The name of the view of a table's live rows.
pub fn live_view(name: &TableName) -> TableName {
    TableName { namespace: name.namespace.clone(), name: format!("{}{LIVE_SUFFIX}", name.name) }
}

/// The statements that make a table and its view.
pub fn create_statements(table: &TableSchema, features: Features) -> Vec<String> {
    let mut columns: Vec<String> = table
        .columns
        .iter()
        .map(|column| format!("{} {}", quote(&column.name), column_type(column, features)))
        .collect();
    columns.push(format!("{} UInt64", quote(VERSION_COLUMN)));
    columns.push(format!("{} UInt8", quote(DELETED_COLUMN)));
    let engine = if table.primary_key.is_empty() {
        // Without a key nothing is replaced: every row stays (a table without a key takes
        // snapshots and inserts only).
        "MergeTree ORDER BY tuple()".to_owned()
    } else {
        let key: Vec<String> = table.primary_key_names().into_iter().map(quote).collect();
        format!("ReplacingMergeTree({}) ORDER BY ({})", quote(VERSION_COLUMN), key.join(", "))
    };
    let mut statements = Vec::new();
    if let Some(database) = &table.name.namespace {
        statements.push(format!("CREATE DATABASE IF NOT EXISTS {}", quote(database)));
    }
    statements.push(format!(
        "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE = {engine}",
        qualified(&table.name),
        columns.join(", ")
    ));
    statements.push(view_statement(&table.name, own_columns(table), !table.primary_key.is_empty()));
    statements
}

/// The view of a table's live rows, over the table's own columns (named in order): `FINAL` on
/// a `ReplacingMergeTree` (a table with a key), every row of a plain `MergeTree`.
fn view_statement<'a>(name: &TableName, columns: impl IntoIterator<Item = &'a str>, replacing: bool) -> String {
    let columns: Vec<String> = columns.into_iter().map(quote).collect();
    format!(
        "CREATE VIEW IF NOT EXISTS {} AS SELECT {} FROM {}{} WHERE {} = 0",
        qualified(&live_view(name)),
        columns.join(", "),
        qualified(name),
        if replacing { " FINAL" } else { "" },
        quote(DELETED_COLUMN)
    )
}

/// Whether a table is a `ReplacingMergeTree`.
async fn replacing(server: &Server, name: &TableName) -> Result<bool> {
    let answer = server
        .query(&format!(
            "SELECT engine FROM system.tables WHERE database = {} AND name = {} FORMAT TabSeparated",
            database_of(name),
            literal(&name.name)
        ))
        .await?;
    Ok(answer.trim().starts_with("Replacing"))
}

fn database_of(name: &TableName) -> String {
    match &name.namespace {
        Some(database) => literal(database),
        None => "currentDatabase()".to_owned(),
    }
}

fn own_columns(table: &TableSchema) -> impl Iterator<Item = &str> {
    table.columns.iter().map(|column| column.name.as_str())
}

/// The columns a table has, in order, with their types; empty when it does not exist.
pub async fn columns(server: &Server, name: &TableName) -> Result<Vec<(String, String)>> {
    let database = database_of(name);
    let answer = server
        .query(&format!(
            "SELECT name, type FROM system.columns WHERE database = {database} AND table = {} FORMAT TabSeparated",
            literal(&name.name)
        ))
        .await?;
    Ok(answer
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(name, data_type)| (unescape(name), unescape(data_type)))
        .collect())
}

/// Makes a table (and its view) unless it exists; with `create` false, a missing table is an
/// error naming it. A table that exists must have the Sluice columns.
pub async fn ensure(server: &Server, table: &TableSchema, features: Features, create: bool) -> Result<()> {
    let existing = columns(server, &table.name).await?;
    if existing.is_empty() {
        if !create {
            return Err(Error::new(ErrorKind::Schema, format!("ClickHouse table {} does not exist", table.name))
                .on(Side::Target)
                .hint("set `create_tables: true` on the target, or create it as `sluice schema` prints it"));
        }
        for statement in create_statements(table, features) {
            server.query(&statement).await?;
        }
        return Ok(());
    }
    let lacks: Vec<&str> = [VERSION_COLUMN, DELETED_COLUMN]
        .into_iter()
        .filter(|wanted| !existing.iter().any(|(name, _)| name == wanted))
        .collect();
    if !lacks.is_empty() {
        return Err(Error::new(
            ErrorKind::Schema,
            format!("ClickHouse table {} has no column {}, which Sluice writes each row's version and deletion to", table.name, lacks.join(" or ")),
        )
        .on(Side::Target)
        .hint("drop the table and let the job create it (`create_tables: true`), or create it as `sluice schema` prints it"));
    }
    let own = existing.iter().map(|(name, _)| name.as_str()).filter(|name| !is_sluice_column(name));
    let replacing = replacing(server, &table.name).await?;
    server.query(&view_statement(&table.name, own, replacing)).await?;
    Ok(())
}

fn is_sluice_column(name: &str) -> bool {
    name == VERSION_COLUMN || name == DELETED_COLUMN
}

/// Brings a table's columns to `table`'s: adds, drops and retypes columns (`MODIFY COLUMN`),
/// idempotent since each step is checked against the columns the table has; then makes its view
/// again over the new columns. A renamed column is refused (ClickHouse before 20.4 cannot rename).
pub async fn alter(
    server: &Server,
    table: &TableSchema,
    renamed: &[(String, String)],
    retyped: &[String],
    features: Features,
) -> Result<()> {
    let existing: Vec<String> = columns(server, &table.name)
        .await?
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !is_sluice_column(name))
        .collect();
    let name = qualified(&table.name);
    for step in column_changes(&existing, table, renamed, retyped) {
        let statement = match step {
            ColumnChange::Rename { from, to } => {
                return Err(Error::new(
                    ErrorKind::Schema,
                    format!("table {}: column {from} is renamed to {to}; the ClickHouse target does not rename columns", table.name),
                )
                .on(Side::Target)
                .hint("rename the column in ClickHouse by hand (ALTER TABLE … RENAME COLUMN on 20.4 and later), then run the job again"))
            }
            ColumnChange::Add(column) => {
                let after = table.columns.iter().position(|each| each.name == column.name).and_then(|index| {
                    index.checked_sub(1).map(|before| format!(" AFTER {}", quote(&table.columns[before].name)))
                });
                format!(
                    "ALTER TABLE {name} ADD COLUMN {} {}{}",
                    quote(&column.name),
                    column_type(column, features),
                    after.unwrap_or_default()
                )
            }
            ColumnChange::Retype(column) => {
                format!("ALTER TABLE {name} MODIFY COLUMN {} {}", quote(&column.name), column_type(column, features))
            }
            ColumnChange::Drop(column) => format!("ALTER TABLE {name} DROP COLUMN {}", quote(&column)),
        };
        server.query(&statement).await?;
    }
    server.query(&format!("DROP TABLE IF EXISTS {}", qualified(&live_view(&table.name)))).await?;
    let replacing = replacing(server, &table.name).await?;
    server.query(&view_statement(&table.name, own_columns(table), replacing)).await?;
    Ok(())
}

/// Drops a table and its view; a missing one is fine.
pub async fn drop(server: &Server, name: &TableName) -> Result<()> {
    server.query(&format!("DROP TABLE IF EXISTS {}", qualified(&live_view(name)))).await?;
    server.query(&format!("DROP TABLE IF EXISTS {}", qualified(name))).await.map(|_| ())
}

/// Renames a table and makes its view under the new name; done already (no `from`) is fine.
pub async fn rename(server: &Server, from: &TableName, to: &TableName) -> Result<()> {
    if columns(server, from).await?.is_empty() {
        return Ok(());
    }
    if let Some(database) = &to.namespace {
        server.query(&format!("CREATE DATABASE IF NOT EXISTS {}", quote(database))).await?;
    }
    server.query(&format!("DROP TABLE IF EXISTS {}", qualified(&live_view(from)))).await?;
    server.query(&format!("RENAME TABLE {} TO {}", qualified(from), qualified(to))).await?;
    let columns: Vec<String> =
        columns(server, to).await?.into_iter().map(|(name, _)| name).filter(|name| !is_sluice_column(name)).collect();
    let replacing = replacing(server, to).await?;
    server.query(&view_statement(to, columns.iter().map(String::as_str), replacing)).await.map(|_| ())
}

/// Empties a table.
pub async fn truncate(server: &Server, name: &TableName) -> Result<()> {
    server.query(&format!("TRUNCATE TABLE IF EXISTS {}", qualified(name))).await.map(|_| ())
}

/// A TabSeparated field as it was: `\t`, `\n`, `\\` and ClickHouse's other escapes undone.
pub fn unescape(field: &str) -> String {
    if !field.contains('\\') {
        return field.to_owned();
    }
    String::from_utf8_lossy(&unescape_bytes(field.as_bytes())).into_owned()
}

/// A TabSeparated field's bytes as they were: ClickHouse's escapes undone.
pub fn unescape_bytes(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut bytes = field.iter();
    while let Some(&byte) = bytes.next() {
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        match bytes.next() {
            Some(b't') => out.push(b'\t'),
            Some(b'n') => out.push(b'\n'),
            Some(b'r') => out.push(b'\r'),
            Some(b'b') => out.push(0x08),
            Some(b'f') => out.push(0x0c),
            Some(b'0') => out.push(0),
            Some(&other) => out.push(other),
            None => out.push(b'\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Column, DataType};

    #[test]
    fn a_keyed_table_is_replacing_by_its_key_and_a_keyless_one_keeps_every_row() {
        let features = Features { wide_dates: false, boolean: false };
        let mut table = TableSchema::named(TableName::new(Some("shop"), "orders"));
        table.columns = vec![
            Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false),
            Column::new("note", DataType::Text { length: None, fixed: false }, true),
        ];
        table.primary_key = vec![0];
        let statements = create_statements(&table, features);
        assert_eq!(statements[0], "CREATE DATABASE IF NOT EXISTS `shop`");
        assert_eq!(
            statements[1],
            "CREATE TABLE IF NOT EXISTS `shop`.`orders` (`id` Int64, `note` Nullable(String), `_sluice_version` UInt64, \
             `_sluice_deleted` UInt8) ENGINE = ReplacingMergeTree(`_sluice_version`) ORDER BY (`id`)"
        );
        assert_eq!(
            statements[2],
            "CREATE VIEW IF NOT EXISTS `shop`.`orders_live` AS SELECT `id`, `note` FROM `shop`.`orders` FINAL WHERE `_sluice_deleted` = 0"
        );
        table.primary_key.clear();
        let statements = create_statements(&table, features);
        assert!(statements[1].ends_with("ENGINE = MergeTree ORDER BY tuple()"));
        assert!(
            statements[2].ends_with("FROM `shop`.`orders` WHERE `_sluice_deleted` = 0"),
            "no FINAL: {}",
            statements[2]
        );
    }

    #[test]
    fn fields_are_unescaped() {
        assert_eq!(unescape("a\\tb\\\\c\\nd\\'"), "a\tb\\c\nd'");
        assert_eq!(unescape("plain"), "plain");
    }
}
