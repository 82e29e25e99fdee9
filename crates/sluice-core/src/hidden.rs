//! Copies kept out of sight until they show a state the source had.
//!
//! A `snapshot+cdc` job copies its tables split by split, each read at its own moment, then
//! replays the changes since the snapshot's start until the stream passes the copy's end (the
//! replay window). In between, the rows of a table are a mix of moments no source ever showed
//! (a transfer's debit from a later split beside its credit from an earlier one). So a target
//! that can rename tables inside its transactions (`FoldedChangeSink::hides_copies`) takes each copy under a
//! hidden name (`hidden_name`), and the stream renames every hidden table to its own name in the
//! commit that ends the window (`FoldedChangeWriter::publish`): readers see no table, then the whole of
//! it at a source state, and every state after that is one too.
//!
//! Only tables the target does not have when the job is first planned are hidden: a table that
//! exists is the user's (or a restart's), and publishing would have to drop it.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::connector::{Checkpoint, SchemaChange, Sink, TableTasks};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::names::{hidden_name, HIDDEN_PREFIX};
use crate::schema::{TableName, TableSchema};
use crate::state::Plan;

/// The longest table name every hiding target accepts (PostgreSQL: 63 bytes; MySQL: 64
/// characters).
const MAX_NAME_BYTES: usize = 63;

/// The tables a new plan hides: those of a `snapshot+cdc` job the target does not have yet.
pub(crate) async fn tables_to_hide(sink: &dyn Sink, targets: &[TableSchema]) -> Result<Vec<TableName>> {
    let Some(folded) = sink.folded_changes().filter(|folded| folded.hides_copies()) else { return Ok(Vec::new()) };
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let (names, long): (Vec<TableName>, Vec<TableName>) = targets
        .iter()
        .map(|target| target.name.clone())
        .partition(|name| HIDDEN_PREFIX.len() + name.name.len() <= MAX_NAME_BYTES);
    if !long.is_empty() {
        let long: Vec<String> = long.iter().map(ToString::to_string).collect();
        log::warn!(
            "{} copied in place, not hidden (names longer than {} bytes): readers may see their rows mix moments of the source until the stream passes the copy's end",
            long.join(", "),
            MAX_NAME_BYTES - HIDDEN_PREFIX.len()
        );
    }
    let existing = folded.existing_tables(&names).await?;
    Ok(names.into_iter().filter(|name| !existing.contains(name)).collect())
}

/// The tables of a plan whose copy is still hidden, and the names everything but the stream
/// writes them under. A hidden table is published once its own name exists in the target (the
/// rename made it), so the target alone says which are left.
///
/// The stream keeps its own copy in its checkpoint, since its DDL may drop or rename a hidden
/// table before the copy is published (`follow`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HiddenCopies {
    tables: BTreeSet<TableName>,
}

