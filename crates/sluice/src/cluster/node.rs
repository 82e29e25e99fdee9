//! One server node: it advertises itself as a worker, competes to lead, and runs the tasks it
//! claims. The same code runs a single-node server (on a `MemoryStore`) and a cluster member
//! (on etcd).
//!
//! Placement (`model::may_claim`): a worker claims only with a free slot and a load (tasks ÷
//! capacity × weight) not above the least loaded live worker's, at most one task per look (a
//! change of its copy of the cluster, `mirror.rs`, or 500 ms after a claim), so work spreads as
//! workers report their loads. Claiming is a create of the task's
//! ownership key with the worker's lease: at most one worker wins, and the key's create revision
//! is the task's fencing epoch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::Result;
use tokio::sync::watch;

use super::model::*;
use super::store::{Entry, Guard, Store};
use crate::state_store::SqliteStateStore;

/// How often a node looks at the cluster while it has time-bound work: as leader (schedules,
/// alarms, planning to retry), or after it claimed a task (it claims one per tick).
const TICK: Duration = Duration::from_millis(500);

/// How often an idle node looks at the cluster when nothing changed: only a safety net, as a
/// change it must act on wakes it (`mirror.rs`).
const IDLE_TICK: Duration = Duration::from_secs(10);

/// How long a node waits for its copy to hold its own latest write before it decides anyway.
const OWN_WRITES_WAIT: Duration = Duration::from_secs(2);

/// The shortest time between two looks: the changes of a burst are taken in together.
const LOOK_GAP: Duration = Duration::from_millis(200);

/// What a node keeps a copy of (`mirror.rs`), under `ROOT`: what its ticks decide on.
const MIRRORED: [&str; 7] = ["jobs/", "plans/", "owners/", "tasks/", "workers/", "verifications/", "alarms/"];

/// When a lease is renewed, as a share of its time to live: a 2 s lease (the default) every
/// 1.1 s, under one renewal per second. The rest (0.9 s) is what a renewal may take, and what
/// `RENEWAL_TIMEOUT` and `RENEWAL_RETRY` leave room in for a second try (decision 0067).
const RENEW_EVERY: f64 = 0.55;

/// How long one renewal may take, as a share of the lease's time to live.
const RENEWAL_TIMEOUT: f64 = 0.2;

/// How soon a renewal that failed is tried again.
const RENEWAL_RETRY: Duration = Duration::from_millis(100);

/// How often the leader evaluates the alarms.
const ALARMS_EVERY: Duration = Duration::from_secs(2);

/// How often the leader looks for jobs whose `verify:` is due.
const VERIFY_CHECK_EVERY: Duration = Duration::from_secs(1);

