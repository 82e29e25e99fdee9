//! Helpers for the integration tests: a scratch directory, job files, running the real `sluice`
//! binary as a child process, sample SQLite sources, and value-by-value table comparison.

#![allow(dead_code)]

pub mod browser;
pub mod clickhouse;
pub mod cluster;
pub mod iceberg;
pub mod kafka;
pub mod lake;
pub mod mariadb_server;
pub mod nats;
pub mod postgres_server;
pub mod postgres_source;
pub mod stream_job;
pub mod testdb;
pub mod webhook;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::types::ValueRef;
use rusqlite::Connection;

/// The `host:port` of a server URL, as a socket address.
pub fn address_of(url: &str) -> std::net::SocketAddr {
    let authority = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    let host_port = authority.split('/').next().unwrap();
    host_port.parse().expect("the test servers listen on 127.0.0.1:PORT")
}

/// The URL with its host and port replaced by the proxy's.
pub fn through(url: &str, proxy: &sluice_faults::Proxy) -> String {
    url.replace(&address_of(url).to_string(), &proxy.address().to_string())
}

/// A scratch directory that the binary runs in.
pub struct Workspace {
    pub directory: tempfile::TempDir,
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace { directory: tempfile::tempdir().expect("a temporary directory") }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.directory.path().join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).expect("write a file");
        path
    }

    pub fn command(&self, arguments: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .args(arguments)
            .current_dir(self.directory.path())
            .stdin(Stdio::null())
            .env("SLUICE_PROGRESS_SECS", "0.2");
        command
    }

    /// Runs sluice to completion.
    pub fn sluice(&self, arguments: &[&str]) -> Run {
        let output = self.command(arguments).output().expect("sluice runs");
        Run::from(output)
    }

    /// Runs `sluice run JOB` to completion with `SOURCE` and `TARGET` in its environment (the
    /// job file says `${SOURCE}` and `${TARGET}`).
    pub fn run_job(&self, job: &Path, source: &str, target: &str) -> Run {
        let mut command = self.command(&["run", job.to_str().expect("a UTF-8 path")]);
        Run::from(command.env("SOURCE", source).env("TARGET", target).output().expect("sluice runs"))
    }

    /// Starts `sluice run JOB [extra...]` with `SOURCE` and `TARGET` in its environment (the
    /// job files say `${SOURCE}` and `${TARGET}`), output piped, killed if the test fails first.
    pub fn start_run(&self, job: &Path, source: &str, target: &str, extra: &[&str]) -> Guard {
        let mut arguments = vec!["run", job.to_str().expect("a UTF-8 path")];
        arguments.extend_from_slice(extra);
        let child = self
            .command(&arguments)
            .env("SOURCE", source)
            .env("TARGET", target)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sluice starts");
        Guard::new(child)
    }

    /// Starts sluice in the background, its output read as it runs.
    pub fn spawn(&self, arguments: &[&str]) -> Running {
        Running::new(
            self.command(arguments).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("sluice starts"),
        )
    }
}

/// What a finished run printed and returned.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    pub fn assert_code(&self, code: i32) -> &Run {
        assert_eq!(self.code, code, "exit code\n--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr);
        self
    }
}

