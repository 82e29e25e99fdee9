//! The messages of the `pgoutput` logical decoding plugin, protocol versions 1 and 2
//! (PostgreSQL documentation, "Logical Replication Message Formats"), decoded from the data of
//! one XLogData message. Values and contents are slices of the input (no copy); names are
//! owned strings. Truncated or malformed input is a [`ReplicationError::Protocol`] naming the
//! message, never a panic.
//!
//! In protocol version 2 with `streaming 'on'`, a transaction larger than
//! `logical_decoding_work_mem` is sent before it commits, in chunks between Stream Start and
//! Stream Stop; the messages inside a chunk (Relation, Type, Insert, Update, Delete, Truncate,
//! transactional Message) carry the transaction id first. The caller knows whether it is
//! inside a chunk and says so with `decode`'s `streaming` flag.

use bytes::Bytes;

use super::{Lsn, ReplicationError};

/// One decoded `pgoutput` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LogicalMessage {
    /// A transaction starts; `final_lsn` is the LSN of its commit record.
    Begin { final_lsn: Lsn, commit_time: i64, xid: u32 },
    /// A transaction ends. `end_lsn` is the position past its commit: the one to confirm once
    /// the transaction is stored.
    Commit { commit_lsn: Lsn, end_lsn: Lsn, commit_time: i64 },
    /// The shape of a table, sent before its first change (and after each change of shape).
    Relation(Relation),
    /// A non-built-in type used by a column of a Relation.
    Type { xid: Option<u32>, oid: u32, namespace: String, name: String },
    /// A new row.
    Insert { xid: Option<u32>, relation: u32, new: Tuple },
    /// A changed row; `old` is present when the key changed (`Key`) or under `REPLICA IDENTITY
    /// FULL` (`Full`).
    Update { xid: Option<u32>, relation: u32, old: Option<OldTuple>, new: Tuple },
    /// A deleted row: its key columns (the other columns null), or the whole row under
    /// `REPLICA IDENTITY FULL`.
    Delete { xid: Option<u32>, relation: u32, old: OldTuple },
    /// Tables emptied by one TRUNCATE statement.
    Truncate { xid: Option<u32>, cascade: bool, restart_identity: bool, relations: Vec<u32> },
    /// The transaction came from another node through replication origin `name`.
    Origin { commit_lsn: Lsn, name: String },
    /// A message written with `pg_logical_emit_message` (sent with the `messages 'true'`
    /// option).
    Message { xid: Option<u32>, transactional: bool, lsn: Lsn, prefix: String, content: Bytes },
    /// A chunk of an uncommitted (streamed) transaction starts.
    StreamStart { xid: u32, first_segment: bool },
    /// The current chunk of a streamed transaction ends.
    StreamStop,
    /// A streamed transaction committed: apply what its chunks brought.
    StreamCommit { xid: u32, commit_lsn: Lsn, end_lsn: Lsn, commit_time: i64 },
    /// A streamed transaction (`subxid == xid`) or one of its subtransactions rolled back:
    /// discard what the chunks brought for it. (Protocol 4 adds the abort's LSN and time.)
    StreamAbort { xid: u32, subxid: u32, abort: Option<(Lsn, i64)> },
}

/// A table's description in a Relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    /// The streamed transaction it belongs to (protocol 2, inside a stream chunk).
    pub xid: Option<u32>,
    pub oid: u32,
    /// The schema; empty for `pg_catalog`.
    pub namespace: String,
    pub name: String,
    /// `d` default (primary key), `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// A column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelationColumn {
    /// Part of the replica identity (the key sent for updates and deletes).
    pub key: bool,
    pub name: String,
    pub type_oid: u32,
    /// The type modifier (`atttypmod`), -1 when none.
    pub type_modifier: i32,
}

/// The values of a row, one per column of its Relation.
pub(crate) type Tuple = Vec<TupleValue>;

/// The old row of an Update or Delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OldTuple {
    /// The replica identity's columns; the others are [`TupleValue::Null`].
    Key(Tuple),
    /// The whole old row (`REPLICA IDENTITY FULL`).
    Full(Tuple),
}

impl OldTuple {
    /// The values, whichever kind.
    pub fn values(&self) -> &Tuple {
        match self {
            OldTuple::Key(values) | OldTuple::Full(values) => values,
        }
    }
}

