//! Changes merged into a Delta table by key, copy-on-write (`crate::lake::keys` finds the rows
//! a group removes): the files that hold a changed or deleted key are written again without its
//! row, and the new images go into new files, all in one commit.

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, StringArray};
use arrow_schema::SchemaRef;
use deltalake_core::kernel::Action;
use deltalake_core::writer::{DeltaWriter, RecordBatchWriter};
use sluice_core::{Error, ErrorKind, Result, Side};

use super::table::{delta_error, table_url, DataFile, LakeTable};
use super::types;
use crate::lake::keys::{read_whole, FileBounds, StagedChanges, READ_BATCH_ROWS};

fn internal(message: String) -> Error {
    Error::new(ErrorKind::Write, message).on(Side::Target)
}

/// A file's partition values as one-row arrays of their columns' types.
pub(super) fn partition_constants(
    file: &DataFile,
    schema: &SchemaRef,
    partition_columns: &[String],
) -> Result<Vec<(String, ArrayRef)>> {
    let mut constants = Vec::new();
    for column in partition_columns {
        let Ok(field) = schema.field_with_name(column) else { continue };
        let text = file.add.partition_values.get(column).cloned().flatten();
        let array: ArrayRef = Arc::new(StringArray::from(vec![text]));
        let typed = arrow_cast::cast(&array, field.data_type())
            .map_err(|error| internal(format!("partition value of {column} in {}: {error}", file.add.path)))?;
        constants.push((column.clone(), typed));
    }
    Ok(constants)
}

/// A data writer for `table`'s current (or new) schema: files of at most `file_bytes`, row
/// groups of 128 Ki rows.
pub(super) fn data_writer(table: &LakeTable, schema: &SchemaRef, file_bytes: u64) -> Result<RecordBatchWriter> {
    let partitions = table.partition_columns();
    let url = table_url(&table.root)?;
    let properties = deltalake_core::parquet::file::properties::WriterProperties::builder()
        .set_compression(deltalake_core::parquet::basic::Compression::SNAPPY)
        .set_max_row_group_row_count(Some(128 * 1024))
        .set_dictionary_enabled(false)
        .set_statistics_enabled(deltalake_core::parquet::file::properties::EnabledStatistics::Chunk)
        .build();
    Ok(RecordBatchWriter::try_new(url.as_str(), schema.clone(), (!partitions.is_empty()).then_some(partitions), None)
        .map_err(|error| delta_error(format!("write to Delta table {}", table.name), error))?
        .with_writer_properties(properties)
        .with_target_file_size(file_bytes))
}

/// What a merge wrote and removed, for the commit and its metrics.
#[derive(Debug, Default)]
pub(super) struct Merged {
    pub actions: Vec<Action>,
    pub files_rewritten: usize,
    pub rows_rewritten: u64,
}

/// Merges `staged` into `table` (whose schema is `schema`, new columns included): finds the
/// files holding its keys, writes them again without those rows, and the added rows as new
/// files.
pub(super) async fn merge(
    table: &LakeTable,
    schema: &SchemaRef,
    staged: StagedChanges,
    file_bytes: u64,
) -> Result<Merged> {
    let name = staged.table.name.clone();
    let bounds: Vec<FileBounds> = table
        .files()
        .iter()
        .map(|file| FileBounds { path: file.file.clone(), rows: file.rows, first_key: file.bounds(staged.first_key()) })
        .collect();
    let located = staged.locate(&bounds).await?;
    let mut merged = Merged::default();
    let mut writer = data_writer(table, schema, file_bytes)?;
    let partitions = table.partition_columns();
    for (index, drop_rows) in located.rewrites {
        let file = &table.files()[index];
        let batches = read_whole(&file.file).await?;
        let constants = partition_constants(file, schema, &partitions)?;
        let mut offset = 0;
        for batch in batches {
            let rows = batch.num_rows();
            let keep =
                BooleanArray::from(drop_rows[offset..offset + rows].iter().map(|dropped| !dropped).collect::<Vec<_>>());
            offset += rows;
            let kept = arrow_select::filter::filter_record_batch(&batch, &keep)
                .map_err(|error| internal(error.to_string()))?;
            merged.rows_rewritten += kept.num_rows() as u64;
            if kept.num_rows() > 0 {
                let conformed = crate::lake::rows::conform(&kept, schema, &constants)?;
                writer
                    .write(conformed)
                    .await
                    .map_err(|error| delta_error(format!("write to Delta table {name}"), error))?;
            }
        }
        merged.files_rewritten += 1;
        merged.actions.push(Action::Remove(file.remove(true)));
    }
    for (rows_schema, rows) in &located.added {
        for chunk in rows.chunks(READ_BATCH_ROWS) {
            let batch = types::batch(rows_schema, schema, chunk.iter())?;
            writer.write(batch).await.map_err(|error| delta_error(format!("write to Delta table {name}"), error))?;
        }
    }
    let adds = writer.flush().await.map_err(|error| delta_error(format!("write to Delta table {name}"), error))?;
    merged.actions.extend(adds.into_iter().map(Action::Add));
    Ok(merged)
}
