//! The cost of a Prometheus scrape of the operator (not a test): `GET /metrics` over mutual
//! TLS with a reader certificate, against a fleet of N nodes stored in a three-member etcd
//! cluster on loopback (10 groups, each with a rollout half done), compared with the same
//! fleet's `GET /v1/fleet/status` (the JSON `slate fleet status` renders) on the same server.
//! Both read the inventory and the rollouts from etcd and render them; the status also plans
//! every node's wave. Only the operator API runs: no leader, so nothing moves meanwhile.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use slate_api::{Client, Role};
use slate_operator::etcd::Commit;
use slate_operator::{EtcdState, OperatorMetrics, OperatorService};
use slate_release::ReleaseIndex;
use slate_rollout::{NodeProgress, NodeRecord, NodeReport, Rollout, RolloutState, Step, Strategy};
use slate_testkit::etcd::EtcdCluster;

use crate::bench::operator_replica::{release, Fixed};
use crate::bench::{Bench, Comparison, Sample, Side};

const GROUPS: usize = 10;
/// Requests per sample: a sample is their median.
const REQUESTS: usize = 15;
/// The issue's target for the median scrape.
pub const TARGET_MS: f64 = 100.0;

const POLICY: &str = r#"
[[policy]]
name = "bench"
max_unavailable = "10%"
waves = [{ percent = 1, soak = "10s" }, { percent = 10, soak = "10s" }, { percent = 100 }]
failure_budget = 50
"#;

fn now() -> u64 {
    slate_operator::leader::now_unix()
}

/// The fleet: `per_group` nodes in each group, the first half done on v2, the next 5 %
/// upgrading, one failed; the rest idle on v1.
fn store_fleet(state: &EtcdState, per_group: usize) -> Result<()> {
    let mut puts = Vec::new();
    let flush = |puts: &mut Vec<(String, Vec<u8>)>| -> Result<()> {
        if puts.is_empty() {
            return Ok(());
        }
        let commit = Commit {
            puts: std::mem::take(puts),
            ..Commit::default()
        };
        state.commit(&commit).context("storing the fleet")?;
        Ok(())
    };
    for g in 0..GROUPS {
        let group = format!("g{g}");
        let mut rollout = Rollout {
            id: 1,
            group: group.clone(),
            target: "2".into(),
            image: format!("registry.invalid/slate/os:2@sha256:{}", "cd".repeat(32)),
            created: now(),
            state: RolloutState::Running,
            nodes: BTreeMap::new(),
            recent_starts: Vec::new(),
            acknowledged: Default::default(),
        };
        for i in 0..per_group {
            let id = format!("{group}-n{i:05}");
            let (version, step) = match i {
                i if i < per_group / 2 => ("2", Some(Step::Done { at: now() })),
                i if i < per_group / 2 + per_group / 20 => (
                    "1",
                    Some(Step::Upgrading {
                        issued: true,
                        prior_failure: None,
                    }),
                ),
                i if i == per_group - 1 => (
                    "1",
                    Some(Step::Failed {
                        at: now(),
                        reason: "reverted".into(),
                    }),
                ),
                _ => ("1", None),
            };
            if let Some(step) = step {
                rollout.nodes.insert(
                    id.clone(),
                    NodeProgress {
                        from: Some("1".into()),
                        started: Some(now()),
                        strategy: Strategy::InPlace,
                        step,
                    },
                );
            }
            let record = NodeRecord {
                report: NodeReport::settled(
                    &id,
                    &group,
                    format!("10.0.{g}.{}:50000", i % 250),
                    version,
                ),
                last_seen: now(),
            };
            puts.push((
                format!("{}{id}", slate_operator::state::NODES),
                serde_json::to_vec(&record)?,
            ));
            if puts.len() == 100 {
                flush(&mut puts)?;
            }
        }
        flush(&mut puts)?;
        let rollouts = BTreeMap::from([(group, rollout)]);
        slate_operator::state::commit_rollouts(state, None, &rollouts, &BTreeMap::new(), &[], 0)
            .context("storing a rollout")?;
    }
    Ok(())
}

/// The median of `REQUESTS` calls of `call`, in milliseconds.
fn median_ms(mut call: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut took = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let started = Instant::now();
        call()?;
        took.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    took.sort_by(f64::total_cmp);
    Ok(took[REQUESTS / 2])
}

