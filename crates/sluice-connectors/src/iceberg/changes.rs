//! The change writer: a group of whole source transactions, folded per key by the stream, merged
//! copy-on-write into each table it touches, and committed to the catalog in one transaction
//! that moves every touched table, with the stream's checkpoint in each (and gives hidden copies
//! their names). When another writer (a copy task of a hidden table) moved a table first, the
//! group is merged again on the table as it is then.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow_array::BooleanArray;
use async_trait::async_trait;
use iceberg::spec::{ManifestEntry, NestedField, Schema, Type};
use sluice_core::change::Row;
use sluice_core::connector::{
    ChangeWriter, Checkpoint, CommitCadence, FoldedChangeWriter, Refused, SchemaChange, Updated,
};
use sluice_core::names::STREAM_TASK;
use sluice_core::{Error, ErrorKind, Result, Side, TableName, TableSchema};

use super::catalog::Pointer;
use super::files::{bound_json, local, DataWriter};
use super::table::{iceberg_error, FileChanges, IcebergTable};
use super::{types, StreamMark, Warehouse, COMMIT_TRIES};
use crate::lake::keys::{read_whole, FileBounds, StagedChanges, READ_BATCH_ROWS};
use crate::lake::rows;

/// A file smaller than this part of `target_file_mb` is small...
const SMALL_FILE_PART: u64 = 4;
/// ...and this many small files in a table are joined with the next group that touches it.
const COMPACT_FILES: usize = 8;

/// The small files to join: the smallest first, up to `round_bytes` (two at least).
fn pick(mut small: Vec<(&str, u64)>, round_bytes: u64) -> Vec<(&str, u64)> {
    small.sort_by_key(|(_, size)| *size);
    let mut bytes = 0;
    let mut picked = Vec::new();
    for (path, size) in small {
        if bytes + size > round_bytes && picked.len() >= 2 {
            break;
        }
        bytes += size;
        picked.push((path, size));
    }
    picked
}

/// How often the stream deletes the files its tables no longer reference...
const CLEAN_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// ...once they are this old (a writer's files before its commit are younger).
const CLEAN_GRACE: std::time::Duration = std::time::Duration::from_secs(3 * 3_600);

/// The table property holding the stream's last group in a table.
fn stream_property(job: &str) -> String {
    format!("sluice.stream.{job}")
}

pub(super) struct IcebergChanges {
    warehouse: Arc<Warehouse>,
    job: String,
    /// The group's changes per table, in the order tables were first touched.
    staged: Vec<StagedChanges>,
    /// Tables whose columns the group adds: their schema after it.
    reshaped: Vec<Arc<TableSchema>>,
    /// Tables a TRUNCATE empties with the group.
    truncating: Vec<TableName>,
    /// Hidden copies to publish with the group: (hidden name, own name).
    publishing: Vec<(TableName, TableName)>,
    /// The last committed group.
    group: i64,
    /// Tables the stream changed since it last deleted unreferenced files, and when that was.
    touched: HashSet<TableName>,
    cleaned: std::time::Instant,
}

