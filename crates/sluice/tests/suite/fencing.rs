//! Fencing in the targets themselves (PostgreSQL, MariaDB, ClickHouse): once a newer epoch claims a
//! task, a writer of the older epoch can neither commit rows nor its checkpoint, nor claim the
//! task back; the newer owner commits normally, and a stalled old writer's row locks are freed
//! when its idle transaction times out.

use crate::support;

use std::sync::Arc;

use sluice_core::change::{Batch, Change, Position};
use sluice_core::connector::{Checkpoint, Fence};
use sluice_core::spec::parse_job;
use sluice_core::{Column, DataType, ErrorKind, TableName, TableSchema, Value};
use support::{mariadb, mysql_url, postgres_url, psql, unique_name};

fn table(namespace: &str) -> Arc<TableSchema> {
    Arc::new(TableSchema {
        name: TableName::new(Some(namespace), "fenced"),
        columns: vec![Column::new("id", DataType::Integer { bytes: 8, unsigned: false }, false)],
        primary_key: vec![0],
        indexes: Vec::new(),
        details: Default::default(),
    })
}

fn checkpoint(rows: u64) -> Checkpoint {
    Checkpoint {
        task: "t1".into(),
        position: Some(Position(serde_json::json!({ "row": rows }))),
        done: false,
        rows_written: rows,
    }
}

fn batch(table: &Arc<TableSchema>, id: i64) -> Batch {
    Batch::new(vec![Change::insert(table.clone(), vec![Value::Int(id)])], Position(serde_json::json!({ "row": id })))
}

async fn older_epochs_cannot_commit(target: &str, url: String, namespace: &str, count: impl Fn() -> u64) {
    let yaml = format!("name: fence-{namespace}\nmode: snapshot\nsource:\n  type: sqlite\n  path: none.db\ntarget:\n  type: {target}\n  url: \"{url}\"\n");
    // The URL is written into the job, not set in the process environment, which the tests
    // running beside this one share.
    let job = parse_job(&yaml, false, |_| None).expect("a valid job");
    let fenced =
        |epoch| sluice_connectors::fenced_sink(&job, Fence { task: "stream".into(), epoch }).expect("a fenced sink");
    let (old, new) = (fenced(10), fenced(11));
    old.prepare(&[(*table(namespace)).clone()]).await.expect("prepare");
    old.claim(&job.name).await.expect("epoch 10 claims");
    let mut old_writer = old.open(&job.name, "t1", table(namespace)).await.unwrap();
    old_writer.write(&batch(&table(namespace), 1)).await.unwrap();
    old_writer.commit(&checkpoint(1)).await.expect("epoch 10 commits while it holds the fence");

    // Epoch 11 claims. The old owner's open session fails: PostgreSQL ends it at the claim,
    // MariaDB refuses its commit.
    new.claim(&job.name).await.expect("epoch 11 claims");
    let stale = async {
        old_writer.write(&batch(&table(namespace), 2)).await?;
        old_writer.commit(&checkpoint(2)).await
    };
    assert!(stale.await.is_err(), "the old owner's session cannot commit");
    // A session it opens afterwards (its retry) is refused by the fence.
    let mut retry = old.open(&job.name, "t1", table(namespace)).await.unwrap();
    retry.write(&batch(&table(namespace), 2)).await.unwrap();
    let refused = retry.commit(&checkpoint(2)).await.expect_err("epoch 10 is fenced");
    assert_eq!(refused.kind(), ErrorKind::Fenced, "{refused}");
    assert!(refused.to_string().contains("epoch 11"), "{refused}");
    assert_eq!(count(), 1, "the fenced commit's row did not land");
    let refused = old.claim(&job.name).await.expect_err("epoch 10 cannot claim back");
    assert_eq!(refused.kind(), ErrorKind::Fenced);

    // The new owner reads the old owner's last checkpoint and commits.
    let mut new_writer = new.open(&job.name, "t1", table(namespace)).await.unwrap();
    assert_eq!(new_writer.recover().await.unwrap().map(|checkpoint| checkpoint.rows_written), Some(1));
    new_writer.write(&batch(&table(namespace), 2)).await.unwrap();
    new_writer.commit(&checkpoint(2)).await.expect("epoch 11 commits");
    assert_eq!(count(), 2);
}

