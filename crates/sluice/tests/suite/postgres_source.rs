//! PostgreSQL as a source through the real binary and a real PostgreSQL 15 with
//! `wal_level = logical`: the copy in the slot's snapshot, the stream of its slot, exactly once
//! through kills, into PostgreSQL and MariaDB.

use crate::support;

use std::time::Duration;

use support::postgres_server::PostgresServer;
use support::postgres_source::{
    create_tables_sql, load, stored_stream_lsn, stream_lsn, stream_lsn_in, target_sql, SourceDatabase, ACCOUNTS,
};
use support::workload::{assert_same, Random};
use support::{
    canary, kill, lake, mariadb, mysql_url, postgres_url, psql, wait_for, wait_running, Guard, Run, Workspace,
};

/// `sluice run` of `job` from `source` into `target`, in the background.
fn start(workspace: &Workspace, job: &std::path::Path, source: &SourceDatabase, target: &str) -> Guard {
    workspace.start_run(job, &source.url(), target, &["--summary-json", "summary.json"])
}

fn job_file(workspace: &Workspace, name: &str, schema: &str, target: &str, extra: &str) -> std::path::PathBuf {
    workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\n\
             target:\n  type: {target}\n  url: ${{TARGET}}\n  create_tables: true\n{extra}"
        ),
    )
}

/// A `snapshot+cdc` job of `schema`'s tables into PostgreSQL through the user's `publication`.
fn job_reading_publication(
    workspace: &Workspace,
    file: &str,
    name: &str,
    schema: &str,
    publication: &str,
) -> std::path::PathBuf {
    workspace.write(
        file,
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\n  \
             publication: {publication}\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n  create_tables: true\n"
        ),
    )
}

/// `sluice ARGUMENTS` run to its end, `${SOURCE}` being `source` and `${TARGET}` the test
/// PostgreSQL.
fn sluice_into_postgres(workspace: &Workspace, arguments: &[&str], source: &SourceDatabase) -> Run {
    Run::from(workspace.command(arguments).env("SOURCE", source.url()).env("TARGET", postgres_url()).output().unwrap())
}

/// `sluice check` of `job` from `source` into the test PostgreSQL.
fn check(workspace: &Workspace, job: &std::path::Path, source: &SourceDatabase) -> Run {
    sluice_into_postgres(workspace, &["check", job.to_str().unwrap()], source)
}

/// `sluice verify` of `job` from `source` into the target at `target_url`, with more arguments.
fn verify(
    workspace: &Workspace,
    job: &std::path::Path,
    source: &SourceDatabase,
    target_url: &str,
    extra: &[&str],
) -> Run {
    let mut arguments = vec!["verify", job.to_str().unwrap(), "--json"];
    arguments.extend_from_slice(extra);
    Run::from(workspace.command(&arguments).env("SOURCE", source.url()).env("TARGET", target_url).output().unwrap())
}

/// Waits until the job's stream has stored a position at or past the source's WAL position now.
fn wait_converged(job: &str, source: &SourceDatabase, run: &mut Guard) {
    wait_converged_in(&psql, job, source, run);
}

/// Waits until the job's stream has stored, in the target `target` runs SQL on, a position at or
/// past the source's WAL position now.
fn wait_converged_in(target: &dyn Fn(&str) -> String, job: &str, source: &SourceDatabase, run: &mut Guard) {
    let now = source.wal_position();
    // Generous: under the whole suite's load a stream of millions of changes (the large
    // transaction's) takes minutes, not the seconds it takes alone.
    wait_running("the stream to reach the source", Duration::from_secs(240), run, || {
        stored_stream_lsn(target, job).is_some_and(|at| at >= now)
    });
}

#[test]
fn a_postgres_source_copies_and_streams_into_postgres_exactly_once_through_kills() {
    copy_and_stream_through_kills("postgres", &postgres_url());
}

#[test]
fn a_postgres_source_copies_and_streams_into_mariadb_exactly_once_through_kills() {
    copy_and_stream_through_kills("mysql", &mysql_url());
}