pub fn bench_scrape(nodes: usize) -> Result<Comparison> {
    ensure!(nodes >= GROUPS * 20, "at least {} nodes", GROUPS * 20);
    let per_group = nodes / GROUPS;
    let total = per_group * GROUPS;
    let cluster = EtcdCluster::start(3)?;
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    slate_api::gen_certs(&certs, &[])?;
    let state = Arc::new(EtcdState::connect(
        &cluster.endpoints(),
        "/slate/operator/",
    )?);
    slate_operator::state::set_policies(&state, POLICY)?;
    let stored = Instant::now();
    store_fleet(&state, per_group)?;
    println!(
        "  stored {total} nodes and {GROUPS} rollouts in etcd in {:.1} s",
        stored.elapsed().as_secs_f64()
    );
    let mut index = ReleaseIndex::default();
    index.publish(release("1"))?;
    index.publish(release("2"))?;
    let listen = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    // The inventory from a watch, as `slate operator run` serves it.
    let nodes = Arc::new(slate_operator::state::NodeStore::start(state.clone())?);
    let synced = Instant::now();
    while nodes
        .mirror
        .snapshot()
        .is_none_or(|s| s.values.len() < total)
    {
        ensure!(
            synced.elapsed() < Duration::from_secs(120),
            "the inventory's watch did not sync"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let service = OperatorService {
        state: state.clone(),
        releases: Arc::new(Fixed(index)),
        repository: "registry.invalid/slate/os".into(),
        stale_after: Duration::from_secs(3600),
        log: Arc::new(|_| {}),
        heartbeats: Default::default(),
        metrics: Arc::new(OperatorMetrics::new()),
        node_certs: None,
        nodes: Some(nodes),
    };
    let config = slate_api::ServerConfig::from_dir(listen, &certs)?;
    let server = slate_api::spawn_service(config, Arc::new(service))?;
    let reader = Client::from_dir(&listen.to_string(), &certs, Role::Reader)?
        .with_timeout(Duration::from_secs(60));

    // What a scrape must show of this fleet, checked once before timing it.
    let text = reader.get_text("/metrics")?;
    let done = format!(
        "slate_operator_rollout_nodes{{group=\"g0\",step=\"done\"}} {}\n",
        per_group / 2
    );
    ensure!(text.contains(&done), "the scrape lacks {done:?}");
    let size = text.len();
    let scrape = Side::new("GET /metrics", |_| {
        Ok(Sample::new(median_ms(|| {
            reader.get_text("/metrics").map(drop).map_err(Into::into)
        })?)
        .with("bytes", "B", size as f64))
    });
    let status = Side::new("GET /v1/fleet/status (JSON)", |_| {
        Ok(Sample::new(median_ms(|| {
            reader
                .call::<serde_json::Value, ()>("GET", "/v1/fleet/status", None)
                .map(drop)
                .map_err(Into::into)
        })?))
    });
    let page = reader.get_text("/ui")?;
    ensure!(
        page.contains("g0") && page.contains("<svg"),
        "the dashboard lacks the group g0 or its timeline"
    );
    let ui = Side::new("GET /ui (dashboard HTML)", |_| {
        Ok(Sample::new(median_ms(|| {
            reader.get_text("/ui").map(drop).map_err(Into::into)
        })?)
        .with("bytes", "B", page.len() as f64))
    });
    let mut c = Bench::new(&format!("operator scrape, {total} nodes"), "ms")
        .about(format!(
            "{total} nodes in {GROUPS} groups stored in a 3-member etcd, a rollout half done \
             in each; the operator API alone on loopback (the inventory from its watch, as \
             `slate operator run` has it), mutual TLS, a reader certificate; /ui also shown"
        ))
        .about(format!(
            "each run: the median of {REQUESTS} requests, one connection each; the issue's \
             target for /metrics: {TARGET_MS} ms"
        ))
        .run(scrape, status, vec![ui])?;
    let median = c.slate.stats().median;
    c.extra(
        "scrape_target",
        serde_json::json!({"target_ms": TARGET_MS, "median_ms": median, "bytes": size}),
        format!(
            "/metrics median {median:.1} ms against the {TARGET_MS} ms target ({}); {size} \
             bytes of text",
            if median <= TARGET_MS { "met" } else { "MISSED" }
        ),
    );
    c.print();
    server.shutdown()?;
    Ok(c)
}
