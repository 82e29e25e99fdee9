//! TLS everywhere, against servers that accept nothing else: the MariaDB and PostgreSQL that
//! scripts/test.sh starts with `--tls` (plaintext TCP refused), etcd speaking only HTTPS to
//! clients with a certificate, with authentication on, and the API over HTTPS. Certificates are
//! made at test time (`scripts/testdb certs`): the server's names only `localhost`, so a URL
//! naming 127.0.0.1 is a wrong host name.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::cluster::{start_server_with, Etcd};
use support::{canary, signal, unique_name, wait_for, Run, Workspace};

/// The test certificates (scripts/testdb certs).
fn certs() -> PathBuf {
    PathBuf::from(std::env::var("SLUICE_TEST_TLS_DIR").expect("SLUICE_TEST_TLS_DIR is set by scripts/test.sh"))
}

fn cert(name: &str) -> String {
    certs().join(name).to_str().expect("a UTF-8 path").to_owned()
}

/// A URL of a TLS-only test server, with `host` for its host and `query` appended.
fn url(variable: &str, host: &str, query: &str) -> String {
    let base = std::env::var(variable).unwrap_or_else(|_| panic!("{variable} is set by scripts/test.sh"));
    let base = base.replace("@127.0.0.1:", &format!("@{host}:"));
    if query.is_empty() {
        base
    } else {
        format!("{base}?{query}")
    }
}

fn mysql(host: &str, query: &str) -> String {
    url("SLUICE_TEST_MYSQL_TLS_URL", host, query)
}

fn postgres(host: &str, query: &str) -> String {
    url("SLUICE_TEST_POSTGRES_TLS_URL", host, query)
}

