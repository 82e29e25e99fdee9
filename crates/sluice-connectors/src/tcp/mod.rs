//! A TCP line input as a change source (`type: tcp`): clients connect and send JSON Lines, one
//! row of the one table per line, loaded into any target that applies changes.
//!
//! - **Back-pressure.** Lines are read only as fast as the target takes them: each connection
//!   hands its decoded lines over a bounded queue, and while that is full the connection is not
//!   read, so the sender's TCP window closes and its writes block.
//! - **Acknowledgements.** Once a commit makes a connection's lines durable, the server writes
//!   `ok N` on that connection (N: its lines durable so far). A line that does not decode gets
//!   `error N: why` and the connection is closed; its earlier lines stand. Lines not
//!   acknowledged when the connection breaks (a crash, a restart) must be sent again: with a
//!   `key`, a line sent twice replaces its row, so resending is safe.
//! - **Columns** are declared (`columns: {id: integer, name: text}`); `key` names the primary key.
//! - **Bounds.** Every input is bounded so one client cannot hold the server: a line longer than
//!   `max_line_bytes`, a connection past `max_connections`, one quiet for `idle_timeout_secs`, a
//!   failed `auth` or TLS handshake: each is answered (`error N: why`) where it can be and closed.
//! - **TLS and authentication.** With `tls_cert` and `tls_key` the input speaks TLS only; with
//!   `auth`, a connection's first line must be `auth TOKEN` (compared in constant time).

pub(crate) mod connector;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::change::Change;
use sluice_core::connector::{ChangeSource, ChangeStream, CheckItem, Source, StreamEvent};
use sluice_core::secret::Secret;
use sluice_core::{Error, ErrorKind, Position, Result, Row, Side, TableSchema};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Lines decoded and waiting for the stream, across connections: the back-pressure bound.
const QUEUED_LINES: usize = 4_096;

/// How long a quiet input waits before it lets acknowledgements out.
const ACKNOWLEDGE_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Lines per source transaction, at most.
const LINES_PER_TRANSACTION: usize = 5_000;

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A `tcp` source's options.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    pub listen: SocketAddr,
    pub table: Arc<TableSchema>,
    /// A longer line is answered `error N: line too long` and its connection closed, so no
    /// client holds the input's memory with one endless line.
    pub max_line_bytes: usize,
    /// Connections open at once, at most; one more is answered `error 0: too many connections`.
    pub max_connections: usize,
    /// A connection that sends nothing for this long is closed.
    pub idle_timeout: std::time::Duration,
    /// The token a connection's first line must give (`auth TOKEN`), if any.
    pub auth: Option<Secret>,
    /// Speak TLS only, with this certificate chain and key.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Where the stream stands: the lines committed since the job began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Lines {
    lines: u64,
}

/// A TCP line input as a source.
#[derive(Debug)]
pub struct TcpSource {
    options: TcpOptions,
}

impl TcpSource {
    pub fn new(options: TcpOptions) -> TcpSource {
        TcpSource { options }
    }
}

#[async_trait]
impl Source for TcpSource {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        Ok(vec![CheckItem {
            what: "line input".into(),
            ok: true,
            detail: format!("listens on {} for rows of {}", self.options.listen, self.options.table.name),
        }])
    }

    async fn discover(&self) -> Result<Vec<TableSchema>> {
        Ok(vec![(*self.options.table).clone()])
    }

    sluice_core::capabilities!(changes: ChangeSource);
}

#[async_trait]
impl ChangeSource for TcpSource {
    async fn start_position(&self) -> Result<Option<Position>> {
        Ok(Some(Position::of(&Lines::default())))
    }

    fn applies_by_key(&self) -> bool {
        true
    }

    fn reached(&self, position: &Position, mark: &Position) -> bool {
        match (position.read::<Lines>("the position"), mark.read::<Lines>("the mark")) {
            (Ok(position), Ok(mark)) => position.lines >= mark.lines,
            _ => false,
        }
    }

    async fn stream(&self, after: &Position) -> Result<Box<dyn ChangeStream>> {
        let start: Lines = after.read("the tcp source's stream")?;
        let listener = TcpListener::bind(self.options.listen).await.map_err(|error| {
            Error::new(ErrorKind::Connect, format!("listen on {}: {error}", self.options.listen))
                .on(Side::Source)
                .hint("choose a free address in source.listen")
        })?;
        log::info!("line input: listening on {} for rows of {}", self.options.listen, self.options.table.name);
        let (lines, received) = mpsc::channel(QUEUED_LINES);
        let connections: Connections = Arc::default();
        let accepting = tokio::spawn(accept(listener, self.options.clone(), lines, connections.clone()));
        Ok(Box::new(LineStream {
            table: self.options.table.clone(),
            committed: start.lines,
            taken: start.lines,
            received,
            unacknowledged: VecDeque::new(),
            connections,
            commit_pending: false,
            accepting,
        }))
    }
}

