//! Writing into PostgreSQL: created schemas and tables, COPY in one transaction per commit that
//! also updates the task's row in `sluice.checkpoints`.

use std::sync::Arc;

use async_trait::async_trait;
use sluice_core::change::{Batch, Change, EncodedRows, Rejected, RowEncoding};
use sluice_core::connector::{
    Binding, CheckItem, Checkpoint, Fence, FoldedChangeSink, FoldedChangeWriter, Refused, Sink, TableTasks, TableWriter,
};
use sluice_core::secret::Secret;
use sluice_core::spec::WriteMode;
use sluice_core::{Error, ErrorKind, Result, Row, Side, TableName, TableSchema};
use tokio_postgres::Client;

use super::checkpoints::{
    commit_with_checkpoint, fence_tag, own_tables, read_checkpoint, record_identity, verify_binding, BINDING_TABLE,
    FENCE_TABLE,
};
use super::tables::{
    create_index_sql, create_table_sql, finish_sql, primary_key_sql, qualified, KeyBuilt, HAS_PRIMARY_KEY,
};
use super::trial::CopyTrial;
use super::{connect, postgres_error, quote, refuse_long_names};
use crate::sql::snapshot::{write_inserts, InsertTarget};
use crate::sql::target::{to_create, warn_keyless_upsert};
use crate::sql::task::WriterTask;

/// Tables whose keys and indexes `finish` builds at once, each on a connection of its own.
const BUILDS_AT_ONCE: usize = 4;

/// A PostgreSQL database written as a target.
#[derive(Debug)]
pub struct PostgresSink {
    url: Secret,
    /// The URL without its password, for messages.
    server: String,
    write_mode: WriteMode,
    create_tables: bool,
    /// Every table goes into this namespace when set.
    namespace: Option<String>,
    /// The cluster task's fence every checkpoint commit checks, when a worker runs this sink.
    fence: Option<Fence>,
}

impl PostgresSink {
    pub fn new(
        url: Secret,
        server: String,
        write_mode: WriteMode,
        create_tables: bool,
        namespace: Option<String>,
    ) -> PostgresSink {
        PostgresSink { url, server, write_mode, create_tables, namespace, fence: None }
    }

    /// The same sink, committing only while `fence` (when given) holds in the target.
    pub fn fenced_if(self, fence: Option<Fence>) -> PostgresSink {
        PostgresSink { fence, ..self }
    }

    /// A writer's connection. A fenced one ends a transaction left idle for 10 s, so a worker
    /// stalled in the middle of one (paused, cut off) cannot hold the row locks its task's new
    /// owner needs.
    async fn writer_connection(&self, job: &str) -> Result<Client> {
        let client = connect(&self.url, Side::Target, &self.server).await?;
        if let Some(fence) = &self.fence {
            // Tagged, so the task's next owner can end this session should this worker stall
            // in the middle of a statement (a COPY waiting for rows is not idle).
            let settings = format!(
                "SET idle_in_transaction_session_timeout = '10s'; SET application_name = '{}{}'",
                fence_tag(job, fence),
                fence.epoch
            );
            client.batch_execute(&settings).await.map_err(self.error("tag and limit the session"))?;
        }
        Ok(client)
    }

