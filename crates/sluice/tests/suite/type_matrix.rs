//! The type matrix: edge values of every MySQL type, copied into PostgreSQL and into MySQL and
//! compared value by value.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::workload::{source_position, stream_position};
use support::{mariadb, mariadb_bytes, mysql_url, postgres_url, signal, unique_name, wait_for, Run, Workspace};

/// One MySQL column type, the values to put in it (SQL literals), and the text PostgreSQL must
/// show for each (`NULL` for NULL).
struct Case {
    mysql_type: &'static str,
    values: &'static [(&'static str, &'static str)],
}

const CASES: &[Case] = &[
    Case { mysql_type: "TINYINT", values: &[("-128", "-128"), ("127", "127"), ("0", "0"), ("NULL", "NULL")] },
    Case { mysql_type: "TINYINT UNSIGNED", values: &[("0", "0"), ("255", "255")] },
    Case { mysql_type: "TINYINT(1)", values: &[("0", "0"), ("1", "1"), ("-5", "-5")] },
    Case { mysql_type: "SMALLINT", values: &[("-32768", "-32768"), ("32767", "32767"), ("0", "0")] },
    Case { mysql_type: "SMALLINT UNSIGNED", values: &[("65535", "65535")] },
    Case { mysql_type: "MEDIUMINT", values: &[("-8388608", "-8388608"), ("8388607", "8388607")] },
    Case { mysql_type: "MEDIUMINT UNSIGNED", values: &[("16777215", "16777215")] },
    Case {
        mysql_type: "INT",
        values: &[("-2147483648", "-2147483648"), ("2147483647", "2147483647"), ("0", "0"), ("-1", "-1")],
    },
    Case { mysql_type: "INT UNSIGNED", values: &[("4294967295", "4294967295")] },
    Case {
        mysql_type: "BIGINT",
        values: &[("-9223372036854775808", "-9223372036854775808"), ("9223372036854775807", "9223372036854775807")],
    },
    Case { mysql_type: "BIGINT UNSIGNED", values: &[("18446744073709551615", "18446744073709551615"), ("0", "0")] },
    Case {
        mysql_type: "DECIMAL(65,30)",
        values: &[
            (
                "'99999999999999999999999999999999999.999999999999999999999999999999'",
                "99999999999999999999999999999999999.999999999999999999999999999999",
            ),
            (
                "'-99999999999999999999999999999999999.999999999999999999999999999999'",
                "-99999999999999999999999999999999999.999999999999999999999999999999",
            ),
            ("'0.000000000000000000000000000001'", "0.000000000000000000000000000001"),
            ("'-0.5'", "-0.500000000000000000000000000000"),
            ("0", "0.000000000000000000000000000000"),
        ],
    },
    Case {
        mysql_type: "DECIMAL(10,2)",
        values: &[("1.5", "1.50"), ("-0.01", "-0.01"), ("99999999.99", "99999999.99")],
    },
    Case { mysql_type: "DECIMAL(5,0)", values: &[("-99999", "-99999")] },
    Case {
        mysql_type: "FLOAT",
        values: &[
            ("0.1", "0.1"),
            ("-3.40282e38", "-3.40282e+38"),
            ("1.17549e-38", "1.17549e-38"),
            ("0", "0"),
            ("3.14", "3.14"),
        ],
    },
    Case {
        mysql_type: "DOUBLE",
        values: &[
            ("0.1", "0.1"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"),
            ("5e-324", "5e-324"),
            ("-2.5", "-2.5"),
            ("1e15", "1e+15"),
        ],
    },
    Case { mysql_type: "BIT(1)", values: &[("b'0'", "0"), ("b'1'", "1")] },
    Case {
        mysql_type: "BIT(64)",
        values: &[
            (
                "b'1111111111111111111111111111111111111111111111111111111111111111'",
                "1111111111111111111111111111111111111111111111111111111111111111",
            ),
            ("b'0'", "0000000000000000000000000000000000000000000000000000000000000000"),
        ],
    },
    Case {
        mysql_type: "DATE",
        values: &[
            ("'1000-01-01'", "1000-01-01"),
            ("'9999-12-31'", "9999-12-31"),
            ("'2024-02-29'", "2024-02-29"),
            ("'2000-01-01'", "2000-01-01"),
        ],
    },
    Case {
        mysql_type: "DATETIME(6)",
        values: &[
            ("'1000-01-01 00:00:00'", "1000-01-01 00:00:00"),
            ("'9999-12-31 23:59:59.999999'", "9999-12-31 23:59:59.999999"),
            ("'2024-01-01 00:00:00.000001'", "2024-01-01 00:00:00.000001"),
            ("'2038-01-19 03:14:08'", "2038-01-19 03:14:08"),
        ],
    },
    Case { mysql_type: "DATETIME", values: &[("'2024-06-01 12:34:56'", "2024-06-01 12:34:56")] },
    Case { mysql_type: "DATETIME(3)", values: &[("'2024-06-01 12:34:56.789'", "2024-06-01 12:34:56.789")] },
    Case {
        mysql_type: "TIMESTAMP(6) NULL",
        values: &[
            ("'1970-01-01 00:00:01'", "1970-01-01 00:00:01+00"),
            ("'2038-01-19 03:14:07.999999'", "2038-01-19 03:14:07.999999+00"),
            ("NULL", "NULL"),
        ],
    },
    Case {
        mysql_type: "TIME(6)",
        values: &[
            ("'-838:59:59'", "-838:59:59"),
            ("'838:59:59'", "838:59:59"),
            ("'00:00:00'", "00:00:00"),
            ("'-00:00:00.000001'", "-00:00:00.000001"),
            ("'123:45:06.789'", "123:45:06.789"),
        ],
    },
    Case { mysql_type: "YEAR", values: &[("1901", "1901"), ("2155", "2155"), ("0", "0")] },
    Case { mysql_type: "CHAR(10)", values: &[("'abc'", "abc"), ("''", ""), ("NULL", "NULL")] },
    Case {
        mysql_type: "VARCHAR(255) CHARACTER SET utf8mb4",
        values: &[
            ("'😀𠀀'", "😀𠀀"),
            ("'naïve e\u{301}'", "naïve e\u{301}"),
            ("'quote''\"\\\\'", "quote'\"\\"),
            ("'tab\\tnew\\nline\\r'", "tab\tnew\nline\r"),
            ("''", ""),
            ("'  trailing  '", "  trailing  "),
            ("'A'", "A"),
            ("'ǅ ß ﬁ'", "ǅ ß ﬁ"),
        ],
    },
    Case { mysql_type: "VARCHAR(20) CHARACTER SET latin1", values: &[("'café'", "café"), ("'ÿ±'", "ÿ±")] },
    Case { mysql_type: "MEDIUMTEXT", values: &[("REPEAT('x', 70000)", "x{70000}"), ("''", "")] },
    Case { mysql_type: "BINARY(4)", values: &[("0x00010203", "\\x00010203"), ("0x41", "\\x41000000")] },
    Case { mysql_type: "VARBINARY(10)", values: &[("0x00", "\\x00"), ("0xFFFE", "\\xfffe"), ("''", "\\x")] },
    Case { mysql_type: "BLOB", values: &[("0x000102FF", "\\x000102ff"), ("NULL", "NULL"), ("''", "\\x")] },
    Case { mysql_type: "ENUM('a','b c','')", values: &[("'a'", "a"), ("'b c'", "b c"), ("''", "")] },
    Case { mysql_type: "SET('x','y','z')", values: &[("'x,y'", "x,y"), ("''", ""), ("'z,x'", "x,z")] },
    Case {
        mysql_type: "JSON",
        values: &[
            ("'{\"a\": 1}'", "{\"a\": 1}"),
            ("'[1, 2, 3]'", "[1, 2, 3]"),
            ("'12345678901234567890123'", "12345678901234567890123"),
            ("'\"text\"'", "\"text\""),
            ("'{\"k\": [1, {\"n\": null}]}'", "{\"k\": [1, {\"n\": null}]}"),
        ],
    },
    Case {
        mysql_type: "POINT",
        values: &[("ST_GeomFromText('POINT(1 2)')", "\\x000000000101000000000000000000f03f0000000000000040")],
    },
];

fn value_count() -> usize {
    CASES.iter().map(|case| case.values.len()).sum()
}

/// Creates one table per case in a fresh database.
fn create_source(database: &str) {
    let mut sql = format!("CREATE DATABASE {database}; USE {database};");
    for (index, case) in CASES.iter().enumerate() {
        sql.push_str(&format!("CREATE TABLE t{index:02} (id INT PRIMARY KEY, v {});", case.mysql_type));
    }
    mariadb(&sql);
}

/// Fills every case's table with its values.
fn fill_source(database: &str) {
    let mut sql = format!("USE {database}; SET SESSION sql_mode = 'STRICT_ALL_TABLES';");
    for (index, case) in CASES.iter().enumerate() {
        let rows: Vec<String> =
            case.values.iter().enumerate().map(|(row, (literal, _))| format!("({row}, {literal})")).collect();
        sql.push_str(&format!("INSERT INTO t{index:02} VALUES {};", rows.join(", ")));
    }
    mariadb(&sql);
}

fn job_text(name: &str, mode: &str, database: &str, target: &str, namespace: &str) -> String {
    format!(
        "name: {name}\nmode: {mode}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {namespace}\n"
    )
}

fn target_url(target: &str) -> String {
    if target == "postgres" {
        postgres_url()
    } else {
        mysql_url()
    }
}

/// Compares every value in the PostgreSQL schema with the expected text and every MySQL copy
/// with the source byte for byte; returns the differences.
fn mismatches_of(database: &str, pg_schema: &str, my_copy: &str) -> Vec<String> {
    let mut mismatches = Vec::new();
    for (index, case) in CASES.iter().enumerate() {
        let shown =
            postgres_records(&format!("SELECT coalesce(v::text, 'NULL') FROM {pg_schema}.t{index:02} ORDER BY id"));
        for (row, (literal, expected)) in case.values.iter().enumerate() {
            let expected = match expected.strip_prefix("x{") {
                Some(count) => "x".repeat(count.trim_end_matches('}').parse().unwrap()),
                None => (*expected).to_owned(),
            };
            let actual = shown.get(row).map_or("<missing>", String::as_str);
            if actual != expected {
                mismatches
                    .push(format!("postgres {} {literal}: got {actual:?}, expected {expected:?}", case.mysql_type));
            }
        }
        let source = mariadb_bytes(&format!("SELECT id, v FROM {database}.t{index:02} ORDER BY id"));
        let target = mariadb_bytes(&format!("SELECT id, v FROM {my_copy}.t{index:02} ORDER BY id"));
        if source != target {
            mismatches.push(format!(
                "mysql {}: got {:?}, expected {:?}",
                case.mysql_type,
                String::from_utf8_lossy(&target),
                String::from_utf8_lossy(&source)
            ));
        }
    }
    mismatches
}

/// The rows of a one-column PostgreSQL query, separated so values may hold line breaks.
fn postgres_records(sql: &str) -> Vec<String> {
    let output = Command::new("psql")
        .args([postgres_url().as_str(), "-X", "-At", "-R", "\u{1e}", "-c", sql])
        .output()
        .expect("run psql");
    assert!(output.status.success(), "psql: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).expect("UTF-8 output");
    text.trim_end_matches('\n').split('\u{1e}').map(str::to_owned).collect()
}

#[test]
fn every_edge_value_survives_mysql_to_postgres_and_mysql_to_mysql() {
    assert!(value_count() >= 100, "the matrix has {} values", value_count());
    let database = unique_name("matrix");
    create_source(&database);
    fill_source(&database);
    let workspace = Workspace::new();
    let copy = |target: &str, name: &str, namespace: &str, source: &str| {
        let job = workspace.write(&format!("{name}.yaml"), &job_text(name, "snapshot", &database, target, namespace));
        let run = Run::from(
            workspace
                .command(&["run", job.to_str().unwrap()])
                .env("SOURCE", source)
                .env("TARGET", target_url(target))
                .output()
                .unwrap(),
        );
        run.assert_code(0);
        run
    };
    let pg_schema = format!("{database}_pg");
    let my_copy = format!("{database}_copy");
    for (target, namespace) in [("postgres", &pg_schema), ("mysql", &my_copy)] {
        let run = copy(target, &format!("to-{target}"), namespace, &mysql_url());
        assert!(!run.stderr.contains("read through the driver"), "{}", run.stderr);
    }
    // A compressed connection is beyond the lean reader: the same values come through the
    // driver (mysql_async), the other read path, and must arrive the same.
    let (driver_pg, driver_my) = (format!("{database}_pg_driver"), format!("{database}_copy_driver"));
    for (target, namespace) in [("postgres", &driver_pg), ("mysql", &driver_my)] {
        let run = copy(target, &format!("driver-to-{target}"), namespace, &format!("{}?compression=fast", mysql_url()));
        assert!(run.stderr.contains("read through the driver (compression)"), "{}", run.stderr);
    }
    // MariaDB's JSON (a LONGTEXT with a json_valid check) stays JSON on both targets.
    let json = CASES.iter().position(|case| case.mysql_type == "JSON").unwrap();
    let pg_type = postgres_records(&format!(
        "SELECT data_type FROM information_schema.columns WHERE table_schema = '{pg_schema}' AND table_name = 't{json:02}' AND column_name = 'v'"
    ));
    assert_eq!(pg_type, ["json"]);
    let my_check = mariadb(&format!(
        "SELECT count(*) FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = '{my_copy}' AND TABLE_NAME = 't{json:02}' AND CHECK_CLAUSE LIKE 'json_valid%'"
    ));
    assert_eq!(my_check.trim(), "1");
    let mut mismatches = mismatches_of(&database, &pg_schema, &my_copy);
    mismatches
        .extend(mismatches_of(&database, &driver_pg, &driver_my).into_iter().map(|text| format!("driver: {text}")));
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));

    // `sluice verify` finds every edge value equal, as each type's equality says, on both
    // targets: no false difference.
    for target in ["postgres", "mysql"] {
        let job = workspace.path(&format!("to-{target}.yaml"));
        let verified = Run::from(
            workspace
                .command(&["verify", job.to_str().unwrap(), "--json"])
                .env("SOURCE", mysql_url())
                .env("TARGET", target_url(target))
                .output()
                .unwrap(),
        );
        assert_eq!(verified.code, 0, "{target}: {}", verified.all());
        let report: serde_json::Value = serde_json::from_str(&verified.stdout).unwrap();
        let rows: u64 =
            report["tables"].as_array().unwrap().iter().map(|table| table["rows_target"].as_u64().unwrap()).sum();
        assert_eq!(rows as usize, value_count(), "{target}: {}", verified.stdout);
    }
}

