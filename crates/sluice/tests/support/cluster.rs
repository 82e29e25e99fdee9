//! Cluster test parts: etcd members and `sluice server` nodes as child processes (so SIGKILL and
//! SIGSTOP are real), and a small HTTP client for the API.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{wait_for, Guard, Workspace};

/// A free TCP port on 127.0.0.1 (free when asked; the OS does not hand it out again at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port").local_addr().expect("an address").port()
}

/// An etcd cluster of one or more members, each its own process with its own data dir.
pub struct Etcd {
    pub endpoints: String,
    members: Vec<(String, Option<Child>)>,
    /// How each member is started, to start it again on its data dir.
    commands: Vec<(Vec<String>, PathBuf)>,
    /// The certificates of members that speak only HTTPS and want client certificates.
    tls: Option<PathBuf>,
    _directory: tempfile::TempDir,
}

impl Etcd {
    pub fn start(count: usize) -> Etcd {
        Etcd::start_with(count, None)
    }

    /// One member that speaks only HTTPS (as `localhost`, the name its certificate holds), with
    /// `certs` from scripts/testdb certs; with `client_certificates`, it accepts only clients
    /// with a certificate of their CA.
    pub fn start_tls(certs: &std::path::Path, client_certificates: bool) -> Etcd {
        Etcd::start_with(1, Some((certs.to_owned(), client_certificates)))
    }

    fn start_with(count: usize, tls: Option<(PathBuf, bool)>) -> Etcd {
        let directory = tempfile::Builder::new()
            .prefix("sluice-etcd")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("a temporary directory");
        let ports: Vec<(u16, u16)> = (0..count).map(|_| (free_port(), free_port())).collect();
        let initial: Vec<String> =
            ports.iter().enumerate().map(|(index, (_, peer))| format!("m{index}=http://127.0.0.1:{peer}")).collect();
        let (mut members, mut commands) = (Vec::new(), Vec::new());
        for (index, (client, peer)) in ports.iter().enumerate() {
            let (listen, advertise) = match &tls {
                Some(_) => (format!("https://127.0.0.1:{client}"), format!("https://localhost:{client}")),
                None => (format!("http://127.0.0.1:{client}"), format!("http://127.0.0.1:{client}")),
            };
            let mut arguments = Vec::new();
            if let Some((certs, client_certificates)) = &tls {
                let file = |name: &str| certs.join(name).to_str().expect("a UTF-8 path").to_owned();
                arguments.extend(["--cert-file".into(), file("server.pem"), "--key-file".into(), file("server.key")]);
                if *client_certificates {
                    arguments.extend(["--trusted-ca-file".into(), file("ca.pem"), "--client-cert-auth".into()]);
                }
            }
            let data = directory.path().join(format!("m{index}")).to_str().unwrap().to_owned();
            let peer_url = format!("http://127.0.0.1:{peer}");
            arguments.extend(
                [
                    ["--name", &format!("m{index}")],
                    ["--data-dir", &data],
                    ["--listen-client-urls", &listen],
                    ["--advertise-client-urls", &advertise],
                    ["--listen-peer-urls", &peer_url],
                    ["--initial-advertise-peer-urls", &peer_url],
                    ["--initial-cluster", &initial.join(",")],
                    ["--initial-cluster-state", "new"],
                    ["--initial-cluster-token", "sluice-test"],
                ]
                .concat()
                .into_iter()
                .map(str::to_owned),
            );
            let log = directory.path().join(format!("m{index}.log"));
            members.push((advertise, Some(spawn_etcd(&arguments, &log))));
            commands.push((arguments, log));
        }
        let endpoints = members.iter().map(|(endpoint, _)| endpoint.clone()).collect::<Vec<_>>().join(",");
        let etcd = Etcd { endpoints, members, commands, tls: tls.map(|(certs, _)| certs), _directory: directory };
        wait_for("etcd to be healthy", Duration::from_secs(30), || etcd.leader().is_some());
        etcd
    }

    /// The index of the member that leads, when one does.
    pub fn leader(&self) -> Option<usize> {
        let live: Vec<&str> =
            self.members.iter().filter(|(_, child)| child.is_some()).map(|(endpoint, _)| endpoint.as_str()).collect();
        let output = self.etcdctl_at(&live.join(",")).args(["endpoint", "status", "-w", "json"]).output().ok()?;
        let statuses: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        let statuses = statuses.as_array()?;
        if statuses.len() < live.len() {
            return None;
        }
        let leader = statuses.first()?["Status"]["leader"].as_u64()?;
        let endpoint = statuses
            .iter()
            .find(|status| status["Status"]["header"]["member_id"].as_u64() == Some(leader))?["Endpoint"]
            .as_str()?;
        self.members.iter().position(|(member, _)| member == endpoint)
    }

