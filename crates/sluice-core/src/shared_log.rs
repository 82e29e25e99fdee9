//! One read of a source's change log for the several jobs of a job's targets (`targets:`).
//!
//! The jobs of one job's targets (`JobSpec::parts`) stream the same source. A `SharedLog`
//! reads it once and hands every event to each job's stream that has joined it. A job's stream
//! starts on a reader of its own, from its own checkpoint; once it stands at a transaction boundary
//! the shared reader has passed recently (a position of an event still in the buffer), it
//! leaves its own reader and reads on from the buffer. The shared reader never runs more than
//! a few events (`prefetch`) ahead of the joined stream furthest ahead, so the fastest target sets
//! its pace; a joined stream that falls `capacity` row changes behind that one leaves the buffer with an
//! `Unavailable` error, which ends its attempt: the job restarts from its own checkpoint on a
//! reader of its own, catches up, and joins again. A target that is down or slow thus holds only
//! itself, at the cost of reading the log again while it catches up.
//!
//! Only for logs that any reader may read from any position (a MySQL binlog): a log that keeps
//! its place for one reader (a PostgreSQL slot, acknowledged per job) is not shared.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::change::Position;
use crate::connector::{
    ChangeSource, ChangeStream, CheckItem, CursorSource, LogBacklog, SnapshotSource, Source, StreamEvent,
};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::schema::TableSchema;

/// Row changes (other events count one each) the shared reader keeps for the streams behind the
/// one furthest ahead: about 20 MB of ordinary rows.
pub const SHARED_EVENTS: usize = 100_000;

/// The shared reader of one source's change log, and the events it read lately.
pub struct SharedLog {
    /// The source the shared reader reads with (its own binlog reader id).
    source: Arc<dyn Source>,
    capacity: usize,
    state: Mutex<Buffer>,
    /// Woken when an event is read, a stream moves on or leaves, or the reader fails.
    changed: Notify,
    /// Held while a stream starts or joins the shared reader, so streams starting together
    /// join the reader the first of them opens instead of each opening one.
    starting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for SharedLog {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let buffer = self.buffer();
        formatter
            .debug_struct("SharedLog")
            .field("capacity", &self.capacity)
            .field("reading", &buffer.reading)
            .field("joined", &buffer.cursors.len())
            .finish()
    }
}

#[derive(Default)]
struct Buffer {
    /// The events read lately; the first is event number `first`.
    events: VecDeque<StreamEvent>,
    /// Their weight: row changes, other events one each (`weight`).
    held: usize,
    first: u64,
    /// Boundary position (its JSON text) → the number of the event that follows it.
    boundaries: HashMap<String, u64>,
    /// Each joined stream's next event number.
    cursors: HashMap<u64, u64>,
    next_stream: u64,
    /// The shared reader runs (a task reads into the buffer).
    reading: bool,
    /// Why the shared reader stopped, for the joined streams.
    failed: Option<Error>,
    /// Streams that joined since the reader started, for the summary.
    joined: u64,
}

impl Buffer {
    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

impl SharedLog {
    /// A shared reader of `source`'s log, keeping at most `capacity` row changes behind the joined
    /// stream furthest ahead.
    pub fn new(source: Arc<dyn Source>, capacity: usize) -> Arc<SharedLog> {
        Arc::new(SharedLog {
            source,
            capacity: capacity.max(2),
            state: Mutex::new(Buffer::default()),
            changed: Notify::new(),
            starting: tokio::sync::Mutex::new(()),
        })
    }

    /// `inner` with its change stream read through this log: everything else is `inner`'s.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn Source>) -> Arc<dyn Source> {
        Arc::new(SharedSource { inner, log: self.clone() })
    }

    /// How many times a job's stream joined the shared reader (a stream that left and came back
    /// counts again).
    pub fn joins(&self) -> u64 {
        self.buffer().joined
    }

    /// How many events the shared reader reads ahead of the stream furthest ahead.
    fn prefetch(&self) -> usize {
        (self.capacity / 8).clamp(2, 64)
    }