/// `snapshot+cdc` under a load of transfers, key moves, updates beside out-of-line values and
/// a keyless table, killed once in the copy and once in the stream: the target ends equal to
/// the source, and no transfer is ever seen half-applied once the tables are visible.
fn copy_and_stream_through_kills(target: &str, target_url: &str) {
    let source = SourceDatabase::create(if target == "postgres" { "pgsrc" } else { "pgsrcmy" });
    let schema = source.name.clone();
    source.sql(&create_tables_sql(&schema, 40_000));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    // Slow enough that a kill lands in the copy.
    let job = job_file(
        &workspace,
        &name,
        &schema,
        target,
        "limits: {split_rows: 5000, batch_rows: 500, rows_per_sec: 20000}\nparallelism: 2\n",
    );
    let load = load(&source, &schema, Random::from_environment("pg-source-kills"), 300, 1_000_000);
    let on_target = |sql: &str| target_sql(target, sql);
    let stored = || stream_lsn_in(target, &name);

    let mut run = start(&workspace, &job, &source, target_url);
    let copied = || {
        let sql = format!("SELECT coalesce(sum(rows_written), 0) FROM sluice.checkpoints WHERE job = '{name}'");
        let exists = "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'sluice' AND table_name = 'checkpoints'";
        on_target(exists).trim() != "0" && on_target(&sql).trim().parse::<u64>().unwrap_or(0) > 0
    };
    wait_running("part of the copy", Duration::from_secs(60), &mut run, copied);
    kill(&mut run);
    assert!(stored().is_none(), "the first kill lands in the copy");

    let mut run = start(&workspace, &job, &source, target_url);
    wait_running("the stream", Duration::from_secs(120), &mut run, || stored().is_some());
    // A sampler: once the tables are visible, no transfer is ever half-applied.
    let total = (ACCOUNTS * 1000).to_string();
    let mut samples = 0;
    let visible = format!(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{schema}' AND table_name = 'accounts'"
    );
    let mut sample = || {
        // Published whole once the stream passes the copy's end; never seen before.
        if on_target(&visible).trim() == "1" {
            let sum = on_target(&format!("SELECT sum(balance) FROM {schema}.accounts"));
            assert_eq!(sum.trim(), total, "a transfer is half-applied in the target");
            samples += 1;
        }
    };
    let started = source.wal_position();
    wait_running("the stream to move on", Duration::from_secs(60), &mut run, || {
        sample();
        stored().is_some_and(|at| at > started)
    });
    kill(&mut run);

    let mut run = start(&workspace, &job, &source, target_url);
    let again = source.wal_position();
    wait_running("the stream again", Duration::from_secs(60), &mut run, || {
        sample();
        stored().is_some_and(|at| at > again)
    });
    load.stop();
    let stopped = source.wal_position();
    wait_running("the stream to reach the source", Duration::from_secs(90), &mut run, || {
        sample();
        stored().is_some_and(|at| at >= stopped)
    });
    assert!(samples > 0, "the sampler saw the tables while the load ran");

    // Columns both targets print alike (the large values by their digest); PostgreSQL names
    // an array's and a uuid's text form, MariaDB holds them as text.
    let text = |on_postgres: bool, column: &str| match on_postgres {
        true => format!("coalesce({column}::text, 'NULL')"),
        false => format!("coalesce({column}, 'NULL')"),
    };
    for (table, columns, order) in [
        ("accounts", "id, balance", "id"),
        ("items", "id, v, coalesce(note, 'NULL'), {tags}, {uid}", "id"),
        ("docs", "id, small, md5(body)", "id"),
        ("pairs", "a, b, v", "a, b"),
        ("events", "k, note", "k, note"),
    ] {
        let sql = |on_postgres: bool| {
            let columns =
                columns.replace("{tags}", &text(on_postgres, "tags")).replace("{uid}", &text(on_postgres, "uid"));
            format!("SELECT concat_ws('|', {columns}) FROM {schema}.{table} ORDER BY {order}")
        };
        let lines = |text: String| text.lines().map(str::to_owned).collect::<Vec<_>>();
        assert_same(table, &lines(source.sql(&sql(true))), &lines(on_target(&sql(target == "postgres"))));
    }
    assert_eq!(on_target(&format!("SELECT sum(balance) FROM {schema}.accounts")).trim(), total);
    // `sluice verify` of the running job agrees, table by table, through the target's own reader.
    let verified = verify(&workspace, &job, &source, target_url, &[]);
    assert_eq!(verified.code, 0, "verify of a PostgreSQL-sourced job into {target}:\n{}", verified.all());
    let report: serde_json::Value = serde_json::from_str(&verified.stdout).unwrap();
    assert_eq!(report["tables"].as_array().map(Vec::len), Some(5), "{}", verified.stdout);
    // A row deleted from the target behind the job's back: found, and checked again once the
    // idle stream has passed the source's position (it moves on with the source's WAL).
    on_target(&format!("DELETE FROM {schema}.accounts WHERE id = 3"));
    let accounts = format!("{schema}.accounts");
    let found = verify(&workspace, &job, &source, target_url, &["--tables", &accounts, "--settle-secs", "30"]);
    let report: serde_json::Value = serde_json::from_str(&found.stdout).unwrap();
    assert_eq!(found.code, 1, "{}", found.all());
    assert_eq!(report["tables"][0]["differences"][0]["key"]["id"], 3, "{}", found.stdout);
    // The slot has confirmed what the target stored, and keeps no more.
    let confirmed = source
        .sql(&format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'sluice_{schema}'"));
    assert!(
        support::postgres_source::lsn(confirmed.trim()).is_some_and(|at| at <= stored().unwrap()),
        "the slot confirms no more than the target stored: {confirmed}"
    );
    drop(run);
    assert!(!String::from_utf8_lossy(&std::fs::read(workspace.path("summary.json")).unwrap_or_default())
        .contains(&canary()));
}

#[test]
fn postgres_values_reach_mariadb_through_the_copy_and_the_stream() {
    let source = SourceDatabase::create("pgtypes");
    let schema = source.name.clone();
    let columns = "id int PRIMARY KEY, i8 bigint, n numeric(20,5), f8 float8, b bool, v varchar(10), t text, \
                   raw bytea, d date, ts timestamp(6), tz timestamptz, tm time, j jsonb, u uuid, ip inet, arr int[], \
                   m mood, span interval, far timestamptz, bits bit(3)";
    let row = |id: u32| {
        format!(
            "({id}, -9223372036854775808, 123456789012345.12345, 1.5e300, true, 'café', repeat('long ', 20000), '\\x00ff10', \
             '2024-02-29', '2024-02-29 23:59:59.000001', '2024-02-29 12:00:00.5+02', '23:59:59.999999', '{{\"a\": [1, 2.50]}}', \
             'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '192.168.0.1/24', '{{1,NULL,3}}', 'ok', '1 day 02:00:00', '2100-01-01 00:00:00+00', B'101')"
        )
    };
    source.sql(&format!(
        "CREATE SCHEMA {schema}; CREATE TYPE {schema}.mood AS ENUM ('sad', 'ok'); SET search_path = {schema};
         CREATE TABLE every_type ({columns}); INSERT INTO every_type VALUES {}, (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);",
        row(1)
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = job_file(&workspace, &name, &schema, "mysql", "");
    let mut run = start(&workspace, &job, &source, &mysql_url());
    let streaming = || {
        mariadb(&format!("SELECT count(*) FROM sluice.checkpoints WHERE job = '{name}' AND task = 'stream'")).trim()
            == "1"
    };
    wait_running("the stream", Duration::from_secs(60), &mut run, || {
        mariadb("SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'sluice' AND TABLE_NAME = 'checkpoints'")
            .trim()
            == "1"
            && streaming()
    });
    source.sql(&format!(
        "SET search_path = {schema}; INSERT INTO every_type VALUES {}; UPDATE every_type SET v = 'x' WHERE id = 2",
        row(3)
    ));
    wait_running("the streamed row", Duration::from_secs(60), &mut run, || {
        mariadb(&format!("SELECT count(*) FROM {schema}.every_type WHERE id = 3 OR v = 'x'")).trim() == "2"
    });
    let rows = mariadb(&format!(
        "SELECT id, i8, n, f8, b, v, length(t), hex(raw), d, ts, tz, tm, j, u, ip, arr, m, span, far, bits FROM {schema}.every_type ORDER BY id"
    ));
    let full = "-9223372036854775808\t123456789012345.12345\t1.5e300\t1\tcafé\t100000\t00FF10\t2024-02-29\t2024-02-29 23:59:59.000001\t\
                2024-02-29 10:00:00.500000\t23:59:59.999999\t{\"a\": [1, 2.50]}\ta0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\t192.168.0.1/24\t{1,NULL,3}\tok\t1 day 02:00:00\t2100-01-01 00:00:00.000000\t";
    let expected: Vec<String> =
        vec![format!("1\t{full}"), format!("2\t{}x{}", "NULL\t".repeat(4), "\tNULL".repeat(14)), format!("3\t{full}")];
    let actual: Vec<String> = rows.lines().map(|line| line.to_owned()).collect();
    // The bit(3) column's bytes, as MariaDB prints BIT, are checked apart.
    let trimmed: Vec<String> = actual
        .iter()
        .map(|line| line.rsplit_once('\t').map_or(line.clone(), |(head, _)| format!("{head}\t")))
        .collect();
    let expected_trimmed: Vec<String> = expected
        .iter()
        .map(|line| line.rsplit_once('\t').map_or(line.clone(), |(head, _)| format!("{head}\t")))
        .collect();
    assert_eq!(trimmed, expected_trimmed, "every value equal in MariaDB");
    assert_eq!(mariadb(&format!("SELECT bits + 0 FROM {schema}.every_type ORDER BY id")), "5\nNULL\n5\n");
    assert!(!run.stderr_text().contains(&canary()));
    // `sluice verify` across the two engines finds every value equal as its type says.
    let verified = verify(&workspace, &job, &source, &mysql_url(), &[]);
    assert_eq!(verified.code, 0, "{}", verified.all());
}

#[test]
fn a_dropped_slot_stops_the_job_naming_it_and_reset_drops_the_jobs_own() {
    let source = SourceDatabase::create("pgslot");
    let schema = source.name.clone();
    source.sql(&format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY, v int); INSERT INTO {schema}.t VALUES (1, 1)"));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let slot = format!("sluice_{schema}");
    let job = job_file(&workspace, &name, &schema, "postgres", "");
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    assert_eq!(source.slots(), vec![slot.clone()]);

    // The slot is dropped under the running job: its reader ended, the slot gone before the job
    // reconnects. A new slot would skip what happened meanwhile: the job stops instead.
    let drop_slot = format!(
        "DO $$ BEGIN LOOP PERFORM pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active_pid IS NOT NULL; \
         BEGIN PERFORM pg_drop_replication_slot('{slot}'); EXIT; EXCEPTION WHEN object_in_use THEN PERFORM pg_sleep(0.01); END; END LOOP; END $$"
    );
    source.sql(&drop_slot);
    source.sql(&format!("INSERT INTO {schema}.t VALUES (2, 2)"));
    let output = run.into_inner().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the job stops:\n{stderr}");
    assert!(stderr.contains(&format!("replication slot {slot}")) && stderr.contains("gone"), "{stderr}");
    assert!(source.slots().is_empty(), "no slot is created again behind the job's back");

    // Reset forgets the job's progress and drops what it owns at the source; the next run
    // makes a new slot and copies again.
    let reset = sluice_into_postgres(&workspace, &["reset", job.to_str().unwrap()], &source);
    reset.assert_code(0);
    assert!(source.slots().is_empty(), "reset drops the slot its planning made");
    assert_eq!(source.sql(&format!("SELECT count(*) FROM pg_publication WHERE pubname = '{slot}'")).trim(), "0");
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream after the reset", Duration::from_secs(60), &mut run, || {
        stream_lsn(&name).is_some() && psql(&format!("SELECT count(*) FROM {schema}.t")).trim() == "2"
    });
    assert_eq!(source.slots(), vec![slot]);
}

#[test]
fn a_large_transaction_rolled_back_leaves_nothing_and_committed_lands_once() {
    // A server of its own: while these transactions are open no other test could create a
    // replication slot on the shared server (a logical slot waits for every transaction running
    // when it is created), and their million-row applies would load its target beside them.
    let server = PostgresServer::start();
    let source = SourceDatabase::create_on(server.url(), "pglarge");
    let schema = source.name.clone();
    source.sql(&format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY, v text)"));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: cdc\nsource:\n  type: postgres\n  url: \"${{SOURCE}}?options=-c%20logical_decoding_work_mem%3D4MB\"\n  tables: [\"{schema}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n  create_tables: true\nlimits: {{batch_rows: 2000}}\n"
        ),
    );
    let target = |sql: &str| server.sql(sql);
    let mut run = start(&workspace, &job, &source, server.url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stored_stream_lsn(&target, &name).is_some());
    const ROWS: u32 = 1_000_000;
    // The job's replication session streams a transaction once it holds 4 MB of changes
    // (`logical_decoding_work_mem`, from the URL's options), so these are sent before they end:
    // the second transaction also rolls back a subtransaction of 100,000 rows (about 15 MB of
    // changes to the server), streamed before its rollback.
    source.sql(&format!(
        "BEGIN; INSERT INTO {schema}.t SELECT g, 'rolled back ' || g FROM generate_series(1, {ROWS}) g; ROLLBACK;
         BEGIN; INSERT INTO {schema}.t SELECT g, 'kept ' || g FROM generate_series(1, {ROWS}) g; UPDATE {schema}.t SET v = v || '!' WHERE id % 2 = 0;
         SAVEPOINT s; INSERT INTO {schema}.t SELECT g, 'in a rolled back savepoint' FROM generate_series({ROWS} + 1, {ROWS} + 100000) g;
         UPDATE {schema}.t SET v = 'undone' WHERE id <= 10; ROLLBACK TO s; COMMIT;"
    ));
    wait_converged_in(&target, &name, &source, &mut run);
    assert_eq!(
        server.sql(&format!("SELECT count(*), count(*) FILTER (WHERE v LIKE 'kept %'), count(*) FILTER (WHERE v LIKE '%!') FROM {schema}.t")),
        format!("{ROWS}|{ROWS}|{}\n", ROWS / 2)
    );
    // The server streamed both transactions before they ended (protocol 2): what the stream
    // kept of the rolled-back one was dropped, the committed one applied once.
    let streamed = source.sql(&format!(
        "SELECT stream_txns FROM pg_stat_replication_slots s JOIN pg_replication_slots r USING (slot_name) WHERE r.database = '{}'",
        source.name
    ));
    assert!(streamed.trim().parse::<u64>().is_ok_and(|count| count >= 2), "streamed transactions: {streamed:?}");
    // Stopped, the job's slot still holds WAL: `check` says so.
    drop(run);
    source.wait_slots_released();
    let check = Run::from(
        workspace
            .command(&["check", job.to_str().unwrap()])
            .env("SOURCE", source.url())
            .env("TARGET", server.url())
            .output()
            .unwrap(),
    );
    check.assert_code(0);
    assert!(check.all().contains("is not being read and holds"), "{}", check.all());
}

