//! File inputs: a watched directory (`type: directory`) receiving 1,000 files, some left
//! partial, some sent again under other names, loads each complete file exactly once into
//! PostgreSQL while the run is SIGKILLed again and again. The table has no key, so a file loaded
//! twice would show as duplicate rows.

use crate::support;

use std::path::Path;
use std::time::Duration;

use support::{kill, postgres_url, psql, unique_name, wait_for, Workspace};

const FILES: u64 = 1_000;
const LINES: u64 = 20;

/// Writes file `number` as a producer should: under a temporary name, then renamed.
fn deliver(directory: &Path, name: &str, number: u64) {
    let mut text = String::new();
    for line in 0..LINES {
        text.push_str(&format!(
            "{{\"file\": {number}, \"line\": {line}, \"payload\": \"row {line} of file {number}\"}}\n"
        ));
    }
    let temporary = directory.join(format!("{name}.jsonl.tmp"));
    std::fs::write(&temporary, text).unwrap();
    std::fs::rename(&temporary, directory.join(format!("{name}.jsonl"))).unwrap();
}

/// The rows of a target table; 0 before the run has created it.
fn loaded_rows(table: &str) -> u64 {
    let output = std::process::Command::new("psql")
        .args([postgres_url().as_str(), "-X", "-At", "-c", &format!("SELECT count(*) FROM {table}")])
        .output()
        .expect("run psql");
    String::from_utf8_lossy(&output.stdout).trim().parse().unwrap_or(0)
}

#[test]
fn a_watched_directory_loads_each_complete_file_exactly_once_across_kills() {
    let namespace = unique_name("files");
    let workspace = Workspace::new();
    let incoming = workspace.path("incoming");
    let events = incoming.join("events");
    std::fs::create_dir_all(&events).unwrap();
    deliver(&events, "f0", 0);
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {}\nmode: cdc\nsource:\n  type: directory\n  path: {}\n  format: jsonl\n  poll_ms: 50\n\
             target:\n  type: postgres\n  url: {}\n  namespace: {namespace}\n",
            namespace.replace('_', "-"),
            incoming.display(),
            postgres_url()
        ),
    );
    let table = format!("{namespace}.events");

    // The producer: 1,000 files; every 50th leaves a partial file behind, never renamed; every
    // 25th sends an earlier file again under a new name.
    let producer = {
        let events = events.clone();
        std::thread::spawn(move || {
            for number in 1..FILES {
                deliver(&events, &format!("f{number}"), number);
                if number % 50 == 0 {
                    std::fs::write(events.join(format!("partial{number}.jsonl.tmp")), "{\"file\": 999999, \"line\": 0")
                        .unwrap();
                }
                if number % 25 == 0 {
                    let again = std::fs::read(events.join(format!("f{}.jsonl", number - 10))).unwrap();
                    std::fs::write(events.join(format!("again{number}.jsonl.tmp")), again).unwrap();
                    std::fs::rename(
                        events.join(format!("again{number}.jsonl.tmp")),
                        events.join(format!("again{number}.jsonl")),
                    )
                    .unwrap();
                }
                if number % 100 == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        })
    };

    // Six SIGKILLs, each once more rows are in than before it (or, once the producer is done and
    // a slow machine let the job load everything before the kills were through, once a run
    // has started streaming: a kill of an idle stream must lose nothing either).
    let mut logs = String::new();
    let mut last_seen = 0;
    let mut run = workspace.spawn(&["run", job.to_str().unwrap()]);
    for _ in 0..6 {
        let stderr = run.stderr_view();
        wait_for("more files loaded before the next kill", Duration::from_secs(120), || {
            loaded_rows(&table) > last_seen + LINES
                || (producer.is_finished() && stderr().contains("change stream"))
                || stderr().contains(" ERROR ")
        });
        last_seen = loaded_rows(&table);
        kill(&mut run);
        logs.push_str(&stderr());
        run = workspace.spawn(&["run", job.to_str().unwrap()]);
    }
    producer.join().unwrap();
    let stderr = run.stderr_view();
    wait_for("every file loaded", Duration::from_secs(180), || loaded_rows(&table) >= FILES * LINES);
    kill(&mut run);
    logs.push_str(&stderr());

    // A run started after everything is in finds every file loaded already.
    let mut run = workspace.spawn(&["run", job.to_str().unwrap()]);
    let stderr = run.stderr_view();
    wait_for("the restarted run looked at the directory", Duration::from_secs(60), || {
        stderr().contains("already loaded")
    });
    kill(&mut run);
    assert!(stderr().contains(", 0 to load"), "{}", stderr());
    logs.push_str(&stderr());

    assert_eq!(loaded_rows(&table), FILES * LINES, "{logs}");
    let duplicates = psql(&format!("SELECT file, line FROM {table} GROUP BY file, line HAVING count(*) > 1 LIMIT 5"));
    assert!(duplicates.trim().is_empty(), "rows loaded twice: {duplicates}");
    let files = psql(&format!("SELECT count(DISTINCT file), min(file), max(file) FROM {table}"));
    assert_eq!(files.trim(), format!("{FILES}|0|{}", FILES - 1));
    assert!(logs.contains("the same content as a file already loaded"), "{logs}");
    assert!(!logs.contains("partial"), "a partial file was read: {logs}");
}

