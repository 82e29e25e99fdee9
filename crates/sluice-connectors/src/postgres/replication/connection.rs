//! A walsender session: the frontend/backend protocol with the `replication=database` startup
//! parameter, so the server accepts replication commands (IDENTIFY_SYSTEM,
//! CREATE_REPLICATION_SLOT, START_REPLICATION …) as well as plain SQL.
//!
//! What it speaks: TCP (plain, or TLS with libpq's `sslmode` semantics as
//! [`endpoint`](super::super::endpoint) reads them) and Unix sockets (never TLS, as libpq);
//! trust, cleartext password, MD5 and SCRAM-SHA-256 authentication (without channel binding);
//! the simple query protocol; the copy-both stream of logical replication.
//!
//! Reads go through a buffer owned by the connection: a cancelled [`recv`]
//! (`tokio::select!`, a timeout) loses nothing. Writes go through an owned buffer too: a
//! cancelled [`send_status`] is finished by the next call. A query or START_REPLICATION that is
//! cancelled halfway leaves the session in an unknown state: later calls refuse, reconnect.
//!
//! [`recv`]: ReplicationConnection::recv
//! [`send_status`]: ReplicationConnection::send_status

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::backend::{AuthenticationSaslBody, ErrorFields, Message};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::fallible_iterator::FallibleIterator;

use super::{Lsn, ReplicationError};
use crate::tls::ClientTls;

/// The port when the URL gives none.
const DEFAULT_PORT: u16 = 5432;
/// The room made in the read buffer before a read; messages larger than this grow it.
const READ_CHUNK: usize = 64 * 1024;
/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01 00:00 UTC).
const POSTGRES_EPOCH_MICROS: i64 = 946_684_800 * 1_000_000;
/// The tag of CopyBothResponse, which `postgres-protocol`'s parser does not know.
const COPY_BOTH_RESPONSE: u8 = b'W';

/// A walsender session with a PostgreSQL server.
pub(crate) struct ReplicationConnection {
    stream: Stream,
    /// Bytes read and not yet parsed.
    input: BytesMut,
    /// Bytes to send and not yet written.
    output: BytesMut,
    state: State,
    /// Where the connection goes, for messages: `host:port` or the socket's path.
    server: String,
    server_version: Option<String>,
}

/// What the session is doing, as far as the client knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Ready for a command.
    Idle,
    /// A command was sent and its answer not read to the end (a cancelled call leaves this).
    Busy,
    /// In copy-both mode: XLogData and keepalives come, status updates go.
    Streaming,
    /// The server ended its half of the copy (CopyDone); [`ReplicationConnection::stop`] ends ours.
    ServerDone,
    /// The protocol went wrong; only closing is left.
    Broken,
}

/// What [`ReplicationConnection::recv`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplicationMessage {
    /// A piece of WAL, decoded by the output plugin (for pgoutput: [`super::decode`]).
    XLogData { wal_start: Lsn, wal_end: Lsn, server_time: i64, data: Bytes },
    /// The server's heartbeat. With `reply_requested`, answer with
    /// [`ReplicationConnection::send_status`] soon, or the server ends the session after
    /// `wal_sender_timeout`.
    Keepalive { wal_end: Lsn, server_time: i64, reply_requested: bool },
}

/// The result of a simple query: the column names and the rows of the last statement that
/// returned rows, every value as text (`None` for NULL).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct QueryRows {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Option<String>>>,
}

impl QueryRows {
    /// The value in row `row` of the column named `column`; `None` for NULL, for a missing row
    /// and for a missing column.
    pub fn get(&self, row: usize, column: &str) -> Option<&str> {
        let index = self.columns.iter().position(|name| name == column)?;
        self.rows.get(row)?.get(index)?.as_deref()
    }
}

impl std::fmt::Debug for ReplicationConnection {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ReplicationConnection")
            .field("server", &self.server)
            .field("tls", &matches!(self.stream, Stream::Tls(_)))
            .field("state", &self.state)
            .field("buffered", &self.input.len())
            .finish_non_exhaustive()
    }
}

impl ReplicationConnection {
    /// A walsender session (`replication=database`) on the server of `config`: each of its
    /// hosts in turn (TCP host or Unix socket directory, with its port), as its user, on its
    /// database, authenticated with trust, cleartext password, MD5 or SCRAM-SHA-256, over TLS
    /// per `mode` and `tls` on TCP (SSLRequest first unless `Disable`; a server without TLS is
    /// accepted under `Prefer` only). `config`'s connect timeout bounds each host's attempt.
    pub async fn connect(
        config: &tokio_postgres::Config,
        mode: SslMode,
        tls: &ClientTls,
    ) -> Result<ReplicationConnection, ReplicationError> {
        let user = config.get_user().ok_or_else(|| ReplicationError::Auth("the URL names no user".into()))?;
        let ports = config.get_ports();
        let mut last_error = ReplicationError::Io("the URL names no host".into());
        for (index, host) in config.get_hosts().iter().enumerate() {
            let port = ports.get(index).or(ports.first()).copied().unwrap_or(DEFAULT_PORT);
            let attempt = connect_host(config, user, host, port, mode, tls);
            let result = match config.get_connect_timeout() {
                Some(limit) => tokio::time::timeout(*limit, attempt).await.unwrap_or_else(|_| {
                    Err(ReplicationError::Io(format!(
                        "connecting to {} took longer than the connect timeout ({} s)",
                        describe_host(host, port),
                        limit.as_secs_f64()
                    )))
                }),
                None => attempt.await,
            };
            match result {
                Ok(connection) => return Ok(connection),
                Err(error) => last_error = error,
            }
        }
        Err(last_error)
    }