#[test]
fn postgres_values_reach_postgres_equal_through_the_copy_and_the_stream() {
    let source = SourceDatabase::create("pgvalues");
    let schema = source.name.clone();
    let columns = "id int GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, n numeric, big numeric, d date, ts timestamp, tz timestamptz, \
                   tt timetz, span interval, m money, x xml, tv tsvector, vb varbit(20), mac macaddr, net cidr, \
                   grid int[][], r int4range, tr tstzrange, j json, doc jsonb, f4 real, txt text, g int GENERATED ALWAYS AS (id * 2) STORED";
    let values = |n: &str| {
        format!(
            "({n}, 'NaN', (repeat('9', 1000) || '.' || repeat('1', 20))::numeric, 'infinity', '0044-03-15 10:00:00 BC', '-infinity', \
             '10:00:00+05:30', '1 year 2 mons -3 days 04:05:06.789', 12.34, '<a>b</a>', 'the quick brown fox', B'10110', \
             '08:00:2b:01:02:03', '10.1.0.0/16', '{{{{1,2}},{{NULL,4}}}}', '[1,10)', '[2024-01-01 00:00:00+00,)', '{{\"k\": [1, 2.50, \"é\"]}}', \
             '{{\"b\": 1, \"a\": null}}', 'NaN', E'tab\\there\\nline \\\\ back')"
        )
    };
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema}; CREATE TABLE every_type ({columns});
         INSERT INTO every_type (id, n, big, d, ts, tz, tt, span, m, x, tv, vb, mac, net, grid, r, tr, j, doc, f4, txt) VALUES {};
         INSERT INTO every_type (id) VALUES (2);",
        values("1")
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = job_file(&workspace, &name, &schema, "postgres", "");
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    source.sql(&format!(
        "SET search_path = {schema}; INSERT INTO every_type (id, n, big, d, ts, tz, tt, span, m, x, tv, vb, mac, net, grid, r, tr, j, doc, f4, txt) VALUES {};
         UPDATE every_type SET n = 'Infinity', d = '5874897-12-31' WHERE id = 2;",
        values("3")
    ));
    wait_converged(&name, &source, &mut run);
    // Every value equal; the generated column, which the stream does not carry, is computed by
    // the target from the same expression.
    let listed = "id, n, big, d, ts, tz, tt, span, m, x, tv, vb, mac, net, grid, r, tr, j, doc, f4, txt, g";
    let rows = |sql: &dyn Fn(&str) -> String| -> Vec<String> {
        sql(&format!(
            "SELECT replace(t::text, chr(10), '\\n') FROM (SELECT {listed} FROM {schema}.every_type) t ORDER BY id"
        ))
        .lines()
        .map(str::to_owned)
        .collect()
    };
    let expected = rows(&|sql: &str| source.sql(sql));
    assert_eq!(expected.len(), 3);
    assert_eq!(rows(&psql), expected, "every value equal in PostgreSQL");
    // `sluice verify` of the running job sees them equal too (NaN, infinities, years past 9999
    // kept as the server's text on both sides): no false difference.
    let verified = verify(&workspace, &job, &source, &postgres_url(), &[]);
    assert_eq!(verified.code, 0, "{}", verified.all());
    // The types are the source's own.
    let types = |sql: &dyn Fn(&str) -> String| {
        sql(&format!(
            "SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ',' ORDER BY attnum) FROM pg_attribute \
             WHERE attrelid = '{schema}.every_type'::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = ''"
        ))
    };
    assert_eq!(types(&psql), types(&|sql: &str| source.sql(sql)));
    let generated = format!(
        "SELECT attname || ' ' || format_type(atttypid, atttypmod) || ' ' || pg_get_expr(adbin, adrelid) FROM pg_attribute \
         JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum WHERE attrelid = '{schema}.every_type'::regclass AND attgenerated = 's'"
    );
    assert_eq!(psql(&generated), "g integer (id * 2)\n");
    // The identity's sequence stands past the ids the stream wrote once the table was there:
    // an application inserting without an id after a cutover gets a new one.
    source.sql(&format!("INSERT INTO {schema}.every_type (id, txt) VALUES (10, 'streamed')"));
    wait_converged(&name, &source, &mut run);
    drop(run);
    let inserted = psql(&format!("INSERT INTO {schema}.every_type (txt) VALUES ('app') RETURNING id"));
    assert_eq!(inserted.lines().next(), Some("11"), "{inserted}");
}

