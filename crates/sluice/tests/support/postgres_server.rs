//! A PostgreSQL server of one test alone, started by scripts/testdb in its own temporary
//! directory (`wal_level = logical`), for a test whose load the shared test server must not
//! carry while other tests run beside it: a transaction that stays open for long keeps every
//! other test on the same server from creating a logical replication slot until it ends.

use std::path::PathBuf;
use std::process::Command;

pub struct PostgresServer {
    directory: tempfile::TempDir,
    url: String,
}

fn testdb() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/testdb")
}

impl PostgresServer {
    pub fn start() -> PostgresServer {
        let directory = tempfile::Builder::new()
            .prefix("sluice-postgres")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory");
        let data = directory.path().join("postgres");
        let output =
            Command::new(testdb()).args(["start", "postgres", data.to_str().unwrap()]).output().expect("testdb");
        assert!(output.status.success(), "testdb start: {}", String::from_utf8_lossy(&output.stderr));
        let url = String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|line| line.strip_prefix("URL=").map(str::to_owned))
            .expect("testdb prints the URL");
        PostgresServer { directory, url }
    }

    /// The URL of its `sluice` database (the `sluice` user and the test password).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Runs SQL in its `sluice` database; the rows, `|`-separated.
    pub fn sql(&self, sql: &str) -> String {
        super::psql_at(&self.url, sql)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let data = self.directory.path().join("postgres");
        let _ = Command::new(testdb()).args(["stop", "postgres", data.to_str().unwrap()]).output();
    }
}
