//! Resync on a server (`sluice job resync`): a table of a running snapshot+cdc job, damaged in
//! the target, is copied again while a mixed load runs on it and on the other table; the copy
//! replaces it whole, exactly once, and both tables end equal to the source. Into PostgreSQL
//! (the copy put in place in the group's transaction) and MySQL (one `RENAME TABLE`).

use crate::support;

use std::time::{Duration, Instant};

use support::cluster::start_server;
use support::workload::{assert_same, create_tables_sql, rows, source_position, stream_position, Load, Random};
use support::{mariadb, mysql_url, postgres_url, psql, unique_name, Workspace};

#[test]
fn a_table_copied_again_under_a_mixed_load_replaces_the_damaged_one_whole_and_exactly_once() {
    for target in ["postgres", "mysql"] {
        let database = unique_name(&format!("resync_{target}"));
        mariadb(&create_tables_sql(&database));
        // Rows enough that the copy takes many chunks of a tenth of a second each, far above
        // the keys the load inserts.
        mariadb(&format!(
            "INSERT INTO {database}.items SELECT seq, seq % 1000, CONCAT('bulk ', seq) FROM {database}.seq_1000001_to_1070000"
        ));
        let workspace = Workspace::new();
        let name = database.replace('_', "-");
        let namespace = database.clone() + "_copy";
        let target_url = if target == "postgres" { postgres_url() } else { mysql_url() };
        let environment = [("SLUICE_VAR_SOURCE", mysql_url()), ("SLUICE_VAR_TARGET", target_url)];
        let server = start_server(&workspace, "solo", None, &environment);
        // Small batches: each chunk of the copy is many batches, and many groups pass between
        // its chunks.
        let document = format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: {target}\n  url: ${{SLUICE_VAR_TARGET}}\n  namespace: {namespace}\nlimits: {{batch_rows: 20}}\n"
        );
        let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", &document)));
        assert_eq!(status, 201, "{body}");
        let converged = |what: &str| {
            let source = source_position();
            let deadline = Instant::now() + Duration::from_secs(120);
            while stream_position(target, &name).is_none_or(|at| at < source) {
                assert!(
                    Instant::now() < deadline,
                    "{target}, {what}: the stream did not reach {source:?}\n{}",
                    server.output()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        };
        let on_target = |sql: &str| if target == "postgres" { psql(sql) } else { mariadb(sql) };
        converged("the copy");
        // A MySQL target publishes the hidden copies by a rename just after the checkpoint that
        // ends the window: the tables are there once the rename is.
        support::wait_for("the copies to be published", Duration::from_secs(60), || {
            on_target(&format!(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{namespace}' AND table_name = 'items'"
            ))
            .trim()
                == "1"
        });
        let load = Load::start(&database, Random::from_environment("resync"), 150);
        // Damage the target's items: rows gone, values changed, a row the source never had. The
        // stream may stop at a change of a row gone; the resync starts it again. Only rows the
        // load changes too: a long statement over the bulk rows as well would deadlock with the
        // stream's groups on PostgreSQL.
        on_target(&format!(
            "DELETE FROM {namespace}.items WHERE id % 7 = 0 AND id < 1000000;
             UPDATE {namespace}.items SET note = 'damaged' WHERE id % 5 = 0 AND id < 1000000;
             INSERT INTO {namespace}.items VALUES (999999999, 1, 'stray')"
        ));
        let resynced =
            workspace.sluice(&["job", "--server", &server.url, "resync", &name, &format!("{database}.items")]);
        resynced.assert_code(0);
        assert!(resynced.stdout.contains("resync-"), "{}", resynced.all());
        // From the copy's start to its end the stream goes on: the longest time its committed
        // position stood still while the load ran is one chunk's read and one group, not the copy.
        let (begun, replaced) = (
            format!("resync: table {database}.items is copied again into"),
            format!("resync: table {database}.items is copied again and replaces"),
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        let (mut position, mut moved, mut longest, mut samples) = (None, Instant::now(), Duration::ZERO, 0);
        loop {
            let log = server.output();
            if log.contains(&replaced) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{target}: the copy did not replace the table (the stream's position {position:?} last moved {:?} ago):\n{log}",
                moved.elapsed()
            );
            if log.contains(&begun) {
                samples += 1;
                let now = stream_position(target, &name);
                if now != position {
                    (position, moved) = (now, Instant::now());
                }
                longest = longest.max(moved.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{target}: while the table was copied again ({samples} looks), the stream's position stood still {longest:?} at the longest"
        );
        assert!(samples >= 5, "{target}: the copy was too quick to watch the stream ({samples} looks)");
        assert!(longest < Duration::from_secs(3), "{target}: the stream stood still {longest:?} during the copy");
        load.stop();
        converged("the end of the load");
        let side = |side: &str, table: &str| {
            if side == "source" {
                rows("mariadb", &format!("{database}.{table}"), &columns(table))
            } else {
                rows(
                    if target == "postgres" { "postgres" } else { "mariadb" },
                    &format!("{namespace}.{table}"),
                    &columns(table),
                )
            }
        };
        for table in ["items", "accounts"] {
            assert_same(&format!("{target}: {table}"), &side("source", table), &side("target", table));
        }
        let log = server.output();
        assert_eq!(log.matches("is copied again and replaces").count(), 1, "{target}: replaced once:\n{log}");
        assert!(log.matches("resync: every row of table").count() == 1, "{target}: {log}");
        let copies = on_target(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema IN ('{namespace}', '{namespace}_sluice_resync') \
             AND table_name LIKE '\\_sluice%'"
        ));
        assert_eq!(copies.trim(), "0", "{target}: no copy or old table is left behind");
        // A table that is not the job's is refused, naming it.
        let (status, body) = server.call(
            "POST",
            &format!("/jobs/{name}/resync"),
            None,
            Some(("application/json", r#"{"tables": ["elsewhere.items"]}"#)),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains("elsewhere.items is not among job"), "{body}");
    }
}

fn columns(table: &str) -> Vec<&'static str> {
    if table == "items" {
        vec!["id", "v", "note"]
    } else {
        vec!["id", "balance"]
    }
}
