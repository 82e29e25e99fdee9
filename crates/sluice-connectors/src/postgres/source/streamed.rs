//! Transactions the server streams before they end (protocol 2 with `streaming 'on'`: a
//! transaction whose changes outgrow the server's `logical_decoding_work_mem` is sent in chunks
//! while it runs). Each one's messages are kept as they came, in memory up to
//! [`MEMORY_BYTES`] and then in an unnamed file of its own, until the server says how it ended:
//! committed, they are handed on in order (without the row changes of its rolled-back
//! subtransactions); rolled back, they are dropped and leave no trace.
//!
//! Kept messages are the raw `pgoutput` data: they are decoded only when handed on, so a
//! transaction that rolls back costs a copy of its bytes and nothing more.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};

use bytes::Bytes;

/// How many bytes of one transaction's messages stay in memory before the rest goes to its file.
pub(crate) const MEMORY_BYTES: usize = 16 << 20;

/// Message tags that describe (a relation, a type) rather than change rows: kept even when the
/// subtransaction they came in rolls back, since later rows of the transaction are decoded with
/// them.
const DESCRIPTIONS: [u8; 2] = [b'R', b'Y'];

/// The transactions being streamed, and the one whose chunk is being received.
#[derive(Debug, Default)]
pub(crate) struct StreamedTransactions {
    open: HashMap<u32, Spool>,
    /// The transaction of the chunk between a Stream Start and its Stream Stop.
    current: Option<u32>,
}

/// Why a streamed transaction's message could not be taken.
#[derive(Debug)]
pub(crate) enum StreamedError {
    /// The server's messages do not fit together (named in the text).
    Protocol(String),
    /// The transaction's file could not be written or read.
    Io(io::Error),
}

impl From<io::Error> for StreamedError {
    fn from(error: io::Error) -> StreamedError {
        StreamedError::Io(error)
    }
}

impl StreamedTransactions {
    /// Inside a chunk: the next message belongs to its transaction.
    pub fn in_chunk(&self) -> bool {
        self.current.is_some()
    }

    /// A chunk of transaction `xid` starts; its first chunk opens it.
    pub fn start(&mut self, xid: u32, first_segment: bool) -> Result<(), StreamedError> {
        if let Some(current) = self.current {
            return Err(StreamedError::Protocol(format!(
                "a chunk of transaction {xid} started inside one of transaction {current}"
            )));
        }
        match (first_segment, self.open.contains_key(&xid)) {
            (true, false) => {
                self.open.insert(xid, Spool::default());
            }
            (false, true) => {}
            (true, true) => {
                return Err(StreamedError::Protocol(format!("transaction {xid} was streamed from its start twice")))
            }
            (false, false) => {
                return Err(StreamedError::Protocol(format!(
                    "a later chunk of transaction {xid} came without its first"
                )))
            }
        }
        self.current = Some(xid);
        Ok(())
    }

    /// The current chunk ends.
    pub fn stop(&mut self) {
        self.current = None;
    }

    /// Keeps a message of the current chunk. Every message inside a chunk starts with its tag
    /// and the id of the (sub)transaction it belongs to.
    pub fn keep(&mut self, data: Bytes) -> Result<(), StreamedError> {
        let Some(xid) = self.current else {
            return Err(StreamedError::Protocol("a streamed message came outside a chunk".into()));
        };
        let Some(subxid) = data.get(1..5).map(|id| u32::from_be_bytes(id.try_into().expect("four bytes"))) else {
            return Err(StreamedError::Protocol(format!(
                "a message of streamed transaction {xid} has no transaction id"
            )));
        };
        self.open.get_mut(&xid).expect("the current transaction is open").push(subxid, data)?;
        Ok(())
    }

    /// Transaction `xid` committed: its messages, to hand on.
    pub fn commit(&mut self, xid: u32) -> Result<Replay, StreamedError> {
        match self.open.remove(&xid) {
            Some(spool) => Ok(spool.replay()?),
            None => Err(StreamedError::Protocol(format!("streamed transaction {xid} committed without its chunks"))),
        }
    }

    /// Transaction `xid` (when `subxid == xid`) or one of its subtransactions rolled back.
    pub fn abort(&mut self, xid: u32, subxid: u32) {
        if xid == subxid {
            // Dropping the spool closes its unnamed file, which frees its space.
            self.open.remove(&xid);
        } else if let Some(spool) = self.open.get_mut(&xid) {
            spool.aborted.insert(subxid);
        }
    }
}

/// One open transaction's messages, with the (sub)transaction id each came with.
#[derive(Debug, Default)]
struct Spool {
    /// The first messages, while they fit in [`MEMORY_BYTES`].
    memory: Vec<(u32, Bytes)>,
    memory_bytes: usize,
    /// The rest, each as its subtransaction id, length (both big-endian `u32`) and bytes.
    file: Option<BufWriter<File>>,
    /// Subtransactions that rolled back.
    aborted: HashSet<u32>,
}

impl Spool {
    fn push(&mut self, subxid: u32, data: Bytes) -> io::Result<()> {
        if self.file.is_none() && self.memory_bytes + data.len() <= MEMORY_BYTES {
            self.memory_bytes += data.len();
            self.memory.push((subxid, data));
            return Ok(());
        }
        let file = match &mut self.file {
            Some(file) => file,
            None => self.file.insert(BufWriter::with_capacity(1 << 20, tempfile::tempfile()?)),
        };
        let length = u32::try_from(data.len()).map_err(|_| io::Error::other("a message of 4 GiB or more"))?;
        file.write_all(&subxid.to_be_bytes())?;
        file.write_all(&length.to_be_bytes())?;
        file.write_all(&data)
    }