    fn error(&self, doing: &str) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
        let doing = doing.to_owned();
        move |error| postgres_error(error, Side::Target, &self.server, &doing)
    }

    /// Makes the checkpoint and fence tables, and the missing tables (when the job may) with
    /// their primary keys built as `key` says.
    async fn prepare_tables(&self, tables: &[TableSchema], key: impl Fn(&TableSchema) -> KeyBuilt) -> Result<()> {
        refuse_long_names(tables)?;
        let client = connect(&self.url, Side::Target, &self.server).await?;
        client
            .batch_execute(&own_tables(
                "CREATE SCHEMA IF NOT EXISTS sluice;
                 CREATE TABLE IF NOT EXISTS sluice.checkpoints (job text NOT NULL, task text NOT NULL, position jsonb,
                     done boolean NOT NULL, rows_written bigint NOT NULL, updated_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (job, task))",
            ))
            .await
            .map_err(self.error("create the checkpoint table sluice.checkpoints"))?;
        // Made here too, once, before the tasks of a cluster job claim their fences at once.
        client
            .batch_execute(&own_tables(FENCE_TABLE))
            .await
            .map_err(self.error("create the fence table sluice.fences"))?;
        warn_keyless_upsert(tables, self.write_mode);
        for table in tables {
            let existing = self.columns(&client, &table.name).await?;
            if to_create(table, &existing, self.create_tables, |known, name| known == name)? {
                // Under the lock of Sluice's own tables: the jobs of several sources
                // (`sources:`) create the same tables at once.
                client
                    .batch_execute(&own_tables(&create_table_sql(table, key(table))))
                    .await
                    .map_err(self.error(&format!("create table {}", table.name)))?;
            }
        }
        Ok(())
    }

    /// The columns table `table` has (none when it does not exist).
    async fn columns(&self, client: &Client, table: &TableName) -> Result<Vec<String>> {
        let namespace = table.namespace.as_deref().unwrap_or("public");
        Ok(client
            .query(
                "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 \
                 ORDER BY ordinal_position",
                &[&namespace, &table.name],
            )
            .await
            .map_err(self.error(&format!("describe table {table}")))?
            .iter()
            .map(|row| row.get(0))
            .collect())
    }
}

#[async_trait]
impl Sink for PostgresSink {
    async fn check(&self) -> Result<Vec<CheckItem>> {
        let client = connect(&self.url, Side::Target, &self.server).await?;
        let row = client
            .query_one("SELECT version(), current_user", &[])
            .await
            .map_err(self.error("read the server version"))?;
        let (version, user): (String, String) = (row.get(0), row.get(1));
        let version = version.split(" on ").next().unwrap_or(&version).to_owned();
        Ok(vec![CheckItem {
            what: "target connection".into(),
            ok: true,
            detail: format!("{} as {user} ({version})", self.server),
        }])
    }

    /// `db.table` lands as schema `db` (or the job's `namespace`), table `table`; a name
    /// without namespace in `public`.
    fn target_name(&self, source: &TableName) -> TableName {
        let namespace = self.namespace.as_deref().or(source.namespace.as_deref()).unwrap_or("public");
        TableName::new(Some(namespace), &source.name)
    }

    fn create_statements(&self, tables: &[TableSchema]) -> Vec<String> {
        tables
            .iter()
            .flat_map(|table| {
                std::iter::once(create_table_sql(table, KeyBuilt::WithTable)).chain(create_index_sql(table))
            })
            .collect()
    }

    /// Builds each table's primary key (when `prepare_for_copy` left it out) and indexes on
    /// its own connection, `BUILDS_AT_ONCE` tables at a time: the server uses one core per index
    /// build, and a job of hundreds of tables must not take as many of its connections.
    async fn finish(&self, tables: &[TableSchema]) -> Result<()> {
        let mut builds = tokio::task::JoinSet::new();
        let turns = Arc::new(tokio::sync::Semaphore::new(BUILDS_AT_ONCE));
        for table in tables.iter().filter(|table| !table.primary_key.is_empty() || !finish_sql(table).is_empty()) {
            let (url, server) = (self.url.clone(), self.server.clone());
            let statements = finish_sql(table);
            let key = primary_key_sql(table);
            let name = table.name.clone();
            let turns = turns.clone();
            builds.spawn(async move {
                let _turn = turns.acquire_owned().await.expect("the semaphore is never closed");
                let client = connect(&url, Side::Target, &server).await?;
                // One build of a table at a time: the jobs of several sources (`sources:`)
                // finish the same tables, and two `CREATE INDEX IF NOT EXISTS` at once fail. The
                // session's lock ends with its connection.
                client.execute("SELECT pg_advisory_lock(hashtext($1))", &[&qualified(&name)]).await.map_err(
                    |error| {
                        postgres_error(error, Side::Target, &server, &format!("wait to build the indexes of {name}"))
                    },
                )?;
                if let Some(key) = key {
                    add_primary_key(&client, &server, &name, &key).await?;
                }
                for statement in statements {
                    client.batch_execute(&statement).await.map_err(|error| {
                        postgres_error(
                            error,
                            Side::Target,
                            &server,
                            &format!("build the indexes and sequences of {name}"),
                        )
                    })?;
                }
                Ok::<_, Error>(())
            });
        }
        while let Some(build) = builds.join_next().await {
            build.map_err(|error| {
                Error::new(ErrorKind::Write, format!("an index build failed: {error}")).on(Side::Target)
            })??;
        }
        Ok(())
    }