/// A table the job maps unchanged goes from PostgreSQL to PostgreSQL as the COPY text the source
/// wrote, no value decoded and encoded again: every value equal (escapes, NULLs, NaN, BC dates,
/// infinities, arrays, bytea); a row the target table refuses is found among them and kept as a
/// dirty record naming its key and the rule; a job that filters the table decodes its rows as
/// before, with the same result.
#[test]
fn copy_text_passes_from_postgres_to_postgres_unread_and_a_refused_row_is_still_found() {
    const ROWS: i64 = 3_000;
    let source = SourceDatabase::create("pgpass");
    let schema = source.name.clone();
    let columns =
        "id int PRIMARY KEY, n numeric, at timestamptz, d date, span interval, f float8, raw bytea, doc jsonb, \
                   grid int[], s text, nothing text";
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema}; CREATE TABLE items ({columns});
         INSERT INTO items SELECT g, CASE WHEN g % 100 = 0 THEN 'NaN' ELSE g / 7.0 END,
                '2024-01-01 00:00:00+00'::timestamptz + g * interval '1.5 seconds',
                CASE WHEN g = 5 THEN '0044-03-15 BC'::date WHEN g = 6 THEN 'infinity'::date ELSE '2024-02-29'::date + g END,
                make_interval(months => g, secs => (g / 3.0)::float8), CASE WHEN g = 7 THEN '-Infinity' ELSE g / 3.0 END,
                decode(lpad(to_hex(g), 8, '0'), 'hex'), jsonb_build_object('g', g, 'e', 'é'), ARRAY[[g, NULL], [1, 2]],
                E'tab\\there\\nline \\\\ back ' || g, NULL
         FROM generate_series(1, {ROWS}) g;"
    ));
    // The target's table is the user's, with a rule one row breaks.
    psql(&format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {schema}.items ({columns}, CONSTRAINT not_1234 CHECK (id <> 1234))"
    ));
    let workspace = Workspace::new();
    let job = |name: &str, extra: &str| {
        workspace.write(
            &format!("{name}.yaml"),
            &format!(
                "name: {name}\nmode: snapshot\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.items\"]\n\
                 target:\n  type: postgres\n  url: ${{TARGET}}\n  create_tables: true\n{extra}\
                 limits: {{split_rows: 1000, batch_rows: 250}}\nerrors: {{max_dirty_records: 10}}\n"
            ),
        )
    };
    let rows = |sql: &dyn Fn(&str) -> String, schema: &str| -> Vec<String> {
        sql(&format!("SELECT replace(t::text, chr(10), '\\n') FROM {schema}.items t WHERE id <> 1234 ORDER BY id"))
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let expected = rows(&|sql: &str| source.sql(sql), &schema);
    assert_eq!(expected.len(), ROWS as usize - 1);

    let unread = job("unread", "");
    let run = sluice_into_postgres(&workspace, &["run", unread.to_str().unwrap()], &source);
    run.assert_code(0);
    assert!(run.stderr.contains("not decoded: the job maps the table unchanged"), "{}", run.stderr);
    assert_eq!(rows(&psql, &schema), expected, "every value equal");
    let dirty = std::fs::read_to_string(workspace.path(".sluice/unread/dirty.jsonl")).unwrap_or_default();
    let records: Vec<serde_json::Value> = dirty.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len(), 1, "{dirty}");
    assert_eq!(records[0]["key"], "id=1234", "{dirty}");
    assert!(records[0]["reason"].as_str().is_some_and(|reason| reason.contains("not_1234")), "{dirty}");

    // Filtered (the filter keeps every row), the rows are decoded: the same end.
    let filtered = format!("{schema}_filtered");
    psql(&format!(
        "CREATE SCHEMA {filtered}; CREATE TABLE {filtered}.items ({columns}, CONSTRAINT not_1234 CHECK (id <> 1234))"
    ));
    let decoded = job(
        "decoded",
        &format!(
            "  namespace: {filtered}\ntransform:\n  - {{source_table: \"{schema}\\\\.items\", filter: \"id > 0\"}}\n"
        ),
    );
    let run = sluice_into_postgres(&workspace, &["run", decoded.to_str().unwrap()], &source);
    run.assert_code(0);
    assert!(!run.stderr.contains("not decoded"), "{}", run.stderr);
    assert_eq!(rows(&psql, &filtered), expected, "every value equal through the decoded path");
}

#[test]
fn tables_the_stream_cannot_identify_are_refused_with_the_fix_and_keyless_full_ones_stream_exactly() {
    let source = SourceDatabase::create("pgkeyless");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE unnamed (a int, b text); INSERT INTO unnamed VALUES (1, 'x');
         CREATE TABLE logged (a int, b text); ALTER TABLE logged REPLICA IDENTITY FULL;
         INSERT INTO logged VALUES (1, 'x'), (1, 'x'), (2, 'y');"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = job_file(&workspace, &name, &schema, "postgres", "");
    let check = check(&workspace, &job, &source);
    assert_ne!(check.code, 0);
    let fix = format!("ALTER TABLE \"{schema}\".\"unnamed\" REPLICA IDENTITY FULL");
    assert!(check.all().contains(&fix) && !check.all().contains("\"logged\" REPLICA"), "{}", check.all());
    let refused = start(&workspace, &job, &source, &postgres_url());
    let output = refused.into_inner().wait_with_output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains(&fix), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(source.slots().is_empty(), "nothing is made at the source for a refused job");

    source.sql(&format!("DROP TABLE {schema}.unnamed"));
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    source.sql(&format!(
        "SET search_path = {schema}; INSERT INTO logged VALUES (3, 'z'), (1, 'x');
         DELETE FROM logged WHERE ctid = (SELECT ctid FROM logged WHERE a = 1 LIMIT 1);
         UPDATE logged SET b = 'w' WHERE a = 2;"
    ));
    wait_converged(&name, &source, &mut run);
    let rows = |sql: &dyn Fn(&str) -> String| sql(&format!("SELECT a, b FROM {schema}.logged ORDER BY a, b"));
    assert_eq!(rows(&psql), rows(&|sql: &str| source.sql(sql)));
    assert_eq!(rows(&psql), "1|x\n1|x\n2|w\n3|z\n");

    // A table created in the schema while the job runs is published from its creation (the
    // job's tables are the whole schema) and created in the target before its first rows.
    source.sql(&format!(
        "SET search_path = {schema}; CREATE TABLE later (id int PRIMARY KEY, v text DEFAULT 'd');
         INSERT INTO later (id) VALUES (1), (2); UPDATE later SET v = 'w' WHERE id = 1;"
    ));
    wait_converged(&name, &source, &mut run);
    assert_eq!(psql(&format!("SELECT id, v FROM {schema}.later ORDER BY id")), "1|w\n2|d\n");
}

