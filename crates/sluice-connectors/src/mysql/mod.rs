//! MySQL and MariaDB: connections, error classification, the type mapping and value decoding.

mod binlog;
mod changes;
mod checkpoints;
pub(crate) mod connector;
mod ddl;
mod decoded;
mod gtid;
mod keyless;
mod log_time;
mod logged;
mod rows;
mod sink;
mod source;
mod tables;
mod trial;
mod wire;
mod writes;

use std::sync::Arc;
use std::time::Duration;

use mysql_async::{ClientIdentity, Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts, SslOpts};

use crate::tls::{TlsParameters, Verification};
use sluice_core::secret::{self, Secret};
use sluice_core::{DataType, Date, DateTime, Decimal, Error, ErrorKind, Side, Time, Value};

pub use sink::MysqlSink;
pub use source::{default_server_id, MysqlSource, StreamOptions};

/// Every session is pinned to UTC, so `TIMESTAMP` values arrive as UTC instants, and to
/// utf8mb4, so text of any column charset arrives as UTF-8.
pub(super) const SESSION_SETUP: [&str; 3] =
    ["SET time_zone = '+00:00'", "SET NAMES utf8mb4", "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"];

/// The TLS parameters sluice reads itself, named as the MySQL client's options.
pub(crate) const TLS_PARAMETERS: TlsParameters = TlsParameters {
    mode: "ssl-mode",
    modes: &["DISABLED", "PREFERRED", "REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"],
    ca: "ssl-ca",
    cert: "ssl-cert",
    key: "ssl-key",
};

/// A MySQL URL resolved: the driver's options (TLS set when it is used) and the TLS
/// configuration of the lean reader (`None`: plaintext).
#[derive(Debug, Clone)]
pub(super) struct Endpoint {
    pub(super) opts: Opts,
    pub(super) tls: Option<Arc<rustls::ClientConfig>>,
}

