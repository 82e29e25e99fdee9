//! Resync: tables of a running stream copied again while the stream runs, each switched in whole
//! (`sluice job resync`, `POST /api/v1/jobs/{name}/resync`).
//!
//! A table's new copy is written under its hidden name (`names::hidden_name`) in chunks, between
//! the stream's groups: a chunk is what a new read of the table from where the last chunk ended
//! gives in a tenth of a second (`CHUNK_TIME`, about `CHUNK_ROWS` rows at most), a consistent
//! snapshot taken while the stream waits, so its log position is at or past everything applied
//! (`SnapshotSource::copy_reads` tells the reads back). The stream goes on applying every change
//! of the table to the table itself, and to the copy those of keys already
//! copied whose transaction comes after the read that copied them; a key past the last chunk is
//! left to the chunk that will read it. Once a read finds no more rows and the stream has passed
//! the last read's position, the copy holds exactly what the table should, and one commit puts it
//! in the table's place (`FoldedChangeWriter::replace`). The other tables wait for one chunk at a
//! time, never for the whole copy.
//!
//! The checkpoint holds what is resynced and the reads so far, so a crash resumes the copy where
//! its last committed chunk ended. What an attempt knows beyond it (the highest key copied) comes
//! from the chunk every attempt reads before it applies anything.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Applier;
use crate::change::{Change, ChangeKind, Position, Row};
use crate::connector::{CopyRead, SchemaChange, Split, SplitHint};
use crate::error::{Error, ErrorKind, Result, Side};
use crate::runner::copied_keys::{compare_keys, holds, key_of, split_kind};
use crate::schema::{TableName, TableSchema};
use crate::transform::TableMapping;

/// How long one chunk of a resync reads (batches of the job's `batch_rows`, one at least): the
/// stream waits for it, so it is short beside a group's time, and long enough that the copy
/// outruns a table that grows while it is copied.
const CHUNK_TIME: std::time::Duration = std::time::Duration::from_millis(100);

/// The most rows one chunk holds beyond its first batch, whatever `CHUNK_TIME` allows: a chunk's
/// rows are in memory at once (about as many as a copy task holds with the default limits).
const CHUNK_ROWS: usize = 20_000;

/// A request to copy tables of a running stream again (source names), named so that the stream
/// takes it once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncRequest {
    pub id: String,
    pub tables: Vec<TableName>,
}

/// A resync in the stream's checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(in crate::runner) struct Resync {
    pub(in crate::runner) id: String,
    /// The tables left to copy again (source names); the first is the one being copied.
    pub(in crate::runner) tables: Vec<TableName>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    copy: Option<TableCopy>,
}

impl Resync {
    pub(in crate::runner) fn of(request: &ResyncRequest) -> Resync {
        Resync { id: request.id.clone(), tables: request.tables.clone(), copy: None }
    }
}

/// Where a table's new copy is written: its hidden name, in a namespace of its own beside the
/// table's (`<namespace>_sluice_resync`), so that what a target names after the table (a key's
/// constraint, a sequence, an index) does not meet the table's own while both exist. Left empty
/// once the copy replaced the table.
fn copy_name(own: &TableName) -> TableName {
    let namespace = format!("{}_sluice_resync", own.namespace.as_deref().unwrap_or("sluice"));
    TableName { namespace: Some(namespace), name: crate::names::hidden_name(own).name }
}

/// One table's new copy.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TableCopy {
    /// The table, read as one split.
    split: Split,
    /// The target table, and the hidden copy that replaces it.
    own: TableName,
    hidden: TableName,
    /// The split's copy position after the last chunk (its reads); `None` before the first.
    copied: Option<Position>,
    /// Every row is read: the copy replaces the table once the stream passes the last read.
    complete: bool,
}

/// What an attempt knows of the copy beyond the checkpoint: which keys it holds, and as of when.
pub(super) struct Frontier {
    /// The table's source name.
    table: TableName,
    /// The reads so far, in key order.
    reads: Vec<CopyRead>,
    /// The highest key copied; `None` once every row is.
    last: Option<Row>,
    /// The mapping of the table onto its copy, for the schema it was made for.
    mapping: Option<(Arc<TableSchema>, Arc<TableMapping>)>,
}

