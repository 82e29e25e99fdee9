//! A part: the file one split writes in a file target. It is written as `<name>.tmp` and renamed
//! to `<name>` when the split is done, so a part that exists is whole, and that is its checkpoint.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use sluice_core::connector::{CheckItem, Checkpoint};
use sluice_core::{Result, Side, TableName};

use super::{directory_name, io_error};

#[derive(Debug)]
pub(crate) struct Part {
    task: String,
    final_path: PathBuf,
    temporary_path: PathBuf,
}

impl Part {
    /// The part of `task` (`table#N` → `part-N.<extension>`) in the table's directory.
    pub(crate) fn new(directory: &Path, table: &TableName, task: &str, extension: &str) -> Part {
        let index = task.rsplit_once('#').map_or(task, |(_, index)| index);
        let final_path = directory.join(directory_name(table)).join(format!("part-{index}.{extension}"));
        let temporary_path = final_path.with_extension(format!("{extension}.tmp"));
        Part { task: task.to_owned(), final_path, temporary_path }
    }

    /// The file being written.
    pub(crate) fn temporary_path(&self) -> &Path {
        &self.temporary_path
    }

    /// Done when the part exists; otherwise a partial part from a run that stopped is discarded
    /// and the split starts over.
    pub(crate) fn recover(&self) -> Result<Option<Checkpoint>> {
        if self.final_path.exists() {
            return Ok(Some(Checkpoint { task: self.task.clone(), position: None, done: true, rows_written: 0 }));
        }
        match fs::remove_file(&self.temporary_path) {
            Ok(()) => Ok(None),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(io_error(Side::Target, format!("remove {}", self.temporary_path.display()), error)),
        }
    }

    /// Removes every part of a table, whole or partial, whichever plan wrote it (a job reset).
    pub(crate) fn remove_all(directory: &Path, table: &TableName, extension: &str) -> Result<()> {
        let table_directory = directory.join(directory_name(table));
        let entries = match fs::read_dir(&table_directory) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(io_error(Side::Target, format!("list {}", table_directory.display()), error)),
        };
        let (whole, partial) = (format!(".{extension}"), format!(".{extension}.tmp"));
        for entry in entries {
            let path = entry
                .map_err(|error| io_error(Side::Target, format!("list {}", table_directory.display()), error))?
                .path();
            let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
            if name.starts_with("part-") && (name.ends_with(&whole) || name.ends_with(&partial)) {
                fs::remove_file(&path)
                    .map_err(|error| io_error(Side::Target, format!("remove {}", path.display()), error))?;
            }
        }
        Ok(())
    }

    /// Makes the written file durable and visible at once: sync it, rename it, sync the directory.
    pub(crate) fn publish(&self, file: &File) -> Result<()> {
        let path = self.temporary_path.display().to_string();
        file.sync_all().map_err(|error| io_error(Side::Target, format!("sync {path}"), error))?;
        fs::rename(&self.temporary_path, &self.final_path)
            .map_err(|error| io_error(Side::Target, format!("rename {path}"), error))?;
        if let Some(parent) = self.final_path.parent() {
            File::open(parent)
                .and_then(|directory| directory.sync_all())
                .map_err(|error| io_error(Side::Target, format!("sync {}", parent.display()), error))?;
        }
        Ok(())
    }
}

/// Checks that a target directory can be created and written.
pub(crate) fn check_directory(directory: &Path) -> Result<Vec<CheckItem>> {
    fs::create_dir_all(directory)
        .map_err(|error| io_error(Side::Target, format!("create {}", directory.display()), error))?;
    let probe = directory.join(".sluice-write-probe");
    File::create(&probe)
        .and_then(|_| fs::remove_file(&probe))
        .map_err(|error| io_error(Side::Target, format!("write into {}", directory.display()), error))?;
    Ok(vec![CheckItem {
        what: "target directory".into(),
        ok: true,
        detail: format!("{} is writable", directory.display()),
    }])
}
