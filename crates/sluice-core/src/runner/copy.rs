//! The copy stage: the snapshot of a plan's splits, run by up to `parallelism` tasks at once.
//! Each task is a pipeline — read → durable write with checkpoint → ack — with a bounded
//! channel between the reader and the writer, so memory is set by `limits`, not by table size.
//! Rows that cannot be read or written become dirty records before the commit that moves past
//! them. Once every split is copied, the target builds what it builds last (indexes).
//!
//! It owns the task queue and what its tasks report (splits found done, the position each
//! split was copied to); it does not plan, prepare the target or stream changes.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, watch};

use super::context::RunContext;
use super::{interrupted, lock};
use crate::change::{Batch, Position, Rejected, RowEncoding};
use crate::connector::{Checkpoint, Split};
use crate::error::{Error, ErrorKind, Result};
use crate::hidden::HiddenCopies;
use crate::schema::{TableName, TableSchema};
use crate::state::Plan;
use crate::stats::TableStats;
use crate::transform::TableMapping;
use crate::zero_dates;

/// Splits waiting for a worker, each with the counters of its table.
type TaskQueue = VecDeque<(Split, Arc<TableStats>)>;

/// The snapshot of one run, and what its tasks found and copied.
pub(super) struct SnapshotCopy {
    context: Arc<RunContext>,
    /// The plan's tables whose copy is still hidden (`crate::hidden`): their rows are written
    /// under the hidden names.
    hidden: HiddenCopies,
    /// Splits found complete in the target at start. Atomic: the copy's tasks run at once and
    /// each counts its own.
    splits_resumed_done: AtomicU64,
    /// The last position of each split this run copied to its end, for targets that keep no
    /// checkpoint (stdout): where the stream finds the copy's reads. Behind a mutex: the copy's
    /// concurrent tasks each add theirs.
    copied: Mutex<HashMap<String, Option<Position>>>,
    /// Splits other runs copied to their end (`Runner::with_copied_splits`).
    copied_elsewhere: BTreeSet<String>,
    /// Tables whose rows some task handed on undecoded (`open_reader`), each said once in the log.
    encoded: Mutex<BTreeSet<TableName>>,
}

impl SnapshotCopy {
    pub(super) fn new(
        context: Arc<RunContext>,
        hidden: HiddenCopies,
        copied_elsewhere: BTreeSet<String>,
    ) -> Arc<SnapshotCopy> {
        Arc::new(SnapshotCopy {
            context,
            hidden,
            splits_resumed_done: AtomicU64::new(0),
            copied: Mutex::new(HashMap::new()),
            copied_elsewhere,
            encoded: Mutex::new(BTreeSet::new()),
        })
    }

    /// Splits found complete in the target at start.
    pub(super) fn splits_resumed_done(&self) -> u64 {
        self.splits_resumed_done.load(Ordering::Relaxed)
    }

    /// The last position of each split this run copied to its end.
    pub(super) fn copied_positions(&self) -> HashMap<String, Option<Position>> {
        lock(&self.copied).clone()
    }