    /// The server's `server_version` (as it reported it at startup), such as `15.4 (Debian …)`.
    pub fn server_version(&self) -> Option<&str> {
        self.server_version.as_deref()
    }

    /// Runs `sql` with the simple query protocol: a replication command (IDENTIFY_SYSTEM,
    /// CREATE_REPLICATION_SLOT, READ_REPLICATION_SLOT, DROP_REPLICATION_SLOT …) or plain SQL.
    /// A server error is returned once the server is ready again, so the session stays usable.
    pub async fn simple_query(&mut self, sql: &str) -> Result<QueryRows, ReplicationError> {
        self.expect_state(State::Idle, "run a query")?;
        frontend::query(sql, &mut self.output).map_err(|error| self.protocol(format!("a query: {error}")))?;
        self.state = State::Busy;
        self.flush().await?;
        let mut rows = QueryRows::default();
        let mut failure = None;
        loop {
            match self.next().await? {
                Backend::Message(Message::RowDescription(body)) => {
                    rows.columns = body
                        .fields()
                        .map(|field| Ok(field.name().to_owned()))
                        .collect()
                        .map_err(|error| self.protocol(format!("a RowDescription: {error}")))?;
                    rows.rows.clear();
                }
                Backend::Message(Message::DataRow(body)) => {
                    let row = data_row(&body).map_err(|error| self.protocol(format!("a DataRow: {error}")))?;
                    rows.rows.push(row);
                }
                Backend::Message(Message::CommandComplete(_) | Message::EmptyQueryResponse) => {}
                Backend::Message(Message::ErrorResponse(body)) => failure = Some(server_error(body.fields())),
                Backend::Message(Message::CopyInResponse(_)) => {
                    frontend::copy_fail("the replication connection sends no COPY data", &mut self.output)
                        .map_err(|error| self.protocol(format!("CopyFail: {error}")))?;
                    self.flush().await?;
                }
                Backend::Message(Message::CopyOutResponse(_)) => {
                    failure = Some(self.protocol(format!("{sql:?} sent COPY data, which simple_query does not read")))
                }
                Backend::Message(Message::CopyData(_) | Message::CopyDone) => {}
                Backend::Message(Message::ReadyForQuery(_)) => {
                    self.state = State::Idle;
                    return failure.map_or(Ok(rows), Err);
                }
                Backend::CopyBoth => {
                    self.state = State::Streaming;
                    return Err(self.protocol("the query started a replication stream: use start_logical"));
                }
                other => return Err(self.unexpected(other, "answering a query")),
            }
        }
    }

    /// `START_REPLICATION SLOT "slot" LOGICAL start (name 'value', …)`: enters copy-both mode,
    /// after which [`recv`](Self::recv) reads the stream. For pgoutput the options are
    /// `proto_version` ('1' or '2'), `publication_names` (a comma-separated list of quoted
    /// identifiers, passed as is), optionally `streaming 'on'`, `messages 'true'`,
    /// `binary 'true'`. Names and values are quoted here. A server error (no such slot:
    /// 42704, slot active: 55006 …) leaves the session usable.
    pub async fn start_logical(
        &mut self,
        slot: &str,
        start: Lsn,
        options: &[(&str, &str)],
    ) -> Result<(), ReplicationError> {
        self.expect_state(State::Idle, "start replication")?;
        let command = start_command(slot, start, options);
        frontend::query(&command, &mut self.output)
            .map_err(|error| self.protocol(format!("START_REPLICATION: {error}")))?;
        self.state = State::Busy;
        self.flush().await?;
        let mut failure = None;
        loop {
            match self.next().await? {
                Backend::CopyBoth => {
                    self.state = State::Streaming;
                    return Ok(());
                }
                Backend::Message(Message::ErrorResponse(body)) => failure = Some(server_error(body.fields())),
                Backend::Message(Message::CommandComplete(_)) => {}
                Backend::Message(Message::ReadyForQuery(_)) => {
                    self.state = State::Idle;
                    return Err(
                        failure.unwrap_or_else(|| self.protocol("START_REPLICATION ended without starting a stream"))
                    );
                }
                other => return Err(self.unexpected(other, "starting replication")),
            }
        }
    }

