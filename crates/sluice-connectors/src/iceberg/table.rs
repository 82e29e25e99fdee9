//! One Iceberg table as Sluice uses it: its metadata, its live data files (from the current
//! snapshot's manifests), and the next metadata file of a commit that adds and removes files.
//!
//! A commit writes a manifest of the files it adds, writes again each manifest that lists a file
//! it removes (without it), keeps the others, and adds a snapshot (`append`, or `overwrite` when
//! files go) with the job's properties in its summary. The job's checkpoints are table
//! properties of the same metadata file, so they survive snapshot expiry; the catalog's pointer
//! move (`catalog.rs`) makes the commit visible.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use iceberg::io::FileIO;
use iceberg::spec::{
    DataFile, FormatVersion, ManifestEntry, ManifestFile, ManifestList, ManifestListWriter, ManifestWriterBuilder,
    Operation, Snapshot, SortOrder, Summary, TableMetadata, TableMetadataBuilder,
};
use iceberg::MetadataLocation;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use super::files::{unique_name, DataWriter};
use super::partition::{PartitionField, Partitioner};
use super::types;

/// A commit to a table listing this many manifests writes their live entries into one.
const MERGE_MANIFESTS: usize = 16;

/// Snapshots kept at least, whatever their age...
const KEEP_SNAPSHOTS: usize = 100;
/// ...and those younger than this.
const KEEP_SNAPSHOTS_MILLIS: i64 = 24 * 3_600 * 1_000;

pub(super) fn iceberg_error(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("{doing}: {error}")).on(Side::Target)
}

fn now_millis() -> i64 {
    sluice_core::clock::unix_millis() as i64
}

/// A table at one metadata file.
#[derive(Debug, Clone)]
pub(super) struct IcebergTable {
    pub name: TableName,
    pub metadata: TableMetadata,
    /// The metadata file the catalog points to.
    pub metadata_file: String,
}

/// The files a commit adds and removes, and what it records.
#[derive(Debug, Default)]
pub(super) struct FileChanges {
    pub added: Vec<DataFile>,
    /// Paths of live files that go.
    pub removed: HashSet<String>,
    /// Summary properties of the snapshot.
    pub summary: HashMap<String, String>,
    /// Table properties set with it (the job's checkpoints).
    pub properties: HashMap<String, String>,
}

impl IcebergTable {
    pub(super) async fn load(io: &FileIO, name: &TableName, metadata_file: &str) -> Result<IcebergTable> {
        let metadata = TableMetadata::read_from(io, metadata_file)
            .await
            .map_err(|error| iceberg_error(format_args!("read Iceberg table {name} at {metadata_file}"), error))?;
        Ok(IcebergTable { name: name.clone(), metadata, metadata_file: metadata_file.to_owned() })
    }

    /// The metadata of a new table of `schema` at `location`, partitioned by `partitions`,
    /// written; the table at it.
    pub(super) async fn create(
        io: &FileIO,
        schema: &TableSchema,
        location: &str,
        partitions: &[PartitionField],
    ) -> Result<IcebergTable> {
        let iceberg_schema = types::iceberg_schema(schema)?;
        let spec = super::partition::spec(&schema.name, &iceberg_schema, partitions)?;
        let failed = |error: iceberg::Error| iceberg_error(format_args!("create Iceberg table {}", schema.name), error);
        let metadata = TableMetadataBuilder::new(
            iceberg_schema,
            spec,
            SortOrder::unsorted_order(),
            location.to_owned(),
            FormatVersion::V2,
            HashMap::from([("write.parquet.compression-codec".to_owned(), "snappy".to_owned())]),
        )
        .and_then(|builder| builder.build())
        .map_err(failed)?
        .metadata;
        let metadata_file = MetadataLocation::new_with_metadata(location, &metadata);
        metadata.write_to(io, &metadata_file).await.map_err(failed)?;
        Ok(IcebergTable { name: schema.name.clone(), metadata, metadata_file: metadata_file.to_string() })
    }