/// A table without a key is read whole by several connections at once, each a range of its
/// pages, all in one snapshot: in `snapshot+cdc` the slot's (its duplicate rows and rows
/// updated while it is read land once, then its changes stream), in `snapshot` one the first
/// connection exports. Updates while the copy runs move rows to other pages: reads at different
/// moments would read some twice and others not at all.
#[test]
fn a_keyless_table_is_read_by_several_connections_in_one_snapshot_exactly_once() {
    let source = SourceDatabase::create("pgctid");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE events (a int, b text); ALTER TABLE events REPLICA IDENTITY FULL;
         INSERT INTO events SELECT g % 5000, repeat('v', 50 + g % 7) FROM generate_series(1, 40000) g; ANALYZE events;
         CREATE TABLE keyed (id int PRIMARY KEY); INSERT INTO keyed SELECT generate_series(1, 40000); ANALYZE keyed;
         CREATE TABLE composite (region text, id int, v text, PRIMARY KEY (region, id));
         INSERT INTO composite SELECT 'r' || (g % 7), g, 'v' || g FROM generate_series(1, 30000) g; ANALYZE composite;"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let limits = "limits: { split_rows: 5000, batch_rows: 1000 }\n";
    let rows = |sql: &dyn Fn(&str) -> String, schema: &str| {
        sql(&format!("SELECT count(*), count(DISTINCT (a, b)), sum(a), sum(length(b)) FROM {schema}.events"))
    };
    // Rows moved while the copies read: each update writes the row's new version elsewhere.
    let writing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let writer = {
        let (writing, url, schema) = (writing.clone(), source.url(), schema.clone());
        std::thread::spawn(move || {
            let mut round = 0;
            while writing.load(std::sync::atomic::Ordering::Relaxed) {
                round += 1;
                support::psql_at(&url, &format!("UPDATE {schema}.events SET b = b || 'x' WHERE a = {}", round % 5000));
                // Paced, not waited on: a load beside the copies, not a stress of the machine.
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };

    let copy = workspace.write(
        "copy.yaml",
        &format!(
            "name: {name}-copy\nmode: snapshot\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n  create_tables: true\n  namespace: {schema}_copy\n{limits}"
        ),
    );
    let copied = sluice_into_postgres(&workspace, &["run", copy.to_str().unwrap()], &source);
    assert_eq!(copied.code, 0, "{}", copied.all());
    assert!(copied.all().contains("read by 4 connections at once"), "{}", copied.all());
    // The updates change b alone: the count and the sum of a hold at every moment.
    let invariant =
        |sql: &dyn Fn(&str) -> String, schema: &str| sql(&format!("SELECT count(*), sum(a) FROM {schema}.events"));
    assert_eq!(
        invariant(&psql, &format!("{schema}_copy")),
        "40000|99980000\n",
        "every row once, whatever moved meanwhile"
    );
    // A table with a key is cut into key ranges by its estimated rows, one task each.
    let tasks =
        psql(&format!("SELECT count(*) FROM sluice.checkpoints WHERE job = '{name}-copy' AND task LIKE '%keyed#%'"));
    assert!(tasks.trim().parse::<u32>().unwrap() >= 4, "40,000 rows in splits of 5,000: {tasks}");
    // A composite text key by sampled bounds: every row once.
    let tasks = psql(&format!(
        "SELECT count(*) FROM sluice.checkpoints WHERE job = '{name}-copy' AND task LIKE '%composite#%'"
    ));
    assert!(tasks.trim().parse::<u32>().unwrap() >= 3, "30,000 rows in splits of 5,000: {tasks}");
    let composite = |sql: &dyn Fn(&str) -> String, schema: &str| {
        sql(&format!("SELECT count(*), count(DISTINCT (region, id)), sum(id), max(v) FROM {schema}.composite"))
    };
    assert_eq!(composite(&psql, &format!("{schema}_copy")), composite(&|sql: &str| source.sql(sql), &schema));

    let job = job_file(&workspace, &name, &schema, "postgres", limits);
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    source.sql(&format!(
        "SET search_path = {schema}; INSERT INTO events VALUES (1, 'new'), (1, 'new'); DELETE FROM events WHERE a = 2"
    ));
    wait_converged(&name, &source, &mut run);
    assert_eq!(rows(&psql, &schema), rows(&|sql: &str| source.sql(sql), &schema));
    assert!(run.stderr_text().contains("read by 4 connections at once"), "{}", run.stderr_text());
}

/// A partitioned table is one table to the job: copied through its root, its partitions'
/// changes streamed under its name (the job's publication publishes it through its root), and
/// created in the target as one table; a user's publication that publishes it through its
/// partitions is refused with the fix.
#[test]
fn a_partitioned_table_copies_and_streams_as_one_table_through_its_root() {
    let source = SourceDatabase::create("pgparts");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE m (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
         CREATE TABLE m_east PARTITION OF m FOR VALUES IN ('east');
         CREATE TABLE m_west PARTITION OF m FOR VALUES IN ('west') PARTITION BY RANGE (id);
         CREATE TABLE m_west_low PARTITION OF m_west FOR VALUES FROM (MINVALUE) TO (1000);
         CREATE TABLE m_west_high PARTITION OF m_west FOR VALUES FROM (1000) TO (MAXVALUE);
         CREATE TABLE m_other PARTITION OF m DEFAULT;
         INSERT INTO m SELECT g, (ARRAY['east', 'west', 'north'])[g % 3 + 1], 'v' || g FROM generate_series(1, 3000) g;
         CREATE PUBLICATION {schema}_by_partitions FOR TABLE m;
         CREATE PUBLICATION sluice_{schema} FOR TABLE m;"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");

    // The user's publication sends the partitions' changes under their own names.
    let theirs = job_reading_publication(&workspace, "theirs.yaml", &name, &schema, &format!("{schema}_by_partitions"));
    let refused = check(&workspace, &theirs, &source);
    assert_ne!(refused.code, 0, "{}", refused.all());
    let fix = format!("ALTER PUBLICATION \"{schema}_by_partitions\" SET (publish_via_partition_root = true)");
    assert!(refused.all().contains(&fix) && refused.all().contains(&format!("{schema}.m")), "{}", refused.all());

    // The job's own publication, as an earlier version made it (through the partitions), is
    // made to publish through the root.
    let job = job_file(&workspace, &name, &schema, "postgres", "");
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    let via_root = format!("SELECT pubviaroot FROM pg_publication WHERE pubname = 'sluice_{schema}'");
    assert_eq!(source.sql(&via_root), "t\n");
    source.sql(&format!(
        "SET search_path = {schema};
         INSERT INTO m VALUES (5000, 'east', 'new'), (5001, 'west', 'new'), (5002, 'south', 'new');
         INSERT INTO m_west_low VALUES (-1, 'west', 'straight into a partition');
         UPDATE m SET v = v || '!' WHERE id % 10 = 0;
         UPDATE m SET region = 'west' WHERE id IN (3, 6, 9) AND region = 'east';
         UPDATE m SET id = id + 2000 WHERE id IN (1, 4) AND region = 'west';
         DELETE FROM m WHERE id % 7 = 0;"
    ));
    wait_converged(&name, &source, &mut run);
    let rows = |sql: &dyn Fn(&str) -> String| sql(&format!("SELECT id, region, v FROM {schema}.m ORDER BY id, region"));
    let expected = rows(&|sql: &str| source.sql(sql));
    assert!(expected.lines().count() > 2500, "{expected}");
    assert_eq!(rows(&psql), expected, "the target's table equals the partitioned one");
    // One table in the target: no partition of the source became a table of its own.
    assert_eq!(
        psql(&format!("SELECT string_agg(table_name, ',' ORDER BY table_name) FROM information_schema.tables WHERE table_schema = '{schema}'")),
        "m\n"
    );
}

/// Tables and columns whose names need quoting (mixed case, spaces, reserved words, a double
/// quote) copy and stream into PostgreSQL and MariaDB under their exact names, keys moved too.
#[test]
fn identifiers_that_need_quoting_copy_and_stream_exactly_into_postgres_and_mariadb() {
    for target in ["postgres", "mysql"] {
        let source = SourceDatabase::create("pgquoted");
        let schema = source.name.clone();
        source.sql(&format!(
            "CREATE SCHEMA {schema}; SET search_path = {schema};
             CREATE TABLE \"Order Items\" (\"Id\" int PRIMARY KEY, \"Select\" text, \"from\" int, \"Mixed Case\" text, \"quote\"\"d\" text);
             CREATE TABLE \"user\" (id int, \"Group\" text, PRIMARY KEY (id, \"Group\"));
             INSERT INTO \"Order Items\" SELECT g, 's' || g, g, 'm' || g, 'q' || g FROM generate_series(1, 500) g;
             INSERT INTO \"user\" SELECT g, 'g' || (g % 3) FROM generate_series(1, 300) g;"
        ));
        let workspace = Workspace::new();
        let name = schema.replace('_', "-");
        let job = job_file(&workspace, &name, &schema, target, "");
        let target_url = if target == "postgres" { postgres_url() } else { mysql_url() };
        let mut run = start(&workspace, &job, &source, &target_url);
        wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn_in(target, &name).is_some());
        source.sql(&format!(
            "SET search_path = {schema};
             INSERT INTO \"Order Items\" VALUES (501, 'new', 0, 'M', 'Q\"');
             UPDATE \"Order Items\" SET \"Select\" = 'changed', \"quote\"\"d\" = NULL WHERE \"Id\" % 10 = 0;
             UPDATE \"Order Items\" SET \"Id\" = \"Id\" + 1000 WHERE \"Id\" IN (3, 7);
             DELETE FROM \"Order Items\" WHERE \"Id\" % 9 = 0;
             UPDATE \"user\" SET \"Group\" = 'moved' WHERE id % 5 = 0;
             DELETE FROM \"user\" WHERE id % 7 = 0;"
        ));
        wait_converged_in(&|sql: &str| target_sql(target, sql), &name, &source, &mut run);
        let [items, users] = if target == "postgres" {
            [
                format!("SELECT \"Id\", \"Select\", \"from\", \"Mixed Case\", coalesce(\"quote\"\"d\", 'NULL') FROM {schema}.\"Order Items\" ORDER BY 1"),
                format!("SELECT id, \"Group\" FROM {schema}.\"user\" ORDER BY 1, 2"),
            ]
        } else {
            [
                format!("SELECT `Id`, `Select`, `from`, `Mixed Case`, coalesce(`quote\"d`, 'NULL') FROM {schema}.`Order Items` ORDER BY 1"),
                format!("SELECT id, `Group` FROM {schema}.`user` ORDER BY 1, 2"),
            ]
        };
        let source_items = source.sql(&format!(
            "SELECT \"Id\", \"Select\", \"from\", \"Mixed Case\", coalesce(\"quote\"\"d\", 'NULL') FROM {schema}.\"Order Items\" ORDER BY 1"
        ));
        let source_users = source.sql(&format!("SELECT id, \"Group\" FROM {schema}.\"user\" ORDER BY 1, 2"));
        let same_form = |text: String| text.replace('\t', "|");
        assert!(source_items.contains("501|new|0|M|Q\"") && source_items.lines().count() > 400, "{source_items}");
        assert_eq!(same_form(target_sql(target, &items)), source_items, "\"Order Items\" in {target}");
        assert_eq!(same_form(target_sql(target, &users)), source_users, "\"user\" in {target}");
    }
}

/// One snapshot of a PostgreSQL source into three file targets at once (`targets:`): SQLite,
/// JSON Lines and Parquet each hold every row once, texts with tabs, line breaks, quotes and
/// non-ASCII letters exact, NULLs as NULLs, and a keyless table's duplicate rows.
#[test]
fn a_postgres_snapshot_lands_in_sqlite_json_lines_and_parquet_at_once() {
    const ROWS: i64 = 2_000;
    let source = SourceDatabase::create("pgfiles");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE items (id bigint PRIMARY KEY, n numeric(12,3), s text, at timestamptz, ok bool, raw bytea, doc jsonb, tags text[], nothing text);
         INSERT INTO items SELECT g, g / 8.0, E'tab\\there \"q\" line\\nbreak é ' || g, '2024-01-01 00:00:00+00'::timestamptz + g * interval '1 minute',
                g % 2 = 0, decode(lpad(to_hex(g), 8, '0'), 'hex'), jsonb_build_object('g', g), ARRAY['a', 'b' || g], NULL
         FROM generate_series(1, {ROWS}) g;
         CREATE TABLE pairs (a int, b text); INSERT INTO pairs VALUES (1, 'x'), (1, 'x'), (2, NULL);"
    ));
    let expected_text = |id: i64| format!("tab\there \"q\" line\nbreak é {id}");
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: files\nmode: snapshot\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\nlimits: {{split_rows: 500}}\n\
             targets:\n  - {{name: local, type: sqlite, path: out.db}}\n  - {{name: lines, type: jsonl, path: out-jsonl}}\n  \
             - {{name: columns, type: parquet, path: out-parquet}}\n"
        ),
    );
    let run =
        Run::from(workspace.command(&["run", job.to_str().unwrap()]).env("SOURCE", source.url()).output().unwrap());
    run.assert_code(0);

    // SQLite has no schemas: the tables keep their own names there; the file targets name each
    // table's directory `schema.table`.
    let sqlite = rusqlite::Connection::open(workspace.path("out.db")).expect("the SQLite target");
    let (count, distinct, nulls): (i64, i64, i64) = sqlite
        .query_row("SELECT count(*), count(DISTINCT id), count(\"nothing\") FROM items", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    assert_eq!((count, distinct, nulls), (ROWS, ROWS, 0), "SQLite: every row once, NULLs kept");
    let text: String = sqlite.query_row("SELECT s FROM items WHERE id = 7", [], |row| row.get(0)).unwrap();
    assert_eq!(text, expected_text(7), "SQLite");
    let keyless: i64 =
        sqlite.query_row("SELECT count(*) FROM pairs WHERE a = 1 AND b = 'x'", [], |row| row.get(0)).unwrap();
    assert_eq!(keyless, 2, "SQLite: a keyless table's duplicates");

    let mut ids = Vec::new();
    for part in std::fs::read_dir(workspace.path(&format!("out-jsonl/{schema}.items"))).expect("the JSON Lines table") {
        let path = part.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "jsonl") {
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let row: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
                let id = row["id"].as_i64().expect("an integer id");
                if id == 7 {
                    assert_eq!(row["s"], expected_text(7), "JSON Lines");
                    assert!(row["nothing"].is_null(), "JSON Lines: {row}");
                }
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=ROWS).collect::<Vec<_>>(), "JSON Lines: every row once");

    let directory = workspace.path(&format!("out-parquet/{schema}.items"));
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(directory.join("_manifest.json")).unwrap()).unwrap();
    let mut rows = 0;
    for part in manifest["parts"].as_array().expect("a list of parts") {
        let file = std::fs::File::open(directory.join(part["path"].as_str().unwrap())).unwrap();
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap().build().unwrap();
        rows += reader.map(|batch| batch.unwrap().num_rows()).sum::<usize>();
    }
    assert_eq!(rows as i64, ROWS, "Parquet: every row once");
}

