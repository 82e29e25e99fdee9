//! Pairing the rows of both sides of a table by key, in whatever order they arrive.
//!
//! Both sides are read in key order, so the rows at the front of each side's lane usually have
//! the same key: they are compared there, with no hashing. When the fronts differ, the one
//! whose key sorts first leaves its lane and waits in a hash set until the other side brings its
//! key (or pairs at once with a row of that key already waiting). A side whose order differs (a
//! text key under another collation) only makes more rows wait, never a wrong verdict. What
//! still waits when both sides are read is on one side only: missing or extra.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};

use super::canonical::Canonical;
use super::DifferenceKind;

/// One row as compared: its compared columns in canonical form, the key's columns first (the
/// layout's order), and, when kept, its values in the mapped schema (the source's rows a repair
/// writes).
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) row: Vec<Canonical>,
    pub(crate) values: Option<crate::change::Row>,
}

/// The side a row was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sided {
    Source,
    Target,
}

/// A difference as found: what it is, its key, the compared columns that differ (positions),
/// and each side's image, so two rounds can tell whether it stayed the same.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Found {
    pub(crate) kind: DifferenceKind,
    pub(crate) key: Vec<Canonical>,
    pub(crate) columns: Vec<usize>,
    pub(crate) source: Option<Vec<Canonical>>,
    pub(crate) target: Option<Vec<Canonical>>,
}

/// A row waiting for its key on the other side; `count` rows of this side with this key (a
/// table without a key pairs equal rows, which may repeat). Hashed and compared by its key:
/// the first `key` columns of its row.
struct Waiting {
    side: Sided,
    row: Vec<Canonical>,
    key: usize,
    count: u64,
}

impl Waiting {
    fn key(&self) -> &[Canonical] {
        &self.row[..self.key]
    }
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Waiting) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Waiting {}

impl Hash for Waiting {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

/// The pairing of one table's rows.
pub(crate) struct Comparison {
    /// Rows of each side in the order they came, not yet paired; one of the two is empty
    /// between calls.
    source_lane: VecDeque<Vec<Canonical>>,
    target_lane: VecDeque<Vec<Canonical>>,
    waiting: HashSet<Waiting, foldhash::fast::RandomState>,
    /// Columns of the key, first in every row.
    key: usize,
    found: Vec<Found>,
    /// Differences kept in `found` at most; the rest are counted.
    keep: usize,
    unlisted: u64,
    rows_source: u64,
    rows_target: u64,
}

impl Comparison {
    /// A comparison of rows whose first `key` columns are their key, keeping `keep`
    /// differences at most.
    pub(crate) fn new(keep: usize, key: usize) -> Comparison {
        Comparison {
            source_lane: VecDeque::new(),
            target_lane: VecDeque::new(),
            waiting: HashSet::default(),
            key,
            found: Vec::new(),
            keep,
            unlisted: 0,
            rows_source: 0,
            rows_target: 0,
        }
    }

    /// Rows read so far from the source and the target.
    pub(crate) fn rows(&self) -> (u64, u64) {
        (self.rows_source, self.rows_target)
    }

    /// How many more rows each side has been read than the other (`(source, target)`).
    pub(crate) fn ahead(&self) -> (u64, u64) {
        (self.rows_source.saturating_sub(self.rows_target), self.rows_target.saturating_sub(self.rows_source))
    }

    pub(crate) fn add(&mut self, side: Sided, entries: Vec<Entry>) {
        match side {
            Sided::Source => self.rows_source += entries.len() as u64,
            Sided::Target => self.rows_target += entries.len() as u64,
        }
        let lane = match side {
            Sided::Source => &mut self.source_lane,
            Sided::Target => &mut self.target_lane,
        };
        lane.extend(entries.into_iter().map(|entry| entry.row));
        self.pair_fronts();
    }

    /// Pairs the rows at the fronts of both lanes while their keys match; where they do not,
    /// the one whose key sorts first goes to wait by its key.
    fn pair_fronts(&mut self) {
        let key = self.key;
        while let (Some(source), Some(target)) = (self.source_lane.front(), self.target_lane.front()) {
            match source[..key].cmp(&target[..key]) {
                std::cmp::Ordering::Equal => {
                    let source = self.source_lane.pop_front().expect("a front");
                    let target = self.target_lane.pop_front().expect("a front");
                    self.compare(source, target);
                }
                std::cmp::Ordering::Less => {
                    let row = self.source_lane.pop_front().expect("a front");
                    self.pair(Sided::Source, row);
                }
                std::cmp::Ordering::Greater => {
                    let row = self.target_lane.pop_front().expect("a front");
                    self.pair(Sided::Target, row);
                }
            }
        }
    }

    /// Records a pair's difference, if its values differ.
    fn compare(&mut self, source: Vec<Canonical>, target: Vec<Canonical>) {
        let columns: Vec<usize> = (self.key..source.len()).filter(|&index| source[index] != target[index]).collect();
        if !columns.is_empty() {
            self.record(Found {
                kind: DifferenceKind::Different,
                key: source[..self.key].to_vec(),
                columns,
                source: Some(source),
                target: Some(target),
            });
        }
    }