    /// Refuses a table Sluice's commits would not describe rightly: one of another format version
    /// than 2 (a table another tool made).
    fn check_writable(&self) -> Result<()> {
        if self.metadata.format_version() == FormatVersion::V2 {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Schema,
            format!(
                "Iceberg table {} cannot take Sluice's commits: it is of Iceberg format version {}; Sluice writes tables of format version 2",
                self.name,
                self.metadata.format_version()
            ),
        )
        .on(Side::Target)
        .hint("let the job create the table: drop it from the catalog, or set target.namespace to one without it"))
    }

    pub(super) fn location(&self) -> &str {
        self.metadata.location()
    }

    /// The Arrow schema of the table's data files.
    pub(super) fn arrow_schema(&self) -> Result<arrow_schema::SchemaRef> {
        types::arrow_schema(&self.name, self.metadata.current_schema())
    }

    /// A writer of the table's data files, for its current schema or `schema` (one a commit
    /// brings), partitioned by its spec.
    pub(super) fn data_writer(&self, schema: Option<&iceberg::spec::Schema>, file_bytes: u64) -> Result<DataWriter> {
        let schema = schema.unwrap_or(self.metadata.current_schema());
        let arrow = types::arrow_schema(&self.name, schema)?;
        let spec = self.metadata.default_partition_spec();
        let partitioner = Partitioner::new(&self.name, spec, schema, &arrow)?;
        Ok(DataWriter::new(self.location(), arrow, self.spec_id(), file_bytes, partitioner))
    }

    pub(super) fn spec_id(&self) -> i32 {
        self.metadata.default_partition_spec_id()
    }

    pub(super) fn property(&self, key: &str) -> Option<&str> {
        self.metadata.properties().get(key).map(String::as_str)
    }

    async fn manifests(&self, io: &FileIO) -> Result<Vec<ManifestFile>> {
        let Some(snapshot) = self.metadata.current_snapshot() else { return Ok(Vec::new()) };
        let failed = |error: iceberg::Error| iceberg_error(format_args!("read Iceberg table {}", self.name), error);
        let bytes = io.new_input(snapshot.manifest_list()).map_err(failed)?.read().await.map_err(failed)?;
        let list = ManifestList::parse_with_version(&bytes, self.metadata.format_version()).map_err(failed)?;
        Ok(list.consume_entries().into_iter().collect())
    }

    /// The live data files of the current snapshot.
    pub(super) async fn live_files(&self, io: &FileIO) -> Result<Vec<Arc<ManifestEntry>>> {
        let failed = |error: iceberg::Error| iceberg_error(format_args!("read Iceberg table {}", self.name), error);
        let mut live = Vec::new();
        for manifest in self.manifests(io).await? {
            let manifest = manifest.load_manifest(io).await.map_err(failed)?;
            live.extend(manifest.entries().iter().filter(|entry| entry.is_alive()).cloned());
        }
        Ok(live)
    }

    /// A new table at the same location named `name`, holding this table's live files in its
    /// first snapshot, with its schema and properties (the job's checkpoints) and `properties`:
    /// a hidden copy published without the history of its partial states.
    pub(super) async fn republish(
        &self,
        io: &FileIO,
        name: &TableName,
        summary: HashMap<String, String>,
        properties: HashMap<String, String>,
    ) -> Result<IcebergTable> {
        let failed = |error: iceberg::Error| iceberg_error(format_args!("publish Iceberg table {name}"), error);
        let mut all = self.metadata.properties().clone();
        all.extend(properties);
        let metadata = TableMetadataBuilder::new(
            self.metadata.current_schema().as_ref().clone(),
            self.metadata.default_partition_spec().as_ref().clone(),
            SortOrder::unsorted_order(),
            self.location().to_owned(),
            FormatVersion::V2,
            all,
        )
        .and_then(|builder| builder.build())
        .map_err(failed)?
        .metadata;
        let metadata_file = MetadataLocation::new_with_metadata(self.location(), &metadata);
        metadata.write_to(io, &metadata_file).await.map_err(failed)?;
        let fresh = IcebergTable { name: name.clone(), metadata, metadata_file: metadata_file.to_string() };
        let added = self.live_files(io).await?.iter().map(|entry| entry.data_file().clone()).collect();
        fresh.stage(io, &FileChanges { added, summary, ..FileChanges::default() }, None).await
    }

    /// Writes the manifests, the manifest list and the metadata file of a commit of `changes`
    /// (with `schema` as the table's new current schema, when given); returns the table at it
    /// (not yet in the catalog).
    pub(super) async fn stage(
        &self,
        io: &FileIO,
        changes: &FileChanges,
        schema: Option<iceberg::spec::Schema>,
    ) -> Result<IcebergTable> {
        self.check_writable()?;
        let failed =
            |error: iceberg::Error| iceberg_error(format_args!("commit to Iceberg table {}", self.name), error);
        let mut builder =
            TableMetadataBuilder::new_from_metadata(self.metadata.clone(), Some(self.metadata_file.clone()));
        if let Some(schema) = schema {
            builder = builder.add_current_schema(schema).map_err(failed)?;
        }
        if !changes.properties.is_empty() {
            builder = builder.set_properties(changes.properties.clone()).map_err(failed)?;
        }
        // The schema the manifests describe: the new one, if the commit brings one.
        let staged = builder.build().map_err(failed)?.metadata;
        let mut builder = TableMetadataBuilder::new_from_metadata(staged.clone(), None);
        if !changes.added.is_empty() || !changes.removed.is_empty() || self.metadata.current_snapshot().is_none() {
            let snapshot = self.snapshot(io, &staged, changes).await?;
            builder = builder.set_branch_snapshot(snapshot, "main").map_err(failed)?;
            builder = builder.remove_snapshots(&expired(&staged));
        }
        let metadata = builder.build().map_err(failed)?.metadata;
        let location = self
            .metadata_file
            .parse::<MetadataLocation>()
            .map(|location| location.with_next_version())
            .unwrap_or_else(|_| MetadataLocation::new_with_metadata(self.location(), &metadata));
        metadata.write_to(io, &location).await.map_err(failed)?;
        Ok(IcebergTable { name: self.name.clone(), metadata, metadata_file: location.to_string() })
    }

    /// The snapshot of a commit, its manifests and manifest list written.
    async fn snapshot(&self, io: &FileIO, staged: &TableMetadata, changes: &FileChanges) -> Result<Snapshot> {
        let failed =
            |error: iceberg::Error| iceberg_error(format_args!("commit to Iceberg table {}", self.name), error);
        let snapshot_id = new_snapshot_id(staged);
        let sequence = staged.next_sequence_number();
        let parent = staged.current_snapshot().map(|snapshot| snapshot.snapshot_id());
        let schema = staged.current_schema().clone();
        let spec = staged.default_partition_spec().as_ref().clone();
        let directory = format!("{}/metadata", self.location().trim_end_matches('/'));
        let manifest_writer = |io: &FileIO| -> Result<_> {
            let path = format!("{directory}/{}", unique_name("manifest-", "avro"));
            let output = io.new_output(&path).map_err(failed)?;
            Ok(ManifestWriterBuilder::new(output, Some(snapshot_id), schema.clone(), spec.clone()).build_v2_data())
        };
        let mut manifests = Vec::new();
        let (mut removed_files, mut removed_rows, mut total_rows, mut total_files) = (0u64, 0u64, 0u64, 0u64);
        // The manifests listing a removed file are written again; all of them, into one, once a
        // table has gathered many (each commit adds one), so reading a table stays a few reads.
        let listed = self.manifests(io).await?;
        let merge_all = listed.len() >= MERGE_MANIFESTS;
        let mut rewritten = Vec::new();
        for manifest in listed {
            let loaded = if merge_all || !changes.removed.is_empty() {
                Some(manifest.load_manifest(io).await.map_err(failed)?)
            } else {
                None
            };
            let touched = merge_all
                || loaded.as_ref().is_some_and(|loaded| {
                    loaded.entries().iter().any(|entry| entry.is_alive() && changes.removed.contains(entry.file_path()))
                });
            match loaded {
                Some(loaded) if touched => rewritten.push(loaded.entries().to_vec()),
                _ => {
                    total_rows += manifest.added_rows_count.unwrap_or(0) + manifest.existing_rows_count.unwrap_or(0);
                    total_files +=
                        u64::from(manifest.added_files_count.unwrap_or(0) + manifest.existing_files_count.unwrap_or(0));
                    manifests.push(manifest);
                }
            }
        }
        let groups = if merge_all { vec![rewritten.concat()] } else { rewritten };
        for entries in groups {
            let mut writer = manifest_writer(io)?;
            for entry in entries.iter().filter(|entry| entry.is_alive()) {
                let sequence_number = entry.sequence_number().unwrap_or(0);
                let file_sequence = entry.file_sequence_number.or(Some(sequence_number));
                if changes.removed.contains(entry.file_path()) {
                    removed_files += 1;
                    removed_rows += entry.record_count();
                    writer
                        .add_delete_file(entry.data_file().clone(), sequence_number, file_sequence)
                        .map_err(failed)?;
                } else {
                    total_rows += entry.record_count();
                    total_files += 1;
                    writer
                        .add_existing_file(
                            entry.data_file().clone(),
                            entry.snapshot_id().unwrap_or(snapshot_id),
                            sequence_number,
                            file_sequence,
                        )
                        .map_err(failed)?;
                }
            }
            manifests.push(writer.write_manifest_file().await.map_err(failed)?);
        }
        let added_rows: u64 = changes.added.iter().map(|file| file.record_count()).sum();
        if !changes.added.is_empty() {
            let mut writer = manifest_writer(io)?;
            for file in &changes.added {
                writer.add_file(file.clone(), sequence).map_err(failed)?;
            }
            manifests.push(writer.write_manifest_file().await.map_err(failed)?);
        }
        let list_path = format!("{directory}/{}", unique_name(&format!("snap-{snapshot_id}-"), "avro"));
        let output = io.new_output(&list_path).map_err(failed)?.writer().await.map_err(failed)?;
        let mut list = ManifestListWriter::v2(output, snapshot_id, parent, sequence);
        list.add_manifests(manifests.into_iter()).map_err(failed)?;
        list.close().await.map_err(failed)?;
        let mut properties = changes.summary.clone();
        properties.insert("added-data-files".into(), changes.added.len().to_string());
        properties.insert("added-records".into(), added_rows.to_string());
        properties.insert("deleted-data-files".into(), removed_files.to_string());
        properties.insert("deleted-records".into(), removed_rows.to_string());
        properties.insert("total-records".into(), (total_rows + added_rows).to_string());
        properties.insert("total-data-files".into(), (total_files + changes.added.len() as u64).to_string());
        let operation = if changes.removed.is_empty() { Operation::Append } else { Operation::Overwrite };
        Ok(Snapshot::builder()
            .with_snapshot_id(snapshot_id)
            .with_parent_snapshot_id(parent)
            .with_sequence_number(sequence)
            .with_timestamp_ms(now_millis())
            .with_manifest_list(list_path)
            .with_summary(Summary { operation, additional_properties: properties })
            .with_schema_id(staged.current_schema_id())
            .build())
    }

    /// Deletes the files under the table's `data/` and `metadata/` that neither this metadata,
    /// the metadata files it logs, nor any of its snapshots reference, and that were last written
    /// longer than `grace` ago (a writer's files before its commit are younger). Returns how many.
    pub(super) async fn remove_unreferenced(&self, io: &FileIO, grace: std::time::Duration) -> Result<usize> {
        let failed = |error: iceberg::Error| iceberg_error(format_args!("clean Iceberg table {}", self.name), error);
        let plain = |path: &str| path.strip_prefix("file://").unwrap_or(path).to_owned();
        let mut referenced: HashSet<String> = HashSet::new();
        referenced.insert(plain(&self.metadata_file));
        referenced.extend(self.metadata.metadata_log().iter().map(|log| plain(&log.metadata_file)));
        let mut manifests = HashSet::new();
        for snapshot in self.metadata.snapshots() {
            referenced.insert(plain(snapshot.manifest_list()));
            let bytes = io.new_input(snapshot.manifest_list()).map_err(failed)?.read().await.map_err(failed)?;
            let list = ManifestList::parse_with_version(&bytes, self.metadata.format_version()).map_err(failed)?;
            for manifest in list.entries() {
                if !manifests.insert(manifest.manifest_path.clone()) {
                    continue;
                }
                referenced.insert(plain(&manifest.manifest_path));
                for entry in manifest.load_manifest(io).await.map_err(failed)?.entries() {
                    if entry.is_alive() {
                        referenced.insert(plain(entry.file_path()));
                    }
                }
            }
        }
        let cutoff = std::time::SystemTime::now() - grace;
        let mut removed = 0;
        for directory in ["data", "metadata"] {
            let directory = super::files::local(self.location()).join(directory);
            let Ok(entries) = std::fs::read_dir(&directory) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let old = entry.metadata().and_then(|metadata| metadata.modified()).is_ok_and(|at| at < cutoff);
                if old && path.is_file() && !referenced.contains(path.to_string_lossy().as_ref()) {
                    match std::fs::remove_file(&path) {
                        Ok(()) => removed += 1,
                        Err(error) => log::warn!("Iceberg table {}: remove {}: {error}", self.name, path.display()),
                    }
                }
            }
        }
        Ok(removed)
    }
}

