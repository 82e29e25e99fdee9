//! PostgreSQL as a source (`source`, over the walsender client of `replication`) and as a
//! target: connections, error classification, the type mapping and the COPY text encoding.

mod changes;
mod checkpoints;
pub(crate) mod connector;
pub(crate) mod replication;
mod sink;
mod source;
mod tables;
mod trial;

use sluice_core::secret::Secret;
use sluice_core::{DataType, Error, ErrorKind, Side, Value};
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use crate::tls::{ClientTls, TlsParameters, Verification};

pub use sink::PostgresSink;
pub use source::{PostgresSource, Replication};

/// The TLS parameters sluice reads itself, named as libpq names them.
pub(crate) const TLS_PARAMETERS: TlsParameters = TlsParameters {
    mode: "sslmode",
    modes: &["disable", "allow", "prefer", "require", "verify-ca", "verify-full"],
    ca: "sslrootcert",
    cert: "sslcert",
    key: "sslkey",
};

/// A connection URL (or key=value string) as the driver's configuration and the TLS settings,
/// with libpq's `sslmode` semantics: `disable`, `prefer` (the default: TLS when the server
/// offers it, unverified), `require` (TLS, unverified; verified like `verify-ca` when
/// `sslrootcert` is given), `verify-ca`, `verify-full`.
pub(crate) fn endpoint(url: &Secret, side: Side) -> Result<(tokio_postgres::Config, SslMode, ClientTls), Error> {
    let found = TLS_PARAMETERS.read(url.expose());
    let mut config: tokio_postgres::Config = found.rest.parse().map_err(|error| {
        Error::config(format!("{side}.url: not a valid PostgreSQL URL ({error})"))
            .hint("expected postgres://user:password@host:port/database[?sslmode=verify-full&sslrootcert=ca.pem]")
    })?;
    let (mode, verification) = match found.mode.as_deref().unwrap_or("prefer") {
        "disable" => (SslMode::Disable, Verification::Encrypt),
        "allow" | "prefer" => (SslMode::Prefer, Verification::Encrypt),
        "require" if found.ca.is_some() => (SslMode::Require, Verification::Chain),
        "require" => (SslMode::Require, Verification::Encrypt),
        "verify-ca" => (SslMode::Require, Verification::Chain),
        "verify-full" => (SslMode::Require, Verification::Full),
        other => {
            return Err(Error::config(format!(
                "{side}.url: sslmode={other} is not one of {}",
                TLS_PARAMETERS.modes.join(", ")
            )))
        }
    };
    config.ssl_mode(mode);
    Ok((config, mode, found.client(verification)))
}

/// Opens a session pinned to UTC, so `timestamptz` values are read and written as UTC, with ISO
/// dates and the `postgres` interval style, so text forms mean the same on every server.
pub(crate) async fn connect(url: &Secret, side: Side, server: &str) -> Result<Client, Error> {
    let (config, mode, tls) = endpoint(url, side)?;
    let connector = match mode {
        SslMode::Disable => None,
        _ => Some(tls.config().map_err(|error| {
            Error::config(format!("{side}.url: {error}")).on(side).hint("fix sslrootcert, sslcert or sslkey")
        })?),
    };
    let client = match connector {
        Some(tls) => {
            let (client, connection) = config
                .connect(tokio_postgres_rustls::MakeRustlsConnect::new(tls))
                .await
                .map_err(|error| postgres_error(error, side, server, "connect"))?;
            drive(connection);
            client
        }
        None => {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|error| postgres_error(error, side, server, "connect"))?;
            drive(connection);
            client
        }
    };
    client
        .batch_execute(
            "SET TIME ZONE 'UTC'; SET client_encoding = 'UTF8'; SET DateStyle = 'ISO'; SET IntervalStyle = 'postgres'",
        )
        .await
        .map_err(|error| postgres_error(error, side, server, "set up the session"))?;
    Ok(client)
}

/// PostgreSQL's identifier limit (NAMEDATALEN - 1), in bytes.
const MAX_NAME_BYTES: usize = 63;

/// Refuses tables whose names PostgreSQL would truncate.
fn refuse_long_names<'a>(tables: impl IntoIterator<Item = &'a sluice_core::TableSchema>) -> Result<(), Error> {
    crate::refuse_long_names(tables, MAX_NAME_BYTES, "bytes", str::len, "PostgreSQL")
}

/// A name of at most `MAX_NAME_BYTES` made from `name`: itself when short enough, else its
/// start (cut on a character boundary) and a hash of the whole, so two long names stay apart
/// and the same name always gives the same result.
fn bounded_name(name: &str) -> String {
    if name.len() <= MAX_NAME_BYTES {
        return name.to_owned();
    }
    let hash = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3));
    let mut cut = MAX_NAME_BYTES - 17;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}_{hash:016x}", &name[..cut])
}

/// Runs a connection's I/O until its client is dropped or the connection fails.
fn drive(connection: impl std::future::Future<Output = Result<(), tokio_postgres::Error>> + Send + 'static) {
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            log::debug!("postgres connection closed: {error}");
        }
    });
}