impl IcebergChanges {
    pub(super) fn new(warehouse: Arc<Warehouse>, job: &str) -> IcebergChanges {
        IcebergChanges {
            warehouse,
            job: job.to_owned(),
            staged: Vec::new(),
            reshaped: Vec::new(),
            truncating: Vec::new(),
            publishing: Vec::new(),
            group: 0,
            touched: HashSet::new(),
            cleaned: std::time::Instant::now(),
        }
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

    async fn open(&self, name: &TableName) -> Result<IcebergTable> {
        self.warehouse.open(name).await?.ok_or_else(|| {
            Error::new(
                ErrorKind::Schema,
                format!("Iceberg table {name} is not in catalog {}", self.warehouse.catalog().name),
            )
            .on(Side::Target)
            .hint("run the job with --restart to create and copy its tables again")
        })
    }

    /// The group's changes to one table as files added and removed (and its new schema).
    async fn table_changes(&self, table: &IcebergTable) -> Result<(FileChanges, Option<Schema>)> {
        let mut changes = FileChanges::default();
        let io = &self.warehouse.io;
        let schema = match self.reshaped.iter().find(|reshaped| reshaped.name == table.name) {
            Some(reshaped) => Some(added_columns(table, reshaped)?),
            None => None,
        };
        let live = table.live_files(io).await?;
        if self.truncating.contains(&table.name) {
            changes.removed.extend(live.iter().map(|entry| entry.file_path().to_owned()));
        }
        let file_bytes = self.warehouse.options.file_bytes;
        let mut writer = table.data_writer(schema.as_ref(), file_bytes)?;
        let arrow = writer.schema().clone();
        let staged =
            self.staged.iter().find(|staged| staged.table.name == table.name).filter(|staged| !staged.is_empty());
        if let Some(staged) = staged {
            self.merge(table, &live, staged, &mut writer, &mut changes).await?;
        }
        // The small files the table gathers group after group, joined in the same commit.
        let small: Vec<(&str, u64)> = live
            .iter()
            .filter(|entry| !changes.removed.contains(entry.file_path()))
            .map(|entry| (entry.file_path(), entry.file_size_in_bytes()))
            .filter(|(_, size)| *size < file_bytes / SMALL_FILE_PART)
            .collect();
        if small.len() >= COMPACT_FILES {
            for (path, _) in pick(small, file_bytes) {
                for batch in read_whole(&local(path)).await? {
                    writer.write(&rows::conform(&batch, &arrow, &[])?)?;
                }
                changes.removed.insert(path.to_owned());
            }
        }
        changes.added = writer.finish()?;
        Ok((changes, schema))
    }

    /// Merges a table's staged changes: the files holding their keys written again without
    /// them, the added rows written, into `writer`.
    async fn merge(
        &self,
        table: &IcebergTable,
        live: &[Arc<ManifestEntry>],
        staged: &StagedChanges,
        writer: &mut DataWriter,
        changes: &mut FileChanges,
    ) -> Result<()> {
        let arrow = writer.schema().clone();
        let first_id = table.metadata.current_schema().field_by_name(staged.first_key()).map(|field| field.id);
        let kept: Vec<&Arc<ManifestEntry>> =
            live.iter().filter(|entry| !changes.removed.contains(entry.file_path())).collect();
        let candidates: Vec<FileBounds> = kept
            .iter()
            .map(|entry| {
                let file = entry.data_file();
                let first_key = first_id.and_then(|id| {
                    Some((bound_json(file.lower_bounds().get(&id)?)?, bound_json(file.upper_bounds().get(&id)?)?))
                });
                FileBounds { path: local(entry.file_path()), rows: entry.record_count(), first_key }
            })
            .collect();
        let located = staged.locate(&candidates).await?;
        for (index, drop_rows) in located.rewrites {
            let path = &candidates[index].path;
            let mut offset = 0;
            for batch in read_whole(path).await? {
                let count = batch.num_rows();
                let keep = BooleanArray::from(
                    drop_rows[offset..offset + count].iter().map(|dropped| !dropped).collect::<Vec<_>>(),
                );
                offset += count;
                let kept = arrow_select::filter::filter_record_batch(&batch, &keep)
                    .map_err(|error| iceberg_error(format_args!("rewrite {}", path.display()), error))?;
                writer.write(&rows::conform(&kept, &arrow, &[])?)?;
            }
            changes.removed.insert(kept[index].file_path().to_owned());
        }
        for (rows_schema, added) in &located.added {
            for chunk in added.chunks(READ_BATCH_ROWS) {
                writer.write(&rows::batch(types::FORMAT, rows_schema, &arrow, chunk.iter())?)?;
            }
        }
        Ok(())
    }

    /// Deletes the files that the tables changed since the last time no longer reference (the
    /// files of expired snapshots, of rewritten manifests, of writers that died before their
    /// commit); a failure is logged, never the stream's.
    async fn clean(&mut self) {
        for name in std::mem::take(&mut self.touched) {
            let cleaned = match self.warehouse.open(&name).await {
                Ok(Some(table)) => table.remove_unreferenced(&self.warehouse.io, CLEAN_GRACE).await,
                Ok(None) => Ok(0),
                Err(error) => Err(error),
            };
            match cleaned {
                Ok(0) => {}
                Ok(files) => log::debug!("Iceberg table {name}: {files} unreferenced files deleted"),
                Err(error) => log::warn!("Iceberg table {name}: unreferenced files not deleted: {error}"),
            }
        }
        self.cleaned = std::time::Instant::now();
    }

    /// One try at committing the group: every touched table merged and staged, then moved
    /// together in the catalog.
    async fn try_commit(&self, mark: &StreamMark) -> Result<()> {
        let mut names: Vec<TableName> = self.staged.iter().map(|staged| staged.table.name.clone()).collect();
        names.extend(self.reshaped.iter().map(|table| table.name.clone()));
        names.extend(self.truncating.iter().cloned());
        let mut seen = HashSet::new();
        names.retain(|name| seen.insert(name.clone()));
        let text = serde_json::to_string(mark).map_err(|error| iceberg_error("the stream's checkpoint", error))?;
        let mut pointers = Vec::new();
        let mut moved: HashMap<TableName, IcebergTable> = HashMap::new();
        let mut summary = HashMap::new();
        summary.insert("sluice.job".to_owned(), self.job.clone());
        summary.insert("sluice.task".to_owned(), STREAM_TASK.to_owned());
        summary.insert("sluice.group".to_owned(), mark.group.to_string());
        summary.insert("sluice.checkpoint".to_owned(), serde_json::to_string(&mark.checkpoint).unwrap_or_default());
        for name in names {
            let table = self.open(&name).await?;
            let (mut changes, schema) = self.table_changes(&table).await?;
            changes.summary = summary.clone();
            changes.properties.insert(stream_property(&self.job), text.clone());
            let staged = table.stage(&self.warehouse.io, &changes, schema).await?;
            pointers.push(Pointer::Move {
                table: name.clone(),
                from: table.metadata_file,
                to: staged.metadata_file.clone(),
            });
            moved.insert(name, staged);
        }
        let catalog = self.warehouse.catalog();
        for (hidden, own) in &self.publishing {
            if catalog.metadata_of(own).await?.is_some() {
                continue;
            }
            let copy = match moved.remove(hidden) {
                Some(copy) => copy,
                // Published already, or dropped.
                None => match self.warehouse.open(hidden).await? {
                    Some(copy) => copy,
                    None => continue,
                },
            };
            let marked = HashMap::from([(stream_property(&self.job), text.clone())]);
            let published = copy.republish(&self.warehouse.io, own, summary.clone(), marked).await?;
            pointers.push(Pointer::Create { table: own.clone(), metadata: published.metadata_file });
            pointers.push(Pointer::Drop { table: hidden.clone(), metadata: copy.metadata_file });
        }
        // A group that changes no table records its position too, so the stream moves on.
        self.warehouse.commit(&self.job, &pointers, Some(&text)).await
    }
}

/// The table's schema with the columns of `table` it lacks added (optional, at the end, with new
/// field ids) and its columns widened where `table` has a wider type Iceberg promotes to (`int` to
/// `long`, `float` to `double`, a decimal to more digits of the same scale), each keeping its id.
/// A column of the table that `table` lacks, or has with a type it cannot be promoted to, is a
/// schema change an Iceberg target does not take.
fn added_columns(current: &IcebergTable, table: &TableSchema) -> Result<Schema> {
    let schema = current.metadata.current_schema();
    let wanted = types::fields(table, 0)?;
    let mut problems = Vec::new();
    let mut fields: Vec<Arc<NestedField>> = Vec::with_capacity(wanted.len());
    for field in schema.as_struct().fields() {
        match wanted.iter().find(|wanted| wanted.name == field.name) {
            None => problems.push(format!("column {} is gone", field.name)),
            Some(new) if new.field_type == field.field_type => fields.push(field.clone()),
            Some(new) if promotes(&field.field_type, &new.field_type) => {
                let mut widened = field.as_ref().clone();
                widened.field_type = new.field_type.clone();
                fields.push(Arc::new(widened));
            }
            Some(new) => problems
                .push(format!("column {} changes type from {} to {}", field.name, field.field_type, new.field_type)),
        }
    }
    if !problems.is_empty() {
        return Err(types::FORMAT.unsupported(&table.name, &problems.join("; ")));
    }
    let mut next = current.metadata.last_column_id();
    for field in wanted {
        if schema.field_by_name(&field.name).is_none() {
            next += 1;
            fields.push(Arc::new(NestedField::optional(next, &field.name, field.field_type.as_ref().clone())));
        }
    }
    Schema::builder()
        .with_schema_id(schema.schema_id() + 1)
        .with_fields(fields)
        .with_identifier_field_ids(schema.identifier_field_ids())
        .build()
        .map_err(|error| {
            Error::new(ErrorKind::Schema, format!("Iceberg table {}: {error}", table.name)).on(Side::Target)
        })
}

/// Whether Iceberg's schema evolution promotes a column of type `from` to `to`.
fn promotes(from: &Type, to: &Type) -> bool {
    use iceberg::spec::PrimitiveType::{Decimal, Double, Float, Int, Long};
    match (from, to) {
        (Type::Primitive(from), Type::Primitive(to)) => match (from, to) {
            (Int, Long) | (Float, Double) => true,
            (Decimal { precision: from, scale: a }, Decimal { precision: to, scale: b }) => a == b && to >= from,
            _ => false,
        },
        _ => false,
    }
}

#[async_trait]
impl ChangeWriter for IcebergChanges {
    /// The checkpoint of the stream's last group, as the catalog records it with each group;
    /// else (a catalog whose record is gone) the largest group any of its tables records for the
    /// job (a group moves all its tables at once).
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        let parse = |text: &str, place: &dyn std::fmt::Display| -> Result<StreamMark> {
            serde_json::from_str(text)
                .map_err(|error| iceberg_error(format_args!("read the stream's checkpoint in {place}"), error))
        };
        let catalog = self.warehouse.catalog();
        let mut last = match catalog.stream_mark(&self.job).await? {
            Some(text) => Some(parse(&text, &format_args!("catalog {}", catalog.name))?),
            None => None,
        };
        if last.is_none() {
            let property = stream_property(&self.job);
            for (name, metadata) in catalog.tables().await? {
                let table = IcebergTable::load(&self.warehouse.io, &name, &metadata).await?;
                let Some(text) = table.property(&property) else { continue };
                let mark = parse(text, &format_args!("Iceberg table {name}"))?;
                if last.as_ref().is_none_or(|last| mark.group > last.group) {
                    last = Some(mark);
                }
            }
        }
        self.group = last.as_ref().map_or(0, |mark| mark.group);
        Ok(last.map(|mark| mark.checkpoint))
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let mark = StreamMark { group: self.group + 1, checkpoint: checkpoint.clone() };
        let mut tries = 0;
        loop {
            match self.try_commit(&mark).await {
                Ok(()) => break,
                Err(error) if error.kind() == ErrorKind::Conflict && tries + 1 < COMMIT_TRIES => tries += 1,
                Err(error) => return Err(error.context(format_args!("stream group {}", mark.group))),
            }
        }
        self.group = mark.group;
        self.touched.extend(self.staged.iter().map(|staged| staged.table.name.clone()));
        self.touched.extend(self.publishing.iter().map(|(_, own)| own.clone()));
        self.staged.clear();
        self.reshaped.clear();
        self.truncating.clear();
        self.publishing.clear();
        if self.cleaned.elapsed() >= CLEAN_EVERY {
            self.clean().await;
        }
        Ok(())
    }

