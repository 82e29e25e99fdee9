//! A node's copy of the keys it decides on (jobs, plans, task owners and statuses, workers, the
//! leader key…), kept current by one watch of the whole root instead of reading them at every
//! tick.
//!
//! Its keeper reads every kept prefix at one revision (`Store::snapshot`), watches the root from
//! there, and applies the events in order, keeping those under the kept prefixes: the copy is
//! always the store as it was at one revision (`Keys::revision`), never a mix of two. When the
//! watch ends (a member went away, the revision was compacted, or the store's bound on one watch
//! passed: the periodic safety net) it reads again. Between a broken watch and the next read the
//! copy is not current, and a node does not decide on it. A node's own writes are in the copy
//! once its revision reached `Store::written`: a node waits for that before it decides.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sluice_core::Result;
use tokio::sync::watch;

use super::store::{Entry, Event, Guard, Store, Watch};

/// How long the keeper waits before reading again after the store did not answer.
const RETRY: Duration = Duration::from_millis(500);

/// The copy and what keeps it.
pub(super) struct Mirror {
    shared: Arc<Shared>,
    keeper: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Copy {
    keys: BTreeMap<String, Entry>,
    /// Whether the keeper has read the prefixes and watches the root now.
    current: bool,
    /// The store revision the copy is at: it holds every write up to it.
    revision: u64,
    /// Counts the copy's changes; by kept prefix, the count at its last change (`Keys::changed`).
    changes: u64,
    changed: BTreeMap<String, u64>,
}

struct Shared {
    copy: Mutex<Copy>,
    /// Moves on at every change of the copy.
    changes: watch::Sender<u64>,
    root: String,
    prefixes: Vec<String>,
}

impl Mirror {
    /// Starts keeping a copy of the keys under `prefixes`, every one of them under `root` (the
    /// node's id names it in logs).
    pub(super) fn start(store: Arc<dyn Store>, root: &str, prefixes: &[&str], node: &str) -> Mirror {
        assert!(prefixes.iter().all(|prefix| prefix.starts_with(root)), "the kept prefixes lie under the root");
        let shared = Arc::new(Shared {
            copy: Mutex::new(Copy::default()),
            changes: watch::channel(0).0,
            root: root.to_owned(),
            prefixes: prefixes.iter().map(|prefix| (*prefix).to_owned()).collect(),
        });
        let keeper = tokio::spawn(keep(shared.clone(), store, node.to_owned())).abort_handle();
        Mirror { shared, keeper }
    }

    /// A receiver that sees every change of the copy.
    pub(super) fn changes(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    /// The store with its reads of what the copy holds answered by the copy (while current and
    /// holding every write made through `store`): for periodic reads of every job (the
    /// console's series, the leader's alarms, verifications and measures). A read sees the
    /// node's own writes; another node's a moment after they land.
    pub(super) fn reads(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(CopyFirst { shared: self.shared.clone(), store })
    }

    /// The store with its reads of what the copy keeps answered by a copy read now, at one
    /// revision (`Store::snapshot`): as current as reading the store, in one request a prefix
    /// however many keys a caller then reads (a listing of every job).
    pub(super) async fn read_now(&self, store: Arc<dyn Store>) -> Result<Arc<dyn Store>> {
        let prefixes: Vec<&str> = self.shared.prefixes.iter().map(String::as_str).collect();
        let (entries, revision) = store.snapshot(&prefixes).await?;
        let shared = Arc::new(Shared {
            copy: Mutex::new(Copy::default()),
            changes: watch::channel(0).0,
            root: self.shared.root.clone(),
            prefixes: self.shared.prefixes.clone(),
        });
        shared.read_at(entries, revision);
        Ok(Arc::new(CopyFirst { shared, store }))
    }

    /// Runs `read` on the copy when it is current; `None` otherwise.
    pub(super) fn read<T>(&self, read: impl FnOnce(&Keys<'_>) -> T) -> Option<T> {
        let copy = self.shared.lock();
        copy.current.then(|| read(&Keys(&copy)))
    }
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// The copy, as a read sees it.
pub(super) struct Keys<'a>(&'a Copy);

impl Keys<'_> {
    pub(super) fn get(&self, key: &str) -> Option<&Entry> {
        self.0.keys.get(key)
    }

    /// The keys under `prefix`, in key order.
    pub(super) fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.0
            .keys
            .range(prefix.to_owned()..)
            .take_while(move |(key, _)| key.starts_with(prefix))
            .map(|(_, entry)| entry)
    }

    /// The store revision the copy is at: it holds every write up to it.
    pub(super) fn revision(&self) -> u64 {
        self.0.revision
    }

