//! The SQL catalog: which metadata file is each table's current one, in the two tables Iceberg's
//! SQL (JDBC) catalog keeps — `iceberg_tables` and `iceberg_namespace_properties`, as pyiceberg,
//! Java's JdbcCatalog and iceberg-rust lay them out — in a SQLite file.
//!
//! A commit moves the pointers of several tables in one SQL transaction, each only from the
//! metadata file its writer started from: so a change stream's group lands in every table it
//! touches at once or not at all, and a writer that raced another fails instead of undoing it.
//! Sluice keeps this catalog itself over `rusqlite` because iceberg-rust's SQL catalog needs
//! sqlx, whose SQLite library cannot be linked beside rusqlite's (ARCHITECTURE.md).

use std::path::PathBuf;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use sluice_core::connector::Fence;
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

/// A catalog the job names: `catalog: {type: sql, uri: "sqlite:///…", name: …}`.
#[derive(Debug, Clone)]
pub(crate) struct SqlCatalog {
    path: PathBuf,
    /// The catalog's name (`catalog_name`): one file may hold several catalogs.
    pub name: String,
}

fn catalog_error(doing: impl std::fmt::Display, error: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Write, format!("Iceberg catalog: {doing}: {error}")).on(Side::Target)
}

impl SqlCatalog {
    /// The catalog of a SQLAlchemy-style URI: `sqlite:////absolute/path.db` or
    /// `sqlite:///relative/path.db`.
    pub(super) fn parse(uri: &str, name: &str) -> std::result::Result<SqlCatalog, String> {
        let Some(rest) = uri.strip_prefix("sqlite:///") else {
            return Err(format!(
                "expected sqlite:////absolute/path/catalog.db (four slashes) or sqlite:///relative/path.db, found `{uri}`; PostgreSQL catalogs are not supported yet"
            ));
        };
        if rest.is_empty() {
            return Err("the SQLite file's path is missing".into());
        }
        Ok(SqlCatalog { path: PathBuf::from(rest), name: name.to_owned() })
    }

    /// Where the catalog's file is.
    pub(super) fn file(&self) -> &std::path::Path {
        &self.path
    }

    fn connect(&self) -> Result<Connection> {
        if let Some(parent) = self.path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|error| catalog_error(format_args!("create {}", parent.display()), error))?;
        }
        let connection = Connection::open(&self.path)
            .map_err(|error| catalog_error(format_args!("open {}", self.path.display()), error))?;
        connection
            .busy_timeout(Duration::from_secs(30))
            .map_err(|error| catalog_error(format_args!("open {}", self.path.display()), error))?;
        connection
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS iceberg_tables (
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
                    job TEXT NOT NULL,
                    task TEXT NOT NULL,
                    epoch INTEGER NOT NULL,
                    PRIMARY KEY (job, task));",
            )
            .map_err(|error| {
                catalog_error(format_args!("create the catalog's tables in {}", self.path.display()), error)
            })?;
        Ok(connection)
    }

    /// The current metadata file of a table, if the catalog has it.
    pub(super) fn metadata_of(&self, table: &TableName) -> Result<Option<String>> {
        let connection = self.connect()?;
        connection
            .query_row(
                "SELECT metadata_location FROM iceberg_tables
                 WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3",
                params![self.name, namespace_of(table), table.name],
                |row| row.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(|error| catalog_error(format_args!("read table {table}"), error))
    }

    /// Every table of the catalog with its current metadata file.
    pub(super) fn tables(&self) -> Result<Vec<(TableName, String)>> {
        let connection = self.connect()?;
        let mut statement = connection
            .prepare(
                "SELECT table_namespace, table_name, metadata_location FROM iceberg_tables
                 WHERE catalog_name = ?1 AND metadata_location IS NOT NULL
                   AND (iceberg_type IS NULL OR iceberg_type = 'TABLE')",
            )
            .map_err(|error| catalog_error("list tables", error))?;
        let rows = statement
            .query_map(params![self.name], |row| {
                Ok((
                    TableName { namespace: Some(row.get::<_, String>(0)?), name: row.get(1)? },
                    row.get::<_, String>(2)?,
                ))
            })
            .map_err(|error| catalog_error("list tables", error))?;
        rows.collect::<std::result::Result<Vec<_>, _>>().map_err(|error| catalog_error("list tables", error))
    }

    /// Takes the job's fence for `fence`'s epoch (`Sink::claim`): from then on a commit of an
    /// older epoch is refused. Refused itself when the catalog holds a newer epoch.
    pub(super) fn claim(&self, job: &str, fence: &Fence) -> Result<()> {
        let mut connection = self.connect()?;
        let transaction = connection
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|error| catalog_error("begin a claim", error))?;
        check_fence(&transaction, job, fence)?;
        transaction
            .execute(
                "INSERT INTO sluice_fences (job, task, epoch) VALUES (?1, ?2, ?3)
                 ON CONFLICT (job, task) DO UPDATE SET epoch = excluded.epoch",
                params![job, fence.task, fence.epoch as i64],
            )
            .map_err(|error| catalog_error(format_args!("claim job {job}"), error))?;
        transaction.commit().map_err(|error| catalog_error("commit a claim", error))
    }

    /// Applies `pointers` together, each only from the metadata file it names: all of them, or
    /// none and an `ErrorKind::Conflict` naming the first table another writer moved. With a
    /// fence, none when the catalog holds a newer epoch of the job's task (`ErrorKind::Fenced`).
    pub(super) fn commit(&self, pointers: &[Pointer], fence: Option<(&str, &Fence)>) -> Result<()> {
        let mut connection = self.connect()?;
        let transaction = connection
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|error| catalog_error("begin a commit", error))?;
        if let Some((job, fence)) = fence {
            check_fence(&transaction, job, fence)?;
        }
        for pointer in pointers {
            let (table, changed) = match pointer {
                Pointer::Create { table, metadata } => {
                    transaction
                        .execute(
                            "INSERT OR IGNORE INTO iceberg_namespace_properties
                             (catalog_name, namespace, property_key, property_value) VALUES (?1, ?2, 'exists', 'true')",
                            params![self.name, namespace_of(table)],
                        )
                        .map_err(|error| catalog_error(format_args!("create namespace of {table}"), error))?;
                    let changed = transaction.execute(
                        "INSERT OR IGNORE INTO iceberg_tables
                         (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location, iceberg_type)
                         VALUES (?1, ?2, ?3, ?4, NULL, 'TABLE')",
                        params![self.name, namespace_of(table), table.name, metadata],
                    );
                    (table, changed)
                }
                Pointer::Move { table, from, to } => {
                    let changed = transaction.execute(
                        "UPDATE iceberg_tables SET metadata_location = ?4, previous_metadata_location = ?5
                         WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3 AND metadata_location = ?5",
                        params![self.name, namespace_of(table), table.name, to, from],
                    );
                    (table, changed)
                }
                Pointer::Drop { table, metadata } => {
                    let changed = transaction.execute(
                        "DELETE FROM iceberg_tables
                         WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3 AND metadata_location = ?4",
                        params![self.name, namespace_of(table), table.name, metadata],
                    );
                    (table, changed)
                }
            };
            match changed {
                Ok(1) => {}
                Ok(_) => {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "Iceberg table {table} was changed by another writer meanwhile (catalog {})",
                            self.name
                        ),
                    )
                    .on(Side::Target))
                }
                Err(error) => return Err(catalog_error(format_args!("commit table {table}"), error)),
            }
        }
        transaction.commit().map_err(|error| catalog_error("commit", error))
    }

    /// Removes a table from the catalog (its files stay).
    pub(super) fn drop_table(&self, table: &TableName) -> Result<()> {
        let connection = self.connect()?;
        connection
            .execute(
                "DELETE FROM iceberg_tables WHERE catalog_name = ?1 AND table_namespace = ?2 AND table_name = ?3",
                params![self.name, namespace_of(table), table.name],
            )
            .map_err(|error| catalog_error(format_args!("drop table {table}"), error))?;
        Ok(())
    }
}

