//! The MySQL tables sluice creates: names, column types and definitions, `CREATE TABLE`,
//! `ALTER TABLE` and index text, and what is built once the table exists (indexes, counter),
//! shared by the snapshot writer and the change writer.

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use sluice_core::{DataType, Result, Side, TableName, TableSchema};

use super::{mysql_error, quote};

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

/// How much of a table's source definition a MySQL target takes: from a MySQL or MariaDB source
/// (`family`) the counter, portable defaults, ON UPDATE and comments; from a server of its own
/// flavor (`same_flavor`) also the source's own types and every default as written, which is
/// what makes `SHOW CREATE TABLE` equal. (MariaDB has types MySQL lacks, and writes expression
/// defaults without the parentheses MySQL needs.)
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Fidelity {
    family: bool,
    same_flavor: bool,
}

impl Fidelity {
    /// For `table` on a target of `flavor` (`mysql` or `mariadb`; `None` when not known yet,
    /// taken to be the source's).
    pub(super) fn of(table: &TableSchema, flavor: Option<&str>) -> Fidelity {
        let dialect = table.details.dialect.as_deref();
        let family = matches!(dialect, Some("mysql" | "mariadb"));
        Fidelity { family, same_flavor: family && flavor.is_none_or(|flavor| Some(flavor) == dialect) }
    }

    /// The column's default as this target writes it, if it takes it.
    fn default_of(self, column: &sluice_core::Column) -> Option<&str> {
        column.details.default.as_deref().filter(|default| self.family && (self.same_flavor || portable(default)))
    }
}

/// InnoDB's longest key, in bytes.
const KEY_BYTES: u32 = 3072;

/// The table with its key and index columns of unbounded text or bytes (PostgreSQL `text`,
/// `bytea`, `uuid` as text) given a length MySQL can index: the primary key's share the key's
/// 3,072 bytes (4 a character), an index's other columns 255 characters or 1,020 bytes. A
/// longer value is refused by the target as a dirty record, never cut.
fn keyable(table: &TableSchema) -> TableSchema {
    let unbounded = |index: &usize| {
        matches!(
            table.columns[*index].data_type,
            DataType::Text { length: None, .. } | DataType::Bytes { length: None, .. }
        )
    };
    let mut table = table.clone();
    let in_key: Vec<usize> = table.primary_key.iter().copied().filter(unbounded).collect();
    let fixed = (table.primary_key.len() - in_key.len()) as u32;
    let share = KEY_BYTES.saturating_sub(16 * fixed) / in_key.len().max(1) as u32;
    let mut bound = |index: usize, bytes: u32| {
        let column = &mut table.columns[index];
        column.data_type = match column.data_type {
            DataType::Text { fixed, .. } => DataType::Text { length: Some(bytes / 4), fixed },
            DataType::Bytes { fixed, .. } => DataType::Bytes { length: Some(bytes), fixed },
            ref other => other.clone(),
        };
    };
    for &index in &in_key {
        bound(index, share);
    }
    let indexed: Vec<usize> =
        table.indexes.iter().flat_map(|index| index.columns.clone()).filter(|index| !in_key.contains(index)).collect();
    for index in indexed {
        if unbounded(&index) {
            bound(index, 1020);
        }
    }
    table
}

/// A column as `CREATE TABLE` and `ALTER TABLE` spell it: name, type, the source's collation
/// for text (so keys compare as they did), an explicit NULL or NOT NULL (TIMESTAMP columns get
/// no implicit default), and what `fidelity` carries of the source's definition; AUTO_INCREMENT
/// only on the column that is the primary key's first (`counter`), which makes it a key at
/// creation.
pub(super) fn column_definition(column: &sluice_core::Column, fidelity: Fidelity, counter: bool) -> String {
    // MariaDB's JSON is LONGTEXT with a check: spelt JSON, it gets that check again.
    let own_type = fidelity.same_flavor && !column.native_type.is_empty() && column.data_type != DataType::Json;
    let type_text = match &column.data_type {
        _ if own_type => column.native_type.clone(),
        // TIMESTAMP holds 1970 to 2038 only: an instant from another database is kept, in UTC,
        // in a DATETIME, which holds years 1000 to 9999.
        DataType::Timestamp { precision } if !fidelity.family => format!("DATETIME({precision})"),
        data_type => column_type(data_type),
    };
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
    let mut definition = format!("{} {type_text}{collation}{nullability}", quote(&column.name));
    if !fidelity.family {
        return definition;
    }
    let details = &column.details;
    if let Some(default) = fidelity.default_of(column) {
        definition.push_str(&format!(" DEFAULT {default}"));
    }
    if let Some(on_update) = &details.on_update {
        definition.push_str(&format!(" ON UPDATE {on_update}"));
    }
    if details.auto_increment && counter {
        definition.push_str(" AUTO_INCREMENT");
    }
    if let Some(comment) = &details.comment {
        definition.push_str(&format!(" COMMENT {}", string_literal(comment)));
    }
    definition
}

/// `ALTER TABLE` that adds `column` to `table` without giving the rows there a value: the
/// source's ADD COLUMN had no default (the stream refuses one: the binlog carries no values for
/// the existing rows), so a default it has by now (a later `ALTER COLUMN ... SET DEFAULT`) is set
/// after the column is added, for the rows to come.
pub(super) fn add_column_sql(table: &TableSchema, column: &sluice_core::Column, fidelity: Fidelity) -> Vec<String> {
    let name = qualified(&table.name);
    let default = fidelity.default_of(column).filter(|default| !default.eq_ignore_ascii_case("NULL"));
    let bare = sluice_core::Column {
        details: sluice_core::schema::ColumnDetails { default: None, ..column.details.clone() },
        ..column.clone()
    };
    let mut statements =
        vec![format!("ALTER TABLE {name} ADD COLUMN IF NOT EXISTS {}", column_definition(&bare, fidelity, false))];
    if let Some(default) = default {
        statements.push(format!("ALTER TABLE {name} ALTER COLUMN {} SET DEFAULT {default}", quote(&column.name)));
    }
    statements
}