    fn buffer(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts the shared reader after `after` unless it runs, and joins it there: the number
    /// of the joined stream, or `None` when it ran already.
    async fn start(self: &Arc<Self>, after: &Position) -> Result<Option<u64>> {
        {
            let mut buffer = self.buffer();
            if buffer.reading {
                return Ok(None);
            }
            buffer.reading = true;
        }
        let opened = match self.source.changes() {
            Some(changes) => changes.stream(after).await,
            None => Err(Error::new(ErrorKind::Config, "the source has no change log to share").on(Side::Source)),
        };
        let mut upstream = match opened {
            Ok(upstream) => upstream,
            Err(error) => {
                self.buffer().reading = false;
                return Err(error);
            }
        };
        let id = {
            let mut buffer = self.buffer();
            let end = buffer.end();
            let (id, joined) = (buffer.next_stream, buffer.joined + 1);
            *buffer = Buffer { first: end, reading: true, next_stream: id + 1, joined, ..Buffer::default() };
            buffer.cursors.insert(id, end);
            // Another stream starting where this one does joins at once.
            buffer.boundaries.insert(after.0.to_string(), end);
            id
        };
        let log = self.clone();
        tokio::spawn(async move {
            loop {
                // The reader waits for the joined stream furthest ahead; with none joined, it ends.
                loop {
                    let waiting = log.changed.notified();
                    {
                        let buffer = log.buffer();
                        let Some(ahead) = buffer.cursors.values().copied().max() else {
                            drop(buffer);
                            log.stop(None);
                            return;
                        };
                        if buffer.end() < ahead + log.prefetch() as u64 {
                            break;
                        }
                    }
                    waiting.await;
                }
                match upstream.next().await {
                    Ok(event) => log.push(event),
                    Err(error) => {
                        log.stop(Some(error));
                        return;
                    }
                }
            }
        });
        Ok(Some(id))
    }

    fn stop(&self, error: Option<Error>) {
        let mut buffer = self.buffer();
        buffer.reading = false;
        buffer.failed = error;
        buffer.cursors.clear();
        buffer.events.clear();
        buffer.boundaries.clear();
        drop(buffer);
        self.changed.notify_waiters();
    }

    fn push(&self, event: StreamEvent) {
        let mut buffer = self.buffer();
        let after = buffer.end() + 1;
        if let Some(position) = boundary(&event) {
            buffer.boundaries.insert(position.0.to_string(), after);
        }
        buffer.held += weight(&event);
        buffer.events.push_back(event);
        while buffer.held > self.capacity && buffer.events.len() > 1 {
            let gone = buffer.events.pop_front().expect("more than one event");
            buffer.held -= weight(&gone);
            buffer.first += 1;
        }
        let first = buffer.first;
        buffer.boundaries.retain(|_, next| *next >= first);
        drop(buffer);
        self.changed.notify_waiters();
    }

    /// Joins a stream standing at `position` when the buffer holds what follows that boundary:
    /// the joined stream's number.
    fn join(&self, position: &Position) -> Option<u64> {
        let mut buffer = self.buffer();
        if !buffer.reading || buffer.failed.is_some() {
            return None;
        }
        let cursor = *buffer.boundaries.get(&position.0.to_string())?;
        if cursor < buffer.first {
            return None;
        }
        let id = buffer.next_stream;
        buffer.next_stream += 1;
        buffer.cursors.insert(id, cursor);
        buffer.joined += 1;
        drop(buffer);
        self.changed.notify_waiters();
        Some(id)
    }

    fn leave(&self, id: u64) {
        self.buffer().cursors.remove(&id);
        self.changed.notify_waiters();
    }

    /// The next event of joined stream `id`, waiting for the reader.
    async fn next_of(&self, id: u64) -> Result<StreamEvent> {
        loop {
            let waiting = self.changed.notified();
            {
                let mut buffer = self.buffer();
                if let Some(error) = &buffer.failed {
                    return Err(Error::new(
                        error.kind(),
                        format!("the targets' shared read of the source's log: {}", error.message()),
                    )
                    .on(Side::Source));
                }
                let Some(cursor) = buffer.cursors.get(&id).copied() else {
                    return Err(left_behind());
                };
                if cursor < buffer.first {
                    buffer.cursors.remove(&id);
                    return Err(left_behind());
                }
                if cursor < buffer.end() {
                    let event = buffer.events[(cursor - buffer.first) as usize].clone();
                    buffer.cursors.insert(id, cursor + 1);
                    drop(buffer);
                    self.changed.notify_waiters();
                    return Ok(event);
                }
            }
            waiting.await;
        }
    }
}

/// The error of a joined stream the shared reader left behind: its attempt ends and the job
/// restarts from its checkpoint, on a reader of its own.
fn left_behind() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        "this target fell behind the other targets' shared read of the source's log; it reads the log again from its checkpoint",
    )
    .on(Side::Source)
}

