//! The change writer: a group of whole source transactions, folded per key by the stream,
//! merged into each table it touches (`merge.rs`), decided in the journal and committed table by
//! table with the stream's app transaction at the group's number (`journal.rs` says why). Groups
//! commit at the target's cadence (`commit_interval_secs`, `commit_rows`), and between groups the
//! tables are kept compact (`maintenance.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::{Action, MetadataExt, StructType, Transaction};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use sluice_core::change::Row;
use sluice_core::connector::{
    ChangeWriter, Checkpoint, CommitCadence, FoldedChangeWriter, Refused, SchemaChange, Updated,
};
use sluice_core::names::own_name;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use super::journal::{Entry, TableCommit};
use super::maintenance::Maintenance;
use super::merge::merge;
use super::table::{now_millis, LakeTable};
use super::{types, Lake, STREAM_APP};
use crate::lake::keys::StagedChanges;

/// A table's schema change waiting for the group's commit.
enum Reshape {
    /// Columns added (the table's schema after them).
    Add(Arc<TableSchema>),
}

pub(super) struct DeltaChanges {
    pub(super) lake: Arc<Lake>,
    pub(super) job: String,
    /// Open tables by location (relative directory).
    pub(super) tables: HashMap<String, LakeTable>,
    /// The group's changes per table, in the order tables were first touched.
    pub(super) staged: Vec<StagedChanges>,
    reshaped: Vec<(String, Reshape)>,
    /// Tables a TRUNCATE empties with the group.
    truncating: Vec<TableName>,
    /// Hidden copies to publish with the group: (hidden name, own name).
    publishing: Vec<(TableName, TableName)>,
    /// The last decided group.
    group: i64,
    maintenance: Maintenance,
}

impl DeltaChanges {
    pub(super) fn new(lake: Arc<Lake>, job: &str) -> DeltaChanges {
        let maintenance = Maintenance::new(&lake.options);
        DeltaChanges {
            lake,
            job: job.to_owned(),
            tables: HashMap::new(),
            staged: Vec::new(),
            reshaped: Vec::new(),
            truncating: Vec::new(),
            publishing: Vec::new(),
            group: 0,
            maintenance,
        }
    }

    fn app(&self) -> String {
        super::app_id(&self.job, STREAM_APP)
    }

    async fn open(&mut self, name: &TableName) -> Result<&mut LakeTable> {
        let location = self.lake.relative(name);
        if !self.tables.contains_key(&location) {
            let table = match LakeTable::open(name, &self.lake.root(name)).await? {
                Some(table) => table,
                None => {
                    return Err(Error::new(
                        ErrorKind::Schema,
                        format!("Delta table {name} does not exist at {}", self.lake.root(name).display()),
                    )
                    .on(Side::Target)
                    .hint("run the job with --restart to create and copy its tables again"))
                }
            };
            self.tables.insert(location.clone(), table);
        }
        Ok(self.tables.get_mut(&location).expect("opened above"))
    }

    fn staged(&mut self, table: &TableSchema) -> Result<&mut StagedChanges> {
        let position = match self.staged.iter().position(|staged| staged.table.name == table.name) {
            Some(position) => {
                // A schema changed inside the group: the rows staged before keep theirs.
                self.staged[position].reshape(table);
                position
            }
            None => {
                self.staged.push(StagedChanges::new(Arc::new(table.clone()), types::FORMAT)?);
                self.staged.len() - 1
            }
        };
        Ok(&mut self.staged[position])
    }

