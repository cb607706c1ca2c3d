//! Rollout operator benchmark (not a test): 10,000 simulated nodes (slate-fleet-sim: real
//! node API servers over a simulated backend, 10 groups of 1,000) heartbeating to one operator
//! replica in this process, on a three-member etcd cluster on loopback; one rollout of v2
//! under a policy of 10 % at a time and two waves with a soak.
//!
//! It prints the leader's decision latency per tick (read from etcd + decide + fenced commit,
//! p50/p99), the etcd writes (Raft proposals, heartbeats included) per node upgrade, and the
//! rollout's wall time as a ratio to the policy's theoretical minimum:
//! waves' soaks + nodes / concurrency × (upgrade + reboot time), the groups in parallel.

use std::io::Read as _;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use slate_api::{Client, Role};
use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, Reporter};
use slate_operator::{EtcdState, LeaderConfig, Operator, ReleaseSource, TickTiming};
use slate_release::{Channel, Release, ReleaseIndex};
use slate_rollout::NodeReport;
use slate_testkit::etcd::EtcdCluster;

const GROUPS: usize = 10;
const SOAK: Duration = Duration::from_secs(10);
const UPGRADE: Duration = Duration::from_secs(2);
const REBOOT: Duration = Duration::from_secs(1);

struct Fixed(ReleaseIndex);

impl ReleaseSource for Fixed {
    fn index(&self) -> Result<ReleaseIndex, String> {
        Ok(self.0.clone())
    }
}

struct ToOperator {
    clients: Vec<Client>,
    next: AtomicUsize,
}