/// A decoded line: its connection, its number there (from 1) and its row.
struct Line {
    connection: u64,
    number: u64,
    row: Row,
}

/// The live connections, by id: where each one's replies go.
type Connections = Arc<std::sync::Mutex<HashMap<u64, mpsc::UnboundedSender<String>>>>;

/// Accepts connections until dropped; each one's lines go to `lines`.
async fn accept(listener: TcpListener, options: TcpOptions, lines: mpsc::Sender<Line>, connections: Connections) {
    let mut next_id = 0;
    let acceptor = options.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    // Dropped with this task when the stream goes: every connection is closed with it.
    let mut readers = tokio::task::JoinSet::new();
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, say: wait a moment rather than spin.
                log::warn!("line input: cannot accept a connection: {error}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        while readers.try_join_next().is_some() {}
        // Readers also count those refused or still in their handshake, so it bounds them all.
        if readers.len() >= options.max_connections {
            log::warn!("line input: {peer} refused: {} connections are open (source.max_connections)", readers.len());
            // Told without a wait (a TLS client, before any handshake, is only closed).
            if acceptor.is_none() {
                let refusal =
                    format!("error 0: too many connections (source.max_connections {})\n", options.max_connections);
                let _ = socket.try_write(refusal.as_bytes());
            }
            continue;
        }
        next_id += 1;
        let id = next_id;
        let (replies, outgoing) = mpsc::unbounded_channel();
        connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id, replies.clone());
        let input = Input { peer, id, options: options.clone(), lines: lines.clone() };
        let connections = connections.clone();
        let acceptor = acceptor.clone();
        readers.spawn(async move {
            match acceptor {
                None => serve(socket, input, replies, outgoing).await,
                Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                    Ok(Ok(stream)) => serve(stream, input, replies, outgoing).await,
                    Ok(Err(error)) => log::warn!("line input: {peer}: TLS handshake failed: {error}"),
                    Err(_) => log::warn!("line input: {peer}: no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
                },
            }
            connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&id);
        });
    }
}

/// One connection's side of the input: who sent it, the input's options, and where its decoded
/// lines go.
struct Input {
    peer: SocketAddr,
    id: u64,
    options: TcpOptions,
    lines: mpsc::Sender<Line>,
}

/// What reading one line of a connection gave.
enum Read {
    Line,
    Closed,
    TooLong,
    Idle,
}

/// Reads one line into `bytes` (at most one byte past `max_line_bytes`, whatever the client
/// sends), waiting `idle` at most.
async fn read_line<R: AsyncRead + Unpin>(
    input: &mut BufReader<R>,
    bytes: &mut Vec<u8>,
    max_line_bytes: usize,
    idle: std::time::Duration,
) -> Read {
    bytes.clear();
    let mut limited = input.take(max_line_bytes as u64 + 1);
    let reading = limited.read_until(b'\n', bytes);
    match tokio::time::timeout(idle, reading).await {
        Err(_) => Read::Idle,
        Ok(Ok(0) | Err(_)) => Read::Closed,
        Ok(Ok(_)) if bytes.len() > max_line_bytes && !bytes.ends_with(b"\n") => Read::TooLong,
        Ok(Ok(_)) => Read::Line,
    }
}

/// Whether `line` is `auth TOKEN` with the input's token, compared in constant time.
fn authenticates(line: &[u8], token: &Secret) -> bool {
    let given = line.strip_suffix(b"\n").unwrap_or(line);
    let given = given.strip_suffix(b"\r").unwrap_or(given);
    let expected = format!("auth {}", token.expose());
    let expected = expected.as_bytes();
    let differing = given.iter().zip(expected).fold(0u8, |differing, (a, b)| differing | (a ^ b));
    given.len() == expected.len() && differing == 0
}

