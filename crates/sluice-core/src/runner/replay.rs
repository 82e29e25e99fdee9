//! Replaying dirty records after a fix: the split that holds them is read again and its rows
//! with those keys are written with the job as it is now (its transform rules, its zero-date
//! policy, the target as it was altered), by key. Only those rows: the split's other rows may
//! have been changed by the stream since, and are left as they are. A runner that replays must
//! have a sink that upserts by primary key.

use std::collections::BTreeSet;

use crate::change::Rejected;
use crate::connector::{Checkpoint, Split};
use crate::error::{Error, ErrorKind, Result};
use crate::stats::TableStats;

use super::Runner;

/// What a replay of one split wrote, found and had refused again.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Rows written again.
    pub written: u64,
    /// The keys asked for that the source still has (as `key_text` renders them).
    pub found: BTreeSet<String>,
    /// Rows refused again (by the source, a transform, the zero-date policy or the target).
    pub rejected: Vec<Rejected>,
}

impl Runner {
    /// Reads `split` again from its start and writes its rows whose key is one of `keys`, by
    /// key, under the checkpoint task `replay/<split>` (a later replay takes the same one).
    /// Rejects are returned, not kept: the caller decides what stays dirty.
    pub async fn replay(&self, split: &Split, keys: &BTreeSet<String>) -> Result<Replayed> {
        if split.table.primary_key.is_empty() || split.whole {
            return Err(Error::new(
                ErrorKind::Config,
                format!("table {} has no primary key: its rows cannot be written again by key", split.table.name),
            )
            .hint("fix the rows in the target by hand, then discard their records"));
        }
        let mapping = self.mapping(&split.table)?;
        let stats = self.stats.table(&split.table.name, &mapping.target.name);
        let task = format!("replay/{}", split.id);
        let mut writer = self.sink.open(&self.job.name, &task, self.written_as(&mapping.target)).await?;
        // A writer is recovered before it writes; a replay starts over whatever it held.
        writer.recover().await?;
        let mut reader = self.source.open(split, None, self.job.limits.batch_rows).await?;
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
                self.throttle.admit(rows, batch.bytes).await;
                let (batch, mut rejects) = self.as_written(&mapping, batch, &stats);
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