    /// Copies every split of the plan with up to `parallelism` tasks, then builds what the
    /// target builds last (secondary indexes).
    pub(super) async fn copy_snapshot(
        self: &Arc<Self>,
        plan: &Plan,
        targets: &[TableSchema],
        build_indexes: bool,
    ) -> Result<()> {
        let queue: Arc<Mutex<TaskQueue>> = Arc::new(Mutex::new(self.task_queue(plan)));
        let workers = self.context.job.parallelism.min(lock(&queue).len()).max(1);
        let mut handles = Vec::with_capacity(workers);
        for _ in 0..workers {
            let copy = self.clone();
            let queue = queue.clone();
            handles.push(tokio::spawn(async move {
                loop {
                    if copy.context.should_stop() {
                        return Ok(());
                    }
                    let next = lock(&queue).pop_front();
                    let Some((split, stats)) = next else {
                        return Ok(());
                    };
                    if let Err(error) = copy.run_task(&split, &stats).await {
                        if error.kind() != ErrorKind::Interrupted {
                            copy.context.abort.send_replace(true);
                        }
                        return Err(error);
                    }
                }
            }));
        }
        let mut first_error = first_error(handles).await;
        if first_error.is_none() && *self.context.stop.borrow() {
            let pending = lock(&queue).len();
            if pending > 0 {
                first_error = Some(interrupted());
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        if !build_indexes {
            log::info!("every split of this group is copied");
            return Ok(());
        }
        log::info!("every split is copied; building secondary indexes where the target has them");
        let targets = self.hidden.schemas(targets);
        self.context.sink.finish(&targets).await
    }

    /// The plan's splits in the order the tasks take them, each with its table's counters.
    fn task_queue(&self, plan: &Plan) -> TaskQueue {
        // Splits are taken a table at a time in turn (the first split of each table, then the
        // second ...), so concurrent tasks write into different tables when there are several:
        // writers of one table contend for its locks (MariaDB's AUTO-INC lock serialises every
        // LOAD DATA into a table with a counter) and its hottest pages.
        let mut queue = TaskQueue::new();
        let longest = plan.tables.iter().map(|table| table.splits.len()).max().unwrap_or(0);
        for index in 0..longest {
            for table in &plan.tables {
                if let Some(split) = table.splits.get(index) {
                    let stats = self.context.stats.table(&split.table.name, &table.target);
                    TableStats::add(&stats.splits_total, 1);
                    // The whole plan's estimate from the start, so the progress's total does not
                    // grow as tasks take their splits; what earlier runs committed comes off it
                    // when a split's task finds its checkpoint.
                    TableStats::add(&stats.rows_expected, split.estimated_rows);
                    queue.push_back((split.clone(), stats));
                }
            }
        }
        queue
    }

    async fn run_task(&self, split: &Split, stats: &Arc<TableStats>) -> Result<()> {
        self.context.with_retry(&format!("task {}", split.id), || self.copy_split(split, stats)).await.map_err(
            |error| {
                if error.kind() == ErrorKind::Interrupted {
                    error
                } else {
                    error.context(format_args!("task {}", split.id))
                }
            },
        )
    }

    /// Copies one split from its checkpoint to its end.
    async fn copy_split(&self, split: &Split, stats: &Arc<TableStats>) -> Result<()> {
        if self.copied_elsewhere.contains(&split.id) {
            TableStats::take(&stats.rows_expected, split.estimated_rows);
            TableStats::add(&stats.splits_done, 1);
            return Ok(());
        }
        let context = &*self.context;
        let job = &context.job;
        let mapping = context.mapping(&split.table)?;
        let mut writer = context.sink.open(&job.name, &split.id, self.hidden.schema(&mapping.target)).await?;
        let recovered = writer.recover().await?;
        let mut rows_written = recovered.as_ref().map_or(0, |checkpoint| checkpoint.rows_written);
        let mut position = recovered.as_ref().and_then(|checkpoint| checkpoint.position.clone());
        if recovered.as_ref().is_some_and(|checkpoint| checkpoint.done) {
            TableStats::take(&stats.rows_expected, split.estimated_rows);
            TableStats::add(&stats.splits_done, 1);
            self.splits_resumed_done.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        if split.whole && recovered.is_some() {
            // A split read whole cannot resume: what an earlier attempt committed goes with the
            // first commit of this one.
            log::info!(
                "task {}: an earlier attempt copied part of this keyless table; copying it again whole",
                split.id
            );
            writer.replace_all().await?;
            rows_written = 0;
            position = None;
        }
        TableStats::take(&stats.rows_expected, rows_written.min(split.estimated_rows));
        let encoding = writer.takes_encoded().filter(|_| mapping.is_identity());
        let (reader, encoded) = open_reader(context, split, encoding, position.as_ref()).await?;
        if let Some(encoding) = encoded.filter(|_| lock(&self.encoded).insert(split.table.name.clone())) {
            log::info!(
                "table {}: rows go to the target as the source wrote them ({encoding}), not decoded: the job maps the table unchanged",
                split.table.name
            );
        }

        let (batches, mut received) = mpsc::channel::<Result<Option<Batch>>>(job.limits.queue_batches);
        let (acks, ack_queue) = mpsc::unbounded_channel::<Position>();
        // Rows written since the last commit (a writer may ask for fewer, larger commits).
        let mut staged = 0;
        let producer =
            tokio::spawn(produce(reader, batches, ack_queue, context.stop.clone(), context.abort.subscribe()));

        let outcome = async {
            loop {
                let Some(item) = received.recv().await else {
                    // The producer stopped without reaching the end: a stop or an abort.
                    return Err(interrupted());
                };
                let Some(batch) = item? else { break };
                let (written, at) = self.write_batch(split, stats, &mapping, &mut *writer, batch).await?;
                rows_written += written;
                staged += written;
                position = Some(at.clone());
                if writer.wants_commit() {
                    let checkpoint =
                        Checkpoint { task: split.id.clone(), position: Some(at.clone()), done: false, rows_written };
                    self.commit(&mut *writer, stats, &checkpoint, std::mem::take(&mut staged)).await?;
                    // A closed ack channel means the producer is gone; the next receive says why.
                    let _ = acks.send(at);
                }
                if context.should_stop() {
                    return Err(interrupted());
                }
            }
            let done = Checkpoint { task: split.id.clone(), position: position.clone(), done: true, rows_written };
            self.commit(&mut *writer, stats, &done, staged).await?;
            lock(&self.copied).insert(split.id.clone(), position.clone());
            TableStats::add(&stats.splits_done, 1);
            Ok(())
        }
        .await;
        drop(received);
        producer.abort();
        outcome
    }

    /// Writes one batch and keeps its rejects; returns how many rows it wrote and the position
    /// to resume after once they are committed.
    async fn write_batch(
        &self,
        split: &Split,
        stats: &TableStats,
        mapping: &TableMapping,
        writer: &mut dyn crate::connector::TableWriter,
        batch: Batch,
    ) -> Result<(u64, Position)> {
        let context = &*self.context;
        let rows = batch.rows() as u64;
        TableStats::add(&stats.rows_read, rows + batch.rejected.len() as u64);
        TableStats::add(&stats.bytes_read, batch.bytes);
        context.throttle.admit(rows, batch.bytes).await;
        let (batch, mut rejects) = as_written(context, mapping, batch, stats);
        let to_write = &batch;
        let target_rejects = writer.write(to_write).await?;
        let written = to_write.rows() as u64 - target_rejects.len() as u64;
        rejects.extend(target_rejects);
        if !rejects.is_empty() {
            TableStats::add(&stats.rows_skipped, rejects.len() as u64);
            context.keep_dirty(&split.id, &rejects)?;
        }
        Ok((written, batch.position))
    }

    /// Commits what the writer staged with `checkpoint` (`written` rows since the last commit),
    /// then records the checkpoint in the local state.
    async fn commit(
        &self,
        writer: &mut dyn crate::connector::TableWriter,
        stats: &TableStats,
        checkpoint: &Checkpoint,
        written: u64,
    ) -> Result<()> {
        writer.commit(checkpoint).await?;
        if !checkpoint.done {
            crate::failpoint::hit("copy.batch.committed");
        }
        TableStats::add(&stats.rows_written, written);
        self.context.state.save_checkpoint(&self.context.job.name, checkpoint)
    }
}

/// Opens the reader of `split` from `position`: one that hands its rows on in `encoding` when
/// given (the target's writer reads it, and the job maps the table unchanged: no value to
/// transform or judge on the way) and the source can, else one that decodes them. Says which
/// encoding the reader's batches carry, if any.
async fn open_reader(
    context: &RunContext,
    split: &Split,
    encoding: Option<RowEncoding>,
    position: Option<&Position>,
) -> Result<(Box<dyn crate::connector::Reader>, Option<RowEncoding>)> {
    let source = context.source.needs_snapshot()?;
    let batch_rows = context.job.limits.batch_rows;
    if let Some(encoding) = encoding {
        if let Some(reader) = source.open_encoded(split, position, batch_rows, encoding).await? {
            return Ok((reader, Some(encoding)));
        }
    }
    Ok((source.open(split, position, batch_rows).await?, None))
}

/// Waits for every task and returns the error that stopped the copy, if any: a real failure
/// outranks the interruptions it caused in the other tasks.
async fn first_error(handles: Vec<tokio::task::JoinHandle<Result<()>>>) -> Option<Error> {
    let mut first_error: Option<Error> = None;
    for handle in handles {
        let outcome =
            handle.await.unwrap_or_else(|panic| Err(Error::new(ErrorKind::Write, format!("a task panicked: {panic}"))));
        if let Err(error) = outcome {
            // A real failure outranks the interruptions it caused in the other tasks.
            let replace = match &first_error {
                None => true,
                Some(current) => current.kind() == ErrorKind::Interrupted && error.kind() != ErrorKind::Interrupted,
            };
            if replace {
                first_error = Some(error);
            }
        }
    }
    first_error
}

/// A batch as the target gets it: transformed, and judged by the zero-date policy; with the
/// rows the source, the transform or the policy refused.
pub(super) fn as_written(
    context: &RunContext,
    mapping: &TableMapping,
    mut batch: Batch,
    stats: &TableStats,
) -> (Batch, Vec<Rejected>) {
    let mut rejects = std::mem::take(&mut batch.rejected);
    if batch.encoded.is_some() {
        // Asked for only where the mapping changes nothing, from sources without zero dates.
        return (batch, rejects);
    }
    if !mapping.is_identity() {
        let transformed = mapping.batch(batch);
        TableStats::add(&stats.rows_filtered, transformed.filtered);
        batch = transformed.batch;
        rejects.append(&mut batch.rejected);
    }
    // The zero-date policy judges the rows as the target gets them.
    if !context.sink.holds_zero_dates() {
        if let Some(outcome) = zero_dates::apply(&batch, context.job.errors.zero_dates, &context.job.target.connector) {
            TableStats::add(&stats.zero_dates_nulled, outcome.nulled);
            rejects.extend(outcome.rejected);
            batch = Batch { rejected: Vec::new(), ..outcome.batch };
        }
    }
    (batch, rejects)
}

/// Pulls batches from a reader into the channel until the split ends, the writer goes away, or a
/// stop is asked for; forwards acknowledged positions to the reader between reads. Sends
/// `Ok(None)` at the end of the split, so the writer can tell the end from a stop.
async fn produce(
    mut reader: Box<dyn crate::connector::Reader>,
    batches: mpsc::Sender<Result<Option<Batch>>>,
    mut acks: mpsc::UnboundedReceiver<Position>,
    stop: watch::Receiver<bool>,
    abort: watch::Receiver<bool>,
) {
    loop {
        while let Ok(position) = acks.try_recv() {
            if let Err(error) = reader.ack(&position).await {
                let _ = batches.send(Err(error)).await;
                return;
            }
        }
        if *stop.borrow() || *abort.borrow() {
            return;
        }
        let item = reader.next().await.map_err(changed_since_planned);
        let last = !matches!(item, Ok(Some(_)));
        if batches.send(item).await.is_err() || last {
            return;
        }
    }
}

/// A split's read that finds one of its columns, or its table, gone: the table changed shape
/// since its copy was planned (DDL while it was copied, or between a killed copy and its
/// resumption), and the copy keeps the planned columns.
fn changed_since_planned(error: Error) -> Error {
    if error.kind() != ErrorKind::Schema || error.side() != Some(crate::error::Side::Source) {
        return error;
    }
    error.hint(
        "the table or its columns changed since its copy was planned (DDL during the copy); copy it again in its shape now: \
         `sluice run --restart`, or on a server `sluice job delete` and `sluice job submit` again",
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicU32, Ordering};

    use async_trait::async_trait;
    use serde_json::json;

    use super::*;
    use crate::change::Change;
    use crate::connector::{CheckItem, Reader, Sink, SnapshotSource, Source, SplitHint, TableWriter};
    use crate::error::Side;
    use crate::runner::Runner;
    use crate::schema::{Column, DataType, TableName};
    use crate::spec::parse_job;
    use crate::spec::JobSpec;
    use crate::state::{MemoryStateStore, StateStore};
    use crate::stats::RunStatus;
    use crate::value::Value;

    fn table() -> Arc<TableSchema> {
        Arc::new(TableSchema {
            name: TableName::parse("t"),
            columns: vec![Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false)],
            primary_key: vec![0],
            indexes: Vec::new(),
            details: Default::default(),
        })
    }

    /// Rows 1..=rows in two splits; a row whose id is in `bad` cannot be decoded.
    struct MemorySource {
        rows: i64,
        bad: Vec<i64>,
        /// Hands rows on as lines of their ids when asked (`SnapshotSource::open_encoded`).
        encodes: bool,
    }

    #[async_trait]
    impl Source for MemorySource {
        async fn check(&self) -> Result<Vec<CheckItem>> {
            Ok(Vec::new())
        }
        async fn discover(&self) -> Result<Vec<TableSchema>> {
            Ok(vec![(*table()).clone()])
        }
        fn snapshot(&self) -> Option<&dyn SnapshotSource> {
            Some(self)
        }
    }

    #[async_trait]
    impl SnapshotSource for MemorySource {
        async fn split(&self, table: &Arc<TableSchema>, _hint: SplitHint) -> Result<Vec<Split>> {
            let half = self.rows / 2;
            Ok([(1, half), (half + 1, self.rows)]
                .iter()
                .enumerate()
                .map(|(index, (from, to))| Split {
                    id: format!("t#{index}"),
                    table: table.clone(),
                    descriptor: json!([from, to]),
                    estimated_rows: (to - from + 1) as u64,
                    whole: false,
                    window: None,
                })
                .collect())
        }
        async fn open(
            &self,
            split: &Split,
            resume_after: Option<&Position>,
            batch_rows: usize,
        ) -> Result<Box<dyn Reader>> {
            let from =
                resume_after.map_or(split.descriptor[0].as_i64().unwrap(), |position| position.0.as_i64().unwrap() + 1);
            Ok(Box::new(MemoryReader {
                next: from,
                to: split.descriptor[1].as_i64().unwrap(),
                batch_rows: batch_rows as i64,
                bad: self.bad.clone(),
                encoded: false,
            }))
        }
        async fn open_encoded(
            &self,
            split: &Split,
            resume_after: Option<&Position>,
            batch_rows: usize,
            _encoding: RowEncoding,
        ) -> Result<Option<Box<dyn Reader>>> {
            if !self.encodes {
                return Ok(None);
            }
            let from =
                resume_after.map_or(split.descriptor[0].as_i64().unwrap(), |position| position.0.as_i64().unwrap() + 1);
            Ok(Some(Box::new(MemoryReader {
                next: from,
                to: split.descriptor[1].as_i64().unwrap(),
                batch_rows: batch_rows as i64,
                bad: Vec::new(),
                encoded: true,
            })))
        }
    }

    struct MemoryReader {
        next: i64,
        to: i64,
        batch_rows: i64,
        bad: Vec<i64>,
        /// Batches carry the ids as lines of text.
        encoded: bool,
    }

    #[async_trait]
    impl Reader for MemoryReader {
        async fn next(&mut self) -> Result<Option<Batch>> {
            if self.next > self.to {
                return Ok(None);
            }
            let last = (self.next + self.batch_rows - 1).min(self.to);
            if self.encoded {
                let data = (self.next..=last).map(|id| format!("{id}\n")).collect::<String>().into_bytes().into();
                let rows = (last - self.next + 1) as usize;
                self.next = last + 1;
                let encoded = crate::change::EncodedRows { encoding: RowEncoding::PostgresCopyText, data, rows };
                return Ok(Some(Batch::encoded(encoded, Position(json!(last)))));
            }
            let mut changes = Vec::new();
            let mut rejected = Vec::new();
            for id in self.next..=last {
                if self.bad.contains(&id) {
                    rejected.push(Rejected {
                        table: "t".into(),
                        key: format!("id={id}"),
                        reason: "source: bad".into(),
                        record: None,
                        change: None,
                    });
                } else {
                    changes.push(Change::insert(table(), vec![Value::Int(id)]));
                }
            }
            self.next = last + 1;
            let mut batch = Batch::new(changes, Position(json!(last)));
            batch.rejected = rejected;
            Ok(Some(batch))
        }
    }

    /// A transactional target in memory whose commits fail with a transient error on the
    /// commit numbers in `failing_commits`.
    #[derive(Default)]
    struct MemoryTarget {
        committed: Mutex<(Vec<i64>, BTreeMap<String, Checkpoint>)>,
        commits: AtomicU32,
        failing_commits: Vec<u32>,
        /// The run's counters, when a test watches them: each commit records the rows the
        /// progress then expects (this run's written rows and the estimate of the rest).
        stats: Mutex<Option<Arc<crate::stats::JobStats>>>,
        expected_at_commits: Mutex<Vec<u64>>,
        /// Rows a writer stages before it wants a commit (`TableWriter::wants_commit`); 0: every batch.
        rows_per_commit: usize,
        /// Writers take batches of ids as lines of text (`TableWriter::takes_encoded`).
        takes_encoded: bool,
        /// Encoded batches written.
        encoded_batches: AtomicU32,
    }

    struct MemorySink(Arc<MemoryTarget>);

    #[async_trait]
    impl Sink for MemorySink {
        async fn check(&self) -> Result<Vec<CheckItem>> {
            Ok(Vec::new())
        }
        fn target_name(&self, source: &TableName) -> TableName {
            source.clone()
        }
        fn create_statements(&self, _tables: &[TableSchema]) -> Vec<String> {
            Vec::new()
        }
        async fn prepare(&self, _tables: &[TableSchema]) -> Result<()> {
            Ok(())
        }
        async fn reset(&self, _job: &str, _tables: &[crate::connector::TableTasks]) -> Result<()> {
            Ok(())
        }
        async fn open(&self, _job: &str, task: &str, _table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
            Ok(Box::new(MemoryWriter { target: self.0.clone(), task: task.to_owned(), staged: Vec::new() }))
        }
    }

    struct MemoryWriter {
        target: Arc<MemoryTarget>,
        task: String,
        staged: Vec<i64>,
    }

    #[async_trait]
    impl TableWriter for MemoryWriter {
        async fn recover(&mut self) -> Result<Option<Checkpoint>> {
            Ok(self.target.committed.lock().unwrap().1.get(&self.task).cloned())
        }
        async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
            if let Some(encoded) = &batch.encoded {
                self.target.encoded_batches.fetch_add(1, Ordering::SeqCst);
                let text = std::str::from_utf8(&encoded.data).unwrap();
                self.staged.extend(text.lines().map(|line| line.parse::<i64>().unwrap()));
                assert_eq!(text.lines().count(), encoded.rows);
            }
            self.staged.extend(batch.changes.iter().map(|change| match change.row()[0] {
                Value::Int(id) => id,
                _ => unreachable!(),
            }));
            Ok(Vec::new())
        }
        fn takes_encoded(&self) -> Option<RowEncoding> {
            self.target.takes_encoded.then_some(RowEncoding::PostgresCopyText)
        }
        async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
            let number = self.target.commits.fetch_add(1, Ordering::SeqCst) + 1;
            if self.target.failing_commits.contains(&number) {
                return Err(Error::new(ErrorKind::Unavailable, "connection reset").on(Side::Target));
            }
            let mut committed = self.target.committed.lock().unwrap();
            committed.0.append(&mut self.staged);
            committed.1.insert(self.task.clone(), checkpoint.clone());
            if let Some(stats) = &*self.target.stats.lock().unwrap() {
                let expected = stats.snapshot().iter().map(|table| table.rows_expected).sum();
                self.target.expected_at_commits.lock().unwrap().push(expected);
            }
            Ok(())
        }
        fn wants_commit(&self) -> bool {
            self.staged.len() >= self.target.rows_per_commit
        }
        async fn replace_all(&mut self) -> Result<()> {
            Ok(())
        }
    }