    /// The next message of the replication stream. Keepalives are returned, not answered:
    /// the caller knows the position to report (see [`ReplicationMessage::Keepalive`]).
    /// Cancellation-safe. Errors: the server's ErrorResponse as [`ReplicationError::Server`]
    /// (the session is then unusable), the end of the server's stream (CopyDone: [`stop`]
    /// finishes it) or of the connection as [`ReplicationError::Io`].
    ///
    /// [`stop`]: Self::stop
    pub async fn recv(&mut self) -> Result<ReplicationMessage, ReplicationError> {
        self.expect_state(State::Streaming, "read the replication stream")?;
        if !self.output.is_empty() {
            self.flush().await?;
        }
        match self.next().await? {
            Backend::Message(Message::CopyData(body)) => {
                copy_data(body.into_bytes()).map_err(|error| self.broken(error))
            }
            Backend::Message(Message::ErrorResponse(body)) => {
                let error = server_error(body.fields());
                Err(self.broken(error))
            }
            Backend::Message(Message::CopyDone) => {
                self.state = State::ServerDone;
                Err(ReplicationError::Io(format!("{} ended the replication stream", self.server)))
            }
            other => Err(self.unexpected(other, "streaming")),
        }
    }

    /// Sends a standby status update: WAL `written`, `flushed` (durably stored by the client:
    /// the server may then free it and advances the slot's `confirmed_flush_lsn`) and
    /// `applied` up to these positions; `reply_requested` asks for a keepalive back at once.
    pub async fn send_status(
        &mut self,
        written: Lsn,
        flushed: Lsn,
        applied: Lsn,
        reply_requested: bool,
    ) -> Result<(), ReplicationError> {
        self.expect_state(State::Streaming, "send a status update")?;
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        body.put_u64(written.0);
        body.put_u64(flushed.0);
        body.put_u64(applied.0);
        body.put_i64(postgres_now());
        body.put_u8(u8::from(reply_requested));
        frontend::CopyData::new(body.freeze())
            .map_err(|error| self.protocol(format!("a status update: {error}")))?
            .write(&mut self.output);
        self.flush().await
    }

    // Only the tests end a stream to reuse its session; the source drops the session.
    /// Ends copy-both mode (CopyDone) and reads what the server still sends (discarding the
    /// rest of the stream) until it is ready for commands again, so the session can run
    /// more commands (such as dropping the slot).
    #[cfg(test)]
    pub async fn stop(&mut self) -> Result<(), ReplicationError> {
        if !matches!(self.state, State::Streaming | State::ServerDone) {
            return Err(self.protocol(format!("stop replication: the session is {:?}, not streaming", self.state)));
        }
        frontend::copy_done(&mut self.output);
        self.state = State::Busy;
        self.flush().await?;
        let mut failure = None;
        loop {
            match self.next().await? {
                Backend::Message(Message::CopyData(_) | Message::CopyDone | Message::CommandComplete(_)) => {}
                Backend::Message(Message::ErrorResponse(body)) => failure = Some(server_error(body.fields())),
                Backend::Message(Message::ReadyForQuery(_)) => {
                    self.state = State::Idle;
                    return failure.map_or(Ok(()), Err);
                }
                other => return Err(self.unexpected(other, "stopping replication")),
            }
        }
    }

    /// Ends the session politely (Terminate) and closes the socket.
    pub async fn close(mut self) -> Result<(), ReplicationError> {
        frontend::terminate(&mut self.output);
        self.flush().await?;
        self.stream.shutdown().await.map_err(|error| self.io("closing", &error))
    }

    // ---- Startup ----

    /// Sends the startup message and authenticates; returns once the server is ready.
    async fn start_up(&mut self, config: &tokio_postgres::Config, user: &str) -> Result<(), ReplicationError> {
        let mut parameters = vec![
            ("user", user),
            ("database", config.get_dbname().unwrap_or(user)),
            ("replication", "database"),
            ("application_name", config.get_application_name().unwrap_or("sluice")),
            ("client_encoding", "UTF8"),
        ];
        if let Some(options) = config.get_options() {
            parameters.push(("options", options));
        }
        frontend::startup_message(parameters, &mut self.output)
            .map_err(|error| self.protocol(format!("the startup message: {error}")))?;
        self.flush().await?;
        self.authenticate(user, config.get_password()).await?;
        loop {
            match self.next().await? {
                Backend::Message(Message::BackendKeyData(_)) => {}
                Backend::Message(Message::ReadyForQuery(_)) => {
                    self.state = State::Idle;
                    return Ok(());
                }
                Backend::Message(Message::ErrorResponse(body)) => return Err(server_error(body.fields())),
                other => return Err(self.unexpected(other, "starting the session")),
            }
        }
    }

