//! The fault proxy as a process, for scripts (bench/soak.sh): forwards a loopback port to an
//! upstream and takes faults, one command per line, on standard input:
//!
//! ```text
//! none | stall | down | reset | latency MS | slice BYTES MS | reset-after BYTES
//! ```
//!
//! It prints `LISTEN 127.0.0.1:PORT` once it listens, `OK` after each command, and ends when
//! standard input closes.
//!
//!     sluice-fault-proxy UPSTREAM_HOST:PORT [--listen 127.0.0.1:PORT]

use std::net::SocketAddr;
use std::time::Duration;

use sluice_faults::{Fault, Proxy};
use tokio::io::AsyncBufReadExt;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let (upstream, listen) = match arguments.as_slice() {
        [upstream] => (upstream.clone(), None),
        [upstream, flag, listen] if flag == "--listen" => (upstream.clone(), Some(listen.clone())),
        _ => fail("usage: sluice-fault-proxy UPSTREAM_HOST:PORT [--listen 127.0.0.1:PORT]"),
    };
    let upstream: SocketAddr =
        upstream.parse().unwrap_or_else(|_| fail(&format!("`{upstream}` is not an address like 127.0.0.1:3306")));
    let listen: Option<SocketAddr> = listen.map(|listen| {
        listen.parse().unwrap_or_else(|_| fail(&format!("`{listen}` is not an address like 127.0.0.1:4000")))
    });
    let proxy = match listen {
        Some(address) => Proxy::start_on(address, upstream).await,
        None => Proxy::start(upstream).await,
    }
    .unwrap_or_else(|error| fail(&format!("cannot listen: {error}")));
    println!("LISTEN {}", proxy.address());
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match command(&line) {
            Some(Command::Fault(fault)) => proxy.set(fault),
            Some(Command::Reset) => proxy.reset_all(),
            None => {
                eprintln!("sluice-fault-proxy: unknown command `{line}`");
                continue;
            }
        }
        println!("OK");
    }
}

enum Command {
    Fault(Fault),
    Reset,
}

fn command(line: &str) -> Option<Command> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let number = |index: usize| words.get(index).and_then(|word| word.parse::<u64>().ok());
    let millis = |index: usize| number(index).map(Duration::from_millis);
    Some(match words.first().copied()? {
        "none" => Command::Fault(Fault::None),
        "stall" => Command::Fault(Fault::Stall),
        "down" => Command::Fault(Fault::Down),
        "reset" => Command::Reset,
        "latency" => Command::Fault(Fault::Latency(millis(1)?)),
        "slice" => Command::Fault(Fault::Slice { bytes: number(1)? as usize, pause: millis(2)? }),
        "reset-after" => Command::Fault(Fault::ResetAfter { bytes: number(1)? as usize }),
        _ => return None,
    })
}

fn fail(message: &str) -> ! {
    eprintln!("sluice-fault-proxy: {message}");
    std::process::exit(2)
}