    fn job(extra: &str) -> Arc<JobSpec> {
        let text = format!("name: unit\nsource: {{type: memory}}\ntarget: {{type: memory}}\nlimits: {{batch_rows: 10}}\nretry: {{initial_backoff_ms: 1}}\n{extra}");
        Arc::new(parse_job(&text, false, |_| None).unwrap())
    }

    #[tokio::test]
    async fn transient_commit_failures_are_retried_without_duplicates() {
        let target = Arc::new(MemoryTarget { failing_commits: vec![3, 4, 9], ..Default::default() });
        let sink = Arc::new(MemorySink(target.clone()));
        let state = Arc::new(MemoryStateStore::default());
        let (_stop, stopped) = watch::channel(false);
        let runner = Arc::new(Runner::new(
            job(""),
            Arc::new(MemorySource { rows: 100, bad: vec![], encodes: false }),
            sink,
            state.clone(),
            stopped,
        ));
        let (summary, error) = runner.run().await;
        assert!(error.is_none(), "{error:?}");
        let mut ids = target.committed.lock().unwrap().0.clone();
        ids.sort_unstable();
        assert_eq!(ids, (1..=100).collect::<Vec<_>>());
        assert_eq!((summary.status, summary.rows_written), (RunStatus::Succeeded, 100));
        assert_eq!(state.runs(), 1);
    }

