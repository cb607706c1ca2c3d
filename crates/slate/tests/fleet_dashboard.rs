//! The rollout dashboard in a real browser during a simulated-fleet rollout: a 3-member etcd,
//! Debian's docker-registry holding the release index, `slate operator run`, and simulated
//! nodes (slate-fleet-sim) in two groups heartbeating to it. A headless Chromium presenting
//! the operator's client certificate loads `/ui` while the rollout runs and must show the
//! groups, waves and counts that `slate fleet status --output json` reports at the same moment;
//! it presses Pause and the rollout pauses (checked through the CLI); a second Chromium with a
//! reader's certificate presses Resume and is refused by the server, with the reason on the
//! page. Screenshots of the overview and of a node's page are written to `target/dashboard/`.
//! Run with `CI=true` to make a missing chromium, chromedriver, etcd or registry a failure.
#![cfg(feature = "etcd")]

mod fleet_support;

#[path = "../../transport/tests/support/registry.rs"]
#[allow(dead_code)]
mod registry;

#[path = "dashboard_browser/browser.rs"]
mod browser;

use fleet_support::{start_operator, wait_for, Index, ToOperator};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use browser::Browser;
use registry::TestRegistry;
use serde_json::Value;
use slate_api::{Client, Role};
use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, Identities};

const POLICY: &str = r#"
[[policy]]
name = "fleet"
max_unavailable = "20%"
waves = [{ percent = 25, soak = "6s" }, { percent = 100 }]
failure_budget = 10
"#;