    /// Commits an entry's table commits that are not in their tables yet, in order.
    async fn roll_forward(&mut self, entry: &Entry) -> Result<()> {
        let app = self.app();
        for commit in &entry.tables {
            let name = TableName::parse(&commit.name);
            let root = self.lake.path.join(&commit.table);
            if commit.create {
                if !LakeTable::exists(&root) {
                    let mut actions = commit.actions.clone();
                    actions.push(Action::Txn(Transaction::new_with_last_update(&app, entry.group, Some(now_millis()))));
                    LakeTable::create_with(&name, &root, actions, commit_info(&self.job, entry)).await?;
                }
                self.tables.remove(&commit.table);
                continue;
            }
            if !self.tables.contains_key(&commit.table) {
                let published = commit
                    .table
                    .strip_suffix(&format!("/{}", super::COPY_DIRECTORY))
                    .is_some_and(|own| LakeTable::exists(&self.lake.path.join(own)));
                if published && !LakeTable::exists(&root) {
                    // A copy published since: the own table carries its rows and this change of
                    // layout is moot.
                    continue;
                }
                let Some(table) = LakeTable::open(&name, &root).await? else {
                    return Err(Error::new(
                        ErrorKind::State,
                        format!(
                            "Delta table {name} is gone from {}, but the stream's group {} changes it",
                            root.display(),
                            entry.group
                        ),
                    )
                    .on(Side::Target)
                    .hint("run the job with --restart to create and copy its tables again"));
                };
                self.tables.insert(commit.table.clone(), table);
            }
            let table = self.tables.get_mut(&commit.table).expect("opened above");
            if table.app_version(&app).await?.is_some_and(|version| version >= entry.group) {
                continue;
            }
            let operation = match commit.operation.as_str() {
                "compact" => {
                    DeltaOperation::Optimize { predicate: None, target_size: self.lake.options.file_bytes as i64 }
                }
                _ => DeltaOperation::Write { mode: SaveMode::Append, partition_by: None, predicate: None },
            };
            let committed = table
                .commit(commit.actions.clone(), Some((&app, entry.group)), commit_info(&self.job, entry), operation)
                .await;
            if let Err(error) = committed {
                // Another writer (the one that decided the group, still running) may have made it.
                table.reload().await?;
                if table.app_version(&app).await?.is_none_or(|version| version < entry.group) {
                    return Err(error.context(format_args!("stream group {}", entry.group)));
                }
            }
            sluice_core::failpoint::hit("delta.table.committed");
        }
        for discarded in &entry.discard {
            // A published copy: its rows are the own table's now.
            if let Some(copy) = discarded.strip_suffix("/_delta_log") {
                self.tables.remove(copy);
            }
            let _ = std::fs::remove_dir_all(self.lake.path.join(discarded));
        }
        Ok(())
    }

    /// Decides `entry` (the next group) and commits its tables.
    async fn decide(&mut self, entry: Entry) -> Result<()> {
        if !self.lake.journal(&self.job).decide(&entry)? {
            let taken = self.lake.journal(&self.job).read_entry(entry.group)?;
            let held = taken.map_or(0, |taken| taken.epoch);
            return Err(match &self.lake.fence {
                Some(fence) => fence.moved(&self.job, held),
                None => Error::new(
                    ErrorKind::Fenced,
                    format!("FENCED: another writer of job {} decided stream group {} first", self.job, entry.group),
                )
                .on(Side::Target)
                .hint("run one writer of a job at a time"),
            });
        }
        sluice_core::failpoint::hit("delta.group.decided");
        self.roll_forward(&entry).await?;
        self.group = entry.group;
        self.lake.journal(&self.job).prune_entries(entry.group - 1);
        Ok(())
    }