    /// A table the job maps unchanged goes from a source that can hand its rows on undecoded to
    /// a writer that takes them so: every batch encoded, every row once, counted; a job that
    /// filters the table gets decoded rows, and so does a writer that takes no encoding.
    #[tokio::test]
    async fn rows_pass_undecoded_only_where_the_mapping_changes_nothing_and_the_writer_takes_them() {
        let copy = |extra: &'static str, takes_encoded: bool| async move {
            let target = Arc::new(MemoryTarget { takes_encoded, ..Default::default() });
            let (_stop, stopped) = watch::channel(false);
            let runner = Arc::new(Runner::new(
                job(extra),
                Arc::new(MemorySource { rows: 100, bad: vec![], encodes: true }),
                Arc::new(MemorySink(target.clone())),
                Arc::new(MemoryStateStore::default()),
                stopped,
            ));
            let (summary, error) = runner.run().await;
            assert!(error.is_none(), "{error:?}");
            let mut ids = target.committed.lock().unwrap().0.clone();
            ids.sort_unstable();
            assert_eq!(ids, (1..=100).collect::<Vec<_>>());
            assert_eq!((summary.rows_read, summary.rows_written), (100, 100));
            target.encoded_batches.load(Ordering::SeqCst)
        };
        assert_eq!(copy("", true).await, 10, "ten batches of ten rows, all encoded");
        assert_eq!(copy("transform: [{source_table: t, filter: \"id > 0\"}]", true).await, 0);
        assert_eq!(copy("", false).await, 0);
    }

    /// A writer that wants fewer, larger commits gets them: batches are written until it asks,
    /// and each split's end commits the rest; every row lands once and the checkpoints count them.
    #[tokio::test]
    async fn a_writer_that_wants_larger_commits_gets_them_and_every_row_once() {
        let target = Arc::new(MemoryTarget { rows_per_commit: 35, ..Default::default() });
        let state = Arc::new(MemoryStateStore::default());
        let (_stop, stopped) = watch::channel(false);
        let runner = Arc::new(Runner::new(
            job(""),
            Arc::new(MemorySource { rows: 100, bad: vec![], encodes: false }),
            Arc::new(MemorySink(target.clone())),
            state,
            stopped,
        ));
        let (summary, error) = runner.run().await;
        assert!(error.is_none(), "{error:?}");
        let (mut ids, checkpoints) = target.committed.lock().unwrap().clone();
        ids.sort_unstable();
        assert_eq!(ids, (1..=100).collect::<Vec<_>>());
        assert_eq!(summary.rows_written, 100);
        assert_eq!(checkpoints.values().map(|checkpoint| checkpoint.rows_written).sum::<u64>(), 100);
        assert!(checkpoints.values().all(|checkpoint| checkpoint.done));
        let commits = target.commits.load(Ordering::SeqCst);
        assert!(commits < 10, "{commits} commits for 10 batches of 10 rows");
    }

    /// The progress expects the whole plan's rows from the first commit on, not only those of
    /// the splits taken so far; a resumed run expects what earlier runs did not commit.
    #[tokio::test]
    async fn the_progress_expects_every_splits_rows_from_the_start() {
        let target = Arc::new(MemoryTarget { failing_commits: vec![3], ..Default::default() });
        let state = Arc::new(MemoryStateStore::default());
        let source = Arc::new(MemorySource { rows: 100, bad: vec![], encodes: false });
        let run = || {
            let (_stop, stopped) = watch::channel(false);
            let runner = Arc::new(Runner::new(
                Arc::new(
                    parse_job(
                        "name: unit\nsource: {type: memory}\ntarget: {type: memory}\nlimits: {batch_rows: 10}\n\
                         parallelism: 1\nretry: {max_attempts: 1, initial_backoff_ms: 1}\n",
                        false,
                        |_| None,
                    )
                    .unwrap(),
                ),
                source.clone(),
                Arc::new(MemorySink(target.clone())),
                state.clone(),
                stopped,
            ));
            *target.stats.lock().unwrap() = Some(runner.stats());
            target.expected_at_commits.lock().unwrap().clear();
            runner
        };
        // The first run commits two batches of the first split, then fails.
        let (summary, _) = run().run().await;
        assert_eq!(summary.status, RunStatus::Failed);
        assert_eq!(*target.expected_at_commits.lock().unwrap(), vec![100, 100]);
        // The next expects the 80 rows left, and its total stays put as it takes the second split.
        let (summary, error) = run().run().await;
        assert!(error.is_none(), "{error:?}");
        assert_eq!(summary.rows_written, 80);
        let expected = target.expected_at_commits.lock().unwrap().clone();
        assert!(expected.len() >= 8 && expected.iter().all(|total| *total == 80), "{expected:?}");
    }

    #[tokio::test]
    async fn dirty_records_past_the_limit_fail_before_their_batch_commits() {
        let target = Arc::new(MemoryTarget::default());
        let sink = Arc::new(MemorySink(target.clone()));
        let state = Arc::new(MemoryStateStore::default());
        let (_stop, stopped) = watch::channel(false);
        let source = Arc::new(MemorySource { rows: 100, bad: vec![5, 15], encodes: false });
        let runner = Arc::new(Runner::new(
            job("parallelism: 1\nerrors: {max_dirty_records: 1}\n"),
            source,
            sink,
            state.clone(),
            stopped,
        ));
        let (summary, error) = runner.run().await;
        let error = error.expect("the second dirty record fails the job");
        assert!(error.to_string().contains("2 dirty records exceed errors.max_dirty_records = 1"), "{error}");
        assert_eq!(summary.status, RunStatus::Failed);
        // Rows 1-10 (with the first dirty record) committed; the batch holding id 15 did not.
        let committed = target.committed.lock().unwrap().0.clone();
        assert_eq!(committed, (1..=10).filter(|id| *id != 5).collect::<Vec<_>>());
        assert_eq!(state.dirty_records("unit").unwrap().len(), 2, "both are kept for inspection");
    }
}
