//! One Delta table as Sluice uses it: created from a table schema, its live data files with the
//! statistics the key merge prunes by, app transaction versions, and commits.

use std::path::{Path, PathBuf};

use arrow_schema::SchemaRef;
use deltalake_core::kernel::engine::arrow_conversion::TryIntoKernel;
use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties, TableReference};
use deltalake_core::kernel::{Action, Add, Remove, StructType, Transaction};
use deltalake_core::logstore::LogStoreRef;
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::table::state::DeltaTableState;
use deltalake_core::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

/// A Delta error as Sluice's, naming what was being done. A concurrent commit of the same
/// application (another writer of the task) is `Fenced`; storage that cannot be reached,
/// `Unavailable`.
pub(super) fn delta_error(doing: impl std::fmt::Display, error: DeltaTableError) -> Error {
    let text = error.to_string();
    let kind = match &error {
        DeltaTableError::Transaction { .. }
            if text.contains("ConcurrentTransaction") || text.contains("concurrent transaction") =>
        {
            ErrorKind::Fenced
        }
        DeltaTableError::ObjectStore { .. } | DeltaTableError::Io { .. } => ErrorKind::Unavailable,
        _ => ErrorKind::Write,
    };
    Error::new(kind, format!("{doing}: {text}")).on(Side::Target)
}

/// A data file of the table as the log lists it.
#[derive(Debug, Clone)]
pub(super) struct DataFile {
    pub add: Add,
    /// Where it is on disk.
    pub file: PathBuf,
    pub rows: u64,
}

impl DataFile {
    /// Its removal, as part of a change of the data (`data_change`) or of its layout only.
    pub(super) fn remove(&self, data_change: bool) -> Remove {
        Remove {
            path: self.add.path.clone(),
            data_change,
            deletion_timestamp: Some(now_millis()),
            extended_file_metadata: Some(true),
            partition_values: Some(self.add.partition_values.clone()),
            size: Some(self.add.size),
            tags: self.add.tags.clone(),
            deletion_vector: self.add.deletion_vector.clone(),
            base_row_id: self.add.base_row_id,
            default_row_commit_version: self.add.default_row_commit_version,
        }
    }

    /// The smallest and largest values of `column` in the file, from its statistics (as the log
    /// writes them: numbers, text), when it has them.
    pub(super) fn bounds(&self, column: &str) -> Option<(serde_json::Value, serde_json::Value)> {
        let stats: serde_json::Value = serde_json::from_str(self.add.stats.as_deref()?).ok()?;
        let low = stats.get("minValues")?.get(column)?.clone();
        let high = stats.get("maxValues")?.get(column)?.clone();
        Some((low, high))
    }
}

pub(super) fn now_millis() -> i64 {
    sluice_core::clock::unix_millis() as i64
}

/// The URL of a table directory.
pub(super) fn table_url(root: &Path) -> Result<url::Url> {
    url::Url::from_directory_path(root).map_err(|()| {
        Error::new(ErrorKind::Config, format!("{} is not an absolute directory path", root.display()))
            .on(Side::Target)
            .hint("give target.path as an absolute path")
    })
}

/// A loaded Delta table and its live files.
pub(super) struct LakeTable {
    pub name: TableName,
    pub root: PathBuf,
    log_store: LogStoreRef,
    state: DeltaTableState,
    files: Vec<DataFile>,
}

impl std::fmt::Debug for LakeTable {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("LakeTable").field("name", &self.name).field("root", &self.root).finish()
    }
}

impl LakeTable {
    /// Whether a Delta table lives at `root`.
    pub(super) fn exists(root: &Path) -> bool {
        root.join("_delta_log").is_dir()
    }

    /// The table at `root`, or `None` when there is none.
    pub(super) async fn open(name: &TableName, root: &Path) -> Result<Option<LakeTable>> {
        if !LakeTable::exists(root) {
            return Ok(None);
        }
        let doing = || format!("open Delta table {name} at {}", root.display());
        let table =
            DeltaTableBuilder::from_url(table_url(root)?).map_err(|error| delta_error(doing(), error))?.load().await;
        match table {
            Ok(table) => Ok(Some(LakeTable::loaded(name, root, table).map_err(|error| delta_error(doing(), error))?)),
            // A log directory with no commit yet: a creation that did not finish.
            Err(DeltaTableError::NotATable(_)) => Ok(None),
            Err(error) => Err(delta_error(doing(), error)),
        }
    }