/// Waits for `condition` while `run` goes on; a run that ends, or a wait that times out, fails
/// the test with what the run printed.
pub fn wait_running(what: &str, limit: Duration, run: &mut Guard, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    loop {
        assert!(run.try_wait().unwrap().is_none(), "the run ended while waiting for {what}:\n{}", run.stderr_text());
        if condition() {
            return;
        }
        assert!(started.elapsed() < limit, "timed out waiting for {what}; the run printed:\n{}", run.stderr_text());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits for `condition`, checking every 20 ms, failing after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A source database with a keyed table of `rows` rows covering the value kinds, a keyless
/// table (where a replayed batch would show as duplicates) and a `WITHOUT ROWID` table.
pub fn make_source(path: &Path, rows: u64) {
    let mut connection = Connection::open(path).expect("open the source");
    connection
        .execute_batch(
            "CREATE TABLE items (id INTEGER PRIMARY KEY, name VARCHAR(40) NOT NULL, price DECIMAL(12,2), created DATETIME,
                 payload BLOB, active BOOLEAN, note TEXT);
             CREATE TABLE events (at INTEGER NOT NULL, kind TEXT);
             CREATE TABLE tags (item_id INTEGER NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (item_id, tag)) WITHOUT ROWID;",
        )
        .expect("create source tables");
    let transaction = connection.transaction().expect("begin");
    {
        let mut items = transaction.prepare("INSERT INTO items VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)").unwrap();
        let mut events = transaction.prepare("INSERT INTO events VALUES (?1, ?2)").unwrap();
        let mut tags = transaction.prepare("INSERT INTO tags VALUES (?1, ?2)").unwrap();
        for id in 1..=rows {
            let note = match id % 5 {
                0 => None,
                1 => Some(String::new()),
                2 => Some(format!("naïve “quote” \"{id}\" 🚀")),
                3 => Some("line\nbreak, comma".to_owned()),
                _ => Some("   padded   ".to_owned()),
            };
            let price = (id % 7 != 0).then(|| format!("{}.{:02}", id * 3, id % 100));
            let created = format!(
                "2024-{:02}-{:02} {:02}:{:02}:{:02}.{:06}",
                1 + id % 12,
                1 + id % 28,
                id % 24,
                id % 60,
                id % 60,
                id % 1_000_000
            );
            let payload: Option<Vec<u8>> = (id % 3 != 0).then(|| (0..(id % 40) as u8).collect());
            items
                .execute(rusqlite::params![id as i64, format!("item {id}"), price, created, payload, id % 2 == 0, note])
                .unwrap();
            events.execute(rusqlite::params![(id % 1_000) as i64, (id % 4 == 0).then_some("click")]).unwrap();
            if id % 10 == 0 {
                tags.execute(rusqlite::params![id as i64, format!("tag-{}", id % 7)]).unwrap();
                tags.execute(rusqlite::params![id as i64, "all"]).unwrap();
            }
        }
    }
    transaction.commit().expect("commit");
}

/// A value in a form that compares equal across SQLite storage classes: `1.5` (REAL) equals
/// `'1.50'` (TEXT under a decimal column), blobs as hex.
fn canonical(value: ValueRef<'_>) -> String {
    let number = |text: String| -> String {
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            text
        }
    };
    match value {
        ValueRef::Null => "NULL".into(),
        ValueRef::Integer(integer) => integer.to_string(),
        ValueRef::Real(real) => number(format!("{real}")),
        ValueRef::Text(bytes) => {
            let text = String::from_utf8_lossy(bytes).into_owned();
            if !text.is_empty() && text.parse::<f64>().is_ok() && !text.contains(['e', 'E', ' ']) {
                number(text)
            } else {
                format!("'{text}'")
            }
        }
        ValueRef::Blob(bytes) => bytes.iter().map(|byte| format!("{byte:02x}")).collect(),
    }
}

/// Every row of a table, canonical, sorted: equal lists mean equal tables, duplicates included.
pub fn table_rows(path: &Path, table: &str) -> Vec<Vec<String>> {
    let connection = Connection::open(path).expect("open a database");
    let mut statement = connection.prepare(&format!("SELECT * FROM \"{table}\"")).expect("select");
    let columns = statement.column_count();
    let mut rows: Vec<Vec<String>> = statement
        .query_map([], |row| (0..columns).map(|index| row.get_ref(index).map(canonical)).collect())
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    rows.sort();
    rows
}

/// Asserts two tables hold the same rows, showing the first differences only.
pub fn assert_same_rows(actual: &Path, expected: &Path, table: &str) {
    let (actual_rows, expected_rows) = (table_rows(actual, table), table_rows(expected, table));
    if actual_rows != expected_rows {
        let missing: Vec<_> = expected_rows.iter().filter(|row| !actual_rows.contains(row)).take(3).collect();
        let extra: Vec<_> = actual_rows.iter().filter(|row| !expected_rows.contains(row)).take(3).collect();
        panic!(
            "table {table}: {} rows, expected {}; first missing {missing:?}; first extra {extra:?}",
            actual_rows.len(),
            expected_rows.len()
        );
    }
}

pub fn count(path: &Path, table: &str) -> u64 {
    let connection = Connection::open(path).expect("open a database");
    connection.query_row(&format!("SELECT count(*) FROM \"{table}\""), [], |row| row.get(0)).unwrap_or(0)
}

/// Rows the target has committed for a job, read from its checkpoint table (0 before it exists).
pub fn committed_rows(path: &Path, job: &str) -> u64 {
    let Ok(connection) = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return 0;
    };
    connection
        .query_row("SELECT coalesce(sum(rows_written), 0) FROM _sluice_checkpoints WHERE job = ?1", [job], |row| {
            row.get(0)
        })
        .unwrap_or(0)
}

/// A pipe of a child read to its end by a thread of its own, into a buffer the test can look at
/// any time.
struct Drain {
    bytes: Arc<Mutex<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drain {
    fn of(pipe: Option<impl std::io::Read + Send + 'static>) -> Drain {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let thread = pipe.map(|mut pipe| {
            let bytes = bytes.clone();
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                loop {
                    match pipe.read(&mut chunk) {
                        Ok(0) => break,
                        Ok(read) => bytes.lock().unwrap().extend_from_slice(&chunk[..read]),
                        Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            })
        });
        Drain { bytes, thread }
    }

    fn so_far(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }

    /// Waits until the reader has read the pipe to its end (the child has exited, so the end
    /// comes at once); what is already read stays in the buffer.
    fn settle(&mut self) {
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the pipe's reader ends");
        }
    }

    /// Everything, once the pipe closed.
    fn finish(&mut self) -> Vec<u8> {
        self.settle();
        std::mem::take(&mut self.bytes.lock().unwrap())
    }
}

/// A child process whose piped stdout and stderr are read while it runs: a pipe no one reads
/// fills up (64 KiB) and blocks the child in its next write.
pub struct Running {
    child: Child,
    stdout: Drain,
    stderr: Drain,
}

