//! A hermetic NATS server with JetStream for stream-target tests: its own port on 127.0.0.1 and
//! its own store directory, stopped by pid; and a reader of a stream's messages.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::cluster::free_port;

pub struct NatsServer {
    pub port: u16,
    directory: tempfile::TempDir,
    /// A configuration file of the test's own, if it gave one (`start_with`).
    config: Option<PathBuf>,
    child: Option<Child>,
}

/// One message of a stream: its subject, the `Sluice-Key` header and the payload as JSON.
#[derive(Debug, Clone)]
pub struct StreamMessage {
    pub subject: String,
    pub key: String,
    pub payload: serde_json::Value,
}

impl NatsServer {
    pub fn start() -> NatsServer {
        NatsServer::launched(None)
    }

    /// A server with these lines of configuration (`max_payload: 16384`).
    pub fn start_with(configuration: &str) -> NatsServer {
        NatsServer::launched(Some(configuration))
    }

    fn launched(configuration: Option<&str>) -> NatsServer {
        let directory = tempfile::Builder::new()
            .prefix("sluice-nats")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory");
        let config = configuration.map(|text| {
            let path = directory.path().join("server.conf");
            std::fs::write(&path, text).expect("the server's configuration");
            path
        });
        let mut server = NatsServer { port: free_port(), directory, config, child: None };
        server.launch();
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn store(&self) -> PathBuf {
        self.directory.path().join("store")
    }

    fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.directory.path().join("server.log"))
            .expect("the server log");
        let mut command = Command::new("nats-server");
        if let Some(config) = &self.config {
            command.arg("-c").arg(config);
        }
        let child = command
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(self.store())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nats-server starts (apt-get install nats-server; scripts/testdb install does)");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "nats-server did not listen on {}", self.port);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server (SIGTERM, so it writes its store) and starts it again on the same port
    /// and store.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }

    /// How many messages a stream holds; `None` while it does not exist.
    pub fn message_count(&self, stream: &str) -> Option<u64> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let url = self.url();
        runtime.block_on(async move {
            let client = async_nats::connect(url).await.ok()?;
            let context = async_nats::jetstream::new(client);
            let mut stream = context.get_stream(stream).await.ok()?;
            Some(stream.info().await.ok()?.state.messages)
        })
    }

    /// Every message of a stream, in stream order.
    pub fn messages(&self, stream: &str) -> Vec<StreamMessage> {
        messages(&self.url(), stream)
    }
}

/// Every message of a stream of the server at `url`, in stream order.
pub fn messages(url: &str, stream: &str) -> Vec<StreamMessage> {
    {
        let url = url.to_owned();
        let stream = stream.to_owned();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            use futures_util::StreamExt;
            let client = async_nats::connect(url).await.expect("connect to the test NATS");
            let context = async_nats::jetstream::new(client);
            let mut stream = context.get_stream(&stream).await.expect("the stream exists");
            let total = stream.info().await.expect("stream info").state.messages;
            let consumer = stream
                .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
                .await
                .expect("an ordered consumer");
            let mut messages = consumer.messages().await.expect("messages");
            let mut found = Vec::new();
            while (found.len() as u64) < total {
                let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
                    .await
                    .expect("the stream's messages arrive")
                    .expect("more messages")
                    .expect("a message");
                let key = message
                    .headers
                    .as_ref()
                    .and_then(|headers| headers.get("Sluice-Key"))
                    .map(|value| value.as_str().to_owned())
                    .unwrap_or_default();
                let payload = serde_json::from_slice(&message.payload).expect("a JSON payload");
                found.push(StreamMessage { subject: message.subject.to_string(), key, payload });
            }
            found
        })
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
