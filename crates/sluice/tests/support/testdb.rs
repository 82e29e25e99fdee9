//! A database server of one test alone, started and stopped by scripts/testdb in its own
//! temporary directory (under /dev/shm where there is one).

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/testdb")
}

/// A server `start` started; stopped when dropped, so a failing test stops its server too.
pub struct OwnServer {
    directory: tempfile::TempDir,
    engine: String,
    url: String,
}

impl OwnServer {
    /// The URL of the server's `sluice` user (the test password).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's directory: its `port`, `pid`, socket and log.
    pub fn path(&self) -> PathBuf {
        self.directory.path().join(&self.engine)
    }

    /// A file of the server's directory, read whole and trimmed (`port`, `tcp_port`).
    pub fn read(&self, name: &str) -> String {
        let path = self.path().join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display())).trim().to_owned()
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let data: &Path = &self.path();
        let _ = Command::new(script()).args(["stop", &self.engine, data.to_str().unwrap()]).output();
    }
}

/// Starts a server of `engine` (`mariadb`, `postgres` or `clickhouse`).
pub fn start(engine: &str) -> OwnServer {
    start_with(engine, &[])
}

/// `start` with more arguments of `scripts/testdb start` (`--tls CERTS`).
pub fn start_with(engine: &str, extra: &[&str]) -> OwnServer {
    let directory = tempfile::Builder::new()
        .prefix(&format!("sluice-{engine}"))
        .tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("a temporary directory");
    let data = directory.path().join(engine);
    let output =
        Command::new(script()).args(["start", engine, data.to_str().unwrap()]).args(extra).output().expect("testdb");
    assert!(output.status.success(), "testdb start: {}", String::from_utf8_lossy(&output.stderr));
    let url = String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("URL=").map(str::to_owned))
        .expect("testdb prints the URL");
    OwnServer { directory, engine: engine.to_owned(), url }
}