/// Near-real-time batches: a scheduled `cdc` job over a watched directory loads, per batch, the
/// files complete at the batch's start, and each batch ends.
#[test]
fn a_scheduled_directory_job_loads_per_batch_what_arrived_and_each_batch_ends() {
    let namespace = unique_name("file_batches");
    let workspace = Workspace::new();
    let incoming = workspace.path("incoming");
    std::fs::create_dir_all(&incoming).unwrap();
    for number in 0..5 {
        deliver(&incoming, &format!("a{number}"), number);
    }
    let server = support::cluster::start_server(&workspace, "solo", None, &[("SLUICE_VAR_TARGET", postgres_url())]);
    // Checkpoints in the target are per job name: a name of its own for each run.
    let name = namespace.replace('_', "-");
    let job = format!(
        "name: {name}\nmode: cdc\nsource:\n  type: directory\n  path: {}\n  table: drops\n  key: [file, line]\n\
         target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  namespace: {namespace}\nschedule: {{every_secs: 2, overlap: queue}}\n",
        incoming.display()
    );
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let table = format!("{namespace}.drops");
    let ended = |after: u64| {
        let mut last = serde_json::Value::Null;
        wait_for(&format!("a batch after {after} ends"), Duration::from_secs(60), || {
            last = server.call("GET", &format!("/jobs/{name}"), None, None).1;
            last["schedule"]["history"].as_array().is_some_and(|history| {
                history.iter().any(|record| {
                    record["batch"].as_u64().is_some_and(|batch| batch > after) && record["outcome"] == "succeeded"
                })
            })
        });
        last["schedule"]["batch"].as_u64().unwrap()
    };
    let first = ended(0);
    assert_eq!(loaded_rows(&table), 5 * LINES, "{}", server.output());
    for number in 5..12 {
        deliver(&incoming, &format!("b{number}"), number);
    }
    // A file sent again is passed over; the batch that starts after these files loads them.
    std::fs::copy(incoming.join("a1.jsonl"), incoming.join("a1-again.jsonl")).unwrap();
    ended(first + 1);
    assert_eq!(loaded_rows(&table), 12 * LINES, "{}", server.output());
    assert!(psql(&format!("SELECT count(*) FROM {table} WHERE file = 11")).trim() == LINES.to_string());
    assert!(server.output().contains("the batch ends"), "{}", server.output());
}

/// Sends `lines` from `from` on, and reads acknowledgements until `until` is acknowledged or the
/// connection breaks; returns the last line acknowledged (0 for none).
fn send_lines(address: &str, from: u64, until: u64, stop_after: Option<u64>) -> u64 {
    use std::io::{BufRead, Write};
    let Ok(stream) = std::net::TcpStream::connect(address) else { return 0 };
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let last = stop_after.unwrap_or(until).min(until);
        for id in from..=last {
            if writer.write_all(format!("{{\"id\": {id}, \"body\": \"line {id}\"}}\n").as_bytes()).is_err() {
                return;
            }
        }
    });
    let mut acknowledged = 0;
    for reply in std::io::BufReader::new(stream).lines() {
        let Ok(reply) = reply else { break };
        let Some(count) = reply.strip_prefix("ok ").and_then(|count| count.parse::<u64>().ok()) else { break };
        acknowledged = from - 1 + count;
        if acknowledged >= stop_after.unwrap_or(until).min(until) {
            break;
        }
    }
    let _ = sender.join();
    acknowledged
}

