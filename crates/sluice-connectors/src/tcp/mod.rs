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

pub(crate) mod connector;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::change::Change;
use sluice_core::connector::{ChangeSource, ChangeStream, CheckItem, Source, StreamEvent};
use sluice_core::{DataType, Error, ErrorKind, Position, Result, Row, Side, TableSchema};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Lines decoded and waiting for the stream, across connections: the back-pressure bound.
const QUEUED_LINES: usize = 4_096;

/// How long a quiet input waits before it lets acknowledgements out.
const ACKNOWLEDGE_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Lines per source transaction, at most.
const LINES_PER_TRANSACTION: usize = 5_000;

/// A column type by the name `columns` gives it.
pub fn column_type(name: &str) -> Option<DataType> {
    Some(match name.to_ascii_lowercase().as_str() {
        "boolean" | "bool" => DataType::Boolean,
        "integer" | "int" => DataType::Integer { bytes: 4, unsigned: false },
        "bigint" | "long" => DataType::Integer { bytes: 8, unsigned: false },
        "float" | "double" => DataType::Float64,
        "decimal" | "numeric" => DataType::Decimal { precision: None, scale: None },
        "text" | "string" => DataType::Text { length: None, fixed: false },
        "bytes" => DataType::Bytes { length: None, fixed: false },
        "date" => DataType::Date,
        "datetime" => DataType::DateTime { precision: 6 },
        "timestamp" => DataType::Timestamp { precision: 6 },
        "json" => DataType::Json,
        _ => return None,
    })
}

/// A `tcp` source's options.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    pub listen: SocketAddr,
    pub table: Arc<TableSchema>,
    /// A longer line is answered `error N: line too long` and its connection closed, so no
    /// client holds the input's memory with one endless line.
    pub max_line_bytes: usize,
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
        let connections: Arc<std::sync::Mutex<HashMap<u64, mpsc::UnboundedSender<String>>>> = Arc::default();
        let accepting = tokio::spawn(accept(
            listener,
            self.options.table.clone(),
            self.options.max_line_bytes,
            lines,
            connections.clone(),
        ));
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

/// Accepts connections until dropped; each one's lines go to `lines`.
async fn accept(
    listener: TcpListener,
    table: Arc<TableSchema>,
    max_line_bytes: usize,
    lines: mpsc::Sender<Line>,
    connections: Arc<std::sync::Mutex<HashMap<u64, mpsc::UnboundedSender<String>>>>,
) {
    let mut next_id = 0;
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
        next_id += 1;
        let (replies, outgoing) = mpsc::unbounded_channel();
        connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(next_id, replies.clone());
        while readers.try_join_next().is_some() {}
        let input = Input { peer, id: next_id, table: table.clone(), max_line_bytes, lines: lines.clone() };
        let serving = serve(socket, input, replies, outgoing);
        let connections = connections.clone();
        readers.spawn(async move {
            serving.await;
            connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&next_id);
        });
    }
}

/// One connection's side of the input: who sent it, the table its lines are rows of, the
/// longest line it may send, and where its decoded lines go.
struct Input {
    peer: SocketAddr,
    id: u64,
    table: Arc<TableSchema>,
    max_line_bytes: usize,
    lines: mpsc::Sender<Line>,
}

/// Reads one connection's lines and writes back what the stream tells it.
async fn serve(
    socket: TcpStream,
    input: Input,
    replies: mpsc::UnboundedSender<String>,
    mut outgoing: mpsc::UnboundedReceiver<String>,
) {
    let Input { peer, id, table, max_line_bytes, lines } = input;
    let (read, mut write) = socket.into_split();
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
    let mut number = 0;
    loop {
        bytes.clear();
        // At most one byte past the bound is read, whatever the client sends.
        match (&mut input).take(max_line_bytes as u64 + 1).read_until(b'\n', &mut bytes).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let too_long = bytes.len() > max_line_bytes && !bytes.ends_with(b"\n");
        if !too_long && bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        number += 1;
        let decoded = match std::str::from_utf8(&bytes) {
            _ if too_long => Err(format!("line too long (more than {max_line_bytes} bytes, source.max_line_bytes)")),
            Ok(text) => crate::file::decode_json(&table, text.trim_end()),
            Err(_) => Err("the line is not UTF-8".to_owned()),
        };
        match decoded {
            Ok(row) => {
                if lines.send(Line { connection: id, number, row }).await.is_err() {
                    break;
                }
            }
            Err(reason) => {
                log::warn!("line input: {peer} line {number}: {reason}; the connection is closed");
                let _ = replies.send(format!("error {number}: {reason}\n"));
                // What the client still sends is read and dropped for a moment, so the close
                // is orderly and the client reads the error (unread bytes would reset it).
                let mut sink = tokio::io::sink();
                let drained = tokio::io::copy(&mut input, &mut sink);
                let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drained).await;
                break;
            }
        }
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
    connections: Arc<std::sync::Mutex<HashMap<u64, mpsc::UnboundedSender<String>>>>,
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