/// What an event weighs in the buffer: its row changes, or one.
fn weight(event: &StreamEvent) -> usize {
    match event {
        StreamEvent::Changes(changes) => changes.len().max(1),
        _ => 1,
    }
}

/// Where an event leaves the stream between transactions, when it says so exactly: a commit, a
/// schema change, a passed-over transaction, or an advance past a dated event (a heartbeat's
/// position depends on when the reader asked, so it is no meeting point).
fn boundary(event: &StreamEvent) -> Option<&Position> {
    match event {
        StreamEvent::Commit { position, .. }
        | StreamEvent::SchemaChange { position, .. }
        | StreamEvent::Echo { position, .. } => Some(position),
        StreamEvent::Advance { position, committed_at } if *committed_at > 0 => Some(position),
        _ => None,
    }
}

/// A job's source whose change stream goes through a `SharedLog`.
struct SharedSource {
    inner: Arc<dyn Source>,
    log: Arc<SharedLog>,
}

#[async_trait]
impl Source for SharedSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        self.inner.check().await
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        self.inner.discover().await
    }

    async fn forget(&self) -> Result<()> {
        self.inner.forget().await
    }

    fn snapshot(&self) -> Option<&dyn SnapshotSource> {
        self.inner.snapshot()
    }

    fn changes(&self) -> Option<&dyn ChangeSource> {
        self.inner.changes().map(|_| self as &dyn ChangeSource)
    }

    fn cursor(&self) -> Option<&dyn CursorSource> {
        self.inner.cursor()
    }
}

impl SharedSource {
    fn own(&self) -> &dyn ChangeSource {
        self.inner.changes().expect("a shared source has a change log")
    }
}

#[async_trait]
impl ChangeSource for SharedSource {
    async fn log_position(&self) -> Result<Option<Position>> {
        self.own().log_position().await
    }

    async fn start_log(&self) -> Result<Option<Position>> {
        self.own().start_log().await
    }

    async fn log_backlog(&self, position: &Position) -> Result<Option<LogBacklog>> {
        self.own().log_backlog(position).await
    }

    async fn held_log(&self) -> Result<Option<u64>> {
        self.own().held_log().await
    }

    async fn start_position(&self) -> Result<Option<Position>> {
        self.own().start_position().await
    }

    fn stop_position(&self) -> Option<Position> {
        self.own().stop_position()
    }

    /// Joins the shared reader at once when it stands where this stream starts (the first
    /// stream starts it there); otherwise reads on its own until it meets the shared reader.
    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
        let starting = self.log.starting.lock().await;
        let joined = match self.log.start(after).await? {
            Some(id) => Some(id),
            None => self.log.join(after),
        };
        drop(starting);
        if let Some(id) = joined {
            return Ok(Box::new(SharedStream { log: self.log.clone(), reading: Reading::Joined(id) }));
        }
        let own = self.own().stream(after).await?;
        Ok(Box::new(SharedStream { log: self.log.clone(), reading: Reading::Own(own) }))
    }

    async fn describe_logged(&self, logged: &TableSchema) -> Result<TableSchema> {
        self.own().describe_logged(logged).await
    }

    fn applies_by_key(&self) -> bool {
        self.own().applies_by_key()
    }

    fn reached(&self, position: &Position, mark: &Position) -> bool {
        self.own().reached(position, mark)
    }
}

enum Reading {
    /// On a reader of its own, until it meets the shared reader.
    Own(Box<dyn ChangeStream>),
    /// From the shared buffer, as stream `id`.
    Joined(u64),
}

