//! The broker scenarios of `streams.rs` (NATS and Kafka targets and sources, standalone and on a
//! cluster) and the Kafka snapshot of `conformance.rs`, in two tests: the NATS scenarios one
//! after the other, and the Kafka ones one after the other.
//!
//! Two Kafka scenarios must not run beside each other: on a 2-core machine the Kafka oracle's
//! test broker (tansu on moto's S3) at times never made a committed transaction readable (its
//! last stable offset stayed behind) when two brokers ran at once — three times in the whole
//! suite, never in 5 runs alone, one of them beside a steady unrelated binlog load. As ten tests
//! behind one lock they held up to four test threads waiting and ran last, one at a time, at the
//! end of the suite; as two tests, sorted among the first, they run on two threads from the start
//! while the other threads take the rest of the suite. (As one test of all eleven scenarios it was
//! the whole suite's critical path: 690 s of a 691 s suite, against 316 s alone.)
//!
//! A Kafka scenario that fails on the test broker's own stall (its message says
//! `streams::STALLED`; the broker's restarts do not always end it) runs again on a fresh broker,
//! up to three attempts in all, and fails the test if the last fails too; any other failure
//! fails it at once.
//!
//! `SLUICE_BROKER_SCENARIO=TEXT` runs only the scenarios whose name contains TEXT.

use super::streams;

type Scenario = (&'static str, fn());

fn nats_scenarios() -> Vec<Scenario> {
    vec![
        (
            "every_change_reaches_nats_exactly_once_in_order_across_kills_and_broker_restarts",
            streams::every_change_reaches_nats_exactly_once_in_order_across_kills_and_broker_restarts,
        ),
        (
            "every_change_reaches_nats_exactly_once_in_order_on_a_cluster_through_a_kill_and_a_pause",
            streams::every_change_reaches_nats_exactly_once_in_order_on_a_cluster_through_a_kill_and_a_pause,
        ),
        (
            "mysql_to_nats_to_postgres_ends_equal_to_the_source_across_kills_of_the_consumer",
            streams::mysql_to_nats_to_postgres_ends_equal_to_the_source_across_kills_of_the_consumer,
        ),
        (
            "mysql_to_nats_to_postgres_on_a_cluster_ends_equal_to_the_source_across_kills_of_the_consuming_node",
            streams::mysql_to_nats_to_postgres_on_a_cluster_ends_equal_to_the_source_across_kills_of_the_consuming_node,
        ),
        (
            "a_copy_then_stream_into_nats_never_takes_a_key_back_in_time",
            streams::a_copy_then_stream_into_nats_never_takes_a_key_back_in_time,
        ),
    ]
}

#[cfg(feature = "kafka")]
fn kafka_scenarios() -> Vec<Scenario> {
    vec![
        ("a_snapshot_into_kafka_is_exact_through_a_kill", super::conformance::a_snapshot_into_kafka_is_exact_through_a_kill),
        (
            "every_change_reaches_kafka_exactly_once_in_order_across_kills_and_broker_restarts",
            streams::every_change_reaches_kafka_exactly_once_in_order_across_kills_and_broker_restarts,
        ),
        (
            "every_change_reaches_kafka_exactly_once_in_order_on_a_cluster_through_a_kill_and_a_pause",
            streams::every_change_reaches_kafka_exactly_once_in_order_on_a_cluster_through_a_kill_and_a_pause,
        ),
        (
            "mysql_to_kafka_to_postgres_ends_equal_to_the_source_across_kills_of_the_consumer",
            streams::mysql_to_kafka_to_postgres_ends_equal_to_the_source_across_kills_of_the_consumer,
        ),
        (
            "mysql_to_kafka_to_postgres_on_a_cluster_ends_equal_to_the_source_across_kills_of_the_consuming_node",
            streams::mysql_to_kafka_to_postgres_on_a_cluster_ends_equal_to_the_source_across_kills_of_the_consuming_node,
        ),
        (
            "a_copy_then_stream_into_kafka_never_takes_a_key_back_in_time",
            streams::a_copy_then_stream_into_kafka_never_takes_a_key_back_in_time,
        ),
    ]
}

#[cfg(not(feature = "kafka"))]
fn kafka_scenarios() -> Vec<Scenario> {
    Vec::new()
}

#[test]
fn nats_scenarios_run_one_after_another() {
    run_one_after_another(nats_scenarios());
}

#[cfg(feature = "kafka")]
#[test]
fn kafka_scenarios_run_one_after_another() {
    run_one_after_another(kafka_scenarios());
}

/// Runs the scenarios whose name contains `SLUICE_BROKER_SCENARIO` (all without it), each whatever
/// the one before it did, and fails naming every one that failed.
fn run_one_after_another(scenarios: Vec<Scenario>) {
    let only = std::env::var("SLUICE_BROKER_SCENARIO").unwrap_or_default();
    let known = nats_scenarios().into_iter().chain(kafka_scenarios()).any(|(name, _)| name.contains(only.as_str()));
    assert!(known, "no broker scenario's name contains SLUICE_BROKER_SCENARIO={only}");
    let mut failed = Vec::new();
    let mut ran = 0;
    for (name, scenario) in scenarios.into_iter().filter(|(name, _)| name.contains(only.as_str())) {
        let started = std::time::Instant::now();
        eprintln!("broker scenario {name}: starts");
        // Each scenario runs whatever the one before it did; its panic (printed above) is counted.
        let mut outcome = std::panic::catch_unwind(scenario);
        let stalled = |payload: &Box<dyn std::any::Any + Send>| {
            let message =
                payload.downcast_ref::<String>().map(String::as_str).or(payload.downcast_ref::<&str>().copied());
            message.is_some_and(|message| message.contains(streams::STALLED))
        };
        let mut attempts = 1;
        while attempts < 3 && outcome.as_ref().is_err_and(stalled) && name.contains("kafka") {
            // The Kafka test broker (tansu 0.6) at times stops making committed transactions
            // readable for good, restarts included (see above); under the whole suite's load it
            // did so twice in a row in one run.
            eprintln!("broker scenario {name}: FAILED on the test broker's stall; it runs again on a fresh broker");
            outcome = std::panic::catch_unwind(scenario);
            attempts += 1;
        }
        eprintln!(
            "broker scenario {name}: {} in {:.0?}",
            if outcome.is_ok() { "passed" } else { "FAILED" },
            started.elapsed()
        );
        if outcome.is_err() {
            failed.push(name);
        }
        ran += 1;
    }
    assert!(
        failed.is_empty(),
        "{} of {ran} broker scenarios failed (their messages are above): {}",
        failed.len(),
        failed.join(", ")
    );
}
