//! A MariaDB server of one test alone, started by scripts/testdb in its own temporary directory,
//! for tests that change a server's global state (settings, purged binary logs, replication)
//! which the shared test server must not see while other tests run beside them.

use std::process::Command;

use super::mariadb_client_at;

pub struct MariadbServer(super::testdb::OwnServer);

impl MariadbServer {
    pub fn start() -> MariadbServer {
        MariadbServer(super::testdb::start("mariadb"))
    }

    /// The URL a job connects with (the `sluice` user and the test password).
    pub fn url(&self) -> &str {
        self.0.url()
    }

    pub fn socket(&self) -> String {
        self.0.path().join("mysql.sock").to_str().unwrap().to_owned()
    }

    pub fn port(&self) -> String {
        self.0.read("port")
    }

    /// Runs SQL as root over the socket; returns the tab-separated rows without column names.
    pub fn sql(&self, sql: &str) -> String {
        let output = mariadb_client_at(&self.socket()).args(["-N", "-e", sql]).output().expect("run mariadb");
        assert!(output.status.success(), "mariadb: {sql}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Replicates `primary` from its first transaction, by GTID.
    pub fn replicate(&self, primary: &MariadbServer) {
        let password = std::env::var("SLUICE_TEST_PASSWORD").unwrap_or_else(|_| "sluice-test-pw".into());
        self.sql(&format!(
            "SET GLOBAL server_id = 2; CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, \
             MASTER_USER = 'sluice', MASTER_PASSWORD = '{}', MASTER_USE_GTID = slave_pos; START SLAVE",
            primary.port(),
            password.replace('\'', "''")
        ));
    }

    /// Waits until this replica applied everything `primary` binlogged.
    pub fn catch_up(&self, primary: &MariadbServer) {
        let position = primary.sql("SELECT @@GLOBAL.gtid_binlog_pos");
        assert_eq!(self.sql(&format!("SELECT MASTER_GTID_WAIT('{position}', 60)")), "0", "the replica caught up");
    }

    /// Makes this replica a primary.
    pub fn promote(&self) {
        self.sql("STOP SLAVE; RESET SLAVE ALL");
    }

    /// SIGKILLs the server, as a crashed primary.
    pub fn kill(&self) {
        let _ = Command::new("kill").args(["-KILL", &self.0.read("pid")]).status();
    }

    /// A table's rows as `a|b|c` lines ordered by `id`.
    pub fn rows(&self, table: &str, columns: &[&str]) -> Vec<String> {
        let list: Vec<String> = columns.iter().map(|column| format!("coalesce({column}, 'NULL')")).collect();
        let text = self.sql(&format!("SELECT concat_ws('|', {}) FROM {table} ORDER BY id", list.join(", ")));
        text.lines().map(str::to_owned).collect()
    }
}