/// Refuses a fence older than the epoch the catalog holds for its job's task.
fn check_fence(transaction: &rusqlite::Transaction<'_>, job: &str, fence: &Fence) -> Result<()> {
    let held: Option<i64> = transaction
        .query_row("SELECT epoch FROM sluice_fences WHERE job = ?1 AND task = ?2", params![job, fence.task], |row| {
            row.get(0)
        })
        .optional()
        .map_err(|error| catalog_error(format_args!("read the fence of job {job}"), error))?;
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

    #[test]
    fn a_commit_moves_every_table_or_none() {
        let directory = tempfile::tempdir().unwrap();
        let uri = format!("sqlite:///{}", directory.path().join("catalog.db").display());
        let catalog = SqlCatalog::parse(&uri, "lake").unwrap();
        let (a, b) = (TableName::parse("d.a"), TableName::parse("d.b"));
        catalog
            .commit(
                &[
                    Pointer::Create { table: a.clone(), metadata: "a1".into() },
                    Pointer::Create { table: b.clone(), metadata: "b1".into() },
                ],
                None,
            )
            .unwrap();
        // b moved meanwhile: neither moves.
        let raced = catalog.commit(
            &[
                Pointer::Move { table: a.clone(), from: "a1".into(), to: "a2".into() },
                Pointer::Move { table: b.clone(), from: "b0".into(), to: "b2".into() },
            ],
            None,
        );
        assert_eq!(raced.unwrap_err().kind(), ErrorKind::Conflict);
        assert_eq!(catalog.metadata_of(&a).unwrap().as_deref(), Some("a1"));
        let c = TableName::parse("d.c");
        catalog
            .commit(
                &[
                    Pointer::Create { table: c.clone(), metadata: "c1".into() },
                    Pointer::Drop { table: a.clone(), metadata: "a1".into() },
                ],
                None,
            )
            .unwrap();
        assert_eq!(catalog.metadata_of(&a).unwrap(), None);
        assert_eq!(catalog.metadata_of(&c).unwrap().as_deref(), Some("c1"));
        assert_eq!(catalog.tables().unwrap().len(), 2);
        assert!(SqlCatalog::parse("postgresql://x/y", "lake").is_err());
    }

    #[test]
    fn a_commit_of_an_older_epoch_is_refused_once_a_newer_one_claimed() {
        let directory = tempfile::tempdir().unwrap();
        let uri = format!("sqlite:///{}", directory.path().join("catalog.db").display());
        let catalog = SqlCatalog::parse(&uri, "lake").unwrap();
        let (old, new) = (Fence { task: "j".into(), epoch: 3 }, Fence { task: "j".into(), epoch: 5 });
        let table = TableName::parse("d.a");
        catalog.claim("job", &old).unwrap();
        catalog
            .commit(&[Pointer::Create { table: table.clone(), metadata: "a1".into() }], Some(("job", &old)))
            .unwrap();
        catalog.claim("job", &new).unwrap();
        let late = Pointer::Move { table: table.clone(), from: "a1".into(), to: "a2".into() };
        let refused = catalog.commit(std::slice::from_ref(&late), Some(("job", &old))).unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::Fenced);
        assert_eq!(catalog.metadata_of(&table).unwrap().as_deref(), Some("a1"));
        assert_eq!(catalog.claim("job", &old).unwrap_err().kind(), ErrorKind::Fenced);
        catalog.commit(&[late], Some(("job", &new))).unwrap();
    }
}
