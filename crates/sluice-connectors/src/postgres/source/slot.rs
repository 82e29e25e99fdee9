//! The replication slot and publication a job's change stream reads through: created by the job
//! when it names none (named after the job) or named by the user (a DBA created them), checked
//! before every stream, never created again behind the job's back.

use serde::{Deserialize, Serialize};
use sluice_core::connector::CheckItem;
use sluice_core::secret::Secret;
use sluice_core::{Error, ErrorKind, Result, Side, TableName};
use tokio_postgres::Client;

use super::super::replication::{ReplicationConnection, ReplicationError};
use super::super::{endpoint, postgres_error, quote};
use super::catalog::{qualified, Described};
use super::{format_lsn, parse_lsn};

/// WAL held by a slot no one reads past which the log warns (1 GiB).
const HELD_WARNING_BYTES: f64 = (1u64 << 30) as f64;

/// The snapshot a new slot starts at, as its creating session exports it: its name for `SET
/// TRANSACTION SNAPSHOT`, and the slot's first position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedSnapshot {
    pub name: String,
    pub lsn: String,
}

/// An exported snapshot and the replication session that keeps it alive.
#[derive(Debug)]
pub(crate) struct Export {
    pub snapshot: ExportedSnapshot,
    pub session: ReplicationConnection,
}

/// The slot and publication of a job, and whether the job made them (a user's are never
/// altered or dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    pub slot: String,
    pub publication: String,
    pub own_slot: bool,
    pub own_publication: bool,
}

impl Replication {
    /// The job's names: the user's, or `sluice_<job>` (lower case letters, digits and `_`, at
    /// most 63 bytes, as slot names must be).
    pub fn named(job: &str, slot: Option<String>, publication: Option<String>) -> Replication {
        let derived = default_name(job);
        Replication {
            own_slot: slot.is_none(),
            own_publication: publication.is_none(),
            slot: slot.unwrap_or_else(|| derived.clone()),
            publication: publication.unwrap_or(derived),
        }
    }