/// Resolves a URL, with the MySQL client's `ssl-mode` semantics: `DISABLED`, `PREFERRED` (the
/// default: TLS, unverified, when the server offers it; plaintext otherwise, with a warning),
/// `REQUIRED` (TLS, unverified), `VERIFY_CA`, `VERIFY_IDENTITY`; `ssl-ca`, `ssl-cert` and
/// `ssl-key` name PEM files. A Unix socket never uses TLS. Sessions are pinned as
/// `SESSION_SETUP` says.
fn endpoint(url: &Secret, side: Side) -> Result<Endpoint, Error> {
    let found = TLS_PARAMETERS.read(url.expose());
    let opts = Opts::from_url(&found.rest).map_err(|error| {
        Error::config(format!("{side}.url: not a valid MySQL URL ({})", secret::scrub(&error.to_string())))
            .hint("expected mysql://user:password@host:port[?ssl-mode=VERIFY_IDENTITY&ssl-ca=ca.pem]")
    })?;
    let mode = found.mode.clone().unwrap_or_else(|| "PREFERRED".to_owned()).to_ascii_uppercase();
    let verification = match mode.as_str() {
        "DISABLED" => None,
        // As libpq's `require`: a CA given is a CA to check the chain against.
        "PREFERRED" | "REQUIRED" if found.ca.is_some() => Some(Verification::Chain),
        "PREFERRED" | "REQUIRED" => Some(Verification::Encrypt),
        "VERIFY_CA" => Some(Verification::Chain),
        "VERIFY_IDENTITY" => Some(Verification::Full),
        other => {
            return Err(Error::config(format!(
                "{side}.url: ssl-mode={other} is not one of {}",
                TLS_PARAMETERS.modes.join(", ")
            )))
        }
    };
    let tls = found.client(verification.unwrap_or(Verification::Encrypt));
    let builder = OptsBuilder::from_opts(opts.clone()).init(SESSION_SETUP.to_vec());
    let use_tls = match verification {
        None => false,
        Some(_) if opts.socket().is_some() => false,
        Some(_) if mode == "PREFERRED" => {
            let server = format!("{}:{}", opts.ip_or_hostname(), opts.tcp_port());
            let offered = blocking(|| wire::offers_tls(opts.ip_or_hostname(), opts.tcp_port(), PROBE_TIMEOUT));
            match &offered {
                Ok(false) if first_warning(&server) => log::warn!(
                    "the MySQL server at {server} offers no TLS; connecting in plaintext (ssl-mode=PREFERRED; \
                     set ssl-mode=REQUIRED or stricter to refuse)"
                ),
                Err(error) if first_warning(&server) => log::warn!(
                    "cannot tell whether the MySQL server at {server} offers TLS ({error}); connecting in plaintext \
                     (ssl-mode=PREFERRED; set ssl-mode=REQUIRED or stricter to refuse)"
                ),
                _ => {}
            }
            offered.unwrap_or(false)
        }
        Some(_) => true,
    };
    if !use_tls {
        return Ok(Endpoint { opts: builder.into(), tls: None });
    }
    let config = tls.config().map_err(|error| {
        Error::config(format!("{side}.url: {error}")).on(side).hint("fix ssl-ca, ssl-cert or ssl-key")
    })?;
    let mut ssl = SslOpts::default().with_danger_accept_invalid_certs(tls.verification == Verification::Encrypt);
    if tls.verification == Verification::Chain {
        // mysql_async's "skip the name" does not recognise rustls' name error, so it is given a
        // name the certificate holds (read over a handshake whose chain was checked).
        let config = Arc::new(config.clone());
        match blocking(|| wire::certificate_name(opts.ip_or_hostname(), opts.tcp_port(), config, PROBE_TIMEOUT)) {
            Ok(name) => ssl = ssl.with_danger_tls_hostname_override(Some(name)),
            Err(error) if crate::tls::is_certificate_failure(&error) => {
                return Err(Error::new(
                    ErrorKind::Auth,
                    format!("{side}: TLS to {}:{}: {error}", opts.ip_or_hostname(), opts.tcp_port()),
                )
                .on(side)
                .hint(tls_hint()))
            }
            // Unreachable for now: the driver checks the URL's host name, which holds when it
            // is the certificate's; connecting will say what is wrong otherwise.
            Err(error) => log::debug!("{side}: cannot read the server's certificate names yet: {error}"),
        }
    }
    if let Some(ca) = &tls.ca {
        ssl = ssl.with_root_certs(vec![ca.clone().into()]).with_disable_built_in_roots(true);
    }
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        ssl = ssl.with_client_identity(Some(ClientIdentity::new(cert.clone().into(), key.clone().into())));
    }
    Ok(Endpoint { opts: builder.ssl_opts(ssl).into(), tls: Some(Arc::new(config)) })
}

/// How long a look at the server while resolving an endpoint may wait, per step.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs a short blocking look at the server without holding up the other tasks of a
/// multi-threaded runtime.
fn blocking<T>(probe: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(probe)
        }
        _ => probe(),
    }
}

/// True the first time it is asked about `server` in this process: a warning about a server
/// is worth one line, not one per connection pool.
fn first_warning(server: &str) -> bool {
    static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if warned.iter().any(|known| known == server) {
        return false;
    }
    warned.push(server.to_owned());
    true
}

/// Builds a connection pool for one side. Nothing connects until first use.
fn pool(endpoint: &Endpoint, connections: usize) -> Result<Pool, Error> {
    let opts = endpoint.opts.clone();
    let constraints = PoolConstraints::new(0, connections.max(1)).expect("0 <= max");
    let builder = OptsBuilder::from_opts(opts)
        .prefer_socket(false)
        .stmt_cache_size(64)
        .pool_opts(PoolOpts::default().with_constraints(constraints));
    Ok(Pool::new(builder))
}

