//! `sluice server` on one node (embedded state): the API's jobs, versions, rollback, diff,
//! lifecycle, auth and errors; a snapshot job submitted through the API runs to `succeeded`;
//! secrets never come back in a response.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::cluster::{start_server, Server};
use support::{count, make_source, wait_for, Run, Workspace};

const ADMIN: &str = "admin-token-0123456789";
const READ: &str = "read-token-0123456789ab";

fn tokens() -> Vec<(&'static str, String)> {
    vec![("SLUICE_ADMIN_TOKEN", ADMIN.to_owned()), ("SLUICE_READ_TOKEN", READ.to_owned())]
}

fn job_yaml(name: &str, parallelism: u32) -> String {
    format!(
        "name: {name}\nmode: snapshot\nsource:\n  type: sqlite\n  path: source.db\ntarget:\n  type: sqlite\n  path: target.db\nparallelism: {parallelism}\nlimits: {{split_rows: 300}}\n"
    )
}

fn wait_state(server: &Server, name: &str, state: &str) -> Value {
    let mut last = Value::Null;
    wait_for(&format!("job {name} to be {state}"), Duration::from_secs(60), || {
        last = server.call("GET", &format!("/jobs/{name}"), Some(READ), None).1;
        last["state"] == state || last["state"] == "failed"
    });
    assert_eq!(last["state"], state, "job {name}: {last:#}\n{}", server.output());
    last
}

