//! Rollout operator benchmark (not a test): simulated nodes (slate-fleet-sim: real node API
//! servers over a simulated backend, in 10 groups; 10,000 unless told) heartbeating to one
//! operator replica in this process, on a three-member etcd cluster on loopback; one rollout of
//! v2 under a policy of 10 % at a time and two waves with a soak. Each run starts its own
//! cluster and fleet, so runs do not inherit each other's etcd history.
//!
//! It prints the rollout's wall time against the policy's theoretical minimum (waves' soaks +
//! nodes / concurrency × (upgrade + reboot time), the groups in parallel), the leader's
//! decision latency per tick (read from etcd + decide + fenced commit, p50/p99 over the ticks
//! of all runs) and the etcd writes (Raft proposals, heartbeats included) per node upgrade.

use std::cell::RefCell;
use std::io::Read as _;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, Identities, Reporter};
use slate_operator::{EtcdState, LeaderConfig, Operator, ReleaseSource, TickTiming};
use slate_release::{Channel, Release, ReleaseIndex};
use slate_rollout::NodeReport;
use slate_testkit::etcd::EtcdCluster;

use crate::bench::{ms, percentile, Bench, Comparison, Sample, Side};

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

/// Each node reports as itself (a client certificate naming it), as a real node does.
struct ToOperator {
    addr: String,
    identities: Identities,
}

impl Reporter for ToOperator {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        self.identities
            .heartbeat_client(&report.id, &self.addr)?
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

/// What one rollout gave.
struct Rollout {
    wall: Duration,
    /// Raft proposals from the policy's arrival to the last node on v2.
    writes: u64,
    ticks: Vec<TickTiming>,
    fleet_start: Duration,
    inventory_fill: Duration,
    max_in_flight: usize,
}

/// The shortest the rollout could take: two soaks, then each group's nodes in batches of
/// `concurrency`, every batch an upgrade and a reboot (groups roll out side by side).
fn theoretical_minimum(per_group: usize) -> (f64, usize) {
    let concurrency = (per_group / 10).max(1);
    let batches = per_group.div_ceil(concurrency);
    let minimum = 2.0 * SOAK.as_secs_f64() + batches as f64 * (UPGRADE + REBOOT).as_secs_f64();
    (minimum, concurrency)
}

/// One rollout from v1 to v2 of `per_group` × GROUPS nodes, from a cluster and fleet of its own.
fn rollout(per_group: usize) -> Result<Rollout> {
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
            // `slate fleet operator`'s default: nothing is old enough to prune during a run.
            event_retention: Duration::from_secs(7 * 24 * 3600),
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
        addr: listen.to_string(),
        identities: Identities::from_dir(&certs)?,
    };
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
    let total = per_group * GROUPS;
    let started = Instant::now();
    let mut fleet = Fleet::start(spec, Arc::new(reporter))?;
    let fleet_start = started.elapsed();