/// Classifies a driver error and names the side and the server (without its password).
fn mysql_error(error: mysql_async::Error, side: Side, server: &str, doing: &str) -> Error {
    use mysql_async::Error as Driver;
    let (kind, hint) = match &error {
        Driver::Server(server_error) => server_error_kind(server_error.code, side),
        // A certificate refused or no TLS where the URL asks for it: settings, not a moment.
        Driver::Io(mysql_async::IoError::Tls(_))
        | Driver::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => (ErrorKind::Auth, Some(tls_hint())),
        Driver::Io(mysql_async::IoError::Io(io)) if io.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) => {
            (ErrorKind::Auth, Some(tls_hint()))
        }
        Driver::Io(_) => io_error_kind(server),
        Driver::Driver(_) if error.is_fatal() => (ErrorKind::Unavailable, None),
        Driver::Url(_) => (ErrorKind::Config, None),
        _ => (read_or_write(side), None),
    };
    classified(kind, hint, format!("{doing} on {server}: {error}"), side)
}

/// Classifies an error of the lean reader as [`mysql_error`] does the driver's.
fn wire_error(error: wire::WireError, side: Side, server: &str, doing: &str) -> Error {
    use wire::WireError as Wire;
    let (kind, hint) = match &error {
        Wire::Server { code, .. } => server_error_kind(*code, side),
        Wire::Io(_) => io_error_kind(server),
        Wire::Unsupported(_) | Wire::Protocol(_) => (read_or_write(side), None),
        Wire::Tls(_) => (ErrorKind::Auth, Some(tls_hint())),
    };
    classified(kind, hint, format!("{doing} on {server}: {error}"), side)
}

/// What to do when a TLS connection to MySQL fails.
fn tls_hint() -> String {
    crate::tls::HANDSHAKE_HINT.replace("{mode}", "ssl-mode").replace("{ca}", "ssl-ca")
}

/// The kind of a server error code, and what to do about it.
fn server_error_kind(code: u16, side: Side) -> (ErrorKind, Option<String>) {
    match code {
        // Access denied (user or password; database).
        1045 | 1044 | 1698 => (ErrorKind::Auth, Some(format!("check the user and password in {side}.url"))),
        // Insecure transport refused (MySQL 3159, MariaDB 4036).
        3159 | 4036 => (
            ErrorKind::Auth,
            Some(format!(
                "the server accepts only TLS connections: set ssl-mode=VERIFY_IDENTITY (or REQUIRED) in {side}.url"
            )),
        ),
        1142 | 1143 | 1227 => (ErrorKind::Auth, Some("grant the missing privilege to the user".to_owned())),
        1146 | 1049 | 1054 => (ErrorKind::Schema, None),
        // Deadlock, lock wait timeout, server shutting down, too many connections.
        1213 | 1205 | 1053 | 1040 => (ErrorKind::Unavailable, None),
        _ => (read_or_write(side), None),
    }
}

fn io_error_kind(server: &str) -> (ErrorKind, Option<String>) {
    (ErrorKind::Connect, Some(format!("check that the server at {server} is up and reachable")))
}

fn read_or_write(side: Side) -> ErrorKind {
    if side == Side::Source {
        ErrorKind::Read
    } else {
        ErrorKind::Write
    }
}

fn classified(kind: ErrorKind, hint: Option<String>, message: String, side: Side) -> Error {
    let error = Error::new(kind, message).on(side);
    match hint {
        Some(hint) => error.hint(hint),
        None => error,
    }
}

/// The server's flavor as its version names it: `mariadb` or `mysql`.
async fn flavor(connection: &mut mysql_async::Conn, side: Side, server: &str) -> Result<&'static str, Error> {
    use mysql_async::prelude::Queryable;
    let version: Option<String> = connection
        .query_first("SELECT VERSION()")
        .await
        .map_err(|error| mysql_error(error, side, server, "read the server version"))?;
    Ok(if version.unwrap_or_default().contains("MariaDB") { "mariadb" } else { "mysql" })
}

/// MySQL's and MariaDB's identifier limit, in characters.
const MAX_NAME_CHARACTERS: usize = 64;

/// Refuses tables whose names MySQL cannot hold.
fn refuse_long_names<'a>(tables: impl IntoIterator<Item = &'a sluice_core::TableSchema>) -> Result<(), Error> {
    crate::refuse_long_names(tables, MAX_NAME_CHARACTERS, "characters", |name| name.chars().count(), "MySQL")
}

