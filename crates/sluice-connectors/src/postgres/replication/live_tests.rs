//! The walsender client and the pgoutput decoder against a real PostgreSQL: the one of
//! `SLUICE_TEST_POSTGRES_URL` (scripts/testdb starts one, with `wal_level=logical` and a
//! superuser `sluice` that has REPLICATION). Without that variable the tests say so and pass.
//!
//! Each test uses its own table, publication and slot, so they run side by side.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sluice_core::secret::Secret;
use sluice_core::Side;

use super::{decode, LogicalMessage, Lsn, OldTuple, ReplicationConnection, ReplicationError, ReplicationMessage};
use super::{Tuple, TupleValue};

/// The test server's URL, or `None` (with a notice) when none is set.
fn url(test: &str) -> Option<Secret> {
    match std::env::var("SLUICE_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(Secret::new(url)),
        _ => {
            eprintln!(
                "{test}: skipped, SLUICE_TEST_POSTGRES_URL is not set (scripts/testdb start postgres DIR prints one)"
            );
            None
        }
    }
}

fn config(url: &Secret) -> (tokio_postgres::Config, tokio_postgres::config::SslMode, crate::tls::ClientTls) {
    super::super::endpoint(url, Side::Source).expect("the test URL is valid")
}

async fn replication(url: &Secret) -> ReplicationConnection {
    let (config, mode, tls) = config(url);
    ReplicationConnection::connect(&config, mode, &tls).await.expect("a replication connection")
}

/// A SQL session whose unqualified tables are in `public` (the test user's own schema, which
/// other tests' checkpoints create, would come first).
async fn sql(url: &Secret) -> tokio_postgres::Client {
    let client = super::super::connect(url, Side::Source, "the test server").await.expect("a SQL connection");
    client.batch_execute("SET search_path = public").await.expect("a search path");
    client
}

/// Drops what an earlier failed run may have left.
async fn clean_up(client: &tokio_postgres::Client, name: &str) {
    client
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
            &[&format!("{name}_slot")],
        )
        .await
        .unwrap();
    client.batch_execute(&format!("DROP PUBLICATION IF EXISTS {name}_pub; DROP TABLE IF EXISTS {name}")).await.unwrap();
}

/// Creates a logical slot for pgoutput; returns its consistent point.
async fn create_slot(repl: &mut ReplicationConnection, slot: &str) -> Lsn {
    let rows = repl
        .simple_query(&format!("CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput (SNAPSHOT 'nothing')"))
        .await
        .expect("CREATE_REPLICATION_SLOT");
    assert_eq!(rows.get(0, "slot_name"), Some(slot));
    assert_eq!(rows.get(0, "output_plugin"), Some("pgoutput"));
    rows.get(0, "consistent_point").expect("a consistent point").parse().expect("an LSN")
}

async fn confirmed_flush(client: &tokio_postgres::Client, slot: &str) -> Lsn {
    let row = client
        .query_one("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
        .await
        .unwrap();
    row.get::<_, String>(0).parse().unwrap()
}

/// The stream of a started slot, decoded, with keepalives answered.
struct Changes {
    repl: ReplicationConnection,
    in_stream: bool,
    confirmed: Lsn,
}

impl Changes {
    async fn next(&mut self) -> LogicalMessage {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "no change in 60 s");
            // Short timeouts cancel `recv` often, mid-message too: nothing may get lost.
            let Ok(received) = tokio::time::timeout(Duration::from_millis(3), self.repl.recv()).await else { continue };
            match received.expect("the stream goes on") {
                ReplicationMessage::XLogData { data, .. } => {
                    let message = decode(data, self.in_stream).expect("a pgoutput message");
                    match message {
                        LogicalMessage::StreamStart { .. } => self.in_stream = true,
                        LogicalMessage::StreamStop => self.in_stream = false,
                        _ => {}
                    }
                    return message;
                }
                ReplicationMessage::Keepalive { reply_requested: true, .. } => {
                    let at = self.confirmed;
                    self.repl.send_status(at, at, at, false).await.expect("a status update");
                }
                ReplicationMessage::Keepalive { .. } => {}
            }
        }
    }

    /// Confirms `lsn` and waits until the slot shows it.
    async fn confirm(&mut self, lsn: Lsn, client: &tokio_postgres::Client, slot: &str) {
        self.confirmed = lsn;
        self.repl.send_status(lsn, lsn, lsn, true).await.expect("a status update");
        let deadline = Instant::now() + Duration::from_secs(30);
        while confirmed_flush(client, slot).await < lsn {
            assert!(Instant::now() < deadline, "confirmed_flush_lsn never reached {lsn}");
            // Reads (and answers) what the server sends meanwhile.
            if let Ok(received) = tokio::time::timeout(Duration::from_millis(50), self.repl.recv()).await {
                received.expect("the stream goes on");
            }
        }
    }
}