    /// Pairs a row by its key with one of the other side waiting, or leaves it waiting.
    fn pair(&mut self, side: Sided, row: Vec<Canonical>) {
        let arriving = Waiting { side, row, key: self.key, count: 1 };
        let Some(mut waiting) = self.waiting.take(&arriving) else {
            self.waiting.insert(arriving);
            return;
        };
        if waiting.side == side {
            waiting.count += 1;
            self.waiting.insert(waiting);
            return;
        }
        let row = arriving.row;
        let other = if waiting.count == 1 {
            waiting.row
        } else {
            waiting.count -= 1;
            let other = waiting.row.clone();
            self.waiting.insert(waiting);
            other
        };
        match side {
            Sided::Source => self.compare(row, other),
            Sided::Target => self.compare(other, row),
        }
    }

    fn record(&mut self, found: Found) {
        if self.found.len() < self.keep {
            self.found.push(found);
        } else {
            self.unlisted += 1;
        }
    }

    /// The differences: those found in pairs, then every row still waiting (missing when only
    /// the source has it, extra when only the target does), sorted by kind and key; and how
    /// many more there were than were kept.
    pub(crate) fn finish(mut self) -> (Vec<Found>, u64) {
        for row in std::mem::take(&mut self.source_lane) {
            self.pair(Sided::Source, row);
        }
        for row in std::mem::take(&mut self.target_lane) {
            self.pair(Sided::Target, row);
        }
        let waiting = std::mem::take(&mut self.waiting);
        for waiting in waiting {
            let kind = match waiting.side {
                Sided::Source => DifferenceKind::Missing,
                Sided::Target => DifferenceKind::Extra,
            };
            for _ in 0..waiting.count {
                let (source, target) = match waiting.side {
                    Sided::Source => (Some(waiting.row.clone()), None),
                    Sided::Target => (None, Some(waiting.row.clone())),
                };
                self.record(Found { kind, key: waiting.key().to_vec(), columns: Vec::new(), source, target });
            }
        }
        self.found.sort_by(|one, other| (one.kind as u8, &one.key).cmp(&(other.kind as u8, &other.key)));
        (self.found, self.unlisted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: i128, value: &str) -> Entry {
        Entry { row: vec![Canonical::Integer(key), Canonical::Text(value.to_owned())], values: None }
    }

    #[test]
    fn rows_pair_by_key_in_any_order_and_what_stays_alone_is_missing_or_extra() {
        let mut comparison = Comparison::new(100, 1);
        comparison.add(Sided::Source, vec![entry(1, "a"), entry(2, "b"), entry(3, "c"), entry(5, "e")]);
        comparison.add(Sided::Target, vec![entry(3, "c"), entry(2, "B"), entry(4, "d"), entry(1, "a")]);
        assert_eq!(comparison.rows(), (4, 4));
        let (found, unlisted) = comparison.finish();
        assert_eq!(unlisted, 0);
        let kinds: Vec<(DifferenceKind, Vec<Canonical>, Vec<usize>)> =
            found.into_iter().map(|found| (found.kind, found.key, found.columns)).collect();
        assert_eq!(
            kinds,
            vec![
                (DifferenceKind::Missing, vec![Canonical::Integer(5)], vec![]),
                (DifferenceKind::Extra, vec![Canonical::Integer(4)], vec![]),
                (DifferenceKind::Different, vec![Canonical::Integer(2)], vec![1]),
            ]
        );
    }

    #[test]
    fn sides_in_the_same_order_pair_at_their_fronts_and_only_strays_wait() {
        let mut comparison = Comparison::new(100, 1);
        let source: Vec<Entry> = (1..=1000).map(|key| entry(key, "v")).collect();
        let target: Vec<Entry> = (1..=1000)
            .filter(|&key| key != 500)
            .map(|key| entry(key, if key == 700 { "w" } else { "v" }))
            .chain([entry(1500, "v")])
            .collect();
        let (mut sources, mut targets) = (source.chunks(64), target.chunks(50));
        let mut most_waiting = 0;
        loop {
            let (from_source, from_target) = (sources.next(), targets.next());
            if from_source.is_none() && from_target.is_none() {
                break;
            }
            if let Some(rows) = from_source {
                comparison.add(Sided::Source, rows.to_vec());
            }
            if let Some(rows) = from_target {
                comparison.add(Sided::Target, rows.to_vec());
            }
            most_waiting = most_waiting.max(comparison.waiting.len());
        }
        assert!(most_waiting <= 1, "rows in the same order wait only when they stray: {most_waiting}");
        let (found, _) = comparison.finish();
        let kinds: Vec<(DifferenceKind, Vec<Canonical>)> =
            found.into_iter().map(|found| (found.kind, found.key)).collect();
        assert_eq!(
            kinds,
            vec![
                (DifferenceKind::Missing, vec![Canonical::Integer(500)]),
                (DifferenceKind::Extra, vec![Canonical::Integer(1500)]),
                (DifferenceKind::Different, vec![Canonical::Integer(700)]),
            ]
        );
    }

    #[test]
    fn repeated_rows_of_a_table_without_a_key_pair_one_for_one() {
        let mut comparison = Comparison::new(100, 2);
        comparison.add(Sided::Source, vec![entry(1, "a"), entry(1, "a"), entry(1, "a")]);
        comparison.add(Sided::Target, vec![entry(1, "a")]);
        let (found, _) = comparison.finish();
        assert_eq!(found.iter().filter(|found| found.kind == DifferenceKind::Missing).count(), 2);
        assert_eq!(found.len(), 2);
    }

    #[test]
    fn differences_beyond_those_kept_are_counted() {
        let mut comparison = Comparison::new(2, 1);
        comparison.add(Sided::Source, (0..5).map(|key| entry(key, "x")).collect());
        let (found, unlisted) = comparison.finish();
        assert_eq!((found.len(), unlisted), (2, 3));
    }
}