    /// `etcdctl` for these members (with the client certificate when they want one).
    pub fn etcdctl(&self) -> Command {
        self.etcdctl_at(&self.endpoints)
    }

    fn etcdctl_at(&self, endpoints: &str) -> Command {
        let mut command = Command::new("etcdctl");
        command.env("ETCDCTL_API", "3").args(["--endpoints", endpoints, "--command-timeout=2s"]);
        if let Some(certs) = &self.tls {
            let file = |name: &str| certs.join(name).to_str().expect("a UTF-8 path").to_owned();
            command.args(["--cacert", &file("ca.pem"), "--cert", &file("client.pem"), "--key", &file("client.key")]);
        }
        command
    }

    /// Starts a killed member again on its data dir and waits until the cluster has a leader.
    pub fn restart(&mut self, index: usize) {
        let (arguments, log) = &self.commands[index];
        self.members[index].1 = Some(spawn_etcd(arguments, log));
        wait_for("etcd to be healthy again", Duration::from_secs(30), || self.leader().is_some());
    }

    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].1.take() {
            child.kill().expect("SIGKILL an etcd member");
            child.wait().expect("reap it");
        }
    }
}

fn spawn_etcd(arguments: &[String], log: &std::path::Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("a log file");
    Command::new("etcd")
        .args(arguments)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("etcd starts (apt-get install etcd-server; scripts/testdb install does)")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // One at a time: stopping all members at once can take seconds.
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}

/// The lease of test nodes: 5 s, which a loaded test machine never misses, unless
/// `SLUICE_TEST_LEASE_SECS` says otherwise (the failover benchmark runs the default lease).
pub fn lease_secs() -> u64 {
    std::env::var("SLUICE_TEST_LEASE_SECS").ok().and_then(|text| text.parse().ok()).unwrap_or(5)
}

/// A `sluice server` node.
pub struct Server {
    pub id: String,
    pub url: String,
    pub log: PathBuf,
    pub child: Guard,
}

/// Starts a node in `workspace` (its state under `state-<id>`), waiting until its API answers.
pub fn start_server(workspace: &Workspace, id: &str, etcd: Option<&str>, environment: &[(&str, String)]) -> Server {
    let mut extra = Vec::new();
    if let Some(etcd) = etcd {
        extra.extend(["--etcd", etcd]);
    }
    start_server_with(workspace, id, &extra, environment)
}

/// Starts a node with more arguments. With `--tls-cert` its URL is `https://localhost:PORT`
/// and it is ready when it logs that its API listens (the test client speaks plain HTTP only).
pub fn start_server_with(workspace: &Workspace, id: &str, extra: &[&str], environment: &[(&str, String)]) -> Server {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let state = format!("state-{id}");
    // The documents of the tests name their files relative to the workspace.
    let root = workspace.path("");
    let root = root.to_str().expect("a UTF-8 path");
    let lease = lease_secs().to_string();
    let mut arguments = vec![
        "server",
        "--listen",
        &listen,
        "--node-id",
        id,
        "--state-dir",
        &state,
        "--lease-secs",
        &lease,
        "--data-root",
        root,
    ];
    arguments.extend_from_slice(extra);
    let https = extra.contains(&"--tls-cert");
    let log = workspace.path(&format!("{id}.log"));
    let mut command = workspace.command(&arguments);
    command
        .stdout(Stdio::null())
        .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("a log file"));
    for (name, value) in environment {
        command.env(name, value);
    }
    let child = Guard::new(command.spawn().expect("sluice server starts"));
    let url = if https { format!("https://localhost:{port}") } else { format!("http://{listen}") };
    let mut server = Server { id: id.to_owned(), url, log, child };
    let deadline = Instant::now() + Duration::from_secs(30);
    let ready = |server: &Server| match https {
        true => server.output().contains("API on https://"),
        false => request(&server.url, "GET", "/healthz", None, None).map(|(status, _)| status) == Some(200),
    };
    while !ready(&server) {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("server {id} exited with {status}:\n{}", server.output());
        }
        assert!(Instant::now() < deadline, "server {id} did not answer within 30 s:\n{}", server.output());
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

impl Server {
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Calls the API; the status and the JSON body (`null` when there is none).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, &str)>,
    ) -> (u16, serde_json::Value) {
        let (status, text) = request(&self.url, method, &format!("/api/v1{path}"), token, body)
            .unwrap_or_else(|| panic!("{method} {path}: no answer from {}", self.id));
        (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
    }
}

/// One HTTP/1.1 request; the status and body, or `None` when nothing answers.
pub fn request(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<(&str, &str)>,
) -> Option<(u16, String)> {
    let authority = url.strip_prefix("http://")?;
    let mut stream = TcpStream::connect(authority).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let (content_type, payload) = body.unwrap_or(("application/json", ""));
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n", payload.len());
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(payload.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}