    /// What `sluice check` says of logical replication on the source.
    pub(crate) async fn check(&self, client: &Client, server: &str, tables: &[Described]) -> Result<Vec<CheckItem>> {
        let error = |error| postgres_error(error, Side::Source, server, "read the replication settings");
        let row = client
            .query_one(
                "SELECT current_setting('wal_level'), \
                 (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), \
                 current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)::int, \
                 EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1), current_user::text",
                &[&self.slot],
            )
            .await
            .map_err(error)?;
        let (wal_level, replication, free, slot_exists, user): (String, Option<bool>, i32, bool, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
        let mut items = vec![
            CheckItem {
                what: "source wal_level".into(),
                ok: wal_level == "logical",
                detail: if wal_level == "logical" {
                    "logical".into()
                } else {
                    format!(
                        "wal_level is {wal_level}; set wal_level = logical in postgresql.conf and restart the server"
                    )
                },
            },
            CheckItem {
                what: "source REPLICATION attribute".into(),
                ok: replication == Some(true),
                detail: if replication == Some(true) {
                    format!("{user} may replicate")
                } else {
                    format!("{user} lacks the REPLICATION attribute; ALTER ROLE {} REPLICATION", quote(&user))
                },
            },
        ];
        items.push(match (slot_exists, self.own_slot) {
            (true, _) => self.held_wal(client, server).await?,
            (false, false) => CheckItem {
                what: "source replication slot".into(),
                ok: false,
                detail: format!(
                    "slot {} named in source.slot does not exist; create it: SELECT pg_create_logical_replication_slot('{}', 'pgoutput')",
                    self.slot, self.slot
                ),
            },
            (false, true) => CheckItem {
                what: "source replication slot".into(),
                ok: free > 0,
                detail: if free > 0 {
                    format!("slot {} is created at the job's first run ({free} free)", self.slot)
                } else {
                    "no free replication slot: raise max_replication_slots or drop an unused slot".into()
                },
            },
        });
        if !self.own_publication {
            let names: Vec<TableName> = tables.iter().map(|table| table.schema.name.clone()).collect();
            let via_root = self.via_root(client, server).await?;
            let problem = self.publication_problem(client, server, &names, via_root).await?;
            items.push(CheckItem {
                what: "source publication".into(),
                ok: problem.is_none(),
                detail: problem.unwrap_or_else(|| format!("publication {} covers the tables", self.publication)),
            });
        }
        Ok(items)
    }

    /// The WAL the slot holds, from its restart position to the server's current one; `None`
    /// when there is no such slot.
    pub(super) async fn held_bytes(&self, client: &Client, server: &str) -> Result<Option<u64>> {
        let row = client
            .query_opt(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .map_err(|error| postgres_error(error, Side::Source, server, "read the replication slot"))?;
        Ok(row.and_then(|row| row.get::<_, Option<f64>>(0)).map(|bytes| bytes.max(0.0) as u64))
    }

    /// The slot's line of `sluice check`: the WAL it holds, and whether a job reads it now (a
    /// slot no one reads keeps the server's WAL growing).
    async fn held_wal(&self, client: &Client, server: &str) -> Result<CheckItem> {
        let row = client
            .query_one(
                "SELECT active, pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)), \
                 pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .map_err(|error| postgres_error(error, Side::Source, server, "read the replication slot"))?;
        let (active, held, bytes): (bool, Option<String>, Option<f64>) = (row.get(0), row.get(1), row.get(2));
        let held = held.unwrap_or_else(|| "no".into());
        let detail = if active {
            format!("slot {} is being read; it holds {held} of WAL", self.slot)
        } else {
            // Every run starts with its slot unread: the log warns only of a slot left long.
            if bytes.unwrap_or(0.0) >= HELD_WARNING_BYTES {
                log::warn!("replication slot {} on {server} is not being read and holds {held} of WAL", self.slot);
            }
            format!(
                "slot {} is not being read and holds {held} of WAL, which grows until the job runs again (or `sluice reset` drops the slot)",
                self.slot
            )
        };
        Ok(CheckItem { what: "source replication slot".into(), ok: true, detail })
    }

    /// Whether the publication publishes a partitioned table's changes under the table's own
    /// name (`pubviaroot`) rather than its partitions'; `None` when it does not exist.
    async fn via_root(&self, client: &Client, server: &str) -> Result<Option<bool>> {
        Ok(client
            .query_opt("SELECT pubviaroot FROM pg_publication WHERE pubname = $1", &[&self.publication])
            .await
            .map_err(|error| postgres_error(error, Side::Source, server, "read the publications"))?
            .map(|row| row.get(0)))
    }

    /// What keeps the user's publication (`via_root` as `via_root` read it) from carrying
    /// `tables`' changes as the job reads them, with the statement that fixes it; `None` when
    /// nothing does.
    async fn publication_problem(
        &self,
        client: &Client,
        server: &str,
        tables: &[TableName],
        via_root: Option<bool>,
    ) -> Result<Option<String>> {
        if via_root == Some(false) {
            let partitioned = partitioned(client, server, tables).await?;
            if !partitioned.is_empty() {
                return Ok(Some(format!(
                    "publication {} publishes the partitioned table(s) {} through their partitions, whose changes the job does not take for the table's; ALTER PUBLICATION {} SET (publish_via_partition_root = true)",
                    self.publication,
                    partitioned.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
                    quote(&self.publication)
                )));
            }
        }
        let missing =
            if via_root.is_some() { self.unpublished(client, server, tables).await? } else { tables.to_vec() };
        Ok((!missing.is_empty()).then(|| self.missing_detail(&missing)))
    }

    fn missing_detail(&self, missing: &[TableName]) -> String {
        let list: Vec<String> = missing.iter().map(qualified).collect();
        format!(
            "publication {} does not publish {}; ALTER PUBLICATION {} ADD TABLE {}",
            self.publication,
            missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            quote(&self.publication),
            list.join(", ")
        )
    }

    /// The tables of `tables` the publication does not publish (all when it does not exist).
    /// A partitioned table is listed under its own name when published through its root.
    async fn unpublished(&self, client: &Client, server: &str, tables: &[TableName]) -> Result<Vec<TableName>> {
        let names: Vec<String> = tables.iter().map(qualified).collect();
        let missing = unpublished(client, server, &self.publication, &names).await?;
        Ok(tables
            .iter()
            .zip(&names)
            .filter(|(_, name)| missing.contains(name))
            .map(|(table, _)| table.clone())
            .collect())
    }

    /// Makes the job's own publication publish `tables` (created with them, or the missing
    /// ones added), or checks that the user's does. A table is published from the moment it is
    /// added: the caller does this before it reads a position the stream must cover from.
    ///
    /// A job whose tables are whole schemas (`app.*`) gets a publication of those schemas where
    /// the server has them (PostgreSQL 15) and the user may (a superuser): tables created in
    /// them later are published from their creation, and the stream takes them in.
    pub(crate) async fn publish(
        &self,
        client: &Client,
        server: &str,
        tables: &[TableName],
        schemas: Option<Vec<&str>>,
    ) -> Result<()> {
        let via_root = self.via_root(client, server).await?;
        if !self.own_publication {
            return match self.publication_problem(client, server, tables, via_root).await? {
                None => Ok(()),
                Some(problem) => Err(Error::new(ErrorKind::Config, problem).on(Side::Source)),
            };
        }
        let exists = via_root.is_some();
        let publication = quote(&self.publication);
        if via_root == Some(false) {
            // Made by an earlier version: partitions' changes would come under their names.
            let sql = format!("ALTER PUBLICATION {publication} SET (publish_via_partition_root = true)");
            client.batch_execute(&sql).await.map_err(|failure| {
                postgres_error(failure, Side::Source, server, "publish partitioned tables through their root")
            })?;
        }
        let missing = if exists { self.unpublished(client, server, tables).await? } else { tables.to_vec() };
        if let (false, Some(schemas)) = (exists, schemas) {
            let list: Vec<String> = schemas.iter().map(|schema| quote(schema)).collect();
            let sql = format!("CREATE PUBLICATION {publication} FOR TABLES IN SCHEMA {} {VIA_ROOT}", list.join(", "));
            match client.batch_execute(&sql).await {
                Ok(()) => return Ok(()),
                // An older server, or a user who is no superuser: the tables one by one.
                Err(error) => log::info!(
                    "publication {} lists the job's tables one by one (a publication of schemas {} was refused: {error}); tables created later are not published",
                    self.publication,
                    schemas.join(", ")
                ),
            }
        }
        let list: Vec<String> = missing.iter().map(qualified).collect();
        let sql = match (exists, list.is_empty()) {
            (false, true) => format!("CREATE PUBLICATION {publication} {VIA_ROOT}"),
            (false, false) => format!("CREATE PUBLICATION {publication} FOR TABLE {} {VIA_ROOT}", list.join(", ")),
            (true, true) => return Ok(()),
            (true, false) => format!("ALTER PUBLICATION {publication} ADD TABLE {}", list.join(", ")),
        };
        client.batch_execute(&sql).await.map_err(|failure| {
            postgres_error(failure, Side::Source, server, "publish the job's tables")
                .hint("the user must own the tables (or name a publication a DBA created in source.publication)")
        })
    }

    /// Makes the publication publish `tables` (the job's own) or checks that it does (the
    /// user's), then creates the slot if the job has none yet: the slot just created, with
    /// its position and exported snapshot.
    pub(crate) async fn prepare(
        &self,
        url: &Secret,
        client: &Client,
        server: &str,
        tables: &[TableName],
        schemas: Option<Vec<&str>>,
    ) -> Result<Option<Export>> {
        let error = |doing: &'static str| move |error| postgres_error(error, Side::Source, server, doing);
        self.publish(client, server, tables, schemas).await?;
        let existing = client
            .query_opt("SELECT 1 FROM pg_replication_slots WHERE slot_name = $1", &[&self.slot])
            .await
            .map_err(error("read the replication slots"))?;
        match existing {
            Some(_) => Ok(None),
            None if self.own_slot => self.create(url, server).await.map(Some),
            None => Err(Error::new(
                ErrorKind::Config,
                format!("replication slot {} named in source.slot does not exist", self.slot),
            )
            .on(Side::Source)
            .hint(format!("create it: SELECT pg_create_logical_replication_slot('{}', 'pgoutput')", self.slot))),
        }
    }

    /// Creates the job's slot on a replication session that exports the snapshot the slot
    /// starts at: reads that import it see exactly the rows before the slot's first change.
    /// The snapshot lives as long as the session, which the caller keeps idle until the copy
    /// is read.
    async fn create(&self, url: &Secret, server: &str) -> Result<Export> {
        let (config, mode, tls) = endpoint(url, Side::Source)?;
        let failed = |error: ReplicationError| {
            Error::new(ErrorKind::Read, format!("create replication slot {} on {server}: {error}", self.slot))
                .on(Side::Source)
                .hint("the user needs the REPLICATION attribute and a free replication slot")
        };
        let mut session = ReplicationConnection::connect(&config, mode, &tls).await.map_err(failed)?;
        // PostgreSQL 15 takes the options in parentheses; older servers only the keyword.
        let modern = session
            .server_version()
            .and_then(|version| version.split(['.', ' ']).next()?.parse::<u32>().ok())
            .is_some_and(|major| major >= 15);
        let options = if modern { "(SNAPSHOT 'export')" } else { "EXPORT_SNAPSHOT" };
        let slot = self.slot.replace('"', "\"\"");
        let created = session
            .simple_query(&format!("CREATE_REPLICATION_SLOT \"{slot}\" LOGICAL pgoutput {options}"))
            .await
            .map_err(failed)?;
        let lsn = created.get(0, "consistent_point").and_then(parse_lsn);
        let snapshot = created.get(0, "snapshot_name").map(str::to_owned);
        let (Some(lsn), Some(snapshot)) = (lsn, snapshot) else {
            return Err(failed(ReplicationError::Protocol(
                "CREATE_REPLICATION_SLOT returned no position or snapshot".into(),
            )));
        };
        log::info!(
            "created replication slot {} on {server} at {}, exporting snapshot {snapshot}",
            self.slot,
            format_lsn(lsn)
        );
        Ok(Export { snapshot: ExportedSnapshot { name: snapshot, lsn: format_lsn(lsn) }, session })
    }

    /// Before a stream opens: the slot still exists, decodes with `pgoutput` in this database,
    /// and has not confirmed past `after` (the changes between would be gone). A slot that was
    /// dropped is never created again here: a new one would skip what happened meanwhile.
    pub(crate) async fn verify(&self, client: &Client, server: &str, after: u64) -> Result<()> {
        let row = client
            .query_opt(
                "SELECT plugin::text, database::text = current_database(), confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .map_err(|error| postgres_error(error, Side::Source, server, "read the replication slot"))?;
        let Some(row) = row else {
            return Err(Error::new(
                ErrorKind::PositionLost,
                format!("replication slot {} on {server} is gone: the changes since the job's checkpoint {} cannot be read", self.slot, format_lsn(after)),
            )
            .on(Side::Source)
            .hint("reset the job and run it again (its copy is taken anew); sluice does not create a new slot by itself, which would skip changes"));
        };
        let (plugin, here, confirmed): (Option<String>, Option<bool>, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        if plugin.as_deref() != Some("pgoutput") || here != Some(true) {
            return Err(Error::new(
                ErrorKind::Config,
                format!("replication slot {} is not a pgoutput slot of this database", self.slot),
            )
            .on(Side::Source)
            .hint("name a logical slot created with pgoutput in the source database"));
        }
        if let Some(confirmed) = confirmed.as_deref().and_then(parse_lsn) {
            if confirmed > after {
                return Err(Error::new(
                    ErrorKind::PositionLost,
                    format!(
                        "replication slot {} has confirmed WAL position {} past the job's checkpoint {}: the changes between are gone (was the slot dropped and created again, or read by another client?)",
                        self.slot,
                        format_lsn(confirmed),
                        format_lsn(after)
                    ),
                )
                .on(Side::Source)
                .hint("reset the job and run it again; give each job its own slot"));
            }
        }
        Ok(())
    }
}

impl Replication {
    /// Drops the job's own slot and publication (`Source::forget`); a slot still read by a
    /// running job is an error saying so.
    pub(crate) async fn forget(&self, client: &Client, server: &str) -> Result<()> {
        if self.own_slot {
            let row = client
                .query_opt("SELECT active FROM pg_replication_slots WHERE slot_name = $1", &[&self.slot])
                .await
                .map_err(|error| postgres_error(error, Side::Source, server, "read the replication slots"))?;
            match row.map(|row| row.get::<_, bool>(0)) {
                Some(true) => {
                    return Err(Error::new(ErrorKind::Config, format!("replication slot {} is being read", self.slot))
                        .on(Side::Source)
                        .hint("stop the job's run first, then reset it"))
                }
                Some(false) => {
                    client.execute("SELECT pg_drop_replication_slot($1)", &[&self.slot]).await.map_err(|error| {
                        postgres_error(error, Side::Source, server, "drop the job's replication slot")
                    })?;
                    log::info!("dropped replication slot {} on {server}", self.slot);
                }
                None => {}
            }
        }
        if self.own_publication {
            client
                .batch_execute(&format!("DROP PUBLICATION IF EXISTS {}", quote(&self.publication)))
                .await
                .map_err(|error| postgres_error(error, Side::Source, server, "drop the job's publication"))?;
        }
        Ok(())
    }
}

/// `sluice_<job>`: the job's name in the characters a slot name may hold.
fn default_name(job: &str) -> String {
    let cleaned: String = job
        .chars()
        .map(|character| if character.is_ascii_alphanumeric() { character.to_ascii_lowercase() } else { '_' })
        .collect();
    let mut name = format!("sluice_{cleaned}");
    name.truncate(63);
    name
}

/// How the job's own publications publish a partitioned table: its partitions' changes under
/// its name, as the job reads it (PostgreSQL 13 and later).
const VIA_ROOT: &str = "WITH (publish_via_partition_root = true)";

/// The tables of `names` (quoted, qualified) that exist but `publication` does not publish
/// (every one when it does not exist). A table dropped meanwhile is not listed: it sends
/// nothing, and the stream ignores it (README).
pub(super) async fn unpublished(
    client: &Client,
    server: &str,
    publication: &str,
    names: &[String],
) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT name FROM unnest($1::text[]) AS name \
             WHERE to_regclass(name) IS NOT NULL AND NOT EXISTS ( \
                 SELECT 1 FROM pg_publication_tables p \
                 WHERE p.pubname = $2 AND to_regclass(format('%I.%I', p.schemaname, p.tablename)) = to_regclass(name))",
            &[&names, &publication],
        )
        .await
        .map_err(|error| postgres_error(error, Side::Source, server, "read the publication's tables"))?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// The partitioned tables among `tables` (one dropped meanwhile is not).
async fn partitioned(client: &Client, server: &str, tables: &[TableName]) -> Result<Vec<TableName>> {
    let names: Vec<String> = tables.iter().map(qualified).collect();
    let rows = client
        .query(
            "SELECT name FROM unnest($1::text[]) AS name WHERE (SELECT relkind FROM pg_class WHERE oid = to_regclass(name)) = 'p'",
            &[&names],
        )
        .await
        .map_err(|error| postgres_error(error, Side::Source, server, "find the partitioned tables"))?;
    let partitioned: Vec<&str> = rows.iter().map(|row| row.get(0)).collect();
    Ok(tables
        .iter()
        .zip(&names)
        .filter(|(_, name)| partitioned.contains(&name.as_str()))
        .map(|(table, _)| table.clone())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_come_from_the_job_and_user_names_are_kept() {
        let names = Replication::named("Orders-Sync.v2", None, Some("dba_pub".into()));
        assert_eq!(names.slot, "sluice_orders_sync_v2");
        assert_eq!(names.publication, "dba_pub");
        assert!(names.own_slot && !names.own_publication);
        assert_eq!(Replication::named(&"x".repeat(80), None, None).slot.len(), 63);
    }
}
