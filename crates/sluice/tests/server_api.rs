//! `sluice server` on one node (embedded state): the API's jobs, versions, rollback, diff,
//! lifecycle, auth and errors; a snapshot job submitted through the API runs to `succeeded`;
//! secrets never come back in a response.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::cluster::{start_server, Server};
use support::{count, make_source, wait_for, Workspace};

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
    assert_eq!(listed, serde_json::json!([{ "name": "copy", "state": "succeeded", "version": 1, "mode": "snapshot" }]));
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
    assert_eq!(openapi["openapi"], "3.0.3");
    let metrics = support::cluster::request(&server.url, "GET", "/metrics", None, None).unwrap().1;
    assert!(metrics.contains("sluice_workers 1"), "{metrics}");
}

#[test]
fn invalid_jobs_get_every_error_and_secrets_never_come_back() {
    let workspace = Workspace::new();
    let server = start_server(&workspace, "solo", None, &tokens());
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

    // A job whose URL holds a password: no response shows it.
    let secret = "Sup3r-Secret-pw";
    let job = format!(
        "name: secretive\nmode: snapshot\nsource:\n  type: mysql\n  url: mysql://u:{secret}@127.0.0.1:1/db\n  tables: [\"db.*\"]\ntarget:\n  type: sqlite\n  path: t.db\nretry: {{max_attempts: 1}}\n"
    );
    let (status, body) = server.call("POST", "/jobs", Some(ADMIN), Some(("application/yaml", &job)));
    assert_eq!(status, 201, "{body}");
    let failed = wait_state(&server, "secretive", "failed");
    assert_eq!(failed["error"]["side"], "source", "{failed:#}");
    let mut everything = failed.to_string();
    for path in [
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
    assert!(submitted.all().contains("\"version\": 1"), "{}", submitted.all());
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
    assert!(shown.all().contains("\"state\": \"succeeded\""), "{}", shown.all());
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