    /// The group's table commits: merges, added columns, published copies.
    async fn table_commits(&mut self) -> Result<(Vec<TableCommit>, Vec<String>)> {
        let mut commits: Vec<TableCommit> = Vec::new();
        let file_bytes = self.lake.options.file_bytes;
        let mut staged = std::mem::take(&mut self.staged);
        let mut reshaped = std::mem::take(&mut self.reshaped);
        for name in std::mem::take(&mut self.truncating) {
            let table = self.open(&name).await?;
            let actions: Vec<Action> = table.files().iter().map(|file| Action::Remove(file.remove(true))).collect();
            if let Some(position) = staged.iter().position(|changes| changes.table.name == name) {
                // Rows of the table staged before the TRUNCATE are gone with it.
                staged.remove(position);
            }
            commits.push(TableCommit {
                table: self.lake.relative(&name),
                name: name.to_string(),
                create: false,
                operation: "truncate".into(),
                actions,
            });
        }
        for changes in staged {
            let name = changes.table.name.clone();
            let location = self.lake.relative(&name);
            let mut actions: Vec<Action> = Vec::new();
            let table = self.open(&name).await?;
            let mut schema = table.arrow_schema();
            if let Some(index) = reshaped.iter().position(|(at, _)| *at == location) {
                let (_, Reshape::Add(table_schema)) = reshaped.remove(index);
                let (metadata, widened) = added_columns(table, &table_schema)?;
                actions.push(metadata);
                schema = widened;
            }
            if !changes.is_empty() {
                let (removed, added) = changes.counts();
                let started = std::time::Instant::now();
                let merged = merge(table, &schema, changes, file_bytes).await?;
                log::debug!(
                    "delta {name}: {removed} rows out, {added} in; {} files rewritten ({} rows kept) in {:?}",
                    merged.files_rewritten,
                    merged.rows_rewritten,
                    started.elapsed()
                );
                actions.extend(merged.actions);
            }
            if !actions.is_empty() {
                commits.push(TableCommit {
                    table: location,
                    name: name.to_string(),
                    create: false,
                    operation: "merge".into(),
                    actions,
                });
            }
        }
        for (location, Reshape::Add(table_schema)) in reshaped {
            let table = self.open(&table_schema.name).await?;
            let (metadata, _) = added_columns(table, &table_schema)?;
            commits.push(TableCommit {
                table: location,
                name: table_schema.name.to_string(),
                create: false,
                operation: "schema".into(),
                actions: vec![metadata],
            });
        }
        let mut discard = Vec::new();
        for (hidden, own) in std::mem::take(&mut self.publishing) {
            let hidden_location = self.lake.relative(&hidden);
            let own_location = self.lake.relative(&own);
            if LakeTable::exists(&self.lake.root(&own)) || !LakeTable::exists(&self.lake.root(&hidden)) {
                continue;
            }
            let tasks = self.lake.journal(&self.job).tasks_of(&hidden_location)?;
            let job = self.job.clone();
            // The copy's files as they will be after this group's own commit to it.
            let table = self.open(&hidden).await?;
            let mut files: Vec<deltalake_core::kernel::Add> =
                table.files().iter().map(|file| file.add.clone()).collect();
            if let Some(commit) = commits.iter().find(|commit| commit.table == hidden_location) {
                for action in &commit.actions {
                    match action {
                        Action::Remove(remove) => files.retain(|add| add.path != remove.path),
                        Action::Add(add) => files.push(add.clone()),
                        _ => {}
                    }
                }
            }
            let (mut protocol, mut metadata) = table.protocol_and_metadata();
            // Columns the group adds to the copy are the table's from its first version.
            for action in
                commits.iter().filter(|commit| commit.table == hidden_location).flat_map(|commit| &commit.actions)
            {
                match action {
                    Action::Metadata(_) => metadata = action.clone(),
                    Action::Protocol(_) => protocol = action.clone(),
                    _ => {}
                }
            }
            let prefix =
                hidden_location.strip_prefix(&format!("{own_location}/")).unwrap_or(super::COPY_DIRECTORY).to_owned();
            let mut actions = vec![protocol, metadata];
            for mut add in files {
                add.path = format!("{prefix}/{}", add.path);
                actions.push(Action::Add(add));
            }
            // The copy tasks' checkpoints move with their rows.
            for (task, _) in tasks {
                let app = super::app_id(&job, &task);
                if let Some(version) = table.app_version(&app).await? {
                    actions.push(Action::Txn(Transaction::new_with_last_update(app, version, Some(now_millis()))));
                }
            }
            commits.push(TableCommit {
                table: own_location,
                name: own.to_string(),
                create: true,
                operation: "publish".into(),
                actions,
            });
            discard.push(format!("{hidden_location}/_delta_log"));
        }
        Ok((commits, discard))
    }
}

/// The metadata of `table` with the columns of `schema` it lacks added (nullable, at the end),
/// and the Arrow schema after it. A column of the table that `schema` lacks, or has with another
/// type, is a schema change a Delta table does not take.
fn added_columns(table: &LakeTable, schema: &TableSchema) -> Result<(Action, arrow_schema::SchemaRef)> {
    let current = table.arrow_schema();
    let wanted = types::arrow_schema(schema);
    let mut problems = Vec::new();
    for field in current.fields() {
        match wanted.field_with_name(field.name()) {
            Err(_) if !table.partition_columns().contains(field.name()) => {
                problems.push(format!("column {} is gone", field.name()))
            }
            Ok(new) if new.data_type() != field.data_type() => problems.push(format!(
                "column {} changes type from {} to {}",
                field.name(),
                field.data_type(),
                new.data_type()
            )),
            _ => {}
        }
    }
    if !problems.is_empty() {
        return Err(types::FORMAT.unsupported(&schema.name, &problems.join("; ")));
    }
    let mut fields: Vec<arrow_schema::FieldRef> = current.fields().iter().cloned().collect();
    for field in wanted.fields() {
        if current.field_with_name(field.name()).is_err() {
            fields.push(Arc::new(field.as_ref().clone().with_nullable(true)));
        }
    }
    let widened = Arc::new(arrow_schema::Schema::new(fields));
    let structure: StructType = widened
        .as_ref()
        .try_into_kernel()
        .map_err(|error| Error::new(ErrorKind::Schema, format!("table {}: {error}", schema.name)).on(Side::Target))?;
    let metadata =
        table.metadata().clone().with_schema(&structure).map_err(|error| {
            Error::new(ErrorKind::Schema, format!("table {}: {error}", schema.name)).on(Side::Target)
        })?;
    Ok((Action::Metadata(metadata), widened))
}

