//! A snapshot's batch into one table of a server target: inserts only, written in the open
//! transaction (begun by the first write), a row whose content the target refuses found and left
//! out as a dirty record.

use async_trait::async_trait;
use sluice_core::change::{Batch, ChangeKind, Rejected};
use sluice_core::connector::Refused;
use sluice_core::{Error, ErrorKind, Result, Row, Side, TableSchema};

/// A server target's writer of one table, as [`write_inserts`] drives it.
#[async_trait]
pub(crate) trait InsertTarget: Send {
    /// The target's name in messages: `MySQL`, `PostgreSQL`.
    const TARGET: &'static str;

    /// The table written.
    fn table(&self) -> &TableSchema;

    /// Whether a transaction is open: set by [`InsertTarget::begin`], cleared by a commit.
    fn in_transaction(&mut self) -> &mut bool;

    /// Starts a transaction on the server.
    async fn start_transaction(&mut self) -> Result<()>;

    /// Writes `rows` into the open transaction, each try under a savepoint; returns those
    /// refused for their content, the others written.
    async fn write_rows(&mut self, rows: &[&Row]) -> Result<Vec<Refused>>;

    /// Starts a transaction unless one is open.
    async fn begin(&mut self) -> Result<()> {
        if !*self.in_transaction() {
            self.start_transaction().await?;
            *self.in_transaction() = true;
        }
        Ok(())
    }
}

/// Writes a snapshot's batch of inserts through `writer`; returns the refused rows as dirty
/// records. Any other change fails: a table target of a snapshot applies inserts only.
pub(crate) async fn write_inserts<W: InsertTarget>(writer: &mut W, batch: &Batch) -> Result<Vec<Rejected>> {
    writer.begin().await?;
    let mut rows = Vec::with_capacity(batch.changes.len());
    for change in &batch.changes {
        let ChangeKind::Insert { after } = &change.kind else {
            return Err(Error::new(
                ErrorKind::Write,
                format!("the {} target applies inserts only (snapshot mode)", W::TARGET),
            )
            .on(Side::Target));
        };
        rows.push(after);
    }
    let refused = writer.write_rows(&rows).await?;
    let table = writer.table();
    Ok(refused.into_iter().map(|refused| Rejected::row(table, rows[refused.index], refused.reason)).collect())
}