    async fn table_columns(&self, table: &TableName) -> Result<Option<Vec<String>>> {
        let client = connect(&self.url, Side::Target, &self.server).await?;
        Ok(Some(self.columns(&client, table).await?))
    }

    async fn prepare(&self, tables: &[TableSchema]) -> Result<()> {
        self.prepare_tables(tables, |_| KeyBuilt::WithTable).await
    }

    /// The primary key of a table created now is built by `finish`, over the copied rows,
    /// unless the table is `merged` or the job upserts (every batch needs the key then).
    async fn prepare_for_copy(&self, tables: &[TableSchema], merged: &[TableName]) -> Result<()> {
        let key = |table: &TableSchema| {
            if self.write_mode == WriteMode::Upsert || merged.contains(&table.name) {
                KeyBuilt::WithTable
            } else {
                KeyBuilt::AfterCopy
            }
        };
        self.prepare_tables(tables, key).await
    }

    async fn verify_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<Vec<(TableName, Binding)>> {
        let client = connect(&self.url, Side::Target, &self.server).await?;
        client
            .batch_execute(&own_tables(BINDING_TABLE))
            .await
            .map_err(self.error("create the table sluice.bindings"))?;
        let mut judged = Vec::with_capacity(tables.len());
        for table in tables {
            judged.push((
                table.table.clone(),
                verify_binding(&client, &self.server, job, &table.table, &table.tasks).await?,
            ));
        }
        Ok(judged)
    }

    async fn forget_checkpoints(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let client = connect(&self.url, Side::Target, &self.server).await?;
        for table in tables {
            client
                .execute("DELETE FROM sluice.checkpoints WHERE job = $1 AND task = ANY($2)", &[&job, &table.tasks])
                .await
                .map_err(self.error(&format!("forget the checkpoints of {}", table.table)))?;
            record_identity(&client, &self.server, job, &table.table).await?;
        }
        Ok(())
    }

    /// One transaction: the tables are emptied and the checkpoints forgotten together.
    async fn reset(&self, job: &str, tables: &[TableTasks]) -> Result<()> {
        let client = connect(&self.url, Side::Target, &self.server).await?;
        client
            .batch_execute(&own_tables(BINDING_TABLE))
            .await
            .map_err(self.error("create the table sluice.bindings"))?;
        client.batch_execute("BEGIN").await.map_err(self.error("begin"))?;
        for table in tables {
            let name = qualified(&table.table);
            let exists: bool = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
                .await
                .map_err(self.error("look for the job's tables"))?
                .get(0);
            if exists {
                client
                    .batch_execute(&format!("TRUNCATE {name}"))
                    .await
                    .map_err(self.error(&format!("empty table {}", table.table)))?;
            }
        }
        client
            .execute("DELETE FROM sluice.checkpoints WHERE job = $1", &[&job])
            .await
            .map_err(self.error("forget the job's checkpoints"))?;
        client
            .execute("DELETE FROM sluice.bindings WHERE job = $1", &[&job])
            .await
            .map_err(self.error("forget the job's table identities"))?;
        client.batch_execute("COMMIT").await.map_err(self.error("commit the reset"))
    }