/// A snapshot id the table does not have yet.
fn new_snapshot_id(metadata: &TableMetadata) -> i64 {
    let mut id = (sluice_core::clock::unix_nanos() as i64).wrapping_mul(6_364_136_223_846_793_005).abs();
    while id == 0 || metadata.snapshot_by_id(id).is_some() {
        id = id.wrapping_add(1).abs();
    }
    id
}

/// The snapshots to expire: all but the last `KEEP_SNAPSHOTS` and those younger than a day.
fn expired(metadata: &TableMetadata) -> Vec<i64> {
    let mut snapshots: Vec<(i64, i64)> =
        metadata.snapshots().map(|snapshot| (snapshot.timestamp_ms(), snapshot.snapshot_id())).collect();
    if snapshots.len() <= KEEP_SNAPSHOTS {
        return Vec::new();
    }
    snapshots.sort_unstable();
    let current = metadata.current_snapshot_id();
    let oldest_kept = now_millis() - KEEP_SNAPSHOTS_MILLIS;
    snapshots[..snapshots.len() - KEEP_SNAPSHOTS]
        .iter()
        .filter(|(at, id)| *at < oldest_kept && Some(*id) != current)
        .map(|(_, id)| *id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, RecordBatch};
    use sluice_core::{Column, DataType};

    /// A new table of one `long` column in `directory`, a writer of its files and a batch of ids.
    async fn table_of_ids(directory: &tempfile::TempDir) -> (FileIO, IcebergTable, DataWriter, RecordBatch) {
        let location = directory.path().join("t").to_string_lossy().into_owned();
        let io = FileIO::new_with_fs();
        let schema = TableSchema {
            name: TableName::parse("d.t"),
            columns: vec![Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false)],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        };
        let table = IcebergTable::create(&io, &schema, &location, &[]).await.unwrap();
        let arrow = table.arrow_schema().unwrap();
        let writer = table.data_writer(None, 1 << 20).unwrap();
        let ids = RecordBatch::try_new(arrow, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
        (io, table, writer, ids)
    }

    #[tokio::test]
    async fn many_commits_keep_few_manifests_and_every_file() {
        let directory = tempfile::tempdir().unwrap();
        let (io, mut table, mut writer, ids) = table_of_ids(&directory).await;
        for _ in 0..40 {
            writer.write(&ids).unwrap();
            let added = writer.finish().unwrap();
            table = table.stage(&io, &FileChanges { added, ..FileChanges::default() }, None).await.unwrap();
        }
        assert!(table.manifests(&io).await.unwrap().len() <= MERGE_MANIFESTS, "the manifests are merged");
        assert_eq!(table.live_files(&io).await.unwrap().len(), 40);
        assert_eq!(table.metadata.snapshots().count(), 40);
    }

    #[tokio::test]
    async fn files_no_snapshot_references_are_deleted_and_the_others_kept() {
        let directory = tempfile::tempdir().unwrap();
        let (io, table, mut writer, ids) = table_of_ids(&directory).await;
        writer.write(&ids).unwrap();
        let first = writer.finish().unwrap();
        let table =
            table.stage(&io, &FileChanges { added: first.clone(), ..FileChanges::default() }, None).await.unwrap();
        // A second commit replaces the first file; a third file is never committed.
        writer.write(&ids).unwrap();
        let second = writer.finish().unwrap();
        let removed = HashSet::from([first[0].file_path().to_owned()]);
        let table = table
            .stage(&io, &FileChanges { added: second.clone(), removed, ..FileChanges::default() }, None)
            .await
            .unwrap();
        writer.write(&ids).unwrap();
        let orphan = writer.finish().unwrap();
        assert_eq!(table.remove_unreferenced(&io, std::time::Duration::ZERO).await.unwrap(), 1);
        assert!(!std::path::Path::new(orphan[0].file_path()).exists());
        // The first file is still in the first snapshot, which readers may travel back to.
        assert!(std::path::Path::new(first[0].file_path()).exists());
        assert!(std::path::Path::new(second[0].file_path()).exists());
        let live = table.live_files(&io).await.unwrap();
        assert_eq!(
            live.iter().map(|entry| entry.file_path().to_owned()).collect::<Vec<_>>(),
            vec![second[0].file_path().to_owned()]
        );
        // Nothing the table references was deleted: it reads as before.
        assert!(IcebergTable::load(&io, &table.name, &table.metadata_file)
            .await
            .unwrap()
            .live_files(&io)
            .await
            .is_ok());
    }
}
