//! The coordination store on etcd: leases, guarded writes as transactions comparing create
//! revisions. Only this file knows etcd's client.

use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use sluice_core::{Error, ErrorKind, Result};

use super::store::{store_error, Entry, Guard, Store};

/// A connection to an etcd cluster (any of its members).
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("EtcdStore").finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Connects to the members in `endpoints` (`http://host:port`, comma separated).
    pub async fn connect(endpoints: &str) -> Result<EtcdStore> {
        let members: Vec<String> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|member| !member.is_empty())
            .map(|member| if member.contains("://") { member.to_owned() } else { format!("http://{member}") })
            .collect();
        if members.is_empty() {
            return Err(Error::config("--etcd: no member given; expected http://host:port[,http://host:port…]"));
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(3))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        let client = Client::connect(&members, Some(options)).await.map_err(|error| {
            Error::new(ErrorKind::Connect, format!("cannot reach etcd at {}: {error}", members.join(",")))
                .hint("start etcd or fix --etcd")
        })?;
        let store = EtcdStore { client };
        // Connecting is lazy: one read proves a member answers.
        store.get("/sluice/").await?;
        Ok(store)
    }
}

/// Runs `call` again (up to 4 times) while it fails to connect: the client spreads requests over
/// every member, dead ones included, and a request that could not connect was never sent, so
/// trying again (on the next member) is safe even for a write.
async fn retrying<T, F, Fut>(doing: &str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let mut attempt = 1;
    loop {
        match call().await {
            Ok(value) => return Ok(value),
            Err(error) if attempt < 4 && format!("{error:?}").contains("ConnectError") => attempt += 1,
            Err(error) => return Err(store_error(doing, error)),
        }
    }
}

impl EtcdStore {
    /// Runs a transaction (its compares, then its operations when they hold).
    async fn transaction(&self, doing: &str, transaction: Txn) -> Result<etcd_client::TxnResponse> {
        retrying(doing, || {
            let mut client = self.client.clone();
            let transaction = transaction.clone();
            async move { client.txn(transaction).await }
        })
        .await
    }
}

fn entry(value: &KeyValue) -> Entry {
    Entry {
        key: String::from_utf8_lossy(value.key()).into_owned(),
        value: String::from_utf8_lossy(value.value()).into_owned(),
        create_revision: value.create_revision() as u64,
        mod_revision: value.mod_revision() as u64,
    }
}

fn put_options(lease: Option<i64>) -> Option<PutOptions> {
    lease.map(|lease| PutOptions::new().with_lease(lease))
}

#[async_trait]
impl Store for EtcdStore {
    async fn grant(&self, ttl: Duration) -> Result<i64> {
        let response = retrying("grant a lease", || {
            let mut client = self.client.clone();
            async move { client.lease_grant(ttl.as_secs().max(1) as i64, None).await }
        })
        .await?;
        Ok(response.id())
    }

    async fn renew(&self, lease: i64) -> Result<bool> {
        let renewed = async {
            let (mut keeper, mut responses) = self.client.clone().lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            responses.message().await
        }
        .await;
        match renewed {
            Ok(response) => Ok(response.is_some_and(|response| response.ttl() > 0)),
            // etcd forgot the lease: it ended.
            Err(error) if error.to_string().contains("lease not found") => Ok(false),
            Err(error) => Err(store_error("renew the lease", error)),
        }
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        retrying("revoke the lease", || {
            let mut client = self.client.clone();
            async move { client.lease_revoke(lease).await }
        })
        .await?;
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Entry>> {
        let response = retrying("read", || {
            let mut client = self.client.clone();
            async move { client.get(key, None).await }
        })
        .await?;
        Ok(response.kvs().first().map(entry))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<Entry>> {
        let response = retrying("list", || {
            let mut client = self.client.clone();
            async move { client.get(prefix, Some(GetOptions::new().with_prefix())).await }
        })
        .await?;
        Ok(response.kvs().iter().map(entry).collect())
    }

    async fn put(&self, key: &str, value: &str, lease: Option<i64>) -> Result<u64> {
        let response = retrying("write", || {
            let mut client = self.client.clone();
            async move { client.put(key, value, put_options(lease)).await }
        })
        .await?;
        Ok(response.header().map_or(0, |header| header.revision() as u64))
    }

    async fn create(&self, key: &str, value: &str, lease: Option<i64>) -> Result<Option<u64>> {
        let transaction = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key,
            value,
            put_options(lease),
        )]);
        let response = self.transaction("create", transaction).await?;
        Ok(response.succeeded().then(|| response.header().map_or(0, |header| header.revision() as u64)))
    }

    async fn replace(&self, key: &str, value: &str, mod_revision: u64) -> Result<bool> {
        let transaction = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, mod_revision as i64)])
            .and_then([TxnOp::put(key, value, None)]);
        let response = self.transaction("write", transaction).await?;
        Ok(response.succeeded())
    }

    async fn put_guarded(&self, key: &str, value: &str, guard: &Guard) -> Result<bool> {
        let transaction = Txn::new()
            .when([Compare::create_revision(guard.key.as_str(), CompareOp::Equal, guard.create_revision as i64)])
            .and_then([TxnOp::put(key, value, None)]);
        let response = self.transaction("write", transaction).await?;
        Ok(response.succeeded())
    }

    async fn delete_guarded(&self, guard: &Guard) -> Result<bool> {
        let transaction = Txn::new()
            .when([Compare::create_revision(guard.key.as_str(), CompareOp::Equal, guard.create_revision as i64)])
            .and_then([TxnOp::delete(guard.key.as_str(), None)]);
        let response = self.transaction("delete", transaction).await?;
        Ok(response.succeeded())
    }

    async fn delete(&self, key: &str) -> Result<()> {
        retrying("delete", || {
            let mut client = self.client.clone();
            async move { client.delete(key, None).await }
        })
        .await?;
        Ok(())
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        retrying("delete", || {
            let mut client = self.client.clone();
            async move { client.delete(prefix, Some(etcd_client::DeleteOptions::new().with_prefix())).await }
        })
        .await?;
        Ok(())
    }
}