#[test]
fn a_job_submitted_through_the_api_runs_and_its_versions_roll_back() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 1_000);
    let server = start_server(&workspace, "solo", None, &tokens());
    let yaml = ("application/yaml", job_yaml("copy", 2));

    // Auth: none → 401, read → 403 on a change, admin → 201.
    assert_eq!(server.call("POST", "/jobs", None, Some((yaml.0, &yaml.1))).0, 401);
    assert_eq!(server.call("GET", "/jobs", Some("wrong-token-0000000000"), None).0, 401);
    assert_eq!(server.call("POST", "/jobs", Some(READ), Some((yaml.0, &yaml.1))).0, 403);
    let (status, created) = server.call("POST", "/jobs", Some(ADMIN), Some((yaml.0, &yaml.1)));
    assert_eq!(status, 201, "{created}");
    assert_eq!(created, serde_json::json!({ "name": "copy", "version": 1 }));
    let again = job_yaml("copy", 9);
    assert_eq!(server.call("POST", "/jobs", Some(ADMIN), Some((yaml.0, &again))).0, 409, "a second create is refused");
    let (_, first) = server.call("GET", "/jobs/copy/versions/1", Some(READ), None);
    assert!(first["document"].as_str().unwrap().contains("parallelism: 2"), "version 1 is untouched: {first}");

    let job = wait_state(&server, "copy", "succeeded");
    let source_rows: u64 =
        ["items", "events", "tags"].iter().map(|table| count(&workspace.path("source.db"), table)).sum();
    for table in ["items", "events", "tags"] {
        support::assert_same_rows(&workspace.path("target.db"), &workspace.path("source.db"), table);
    }
    assert_eq!(job["stats"]["rows_written"], source_rows, "{job:#}");
    assert_eq!(job["tasks"].as_array().unwrap().len(), 3, "one snapshot task per table: {job:#}");
    assert!(
        job["tasks"].as_array().unwrap().iter().all(|task| task["worker"] == "solo" && task["state"] == "succeeded"),
        "{job:#}"
    );
    let (_, listed) = server.call("GET", "/jobs", Some(READ), None);
    // Each line carries the job's counters, as the job's own view shows them.
    assert_eq!(
        listed,
        serde_json::json!([{ "name": "copy", "state": "succeeded", "version": 1, "mode": "snapshot", "phase": null,
            "rows_per_sec": 0.0, "lag_secs": null, "error": null, "stats": job["stats"] }])
    );
    assert_eq!(listed[0]["stats"]["rows_written"], source_rows, "{listed:#}");
    let (_, runs) = server.call("GET", "/jobs/copy/runs", Some(READ), None);
    assert_eq!(
        runs.as_array().unwrap().iter().map(|run| run["rows_written"].as_u64().unwrap()).sum::<u64>(),
        source_rows
    );

    // A new version (JSON this time), then a rollback to 1 as version 3.
    let json = serde_json::json!({
        "name": "copy", "mode": "snapshot", "parallelism": 4,
        "source": { "type": "sqlite", "path": "source.db" }, "target": { "type": "sqlite", "path": "target.db" },
        "limits": { "split_rows": 300 }
    })
    .to_string();
    let (status, updated) = server.call("PUT", "/jobs/copy", Some(ADMIN), Some(("application/json", &json)));
    assert_eq!((status, updated["version"].clone()), (200, 2.into()), "{updated}");
    let (status, rolled) =
        server.call("POST", "/jobs/copy/rollback", Some(ADMIN), Some(("application/json", r#"{"version": 1}"#)));
    assert_eq!((status, rolled["version"].clone()), (200, 3.into()), "{rolled}");
    let (_, versions) = server.call("GET", "/jobs/copy/versions", Some(READ), None);
    let origins: Vec<&str> =
        versions.as_array().unwrap().iter().map(|version| version["origin"].as_str().unwrap()).collect();
    assert_eq!(origins, ["submitted", "updated", "rollback to 1"]);
    assert_eq!(versions[2]["current"], true);
    let (_, diff) = server.call("GET", "/jobs/copy/versions/1/diff/3", Some(READ), None);
    assert!(
        diff["diff"].as_str().unwrap().lines().all(|line| line.starts_with("  ")),
        "1 and 3 are the same document: {diff}"
    );
    let (_, diff) = server.call("GET", "/jobs/copy/versions/1/diff/2", Some(READ), None);
    assert!(diff["diff"].as_str().unwrap().contains("- parallelism: 2"), "{diff}");
    // The new generation resumes from the target's checkpoints: nothing is copied twice.
    wait_state(&server, "copy", "succeeded");
    support::assert_same_rows(&workspace.path("target.db"), &workspace.path("source.db"), "items");

    // Stop, start, restart and delete; unknown jobs and versions are 404.
    assert_eq!(server.call("POST", "/jobs/copy/stop", Some(ADMIN), None).0, 200);
    wait_state(&server, "copy", "stopped");
    assert_eq!(server.call("POST", "/jobs/copy/start", Some(ADMIN), None).0, 200);
    wait_state(&server, "copy", "succeeded");
    assert_eq!(
        server.call("POST", "/jobs/copy/rollback", Some(ADMIN), Some(("application/json", r#"{"version": 9}"#))).0,
        404
    );
    // A number past u32 is refused, not cut down to another version.
    for version in ["4294967297", "0", "-1", "\"1\""] {
        let body = format!("{{\"version\": {version}}}");
        let (status, answer) =
            server.call("POST", "/jobs/copy/rollback", Some(ADMIN), Some(("application/json", &body)));
        assert_eq!(status, 400, "{version}: {answer}");
    }
    assert_eq!(server.call("GET", "/jobs/nothing", Some(READ), None).0, 404);
    let (status, body) =
        server.call("POST", "/jobs/copy/tables", Some(ADMIN), Some(("application/json", r#"{"tables": ["main.x"]}"#)));
    assert_eq!(status, 400, "a snapshot job has no stream to add tables to: {body}");
    // Deleting `copy` leaves a job whose name starts the same way alone.
    let other = ("application/yaml", job_yaml("copy-more", 1).replace("target.db", "more.db"));
    assert_eq!(server.call("POST", "/jobs", Some(ADMIN), Some((other.0, &other.1))).0, 201);
    assert_eq!(server.call("DELETE", "/jobs/copy", Some(ADMIN), None).0, 204);
    assert_eq!(server.call("GET", "/jobs/copy", Some(READ), None).0, 404);
    let (status, more) = server.call("GET", "/jobs/copy-more", Some(READ), None);
    assert_eq!(status, 200, "{more}");
    assert_eq!(server.call("GET", "/jobs/copy-more/versions", Some(READ), None).1.as_array().map(Vec::len), Some(1));
    wait_state(&server, "copy-more", "succeeded");

    // Workers, leader, OpenAPI and metrics.
    let (_, workers) = server.call("GET", "/workers", Some(READ), None);
    assert_eq!(workers[0]["id"], "solo");
    assert_eq!(server.call("GET", "/leader", Some(READ), None).1["leader"], "solo");
    let (_, openapi) = server.call("GET", "/openapi.json", None, None);
    assert_eq!(openapi["openapi"], "3.1.0");
    assert!(openapi["paths"]["/jobs/{name}"]["get"].is_object(), "{openapi}");
    // Metrics need the read token once tokens are set.
    assert_eq!(support::cluster::request(&server.url, "GET", "/metrics", None, None).unwrap().0, 401);
    let metrics = support::cluster::request(&server.url, "GET", "/metrics", Some(READ), None).unwrap().1;
    assert!(metrics.contains("sluice_workers 1"), "{metrics}");
    // The finished copy's counters, per task of its current generation, and the worker's.
    assert!(metrics.contains("sluice_task_rows_written_total{job=\"copy-more\""), "{metrics}");
    assert!(metrics.contains("sluice_job_running{job=\"copy-more\",state=\"succeeded\"} 0"), "{metrics}");
    assert!(metrics.contains("sluice_worker_leader{worker=\"solo\"} 1"), "{metrics}");
    assert!(metrics.contains("# TYPE sluice_task_apply_latency_seconds histogram"), "{metrics}");
}

#[test]
fn invalid_jobs_get_every_error_and_secrets_never_come_back() {
    let workspace = Workspace::new();
    let mut environment = tokens();
    environment.push(("SLUICE_VAR_SECRETIVE_PW", "Sup3r-Secret-pw".to_owned()));
    // A secret mounted as a file, as orchestrators do (its trailing newline is not the secret's).
    let secrets = workspace.path("secrets");
    std::fs::create_dir(&secrets).unwrap();
    workspace.write("secrets/DB_PASSWORD", "Sup3r-Secret-pw\n");
    let server = support::cluster::start_server_with(
        &workspace,
        "solo",
        &["--secrets-dir", secrets.to_str().unwrap()],
        &environment,
    );
    let bad =
        "name: bad\nmode: snapshot\nsource:\n  type: nothing\ntarget:\n  type: sqlite\n  path: t.db\n  colour: red\n";
    let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", bad)));
    assert_eq!(status, 400, "{body}");
    let paths: Vec<&str> =
        body["errors"].as_array().unwrap().iter().map(|error| error["path"].as_str().unwrap()).collect();
    for expected in ["source.type", "target.colour"] {
        assert!(paths.contains(&expected), "{expected} is reported: {body:#}");
    }
    assert_eq!(server.call("POST", "/jobs", Some(ADMIN), Some(("application/json", "{not json"))).0, 400);

    // A literal password is refused (the store would keep it at rest), by path and line, and
    // the answer does not repeat it.
    let secret = "Sup3r-Secret-pw";
    let job = |url: &str| {
        format!(
            "name: secretive\nmode: snapshot\nsource:\n  type: mysql\n  url: {url}\n  tables: [\"db.*\"]\ntarget:\n  type: sqlite\n  path: t.db\nretry: {{max_attempts: 1}}\n"
        )
    };
    for url in [format!("mysql://u:{secret}@127.0.0.1:1/db"), format!("mysql://u@127.0.0.1:1/db?password={secret}")] {
        let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &job(&url))));
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["errors"][0]["path"], "source.url", "{body}");
        assert_eq!(body["errors"][0]["line"], 5, "{body}");
        assert!(!body.to_string().contains(secret), "{body}");
    }
    // So is a NATS token in a URL (its user part alone).
    let nats = format!(
        "name: tokened\nmode: snapshot\nsource:\n  type: sqlite\n  path: s.db\ntarget:\n  type: nats\n  url: nats://{secret}@127.0.0.1:1\n  stream: EVENTS\n"
    );
    let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &nats)));
    assert_eq!(status, 400, "{body}");
    assert!(body["errors"].as_array().unwrap().iter().any(|error| error["path"] == "target.url"), "{body}");
    assert!(!body.to_string().contains(secret), "{body}");

    // A document reads only variables named with the server's prefix (SLUICE_VAR_) and files of
    // its --secrets-dir: not the server's own environment, in any field, every one named at once.
    let nosy = "name: nosy\nmode: snapshot\nsource:\n  type: mysql\n  url: mysql://u:${SLUICE_ETCD_PASSWORD}@127.0.0.1:1/db\n  tables: [\"${HOME}.*\"]\ntarget:\n  type: sqlite\n  path: t.db\n";
    let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", nosy)));
    assert_eq!(status, 400, "{body}");
    let errors = body["errors"].as_array().unwrap();
    for (variable, field) in [("`SLUICE_ETCD_PASSWORD`", "source.url"), ("`HOME`", "source.tables")] {
        assert!(
            errors.iter().any(|error| error["path"].as_str().unwrap().starts_with(field)
                && error["message"].as_str().unwrap().contains(variable)
                && error["message"].as_str().unwrap().contains("SLUICE_VAR_")),
            "{variable} is refused at {field}, naming the prefix: {body:#}"
        );
    }
    // Every path stays inside the server's data root (here the workspace), links followed.
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), workspace.path("escape")).unwrap();
    let roaming = "name: roaming\nmode: snapshot\nsource:\n  type: sqlite\n  path: ../../etc/passwd\ntarget:\n  type: sqlite\n  path: escape/t.db\n";
    let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", roaming)));
    assert_eq!(status, 400, "{body}");
    for field in ["source.path", "target.path"] {
        assert!(
            body["errors"].as_array().unwrap().iter().any(|error| error["path"] == field
                && error["message"].as_str().unwrap().contains("outside the server's data root")),
            "{field} is refused: {body:#}"
        );
    }
    let filed = "name: filed\nmode: snapshot\nsource:\n  type: mysql\n  url: mysql://u:${DB_PASSWORD}@127.0.0.1:1/db\n  tables: [\"db.*\"]\ntarget:\n  type: sqlite\n  path: t.db\nretry: {max_attempts: 1}\n";
    let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", filed)));
    assert_eq!(status, 201, "a secret of --secrets-dir is read whatever its name: {body}");
    let filed_failed = wait_state(&server, "filed", "failed");
    assert_eq!(filed_failed["error"]["side"], "source", "{filed_failed:#}");

    // Every field that holds a secret must be a ${VARIABLE}: a Kafka password, a tcp input's
    // token, a mask's salt; each named.
    let written_out = format!(
        "name: spelled\nmode: cdc\nsource:\n  type: tcp\n  listen: 9\n  table: t\n  columns: {{id: int}}\n  auth: {secret}-tcp\n\
         target:\n  type: kafka\n  brokers: 127.0.0.1:1\n  user: u\n  password: {secret}\n\
         transform:\n  - source_table: t\n    mask: {{id: hash}}\n    salt: {secret}-salt\n"
    );
    let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &written_out)));
    assert_eq!(status, 400, "{body}");
    for field in ["source.auth", "target.password", "transform[0].salt"] {
        assert!(
            body["errors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|error| error["path"] == field && error["message"].as_str().unwrap().contains("is a secret")),
            "{field} is refused: {body:#}"
        );
    }
    assert!(!body.to_string().contains(secret), "{body}");
    let referenced = written_out
        .replace(&format!("{secret}-tcp"), "${SLUICE_VAR_SECRETIVE_PW}-long-enough")
        .replace(&format!("password: {secret}"), "password: ${SLUICE_VAR_SECRETIVE_PW}")
        .replace(&format!("{secret}-salt"), "${SLUICE_VAR_SECRETIVE_PW}");
    let (_, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &referenced)));
    let left: Vec<&Value> = body["errors"]
        .as_array()
        .map(|errors| {
            errors.iter().filter(|error| error["message"].as_str().unwrap_or("").contains("is a secret")).collect()
        })
        .unwrap_or_default();
    assert!(left.iter().all(|error| error["path"] == "source.auth"), "only the token with text around it: {body:#}");

    // A password from the server's environment: no response or log shows it.
    let (status, body) = server.call(
        "POST",
        "/jobs",
        Some(ADMIN),
        Some(("application/yaml", &job("mysql://u:${SLUICE_VAR_SECRETIVE_PW}@127.0.0.1:1/db"))),
    );
    assert_eq!(status, 201, "{body}");
    let failed = wait_state(&server, "secretive", "failed");
    assert_eq!(failed["error"]["side"], "source", "{failed:#}");
    let mut everything = failed.to_string() + &filed_failed.to_string();
    for path in [
        "/jobs/filed/versions/1",
        "/jobs/secretive/versions/1",
        "/jobs/secretive/versions/1/diff/1",
        "/jobs/secretive/versions",
        "/jobs",
        "/jobs/secretive/runs",
    ] {
        let (status, body) = server.call("GET", path, Some(READ), None);
        assert_eq!(status, 200, "{path}: {body}");
        everything.push_str(&body.to_string());
    }
    assert!(everything.contains("u:***@127.0.0.1"), "the URL is shown redacted: {everything}");
    assert!(!everything.contains(secret), "a response shows the password: {everything}");
    assert!(!server.output().contains(secret), "the log shows the password");
    let stored = std::fs::read_to_string(workspace.path("state-solo/server.json")).expect("the store file");
    assert!(!stored.contains(secret), "the store keeps the password at rest");
    // The store and its directory are the user's alone, whatever the umask.
    use std::os::unix::fs::PermissionsExt;
    let mode = |name: &str| std::fs::metadata(workspace.path(name)).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode("state-solo"), mode("state-solo/server.json")), (0o700, 0o600));
}

