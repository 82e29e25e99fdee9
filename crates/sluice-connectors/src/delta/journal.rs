//! What Sluice keeps beside a job's tables, under `<path>/.sluice/<job>/` (a name no table
//! directory can have: a leading dot is escaped in table directory names):
//!
//! - `tasks/<task>/<version>.json`: the checkpoint a copy task commits with its app transaction
//!   `version`, written before the commit. The table's app transaction says which one holds; the
//!   others are attempts whose commit did not happen.
//! - `stream/<group>.json`: the change stream's journal. A group of source transactions may touch
//!   several tables, and Delta commits one table at a time, so the group is decided first, by
//!   creating its entry (never replacing one): the checkpoint and every table's actions. Its
//!   table commits follow, each with the stream's app transaction at the group's number, so a
//!   commit that happened is never made twice. A start rolls the last entry forward. Two writers
//!   of one stream cannot both decide a group: the second finds the number taken.
//! - `fences/<task>/<epoch>`: the cluster claims of each task; the largest epoch owns it.

use std::fs;
use std::path::{Path, PathBuf};

use deltalake_core::kernel::Action;
use serde::{Deserialize, Serialize};
use sluice_core::connector::{Checkpoint, Fence};
use sluice_core::{Error, ErrorKind, Result, Side};

use crate::file::fence::{file_name, job_directory, numbered, write_whole, Fences};

/// The checkpoint of one commit of a copy task.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Intent {
    pub checkpoint: Checkpoint,
    /// The table directory committed to, relative to the target path.
    pub table: String,
}

/// One table's part of a journal entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct TableCommit {
    /// The table directory, relative to the target path.
    pub table: String,
    /// The table's name, for messages.
    pub name: String,
    /// The commit creates the table: its first actions are its protocol and metadata.
    #[serde(default)]
    pub create: bool,
    /// What the commit does: `merge`, `compact`, `publish`, `schema`.
    pub operation: String,
    pub actions: Vec<Action>,
}

/// A decided group of the change stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Entry {
    pub group: i64,
    /// The claim of the writer that decided it (0 standalone).
    pub epoch: u64,
    pub checkpoint: Checkpoint,
    pub tables: Vec<TableCommit>,
    /// Table directories to delete once the tables are committed (published copies' logs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discard: Vec<String>,
}

fn state_error(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("{doing}: {error}"))
        .on(Side::Target)
        .hint("check target.path and its permissions")
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            Error::new(ErrorKind::State, format!("{} is corrupt: {error}", path.display()))
                .on(Side::Target)
                .hint("run the job with --restart to copy everything again")
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(state_error(format!("read {}", path.display()), error)),
    }
}

/// A job's bookkeeping directory.
#[derive(Debug, Clone)]
pub(super) struct Journal {
    root: PathBuf,
    fences: Fences,
}

impl Journal {
    pub(super) fn new(path: &Path, job: &str) -> Journal {
        Journal { root: job_directory(path, job), fences: Fences::new(path, job) }
    }

    /// Every job's bookkeeping under `path`, for `reset`.
    pub(super) fn remove(&self) -> Result<()> {
        match fs::remove_dir_all(&self.root) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                Err(state_error(format!("remove {}", self.root.display()), error))
            }
            _ => Ok(()),
        }
    }

    fn task_directory(&self, task: &str) -> PathBuf {
        self.root.join("tasks").join(file_name(task))
    }

    /// Records the checkpoint of a copy task's commit `version`, before the commit.
    pub(super) fn write_intent(&self, task: &str, version: i64, intent: &Intent) -> Result<()> {
        let path = self.task_directory(task).join(format!("{version}.json"));
        write_whole(&path, &serde_json::to_vec(intent).expect("intents serialize"), false)?;
        Ok(())
    }

    pub(super) fn read_intent(&self, task: &str, version: i64) -> Result<Option<Intent>> {
        read_json(&self.task_directory(task).join(format!("{version}.json")))
    }

    /// Forgets a task's intents before `version`.
    pub(super) fn prune_intents(&self, task: &str, version: i64) {
        let directory = self.task_directory(task);
        for old in numbered(&directory).unwrap_or_default().into_iter().filter(|number| *number < version) {
            let _ = fs::remove_file(directory.join(format!("{old}.json")));
        }
    }

    /// The tasks whose latest intent names `table`, with that intent's version.
    pub(super) fn tasks_of(&self, table: &str) -> Result<Vec<(String, i64)>> {
        let directory = self.root.join("tasks");
        let entries = match fs::read_dir(&directory) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(state_error(format!("list {}", directory.display()), error)),
        };
        let mut tasks = Vec::new();
        for entry in entries.filter_map(|entry| entry.ok()) {
            let Some(last) = numbered(&entry.path())?.last().copied() else { continue };
            let Some(intent) = read_json::<Intent>(&entry.path().join(format!("{last}.json")))? else { continue };
            if intent.table == table {
                tasks.push((intent.checkpoint.task.clone(), last));
            }
        }
        Ok(tasks)
    }

    fn stream_directory(&self) -> PathBuf {
        self.root.join(sluice_core::names::STREAM_TASK)
    }

    /// The last decided group of the stream.
    pub(super) fn last_entry(&self) -> Result<Option<Entry>> {
        let directory = self.stream_directory();
        match numbered(&directory)?.last() {
            Some(last) => read_json(&directory.join(format!("{last}.json"))),
            None => Ok(None),
        }
    }

    /// Decides a group: `false` when its number is taken (another writer decided it).
    pub(super) fn decide(&self, entry: &Entry) -> Result<bool> {
        let path = self.stream_directory().join(format!("{}.json", entry.group));
        write_whole(&path, &serde_json::to_vec(entry).expect("entries serialize"), true)
    }

    pub(super) fn read_entry(&self, group: i64) -> Result<Option<Entry>> {
        read_json(&self.stream_directory().join(format!("{group}.json")))
    }

    /// Forgets the entries before `group`.
    pub(super) fn prune_entries(&self, group: i64) {
        let directory = self.stream_directory();
        for old in numbered(&directory).unwrap_or_default().into_iter().filter(|number| *number < group) {
            let _ = fs::remove_file(directory.join(format!("{old}.json")));
        }
    }

    /// Takes a task for `fence`'s epoch; `Fenced` when a later claim holds it.
    pub(super) fn claim(&self, job: &str, fence: &Fence) -> Result<()> {
        self.fences.claim(job, fence)
    }

    /// `Fenced` when a later claim than `fence`'s holds its task.
    pub(super) fn check(&self, job: &str, fence: &Fence) -> Result<()> {
        self.fences.check(job, fence)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_decided_once() {
        let directory = tempfile::tempdir().unwrap();
        let journal = Journal::new(directory.path(), "job");
        let checkpoint =
            Checkpoint { task: sluice_core::names::STREAM_TASK.into(), position: None, done: false, rows_written: 0 };
        let entry = Entry { group: 1, epoch: 0, checkpoint, tables: Vec::new(), discard: Vec::new() };
        assert!(journal.decide(&entry).unwrap());
        assert!(!journal.decide(&Entry { epoch: 9, ..entry.clone() }).unwrap());
        assert_eq!(journal.last_entry().unwrap().unwrap().epoch, 0);
        journal.decide(&Entry { group: 2, ..entry.clone() }).unwrap();
        journal.prune_entries(2);
        assert!(journal.read_entry(1).unwrap().is_none());
    }
}