/// Classifies a driver error and names the side and the server (without its password).
fn postgres_error(error: tokio_postgres::Error, side: Side, server: &str, doing: &str) -> Error {
    let (kind, hint) = match error.code() {
        Some(code) if *code == SqlState::INVALID_PASSWORD || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
            (ErrorKind::Auth, Some(format!("check the user and password in {side}.url")))
        }
        Some(code) if *code == SqlState::INSUFFICIENT_PRIVILEGE => {
            (ErrorKind::Auth, Some("grant the missing privilege to the user".to_owned()))
        }
        Some(code) if *code == SqlState::INVALID_CATALOG_NAME => {
            (ErrorKind::Connect, Some(format!("create the database or fix {side}.url")))
        }
        Some(code)
            if *code == SqlState::T_R_SERIALIZATION_FAILURE
                || *code == SqlState::T_R_DEADLOCK_DETECTED
                || *code == SqlState::TOO_MANY_CONNECTIONS
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW =>
        {
            (ErrorKind::Unavailable, None)
        }
        Some(code) if *code == SqlState::UNDEFINED_TABLE || *code == SqlState::UNDEFINED_COLUMN => {
            (ErrorKind::Schema, None)
        }
        Some(code) if code.code().starts_with("08") => (ErrorKind::Unavailable, None),
        Some(_) if side == Side::Source => (ErrorKind::Read, None),
        Some(_) => (ErrorKind::Write, None),
        None if doing == "connect" => {
            (ErrorKind::Connect, Some(format!("check that the server at {server} is up and reachable")))
        }
        None => (ErrorKind::Unavailable, None),
    };
    // The driver's Display omits the server's detail; the database error carries it.
    let detail = match error.as_db_error() {
        Some(database) => format!("{}: {}", database.severity(), database.message()),
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    };
    let (kind, hint) = if doing == "connect"
        && error.as_db_error().is_none()
        && crate::tls::is_certificate_failure(&detail)
    {
        (ErrorKind::Auth, Some(crate::tls::HANDSHAKE_HINT.replace("{mode}", "sslmode").replace("{ca}", "sslrootcert")))
    } else if detail.contains("no encryption") {
        (
            ErrorKind::Auth,
            Some(format!(
                "the server accepts only TLS connections: set sslmode=verify-full (or require) in {side}.url"
            )),
        )
    } else {
        (kind, hint)
    };
    let error = Error::new(kind, format!("{doing} on {server}: {detail}")).on(side);
    match hint {
        Some(hint) => error.hint(hint),
        None => error,
    }
}

/// True for errors caused by one row's content (class 22 data exception, class 23 integrity
/// constraint violation): the row is dirty, the batch is not.
fn is_row_error(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| code.code().starts_with("22") || code.code().starts_with("23"))
}

/// Quotes an identifier for PostgreSQL: double quotes, inner quotes doubled.
fn quote(identifier: &str) -> String {
    format!("\"{}\"", identifier.replace('"', "\"\""))
}

/// The PostgreSQL type a logical type is created as. Every mapping holds every value of the
/// source type: unsigned integers widen, MySQL TIME (±838 h) becomes an interval.
fn column_type(data_type: &DataType) -> String {
    match data_type {
        DataType::Boolean => "boolean".into(),
        DataType::Integer { bytes: 1 | 2, unsigned: false } | DataType::Integer { bytes: 1, unsigned: true } => {
            "smallint".into()
        }
        DataType::Integer { bytes: 2 | 3, .. } | DataType::Integer { bytes: 4, unsigned: false } => "integer".into(),
        DataType::Integer { bytes: 4, unsigned: true } | DataType::Integer { bytes: 8, unsigned: false } => {
            "bigint".into()
        }
        DataType::Integer { .. } => "numeric(20,0)".into(),
        DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Decimal { precision: Some(precision), scale } => {
            format!("numeric({precision},{})", scale.unwrap_or(0))
        }
        DataType::Decimal { .. } => "numeric".into(),
        DataType::Text { length: Some(length), .. } => format!("varchar({length})"),
        DataType::Text { .. } | DataType::Enum { .. } | DataType::Set { .. } => "text".into(),
        DataType::Bytes { .. } | DataType::Geometry => "bytea".into(),
        DataType::Bits { width } => format!("bit({width})"),
        DataType::Date => "date".into(),
        DataType::Time { .. } => "interval".into(),
        DataType::DateTime { precision } => format!("timestamp({precision})"),
        DataType::Timestamp { precision } => format!("timestamptz({precision})"),
        DataType::Year => "smallint".into(),
        // `json` keeps the document's text as the source wrote it; `jsonb` would reorder keys.
        DataType::Json => "json".into(),
    }
}

/// Sends rows to a `COPY ... FROM STDIN` statement (text format) in one message. `buffer` is
/// reused from call to call, sized for a batch like the last.
async fn copy_rows<'a>(
    client: &Client,
    statement: &str,
    rows: impl Iterator<Item = &'a sluice_core::Row>,
    buffer: &mut String,
) -> Result<(), tokio_postgres::Error> {
    use futures_util::SinkExt;
    buffer.clear();
    for row in rows {
        for (index, value) in row.iter().enumerate() {
            if index > 0 {
                buffer.push('\t');
            }
            encode_copy(value, buffer);
        }
        buffer.push('\n');
    }
    let sink = client.copy_in::<_, bytes::Bytes>(statement).await?;
    futures_util::pin_mut!(sink);
    let capacity = buffer.len() + buffer.len() / 8;
    let data = std::mem::replace(buffer, String::with_capacity(capacity));
    sink.send(bytes::Bytes::from(data)).await?;
    sink.finish().await?;
    Ok(())
}

