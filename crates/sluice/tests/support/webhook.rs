//! A webhook receiver for alarm tests: an HTTP/1.1 listener on 127.0.0.1 that answers 200 to
//! every POST and keeps the JSON bodies it got.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use serde_json::Value;

pub struct Webhook {
    /// Its URL, whose path holds a token as Slack's do: a secret that must never show.
    pub url: String,
    pub token: String,
    received: Arc<Mutex<Vec<Value>>>,
}

impl Webhook {
    pub fn start() -> Webhook {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a port");
        let token = format!("hook-token-{}-{}", std::process::id(), listener.local_addr().unwrap().port());
        let url = format!("http://{}/hook/{token}", listener.local_addr().unwrap());
        let received: Arc<Mutex<Vec<Value>>> = Arc::default();
        let kept = received.clone();
        // Lives as long as the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().expect("a socket"));
                let mut length = 0;
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|read| read > 0) && line != "\r\n" {
                    if let Some((name, value)) = line.split_once(':') {
                        if name.eq_ignore_ascii_case("content-length") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    line.clear();
                }
                let mut body = vec![0; length];
                if reader.read_exact(&mut body).is_ok() {
                    if let Ok(value) = serde_json::from_slice(&body) {
                        kept.lock().unwrap().push(value);
                    }
                }
                let mut stream = stream;
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            }
        });
        Webhook { url, token, received }
    }

    /// The bodies received so far, in order.
    pub fn received(&self) -> Vec<Value> {
        self.received.lock().unwrap().clone()
    }

    /// The events received for one alarm: `firing` / `resolved`, in order.
    pub fn events(&self, alarm: &str) -> Vec<String> {
        self.received()
            .iter()
            .filter(|event| event["name"] == alarm)
            .filter_map(|event| event["event"].as_str().map(str::to_owned))
            .collect()
    }
}
