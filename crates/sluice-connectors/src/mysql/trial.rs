//! Rows inserted under a savepoint, so a row whose content MySQL refuses is found and left out
//! (`sluice_core::connector::find_refused`) instead of failing the transaction: the copy's
//! batches and the stream's groups share it.

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::Conn;
use sluice_core::connector::{find_refused, Refused, RowTrial};
use sluice_core::{Error, ErrorKind, Result, Row, Side, TableSchema};

use super::mysql_error;
use super::rows::insert_rows;

/// Server errors caused by one row's content: the row is dirty, the batch is not.
fn is_row_error(error: &mysql_async::Error) -> bool {
    // Out of range, incorrect value, too long, bad date, duplicate key, NULL in NOT NULL,
    // foreign key, check constraint, bad enum/set member, truncated.
    matches!(error, mysql_async::Error::Server(server) if matches!(server.code, 1264 | 1366 | 1406 | 1292 | 1062 | 1048 | 1452 | 4025 | 1265 | 1367 | 3819))
}

/// How rows of one table go into the open transaction.
#[async_trait]
pub(super) trait Inserts: Send {
    fn connection(&mut self) -> &mut Conn;
    fn server(&self) -> &str;
    fn table(&self) -> &TableSchema;
    /// Inserts `rows`, all or none of them.
    async fn insert(&mut self, rows: &[&Row]) -> std::result::Result<(), mysql_async::Error>;
}

/// Plain multi-row INSERTs of a table (the change stream's).
pub(super) struct TableInserts<'a> {
    pub connection: &'a mut Conn,
    pub server: &'a str,
    pub table: &'a TableSchema,
}

#[async_trait]
impl Inserts for TableInserts<'_> {
    fn connection(&mut self) -> &mut Conn {
        self.connection
    }

    fn server(&self) -> &str {
        self.server
    }

    fn table(&self) -> &TableSchema {
        self.table
    }

    async fn insert(&mut self, rows: &[&Row]) -> std::result::Result<(), mysql_async::Error> {
        insert_rows(self.connection, self.table, rows).await
    }
}

/// Rows tried into the open transaction through `inserts`, each try under a savepoint.
pub(super) struct InsertTrial<'a, I: Inserts> {
    pub inserts: &'a mut I,
    pub rows: &'a [&'a Row],
    /// A row whose key exists stops the job (the change stream) instead of being refused.
    pub key_conflicts: bool,
}

impl<I: Inserts> InsertTrial<'_, I> {
    /// Writes the rows; returns those refused for their content, the others written.
    pub async fn run(mut self) -> Result<Vec<Refused>> {
        let count = self.rows.len();
        find_refused(&mut self, count).await
    }

    async fn execute(&mut self, sql: &str, doing: &str) -> Result<()> {
        let result = self.inserts.connection().query_drop(sql).await;
        result.map_err(|error| mysql_error(error, Side::Target, self.inserts.server(), doing))
    }
}

#[async_trait]
impl<I: Inserts> RowTrial for InsertTrial<'_, I> {
    async fn try_rows(&mut self, range: std::ops::Range<usize>) -> Result<Option<String>> {
        self.execute("SAVEPOINT trial", "set a savepoint").await?;
        let all = self.rows;
        let Err(error) = self.inserts.insert(&all[range]).await else { return Ok(None) };
        let table = self.inserts.table().name.clone();
        if !is_row_error(&error) {
            return Err(mysql_error(error, Side::Target, self.inserts.server(), &format!("insert into {table}")));
        }
        self.execute("ROLLBACK TO SAVEPOINT trial", "roll back refused rows").await?;
        match error {
            mysql_async::Error::Server(server) if self.key_conflicts && server.code == 1062 => Err(Error::new(
                ErrorKind::Conflict,
                format!("table {table}: a row the source inserted already exists in the target: {}", server.message),
            )
            .on(Side::Target)
            .hint("the target was changed outside this job; remove the row (or copy the table again) and restart")),
            error => Ok(Some(format!("target: {error}"))),
        }
    }
}