struct SharedStream {
    log: Arc<SharedLog>,
    reading: Reading,
}

#[async_trait]
impl ChangeStream for SharedStream {
    async fn next(&mut self) -> Result<StreamEvent> {
        match &mut self.reading {
            Reading::Joined(id) => self.log.next_of(*id).await,
            Reading::Own(own) => {
                let event = own.next().await?;
                if let Some(id) = boundary(&event).and_then(|position| self.log.join(position)) {
                    // The own reader's connection closes with it.
                    self.reading = Reading::Joined(id);
                }
                Ok(event)
            }
        }
    }

    async fn ack(&mut self, position: &Position) -> Result<()> {
        match &mut self.reading {
            Reading::Own(own) => own.ack(position).await,
            Reading::Joined(_) => Ok(()),
        }
    }
}

impl Drop for SharedStream {
    fn drop(&mut self) {
        if let Reading::Joined(id) = self.reading {
            self.log.leave(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A log of numbered transactions, each one `Commit` at its number; counts its readers.
    #[derive(Default)]
    struct NumberedLog {
        opens: AtomicUsize,
    }

    struct Numbered(u64);

    #[async_trait]
    impl ChangeStream for Numbered {
        async fn next(&mut self) -> Result<StreamEvent> {
            self.0 += 1;
            tokio::task::yield_now().await;
            Ok(StreamEvent::Commit { position: Position(self.0.into()), committed_at: self.0 })
        }
    }

    #[async_trait]
    impl Source for NumberedLog {
        async fn check(&self) -> Result<Vec<CheckItem>> {
            Ok(Vec::new())
        }
        async fn discover(&self) -> Result<Vec<TableSchema>> {
            Ok(Vec::new())
        }
        fn changes(&self) -> Option<&dyn ChangeSource> {
            Some(self)
        }
    }

    #[async_trait]
    impl ChangeSource for NumberedLog {
        async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
            self.opens.fetch_add(1, Ordering::Relaxed);
            Ok(Box::new(Numbered(after.0.as_u64().unwrap())))
        }
    }

    async fn numbers(stream: &mut Box<dyn ChangeStream>, count: usize) -> Result<Vec<u64>> {
        let mut seen = Vec::new();
        for _ in 0..count {
            match stream.next().await? {
                StreamEvent::Commit { position, .. } => seen.push(position.0.as_u64().unwrap()),
                other => panic!("{other:?}"),
            }
        }
        Ok(seen)
    }

    #[tokio::test]
    async fn streams_share_one_read_join_it_when_they_meet_it_and_leave_it_when_left_behind() {
        let upstream = Arc::new(NumberedLog::default());
        let log = SharedLog::new(upstream.clone(), 8);
        let source = log.wrap(upstream.clone());
        let changes = source.changes().unwrap();

        // Two streams from one position: one read, the same events.
        let mut first = changes.stream(&Position(0.into())).await.unwrap();
        let mut second = changes.stream(&Position(0.into())).await.unwrap();
        assert_eq!(numbers(&mut first, 5).await.unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(numbers(&mut second, 5).await.unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(upstream.opens.load(Ordering::Relaxed), 1, "one read for both");

        // A stream starting behind what the buffer holds reads on its own, and joins the shared
        // read once it reaches a position the buffer still holds.
        assert_eq!(numbers(&mut first, 15).await.unwrap(), (6..=20).collect::<Vec<u64>>());
        let mut third = changes.stream(&Position(1.into())).await.unwrap();
        assert_eq!(upstream.opens.load(Ordering::Relaxed), 2, "behind the buffer: a reader of its own");
        assert_eq!(numbers(&mut third, 25).await.unwrap(), (2..=26).collect::<Vec<u64>>());
        assert_eq!(log.joins(), 3, "it joined on the way, without a gap or a repeat");
        assert_eq!(upstream.opens.load(Ordering::Relaxed), 2);

        // The second stream, left more than the buffer behind the others, is told so.
        let left = numbers(&mut second, 20).await.unwrap_err();
        assert_eq!(left.kind(), ErrorKind::Unavailable, "{left}");
        assert!(left.to_string().contains("fell behind"), "{left}");
    }
}
