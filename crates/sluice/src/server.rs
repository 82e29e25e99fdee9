//! `sluice server`: wires the coordination store, the node and the HTTP API together.

mod open_connections;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Error, Result};
use tokio::sync::watch;

use crate::api::{router, Api, Tokens};
use crate::cluster::etcd::{EtcdOptions, EtcdStore};
use crate::cluster::node::{Node, NodeConfig};
use crate::cluster::store::{MemoryStore, Store};
use crate::document_rules::{DocumentRules, ServerRules};
use open_connections::OpenConnections;

#[derive(Debug)]
pub struct Options {
    pub etcd: Option<EtcdOptions>,
    pub listen: SocketAddr,
    /// The API's certificate chain and key (PEM): HTTPS instead of HTTP.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// The API's open connections at most (`open_connections`).
    pub max_connections: usize,
    /// How long a connection may take to send a request's head, or stay idle between requests.
    pub header_timeout: Duration,
    pub open_metrics: bool,
    pub node_id: Option<String>,
    pub state_dir: PathBuf,
    pub capacity: usize,
    pub weight: f64,
    /// `--zone` and `--label NAME=VALUE`s, as given: checked at start.
    pub zone: Option<String>,
    pub labels: Vec<String>,
    pub lease_secs: u64,
    pub tokens_file: Option<PathBuf>,
    /// Global alarm rules that replace the cluster's when this node starts.
    pub alarms: Option<PathBuf>,
    /// Where documents' `${NAME}`s take their values (`--env-prefix`, `--secrets-dir`).
    pub env_prefix: String,
    pub secrets_dir: Option<PathBuf>,
    /// The directory documents' paths stay inside (`--data-root`; default `<state-dir>/data`).
    pub data_root: Option<PathBuf>,
}

/// Runs the server until SIGINT/SIGTERM; the exit code.
pub async fn serve(options: Options) -> u8 {
    match run(options).await {
        Ok(()) => 0,
        Err(error) => {
            eprintln!("error: {error}");
            error.exit_code() as u8
        }
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "node".to_owned())
}

