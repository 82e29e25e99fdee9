//! The task a server target's writer writes for, as its checkpoint row and fence know it.

use sluice_core::connector::Fence;

/// The task a writer (of a table, or of a change stream) commits for.
#[derive(Debug, Clone)]
pub(crate) struct WriterTask {
    /// The job's name.
    pub job: String,
    /// The task's name: its row in `sluice.checkpoints`.
    pub name: String,
    /// The cluster task's fence every checkpoint commit checks, when a worker runs the task.
    pub fence: Option<Fence>,
}

impl WriterTask {
    /// Task `name` of `job`, fenced by `fence` when given.
    pub fn new(job: &str, name: &str, fence: Option<&Fence>) -> WriterTask {
        WriterTask { job: job.to_owned(), name: name.to_owned(), fence: fence.cloned() }
    }
}
