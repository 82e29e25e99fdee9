//! A TCP proxy that injects faults between Sluice and a server, in the manner of toxiproxy:
//! tests point a job at the proxy's address and switch faults on and off while it runs.
//!
//! Every fault applies to data flowing in both directions of every connection, current and
//! future, from the moment it is set.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the bytes it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Forward everything at once.
    #[default]
    None,
    /// Hold every chunk for this long before forwarding it.
    Latency(Duration),
    /// Forward nothing (the peers see a silent connection) until the fault changes.
    Stall,
    /// Forward in pieces of at most `bytes`, with `pause` between pieces.
    Slice { bytes: usize, pause: Duration },
    /// Forward `bytes` more bytes per direction, then reset the connection.
    ResetAfter { bytes: usize },
    /// The server is down: every open connection is reset, and every new one is reset as soon
    /// as it is accepted, until the fault changes.
    Down,
}

/// A running proxy. Dropping it stops accepting; `reset_all` ends every open connection.
#[derive(Debug)]
pub struct Proxy {
    address: SocketAddr,
    fault: watch::Sender<Fault>,
    /// Bumped to reset every open connection at once.
    resets: watch::Sender<u64>,
    accepted: Arc<Mutex<u64>>,
    listener: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        Proxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream).await
    }

    /// Listens on `address` and forwards each connection to `upstream`.
    pub async fn start_on(address: SocketAddr, upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let (fault, fault_watch) = watch::channel(Fault::None);
        let (resets, reset_watch) = watch::channel(0u64);
        let accepted = Arc::new(Mutex::new(0));
        let counter = accepted.clone();
        let listener = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                *counter.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) += 1;
                let (fault, resets) = (fault_watch.clone(), reset_watch.clone());
                if *fault.borrow() == Fault::Down {
                    reset_socket(&client);
                    continue;
                }
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        relay(client, server, fault, resets).await;
                    }
                });
            }
        });
        Ok(Proxy { address, fault, resets, accepted, listener })
    }

    /// The address to connect to instead of the upstream.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Resets (RST, not FIN) every connection open now.
    pub fn reset_all(&self) {
        self.resets.send_modify(|generation| *generation += 1);
    }

    /// Connections accepted since the start.
    pub fn connections(&self) -> u64 {
        *self.accepted.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.listener.abort();
        self.reset_all();
    }
}

/// Relays both directions in one task until both sides have closed, a fault resets the
/// connection, or `reset_all` is called. A reset closes both sockets with linger 0: the peers see
/// RST, as from a crashed host, not an orderly FIN.
async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    mut fault: watch::Receiver<Fault>,
    mut resets: watch::Receiver<u64>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // The receivers are clones of the listener's, which saw no change: mark what exists now as
    // seen, so only later faults and resets reach this connection.
    fault.borrow_and_update();
    resets.borrow_and_update();
    let mut from_client = vec![0u8; 64 * 1024];
    let mut from_server = vec![0u8; 64 * 1024];
    // Bytes left per direction before a ResetAfter fault fires; re-armed whenever the fault is set.
    let mut budget: [Option<usize>; 2] = [None, None];
    let mut open = [true, true];
    let reset = loop {
        if !open[0] && !open[1] {
            break false;
        }
        if matches!(*fault.borrow(), Fault::Down) {
            break true;
        }
        if matches!(*fault.borrow(), Fault::Stall) {
            tokio::select! {
                changed = fault.changed() => if changed.is_err() { break true },
                _ = resets.changed() => break true,
            }
            continue;
        }
        let (direction, read) = tokio::select! {
            read = client.read(&mut from_client), if open[0] => (0, read),
            read = server.read(&mut from_server), if open[1] => (1, read),
            changed = fault.changed() => {
                if changed.is_err() { break true }
                budget = [None, None];
                continue;
            }
            _ = resets.changed() => break true,
        };
        let Ok(count) = read else { break true };
        let (data, destination) =
            if direction == 0 { (&from_client[..count], &mut server) } else { (&from_server[..count], &mut client) };
        if count == 0 {
            open[direction] = false;
            let _ = destination.shutdown().await;
            continue;
        }
        let current = *fault.borrow();
        if forward(data, destination, current, &mut budget[direction]).await.is_err() {
            break true;
        }
    };
    if reset {
        reset_socket(&client);
        reset_socket(&server);
    }
}

/// Makes the socket's drop send RST: a zero linger never blocks on drop (the deprecation is
/// about non-zero timeouts), and the kernel discards unsent data and resets at once.
fn reset_socket(socket: &TcpStream) {
    #[allow(deprecated)]
    let _ = socket.set_linger(Some(Duration::ZERO));
}

