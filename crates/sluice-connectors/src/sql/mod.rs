//! What the SQL server targets (MySQL, PostgreSQL) do alike, written once: the checks of a
//! target table before a copy, the snapshot batch written in one transaction with a refused row
//! found and left out, the replay-safe steps of a stream's table renames, and the rows a
//! stream updates in place.

pub(crate) mod catalog;
pub(crate) mod snapshot;
pub(crate) mod target;
pub(crate) mod task;
pub(crate) mod update;
