//! Replaying dirty records after a fix: the rows they name are read again from the source and
//! written with the job as it is now (its transform rules, its zero-date policy, the target as
//! it was altered), by key. A copied row is read again from the split that holds it; a change
//! the stream left out, by its source key (`SnapshotSource::key_split`): the row as the source has it
//! now. Only those rows: a split's other rows may have been changed by the stream since, and are
//! left as they are. A runner that replays must have a sink that upserts by primary key.
//!
//! This stage runs outside a run (`sluice replay`, a cluster's replay) and owns only its report
//! of verdicts; it must not keep dirty records itself (the caller decides what stays dirty) nor
//! move the job's checkpoints: it writes under checkpoint tasks of its own (`replay/<split>`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::change::{key_values_text, Rejected, SourceKey};
use crate::connector::{Checkpoint, Split};
use crate::error::{Error, ErrorKind, Result};
use crate::schema::TableSchema;
use crate::state::Plan;
use crate::stats::TableStats;

use super::context::RunContext;
use super::copy::as_written;

/// A dirty record to replay: its id in the store that keeps it, the task that kept it (a
/// split's id, or the stream's), and the record.
#[derive(Debug, Clone)]
pub struct DirtyEntry {
    pub id: String,
    pub task: String,
    pub record: Rejected,
}

/// What a replay made of one dirty record.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Its row was written again: the record goes.
    Written,
    /// The target refused its row again: the record stays, with this new reason.
    Refused(String),
    /// Not replayed, and why (the source no longer has the row, it cannot be read by key …):
    /// the record stays as it is.
    Kept(String),
}

/// What a replay of dirty records did.
#[derive(Debug, Default)]
pub struct ReplayReport {
    /// Each record's verdict, by id.
    pub verdicts: Vec<(String, Verdict)>,
    /// Rows refused this time under another key than their record's (another side refused
    /// them), with the task to keep them under.
    pub others: Vec<(String, Rejected)>,
    /// Rows written again.
    pub rows_written: u64,
}

impl ReplayReport {
    fn keep_all(&mut self, entries: &[&DirtyEntry], why: &str) {
        self.verdicts.extend(entries.iter().map(|entry| (entry.id.clone(), Verdict::Kept(why.to_owned()))));
    }

    /// The verdicts of `entries`, whose rows were looked for by the keys in `wanted` (the
    /// source's key texts, in `entries`' order), from what `replayed` found, wrote and refused.
    fn judge(&mut self, task: &str, entries: &[&DirtyEntry], wanted: &[String], replayed: Replayed) {
        self.rows_written += replayed.written;
        for (entry, key) in entries.iter().zip(wanted) {
            let again = replayed.rejected.iter().find(|reject| reject.key == entry.record.key || reject.key == *key);
            let verdict = match again {
                Some(reject) => Verdict::Refused(reject.reason.clone()),
                None if replayed.found.contains(key) => Verdict::Written,
                None => Verdict::Kept("the source no longer has this row (deleted since?); discard the record".into()),
            };
            self.verdicts.push((entry.id.clone(), verdict));
        }
        let known = |reject: &Rejected| {
            entries.iter().zip(wanted).any(|(entry, key)| reject.key == entry.record.key || reject.key == *key)
        };
        self.others.extend(
            replayed.rejected.into_iter().filter(|reject| !known(reject)).map(|reject| (task.to_owned(), reject)),
        );
    }
}

/// What a replay of one split wrote, found and had refused again.
#[derive(Debug, Default)]
pub(crate) struct Replayed {
    /// Rows written again.
    pub written: u64,
    /// The keys asked for that the source still has (as `key_text` renders them).
    pub found: BTreeSet<String>,
    /// Rows refused again (by the source, a transform, the zero-date policy or the target).
    pub rejected: Vec<Rejected>,
}

/// The replay of dirty records, on the run context of a runner that does not run: it writes
/// under the target tables' own names (a hidden copy is the run's, and published by the time its
/// records are replayed).
pub(super) struct Replay<'a> {
    pub(super) context: &'a RunContext,
}

