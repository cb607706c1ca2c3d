//! The rollout operator end to end with real parts: a 3-member etcd cluster on loopback,
//! Debian's docker-registry holding the release index, two `slate operator run` replicas, and
//! simulated nodes (slate-fleet-sim: real node API servers over a simulated backend) that
//! heartbeat to the replicas. The simulator's log is the ground truth: every upgrade a node
//! accepted and the most upgrades ever in flight at once per group.
//!
//! 1. v2 rolls across 3 groups; mid-way the leader replica is SIGKILLed and so is one etcd
//!    member: the rollout completes, no node is asked twice, no instant exceeds the limit.
//! 2. v3 reverts on every node: the canaries (the first wave, 1 %: 3 or 4 nodes a group) fail,
//!    each group's rollout pauses by itself (failure budget 3) with the reason, nothing else is
//!    touched.
//! 3. v3 is yanked and v4 published; `slate fleet resume` moves every group on to v4.
#![cfg(feature = "etcd")]

mod fleet_support;

#[path = "../../transport/tests/support/registry.rs"]
#[allow(dead_code)]
mod registry;

use fleet_support::{free_port, release, wait_for};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use registry::TestRegistry;
use slate_api::{Client, Role};
use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, Identities, Reporter, SimEventKind};
use slate_release::ReleaseIndex;
use slate_rollout::NodeReport;
use slate_transport::{store_release_index, Options, Reference};

/// 1,000 nodes in three groups.
const GROUPS: [(&str, usize); 3] = [("web", 400), ("db", 300), ("edge", 300)];

/// The policy's limit in a group: 10 % of its nodes.
fn limit(nodes: usize) -> usize {
    nodes / 10
}

const POLICY: &str = r#"
[[policy]]
name = "fleet"
max_unavailable = "10%"
waves = [{ percent = 1, soak = "3s" }, { percent = 30, soak = "2s" }, { percent = 100 }]
failure_budget = 3
upgrade_timeout = "60s"

[[policy]]
name = "edge-fresh"
groups = ["edge"]
strategy = "replace"
"#;

/// Heartbeats to whichever replica answers.
/// Each node as itself: a client certificate naming the node it reports about.
struct ToReplicas {
    addrs: Vec<String>,
    identities: Identities,
    next: AtomicUsize,
}

