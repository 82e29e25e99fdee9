//! The directory's change stream: looks for complete files it has not loaded, in the order they
//! arrived, and yields each one's records as a source transaction whose commit position is the
//! manifest with the file's hash added.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use sluice_core::change::Change;
use sluice_core::connector::{ChangeStream, StreamEvent};
use sluice_core::{Error, ErrorKind, Position, Result, Side, TableSchema};

use super::{DirectoryOptions, Manifest, Ready, WatchedTable};
use crate::file::{FileReader, Format};

/// Records per `Changes` piece of a file's transaction.
const PIECE_RECORDS: usize = 5_000;

/// The complete files of a directory, oldest first (then by name).
pub(super) fn complete_files(directory: &Path, format: Format, ready: Ready) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(directory).map_err(|error| {
        Error::new(ErrorKind::Unavailable, format!("list {}: {error}", directory.display())).on(Side::Source)
    })?;
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(metadata) = entry.metadata() else { continue };
        if !metadata.is_file() || name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        if path.extension().is_none_or(|extension| extension != format.extension()) {
            continue;
        }
        if ready == Ready::Marker && !directory.join(format!("{name}.done")).exists() {
            continue;
        }
        files.push((metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH), path));
    }
    files.sort();
    Ok(files.into_iter().map(|(_, path)| path).collect())
}

/// What identifies a file's content as seen: its size and modification time.
fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.len(), metadata.modified().ok()?))
}

/// The SHA-256 of a file's content, hex.
pub(super) fn content_hash(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|error| {
        Error::new(ErrorKind::Unavailable, format!("open {}: {error}", path.display())).on(Side::Source)
    })?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let read = file.read(&mut buffer).map_err(|error| {
            Error::new(ErrorKind::Unavailable, format!("read {}: {error}", path.display())).on(Side::Source)
        })?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
    }
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

/// A file to load: where, into which table, its content hash and the stamp it was hashed at.
struct Arrival {
    path: PathBuf,
    table: Arc<TableSchema>,
    hash: String,
    stamp: Option<(u64, SystemTime)>,
}

/// The file being loaded.
struct Loading {
    arrival: Arrival,
    reader: FileReader,
}

pub(super) struct DirectoryStream {
    tables: Vec<WatchedTable>,
    format: Format,
    ready: Ready,
    poll: Duration,
    /// The hashes of the files loaded (committed, or about to be with the next commit).
    loaded: BTreeSet<String>,
    /// Files already judged, by their stamp then: not hashed again until they change.
    seen: HashMap<PathBuf, Option<(u64, SystemTime)>>,
    waiting: VecDeque<Arrival>,
    loading: Option<Loading>,
    /// No scan yet: the files found loaded are the ones loaded before this stream started.
    first_scan: bool,
}

impl DirectoryStream {
    pub(super) fn new(tables: Vec<WatchedTable>, options: &DirectoryOptions, loaded: BTreeSet<String>) -> Self {
        DirectoryStream {
            tables,
            format: options.format,
            ready: options.ready,
            poll: options.poll,
            loaded,
            seen: HashMap::new(),
            waiting: VecDeque::new(),
            loading: None,
            first_scan: true,
        }
    }

    /// Queues the complete files not seen yet whose content is not loaded.
    fn scan(&mut self) -> Result<()> {
        let mut found = Vec::new();
        for table in &self.tables {
            for path in complete_files(&table.directory, self.format, self.ready)? {
                let stamp = stamp(&path);
                if self.seen.get(&path) == Some(&stamp) {
                    continue;
                }
                found.push((stamp, path, table.schema.clone()));
            }
        }
        found.sort_by(|left, right| {
            (left.0.map(|stamp| stamp.1), &left.1).cmp(&(right.0.map(|stamp| stamp.1), &right.1))
        });
        let mut loaded_before = 0;
        for (stamp, path, table) in found {
            let hash = content_hash(&path)?;
            self.seen.insert(path.clone(), stamp);
            let queued = self.waiting.iter().any(|arrival| arrival.hash == hash);
            if self.first_scan && self.loaded.contains(&hash) {
                loaded_before += 1;
            } else if self.loaded.contains(&hash) || queued {
                log::info!("{}: the same content as a file already loaded; passed over", path.display());
            } else {
                self.waiting.push_back(Arrival { path, table, hash, stamp });
            }
        }
        if std::mem::take(&mut self.first_scan) {
            log::info!("watched directory: {loaded_before} files found already loaded, {} to load", self.waiting.len());
        }
        Ok(())
    }

    /// The next piece of the file being loaded, or its commit at its end.
    fn read(&mut self) -> Result<StreamEvent> {
        let loading = self.loading.as_mut().expect("a file is loading");
        let mut changes = Vec::new();
        while changes.len() < PIECE_RECORDS {
            match loading.reader.next_record()? {
                None => break,
                Some(Ok(row)) => changes.push(Change::insert(loading.arrival.table.clone(), row)),
                Some(Err(reason)) => {
                    return Err(Error::new(
                        ErrorKind::Schema,
                        format!(
                            "{} record {} (table {}): {reason}",
                            loading.arrival.path.display(),
                            loading.reader.records,
                            loading.arrival.table.name
                        ),
                    )
                    .on(Side::Source)
                    .hint("nothing of this file is loaded: fix it and send it again, or move it out of the directory, then start the job again"));
                }
            }
        }
        if !changes.is_empty() {
            return Ok(StreamEvent::Changes(changes));
        }
        let Loading { arrival, reader } = self.loading.take().expect("a file is loading");
        if stamp(&arrival.path) != arrival.stamp {
            // Written to after it counted as complete: read again from the last commit.
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{} changed while it was loaded; it is loaded again", arrival.path.display()),
            )
            .on(Side::Source)
            .hint("write files under another name and rename them when complete (or use ready: marker)"));
        }
        log::info!("{}: {} records loaded into {}", arrival.path.display(), reader.records, arrival.table.name);
        self.loaded.insert(arrival.hash);
        let manifest = Manifest::of(self.loaded.clone());
        Ok(StreamEvent::Commit {
            position: Position::of(&manifest),
            committed_at: crate::events::source::now_seconds(),
        })
    }
}

#[async_trait]
impl ChangeStream for DirectoryStream {
    async fn next(&mut self) -> Result<StreamEvent> {
        loop {
            if self.loading.is_some() {
                return self.read();
            }
            if let Some(arrival) = self.waiting.pop_front() {
                let reader = FileReader::open(arrival.path.clone(), self.format, arrival.table.clone(), PIECE_RECORDS)?;
                self.loading = Some(Loading { arrival, reader });
                continue;
            }
            self.scan()?;
            if self.waiting.is_empty() {
                tokio::time::sleep(self.poll).await;
            }
        }
    }
}
