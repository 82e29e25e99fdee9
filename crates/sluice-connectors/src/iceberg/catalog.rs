//! The SQL catalog: which metadata file is each table's current one, in the two tables Iceberg's
//! SQL (JDBC) catalog keeps — `iceberg_tables` and `iceberg_namespace_properties`, as pyiceberg,
//! Java's JdbcCatalog and iceberg-rust lay them out — in a SQLite file or a PostgreSQL database.
//!
//! A commit moves the pointers of several tables in one SQL transaction, each only from the
//! metadata file its writer started from: so a change stream's group lands in every table it
//! touches at once or not at all, and a writer that raced another fails instead of undoing it.
//! A cluster task's fence (`sluice_fences`, beside the catalog's tables) is checked in the same
//! transaction, and a stream's group records its checkpoint in it (`sluice_streams`), so the
//! position moves on with groups that change no table too. Sluice keeps this catalog itself, over `rusqlite` and `tokio-postgres`, because
//! iceberg-rust's SQL catalog needs sqlx, whose SQLite library cannot be linked beside rusqlite's
//! (docs/decisions/0072).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::OptionalExtension;
use sluice_core::connector::Fence;
use sluice_core::secret::Secret;
use sluice_core::{Error, ErrorKind, Result, Side, TableName};

/// One change of a commit.
#[derive(Debug, Clone)]
pub(crate) enum Pointer {
    /// A new table, at this metadata file.
    Create { table: TableName, metadata: String },
    /// A table moves from one metadata file to the next.
    Move { table: TableName, from: String, to: String },
    /// A table (at this metadata file) leaves the catalog.
    Drop { table: TableName, metadata: String },
}

/// The catalog's tables, created when missing (SQLite and PostgreSQL alike).
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS iceberg_tables (
        catalog_name VARCHAR(255) NOT NULL,
        table_namespace VARCHAR(255) NOT NULL,
        table_name VARCHAR(255) NOT NULL,
        metadata_location VARCHAR(1000),
        previous_metadata_location VARCHAR(1000),
        iceberg_type VARCHAR(5),
        PRIMARY KEY (catalog_name, table_namespace, table_name));
    CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (
        catalog_name VARCHAR(255) NOT NULL,
        namespace VARCHAR(255) NOT NULL,
        property_key VARCHAR(255),
        property_value VARCHAR(1000),
        PRIMARY KEY (catalog_name, namespace, property_key));
    CREATE TABLE IF NOT EXISTS sluice_fences (
        job VARCHAR(255) NOT NULL,
        task VARCHAR(255) NOT NULL,
        epoch BIGINT NOT NULL,
        PRIMARY KEY (job, task));
    CREATE TABLE IF NOT EXISTS sluice_streams (
        catalog_name VARCHAR(255) NOT NULL,
        job VARCHAR(255) NOT NULL,
        mark TEXT NOT NULL,
        PRIMARY KEY (catalog_name, job));";

const METADATA_OF: &str = "SELECT metadata_location FROM iceberg_tables
    WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3";
const TABLES: &str = "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables
    WHERE catalog_name = ?1 AND metadata_location IS NOT NULL AND (iceberg_type IS NULL OR iceberg_type = 'TABLE')";
const STREAM: &str = "SELECT mark FROM sluice_streams WHERE catalog_name = ?1 AND job = ?2";
const MARK: &str = "INSERT INTO sluice_streams (catalog_name, job, mark) VALUES (?1, ?2, ?3)
    ON CONFLICT (catalog_name, job) DO UPDATE SET mark = excluded.mark";
const FORGET: &str = "DELETE FROM sluice_streams WHERE catalog_name = ?1 AND job = ?2";
const FENCE: &str = "SELECT epoch FROM sluice_fences WHERE job = ?1 AND task = ?2";
const CLAIM: &str = "INSERT INTO sluice_fences (job, task, epoch) VALUES (?1, ?2, ?3)
    ON CONFLICT (job, task) DO UPDATE SET epoch = excluded.epoch";
const CREATE_NAMESPACE: &str = "INSERT INTO iceberg_namespace_properties
    (catalog_name, namespace, property_key, property_value) VALUES (?1, ?2, 'exists', 'true') ON CONFLICT DO NOTHING";
