//! Replaying dirty records after a fix: the splits that hold them are read again and written
//! with the job as it is now (its transform rules, its zero-date policy, the target as it was
//! altered), by key. Every row of those splits is written again as the source holds it now, so
//! a runner that replays must have a sink that upserts by primary key.

use crate::change::Rejected;
use crate::connector::{Checkpoint, Split};
use crate::error::{Error, ErrorKind, Result};
use crate::stats::TableStats;

use super::Runner;

/// What a replay wrote and what was refused again.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Rows of the splits written again.
    pub written: u64,
    /// Rows refused again (by the source, a transform, the zero-date policy or the target).
    pub rejected: Vec<Rejected>,
}

impl Runner {
    /// Reads `splits` again from their start and writes them by key, each under the checkpoint
    /// task `replay/<split>` (a replay run again takes the same one). Rejects are returned, not
    /// kept: the caller decides what stays dirty.
    pub async fn replay(&self, splits: &[Split]) -> Result<Replayed> {
        let mut replayed = Replayed::default();
        for split in splits {
            if split.table.primary_key.is_empty() || split.whole {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!("table {} has no primary key: its rows cannot be written again by key", split.table.name),
                )
                .hint("discard its dirty records, or restart the job from scratch (--restart) once fixed"));
            }
            let mapping = self.mapping(&split.table)?;
            let stats = self.stats.table(&split.table.name, &mapping.target.name);
            let task = format!("replay/{}", split.id);
            let mut writer = self.sink.open(&self.job.name, &task, self.written_as(&mapping.target)).await?;
            // A writer is recovered before it writes; a replay starts over whatever it held.
            writer.recover().await?;
            let mut reader = self.source.open(split, None, self.job.limits.batch_rows).await?;
            let mut rows_written = 0;
            while let Some(batch) = reader.next().await? {
                TableStats::add(&stats.rows_read, batch.changes.len() as u64);
                let position = batch.position.clone();
                let (batch, mut rejects) = self.as_written(&mapping, batch, &stats);
                let target_rejects = writer.write(&batch).await?;
                rows_written += batch.changes.len() as u64 - target_rejects.len() as u64;
                rejects.extend(target_rejects);
                replayed.rejected.extend(rejects);
                let checkpoint =
                    Checkpoint { task: task.clone(), position: Some(position.clone()), done: false, rows_written };
                writer.commit(&checkpoint).await?;
                reader.ack(&position).await?;
            }
            TableStats::add(&stats.rows_written, rows_written);
            replayed.written += rows_written;
        }
        Ok(replayed)
    }
}