/// The TCP line input: every line acknowledged once durable; a client that resends what was not
/// acknowledged after a SIGKILL ends with every line in once (the key replaces a resent line);
/// a line that does not decode is answered with its error.
#[test]
fn a_tcp_line_input_acknowledges_durable_lines_and_a_resending_client_loses_none_across_kills() {
    use std::io::{BufRead, Write};
    let namespace = unique_name("lines");
    let workspace = Workspace::new();
    let address = format!("127.0.0.1:{}", support::cluster::free_port());
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {}\nmode: cdc\nsource:\n  type: tcp\n  listen: \"{address}\"\n  table: inbox\n  \
             columns: {{id: bigint, body: text}}\n  key: [id]\n  max_line_bytes: 4096\ntarget:\n  type: postgres\n  url: {}\n  namespace: {namespace}\n",
            namespace.replace('_', "-"),
            postgres_url()
        ),
    );
    let table = format!("{namespace}.inbox");
    const TOTAL: u64 = 20_000;
    let mut acknowledged = 0;
    for round in 0..4 {
        let mut run = workspace.spawn(&["run", job.to_str().unwrap()]);
        let stderr = run.stderr_view();
        wait_for("the input listens", Duration::from_secs(60), || stderr().contains("listening on"));
        // Half way through a round's lines the run is killed; the client resends from its last ack.
        let stop = (round < 3).then_some(acknowledged + 3_000);
        let sender_address = address.clone();
        let from = acknowledged + 1;
        let client = std::thread::spawn(move || send_lines(&sender_address, from, TOTAL, stop));
        if round < 3 {
            wait_for("some lines in", Duration::from_secs(60), || loaded_rows(&table) > acknowledged + 1_000);
            kill(&mut run);
            acknowledged = acknowledged.max(client.join().unwrap());
        } else {
            acknowledged = client.join().unwrap();
            assert_eq!(acknowledged, TOTAL, "{}", stderr());
            // A bad line: its error comes back, the lines before it stand.
            let mut stream = std::net::TcpStream::connect(&address).unwrap();
            stream.write_all(b"{\"id\": 999999, \"body\": \"fine\"}\n{\"id\": \"not a number\"}\n").unwrap();
            let replies: Vec<String> = std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
                .take_while(|line| !line.starts_with("error"))
                .collect();
            assert!(replies.iter().all(|reply| reply.starts_with("ok")), "{replies:?}");
            wait_for("the good line in", Duration::from_secs(30), || loaded_rows(&table) == TOTAL + 1);
            // A line longer than max_line_bytes: refused by its number, its connection closed,
            // the input still serving the others.
            let mut stream = std::net::TcpStream::connect(&address).unwrap();
            let long = format!("{{\"id\": 1000000, \"body\": \"{}\"}}\n", "x".repeat(20_000));
            stream.write_all(long.as_bytes()).unwrap();
            let reply =
                std::io::BufReader::new(stream).lines().map_while(Result::ok).find(|line| line.starts_with("error"));
            assert_eq!(reply.as_deref(), Some("error 1: line too long (more than 4096 bytes, source.max_line_bytes)"));
            assert_eq!(send_lines(&address, TOTAL + 1, TOTAL + 1, None), TOTAL + 1, "{}", stderr());
            wait_for("the line after in", Duration::from_secs(30), || loaded_rows(&table) == TOTAL + 2);
            kill(&mut run);
            assert!(stderr().contains("line 2"), "{}", stderr());
        }
    }
    assert_eq!(loaded_rows(&table), TOTAL + 2);
    let expected = psql(&format!("SELECT count(*) FROM {table} WHERE body = 'line ' || id"));
    assert_eq!(expected.trim(), (TOTAL + 1).to_string());
}

