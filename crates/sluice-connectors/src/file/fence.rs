//! Cluster claims of a file target's tasks, kept as files beside its tables:
//! `<path>/.sluice/<job>/fences/<task>/<epoch>.json`, each made once and never replaced, so the
//! largest epoch owns a task (a name no table directory can take: a leading dot is escaped in
//! table directory names).

use std::fs;
use std::path::{Path, PathBuf};

use sluice_core::connector::Fence;
use sluice_core::{Error, ErrorKind, Result, Side};

/// A job's or task's name as one file name.
pub(crate) fn file_name(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F").replace('\\', "%5C").replace(':', "%3A")
}

/// The bookkeeping directory of `job` under a target `path`.
pub(crate) fn job_directory(path: &Path, job: &str) -> PathBuf {
    path.join(".sluice").join(file_name(job))
}

fn state_error(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("{doing}: {error}"))
        .on(Side::Target)
        .hint("check target.path and its permissions")
}

/// The numbers of a directory's `<n>.json` files, in order.
pub(crate) fn numbered(directory: &Path) -> Result<Vec<i64>> {
    let entries = match fs::read_dir(directory) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(state_error(format!("list {}", directory.display()), error)),
    };
    let mut numbers: Vec<i64> = entries
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| entry.file_name().to_str()?.strip_suffix(".json")?.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

/// Writes `bytes` to `path` whole: a temporary file, synced, then renamed (or linked, when
/// `exclusive`: then an existing `path` is left alone and the answer is `false`).
pub(crate) fn write_whole(path: &Path, bytes: &[u8], exclusive: bool) -> Result<bool> {
    use std::io::Write;
    let directory = path.parent().expect("bookkeeping files live in a directory");
    fs::create_dir_all(directory).map_err(|error| state_error(format!("create {}", directory.display()), error))?;
    let temporary = directory.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|name| name.to_str()).unwrap_or("entry"),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()
    };
    write().map_err(|error| state_error(format!("write {}", temporary.display()), error))?;
    let placed = if exclusive {
        match fs::hard_link(&temporary, path) {
            Ok(()) => true,
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(error) => return Err(state_error(format!("write {}", path.display()), error)),
        }
    } else {
        fs::rename(&temporary, path).map_err(|error| state_error(format!("write {}", path.display()), error))?;
        true
    };
    let _ = fs::remove_file(&temporary);
    if let Ok(directory) = fs::File::open(directory) {
        let _ = directory.sync_all();
    }
    Ok(placed)
}

/// The claims of one job's tasks.
#[derive(Debug, Clone)]
pub(crate) struct Fences {
    root: PathBuf,
}

impl Fences {
    pub(crate) fn new(path: &Path, job: &str) -> Fences {
        Fences { root: job_directory(path, job).join("fences") }
    }

    fn directory(&self, fence: &Fence) -> PathBuf {
        self.root.join(file_name(&fence.task))
    }

    /// Takes a task for `fence`'s epoch; `Fenced` when a later claim holds it.
    pub(crate) fn claim(&self, job: &str, fence: &Fence) -> Result<()> {
        self.check(job, fence)?;
        write_whole(&self.directory(fence).join(format!("{}.json", fence.epoch)), b"{}", true)?;
        Ok(())
    }

    /// `Fenced` when a later claim than `fence`'s holds its task.
    pub(crate) fn check(&self, job: &str, fence: &Fence) -> Result<()> {
        match numbered(&self.directory(fence))?.last() {
            Some(&held) if held > fence.epoch as i64 => Err(fence.moved(job, held as u64)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_claim_fences_the_earlier() {
        let directory = tempfile::tempdir().unwrap();
        let fences = Fences::new(directory.path(), "job");
        let (old, new) = (Fence { task: "stream".into(), epoch: 5 }, Fence { task: "stream".into(), epoch: 7 });
        fences.claim("job", &old).unwrap();
        fences.claim("job", &new).unwrap();
        assert_eq!(fences.check("job", &old).unwrap_err().kind(), ErrorKind::Fenced);
        assert!(fences.claim("job", &old).is_err());
        fences.check("job", &new).unwrap();
    }
}
