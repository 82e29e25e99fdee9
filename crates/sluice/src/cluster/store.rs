//! The coordination store: a small key-value store with revisions, leases and guarded writes,
//! shaped after etcd. A cluster uses etcd (`etcd.rs`); a single-node server uses `MemoryStore`,
//! kept in a file under its state directory.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::{Error, ErrorKind, Result, Side};

/// One stored key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub key: String,
    pub value: String,
    /// The store revision that created this key (it changes when the key is deleted and made
    /// again). A task's ownership key's create revision is its fencing epoch.
    pub create_revision: u64,
    /// The store revision of the last write to this key.
    pub mod_revision: u64,
}

/// A change to a key, as a watch reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The key was written: its value and revisions now.
    Put(Entry),
    /// The key was deleted (by a call, or because its lease ended) at `revision`.
    Delete { key: String, revision: u64 },
}

impl Event {
    pub fn key(&self) -> &str {
        match self {
            Event::Put(entry) => &entry.key,
            Event::Delete { key, .. } => key,
        }
    }
}

/// The changes a watch reports, a batch at a time and in revision order. It ends (`recv`
/// gives `None`) when the watch broke: a member went away, the revision it started from was
/// compacted, or it outlived the store's bound on one watch. The watcher then lists again and
/// watches from there.
pub type Watch = tokio::sync::mpsc::Receiver<Vec<Event>>;

/// A write that happens only while a key exists with a given create revision: the writer still
/// owns what it writes about.
#[derive(Debug, Clone)]
pub struct Guard {
    pub key: String,
    pub create_revision: u64,
}

/// What the cluster needs from its coordination store. Every call is one round trip; a failed
/// call changed nothing. Revisions only grow.
#[async_trait]
pub trait Store: Send + Sync {
    /// Grants a lease that lives `ttl` after its last renewal; keys written with it are deleted
    /// when it ends.
    async fn grant(&self, ttl: Duration) -> Result<i64>;

    /// Renews a lease; `false` when it has already ended (its keys are gone).
    async fn renew(&self, lease: i64) -> Result<bool>;

    /// Ends a lease now, deleting its keys.
    async fn revoke(&self, lease: i64) -> Result<()>;

    async fn get(&self, key: &str) -> Result<Option<Entry>>;

    /// Every key starting with `prefix`, in key order.
    async fn list(&self, prefix: &str) -> Result<Vec<Entry>> {
        Ok(self.list_at(prefix).await?.0)
    }

    /// Every key starting with `prefix`, in key order, with the store revision it was read at
    /// (what a watch of the prefix starts after).
    async fn list_at(&self, prefix: &str) -> Result<(Vec<Entry>, u64)>;

    /// Every key under any of `prefixes`, all read at one store revision, which it returns.
    async fn snapshot(&self, prefixes: &[&str]) -> Result<(Vec<Entry>, u64)>;

    /// Reports every change to keys starting with `prefix` made after `revision`, until the
    /// returned watch ends.
    async fn watch(&self, prefix: &str, revision: u64) -> Result<Watch>;

    /// The revision of the latest write made through this store object (0 before any): a
    /// copy kept by a watch holds this node's own writes once it reached it.
    fn written(&self) -> u64;

    /// How many keys start with `prefix` (without reading them).
    async fn count(&self, prefix: &str) -> Result<u64>;

    /// Writes a key (attached to `lease` when given) and returns the revision of the write.
    async fn put(&self, key: &str, value: &str, lease: Option<i64>) -> Result<u64>;

    /// Writes a key only if it does not exist; the revision of the write, or `None` when it
    /// existed.
    async fn create(&self, key: &str, value: &str, lease: Option<i64>) -> Result<Option<u64>>;

    /// Writes a key only if its last write is still the one at `mod_revision` (nobody changed
    /// it since it was read); `false` (nothing written) otherwise.
    async fn replace(&self, key: &str, value: &str, mod_revision: u64) -> Result<bool>;

    /// Writes a key only while `guard` holds; `false` (nothing written) when it does not.
    async fn put_guarded(&self, key: &str, value: &str, guard: &Guard) -> Result<bool>;

    /// Deletes a key only while it has `create_revision`; `false` when it did not.
    async fn delete_guarded(&self, guard: &Guard) -> Result<bool>;