    fn cadence(&self) -> Option<CommitCadence> {
        Some(CommitCadence { every: self.warehouse.options.commit_interval, rows: self.warehouse.options.commit_rows })
    }

    async fn apply_schema_change(&mut self, change: &SchemaChange) -> Result<()> {
        if let Some(refused) = types::FORMAT.refusal(change) {
            return Err(refused);
        }
        match change {
            SchemaChange::Create(table) => self.warehouse.ensure(table).await.map(|_| ()),
            SchemaChange::Alter { table, .. } => {
                // Checked now, so the statement is named in the error.
                added_columns(&self.open(&table.name).await?, table)?;
                self.reshaped.retain(|reshaped| reshaped.name != table.name);
                self.reshaped.push(Arc::new(table.clone()));
                Ok(())
            }
            SchemaChange::Truncate(name) => {
                self.open(name).await?;
                // Rows of the table staged before the TRUNCATE are gone with it.
                self.staged.retain(|staged| staged.table.name != *name);
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
impl FoldedChangeWriter for IcebergChanges {
    /// An Iceberg table's files hold whole rows: a row that keeps values its update left
    /// unchanged (and the source did not send) cannot be written.
    async fn update(&mut self, table: &TableSchema, rows: &[Row]) -> Result<Updated> {
        Err(rows::partial_update(types::FORMAT, table, rows.len()))
    }

    async fn delete(&mut self, table: &TableSchema, keys: &[Row], expect_all: bool) -> Result<()> {
        self.staged(table)?.delete(keys, expect_all)
    }

    /// Stages the rows; one with a value its Iceberg column cannot hold is left out and returned.
    async fn insert(&mut self, table: &TableSchema, inserted: &[Row]) -> Result<Vec<Refused>> {
        let (kept, refused) = rows::inserted_rows(types::FORMAT, table, inserted);
        self.staged(table)?.insert(&kept)?;
        Ok(refused)
    }

    async fn publish(&mut self, tables: &[(TableName, TableName)]) -> Result<()> {
        self.publishing.extend(tables.iter().cloned());
        Ok(())
    }
}
