//! The net effect of a run of row changes, per table and primary key.
//!
//! The stream task groups many source transactions into one target transaction. Inside it only
//! the end state of each row is visible, so a key's changes fold into where the row was at the
//! start (present or absent) and where it is at the end (a row image or absent). Applying a
//! group is then one delete of the keys that were present and one insert of the final images per
//! table: few statements whatever the transactions' shape, and per-key order kept by
//! construction. An update that changes the primary key becomes a delete of the old key and an
//! insert of the new one. A writer that prefers it (`FoldedChangeWriter::updates_in_place`)
//! gets a row that was there before the group and is there after it as an update instead.
//!
//! A table without a primary key is a multiset of rows: a row is known by all of its values, and
//! the group's changes fold into how many copies of each row came or went. Applying them deletes
//! that many matching rows (one per copy) and inserts the new copies; a duplicate row stays a
//! duplicate.

mod conflicts;

use std::collections::HashMap;
use std::sync::Arc;

use crate::change::{key_text, Change, ChangeKind, Row};
use crate::conflict::missing_rows;
use crate::connector::FoldedChangeWriter;
use crate::error::{Error, ErrorKind, Result, Side};
use crate::schema::TableSchema;
use crate::value::Value;

pub(crate) use conflicts::{Conflict, Winner};

/// Whether a row holds a value its update left unchanged and its log did not carry.
pub(crate) fn has_unchanged(row: &Row) -> bool {
    row.iter().any(|value| matches!(value, Value::Unchanged))
}

/// Fills the values `after` left unchanged from the key's earlier image.
fn fill_unchanged(after: &mut Row, earlier: &Row) {
    for (value, known) in after.iter_mut().zip(earlier) {
        if matches!(value, Value::Unchanged) {
            *value = known.clone();
        }
    }
}

/// An update whose unchanged values cannot be kept (`what` says why: its row moved to another
/// key, the target lacks the row, the target takes events).
pub(crate) fn unchanged_lost(table: &TableSchema, row: &Row, what: &str) -> Error {
    let columns: Vec<&str> = table
        .columns
        .iter()
        .zip(row)
        .filter(|(_, value)| matches!(value, Value::Unchanged))
        .map(|(column, _)| column.name.as_str())
        .collect();
    Error::new(
        ErrorKind::Read,
        format!(
            "table {} ({}): an update left {} unchanged and the source's log does not carry {}, and {what}: sluice does not write a guess",
            table.name,
            key_text(table, row),
            columns.join(", "),
            if columns.len() == 1 { "its value" } else { "their values" }
        ),
    )
    .on(Side::Source)
    .hint("make the source log whole rows (PostgreSQL: ALTER TABLE ... REPLICA IDENTITY FULL), then reset the job")
}

/// One key's fold: was a row there before the group, and what is there after it.
#[derive(Debug)]
struct Entry {
    key: Row,
    existed: bool,
    row: Option<Row>,
    /// The row before the group's first change to the key, when that change carried it (an
    /// update or a delete): the dirty record of a refused row shows it.
    before: Option<Row>,
    /// The key's changes are applied by key (`ApplyMode::Replay` or `Dirty`): its row is
    /// deleted whether or not the target has it, then its final image inserted.
    by_key: bool,
    /// The group's transaction (`NetChanges::end_transaction` counts them) that changed it last.
    transaction: usize,
}

/// A row of a table without a primary key, and how many copies of it came (positive) or went
/// (negative).
#[derive(Debug)]
struct Copies {
    row: Row,
    count: i64,
    /// A copy with a dirty record (`ApplyMode::Dirty`): one that should go need not be there.
    dirty: bool,
    transaction: usize,
}

#[derive(Debug)]
struct TableChanges {
    table: Arc<TableSchema>,
    positions: HashMap<String, usize>,
    entries: Vec<Entry>,
    /// A table without a primary key: each distinct row and its copies, in order of first
    /// appearance.
    copies: Vec<Copies>,
}

impl TableChanges {
    /// Counts `change` copies of `row` in (a keyless table).
    fn count(&mut self, row: Row, change: i64, dirty: bool, transaction: usize) {
        let text = format!("{row:?}");
        let next = self.copies.len();
        let index = *self.positions.entry(text).or_insert(next);
        if index == next {
            self.copies.push(Copies { row, count: 0, dirty: false, transaction });
        }
        let copies = &mut self.copies[index];
        copies.count += change;
        copies.dirty |= dirty;
        copies.transaction = transaction;
    }

    /// The entry of `key`, made on its first change (`existed` says whether that change found a
    /// row), and whether it was made now.
    fn entry(&mut self, key: Row, existed: bool, mode: ApplyMode, transaction: usize) -> (&mut Entry, bool) {
        let text = format!("{key:?}");
        let mut made = false;
        let index = *self.positions.entry(text).or_insert_with(|| {
            // A key first seen by an update or delete existed; its caller sets `row` right away,
            // so the empty placeholder image never reaches the target.
            self.entries.push(Entry {
                key,
                existed,
                row: if existed { Some(Vec::new()) } else { None },
                before: None,
                by_key: false,
                transaction,
            });
            made = true;
            self.entries.len() - 1
        });
        let entry = &mut self.entries[index];
        entry.by_key |= mode != ApplyMode::Strict;
        entry.transaction = transaction;
        (entry, made)
    }
}