/// `slate fleet status --output json`, as a reader.
fn cli_status(addr: &str, certs: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(["fleet", "status", "--output", "json", "--role", "reader"])
        .args(["--node", addr])
        .arg("--certs")
        .arg(certs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "slate fleet status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rollout_state(status: &Value, group: &str) -> String {
    status["rollouts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["group"] == group)
        .map_or("none".into(), |r| {
            r["state"]["state"].as_str().unwrap_or("?").to_owned()
        })
}

/// What one group looks like: its node count, nodes by `version|state`, by wave, by
/// `wave|state`, and its rollout's target and state. Built the same way from the CLI's JSON
/// and from the page, then compared.
type Seen = BTreeMap<String, Value>;

fn seen_by_cli(status: &Value) -> Seen {
    let mut groups: BTreeMap<String, (u64, Seen, Seen, Seen)> = BTreeMap::new();
    for n in status["nodes"].as_array().unwrap() {
        let g = groups
            .entry(n["group"].as_str().unwrap().into())
            .or_default();
        g.0 += 1;
        let state = n["state"].as_str().unwrap();
        let cell = format!("{}|{state}", n["version"].as_str().unwrap());
        let by_cell = g.1.get(&cell).and_then(Value::as_u64).unwrap_or(0);
        g.1.insert(cell, Value::from(by_cell + 1));
        if let Some(w) = n["wave"].as_u64() {
            let by_wave = g.2.get(&w.to_string()).and_then(Value::as_u64).unwrap_or(0);
            g.2.insert(w.to_string(), Value::from(by_wave + 1));
            let key = format!("{w}|{state}");
            let by_state = g.3.get(&key).and_then(Value::as_u64).unwrap_or(0);
            g.3.insert(key, Value::from(by_state + 1));
        }
    }
    groups
        .into_iter()
        .map(|(group, (nodes, cells, waves, wave_states))| {
            let rollout = status["rollouts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["group"] == group.as_str());
            let value = serde_json::json!({
                "nodes": nodes,
                "cells": cells,
                "waves": waves,
                "wave_states": wave_states,
                "target": rollout.map(|r| r["target"].clone()),
                "state": rollout.map(|r| r["state"]["state"].clone()),
            });
            (group, value)
        })
        .collect()
}

/// The same, read off the page in one script (so from one rendering of it).
const READ_PAGE: &str = r#"
var out = {};
function group(g) {
  return out[g] = out[g] || {nodes: 0, cells: {}, waves: {}, wave_states: {}, target: null, state: null};
}
document.querySelectorAll('[data-field=nodes][data-group]').forEach(function (e) {
  group(e.dataset.group).nodes = +e.textContent;
});
document.querySelectorAll('table.glance td[data-state]').forEach(function (td) {
  var n = +td.textContent;
  if (n > 0) group(td.dataset.group).cells[td.dataset.version + '|' + td.dataset.state] = n;
});
document.querySelectorAll('section.rollout').forEach(function (s) {
  var g = group(s.dataset.group);
  var t = s.querySelector('[data-field=target]'), st = s.querySelector('[data-field=state]');
  g.target = t ? t.textContent : null;
  g.state = st ? st.textContent : null;
  s.querySelectorAll('tr[data-wave]').forEach(function (tr) {
    var w = tr.dataset.wave;
    g.waves[w] = +tr.querySelector('[data-field=nodes]').textContent;
    tr.querySelectorAll('td[data-state]').forEach(function (td) {
      var n = +td.textContent;
      if (n > 0) g.wave_states[w + '|' + td.dataset.state] = n;
    });
  });
});
return out;
"#;

fn seen_on_page(browser: &Browser) -> Seen {
    match browser.js(READ_PAGE) {
        Value::Object(map) => map.into_iter().collect(),
        other => panic!("the page read as {other}"),
    }
}

/// `target/dashboard/NAME`, beside the test binary's `target/debug/deps`.
fn artifact(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_owned();
    target.join("dashboard").join(name)
}

#[test]
fn the_dashboard_shows_the_rollout_and_acts_by_role() {
    let _serial = slate_testkit::etcd::one_at_a_time();
    if !browser::available() {
        return;
    }
    let Some(etcd) = slate_testkit::etcd::three_members() else {
        return;
    };
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    slate_api::gen_certs(&certs, &[]).unwrap();
    let image = registry.image("slate/os");
    let mut index = Index::new(&image);
    index.publish("1");
    let (_operator, op_addr) = start_operator(
        &etcd.endpoints(),
        &certs,
        &image,
        &dir.path().join("operator.log"),
    );
    let admin = || Client::from_dir(&op_addr, &certs, Role::Admin).unwrap();
    admin()
        .call::<Value, _>(
            "POST",
            "/v1/fleet/policy",
            Some(&serde_json::json!({ "text": POLICY })),
        )
        .unwrap();

    let mut spec = FleetSpec::new(&certs)
        .group("web", 16, "stable", "1")
        .group("db", 8, "stable", "1");
    spec.heartbeat_interval = Duration::from_secs(1);
    spec.behaviour = Behaviour {
        // Slow enough that the page can be read between changes, and some upgrades revert
        // (seeded: the same ones every run), so the timeline has failures to mark.
        upgrade_time: Duration::from_secs(3),
        reboot_time: Duration::from_secs(1),
        fail_probability: 0.15,
        ..Behaviour::default()
    };
    let reporter = ToOperator {
        addr: op_addr.clone(),
        identities: Identities::from_dir(&certs).unwrap(),
    };
    let fleet = Fleet::start(spec, Arc::new(reporter)).unwrap();
    wait_for("24 nodes in the inventory", Duration::from_secs(60), || {
        cli_status(&op_addr, &certs)["nodes"]
            .as_array()
            .is_some_and(|n| n.len() == 24)
    });

    // The browsers start before the release, so that the rollout is young when they look.
    let origin = format!("https://{op_addr}");
    let operator = Browser::start(&certs, Role::Operator, &origin);
    let reader = Browser::start(&certs, Role::Reader, &origin);
    let ui = format!("{origin}/ui");
    operator.goto(&ui);
    let role = operator.js("return document.querySelector('[data-role]').dataset.role;");
    assert_eq!(role, "operator", "the page knows the certificate's role");

    index.publish("2");
    wait_for("the rollouts to start", Duration::from_secs(60), || {
        let s = cli_status(&op_addr, &certs);
        rollout_state(&s, "web") == "running" && rollout_state(&s, "db") == "running"
    });

    // The page shows what the CLI shows: loaded between two CLI reads that agree with each
    // other (nothing moved meanwhile), it must agree with them.
    let start = Instant::now();
    let mut tries = 0;
    let matched = loop {
        tries += 1;
        let before = seen_by_cli(&cli_status(&op_addr, &certs));
        operator.goto(&ui);
        let page = seen_on_page(&operator);
        let after = seen_by_cli(&cli_status(&op_addr, &certs));
        if before == after && page == before {
            break page;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "after {tries} tries the page never matched the CLI;\npage: {page:#?}\ncli: {after:#?}"
        );
    };
    eprintln!("page = CLI after {tries} tries: {matched:#?}");
    let overview_shot = operator.screenshot(&artifact("overview.png"));
    assert_eq!(matched.len(), 2, "both groups: {matched:?}");
    assert!(
        matched["web"]["waves"]
            .as_object()
            .is_some_and(|w| w.len() == 2),
        "two waves: {matched:?}"
    );

    // Pause, as the operator: the rollout pauses (the CLI says so) and the page says done.
    operator.click("button[data-action=pause][data-group=web]");
    let answer = operator.message();
    assert!(answer.contains("pause web: done"), "{answer}");
    let status = cli_status(&op_addr, &certs);
    assert_eq!(rollout_state(&status, "web"), "paused", "{status:#}");
    assert_eq!(
        rollout_state(&status, "db"),
        "running",
        "only the group pressed"
    );
    operator.goto(&ui);
    let paused_shot = operator.screenshot(&artifact("overview-paused.png"));
    let paused = operator.js(
        "return document.querySelector('section.rollout[data-group=web] [data-field=state]')\
         .textContent;",
    );
    assert_eq!(paused, "paused");

    // Resume, as a reader: refused by the server, which says why; still paused.
    reader.goto(&ui);
    let role = reader.js("return document.querySelector('[data-role]').dataset.role;");
    assert_eq!(role, "reader");
    reader.click("button[data-action=resume][data-group=web]");
    let refusal = reader.message();
    assert!(
        refusal.contains("refused (403)") && refusal.contains("requires role operator"),
        "{refusal}"
    );
    let refused_shot = reader.screenshot(&artifact("reader-refused.png"));
    let status = cli_status(&op_addr, &certs);
    assert_eq!(
        rollout_state(&status, "web"),
        "paused",
        "the reader changed nothing"
    );

    // A node's page: the node the CLI shows, with what it says of itself.
    let node = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["group"] == "web" && n["state"] != "idle")
        .or_else(|| status["nodes"].as_array().unwrap().first())
        .unwrap()
        .clone();
    let id = node["node"].as_str().unwrap();
    operator.goto(&format!("{origin}/ui/node?id={id}"));
    let shown = operator.js(
        "return {node: document.querySelector('h1[data-node]').dataset.node, \
         group: document.querySelector('[data-field=group]').textContent, \
         running: (document.querySelector('[data-field=running]') || {}).textContent};",
    );
    assert_eq!(shown["node"], id, "{shown}");
    assert_eq!(shown["group"], "web", "{shown}");
    assert!(shown["running"].is_string(), "the node answered: {shown}");
    let node_shot = operator.screenshot(&artifact("node.png"));

    // Resume as the operator; the rollout finishes and the timeline shows it.
    operator.goto(&ui);
    operator.click("button[data-action=resume][data-group=web]");
    let answer = operator.message();
    assert!(answer.contains("resume web: done"), "{answer}");
    wait_for("both rollouts to finish", Duration::from_secs(180), || {
        let s = cli_status(&op_addr, &certs);
        rollout_state(&s, "web") == "completed" && rollout_state(&s, "db") == "completed"
    });
    operator.goto(&ui);
    let marks = operator.js(
        "return {paused: document.querySelectorAll('section[data-group=web] [data-mark=paused]').length, \
         completed: document.querySelectorAll('section[data-group=web] [data-mark=completed]').length, \
         failures: document.querySelectorAll('svg [data-failure]').length};",
    );
    let status = cli_status(&op_addr, &certs);
    let failed = status["rollouts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["nodes"].as_object().unwrap().values())
        .filter(|p| p["step"]["step"] == "failed")
        .count();
    eprintln!("timeline marks: {marks}; failed nodes by the CLI: {failed}");
    assert_eq!(marks["paused"], 1, "{marks}");
    assert_eq!(marks["completed"], 1, "{marks}");
    assert_eq!(marks["failures"].as_u64(), Some(failed as u64), "{marks}");
    let done_shot = operator.screenshot(&artifact("overview-completed.png"));
    for shot in [
        &overview_shot,
        &paused_shot,
        &refused_shot,
        &node_shot,
        &done_shot,
    ] {
        let len = std::fs::metadata(shot).unwrap().len();
        assert!(len > 10_000, "{} is {len} bytes", shot.display());
        eprintln!("screenshot: {} ({len} bytes)", shot.display());
    }
    drop(fleet);
}
