//! The web console as a person uses it, in a headless Chromium against a real server, MariaDB
//! and PostgreSQL: log in, submit a job with a mistake and see it marked at its line, fix it,
//! watch it run, take the target down until the lag alarm fires (the webhook hears it), bring it
//! back and see the alarm resolve. A screenshot of every page is kept under
//! `target/tmp/console/`.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use sluice_faults::{Fault, Proxy};
use support::browser::Browser;
use support::cluster::start_server;
use support::webhook::Webhook;
use support::workload::{committed, create_tables, Load, Random};
use support::{address_of, mysql_url, postgres_url, psql, through, unique_name, wait_for, Workspace};

const TOKEN: &str = "console-admin-token-0123456789";
const READER: &str = "console-read-token-0123456789";

fn screenshot(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console").join(format!("{name}.png"))
}

#[test]
fn an_operator_submits_fixes_watches_and_sees_the_lag_alarm_fire_and_resolve() {
    let database = unique_name("console");
    create_tables(&database);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let proxy = runtime.block_on(Proxy::start(address_of(&postgres_url()))).expect("a proxy");
    let webhook = Webhook::start();
    let workspace = Workspace::new();
    let environment = [
        ("SLUICE_ADMIN_TOKEN", TOKEN.to_owned()),
        ("SLUICE_READ_TOKEN", READER.to_owned()),
        ("SLUICE_VAR_SOURCE", mysql_url()),
        ("SLUICE_VAR_TARGET", through(&postgres_url(), &proxy)),
        ("SLUICE_VAR_ALARM_HOOK", webhook.url.clone()),
    ];
    let server = start_server(&workspace, "console", None, &environment);
    let name = database.replace('_', "-");
    let browser = Browser::start();

    // Log in: a wrong token is refused on the page, the right one opens the jobs list.
    browser.goto(&format!("{}/", server.url));
    browser.type_into("#token", "not-the-token-at-all");
    browser.click("#login");
    browser.wait_text("#login-error", Duration::from_secs(10), |text| !text.is_empty());
    browser.screenshot(&screenshot("01-login"));
    browser.type_into("#token", TOKEN);
    browser.click("#login");
    browser.wait_text("table#jobs", Duration::from_secs(10), |_| true);
    assert!(!browser.url().contains(TOKEN), "the token never goes in a URL: {}", browser.url());

    // A job with a mistake on line 11: marked there, nothing created.
    let job = |parallelism: &str| {
        format!(
            "name: {name}\nmode: snapshot+cdc\nsource:\n  type: mysql\n  url: ${{SLUICE_VAR_SOURCE}}\n  tables: [\"{database}.*\"]\n\
             target:\n  type: postgres\n  url: ${{SLUICE_VAR_TARGET}}\n  namespace: {database}\nparallelism: {parallelism}\n\
             alarms:\n  - {{name: lag, when: \"lag_seconds > 8\", for_secs: 3, notify: [{{webhook: \"${{SLUICE_VAR_ALARM_HOOK}}\"}}]}}\n"
        )
    };
    browser.click("#nav-new");
    browser.paste("#editor", &job("lots"));
    browser.click("#submit");
    let error = browser.wait_text("#errors li[data-line='11']", Duration::from_secs(10), |_| true);
    assert!(error.contains("parallelism"), "the error names the field: {error}");
    browser.wait_text("#gutter .line-error[data-line='11']", Duration::from_secs(5), |_| true);
    browser.screenshot(&screenshot("02-editor-error"));
    let (status, _) = server.call("GET", &format!("/jobs/{name}"), Some(TOKEN), None);
    assert_eq!(status, 404, "an invalid job is not created");

    // Fixed: it is created and the job page shows it running.
    browser.paste("#editor", &job("2"));
    browser.click("#submit");
    browser.wait_text("#job-state", Duration::from_secs(60), |state| state == "running");
    let load = Load::start(&database, Random::from_environment("console"), 50);
    let before = committed("postgres", &name);
    wait_for("the stream to apply", Duration::from_secs(90), || committed("postgres", &name) > before + 20);
    browser.wait_text("#tasks", Duration::from_secs(10), |tasks| tasks.contains("cdc"));
    // The stream measures the source's log past its checkpoint.
    let backlog = format!("sluice_task_source_log_files_to_spare{{job=\"{name}\",task=\"stream\"");
    wait_for("the stream to report the source's log", Duration::from_secs(30), || {
        support::cluster::request(&server.url, "GET", "/metrics", Some(TOKEN), None)
            .is_some_and(|(_, metrics)| metrics.contains(&backlog))
    });
    browser.screenshot(&screenshot("03-job"));
    browser.click("#nav-jobs");
    browser.wait_text(&format!("tr[data-job='{name}'] td.state"), Duration::from_secs(10), |state| state == "running");
    browser.screenshot(&screenshot("04-jobs"));

    // The target goes down: the lag alarm fires once, on the page and at the webhook.
    let alarm = format!("tr[data-alarm='{name}/lag'] td.state");
    browser.click("#nav-alarms");
    browser.wait_text(&alarm, Duration::from_secs(30), |state| state == "ok");
    assert!(webhook.received().is_empty(), "an alarm while the stream keeps up: {:?}", webhook.received());
    proxy.set(Fault::Down);
    wait_for("the webhook to hear the alarm fire", Duration::from_secs(90), || !webhook.events("lag").is_empty());
    let (_, metrics) = support::cluster::request(&server.url, "GET", "/metrics", Some(TOKEN), None).unwrap();
    assert!(metrics.contains(&format!("sluice_job_alarms_firing{{job=\"{name}\"}} 1")), "{metrics}");
    browser.click("#nav-alarms");
    browser.wait_text(&alarm, Duration::from_secs(10), |state| state == "firing");
    browser.screenshot(&screenshot("05-alarm-firing"));
    browser.click("#nav-jobs");
    let row =
        browser.wait_text(&format!("tr[data-job='{name}']"), Duration::from_secs(30), |row| row.contains("target"));
    assert!(!row.contains(&postgres_url()), "no URL with its password on the page: {row}");
    browser.screenshot(&screenshot("06-jobs-target-down"));

    // The target is back (the writes done): the alarm resolves.
    load.stop();
    proxy.set(Fault::None);
    wait_for("the webhook to hear it resolve", Duration::from_secs(120), || webhook.events("lag").len() >= 2);
    browser.click("#nav-alarms");
    browser.wait_text(&alarm, Duration::from_secs(10), |state| state == "ok");
    browser.wait_text("table#alarm-history", Duration::from_secs(10), |history| {
        history.contains("resolved") && history.contains("firing")
    });
    browser.screenshot(&screenshot("07-alarm-resolved"));
    assert_eq!(webhook.events("lag"), ["firing", "resolved"], "{:#?}", webhook.received());

    // The other pages render.
    browser.click("#nav-cluster");
    browser.wait_text("table#workers", Duration::from_secs(10), |workers| workers.contains("console"));
    browser.screenshot(&screenshot("08-cluster"));
    browser.goto(&format!("{}/#/dirty/{name}", server.url));
    browser.wait_text("#dirty-total", Duration::from_secs(10), |total| total.starts_with('0'));
    browser.screenshot(&screenshot("09-dirty"));
    browser.goto(&format!("{}/#/jobs/{name}", server.url));
    browser.wait_text("#job-state", Duration::from_secs(10), |state| state == "running");
    browser.wait_text("table#versions", Duration::from_secs(10), |versions| versions.contains('1'));
    browser.screenshot(&screenshot("10-job-after"));

    // Verify from the job page: the target equals the source; then a row added to the target
    // behind the job's back is named by its key.
    browser.click("#job-verify");
    browser.wait_text("#verify-summary", Duration::from_secs(120), |summary| {
        summary.starts_with("The target equals the source")
    });
    psql(&format!("INSERT INTO {database}.accounts VALUES (999999, 1)"));
    browser.click("#job-verify");
    let accounts = format!("#verify-tables tr[data-table='{database}.accounts']");
    let row = browser.wait_text(&accounts, Duration::from_secs(120), |row| row.contains("999999"));
    assert!(row.contains(r#"extra {"id":999999}"#), "{row}");
    browser.wait_text("#verify-summary", Duration::from_secs(10), |summary| summary.starts_with("1 row differs"));
    browser.screenshot(&screenshot("11-verification"));

    // Verify and repair (confirmed in its dialog): the extra row is deleted, the target equals
    // the source again, and the repair is listed with the dirty records.
    browser.click("#job-repair");
    browser.accept_dialog();
    browser.wait_text("#verify-summary", Duration::from_secs(120), |summary| {
        summary.starts_with("The target equals the source")
    });
    let left = psql(&format!("SELECT count(*) FROM {database}.accounts WHERE id = 999999"));
    assert_eq!(left.trim(), "0", "the extra row is deleted from the target");
    let (status, repairs) = server.call("GET", &format!("/jobs/{name}/repairs"), Some(TOKEN), None);
    assert_eq!(status, 200, "{repairs}");
    let repairs = repairs.as_array().unwrap();
    assert_eq!(repairs.len(), 1, "{repairs:?}");
    assert_eq!((repairs[0]["kind"].as_str(), &repairs[0]["key"]), (Some("extra"), &serde_json::json!({"id": 999999})));
    assert_eq!(
        (&repairs[0]["before"]["balance"], &repairs[0]["after"]),
        (&serde_json::json!(1), &serde_json::Value::Null)
    );
    browser.goto(&format!("{}/#/dirty/{name}", server.url));
    let listed = browser.wait_text("table#repairs", Duration::from_secs(10), |repairs| repairs.contains("999999"));
    assert!(listed.contains("extra") && listed.contains("deleted"), "{listed}");
    browser.screenshot(&screenshot("12-repairs"));
    // Who is signed in, and the audit trail of what the operator did through the console.
    let signed_in = browser.text("#signed-in").unwrap_or_default();
    assert_eq!(signed_in, "SLUICE_ADMIN_TOKEN (admin)");
    browser.click("#nav-audit");
    let trail = browser.wait_text("table#audit", Duration::from_secs(10), |trail| trail.contains("verify job"));
    assert!(trail.contains("create job") && trail.contains(&name), "{trail}");
    browser.type_into("#audit-actor", "someone-else");
    browser.click("#audit-filter");
    browser.wait_text("table#audit", Duration::from_secs(10), |trail| trail.contains("No change recorded"));
    browser.screenshot(&screenshot("13-audit"));
    // A read token sees the job, and is offered nothing it may not do.
    browser.click("#nav-logout");
    browser.type_into("#token", READER);
    browser.click("#login");
    browser.wait_text("#signed-in", Duration::from_secs(10), |text| text == "SLUICE_READ_TOKEN (read)");
    browser.goto(&format!("{}/#/jobs/{name}", server.url));
    browser.wait_text("table#tasks", Duration::from_secs(10), |tasks| tasks.contains("stream"));
    for hidden in ["#job-stop", "#job-verify", "#job-delete", "#job-edit", "#nav-new"] {
        assert_eq!(browser.text(hidden).as_deref(), Some(""), "{hidden} is not offered to a read token");
    }
    assert_eq!(browser.text("#job-dirty").as_deref(), Some("Dirty records"), "what it may see stays");
    browser.screenshot(&screenshot("14-read-only"));
    let output = server.output();
    assert!(!output.contains(TOKEN), "the token in the server's log");
    assert!(!output.contains(&webhook.token), "the webhook's secret in the server's log");
    for path in ["/alarms".to_owned(), format!("/jobs/{name}"), format!("/jobs/{name}/versions/1")] {
        let (_, answer) = server.call("GET", &path, Some(TOKEN), None);
        assert!(!answer.to_string().contains(&webhook.token), "the webhook's secret in GET {path}: {answer}");
    }
}