/// How replayed changes meet the target's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ApplyMode {
    /// Every change must find the target as the source had it: a missing row to update or
    /// delete, or an existing row to insert, stops the job.
    Strict,
    /// The changes between a snapshot's start and end: the snapshot may already hold some of
    /// them, so every touched key is deleted (present or not) and its final image inserted.
    Replay,
    /// A change of a row with a dirty record: a change of it was left out (refused by the
    /// target, or the copy refused the row), so the target may lack the row or hold an older
    /// one. Its key is applied as in `Replay`, on top of what the target has, and so is a copy
    /// of a keyless table's row; the other keys of the group stay strict.
    Dirty,
}

/// A row the target refused for its content when the fold was applied (`FoldedChangeWriter::insert`):
/// left out of the target, the key's earlier row deleted, to be kept as a dirty record.
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    /// The target table, under its own name.
    pub table: Arc<TableSchema>,
    /// The row before the group changed it, when a change carried it.
    pub before: Option<Row>,
    pub after: Row,
    /// The group's transaction that changed the row last (`NetChanges::end_transaction`).
    pub transaction: usize,
    pub reason: String,
}

/// The folded changes of a group, tables in order of first appearance.
#[derive(Debug, Default)]
pub(crate) struct NetChanges {
    tables: Vec<TableChanges>,
    /// Changes folded since the last `apply`.
    changes: usize,
    /// Source transactions of the group ended so far: the open one's number.
    transaction: usize,
}

/// What applying a fold did.
#[derive(Debug, Default)]
pub struct Applied {
    /// Changes applied, less the rows the target refused.
    pub changes: usize,
    /// Rows the target refused, left out.
    pub refused: Vec<Refusal>,
}

impl NetChanges {
    /// Changes folded since the last apply.
    pub fn len(&self) -> usize {
        self.changes
    }

    /// The open source transaction ended: the changes folded next are the next one's.
    pub(crate) fn end_transaction(&mut self) {
        self.transaction += 1;
    }

    /// The group commits: the next group's transactions are counted from 0.
    pub(crate) fn end_group(&mut self) {
        self.transaction = 0;
    }