    /// Answers the server's authentication requests until AuthenticationOk.
    async fn authenticate(&mut self, user: &str, password: Option<&[u8]>) -> Result<(), ReplicationError> {
        let password = || {
            password.ok_or_else(|| {
                ReplicationError::Auth(format!("the server asks for a password for {user} and the URL gives none"))
            })
        };
        loop {
            match self.next().await? {
                Backend::Message(Message::AuthenticationOk) => return Ok(()),
                Backend::Message(Message::AuthenticationCleartextPassword) => {
                    frontend::password_message(password()?, &mut self.output)
                        .map_err(|error| self.protocol(format!("a password message: {error}")))?;
                    self.flush().await?;
                }
                Backend::Message(Message::AuthenticationMd5Password(body)) => {
                    let hash = md5_hash(user.as_bytes(), password()?, body.salt());
                    frontend::password_message(hash.as_bytes(), &mut self.output)
                        .map_err(|error| self.protocol(format!("a password message: {error}")))?;
                    self.flush().await?;
                }
                Backend::Message(Message::AuthenticationSasl(body)) => self.scram(&body, password()?).await?,
                Backend::Message(Message::ErrorResponse(body)) => return Err(server_error(body.fields())),
                Backend::Message(
                    Message::AuthenticationKerberosV5
                    | Message::AuthenticationScmCredential
                    | Message::AuthenticationGss
                    | Message::AuthenticationGssContinue(_)
                    | Message::AuthenticationSspi,
                ) => {
                    return Err(ReplicationError::Auth(format!(
                        "{} asks for an authentication method sluice does not support (Kerberos, GSSAPI or SSPI); \
                         use scram-sha-256, md5 or password in pg_hba.conf",
                        self.server
                    )))
                }
                other => return Err(self.unexpected(other, "authenticating")),
            }
        }
    }

    /// SCRAM-SHA-256, without channel binding.
    async fn scram(&mut self, offer: &AuthenticationSaslBody, password: &[u8]) -> Result<(), ReplicationError> {
        let mechanisms: Vec<String> = offer
            .mechanisms()
            .map(|mechanism| Ok(mechanism.to_owned()))
            .collect()
            .map_err(|error| self.protocol(format!("the SASL mechanisms: {error}")))?;
        if !mechanisms.iter().any(|mechanism| mechanism == sasl::SCRAM_SHA_256) {
            return Err(ReplicationError::Auth(format!(
                "{} offers only the SASL mechanisms {mechanisms:?}; sluice speaks SCRAM-SHA-256",
                self.server
            )));
        }
        // "n": the client does not do channel binding. ("y" would tell a server that offers
        // SCRAM-SHA-256-PLUS that the client thinks it cannot, and the server would refuse.)
        let mut scram = ScramSha256::new(password, ChannelBinding::unsupported());
        frontend::sasl_initial_response(sasl::SCRAM_SHA_256, scram.message(), &mut self.output)
            .map_err(|error| self.protocol(format!("SASLInitialResponse: {error}")))?;
        self.flush().await?;
        match self.next().await? {
            Backend::Message(Message::AuthenticationSaslContinue(body)) => scram
                .update(body.data())
                .map_err(|error| ReplicationError::Auth(format!("SCRAM: the server's first message: {error}")))?,
            Backend::Message(Message::ErrorResponse(body)) => return Err(server_error(body.fields())),
            other => return Err(self.unexpected(other, "SCRAM authentication")),
        }
        frontend::sasl_response(scram.message(), &mut self.output)
            .map_err(|error| self.protocol(format!("SASLResponse: {error}")))?;
        self.flush().await?;
        match self.next().await? {
            Backend::Message(Message::AuthenticationSaslFinal(body)) => scram.finish(body.data()).map_err(|error| {
                ReplicationError::Auth(format!("SCRAM: the server's signature does not verify: {error}"))
            }),
            Backend::Message(Message::ErrorResponse(body)) => Err(server_error(body.fields())),
            other => Err(self.unexpected(other, "SCRAM authentication")),
        }
    }

    // ---- Reading and writing ----

    /// The next backend message; notices and parameter changes are handled here.
    async fn next(&mut self) -> Result<Backend, ReplicationError> {
        loop {
            match self.parse()? {
                Some(Backend::Message(Message::NoticeResponse(body))) => {
                    let notice = server_error(body.fields());
                    log::debug!("postgres notice from {}: {notice}", self.server);
                }
                Some(Backend::Message(Message::ParameterStatus(body))) => {
                    if body.name().is_ok_and(|name| name == "server_version") {
                        self.server_version = body.value().ok().map(str::to_owned);
                    }
                }
                Some(message) => return Ok(message),
                None => self.fill().await?,
            }
        }
    }

    /// A whole message from the read buffer, or `None` when more bytes are needed.
    fn parse(&mut self) -> Result<Option<Backend>, ReplicationError> {
        if self.input.first() == Some(&COPY_BOTH_RESPONSE) && self.input.len() >= 5 {
            let length = u32::from_be_bytes([self.input[1], self.input[2], self.input[3], self.input[4]]) as usize;
            if length < 4 {
                return Err(self.protocol(format!("a CopyBothResponse of length {length}")));
            }
            if self.input.len() <= length {
                self.input.reserve(length + 1 - self.input.len());
                return Ok(None);
            }
            self.input.advance(length + 1);
            return Ok(Some(Backend::CopyBoth));
        }
        match Message::parse(&mut self.input) {
            Ok(message) => Ok(message.map(Backend::Message)),
            Err(error) => Err(self.protocol(format!("an unreadable message: {error}"))),
        }
    }