impl Reporter for ToReplicas {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..self.addrs.len() {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.addrs.len();
            let client = self
                .identities
                .heartbeat_client(&report.id, &self.addrs[i])?;
            match client.call::<serde_json::Value, _>("POST", "/v1/fleet/heartbeat", Some(report)) {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        Err(last)
    }
}

struct Replica {
    child: Child,
    addr: String,
    name: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_replica(name: &str, etcd: &[String], certs: &Path, image: &str, log: &Path) -> Replica {
    let addr = format!("127.0.0.1:{}", free_port());
    let out = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(["operator", "run", "--etcd", &etcd.join(",")])
        .args(["--listen", &addr, "--name", name, "--image", image])
        .arg("--certs")
        .arg(certs)
        .args(["--insecure-registry", "--tick", "500ms", "--lease", "2s"])
        .args(["--release-refresh", "1s", "--stale-after", "30s"])
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .unwrap();
    Replica {
        child,
        addr,
        name: name.into(),
    }
}

fn fleet_cli(certs: &Path, replica: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_slate"))
        .arg("--certs")
        .arg(certs)
        .args(["--node", replica, "--role", "admin", "fleet"])
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "slate fleet {args:?}: {text}");
    text
}

fn status(certs: &Path, replica: &str) -> serde_json::Value {
    serde_json::from_str(&fleet_cli(certs, replica, &["status", "--output", "json"])).unwrap()
}

fn on_version(fleet: &Fleet, version: &str) -> usize {
    fleet.versions().get(version).copied().unwrap_or(0)
}

fn accepted_to(fleet: &Fleet, version: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (node, targets) in fleet.upgrades_per_node() {
        let n = targets.iter().filter(|t| *t == version).count();
        if n > 0 {
            out.insert(node, n);
        }
    }
    out
}

#[test]
fn failover_stop_the_line_and_resume_after_a_yank() {
    let _serial = slate_testkit::etcd::one_at_a_time();
    let Some(mut etcd) = slate_testkit::etcd::three_members() else {
        return;
    };
    let Some(registry) = TestRegistry::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    slate_api::gen_certs(&certs, &[]).unwrap();
    let image = registry.image("slate/os");
    let repo = Reference::parse(&image).unwrap();
    let options = Options {
        insecure: true,
        ..Options::default()
    };
    let mut index = ReleaseIndex::default();
    index.publish(release("1")).unwrap();
    index.publish(release("2")).unwrap();
    store_release_index(&repo, &index, &options).unwrap();

    let endpoints = etcd.endpoints();
    let mut replicas: Vec<Replica> = ["op-a", "op-b"]
        .iter()
        .map(|n| {
            start_replica(
                n,
                &endpoints,
                &certs,
                &image,
                &dir.path().join(format!("{n}.log")),
            )
        })
        .collect();
    let replica_addrs: Vec<String> = replicas.iter().map(|r| r.addr.clone()).collect();
    wait_for("the operator API", Duration::from_secs(30), || {
        Client::from_dir(&replica_addrs[0], &certs, Role::Reader)
            .unwrap()
            .call::<serde_json::Value, ()>("GET", "/v1/fleet/policy", None)
            .is_ok()
    });
    fleet_cli(
        &certs,
        &replica_addrs[0],
        &["policy", "set", "--dry-run", &write(&dir, POLICY)],
    );
    let stored = fleet_cli(&certs, &replica_addrs[0], &["policy", "show"]);
    assert!(stored.is_empty(), "nothing stored by a dry run: {stored}");
    nodes_speak_only_for_themselves(&certs, &replica_addrs[0]);

    let reporter = ToReplicas {
        addrs: replica_addrs.clone(),
        identities: Identities::from_dir(&certs).unwrap(),
        next: AtomicUsize::new(0),
    };
    let mut spec = FleetSpec::new(&certs);
    for (g, nodes) in GROUPS {
        spec = spec.group(g, nodes, "stable", "1");
    }
    spec.heartbeat_interval = Duration::from_secs(10);
    spec.behaviour = Behaviour {
        upgrade_time: Duration::from_millis(600),
        reboot_time: Duration::from_millis(300),
        jitter: Duration::from_millis(400),
        ..Behaviour::default()
    };
    let total: usize = GROUPS.iter().map(|(_, n)| n).sum();
    let mut fleet = Fleet::start(spec, Arc::new(reporter)).unwrap();
    wait_for(
        "every node in the inventory",
        Duration::from_secs(60),
        || {
            status(&certs, &replica_addrs[0])["nodes"]
                .as_array()
                .unwrap()
                .len()
                == total
        },
    );

    // 1. v2, with the leader and an etcd member killed mid-way.
    fleet_cli(
        &certs,
        &replica_addrs[0],
        &["policy", "set", &write(&dir, POLICY)],
    );
    let plan = fleet_cli(&certs, &replica_addrs[1], &["plan", "--output", "json"]);
    let plan: Vec<serde_json::Value> = serde_json::from_str(&plan).unwrap();
    assert_eq!(plan.len(), total);
    wait_for(
        "a third of the fleet on 2",
        Duration::from_secs(120),
        || on_version(&fleet, "2") >= total / 3,
    );
    let leader = status(&certs, &replica_addrs[1])["leader"]
        .as_str()
        .unwrap()
        .to_owned();
    let killed = replicas.iter().position(|r| r.name == leader).unwrap();
    replicas[killed].child.kill().unwrap();
    let etcd_leader = etcd.leader().unwrap();
    etcd.kill(etcd_leader);
    eprintln!(
        "killed replica {leader} and etcd member {etcd_leader} with {} nodes on 2",
        on_version(&fleet, "2")
    );
    let survivor = replica_addrs[1 - killed].clone();
    wait_for("every node on 2", Duration::from_secs(240), || {
        on_version(&fleet, "2") == total
    });
    let twice: Vec<_> = accepted_to(&fleet, "2")
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(twice.is_empty(), "asked twice: {twice:?}");
    assert_eq!(accepted_to(&fleet, "2").len(), total);
    for (g, nodes) in GROUPS {
        let (max, at) = fleet.max_in_flight(g);
        eprintln!(
            "group {g}: at most {max} in flight (at {at} ms), limit {}",
            limit(nodes)
        );
        assert!(max <= limit(nodes), "group {g}: {max} in flight at {at} ms");
    }
    // Strategy per group: `edge` is covered by a policy that says replace, the others by
    // none that names a strategy (in place).
    for e in fleet.events() {
        if let SimEventKind::Accepted { replace, .. } = e.kind {
            assert_eq!(replace, e.group == "edge", "{} in {}", e.node, e.group);
        }
    }
    let s = status(&certs, &survivor);
    assert_eq!(s["leader"].as_str().unwrap(), replicas[1 - killed].name);

    // 2. v3 reverts everywhere: the canaries fail and each group pauses.
    fleet.set_behaviour(Behaviour {
        fail_versions: ["3".to_owned()].into(),
        ..fleet.behaviour()
    });
    index.publish(release("3")).unwrap();
    store_release_index(&repo, &index, &options).unwrap();
    wait_for("every group paused", Duration::from_secs(120), || {
        let s = status(&certs, &survivor);
        s["rollouts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["target"] == "3" && r["state"]["state"] == "paused")
            .count()
            == GROUPS.len()
    });
    let s = status(&certs, &survivor);
    for r in s["rollouts"].as_array().unwrap() {
        let reason = r["state"]["reason"].as_str().unwrap();
        assert!(reason.contains("of its nodes failed on 3"), "{reason}");
    }
    // The canaries are the first wave, 1 % of each group: 4 + 3 + 3.
    let canaries: usize = GROUPS.iter().map(|(_, n)| n.div_ceil(100)).sum();
    let tried = accepted_to(&fleet, "3");
    assert_eq!(tried.len(), canaries, "only the canaries: {tried:?}");
    assert_eq!(
        on_version(&fleet, "2"),
        total,
        "every node back on or still on 2"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        accepted_to(&fleet, "3").len(),
        canaries,
        "paused: nothing more"
    );

    // 3. Yank v3, publish v4, resume: the rollouts move on to v4.
    index.yank("3", "reverts on every node").unwrap();
    index.publish(release("4")).unwrap();
    store_release_index(&repo, &index, &options).unwrap();
    std::thread::sleep(Duration::from_millis(1500)); // the replicas' release refresh
    fleet_cli(&certs, &survivor, &["resume"]);
    wait_for("every node on 4", Duration::from_secs(240), || {
        on_version(&fleet, "4") == total
    });
    assert!(accepted_to(&fleet, "4").values().all(|n| *n == 1));
    let refused = fleet
        .events()
        .iter()
        .filter(|e| matches!(e.kind, SimEventKind::Refused { .. }))
        .count();
    eprintln!("refused upgrade calls: {refused}");
    // The event log's turning points, for the record.
    let events: Vec<serde_json::Value> = Client::from_dir(&survivor, &certs, Role::Reader)
        .unwrap()
        .call("GET", "/v1/fleet/events?limit=100000", None::<&()>)
        .unwrap();
    let turning = [
        "rollout_started",
        "paused",
        "resumed",
        "aborted",
        "completed",
    ];
    for e in events
        .iter()
        .filter(|e| turning.contains(&e["kind"].as_str().unwrap_or("")))
    {
        eprintln!("event {e}");
    }
    let started: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["kind"] == "started").collect();
    eprintln!("{} upgrade starts recorded in the event log", started.len());
    // The CLI reads the log's end: the last 5, oldest first; one group's of the whole log.
    let last: Vec<serde_json::Value> = serde_json::from_str(&fleet_cli(
        &certs,
        &survivor,
        &["events", "--limit", "5", "--output", "json"],
    ))
    .unwrap();
    assert_eq!(last.len(), 5);
    assert!(last
        .windows(2)
        .all(|w| w[0]["at"].as_u64() <= w[1]["at"].as_u64()));
    // The rollout may still be writing (soaks): the log read after the CLI holds what it saw.
    let later: Vec<serde_json::Value> = Client::from_dir(&survivor, &certs, Role::Reader)
        .unwrap()
        .call("GET", "/v1/fleet/events?limit=100000", None::<&()>)
        .unwrap();
    assert!(later.len() >= events.len());
    let at = later
        .iter()
        .position(|e| *e == last[0])
        .expect("in the whole log");
    assert_eq!(
        later[at..at + 5],
        last[..],
        "the CLI's 5 are consecutive in the log"
    );
    let edge: Vec<serde_json::Value> = serde_json::from_str(&fleet_cli(
        &certs,
        &survivor,
        &[
            "events", "--limit", "100000", "--group", "edge", "--output", "json",
        ],
    ))
    .unwrap();
    assert!(!edge.is_empty() && edge.iter().all(|e| e["group"] == "edge"));
    let text = fleet_cli(&certs, &survivor, &["events", "--limit", "3"]);
    assert_eq!(text.lines().count(), 3, "{text}");
    fleet.shutdown();
    drop(replicas);
}

/// Issue 36: a node's certificate reports about that node and does nothing else on the
/// operator; an admin may not send a heartbeat in a node's name either.
fn nodes_speak_only_for_themselves(certs: &Path, replica: &str) {
    let identities = Identities::from_dir(certs).unwrap();
    let node = identities.heartbeat_client("web-00001", replica).unwrap();
    let report = |id: &str| NodeReport {
        sent_at_ms: 1,
        ..NodeReport::settled(id, "web", "127.0.0.1:1".into(), "1")
    };
    let denied =
        |what: &str, result: Result<serde_json::Value, slate_api::ClientError>, says: &str| {
            match result {
                Err(slate_api::ClientError::PermissionDenied(m)) => {
                    assert!(m.contains(says), "{what}: {m}")
                }
                other => panic!("{what}: {other:?}"),
            }
        };
    denied(
        "a node reporting about another node",
        node.call("POST", "/v1/fleet/heartbeat", Some(&report("web-00002"))),
        "a heartbeat must come from the node it reports about: this report is about web-00002, \
         its certificate is node web-00001's",
    );
    denied(
        "a node pausing the fleet",
        node.call("POST", "/v1/fleet/pause", Some(&serde_json::json!({}))),
        "requires role operator or higher; this client's certificate grants role node",
    );
    for (method, path) in [
        ("GET", "/v1/fleet/status"),
        ("POST", "/v1/fleet/resume"),
        ("POST", "/v1/fleet/abort"),
        ("POST", "/v1/fleet/policy"),
        ("POST", "/v1/fleet/nodes"),
    ] {
        denied(
            &format!("a node: {method} {path}"),
            node.call(method, path, Some(&serde_json::json!({}))),
            "this client's certificate grants role node",
        );
    }
    let admin = Client::from_dir(replica, certs, Role::Admin).unwrap();
    denied(
        "an admin sending a node's heartbeat",
        admin.call("POST", "/v1/fleet/heartbeat", Some(&report("web-00001"))),
        "a client of role admin",
    );
    // Its own report is taken.
    let written: serde_json::Value = node
        .call("POST", "/v1/fleet/heartbeat", Some(&report("web-00001")))
        .unwrap();
    assert_eq!(written["written"], true, "{written}");
}

fn write(dir: &tempfile::TempDir, text: &str) -> String {
    let path: PathBuf = dir.path().join("policy.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}