/// The strictest settings, which must work: the certificate's host name and its CA.
fn mysql_verified() -> String {
    mysql("localhost", &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", cert("ca.pem")))
}

fn postgres_verified() -> String {
    postgres("localhost", &format!("sslmode=verify-full&sslrootcert={}", cert("ca.pem")))
}

/// SQL as root over the TLS MariaDB's socket.
fn mariadb(sql: &str) -> String {
    let socket = std::env::var("SLUICE_TEST_MYSQL_TLS_SOCKET").expect("set by scripts/test.sh");
    let output = Command::new("mariadb")
        .args(["--no-defaults", "--default-character-set=utf8mb4", "-uroot", "-S", &socket, "--batch", "-N", "-e", sql])
        .output()
        .expect("run the mariadb client");
    assert!(output.status.success(), "mariadb: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// SQL on the TLS PostgreSQL (psql negotiates TLS).
fn psql(sql: &str) -> String {
    let output = Command::new("psql")
        .args([postgres("127.0.0.1", "sslmode=require").as_str(), "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql");
    assert!(output.status.success(), "psql: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A source database with one table of `rows` rows.
fn make_source(database: &str, rows: u32) {
    mariadb(&format!(
        "CREATE DATABASE {database}; CREATE TABLE {database}.items (id INT PRIMARY KEY, name VARCHAR(40), \
         amount DECIMAL(12,2), seen DATETIME(3)); USE {database}; INSERT INTO items SELECT seq, CONCAT('item ', seq), \
         seq * 1.25, '2026-01-02 03:04:05.678' FROM seq_1_to_{rows};"
    ));
}

fn source_rows(database: &str) -> String {
    mariadb(&format!(
        "SELECT id, name, amount, DATE_FORMAT(seen, '%Y-%m-%d %H:%i:%s.%f') FROM {database}.items ORDER BY id"
    ))
    .replace('\t', "|")
}

fn target_rows(database: &str) -> String {
    psql(&format!(
        "SELECT id, name, amount, to_char(seen, 'YYYY-MM-DD HH24:MI:SS.US') FROM {database}.items ORDER BY id"
    ))
}

/// The target holds exactly the source's rows; on a difference, the first differing row.
fn assert_same(database: &str) {
    let (source, target) = (source_rows(database), target_rows(database));
    if source != target {
        let first = source.lines().zip(target.lines()).find(|(a, b)| a != b);
        panic!(
            "{database}: {} source rows, {} target rows; first difference (source, target): {first:?}",
            source.lines().count(),
            target.lines().count()
        );
    }
}

fn target_count(database: &str) -> Option<u64> {
    let output = Command::new("psql")
        .args([
            postgres("127.0.0.1", "sslmode=require").as_str(),
            "-X",
            "-At",
            "-c",
            &format!("SELECT count(*) FROM {database}.items"),
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

fn snapshot_cdc_job(name: &str, database: &str) -> String {
    format!(
        "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\n\
         target:\n  type: postgres\n  url: ${{TARGET}}\nparallelism: 2\nlimits: {{ split_rows: 300 }}\n"
    )
}

#[test]
fn a_snapshot_and_its_changes_move_over_verified_tls_only() {
    let database = unique_name("tls");
    make_source(&database, 1000);
    let workspace = Workspace::new();
    let job = workspace.write("job.yaml", &snapshot_cdc_job(&database.replace('_', "-"), &database));
    let child = workspace.start_run(&job, &mysql_verified(), &postgres_verified(), &["--summary-json", "summary.json"]);
    wait_for("the snapshot in the target", Duration::from_secs(60), || target_count(&database) == Some(1000));
    mariadb(&format!(
        "INSERT INTO {database}.items VALUES (1001, 'new', 9.5, '2026-03-04 05:06:07.089'); \
         UPDATE {database}.items SET name = 'changed' WHERE id = 7; DELETE FROM {database}.items WHERE id = 8;"
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while target_rows(&database) != source_rows(&database) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let child = child.into_inner();
    signal(&child, "INT");
    let run = Run::from(child.wait_with_output().expect("the run ends"));
    assert!(run.code == 0 && target_rows(&database) == source_rows(&database), "{}", run.all());
    assert_same(&database);
    assert!(!run.all().contains("through the driver"), "the lean reader reads over TLS: {}", run.all());
    assert!(!run.all().contains(&canary()), "the password never prints");

    // The driver path (compression makes the lean reader step aside) over TLS too.
    let driver = unique_name("tls_driver");
    make_source(&driver, 300);
    let job = workspace.write(
        "driver.yaml",
        &format!(
            "name: {}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{driver}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n",
            driver.replace('_', "-")
        ),
    );
    let output = workspace
        .command(&["run", job.to_str().unwrap()])
        .env("SOURCE", format!("{}&compression=fast", mysql_verified()))
        .env("TARGET", postgres_verified())
        .output()
        .expect("sluice runs");
    let run = Run::from(output);
    run.assert_code(0);
    assert!(run.all().contains("through the driver"), "{}", run.all());
    assert_same(&driver);

    // MySQL as the target over TLS too (LOAD DATA LOCAL and the checkpoint on the driver).
    let copy = format!("{driver}_copy");
    let job = workspace.write(
        "mysql.yaml",
        &format!(
            "name: {}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{driver}.*\"]\n\
             target:\n  type: mysql\n  url: ${{TARGET}}\n  namespace: {copy}\n",
            copy.replace('_', "-")
        ),
    );
    let run = workspace.start_run(&job, &mysql_verified(), &mysql_verified(), &[]).into_inner();
    let run = Run::from(run.wait_with_output().expect("the run ends"));
    run.assert_code(0);
    let copied = mariadb(&format!(
        "SELECT id, name, amount, DATE_FORMAT(seen, '%Y-%m-%d %H:%i:%s.%f') FROM {copy}.items ORDER BY id"
    ));
    assert_eq!(copied.replace('\t', "|"), source_rows(&driver), "{}", run.all());
}

#[test]
fn a_postgres_source_copies_and_streams_over_verified_tls() {
    let schema = unique_name("tls_pgsrc");
    psql(&format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY, v text);
         INSERT INTO {schema}.t SELECT g, 'v' || g FROM generate_series(1, 500) g"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = workspace.write(
        "pg.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n"
        ),
    );
    // The source over TLS only, verified (the copy's sessions and the replication session).
    let child = workspace.start_run(&job, &postgres_verified(), &support::postgres_url(), &[]);
    let rows = |sql: &dyn Fn(&str) -> String| sql(&format!("SELECT count(*), sum(length(v)) FROM {schema}.t"));
    let target_rows = || {
        let exists = format!("SELECT to_regclass('{schema}.t') IS NOT NULL");
        (support::psql(&exists).trim() == "t").then(|| rows(&support::psql))
    };
    wait_for("the copy over TLS", Duration::from_secs(60), || target_rows() == Some(rows(&psql)));
    psql(&format!("INSERT INTO {schema}.t VALUES (501, 'new'); UPDATE {schema}.t SET v = 'changed' WHERE id = 7; DELETE FROM {schema}.t WHERE id = 8"));
    wait_for("the changes over TLS", Duration::from_secs(60), || target_rows() == Some(rows(&psql)));
    let child = child.into_inner();
    signal(&child, "INT");
    let run = Run::from(child.wait_with_output().expect("the run ends"));
    run.assert_code(0);
    assert!(!run.all().contains(&canary()), "the password never prints");
    let slot = format!("sluice_{schema}");
    wait_for("the slot's reader to end", Duration::from_secs(30), || {
        psql(&format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active")).trim() == "0"
    });
    psql(&format!("SELECT pg_drop_replication_slot('{slot}')"));
}

/// Runs a snapshot job from `source` to `target` and expects it to fail fast, naming `side`
/// and saying something of `cause`.
fn assert_refused(workspace: &Workspace, source: (&str, &str), target: (&str, &str), side: &str, cause: &[&str]) {
    let job = format!(
        "name: refused\nsource:\n  type: {}\n  {}\n  tables: [\"*\"]\ntarget:\n  type: {}\n  {}\n",
        source.0, source.1, target.0, target.1
    );
    let file = workspace.write("refused.yaml", &job);
    let started = Instant::now();
    let run = workspace.sluice(&["run", file.to_str().unwrap(), "--summary-json", "refused.json"]);
    let elapsed = started.elapsed();
    assert_ne!(run.code, 0, "{job}\n{}", run.all());
    let text = run.all();
    let lower = text.to_lowercase();
    assert!(lower.contains(side), "the error names the {side} side: {text}");
    assert!(cause.iter().any(|cause| lower.contains(cause)), "the error says why ({cause:?}): {text}");
    assert!(!text.contains(&canary()), "the password never prints: {text}");
    assert!(elapsed < Duration::from_secs(20), "refused in {elapsed:?}, not fast: {text}");
}

#[test]
fn a_wrong_ca_a_wrong_host_name_or_plaintext_fail_fast_and_clearly() {
    let workspace = Workspace::new();
    let database = unique_name("tls_refused");
    make_source(&database, 10);
    std::fs::create_dir(workspace.path("out")).unwrap();
    let files = ("jsonl", "path: out");
    let other_ca = cert("other-ca.pem");
    let ca = cert("ca.pem");
    let source = |url: String| format!("url: \"{url}\"");
    // MySQL source.
    for (url, cause) in [
        (mysql("localhost", &format!("ssl-mode=VERIFY_CA&ssl-ca={other_ca}")), &["certificate", "unknownissuer"][..]),
        (mysql("127.0.0.1", &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")), &["not valid for name", "name"][..]),
        (mysql("127.0.0.1", "ssl-mode=DISABLED"), &["tls"][..]),
    ] {
        let url = url.replace("?", &format!("/{database}?"));
        assert_refused(&workspace, ("mysql", &source(url)), files, "source", cause);
    }
    // PREFERRED, the default, takes the TLS the server offers (and verifies the chain of a CA
    // given, as REQUIRED does); VERIFY_CA accepts a name the certificate does not hold.
    let verify_ca = format!("ssl-mode=VERIFY_CA&ssl-ca={ca}");
    for query in ["", "ssl-mode=REQUIRED", &format!("ssl-mode=PREFERRED&ssl-ca={ca}"), &verify_ca] {
        let url = mysql("127.0.0.1", query);
        let target = postgres("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}"));
        let job = format!("name: preferred\nsource:\n  type: mysql\n  url: \"{url}\"\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: \"{target}\"\n");
        let file = workspace.write("preferred.yaml", &job);
        let run = workspace.sluice(&["check", file.to_str().unwrap()]);
        run.assert_code(0);
        assert!(!run.all().contains(&canary()), "{}", run.all());
    }
    let url =
        mysql("localhost", &format!("ssl-mode=REQUIRED&ssl-ca={other_ca}")).replace("?", &format!("/{database}?"));
    assert_refused(&workspace, ("mysql", &source(url)), files, "source", &["certificate", "unknownissuer"]);
    // PostgreSQL target.
    let sqlite = workspace.path("source.db");
    support::make_source(&sqlite, 3);
    let sqlite_source = format!("path: {}", sqlite.display());
    for (url, cause) in [
        (
            postgres("localhost", &format!("sslmode=verify-ca&sslrootcert={other_ca}")),
            &["certificate", "unknownissuer"][..],
        ),
        (postgres("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={ca}")), &["not valid for name", "name"][..]),
        (postgres("127.0.0.1", "sslmode=disable"), &["no encryption", "tls"][..]),
        (
            postgres("localhost", &format!("sslmode=require&sslrootcert={other_ca}")),
            &["certificate", "unknownissuer"][..],
        ),
    ] {
        assert_refused(&workspace, ("sqlite", &sqlite_source), ("postgres", &source(url)), "target", cause);
    }
}

/// An HTTPS etcd member with authentication on: user `root` with `password`. (etcd's JSON
/// gateway refuses users together with client certificates, so this member wants none.)
fn etcd_with_user(password: &str) -> Etcd {
    let etcd = Etcd::start_tls(&certs(), false);
    for arguments in [
        &["user", "add", &format!("root:{password}")][..],
        &["user", "grant-role", "root", "root"],
        &["auth", "enable"],
    ] {
        let output = etcd.etcdctl().args(arguments).output().expect("run etcdctl");
        assert!(output.status.success(), "etcdctl {arguments:?}: {}", String::from_utf8_lossy(&output.stderr));
    }
    etcd
}

/// `sluice server` run to its end with `arguments` (it is expected to stop at once).
fn server_refused(workspace: &Workspace, arguments: &[String], environment: &[(&str, String)], cause: &str) {
    let mut all = vec!["server".to_owned(), "--listen".to_owned(), "127.0.0.1:0".to_owned()];
    all.extend_from_slice(arguments);
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let started = Instant::now();
    let output = workspace.command(&all).envs(environment.iter().map(|(name, value)| (*name, value))).output();
    let run = Run::from(output.expect("sluice server runs"));
    assert_ne!(run.code, 0, "{}", run.all());
    let text = run.all().to_lowercase();
    assert!(text.contains("etcd") && text.contains(cause), "{all:?}: expected etcd and {cause}: {text}");
    assert!(started.elapsed() < Duration::from_secs(20), "{all:?}: not fast: {text}");
    assert!(!run.all().contains(&canary()), "{}", run.all());
}

fn strings(arguments: &[&str]) -> Vec<String> {
    arguments.iter().map(|argument| argument.to_string()).collect()
}

#[test]
fn a_cluster_node_reaches_etcd_over_tls_and_serves_https() {
    let etcd = Etcd::start_tls(&certs(), true);
    let workspace = Workspace::new();
    let token = "admin-token-0123456789abcdef".to_owned();
    let (ca, client_cert, client_key) = (cert("ca.pem"), cert("client.pem"), cert("client.key"));
    let (server_cert, server_key) = (cert("server.pem"), cert("server.key"));
    let etcd_arguments = |endpoints: &str, etcd_ca: &str| {
        strings(&["--etcd", endpoints, "--etcd-ca", etcd_ca, "--etcd-cert", &client_cert, "--etcd-key", &client_key])
    };
    let environment = [
        ("SLUICE_ADMIN_TOKEN", token.clone()),
        ("SLUICE_VAR_SOURCE", mysql_verified()),
        ("SLUICE_VAR_TARGET", postgres_verified()),
    ];
    let mut arguments = etcd_arguments(&etcd.endpoints, &ca);
    arguments.extend(strings(&["--tls-cert", &server_cert, "--tls-key", &server_key]));
    let arguments: Vec<&str> = arguments.iter().map(String::as_str).collect();
    let server = start_server_with(&workspace, "tls0", &arguments, &environment);

    let database = unique_name("tls_cluster");
    let job_name = database.replace('_', "-");
    make_source(&database, 500);
    workspace.write(
        "job.yaml",
        &format!(
            "name: {job_name}\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n"
        ),
    );
    let job = |arguments: &[&str]| {
        let mut all = vec!["job"];
        all.extend_from_slice(arguments);
        let mut command = workspace.command(&all);
        command.env("SLUICE_TOKEN", &token).env("SLUICE_SERVER", &server.url).env("SLUICE_CA", &ca);
        Run::from(command.output().expect("sluice job runs"))
    };
    job(&["submit", "job.yaml"]).assert_code(0);
    let mut last = Value::Null;
    wait_for("the job to end", Duration::from_secs(60), || {
        let shown = job(&["show", &job_name, "--json"]);
        last = serde_json::from_str(&shown.stdout).unwrap_or(Value::Null);
        last["state"] == "succeeded" || last["state"] == "failed"
    });
    assert_eq!(last["state"], "succeeded", "{last:#}\n{}", server.output());
    assert_same(&database);
    let stored = etcd.etcdctl().args(["get", "", "--prefix"]).output().expect("run etcdctl");
    let stored = String::from_utf8_lossy(&stored.stdout);
    assert!(stored.contains(&job_name), "the job is in etcd: {stored}");
    assert!(!stored.contains(&canary()), "no etcd key holds the password");

    // HTTPS is checked like any TLS: the address is not the certificate's name.
    let wrong_name = server.url.replace("localhost", "127.0.0.1");
    let refused = job(&["list", "--server", &wrong_name]);
    assert_eq!(refused.code, 1, "{}", refused.all());
    assert!(refused.all().to_lowercase().contains("certificate"), "{}", refused.all());
    let plaintext = job(&["list", "--server", &server.url.replace("https://", "http://")]);
    assert_eq!(plaintext.code, 1, "{}", plaintext.all());
    assert!(!server.output().contains(&canary()), "{}", server.output());

    // A node that cannot trust etcd, names it by the wrong name, or speaks plaintext to it
    // stops at once naming etcd.
    let port = etcd.endpoints.rsplit(':').next().unwrap().to_owned();
    server_refused(&workspace, &etcd_arguments(&etcd.endpoints, &cert("other-ca.pem")), &environment, "certificate");
    server_refused(&workspace, &etcd_arguments(&format!("https://127.0.0.1:{port}"), &ca), &environment, "certificate");
    server_refused(&workspace, &strings(&["--etcd", &format!("http://localhost:{port}")]), &environment, "https");
}

#[test]
fn a_cluster_node_signs_in_to_etcd_as_a_user() {
    let password = format!("{}-etcd", canary());
    let etcd = etcd_with_user(&password);
    let workspace = Workspace::new();
    let arguments = strings(&["--etcd", &etcd.endpoints, "--etcd-ca", &cert("ca.pem"), "--etcd-user", "root"]);
    let environment = [("SLUICE_ETCD_PASSWORD", password.clone())];
    let borrowed: Vec<&str> = arguments.iter().map(String::as_str).collect();
    let server = start_server_with(&workspace, "user0", &borrowed, &environment);
    wait_for("the node to register itself in etcd", Duration::from_secs(30), || {
        server.call("GET", "/workers", None, None).1.as_array().map(Vec::len) == Some(1)
    });
    assert!(!server.output().contains(&password), "{}", server.output());
    server_refused(&workspace, &arguments, &[("SLUICE_ETCD_PASSWORD", "wrong-password".to_owned())], "root");
}

/// The `tcp` input with TLS, a token and bounds: a plaintext client, a client without the
/// token, a connection past `max_connections`, an endless line and a quiet connection are each
/// refused or cut, and a client with the token over TLS loads its rows.
#[test]
fn a_tcp_input_over_tls_with_a_token_takes_only_authenticated_bounded_clients() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    let namespace = unique_name("tcp_tls");
    let workspace = Workspace::new();
    let address = format!("127.0.0.1:{}", support::cluster::free_port());
    let token = "tcp-token-0123456789abcdef";
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {}\nmode: cdc\nsource:\n  type: tcp\n  listen: \"{address}\"\n  table: inbox\n  \
             columns: {{id: bigint, body: text}}\n  key: [id]\n  max_line_bytes: 1024\n  max_connections: 2\n  \
             idle_timeout_secs: 5\n  auth: ${{TCP_TOKEN}}\n  tls_cert: {}\n  tls_key: {}\n\
             target:\n  type: postgres\n  url: {}\n  namespace: {namespace}\n",
            namespace.replace('_', "-"),
            cert("server.pem"),
            cert("server.key"),
            support::postgres_url()
        ),
    );
    let child = workspace
        .command(&["run", job.to_str().unwrap()])
        .env("TCP_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = support::Running::new(child);
    let stderr = run.stderr_view();
    wait_for("the input listens", Duration::from_secs(60), || stderr().contains("listening on"));

    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(cert("ca.pem")).unwrap();
    use rustls::pki_types::pem::PemObject;
    for certificate in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(certificate.unwrap()).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions().unwrap();
    let config = std::sync::Arc::new(config.with_root_certificates(roots).with_no_client_auth());
    let connect = || {
        let connection =
            rustls::ClientConnection::new(config.clone(), "localhost".try_into().unwrap()).expect("a TLS client");
        let socket = TcpStream::connect(&address).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        rustls::StreamOwned::new(connection, socket)
    };
    // The replies of a connection until it closes or says `error`.
    let replies_of = |stream: &mut dyn Read| -> Vec<String> {
        let mut replies = Vec::new();
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            let error = line.starts_with("error");
            replies.push(line);
            if error {
                break;
            }
        }
        replies
    };

    // The token: lines loaded and acknowledged.
    let mut member = connect();
    member
        .write_all(
            format!("auth {token}\n{{\"id\": 3, \"body\": \"member\"}}\n{{\"id\": 4, \"body\": \"member\"}}\n")
                .as_bytes(),
        )
        .unwrap();
    let mut reader = BufReader::new(&mut member);
    let mut acknowledged = String::new();
    while acknowledged != "ok 2" {
        acknowledged.clear();
        reader.read_line(&mut acknowledged).unwrap();
        acknowledged = acknowledged.trim_end().to_owned();
        assert!(acknowledged.starts_with("ok"), "{acknowledged}");
    }
    // Two connections are open (the member's and one more): one more is closed at once, unread.
    let mut second = connect();
    second.write_all(format!("auth {token}\n").as_bytes()).unwrap();
    second.flush().unwrap();
    let mut third = TcpStream::connect(&address).unwrap();
    third.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut refused = Vec::new();
    let _ = third.read_to_end(&mut refused);
    assert!(refused.is_empty(), "a TLS input refuses before any handshake: {refused:?}");
    wait_for("the refusal logged", Duration::from_secs(10), || {
        stderr().contains("connections are open (source.max_connections)")
    });
    // An endless line: cut by its number past max_line_bytes.
    let long = format!("{{\"id\": 5, \"body\": \"{}\"}}\n", "x".repeat(5_000));
    second.write_all(long.as_bytes()).unwrap();
    assert_eq!(
        replies_of(&mut second).last().map(String::as_str),
        Some("error 1: line too long (more than 1024 bytes, source.max_line_bytes)")
    );
    drop(second);
    // A quiet connection is closed after idle_timeout_secs.
    let quiet = replies_of(&mut member);
    assert_eq!(quiet.last().map(String::as_str), Some("error 3: idle for 5 s (source.idle_timeout_secs)"), "{quiet:?}");
    drop(member);
    // A wrong token: refused before any line is read. (Tried until the closed connections are
    // counted out: until then the cap closes it before its handshake.)
    wait_for("a wrong token refused", Duration::from_secs(30), || {
        let mut stranger = connect();
        if stranger.write_all(b"auth not-the-token-at-all\n{\"id\": 2, \"body\": \"stranger\"}\n").is_err() {
            return false;
        }
        let replies = replies_of(&mut stranger);
        if replies.is_empty() {
            return false;
        }
        assert_eq!(replies, ["error 0: authentication failed: the first line must be `auth TOKEN` (source.auth)"]);
        true
    });
    // A plaintext client gets nothing loaded: its handshake fails and the connection closes.
    let mut plain = TcpStream::connect(&address).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = plain.write_all(format!("auth {token}\n{{\"id\": 1, \"body\": \"plain\"}}\n").as_bytes());
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(!String::from_utf8_lossy(&answer).contains("ok"), "{answer:?}");
    support::kill(&mut run);
    let loaded =
        support::psql(&format!("SELECT string_agg(id::text || ':' || body, ',' ORDER BY id) FROM {namespace}.inbox"));
    assert_eq!(loaded.trim(), "3:member,4:member", "only the member's lines: {}", stderr());
    assert!(!stderr().contains(token), "the token never prints");
}