    /// Reads more bytes into the buffer. Cancellation-safe: the bytes are kept either way.
    async fn fill(&mut self) -> Result<(), ReplicationError> {
        if self.input.capacity() - self.input.len() < READ_CHUNK / 4 {
            self.input.reserve(READ_CHUNK);
        }
        match self.stream.read_buf(&mut self.input).await {
            Ok(0) => Err(self.broken(ReplicationError::Io(format!("{} closed the connection", self.server)))),
            Ok(_) => Ok(()),
            Err(error) => Err(self.io("reading", &error)),
        }
    }

    /// Writes out the output buffer. A cancelled flush keeps what was not written yet.
    async fn flush(&mut self) -> Result<(), ReplicationError> {
        while self.output.has_remaining() {
            match self.stream.write_buf(&mut self.output).await {
                Ok(0) => return Err(self.broken(ReplicationError::Io(format!("{} stopped reading", self.server)))),
                Ok(_) => {}
                Err(error) => return Err(self.io("writing", &error)),
            }
        }
        self.stream.flush().await.map_err(|error| self.io("writing", &error))
    }

    // ---- Errors ----

    fn expect_state(&self, state: State, doing: &str) -> Result<(), ReplicationError> {
        match self.state {
            current if current == state => Ok(()),
            State::Busy => Err(ReplicationError::Protocol(format!(
                "cannot {doing}: an earlier command on {} was interrupted before its answer was read; reconnect",
                self.server
            ))),
            current => Err(ReplicationError::Protocol(format!(
                "cannot {doing}: the session with {} is {current:?}",
                self.server
            ))),
        }
    }

    /// A message that has no place here: the session is broken.
    fn unexpected(&mut self, message: Backend, doing: &str) -> ReplicationError {
        let name = backend_name(&message);
        self.protocol(format!("unexpected {name} while {doing}"))
    }

    fn protocol(&mut self, what: impl std::fmt::Display) -> ReplicationError {
        let error = ReplicationError::Protocol(format!("{}: {what}", self.server));
        self.broken(error)
    }

    fn io(&mut self, doing: &str, error: &io::Error) -> ReplicationError {
        let error = ReplicationError::Io(format!("{doing} {}: {error}", self.server));
        self.broken(error)
    }

    fn broken(&mut self, error: ReplicationError) -> ReplicationError {
        self.state = State::Broken;
        error
    }
}

/// A backend message, or CopyBothResponse (which `postgres-protocol` does not parse).
enum Backend {
    Message(Message),
    CopyBoth,
}

/// A message's name, for errors.
fn backend_name(message: &Backend) -> &'static str {
    let Backend::Message(message) = message else { return "CopyBothResponse" };
    match message {
        Message::AuthenticationOk
        | Message::AuthenticationCleartextPassword
        | Message::AuthenticationMd5Password(_)
        | Message::AuthenticationSasl(_)
        | Message::AuthenticationSaslContinue(_)
        | Message::AuthenticationSaslFinal(_) => "authentication message",
        Message::BackendKeyData(_) => "BackendKeyData",
        Message::CommandComplete(_) => "CommandComplete",
        Message::CopyData(_) => "CopyData",
        Message::CopyDone => "CopyDone",
        Message::CopyInResponse(_) => "CopyInResponse",
        Message::CopyOutResponse(_) => "CopyOutResponse",
        Message::DataRow(_) => "DataRow",
        Message::EmptyQueryResponse => "EmptyQueryResponse",
        Message::ErrorResponse(_) => "ErrorResponse",
        Message::NotificationResponse(_) => "NotificationResponse",
        Message::ReadyForQuery(_) => "ReadyForQuery",
        Message::RowDescription(_) => "RowDescription",
        _ => "message",
    }
}

/// Connects to one host and starts the session.
async fn connect_host(
    config: &tokio_postgres::Config,
    user: &str,
    host: &Host,
    port: u16,
    mode: SslMode,
    tls: &ClientTls,
) -> Result<ReplicationConnection, ReplicationError> {
    let server = describe_host(host, port);
    let stream = match host {
        Host::Tcp(name) => {
            let tcp = TcpStream::connect((name.as_str(), port))
                .await
                .map_err(|error| ReplicationError::Io(format!("connecting to {server}: {error}")))?;
            tcp.set_nodelay(true).map_err(|error| ReplicationError::Io(format!("{server}: TCP_NODELAY: {error}")))?;
            negotiate_tls(tcp, name, &server, mode, tls).await?
        }
        #[cfg(unix)]
        Host::Unix(directory) => {
            let path = directory.join(format!(".s.PGSQL.{port}"));
            Stream::Unix(
                tokio::net::UnixStream::connect(&path)
                    .await
                    .map_err(|error| ReplicationError::Io(format!("connecting to {server}: {error}")))?,
            )
        }
    };
    let mut connection = ReplicationConnection {
        stream,
        input: BytesMut::with_capacity(READ_CHUNK),
        output: BytesMut::with_capacity(1024),
        state: State::Busy,
        server,
        server_version: None,
    };
    connection.start_up(config, user).await?;
    Ok(connection)
}