/// Reads one connection's lines and writes back what the stream tells it.
async fn serve<S: AsyncRead + AsyncWrite + Send + 'static>(
    socket: S,
    input: Input,
    replies: mpsc::UnboundedSender<String>,
    mut outgoing: mpsc::UnboundedReceiver<String>,
) {
    let Input { peer, id, options, lines } = input;
    let (read, mut write) = tokio::io::split(socket);
    let writer = tokio::spawn(async move {
        while let Some(reply) = outgoing.recv().await {
            let closing = reply.starts_with("error");
            if write.write_all(reply.as_bytes()).await.is_err() || closing {
                // After an error nothing more is read from this connection: it is closed.
                let _ = write.shutdown().await;
                return;
            }
        }
    });
    let mut input = BufReader::new(read);
    let mut bytes = Vec::new();
    let (max_line_bytes, idle) = (options.max_line_bytes, options.idle_timeout);
    let mut refusal = None;
    if let Some(token) = &options.auth {
        let authenticated = matches!(read_line(&mut input, &mut bytes, max_line_bytes, idle).await, Read::Line)
            && authenticates(&bytes, token);
        if !authenticated {
            refusal = Some((0, "authentication failed: the first line must be `auth TOKEN` (source.auth)".to_owned()));
        }
    }
    let mut number = 0;
    while refusal.is_none() {
        let read = read_line(&mut input, &mut bytes, max_line_bytes, idle).await;
        if matches!(read, Read::Closed) {
            break;
        }
        if matches!(read, Read::Line) && bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        number += 1;
        let decoded = match read {
            Read::TooLong => Err(format!("line too long (more than {max_line_bytes} bytes, source.max_line_bytes)")),
            Read::Idle => Err(format!("idle for {} s (source.idle_timeout_secs)", idle.as_secs())),
            _ => match std::str::from_utf8(&bytes) {
                Ok(text) => crate::file::decode_json(&options.table, text.trim_end()),
                Err(_) => Err("the line is not UTF-8".to_owned()),
            },
        };
        match decoded {
            Ok(row) => {
                if lines.send(Line { connection: id, number, row }).await.is_err() {
                    break;
                }
            }
            Err(reason) => refusal = Some((number, reason)),
        }
    }
    if let Some((number, reason)) = refusal {
        log::warn!("line input: {peer} line {number}: {reason}; the connection is closed");
        let _ = replies.send(format!("error {number}: {reason}\n"));
        // What the client still sends is read and dropped for a moment, so the close is orderly
        // and the client reads the error (unread bytes would reset it).
        let mut sink = tokio::io::sink();
        let drained = tokio::io::copy(&mut input, &mut sink);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drained).await;
    }
    drop(replies);
    // Acknowledgements go on until the client closes its side or the stream ends.
    let _ = writer.await;
}

struct LineStream {
    table: Arc<TableSchema>,
    /// Lines committed (the position).
    committed: u64,
    /// Lines handed to the stream, committed or not.
    taken: u64,
    received: mpsc::Receiver<Line>,
    /// Lines handed and not acknowledged yet: (global number, connection, its number there).
    unacknowledged: VecDeque<(u64, u64, u64)>,
    connections: Connections,
    /// The lines handed last wait for their `Commit`.
    commit_pending: bool,
    accepting: JoinHandle<()>,
}

impl Drop for LineStream {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

#[async_trait]
impl ChangeStream for LineStream {
    async fn next(&mut self) -> Result<StreamEvent> {
        if self.commit_pending {
            self.commit_pending = false;
            self.committed = self.taken;
            return Ok(StreamEvent::Commit {
                position: Position::of(&Lines { lines: self.taken }),
                committed_at: crate::events::source::now_seconds(),
            });
        }
        // The stream acknowledges between reads: while lines wait for their `ok`, a quiet input
        // still returns now and then, so the acknowledgement goes out.
        let first = if self.unacknowledged.is_empty() {
            self.received.recv().await
        } else {
            match tokio::time::timeout(ACKNOWLEDGE_EVERY, self.received.recv()).await {
                Ok(line) => line,
                Err(_) => {
                    return Ok(StreamEvent::Advance {
                        position: Position::of(&Lines { lines: self.committed }),
                        committed_at: crate::events::source::now_seconds(),
                    })
                }
            }
        };
        let Some(first) = first else {
            return Err(Error::new(ErrorKind::Unavailable, "the line input stopped listening").on(Side::Source));
        };
        let mut lines = vec![first];
        while lines.len() < LINES_PER_TRANSACTION {
            match self.received.try_recv() {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        let mut changes = Vec::with_capacity(lines.len());
        for line in lines {
            self.taken += 1;
            self.unacknowledged.push_back((self.taken, line.connection, line.number));
            changes.push(Change::insert(self.table.clone(), line.row));
        }
        self.commit_pending = true;
        Ok(StreamEvent::Changes(changes))
    }

    async fn ack(&mut self, position: &Position) -> Result<()> {
        let durable: Lines = position.read("the tcp source's stream")?;
        let mut latest: BTreeMap<u64, u64> = BTreeMap::new();
        while self.unacknowledged.front().is_some_and(|(global, _, _)| *global <= durable.lines) {
            let (_, connection, number) = self.unacknowledged.pop_front().expect("checked");
            latest.insert(connection, number);
        }
        let mut connections = self.connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        for (connection, number) in latest {
            if let Some(replies) = connections.get(&connection) {
                if replies.send(format!("ok {number}\n")).is_err() {
                    connections.remove(&connection);
                }
            }
        }
        Ok(())
    }
}