    /// A number that differs from the last one read whenever a key under the kept `prefix`
    /// changed since (or the copy was read again): what a reader compares before it decodes
    /// the prefix's records again.
    pub(super) fn changed(&self, prefix: &str) -> u64 {
        self.0.changed.get(prefix).copied().unwrap_or(self.0.changes)
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.copy.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn kept(&self, key: &str) -> bool {
        self.prefix_of(key).is_some()
    }

    /// The kept prefix `key` lies under.
    fn prefix_of(&self, key: &str) -> Option<&str> {
        self.prefixes.iter().map(String::as_str).find(|prefix| key.starts_with(prefix))
    }

    /// Whether the copy holds, now, every key that starts with `prefix`, with every write made
    /// through the node's store up to `written` (`Store::written`): a read through the copy
    /// then sees what the node itself wrote, as a read of the store would.
    fn holds(&self, copy: &Copy, prefix: &str, written: u64) -> bool {
        copy.current && copy.revision >= written && self.kept(prefix)
    }

    fn changed(&self) {
        self.changes.send_modify(|generation| *generation += 1);
    }

    /// Replaces the copy with what a snapshot read at `revision`.
    fn read_at(&self, entries: Vec<Entry>, revision: u64) {
        let mut copy = self.lock();
        copy.keys = entries.into_iter().map(|entry| (entry.key.clone(), entry)).collect();
        copy.revision = revision;
        copy.current = true;
        copy.changes += 1;
        let changes = copy.changes;
        copy.changed = self.prefixes.iter().map(|prefix| (prefix.clone(), changes)).collect();
        drop(copy);
        self.changed();
    }

    /// Applies watched events. Receivers are told when a kept key changed, or when the copy
    /// reached `written` (the revision of the node's own latest write, which a node waits for
    /// before it decides): a write elsewhere under the root (run records, plan pieces, versions)
    /// moves the revision on without waking every node.
    fn apply(&self, events: Vec<Event>, written: u64) {
        let mut copy = self.lock();
        let before = copy.revision;
        let mut kept = false;
        for event in events {
            let (key, revision) = match &event {
                Event::Put(entry) => (entry.key.as_str(), entry.mod_revision),
                Event::Delete { key, revision } => (key.as_str(), *revision),
            };
            copy.revision = copy.revision.max(revision);
            let Some(prefix) = self.prefix_of(key) else { continue };
            kept = true;
            copy.changes += 1;
            let changes = copy.changes;
            match copy.changed.get_mut(prefix) {
                Some(seen) => *seen = changes,
                None => {
                    copy.changed.insert(prefix.to_owned(), changes);
                }
            }
            match event {
                Event::Put(entry) => {
                    copy.keys.insert(entry.key.clone(), entry);
                }
                Event::Delete { key, .. } => {
                    copy.keys.remove(&key);
                }
            }
        }
        let reached = before < written && copy.revision >= written;
        drop(copy);
        if kept || reached {
            self.changed();
        }
    }

    fn lost(&self) {
        self.lock().current = false;
    }
}

/// Keeps the copy until the mirror ends.
async fn keep(shared: Arc<Shared>, store: Arc<dyn Store>, node: String) {
    let mut failing = false;
    let prefixes: Vec<&str> = shared.prefixes.iter().map(String::as_str).collect();
    loop {
        let watched = match store.snapshot(&prefixes).await {
            Ok((entries, revision)) => {
                shared.read_at(entries, revision);
                store.watch(&shared.root, revision).await
            }
            Err(error) => Err(error),
        };
        match watched {
            Ok(mut watch) => {
                if std::mem::take(&mut failing) {
                    log::info!("node {node}: watches the cluster again");
                }
                while let Some(events) = watch.recv().await {
                    shared.apply(events, store.written());
                }
                shared.lost();
            }
            Err(error) => {
                shared.lost();
                if !std::mem::replace(&mut failing, true) {
                    log::warn!("node {node}: cannot watch the cluster: {error}; trying again");
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// A store whose reads of what the copy holds come from the copy (`Mirror::reads`);
/// everything else goes to the store.
struct CopyFirst {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
}

impl CopyFirst {
    /// The keys under `prefix` and the copy's revision, when the copy holds them.
    fn copied(&self, prefix: &str) -> Option<(Vec<Entry>, u64)> {
        let written = self.store.written();
        let copy = self.shared.lock();
        if !self.shared.holds(&copy, prefix, written) {
            return None;
        }
        let entries = Keys(&copy).under(prefix).cloned().collect();
        Some((entries, copy.revision))
    }
}

#[async_trait]
impl Store for CopyFirst {
    async fn grant(&self, ttl: Duration) -> Result<i64> {
        self.store.grant(ttl).await
    }

    async fn renew(&self, lease: i64) -> Result<bool> {
        self.store.renew(lease).await
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        self.store.revoke(lease).await
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>> {
        {
            let written = self.store.written();
            let copy = self.shared.lock();
            if self.shared.holds(&copy, key, written) {
                return Ok(copy.keys.get(key).cloned());
            }
        }
        self.store.get(key).await
    }

    async fn list_at(&self, prefix: &str) -> Result<(Vec<Entry>, u64)> {
        match self.copied(prefix) {
            Some(copied) => Ok(copied),
            None => self.store.list_at(prefix).await,
        }
    }

    async fn snapshot(&self, prefixes: &[&str]) -> Result<(Vec<Entry>, u64)> {
        self.store.snapshot(prefixes).await
    }

    async fn watch(&self, prefix: &str, revision: u64) -> Result<Watch> {
        self.store.watch(prefix, revision).await
    }

    fn written(&self) -> u64 {
        self.store.written()
    }

    async fn count(&self, prefix: &str) -> Result<u64> {
        match self.copied(prefix) {
            Some((entries, _)) => Ok(entries.len() as u64),
            None => self.store.count(prefix).await,
        }
    }

    async fn put(&self, key: &str, value: &str, lease: Option<i64>) -> Result<u64> {
        self.store.put(key, value, lease).await
    }

    async fn create(&self, key: &str, value: &str, lease: Option<i64>) -> Result<Option<u64>> {
        self.store.create(key, value, lease).await
    }

    async fn replace(&self, key: &str, value: &str, mod_revision: u64) -> Result<bool> {
        self.store.replace(key, value, mod_revision).await
    }

    async fn put_guarded(&self, key: &str, value: &str, guard: &Guard) -> Result<bool> {
        self.store.put_guarded(key, value, guard).await
    }

    async fn delete_guarded(&self, guard: &Guard) -> Result<bool> {
        self.store.delete_guarded(guard).await
    }

    async fn delete_while(&self, key: &str, guard: &Guard) -> Result<bool> {
        self.store.delete_while(key, guard).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.store.delete(key).await
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        self.store.delete_prefix(prefix).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::store::MemoryStore;

    async fn wait_until(mirror: &Mirror, mut condition: impl FnMut(&Keys<'_>) -> bool) {
        let mut changes = mirror.changes();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !mirror.read(&mut condition).unwrap_or(false) {
            tokio::time::timeout_at(deadline, changes.changed()).await.expect("the mirror changed in time").unwrap();
        }
    }

    #[tokio::test]
    async fn the_copy_follows_writes_deletes_and_ended_leases() {
        let store = Arc::new(MemoryStore::open(None).unwrap());
        store.put("/a/before", "1", None).await.unwrap();
        store.put("/b/other", "ignored", None).await.unwrap();
        let mirror = Mirror::start(store.clone(), "/", &["/a/", "/leader"], "test");
        wait_until(&mirror, |keys| keys.get("/a/before").is_some()).await;
        let keys = |mirror: &Mirror| {
            mirror.read(|keys| {
                keys.under("/a/").map(|entry| (entry.key.clone(), entry.value.clone())).collect::<Vec<_>>()
            })
        };
        assert_eq!(keys(&mirror).unwrap(), [("/a/before".to_owned(), "1".to_owned())]);

        let revision = store.put("/a/after", "2", None).await.unwrap();
        store.delete("/a/before").await.unwrap();
        let lease = store.grant(Duration::from_millis(50)).await.unwrap();
        store.put("/leader", "me", Some(lease)).await.unwrap();
        wait_until(&mirror, |keys| keys.get("/a/before").is_none() && keys.get("/leader").is_some()).await;
        assert_eq!(keys(&mirror).unwrap(), [("/a/after".to_owned(), "2".to_owned())]);
        assert!(mirror.read(|keys| keys.revision()).unwrap() > revision);
        // A write under the root but outside the kept prefixes moves the copy's revision on
        // (the node's own writes are in the copy once it reached `written`), and is not kept.
        store.put("/b/later", "x", None).await.unwrap();
        wait_until(&mirror, |keys| keys.revision() >= store.written()).await;
        assert!(mirror.read(|keys| keys.get("/b/later").is_none()).unwrap());
        assert!(mirror.read(|keys| keys.get("/b/other").is_none()).unwrap(), "only the watched prefixes are copied");

        // The lease is left to end (the store notices at its next call): the leader key goes.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while store.count("/leader").await.unwrap() > 0 {
            assert!(std::time::Instant::now() < deadline, "the lease outlived its time");
            tokio::task::yield_now().await;
        }
        wait_until(&mirror, |keys| keys.get("/leader").is_none()).await;

        // Reads through the copy: mirrored keys from it, the rest from the store.
        let reads = mirror.reads(store.clone());
        assert_eq!(reads.get("/a/after").await.unwrap().unwrap().value, "2");
        assert_eq!(reads.list("/a/").await.unwrap().len(), 1);
        assert_eq!(reads.count("/b/").await.unwrap(), 2, "a prefix the copy does not hold is read from the store");
        reads.put("/a/through", "3", None).await.unwrap();
        assert_eq!(store.get("/a/through").await.unwrap().unwrap().value, "3", "writes go to the store");
    }
}