#[test]
fn a_server_without_tokens_listens_on_loopback_only() {
    let workspace = Workspace::new();
    let run = workspace.sluice(&["server", "--listen", "0.0.0.0:0", "--state-dir", "state"]);
    run.assert_code(2);
    assert!(run.all().contains("loopback"), "{}", run.all());
}

#[test]
fn the_job_command_drives_a_server() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 300);
    let server = start_server(&workspace, "solo", None, &tokens());
    workspace.write("job.yaml", &job_yaml("cli", 2));
    let job = |arguments: &[&str], token: Option<&str>| {
        let mut all = vec!["job", "--server", server.url.as_str()];
        all.extend_from_slice(arguments);
        let mut command = workspace.command(&all);
        command.env_remove("SLUICE_TOKEN");
        if let Some(token) = token {
            command.env("SLUICE_TOKEN", token);
        }
        support::Run::from(command.output().expect("sluice job runs"))
    };
    let refused = job(&["list"], None);
    refused.assert_code(1);
    assert!(refused.all().contains("bearer token"), "{}", refused.all());
    let submitted = job(&["submit", "job.yaml"], Some(ADMIN));
    submitted.assert_code(0);
    assert!(
        submitted.stdout.lines().any(|line| line.starts_with("version:") && line.ends_with(" 1")),
        "{}",
        submitted.all()
    );
    assert_eq!(job(&["submit", "job.yaml"], Some(ADMIN)).code, 1, "a second submit is a conflict");
    wait_state(&server, "cli", "succeeded");
    let listed = job(&["list"], Some(READ));
    listed.assert_code(0);
    assert!(
        listed.all().lines().any(|line| line.starts_with("cli ") && line.contains("succeeded")),
        "{}",
        listed.all()
    );
    let shown = job(&["show", "cli"], Some(READ));
    assert!(
        shown.stdout.lines().any(|line| line.starts_with("state:") && line.ends_with("succeeded")),
        "{}",
        shown.all()
    );
    assert!(
        shown.stdout.lines().any(|line| line.starts_with("id ") && line.contains("state")),
        "a task table: {}",
        shown.all()
    );
    // --json prints the API's answer, and --server/--token go anywhere on the line.
    let json = job(&["show", "--json", "cli", "--token", READ], None);
    json.assert_code(0);
    let value: serde_json::Value = serde_json::from_str(&json.stdout).expect("JSON");
    assert_eq!(value["state"], "succeeded", "{}", json.all());
    workspace.write("job.yaml", &job_yaml("cli", 3));
    job(&["update", "job.yaml"], Some(ADMIN)).assert_code(0);
    let diff = job(&["diff", "cli", "1", "2"], Some(READ));
    assert!(diff.all().contains("- parallelism: 2") && diff.all().contains("+ parallelism: 3"), "{}", diff.all());
    job(&["rollback", "cli", "1"], Some(ADMIN)).assert_code(0);
    assert!(job(&["versions", "cli"], Some(READ)).all().contains("rollback to 1"));
    assert_eq!(job(&["stop", "cli"], Some(READ)).code, 1, "a read token cannot stop a job");
    job(&["stop", "cli"], Some(ADMIN)).assert_code(0);
    job(&["delete", "cli"], Some(ADMIN)).assert_code(0);
    assert_eq!(job(&["show", "cli"], Some(READ)).code, 1);
}

