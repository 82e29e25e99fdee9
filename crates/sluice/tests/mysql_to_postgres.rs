//! MySQL/MariaDB into PostgreSQL through the real binary and real servers.

mod support;

use support::{canary, mariadb, mysql_url, postgres_url, psql, unique_name, Run, Workspace};

#[test]
fn a_mysql_snapshot_lands_in_postgres_value_for_value_and_resumes_without_duplicates() {
    let database = unique_name("shop");
    mariadb(&format!(
        "CREATE DATABASE {database}; USE {database};
         CREATE TABLE orders (id BIGINT UNSIGNED PRIMARY KEY, amount DECIMAL(65,30), note VARCHAR(50) CHARACTER SET latin1,
             created DATETIME(6), ts TIMESTAMP(3) NULL, t TIME(6), y YEAR, b BIT(10), e ENUM('a','b'), s SET('x','y'),
             bin VARBINARY(10), f FLOAT, d DOUBLE, flag TINYINT(1), emoji VARCHAR(20) CHARACTER SET utf8mb4);
         INSERT INTO orders VALUES
           (18446744073709551615, '12345678901234567890123456789012345.123456789012345678901234567890', 'café',
            '2024-01-02 03:04:05.000006', '2038-01-19 03:14:07.999', '-838:59:59', 2155, b'1010101010', 'b', 'x,y',
            0x00FF, 0.1, 0.1, 1, '😀𠀀'),
           (1, NULL, '', '1000-01-01 00:00:00', NULL, '00:00:00', 1901, b'0', 'a', '', '', -1e38, 1e308, 0, NULL);
         CREATE TABLE `we\"ird name` (k VARCHAR(10) COLLATE utf8mb4_general_ci, n INT, PRIMARY KEY (k, n));
         INSERT INTO `we\"ird name` VALUES ('a ', 1), ('B', 1), ('b', 2);
         CREATE TABLE numbers (id INT PRIMARY KEY, v INT);
         INSERT INTO numbers SELECT seq, seq * 2 FROM seq_1_to_5000;"
    ));
    let workspace = Workspace::new();
    let job = workspace.write(
        "job.yaml",
        &format!("name: m2p\nsource:\n  type: mysql\n  url: ${{SOURCE}}\n  tables: [\"{database}.*\"]\ntarget:\n  type: postgres\n  url: ${{TARGET}}\nlimits: {{split_rows: 1000, batch_rows: 300}}\n"),
    );
    let run = |summary: &str| {
        Run::from(
            workspace
                .command(&["run", job.to_str().unwrap(), "--summary-json", summary])
                .env("SOURCE", mysql_url())
                .env("TARGET", postgres_url())
                .output()
                .unwrap(),
        )
    };
    let first = run("first.json");
    first.assert_code(0);
    assert!(!first.all().contains(&canary()));
    let rows = psql(&format!("SELECT id, amount, note, created, ts, t, y, b, e, s, bin, f, d, flag, emoji FROM {database}.orders ORDER BY id"));
    assert_eq!(
        rows,
        "1|||1000-01-01 00:00:00||00:00:00|1901|0000000000|a||\\x|-1e+38|1e+308|0|\n\
         18446744073709551615|12345678901234567890123456789012345.123456789012345678901234567890|café|2024-01-02 03:04:05.000006|2038-01-19 03:14:07.999+00|-838:59:59|2155|1010101010|b|x,y|\\x00ff|0.1|0.1|1|😀𠀀\n"
    );
    assert_eq!(
        psql(&format!("SELECT k || '|' || n FROM {database}.\"we\"\"ird name\" ORDER BY n, k")),
        "B|1\na |1\nb|2\n"
    );
    assert_eq!(psql(&format!("SELECT count(*), sum(v) FROM {database}.numbers")), "5000|25005000\n");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workspace.path("first.json")).unwrap()).unwrap();
    assert_eq!(summary["rows_written"], 5_005);
    let position = &summary["source_position"];
    assert_eq!(position["flavor"], "mariadb", "the snapshot records where a change stream continues: {position}");
    assert!(
        position["file"].as_str().is_some_and(|file| !file.is_empty()) && position["position"].as_u64().is_some(),
        "{position}"
    );

    let again = run("second.json");
    again.assert_code(0);
    assert_eq!(psql(&format!("SELECT count(*) FROM {database}.numbers")), "5000\n");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(workspace.path("second.json")).unwrap()).unwrap();
    assert_eq!(summary["rows_written"], 0);
}
