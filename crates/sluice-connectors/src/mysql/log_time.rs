//! Times in the binlog: `source.start_position: {time: …}` names the first transaction the
//! binlog dates at or after a time. The date of a transaction is the timestamp of the event that
//! begins it (MariaDB's GTID event, MySQL's GTID or BEGIN event): when its first statement began
//! (for an explicit transaction, MariaDB dates the GTID event at its COMMIT), in whole seconds.
//!
//! The position is found by reading: the files' first transactions are dated by a binary
//! search, then the last file that begins before the time is read until a transaction dated at
//! or after it (`BinlogChangeStream` ends there, as it ends a stream at a stop time).

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row};
use serde_json::json;
use sluice_core::connector::{ChangeStream, StreamEvent};
use sluice_core::filter::TableFilter;
use sluice_core::{Error, ErrorKind, Position, Result, Side};

use super::binlog::{BinlogChangeStream, LogPosition};
use super::mysql_error;

/// Where a binlog is read from to find a time.
pub(super) struct LogReader<'a> {
    pub opts: Opts,
    pub server: &'a str,
    pub server_id: u32,
}

impl LogReader<'_> {
    /// The position where the first transaction dated at or after `time` (seconds since the
    /// epoch) begins; the binlog's end when every transaction is older. A time in the future is
    /// refused: what will be written before it is not known yet.
    pub(super) async fn position_at(&self, connection: &mut Conn, time: u64) -> Result<Position> {
        let now = sluice_core::clock::unix_seconds();
        if time > now {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "start_position time {} is in the future (the source's clock says {})",
                    sluice_core::clock::rfc3339(time),
                    sluice_core::clock::rfc3339(now)
                ),
            )
            .on(Side::Source)
            .hint("give a time that has passed, or no start_position: a cdc job then starts where the source stands"));
        }
        let error = |doing: &'static str| move |error| mysql_error(error, Side::Source, self.server, doing);
        let rows: Vec<Row> = connection.query("SHOW BINARY LOGS").await.map_err(error("list the binary logs"))?;
        let files: Vec<String> = rows.iter().filter_map(|row| row.get::<String, _>(0)).collect();
        let status: Option<Row> =
            connection.query_first("SHOW MASTER STATUS").await.map_err(error("read the binlog position"))?;
        let head = status
            .and_then(|row| Some(LogPosition { file: row.get::<String, _>(0)?, offset: row.get::<u64, _>(1)? }))
            .ok_or_else(|| {
                Error::new(ErrorKind::Config, format!("{} has no binary log (log_bin is off)", self.server))
                    .on(Side::Source)
            })?;
        // The first file whose first transaction is dated at or after the time; the one sought
        // lies in the file before it, or in it.
        let (mut low, mut high) = (0, files.len());
        while low < high {
            let middle = (low + high) / 2;
            match self.first_transaction(&files[middle], 0, &head).await? {
                Some((_, dated)) if dated < time => low = middle + 1,
                _ => high = middle,
            }
        }
        let Some(first) = files.get(low.saturating_sub(1)) else { return Ok(plain(&head)) };
        Ok(match self.first_transaction(first, time, &head).await? {
            Some((position, _)) => position,
            None => plain(&head),
        })
    }

    /// The first transaction from the start of `file` on dated at or after `time`: where it
    /// begins, and its date. `None` when the binlog reaches `head` first.
    async fn first_transaction(&self, file: &str, time: u64, head: &LogPosition) -> Result<Option<(Position, u64)>> {
        let start = Position(json!({"file": file, "position": 4, "gtid": ""}));
        // Selecting no table: the read dates transactions and decodes no row.
        let nothing = TableFilter::new(&["!*".to_owned()]);
        let mut stream = BinlogChangeStream::open(
            self.opts.clone(),
            self.server.to_owned(),
            nothing,
            &start,
            self.server_id,
            1,
            Some(time),
        )
        .await?;
        loop {
            let at = match stream.next().await? {
                StreamEvent::End { position, committed_at } => {
                    let found = LogPosition::from_position(&position)?;
                    return Ok(Some((plain(&found), committed_at)));
                }
                StreamEvent::Advance { position, .. }
                | StreamEvent::Echo { position, .. }
                | StreamEvent::Commit { position, .. }
                | StreamEvent::SchemaChange { position, .. } => position,
                StreamEvent::Changes(_) => continue,
            };
            if LogPosition::from_position(&at)?.key() >= head.key() {
                return Ok(None);
            }
        }
    }
}

/// A file and offset as a start position (no GTIDs: the transactions before it are not known).
fn plain(position: &LogPosition) -> Position {
    Position(json!({"file": position.file, "position": position.offset, "gtid": ""}))
}
