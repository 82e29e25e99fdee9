//! Keeping a streamed table cheap to read: every group adds a file per table it touches, so small
//! files pile up. Between groups the change writer compacts one table at a time (its small files
//! of one partition read and written as one, a layout change that readers see as no change to the
//! data), bounded to `target_file_mb` of input so the stream waits at most that long; compactions
//! are decided in the stream's journal like groups, so no other writer can interleave. Vacuum
//! (`vacuum_every_secs`) deletes the files no version newer than `vacuum_retention_hours` needs.
//! Log checkpoints are Delta's own (`delta.checkpointInterval`, written after the commit that
//! reaches it).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use deltalake_core::kernel::Action;
use deltalake_core::operations::vacuum::VacuumMode;
use deltalake_core::DeltaTableBuilder;
use sluice_core::connector::Checkpoint;
use sluice_core::Result;

use super::journal::{Entry, TableCommit};
use super::merge::data_writer;
use super::table::{delta_error, table_url, DataFile, LakeTable};
use super::{DeltaOptions, Lake};

/// When a compaction and a vacuum are due.
#[derive(Debug)]
pub(super) struct Maintenance {
    compact_every: Option<Duration>,
    vacuum_every: Option<Duration>,
    retention: Duration,
    /// A file under this size is small.
    small_bytes: u64,
    /// The most a compaction reads.
    round_bytes: u64,
    last_compaction: Instant,
    last_vacuum: Instant,
    /// The table the next compaction looks at first (round robin over the open tables).
    next: usize,
}

impl Maintenance {
    pub(super) fn new(options: &DeltaOptions) -> Maintenance {
        Maintenance {
            compact_every: options.compact_every,
            vacuum_every: options.vacuum_every,
            retention: options.vacuum_retention,
            small_bytes: options.file_bytes / 4,
            round_bytes: options.file_bytes,
            last_compaction: Instant::now(),
            last_vacuum: Instant::now(),
            next: 0,
        }
    }

    /// A compaction to decide as group `group` (keeping `checkpoint`), when one is due and some
    /// table has small files to join.
    pub(super) async fn due(
        &mut self,
        tables: &mut HashMap<String, LakeTable>,
        lake: &Lake,
        group: i64,
        checkpoint: &Checkpoint,
    ) -> Result<Option<Entry>> {
        let Some(every) = self.compact_every else { return Ok(None) };
        if self.last_compaction.elapsed() < every || tables.is_empty() {
            return Ok(None);
        }
        self.last_compaction = Instant::now();
        let mut locations: Vec<&String> = tables.keys().collect();
        locations.sort();
        let count = locations.len();
        for offset in 0..count {
            let location = locations[(self.next + offset) % count].clone();
            let table = &tables[&location];
            let picked = pick(table.files(), self.small_bytes, self.round_bytes);
            if picked.len() < 2 {
                continue;
            }
            self.next = (self.next + offset + 1) % count;
            let actions = compact(table, &picked, lake.options.file_bytes).await?;
            log::info!(
                "delta {}: compacting {} small files into {}",
                table.name,
                picked.len(),
                actions.len() - picked.len()
            );
            let commit = TableCommit {
                table: location,
                name: table.name.to_string(),
                create: false,
                operation: "compact".into(),
                actions,
            };
            let epoch = lake.fence.as_ref().map_or(0, |fence| fence.epoch);
            return Ok(Some(Entry {
                group,
                epoch,
                checkpoint: checkpoint.clone(),
                tables: vec![commit],
                discard: Vec::new(),
            }));
        }
        Ok(None)
    }