fn tuple(values: &Tuple) -> String {
    let value = |value: &TupleValue| match value {
        TupleValue::Null => "null".to_owned(),
        TupleValue::UnchangedToast => "toast".to_owned(),
        TupleValue::Text(text) if text.len() > 20 => format!("text({})", text.len()),
        TupleValue::Text(text) => String::from_utf8_lossy(text).into_owned(),
        TupleValue::Binary(bytes) => format!("binary({})", bytes.len()),
    };
    values.iter().map(value).collect::<Vec<_>>().join(",")
}

/// A message in a few words, for comparing sequences.
fn summary(message: &LogicalMessage) -> String {
    match message {
        LogicalMessage::Begin { .. } => "begin".into(),
        LogicalMessage::Commit { .. } => "commit".into(),
        LogicalMessage::Relation(relation) => {
            let columns: Vec<String> = relation
                .columns
                .iter()
                .map(|column| format!("{}{}:{}", if column.key { "*" } else { "" }, column.name, column.type_oid))
                .collect();
            format!(
                "relation {}.{} {} {}",
                relation.namespace,
                relation.name,
                char::from(relation.replica_identity),
                columns.join(" ")
            )
        }
        LogicalMessage::Insert { new, .. } => format!("insert {}", tuple(new)),
        LogicalMessage::Update { old, new, .. } => match old {
            None => format!("update {}", tuple(new)),
            Some(OldTuple::Key(old)) => format!("update key {} to {}", tuple(old), tuple(new)),
            Some(OldTuple::Full(old)) => format!("update row {} to {}", tuple(old), tuple(new)),
        },
        LogicalMessage::Delete { old: OldTuple::Key(old), .. } => format!("delete key {}", tuple(old)),
        LogicalMessage::Delete { old: OldTuple::Full(old), .. } => format!("delete row {}", tuple(old)),
        LogicalMessage::Truncate { relations, cascade, restart_identity, .. } => {
            format!("truncate {} {cascade} {restart_identity}", relations.len())
        }
        LogicalMessage::Message { transactional, prefix, content, .. } => {
            format!("message {transactional} {prefix} {}", String::from_utf8_lossy(content))
        }
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn walsender_sessions_run_commands_and_report_server_errors() {
    let Some(url) = url("walsender_sessions_run_commands_and_report_server_errors") else { return };
    let started = Instant::now();
    let mut repl = replication(&url).await;
    let version = repl.server_version().expect("the server reports its version").to_owned();
    let system = repl.simple_query("IDENTIFY_SYSTEM").await.expect("IDENTIFY_SYSTEM");
    assert_eq!(system.columns, ["systemid", "timeline", "xlogpos", "dbname"]);
    assert!(system.get(0, "xlogpos").unwrap().parse::<Lsn>().unwrap() > Lsn(0));
    assert!(system.get(0, "dbname").is_some(), "{system:?} {version}");

    let rows = repl.simple_query("SELECT 1 AS one, NULL AS nothing, 'é' AS text").await.unwrap();
    assert_eq!(rows.rows, [[Some("1".to_owned()), None, Some("é".to_owned())]]);

    // A server error leaves the session usable.
    let error = repl.simple_query("SELECT * FROM no_such_table").await.unwrap_err();
    assert_eq!(error.code(), Some("42P01"), "{error}");
    let error = repl.start_logical("no_such_slot", Lsn(0), &[("proto_version", "1")]).await.unwrap_err();
    assert_eq!(error.code(), Some("42704"), "{error}");
    assert!(error.to_string().contains("no_such_slot"), "{error}");
    assert_eq!(repl.simple_query("SELECT 2 AS two").await.unwrap().get(0, "two"), Some("2"));
    let password = String::from_utf8_lossy(config(&url).0.get_password().unwrap()).into_owned();
    assert!(!format!("{repl:?}").contains(&password));
    repl.close().await.unwrap();

    // A wrong password is the server's refusal, no password the client's; neither shows it.
    let (config, mode, tls) = config(&url);
    let mut wrong = config.clone();
    wrong.password("not-the-password");
    let error = ReplicationConnection::connect(&wrong, mode, &tls).await.unwrap_err();
    assert_eq!(error.code(), Some("28P01"), "{error}");
    let mut none = tokio_postgres::Config::new();
    none.host(match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[allow(unreachable_patterns)]
        _ => unreachable!("the test URL is TCP"),
    });
    none.port(config.get_ports()[0]).user(config.get_user().unwrap()).dbname(config.get_dbname().unwrap());
    let error = ReplicationConnection::connect(&none, mode, &tls).await.unwrap_err();
    assert!(matches!(&error, ReplicationError::Auth(message) if message.contains("gives none")), "{error}");
    assert!(!error.to_string().contains(&password));

    // sslmode=require and a server without TLS: refused by the client.
    let required = Secret::new(format!("{}?sslmode=require", url.expose()));
    let error = connect_to(&required).await.unwrap_err();
    assert!(matches!(&error, ReplicationError::Tls(message) if message.contains("does not offer TLS")), "{error}");
    eprintln!("walsender session tests: {:?}", started.elapsed());
}

/// Over the Unix socket in `SLUICE_TEST_POSTGRES_SOCKET` (the directory; scripts/testdb puts it
/// in the server's directory), as the superuser `postgres`, which the socket trusts.
#[tokio::test]
async fn unix_socket_sessions_need_no_password() {
    let (Ok(directory), Some(url)) = (std::env::var("SLUICE_TEST_POSTGRES_SOCKET"), url("unix_socket")) else {
        eprintln!("unix_socket_sessions_need_no_password: skipped, SLUICE_TEST_POSTGRES_SOCKET is not set");
        return;
    };
    let port = config(&url).0.get_ports()[0];
    let socket = Secret::new(format!("host={directory} port={port} user=postgres dbname=postgres"));
    let mut repl = connect_to(&socket).await.expect("a session over the socket");
    assert!(format!("{repl:?}").contains(".s.PGSQL."), "{repl:?}");
    let system = repl.simple_query("IDENTIFY_SYSTEM").await.unwrap();
    assert_eq!(system.get(0, "dbname"), Some("postgres"));
    repl.close().await.unwrap();
}

#[tokio::test]
async fn protocol_1_streams_every_kind_of_change_and_status_updates_confirm() {
    let Some(url) = url("protocol_1_streams_every_kind_of_change_and_status_updates_confirm") else { return };
    let started = Instant::now();
    let (name, slot) = ("repl_test_v1", "repl_test_v1_slot");
    let client = sql(&url).await;
    clean_up(&client, name).await;
    client
        .batch_execute(&format!(
            "CREATE TABLE {name} (id text PRIMARY KEY, big text, note text);
             ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL;
             CREATE PUBLICATION {name}_pub FOR TABLE {name};"
        ))
        .await
        .unwrap();
    let mut repl = replication(&url).await;
    let start = create_slot(&mut repl, slot).await;

    // Each statement is a transaction of its own.
    for statement in [
        format!("INSERT INTO {name} VALUES ('a', repeat('0123456789', 1000), NULL)"),
        format!("UPDATE {name} SET note = 'n1' WHERE id = 'a'"),
        format!("UPDATE {name} SET id = 'b' WHERE id = 'a'"),
        "SELECT pg_logical_emit_message(true, 'sluice-test', 'hello')".to_owned(),
        format!("DELETE FROM {name} WHERE id = 'b'"),
        format!("INSERT INTO {name} VALUES ('c', 'small', NULL)"),
        format!("TRUNCATE {name}"),
    ] {
        client.batch_execute(&statement).await.unwrap();
    }

    let options = [("proto_version", "1"), ("publication_names", "\"repl_test_v1_pub\""), ("messages", "true")];
    repl.start_logical(slot, start, &options).await.expect("START_REPLICATION");
    // The slot is in use: a second session is refused with 55006.
    let mut other = replication(&url).await;
    let error = other.start_logical(slot, start, &options).await.unwrap_err();
    assert_eq!(error.code(), Some("55006"), "{error}");
    other.close().await.unwrap();

    let mut changes = Changes { repl, in_stream: false, confirmed: start };
    let (mut seen, mut last_end, mut relation_oid) = (Vec::new(), Lsn(0), 0);
    while seen.iter().filter(|summary: &&String| *summary == "commit").count() < 7 {
        let message = changes.next().await;
        match &message {
            LogicalMessage::Commit { end_lsn, commit_lsn, .. } => {
                assert!(end_lsn > commit_lsn);
                last_end = *end_lsn;
            }
            LogicalMessage::Relation(relation) => relation_oid = relation.oid,
            LogicalMessage::Truncate { relations, .. } => assert_eq!(relations, &[relation_oid]),
            LogicalMessage::Insert { relation, xid, .. } => assert_eq!((*relation, *xid), (relation_oid, None)),
            _ => {}
        }
        seen.push(summary(&message));
    }
    // PostgreSQL describes a relation again whenever its cache entry was rebuilt (a TRUNCATE gives
    // the table a new file; an autovacuum or another session's invalidation may too, at any
    // time): a description that repeats the last one changes nothing and is left out here.
    let mut described = std::collections::HashSet::new();
    seen.retain(|summary| !summary.starts_with("relation ") || described.insert(summary.clone()));
    let expected = [
        "begin",
        "relation public.repl_test_v1 d *id:25 big:25 note:25",
        "insert a,text(10000),null",
        "commit",
        "begin",
        "update a,toast,n1",
        "commit",
        "begin",
        "update key a,null,null to b,toast,n1",
        "commit",
        "begin",
        "message true sluice-test hello",
        "commit",
        "begin",
        "delete key b,null,null",
        "commit",
        "begin",
        "insert c,small,null",
        "commit",
        "begin",
        "truncate 1 false false",
        "commit",
    ];
    assert_eq!(seen, expected);

    assert!(confirmed_flush(&client, slot).await < last_end);
    changes.confirm(last_end, &client, slot).await;
    let mut repl = changes.repl;
    repl.stop().await.expect("the stream stops");
    // Stopped, the session runs commands again.
    repl.simple_query(&format!("DROP_REPLICATION_SLOT \"{slot}\"")).await.expect("DROP_REPLICATION_SLOT");
    repl.close().await.unwrap();
    clean_up(&client, name).await;
    eprintln!("protocol 1 test: {:?}", started.elapsed());
}

#[tokio::test]
async fn protocol_2_streams_large_transactions_before_they_end() {
    let Some(url) = url("protocol_2_streams_large_transactions_before_they_end") else { return };
    let started = Instant::now();
    let (name, slot) = ("repl_test_v2", "repl_test_v2_slot");
    let client = sql(&url).await;
    clean_up(&client, name).await;
    client
        .batch_execute(&format!(
            "CREATE TABLE {name} (id int PRIMARY KEY, payload text);
             CREATE PUBLICATION {name}_pub FOR TABLE {name};"
        ))
        .await
        .unwrap();
    // The walsender's own setting, from the startup packet: transactions above 64 kB stream.
    let (mut config, mode, tls) = config(&url);
    config.options("-c logical_decoding_work_mem=64kB");
    let mut repl = ReplicationConnection::connect(&config, mode, &tls).await.unwrap();
    let major: u32 = repl.server_version().unwrap().split(['.', ' ']).next().unwrap().parse().unwrap();
    if major < 14 {
        eprintln!(
            "protocol_2_streams_large_transactions_before_they_end: skipped, PostgreSQL {major} has no streaming"
        );
        return;
    }
    let setting = repl.simple_query("SHOW logical_decoding_work_mem").await.unwrap();
    assert_eq!(setting.get(0, "logical_decoding_work_mem"), Some("64kB"));
    let start = create_slot(&mut repl, slot).await;

    let insert = |from: u32, to: u32| {
        format!("INSERT INTO {name} SELECT i, repeat('p', 100) FROM generate_series({from}, {to}) i;")
    };
    let xid = |row: tokio_postgres::Row| (row.get::<_, i64>(0) & 0xFFFF_FFFF) as u32;
    // 1: committed; 2: rolled back; 3: committed with a rolled back subtransaction; 4: small.
    client.batch_execute("BEGIN").await.unwrap();
    let first = xid(client.query_one("SELECT txid_current()", &[]).await.unwrap());
    client.batch_execute(&(insert(1, 2000) + "COMMIT")).await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    let second = xid(client.query_one("SELECT txid_current()", &[]).await.unwrap());
    client.batch_execute(&(insert(2001, 4000) + "ROLLBACK")).await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    let third = xid(client.query_one("SELECT txid_current()", &[]).await.unwrap());
    client
        .batch_execute(&(insert(4001, 6000) + "SAVEPOINT s;" + &insert(6001, 8000) + "ROLLBACK TO s; COMMIT"))
        .await
        .unwrap();
    client.batch_execute(&format!("INSERT INTO {name} VALUES (99999, 'small')")).await.unwrap();

    let options = [("proto_version", "2"), ("publication_names", "\"repl_test_v2_pub\""), ("streaming", "on")];
    repl.start_logical(slot, start, &options).await.expect("START_REPLICATION");
    let mut changes = Changes { repl, in_stream: false, confirmed: start };
    let mut streamed_inserts: HashMap<u32, usize> = HashMap::new();
    let mut frames = Vec::new();
    let mut starts: HashMap<u32, Vec<bool>> = HashMap::new();
    let mut current = None;
    let last_end = loop {
        let message = changes.next().await;
        match message {
            LogicalMessage::StreamStart { xid, first_segment } => {
                assert_eq!(current, None, "a stream chunk starts inside another");
                current = Some(xid);
                starts.entry(xid).or_default().push(first_segment);
            }
            LogicalMessage::StreamStop => current = None,
            LogicalMessage::Insert { xid: Some(xid), .. } => {
                assert!(current.is_some(), "an insert with an xid outside a stream chunk");
                *streamed_inserts.entry(xid).or_default() += 1;
            }
            LogicalMessage::Relation(relation) if current.is_some() => assert_eq!(relation.xid, current),
            LogicalMessage::StreamCommit { xid, .. } => frames.push(format!("commit {xid}")),
            LogicalMessage::StreamAbort { xid, subxid, .. } if xid == subxid => frames.push(format!("abort {xid}")),
            LogicalMessage::StreamAbort { xid, .. } => frames.push(format!("abort subtransaction of {xid}")),
            LogicalMessage::Begin { .. } => frames.push("begin".into()),
            LogicalMessage::Insert { xid: None, new, .. } => frames.push(format!("insert {}", tuple(&new))),
            LogicalMessage::Commit { end_lsn, .. } => {
                frames.push("end".into());
                break end_lsn;
            }
            _ => {}
        }
    };
    assert_eq!(
        frames,
        [
            format!("commit {first}"),
            format!("abort {second}"),
            format!("abort subtransaction of {third}"),
            format!("commit {third}"),
            "begin".into(),
            "insert 99999,small".into(),
            "end".into(),
        ]
    );
    assert_eq!(streamed_inserts.get(&first), Some(&2000));
    assert_eq!(streamed_inserts.get(&third), Some(&2000));
    // The rolled back transaction may stream no row: decoding it after its abort, the server
    // finds the abort at its first catalog lookup and stops the chunk.
    assert!(streamed_inserts.get(&second).is_none_or(|count| *count <= 2000));
    // The subtransaction's rows came under its own xid.
    let others: usize =
        streamed_inserts.iter().filter(|(xid, _)| ![first, second, third].contains(xid)).map(|(_, n)| n).sum();
    assert!(others > 0, "{streamed_inserts:?}");
    for xid in [first, second, third] {
        let segments = &starts[&xid];
        assert!(segments[0] && !segments[1..].contains(&true), "{xid}: {segments:?}");
    }

    changes.confirm(last_end, &client, slot).await;
    let mut repl = changes.repl;
    repl.stop().await.expect("the stream stops");
    repl.simple_query(&format!("DROP_REPLICATION_SLOT \"{slot}\"")).await.expect("DROP_REPLICATION_SLOT");
    repl.close().await.unwrap();
    clean_up(&client, name).await;
    eprintln!("protocol 2 test: {:?}", started.elapsed());
}

/// The TLS-only test server (`SLUICE_TEST_POSTGRES_TLS_URL`, certificates in
/// `SLUICE_TEST_TLS_DIR`, both set by scripts/test.sh): its URL with `host` and `query`.
fn tls_url(host: &str, query: &str) -> Option<Secret> {
    let (Ok(url), Ok(certs)) = (std::env::var("SLUICE_TEST_POSTGRES_TLS_URL"), std::env::var("SLUICE_TEST_TLS_DIR"))
    else {
        return None;
    };
    let query = query.replace("{certs}", &certs);
    Some(Secret::new(format!("{}?{query}", url.replace("@127.0.0.1:", &format!("@{host}:")))))
}

async fn connect_to(url: &Secret) -> Result<ReplicationConnection, ReplicationError> {
    let (config, mode, tls) = config(url);
    ReplicationConnection::connect(&config, mode, &tls).await
}

#[tokio::test]
async fn tls_sessions_verify_the_server_and_stream() {
    let Some(verified) = tls_url("localhost", "sslmode=verify-full&sslrootcert={certs}/ca.pem") else {
        eprintln!("tls_sessions_verify_the_server_and_stream: skipped, SLUICE_TEST_POSTGRES_TLS_URL is not set");
        return;
    };
    let mut repl = connect_to(&verified).await.expect("a verified TLS session");
    assert!(format!("{repl:?}").contains("tls: true"), "{repl:?}");
    repl.simple_query("IDENTIFY_SYSTEM").await.expect("IDENTIFY_SYSTEM over TLS");
    let rows = repl
        .simple_query("CREATE_REPLICATION_SLOT \"repl_test_tls_slot\" TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing')")
        .await
        .unwrap();
    let start: Lsn = rows.get(0, "consistent_point").unwrap().parse().unwrap();
    let options = [("proto_version", "1"), ("publication_names", "\"no_publication\"")];
    repl.start_logical("repl_test_tls_slot", start, &options).await.expect("START_REPLICATION over TLS");
    // A status update that asks for a reply gets a keepalive back.
    repl.send_status(start, start, start, true).await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), repl.recv()).await.expect("a reply in 30 s").unwrap();
    assert!(matches!(reply, ReplicationMessage::Keepalive { .. }), "{reply:?}");
    repl.stop().await.unwrap();
    repl.close().await.unwrap();

    // Preferred TLS is taken when offered; the name is checked under verify-full; plain text
    // is refused by this server.
    let preferred = tls_url("127.0.0.1", "sslmode=prefer").unwrap();
    assert!(format!("{:?}", connect_to(&preferred).await.unwrap()).contains("tls: true"));
    let wrong_name = tls_url("127.0.0.1", "sslmode=verify-full&sslrootcert={certs}/ca.pem").unwrap();
    let error = connect_to(&wrong_name).await.unwrap_err();
    assert!(matches!(&error, ReplicationError::Tls(message) if message.contains("name")), "{error}");
    let other_ca = tls_url("localhost", "sslmode=verify-ca&sslrootcert={certs}/other-ca.pem").unwrap();
    let error = connect_to(&other_ca).await.unwrap_err();
    assert!(matches!(&error, ReplicationError::Tls(_)), "{error}");
    let plain = tls_url("127.0.0.1", "sslmode=disable").unwrap();
    let error = connect_to(&plain).await.unwrap_err();
    assert_eq!(error.code(), Some("28000"), "{error}");
    assert!(error.to_string().contains("no encryption"), "{error}");
    eprintln!("TLS errors: {error}");
    let password = String::from_utf8_lossy(config(&plain).0.get_password().unwrap()).into_owned();
    for url in [wrong_name, other_ca, plain] {
        let error = connect_to(&url).await.unwrap_err().to_string();
        eprintln!("  {error}");
        assert!(!error.contains(&password), "{error}");
    }
}
