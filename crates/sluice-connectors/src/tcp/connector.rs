//! The `tcp` connector: a line input of JSON Lines, as a change source.

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_core::connector::{Capabilities, Source};
use sluice_core::spec::{EndpointSpec, JobSpec, SpecError};
use sluice_core::{Result, TableName, TableSchema};

use super::{TcpOptions, TcpSource};
use crate::events::{count_option, names_option, text_option};
use crate::{Connector, SourceSide};

pub(crate) const CONNECTOR: Connector = Connector {
    name: "tcp",
    feature: "tcp",
    secrets: &["auth"],
    capabilities: Capabilities { change_source: true, ..Capabilities::NONE },
    source: Some(SourceSide {
        fields: &[
            "type",
            "listen",
            "table",
            "columns",
            "key",
            "max_line_bytes",
            "max_connections",
            "idle_timeout_secs",
            "auth",
            "tls_cert",
            "tls_key",
        ],
        validate,
        build,
    }),
    target: None,
};

/// The longest line a connection may send by default: 1 MiB.
const DEFAULT_MAX_LINE_BYTES: u64 = 1 << 20;

/// Connections open at once by default.
const DEFAULT_MAX_CONNECTIONS: u64 = 256;

/// Seconds a connection may stay quiet by default.
const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 300;

/// Where to listen: an address and port, or a port alone, on the loopback interface (reachable
/// from this machine only unless the job names an address).
fn listen_address(text: &str) -> Option<SocketAddr> {
    text.parse().ok().or_else(|| {
        let port: u16 = text.strip_prefix(':').unwrap_or(text).parse().ok()?;
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    })
}

fn options(endpoint: &EndpointSpec) -> std::result::Result<TcpOptions, Vec<SpecError>> {
    let mut errors = Vec::new();
    let listen = match text_option(endpoint, "listen") {
        None => {
            errors.push(
                endpoint
                    .error("listen", "missing required field `listen` (the address to listen on, e.g. 127.0.0.1:9000)"),
            );
            None
        }
        Some(text) => match listen_address(&text) {
            Some(address) => Some(address),
            None => {
                errors.push(endpoint.error(
                    "listen",
                    format!("`{text}` is not an address and port such as 127.0.0.1:9000, or a port (on 127.0.0.1)"),
                ));
                None
            }
        },
    };
    let table = text_option(endpoint, "table");
    if table.is_none() {
        errors.push(endpoint.error("table", "missing required field `table` (the table every line is a row of)"));
    }
    let mut columns = crate::declared::declared_columns(
        endpoint.options.get("columns"),
        &endpoint.path_of("columns"),
        endpoint.line,
        &mut errors,
    );
    let names = names_option(endpoint, "key").map_err(|error| errors.push(error)).unwrap_or_default();
    let primary_key = crate::declared::declared_key(
        &mut columns,
        &names,
        &endpoint.path_of("key"),
        endpoint.line_of("key"),
        &mut errors,
    );
    let mut count = |field: &str, default: u64| {
        match count_option(endpoint, field, default) {
            Ok(0) => errors.push(endpoint.error(field, "must be at least 1")),
            Ok(value) => return value,
            Err(error) => errors.push(error),
        }
        default
    };
    let max_line_bytes = count("max_line_bytes", DEFAULT_MAX_LINE_BYTES);
    let max_connections = count("max_connections", DEFAULT_MAX_CONNECTIONS);
    let idle_timeout_secs = count("idle_timeout_secs", DEFAULT_IDLE_TIMEOUT_SECS);
    let auth = text_option(endpoint, "auth").map(|token| {
        sluice_core::secret::register(&token);
        if token.len() < 16 {
            errors.push(endpoint.error("auth", "a token of at least 16 characters, from ${VARIABLE}"));
        }
        sluice_core::secret::Secret::new(token)
    });
    let tls = match (text_option(endpoint, "tls_cert"), text_option(endpoint, "tls_key")) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            match crate::tls::server_config(std::path::Path::new(&cert), std::path::Path::new(&key)) {
                Ok(config) => Some(Arc::new(config)),
                Err(problem) => {
                    errors.push(endpoint.error("tls_cert", problem));
                    None
                }
            }
        }
        (Some(_), None) => {
            errors.push(endpoint.error("tls_key", "missing: tls_cert needs its private key (PEM)"));
            None
        }
        (None, Some(_)) => {
            errors.push(endpoint.error("tls_cert", "missing: tls_key needs its certificate chain (PEM)"));
            None
        }
    };
    match (listen, table) {
        (Some(listen), Some(table)) if errors.is_empty() => Ok(TcpOptions {
            listen,
            max_line_bytes: max_line_bytes as usize,
            max_connections: max_connections as usize,
            idle_timeout: std::time::Duration::from_secs(idle_timeout_secs),
            auth,
            tls,
            table: Arc::new(TableSchema {
                name: TableName::parse(&table),
                columns,
                primary_key,
                indexes: Vec::new(),
                details: Default::default(),
            }),
        }),
        _ => Err(errors),
    }
}

fn validate(_job: &JobSpec, endpoint: &EndpointSpec) -> Vec<SpecError> {
    options(endpoint).err().unwrap_or_default()
}

fn build(job: &JobSpec) -> Result<Arc<dyn Source>> {
    Ok(Arc::new(TcpSource::new(options(&job.source).map_err(crate::invalid)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_alone_listens_on_the_loopback_interface() {
        let loopback = |port| Some(SocketAddr::from(([127, 0, 0, 1], port)));
        assert_eq!(listen_address("9000"), loopback(9000));
        assert_eq!(listen_address(":9000"), loopback(9000));
        assert_eq!(listen_address("0.0.0.0:9000"), Some(SocketAddr::from(([0, 0, 0, 0], 9000))));
        assert_eq!(listen_address("[::1]:9000").map(|address| address.is_ipv6()), Some(true));
        assert_eq!(listen_address("localhost:9000"), None);
        assert_eq!(listen_address("99999"), None);
    }
}