const CREATE: &str = "INSERT INTO iceberg_tables
    (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location, iceberg_type)
    VALUES (?1, ?2, ?3, ?4, NULL, 'TABLE') ON CONFLICT DO NOTHING";
const MOVE: &str = "UPDATE iceberg_tables SET metadata_location = ?4, previous_metadata_location = ?5
    WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3 AND metadata_location = ?5";
const DROP: &str = "DELETE FROM iceberg_tables
    WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3 AND metadata_location = ?4";
const DROP_ANY: &str =
    "DELETE FROM iceberg_tables WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3";

/// A statement's text for PostgreSQL, whose numbered parameters are `$N` where SQLite's are `?N`.
fn postgres_text(statement: &str) -> String {
    statement.replace('?', "$")
}

/// Where the catalog's tables are.
#[derive(Debug, Clone)]
enum Store {
    Sqlite(PathBuf),
    /// A PostgreSQL database, with the session kept between calls.
    Postgres {
        url: Secret,
        session: Arc<tokio::sync::Mutex<Option<tokio_postgres::Client>>>,
    },
}

/// A catalog the job names: `catalog: {type: sql, uri: "sqlite:///…" or "postgresql://…", name: …}`.
#[derive(Debug, Clone)]
pub(crate) struct SqlCatalog {
    store: Store,
    /// The URI with its password hidden, for messages.
    shown: String,
    /// The catalog's name (`catalog_name`): one database may hold several catalogs.
    pub name: String,
}

fn catalog_error(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Error {
    let text = sluice_core::secret::scrub(&error.to_string());
    Error::new(ErrorKind::Write, format!("Iceberg catalog: {doing}: {text}")).on(Side::Target)
}

/// The key of a table in the catalog's tables.
fn key(table: &TableName) -> (&str, &str) {
    (namespace_of(table), &table.name)
}

/// A commit's pointer as a statement and its parameters (after the catalog's name).
fn statement(pointer: &Pointer) -> (&'static str, &TableName, Vec<&str>) {
    match pointer {
        Pointer::Create { table, metadata } => (CREATE, table, vec![metadata]),
        Pointer::Move { table, from, to } => (MOVE, table, vec![to, from]),
        Pointer::Drop { table, metadata } => (DROP, table, vec![metadata]),
    }
}

fn conflict(table: &TableName, catalog: &str) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!("Iceberg table {table} was changed by another writer meanwhile (catalog {catalog})"),
    )
    .on(Side::Target)
}

impl SqlCatalog {
    /// The catalog of a SQLAlchemy-style URI: `sqlite:////absolute/path.db`,
    /// `sqlite:///relative/path.db`, or `postgresql://user:password@host:port/database` (a
    /// driver named as in `postgresql+psycopg2://` is left out).
    pub(super) fn parse(uri: &str, name: &str) -> std::result::Result<SqlCatalog, String> {
        let shown = sluice_core::secret::redact_url_passwords(uri);
        let store = if let Some(path) = uri.strip_prefix("sqlite:///") {
            if path.is_empty() {
                return Err("the SQLite file's path is missing".into());
            }
            Store::Sqlite(PathBuf::from(path))
        } else if let Some((scheme, rest)) = uri
            .split_once("://")
            .filter(|(scheme, _)| *scheme == "postgresql" || *scheme == "postgres" || scheme.starts_with("postgresql+"))
        {
            let _ = scheme;
            let url = Secret::new(format!("postgresql://{rest}"));
            Store::Postgres { url, session: Arc::new(tokio::sync::Mutex::new(None)) }
        } else {
            return Err(format!(
                "expected sqlite:////absolute/path/catalog.db (four slashes), sqlite:///relative/path.db or postgresql://user:password@host:port/database, found `{shown}`"
            ));
        };
        Ok(SqlCatalog { store, shown, name: name.to_owned() })
    }

    /// The catalog's URI with its password hidden.
    pub(super) fn shown(&self) -> &str {
        &self.shown
    }