/// The Sluice metadata of a group's commits: the job, the group and the stream's checkpoint.
fn commit_info(job: &str, entry: &Entry) -> serde_json::Value {
    serde_json::json!({ "job": job, "task": STREAM_APP, "version": entry.group, "checkpoint": entry.checkpoint })
}

#[async_trait]
impl ChangeWriter for DeltaChanges {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        let journal = self.lake.journal(&self.job);
        let last = match journal.last_entry()? {
            Some(entry) => Some(entry),
            None => self.lake.stream_entry_from_tables(&self.job).await?,
        };
        let Some(mut entry) = last else {
            if let Some(fence) = &self.lake.fence {
                journal.claim(&self.job, fence)?;
            }
            return Ok(None);
        };
        self.roll_forward(&entry).await?;
        self.group = entry.group;
        if let Some(fence) = self.lake.fence.clone() {
            // A claim is a group of its own: an older owner can decide no group after it.
            loop {
                if entry.epoch > fence.epoch {
                    return Err(fence.moved(&self.job, entry.epoch));
                }
                if entry.epoch == fence.epoch {
                    break;
                }
                let claim = Entry {
                    group: entry.group + 1,
                    epoch: fence.epoch,
                    tables: Vec::new(),
                    discard: Vec::new(),
                    ..entry.clone()
                };
                if journal.decide(&claim)? {
                    self.group = claim.group;
                    entry = claim;
                    break;
                }
                // The older owner decided one more group first: take it in, then claim after it.
                entry = journal.read_entry(claim.group)?.expect("a group that could not be created exists");
                self.roll_forward(&entry).await?;
                self.group = entry.group;
            }
        }
        Ok(Some(entry.checkpoint))
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        self.lake.check_fence(&self.job)?;
        let (tables, discard) = self.table_commits().await?;
        let epoch = self.lake.fence.as_ref().map_or(0, |fence| fence.epoch);
        let entry = Entry { group: self.group + 1, epoch, checkpoint: checkpoint.clone(), tables, discard };
        self.decide(entry).await?;
        // Between groups: compaction and vacuum, each bounded to keep the stream moving.
        if let Some(entry) = self.maintenance.due(&mut self.tables, &self.lake, self.group + 1, checkpoint).await? {
            self.decide(entry).await?;
        }
        self.maintenance.vacuum(&mut self.tables, &self.lake).await;
        Ok(())
    }

    fn cadence(&self) -> Option<CommitCadence> {
        Some(CommitCadence { every: self.lake.options.commit_interval, rows: self.lake.options.commit_rows })
    }

    async fn apply_schema_change(&mut self, change: &SchemaChange) -> Result<()> {
        if let Some(refused) = types::FORMAT.refusal(change) {
            return Err(refused);
        }
        match change {
            SchemaChange::Create(table) => {
                let created = self.lake.ensure_table(table).await?;
                self.tables.insert(self.lake.relative(&table.name), created);
                Ok(())
            }
            SchemaChange::Alter { table, .. } => {
                let location = self.lake.relative(&table.name);
                let current = self.open(&table.name).await?;
                // Checked now, so the statement is named in the error.
                added_columns(current, table)?;
                self.reshaped.retain(|(at, _)| *at != location);
                self.reshaped.push((location, Reshape::Add(Arc::new(table.clone()))));
                Ok(())
            }
            SchemaChange::Truncate(name) => {
                // The group before the statement is committed; its own commit empties the table.
                self.open(name).await?;
                if !self.truncating.contains(name) {
                    self.truncating.push(name.clone());
                }
                Ok(())
            }
            SchemaChange::Drop(_) | SchemaChange::Rename { .. } => unreachable!("refused above"),
        }
    }
}

#[async_trait]
impl FoldedChangeWriter for DeltaChanges {
    /// A Delta table's files hold whole rows: a row that keeps values its update left unchanged
    /// (and the source did not send) cannot be written.
    async fn update(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Updated> {
        Err(crate::lake::rows::partial_update(types::FORMAT, table, rows.len()))
    }

    async fn delete(&mut self, table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()> {
        self.staged(table)?.delete(keys, expect_all)
    }

    /// Stages the rows; one with a value its Delta column cannot hold is left out and returned.
    async fn insert(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Vec<Refused>> {
        let (kept, refused) = crate::lake::rows::inserted_rows(types::FORMAT, table, rows);
        self.staged(table)?.insert(&kept)?;
        Ok(refused)
    }

    async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()> {
        for (hidden, own) in tables {
            debug_assert_eq!(own_name(&hidden.name), own.name);
            self.publishing.push((hidden.clone(), own.clone()));
        }
        Ok(())
    }
}