/// `snapshot+cdc` from PostgreSQL into Delta tables under transfers, inserts, updates, deletes
/// and key moves, killed once while streaming: read by `deltalake` (not by Sluice), each table
/// at its latest version equals the source, and every version of the accounts keeps the
/// transfers' sum (no transaction half-applied, no copy half-published).
#[test]
fn a_postgres_source_copies_and_streams_into_delta_tables_exactly_once() {
    let source = SourceDatabase::create("pgdelta");
    let schema = source.name.clone();
    source.sql(&create_tables_sql(&schema, 5_000));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  \
             tables: [\"{schema}.accounts\", \"{schema}.items\"]\ntarget:\n  type: delta\n  path: lake\n  \
             commit_interval_secs: 1\nlimits: {{split_rows: 1000, batch_rows: 250}}\n"
        ),
    );
    let lake_table = |table: &str| workspace.path(&format!("lake/{schema}.{table}"));
    support::postgres_source::stream_through_a_kill(&workspace, &job, &source, &schema, "pg-source-delta", || {
        lake::stream_lsn(&workspace.path("lake"), &name)
    });

    for (table, columns, expected) in source.accounts_and_items(&schema) {
        assert_same(table, &expected, &lake::rows(&lake_table(table), columns));
    }
    lake::accounts_versions(&lake_table("accounts"), 1, ACCOUNTS, (ACCOUNTS * 1000) as i64);
}

/// `snapshot+cdc` from PostgreSQL into NATS as Debezium events: each row's snapshot event once,
/// then its changes in order (an update with the new values, a delete with the old key, a key
/// moved as one update from the old key to the new, keyed by the new), killed once while
/// streaming.
#[test]
fn a_postgres_source_streams_debezium_events_into_nats_exactly_once() {
    let nats = support::nats::NatsServer::start();
    let source = SourceDatabase::create("pgnats");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {schema}.items (id int PRIMARY KEY, v int NOT NULL, s text);
         INSERT INTO {schema}.items SELECT g, g, 's' || g FROM generate_series(1, 200) g;"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\n\
             target:\n  type: nats\n  url: ${{TARGET}}\n  stream: EVENTS\n  subject: \"pg.{{db}}.{{table}}\"\n  format: debezium\n"
        ),
    );
    let events = || -> Vec<serde_json::Value> {
        if nats.message_count("EVENTS").is_none() {
            return Vec::new();
        }
        nats.messages("EVENTS").into_iter().map(|message| message.payload).collect()
    };
    let id_of = |event: &serde_json::Value| {
        let image = if event["op"] == "d" { &event["before"] } else { &event["after"] };
        image["id"].as_i64().unwrap_or_else(|| panic!("an event without its row's id: {event}"))
    };
    let mut run = start(&workspace, &job, &source, &nats.url());
    wait_running("the snapshot's events", Duration::from_secs(60), &mut run, || events().len() >= 200);
    source.sql(&format!("UPDATE {schema}.items SET v = v + 1000 WHERE id <= 10"));
    wait_running("the first change's events", Duration::from_secs(60), &mut run, || {
        events().iter().filter(|event| event["op"] == "u").count() == 10
    });
    kill(&mut run);
    source.sql(&format!(
        "SET search_path = {schema}; DELETE FROM items WHERE id = 50; INSERT INTO items VALUES (201, 1, 'new');
         UPDATE items SET id = 1000 WHERE id = 20; UPDATE items SET s = NULL WHERE id = 30;
         ALTER TABLE items REPLICA IDENTITY FULL; UPDATE items SET v = 77 WHERE id = 60;"
    ));
    let mut run = start(&workspace, &job, &source, &nats.url());
    wait_running("the changes after the kill", Duration::from_secs(60), &mut run, || {
        events().iter().any(|event| event["op"] == "u" && id_of(event) == 60)
    });
    drop(run);

    let seen = events();
    let of = |op: &str| -> Vec<i64> {
        let mut ids: Vec<i64> = seen.iter().filter(|event| event["op"] == op).map(id_of).collect();
        ids.sort_unstable();
        ids
    };
    assert_eq!(of("r"), (1..=200).collect::<Vec<_>>(), "each row's snapshot event once");
    assert_eq!(of("u"), [(1..=10).collect::<Vec<_>>(), vec![30, 60]].concat(), "each update once");
    // A key move is a delete of the old key and a create of the new one, as Debezium sends it.
    assert_eq!(
        (of("d"), of("c")),
        (vec![20, 50], vec![201, 1000]),
        "the deleted rows and the inserted ones, once each"
    );
    let created = seen.iter().position(|event| event["op"] == "c" && id_of(event) == 1000).unwrap();
    let deleted = &seen[created - 1];
    assert!(deleted["op"] == "d" && id_of(deleted) == 20, "the move's delete comes just before its create: {deleted}");
    assert!(deleted["before"]["v"].is_null(), "only the old key was sent: {deleted}");
    // REPLICA IDENTITY DEFAULT: the server sends no old row, so no update shows one; FULL
    // from the change after the ALTER TABLE on.
    for event in seen.iter().filter(|event| event["op"] == "u" && id_of(event) != 60) {
        assert!(event["before"].is_null(), "{event}");
    }
    let full = seen.iter().find(|event| event["op"] == "u" && id_of(event) == 60).unwrap();
    assert!(full["before"]["v"] == 60 && full["before"]["s"] == "s60" && full["after"]["v"] == 77, "{full}");
    assert_eq!(deleted["transaction"]["id"], seen[created]["transaction"]["id"], "one transaction: {deleted}");
    for event in seen.iter().filter(|event| event["op"] == "u" && id_of(event) <= 10) {
        assert_eq!(event["after"]["v"].as_i64(), Some(id_of(event) + 1000), "{event}");
    }
    let emptied = seen.iter().find(|event| event["op"] == "u" && id_of(event) == 30).unwrap();
    assert!(emptied["after"]["s"].is_null() && emptied["after"]["v"] == 30, "{emptied}");
    // A row's events in the order of its changes: the snapshot's first.
    let first_of_one: Vec<&str> =
        seen.iter().filter(|event| id_of(event) == 1).map(|event| event["op"].as_str().unwrap()).collect();
    assert_eq!(first_of_one, ["r", "u"]);
}