    fn sqlite(path: &std::path::Path) -> Result<rusqlite::Connection> {
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|error| catalog_error(format_args!("create {}", parent.display()), error))?;
        }
        let connection = rusqlite::Connection::open(path)
            .map_err(|error| catalog_error(format_args!("open {}", path.display()), error))?;
        connection
            .busy_timeout(Duration::from_secs(30))
            .map_err(|error| catalog_error(format_args!("open {}", path.display()), error))?;
        connection
            .execute_batch(SCHEMA)
            .map_err(|error| catalog_error(format_args!("create the catalog's tables in {}", path.display()), error))?;
        Ok(connection)
    }

    /// The PostgreSQL session, opened (and the catalog's tables created) when there is none.
    async fn postgres<'a>(
        &self,
        url: &Secret,
        session: &'a tokio::sync::Mutex<Option<tokio_postgres::Client>>,
    ) -> Result<tokio::sync::MutexGuard<'a, Option<tokio_postgres::Client>>> {
        let mut guard = session.lock().await;
        if guard.as_ref().is_none_or(|client| client.is_closed()) {
            let client = crate::postgres::connect(url, Side::Target, &self.shown)
                .await
                .map_err(|error| error.context(format_args!("Iceberg catalog {}", self.shown)))?;
            if let Err(error) = client.batch_execute(SCHEMA).await {
                // Another writer creating the same tables at once.
                let raced = error.code().is_some_and(|code| {
                    *code == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                        || *code == tokio_postgres::error::SqlState::DUPLICATE_TABLE
                });
                if !raced {
                    return Err(catalog_error(format_args!("create the catalog's tables in {}", self.shown), error));
                }
            }
            *guard = Some(client);
        }
        Ok(guard)
    }

    /// The current metadata file of a table, if the catalog has it.
    pub(super) async fn metadata_of(&self, table: &TableName) -> Result<Option<String>> {
        let (namespace, name) = key(table);
        let failed = |error: &dyn std::fmt::Display| catalog_error(format_args!("read table {table}"), error);
        match &self.store {
            Store::Sqlite(path) => Self::sqlite(path)?
                .query_row(METADATA_OF, rusqlite::params![self.name, namespace, name], |row| {
                    row.get::<_, Option<String>>(0)
                })
                .optional()
                .map(Option::flatten)
                .map_err(|error| failed(&error)),
            Store::Postgres { url, session } => {
                let mut guard = self.postgres(url, session).await?;
                let client = guard.as_mut().expect("connected above");
                let row = client
                    .query_opt(&postgres_text(METADATA_OF), &[&self.name, &namespace, &name])
                    .await
                    .map_err(|error| failed(&error))?;
                Ok(row.and_then(|row| row.get::<_, Option<String>>(0)))
            }
        }
    }

    /// Every table of the catalog with its current metadata file.
    pub(super) async fn tables(&self) -> Result<Vec<(TableName, String)>> {
        let failed = |error: &dyn std::fmt::Display| catalog_error("list tables", error);
        let named = |namespace: String, name: String| TableName { namespace: Some(namespace), name };
        match &self.store {
            Store::Sqlite(path) => {
                let connection = Self::sqlite(path)?;
                let mut statement = connection.prepare(TABLES).map_err(|error| failed(&error))?;
                let rows = statement
                    .query_map(rusqlite::params![self.name], |row| {
                        Ok((named(row.get(0)?, row.get(1)?), row.get::<_, String>(2)?))
                    })
                    .map_err(|error| failed(&error))?;
                rows.collect::<std::result::Result<Vec<_>, _>>().map_err(|error| failed(&error))
            }
            Store::Postgres { url, session } => {
                let mut guard = self.postgres(url, session).await?;
                let client = guard.as_mut().expect("connected above");
                let rows = client.query(&postgres_text(TABLES), &[&self.name]).await.map_err(|error| failed(&error))?;
                Ok(rows.into_iter().map(|row| (named(row.get(0), row.get(1)), row.get(2))).collect())
            }
        }
    }

    /// The mark the job's stream recorded with its last group, if any.
    pub(super) async fn stream_mark(&self, job: &str) -> Result<Option<String>> {
        let failed = |error: &dyn std::fmt::Display| catalog_error(format_args!("read the stream of job {job}"), error);
        match &self.store {
            Store::Sqlite(path) => Self::sqlite(path)?
                .query_row(STREAM, rusqlite::params![self.name, job], |row| row.get::<_, String>(0))
                .optional()
                .map_err(|error| failed(&error)),
            Store::Postgres { url, session } => {
                let mut guard = self.postgres(url, session).await?;
                let client = guard.as_mut().expect("connected above");
                let row = client
                    .query_opt(&postgres_text(STREAM), &[&self.name, &job])
                    .await
                    .map_err(|error| failed(&error))?;
                Ok(row.map(|row| row.get::<_, String>(0)))
            }
        }
    }

    /// Forgets the job's stream mark (`sluice run --restart`).
    pub(super) async fn forget_stream(&self, job: &str) -> Result<()> {
        let failed =
            |error: &dyn std::fmt::Display| catalog_error(format_args!("forget the stream of job {job}"), error);
        match &self.store {
            Store::Sqlite(path) => Self::sqlite(path)?
                .execute(FORGET, rusqlite::params![self.name, job])
                .map(|_| ())
                .map_err(|error| failed(&error)),
            Store::Postgres { url, session } => {
                let mut guard = self.postgres(url, session).await?;
                let client = guard.as_mut().expect("connected above");
                client
                    .execute(&postgres_text(FORGET), &[&self.name, &job])
                    .await
                    .map(|_| ())
                    .map_err(|error| failed(&error))
            }
        }
    }

    /// Takes the job's fence for `fence`'s epoch (`Sink::claim`): from then on a commit of an
    /// older epoch is refused. Refused itself when the catalog holds a newer epoch.
    pub(super) async fn claim(&self, job: &str, fence: &Fence) -> Result<()> {
        let failed = |error: &dyn std::fmt::Display| catalog_error(format_args!("claim job {job}"), error);
        let epoch = fence.epoch as i64;
        match &self.store {
            Store::Sqlite(path) => {
                let mut connection = Self::sqlite(path)?;
                let transaction = connection
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|error| failed(&error))?;
                let held = transaction
                    .query_row(FENCE, rusqlite::params![job, fence.task], |row| row.get::<_, i64>(0))
                    .optional()
                    .map_err(|error| failed(&error))?;
                check_fence(job, fence, held)?;
                transaction
                    .execute(CLAIM, rusqlite::params![job, fence.task, epoch])
                    .map_err(|error| failed(&error))?;
                transaction.commit().map_err(|error| failed(&error))
            }
            Store::Postgres { url, session } => {
                let mut guard = self.postgres(url, session).await?;
                let client = guard.as_mut().expect("connected above");
                let transaction = client.transaction().await.map_err(|error| failed(&error))?;
                let held = transaction
                    .query_opt(&format!("{} FOR UPDATE", postgres_text(FENCE)), &[&job, &fence.task])
                    .await
                    .map_err(|error| failed(&error))?
                    .map(|row| row.get::<_, i64>(0));
                check_fence(job, fence, held)?;
                transaction
                    .execute(&postgres_text(CLAIM), &[&job, &fence.task, &epoch])
                    .await
                    .map_err(|error| failed(&error))?;
                transaction.commit().await.map_err(|error| failed(&error))
            }
        }
    }

    /// Applies `pointers` together, each only from the metadata file it names, with the stream
    /// mark of `commit.mark` (job, mark): all of them, or none and an `ErrorKind::Conflict`
    /// naming the first table another writer moved. With a fence, none when the catalog holds a
    /// newer epoch of the job's task (`ErrorKind::Fenced`).
    pub(super) async fn commit(&self, pointers: &[Pointer], commit: Commit<'_>) -> Result<()> {
        let Commit { fence, mark } = commit;
        let failed = |error: &dyn std::fmt::Display| catalog_error("commit", error);
        match &self.store {
            Store::Sqlite(path) => {
                let mut connection = Self::sqlite(path)?;
                let transaction = connection
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .map_err(|error| failed(&error))?;
                if let Some((job, fence)) = fence {
                    let held = transaction
                        .query_row(FENCE, rusqlite::params![job, fence.task], |row| row.get::<_, i64>(0))
                        .optional()
                        .map_err(|error| failed(&error))?;
                    check_fence(job, fence, held)?;
                }
                for pointer in pointers {
                    let (text, table, values) = statement(pointer);
                    let (namespace, name) = key(table);
                    if matches!(pointer, Pointer::Create { .. }) {
                        transaction
                            .execute(CREATE_NAMESPACE, rusqlite::params![self.name, namespace])
                            .map_err(|error| failed(&error))?;
                    }
                    let mut parameters: Vec<&dyn rusqlite::ToSql> = vec![&self.name, &namespace, &name];
                    parameters.extend(values.iter().map(|value| value as &dyn rusqlite::ToSql));
                    if transaction.execute(text, parameters.as_slice()).map_err(|error| failed(&error))? != 1 {
                        return Err(conflict(table, &self.name));
                    }
                }
                if let Some((job, mark)) = mark {
                    transaction
                        .execute(MARK, rusqlite::params![self.name, job, mark])
                        .map_err(|error| failed(&error))?;
                }
                transaction.commit().map_err(|error| failed(&error))
            }
            Store::Postgres { url, session } => {
                let mut guard = self.postgres(url, session).await?;
                let client = guard.as_mut().expect("connected above");
                let transaction = client.transaction().await.map_err(|error| failed(&error))?;
                if let Some((job, fence)) = fence {
                    let held = transaction
                        .query_opt(&format!("{} FOR SHARE", postgres_text(FENCE)), &[&job, &fence.task])
                        .await
                        .map_err(|error| failed(&error))?
                        .map(|row| row.get::<_, i64>(0));
                    check_fence(job, fence, held)?;
                }
                for pointer in pointers {
                    let (text, table, values) = statement(pointer);
                    let (namespace, name) = key(table);
                    if matches!(pointer, Pointer::Create { .. }) {
                        transaction
                            .execute(&postgres_text(CREATE_NAMESPACE), &[&self.name, &namespace])
                            .await
                            .map_err(|error| failed(&error))?;
                    }
                    let mut parameters: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                        vec![&self.name, &namespace, &name];
                    parameters.extend(values.iter().map(|value| value as &(dyn tokio_postgres::types::ToSql + Sync)));
                    let changed = transaction
                        .execute(&postgres_text(text), parameters.as_slice())
                        .await
                        .map_err(|error| failed(&error))?;
                    if changed != 1 {
                        return Err(conflict(table, &self.name));
                    }
                }
                if let Some((job, mark)) = mark {
                    transaction
                        .execute(&postgres_text(MARK), &[&self.name, &job, &mark])
                        .await
                        .map_err(|error| failed(&error))?;
                }
                transaction.commit().await.map_err(|error| failed(&error))
            }
        }
    }

    /// Removes a table from the catalog (its files stay).
    pub(super) async fn drop_table(&self, table: &TableName) -> Result<()> {
        let (namespace, name) = key(table);
        let failed = |error: &dyn std::fmt::Display| catalog_error(format_args!("drop table {table}"), error);
        match &self.store {
            Store::Sqlite(path) => Self::sqlite(path)?
                .execute(DROP_ANY, rusqlite::params![self.name, namespace, name])
                .map(|_| ())
                .map_err(|error| failed(&error)),
            Store::Postgres { url, session } => {
                let mut guard = self.postgres(url, session).await?;
                let client = guard.as_mut().expect("connected above");
                client
                    .execute(&postgres_text(DROP_ANY), &[&self.name, &namespace, &name])
                    .await
                    .map(|_| ())
                    .map_err(|error| failed(&error))
            }
        }
    }
}