    /// Deletes `key` (nothing when it does not exist) only while `guard` holds; `false`
    /// (nothing deleted) when it does not.
    async fn delete_while(&self, key: &str, guard: &Guard) -> Result<bool>;

    /// Deletes a key (nothing when it does not exist).
    async fn delete(&self, key: &str) -> Result<()>;

    /// Deletes every key starting with `prefix`.
    async fn delete_prefix(&self, prefix: &str) -> Result<()>;
}

/// The error of a store call, on the coordination side.
pub fn store_error(doing: &str, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Unavailable, format!("coordination store: cannot {doing}: {error}"))
        .on(Side::State)
        .hint("check that etcd is reachable from this node (--etcd)")
}

/// The single-node store: in memory, with every key that is not leased also written to a file,
/// so jobs and their versions survive a restart of the server.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Memory>,
    file: Option<PathBuf>,
    /// Every change, in revision order, to the watches.
    events: tokio::sync::broadcast::Sender<Vec<Event>>,
    /// The revision of the latest write.
    written: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Memory {
    revision: u64,
    keys: BTreeMap<String, Entry>,
    /// key → lease, for leased keys (never persisted).
    #[serde(skip)]
    leased: BTreeMap<String, i64>,
    #[serde(skip)]
    leases: BTreeMap<i64, (Instant, Duration)>,
    #[serde(skip)]
    next_lease: i64,
    /// Changes made under the lock and not yet sent to the watches.
    #[serde(skip)]
    changes: Vec<Event>,
}

impl Memory {
    /// Deletes the keys of leases that ended.
    fn expire(&mut self) {
        let now = Instant::now();
        let ended: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (renewed, ttl))| now.duration_since(*renewed) > *ttl)
            .map(|(id, _)| *id)
            .collect();
        for lease in ended {
            self.end(lease);
        }
    }

    fn end(&mut self, lease: i64) {
        self.leases.remove(&lease);
        let keys: Vec<String> =
            self.leased.iter().filter(|(_, id)| **id == lease).map(|(key, _)| key.clone()).collect();
        if !keys.is_empty() {
            self.revision += 1;
        }
        for key in keys {
            self.remove(&key);
        }
    }

    /// Deletes a key at the current revision (the caller moved it on).
    fn remove(&mut self, key: &str) -> bool {
        self.leased.remove(key);
        let removed = self.keys.remove(key).is_some();
        if removed {
            self.changes.push(Event::Delete { key: key.to_owned(), revision: self.revision });
        }
        removed
    }

    fn write(&mut self, key: &str, value: &str, lease: Option<i64>) -> u64 {
        self.revision += 1;
        let revision = self.revision;
        let create_revision = self.keys.get(key).map_or(revision, |entry| entry.create_revision);
        let entry = Entry { key: key.to_owned(), value: value.to_owned(), create_revision, mod_revision: revision };
        self.changes.push(Event::Put(entry.clone()));
        self.keys.insert(key.to_owned(), entry);
        match lease {
            Some(lease) => self.leased.insert(key.to_owned(), lease),
            None => self.leased.remove(key),
        };
        revision
    }

    fn holds(&self, guard: &Guard) -> bool {
        self.keys.get(&guard.key).is_some_and(|entry| entry.create_revision == guard.create_revision)
    }
}