impl Applier<'_> {
    /// A resync asked since the last look, taken in (the stream is idle): a copy another request
    /// left unfinished is dropped first.
    pub(super) async fn take_resync_request(&mut self) -> Result<()> {
        let Some(requests) = self.resync_requests.as_mut() else { return Ok(()) };
        if !requests.has_changed().unwrap_or(false) {
            return Ok(());
        }
        let Some(request) = requests.borrow_and_update().clone() else { return Ok(()) };
        if !self.checkpoint.takes_resync(&request) {
            return Ok(());
        }
        self.drain().await?;
        if let Some(copy) = self.checkpoint.resync.as_ref().and_then(|resync| resync.copy.as_ref()) {
            let hidden = copy.hidden.clone();
            self.writer.common().apply_schema_change(&SchemaChange::Drop(hidden)).await?;
        }
        self.checkpoint.resync = Some(Resync::of(&request));
        self.resync_frontier = None;
        self.moved = true;
        Ok(())
    }

    /// Whether a step of the resync can be taken now: nothing open or waiting, no copy of the
    /// job's own still hidden, no backfill catching up, and the step has something to do.
    pub(super) fn resync_due(&self) -> bool {
        let checkpoint = &self.checkpoint;
        let Some(resync) = &checkpoint.resync else { return false };
        if !self.idle() || checkpoint.catch_up.is_some() || !checkpoint.hidden.is_empty() {
            return false;
        }
        match &resync.copy {
            Some(copy) if copy.complete => self.passed_reads(),
            _ => true,
        }
    }

    /// The stream is past the position of every read of the copy.
    fn passed_reads(&self) -> bool {
        let Some(frontier) = &self.resync_frontier else { return false };
        frontier
            .reads
            .iter()
            .filter_map(|read| read.as_of.as_ref())
            .all(|as_of| self.changes.reached(&self.checkpoint.at, as_of))
    }

    /// Before an attempt applies anything: a copy begun and not complete reads a chunk, which
    /// tells how far it reaches; a complete one reads its reads back from the checkpoint.
    pub(super) async fn resume_resync(&mut self) -> Result<()> {
        let Some(copy) = self.checkpoint.resync.as_ref().and_then(|resync| resync.copy.clone()) else { return Ok(()) };
        if copy.complete {
            let reads = self.context.source.needs_snapshot()?.copy_reads(&copy.split, copy.copied.as_ref())?;
            self.resync_frontier =
                Some(Frontier { table: copy.split.table.name.clone(), reads, last: None, mapping: None });
            Ok(())
        } else {
            self.resync_step().await
        }
    }

    /// Takes one step of the resync, and commits it with the checkpoint: begins a table's copy,
    /// copies a chunk, or puts a complete copy in the table's place.
    pub(super) async fn resync_step(&mut self) -> Result<()> {
        let Some(resync) = self.checkpoint.resync.clone() else { return Ok(()) };
        self.drain().await?;
        let Some(table) = resync.tables.first().cloned() else {
            self.end_resync();
            return self.commit().await;
        };
        match resync.copy {
            None => self.begin_copy(&table).await?,
            Some(copy) if !copy.complete => self.copy_chunk(copy).await?,
            Some(copy) => self.replace_table(copy).await?,
        }
        self.moved = true;
        self.commit().await
    }

    /// Creates the hidden copy of `table` (empty) and records it.
    async fn begin_copy(&mut self, table: &TableName) -> Result<()> {
        let context = self.context;
        if self.raw || !context.sink.folded_changes().is_some_and(|folded| folded.hides_copies()) {
            log::warn!(
                "resync: this target cannot take a table's copy under another name and put it in the table's place (PostgreSQL and MySQL can); {table} is left out"
            );
            self.next_resync_table();
            return Ok(());
        }
        let discovered = context.with_retry("discover the source tables", || context.source.discover()).await?;
        let Some(schema) = discovered.into_iter().find(|schema| &schema.name == table) else {
            log::warn!(
                "resync: table {table} is not among the job's source tables (gone, or not selected); it is left out"
            );
            self.next_resync_table();
            return Ok(());
        };
        if schema.primary_key.is_empty() {
            log::warn!(
                "resync: table {table} has no primary key, so it cannot be copied again in chunks while the stream runs; it is left out (run the job with --restart to copy it again)"
            );
            self.next_resync_table();
            return Ok(());
        }
        let schema = Arc::new(schema);
        let snapshot = context.source.needs_snapshot()?;
        let hint = SplitHint { rows_per_split: u64::MAX };
        let mut splits = context.with_retry("split the source table", || snapshot.split(&schema, hint)).await?;
        if splits.len() != 1 || splits[0].whole {
            return Err(Error::new(
                ErrorKind::Config,
                format!("resync: the source cuts table {table} into {} reads, where one is needed", splits.len()),
            )
            .on(Side::Source));
        }
        let split = splits.remove(0);
        let mapping = context.mapping(&split.table)?;
        let own = mapping.target.name.clone();
        let hidden = copy_name(&own);
        if hidden.name.len() > 63 || hidden.namespace.as_ref().is_some_and(|namespace| namespace.len() > 63) {
            log::warn!(
                "resync: the name of {own} is too long for a copy under another name ({hidden}); it is left out"
            );
            self.next_resync_table();
            return Ok(());
        }
        let writer = self.writer.common();
        writer.apply_schema_change(&SchemaChange::Drop(hidden.clone())).await?;
        let copy_schema = TableSchema { name: hidden.clone(), ..(*mapping.target).clone() };
        writer.apply_schema_change(&SchemaChange::Create(copy_schema)).await?;
        log::info!("resync: table {table} is copied again into {hidden} while the stream runs");
        if let Some(resync) = &mut self.checkpoint.resync {
            resync.copy = Some(TableCopy { split, own, hidden, copied: None, complete: false });
        }
        Ok(())
    }

    /// Copies the next chunk of the table into its copy: the batches a new read from where the
    /// last chunk ended gives within `CHUNK_TIME` (one at least, about `CHUNK_ROWS` rows at
    /// most). A chunk of one batch would let a table that grows at its end under the stream (new
    /// keys inserted faster than one batch per group) stay ahead of its copy for ever; a chunk
    /// bounded by time keeps the stream's pause short and copies as fast as the source reads.
    async fn copy_chunk(&mut self, mut copy: TableCopy) -> Result<()> {
        let context = self.context;
        let snapshot = context.source.needs_snapshot()?;
        let batch_rows = context.job.limits.batch_rows.max(1);
        let (split, copied) = (&copy.split, copy.copied.as_ref());
        let started = std::time::Instant::now();
        let batches = context
            .with_retry(&format!("read table {} again", split.table.name), || async move {
                let mut reader = snapshot.open(split, copied, batch_rows).await?;
                let (mut batches, mut rows) = (Vec::new(), 0);
                while let Some(batch) = reader.next().await? {
                    if batch.changes.is_empty() {
                        break;
                    }
                    rows += batch.changes.len();
                    batches.push(batch);
                    if started.elapsed() >= CHUNK_TIME || rows >= CHUNK_ROWS {
                        break;
                    }
                }
                Ok(batches)
            })
            .await?;
        let source = copy.split.table.clone();
        let mut last = None;
        if batches.is_empty() {
            copy.complete = true;
            log::info!(
                "resync: every row of table {} is copied; it replaces the table once the stream passes the copy's last read",
                source.name
            );
        }
        let mapping = context.mapping(&source)?;
        let mut rows: Vec<Row> = Vec::new();
        for batch in batches {
            last = batch.changes.iter().rev().find_map(|change| match &change.kind {
                ChangeKind::Insert { after } => Some(key_of(&source, after)),
                _ => None,
            });
            copy.copied = Some(batch.position.clone());
            let transformed = mapping.batch(batch).batch;
            if !transformed.rejected.is_empty() {
                context.keep_dirty(&format!("resync {}", source.name), &transformed.rejected)?;
            }
            rows.extend(transformed.changes.into_iter().filter_map(|change| match change.kind {
                ChangeKind::Insert { after } => Some(after),
                _ => None,
            }));
        }
        if !rows.is_empty() {
            let target = TableSchema { name: copy.hidden.clone(), ..(*mapping.target).clone() };
            let refused = self.writer.folded()?.insert(&target, &rows).await?;
            if let Some(first) = refused.first() {
                return Err(Error::new(
                    ErrorKind::Data,
                    format!(
                        "resync of table {}: the target refuses {} rows of the copy, the first: {}",
                        source.name,
                        refused.len(),
                        first.reason
                    ),
                )
                .on(Side::Target)
                .hint("fix what the target refuses, then ask for the resync again"));
            }
        }
        let reads = snapshot.copy_reads(&copy.split, copy.copied.as_ref())?;
        self.resync_frontier = Some(Frontier { table: source.name.clone(), reads, last, mapping: None });
        if let Some(resync) = &mut self.checkpoint.resync {
            resync.copy = Some(copy);
        }
        Ok(())
    }

    /// Puts the complete copy in the table's place, and goes on with the next table.
    async fn replace_table(&mut self, copy: TableCopy) -> Result<()> {
        self.writer.folded()?.replace(&copy.hidden, &copy.own).await?;
        log::info!("resync: table {} is copied again and replaces {} whole", copy.split.table.name, copy.own);
        self.next_resync_table();
        Ok(())
    }

    /// The first table is done (or left out): the next one, or the end of the resync.
    fn next_resync_table(&mut self) {
        self.resync_frontier = None;
        if let Some(resync) = &mut self.checkpoint.resync {
            resync.copy = None;
            if !resync.tables.is_empty() {
                resync.tables.remove(0);
            }
            if resync.tables.is_empty() {
                self.end_resync();
            }
        }
    }

    fn end_resync(&mut self) {
        if let Some(resync) = self.checkpoint.resync.take() {
            log::info!("resync {} is done", resync.id);
            self.checkpoint.resynced = Some(resync.id);
        }
    }

    /// DDL on the table being copied: the copy cannot follow it, so it is dropped, and the
    /// table left as the stream keeps it (the statement is carried to it as to any table).
    pub(super) async fn abandon_resync(&mut self, statement: &str, tables: &[&TableName]) -> Result<()> {
        let Some(copy) = self.checkpoint.resync.as_ref().and_then(|resync| resync.copy.clone()) else { return Ok(()) };
        if !tables.contains(&&copy.split.table.name) {
            return Ok(());
        }
        self.drain().await?;
        self.writer.common().apply_schema_change(&SchemaChange::Drop(copy.hidden.clone())).await?;
        log::warn!(
            "resync: DDL `{statement}` on table {} came while it was copied again: the copy is dropped and the table left as the stream keeps it; ask for the resync again",
            copy.split.table.name
        );
        self.next_resync_table();
        Ok(())
    }

    /// The changes of the transaction starting at the checkpoint's position that the table's
    /// copy takes: those of keys copied, after the read that copied them.
    pub(super) fn resync_changes(&mut self, changes: &[Change]) -> Result<Vec<Change>> {
        let Some(frontier) = &self.resync_frontier else { return Ok(Vec::new()) };
        let (source, at) = (self.changes, &self.checkpoint.at);
        let mut taken = Vec::new();
        for change in changes.iter().filter(|change| change.table.name == frontier.table) {
            let schema = &change.table;
            let takes = |row: &Row| {
                let key = key_of(schema, row);
                frontier.last.as_ref().is_none_or(|last| compare_keys(&key, last).is_le())
                    && !holds(&frontier.reads, &key, source, at)
            };
            if let Some(kind) = split_kind(change.kind.clone(), |row| !takes(row)) {
                taken.push(Change { table: schema.clone(), kind });
            }
        }
        Ok(taken)
    }

    /// Whether target table `target` is to be copied again: until its copy replaces it, its own
    /// changes apply as a replay, since what it holds is not trusted any more (a table damaged in
    /// the target is what a resync is for).
    pub(super) fn resyncing(&self, target: &TableName) -> bool {
        self.checkpoint
            .resync
            .as_ref()
            .is_some_and(|resync| resync.tables.iter().any(|table| self.context.target_name(table) == *target))
    }

    /// The mapping of the table being copied onto its copy, for `table`'s schema.
    pub(super) fn resync_mapping(&mut self, table: &Arc<TableSchema>) -> Result<Arc<TableMapping>> {
        let hidden = match self.checkpoint.resync.as_ref().and_then(|resync| resync.copy.as_ref()) {
            Some(copy) => copy.hidden.clone(),
            None => return Err(Error::new(ErrorKind::State, "no resync copy to map onto").on(Side::State)),
        };
        let context = self.context;
        let frontier = self.resync_frontier.as_mut().expect("a frontier with the copy's changes");
        if let Some((schema, mapping)) = &frontier.mapping {
            if Arc::ptr_eq(schema, table) {
                return Ok(mapping.clone());
            }
        }
        let mapping = Arc::new(context.mapping(table)?.renamed(hidden));
        frontier.mapping = Some((table.clone(), mapping.clone()));
        Ok(mapping)
    }
}
