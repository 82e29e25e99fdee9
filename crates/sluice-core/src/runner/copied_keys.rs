//! Where the copy of a `snapshot+cdc` job read each key, so that the stream leaves out the
//! changes a copied row already holds.
//!
//! The stream starts at the position the job was planned at, before any split was read, and
//! each split is read later, in consistent snapshots at positions of their own
//! (`SnapshotSource::copy_reads`). A SQL target takes the changes in between idempotently (the replay
//! window); an event target cannot take anything back, so without this a consumer would see a
//! key's copied row followed by changes older than it. With it, each key's events are its
//! copied row and then exactly the changes after the read that copied it, in source order.
//!
//! A table read whole (no key) has one read that covers every row.
//!
//! A stream target whose events become visible before the checkpoint that covers them (NATS)
//! may hold some keys as an earlier, interrupted read left them (`HeldRows`): those keys take
//! that read's position, whatever the split's reads say.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use crate::change::{key_identity, Change, ChangeKind, Position, Row};
use crate::connector::{ChangeSource, CopyRead};
use crate::schema::{TableName, TableSchema};
use crate::value::Value;

/// The copy's reads of every table whose changes the stream may still meet in them.
#[derive(Debug, Default)]
pub(super) struct CopiedKeys {
    tables: HashMap<TableName, TableReads>,
    /// Tables with a split whose reads the source could not tell: none of their changes can be
    /// judged, so all are sent.
    unknown: HashSet<TableName>,
}

/// One table's reads, in key order, the keys held as an earlier read left them, and the latest position among them all: past it the copy holds none of the table's
/// changes.
#[derive(Debug, Default)]
struct TableReads {
    reads: Vec<CopyRead>,
    held: Vec<(HashSet<String>, Position)>,
    latest: Option<Position>,
}

impl TableReads {
    /// Whether the copy holds the change to `row` of the transaction starting at `at`.
    fn holds(&self, schema: &TableSchema, row: &Row, source: &dyn ChangeSource, at: &Position) -> bool {
        if !self.held.is_empty() {
            let identity = key_identity(schema, row);
            let mut reads = self.held.iter().filter(|(keys, _)| keys.contains(&identity)).peekable();
            if reads.peek().is_some() {
                // Held by two interrupted reads (two runs stopped in one window): the earlier
                // one counts, so no change is missing (one the later read holds may come again).
                return reads.all(|(_, as_of)| !source.reached(at, as_of));
            }
        }
        holds(&self.reads, &key_of(schema, row), source, at)
    }
}

impl CopiedKeys {
    /// Adds the reads of one split of `table` (in key order); none means the source cannot
    /// tell them.
    pub(super) fn add(&mut self, table: TableName, reads: Vec<CopyRead>) {
        if reads.is_empty() {
            self.unknown.insert(table);
        } else {
            self.tables.entry(table).or_default().reads.extend(reads);
        }
    }

    /// Makes `keys` of `table` (`change::key_identity`) read at `as_of`, whatever the reads say
    /// (`HeldRows`). Called after the table's reads are added.
    pub(super) fn hold(&mut self, table: TableName, keys: Vec<String>, as_of: Position) {
        if let Some(reads) = self.tables.get_mut(&table) {
            reads.held.push((keys.into_iter().collect(), as_of));
        }
    }

    /// Orders each table's reads by the key they start after, once all are added, and finds
    /// their latest position.
    pub(super) fn sorted(mut self, source: &dyn ChangeSource) -> CopiedKeys {
        for table in &self.unknown {
            self.tables.remove(table);
        }
        for table in self.tables.values_mut() {
            table.reads.sort_by(|left, right| match (&left.after, &right.after) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (Some(left), Some(right)) => compare_keys(left, right),
            });
            let held = table.held.iter().map(|(_, as_of)| as_of);
            for as_of in table.reads.iter().filter_map(|read| read.as_of.as_ref()).chain(held) {
                if table.latest.as_ref().is_none_or(|latest| !source.reached(latest, as_of)) {
                    table.latest = Some(as_of.clone());
                }
            }
        }
        // A table none of whose keys the copy read holds no change.
        self.tables.retain(|_, table| table.latest.is_some());
        self
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Tables whose copy's reads the source could not tell.
    pub(super) fn unknown(&self) -> impl Iterator<Item = &TableName> {
        self.unknown.iter()
    }