impl Running {
    pub fn new(mut child: Child) -> Running {
        let stdout = Drain::of(child.stdout.take());
        let stderr = Drain::of(child.stderr.take());
        Running { child, stdout, stderr }
    }

    /// What the child wrote to stderr so far; once it has exited, all it wrote (the reader may
    /// lag the exit by a moment, so this waits for it to reach the pipe's end).
    pub fn stderr_text(&mut self) -> String {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            self.stderr.settle();
        }
        String::from_utf8_lossy(&self.stderr.so_far()).into_owned()
    }

    /// A view of the child's stdout that stays readable while the child is borrowed elsewhere.
    pub fn stdout_view(&self) -> impl Fn() -> String {
        let bytes = self.stdout.bytes.clone();
        move || String::from_utf8_lossy(&bytes.lock().unwrap()).into_owned()
    }

    /// A view of the child's stderr that stays readable while the child is borrowed elsewhere.
    pub fn stderr_view(&self) -> impl Fn() -> String {
        let bytes = self.stderr.bytes.clone();
        move || String::from_utf8_lossy(&bytes.lock().unwrap()).into_owned()
    }

    /// Waits for the child to end and returns its status and all it wrote.
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        let status = self.child.wait()?;
        Ok(Output { status, stdout: self.stdout.finish(), stderr: self.stderr.finish() })
    }
}

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.child
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.child
    }
}

/// A child process that is killed when dropped, so a failing test leaves no run behind (a
/// stray binlog reader would hold the source's logs and fight later runs for its server id).
pub struct Guard(Option<Running>);

impl Guard {
    pub fn new(child: Child) -> Guard {
        Guard(Some(Running::new(child)))
    }

    /// The child, no longer guarded.
    pub fn into_inner(mut self) -> Running {
        self.0.take().expect("guarded until now")
    }
}

impl std::ops::Deref for Guard {
    type Target = Running;
    fn deref(&self) -> &Running {
        self.0.as_ref().expect("guarded until now")
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Running {
        self.0.as_mut().expect("guarded until now")
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// SIGKILL: the process gets no chance to clean up.
pub fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL the run");
    child.wait().expect("reap the run");
}

/// Sends a signal by name (`TERM`, `INT`) with the system's `kill`.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(child.id().to_string()).status().expect("run kill");
    assert!(status.success(), "send SIG{name}");
}

pub fn summary(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the summary file exists")).expect("the summary is JSON")
}

/// The URL of the test MariaDB started by scripts/test.sh.
pub fn mysql_url() -> String {
    std::env::var("SLUICE_TEST_MYSQL_URL")
        .expect("SLUICE_TEST_MYSQL_URL is set by scripts/test.sh, which starts the test servers")
}

/// The URL of the test PostgreSQL started by scripts/test.sh.
pub fn postgres_url() -> String {
    std::env::var("SLUICE_TEST_POSTGRES_URL")
        .expect("SLUICE_TEST_POSTGRES_URL is set by scripts/test.sh, which starts the test servers")
}

/// The password of the test servers: a canary that must never appear in any output.
pub fn canary() -> String {
    std::env::var("SLUICE_TEST_PASSWORD").expect("SLUICE_TEST_PASSWORD is set by scripts/test.sh")
}

/// Runs SQL on the test MariaDB as root over its socket; returns the tab-separated rows.
pub fn mariadb(sql: &str) -> String {
    String::from_utf8_lossy(&mariadb_bytes(sql)).into_owned()
}

/// The `mariadb` client as root over the test server's socket, in UTF-8, in batch mode.
pub fn mariadb_client() -> Command {
    let socket = std::env::var("SLUICE_TEST_MYSQL_SOCKET").expect("SLUICE_TEST_MYSQL_SOCKET is set by scripts/test.sh");
    mariadb_client_at(&socket)
}

/// The `mariadb` client as root on the server of this unix socket.
pub fn mariadb_client_at(socket: &str) -> Command {
    let mut command = Command::new("mariadb");
    command.args(["--no-defaults", "--default-character-set=utf8mb4", "-uroot", "-S", socket, "--batch"]);
    command
}

/// Like `mariadb`, as the raw bytes the client printed, for byte-exact comparisons.
pub fn mariadb_bytes(sql: &str) -> Vec<u8> {
    let output = mariadb_client().args(["--skip-column-names", "-e", sql]).output().expect("run the mariadb client");
    assert!(output.status.success(), "mariadb: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// Runs SQL on the test PostgreSQL; returns the rows, `|`-separated.
pub fn psql(sql: &str) -> String {
    psql_at(&postgres_url(), sql)
}

/// Runs SQL in the database at `url`; the rows, `|`-separated.
pub fn psql_at(url: &str, sql: &str) -> String {
    let output =
        Command::new("psql").args([url, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql]).output().expect("run psql");
    assert!(output.status.success(), "psql: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A database name unique to one test, so tests can run in parallel on one server.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{prefix}_{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}
