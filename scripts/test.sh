#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a used one: installs what is missing, starts
# hermetic MariaDB, PostgreSQL and ClickHouse servers (own temp dirs and ports, see
# scripts/testdb; a second MariaDB and PostgreSQL pair that accepts only TLS), runs the
# lints and every test against them, and stops the servers whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."

# The password of the test servers is a canary: tests assert it never appears in any output.
export SLUICE_TEST_PASSWORD=${SLUICE_TEST_PASSWORD:-CANARY-7f3a9c-secret}

scripts/testdb install

base=$(mktemp -d /dev/shm/sluice-test.XXXXXX 2>/dev/null || mktemp -d /tmp/sluice-test.XXXXXX)
cleanup() {
  local server log
  # A test server that crashed leaves every later test without a server: show why it crashed.
  # ClickHouse logs a stack trace with every refused query, so only its "Received signal" counts.
  for log in "$base"/*/server.log; do
    pattern='got signal|segfault|stack trace|PANIC'
    [[ $log != */clickhouse/* ]] || pattern='Received signal'
    if [ -f "$log" ] && grep -qiE "$pattern" "$log"; then
      # MariaDB writes the signal, the query and the stack first, then its settings: show the
      # report from its start, without the one long line of optimizer switches.
      echo "test server crashed; its report in $log:" >&2
      awk -v pattern="$pattern" 'found || tolower($0) ~ tolower(pattern) { found = 1; print }' "$log" |
        grep -v '^Optimizer switch' |
        head -n 120 >&2 || true
    fi
  done
  for server in mariadb postgres; do
    scripts/testdb stop "$server" "$base/$server" >/dev/null 2>&1 || true
    scripts/testdb stop "$server" "$base/$server-tls" >/dev/null 2>&1 || true
  done
  scripts/testdb stop clickhouse "$base/clickhouse" >/dev/null 2>&1 || true
  rm -rf "$base"
}
trap cleanup EXIT

mysql_url=$(scripts/testdb start mariadb "$base/mariadb")
postgres_url=$(scripts/testdb start postgres "$base/postgres")
export SLUICE_TEST_MYSQL_URL=${mysql_url#URL=}
export SLUICE_TEST_POSTGRES_URL=${postgres_url#URL=}
export SLUICE_TEST_MYSQL_SOCKET="$base/mariadb/mysql.sock"
# ClickHouse for the warehouse target's tests: its HTTP URL, and its native port for
# clickhouse-client, which the tests read it with.
clickhouse_url=$(scripts/testdb start clickhouse "$base/clickhouse")
export SLUICE_TEST_CLICKHOUSE_URL=${clickhouse_url#URL=}
export SLUICE_TEST_CLICKHOUSE_PORT=$(cat "$base/clickhouse/tcp_port")
# A second pair that accepts TLS connections only, with certificates made now (tests/suite/tls.rs).
scripts/testdb certs "$base/certs"
mysql_tls_url=$(scripts/testdb start mariadb "$base/mariadb-tls" --tls "$base/certs")
postgres_tls_url=$(scripts/testdb start postgres "$base/postgres-tls" --tls "$base/certs")
export SLUICE_TEST_TLS_DIR="$base/certs"
export SLUICE_TEST_MYSQL_TLS_URL=${mysql_tls_url#URL=}
export SLUICE_TEST_POSTGRES_TLS_URL=${postgres_tls_url#URL=}
export SLUICE_TEST_MYSQL_TLS_SOCKET="$base/mariadb-tls/mysql.sock"
echo "test servers: MariaDB on port $(cat "$base/mariadb/port"), PostgreSQL on port $(cat "$base/postgres/port")," \
  "ClickHouse on port $(cat "$base/clickhouse/port");" \
  "TLS only: MariaDB on port $(cat "$base/mariadb-tls/port"), PostgreSQL on port $(cat "$base/postgres-tls/port")"

cargo fmt --all -- --check
# The Grafana dashboard against Grafana's schema and the code's metric names (node and npm).
ops/grafana/check.sh
# Clippy's lints, warnings as errors, run while the tests build: cargo compiles the workspace's
# own crates (every target: libraries, binaries, tests, examples) with clippy-driver
# (scripts/rustc-with-clippy), so every dependency is compiled once for both, not checked for a
# `cargo clippy` first and built again for the tests. A lint fails the build, so no test runs.
# Twice as many tests at once as there are cores: most of a test's time is spent waiting on a
# server, a process or a broker, and two at a time left the cores half idle.
# The Kafka scenarios run after the rest, alone: the test broker (tansu) at times stops making
# committed transactions readable when the machine is loaded, and a scenario that stalled on
# three fresh brokers in a row under the whole suite's load passed alone at once.
features=sluice/failpoints,sluice/kafka,sluice/delta,sluice/iceberg
kafka=kafka_scenarios_run_one_after_another
RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/rustc-with-clippy" \
  cargo test --workspace --features "$features" -- --test-threads "$(($(nproc) * 2))" --skip "$kafka"
RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/rustc-with-clippy" \
  cargo test --workspace --features "$features" --tests -- --exact "suite::brokers::$kafka"