    async fn claim(&self, job: &str) -> Result<()> {
        let Some(fence) = &self.fence else { return Ok(()) };
        let mut client = connect(&self.url, Side::Target, &self.server).await?;
        client
            .batch_execute(&own_tables(FENCE_TABLE))
            .await
            .map_err(self.error("create the fence table sluice.fences"))?;
        // Sessions of older owners of this task are stale: ending them rolls back whatever they
        // hold (a stalled COPY's row locks, a share lock on the fence) before the fence is taken.
        let tag = fence_tag(job, fence);
        client
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE pid <> pg_backend_pid()
                   AND CASE WHEN starts_with(application_name, $1)
                       THEN substr(application_name, length($1) + 1)::bigint < $2 ELSE false END",
                &[&tag, &(fence.epoch as i64)],
            )
            .await
            .map_err(self.error("end the sessions of the task's older owners"))?;
        let transaction = client.transaction().await.map_err(self.error("begin"))?;
        let held: Option<i64> = transaction
            .query_opt("SELECT epoch FROM sluice.fences WHERE job = $1 AND task = $2 FOR UPDATE", &[&job, &fence.task])
            .await
            .map_err(self.error("read the fence"))?
            .map(|row| row.get(0));
        if let Some(held) = held.filter(|held| *held as u64 > fence.epoch) {
            return Err(fence.moved(job, held as u64));
        }
        transaction
            .execute(
                "INSERT INTO sluice.fences (job, task, epoch) VALUES ($1, $2, $3)
                 ON CONFLICT (job, task) DO UPDATE SET epoch = EXCLUDED.epoch",
                &[&job, &fence.task, &(fence.epoch as i64)],
            )
            .await
            .map_err(self.error("take the fence"))?;
        transaction.commit().await.map_err(self.error("commit the fence"))
    }

    async fn open(&self, job: &str, task: &str, table: Arc<TableSchema>) -> Result<Box<dyn TableWriter>> {
        let client = self.writer_connection(job).await?;
        let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
        let upsert = self.write_mode == WriteMode::Upsert && !table.primary_key.is_empty();
        let stage = upsert.then(|| format!("sluice_stage_{}", std::process::id()));
        let copy_target = stage.clone().unwrap_or_else(|| qualified(&table.name));
        Ok(Box::new(PostgresWriter {
            client,
            server: self.server.clone(),
            task: WriterTask::new(job, task, self.fence.as_ref()),
            copy: format!("COPY {copy_target} ({}) FROM STDIN", columns.join(", ")),
            upsert: stage.as_ref().map(|stage| upsert_sql(&table, stage)),
            stage,
            table,
            in_transaction: false,
            buffer: String::new(),
        }))
    }

    sluice_core::capabilities!(folded_changes: FoldedChangeSink);
}

#[async_trait]
impl FoldedChangeSink for PostgresSink {
    fn hides_copies(&self) -> bool {
        true
    }

    async fn existing_tables(&self, tables: &[TableName]) -> Result<Vec<TableName>> {
        let client = connect(&self.url, Side::Target, &self.server).await?;
        let mut existing = Vec::new();
        for table in tables {
            let found = client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&qualified(table)]).await.map_err(
                |error| postgres_error(error, Side::Target, &self.server, &format!("look up table {table}")),
            )?;
            if found.get::<_, bool>(0) {
                existing.push(table.clone());
            }
        }
        Ok(existing)
    }

    async fn open_folded(&self, job: &str, task: &str) -> Result<Box<dyn FoldedChangeWriter>> {
        Ok(Box::new(super::changes::PostgresChangeWriter {
            client: self.writer_connection(job).await?,
            server: self.server.clone(),
            task: WriterTask::new(job, task, self.fence.as_ref()),
            in_transaction: false,
            buffer: String::new(),
            sequences: Default::default(),
        }))
    }

    /// Lanes need nothing of their own: PostgreSQL's row locks cover only the rows written, and
    /// its default READ COMMITTED takes no gap locks.
    async fn open_lane(&self, job: &str, task: &str, _lane: usize) -> Result<Option<Box<dyn FoldedChangeWriter>>> {
        self.open_folded(job, task).await.map(Some)
    }
}

