//! The test ClickHouse server `scripts/test.sh` starts, read with its own client
//! (`clickhouse-client` over the native protocol), never with Sluice.

use std::process::Command;

/// The server's HTTP URL, as a job's `target.url` names it.
pub fn url() -> String {
    std::env::var("SLUICE_TEST_CLICKHOUSE_URL")
        .expect("SLUICE_TEST_CLICKHOUSE_URL is set by scripts/test.sh, which starts the test servers")
}

/// Runs a query with `clickhouse-client`; returns its TabSeparated answer.
pub fn query(sql: &str) -> String {
    let output = client(sql);
    assert!(output.status.success(), "clickhouse-client: {sql}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A query's answer, or `None` when the server refuses it (a table not made yet).
pub fn try_query(sql: &str) -> Option<String> {
    let output = client(sql);
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `query` on a ClickHouse of one test alone (`testdb::start_with("clickhouse", …)`).
pub fn query_on(server: &super::testdb::OwnServer, sql: &str) -> String {
    let output = client_at(&server.read("tcp_port"), sql);
    assert!(output.status.success(), "clickhouse-client: {sql}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn client(sql: &str) -> std::process::Output {
    let port =
        std::env::var("SLUICE_TEST_CLICKHOUSE_PORT").expect("SLUICE_TEST_CLICKHOUSE_PORT is set by scripts/test.sh");
    client_at(&port, sql)
}

fn client_at(port: &str, sql: &str) -> std::process::Output {
    Command::new("clickhouse-client")
        .args(["--host", "127.0.0.1", "--port", port, "--user", "sluice", "--password", &super::canary()])
        .args(["--format", "TabSeparated", "--query", sql])
        .output()
        .expect("run clickhouse-client")
}