/// An evaluation of the alarms (or a round of scheduled verifications) under way; its end
/// clears the node's flag.
struct Evaluating(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Evaluating {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// The HTTP client of alarm notifications: short timeouts, redirects not followed (a webhook
/// URL names its receiver), no proxy from the environment.
fn webhook_client() -> Result<reqwest::Client> {
    let tls = sluice_connectors::tls::ClientTls {
        verification: sluice_connectors::tls::Verification::Full,
        ca: None,
        cert: None,
        key: None,
    };
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .tls_backend_preconfigured(tls.config().map_err(sluice_core::Error::config)?)
        .build()
        .map_err(|error| sluice_core::Error::config(format!("cannot make the HTTP client of alarm webhooks: {error}")))
}

/// What a node is told at start.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: String,
    /// Where its API listens, as other nodes and clients reach it.
    pub address: String,
    /// How many tasks it runs at once.
    pub capacity: usize,
    /// Its share of work relative to workers of the same capacity.
    pub weight: f64,
    /// `--zone` and `--label`s: which jobs' `placement:` it may run.
    pub zone: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The lease of its worker record and task ownerships.
    pub lease: Duration,
    pub state_dir: PathBuf,
    /// Whether task writes are fenced in the target (a cluster; a single node needs no fence).
    pub fencing: bool,
    /// Where the `${NAME}`s of job documents and alarm rules take their values on this node.
    pub document_rules: crate::job_text::DocumentRules,
}

/// A task this node runs.
#[derive(Debug)]
pub(super) struct Running {
    pub(super) stop: watch::Sender<bool>,
    /// The job's resync request, as the task was last told it.
    pub(super) resync: watch::Sender<Option<sluice_core::runner::ResyncRequest>>,
    pub(super) generation: u64,
    pub(super) guard: Guard,
}

/// A server node.
pub struct Node {
    pub store: Arc<dyn Store>,
    pub config: NodeConfig,
    pub(super) lease: Mutex<i64>,
    pub(super) running: Mutex<BTreeMap<String, Running>>,
    /// Jobs this node, as leader, is planning now.
    pub(super) planning: Mutex<BTreeSet<String>>,
    pub(super) state: Arc<SqliteStateStore>,
    started_at: String,
    /// Task writes refused by a fence since this node started (`WorkerRecord::fence_refusals`).
    pub(super) fence_refusals: std::sync::atomic::AtomicU64,
    /// Whether an evaluation of the alarms (as leader) is under way, and when the last began.
    alarming: Arc<std::sync::atomic::AtomicBool>,
    last_alarms: Mutex<Option<Instant>>,
    /// Whether scheduled verifications (as leader) are under way, and when the last round began.
    verifying: Arc<std::sync::atomic::AtomicBool>,
    last_verify_check: Mutex<Option<Instant>>,
    /// Whether a measure of what stopped jobs' sources hold (as leader) is under way, and when
    /// the last began.
    measuring: Arc<std::sync::atomic::AtomicBool>,
    last_held_log: Mutex<Option<Instant>>,
    /// Each job version's `verify:` and the scheduled verifications that failed lately.
    verify_schedules: Arc<super::verification::Schedules>,
    /// Sends alarm notifications.
    webhooks: reqwest::Client,
    /// Each job version's alarm rules, parsed once.
    alarm_rules: Arc<crate::alarms::RulesCache>,
    /// The node's copy of what its ticks decide on.
    mirror: super::mirror::Mirror,
    /// The worker record last written: under which lease, its text, and the write's revision.
    advertised: Mutex<Option<(i64, String, u64)>>,
    /// Told when a task here ended: the node looks again (it has room, its record changed).
    ended: tokio::sync::Notify,
    /// Since when the copy has not held the node's own latest write.
    behind_since: Mutex<Option<Instant>>,
    /// The copy's records as the last tick decoded them.
    decoded: Mutex<Decoded>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Node").field("id", &self.config.id).finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Records by name under their prefix, each with the revision of the write it was decoded from.
pub(super) type Records<T> = Arc<BTreeMap<String, (u64, Arc<T>)>>;

/// The records of one kept prefix as last decoded, and the copy's change count they are of
/// (`Keys::changed`).
struct Cached<T> {
    seen: Option<u64>,
    records: Records<T>,
}

impl<T> Default for Cached<T> {
    fn default() -> Self {
        Cached { seen: None, records: Arc::default() }
    }
}

/// The records of the copy as last decoded: a tick decodes only what changed since the last
/// one, and shares the rest (a prefix nothing changed under is not even listed again).
#[derive(Default)]
struct Decoded {
    jobs: Cached<JobRecord>,
    plans: Cached<PlanRecord>,
    statuses: Cached<TaskStatus>,
    workers: Cached<WorkerRecord>,
    owners: Cached<Owner>,
}

/// The records under `prefix` in the copy, decoding only those written since `cache` last saw
/// them (`adjust` completes a record decoded from an entry); `cache` then holds exactly these.
fn refresh<T: serde::de::DeserializeOwned>(
    cache: &mut Cached<T>,
    prefix: &str,
    keys: &super::mirror::Keys<'_>,
    adjust: impl Fn(T, &Entry) -> T,
) -> Result<Records<T>> {
    let changed = keys.changed(prefix);
    if cache.seen == Some(changed) {
        return Ok(cache.records.clone());
    }
    let mut fresh = BTreeMap::new();
    for entry in keys.under(prefix) {
        let name = &entry.key[prefix.len()..];
        let record = match cache.records.get(name) {
            Some((revision, record)) if *revision == entry.mod_revision => record.clone(),
            _ => Arc::new(adjust(decode(entry)?, entry)),
        };
        fresh.insert(name.to_owned(), (entry.mod_revision, record));
    }
    *cache = Cached { seen: Some(changed), records: Arc::new(fresh) };
    Ok(cache.records.clone())
}

/// A record as decoded.
fn same<T>(record: T, _: &Entry) -> T {
    record
}

/// A job record with the revision of the write it was read from.
fn with_revision(job: JobRecord, entry: &Entry) -> JobRecord {
    JobRecord { revision: entry.mod_revision, ..job }
}

/// Records read from the store, as a view holds them.
fn records<T>(loaded: Vec<(String, T, Entry)>) -> Records<T> {
    Arc::new(loaded.into_iter().map(|(name, record, entry)| (name, (entry.mod_revision, Arc::new(record)))).collect())
}

/// Everything a tick looks at, read once. Its records are shared with the node's cache, so
/// taking a view copies nothing but the workers.
pub(super) struct View {
    jobs: Records<JobRecord>,
    plans: Records<PlanRecord>,
    /// Task statuses by `job/task`.
    statuses: Records<TaskStatus>,
    /// Task owners by `job/task`.
    owners: Records<Owner>,
    /// The store revision the view is of: it holds every write up to it.
    pub(super) revision: u64,
    /// The live workers, each with the tasks it owns (`model::assign_tasks`).
    pub(super) workers: Vec<WorkerRecord>,
}

impl View {
    /// Every job by name, in name order.
    pub(super) fn jobs(&self) -> impl Iterator<Item = (&str, &JobRecord)> + '_ {
        self.jobs.iter().map(|(name, (_, job))| (name.as_str(), &**job))
    }

    pub(super) fn job(&self, name: &str) -> Option<&JobRecord> {
        self.jobs.get(name).map(|(_, job)| &**job)
    }

    pub(super) fn plan(&self, job: &str) -> Option<&PlanRecord> {
        self.plans.get(job).map(|(_, plan)| &**plan)
    }

    /// The statuses of a job's tasks, by task id (one look into the statuses).
    pub(super) fn statuses_of(&self, job: &str) -> BTreeMap<&str, &TaskStatus> {
        let prefix = format!("{job}/");
        self.statuses
            .range(prefix.clone()..)
            .take_while(|(key, _)| key.starts_with(&prefix))
            .map(|(key, (_, status))| (&key[prefix.len()..], &**status))
            .collect()
    }

    /// Whether the owner key `key` (`model::owner_key`) is present.
    pub(super) fn owned(&self, key: &str) -> bool {
        key.strip_prefix(&format!("{ROOT}owners/")).is_some_and(|task| self.owners.contains_key(task))
    }

    /// The ids of a job's tasks that have an owner (one look into the owners).
    pub(super) fn owned_of(&self, job: &str) -> BTreeSet<&str> {
        let prefix = format!("{job}/");
        self.owners
            .range(prefix.clone()..)
            .take_while(|(task, _)| task.starts_with(&prefix))
            .map(|(task, _)| &task[prefix.len()..])
            .collect()
    }

    /// Workers as stored, with the tasks the owners give each.
    fn with_tasks(workers: impl Iterator<Item = WorkerRecord>, owners: &Records<Owner>) -> Vec<WorkerRecord> {
        let mut workers: Vec<WorkerRecord> = workers.collect();
        assign_tasks(&mut workers, owners.iter().map(|(task, (_, owner))| (task.as_str(), owner.worker.as_str())));
        workers
    }
}

impl Node {
    pub async fn start(store: Arc<dyn Store>, config: NodeConfig) -> Result<Arc<Node>> {
        let state = Arc::new(SqliteStateStore::open(&config.state_dir)?);
        let deadline = Instant::now() + Duration::from_secs(30);
        let lease = loop {
            match store.grant(config.lease).await {
                Ok(lease) => break lease,
                Err(error) if Instant::now() < deadline => {
                    log::warn!("node {}: {error}; trying again", config.id);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => return Err(error),
            }
        };
        let mirrored: Vec<String> =
            MIRRORED.iter().map(|prefix| format!("{ROOT}{prefix}")).chain([LEADER.to_owned()]).collect();
        let mirror = super::mirror::Mirror::start(
            store.clone(),
            ROOT,
            &mirrored.iter().map(String::as_str).collect::<Vec<_>>(),
            &config.id,
        );
        Ok(Arc::new(Node {
            store,
            config,
            lease: Mutex::new(lease),
            running: Mutex::new(BTreeMap::new()),
            planning: Mutex::new(BTreeSet::new()),
            state,
            started_at: crate::logger::timestamp(),
            fence_refusals: Default::default(),
            alarming: Default::default(),
            last_alarms: Mutex::new(None),
            verifying: Default::default(),
            last_verify_check: Mutex::new(None),
            measuring: Default::default(),
            last_held_log: Mutex::new(None),
            verify_schedules: Default::default(),
            webhooks: webhook_client()?,
            alarm_rules: Default::default(),
            mirror,
            advertised: Mutex::new(None),
            ended: tokio::sync::Notify::new(),
            behind_since: Mutex::new(None),
            decoded: Mutex::new(Decoded::default()),
        }))
    }

    /// Runs the node until `shutdown`; then stops its tasks, waits for them to save their
    /// checkpoints, and gives its lease back so other workers take over at once.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        tokio::spawn(self.clone().keep_lease());
        let mut last_error = String::new();
        let mut changes = self.mirror.changes();
        loop {
            let started = Instant::now();
            changes.borrow_and_update();
            let next = match self.tick().await {
                Ok(busy) => {
                    last_error.clear();
                    if busy {
                        TICK
                    } else {
                        IDLE_TICK
                    }
                }
                Err(error) => {
                    let message = error.to_string();
                    if message != last_error {
                        log::warn!("node {}: {message}", self.config.id);
                        last_error = message;
                    }
                    TICK
                }
            };
            let changed = tokio::select! {
                _ = tokio::time::sleep(next) => false,
                _ = changes.changed() => true,
                _ = self.ended.notified() => false,
                _ = shutdown.wait_for(|stopped| *stopped) => break,
            };
            if changed {
                tokio::time::sleep(LOOK_GAP.saturating_sub(started.elapsed())).await;
            }
        }
        log::info!("node {}: stopping its tasks", self.config.id);
        self.stop_all();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !lock(&self.running).is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let lease = *lock(&self.lease);
        if let Err(error) = self.store.revoke(lease).await {
            log::warn!("node {}: could not give its lease back ({error}); its tasks move when it ends", self.config.id);
        }
    }

    /// The store with reads of what the node's copy holds answered by the copy
    /// (`Mirror::reads`): for reads over every job, often; they see the node's own writes.
    pub fn copy_first(&self) -> Arc<dyn Store> {
        self.mirror.reads(self.store.clone())
    }

    /// The store with reads of what the node's copy keeps answered by a copy read now
    /// (`Mirror::read_now`): current, in one request a prefix, for reads over every job.
    pub async fn read_now(&self) -> Result<Arc<dyn Store>> {
        self.mirror.read_now(self.store.clone()).await
    }

    /// Takes a task that ended off this node's list.
    pub(super) fn forget(&self, task: &str) {
        lock(&self.running).remove(task);
        self.ended.notify_one();
    }

    fn stop_all(&self) {
        for running in lock(&self.running).values() {
            running.stop.send_replace(true);
        }
    }

    /// Renews the lease every `RENEW_EVERY` of its time to live, each renewal bounded to
    /// `RENEWAL_TIMEOUT` of it, and a failed one tried again after `RENEWAL_RETRY` (not a whole
    /// period) while the lease may still live. A lease that ended (the node was paused
    /// or cut off for longer than the lease) means its tasks may already run elsewhere: every
    /// task here is stopped at once, and the node starts over with a new lease.
    ///
    /// While the coordination store does not answer, fenced tasks keep applying: a worker that
    /// claims one of them meanwhile takes its fence in the target, so this one's next commit
    /// fails instead of writing twice. When the store answers again, a lease it kept (etcd
    /// renews every lease when it restarts) keeps the tasks here; one that ended stops them,
    /// and they are claimed again, each by one worker. Without fences (a single node) a task
    /// stops once the lease may have ended.
    async fn keep_lease(self: Arc<Self>) {
        let period = self.config.lease.mul_f64(RENEW_EVERY);
        let mut renewed = Instant::now();
        let mut unreachable = false;
        let mut wait = period;
        loop {
            tokio::time::sleep(wait).await;
            wait = period;
            let lease = *lock(&self.lease);
            let renewal = tokio::time::timeout(self.config.lease.mul_f64(RENEWAL_TIMEOUT), self.store.renew(lease));
            let answer = renewal
                .await
                .unwrap_or_else(|_| Err(super::store::store_error("renew the lease", "etcd did not answer in time")));
            let lost = match answer {
                Ok(true) => {
                    if std::mem::take(&mut unreachable) {
                        log::info!(
                            "node {}: the coordination store answers again after {:?}; its lease held",
                            self.config.id,
                            renewed.elapsed()
                        );
                    }
                    renewed = Instant::now();
                    false
                }
                Ok(false) => true,
                Err(error) => {
                    wait = RENEWAL_RETRY;
                    if !std::mem::replace(&mut unreachable, true) {
                        log::warn!(
                            "node {}: cannot renew its lease: {error}; {}",
                            self.config.id,
                            if self.config.fencing {
                                "its tasks keep applying, fenced in their targets"
                            } else {
                                "its tasks stop once the lease may have ended"
                            }
                        );
                    }
                    !self.config.fencing && renewed.elapsed() > self.config.lease
                }
            };
            if lost {
                unreachable = false;
                log::error!(
                    "node {}: its lease ended; stopping its tasks (they continue on other workers, fenced against this one)",
                    self.config.id
                );
                self.stop_all();
                match self.store.grant(self.config.lease).await {
                    Ok(lease) => {
                        *lock(&self.lease) = lease;
                        renewed = Instant::now();
                    }
                    Err(error) => log::warn!("node {}: {error}", self.config.id),
                }
            }
        }
    }

    /// The cluster as the node's copy has it, with the leader key; `None` while the copy is
    /// not current (being read again).
    fn view(&self) -> Result<Option<(View, Option<Entry>)>> {
        let prefix = |name: &str| format!("{ROOT}{name}");
        let mut decoded = lock(&self.decoded);
        let Decoded { jobs, plans, statuses, workers, owners } = &mut *decoded;
        self.mirror
            .read(|keys| {
                let owners = refresh(owners, &prefix("owners/"), keys, same)?;
                let workers = refresh(workers, &prefix("workers/"), keys, same)?;
                let view = View {
                    jobs: refresh(jobs, &prefix("jobs/"), keys, with_revision)?,
                    plans: refresh(plans, &prefix("plans/"), keys, same)?,
                    revision: keys.revision(),
                    statuses: refresh(statuses, &prefix("tasks/"), keys, same)?,
                    workers: View::with_tasks(workers.values().map(|(_, worker)| (**worker).clone()), &owners),
                    owners,
                };
                Ok((view, keys.get(LEADER).cloned()))
            })
            .transpose()
    }

    /// The cluster as the store has it now, read key range by key range: what a leader
    /// confirms a decision on before it writes it (planning, firing a batch).
    pub(super) async fn stored_view(&self) -> Result<View> {
        let store = &*self.store;
        let jobs = load_all::<JobRecord>(store, &format!("{ROOT}jobs/")).await?;
        let owners = records(load_all::<Owner>(store, &format!("{ROOT}owners/")).await?);
        let workers = load_all::<WorkerRecord>(store, &format!("{ROOT}workers/")).await?;
        Ok(View {
            jobs: records(
                jobs.into_iter().map(|(name, job, entry)| (name, with_revision(job, &entry), entry)).collect(),
            ),
            plans: records(load_all::<PlanRecord>(store, &format!("{ROOT}plans/")).await?),
            revision: store.written(),
            statuses: records(load_all::<TaskStatus>(store, &format!("{ROOT}tasks/")).await?),
            workers: View::with_tasks(workers.into_iter().map(|(_, worker, _)| worker), &owners),
            owners,
        })
    }

    /// This worker as it advertises itself.
    pub(super) fn record(&self) -> WorkerRecord {
        WorkerRecord {
            id: self.config.id.clone(),
            address: self.config.address.clone(),
            capacity: self.config.capacity,
            weight: self.config.weight,
            zone: self.config.zone.clone(),
            labels: self.config.labels.clone(),
            // Its tasks are read from their owner keys, not from this record.
            tasks: Vec::new(),
            started_at: self.started_at.clone(),
            fence_refusals: self.fence_refusals.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Looks at the cluster once and acts: advertises this worker, leads when it holds (or
    /// takes) the leader key, stops what moved, claims. Whether the node has time-bound work
    /// (it leads, or it claimed and may claim more) and should look again soon.
    async fn tick(self: &Arc<Self>) -> Result<bool> {
        let Some((view, leader_key)) = self.view()? else { return Ok(false) };
        if !self.holds_own_writes(view.revision) {
            // The copy changes when it catches up, which wakes the node.
            return Ok(true);
        }
        let lease = *lock(&self.lease);
        self.advertise(lease, &view).await?;
        let leader = match leader_key {
            Some(entry) => (entry.value == self.config.id).then_some(entry.create_revision),
            None => match self.store.create(LEADER, &self.config.id, Some(lease)).await? {
                Some(revision) => {
                    log::info!("node {}: leads the cluster", self.config.id);
                    Some(revision)
                }
                None => self
                    .store
                    .get(LEADER)
                    .await?
                    .filter(|entry| entry.value == self.config.id)
                    .map(|entry| entry.create_revision),
            },
        };
        if let Some(revision) = leader {
            self.fire_schedules(&view).await;
            let guard = Guard { key: LEADER.to_owned(), create_revision: revision };
            self.evaluate_alarms(&guard);
            self.verify_on_schedule();
            self.measure_held_logs();
            self.lead(&view, guard);
        }
        self.stop_what_moved(&view);
        let claimed = self.claim(&view, lease).await?;
        Ok(leader.is_some() || claimed)
    }

    /// Whether a copy at `revision` holds every write this node made (`Store::written`): a
    /// node decides only on a copy that does, so it never acts on a state older than its own
    /// last write (a plan it stored, a batch it fired, a task it ended). A copy that stays behind
    /// for `OWN_WRITES_WAIT` (a store shared with writers outside the cluster's root can answer
    /// with revisions the copy never sees) is decided on all the same, as a list read then was.
    fn holds_own_writes(&self, revision: u64) -> bool {
        let mut behind = lock(&self.behind_since);
        if revision >= self.store.written() {
            *behind = None;
            return true;
        }
        behind.get_or_insert_with(Instant::now).elapsed() > OWN_WRITES_WAIT
    }

    /// Writes this worker's record when it changed since it was last written (its tasks), its
    /// lease changed, or the copy shows the written record gone (the store lost it).
    async fn advertise(&self, lease: i64, view: &View) -> Result<()> {
        let text = encode(&self.record());
        // As stored: without the tasks the view gives it from their owners.
        let stored = view
            .workers
            .iter()
            .find(|worker| worker.id == self.config.id)
            .map(|worker| encode(&WorkerRecord { tasks: Vec::new(), ..worker.clone() }));
        let current = lock(&self.advertised).as_ref().is_some_and(|(written_lease, written, revision)| {
            *written_lease == lease
                && *written == text
                && (view.revision < *revision || stored.as_deref() == Some(text.as_str()))
        });
        if !current {
            let revision = self.store.put(&worker_key(&self.config.id), &text, Some(lease)).await?;
            *lock(&self.advertised) = Some((lease, text, revision));
        }
        Ok(())
    }

    /// As leader: starts an evaluation of the alarms every `ALARMS_EVERY`, one at a time.
    fn evaluate_alarms(&self, guard: &Guard) {
        use std::sync::atomic::Ordering;
        let mut last = lock(&self.last_alarms);
        if last.is_some_and(|last| last.elapsed() < ALARMS_EVERY) || self.alarming.swap(true, Ordering::AcqRel) {
            return;
        }
        *last = Some(Instant::now());
        let (store, guard, client, rules) =
            (self.copy_first(), guard.clone(), self.webhooks.clone(), self.alarm_rules.clone());
        let document_rules = self.config.document_rules.clone();
        // Cleared however the evaluation ends, a panic included.
        let evaluating = Evaluating(self.alarming.clone());
        tokio::spawn(async move {
            if let Err(error) = crate::alarms::evaluate(store, &document_rules, guard, client, &rules).await {
                log::warn!("alarms: cannot evaluate them now: {error}");
            }
            drop(evaluating);
        });
    }

    /// As leader: every `HELD_LOG_EVERY`, measures what the sources of unread stream jobs hold
    /// for them (`held_log::measure`), one round at a time.
    fn measure_held_logs(&self) {
        use std::sync::atomic::Ordering;
        let mut last = lock(&self.last_held_log);
        if last.is_some_and(|last| last.elapsed() < super::held_log::HELD_LOG_EVERY)
            || self.measuring.swap(true, Ordering::AcqRel)
        {
            return;
        }
        *last = Some(Instant::now());
        let (store, document_rules) = (self.copy_first(), self.config.document_rules.clone());
        let measuring = Evaluating(self.measuring.clone());
        tokio::spawn(async move {
            if let Err(error) = super::held_log::measure(&*store, &document_rules).await {
                log::warn!("what stopped jobs' sources hold: cannot measure it now: {error}");
            }
            drop(measuring);
        });
    }

    /// As leader: every `VERIFY_CHECK_EVERY`, verifies the jobs whose `verify:` is due, one
    /// round at a time (`verification::run_due`).
    fn verify_on_schedule(&self) {
        use std::sync::atomic::Ordering;
        let mut last = lock(&self.last_verify_check);
        if last.is_some_and(|last| last.elapsed() < VERIFY_CHECK_EVERY) || self.verifying.swap(true, Ordering::AcqRel) {
            return;
        }
        *last = Some(Instant::now());
        let (store, node, schedules) = (self.copy_first(), self.config.id.clone(), self.verify_schedules.clone());
        let document_rules = self.config.document_rules.clone();
        let verifying = Evaluating(self.verifying.clone());
        tokio::spawn(async move {
            if let Err(error) = super::verification::run_due(&*store, &document_rules, &node, &schedules).await {
                log::warn!("scheduled verifications: cannot look for due jobs now: {error}");
            }
            drop(verifying);
        });
    }

    /// Stops the tasks here whose job stopped, changed generation, or moved to another owner.
    fn stop_what_moved(&self, view: &View) {
        for (key, running) in lock(&self.running).iter() {
            let job = key.split('/').next().unwrap_or_default();
            let keep = view
                .job(job)
                .is_some_and(|job| job.desired == Desired::Running && job.generation == running.generation)
                && (view.owned(&running.guard.key) || view.revision < running.guard.create_revision);
            if !keep && !*running.stop.borrow() {
                log::info!("node {}: stopping task {key}: its job stopped, changed or the task moved", self.config.id);
                running.stop.send_replace(true);
            }
            // A resync asked since: the running stream takes it in without a restart.
            if let Some(job) = view.job(job).filter(|job| *running.resync.borrow() != job.resync) {
                running.resync.send_replace(job.resync.clone());
            }
        }
    }
}