/// Forwards one chunk under a fault; an error means the connection must be reset.
async fn forward(
    data: &[u8],
    destination: &mut TcpStream,
    fault: Fault,
    budget: &mut Option<usize>,
) -> std::io::Result<()> {
    match fault {
        Fault::None | Fault::Stall => destination.write_all(data).await,
        Fault::Down => Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fault: the server is down")),
        Fault::Latency(delay) => {
            tokio::time::sleep(delay).await;
            destination.write_all(data).await
        }
        Fault::Slice { bytes, pause } => {
            for piece in data.chunks(bytes.max(1)) {
                destination.write_all(piece).await?;
                tokio::time::sleep(pause).await;
            }
            Ok(())
        }
        Fault::ResetAfter { bytes } => {
            let left = budget.get_or_insert(bytes);
            if data.len() < *left {
                *left -= data.len();
                return destination.write_all(data).await;
            }
            destination.write_all(&data[..*left]).await?;
            Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "fault: reset after the byte budget"))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// An upstream that echoes everything back.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    while let Ok(count) = socket.read(&mut buffer).await {
                        if count == 0 || socket.write_all(&buffer[..count]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    async fn round_trip(address: SocketAddr, payload: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut socket = TcpStream::connect(address).await?;
        socket.write_all(payload).await?;
        let mut received = vec![0u8; payload.len()];
        socket.read_exact(&mut received).await?;
        Ok(received)
    }

    #[tokio::test]
    async fn bytes_pass_unchanged_without_a_fault() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let payload: Vec<u8> = (0..200_000u32).map(|index| index as u8).collect();
        assert_eq!(round_trip(proxy.address(), &payload).await.unwrap(), payload);
        assert_eq!(proxy.connections(), 1);
    }

    #[tokio::test]
    async fn latency_and_slicing_delay_but_keep_the_bytes() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        proxy.set(Fault::Latency(Duration::from_millis(50)));
        let start = Instant::now();
        assert_eq!(round_trip(proxy.address(), b"ping").await.unwrap(), b"ping");
        assert!(start.elapsed() >= Duration::from_millis(100), "both directions waited");
        proxy.set(Fault::Slice { bytes: 3, pause: Duration::from_millis(1) });
        assert_eq!(round_trip(proxy.address(), b"sliced payload").await.unwrap(), b"sliced payload");
    }

    #[tokio::test]
    async fn reset_after_a_budget_cuts_the_connection_mid_stream() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        proxy.set(Fault::ResetAfter { bytes: 1_000 });
        let error = round_trip(proxy.address(), &[7u8; 10_000]).await.unwrap_err();
        assert!(
            matches!(error.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn a_stall_is_silent_until_lifted_and_reset_all_ends_connections() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut socket = TcpStream::connect(proxy.address()).await.unwrap();
        proxy.set(Fault::Stall);
        socket.write_all(b"held").await.unwrap();
        let mut buffer = [0u8; 4];
        let silent = tokio::time::timeout(Duration::from_millis(200), socket.read_exact(&mut buffer)).await;
        assert!(silent.is_err(), "nothing passes during a stall");
        proxy.set(Fault::None);
        socket.read_exact(&mut buffer).await.unwrap();
        assert_eq!(&buffer, b"held");
        proxy.reset_all();
        let after = socket.read(&mut buffer).await;
        assert!(matches!(after, Ok(0) | Err(_)), "the connection is gone: {after:?}");
        assert_eq!(round_trip(proxy.address(), b"fresh").await.unwrap(), b"fresh", "new connections are not reset");
    }

    #[tokio::test]
    async fn a_server_down_resets_open_and_new_connections_until_it_is_up_again() {
        let proxy = Proxy::start(echo_server().await).await.unwrap();
        let mut open = TcpStream::connect(proxy.address()).await.unwrap();
        open.write_all(b"up").await.unwrap();
        let mut buffer = [0u8; 2];
        open.read_exact(&mut buffer).await.unwrap();
        proxy.set(Fault::Down);
        let after = open.read(&mut buffer).await;
        assert!(matches!(after, Ok(0) | Err(_)), "the open connection is gone: {after:?}");
        assert!(round_trip(proxy.address(), b"refused").await.is_err(), "a new connection is reset");
        proxy.set(Fault::None);
        assert_eq!(round_trip(proxy.address(), b"back").await.unwrap(), b"back");
    }
}