/// Quotes an identifier for MySQL: backticks, inner backticks doubled.
fn quote(identifier: &str) -> String {
    format!("`{}`", identifier.replace('`', "``"))
}

/// Maps an `information_schema.COLUMNS` row to a logical type.
struct ColumnType<'a> {
    data_type: &'a str,
    column_type: &'a str,
    precision: Option<u64>,
    scale: Option<u64>,
    length: Option<u64>,
    datetime_precision: Option<u64>,
}

impl ColumnType<'_> {
    fn logical(&self) -> DataType {
        let unsigned = self.column_type.contains("unsigned");
        let fsp = self.datetime_precision.unwrap_or(0).min(6) as u8;
        let length = self.length.and_then(|length| u32::try_from(length).ok());
        match self.data_type {
            "tinyint" => DataType::Integer { bytes: 1, unsigned },
            "smallint" => DataType::Integer { bytes: 2, unsigned },
            "mediumint" => DataType::Integer { bytes: 3, unsigned },
            "int" | "integer" => DataType::Integer { bytes: 4, unsigned },
            "bigint" => DataType::Integer { bytes: 8, unsigned },
            "float" => DataType::Float32,
            "double" | "real" => DataType::Float64,
            "decimal" | "numeric" => DataType::Decimal {
                precision: self.precision.map(|precision| precision as u32),
                scale: self.scale.map(|scale| scale as u32),
            },
            "char" => DataType::Text { length, fixed: true },
            "varchar" => DataType::Text { length, fixed: false },
            "tinytext" | "text" | "mediumtext" | "longtext" => DataType::Text { length: None, fixed: false },
            "binary" => DataType::Bytes { length, fixed: true },
            "varbinary" => DataType::Bytes { length, fixed: false },
            "tinyblob" | "blob" | "mediumblob" | "longblob" => DataType::Bytes { length: None, fixed: false },
            "bit" => DataType::Bits { width: self.precision.unwrap_or(1).clamp(1, 64) as u8 },
            "date" => DataType::Date,
            "time" => DataType::Time { precision: fsp },
            "datetime" => DataType::DateTime { precision: fsp },
            "timestamp" => DataType::Timestamp { precision: fsp },
            "year" => DataType::Year,
            "json" => DataType::Json,
            "enum" => DataType::Enum { values: enum_values(self.column_type) },
            "set" => DataType::Set { values: enum_values(self.column_type) },
            "geometry" | "point" | "linestring" | "polygon" | "multipoint" | "multilinestring" | "multipolygon"
            | "geometrycollection" => DataType::Geometry,
            // MariaDB reports JSON columns as longtext with a check; anything else unknown is
            // carried as text and named in docs/types.md.
            _ => DataType::Text { length: None, fixed: false },
        }
    }
}

/// The quoted members of `enum('a','b''c')` or `set(...)`.
fn enum_values(column_type: &str) -> Vec<String> {
    let inner = column_type.split_once('(').map_or("", |(_, rest)| rest.strip_suffix(')').unwrap_or(rest));
    let mut values = Vec::new();
    let mut current = String::new();
    let mut characters = inner.chars().peekable();
    let mut quoted = false;
    while let Some(character) = characters.next() {
        match (character, quoted) {
            ('\'', false) => quoted = true,
            ('\'', true) if characters.peek() == Some(&'\'') => {
                characters.next();
                current.push('\'');
            }
            ('\'', true) => {
                quoted = false;
                values.push(std::mem::take(&mut current));
            }
            (character, true) => current.push(character),
            _ => {}
        }
    }
    values
}

