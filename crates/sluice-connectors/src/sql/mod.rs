//! What the SQL server targets (MySQL, PostgreSQL) do alike, written once: the checks of a
//! target table before a copy, the snapshot batch written in one transaction with a refused row
//! found and left out, and the replay-safe steps of a stream's table renames.

pub(crate) mod catalog;
pub(crate) mod snapshot;
pub(crate) mod target;
pub(crate) mod task;