/// One column's value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TupleValue {
    Null,
    /// A TOASTed value the change did not touch: it is not in the WAL, the row keeps its value.
    UnchangedToast,
    /// The value in the type's text output form.
    Text(Bytes),
    /// The value in the type's binary form (with the `binary 'true'` option).
    Binary(Bytes),
}

/// Decodes the data of one XLogData message. `streaming` says the message lies between a
/// Stream Start and a Stream Stop (protocol 2), where most messages carry a transaction id.
pub(crate) fn decode(data: Bytes, streaming: bool) -> Result<LogicalMessage, ReplicationError> {
    let Some(&tag) = data.first() else {
        return Err(ReplicationError::protocol("empty pgoutput message"));
    };
    let mut reader = Reader { data, position: 1, message: message_name(tag) };
    let message = match tag {
        b'B' => begin(&mut reader)?,
        b'C' => commit(&mut reader)?,
        b'O' => LogicalMessage::Origin { commit_lsn: reader.lsn()?, name: reader.string()? },
        b'R' => relation(&mut reader, streaming)?,
        b'Y' => LogicalMessage::Type {
            xid: reader.xid(streaming)?,
            oid: reader.u32()?,
            namespace: reader.string()?,
            name: reader.string()?,
        },
        b'I' => insert(&mut reader, streaming)?,
        b'U' => update(&mut reader, streaming)?,
        b'D' => delete(&mut reader, streaming)?,
        b'T' => truncate(&mut reader, streaming)?,
        b'M' => message(&mut reader, streaming)?,
        b'S' => LogicalMessage::StreamStart { xid: reader.u32()?, first_segment: reader.u8()? == 1 },
        b'E' => LogicalMessage::StreamStop,
        b'c' => stream_commit(&mut reader)?,
        b'A' => stream_abort(&mut reader)?,
        other => {
            return Err(ReplicationError::protocol(format!(
                "unknown pgoutput message type {:?} (byte {other})",
                char::from(other)
            )))
        }
    };
    reader.finish()?;
    Ok(message)
}

/// The documentation's name of a message type, for errors.
fn message_name(tag: u8) -> &'static str {
    match tag {
        b'B' => "Begin",
        b'C' => "Commit",
        b'O' => "Origin",
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        b'S' => "Stream Start",
        b'E' => "Stream Stop",
        b'c' => "Stream Commit",
        b'A' => "Stream Abort",
        _ => "unknown",
    }
}

fn begin(reader: &mut Reader) -> Result<LogicalMessage, ReplicationError> {
    Ok(LogicalMessage::Begin { final_lsn: reader.lsn()?, commit_time: reader.i64()?, xid: reader.u32()? })
}

fn commit(reader: &mut Reader) -> Result<LogicalMessage, ReplicationError> {
    let _flags = reader.u8()?;
    Ok(LogicalMessage::Commit { commit_lsn: reader.lsn()?, end_lsn: reader.lsn()?, commit_time: reader.i64()? })
}

fn relation(reader: &mut Reader, streaming: bool) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.xid(streaming)?;
    let oid = reader.u32()?;
    let namespace = reader.string()?;
    let name = reader.string()?;
    let replica_identity = reader.u8()?;
    let count = reader.count()?;
    let mut columns = Vec::with_capacity(count.min(reader.remaining()));
    for _ in 0..count {
        columns.push(RelationColumn {
            key: reader.u8()? & 1 == 1,
            name: reader.string()?,
            type_oid: reader.u32()?,
            type_modifier: reader.i32()?,
        });
    }
    Ok(LogicalMessage::Relation(Relation { xid, oid, namespace, name, replica_identity, columns }))
}

fn insert(reader: &mut Reader, streaming: bool) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.xid(streaming)?;
    let relation = reader.u32()?;
    reader.expect(b'N', "the new tuple's marker")?;
    Ok(LogicalMessage::Insert { xid, relation, new: reader.tuple()? })
}

fn update(reader: &mut Reader, streaming: bool) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.xid(streaming)?;
    let relation = reader.u32()?;
    let old = match reader.u8()? {
        b'K' => Some(OldTuple::Key(reader.tuple()?)),
        b'O' => Some(OldTuple::Full(reader.tuple()?)),
        b'N' => None,
        other => return Err(reader.error(format!("tuple marker {:?} is none of K, O, N", char::from(other)))),
    };
    if old.is_some() {
        reader.expect(b'N', "the new tuple's marker")?;
    }
    Ok(LogicalMessage::Update { xid, relation, old, new: reader.tuple()? })
}

