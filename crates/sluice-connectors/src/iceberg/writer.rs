//! The copy writer: a task's rows written into data files and appended to the table with the
//! task's checkpoint as a property of the same metadata file.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::change::{Batch, Rejected};
use sluice_core::connector::{Checkpoint, TableWriter};
use sluice_core::{Result, TableSchema};

use super::files::DataWriter;
use super::table::{iceberg_error, FileChanges};
use super::{checkpoint_property, types, Warehouse};
use crate::lake::rows;

/// Rows a copy holds before it asks for a commit (the engine commits at a split's end anyway).
const COMMIT_ROWS: u64 = 1_000_000;

pub(super) struct CopyWriter {
    warehouse: Arc<Warehouse>,
    job: String,
    task: String,
    table: Arc<TableSchema>,
    writer: Option<DataWriter>,
    /// Rows staged since the last commit.
    staged: u64,
    /// Remove every file of the table with the next commit (a split copied again whole).
    replace: bool,
}

impl CopyWriter {
    pub(super) fn new(warehouse: Arc<Warehouse>, job: &str, task: &str, table: Arc<TableSchema>) -> CopyWriter {
        CopyWriter {
            warehouse,
            job: job.to_owned(),
            task: task.to_owned(),
            table,
            writer: None,
            staged: 0,
            replace: false,
        }
    }

    async fn data_writer(&mut self) -> Result<&mut DataWriter> {
        if self.writer.is_none() {
            let table = self.warehouse.ensure(&self.table).await?;
            self.writer = Some(table.data_writer(None, self.warehouse.options.file_bytes)?);
        }
        Ok(self.writer.as_mut().expect("made above"))
    }
}

#[async_trait]
impl TableWriter for CopyWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        let table = self.warehouse.ensure(&self.table).await?;
        let Some(text) = table.property(&checkpoint_property(&self.job, &self.task)) else { return Ok(None) };
        serde_json::from_str(text).map(Some).map_err(|error| {
            iceberg_error(format_args!("read task {}'s checkpoint in Iceberg table {}", self.task, table.name), error)
        })
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        let (accepted, rejected) = rows::copied_rows(types::FORMAT, &self.table, batch)?;
        if accepted.is_empty() {
            return Ok(rejected);
        }
        let count = accepted.len() as u64;
        let table = self.table.clone();
        let writer = self.data_writer().await?;
        let record_batch = rows::batch(types::FORMAT, &table, &writer.schema().clone(), accepted.into_iter())?;
        writer.write(&record_batch)?;
        self.staged += count;
        Ok(rejected)
    }

    fn wants_commit(&self) -> bool {
        self.staged >= COMMIT_ROWS
            || self.writer.as_ref().is_some_and(|writer| writer.held_bytes() >= self.warehouse.options.file_bytes)
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let mut changes = FileChanges::default();
        if let Some(writer) = self.writer.as_mut() {
            changes.added = writer.finish()?;
        }
        // The table exists once (it is made when missing: a split that wrote no row commits too).
        let table = self.warehouse.ensure(&self.table).await?;
        if self.replace {
            let live = table.live_files(&self.warehouse.io).await?;
            changes.removed = live.iter().map(|entry| entry.file_path().to_owned()).collect::<HashSet<_>>();
        }
        let text = serde_json::to_string(checkpoint)
            .map_err(|error| iceberg_error(format_args!("task {}'s checkpoint", self.task), error))?;
        changes.summary.insert("sluice.job".into(), self.job.clone());
        changes.summary.insert("sluice.task".into(), self.task.clone());
        changes.summary.insert("sluice.checkpoint".into(), text.clone());
        changes.properties.insert(checkpoint_property(&self.job, &self.task), text);
        self.warehouse.commit_files(&self.job, &table.name, &changes).await?;
        self.staged = 0;
        self.replace = false;
        Ok(())
    }

    async fn replace_all(&mut self) -> Result<()> {
        self.replace = true;
        Ok(())
    }
}
