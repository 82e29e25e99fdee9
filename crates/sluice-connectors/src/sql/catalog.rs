//! The tables of a server target as a change stream's DDL finds them, and the steps of a rename
//! or a publish that hold when replayed after a crash: a table already renamed is left as it is,
//! an empty table in the way (made by a run's `prepare`) is dropped, one with rows stops the job.

use async_trait::async_trait;
use sluice_core::conflict::{published_over, renamed_over};
use sluice_core::{Error, ErrorKind, Result, Side, TableName};

/// What a server target's change writer tells of its tables.
#[async_trait]
pub(crate) trait Catalog: Send {
    /// The table's column names, empty when it does not exist.
    async fn columns(&mut self, table: &TableName) -> Result<Vec<String>>;

    /// Whether the (existing) table holds a row.
    async fn holds_rows(&mut self, table: &TableName) -> Result<bool>;

    /// Drops the (existing, empty) table.
    async fn drop_empty(&mut self, table: &TableName) -> Result<()>;

    /// Whether a table can be renamed to `to`: it does not exist, or exists empty (made by a
    /// run's `prepare` while the stream was still behind the statement that makes it) and is
    /// dropped now. A `to` that holds rows is left alone: false.
    async fn free_name(&mut self, to: &TableName) -> Result<bool> {
        if self.columns(to).await?.is_empty() {
            return Ok(true);
        }
        let held = self.holds_rows(to).await?;
        if !held {
            self.drop_empty(to).await?;
        }
        Ok(!held)
    }
}

/// Whether `from` is still to be renamed to `to`: false when a replay finds it renamed already;
/// an error when neither table exists, or when `to` exists with rows.
pub(crate) async fn to_rename(catalog: &mut impl Catalog, from: &TableName, to: &TableName) -> Result<bool> {
    if catalog.columns(from).await?.is_empty() {
        if catalog.columns(to).await?.is_empty() {
            return Err(
                Error::new(ErrorKind::Schema, format!("neither {from} nor {to} exists to rename")).on(Side::Target)
            );
        }
        return Ok(false);
    }
    if !catalog.free_name(to).await? {
        return Err(renamed_over(from, to));
    }
    Ok(true)
}

/// The pairs of (hidden copy, own name) still to publish: those whose copy exists (a replay
/// finds the others published), each own name free; an error naming every own name taken.
pub(crate) async fn to_publish<'a>(
    catalog: &mut impl Catalog,
    tables: &'a [(TableName, TableName)],
) -> Result<Vec<&'a (TableName, TableName)>> {
    let mut renames = Vec::new();
    let mut taken = Vec::new();
    for pair @ (hidden, own) in tables {
        if catalog.columns(hidden).await?.is_empty() {
            continue;
        }
        if catalog.free_name(own).await? {
            renames.push(pair);
        } else {
            taken.push(format!("{own} (the copy waits as {hidden})"));
        }
    }
    if !taken.is_empty() {
        return Err(published_over(&taken));
    }
    Ok(renames)
}
