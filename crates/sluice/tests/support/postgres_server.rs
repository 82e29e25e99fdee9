//! A PostgreSQL server of one test alone, started by scripts/testdb in its own temporary
//! directory (`wal_level = logical`), for a test whose load the shared test server must not
//! carry while other tests run beside it: a transaction that stays open for long keeps every
//! other test on the same server from creating a logical replication slot until it ends.

pub struct PostgresServer(super::testdb::OwnServer);

impl PostgresServer {
    pub fn start() -> PostgresServer {
        PostgresServer(super::testdb::start("postgres"))
    }

    /// The URL of its `sluice` database (the `sluice` user and the test password).
    pub fn url(&self) -> &str {
        self.0.url()
    }

    /// Runs SQL in its `sluice` database; the rows, `|`-separated.
    pub fn sql(&self, sql: &str) -> String {
        super::psql_at(self.0.url(), sql)
    }
}