/// Adds the primary key `statement` builds, unless the table has one: a table created with it,
/// or a `finish` that ran before. Rows copied twice under one key (a route merging tables whose
/// keys meet) make the build fail, naming the table and the key.
async fn add_primary_key(client: &Client, server: &str, table: &TableName, statement: &str) -> Result<()> {
    let error = |doing: &str| {
        let doing = doing.to_owned();
        move |error| postgres_error(error, Side::Target, server, &doing)
    };
    let has_key: bool = client
        .query_one(HAS_PRIMARY_KEY, &[&qualified(table)])
        .await
        .map_err(error(&format!("look for the primary key of {table}")))?
        .get(0);
    if has_key {
        return Ok(());
    }
    let built = client.batch_execute(statement).await;
    built.map_err(|failure| {
        let duplicate = failure.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION);
        let error = error(&format!("build the primary key of {table}"))(failure);
        if duplicate {
            error.hint(
                "the copied rows hold one key twice: a route that merges tables needs keys that stay apart \
                 (a column naming the source table in the key); fix the rows and run the job again",
            )
        } else {
            error
        }
    })
}

/// Moves staged rows into the table, replacing rows with the same primary key only: a conflict
/// on any other unique key still fails.
fn upsert_sql(table: &TableSchema, stage: &str) -> String {
    let columns: Vec<String> = table.columns.iter().map(|column| quote(&column.name)).collect();
    let key: Vec<String> = table.primary_key.iter().map(|&index| quote(&table.columns[index].name)).collect();
    let updates: Vec<String> = (0..table.columns.len())
        .filter(|index| !table.primary_key.contains(index))
        .map(|index| format!("{0} = EXCLUDED.{0}", quote(&table.columns[index].name)))
        .collect();
    let action = if updates.is_empty() { "NOTHING".to_owned() } else { format!("UPDATE SET {}", updates.join(", ")) };
    format!(
        "INSERT INTO {} ({cols}) SELECT {cols} FROM {stage} ON CONFLICT ({}) DO {action}; DELETE FROM {stage}",
        qualified(&table.name),
        key.join(", "),
        cols = columns.join(", ")
    )
}

struct PostgresWriter {
    client: Client,
    server: String,
    task: WriterTask,
    table: Arc<TableSchema>,
    copy: String,
    /// For upsert: the session's staging table and the statement that merges it.
    stage: Option<String>,
    upsert: Option<String>,
    in_transaction: bool,
    buffer: String,
}