/// What a commit checks and records besides its pointers: the job's fence (job, fence) and the
/// stream's mark (job, mark).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Commit<'a> {
    pub fence: Option<(&'a str, &'a Fence)>,
    pub mark: Option<(&'a str, &'a str)>,
}

/// Refuses a fence older than the epoch the catalog holds for its job's task (`held`).
fn check_fence(job: &str, fence: &Fence, held: Option<i64>) -> Result<()> {
    match held {
        Some(held) if held as u64 > fence.epoch => Err(fence.moved(job, held as u64)),
        _ => Ok(()),
    }
}

/// The catalog's namespace of a table: its database (`default` when it has none).
pub(super) fn namespace_of(table: &TableName) -> &str {
    table.namespace.as_deref().unwrap_or("default")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(directory: &tempfile::TempDir) -> SqlCatalog {
        let uri = format!("sqlite:///{}", directory.path().join("catalog.db").display());
        SqlCatalog::parse(&uri, "lake").unwrap()
    }

    #[tokio::test]
    async fn a_commit_moves_every_table_or_none() {
        let directory = tempfile::tempdir().unwrap();
        let catalog = catalog(&directory);
        let (a, b) = (TableName::parse("d.a"), TableName::parse("d.b"));
        let created = [
            Pointer::Create { table: a.clone(), metadata: "a1".into() },
            Pointer::Create { table: b.clone(), metadata: "b1".into() },
        ];
        catalog.commit(&created, Commit::default()).await.unwrap();
        // b moved meanwhile: neither moves.
        let raced = [
            Pointer::Move { table: a.clone(), from: "a1".into(), to: "a2".into() },
            Pointer::Move { table: b.clone(), from: "b0".into(), to: "b2".into() },
        ];
        assert_eq!(catalog.commit(&raced, Commit::default()).await.unwrap_err().kind(), ErrorKind::Conflict);
        assert_eq!(catalog.metadata_of(&a).await.unwrap().as_deref(), Some("a1"));
        let c = TableName::parse("d.c");
        let swapped = [
            Pointer::Create { table: c.clone(), metadata: "c1".into() },
            Pointer::Drop { table: a.clone(), metadata: "a1".into() },
        ];
        catalog.commit(&swapped, Commit { fence: None, mark: Some(("job", "m1")) }).await.unwrap();
        assert_eq!(catalog.stream_mark("job").await.unwrap().as_deref(), Some("m1"));
        // A group that moves no table records its mark alone.
        catalog.commit(&[], Commit { fence: None, mark: Some(("job", "m2")) }).await.unwrap();
        assert_eq!(catalog.stream_mark("job").await.unwrap().as_deref(), Some("m2"));
        catalog.forget_stream("job").await.unwrap();
        assert_eq!(catalog.stream_mark("job").await.unwrap(), None);
        assert_eq!(catalog.metadata_of(&a).await.unwrap(), None);
        assert_eq!(catalog.metadata_of(&c).await.unwrap().as_deref(), Some("c1"));
        assert_eq!(catalog.tables().await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_commit_of_an_older_epoch_is_refused_once_a_newer_one_claimed() {
        let directory = tempfile::tempdir().unwrap();
        let catalog = catalog(&directory);
        let (old, new) = (Fence { task: "j".into(), epoch: 3 }, Fence { task: "j".into(), epoch: 5 });
        let table = TableName::parse("d.a");
        catalog.claim("job", &old).await.unwrap();
        let created = [Pointer::Create { table: table.clone(), metadata: "a1".into() }];
        catalog.commit(&created, Commit { fence: Some(("job", &old)), mark: None }).await.unwrap();
        catalog.claim("job", &new).await.unwrap();
        let late = [Pointer::Move { table: table.clone(), from: "a1".into(), to: "a2".into() }];
        assert_eq!(
            catalog.commit(&late, Commit { fence: Some(("job", &old)), mark: None }).await.unwrap_err().kind(),
            ErrorKind::Fenced
        );
        assert_eq!(catalog.metadata_of(&table).await.unwrap().as_deref(), Some("a1"));
        assert_eq!(catalog.claim("job", &old).await.unwrap_err().kind(), ErrorKind::Fenced);
        catalog.commit(&late, Commit { fence: Some(("job", &new)), mark: None }).await.unwrap();
    }

    #[test]
    fn uris_name_sqlite_files_or_postgresql_databases_and_hide_passwords() {
        assert!(matches!(SqlCatalog::parse("sqlite:////data/c.db", "l").unwrap().store, Store::Sqlite(_)));
        let postgres = SqlCatalog::parse("postgresql+psycopg2://u:hunter22@h:5432/db", "l").unwrap();
        assert!(matches!(postgres.store, Store::Postgres { .. }));
        assert!(!postgres.shown().contains("hunter22"), "{}", postgres.shown());
        let refused = SqlCatalog::parse("mysql://u:hunter22@h/db", "l").unwrap_err();
        assert!(!refused.contains("hunter22"), "{refused}");
    }
}