/// Connects to etcd, retrying for 30 s: a cluster electing a new leader answers "unavailable"
/// for a moment, and a node started with its cluster should wait for it rather than exit.
async fn connect_etcd(options: &EtcdOptions) -> Result<EtcdStore> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match EtcdStore::connect(options).await {
            Ok(store) => return Ok(store),
            Err(error)
                if error.kind() == sluice_core::ErrorKind::Unavailable && std::time::Instant::now() < deadline =>
            {
                log::warn!("{error}; trying again");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

async fn run(options: Options) -> Result<()> {
    let tokens = Tokens::load(options.tokens_file.as_deref())?;
    if tokens.is_empty() && !options.listen.ip().is_loopback() {
        return Err(Error::config(format!(
            "no API token is set, so the server may listen on loopback only, not on {}",
            options.listen
        ))
        .hint("set SLUICE_ADMIN_TOKEN (and SLUICE_READ_TOKEN) or --tokens-file, or listen on 127.0.0.1"));
    }
    if options.capacity == 0 || options.lease_secs < 2 || !(options.weight > 0.0 && options.weight.is_finite()) {
        return Err(Error::config("--capacity must be at least 1, --weight above 0 and --lease-secs at least 2"));
    }
    let (zone, labels) = placement_of(options.zone.as_deref(), &options.labels)?;
    crate::private_files::create_dir(&options.state_dir).map_err(|error| {
        Error::config(format!("--state-dir {}: cannot create it: {error}", options.state_dir.display()))
    })?;
    let data_root = options.data_root.clone().unwrap_or_else(|| options.state_dir.join("data"));
    let rules = ServerRules::new(options.env_prefix.clone(), options.secrets_dir.clone(), &data_root)
        .map_err(|error| Error::config(format!("--data-root {}: cannot create it: {error}", data_root.display())))?;
    let document_rules = DocumentRules::Server(rules);
    let id = options.node_id.clone().unwrap_or_else(|| format!("{}-{}", host_name(), options.listen.port()));
    let store: Arc<dyn Store> = match &options.etcd {
        Some(members) => Arc::new(connect_etcd(members).await?),
        None => Arc::new(MemoryStore::open(Some(options.state_dir.join("server.json")))?),
    };
    if let Some(path) = &options.alarms {
        let text = std::fs::read_to_string(path)
            .map_err(|error| Error::config(format!("--alarms {}: cannot read it: {error}", path.display())))?;
        let rules = crate::alarms::checked_rules(&text, &document_rules).map_err(|errors| {
            let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
            Error::config(format!("--alarms {}: {}", path.display(), listed.join("; ")))
                .hint("the file holds rules as a job's `alarms:` does (a list, or {alarms: [...]})")
        })?;
        store.put(crate::alarms::GLOBAL_RULES, &text, None).await?;
        log::info!("node {id}: {rules} global alarm rules from {}", path.display());
    }
    let tls = match &options.tls {
        Some((cert, key)) => {
            let config = sluice_connectors::tls::server_config(cert, key)
                .map_err(|error| Error::config(format!("--tls-cert/--tls-key: {error}")))?;
            Some(axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(config)))
        }
        None => None,
    };
    let listener = std::net::TcpListener::bind(options.listen)
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .map_err(|error| Error::config(format!("--listen {}: cannot listen: {error}", options.listen)))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let config = NodeConfig {
        id: id.clone(),
        address: format!("{scheme}://{}", options.listen),
        capacity: options.capacity,
        weight: options.weight,
        zone,
        labels,
        lease: Duration::from_secs(options.lease_secs),
        state_dir: options.state_dir.clone(),
        fencing: options.etcd.is_some(),
        document_rules,
    };
    let node = Node::start(store, config).await?;
    let (stop, stopped) = watch::channel(false);
    tokio::spawn(crate::watch_signals(stop));
    let running = tokio::spawn(node.clone().run(stopped.clone()));
    log::info!(
        "node {id}: API on {scheme}://{} ({}); {} tokens",
        options.listen,
        if options.etcd.is_some() { "cluster on etcd" } else { "single node" },
        if tokens.is_empty() { "no" } else { "with" }
    );
    let series = Arc::new(crate::api::series::Series::default());
    series.start(node.copy_first());
    let api = Arc::new(Api { node, tokens, open_metrics: options.open_metrics, series });
    let handle = axum_server::Handle::new();
    let mut shutdown = stopped.clone();
    let stopping = handle.clone();
    tokio::spawn(async move {
        let _ = shutdown.wait_for(|stopped| *stopped).await;
        stopping.graceful_shutdown(Some(Duration::from_secs(10)));
    });
    let service = OpenConnections::new(router(api), options.max_connections);
    // axum-server leaves both timeouts off: without them a client that never sends a request
    // (or a whole request head) holds its connection for ever. The first request's covers the
    // protocol detection before hyper reads a head; the header-read one, each head after.
    let header_timeout = options.header_timeout;
    let served = match tls {
        Some(tls) => match axum_server::from_tcp_rustls(listener, tls) {
            Ok(mut server) => {
                server.http_builder().http1().header_read_timeout(header_timeout);
                server.first_request_timeout(header_timeout).handle(handle).serve(service).await
            }
            Err(error) => Err(error),
        },
        None => match axum_server::from_tcp(listener) {
            Ok(mut server) => {
                server.http_builder().http1().header_read_timeout(header_timeout);
                server.first_request_timeout(header_timeout).handle(handle).serve(service).await
            }
            Err(error) => Err(error),
        },
    };
    let _ = running.await;
    served.map_err(|error| Error::config(format!("the API server failed: {error}")))
}

/// `--zone` and the `--label NAME=VALUE`s, checked: every problem in one error.
fn placement_of(zone: Option<&str>, labels: &[String]) -> Result<(Option<String>, BTreeMap<String, String>)> {
    use sluice_core::spec::is_placement_word;
    let mut problems = Vec::new();
    if let Some(zone) = zone.filter(|zone| !is_placement_word(zone)) {
        problems.push(format!("--zone `{zone}`"));
    }
    let mut parsed = BTreeMap::new();
    for label in labels {
        match label.split_once('=') {
            Some((name, value)) if is_placement_word(name) && is_placement_word(value) => {
                parsed.insert(name.to_owned(), value.to_owned());
            }
            _ => problems.push(format!("--label `{label}`")),
        }
    }
    if !problems.is_empty() {
        return Err(Error::config(format!(
            "{}: a zone, a label's name and its value are 1 to 63 letters, digits, `-`, `_` or `.`; a label is NAME=VALUE",
            problems.join(", ")
        )));
    }
    Ok((zone.map(str::to_owned), parsed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_and_labels_are_checked_all_at_once() {
        let (zone, labels) = placement_of(Some("east"), &["disk=ssd".into(), "rack=r1".into()]).unwrap();
        assert_eq!(zone.as_deref(), Some("east"));
        assert_eq!(labels.get("disk").map(String::as_str), Some("ssd"));
        let error = placement_of(Some("east coast"), &["disk".into(), "ok=yes".into(), "a=b c".into()]).unwrap_err();
        let message = error.to_string();
        for named in ["--zone `east coast`", "--label `disk`", "--label `a=b c`"] {
            assert!(message.contains(named), "{message}");
        }
        assert!(!message.contains("ok=yes"), "{message}");
    }
}