fn delete(reader: &mut Reader, streaming: bool) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.xid(streaming)?;
    let relation = reader.u32()?;
    let old = match reader.u8()? {
        b'K' => OldTuple::Key(reader.tuple()?),
        b'O' => OldTuple::Full(reader.tuple()?),
        other => return Err(reader.error(format!("tuple marker {:?} is neither K nor O", char::from(other)))),
    };
    Ok(LogicalMessage::Delete { xid, relation, old })
}

fn truncate(reader: &mut Reader, streaming: bool) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.xid(streaming)?;
    let count = reader.u32()? as usize;
    let options = reader.u8()?;
    let mut relations = Vec::with_capacity(count.min(reader.remaining() / 4));
    for _ in 0..count {
        relations.push(reader.u32()?);
    }
    Ok(LogicalMessage::Truncate { xid, cascade: options & 1 != 0, restart_identity: options & 2 != 0, relations })
}

fn message(reader: &mut Reader, streaming: bool) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.xid(streaming)?;
    let transactional = reader.u8()? & 1 == 1;
    let lsn = reader.lsn()?;
    let prefix = reader.string()?;
    let length = reader.u32()? as usize;
    let content = reader.bytes(length)?;
    Ok(LogicalMessage::Message { xid, transactional, lsn, prefix, content })
}

fn stream_commit(reader: &mut Reader) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.u32()?;
    let _flags = reader.u8()?;
    Ok(LogicalMessage::StreamCommit {
        xid,
        commit_lsn: reader.lsn()?,
        end_lsn: reader.lsn()?,
        commit_time: reader.i64()?,
    })
}

fn stream_abort(reader: &mut Reader) -> Result<LogicalMessage, ReplicationError> {
    let xid = reader.u32()?;
    let subxid = reader.u32()?;
    let abort = match reader.remaining() {
        0 => None,
        _ => Some((reader.lsn()?, reader.i64()?)),
    };
    Ok(LogicalMessage::StreamAbort { xid, subxid, abort })
}

/// Reads a message's fields in order; every failure names the message and the offset.
struct Reader {
    data: Bytes,
    position: usize,
    message: &'static str,
}

impl Reader {
    fn error(&self, what: impl std::fmt::Display) -> ReplicationError {
        ReplicationError::Protocol(format!(
            "pgoutput {} message: {what} (at byte {} of {})",
            self.message,
            self.position,
            self.data.len()
        ))
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.position
    }