/// Sends `head` (request line and headers, without the blank line) and `body` as they are;
/// the status.
fn raw_status(url: &str, head: &str, body: &[u8]) -> u16 {
    use std::io::{Read, Write};
    let authority = url.strip_prefix("http://").expect("an http URL");
    let mut stream = std::net::TcpStream::connect(authority).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!("{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).unwrap();
    // The server may answer (and close) before reading a refused body.
    let _ = stream.write_all(body);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace().nth(1).and_then(|status| status.parse().ok()).unwrap_or_else(|| panic!("no status: {text}"))
}

#[test]
fn a_server_refuses_cross_site_requests_and_hostile_documents() {
    let workspace = Workspace::new();
    let server = start_server(&workspace, "open", None, &[]);
    let host = server.url.strip_prefix("http://").unwrap().to_owned();
    let job = job_yaml("fine", 1);
    let post = |headers: &str| format!("POST /api/v1/jobs HTTP/1.1\r\nHost: {host}\r\n{headers}");
    // Another site's page, a rebound DNS name, a form's content type: all refused.
    assert_eq!(
        raw_status(&server.url, &post("Origin: http://evil.example\r\nContent-Type: application/yaml"), job.as_bytes()),
        403
    );
    assert_eq!(
        raw_status(&server.url, &post("Sec-Fetch-Site: cross-site\r\nContent-Type: application/yaml"), job.as_bytes()),
        403
    );
    let rebound = format!(
        "POST /api/v1/jobs HTTP/1.1\r\nHost: evil.example:{}\r\nContent-Type: application/yaml",
        server.url.rsplit(':').next().unwrap()
    );
    assert_eq!(raw_status(&server.url, &rebound, job.as_bytes()), 403);
    assert_eq!(raw_status(&server.url, &post("Content-Type: text/plain"), job.as_bytes()), 415);
    assert_eq!(raw_status(&server.url, &post("Content-Type: application/x-www-form-urlencoded"), job.as_bytes()), 415);
    // The same request from the server's own origin goes through.
    let origin = format!("Origin: http://{host}\r\nContent-Type: application/yaml");
    assert_eq!(raw_status(&server.url, &post(&origin), job.as_bytes()), 201);

    // A "billion laughs" document: refused at once, memory flat.
    let mut laughs = String::from(
        "name: lol\na0: &a0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n",
    );
    for level in 1..10 {
        laughs.push_str(&format!("a{level}: &a{level} [{}]\n", vec![format!("*a{}", level - 1); 9].join(", ")));
    }
    let started = Instant::now();
    let (status, body) = server.call("POST", "/jobs", None, Some(("application/yaml", &laughs)));
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("more than 100000 values"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(5), "refused in {:?}", started.elapsed());
    // A document over the size limit.
    let huge = format!("{job}# {}\n", "x".repeat(2 * 1024 * 1024));
    assert_eq!(raw_status(&server.url, &post("Content-Type: application/yaml"), huge.as_bytes()), 413);
    assert_eq!(server.call("GET", "/jobs", None, None).0, 200, "the server lives on");
}

#[test]
fn a_short_token_from_the_environment_is_refused() {
    let workspace = Workspace::new();
    let run = Run::from(
        workspace
            .command(&["server", "--listen", "127.0.0.1:0", "--state-dir", "state"])
            .env("SLUICE_ADMIN_TOKEN", "short")
            .output()
            .unwrap(),
    );
    run.assert_code(2);
    assert!(run.all().contains("SLUICE_ADMIN_TOKEN: a token needs at least 16 characters"), "{}", run.all());
    assert!(!run.all().contains("short\n"), "the token is not echoed: {}", run.all());
}

/// Global alarm rules from the server's `--alarms` file and from `PUT /alarms`: a webhook
/// written out (a secret at rest) is refused naming its field, never echoing it; the rules kept
/// are shown without their targets.
#[test]
fn global_alarm_rules_come_from_the_server_file_and_the_api() {
    let workspace = Workspace::new();
    let secret = "hooks-secret-path-7c1e";
    workspace.write(
        "written-out.yaml",
        &format!(
            "- {{name: lag, when: \"lag_seconds > 5\", notify: [{{webhook: \"http://127.0.0.1:9/{secret}\"}}]}}\n"
        ),
    );
    let run = workspace.sluice(&[
        "server",
        "--listen",
        "127.0.0.1:0",
        "--state-dir",
        "refused",
        "--alarms",
        "written-out.yaml",
    ]);
    run.assert_code(2);
    assert!(run.all().contains("--alarms written-out.yaml: alarms[0].notify[0].webhook"), "{}", run.all());
    assert!(!run.all().contains(secret), "the URL is not echoed: {}", run.all());

    workspace.write(
        "alarms.yaml",
        "alarms:\n  - {name: stalled, when: \"stalled_seconds > 60\", notify: [{slack: \"${SLUICE_VAR_HOOK}\"}]}\n",
    );
    let mut environment = tokens();
    environment.push(("SLUICE_VAR_HOOK", format!("http://127.0.0.1:9/{secret}")));
    let server = support::cluster::start_server_with(&workspace, "alarms", &["--alarms", "alarms.yaml"], &environment);
    let (status, alarms) = server.call("GET", "/alarms", Some(READ), None);
    assert_eq!(status, 200, "{alarms}");
    assert_eq!(
        alarms["global"],
        serde_json::json!([{ "name": "stalled", "when": "stalled_seconds > 60", "for_secs": 0, "notify": ["slack"] }])
    );

    let written_out = format!(
        "[{{\"name\": \"x\", \"when\": \"failed == 1\", \"notify\": [{{\"slack\": \"https://h/{secret}\"}}]}}]"
    );
    let (status, answer) = server.call("PUT", "/alarms", Some(ADMIN), Some(("application/json", &written_out)));
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["errors"][0]["path"], "alarms[0].notify[0].slack", "{answer}");
    let (status, answer) =
        server.call("PUT", "/alarms", Some(READ), Some(("application/yaml", "- {name: y, when: \"failed == 1\"}\n")));
    assert_eq!(status, 403, "a read token changes nothing: {answer}");
    let rules = "- {name: failing, when: \"failed == 1\"}\n- {name: slow, when: \"rows_per_sec < 10\", for_secs: 30}\n";
    let (status, answer) = server.call("PUT", "/alarms", Some(ADMIN), Some(("application/yaml", rules)));
    assert_eq!((status, answer["rules"].as_u64()), (200, Some(2)), "{answer}");
    let (_, alarms) = server.call("GET", "/alarms", Some(READ), None);
    assert_eq!(alarms["global"][1]["name"], "slow", "{alarms}");
    assert!(!alarms.to_string().contains(secret) && !server.output().contains(secret), "{alarms}");
}

