//! A part: the file one split writes in a file target. It is written as `<name>.<writer>.tmp`
//! (its own per writer, so two writers of one split, a cluster task that moved and the worker it
//! left, never write into one file) and renamed to `<name>` when the split is done, so a part
//! that exists is whole, and that is its checkpoint.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use sluice_core::connector::{CheckItem, Checkpoint};
use sluice_core::{Result, Side, TableName};

use super::{directory_name, io_error};

/// The file that lists a table's whole parts once every split is done (`write_manifest`).
pub(crate) const MANIFEST: &str = "_manifest.json";

#[derive(Debug)]
pub(crate) struct Part {
    task: String,
    final_path: PathBuf,
    temporary_path: PathBuf,
}

impl Part {
    /// The part of `task` (`table#N` → `part-N.<extension>`) in the table's directory.
    pub(crate) fn new(directory: &Path, table: &TableName, task: &str, extension: &str) -> Part {
        let index = sluice_core::names::split_index(task);
        static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let writer = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let final_path = directory.join(directory_name(table)).join(format!("part-{index}.{extension}"));
        let temporary_path = final_path.with_extension(format!("{extension}.{}-{writer}.tmp", std::process::id()));
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
        // Every partial file of this part, whichever writer left it.
        let name = self.final_path.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_owned();
        let Some(directory) = self.final_path.parent() else { return Ok(None) };
        let entries = match fs::read_dir(directory) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io_error(Side::Target, format!("list {}", directory.display()), error)),
        };
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            if file.starts_with(&format!("{name}.")) && file.ends_with(".tmp") {
                match fs::remove_file(entry.path()) {
                    Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                        return Err(io_error(Side::Target, format!("remove {}", entry.path().display()), error))
                    }
                    _ => {}
                }
            }
        }
        Ok(None)
    }

    /// Removes every part of a table, whole or partial, whichever plan wrote it (a job reset).
    pub(crate) fn remove_all(directory: &Path, table: &TableName, extension: &str) -> Result<()> {
        let table_directory = directory.join(directory_name(table));
        let entries = match fs::read_dir(&table_directory) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(io_error(Side::Target, format!("list {}", table_directory.display()), error)),
        };
        let (whole, partial) = (format!(".{extension}"), ".tmp");
        for entry in entries {
            let path = entry
                .map_err(|error| io_error(Side::Target, format!("list {}", table_directory.display()), error))?
                .path();
            let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
            let whole_or_partial = name.ends_with(&whole) || (name.ends_with(partial) && name.contains(&whole));
            if (name.starts_with("part-") && whole_or_partial) || name == MANIFEST {
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

/// Lists a table's whole parts in its `_manifest.json` (path, bytes and, where `rows_of` can
/// tell, rows), written whole and last: a reader that takes the dataset from the manifest never
/// reads a part a killed or moved task left behind, nor one of a batch still being written.
pub(crate) fn write_manifest(
    directory: &Path,
    table: &TableName,
    extension: &str,
    rows_of: impl Fn(&Path) -> Option<u64>,
) -> Result<()> {
    let table_directory = directory.join(directory_name(table));
    let listed = fs::read_dir(&table_directory)
        .map_err(|error| io_error(Side::Target, format!("list {}", table_directory.display()), error))?;
    let mut parts: Vec<(String, PathBuf)> = listed
        .flatten()
        .map(|entry| (entry.file_name().to_string_lossy().into_owned(), entry.path()))
        .filter(|(name, _)| name.starts_with("part-") && name.ends_with(&format!(".{extension}")))
        .collect();
    parts.sort();
    let mut total = 0;
    let mut listed = Vec::new();
    for (name, path) in &parts {
        let bytes = fs::metadata(path)
            .map_err(|error| io_error(Side::Target, format!("read {}", path.display()), error))?
            .len();
        let rows = rows_of(path);
        total += rows.unwrap_or(0);
        listed.push(serde_json::json!({ "path": name, "bytes": bytes, "rows": rows }));
    }
    let manifest =
        serde_json::json!({ "table": table.to_string(), "format": extension, "rows": total, "parts": listed });
    let text = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
    super::fence::write_whole(&table_directory.join(MANIFEST), &text, false)?;
    Ok(())
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