    /// Folds one change in. A change inconsistent with the ones before it in the same group (an
    /// insert of a key the group already holds a row for, an update or delete of a key the group
    /// deleted) is an error in `Strict` mode, where it means the source log is not what the
    /// stream assumes.
    pub fn add(&mut self, change: Change, mode: ApplyMode) -> Result<()> {
        let table = &change.table;
        let transaction = self.transaction;
        // The same table under the same schema; a schema change comes with a flush before it.
        let same = |known: &TableChanges| {
            Arc::ptr_eq(&known.table, table) || (known.table.name == table.name && known.table.columns == table.columns)
        };
        let position = match self.tables.iter().position(same) {
            Some(position) => position,
            None => {
                self.tables.push(TableChanges {
                    table: table.clone(),
                    positions: HashMap::new(),
                    entries: Vec::new(),
                    copies: Vec::new(),
                });
                self.tables.len() - 1
            }
        };
        self.changes += 1;
        if let ChangeKind::Update { after, .. } = &change.kind {
            if has_unchanged(after) && table.primary_key.iter().any(|&index| matches!(after[index], Value::Unchanged)) {
                return Err(unchanged_lost(table, after, "the key is among them"));
            }
        }
        if table.primary_key.is_empty() {
            if let ChangeKind::Update { after, .. } = &change.kind {
                if has_unchanged(after) {
                    return Err(unchanged_lost(table, after, "the table has no key to keep them by"));
                }
            }
            // Rows known by their values: the copies that came and went, whatever the mode (the
            // stream applies a keyless table's changes only past its copy).
            let copies = &mut self.tables[position];
            let dirty = mode == ApplyMode::Dirty;
            match change.kind {
                ChangeKind::Insert { after } => copies.count(after, 1, dirty, transaction),
                ChangeKind::Delete { before } => copies.count(before, -1, dirty, transaction),
                ChangeKind::Update { before, after } => {
                    copies.count(before, -1, dirty, transaction);
                    copies.count(after, 1, dirty, transaction);
                }
            }
            return Ok(());
        }
        let key_of = |row: &Row| -> Row { table.primary_key.iter().map(|&index| row[index].clone()).collect() };
        let table_changes = &mut self.tables[position];
        let inconsistent = |what: &str, row: &Row| {
            Error::new(
                ErrorKind::Conflict,
                format!("{what} of table {} ({}) contradicts the changes before it", table.name, key_text(table, row)),
            )
            .on(Side::Source)
        };
        match change.kind {
            ChangeKind::Insert { after } => {
                let (entry, _) = table_changes.entry(key_of(&after), false, mode, transaction);
                if entry.row.is_some() && mode == ApplyMode::Strict {
                    return Err(inconsistent("an insert", &after));
                }
                entry.row = Some(after);
            }
            ChangeKind::Delete { before } => {
                let (entry, made) = table_changes.entry(key_of(&before), true, mode, transaction);
                if entry.row.is_none() && mode == ApplyMode::Strict {
                    return Err(inconsistent("a delete", &before));
                }
                entry.row = None;
                if made {
                    entry.before = Some(before);
                }
            }
            ChangeKind::Update { before, after } => {
                let (old_key, new_key) = (key_of(&before), key_of(&after));
                let mut after = after;
                if old_key != new_key {
                    let (entry, made) = table_changes.entry(old_key, true, mode, transaction);
                    if entry.row.is_none() && mode == ApplyMode::Strict {
                        return Err(inconsistent("an update", &before));
                    }
                    match &entry.row {
                        Some(earlier) if !made => fill_unchanged(&mut after, earlier),
                        _ if has_unchanged(&after) => {
                            return Err(unchanged_lost(table, &after, "the update moved the row to another key"))
                        }
                        _ => {}
                    }
                    entry.row = None;
                    if made {
                        entry.before = Some(before);
                    }
                    let (entry, _) = table_changes.entry(new_key, false, mode, transaction);
                    if entry.row.is_some() && mode == ApplyMode::Strict {
                        return Err(inconsistent("an update", &after));
                    }
                    entry.row = Some(after);
                } else {
                    let (entry, made) = table_changes.entry(new_key, true, mode, transaction);
                    if entry.row.is_none() && mode == ApplyMode::Strict {
                        return Err(inconsistent("an update", &before));
                    }
                    if let (Some(earlier), false) = (&entry.row, made) {
                        fill_unchanged(&mut after, earlier);
                    }
                    entry.row = Some(after);
                    if made {
                        entry.before = Some(before);
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies the folded changes inside the writer's open transaction: first every table's
    /// deletes, then the updates in place (rows that keep values the log did not carry, and
    /// rows there before and after the group where the writer prefers it), then every table's
    /// inserts, so a unique key moved from one row to another within the group
    /// does not collide. Keys folded in `Replay` or `Dirty` mode are deleted whether
    /// or not the target has them; the others must be there. `target` maps a table to the one
    /// its rows are written into (a hidden copy's name). Leaves the fold empty.
    pub async fn apply(
        &mut self,
        writer: &mut dyn FoldedChangeWriter,
        target: &mut (dyn FnMut(&Arc<TableSchema>) -> Arc<TableSchema> + Send),
    ) -> Result<Applied> {
        let tables = std::mem::take(&mut self.tables);
        let applied = std::mem::take(&mut self.changes);
        let targets: Vec<Arc<TableSchema>> = tables.iter().map(|table| target(&table.table)).collect();
        let in_place = rows_in_place(writer.updates_in_place(), &tables, &targets);
        let orphans_possible = writer.writes_outlive_failed_commits();
        let mut refused_rows = Vec::new();
        for ((changes, target), in_place) in tables.iter().zip(&targets).zip(&in_place) {
            delete_replaced(writer, changes, target, in_place, orphans_possible).await?;
        }
        for ((changes, target), in_place) in tables.iter().zip(&targets).zip(&in_place) {
            update_in_place(writer, changes, target, in_place, &mut refused_rows).await?;
        }
        for ((changes, target), in_place) in tables.into_iter().zip(&targets).zip(in_place) {
            insert_new(writer, changes, target, &in_place, &mut refused_rows).await?;
        }
        Ok(Applied { changes: applied.saturating_sub(refused_rows.len()), refused: refused_rows })
    }
}

/// Per table and entry: a row updated in place, not replaced (judged once, used by the three
/// passes of `apply`): one that keeps values the log did not carry, and where the writer prefers
/// it (`updates_in_place`), one that was there before the group and is there after it.
fn rows_in_place(updates_in_place: bool, tables: &[TableChanges], targets: &[Arc<TableSchema>]) -> Vec<Vec<bool>> {
    tables
        .iter()
        .zip(targets)
        .map(|(table, target)| {
            let whole =
                updates_in_place && !target.primary_key.is_empty() && !target.indexes.iter().any(|index| index.unique);
            table
                .entries
                .iter()
                .map(|entry| {
                    entry
                        .row
                        .as_ref()
                        .is_some_and(|row| has_unchanged(row) || (whole && entry.existed && !entry.by_key))
                })
                .collect()
        })
        .collect()
}

/// `apply`'s first pass for one table: the rows that go or are replaced are deleted (those that
/// were there before the group must be there; those applied by key may not). Where a failed
/// commit's rows may be left in the target (`orphans_possible`), a key the group found absent
/// and leaves absent is deleted too, by key.
async fn delete_replaced(
    writer: &mut dyn FoldedChangeWriter,
    changes: &TableChanges,
    target: &TableSchema,
    in_place: &[bool],
    orphans_possible: bool,
) -> Result<()> {
    if !changes.copies.is_empty() {
        // A keyless table: one matching row per copy that went, each must exist (unless it is
        // dirty).
        for dirty in [false, true] {
            let gone: Vec<Row> = copies(&changes.copies, |copies| copies.dirty == dirty, |count| -count);
            if !gone.is_empty() {
                writer.delete(target, &gone, !dirty).await?;
            }
        }
        return Ok(());
    }
    let replaced = || changes.entries.iter().zip(in_place).filter(|(_, in_place)| !**in_place);
    let strict: Vec<Row> =
        replaced().filter(|(entry, _)| entry.existed && !entry.by_key).map(|(entry, _)| entry.key.clone()).collect();
    if !strict.is_empty() {
        writer.delete(target, &strict, true).await?;
    }
    // A key the group found absent and leaves absent: a failed commit may have left its row.
    let orphan = |entry: &Entry| orphans_possible && !entry.existed && entry.row.is_none();
    let by_key: Vec<Row> =
        replaced().filter(|(entry, _)| entry.by_key || orphan(entry)).map(|(entry, _)| entry.key.clone()).collect();
    if !by_key.is_empty() {
        writer.delete(target, &by_key, false).await?;
    }
    Ok(())
}

/// `apply`'s second pass for one table: the rows updated in place; a refused one goes and is
/// kept in `refused_rows`.
async fn update_in_place(
    writer: &mut dyn FoldedChangeWriter,
    changes: &TableChanges,
    target: &TableSchema,
    in_place: &[bool],
    refused_rows: &mut Vec<Refusal>,
) -> Result<()> {
    let (mut updated, entries): (Vec<Row>, Vec<&Entry>) = changes
        .entries
        .iter()
        .zip(in_place)
        .filter_map(|(entry, in_place)| Some((entry.row.clone().filter(|_| *in_place)?, entry)))
        .unzip();
    if updated.is_empty() {
        return Ok(());
    }
    let outcome = writer.update(target, &updated).await?;
    // A row applied by key that the target lacks is left to the later changes of the key (a
    // replay window: the copy read it after a delete the stream has yet to apply).
    let missing: Vec<usize> = outcome.missing.into_iter().filter(|&index| !entries[index].by_key).collect();
    if let Some(&index) = missing.iter().find(|&&index| has_unchanged(&updated[index])) {
        return Err(unchanged_lost(target, &updated[index], "the target has no row of this key"));
    }
    if !missing.is_empty() {
        let keys: Vec<&Row> = missing.iter().map(|&index| &entries[index].key).collect();
        return Err(missing_rows(target, &keys));
    }
    // A refused row goes, as when its new image is refused on insert: the target holds no row
    // the source no longer has, and the dirty record holds both.
    let gone: Vec<Row> = outcome.refused.iter().map(|refusal| entries[refusal.index].key.clone()).collect();
    if !gone.is_empty() {
        writer.delete(target, &gone, false).await?;
    }
    for refusal in outcome.refused {
        let entry = entries[refusal.index];
        refused_rows.push(Refusal {
            table: changes.table.clone(),
            before: entry.before.clone(),
            after: std::mem::take(&mut updated[refusal.index]),
            transaction: entry.transaction,
            reason: refusal.reason,
        });
    }
    Ok(())
}

/// `apply`'s last pass for one table: every new row (copies of a keyless table's rows, and the
/// rows not updated in place); a refused one is kept in `refused_rows`.
async fn insert_new(
    writer: &mut dyn FoldedChangeWriter,
    changes: TableChanges,
    target: &TableSchema,
    in_place: &[bool],
    refused_rows: &mut Vec<Refusal>,
) -> Result<()> {
    let mut rows: Vec<Row> = copies(&changes.copies, |_| true, |count| count);
    // What each row refused would be kept with: the row before, the transaction.
    let mut origins: Vec<(Option<Row>, usize)> = changes
        .copies
        .iter()
        .flat_map(|copies| std::iter::repeat_n((None, copies.transaction), copies.count.max(0) as usize))
        .collect();
    for (entry, in_place) in changes.entries.into_iter().zip(in_place) {
        if let Some(row) = entry.row.filter(|_| !in_place) {
            rows.push(row);
            origins.push((entry.before, entry.transaction));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    for refusal in writer.insert(target, &rows).await? {
        let (before, transaction) = std::mem::take(&mut origins[refusal.index]);
        refused_rows.push(Refusal {
            table: changes.table.clone(),
            before,
            after: std::mem::take(&mut rows[refusal.index]),
            transaction,
            reason: refusal.reason,
        });
    }
    Ok(())
}

/// Each row of `counted` that `chosen` takes, repeated as many times as `wanted` of its count
/// says (none when not positive).
fn copies(counted: &[Copies], chosen: impl Fn(&Copies) -> bool, wanted: impl Fn(i64) -> i64) -> Vec<Row> {
    counted
        .iter()
        .filter(|copies| chosen(copies))
        .flat_map(|copies| std::iter::repeat_n(&copies.row, wanted(copies.count).max(0) as usize))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::connector::{ChangeWriter, Checkpoint, Refused, Updated};
    use crate::schema::{Column, DataType, TableName};
    use crate::value::Value;

    fn table() -> Arc<TableSchema> {
        let column = |name: &str| Column::new(name, DataType::Integer { bytes: 8, unsigned: false }, false);
        Arc::new(TableSchema {
            name: TableName::parse("db.t"),
            columns: vec![column("id"), column("v")],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        })
    }

    fn row(id: i64, v: i64) -> Row {
        vec![Value::Int(id), Value::Int(v)]
    }

    /// A target table in memory that enforces what the real targets enforce.
    #[derive(Default)]
    struct MemoryTarget {
        rows: std::collections::BTreeMap<i64, i64>,
        statements: usize,
        /// Prefers updates in place (`FoldedChangeWriter::updates_in_place`), and counts them.
        in_place: bool,
        updates: usize,
        /// Keeps rows of a failed commit (`FoldedChangeWriter::writes_outlive_failed_commits`).
        keeps_failed: bool,
    }

    fn id(key: &Row) -> i64 {
        match key[0] {
            Value::Int(id) => id,
            _ => unreachable!("test keys are integers"),
        }
    }

    #[async_trait]
    impl ChangeWriter for MemoryTarget {
        async fn recover(&mut self) -> Result<Option<Checkpoint>> {
            Ok(None)
        }
        async fn commit(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
            Ok(())
        }
        async fn apply_schema_change(&mut self, change: &crate::connector::SchemaChange) -> Result<()> {
            unreachable!("no DDL here: {change:?}")
        }
    }

    #[async_trait]
    impl FoldedChangeWriter for MemoryTarget {
        async fn delete(&mut self, _table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()> {
            self.statements += 1;
            for key in keys {
                if self.rows.remove(&id(key)).is_none() && expect_all {
                    return Err(Error::new(ErrorKind::Conflict, format!("id={} is missing", id(key))));
                }
            }
            Ok(())
        }
        /// Refuses a negative value, as a column with a CHECK would.
        async fn insert(&mut self, _table: &TableSchema, rows: &[Row]) -> Result<Vec<Refused>> {
            self.statements += 1;
            let mut refused = Vec::new();
            for (index, row) in rows.iter().enumerate() {
                let value = match row[1] {
                    Value::Int(value) => value,
                    _ => unreachable!(),
                };
                if value < 0 {
                    refused.push(Refused { index, reason: "column v: negative".into() });
                    continue;
                }
                if self.rows.insert(id(row), value).is_some() {
                    return Err(Error::new(ErrorKind::Conflict, format!("id={} exists", id(row))));
                }
            }
            Ok(refused)
        }
        /// Refuses a negative value as `insert` does; the row keeps its value.
        async fn update(&mut self, _table: &TableSchema, rows: &[Row]) -> Result<Updated> {
            self.statements += 1;
            let mut outcome = Updated::default();
            for (index, row) in rows.iter().enumerate() {
                match (self.rows.get_mut(&id(row)), &row[1]) {
                    (None, _) => outcome.missing.push(index),
                    (Some(_), Value::Int(new)) if *new < 0 => {
                        outcome.refused.push(Refused { index, reason: "column v: negative".into() })
                    }
                    (Some(value), Value::Int(new)) => {
                        *value = *new;
                        self.updates += 1;
                    }
                    (Some(_), _) => {}
                }
            }
            Ok(outcome)
        }
        fn updates_in_place(&self) -> bool {
            self.in_place
        }
        fn writes_outlive_failed_commits(&self) -> bool {
            self.keeps_failed
        }
        async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()> {
            unreachable!("nothing hidden here: {tables:?}")
        }
        async fn rows_by_key(&mut self, _table: &TableSchema, keys: &[Row]) -> Result<Vec<Row>> {
            Ok(keys.iter().filter_map(|key| self.rows.get(&id(key)).map(|value| row(id(key), *value))).collect())
        }
    }

    #[tokio::test]
    async fn conflicts_are_judged_against_the_target_rows_and_settled_by_the_policy() {
        use crate::spec::ConflictPolicy;
        let change = |kind| Change { table: table(), kind };
        let changes = || {
            vec![
                change(ChangeKind::Update { before: row(1, 10), after: row(1, 11) }),
                // The target holds 20: someone else changed the row.
                change(ChangeKind::Update { before: row(2, 15), after: row(2, 16) }),
                change(ChangeKind::Insert { after: row(4, 40) }),
                // The target has a row of this key already.
                change(ChangeKind::Insert { after: row(3, 33) }),
                // Gone already: nothing to do, no conflict.
                change(ChangeKind::Delete { before: row(5, 50) }),
            ]
        };
        let settle = |policy: ConflictPolicy| async move {
            let mut target = MemoryTarget::default();
            target.rows.extend([(1, 10), (2, 20), (3, 30)]);
            let mut net = NetChanges::default();
            for change in changes() {
                net.add(change, ApplyMode::Strict)?;
            }
            let conflicts = net.settle_conflicts(&mut target, &mut |table| table.clone(), &policy).await?;
            net.apply(&mut target, &mut |table| table.clone()).await?;
            let winners: Vec<(i64, Winner)> =
                conflicts.iter().map(|conflict| (id(conflict.some_row()), conflict.winner)).collect();
            Ok::<_, Error>((target.rows.into_iter().collect::<Vec<_>>(), winners))
        };
        let (rows, winners) = settle(ConflictPolicy::SourceWins).await.unwrap();
        assert_eq!(rows, [(1, 11), (2, 16), (3, 33), (4, 40)]);
        assert_eq!(winners, [(2, Winner::Source), (3, Winner::Source)]);
        let (rows, winners) = settle(ConflictPolicy::TargetWins).await.unwrap();
        assert_eq!(rows, [(1, 11), (2, 20), (3, 30), (4, 40)]);
        assert_eq!(winners, [(2, Winner::Target), (3, Winner::Target)]);
        // Dated by v: the source's 16 is older than the target's 20, its 33 newer than 30.
        let (rows, winners) = settle(ConflictPolicy::NewerWins("v".into())).await.unwrap();
        assert_eq!(rows, [(1, 11), (2, 20), (3, 33), (4, 40)]);
        assert_eq!(winners, [(2, Winner::Target), (3, Winner::Source)]);
        let stopped = settle(ConflictPolicy::Stop).await.unwrap_err().to_string();
        assert!(stopped.contains("db.t (id=2): conflict"), "{stopped}");
        assert!(stopped.contains(r#"{"id": 2, "v": 20}"#) && stopped.contains(r#"{"id": 2, "v": 16}"#), "{stopped}");
        let unknown = settle(ConflictPolicy::NewerWins("changed_at".into())).await.unwrap_err().to_string();
        assert!(unknown.contains("`changed_at` is not a column of target table db.t"), "{unknown}");
    }

    async fn apply(target: &mut MemoryTarget, changes: Vec<Change>, mode: ApplyMode) -> Result<()> {
        let mut net = NetChanges::default();
        for change in changes {
            net.add(change, mode)?;
        }
        net.apply(target, &mut |table| table.clone()).await.map(|_| ())
    }

    fn insert(id: i64, v: i64) -> Change {
        Change::insert(table(), row(id, v))
    }

    #[tokio::test]
    async fn a_group_folds_to_the_end_state_in_two_statements() {
        let table = table();
        let mut target = MemoryTarget::default();
        target.rows.extend([(1, 10), (2, 20), (3, 30)]);
        let update =
            |before: Row, after: Row| Change { table: table.clone(), kind: ChangeKind::Update { before, after } };
        let changes = vec![
            Change { table: table.clone(), kind: ChangeKind::Insert { after: row(4, 40) } },
            update(row(1, 10), row(1, 11)),
            update(row(1, 11), row(1, 12)),
            Change { table: table.clone(), kind: ChangeKind::Delete { before: row(2, 20) } },
            // A primary-key change: 3 moves to 5, then 4 takes over the freed 3.
            update(row(3, 30), row(5, 31)),
            update(row(4, 40), row(3, 41)),
            Change { table: table.clone(), kind: ChangeKind::Insert { after: row(2, 22) } },
        ];
        apply(&mut target, changes, ApplyMode::Strict).await.unwrap();
        assert_eq!(target.rows.into_iter().collect::<Vec<_>>(), vec![(1, 12), (2, 22), (3, 41), (5, 31)]);
        assert_eq!(target.statements, 2);
    }

    /// A key a group inserts and deletes folds into nothing, unless the writer's rows outlive a
    /// failed commit: a run that wrote the insert and crashed before its checkpoint left the row,
    /// and the group run again must delete it (as ClickHouse, through a kill or a fenced worker).
    #[tokio::test]
    async fn a_key_inserted_and_deleted_in_a_group_is_deleted_where_a_failed_commit_left_rows() {
        let changes =
            || vec![insert(7, 70), Change { table: table(), kind: ChangeKind::Delete { before: row(7, 70) } }];
        let mut transactional = MemoryTarget::default();
        apply(&mut transactional, changes(), ApplyMode::Strict).await.unwrap();
        assert_eq!(transactional.statements, 0, "nothing to write where a failed commit left nothing");
        // The row a crashed run sent before its checkpoint.
        let mut kept = MemoryTarget { keeps_failed: true, ..MemoryTarget::default() };
        kept.rows.insert(7, 70);
        apply(&mut kept, changes(), ApplyMode::Strict).await.unwrap();
        assert!(kept.rows.is_empty(), "the failed commit's row outlived the replay: {:?}", kept.rows);
    }

    /// A writer that prefers updates in place gets the keys there before and after the group
    /// as one update; keys that came, went or moved are still deleted and inserted. A row it
    /// refuses goes and is a refusal; a key it lacks stops the stream; a table with
    /// a unique index besides its key is never updated in place.
    #[tokio::test]
    async fn rows_there_before_and_after_a_group_are_updated_in_place_where_the_writer_prefers_it() {
        let table = table();
        let update =
            |before: Row, after: Row| Change { table: table.clone(), kind: ChangeKind::Update { before, after } };
        let changes = || {
            vec![
                insert(4, 40),
                update(row(1, 10), row(1, 11)),
                update(row(1, 11), row(1, 12)),
                Change { table: table.clone(), kind: ChangeKind::Delete { before: row(2, 20) } },
                Change { table: table.clone(), kind: ChangeKind::Insert { after: row(2, 22) } },
                update(row(3, 30), row(5, 31)),
            ]
        };
        let mut target = MemoryTarget { in_place: true, ..MemoryTarget::default() };
        target.rows.extend([(1, 10), (2, 20), (3, 30)]);
        apply(&mut target, changes(), ApplyMode::Strict).await.unwrap();
        assert_eq!(
            target.rows.iter().map(|(id, v)| (*id, *v)).collect::<Vec<_>>(),
            [(1, 12), (2, 22), (4, 40), (5, 31)]
        );
        assert_eq!((target.statements, target.updates), (3, 2), "keys 1 and 2 updated, 3 deleted, 4 and 5 inserted");

        let mut target = MemoryTarget { in_place: true, ..MemoryTarget::default() };
        target.rows.insert(1, 10);
        let mut net = NetChanges::default();
        net.add(update(row(1, 10), row(1, -1)), ApplyMode::Strict).unwrap();
        let applied = net.apply(&mut target, &mut |table| table.clone()).await.unwrap();
        let [refusal] = applied.refused.as_slice() else { panic!("{:?}", applied.refused) };
        assert_eq!((&refusal.before, &refusal.after), (&Some(row(1, 10)), &row(1, -1)));
        assert!(target.rows.is_empty(), "the refused key's row is gone, as when an insert is refused");

        let mut target = MemoryTarget { in_place: true, ..MemoryTarget::default() };
        let error = apply(&mut target, vec![update(row(7, 70), row(7, 71))], ApplyMode::Strict).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Conflict, "{error}");
        assert!(error.to_string().contains("missing in the target (id=7)"), "{error}");

        let unique = Arc::new(TableSchema {
            indexes: vec![crate::schema::Index { name: "by_v".into(), columns: vec![1], unique: true }],
            ..(*table).clone()
        });
        let mut target = MemoryTarget { in_place: true, ..MemoryTarget::default() };
        target.rows.extend([(1, 10), (2, 20)]);
        let swap = vec![
            Change { table: unique.clone(), kind: ChangeKind::Update { before: row(1, 10), after: row(1, 20) } },
            Change { table: unique.clone(), kind: ChangeKind::Update { before: row(2, 20), after: row(2, 10) } },
        ];
        apply(&mut target, swap, ApplyMode::Strict).await.unwrap();
        assert_eq!(target.rows.iter().map(|(id, v)| (*id, *v)).collect::<Vec<_>>(), [(1, 20), (2, 10)]);
        assert_eq!(target.updates, 0, "two rows swapping a unique value are deleted and inserted");
    }

    /// A row the target refuses is left out (the key's row before it goes) with what its dirty
    /// record shows: the row before the group and the transaction that changed it last. The
    /// key's later changes, folded as `Dirty`, apply on top of what the target has, while the
    /// group's other keys stay strict.
    /// A row whose update left a value unchanged and unsent: filled from an earlier image of the
    /// key in the group, else updated in place so the target keeps its value.
    #[tokio::test]
    async fn values_an_update_left_unsent_come_from_the_group_or_stay_as_the_target_has_them() {
        let table = table();
        let update = |before, after| Change { table: table.clone(), kind: ChangeKind::Update { before, after } };
        let kept = |id| vec![Value::Int(id), Value::Unchanged];
        let mut target = MemoryTarget::default();
        target.rows.extend([(1, 10), (2, 20)]);
        let changes = vec![
            // The first change of key 1 in the group: its row is updated in place.
            update(row(1, 10), kept(1)),
            // Key 3 is inserted in the group, then updated: its value comes from the insert.
            insert(3, 30),
            update(row(3, 30), kept(3)),
            // Key 2 is updated twice: the second update's unsent value is the first one's.
            update(row(2, 20), row(2, 21)),
            update(row(2, 21), kept(2)),
        ];
        apply(&mut target, changes, ApplyMode::Strict).await.unwrap();
        assert_eq!(target.rows.iter().map(|(id, v)| (*id, *v)).collect::<Vec<_>>(), vec![(1, 10), (2, 21), (3, 30)]);

        // The target lacks the row: strict, the stream stops naming the table, key and column;
        // by key (a replay window), the row is left to the key's later changes.
        let mut target = MemoryTarget::default();
        let error = apply(&mut target, vec![update(row(7, 70), kept(7))], ApplyMode::Strict).await.unwrap_err();
        let message = error.to_string();
        assert!(message.contains("db.t (id=7)") && message.contains("left v unchanged"), "{message}");
        assert!(message.contains("REPLICA IDENTITY FULL"), "{message}");
        apply(&mut target, vec![update(row(7, 70), kept(7))], ApplyMode::Replay).await.unwrap();
        assert!(target.rows.is_empty());

        // A row moved to another key cannot keep a value the target holds under the old key.
        let mut target = MemoryTarget::default();
        target.rows.insert(8, 80);
        let error = apply(&mut target, vec![update(row(8, 80), kept(9))], ApplyMode::Strict).await.unwrap_err();
        assert!(error.to_string().contains("moved the row to another key"), "{error}");
    }

    #[tokio::test]
    async fn a_refused_row_is_left_out_and_its_key_later_applies_on_top_of_the_target() {
        let table = table();
        let update = |before, after| Change { table: table.clone(), kind: ChangeKind::Update { before, after } };
        let held = |target: &MemoryTarget| target.rows.iter().map(|(id, v)| (*id, *v)).collect::<Vec<_>>();
        let mut target = MemoryTarget::default();
        target.rows.insert(1, 10);
        let mut net = NetChanges::default();
        net.add(insert(2, 20), ApplyMode::Strict).unwrap();
        net.end_transaction();
        net.add(update(row(1, 10), row(1, 5)), ApplyMode::Strict).unwrap();
        net.add(update(row(1, 5), row(1, -1)), ApplyMode::Strict).unwrap();
        let applied = net.apply(&mut target, &mut |table| table.clone()).await.unwrap();
        assert_eq!(applied.changes, 2, "three changes, one refused row");
        let [refusal] = applied.refused.as_slice() else { panic!("{:?}", applied.refused) };
        assert_eq!(
            (&refusal.before, &refusal.after, refusal.transaction, refusal.reason.as_str()),
            (&Some(row(1, 10)), &row(1, -1), 1, "column v: negative")
        );
        assert_eq!(held(&target), vec![(2, 20)], "the refused key's row is gone");
        net.end_group();

        // Key 1 changes again: strict, its update would find no row.
        net.add(update(row(1, -1), row(1, 11)), ApplyMode::Dirty).unwrap();
        net.add(insert(3, 30), ApplyMode::Strict).unwrap();
        let applied = net.apply(&mut target, &mut |table| table.clone()).await.unwrap();
        assert!(applied.refused.is_empty());
        assert_eq!(held(&target), vec![(1, 11), (2, 20), (3, 30)]);
        let error = apply(&mut target, vec![insert(3, 31)], ApplyMode::Strict).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Conflict, "the other keys stay strict");
    }

    #[tokio::test]
    async fn strict_mode_stops_at_a_target_that_differs() {
        let mut target = MemoryTarget::default();
        target.rows.insert(1, 10);
        let error = apply(&mut target, vec![insert(1, 10)], ApplyMode::Strict).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Conflict);
        let delete = Change { table: table(), kind: ChangeKind::Delete { before: row(9, 0) } };
        let error = apply(&mut MemoryTarget::default(), vec![delete], ApplyMode::Strict).await.unwrap_err();
        assert!(error.to_string().contains("id=9"), "{error}");
    }

    #[tokio::test]
    async fn replay_converges_whatever_the_snapshot_already_holds() {
        let table = table();
        // The snapshot read row 1 after its update and never saw row 2, deleted before it read.
        let mut target = MemoryTarget::default();
        target.rows.insert(1, 11);
        let changes = vec![
            insert(1, 10),
            Change { table: table.clone(), kind: ChangeKind::Update { before: row(1, 10), after: row(1, 11) } },
            insert(2, 20),
            Change { table: table.clone(), kind: ChangeKind::Delete { before: row(2, 20) } },
            insert(3, 30),
        ];
        apply(&mut target, changes, ApplyMode::Replay).await.unwrap();
        assert_eq!(target.rows.into_iter().collect::<Vec<_>>(), vec![(1, 11), (3, 30)]);
    }

    /// A random source history on five keys (inserts, updates, key moves, deletes), cut into
    /// groups of random sizes: folding each group and applying it must leave the target exactly
    /// where applying the changes one by one leaves the source, for a thousand histories; and so
    /// must replaying the whole history over a copy that read each key at a different moment.
    #[tokio::test]
    async fn folded_groups_end_where_the_changes_one_by_one_do() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |bound: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % bound
        };
        let table = table();
        for _ in 0..1_000 {
            let mut source = std::collections::BTreeMap::<i64, i64>::new();
            let mut target = MemoryTarget::default();
            let mut group = Vec::new();
            let mut history = vec![source.clone()];
            let mut all: Vec<Change> = Vec::new();
            for step in 0..40 {
                let key = next(5) as i64;
                let value = step as i64;
                let change = match (source.get(&key).copied(), next(3)) {
                    (None, _) => {
                        source.insert(key, value);
                        Change::insert(table.clone(), row(key, value))
                    }
                    (Some(old), 0) => {
                        source.remove(&key);
                        Change { table: table.clone(), kind: ChangeKind::Delete { before: row(key, old) } }
                    }
                    (Some(old), 1) => {
                        let moved = next(5) as i64;
                        if source.contains_key(&moved) {
                            continue;
                        }
                        source.remove(&key);
                        source.insert(moved, value);
                        Change {
                            table: table.clone(),
                            kind: ChangeKind::Update { before: row(key, old), after: row(moved, value) },
                        }
                    }
                    (Some(old), _) => {
                        source.insert(key, value);
                        Change {
                            table: table.clone(),
                            kind: ChangeKind::Update { before: row(key, old), after: row(key, value) },
                        }
                    }
                };
                all.push(change.clone());
                group.push(change);
                history.push(source.clone());
                if next(4) == 0 {
                    apply(&mut target, std::mem::take(&mut group), ApplyMode::Strict).await.unwrap();
                }
            }
            apply(&mut target, group, ApplyMode::Strict).await.unwrap();
            assert_eq!(target.rows, source);
            // A copy that read each key at its own moment of the history, then every change
            // replayed from the history's start: the replay converges on the source too.
            let mut copy = MemoryTarget::default();
            for key in 0..5 {
                let moment = &history[next(history.len() as u64) as usize];
                if let Some(value) = moment.get(&key) {
                    copy.rows.insert(key, *value);
                }
            }
            let mut replayed = Vec::new();
            for change in all.drain(..) {
                replayed.push(change);
                if next(3) == 0 {
                    apply(&mut copy, std::mem::take(&mut replayed), ApplyMode::Replay).await.unwrap();
                }
            }
            apply(&mut copy, replayed, ApplyMode::Replay).await.unwrap();
            assert_eq!(copy.rows, source);
        }
    }

    /// A keyless table in memory: a multiset, one matching row deleted per key.
    #[derive(Default)]
    struct KeylessTarget {
        rows: Vec<Row>,
    }

    #[async_trait]
    impl ChangeWriter for KeylessTarget {
        async fn recover(&mut self) -> Result<Option<Checkpoint>> {
            Ok(None)
        }
        async fn commit(&mut self, _checkpoint: &Checkpoint) -> Result<()> {
            Ok(())
        }
        async fn apply_schema_change(&mut self, change: &crate::connector::SchemaChange) -> Result<()> {
            unreachable!("no DDL here: {change:?}")
        }
    }

    #[async_trait]
    impl FoldedChangeWriter for KeylessTarget {
        async fn delete(&mut self, _table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()> {
            for key in keys {
                match self.rows.iter().position(|row| row == key) {
                    Some(index) => drop(self.rows.remove(index)),
                    None if expect_all => return Err(Error::new(ErrorKind::Conflict, format!("{key:?} is missing"))),
                    None => {}
                }
            }
            Ok(())
        }
        async fn insert(&mut self, _table: &TableSchema, rows: &[Row]) -> Result<Vec<Refused>> {
            self.rows.extend(rows.iter().cloned());
            Ok(Vec::new())
        }
        async fn update(&mut self, _table: &TableSchema, rows: &[Row]) -> Result<Updated> {
            unreachable!("a keyless table's update is a delete and an insert: {rows:?}")
        }
        async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()> {
            unreachable!("nothing hidden here: {tables:?}")
        }
    }

    #[tokio::test]
    async fn a_keyless_table_folds_as_a_multiset_and_duplicates_stay_duplicates() {
        let keyless = Arc::new(TableSchema { primary_key: Vec::new(), ..(*table()).clone() });
        let insert = |v| Change::insert(keyless.clone(), row(1, v));
        let delete = |v| Change { table: keyless.clone(), kind: ChangeKind::Delete { before: row(1, v) } };
        let update = |from, to| Change {
            table: keyless.clone(),
            kind: ChangeKind::Update { before: row(1, from), after: row(1, to) },
        };
        let mut target = KeylessTarget { rows: vec![row(1, 1), row(1, 1), row(1, 2)] };
        let mut net = NetChanges::default();
        // Of two equal rows one goes; one is updated and back again; a duplicate comes.
        for change in [delete(1), update(2, 3), update(3, 2), insert(4), insert(4), delete(4)] {
            net.add(change, ApplyMode::Replay).unwrap();
        }
        net.apply(&mut target, &mut |table| table.clone()).await.unwrap();
        target.rows.sort_by_key(|row| format!("{row:?}"));
        assert_eq!(target.rows, vec![row(1, 1), row(1, 2), row(1, 4)]);
        // A row that is not there to delete stops the stream, replay or not; unless it is dirty
        // (a change that wrote it was left out).
        let mut net = NetChanges::default();
        net.add(delete(9), ApplyMode::Dirty).unwrap();
        net.apply(&mut target, &mut |table| table.clone()).await.unwrap();
        net.add(delete(9), ApplyMode::Replay).unwrap();
        let error = net.apply(&mut target, &mut |table| table.clone()).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Conflict);
    }
}