    fn replay(self) -> io::Result<Replay> {
        let file = match self.file {
            Some(file) => {
                let mut file = file.into_inner().map_err(io::IntoInnerError::into_error)?;
                file.seek(SeekFrom::Start(0))?;
                Some(BufReader::with_capacity(1 << 20, file))
            }
            None => None,
        };
        Ok(Replay { memory: self.memory.into_iter(), file, aborted: self.aborted })
    }
}

/// A committed streamed transaction's messages, handed on one at a time.
#[derive(Debug)]
pub(crate) struct Replay {
    memory: std::vec::IntoIter<(u32, Bytes)>,
    file: Option<BufReader<File>>,
    aborted: HashSet<u32>,
}

impl Replay {
    /// The next message to decode, skipping the row changes of rolled-back subtransactions;
    /// `None` past the last.
    pub fn next_message(&mut self) -> io::Result<Option<Bytes>> {
        loop {
            let (subxid, data) = match self.memory.next() {
                Some(kept) => kept,
                None => match self.read()? {
                    Some(kept) => kept,
                    None => return Ok(None),
                },
            };
            let description = data.first().is_some_and(|tag| DESCRIPTIONS.contains(tag));
            if description || !self.aborted.contains(&subxid) {
                return Ok(Some(data));
            }
        }
    }

    fn read(&mut self) -> io::Result<Option<(u32, Bytes)>> {
        let Some(file) = &mut self.file else {
            return Ok(None);
        };
        let mut head = [0u8; 8];
        match file.read_exact(&mut head) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                self.file = None;
                return Ok(None);
            }
            Err(error) => return Err(error),
        }
        let subxid = u32::from_be_bytes(head[..4].try_into().expect("four bytes"));
        let length = u32::from_be_bytes(head[4..].try_into().expect("four bytes")) as usize;
        let mut data = vec![0u8; length];
        file.read_exact(&mut data)?;
        Ok(Some((subxid, Bytes::from(data))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamed insert of `subxid` whose payload is `text`.
    fn insert(subxid: u32, text: &str) -> Bytes {
        let mut data = vec![b'I'];
        data.extend_from_slice(&subxid.to_be_bytes());
        data.extend_from_slice(text.as_bytes());
        Bytes::from(data)
    }

    fn relation(subxid: u32) -> Bytes {
        let mut data = vec![b'R'];
        data.extend_from_slice(&subxid.to_be_bytes());
        Bytes::from(data)
    }

    fn everything(mut replay: Replay) -> Vec<Bytes> {
        let mut messages = Vec::new();
        while let Some(message) = replay.next_message().unwrap() {
            messages.push(message);
        }
        messages
    }

    #[test]
    fn a_committed_transaction_comes_back_in_order_from_memory_and_its_file() {
        let mut streamed = StreamedTransactions::default();
        streamed.start(7, true).unwrap();
        streamed.keep(relation(7)).unwrap();
        // Enough to go past the memory bound, so the tail comes from the file.
        let big = "x".repeat(1 << 20);
        let count = MEMORY_BYTES / big.len() + 3;
        let mut sent = vec![relation(7)];
        for index in 0..count {
            let message = insert(7, &format!("{index}{big}"));
            streamed.keep(message.clone()).unwrap();
            sent.push(message);
        }
        streamed.stop();
        assert!(!streamed.in_chunk());
        streamed.start(7, false).unwrap();
        streamed.keep(insert(7, "last")).unwrap();
        sent.push(insert(7, "last"));
        streamed.stop();
        let replay = streamed.commit(7).unwrap();
        assert!(replay.file.is_some(), "the tail went to a file");
        assert_eq!(everything(replay), sent);
        assert_eq!(streamed.open.len(), 0);
    }

    #[test]
    fn a_rolled_back_subtransaction_loses_its_rows_but_not_its_descriptions() {
        let mut streamed = StreamedTransactions::default();
        streamed.start(10, true).unwrap();
        streamed.keep(insert(10, "a")).unwrap();
        streamed.keep(relation(11)).unwrap();
        streamed.keep(insert(11, "rolled back")).unwrap();
        streamed.keep(insert(10, "b")).unwrap();
        streamed.stop();
        // Another transaction streams between, and rolls back whole.
        streamed.start(20, true).unwrap();
        streamed.keep(insert(20, "never")).unwrap();
        streamed.stop();
        streamed.abort(10, 11);
        streamed.abort(20, 20);
        assert_eq!(streamed.open.len(), 1);
        assert_eq!(everything(streamed.commit(10).unwrap()), [insert(10, "a"), relation(11), insert(10, "b")]);
        assert!(matches!(streamed.commit(20), Err(StreamedError::Protocol(_))));
    }

    #[test]
    fn chunks_that_do_not_fit_together_are_refused() {
        let mut streamed = StreamedTransactions::default();
        assert!(matches!(streamed.start(1, false), Err(StreamedError::Protocol(_))));
        assert!(matches!(streamed.keep(insert(1, "a")), Err(StreamedError::Protocol(_))));
        streamed.start(1, true).unwrap();
        assert!(matches!(streamed.start(2, true), Err(StreamedError::Protocol(_))));
        assert!(matches!(streamed.keep(Bytes::from_static(b"I")), Err(StreamedError::Protocol(_))));
        streamed.stop();
        assert!(matches!(streamed.start(1, true), Err(StreamedError::Protocol(_))));
    }
}
