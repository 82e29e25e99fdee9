//! Conflicts: a folded change whose key the target holds otherwise than the change found it at
//! the source (the other side of a two-way pair changed the row, or a hand on the target did).
//! Judged against the target's rows, read and locked in the group's transaction, before the
//! group is written; settled by the job's `conflict:` policy.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use super::{has_unchanged, NetChanges};
use crate::change::{key_text, Row};
use crate::connector::FoldedChangeWriter;
use crate::error::{Error, ErrorKind, Result, Side};
use crate::schema::TableSchema;
use crate::spec::ConflictPolicy;
use crate::value::Value;

/// Which row a conflict left in the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Winner {
    Source,
    Target,
}

/// One conflict, settled: both rows and which one stays.
#[derive(Debug, Clone)]
pub(crate) struct Conflict {
    /// The target table, under its own name.
    pub table: Arc<TableSchema>,
    /// The row as the source's change found it (`None`: the change inserted it).
    pub expected: Option<Row>,
    /// The row as the source's change left it (`None`: the change deleted it).
    pub source: Option<Row>,
    /// The row the target held instead (`None`: no row).
    pub target: Option<Row>,
    pub winner: Winner,
    /// The group's transaction that changed the key last.
    pub transaction: usize,
}

impl Conflict {
    /// Any image of the row: its key is the conflict's.
    pub fn some_row(&self) -> &Row {
        self.source.as_ref().or(self.expected.as_ref()).or(self.target.as_ref()).expect("a conflict has a row")
    }
}

impl NetChanges {
    /// Reads the target's rows under the group's keys and settles every key whose row is
    /// neither where the source's change found it nor where it left it, by `policy`: the
    /// source's row goes in over the target's (its key applied whatever the target holds), or
    /// the key's changes are taken out of the group. A key already where the change left it is
    /// taken out too (nothing to do). Keys applied by key (a replay window, a dirty key) and
    /// tables without a primary key are not judged. `stop` fails on the first conflict, naming
    /// the table, the key and both rows.
    pub(crate) async fn settle_conflicts(
        &mut self,
        writer: &mut dyn FoldedChangeWriter,
        target: &mut (dyn FnMut(&Arc<TableSchema>) -> Arc<TableSchema> + Send),
        policy: &ConflictPolicy,
    ) -> Result<Vec<Conflict>> {
        let mut conflicts = Vec::new();
        for changes in &mut self.tables {
            let schema = target(&changes.table);
            let judged: Vec<usize> = (0..changes.entries.len())
                .filter(|&index| {
                    let entry = &changes.entries[index];
                    !entry.by_key
                        && (!entry.existed || entry.before.is_some())
                        && !entry.row.as_ref().is_some_and(has_unchanged)
                })
                .collect();
            if schema.primary_key.is_empty() || judged.is_empty() {
                continue;
            }
            let keys: Vec<Row> = judged.iter().map(|&index| changes.entries[index].key.clone()).collect();
            let held: HashMap<String, Row> = writer
                .rows_by_key(&schema, &keys)
                .await?
                .into_iter()
                .map(|row| (format!("{:?}", key_of(&schema, &row)), row))
                .collect();
            let newer = match policy {
                ConflictPolicy::NewerWins(column) => Some(dating_column(&schema, column)?),
                _ => None,
            };
            let mut settled = vec![false; changes.entries.len()];
            for index in judged {
                let entry = &mut changes.entries[index];
                let now = held.get(&format!("{:?}", entry.key));
                let expected = if entry.existed { entry.before.as_ref() } else { None };
                if now == expected {
                    continue;
                }
                if now == entry.row.as_ref() {
                    settled[index] = true;
                    continue;
                }
                let winner = match (policy, newer) {
                    (ConflictPolicy::SourceWins, _) => Winner::Source,
                    (ConflictPolicy::TargetWins, _) => Winner::Target,
                    (ConflictPolicy::NewerWins(_), Some(column)) => newer_row(column, entry.row.as_ref(), now),
                    _ => return Err(stopped(&schema, expected, entry.row.as_ref(), now)),
                };
                match winner {
                    Winner::Source => entry.by_key = true,
                    Winner::Target => settled[index] = true,
                }
                conflicts.push(Conflict {
                    table: schema.clone(),
                    expected: expected.cloned(),
                    source: entry.row.clone(),
                    target: now.cloned(),
                    winner,
                    transaction: entry.transaction,
                });
            }
            if settled.iter().any(|settled| *settled) {
                let mut index = 0;
                changes.entries.retain(|_| {
                    index += 1;
                    !settled[index - 1]
                });
                changes.positions = changes
                    .entries
                    .iter()
                    .enumerate()
                    .map(|(index, entry)| (format!("{:?}", entry.key), index))
                    .collect();
            }
        }
        Ok(conflicts)
    }
}

fn key_of(table: &TableSchema, row: &Row) -> Row {
    table.primary_key.iter().map(|&index| row[index].clone()).collect()
}

/// The index of `newer_wins`' column in `table`.
fn dating_column(table: &TableSchema, column: &str) -> Result<usize> {
    table.columns.iter().position(|known| known.name.eq_ignore_ascii_case(column)).ok_or_else(|| {
        Error::new(
            ErrorKind::Config,
            format!("conflict: newer_wins: column `{column}` is not a column of target table {}", table.name),
        )
        .on(Side::Target)
        .hint("name a column every table of the job has that dates its rows (an updated_at kept by the application)")
    })
}

/// The side whose row dates later by `column`; the source on a tie, and when either side has no
/// row (nothing dates a deletion) or no date.
fn newer_row(column: usize, source: Option<&Row>, target: Option<&Row>) -> Winner {
    let (Some(source), Some(target)) = (source, target) else { return Winner::Source };
    let date = |row: &Row| row.get(column).filter(|value| !matches!(value, Value::Null)).cloned();
    match (date(source), date(target)) {
        (Some(source), Some(target)) => match crate::transform::expression::compare(&source, &target).ok().flatten() {
            Some(Ordering::Less) => Winner::Target,
            _ => Winner::Source,
        },
        (None, Some(_)) => Winner::Target,
        _ => Winner::Source,
    }
}

/// The error of `conflict: stop`.
fn stopped(table: &TableSchema, expected: Option<&Row>, source: Option<&Row>, target: Option<&Row>) -> Error {
    let row = source.or(expected).or(target).expect("a conflict has a row");
    let shown = |row: Option<&Row>| row.map_or_else(|| "no row".to_owned(), |row| crate::change::row_json(table, row));
    Error::new(
        ErrorKind::Conflict,
        format!(
            "table {} ({}): conflict: the change expected {} and the target holds {}; the source's row would be {}",
            table.name,
            key_text(table, row),
            shown(expected),
            shown(target),
            shown(source)
        ),
    )
    .on(Side::Target)
    .hint("the job says conflict: stop (the default of a two_way job): settle the row by hand and restart, or choose source_wins, target_wins or {newer_wins: COLUMN}")
}