/// A table taken out of the publication while the job streams sends no more changes: the
/// stream stops naming it and the fix. A table dropped from the source does not stop it.
#[test]
fn a_table_taken_out_of_the_publication_stops_the_stream_naming_it() {
    let source = SourceDatabase::create("pgunpub");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE kept (id int PRIMARY KEY); CREATE TABLE dropped (id int PRIMARY KEY); CREATE TABLE unpublished (id int PRIMARY KEY);
         INSERT INTO kept VALUES (1); INSERT INTO unpublished VALUES (1);
         CREATE PUBLICATION {schema}_pub FOR TABLE kept, dropped, unpublished;"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = job_reading_publication(&workspace, "job.yaml", &name, &schema, &format!("{schema}_pub"));
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    source.sql(&format!("DROP TABLE {schema}.dropped; INSERT INTO {schema}.kept VALUES (2)"));
    wait_converged(&name, &source, &mut run);
    assert_eq!(psql(&format!("SELECT count(*) FROM {schema}.kept")), "2\n");
    source.sql(&format!(
        "ALTER PUBLICATION {schema}_pub DROP TABLE {schema}.unpublished; INSERT INTO {schema}.unpublished VALUES (2)"
    ));
    let stopped = run.into_inner().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(!stopped.status.success(), "the job stops:\n{stderr}");
    let fix = format!("ALTER PUBLICATION \"{schema}_pub\" ADD TABLE \"{schema}\".\"unpublished\"");
    assert!(stderr.contains("no longer publishes") && stderr.contains(&fix), "{stderr}");
}

#[test]
fn cursor_batches_read_postgres_rows_changed_since_the_last_batch_with_a_lookback() {
    let source = SourceDatabase::create("pgcursor");
    let schema = source.name.clone();
    // 1,000 orders a second apart from 2026-01-01 00:00:01 (the last at 00:16:40), one without
    // a cursor value.
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE orders (id int PRIMARY KEY, note text, updated_at timestamptz);
         INSERT INTO orders SELECT g, 'n' || g, '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 second' FROM generate_series(1, 1000) g;
         INSERT INTO orders VALUES (5000, 'no cursor', NULL);"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {}\nmode: incremental-cursor\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [{schema}.orders]\n  \
             cursor: {{column: updated_at, lookback_secs: 60}}\ntarget:\n  type: postgres\n  url: ${{TARGET}}\n",
            schema.replace('_', "-")
        ),
    );
    let run = |summary: &str| -> u64 {
        let output = workspace
            .command(&["run", job.to_str().unwrap(), "--summary-json", summary])
            .env("SOURCE", source.url())
            .env("TARGET", postgres_url())
            .output()
            .unwrap();
        Run::from(output).assert_code(0);
        support::summary(&workspace.path(summary))["rows_read"].as_u64().unwrap()
    };
    let rows = |sql: &dyn Fn(&str) -> String| sql(&format!("SELECT id, note FROM {schema}.orders ORDER BY id"));
    assert_eq!(run("first.json"), 1_001);
    assert_eq!(rows(&psql), rows(&|sql: &str| source.sql(sql)));
    source.sql(&format!(
        "SET search_path = {schema};
         UPDATE orders SET note = note || ' changed', updated_at = '2026-01-02 00:00:00+00' WHERE id <= 10;
         INSERT INTO orders SELECT g, 'new', '2026-01-02 00:00:01+00' FROM generate_series(2001, 2005) g;
         INSERT INTO orders VALUES (3001, 'late', '2026-01-01 00:16:10+00'), (3002, 'too late', '2026-01-01 00:10:00+00');"
    ));
    // The window (00:15:40, 2026-01-02 00:00:01]: ids 941 to 1000, the ten changed, the five new
    // and the late one.
    assert_eq!(run("second.json"), 60 + 10 + 5 + 1);
    let expected: Vec<String> =
        rows(&|sql: &str| source.sql(sql)).lines().filter(|row| !row.starts_with("3002|")).map(str::to_owned).collect();
    assert_eq!(rows(&psql).lines().map(str::to_owned).collect::<Vec<_>>(), expected);
    assert_eq!(run("third.json"), 15, "nothing changed: only the lookback window again");
}

/// A stopped job's slot keeps the WAL written meanwhile: the job's view (and its console page)
/// shows how much; running again, the figure goes. Deleted, the job's slot goes too.
#[test]
fn a_stopped_job_shows_the_wal_its_slot_holds_and_a_deleted_one_drops_its_slot() {
    let source = SourceDatabase::create("pgdelete");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY); INSERT INTO {schema}.t VALUES (1)"
    ));
    let workspace = Workspace::new();
    let admin = "admin-token-0123456789";
    let environment = [
        ("SLUICE_ADMIN_TOKEN", admin.to_owned()),
        ("SLUICE_VAR_SOURCE", source.url()),
        ("SLUICE_VAR_TARGET", postgres_url()),
    ];
    let server = support::cluster::start_server(&workspace, "solo", None, &environment);
    let name = schema.replace('_', "-");
    let yaml = format!(
        "name: {name}\nmode: snapshot+cdc\nsource:\n  type: postgres\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{schema}.*\"]\n\
         target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  create_tables: true\n"
    );
    let (status, body) = server.call("POST", "/jobs", Some(admin), Some(("application/yaml", &yaml)));
    assert_eq!(status, 201, "{body}");
    let slot = format!("sluice_{schema}");
    let active = format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active");
    support::wait_for("the job's stream to read its slot", Duration::from_secs(60), || {
        source.sql(&active).trim() == "1"
    });
    let held = || server.call("GET", &format!("/jobs/{name}"), Some(admin), None).1["held_log"].clone();
    assert!(held().is_null(), "a running job's slot is read: {}", held());
    assert_eq!(server.call("POST", &format!("/jobs/{name}/stop"), Some(admin), None).0, 200);
    support::wait_for("the stream to let go of its slot", Duration::from_secs(60), || {
        source.sql(&active).trim() == "0"
    });
    source.sql(&format!("INSERT INTO {schema}.t SELECT generate_series(2, 20001)"));
    support::wait_for("the view to show the WAL the slot holds", Duration::from_secs(60), || {
        held()["bytes"].as_u64().is_some_and(|bytes| bytes > 100_000)
    });
    let shown = workspace.sluice(&["job", "show", &name, "--server", &server.url, "--token", admin]);
    assert!(shown.stdout.contains("warning:") && shown.stdout.contains("MiB of change log"), "{}", shown.all());
    assert_eq!(server.call("POST", &format!("/jobs/{name}/start"), Some(admin), None).0, 200);
    support::wait_for("the figure to go once the job runs", Duration::from_secs(60), || held().is_null());
    assert_eq!(server.call("DELETE", &format!("/jobs/{name}"), Some(admin), None).0, 204);
    support::wait_for("the slot to be dropped", Duration::from_secs(60), || source.slots().is_empty());
    assert_eq!(source.sql(&format!("SELECT count(*) FROM pg_publication WHERE pubname = '{slot}'")).trim(), "0");
}

