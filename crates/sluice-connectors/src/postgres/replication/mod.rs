//! PostgreSQL logical replication, low level: a walsender client ([`ReplicationConnection`]:
//! startup with `replication=database`, authentication, TLS, replication commands and the
//! copy-both stream of `START_REPLICATION`) and the decoder of the `pgoutput` plugin's
//! messages ([`decode`], protocol versions 1 and 2).
//!
//! tokio-postgres cannot open a replication session (no `replication` startup parameter, no
//! copy-both mode), so the client is written here on the `postgres-protocol` crate's message
//! encoders and decoders.

mod connection;
#[cfg(test)]
mod live_tests;
mod pgoutput;

use std::fmt;
use std::str::FromStr;

pub(crate) use connection::{ReplicationConnection, ReplicationMessage};
pub(crate) use pgoutput::{decode, LogicalMessage, OldTuple, Relation, Tuple, TupleValue};

/// A position in the write-ahead log, printed and parsed as PostgreSQL writes it: the high and
/// low 32 bits in upper-case hexadecimal, separated by a slash (`16/B374D848`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = String;

    /// Parses `X/Y`, each half one to eight hexadecimal digits.
    fn from_str(text: &str) -> Result<Lsn, String> {
        let invalid = || format!("{text:?} is not a WAL position (expected two hexadecimal halves, like 16/B374D848)");
        let (high, low) = text.split_once('/').ok_or_else(invalid)?;
        let half = |digits: &str| {
            if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                return Err(invalid());
            }
            u32::from_str_radix(digits, 16).map_err(|_| invalid())
        };
        Ok(Lsn(u64::from(half(high)?) << 32 | u64::from(half(low)?)))
    }
}

/// Why a replication connection or the decoding of its stream failed. No message holds the
/// password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplicationError {
    /// The socket failed or closed, or the server ended the stream: worth a new connection.
    Io(String),
    /// The server's ErrorResponse: its SQLSTATE (`42704` undefined object: no such slot;
    /// `55006` object in use: the slot is active for another process; `58P01` undefined file:
    /// requested WAL segment already removed; `28P01` wrong password …), message and detail.
    Server { code: String, message: String, detail: Option<String> },
    /// Bytes the protocol does not allow where they came (named).
    Protocol(String),
    /// TLS could not be set up as the URL asks (not offered, a certificate refused, bad files).
    Tls(String),
    /// Authentication could not proceed on the client's side (no password, an unsupported
    /// method, a server signature that does not verify).
    Auth(String),
}

impl ReplicationError {
    /// The SQLSTATE of a server error.
    pub fn code(&self) -> Option<&str> {
        match self {
            ReplicationError::Server { code, .. } => Some(code),
            _ => None,
        }
    }

    pub(crate) fn protocol(message: impl Into<String>) -> ReplicationError {
        ReplicationError::Protocol(message.into())
    }
}

impl fmt::Display for ReplicationError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicationError::Io(message) => write!(formatter, "replication connection: {message}"),
            ReplicationError::Server { code, message, detail } => {
                write!(formatter, "server error {code}: {message}")?;
                match detail {
                    Some(detail) => write!(formatter, " ({detail})"),
                    None => Ok(()),
                }
            }
            ReplicationError::Protocol(message) => write!(formatter, "replication protocol: {message}"),
            ReplicationError::Tls(message) => write!(formatter, "TLS: {message}"),
            ReplicationError::Auth(message) => write!(formatter, "authentication: {message}"),
        }
    }
}

impl std::error::Error for ReplicationError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsn_prints_and_parses_as_postgres_writes_it() {
        for (text, value) in [
            ("0/0", 0),
            ("16/B374D848", 0x16_B374_D848),
            ("FFFFFFFF/FFFFFFFF", u64::MAX),
            ("1/0", 1 << 32),
            ("0/1A", 0x1A),
        ] {
            assert_eq!(text.parse::<Lsn>(), Ok(Lsn(value)), "{text}");
            assert_eq!(Lsn(value).to_string(), text);
        }
        assert_eq!("16/b374d848".parse::<Lsn>(), Ok(Lsn(0x16_B374_D848)));
        for bad in ["", "/", "1/", "/1", "1", "1/2/3", "G/0", "123456789/0", "0/-1", " 0/1", "0/+1"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
        }
        assert!(Lsn(5) < "1/0".parse().unwrap());
    }
}