    // Whatever happens while the rollout is watched, the replica and the fleet are stopped
    // after it: a later run must not share the machine with this one's threads.
    let watched = (|| -> Result<(Duration, Duration, u64)> {
        let inventory_wait = Instant::now();
        while slate_operator::state::inventory(&state)?.len() < total {
            ensure!(
                inventory_wait.elapsed() < Duration::from_secs(600),
                "the inventory did not fill"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let inventory_fill = inventory_wait.elapsed();
        let policy = format!(
            "[[policy]]\nname = \"bench\"\nmax_unavailable = \"10%\"\n\
             waves = [{{ percent = 1, soak = \"{s}s\" }}, {{ percent = 10, soak = \"{s}s\" }}, \
             {{ percent = 100 }}]\nupgrade_timeout = \"10m\"\n",
            s = SOAK.as_secs()
        );
        let writes_before = proposals(&cluster.endpoint(0))?;
        timings.lock().unwrap().clear();
        slate_operator::state::set_policies(&state, &policy)?;
        let since = Instant::now();
        while fleet.versions().get("2").copied().unwrap_or(0) < total {
            ensure!(
                since.elapsed() < Duration::from_secs(3600),
                "the rollout did not finish within an hour: {:?}",
                fleet.versions()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let wall = since.elapsed();
        let writes = proposals(&cluster.endpoint(0))? - writes_before;
        Ok((inventory_fill, wall, writes))
    })();
    stop.store(true, Ordering::Relaxed);
    let ticks = std::mem::take(&mut *timings.lock().unwrap());
    fleet.shutdown();
    let _ = replica.join();
    let (inventory_fill, wall, writes) = watched?;

    let twice = fleet
        .upgrades_per_node()
        .values()
        .filter(|v| v.len() > 1)
        .count();
    ensure!(twice == 0, "{twice} nodes were upgraded twice");
    let (max_in_flight, _) = (0..GROUPS)
        .map(|g| fleet.max_in_flight(&format!("g{g}")))
        .max()
        .unwrap_or_default();
    let (_, concurrency) = theoretical_minimum(per_group);
    ensure!(
        max_in_flight <= concurrency,
        "the limit was exceeded: {max_in_flight} in flight in a group, limit {concurrency}"
    );
    Ok(Rollout {
        wall,
        writes,
        ticks,
        fleet_start,
        inventory_fill,
        max_in_flight,
    })
}

/// p50 and p99, in milliseconds, of one phase of every observed tick.
fn tick_percentiles(ticks: &[TickTiming], phase: impl Fn(&TickTiming) -> Duration) -> (f64, f64) {
    let mut d: Vec<Duration> = ticks.iter().map(phase).collect();
    d.sort();
    let at = |p| percentile(&d, p).map_or(f64::NAN, ms);
    (at(50), at(99))
}

pub fn bench_operator(nodes: usize, scrape_only: bool) -> Result<Vec<Comparison>> {
    ensure!(nodes >= GROUPS * 10, "at least {} nodes", GROUPS * 10);
    let scrape = crate::bench::operator_scrape::bench_scrape(nodes)?;
    if scrape_only {
        return Ok(vec![scrape]);
    }
    slate_fleet_sim::raise_file_limit().context("raising the open-file limit")?;
    let per_group = nodes / GROUPS;
    let total = per_group * GROUPS;
    let (minimum, concurrency) = theoretical_minimum(per_group);
    let ticks = RefCell::new(Vec::new());
    let slate = Side::new("rollout wall time", |_| {
        let r = rollout(per_group)?;
        ensure!(!r.ticks.is_empty(), "no tick was observed");
        ticks.borrow_mut().extend_from_slice(&r.ticks);
        Ok(Sample::new(r.wall.as_secs_f64())
            .with(
                "etcd_writes_per_upgrade",
                "",
                r.writes as f64 / total as f64,
            )
            .with("ticks", "", r.ticks.len() as f64)
            .with("fleet_start", "s", r.fleet_start.as_secs_f64())
            .with("inventory_fill", "s", r.inventory_fill.as_secs_f64())
            .with("max_in_flight_per_group", "", r.max_in_flight as f64))
    });
    let baseline = Side::computed("the policy's theoretical minimum", minimum);
    let mut c = Bench::new(&format!("operator rollout, {total} nodes"), "s")
        .about(format!(
            "{total} simulated nodes in {GROUPS} groups, one operator replica, 3-member etcd; \
             each run starts its own cluster and fleet"
        ))
        .about(format!(
            "minimum: 2 soaks of {} s + {} batches of {} s (at most {concurrency} in flight \
             per group)",
            SOAK.as_secs(),
            per_group.div_ceil(concurrency),
            (UPGRADE + REBOOT).as_secs()
        ))
        .no_warm_up(
            "the baseline is computed, not run, and each run starts its own etcd cluster and \
             fleet from nothing",
        )
        .run(slate, baseline, vec![])?;
    let ticks = ticks.into_inner();
    let (p50, p99) = tick_percentiles(&ticks, |t| t.read + t.decide + t.commit);
    let (decide50, decide99) = tick_percentiles(&ticks, |t| t.decide);
    c.extra(
        "tick_decision_ms",
        serde_json::json!({"p50": p50, "p99": p99, "ticks": ticks.len()}),
        format!(
            "leader decision per tick (read + decide + commit), {} ticks of all runs: \
             p50 {p50:.1} ms, p99 {p99:.1} ms",
            ticks.len()
        ),
    );
    c.extra(
        "tick_decide_ms",
        serde_json::json!({"p50": decide50, "p99": decide99}),
        format!("of it slate_rollout::tick: p50 {decide50:.2} ms, p99 {decide99:.2} ms"),
    );
    c.print();
    Ok(vec![scrape, c])
}