impl Replay<'_> {
    /// Replays dirty records: copied rows by the split of `plan` that holds them, changes the
    /// stream left out by their source key. A source, target or state failure is an error; a
    /// record that cannot be replayed gets its verdict (`Verdict::Kept`).
    pub(super) async fn replay_records(&self, plan: Option<&Plan>, entries: &[DirtyEntry]) -> Result<ReplayReport> {
        let mut report = ReplayReport::default();
        let splits: BTreeMap<&str, &Split> = plan
            .iter()
            .flat_map(|plan| &plan.tables)
            .flat_map(|table| &table.splits)
            .map(|split| (split.id.as_str(), split))
            .collect();
        let mut by_split: BTreeMap<&str, Vec<&DirtyEntry>> = BTreeMap::new();
        let mut by_source: BTreeMap<&str, Vec<(&DirtyEntry, &SourceKey)>> = BTreeMap::new();
        for entry in entries {
            match (&entry.record.change, splits.get(entry.task.as_str())) {
                (Some(change), _) => match &change.source {
                    Some(source) => by_source.entry(source.table.as_str()).or_default().push((entry, source)),
                    None => report.keep_all(
                        &[entry],
                        "its source row is unknown (a transform computes or masks the key, or merges several tables): \
                         fix the row in the target by hand, then discard the record",
                    ),
                },
                (None, Some(split)) => by_split.entry(split.id.as_str()).or_default().push(entry),
                (None, None) => report.keep_all(
                    &[entry],
                    &format!(
                        "its task {} is not a copy in the job's current plan (a plan since replaced): fix the row in \
                         the target by hand, then discard it",
                        entry.task
                    ),
                ),
            }
        }
        for (split, held) in by_split {
            let keys: Vec<String> = held.iter().map(|entry| entry.record.key.clone()).collect();
            self.replay_split(&mut report, splits[split], &held, keys).await?;
        }
        if !by_source.is_empty() {
            let tables = self.context.source.discover().await?;
            for (table, held) in by_source {
                let Some(schema) = tables.iter().find(|known| known.name.to_string() == table) else {
                    let held: Vec<&DirtyEntry> = held.iter().map(|(entry, _)| *entry).collect();
                    report.keep_all(&held, &format!("the source no longer has table {table}; discard the record"));
                    continue;
                };
                self.replay_keys(&mut report, &Arc::new(schema.clone()), &held).await?;
            }
        }
        log::info!(
            "job {}: replayed {} dirty records ({} rows written again); {} still dirty",
            self.context.job.name,
            report.verdicts.iter().filter(|(_, verdict)| *verdict == Verdict::Written).count(),
            report.rows_written,
            report.verdicts.iter().filter(|(_, verdict)| *verdict != Verdict::Written).count()
        );
        Ok(report)
    }

    /// Replays the changes the stream left out of source table `table`: its rows with their
    /// keys, read as the source has them now.
    async fn replay_keys(
        &self,
        report: &mut ReplayReport,
        table: &Arc<TableSchema>,
        held: &[(&DirtyEntry, &SourceKey)],
    ) -> Result<()> {
        let entries: Vec<&DirtyEntry> = held.iter().map(|(entry, _)| *entry).collect();
        let mut keys = Vec::with_capacity(held.len());
        for (_, source) in held {
            let key: std::result::Result<Vec<_>, String> = table
                .primary_key
                .iter()
                .zip(&source.key)
                .map(|(&index, value)| crate::json::decode_value(value, &table.columns[index].data_type))
                .collect();
            match key {
                Ok(key) if key.len() == table.primary_key.len() && source.key.len() == key.len() => keys.push(key),
                _ => {
                    report.keep_all(
                        &entries,
                        &format!("the key of table {} changed since the records were kept; discard them", table.name),
                    );
                    return Ok(());
                }
            }
        }
        let split = match self.context.source.needs_snapshot()?.key_split(table, &keys) {
            Ok(split) => split,
            Err(error) if error.kind() == ErrorKind::Config => {
                report.keep_all(&entries, &error.to_string());
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        let wanted: Vec<String> = keys.iter().map(|key| key_values_text(table, key)).collect();
        self.replay_split(report, &split, &entries, wanted).await
    }

    /// Replays the records `held` of one split, whose rows have the source key texts `keys`.
    async fn replay_split(
        &self,
        report: &mut ReplayReport,
        split: &Split,
        held: &[&DirtyEntry],
        keys: Vec<String>,
    ) -> Result<()> {
        match self.replay(split, &keys.iter().cloned().collect()).await {
            Ok(replayed) => report.judge(&split.id, held, &keys, replayed),
            Err(error) if error.kind() == ErrorKind::Config => report.keep_all(held, &error.to_string()),
            Err(error) => return Err(error),
        }
        Ok(())
    }

    /// Reads `split` again from its start and writes its rows whose key is one of `keys`, by
    /// key, under the checkpoint task `replay/<split>` (a later replay takes the same one).
    /// Rejects are returned, not kept: the caller decides what stays dirty.
    pub(super) async fn replay(&self, split: &Split, keys: &BTreeSet<String>) -> Result<Replayed> {
        if split.table.primary_key.is_empty() || split.whole {
            return Err(Error::new(
                ErrorKind::Config,
                format!("table {} has no primary key: its rows cannot be written again by key", split.table.name),
            )
            .hint("fix the rows in the target by hand, then discard their records"));
        }
        let context = self.context;
        let mapping = context.mapping(&split.table)?;
        let stats = context.stats.table(&split.table.name, &mapping.target.name);
        let task = format!("replay/{}", split.id);
        let mut writer = context.sink.open(&context.job.name, &task, mapping.target.clone()).await?;
        // A writer is recovered before it writes; a replay starts over whatever it held.
        writer.recover().await?;
        let mut reader = context.source.needs_snapshot()?.open(split, None, context.job.limits.batch_rows).await?;
        let mut replayed = Replayed::default();
        while let Some(mut batch) = reader.next().await? {
            let position = batch.position.clone();
            batch.changes.retain(|change| {
                let key = change.key_text();
                let wanted = keys.contains(&key);
                if wanted {
                    replayed.found.insert(key);
                }
                wanted
            });
            batch.rejected.retain(|reject| keys.contains(&reject.key));
            replayed.found.extend(batch.rejected.iter().map(|reject| reject.key.clone()));
            if !batch.changes.is_empty() || !batch.rejected.is_empty() {
                let rows = batch.changes.len() as u64;
                TableStats::add(&stats.rows_read, rows);
                context.throttle.admit(rows, batch.bytes).await;
                let (batch, mut rejects) = as_written(context, &mapping, batch, &stats);
                let target_rejects = writer.write(&batch).await?;
                replayed.written += batch.changes.len() as u64 - target_rejects.len() as u64;
                rejects.extend(target_rejects);
                replayed.rejected.extend(rejects);
                let checkpoint = Checkpoint {
                    task: task.clone(),
                    position: Some(position.clone()),
                    done: false,
                    rows_written: replayed.written,
                };
                writer.commit(&checkpoint).await?;
            }
            reader.ack(&position).await?;
            if replayed.found.len() == keys.len() {
                break;
            }
        }
        TableStats::add(&stats.rows_written, replayed.written);
        Ok(replayed)
    }
}