impl Reporter for ToOperator {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        self.clients[i]
            .call::<serde_json::Value, _>("POST", "/v1/fleet/heartbeat", Some(report))
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

fn release(version: &str) -> Release {
    Release {
        version: version.into(),
        digest: format!("sha256:{}", "cd".repeat(32)),
        created: "2026-12-01T00:00:00Z".into(),
        channel: Channel::Stable,
        official: true,
        min_from: None,
        yanked: None,
    }
}

/// Raft proposals committed, from a member's /metrics.
fn proposals(endpoint: &str) -> Result<u64> {
    let addr: SocketAddr = endpoint
        .trim_start_matches("http://")
        .parse()
        .context("etcd endpoint")?;
    let mut tcp = std::net::TcpStream::connect(addr)?;
    std::io::Write::write_all(
        &mut tcp,
        format!("GET /metrics HTTP/1.0\r\nhost: {addr}\r\n\r\n").as_bytes(),
    )?;
    let mut text = String::new();
    tcp.read_to_string(&mut text)?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("etcd_server_proposals_committed_total ")
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map(|v| v as u64)
        .context("no etcd_server_proposals_committed_total in /metrics")
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

pub fn bench_operator(nodes: usize) -> Result<()> {
    ensure!(nodes >= GROUPS * 10, "at least {} nodes", GROUPS * 10);
    slate_fleet_sim::raise_file_limit().context("raising the open-file limit")?;
    let cluster = EtcdCluster::start(3)?;
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    slate_api::gen_certs(&certs, &[])?;
    let listen = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let timings: Arc<Mutex<Vec<TickTiming>>> = Arc::default();
    let mut index = ReleaseIndex::default();
    index.publish(release("1"))?;
    index.publish(release("2"))?;
    let state = Arc::new(EtcdState::connect(
        &cluster.endpoints(),
        "/slate/operator/",
    )?);
    let seen = timings.clone();
    let op = Operator {
        state: state.clone(),
        leader: LeaderConfig {
            name: "bench".into(),
            repository: "registry.invalid/slate/os".into(),
            tick: Duration::from_secs(1),
            stale_after: Duration::from_secs(90),
            lease_ttl: Duration::from_secs(5),
            release_refresh: Duration::from_secs(10),
            parallel_orders: 32,
        },
        listen,
        certs: certs.clone(),
        releases: Arc::new(Fixed(index)),
        log: Arc::new(|_| {}),
        observer: Some(Arc::new(move |t: &TickTiming| {
            seen.lock().unwrap().push(*t);
        })),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let replica = std::thread::spawn(move || slate_operator::run(op, &stopping));

    let reporter = ToOperator {
        clients: (0..8)
            .map(|_| {
                Client::from_dir(&listen.to_string(), &certs, Role::Operator)
                    .map(|c| c.with_timeout(Duration::from_secs(20)))
            })
            .collect::<Result<_, _>>()?,
        next: AtomicUsize::new(0),
    };
    let per_group = nodes / GROUPS;
    let mut spec = FleetSpec::new(&certs);
    for g in 0..GROUPS {
        spec = spec.group(&format!("g{g}"), per_group, "stable", "1");
    }
    spec.heartbeat_interval = Duration::from_secs(30);
    spec.reporter_threads = 8;
    spec.behaviour = Behaviour {
        upgrade_time: UPGRADE,
        reboot_time: REBOOT,
        ..Behaviour::default()
    };
    let started = Instant::now();
    let mut fleet = Fleet::start(spec, Arc::new(reporter))?;
    let total = per_group * GROUPS;
    println!(
        "{total} simulated nodes started in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let inventory_wait = Instant::now();
    while slate_operator::state::inventory(&state)?.len() < total {
        ensure!(
            inventory_wait.elapsed() < Duration::from_secs(600),
            "the inventory did not fill"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "inventory full after {:.1} s",
        inventory_wait.elapsed().as_secs_f64()
    );

    let policy = format!(
        "[[policy]]\nname = \"bench\"\nmax_unavailable = \"10%\"\n\
         waves = [{{ percent = 1, soak = \"{s}s\" }}, {{ percent = 10, soak = \"{s}s\" }}, \
         {{ percent = 100 }}]\nupgrade_timeout = \"10m\"\n",
        s = SOAK.as_secs()
    );
    let writes_before = proposals(&cluster.endpoint(0))?;
    timings.lock().unwrap().clear();
    slate_operator::state::set_policies(&state, &policy)?;
    let rollout = Instant::now();
    while fleet.versions().get("2").copied().unwrap_or(0) < total {
        ensure!(
            rollout.elapsed() < Duration::from_secs(3600),
            "the rollout did not finish within an hour: {:?}",
            fleet.versions()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let wall = rollout.elapsed();
    let writes = proposals(&cluster.endpoint(0))? - writes_before;
    stop.store(true, Ordering::Relaxed);
    let ticks = std::mem::take(&mut *timings.lock().unwrap());
    fleet.shutdown();
    let _ = replica.join();

    let mut decision: Vec<Duration> = ticks.iter().map(|t| t.read + t.decide + t.commit).collect();
    decision.sort();
    let mut decide: Vec<Duration> = ticks.iter().map(|t| t.decide).collect();
    decide.sort();
    ensure!(!decision.is_empty(), "no tick was observed");
    let concurrency = (per_group / 10).max(1);
    let minimum = 2.0 * SOAK.as_secs_f64()
        + (per_group as f64 / concurrency as f64).ceil() * (UPGRADE + REBOOT).as_secs_f64();
    let twice = fleet
        .upgrades_per_node()
        .values()
        .filter(|v| v.len() > 1)
        .count();
    let (max_in_flight, _) = (0..GROUPS)
        .map(|g| fleet.max_in_flight(&format!("g{g}")))
        .max()
        .unwrap_or_default();
    println!(
        "bench-operator: {total} nodes in {GROUPS} groups, one operator replica, 3-member etcd"
    );
    println!(
        "  leader decision per tick (read + decide + commit) over {} ticks: p50 {:.1} ms, p99 {:.1} ms; of it slate_rollout::tick p50 {:.2} ms, p99 {:.2} ms",
        decision.len(),
        percentile(&decision, 50).as_secs_f64() * 1e3,
        percentile(&decision, 99).as_secs_f64() * 1e3,
        percentile(&decide, 50).as_secs_f64() * 1e3,
        percentile(&decide, 99).as_secs_f64() * 1e3,
    );
    println!(
        "  etcd writes (Raft proposals, heartbeats included) per node upgrade: {:.2} ({writes} for {total})",
        writes as f64 / total as f64
    );
    println!(
        "  rollout wall time {:.1} s vs the policy's minimum {minimum:.1} s (2 soaks of {} s + {} batches of {} s): ratio {:.2}",
        wall.as_secs_f64(),
        SOAK.as_secs(),
        (per_group as f64 / concurrency as f64).ceil(),
        (UPGRADE + REBOOT).as_secs(),
        wall.as_secs_f64() / minimum
    );
    println!("  no node upgraded twice: {}; most in flight in a group: {max_in_flight} (limit {concurrency})", twice == 0);
    ensure!(twice == 0, "{twice} nodes were upgraded twice");
    ensure!(max_in_flight <= concurrency, "the limit was exceeded");
    Ok(())
}