    /// The changes of the transaction that starts at `at`, less what the copy holds of them.
    /// A table whose latest read is behind `at` is forgotten: the copy holds none of its
    /// changes from here on.
    pub(super) fn leave_out(&mut self, source: &dyn ChangeSource, at: &Position, changes: Vec<Change>) -> Vec<Change> {
        let mut kept = Vec::with_capacity(changes.len());
        for change in changes {
            let name = &change.table.name;
            let Some(table) = self.tables.get(name) else {
                kept.push(change);
                continue;
            };
            if table.latest.as_ref().is_none_or(|latest| source.reached(at, latest)) {
                self.tables.remove(name);
                kept.push(change);
                continue;
            }
            let Change { table: schema, kind } = change;
            let rest = split_kind(kind, |row: &Row| table.holds(&schema, row, source, at));
            kept.extend(rest.map(|kind| Change { table: schema, kind }));
        }
        kept
    }
}

/// What of a change a copy lacks, given which rows it holds (`holds`, of a row image): the
/// change itself when it holds neither image, nothing when it holds both.
pub(super) fn split_kind(kind: ChangeKind, holds: impl Fn(&Row) -> bool) -> Option<ChangeKind> {
    match kind {
        ChangeKind::Insert { after } => (!holds(&after)).then_some(ChangeKind::Insert { after }),
        ChangeKind::Delete { before } => (!holds(&before)).then_some(ChangeKind::Delete { before }),
        ChangeKind::Update { before, after } => match (holds(&before), holds(&after)) {
            (true, true) => None,
            (false, false) => Some(ChangeKind::Update { before, after }),
            // The copy holds the old key's row as it was before the change and the new key's as
            // it is after: only the old row's removal is missing.
            (false, true) => Some(ChangeKind::Delete { before }),
            // Neither row: the row's arrival under its new key is missing.
            (true, false) => Some(ChangeKind::Insert { after }),
        },
    }
}

/// The key columns' values of a row (all of them for a table without a key: its one read
/// covers every row).
pub(super) fn key_of(table: &TableSchema, row: &Row) -> Row {
    table.primary_key.iter().filter_map(|&index| row.get(index).cloned()).collect()
}

/// Whether the read that copied `key` holds the transaction starting at `at`: it read the key
/// at a position past `at`.
pub(super) fn holds(reads: &[CopyRead], key: &[Value], source: &dyn ChangeSource, at: &Position) -> bool {
    // The last read starting strictly before the key covers it.
    let covering = reads.partition_point(|read| match &read.after {
        None => true,
        Some(after) => compare_keys(after, key) == Ordering::Less,
    });
    let Some(read) = covering.checked_sub(1).map(|index| &reads[index]) else { return false };
    read.as_of.as_ref().is_some_and(|as_of| !source.reached(at, as_of))
}