    fn loaded(name: &TableName, root: &Path, table: DeltaTable) -> std::result::Result<LakeTable, DeltaTableError> {
        let state = table.snapshot()?.clone();
        let mut lake = LakeTable {
            name: name.clone(),
            root: root.to_path_buf(),
            log_store: table.log_store(),
            state,
            files: Vec::new(),
        };
        lake.files = lake.list_files();
        Ok(lake)
    }

    // The Add actions are what the merge removes and the publish moves, as they are.
    #[allow(deprecated)]
    fn list_files(&self) -> Vec<DataFile> {
        self.state
            .log_data()
            .iter()
            .map(|view| {
                let add = view.add_action();
                let file = self.root.join(view.object_store_path().as_ref());
                let rows = view.num_records().unwrap_or(0) as u64;
                DataFile { add, file, rows }
            })
            .collect()
    }

    /// Creates the table at `root` (or opens the one there) for `table`'s columns, partitioned
    /// by `partition_by`, with these table properties.
    pub(super) async fn create(
        table: &TableSchema,
        schema: &SchemaRef,
        root: &Path,
        partition_by: &[String],
        properties: &[(&str, String)],
    ) -> Result<LakeTable> {
        let doing = || format!("create Delta table {} at {}", table.name, root.display());
        std::fs::create_dir_all(root)
            .map_err(|error| Error::new(ErrorKind::Connect, format!("{}: {error}", doing())).on(Side::Target))?;
        let structure: StructType = schema
            .as_ref()
            .try_into_kernel()
            .map_err(|error| Error::new(ErrorKind::Schema, format!("{}: {error}", doing())).on(Side::Target))?;
        let created = DeltaTableBuilder::from_url(table_url(root)?)
            .map_err(|error| delta_error(doing(), error))?
            .build()
            .map_err(|error| delta_error(doing(), error))?
            .create()
            .with_columns(structure.fields().cloned())
            .with_partition_columns(partition_by.to_vec())
            .with_configuration(properties.iter().map(|(key, value)| (key.to_string(), Some(value.clone()))))
            .with_table_name(table.name.to_string())
            .with_save_mode(SaveMode::Ignore)
            .await
            .map_err(|error| delta_error(doing(), error))?;
        LakeTable::loaded(&table.name, root, created).map_err(|error| delta_error(doing(), error))
    }

    /// Creates a table whose first commit holds `actions` (its protocol and metadata first), as
    /// a publish does. A table already there is left as it is.
    pub(super) async fn create_with(
        name: &TableName,
        root: &Path,
        actions: Vec<Action>,
        info: serde_json::Value,
    ) -> Result<()> {
        let doing = || format!("create Delta table {name} at {}", root.display());
        std::fs::create_dir_all(root)
            .map_err(|error| Error::new(ErrorKind::Connect, format!("{}: {error}", doing())).on(Side::Target))?;
        let table = DeltaTableBuilder::from_url(table_url(root)?)
            .map_err(|error| delta_error(doing(), error))?
            .build()
            .map_err(|error| delta_error(doing(), error))?;
        let (protocol, metadata) = match (&actions[0], &actions[1]) {
            (Action::Protocol(protocol), Action::Metadata(metadata)) => (protocol.clone(), metadata.clone()),
            _ => {
                return Err(Error::new(
                    ErrorKind::State,
                    format!("{}: the actions lack a protocol and metadata", doing()),
                )
                .on(Side::Target))
            }
        };
        let operation = DeltaOperation::Create {
            mode: SaveMode::ErrorIfExists,
            location: table.table_url().clone(),
            protocol,
            metadata,
        };
        let committed = CommitBuilder::from(CommitProperties::default().with_metadata(info_map(info)))
            .with_actions(actions)
            .build(None, table.log_store(), operation)
            .await;
        match committed {
            Ok(_) => Ok(()),
            // Made by an earlier attempt that the journal could not record as done.
            Err(DeltaTableError::VersionAlreadyExists(_)) => Ok(()),
            Err(error) => Err(delta_error(doing(), error)),
        }
    }

    /// The live data files.
    pub(super) fn files(&self) -> &[DataFile] {
        &self.files
    }

    /// The table's Arrow schema now.
    pub(super) fn arrow_schema(&self) -> SchemaRef {
        self.state.snapshot().arrow_schema()
    }