/// The same values through the change stream: inserted after the (empty) snapshot, then moved to
/// new keys, so every type is decoded from the binlog in before and after images.
#[test]
fn every_edge_value_survives_the_change_stream() {
    let database = unique_name("streamed");
    create_source(&database);
    let workspace = Workspace::new();
    let pg_schema = format!("{database}_pg");
    let my_copy = format!("{database}_copy");
    let mut runs = Vec::new();
    for (target, namespace) in [("postgres", &pg_schema), ("mysql", &my_copy)] {
        let name = format!("{database}-{target}").replace('_', "-");
        let job =
            workspace.write(&format!("{target}.yaml"), &job_text(&name, "snapshot+cdc", &database, target, namespace));
        runs.push((target, name, workspace.start_run(&job, &mysql_url(), &target_url(target), &[])));
    }
    for (target, name, _) in &runs {
        wait_for("the stream to start", Duration::from_secs(60), || stream_position(target, name).is_some());
    }
    fill_source(&database);
    let mut sql = format!("USE {database};");
    for index in 0..CASES.len() {
        sql.push_str(&format!("UPDATE t{index:02} SET id = id + 100;"));
    }
    mariadb(&sql);
    let source = source_position();
    for (target, name, child) in &mut runs {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while stream_position(target, name).is_none_or(|at| at < source) {
            if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
                let _ = child.kill();
                let output = child.stderr_text();
                panic!("the {target} stream did not reach the source:\n{output}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for (_, _, child) in runs {
        let child = child.into_inner();
        signal(&child, "TERM");
        let output = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&output.stderr);
        assert!(!text.contains("ERROR") && !text.contains("panicked"), "{text}");
    }
    let mismatches = mismatches_of(&database, &pg_schema, &my_copy);
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
}

#[test]
fn zero_dates_follow_the_policy_and_are_never_silent() {
    let database = unique_name("zero");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database}; SET SESSION sql_mode = '';
         CREATE TABLE dates (id INT PRIMARY KEY, d DATE NULL, dt DATETIME NULL, required DATE NOT NULL);
         INSERT INTO dates VALUES (1, '0000-00-00', '0000-00-00 00:00:00', '2024-01-01'), (2, '2020-00-15', NULL, '2024-01-02'),
                                  (3, '2024-03-01', '2024-03-01 10:00:00', '2024-01-03'), (4, NULL, NULL, '0000-00-00');"
    ));
    let workspace = Workspace::new();
    let job = |name: &str, target: &str, errors: &str| {
        let path = workspace.write(
            &format!("{name}.yaml"),
            &format!("name: {name}\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: {target}\n  url: ${{TARGET}}\n  namespace: {database}_{name}\nerrors: {errors}\n"),
        );
        let target_url = if target == "postgres" { postgres_url() } else { mysql_url() };
        Run::from(
            workspace
                .command(&["run", path.to_str().unwrap(), "--summary-json", &format!("{name}.json")])
                .env("SOURCE", mysql_url())
                .env("TARGET", target_url)
                .output()
                .unwrap(),
        )
    };
    let rejected = job("reject", "postgres", "{max_dirty_records: 0}");
    rejected.assert_code(1);
    assert!(
        rejected.stderr.contains("zero date '0000-00-00' cannot be stored in postgres; set errors.zero_dates: null"),
        "{}",
        rejected.stderr
    );

    job("nulled", "postgres", "{max_dirty_records: 1, zero_dates: 'null'}").assert_code(0);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workspace.path("nulled.json")).unwrap()).unwrap();
    assert_eq!(
        (summary["zero_dates_nulled"].as_u64(), summary["rows_skipped"].as_u64(), summary["rows_written"].as_u64()),
        (Some(3), Some(1), Some(3))
    );
    let rows = postgres_records(&format!("SELECT id || ':' || coalesce(d::text, 'NULL') || ':' || coalesce(dt::text, 'NULL') FROM {database}_nulled.dates ORDER BY id"));
    assert_eq!(rows, vec!["1:NULL:NULL", "2:NULL:NULL", "3:2024-03-01:2024-03-01 10:00:00"]);

    job("kept", "mysql", "{}").assert_code(0);
    let source = mariadb_bytes(&format!("SELECT * FROM {database}.dates ORDER BY id"));
    let copy = mariadb_bytes(&format!("SELECT * FROM {database}_kept.dates ORDER BY id"));
    assert_eq!(
        String::from_utf8_lossy(&copy),
        String::from_utf8_lossy(&source),
        "MySQL to MySQL carries zero dates as they are"
    );
}