/// Key tuples in the order of their values, column by column.
pub(super) fn compare_keys(left: &[Value], right: &[Value]) -> Ordering {
    left.iter()
        .zip(right)
        .map(|(left, right)| compare(left, right))
        .find(|order| order.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// The order of two key values as the source sorts the same types: numbers by value, text by
/// code point (a source comparing text in a case-insensitive collation may disagree on keys
/// differing only in case), bytes by byte, dates and times in time.
fn compare(left: &Value, right: &Value) -> Ordering {
    match (left, right) {
        (Value::Null, Value::Null) => Ordering::Equal,
        (Value::Null, _) => Ordering::Less,
        (_, Value::Null) => Ordering::Greater,
        (Value::Int(left), Value::Int(right)) => left.cmp(right),
        (Value::UInt(left), Value::UInt(right)) => left.cmp(right),
        (Value::Int(left), Value::UInt(right)) => i128::from(*left).cmp(&i128::from(*right)),
        (Value::UInt(left), Value::Int(right)) => i128::from(*left).cmp(&i128::from(*right)),
        (Value::Bool(left), Value::Bool(right)) => left.cmp(right),
        (Value::Float32(left), Value::Float32(right)) => left.total_cmp(right),
        (Value::Float64(left), Value::Float64(right)) => left.total_cmp(right),
        (Value::Decimal(left), Value::Decimal(right)) => compare_decimals(left.as_str(), right.as_str()),
        (Value::Text(left), Value::Text(right)) | (Value::Json(left), Value::Json(right)) => left.cmp(right),
        (Value::Bytes(left), Value::Bytes(right)) => left.cmp(right),
        (Value::Bits { value: left, .. }, Value::Bits { value: right, .. }) => left.cmp(right),
        (Value::Date(left), Value::Date(right)) => left.cmp(right),
        (Value::DateTime(left), Value::DateTime(right)) | (Value::Timestamp(left), Value::Timestamp(right)) => {
            left.cmp(right)
        }
        (Value::Time(left), Value::Time(right)) => {
            let signed = |time: &crate::value::Time| {
                let micros = ((i64::from(time.hours) * 60 + i64::from(time.minutes)) * 60 + i64::from(time.seconds))
                    * 1_000_000
                    + i64::from(time.microseconds);
                if time.negative {
                    -micros
                } else {
                    micros
                }
            };
            signed(left).cmp(&signed(right))
        }
        (left, right) => left.to_string().cmp(&right.to_string()),
    }
}

/// Two decimal literals (`-12.50`, `3`) by value.
fn compare_decimals(left: &str, right: &str) -> Ordering {
    let parts = |text: &str| {
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
        let whole = whole.trim_start_matches('0').to_owned();
        let fraction = fraction.trim_end_matches('0').to_owned();
        let zero = whole.is_empty() && fraction.is_empty();
        (negative && !zero, whole, fraction)
    };
    let (left_negative, left_whole, left_fraction) = parts(left);
    let (right_negative, right_whole, right_fraction) = parts(right);
    let magnitude = left_whole
        .len()
        .cmp(&right_whole.len())
        .then_with(|| left_whole.cmp(&right_whole))
        .then_with(|| left_fraction.cmp(&right_fraction));
    match (left_negative, right_negative) {
        (false, false) => magnitude,
        (true, true) => magnitude.reverse(),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::schema::{Column, DataType};

    /// A source whose positions are plain numbers.
    struct Numbered;

    #[async_trait::async_trait]
    impl crate::connector::Source for Numbered {
        async fn check(&self) -> crate::Result<Vec<crate::connector::CheckItem>> {
            Ok(Vec::new())
        }
        async fn discover(&self) -> crate::Result<Vec<TableSchema>> {
            Ok(Vec::new())
        }
        fn changes(&self) -> Option<&dyn ChangeSource> {
            Some(self)
        }
    }

    #[async_trait::async_trait]
    impl ChangeSource for Numbered {
        async fn stream(&self, _after: &Position) -> crate::Result<Box<dyn crate::connector::ChangeStream>> {
            unreachable!("not read")
        }
        fn reached(&self, position: &Position, mark: &Position) -> bool {
            position.0.as_u64() >= mark.0.as_u64()
        }
    }

    fn table() -> Arc<TableSchema> {
        let columns = vec![
            Column::new("id", DataType::Integer { bytes: 4, unsigned: false }, false),
            Column::new("v", DataType::Integer { bytes: 4, unsigned: false }, true),
        ];
        Arc::new(TableSchema {
            name: TableName::new(Some("db"), "t"),
            columns,
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        })
    }

    fn at(position: u64) -> Position {
        Position(serde_json::json!(position))
    }

    fn read(after: Option<i64>, as_of: Option<u64>) -> CopyRead {
        CopyRead { after: after.map(|key| vec![Value::Int(key)]), as_of: as_of.map(at) }
    }

    fn update(from: i64, to: i64) -> Change {
        Change {
            table: table(),
            kind: ChangeKind::Update {
                before: vec![Value::Int(from), Value::Int(1)],
                after: vec![Value::Int(to), Value::Int(2)],
            },
        }
    }

    fn kinds(changes: &[Change]) -> Vec<String> {
        changes
            .iter()
            .map(|change| match &change.kind {
                ChangeKind::Insert { after } => format!("insert {}", after[0]),
                ChangeKind::Update { before, after } => format!("update {}->{}", before[0], after[0]),
                ChangeKind::Delete { before } => format!("delete {}", before[0]),
            })
            .collect()
    }

    /// Split 1 (keys ..=100) read at 50, then resumed after key 60 at 80; split 2 (keys 100..)
    /// read at 30; split 3 (keys 200..) copied nothing.
    fn copied() -> CopiedKeys {
        let mut copied = CopiedKeys::default();
        copied.add(table().name.clone(), vec![read(Some(100), Some(30))]);
        copied.add(table().name.clone(), vec![read(None, Some(50)), read(Some(60), Some(80))]);
        copied.add(table().name.clone(), vec![read(Some(200), None)]);
        copied.sorted(&Numbered)
    }

    #[test]
    fn a_change_is_left_out_where_the_read_of_its_key_came_after_it() {
        let mut copied = copied();
        let changes = vec![update(10, 10), update(70, 70), update(150, 150), update(250, 250)];
        // At 40: keys up to 60 were read at 50 and keys 61..=100 at 80 (both after), keys
        // 101..=200 at 30 (before), keys past 200 not at all.
        assert_eq!(
            kinds(&copied.leave_out(&Numbered, &at(40), changes.clone())),
            ["update 150->150", "update 250->250"]
        );
        assert_eq!(
            kinds(&copied.leave_out(&Numbered, &at(60), changes.clone())),
            ["update 10->10", "update 150->150", "update 250->250"]
        );
        assert_eq!(kinds(&copied.leave_out(&Numbered, &at(80), changes.clone())).len(), 4);
        assert!(copied.is_empty(), "past every read the table is forgotten");
    }

    #[test]
    fn a_key_held_as_an_earlier_read_left_it_takes_that_reads_position() {
        let mut copied = CopiedKeys::default();
        copied.add(table().name.clone(), vec![read(None, Some(50)), read(Some(60), Some(80))]);
        // Key 70 was sent by a read at 20 that stopped before its checkpoint; the broker kept
        // that row when the read at 80 sent it again. Key 75 is held by reads at 30 and at 25:
        // the earlier counts.
        copied.hold(table().name.clone(), vec!["70".into()], at(20));
        copied.hold(table().name.clone(), vec!["75".into()], at(30));
        copied.hold(table().name.clone(), vec!["75".into(), "76".into()], at(25));
        let mut copied = copied.sorted(&Numbered);
        let changes = vec![update(10, 10), update(70, 70), update(71, 71), update(75, 75), update(76, 76)];
        assert_eq!(kinds(&copied.leave_out(&Numbered, &at(15), changes.clone())), Vec::<String>::new());
        assert_eq!(kinds(&copied.leave_out(&Numbered, &at(22), changes.clone())), ["update 70->70"]);
        assert_eq!(
            kinds(&copied.leave_out(&Numbered, &at(26), changes.clone())),
            ["update 70->70", "update 75->75", "update 76->76"]
        );
        assert_eq!(
            kinds(&copied.leave_out(&Numbered, &at(60), changes)),
            ["update 10->10", "update 70->70", "update 75->75", "update 76->76"]
        );
    }

    #[test]
    fn an_update_moving_a_row_across_reads_keeps_what_the_copy_lacks() {
        let mut copied = copied();
        // At 40, key 10 was read after the change (the copy lacks the old row) and key 150
        // before it (the copy lacks the new row): the row's arrival at 150 is missing.
        assert_eq!(kinds(&copied.leave_out(&Numbered, &at(40), vec![update(10, 150)])), ["insert 150"]);
        // The other way: the copy holds the old row at 150 and the new row at 10.
        assert_eq!(kinds(&copied.leave_out(&Numbered, &at(40), vec![update(150, 10)])), ["delete 150"]);
    }

    #[test]
    fn decimals_and_times_compare_by_value() {
        assert_eq!(compare_decimals("9.5", "10"), Ordering::Less);
        assert_eq!(compare_decimals("-9.5", "-10"), Ordering::Greater);
        assert_eq!(compare_decimals("1.50", "1.5"), Ordering::Equal);
        assert_eq!(compare_decimals("-0.0", "0"), Ordering::Equal);
        assert_eq!(compare_decimals("0.25", "0.3"), Ordering::Less);
        assert_eq!(compare(&Value::Int(-1), &Value::UInt(u64::MAX)), Ordering::Less);
    }
}