impl PostgresWriter {
    fn error(&self, doing: &str) -> impl Fn(tokio_postgres::Error) -> Error + '_ {
        let doing = doing.to_owned();
        move |error| postgres_error(error, Side::Target, &self.server, &doing)
    }

    /// COPYs rows another PostgreSQL server wrote as COPY text under a savepoint; when the table
    /// refuses one, reads them as values and writes them as decoded rows are written, so the
    /// refused ones are found and become dirty records.
    async fn write_encoded(&mut self, rows: &EncodedRows) -> Result<Vec<Rejected>> {
        self.begin().await?;
        self.client.batch_execute("SAVEPOINT encoded").await.map_err(self.error("set a savepoint"))?;
        let copied = match super::copy_text(&self.client, &self.copy, rows.data.clone()).await {
            Ok(()) => match &self.upsert {
                Some(upsert) => self.client.batch_execute(upsert).await,
                None => Ok(()),
            },
            Err(error) => Err(error),
        };
        match copied {
            Ok(()) => {
                self.client
                    .batch_execute("RELEASE SAVEPOINT encoded")
                    .await
                    .map_err(self.error("release a savepoint"))?;
                Ok(Vec::new())
            }
            Err(error) if super::is_row_error(&error) => {
                self.client
                    .batch_execute("ROLLBACK TO SAVEPOINT encoded")
                    .await
                    .map_err(self.error("roll back refused rows"))?;
                log::debug!("table {}: a row of a batch was refused ({error}); finding it", self.table.name);
                self.write_decoded(&rows.data).await
            }
            Err(error) => {
                Err(postgres_error(error, Side::Target, &self.server, &format!("copy into {}", self.table.name)))
            }
        }
    }

    /// The rows of COPY text read as values and written as a decoded batch is; a line whose
    /// values this table's types cannot hold is refused as the source's reader refuses it.
    async fn write_decoded(&mut self, data: &[u8]) -> Result<Vec<Rejected>> {
        let mut rows = Vec::new();
        let mut rejected = Vec::new();
        for line in data.split_inclusive(|byte| *byte == b'\n') {
            match super::source::values::decode_line(&self.table, line) {
                Ok(values) => rows.push(Change::insert(self.table.clone(), values)),
                Err((values, reason)) => rejected.push(Rejected::row(&self.table, &values, reason)),
            }
        }
        let batch = Batch::new(rows, sluice_core::Position(serde_json::Value::Null));
        rejected.extend(write_inserts(self, &batch).await?);
        Ok(rejected)
    }
}

#[async_trait]
impl InsertTarget for PostgresWriter {
    const TARGET: &'static str = "PostgreSQL";

    fn table(&self) -> &TableSchema {
        &self.table
    }

    fn in_transaction(&mut self) -> &mut bool {
        &mut self.in_transaction
    }

    async fn start_transaction(&mut self) -> Result<()> {
        self.client.batch_execute("BEGIN").await.map_err(self.error("begin a transaction"))
    }

    /// COPYed (and merged, for upsert) under savepoints: a row whose content fails the batch
    /// is found and left out, the rest kept.
    async fn write_rows(&mut self, rows: &[&Row]) -> Result<Vec<Refused>> {
        CopyTrial {
            client: &self.client,
            server: &self.server,
            table: &self.table,
            copy: &self.copy,
            then: self.upsert.as_deref(),
            rows,
            buffer: &mut self.buffer,
            key_conflicts: false,
        }
        .run()
        .await
    }
}

#[async_trait]
impl TableWriter for PostgresWriter {
    async fn recover(&mut self) -> Result<Option<Checkpoint>> {
        if let Some(stage) = &self.stage {
            let create = format!(
                "CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {} INCLUDING DEFAULTS)",
                qualified(&self.table.name)
            );
            self.client.batch_execute(&create).await.map_err(self.error("create the staging table"))?;
        }
        read_checkpoint(&self.client, &self.server, &self.task.job, &self.task.name).await
    }

    async fn write(&mut self, batch: &Batch) -> Result<Vec<Rejected>> {
        match &batch.encoded {
            Some(rows) => self.write_encoded(rows).await,
            None => write_inserts(self, batch).await,
        }
    }

    fn takes_encoded(&self) -> Option<RowEncoding> {
        Some(RowEncoding::PostgresCopyText)
    }

    async fn commit(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        self.begin().await?;
        self.in_transaction = false;
        commit_with_checkpoint(&self.client, &self.server, &self.task.job, self.task.fence.as_ref(), checkpoint).await
    }

    /// `TRUNCATE` in the open transaction: undone with it, should the copy fail.
    async fn replace_all(&mut self) -> Result<()> {
        self.begin().await?;
        let statement = format!("TRUNCATE {}", qualified(&self.table.name));
        self.client.batch_execute(&statement).await.map_err(self.error(&format!("empty table {}", self.table.name)))
    }
}