impl MemoryStore {
    /// A store kept in `file` (read now if it exists), or only in memory when `None`.
    pub fn open(file: Option<PathBuf>) -> Result<MemoryStore> {
        let mut memory = Memory::default();
        if let Some(path) = file.as_ref().filter(|path| path.exists()) {
            let text = std::fs::read_to_string(path)
                .map_err(|error| Error::new(ErrorKind::State, format!("cannot read {}: {error}", path.display())))?;
            memory = serde_json::from_str(&text).map_err(|error| {
                Error::new(ErrorKind::State, format!("{} is corrupt: {error}", path.display()))
                    .hint("move the file away to start with no jobs")
            })?;
        }
        memory.next_lease = 1;
        let (events, _) = tokio::sync::broadcast::channel(1024);
        Ok(MemoryStore { inner: Mutex::new(memory), file, events, written: Default::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends the changes made under the lock to the watches (while still holding it, so they
    /// arrive in revision order).
    fn publish(&self, memory: &mut Memory) {
        self.written.fetch_max(memory.revision, std::sync::atomic::Ordering::AcqRel);
        if !memory.changes.is_empty() {
            // No watch is not an error.
            let _ = self.events.send(std::mem::take(&mut memory.changes));
        }
    }

    /// Runs `change` on the store, then writes the durable keys to the file.
    fn change<T>(&self, change: impl FnOnce(&mut Memory) -> T) -> Result<T> {
        let mut memory = self.lock();
        memory.expire();
        let result = change(&mut memory);
        self.publish(&mut memory);
        if let Some(path) = &self.file {
            let durable = Memory {
                revision: memory.revision,
                keys: memory
                    .keys
                    .iter()
                    .filter(|(key, _)| !memory.leased.contains_key(*key))
                    .map(|(key, entry)| (key.clone(), entry.clone()))
                    .collect(),
                ..Memory::default()
            };
            let temporary = path.with_extension("tmp");
            crate::private_files::write(&temporary, &serde_json::to_vec(&durable).expect("entries serialize"))
                .and_then(|()| std::fs::rename(&temporary, path))
                .map_err(|error| Error::new(ErrorKind::State, format!("cannot write {}: {error}", path.display())))?;
        }
        Ok(result)
    }

    fn read<T>(&self, read: impl FnOnce(&Memory) -> T) -> T {
        let mut memory = self.lock();
        memory.expire();
        self.publish(&mut memory);
        read(&memory)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn grant(&self, ttl: Duration) -> Result<i64> {
        let mut memory = self.lock();
        let id = memory.next_lease;
        memory.next_lease += 1;
        memory.leases.insert(id, (Instant::now(), ttl));
        Ok(id)
    }

    async fn renew(&self, lease: i64) -> Result<bool> {
        let mut memory = self.lock();
        memory.expire();
        self.publish(&mut memory);
        Ok(match memory.leases.get_mut(&lease) {
            Some((renewed, _)) => {
                *renewed = Instant::now();
                true
            }
            None => false,
        })
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        self.change(|memory| memory.end(lease))
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>> {
        Ok(self.read(|memory| memory.keys.get(key).cloned()))
    }

    async fn list_at(&self, prefix: &str) -> Result<(Vec<Entry>, u64)> {
        Ok(self.read(|memory| {
            let entries = memory
                .keys
                .range(prefix.to_owned()..)
                .take_while(|(key, _)| key.starts_with(prefix))
                .map(|(_, entry)| entry.clone())
                .collect();
            (entries, memory.revision)
        }))
    }

    async fn snapshot(&self, prefixes: &[&str]) -> Result<(Vec<Entry>, u64)> {
        Ok(self.read(|memory| {
            let entries = memory
                .keys
                .values()
                .filter(|entry| prefixes.iter().any(|prefix| entry.key.starts_with(prefix)))
                .cloned()
                .collect();
            (entries, memory.revision)
        }))
    }

    fn written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Acquire)
    }

    async fn watch(&self, prefix: &str, revision: u64) -> Result<Watch> {
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let mut memory = self.lock();
        memory.expire();
        self.publish(&mut memory);
        // Changed since it was read: a watch that ends at once makes the watcher read again.
        if memory.revision > revision {
            return Ok(receiver);
        }
        let mut events = self.events.subscribe();
        drop(memory);
        let prefix = prefix.to_owned();
        tokio::spawn(async move {
            // A watch that fell behind (`Lagged`) ends, as one whose revision was compacted.
            while let Ok(batch) = events.recv().await {
                let batch: Vec<Event> = batch.into_iter().filter(|event| event.key().starts_with(&prefix)).collect();
                if !batch.is_empty() && sender.send(batch).await.is_err() {
                    break;
                }
            }
        });
        Ok(receiver)
    }

    async fn count(&self, prefix: &str) -> Result<u64> {
        Ok(self.read(|memory| {
            memory.keys.range(prefix.to_owned()..).take_while(|(key, _)| key.starts_with(prefix)).count() as u64
        }))
    }

    async fn put(&self, key: &str, value: &str, lease: Option<i64>) -> Result<u64> {
        self.change(|memory| memory.write(key, value, lease))
    }

    async fn create(&self, key: &str, value: &str, lease: Option<i64>) -> Result<Option<u64>> {
        self.change(|memory| (!memory.keys.contains_key(key)).then(|| memory.write(key, value, lease)))
    }

    async fn replace(&self, key: &str, value: &str, mod_revision: u64) -> Result<bool> {
        self.change(|memory| {
            let current = memory.keys.get(key).is_some_and(|entry| entry.mod_revision == mod_revision);
            if current {
                let lease = memory.leased.get(key).copied();
                memory.write(key, value, lease);
            }
            current
        })
    }

    async fn put_guarded(&self, key: &str, value: &str, guard: &Guard) -> Result<bool> {
        self.change(|memory| {
            let holds = memory.holds(guard);
            if holds {
                let lease = memory.leased.get(key).copied();
                memory.write(key, value, lease);
            }
            holds
        })
    }

    async fn delete_guarded(&self, guard: &Guard) -> Result<bool> {
        self.change(|memory| {
            let holds = memory.holds(guard);
            if holds {
                memory.revision += 1;
                memory.remove(&guard.key);
            }
            holds
        })
    }

    async fn delete_while(&self, key: &str, guard: &Guard) -> Result<bool> {
        self.change(|memory| {
            let holds = memory.holds(guard);
            if holds && memory.keys.contains_key(key) {
                memory.revision += 1;
                memory.remove(key);
            }
            holds
        })
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.change(|memory| {
            if memory.keys.contains_key(key) {
                memory.revision += 1;
                memory.remove(key);
            }
        })
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        self.change(|memory| {
            memory.revision += 1;
            let doomed: Vec<String> = memory.keys.keys().filter(|key| key.starts_with(prefix)).cloned().collect();
            for key in doomed {
                memory.remove(&key);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn leased_keys_end_with_their_lease_and_guards_follow_create_revisions() {
        let store = MemoryStore::open(None).unwrap();
        let lease = store.grant(Duration::from_millis(50)).await.unwrap();
        let first = store.create("owner", "a", Some(lease)).await.unwrap().expect("created");
        assert_eq!(store.create("owner", "b", None).await.unwrap(), None, "a second create is refused");
        let guard = Guard { key: "owner".into(), create_revision: first };
        assert!(store.put_guarded("status", "from a", &guard).await.unwrap());
        // The lease ends: the key goes, and a new claim has a larger revision.
        let deadline = Instant::now() + Duration::from_secs(5);
        while store.get("owner").await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "the leased key outlived its lease");
            tokio::task::yield_now().await;
        }
        assert!(!store.renew(lease).await.unwrap());
        let second = store.create("owner", "b", None).await.unwrap().expect("created again");
        assert!(second > first);
        assert!(!store.put_guarded("status", "stale", &guard).await.unwrap(), "the old owner's guard no longer holds");
        assert_eq!(store.get("status").await.unwrap().unwrap().value, "from a");
        assert!(!store.delete_guarded(&guard).await.unwrap());
        assert!(store.delete_guarded(&Guard { key: "owner".into(), create_revision: second }).await.unwrap());
    }

    #[tokio::test]
    async fn a_replace_loses_to_a_write_in_between() {
        let store = MemoryStore::open(None).unwrap();
        let read = store.put("job", "v1", None).await.unwrap();
        store.put("job", "v2", None).await.unwrap();
        assert!(!store.replace("job", "v1 changed", read).await.unwrap());
        let current = store.get("job").await.unwrap().unwrap();
        assert!(store.replace("job", "v3", current.mod_revision).await.unwrap());
        assert_eq!(store.get("job").await.unwrap().unwrap().value, "v3");
    }

    #[tokio::test]
    async fn durable_keys_survive_a_reopen_and_leased_ones_do_not() {
        let directory = tempfile::tempdir().unwrap();
        let file = directory.path().join("cluster.json");
        let store = MemoryStore::open(Some(file.clone())).unwrap();
        store.put("/jobs/a", "1", None).await.unwrap();
        let lease = store.grant(Duration::from_secs(60)).await.unwrap();
        store.put("/workers/w", "alive", Some(lease)).await.unwrap();
        drop(store);
        let store = MemoryStore::open(Some(file)).unwrap();
        assert_eq!(
            store.list("/").await.unwrap().iter().map(|entry| entry.key.as_str()).collect::<Vec<_>>(),
            ["/jobs/a"]
        );
        assert!(store.put("/jobs/b", "2", None).await.unwrap() > 1, "revisions continue after a reopen");
    }
}