impl HiddenCopies {
    /// The tables of `job` still hidden: the plan's, or, once the stream has a checkpoint, the
    /// stream's (its DDL may have renamed or dropped some), less those whose own name the target
    /// has (published, by a rename whose checkpoint a crash may have lost).
    pub async fn of(plan: &Plan, sink: &dyn Sink, job: &str) -> Result<HiddenCopies> {
        if plan.hidden.is_empty() {
            return Ok(HiddenCopies::default());
        }
        let Some(folded) = sink.folded_changes() else { return Ok(HiddenCopies::default()) };
        let mut writer = folded.open_folded(job, crate::names::STREAM_TASK).await?;
        let listed: Vec<TableName> = match writer.recover().await? {
            Some(Checkpoint { position: Some(position), .. }) => match position.0.get("hidden") {
                Some(hidden) => serde_json::from_value::<HiddenCopies>(hidden.clone())
                    .map_err(|error| {
                        Error::new(
                            ErrorKind::State,
                            format!("the stream's checkpoint lists hidden copies wrongly: {error}"),
                        )
                        .on(Side::Target)
                    })?
                    .tables
                    .into_iter()
                    .collect(),
                None => Vec::new(),
            },
            _ => plan.hidden.clone(),
        };
        drop(writer);
        if listed.is_empty() {
            return Ok(HiddenCopies::default());
        }
        let published = folded.existing_tables(&listed).await?;
        let tables = listed.into_iter().filter(|name| !published.contains(name)).collect();
        Ok(HiddenCopies { tables })
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Each table still hidden: (the name it is written under, its own name), for
    /// `FoldedChangeWriter::publish`.
    pub fn pairs(&self) -> Vec<(TableName, TableName)> {
        self.tables.iter().map(|table| (hidden_name(table), table.clone())).collect()
    }

    /// A schema change of the stream (target names) as it applies to the tables written now:
    /// a hidden table is dropped, emptied, altered or renamed under its hidden name, and a
    /// renamed one stays hidden under its new name.
    pub fn follow(&mut self, change: SchemaChange) -> SchemaChange {
        match change {
            SchemaChange::Drop(table) if self.tables.remove(&table) => SchemaChange::Drop(hidden_name(&table)),
            SchemaChange::Truncate(table) => SchemaChange::Truncate(self.name(&table)),
            SchemaChange::Rename { from, to } if self.tables.remove(&from) => {
                let change = SchemaChange::Rename { from: hidden_name(&from), to: hidden_name(&to) };
                self.tables.insert(to);
                change
            }
            SchemaChange::Create(table) => SchemaChange::Create(TableSchema { name: self.name(&table.name), ..table }),
            SchemaChange::Alter { table, renamed, retyped } => {
                SchemaChange::Alter { table: TableSchema { name: self.name(&table.name), ..table }, renamed, retyped }
            }
            other => other,
        }
    }

    /// The name a target table is written under now.
    pub fn name(&self, table: &TableName) -> TableName {
        if self.tables.contains(table) {
            hidden_name(table)
        } else {
            table.clone()
        }
    }

    /// A target table's schema under the name it is written under now.
    pub fn schema(&self, table: &Arc<TableSchema>) -> Arc<TableSchema> {
        if self.tables.contains(&table.name) {
            Arc::new(TableSchema { name: hidden_name(&table.name), ..(**table).clone() })
        } else {
            table.clone()
        }
    }

    /// Target tables (for `prepare` and `finish`) under the names they are written under now.
    pub fn schemas(&self, tables: &[TableSchema]) -> Vec<TableSchema> {
        tables.iter().map(|table| TableSchema { name: self.name(&table.name), ..table.clone() }).collect()
    }

    /// Tables and their tasks (for judging and resetting checkpoints) under the names they are
    /// written under now.
    pub fn tasks(&self, tables: Vec<TableTasks>) -> Vec<TableTasks> {
        tables.into_iter().map(|table| TableTasks { table: self.name(&table.table), ..table }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_names_take_a_prefix_and_give_it_back() {
        use crate::names::own_name;
        let short = hidden_name(&TableName::parse("shop.orders"));
        assert_eq!(short, TableName::parse("shop._sluice_copy_orders"));
        assert_eq!(own_name(&short.name), "orders");
        assert_eq!(own_name("orders"), "orders");
    }

    #[test]
    fn only_tables_still_hidden_are_renamed() {
        let hidden = HiddenCopies { tables: [TableName::parse("d.a")].into_iter().collect() };
        assert_eq!(hidden.name(&TableName::parse("d.a")), TableName::parse("d._sluice_copy_a"));
        assert_eq!(hidden.name(&TableName::parse("d.b")), TableName::parse("d.b"));
        let tasks = hidden.tasks(vec![TableTasks { table: TableName::parse("d.a"), tasks: vec!["d.a#0".to_owned()] }]);
        assert_eq!(tasks[0].table, TableName::parse("d._sluice_copy_a"));
        assert_eq!(tasks[0].tasks, ["d.a#0"]);
    }

    #[test]
    fn the_stream_ddl_follows_hidden_tables() {
        let (a, b, c) = (TableName::parse("d.a"), TableName::parse("d.b"), TableName::parse("d.c"));
        let mut hidden = HiddenCopies { tables: [a.clone(), b.clone()].into_iter().collect() };
        assert_eq!(hidden.follow(SchemaChange::Truncate(a.clone())), SchemaChange::Truncate(hidden_name(&a)));
        assert_eq!(
            hidden.follow(SchemaChange::Rename { from: a.clone(), to: c.clone() }),
            SchemaChange::Rename { from: hidden_name(&a), to: hidden_name(&c) }
        );
        assert_eq!(hidden.follow(SchemaChange::Drop(b.clone())), SchemaChange::Drop(hidden_name(&b)));
        // A table created by the stream is not a copy: it has its own name at once.
        let created = TableSchema::named(TableName::parse("d.e"));
        assert_eq!(hidden.follow(SchemaChange::Create(created.clone())), SchemaChange::Create(created));
        assert_eq!(hidden.pairs(), [(hidden_name(&c), c)]);
        let text = serde_json::to_string(&hidden).unwrap();
        assert_eq!(serde_json::from_str::<HiddenCopies>(&text).unwrap(), hidden);
    }
}