/// Sends rows already in COPY text format (`RowEncoding::PostgresCopyText`) through `statement`.
async fn copy_text(client: &Client, statement: &str, rows: bytes::Bytes) -> Result<(), tokio_postgres::Error> {
    use futures_util::SinkExt;
    let sink = client.copy_in::<_, bytes::Bytes>(statement).await?;
    futures_util::pin_mut!(sink);
    sink.send(rows).await?;
    sink.finish().await?;
    Ok(())
}

/// Appends a value in COPY text format: `\N` for NULL, backslash escapes for the rest.
fn encode_copy(value: &Value, output: &mut String) {
    use std::fmt::Write;
    match value {
        Value::Null => output.push_str("\\N"),
        Value::Unchanged => unreachable!(
            "a value the source did not send never reaches a writer: the fold fills it or updates its row in place"
        ),
        Value::Bool(value) => output.push(if *value { 't' } else { 'f' }),
        Value::Int(value) => output.push_str(itoa::Buffer::new().format(*value)),
        Value::UInt(value) => output.push_str(itoa::Buffer::new().format(*value)),
        Value::Float32(value) => encode_float(f64::from(*value), &value.to_string(), output),
        Value::Float64(value) => encode_float(*value, &value.to_string(), output),
        Value::Decimal(value) => output.push_str(value.as_str()),
        Value::Text(text) | Value::Json(text) => escape_copy(text, output),
        Value::Bytes(bytes) => {
            output.push_str("\\\\x");
            for byte in bytes {
                let _ = write!(output, "{byte:02x}");
            }
        }
        Value::Bits { width, value } => {
            let _ = write!(output, "{value:0width$b}", width = *width as usize);
        }
        Value::Timestamp(value) => {
            let _ = write!(output, "{value}+00");
        }
        Value::Date(_) | Value::Time(_) | Value::DateTime(_) => {
            let _ = write!(output, "{value}");
        }
    }
}

fn encode_float(value: f64, text: &str, output: &mut String) {
    if value.is_nan() {
        output.push_str("NaN");
    } else if value.is_infinite() {
        output.push_str(if value > 0.0 { "Infinity" } else { "-Infinity" });
    } else {
        output.push_str(text);
    }
}

/// Escapes the four characters COPY text reads specially. Works on bytes: the escaped ones are
/// ASCII, so the slices between them stay on character boundaries.
fn escape_copy(text: &str, output: &mut String) {
    // Most text needs no escape; a branch-free scan (which the compiler vectorizes) finds out
    // before the byte-by-byte pass.
    let special = text.bytes().fold(false, |found, byte| found | matches!(byte, b'\\' | b'\n' | b'\r' | b'\t'));
    if !special {
        output.push_str(text);
        return;
    }
    let mut start = 0;
    for (index, byte) in text.bytes().enumerate() {
        let escaped = match byte {
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            _ => continue,
        };
        output.push_str(&text[start..index]);
        output.push_str(escaped);
        start = index + 1;
    }
    output.push_str(&text[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_bounded_deterministically_and_stay_apart() {
        let (a, b) = ("x".repeat(70) + "_a", "x".repeat(70) + "_b");
        assert_eq!(bounded_name("short"), "short");
        assert!(bounded_name(&a).len() <= MAX_NAME_BYTES && bounded_name(&b).len() <= MAX_NAME_BYTES);
        assert_ne!(bounded_name(&a), bounded_name(&b));
        assert_eq!(bounded_name(&a), bounded_name(&a));
        for name in ["é".repeat(40), format!("a{}", "é".repeat(40)), "😀".repeat(20)] {
            assert!(bounded_name(&name).len() <= MAX_NAME_BYTES, "{name}");
        }
    }

    #[test]
    fn copy_text_escapes_what_copy_reads_specially() {
        let mut output = String::new();
        for value in [
            Value::Text("a\tb\\c\nd".into()),
            Value::Null,
            Value::Bytes(vec![0, 255]),
            Value::Float64(f64::NEG_INFINITY),
            Value::Bits { width: 3, value: 1 },
        ] {
            encode_copy(&value, &mut output);
            output.push('|');
        }
        assert_eq!(output, "a\\tb\\\\c\\nd|\\N|\\\\x00ff|-Infinity|001|");
    }

    #[test]
    fn every_integer_type_fits_its_column() {
        assert_eq!(column_type(&DataType::Integer { bytes: 8, unsigned: true }), "numeric(20,0)");
        assert_eq!(column_type(&DataType::Integer { bytes: 4, unsigned: true }), "bigint");
        assert_eq!(column_type(&DataType::Integer { bytes: 2, unsigned: true }), "integer");
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}