/// `ALTER TABLE ... COMMENT` with the table's comment (none: an empty one), for a target that
/// takes the source's details.
pub(super) fn table_comment_sql(table: &TableSchema, fidelity: Fidelity) -> Option<String> {
    let comment = table.details.comment.as_deref().unwrap_or("");
    fidelity.family.then(|| format!("ALTER TABLE {} COMMENT = {}", qualified(&table.name), string_literal(comment)))
}

/// `ALTER TABLE ... MODIFY COLUMN` that gives a column of `table` its definition there.
pub(super) fn modify_column_sql(table: &TableSchema, column: &sluice_core::Column, fidelity: Fidelity) -> String {
    let counter = table.primary_key.first().is_some_and(|&first| table.columns[first].name == column.name);
    format!("ALTER TABLE {} MODIFY COLUMN {}", qualified(&table.name), column_definition(column, fidelity, counter))
}

/// A default both MySQL and MariaDB read alike: a quoted or numeric literal, NULL, a bit
/// literal, the current time.
fn portable(default: &str) -> bool {
    let upper = default.to_ascii_uppercase();
    default.starts_with('\'')
        || upper == "NULL"
        || upper.starts_with("B'")
        || upper.starts_with("CURRENT_TIMESTAMP")
        || (!default.is_empty()
            && default.chars().all(|c| c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E')))
}

/// A string as a MySQL literal.
pub(super) fn string_literal(text: &str) -> String {
    format!("'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// `CREATE TABLE` (and its database) for a target of `flavor` (see `Fidelity::of`).
pub(super) fn create_table_sql(table: &TableSchema, flavor: Option<&str>) -> String {
    let table = &keyable(table);
    let fidelity = Fidelity::of(table, flavor);
    let first_key = table.primary_key.first().copied();
    let mut definitions: Vec<String> = table
        .columns
        .iter()
        .enumerate()
        .map(|(index, column)| column_definition(column, fidelity, Some(index) == first_key))
        .collect();
    if !table.primary_key.is_empty() {
        let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
        definitions.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    let database = table.name.namespace.as_deref().unwrap_or("sluice_default");
    let mut options = "DEFAULT CHARSET = utf8mb4".to_owned();
    let collation = table.details.collation.as_deref().filter(|collation| {
        fidelity.same_flavor && collation.chars().all(|character| character.is_ascii_alphanumeric() || character == '_')
    });
    if let Some(collation) = collation {
        let charset = collation.split('_').next().unwrap_or(collation);
        options = format!("DEFAULT CHARSET = {charset} COLLATE = {collation}");
    }
    if let Some(comment) = table.details.comment.as_ref().filter(|_| fidelity.family) {
        options.push_str(&format!(" COMMENT = {}", string_literal(comment)));
    }
    format!(
        "CREATE DATABASE IF NOT EXISTS {} CHARACTER SET utf8mb4; CREATE TABLE IF NOT EXISTS {} ({}) {options}",
        quote(database),
        qualified(&table.name),
        definitions.join(", ")
    )
}

/// Moves the table's counter at least to where the source's stood (MySQL keeps it past the
/// highest value in the table whatever is asked), so an insert without a value gets a new one.
pub(super) fn counter_sql(table: &TableSchema) -> Option<String> {
    let next = table.details.next_auto_increment?;
    let counted = table.columns.iter().any(|column| column.details.auto_increment);
    (counted && Fidelity::of(table, None).family)
        .then(|| format!("ALTER TABLE {} AUTO_INCREMENT = {next}", qualified(&table.name)))
}

/// Builds the secondary indexes of `table` that the target's table lacks (known by name, since
/// MySQL 8 has no `ADD INDEX IF NOT EXISTS`), so it can be asked again after a crash.
pub(super) async fn add_missing_indexes(connection: &mut Conn, server: &str, table: &TableSchema) -> Result<()> {
    if table.indexes.is_empty() {
        return Ok(());
    }
    let namespace = table.name.namespace.as_deref().unwrap_or("sluice_default");
    let existing: Vec<String> = connection
        .exec(
            "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
            (namespace, &table.name.name),
        )
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, &format!("read the indexes of {}", table.name)))?;
    for index in
        table.indexes.iter().filter(|index| !existing.iter().any(|name| name.eq_ignore_ascii_case(&index.name)))
    {
        connection.query_drop(format!("{}{}", super::writes::DDL_MARK, add_index_sql(table, index))).await.map_err(
            |error| mysql_error(error, Side::Target, server, &format!("build index {} of {}", index.name, table.name)),
        )?;
    }
    Ok(())
}

/// Moves the table's counter where the source's stood (`counter_sql`), if it has one.
pub(super) async fn move_counter(connection: &mut Conn, server: &str, table: &TableSchema) -> Result<()> {
    let Some(counter) = counter_sql(table) else { return Ok(()) };
    connection
        .query_drop(format!("{}{counter}", super::writes::DDL_MARK))
        .await
        .map_err(|error| mysql_error(error, Side::Target, server, &format!("set the counter of {}", table.name)))
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
