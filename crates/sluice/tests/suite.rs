//! Every integration test of the `sluice` binary, compiled and linked once: each file of
//! `suite/` is a module named after what it tests, `support/` the helpers they share. The tests
//! run against the servers `scripts/test.sh` starts (one MariaDB and one PostgreSQL for all,
//! each test in databases of its own); a test that changes a server's global state starts a
//! server of its own (`support::mariadb_server`).

mod support;

mod suite {
    mod bad_input;
    mod brokers;
    mod cdc;
    mod cdc_source_settings;
    mod clickhouse_target;
    mod cluster;
    mod conformance;
    mod console;
    mod crash_points;
    mod failover;
    mod fan_in;
    mod faults;
    mod fencing;
    mod file_inputs;
    mod iceberg_target;
    mod lake;
    mod lanes;
    mod layering;
    mod migration;
    mod mysql_edge_cases;
    mod mysql_to_postgres;
    mod parquet_target;
    mod postgres_source;
    mod resync;
    mod schedules;
    mod server_api;
    mod snapshot_resume;
    mod standalone;
    mod streams;
    mod targets;
    mod tls;
    mod transform;
    mod two_way;
    mod type_matrix;
    mod verify;
}