/// A worker stalled inside a transaction (paused, cut off) holds row locks; its session ends
/// after 10 s idle, so the task's new owner gets the rows instead of waiting for the old one.
async fn a_stalled_writer_gives_up_its_locks(target: &str, url: String, namespace: &str, count: impl Fn() -> u64) {
    let yaml = format!("name: stall-{namespace}\nmode: snapshot\nsource:\n  type: sqlite\n  path: none.db\ntarget:\n  type: {target}\n  url: \"{url}\"\n");
    // The URL is written into the job, not set in the process environment, which the tests
    // running beside this one share.
    let job = parse_job(&yaml, false, |_| None).expect("a valid job");
    let fenced =
        |epoch| sluice_connectors::fenced_sink(&job, Fence { task: "stream".into(), epoch }).expect("a fenced sink");
    let (old, new) = (fenced(20), fenced(21));
    old.prepare(&[(*table(namespace)).clone()]).await.expect("prepare");
    old.claim(&job.name).await.unwrap();
    let mut old_writer = old.open(&job.name, "t1", table(namespace)).await.unwrap();
    old_writer.write(&batch(&table(namespace), 7)).await.unwrap();
    // The old owner now stalls with row 7 locked in its open transaction.
    new.claim(&job.name).await.unwrap();
    let started = std::time::Instant::now();
    let taken_over = async {
        let mut new_writer = new.open(&job.name, "t1", table(namespace)).await?;
        new_writer.write(&batch(&table(namespace), 7)).await?;
        new_writer.commit(&checkpoint(7)).await
    };
    tokio::time::timeout(std::time::Duration::from_secs(40), taken_over)
        .await
        .expect("the stalled session's locks were freed within 40 s")
        .expect("the new owner writes and commits");
    eprintln!("{target}: the new owner committed {:?} after the old one stalled", started.elapsed());
    assert_eq!(count(), 1);
    assert!(old_writer.commit(&checkpoint(7)).await.is_err(), "the stalled writer cannot commit when it wakes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ends_a_stalled_writers_transaction() {
    let namespace = unique_name("stall");
    psql(&format!("CREATE SCHEMA {namespace}"));
    let query = format!("SELECT count(*) FROM {namespace}.fenced");
    a_stalled_writer_gives_up_its_locks("postgres", postgres_url(), &namespace, || {
        psql(&query).trim().parse().unwrap()
    })
    .await;
    psql(&format!("DROP SCHEMA {namespace} CASCADE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_ends_a_stalled_writers_transaction() {
    let namespace = unique_name("stall");
    mariadb(&format!("CREATE DATABASE {namespace}"));
    let query = format!("SELECT count(*) FROM {namespace}.fenced");
    a_stalled_writer_gives_up_its_locks("mysql", mysql_url(), &namespace, || mariadb(&query).trim().parse().unwrap())
        .await;
    mariadb(&format!("DROP DATABASE {namespace}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_commits_of_an_older_epoch() {
    let namespace = unique_name("fence");
    psql(&format!("CREATE SCHEMA {namespace}"));
    let query = format!("SELECT count(*) FROM {namespace}.fenced");
    older_epochs_cannot_commit("postgres", postgres_url(), &namespace, || psql(&query).trim().parse().unwrap()).await;
    psql(&format!("DROP SCHEMA {namespace} CASCADE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_refuses_commits_of_an_older_epoch() {
    let namespace = unique_name("fence");
    mariadb(&format!("CREATE DATABASE {namespace}"));
    let query = format!("SELECT count(*) FROM {namespace}.fenced");
    older_epochs_cannot_commit("mysql", mysql_url(), &namespace, || mariadb(&query).trim().parse().unwrap()).await;
    mariadb(&format!("DROP DATABASE {namespace}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_refuses_commits_of_an_older_epoch() {
    let namespace = unique_name("fence");
    let query = format!("SELECT count() FROM {namespace}.fenced_live");
    older_epochs_cannot_commit("clickhouse", support::clickhouse::url(), &namespace, || {
        support::clickhouse::query(&query).trim().parse().unwrap()
    })
    .await;
    support::clickhouse::query(&format!("DROP DATABASE {namespace}"));
}