    pub(super) fn partition_columns(&self) -> Vec<String> {
        self.state.metadata().partition_columns().to_vec()
    }

    pub(super) fn protocol_and_metadata(&self) -> (Action, Action) {
        (Action::Protocol(self.state.protocol().clone()), Action::Metadata(self.state.metadata().clone()))
    }

    pub(super) fn metadata(&self) -> &deltalake_core::kernel::Metadata {
        self.state.metadata()
    }

    /// The last version `app` committed (its app transaction), if any.
    pub(super) async fn app_version(&self, app: &str) -> Result<Option<i64>> {
        self.state
            .transaction_version(self.log_store.as_ref(), app)
            .await
            .map_err(|error| delta_error(format!("read table {}'s transactions", self.name), error))
    }

    /// The Sluice metadata of the newest commits, newest first, at most `limit` of them: what
    /// recovery falls back to when the journal lacks a checkpoint.
    pub(super) async fn recent_sluice_info(&self, limit: usize) -> Result<Vec<serde_json::Value>> {
        use futures_util::TryStreamExt;
        let doing = || format!("read table {}'s history", self.name);
        let table = DeltaTableBuilder::from_url(table_url(&self.root)?)
            .map_err(|error| delta_error(doing(), error))?
            .load()
            .await
            .map_err(|error| delta_error(doing(), error))?;
        let infos: Vec<_> =
            table.history(Some(limit)).try_collect().await.map_err(|error| delta_error(doing(), error))?;
        Ok(infos.into_iter().filter_map(|info| info.info.get("sluice").cloned()).collect())
    }

    /// Commits `actions` with `app`'s transaction at `version` and `info` as the commit's
    /// `sluice` metadata. Another commit of the same application since this table was read fails
    /// it with `Fenced`. The table then holds the new version.
    pub(super) async fn commit(
        &mut self,
        actions: Vec<Action>,
        app: Option<(&str, i64)>,
        info: serde_json::Value,
        operation: DeltaOperation,
    ) -> Result<i64> {
        let mut properties = CommitProperties::default().with_metadata(info_map(info));
        if let Some((app, version)) = app {
            properties = properties.with_application_transaction(Transaction::new_with_last_update(
                app,
                version,
                Some(now_millis()),
            ));
        }
        let applied = apply(&self.files, &actions, &self.root);
        let committed = CommitBuilder::from(properties)
            .with_actions(actions)
            .build(Some(&self.state as &dyn TableReference), self.log_store.clone(), operation)
            .await;
        match committed {
            Ok(finalized) => {
                self.state = finalized.snapshot();
                self.files = applied;
                Ok(finalized.version() as i64)
            }
            Err(error) => Err(delta_error(format!("commit to Delta table {}", self.name), error)),
        }
    }

    /// Reads the table again from its log (after a failed commit, or a change by another writer).
    pub(super) async fn reload(&mut self) -> Result<()> {
        self.state
            .update(self.log_store.as_ref(), None)
            .await
            .map_err(|error| delta_error(format!("read Delta table {}", self.name), error))?;
        self.files = self.list_files();
        Ok(())
    }
}

/// The commit's metadata: Sluice's under one key.
fn info_map(info: serde_json::Value) -> Vec<(String, serde_json::Value)> {
    if info.is_null() {
        Vec::new()
    } else {
        vec![("sluice".to_owned(), info)]
    }
}

/// The live files after `actions`.
fn apply(files: &[DataFile], actions: &[Action], root: &Path) -> Vec<DataFile> {
    let removed: std::collections::HashSet<&str> = actions
        .iter()
        .filter_map(|action| match action {
            Action::Remove(remove) => Some(remove.path.as_str()),
            _ => None,
        })
        .collect();
    let mut live: Vec<DataFile> =
        files.iter().filter(|file| !removed.contains(file.add.path.as_str())).cloned().collect();
    for action in actions {
        if let Action::Add(add) = action {
            let rows = add
                .stats
                .as_deref()
                .and_then(|stats| serde_json::from_str::<serde_json::Value>(stats).ok())
                .and_then(|stats| stats.get("numRecords").and_then(serde_json::Value::as_u64))
                .unwrap_or(0);
            let relative = deltalake_core::Path::from_url_path(&add.path)
                .map(|path| path.to_string())
                .unwrap_or_else(|_| add.path.clone());
            live.push(DataFile { add: add.clone(), file: root.join(relative), rows });
        }
    }
    live
}