/// A process's memory as `/proc` tells it: (resident now, peak resident), in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The `tcp` input's bounds at scale, with its defaults: a 100 MB line is cut once past 1 MiB
/// (`max_line_bytes`), 2,000 connections at once leave 256 open (`max_connections`), a client
/// without the token gets nothing in; the input's memory stays bounded (measured: its peak
/// resident size, against the size it had listening) and a client with the token loads its lines
/// exactly.
#[test]
fn a_tcp_input_cuts_a_100_mb_line_refuses_connections_past_its_cap_and_keeps_its_memory() {
    use std::io::{BufRead, Read, Write};
    use std::net::TcpStream;
    let namespace = unique_name("tcp_bounds");
    let workspace = Workspace::new();
    let address = format!("127.0.0.1:{}", support::cluster::free_port());
    let token = "bounds-token-0123456789abcdef";
    let job = workspace.write(
        "job.yaml",
        &format!(
            "name: {}\nmode: cdc\nsource:\n  type: tcp\n  listen: \"{address}\"\n  table: inbox\n  \
             columns: {{id: bigint, body: text}}\n  key: [id]\n  auth: ${{TCP_TOKEN}}\n\
             target:\n  type: postgres\n  url: {}\n  namespace: {namespace}\n",
            namespace.replace('_', "-"),
            postgres_url()
        ),
    );
    let child = workspace
        .command(&["run", job.to_str().unwrap()])
        .env("TCP_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = support::Running::new(child);
    let stderr = run.stderr_view();
    wait_for("the input listens", Duration::from_secs(60), || stderr().contains("listening on"));
    let pid = run.id();
    let (listening, _) = memory_kib(pid);

    // A 100 MB line: the input answers its number once past max_line_bytes and closes (what the
    // client still sends in the next second is read and dropped, so it reads the answer).
    let mut long = TcpStream::connect(&address).unwrap();
    long.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    long.write_all(format!("auth {token}\n{{\"id\": 1, \"body\": \"").as_bytes()).unwrap();
    let chunk = vec![b'x'; 1 << 20];
    let mut written = 0usize;
    while written < 100_000_000 {
        match long.write(&chunk) {
            Ok(count) => written += count,
            Err(_) => break,
        }
    }
    let mut reply = String::new();
    let _ = std::io::BufReader::new(&long).read_line(&mut reply);
    assert_eq!(reply.trim_end(), "error 1: line too long (more than 1048576 bytes, source.max_line_bytes)");
    drop(long);

    // 2,000 connections at once: past the cap, each is told so and closed, unread.
    let mut connections: Vec<(TcpStream, Vec<u8>, bool)> =
        (0..2_000).map(|_| (TcpStream::connect(&address).unwrap(), Vec::new(), false)).collect();
    for (connection, _, _) in &connections {
        connection.set_nonblocking(true).unwrap();
    }
    let mut refused = 0;
    wait_for("the connections past the cap closed", Duration::from_secs(60), || {
        for (connection, received, closed) in connections.iter_mut().filter(|(_, _, closed)| !closed) {
            let mut buffer = [0u8; 256];
            match connection.read(&mut buffer) {
                Ok(0) => *closed = true,
                Ok(count) => received.extend_from_slice(&buffer[..count]),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => *closed = true,
            }
        }
        refused = connections.iter().filter(|(_, _, closed)| *closed).count();
        refused >= 2_000 - 256
    });
    assert!(refused < 2_000, "the input keeps max_connections open: {refused} of 2000 closed");
    for (_, received, closed) in &connections {
        let text = String::from_utf8_lossy(received);
        if *closed {
            assert!(
                matches!(text.as_ref(), "" | "error 0: too many connections (source.max_connections 256)\n"),
                "{text}"
            );
        }
    }
    drop(connections);

    // No token: refused before any line is read.
    let mut stranger = TcpStream::connect(&address).unwrap();
    stranger.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = stranger.write_all(b"{\"id\": 2, \"body\": \"stranger\"}\n");
    let replies: Vec<String> = std::io::BufReader::new(stranger).lines().map_while(Result::ok).collect();
    assert!(replies.iter().all(|reply| !reply.starts_with("ok")), "{replies:?}");

    // The token: every line in, once.
    let lines = (100..1_100).map(|id| format!("{{\"id\": {id}, \"body\": \"line {id}\"}}\n")).collect::<String>();
    wait_for("a client with the token loads its lines", Duration::from_secs(60), || {
        let Ok(mut member) = TcpStream::connect(&address) else { return false };
        member.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        if member.write_all(format!("auth {token}\n{lines}").as_bytes()).is_err() {
            return false;
        }
        std::io::BufReader::new(member).lines().map_while(Result::ok).any(|reply| reply == "ok 1000")
    });
    let (_, peak) = memory_kib(pid);
    eprintln!("tcp input memory: {listening} KiB listening, {peak} KiB at its peak");
    assert!(peak < listening + 64 * 1024, "{listening} KiB listening, {peak} KiB at the peak");
    kill(&mut run);
    assert_eq!(loaded_rows(&format!("{namespace}.inbox")), 1_000, "{}", stderr());
    assert!(!stderr().contains(token), "the token never prints");
}
