//! Crash points for the crash tests: `SLUICE_FAILPOINT=name` (or `name@n`, the n-th time it is
//! passed) makes the process abort at that point, as a kill would, with nothing flushed or
//! closed. Compiled only with the `failpoints` feature (the test command's build); without it
//! `hit` is empty and the variable is ignored.

/// The crash points, in the order a change stream passes them.
#[cfg(feature = "failpoints")]
const POINTS: &[&str] = &[
    // A group's rows are written in the open target transaction, not committed.
    "stream.group.written",
    // A lane (`apply_parallelism`) wrote its group and the group before it committed; its own
    // commit has not begun (the groups after it may be written already).
    "stream.lane.turn",
    // The target committed a group with its checkpoint; nothing else happened yet.
    "stream.group.committed",
    // A DDL statement was applied (MySQL: committed on its own), its checkpoint not.
    "stream.ddl.applied",
    // A table's new schema (from its first rows after a DDL) was applied, the rows not.
    "stream.schema.applied",
    // MySQL renamed the published copies; the checkpoint still lists them as hidden.
    "stream.publish.renamed",
    // A copy task committed a batch with its checkpoint.
    "copy.batch.committed",
    // A stream target's client handed one more message to the broker; none is awaited.
    "events.published",
    // A stream target's broker acknowledged every event of a commit; its checkpoint is not
    // written yet.
    "events.acknowledged",
    // A Delta target decided a group in its journal; no table has it yet.
    "delta.group.decided",
    // A Delta target committed one table of a decided group.
    "delta.table.committed",
];

/// Aborts the process when `SLUICE_FAILPOINT` selects `point` (and this is its n-th pass).
#[cfg(feature = "failpoints")]
pub fn hit(point: &str) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static SELECTED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static PASSES: AtomicU64 = AtomicU64::new(0);
    let selected = SELECTED.get_or_init(|| {
        let text = std::env::var("SLUICE_FAILPOINT").ok()?;
        let (name, nth) = match text.split_once('@') {
            Some((name, nth)) => (name.to_owned(), nth.parse().unwrap_or(1)),
            None => (text, 1),
        };
        assert!(POINTS.contains(&name.as_str()), "SLUICE_FAILPOINT names no crash point: {name}");
        Some((name, nth))
    });
    let Some((name, nth)) = selected else { return };
    if name == point && PASSES.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
        eprintln!("failpoint {point} (pass {nth}): aborting");
        std::process::abort();
    }
}

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_point: &str) {}
