//! The checks a server target makes of a job's table before it writes: a key for an upsert, the
//! table itself, and each of the table's columns.

use sluice_core::names::own_name;
use sluice_core::spec::WriteMode;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

/// Under `write_mode: upsert`, which replaces rows by key, tables without a primary key are
/// copied as multisets (inserted) instead: one warning names them all, each by the name the job
/// gives it (not a hidden copy's).
pub(crate) fn warn_keyless_upsert(tables: &[TableSchema], write_mode: WriteMode) {
    let keyless: Vec<String> = tables
        .iter()
        .filter(|table| write_mode == WriteMode::Upsert && table.primary_key.is_empty())
        .map(|table| {
            let own =
                TableName { namespace: table.name.namespace.clone(), name: own_name(&table.name.name).to_owned() };
            format!("`{own}`")
        })
        .collect();
    if keyless.is_empty() {
        return;
    }
    log::warn!(
        "{} {} no primary key, so write_mode: upsert cannot replace their rows by key: they are copied as \
         multisets (inserted; a row the source holds twice is there twice); give them a primary key to upsert them",
        if keyless.len() == 1 { "table" } else { "tables" },
        keyless.join(", ") + if keyless.len() == 1 { " has" } else { " have" }
    );
}

/// The table in the target, given the names of its columns there (`existing`, empty when it
/// does not exist): whether it is to be created (it does not exist and `create_tables` allows
/// it), or an error for a missing table or a column it lacks. `same` compares a column's name
/// with one of the target's, as the target compares names.
pub(crate) fn to_create(
    table: &TableSchema,
    existing: &[String],
    create_tables: bool,
    same: impl Fn(&str, &str) -> bool,
) -> Result<bool> {
    if existing.is_empty() {
        if !create_tables {
            return Err(Error::new(ErrorKind::Schema, format!("table `{}` does not exist", table.name))
                .on(Side::Target)
                .hint("create it, or set target.create_tables: true"));
        }
        return Ok(true);
    }
    let missing: Vec<&str> = table
        .columns
        .iter()
        .map(|column| column.name.as_str())
        .filter(|name| !existing.iter().any(|known| same(known, name)))
        .collect();
    if !missing.is_empty() {
        return Err(Error::new(
            ErrorKind::Schema,
            format!("table `{}` lacks columns {}", table.name, missing.join(", ")),
        )
        .on(Side::Target)
        .hint("add the columns or drop the table so it is created"));
    }
    Ok(false)
}