#[test]
fn a_server_verifies_a_job_keeps_its_last_report_and_shows_the_differences_to_metrics() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 500);
    let server = start_server(&workspace, "solo", None, &tokens());
    let yaml = job_yaml("checked", 2);
    assert_eq!(server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &yaml))).0, 201);
    wait_state(&server, "checked", "succeeded");
    let json = |text: &'static str| Some(("application/json", text));

    let (status, never) = server.call("GET", "/jobs/checked/verify", Some(READ), None);
    assert_eq!(status, 404, "{never}");
    assert_eq!(server.call("POST", "/jobs/checked/verify", Some(READ), json("{}")).0, 403, "verify needs admin");
    let (status, refused) =
        server.call("POST", "/jobs/checked/verify", Some(ADMIN), json(r#"{"repair": "yes", "rows": 1}"#));
    assert_eq!(status, 400, "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("repair: wrong type") && error.contains("rows: unknown field"),
        "every problem at once: {error}"
    );

    let (status, clean) = server.call("POST", "/jobs/checked/verify", Some(ADMIN), json("{}"));
    assert_eq!(status, 200, "{clean}");
    assert_eq!(clean["report"]["differences_total"], 0, "{clean}");
    assert_eq!(clean["report"]["tables"].as_array().unwrap().len(), 3, "{clean}");

    // A row deleted from the target: found by key, kept as the last report, shown by the job's
    // view and /metrics.
    let target = rusqlite::Connection::open(workspace.path("target.db")).unwrap();
    target.execute("DELETE FROM items WHERE id = 7", []).unwrap();
    let (status, found) = server.call("POST", "/jobs/checked/verify", Some(ADMIN), json(r#"{"tables": ["items"]}"#));
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["report"]["differences_total"], 1, "{found}");
    assert_eq!(
        found["report"]["tables"][0]["differences"][0],
        serde_json::json!({"kind": "missing", "key": {"id": 7}, "columns": []})
    );
    let (_, last) = server.call("GET", "/jobs/checked/verify", Some(READ), None);
    assert_eq!(last["report"]["differences_total"], 1, "{last}");
    let (_, view) = server.call("GET", "/jobs/checked", Some(READ), None);
    assert_eq!(view["stats"]["verify_differences"], 1, "{view}");
    let (_, metrics) = support::cluster::request(&server.url, "GET", "/metrics", Some(READ), None).unwrap();
    assert!(metrics.contains("sluice_verify_differences{job=\"checked\"} 1"), "{metrics}");
    // Each verification is in the job's run history, with its reconciliation per table.
    let (_, runs) = server.call("GET", "/jobs/checked/runs", Some(READ), None);
    let verifications: Vec<&Value> = runs.as_array().unwrap().iter().filter(|run| run["mode"] == "verify").collect();
    assert_eq!(verifications.len(), 2, "{runs}");
    let differs = verifications.iter().find(|run| run["status"] == "differs").expect("the run that found the row");
    assert_eq!(differs["verify"]["differences_total"], 1, "{differs}");
    let items = &differs["verify"]["tables"][0];
    assert_eq!(
        (&items["table"], &items["missing"], &items["sample"]),
        (&serde_json::json!("items"), &serde_json::json!(1), &serde_json::json!([{"id": 7}]))
    );

    // A SQLite target cannot replace rows by key: a repair says so and changes nothing.
    let (status, repaired) = server.call("POST", "/jobs/checked/verify", Some(ADMIN), json(r#"{"repair": true}"#));
    assert_eq!(status, 200, "{repaired}");
    assert_eq!(repaired["report"]["differences_total"], 1, "{repaired}");
    let items =
        repaired["report"]["tables"].as_array().unwrap().iter().find(|table| table["table"] == "items").unwrap();
    assert_eq!(items["repaired"], 0, "{repaired}");
    assert!(items["problems"][0].as_str().unwrap().contains("not repaired: a `sqlite` target cannot"), "{repaired}");
}

#[test]
fn a_job_with_verify_every_is_verified_by_the_leader_on_its_schedule() {
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 300);
    let server = start_server(&workspace, "solo", None, &tokens());
    let yaml = format!("{}verify: {{every_secs: 1, tables: [items]}}\n", job_yaml("watched", 2));
    let (status, created) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &yaml)));
    assert_eq!(status, 201, "{created}");
    wait_state(&server, "watched", "succeeded");
    // Verified without being asked, once copied.
    let mut last = Value::Null;
    wait_for("the first scheduled verification", Duration::from_secs(30), || {
        let (status, answer) = server.call("GET", "/jobs/watched/verify", Some(READ), None);
        last = answer;
        status == 200
    });
    assert_eq!(last["report"]["differences_total"], 0, "{last}");
    assert_eq!(last["report"]["tables"].as_array().unwrap().len(), 1, "only the tables named: {last}");
    // A row changed in the target is found by a later one, and the job's view shows it.
    let target = rusqlite::Connection::open(workspace.path("target.db")).unwrap();
    target.execute("UPDATE items SET name = 'changed' WHERE id = 11", []).unwrap();
    wait_for("a scheduled verification to find the change", Duration::from_secs(30), || {
        let (_, answer) = server.call("GET", "/jobs/watched/verify", Some(READ), None);
        last = answer;
        last["report"]["differences_total"] == 1
    });
    assert_eq!(
        last["report"]["tables"][0]["differences"][0],
        serde_json::json!({"kind": "different", "key": {"id": 11}, "columns": ["name"]})
    );
    let (_, view) = server.call("GET", "/jobs/watched", Some(READ), None);
    assert_eq!(view["stats"]["verify_differences"], 1, "{view}");

    // A bad `verify:` is a bad job, with every problem at once.
    let bad = format!("{}verify: {{every_secs: 0, repair: maybe, when: 1}}\n", job_yaml("bad-verify", 1));
    let (status, refused) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &bad)));
    assert_eq!(status, 400, "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("verify.every_secs") && text.contains("verify.repair") && text.contains("verify.when"),
        "{text}"
    );
}