/// `host:port`, or the socket's path.
fn describe_host(host: &Host, port: u16) -> String {
    match host {
        Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
        Host::Tcp(name) => format!("{name}:{port}"),
        #[cfg(unix)]
        Host::Unix(directory) => directory.join(format!(".s.PGSQL.{port}")).display().to_string(),
    }
}

/// Asks for TLS (unless `Disable`) and sets it up, or goes on in plain text when the server
/// refuses and `mode` is `Prefer`.
async fn negotiate_tls(
    mut tcp: TcpStream,
    host: &str,
    server: &str,
    mode: SslMode,
    tls: &ClientTls,
) -> Result<Stream, ReplicationError> {
    if matches!(mode, SslMode::Disable) {
        return Ok(Stream::Tcp(tcp));
    }
    let config = tls.config().map_err(ReplicationError::Tls)?;
    let name = crate::tls::server_name(host).map_err(ReplicationError::Tls)?;
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    let io_error = |error: io::Error| ReplicationError::Io(format!("asking {server} for TLS: {error}"));
    tcp.write_all(&request).await.map_err(io_error)?;
    // One byte, read alone: nothing the server sends before the handshake may be taken as data.
    match tcp.read_u8().await.map_err(io_error)? {
        b'S' => {
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let stream = connector.connect(name, tcp).await.map_err(|error| {
                ReplicationError::Tls(format!("the handshake with {server} failed: {}", crate::tls::describe(&error)))
            })?;
            Ok(Stream::Tls(Box::new(stream)))
        }
        b'N' if matches!(mode, SslMode::Prefer) => Ok(Stream::Tcp(tcp)),
        b'N' => Err(ReplicationError::Tls(format!("{server} does not offer TLS, which sslmode requires"))),
        other => Err(ReplicationError::Protocol(format!(
            "{server} answered the TLS request with {:?}, neither S nor N",
            char::from(other)
        ))),
    }
}

/// `START_REPLICATION SLOT "slot" LOGICAL X/Y ("name" 'value', …)`.
fn start_command(slot: &str, start: Lsn, options: &[(&str, &str)]) -> String {
    let mut command = format!("START_REPLICATION SLOT {} LOGICAL {start}", quote_identifier(slot));
    if !options.is_empty() {
        let options: Vec<String> = options
            .iter()
            .map(|(name, value)| format!("{} {}", quote_identifier(name), quote_literal(value)))
            .collect();
        command.push_str(&format!(" ({})", options.join(", ")));
    }
    command
}

/// Double quotes, inner ones doubled (the replication grammar reads identifiers as SQL does).
pub(crate) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Single quotes, inner ones doubled (the replication grammar has no backslash escapes).
pub(crate) fn quote_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

/// The values of a DataRow, as text.
fn data_row(body: &postgres_protocol::message::backend::DataRowBody) -> io::Result<Vec<Option<String>>> {
    let buffer = body.buffer();
    body.ranges()
        .map(|range| {
            range
                .map(|range| {
                    std::str::from_utf8(&buffer[range])
                        .map(str::to_owned)
                        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
                })
                .transpose()
        })
        .collect()
}

/// An ErrorResponse's (or NoticeResponse's) code, message and detail.
fn server_error(mut fields: ErrorFields<'_>) -> ReplicationError {
    let (mut code, mut message, mut detail) = (String::new(), String::new(), None);
    while let Ok(Some(field)) = fields.next() {
        let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
        match field.type_() {
            b'C' => code = value,
            b'M' => message = value,
            b'D' => detail = Some(value),
            _ => {}
        }
    }
    ReplicationError::Server { code, message, detail }
}

/// The content of a CopyData message of the replication stream.
fn copy_data(data: Bytes) -> Result<ReplicationMessage, ReplicationError> {
    // The lengths are checked before the fields are read.
    let mut fields = data.slice(1.min(data.len())..);
    match data.first() {
        Some(b'w') if data.len() >= 25 => Ok(ReplicationMessage::XLogData {
            wal_start: Lsn(fields.get_u64()),
            wal_end: Lsn(fields.get_u64()),
            server_time: fields.get_i64(),
            data: fields,
        }),
        Some(b'k') if data.len() >= 18 => Ok(ReplicationMessage::Keepalive {
            wal_end: Lsn(fields.get_u64()),
            server_time: fields.get_i64(),
            reply_requested: fields.get_u8() == 1,
        }),
        Some(b'w' | b'k') => Err(ReplicationError::Protocol(format!(
            "a truncated {} message of {} bytes in the replication stream",
            if data[0] == b'w' { "XLogData" } else { "primary keepalive" },
            data.len()
        ))),
        Some(other) => Err(ReplicationError::Protocol(format!(
            "unknown message {:?} in the replication stream",
            char::from(*other)
        ))),
        None => Err(ReplicationError::Protocol("an empty CopyData in the replication stream".into())),
    }
}