    /// The next `length` bytes, as a slice of the input.
    fn bytes(&mut self, length: usize) -> Result<Bytes, ReplicationError> {
        if self.remaining() < length {
            return Err(self.error(format!("truncated: {length} more bytes expected, {} left", self.remaining())));
        }
        let slice = self.data.slice(self.position..self.position + length);
        self.position += length;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ReplicationError> {
        let mut array = [0; N];
        array.copy_from_slice(&self.bytes(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, ReplicationError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, ReplicationError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, ReplicationError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, ReplicationError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, ReplicationError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn lsn(&mut self) -> Result<Lsn, ReplicationError> {
        Ok(Lsn(u64::from_be_bytes(self.array()?)))
    }

    /// A column count (Int16).
    fn count(&mut self) -> Result<usize, ReplicationError> {
        Ok(usize::from(self.u16()?))
    }

    /// The transaction id that precedes the body inside a stream chunk.
    fn xid(&mut self, streaming: bool) -> Result<Option<u32>, ReplicationError> {
        match streaming {
            true => Ok(Some(self.u32()?)),
            false => Ok(None),
        }
    }

    fn expect(&mut self, byte: u8, what: &str) -> Result<(), ReplicationError> {
        match self.u8()? {
            found if found == byte => Ok(()),
            found => Err(self.error(format!("{what} is {:?}, not {:?}", char::from(found), char::from(byte)))),
        }
    }

    /// A null-terminated UTF-8 string.
    fn string(&mut self) -> Result<String, ReplicationError> {
        let rest = &self.data[self.position..];
        let Some(end) = rest.iter().position(|byte| *byte == 0) else {
            return Err(self.error("truncated: a string without its terminating zero"));
        };
        let text = std::str::from_utf8(&rest[..end])
            .map_err(|error| self.error(format!("a string is not UTF-8 ({error})")))?
            .to_owned();
        self.position += end + 1;
        Ok(text)
    }

    /// TupleData: a column count, then per column its kind and, for data, its length and bytes.
    fn tuple(&mut self) -> Result<Tuple, ReplicationError> {
        let count = self.count()?;
        let mut values = Vec::with_capacity(count.min(self.remaining()));
        for _ in 0..count {
            let value = match self.u8()? {
                b'n' => TupleValue::Null,
                b'u' => TupleValue::UnchangedToast,
                b't' => TupleValue::Text(self.value()?),
                b'b' => TupleValue::Binary(self.value()?),
                other => return Err(self.error(format!("column kind {:?} is none of n, u, t, b", char::from(other)))),
            };
            values.push(value);
        }
        Ok(values)
    }

    fn value(&mut self) -> Result<Bytes, ReplicationError> {
        let length = self.u32()? as usize;
        self.bytes(length)
    }

    /// Refuses bytes left over after the last field.
    fn finish(&self) -> Result<(), ReplicationError> {
        match self.remaining() {
            0 => Ok(()),
            left => Err(self.error(format!("{left} bytes left over after the last field"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};

    use super::*;

    /// Builds a message the way pgoutput writes it.
    #[derive(Default)]
    struct Build(BytesMut);

    impl Build {
        fn new(tag: u8) -> Build {
            Build::default().u8(tag)
        }
        fn u8(mut self, value: u8) -> Build {
            self.0.put_u8(value);
            self
        }
        fn u16(mut self, value: u16) -> Build {
            self.0.put_u16(value);
            self
        }
        fn u32(mut self, value: u32) -> Build {
            self.0.put_u32(value);
            self
        }
        fn i32(mut self, value: i32) -> Build {
            self.0.put_i32(value);
            self
        }
        fn u64(mut self, value: u64) -> Build {
            self.0.put_u64(value);
            self
        }
        fn i64(mut self, value: i64) -> Build {
            self.0.put_i64(value);
            self
        }
        fn string(mut self, value: &str) -> Build {
            self.0.put_slice(value.as_bytes());
            self.0.put_u8(0);
            self
        }
        fn text(self, value: &str) -> Build {
            self.u8(b't').u32(value.len() as u32).raw(value.as_bytes())
        }
        fn raw(mut self, value: &[u8]) -> Build {
            self.0.put_slice(value);
            self
        }
        fn done(self) -> Bytes {
            self.0.freeze()
        }
    }

    fn text(value: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(value.as_bytes()))
    }

    /// Every prefix of a message is refused with an error naming it, and never panics.
    fn assert_truncations_refused(data: &Bytes, streaming: bool, name: &str) {
        for cut in 0..data.len() {
            match decode(data.slice(..cut), streaming) {
                Err(ReplicationError::Protocol(message)) => {
                    assert!(cut == 0 || message.contains(&format!("pgoutput {name} message")), "{message}")
                }
                other => panic!("{name} cut at {cut} of {}: {other:?}", data.len()),
            }
        }
    }

    /// Decodes, checks the result, and checks that every truncation is refused.
    fn check(data: Bytes, streaming: bool, expected: LogicalMessage) {
        assert_eq!(decode(data.clone(), streaming).unwrap(), expected);
        let name = message_name(data[0]);
        assert_truncations_refused(&data, streaming, name);
        let mut longer = BytesMut::from(&data[..]);
        longer.put_u8(0);
        // Left over, or (Stream Abort) the start of protocol 4's optional fields, cut short.
        let error = decode(longer.freeze(), streaming).unwrap_err().to_string();
        assert!(error.contains("left over") || error.contains("Stream Abort message: truncated"), "{error}");
    }

    #[test]
    fn transaction_frames_decode() {
        check(
            Build::new(b'B').u64(0x1_0000_0010).i64(725_000_000_000_000).u32(771).done(),
            false,
            LogicalMessage::Begin { final_lsn: Lsn(0x1_0000_0010), commit_time: 725_000_000_000_000, xid: 771 },
        );
        check(
            Build::new(b'C').u8(0).u64(16).u64(48).i64(-5).done(),
            false,
            LogicalMessage::Commit { commit_lsn: Lsn(16), end_lsn: Lsn(48), commit_time: -5 },
        );
        check(
            Build::new(b'O').u64(99).string("node_a").done(),
            false,
            LogicalMessage::Origin { commit_lsn: Lsn(99), name: "node_a".into() },
        );
    }

    #[test]
    fn relation_and_type_decode_with_and_without_a_streamed_xid() {
        let body = |build: Build| {
            build
                .u32(16384)
                .string("public")
                .string("t")
                .u8(b'd')
                .u16(2)
                .u8(1)
                .string("id")
                .u32(25)
                .i32(-1)
                .u8(0)
                .string("amount")
                .u32(1700)
                .i32(655366)
                .done()
        };
        let relation = |xid| {
            LogicalMessage::Relation(Relation {
                xid,
                oid: 16384,
                namespace: "public".into(),
                name: "t".into(),
                replica_identity: b'd',
                columns: vec![
                    RelationColumn { key: true, name: "id".into(), type_oid: 25, type_modifier: -1 },
                    RelationColumn { key: false, name: "amount".into(), type_oid: 1700, type_modifier: 655366 },
                ],
            })
        };
        check(body(Build::new(b'R')), false, relation(None));
        check(body(Build::new(b'R').u32(900)), true, relation(Some(900)));
        check(
            Build::new(b'Y').u32(7).u32(16400).string("").string("mood").done(),
            true,
            LogicalMessage::Type { xid: Some(7), oid: 16400, namespace: "".into(), name: "mood".into() },
        );
    }

    #[test]
    fn row_changes_decode_every_column_kind() {
        let tuple = |build: Build| build.u16(4).text("k1").u8(b'n').u8(b'u').u8(b'b').u32(2).raw(&[0, 255]);
        let values = vec![
            text("k1"),
            TupleValue::Null,
            TupleValue::UnchangedToast,
            TupleValue::Binary(Bytes::from_static(&[0, 255])),
        ];
        check(
            tuple(Build::new(b'I').u32(16384).u8(b'N')).done(),
            false,
            LogicalMessage::Insert { xid: None, relation: 16384, new: values.clone() },
        );
        check(
            tuple(Build::new(b'U').u32(16384).u8(b'N')).done(),
            false,
            LogicalMessage::Update { xid: None, relation: 16384, old: None, new: values.clone() },
        );
        check(
            tuple(Build::new(b'U').u32(16384).u8(b'K').u16(1).text("k0").u8(b'N')).done(),
            false,
            LogicalMessage::Update {
                xid: None,
                relation: 16384,
                old: Some(OldTuple::Key(vec![text("k0")])),
                new: values.clone(),
            },
        );
        check(
            tuple(tuple(Build::new(b'U').u32(4).u32(16384).u8(b'O')).u8(b'N')).done(),
            true,
            LogicalMessage::Update {
                xid: Some(4),
                relation: 16384,
                old: Some(OldTuple::Full(values.clone())),
                new: values.clone(),
            },
        );
        check(
            Build::new(b'D').u32(16384).u8(b'K').u16(2).text("k0").u8(b'n').done(),
            false,
            LogicalMessage::Delete {
                xid: None,
                relation: 16384,
                old: OldTuple::Key(vec![text("k0"), TupleValue::Null]),
            },
        );
        check(
            tuple(Build::new(b'D').u32(5).u32(16384).u8(b'O')).done(),
            true,
            LogicalMessage::Delete { xid: Some(5), relation: 16384, old: OldTuple::Full(values.clone()) },
        );
        check(
            tuple(Build::new(b'I').u32(6).u32(16384).u8(b'N')).done(),
            true,
            LogicalMessage::Insert { xid: Some(6), relation: 16384, new: values },
        );
        // An empty row (a table without columns) is a row.
        check(
            Build::new(b'I').u32(1).u8(b'N').u16(0).done(),
            false,
            LogicalMessage::Insert { xid: None, relation: 1, new: vec![] },
        );
    }

    #[test]
    fn values_are_slices_of_the_input() {
        let data = Build::new(b'I').u32(1).u8(b'N').u16(1).text("shared").done();
        let LogicalMessage::Insert { new, .. } = decode(data.clone(), false).unwrap() else { panic!() };
        let TupleValue::Text(value) = &new[0] else { panic!() };
        assert_eq!(value.as_ptr(), data[data.len() - 6..].as_ptr());
    }

    #[test]
    fn truncate_and_logical_messages_decode() {
        check(
            Build::new(b'T').u32(2).u8(3).u32(16384).u32(16390).done(),
            false,
            LogicalMessage::Truncate {
                xid: None,
                cascade: true,
                restart_identity: true,
                relations: vec![16384, 16390],
            },
        );
        check(
            Build::new(b'T').u32(8).u32(1).u8(0).u32(16384).done(),
            true,
            LogicalMessage::Truncate { xid: Some(8), cascade: false, restart_identity: false, relations: vec![16384] },
        );
        check(
            Build::new(b'M').u8(1).u64(0x20).string("sluice").u32(3).raw(b"a\0b").done(),
            false,
            LogicalMessage::Message {
                xid: None,
                transactional: true,
                lsn: Lsn(0x20),
                prefix: "sluice".into(),
                content: Bytes::from_static(b"a\0b"),
            },
        );
        check(
            Build::new(b'M').u32(12).u8(0).u64(0x20).string("p").u32(0).done(),
            true,
            LogicalMessage::Message {
                xid: Some(12),
                transactional: false,
                lsn: Lsn(0x20),
                prefix: "p".into(),
                content: Bytes::new(),
            },
        );
    }

    #[test]
    fn stream_frames_decode() {
        check(
            Build::new(b'S').u32(900).u8(1).done(),
            false,
            LogicalMessage::StreamStart { xid: 900, first_segment: true },
        );
        check(
            Build::new(b'S').u32(900).u8(0).done(),
            false,
            LogicalMessage::StreamStart { xid: 900, first_segment: false },
        );
        assert_eq!(decode(Build::new(b'E').done(), true).unwrap(), LogicalMessage::StreamStop);
        check(
            Build::new(b'c').u32(900).u8(0).u64(0x100).u64(0x180).i64(42).done(),
            false,
            LogicalMessage::StreamCommit { xid: 900, commit_lsn: Lsn(0x100), end_lsn: Lsn(0x180), commit_time: 42 },
        );
        check(
            Build::new(b'A').u32(900).u32(901).done(),
            false,
            LogicalMessage::StreamAbort { xid: 900, subxid: 901, abort: None },
        );
        assert_eq!(
            decode(Build::new(b'A').u32(900).u32(900).u64(7).i64(8).done(), false).unwrap(),
            LogicalMessage::StreamAbort { xid: 900, subxid: 900, abort: Some((Lsn(7), 8)) }
        );
    }

    #[test]
    fn malformed_messages_are_refused_by_name() {
        let error = |data: Bytes| decode(data, false).unwrap_err().to_string();
        assert!(error(Bytes::new()).contains("empty"));
        assert!(error(Build::new(b'Z').done()).contains("unknown pgoutput message type 'Z'"));
        assert!(
            error(Build::new(b'I').u32(1).u8(b'X').done()).contains("pgoutput Insert message: the new tuple's marker")
        );
        assert!(error(Build::new(b'U').u32(1).u8(b'X').done()).contains("pgoutput Update message: tuple marker 'X'"));
        assert!(error(Build::new(b'D').u32(1).u8(b'N').u16(0).done()).contains("pgoutput Delete message"));
        assert!(error(Build::new(b'I').u32(1).u8(b'N').u16(1).u8(b'x').done()).contains("column kind 'x'"));
        assert!(error(Build::new(b'O').u64(1).raw(b"no end").done()).contains("terminating zero"));
        assert!(error(Build::new(b'O').u64(1).raw(&[0xff, 0]).done()).contains("not UTF-8"));
        // A length beyond the data, even a huge one, is refused without allocating it.
        let huge = Build::new(b'I').u32(1).u8(b'N').u16(1).u8(b't').u32(u32::MAX).raw(b"x").done();
        assert!(error(huge).contains("truncated"));
        let many = Build::new(b'T').u32(u32::MAX).u8(0).u32(1).done();
        assert!(error(many).contains("pgoutput Truncate message: truncated"));
    }
}