/// The API bounds what one client can hold: a connection that sends no request is closed after
/// `--header-timeout-secs`, and past `--max-connections` a new connection is not served until
/// an open one closes.
#[test]
fn an_idle_connection_is_closed_and_connections_past_the_cap_wait_for_a_free_one() {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    let workspace = Workspace::new();
    let server = support::cluster::start_server_with(
        &workspace,
        "bounded",
        &["--max-connections", "1", "--header-timeout-secs", "3"],
        &[],
    );
    let address = server.url.trim_start_matches("http://").to_owned();
    // Holds the only slot and sends nothing.
    let mut idle = TcpStream::connect(&address).unwrap();
    let opened = Instant::now();
    // A request on a second connection: accepted by the kernel, not served while the slot is
    // held.
    let mut waiting = TcpStream::connect(&address).unwrap();
    waiting.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    waiting.set_read_timeout(Some(Duration::from_millis(1500))).unwrap();
    let mut answer = Vec::new();
    let early = waiting.read_to_end(&mut answer);
    assert!(early.is_err() && answer.is_empty(), "served past the cap: {early:?} {}", String::from_utf8_lossy(&answer));
    // The idle connection is closed by the server once its header timeout passes.
    idle.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut byte = [0u8; 1];
    let closed = idle.read(&mut byte);
    assert!(matches!(closed, Ok(0)) || closed.is_err(), "the idle connection got {closed:?}");
    let held = opened.elapsed();
    assert!(held >= Duration::from_secs(2) && held < Duration::from_secs(20), "closed after {held:?}");
    // Its slot freed, the waiting request is served.
    waiting.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    waiting.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// A request and the weakest role allowed it: method, path, body (media type, text), role.
type Route<'a> = (&'a str, String, Option<(&'a str, &'a str)>, &'a str);

/// Each role against every kind of route: `read` looks, `operate` runs jobs, `admin` changes
/// them; a refusal names the role needed. Every change is in the audit trail before it runs,
/// with its actor, address, action, version and diff, and nothing secret.
#[test]
fn each_role_may_do_what_the_readme_says_and_every_change_is_audited() {
    const VIEWER: &str = "viewer-token-0123456789";
    const ONCALL: &str = "oncall-token-0123456789";
    const ALICE: &str = "alice-token-0123456789a";
    const LEGACY: &str = "legacy-admin-token-0123";
    let workspace = Workspace::new();
    make_source(&workspace.path("source.db"), 200);
    workspace.write(
        "tokens",
        &format!(
            "# role name token\nread viewer {VIEWER}\noperate oncall {ONCALL}\nadmin alice {ALICE}\nadmin {LEGACY}\n"
        ),
    );
    let canary = "Canary-Audit-Pw-71f3";
    let tokens_file = workspace.path("tokens");
    let server = support::cluster::start_server_with(
        &workspace,
        "solo",
        &["--tokens-file", tokens_file.to_str().unwrap()],
        &[("SLUICE_VAR_AUDIT_HOOK", format!("http://127.0.0.1:9/{canary}"))],
    );
    for (token, name, role) in [
        (VIEWER, "viewer", "read"),
        (ONCALL, "oncall", "operate"),
        (ALICE, "alice", "admin"),
        (LEGACY, "admin-line5", "admin"),
    ] {
        let (status, me) = server.call("GET", "/whoami", Some(token), None);
        assert_eq!((status, me["name"].as_str(), me["role"].as_str()), (200, Some(name), Some(role)), "{me}");
    }
    let yaml = |version: u32| ("application/yaml", job_yaml("audited", version));
    let create = yaml(1);
    // (method, path, body, the weakest role allowed)
    let json = |text: &'static str| Some(("application/json", text));
    let routes: Vec<Route> = vec![
        ("POST", "/jobs".into(), Some((create.0, create.1.as_str())), "admin"),
        ("GET", "/jobs".into(), None, "read"),
        ("GET", "/jobs/audited".into(), None, "read"),
        ("GET", "/jobs/audited/versions".into(), None, "read"),
        ("GET", "/audit".into(), None, "read"),
        ("POST", "/jobs/audited/stop".into(), None, "operate"),
        ("POST", "/jobs/audited/start".into(), None, "operate"),
        ("POST", "/jobs/audited/restart".into(), None, "operate"),
        ("POST", "/jobs/audited/dirty/discard".into(), json(r#"{"all": true}"#), "operate"),
        ("POST", "/jobs/audited/verify".into(), json("{}"), "operate"),
        // A copy job has no stream to resync (400), but the role is judged first.
        ("POST", "/jobs/audited/resync".into(), json(r#"{"tables": ["main.items"]}"#), "operate"),
        ("POST", "/jobs/audited/rollback".into(), json(r#"{"version": 1}"#), "admin"),
        ("PUT", "/alarms".into(), Some(("application/yaml", "- {name: y, when: \"failed == 1\"}\n")), "admin"),
    ];
    let rank = |role: &str| ["read", "operate", "admin"].iter().position(|known| *known == role).unwrap();
    for (method, path, body, weakest) in &routes {
        for (token, name, role) in
            [(VIEWER, "viewer", "read"), (ONCALL, "oncall", "operate"), (ALICE, "alice", "admin")]
        {
            let (status, answer) = server.call(method, path, Some(token), *body);
            if rank(role) < rank(weakest) {
                assert_eq!(status, 403, "{name} {method} {path}: {answer}");
                let expected = format!("this needs the {weakest} role; the token {name} has the {role} role");
                assert_eq!(answer["error"], expected.as_str(), "{method} {path}");
            } else {
                assert_ne!(status, 403, "{name} {method} {path}: {answer}");
                assert_ne!(status, 401, "{name} {method} {path}: {answer}");
            }
        }
    }
    // An update by alice with a secret webhook from the server's environment: a new version,
    // its diff in the trail, the secret nowhere.
    let updated = job_yaml("audited", 3).replace("limits:", "retry: {max_attempts: 1}\nlimits:")
        + "alarms:\n  - {name: late, when: \"lag_seconds > 60\", notify: [{webhook: \"${SLUICE_VAR_AUDIT_HOOK}\"}]}\n";
    let (status, answer) = server.call("PUT", "/jobs/audited", Some(ALICE), Some(("application/yaml", &updated)));
    assert_eq!(status, 200, "{answer}");
    let version = answer["version"].as_u64().expect("a version");
    let (status, refused) = server.call("DELETE", "/jobs/audited", Some(ONCALL), None);
    assert_eq!(status, 403, "{refused}");

    let (status, trail) = server.call("GET", "/audit?limit=1000", Some(VIEWER), None);
    assert_eq!(status, 200, "{trail}");
    let records = trail.as_array().expect("a list");
    let found = |actor: &str, action: &str| {
        records.iter().find(|record| record["actor"] == actor && record["action"] == action).cloned()
    };
    let created = found("alice", "create job").expect("the create is recorded");
    assert_eq!((created["status"].as_u64(), created["result"].as_str()), (Some(201), Some("ok")), "{created}");
    assert_eq!((created["job"].as_str(), created["version"].as_u64()), (Some("audited"), Some(1)), "{created}");
    assert!(created["from"].as_str().unwrap().starts_with("127.0.0.1:"), "{created}");
    let stopped = found("oncall", "stop job").expect("oncall's stop is recorded");
    assert_eq!(stopped["job"], "audited", "{stopped}");
    let update = records
        .iter()
        .find(|record| record["action"] == "update job" && record["version"].as_u64() == Some(version))
        .expect("the update is recorded with its version");
    assert_eq!(update["actor"], "alice");
    let diff = update["diff"].as_str().unwrap();
    assert!(diff.contains("+ retry: {max_attempts: 1}") && diff.contains("+ alarms:"), "{update}");
    assert!(found("alice", "set alarms").is_some(), "{trail:#}");
    // Refused by role: never ran, so never recorded.
    assert!(found("oncall", "delete job").is_none(), "{trail:#}");
    assert!(found("viewer", "stop job").is_none(), "{trail:#}");
    // Newest first, and filtered by job and by name.
    let times: Vec<u64> = records.iter().map(|record| record["at_ms"].as_u64().unwrap()).collect();
    assert!(times.windows(2).all(|pair| pair[0] >= pair[1]), "{times:?}");
    let (_, mine) = server.call("GET", "/audit?actor=oncall", Some(VIEWER), None);
    assert!(mine.as_array().unwrap().iter().all(|record| record["actor"] == "oncall"), "{mine}");
    assert!(!mine.as_array().unwrap().is_empty());
    let (_, alarms_only) = server.call("GET", "/audit?job=audited", Some(VIEWER), None);
    assert!(alarms_only.as_array().unwrap().iter().all(|record| record["job"] == "audited"), "{alarms_only}");
    // The command line shows the same trail.
    let listed = workspace.sluice(&["audit", "--server", &server.url, "--token", VIEWER, "--actor", "alice"]);
    listed.assert_code(0);
    assert!(listed.stdout.contains("update job") && listed.stdout.contains("create job"), "{}", listed.stdout);
    assert!(!listed.stdout.contains("oncall"), "only alice's: {}", listed.stdout);
    let everything = trail.to_string() + &listed.stdout + &server.output();
    assert!(!everything.contains(canary), "a secret in the trail or the log");
    for token in [VIEWER, ONCALL, ALICE, LEGACY] {
        assert!(!everything.contains(token), "a token in the trail or the log");
    }
}