/// Decodes a value of the binary protocol as the column's logical type.
fn decode(value: mysql_async::Value, data_type: &DataType) -> Result<Value, String> {
    use mysql_async::Value as My;
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).map_err(|_| "text is not valid UTF-8".to_owned());
    Ok(match (value, data_type) {
        (My::NULL, _) => Value::Null,
        (My::Int(integer), DataType::Boolean) => Value::Bool(integer != 0),
        (My::Int(integer), DataType::Integer { unsigned: true, .. }) => Value::UInt(integer as u64),
        (My::Int(integer), _) => Value::Int(integer),
        (My::UInt(integer), DataType::Integer { unsigned: true, .. }) => Value::UInt(integer),
        (My::UInt(integer), _) => match i64::try_from(integer) {
            Ok(integer) => Value::Int(integer),
            Err(_) => Value::UInt(integer),
        },
        (My::Float(float), DataType::Float64) => Value::Float64(f64::from(float)),
        (My::Float(float), _) => Value::Float32(float),
        (My::Double(double), DataType::Float32) => Value::Float32(double as f32),
        (My::Double(double), _) => Value::Float64(double),
        (My::Date(year, month, day, hour, minute, second, microsecond), data_type) => {
            let date = Date { year, month, day };
            let date_time = DateTime { date, hour, minute, second, microsecond };
            match data_type {
                DataType::Date => Value::Date(date),
                DataType::Timestamp { .. } => Value::Timestamp(date_time),
                _ => Value::DateTime(date_time),
            }
        }
        (My::Time(negative, days, hours, minutes, seconds, microseconds), _) => {
            Value::Time(Time { negative, hours: days * 24 + u32::from(hours), minutes, seconds, microseconds })
        }
        (My::Bytes(bytes), DataType::Decimal { .. }) => {
            let text = text(bytes)?;
            Value::Decimal(Decimal::parse(&text).ok_or_else(|| format!("'{text}' is not a decimal"))?)
        }
        (My::Bytes(bytes), DataType::Bits { width }) => {
            Value::Bits { width: *width, value: bytes.iter().fold(0u64, |value, byte| value << 8 | u64::from(*byte)) }
        }
        (My::Bytes(bytes), DataType::Bytes { .. } | DataType::Geometry) => Value::Bytes(bytes),
        (My::Bytes(bytes), DataType::Json) => Value::Json(text(bytes)?),
        (My::Bytes(bytes), DataType::Integer { unsigned: true, .. }) => {
            let text = text(bytes)?;
            Value::UInt(text.parse().map_err(|_| format!("'{text}' is not an unsigned integer"))?)
        }
        (My::Bytes(bytes), DataType::Integer { .. } | DataType::Year) => {
            let text = text(bytes)?;
            Value::Int(text.parse().map_err(|_| format!("'{text}' is not an integer"))?)
        }
        (My::Bytes(bytes), _) => Value::Text(text(bytes)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_members_are_unquoted() {
        assert_eq!(enum_values("enum('a','b''c','')"), vec!["a", "b'c", ""]);
        assert_eq!(enum_values("set('x,y','z')"), vec!["x,y", "z"]);
    }

    #[test]
    fn identifiers_are_quoted_with_backticks_doubled() {
        assert_eq!(quote("we`ird name"), "`we``ird name`");
    }

    #[test]
    fn binary_protocol_values_decode_without_loss() {
        use mysql_async::Value as My;
        let unsigned = DataType::Integer { bytes: 8, unsigned: true };
        assert_eq!(decode(My::UInt(u64::MAX), &unsigned).unwrap(), Value::UInt(u64::MAX));
        let decimal = DataType::Decimal { precision: Some(65), scale: Some(30) };
        let widest = "-99999999999999999999999999999999999.999999999999999999999999999999";
        assert_eq!(decode(My::Bytes(widest.into()), &decimal).unwrap().to_string(), widest);
        let time = decode(My::Time(true, 34, 22, 59, 59, 0), &DataType::Time { precision: 0 }).unwrap();
        assert_eq!(time.to_string(), "-838:59:59");
        let bits = decode(My::Bytes(vec![1, 2]), &DataType::Bits { width: 10 }).unwrap();
        assert_eq!(bits, Value::Bits { width: 10, value: 258 });
        assert!(decode(My::Bytes(vec![0xff]), &DataType::Text { length: None, fixed: false }).is_err());
    }
}
