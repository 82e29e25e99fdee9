//! The one error type: a kind (what went wrong), a side (where), a message that names the table,
//! key or field, and a hint that says what to do.

use std::fmt;

use crate::secret;

/// Which party an error came from, so an operator knows where to look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    Source,
    Target,
    /// The local state store (checkpoints, run history, dirty records).
    State,
}

impl Side {
    /// Its name in messages and in a job's field paths: `source`, `target`, `state`.
    pub fn name(self) -> &'static str {
        match self {
            Side::Source => "source",
            Side::Target => "target",
            Side::State => "state",
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.name())
    }
}

/// What kind of failure this is. The retry policy (`retry::is_transient`) decides on the kind
/// alone, so connectors classify driver errors when they build an `Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The job file or command line is invalid. Exit code 2.
    Config,
    /// The server could not be reached (refused, unknown host, timed out).
    Connect,
    /// The server refused the credentials or the privileges are missing.
    Auth,
    /// A connection broke or the server asked for a retry (deadlock, lock wait timeout).
    Unavailable,
    /// Reading from the source failed for a reason a retry will not fix.
    Read,
    /// Writing to the target failed for a reason a retry will not fix.
    Write,
    /// A table or column is missing or cannot be mapped.
    Schema,
    /// A value cannot be carried (bad encoding, out of range) and no dirty-record budget is left.
    Data,
    /// The local state store failed.
    State,
    /// The source no longer has the log position a change stream must resume from (binlog
    /// purged, slot dropped). Never retried: continuing would lose changes.
    PositionLost,
    /// The target's data differs from what a source change expects (a row to update or delete is
    /// missing, a row to insert exists). The job stops naming the table and key.
    Conflict,
    /// A cluster task moved to another worker (a newer fencing epoch holds it in the target):
    /// this worker must stop the task without writing anything more. Never retried.
    Fenced,
    /// The run was stopped by a signal before it completed.
    Interrupted,
}

/// An error with its kind, side, message and hint. Its `Display` never contains a secret: every
/// message is scrubbed of registered secrets on the way out.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    side: Option<Side>,
    message: String,
    hint: Option<String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, side: None, message: secret::scrub(&message.into()), hint: None }
    }

    pub fn config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Config, message)
    }

    pub fn state(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::State, message).on(Side::State)
    }

    /// Names the side the error came from.
    pub fn on(mut self, side: Side) -> Error {
        self.side = Some(side);
        self
    }

    /// Says what the operator should do about it.
    pub fn hint(mut self, hint: impl Into<String>) -> Error {
        self.hint = Some(secret::scrub(&hint.into()));
        self
    }

    /// Prefixes the message with where it happened (`table shop.orders`).
    pub fn context(mut self, context: impl fmt::Display) -> Error {
        self.message = format!("{context}: {}", self.message);
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn side(&self) -> Option<Side> {
        self.side
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The process exit code for this error: 2 for an invalid job, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self.kind {
            ErrorKind::Config => 2,
            _ => 1,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(side) = self.side {
            write!(formatter, "{side}: ")?;
        }
        formatter.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(formatter, " (hint: {hint})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}
