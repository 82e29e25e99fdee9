//! A copy task's writer: rows go into data files, and the files into the table's log with the
//! task's checkpoint in one commit. The task's app transaction (`sluice/<job>/<task>`) numbers its
//! commits, so the table itself says which of them happened: Delta's own exactly-once. Rows are
//! committed when a file fills up (`target_file_mb`) and when the split ends; a crash in between
//! copies the rows since the last commit again, whose files no commit ever named.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use deltalake_core::kernel::Action;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::writer::{DeltaWriter, RecordBatchWriter};
use sluice_core::change::{Batch, Rejected};
use sluice_core::connector::{Checkpoint, TableWriter};
use sluice_core::{Error, ErrorKind, Result, Side, TableSchema};

use super::journal::Intent;
use super::merge::data_writer;
use super::table::{delta_error, LakeTable};
use super::{types, Lake};

pub(super) struct CopyWriter {
    pub(super) lake: Arc<Lake>,
    pub(super) job: String,
    pub(super) task: String,
    pub(super) table: Arc<TableSchema>,
    pub(super) delta: Option<LakeTable>,
    pub(super) schema: Option<SchemaRef>,
    pub(super) writer: Option<RecordBatchWriter>,
    /// The task's last committed app transaction version.
    pub(super) version: i64,
    /// Rows staged since the last commit.
    pub(super) staged: u64,
    /// Remove every file of the table with the next commit (a split copied again whole).
    pub(super) replace: bool,
}

impl CopyWriter {
    fn app(&self) -> String {
        super::app_id(&self.job, &self.task)
    }

    async fn table(&mut self) -> Result<&mut LakeTable> {
        if self.delta.is_none() {
            self.delta = Some(self.lake.ensure_table(&self.table).await?);
        }
        Ok(self.delta.as_mut().expect("opened above"))
    }

    async fn data_writer(&mut self) -> Result<&mut RecordBatchWriter> {
        if self.writer.is_none() {
            let file_bytes = self.lake.options.file_bytes;
            let table = self.table().await?;
            let schema = table.arrow_schema();
            let writer = data_writer(table, &schema, file_bytes)?;
            self.schema = Some(schema);
            self.writer = Some(writer);
        }
        Ok(self.writer.as_mut().expect("made above"))
    }
}

#[async_trait]
impl TableWriter for CopyWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        let app = self.app();
        let (job, task) = (self.job.clone(), self.task.clone());
        let journal = self.lake.journal(&job);
        let table = self.table().await?;
        let Some(version) = table.app_version(&app).await? else { return Ok(None) };
        let checkpoint = match journal.read_intent(&task, version)? {
            Some(intent) => intent.checkpoint,
            // The bookkeeping is gone: the commit's own metadata says the same.
            None => super::checkpoint_in_history(table, &task, version).await?.ok_or_else(|| {
                Error::new(
                    ErrorKind::State,
                    format!("task {task} committed version {version} of its app transaction to table {}, and neither .sluice/ nor the table's recent history holds its checkpoint", table.name),
                )
                .on(Side::Target)
                .hint("run the job with --restart to copy everything again")
            })?,
        };
        self.version = version;
        Ok(Some(checkpoint))
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        let (rows, rejected) = crate::lake::rows::copied_rows(types::FORMAT, &self.table, batch)?;
        if rows.is_empty() {
            return Ok(rejected);
        }
        let staged = rows.len() as u64;
        self.data_writer().await?;
        let schema = self.schema.clone().expect("set with the writer");
        let record_batch = types::batch(&self.table, &schema, rows.into_iter())?;
        let name = self.table.name.to_string();
        self.writer
            .as_mut()
            .expect("made above")
            .write(record_batch)
            .await
            .map_err(|error| delta_error(format!("write to Delta table {name}"), error))?;
        self.staged += staged;
        Ok(rejected)
    }

    /// Rows become durable when a file is full or the split is done; a commit in between only
    /// hands them over (as the Parquet target's parts do).
    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let full =
            self.writer.as_ref().is_some_and(|writer| writer.buffer_len() as u64 >= self.lake.options.file_bytes);
        if !checkpoint.done && !full && !self.replace {
            return Ok(());
        }
        self.lake.check_fence(&self.job)?;
        let mut actions: Vec<Action> = Vec::new();
        if self.replace {
            actions.extend(self.table().await?.files().iter().map(|file| Action::Remove(file.remove(true))));
        }
        if let Some(mut writer) = self.writer.take() {
            let adds = writer
                .flush()
                .await
                .map_err(|error| delta_error(format!("write to Delta table {}", self.table.name), error))?;
            actions.extend(adds.into_iter().map(Action::Add));
        }
        let version = self.version + 1;
        let location = self.lake.relative(&self.table.name);
        let journal = self.lake.journal(&self.job);
        journal.write_intent(&self.task, version, &Intent { checkpoint: checkpoint.clone(), table: location })?;
        let info =
            serde_json::json!({ "job": self.job, "task": self.task, "version": version, "checkpoint": checkpoint });
        let operation = DeltaOperation::Write { mode: SaveMode::Append, partition_by: None, predicate: None };
        let app = self.app();
        self.table().await?.commit(actions, Some((&app, version)), info, operation).await?;
        journal.prune_intents(&self.task, version - 1);
        self.version = version;
        self.staged = 0;
        self.replace = false;
        Ok(())
    }

    async fn replace_all(&mut self) -> Result<()> {
        self.replace = true;
        Ok(())
    }
}
