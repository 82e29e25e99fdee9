//! The replication session on a task of its own: it reads the server's messages ahead into a
//! bounded channel, and it reports the target's stored position on its own clock, whether the
//! engine is reading or waiting on a long target commit, so the server never ends the session
//! for silence (`wal_sender_timeout`). When the channel is full it stops reading (the server's
//! WAL waits in the slot) but goes on reporting.

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::super::replication::{Lsn, ReplicationConnection, ReplicationError, ReplicationMessage};

/// How often the session reports the stored position when nothing else makes it: a third of
/// the server's `wal_sender_timeout` (60 s by default), between 100 ms and 10 s.
fn report_every(timeout: Option<Duration>) -> Duration {
    timeout.filter(|timeout| !timeout.is_zero()).map_or(Duration::from_secs(10), |timeout| {
        (timeout / 3).clamp(Duration::from_millis(100), Duration::from_secs(10))
    })
}

/// `wal_sender_timeout` as `SHOW` prints it (`60s`, `1500ms`, `1min`, `0`).
pub(crate) fn parse_timeout(text: &str) -> Option<Duration> {
    let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
    let value: u64 = digits.parse().ok()?;
    Some(match &text[digits.len()..] {
        "ms" => Duration::from_millis(value),
        "" | "s" => Duration::from_secs(value),
        "min" => Duration::from_secs(value * 60),
        "h" => Duration::from_secs(value * 3600),
        _ => return None,
    })
}

/// Messages read ahead of the stream, each one row change (or a transaction's begin or end):
/// on top of the engine's own read-ahead, which is bounded by rows, a few rows more.
const AHEAD: usize = 64;

type Message = Result<ReplicationMessage, ReplicationError>;

/// The running session: its messages, and where to tell it the target's stored position.
#[derive(Debug)]
pub(crate) struct Pump {
    messages: mpsc::Receiver<Message>,
    stored: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl Pump {
    /// Starts the session's task; `stored` is the position the target holds now, `timeout` the
    /// server's `wal_sender_timeout` (`None` when unknown).
    pub(crate) fn start(connection: ReplicationConnection, stored: u64, timeout: Option<Duration>) -> Pump {
        let (sender, messages) = mpsc::channel(AHEAD);
        let (stored_sender, stored_receiver) = watch::channel(stored);
        let task = tokio::spawn(run(connection, sender, stored_receiver, report_every(timeout)));
        Pump { messages, stored: stored_sender, task }
    }

    /// The next message; `None` once the task ended (after it sent its error).
    pub(crate) async fn recv(&mut self) -> Option<Message> {
        self.messages.recv().await
    }

    /// The target stored everything up to `lsn`: the session reports it at once.
    pub(crate) fn stored(&self, lsn: u64) {
        self.stored.send_if_modified(|stored| {
            let moved = lsn > *stored;
            *stored = (*stored).max(lsn);
            moved
        });
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What woke the session's task.
enum Wake {
    Report,
    Stored(bool),
    Read(Message),
    Room(Result<mpsc::OwnedPermit<Message>, mpsc::error::SendError<()>>),
}

async fn run(
    mut connection: ReplicationConnection,
    sender: mpsc::Sender<Message>,
    mut stored: watch::Receiver<u64>,
    every: Duration,
) {
    let mut received = *stored.borrow();
    let mut held: Option<Message> = None;
    let mut clock = tokio::time::interval(every);
    loop {
        let wake = tokio::select! {
            _ = clock.tick() => Wake::Report,
            changed = stored.changed() => Wake::Stored(changed.is_ok()),
            message = connection.recv(), if held.is_none() => Wake::Read(message),
            room = sender.clone().reserve_owned(), if held.is_some() => Wake::Room(room),
        };
        let report = match wake {
            Wake::Report => true,
            Wake::Stored(open) => {
                if !open {
                    return; // The stream was dropped.
                }
                true
            }
            Wake::Read(message) => {
                let reply = match &message {
                    Ok(ReplicationMessage::XLogData { wal_end, .. }) => {
                        received = received.max(wal_end.0);
                        false
                    }
                    Ok(ReplicationMessage::Keepalive { wal_end, reply_requested, .. }) => {
                        received = received.max(wal_end.0);
                        *reply_requested
                    }
                    Err(_) => false,
                };
                held = Some(message);
                reply
            }
            Wake::Room(Ok(permit)) => {
                let message = held.take().expect("a message is held when room is awaited");
                let failed = message.is_err();
                permit.send(message);
                if failed {
                    return;
                }
                false
            }
            Wake::Room(Err(_)) => return,
        };
        if report {
            let at = Lsn(*stored.borrow_and_update());
            if let Err(error) = connection.send_status(Lsn(received.max(at.0)), at, at, false).await {
                let _ = sender.send(Err(error)).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_come_thrice_per_server_timeout_within_bounds() {
        assert_eq!(parse_timeout("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_timeout("1min"), Some(Duration::from_secs(60)));
        assert_eq!(parse_timeout("0"), Some(Duration::ZERO));
        assert_eq!(report_every(parse_timeout("1500ms")), Duration::from_millis(500));
        assert_eq!(report_every(parse_timeout("60s")), Duration::from_secs(10));
        assert_eq!(report_every(parse_timeout("0")), Duration::from_secs(10));
        assert_eq!(report_every(parse_timeout("100ms")), Duration::from_millis(100));
    }
}
