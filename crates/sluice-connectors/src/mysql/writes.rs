//! How Sluice's own writes into a MySQL/MariaDB target are recognised in that server's binlog,
//! so that the other job of a two-way pair passes them over instead of applying them back.
//!
//! Every transaction the change stream applies begins by counting itself in `sluice.writes`
//! (one row per job and task): a transaction whose first table is `sluice.writes` is Sluice's.
//! A DDL statement it runs carries a leading comment, `/* sluice */`, which the server keeps in
//! the binlog with the statement. Only a `two_way` job acts on either; any other job passes
//! such writes on like the rest (chains A → B → C).

use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use sluice_core::{Result, Side, TableName};

use super::mysql_error;

/// The comment that begins each DDL statement Sluice runs on a MySQL target.
pub(super) const DDL_MARK: &str = "/* sluice */ ";

/// The table that counts the transactions each task wrote.
pub(super) const WRITES_TABLE: &str = "CREATE DATABASE IF NOT EXISTS sluice CHARACTER SET utf8mb4;
    CREATE TABLE IF NOT EXISTS sluice.writes (job VARCHAR(128) NOT NULL, task VARCHAR(512) NOT NULL,
        transactions BIGINT UNSIGNED NOT NULL, PRIMARY KEY (job, task)) DEFAULT CHARSET = utf8mb4";

/// Whether a statement of the binlog is DDL Sluice ran.
pub(super) fn is_marked(statement: &str) -> bool {
    statement.trim_start().starts_with(DDL_MARK.trim_end())
}

/// Whether rows of `table` mark their transaction as Sluice's.
pub(super) fn is_writes_table(table: &TableName) -> bool {
    table.namespace.as_deref() == Some("sluice") && table.name == "writes"
}

/// Counts the transaction just begun as one the task wrote: its first row change, so a binlog
/// reader knows it from its first table. A target prepared before the table existed gets it
/// here (the DDL commits the empty transaction, which begins again).
pub(super) async fn mark_transaction(connection: &mut Conn, server: &str, job: &str, task: &str) -> Result<()> {
    const MARK: &str = "INSERT INTO sluice.writes (job, task, transactions) VALUES (?, ?, 1)
        ON DUPLICATE KEY UPDATE transactions = transactions + 1";
    let failed = |error| mysql_error(error, Side::Target, server, "count the transaction in sluice.writes");
    match connection.exec_drop(MARK, (job, task)).await {
        Err(mysql_async::Error::Server(error)) if error.code == NO_SUCH_TABLE => {
            connection.query_drop(WRITES_TABLE).await.map_err(failed)?;
            connection.query_drop("START TRANSACTION").await.map_err(failed)?;
            connection.exec_drop(MARK, (job, task)).await.map_err(failed)
        }
        marked => marked.map_err(failed),
    }
}

/// `ER_NO_SUCH_TABLE`.
const NO_SUCH_TABLE: u16 = 1146;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_ddl_and_the_writes_table_are_known_and_nothing_else_is() {
        assert!(is_marked("/* sluice */ ALTER TABLE `db`.`t` ADD COLUMN `c` int"));
        assert!(is_marked("  /* sluice */ DROP TABLE IF EXISTS `db`.`t`"));
        assert!(!is_marked("ALTER TABLE t ADD COLUMN c int /* sluice */"));
        assert!(!is_marked("/* app */ ALTER TABLE t ADD COLUMN c int"));
        assert!(is_writes_table(&TableName::parse("sluice.writes")));
        assert!(!is_writes_table(&TableName::parse("sluice.checkpoints")));
        assert!(!is_writes_table(&TableName::parse("app.writes")));
    }
}