    /// Vacuums the open tables when due. A failure is logged, not raised: the data is safe, and
    /// the next vacuum tries again.
    pub(super) async fn vacuum(&mut self, tables: &mut HashMap<String, LakeTable>, lake: &Lake) {
        let Some(every) = self.vacuum_every else { return };
        if self.last_vacuum.elapsed() < every {
            return;
        }
        self.last_vacuum = Instant::now();
        let retention = chrono::Duration::from_std(self.retention).unwrap_or(chrono::Duration::days(7));
        for table in tables.values_mut() {
            let name = table.name.clone();
            let vacuumed = async {
                let url = table_url(&table.root)?;
                let delta = DeltaTableBuilder::from_url(url)
                    .map_err(|error| delta_error(format!("open {name}"), error))?
                    .load()
                    .await
                    .map_err(|error| delta_error(format!("open {name}"), error))?;
                let (_, metrics) = delta
                    .vacuum()
                    .with_retention_period(retention)
                    .with_enforce_retention_duration(false)
                    .with_mode(VacuumMode::Full)
                    .await
                    .map_err(|error| delta_error(format!("vacuum {name}"), error))?;
                table.reload().await?;
                Ok::<usize, sluice_core::Error>(metrics.files_deleted.len())
            }
            .await;
            match vacuumed {
                Ok(0) => {}
                Ok(deleted) => log::info!("delta {name}: vacuum deleted {deleted} files no version kept needs"),
                Err(error) => log::warn!("delta {name}: vacuum failed, tried again later: {error}"),
            }
        }
        let _ = lake;
    }
}

/// The small files of one partition to join: the smallest first, up to `round_bytes`.
fn pick(files: &[DataFile], small_bytes: u64, round_bytes: u64) -> Vec<DataFile> {
    let mut partitions: HashMap<Vec<(String, Option<String>)>, Vec<&DataFile>> = HashMap::new();
    for file in files.iter().filter(|file| (file.add.size as u64) < small_bytes) {
        let mut values: Vec<(String, Option<String>)> =
            file.add.partition_values.iter().map(|(column, value)| (column.clone(), value.clone())).collect();
        values.sort();
        partitions.entry(values).or_default().push(file);
    }
    let Some(mut small) = partitions.into_values().max_by_key(Vec::len) else { return Vec::new() };
    small.sort_by_key(|file| file.add.size);
    let mut picked = Vec::new();
    let mut bytes = 0;
    for file in small {
        if bytes + file.add.size as u64 > round_bytes && picked.len() >= 2 {
            break;
        }
        bytes += file.add.size as u64;
        picked.push(file.clone());
    }
    picked
}

/// The actions that replace `files` by their rows in new files, as a change of layout only.
async fn compact(table: &LakeTable, files: &[DataFile], file_bytes: u64) -> Result<Vec<Action>> {
    let schema = table.arrow_schema();
    let mut writer = data_writer(table, &schema, file_bytes)?;
    let partitions = table.partition_columns();
    let mut actions = Vec::new();
    for file in files {
        for batch in crate::lake::keys::read_whole(&file.file).await? {
            let constants = super::merge::partition_constants(file, &schema, &partitions)?;
            let conformed = crate::lake::rows::conform(&batch, &schema, &constants)?;
            deltalake_core::writer::DeltaWriter::write(&mut writer, conformed)
                .await
                .map_err(|error| delta_error(format!("compact {}", table.name), error))?;
        }
        actions.push(Action::Remove(file.remove(false)));
    }
    let adds = deltalake_core::writer::DeltaWriter::flush(&mut writer)
        .await
        .map_err(|error| delta_error(format!("compact {}", table.name), error))?;
    actions.extend(adds.into_iter().map(|mut add| {
        add.data_change = false;
        Action::Add(add)
    }));
    Ok(actions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltalake_core::kernel::Add;

    fn file(path: &str, size: i64, day: &str) -> DataFile {
        let add = Add {
            path: path.into(),
            size,
            partition_values: [("day".to_owned(), Some(day.to_owned()))].into(),
            data_change: true,
            ..Default::default()
        };
        DataFile { add, file: path.into(), rows: 1 }
    }

    #[test]
    fn small_files_of_one_partition_are_joined_smallest_first() {
        let files =
            [file("a", 10, "1"), file("b", 500, "1"), file("c", 20, "1"), file("d", 5, "2"), file("e", 900, "1")];
        let picked: Vec<String> = pick(&files, 600, 40).into_iter().map(|file| file.add.path).collect();
        assert_eq!(picked, ["a", "c"]);
        assert!(pick(&files[3..4], 600, 40).len() < 2);
    }
}