/// Now, in microseconds since 2000-01-01 (PostgreSQL's epoch).
fn postgres_now() -> i64 {
    let since_unix = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_unix.as_micros()).unwrap_or(i64::MAX) - POSTGRES_EPOCH_MICROS
}

/// The socket: TCP, TCP with TLS, or a Unix socket.
enum Stream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(stream) => Pin::new(stream).poll_read(context, buffer),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(context, buffer),
            #[cfg(unix)]
            Stream::Unix(stream) => Pin::new(stream).poll_read(context, buffer),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(stream) => Pin::new(stream).poll_write(context, buffer),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(context, buffer),
            #[cfg(unix)]
            Stream::Unix(stream) => Pin::new(stream).poll_write(context, buffer),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(stream) => Pin::new(stream).poll_flush(context),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(context),
            #[cfg(unix)]
            Stream::Unix(stream) => Pin::new(stream).poll_flush(context),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(stream) => Pin::new(stream).poll_shutdown(context),
            Stream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(context),
            #[cfg(unix)]
            Stream::Unix(stream) => Pin::new(stream).poll_shutdown(context),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_replication_quotes_names_and_values() {
        assert_eq!(
            start_command(
                "my \"slot\"",
                Lsn(0x16_B374_D848),
                &[("proto_version", "2"), ("publication_names", "\"a'b\"")]
            ),
            "START_REPLICATION SLOT \"my \"\"slot\"\"\" LOGICAL 16/B374D848 (\"proto_version\" '2', \
             \"publication_names\" '\"a''b\"')"
        );
        assert_eq!(start_command("s", Lsn(0), &[]), "START_REPLICATION SLOT \"s\" LOGICAL 0/0");
    }

    #[test]
    fn copy_data_reads_xlogdata_and_keepalives() {
        let mut data = BytesMut::new();
        data.put_u8(b'w');
        data.put_u64(1);
        data.put_u64(2);
        data.put_i64(3);
        data.put_slice(b"B...");
        assert_eq!(
            copy_data(data.freeze()),
            Ok(ReplicationMessage::XLogData {
                wal_start: Lsn(1),
                wal_end: Lsn(2),
                server_time: 3,
                data: Bytes::from_static(b"B...")
            })
        );
        let mut data = BytesMut::new();
        data.put_u8(b'k');
        data.put_u64(9);
        data.put_i64(-1);
        data.put_u8(1);
        let keepalive = data.freeze();
        assert_eq!(
            copy_data(keepalive.clone()),
            Ok(ReplicationMessage::Keepalive { wal_end: Lsn(9), server_time: -1, reply_requested: true })
        );
        for cut in 0..keepalive.len() {
            assert!(matches!(copy_data(keepalive.slice(..cut)), Err(ReplicationError::Protocol(_))), "{cut}");
        }
        assert!(copy_data(Bytes::from_static(b"w12")).unwrap_err().to_string().contains("truncated XLogData"));
        assert!(copy_data(Bytes::from_static(b"x")).unwrap_err().to_string().contains("unknown message 'x'"));
    }

    #[test]
    fn rows_are_read_by_column_name() {
        let rows = QueryRows {
            columns: vec!["slot_name".into(), "consistent_point".into()],
            rows: vec![vec![Some("s".into()), None]],
        };
        assert_eq!(rows.get(0, "slot_name"), Some("s"));
        assert_eq!(rows.get(0, "consistent_point"), None);
        assert_eq!(rows.get(1, "slot_name"), None);
        assert_eq!(rows.get(0, "nothing"), None);
    }

    /// A scripted server on a local port, and the configuration of a client for it.
    async fn fake_server<S, F>(script: S) -> (tokio_postgres::Config, tokio::task::JoinHandle<()>)
    where
        S: FnOnce(TcpStream) -> F + Send + 'static,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut config = tokio_postgres::Config::new();
        config.host("127.0.0.1").port(listener.local_addr().unwrap().port()).user("u").dbname("d");
        config.password("pass-word");
        let server = tokio::spawn(async move { script(listener.accept().await.unwrap().0).await });
        (config, server)
    }

    async fn send(socket: &mut TcpStream, tag: u8, body: &[u8]) {
        let mut message = vec![tag];
        message.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        message.extend_from_slice(body);
        socket.write_all(&message).await.unwrap();
    }

    async fn receive(socket: &mut TcpStream) -> (u8, Vec<u8>) {
        let tag = socket.read_u8().await.unwrap();
        let length = socket.read_u32().await.unwrap() as usize;
        let mut body = vec![0; length - 4];
        socket.read_exact(&mut body).await.unwrap();
        (tag, body)
    }

    /// Reads the startup message; returns its parameters.
    async fn startup(socket: &mut TcpStream) -> Vec<u8> {
        let length = socket.read_u32().await.unwrap() as usize;
        let mut body = vec![0; length - 4];
        socket.read_exact(&mut body).await.unwrap();
        body
    }

    async fn ready(socket: &mut TcpStream) {
        send(socket, b'Z', b"I").await;
    }

    fn tls() -> ClientTls {
        ClientTls { verification: crate::tls::Verification::Encrypt, ca: None, cert: None, key: None }
    }

    /// MD5 authentication, a query, and a stream whose message arrives in two parts around a
    /// cancelled `recv`; the server ends the stream, `stop` ends the client's half.
    #[tokio::test]
    async fn md5_session_queries_and_a_cancelled_recv_loses_nothing() {
        let (config, server) = fake_server(|mut socket| async move {
            let parameters = startup(&mut socket).await;
            assert!(parameters.windows(21).any(|window| window == b"replication\0database\0"));
            send(&mut socket, b'R', &[0, 0, 0, 5, 1, 2, 3, 4]).await;
            let (tag, body) = receive(&mut socket).await;
            let expected = md5_hash(b"u", b"pass-word", [1, 2, 3, 4]) + "\0";
            assert_eq!((tag, body), (b'p', expected.into_bytes()));
            send(&mut socket, b'R', &[0, 0, 0, 0]).await;
            send(&mut socket, b'S', b"server_version\x0015.4\0").await;
            send(&mut socket, b'K', &[0, 0, 0, 1, 0, 0, 0, 2]).await;
            ready(&mut socket).await;

            let (tag, body) = receive(&mut socket).await;
            assert_eq!((tag, body.as_slice()), (b'Q', &b"SELECT x\0"[..]));
            let mut description = vec![0, 1];
            description.extend_from_slice(b"x\0");
            description.extend_from_slice(&[0; 18]);
            send(&mut socket, b'T', &description).await;
            send(&mut socket, b'N', b"SNOTICE\0Mjust so you know\0\0").await;
            send(&mut socket, b'D', &[0, 1, 0, 0, 0, 2, b'4', b'2']).await;
            send(&mut socket, b'C', b"SELECT 1\0").await;
            ready(&mut socket).await;

            let (tag, _) = receive(&mut socket).await;
            assert_eq!(tag, b'Q');
            send(&mut socket, b'W', &[0, 0, 0]).await;
            let mut data = vec![b'd', 0, 0, 0, 30, b'w'];
            data.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 9]);
            data.extend_from_slice(b"E");
            socket.write_all(&data[..10]).await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            socket.write_all(&data[10..]).await.unwrap();
            send(&mut socket, b'c', b"").await;
            let (tag, _) = receive(&mut socket).await;
            assert_eq!(tag, b'c', "the client's CopyDone");
            send(&mut socket, b'C', b"START_STREAMING\0").await;
            ready(&mut socket).await;
            assert_eq!(receive(&mut socket).await.0, b'X', "the client's Terminate");
        })
        .await;
        let mut connection = ReplicationConnection::connect(&config, SslMode::Disable, &tls()).await.unwrap();
        assert_eq!(connection.server_version(), Some("15.4"));
        let rows = connection.simple_query("SELECT x").await.unwrap();
        assert_eq!((rows.columns.as_slice(), rows.get(0, "x")), (&["x".to_owned()][..], Some("42")));
        connection.start_logical("s", Lsn(0), &[]).await.unwrap();
        let cancelled = tokio::time::timeout(std::time::Duration::from_millis(100), connection.recv()).await;
        assert!(cancelled.is_err(), "the message is not whole yet");
        assert!(format!("{connection:?}").contains("buffered: 10"), "{connection:?}");
        assert_eq!(
            connection.recv().await.unwrap(),
            ReplicationMessage::XLogData {
                wal_start: Lsn(7),
                wal_end: Lsn(8),
                server_time: 9,
                data: Bytes::from_static(b"E")
            }
        );
        let ended = connection.recv().await.unwrap_err();
        assert!(matches!(&ended, ReplicationError::Io(message) if message.contains("ended the replication stream")));
        assert!(connection.simple_query("SELECT 1").await.is_err(), "no query before the stream is stopped");
        connection.stop().await.unwrap();
        connection.close().await.unwrap();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn cleartext_password_and_a_refusal_with_its_sqlstate() {
        let (config, server) = fake_server(|mut socket| async move {
            startup(&mut socket).await;
            send(&mut socket, b'R', &[0, 0, 0, 3]).await;
            assert_eq!(receive(&mut socket).await, (b'p', b"pass-word\0".to_vec()));
            send(&mut socket, b'E', b"SFATAL\0C28P01\0Mpassword authentication failed for user \"u\"\0\0").await;
        })
        .await;
        let error = ReplicationConnection::connect(&config, SslMode::Disable, &tls()).await.unwrap_err();
        assert_eq!(
            error,
            ReplicationError::Server {
                code: "28P01".into(),
                message: "password authentication failed for user \"u\"".into(),
                detail: None
            }
        );
        server.await.unwrap();
    }

    #[test]
    fn the_postgres_clock_starts_in_2000() {
        // 2024-01-01 is 24 years (8766 days) after 2000-01-01.
        assert!(postgres_now() > 8766 * 86_400 * 1_000_000);
    }
}