#[test]
fn the_replication_session_outlives_a_long_target_commit() {
    let source = SourceDatabase::create("pgslow");
    let schema = source.name.clone();
    source.sql(&format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY, v text)"));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {name}\nmode: cdc\nsource:\n  type: postgres\n  url: ${{SOURCE}}\n  tables: [\"{schema}.*\"]\n\
             target:\n  type: postgres\n  url: ${{TARGET}}\n  create_tables: true\nlimits: {{batch_rows: 1000}}\n"
        ),
    );
    // The server ends a replication session it has not heard from for 1.5 s.
    let url = format!("{}?options=-c%20wal_sender_timeout%3D1500", source.url());
    let mut run = workspace.start_run(&job, &url, &postgres_url(), &[]);
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    source.sql(&format!("INSERT INTO {schema}.t VALUES (0, 'first')"));
    wait_running("the first row", Duration::from_secs(60), &mut run, || {
        psql(&format!("SELECT count(*) FROM {schema}.t")).trim() == "1"
    });
    // The target's table is locked for 6 s while a backlog far larger than the stream reads
    // ahead arrives: the engine waits on its commit, the session keeps reporting.
    let mut lock = std::process::Command::new("psql")
        .args([
            postgres_url().as_str(),
            "-X",
            "-q",
            "-c",
            &format!("BEGIN; LOCK TABLE {schema}.t IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(6); COMMIT;"),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    source.sql(&format!("INSERT INTO {schema}.t SELECT g, 'backlog ' || g FROM generate_series(1, 200000) g"));
    assert!(lock.wait().unwrap().success());
    wait_converged(&name, &source, &mut run);
    assert_eq!(psql(&format!("SELECT count(*) FROM {schema}.t")).trim(), "200001");
    let printed = run.stderr_text();
    assert_eq!(
        printed.matches("change stream starts after").count(),
        1,
        "the stream never had to start again:\n{printed}"
    );
}

#[test]
fn columns_added_dropped_and_retyped_and_truncates_reach_the_target_and_a_rename_stops_the_stream() {
    let source = SourceDatabase::create("pgddl");
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; SET search_path = {schema};
         CREATE TABLE t (id int PRIMARY KEY, a int, gone text); INSERT INTO t VALUES (1, 1, 'x');
         CREATE TABLE u (id int PRIMARY KEY); INSERT INTO u VALUES (1), (2);"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = job_file(&workspace, &name, &schema, "postgres", "");
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    // Each statement a transaction of its own (one `psql -c` string would be one transaction).
    for statement in [
        "ALTER TABLE t ADD COLUMN note varchar(20)",
        "UPDATE t SET note = 'added' WHERE id = 1",
        "INSERT INTO t VALUES (2, 2, 'y', 'two')",
        "ALTER TABLE t DROP COLUMN gone",
        "INSERT INTO t VALUES (3, 3, 'three')",
        "ALTER TABLE t ALTER COLUMN a TYPE bigint",
        "INSERT INTO t VALUES (4, 9000000000, 'four')",
        "TRUNCATE u",
        "INSERT INTO u VALUES (3)",
    ] {
        source.sql(&statement.replace(" t ", &format!(" {schema}.t ")).replace(" u", &format!(" {schema}.u")));
    }
    wait_converged(&name, &source, &mut run);
    let rows = |sql: &dyn Fn(&str) -> String| sql(&format!("SELECT * FROM {schema}.t ORDER BY id"));
    assert_eq!(rows(&psql), rows(&|sql: &str| source.sql(sql)));
    assert_eq!(rows(&psql), "1|1|added\n2|2|two\n3|3|three\n4|9000000000|four\n");
    let types = format!(
        "SELECT string_agg(column_name || ' ' || data_type, ', ' ORDER BY ordinal_position) FROM information_schema.columns \
         WHERE table_schema = '{schema}' AND table_name = 't'"
    );
    assert_eq!(psql(&types).trim(), "id integer, a bigint, note character varying");
    assert_eq!(psql(&format!("SELECT string_agg(id::text, ',') FROM {schema}.u")).trim(), "3");

    // A rename looks like a column dropped and one added: the stream cannot tell, and stops.
    source.sql(&format!(
        "ALTER TABLE {schema}.t RENAME COLUMN note TO label; INSERT INTO {schema}.t VALUES (5, 5, 'five')"
    ));
    let output = run.into_inner().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains(&format!("table {schema}.t lost columns note and gained label")), "{stderr}");
}

#[test]
fn a_slot_confirmed_past_the_targets_checkpoint_stops_the_job_naming_it() {
    let source = SourceDatabase::create("pgahead");
    let schema = source.name.clone();
    source.sql(&format!("CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY)"));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let slot = format!("sluice_{schema}");
    let job = job_file(&workspace, &name, &schema, "postgres", "");
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    drop(run);
    source.wait_slots_released();
    // Another client reads the job's slot past what the target stored: those changes are gone.
    source.sql(&format!("INSERT INTO {schema}.t VALUES (1)"));
    source.sql(&format!("SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"));
    let run = start(&workspace, &job, &source, &postgres_url());
    let output = run.into_inner().wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the job stops:\n{stderr}");
    assert!(
        stderr.contains(&format!("replication slot {slot} has confirmed WAL position"))
            && stderr.contains("past the job's checkpoint"),
        "{stderr}"
    );
    assert_eq!(psql(&format!("SELECT count(*) FROM {schema}.t")).trim(), "0", "nothing is applied from a lost place");
}

/// A stream job over a table `t` holding row 1, run until its stream exists, then killed: its
/// source, workspace, job file and schema.
fn stopped_stream_job(prefix: &str) -> (SourceDatabase, Workspace, std::path::PathBuf, String) {
    let source = SourceDatabase::create(prefix);
    let schema = source.name.clone();
    source.sql(&format!(
        "CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (id int PRIMARY KEY, v int); INSERT INTO {schema}.t VALUES (1, 1)"
    ));
    let workspace = Workspace::new();
    let name = schema.replace('_', "-");
    let job = job_file(&workspace, &name, &schema, "postgres", "");
    let mut run = start(&workspace, &job, &source, &postgres_url());
    wait_running("the stream", Duration::from_secs(60), &mut run, || stream_lsn(&name).is_some());
    support::kill(&mut run);
    (source, workspace, job, schema)
}

/// Runs the job again with `stop_position: {mark}`: it ends with exit 0, saying so; the ids of
/// `t` in the target after.
fn run_to_stop(source: &SourceDatabase, workspace: &Workspace, job: &std::path::Path, mark: &str) -> String {
    let text =
        std::fs::read_to_string(job).unwrap().replace("  tables:", &format!("  stop_position: {{{mark}}}\n  tables:"));
    std::fs::write(job, text).unwrap();
    let finished = sluice_into_postgres(workspace, &["run", job.to_str().unwrap()], source);
    finished.assert_code(0);
    assert!(finished.all().contains("reached source.stop_position"), "{}", finished.all());
    psql(&format!("SELECT string_agg(id::text, ',' ORDER BY id) FROM {}.t", source.name)).trim().to_owned()
}

/// `source.stop_position: {lsn}`: a job started again with a WAL position applies the
/// transactions before it, ends with exit 0 at the first that reaches it, and leaves alone
/// what was committed after.
#[test]
fn a_postgres_stream_stops_at_a_wal_position_with_what_lies_before_it() {
    let (source, workspace, job, schema) = stopped_stream_job("pgstop");
    // The mark is one byte past the WAL's end after the first transaction: that one lies before
    // it; the next one of the job's (or, on a busy server, another's position) reaches it; the
    // last one lies after it, whatever other sessions write meanwhile.
    source.sql(&format!("INSERT INTO {schema}.t VALUES (2, 2)"));
    let after_first = source.sql("SELECT pg_current_wal_lsn() + 1");
    source.sql(&format!("UPDATE {schema}.t SET v = 10 WHERE id = 1"));
    source.sql(&format!("INSERT INTO {schema}.t VALUES (3, 3)"));
    let ids = run_to_stop(&source, &workspace, &job, &format!("lsn: \"{}\"", after_first.trim()));
    assert_eq!(ids, "1,2", "the transaction before the position is applied, the one after it is not");
}

/// `source.stop_position: {time}`: the stream ends with exit 0 before the first transaction
/// committed at or after the time.
#[test]
fn a_postgres_stream_stops_before_the_first_transaction_committed_at_a_time() {
    let (source, workspace, job, schema) = stopped_stream_job("pgstoptime");
    source.sql(&format!("INSERT INTO {schema}.t VALUES (2, 2)"));
    // Once the server's clock has passed the second it is in, the second it is in then: what
    // committed before is dated before it, what commits after at or after it.
    let second =
        || source.sql("SELECT floor(extract(epoch FROM clock_timestamp()))::bigint").trim().parse::<u64>().unwrap();
    let now = second();
    wait_for("the server's clock to pass a second", Duration::from_secs(5), || second() > now);
    let stop = source.sql("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')");
    source.sql(&format!("INSERT INTO {schema}.t VALUES (3, 3)"));
    let ids = run_to_stop(&source, &workspace, &job, &format!("time: \"{}\"", stop.trim()));
    assert_eq!(ids, "1,2", "committed before {stop}: applied; at or after it: not");
}
