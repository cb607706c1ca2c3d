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
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

use slate_fleet_sim::{Behaviour, Fleet, FleetSpec, Identities, Reporter};
use slate_operator::{EtcdState, TickTiming};
use slate_rollout::NodeReport;
use slate_testkit::etcd::EtcdCluster;

use crate::bench::operator_replica::Replica;
use crate::bench::operator_where::{breakdown, Breakdown};
use crate::bench::{ms, percentile, Bench, Comparison, Sample, Side};

const GROUPS: usize = 10;
const SOAK: Duration = Duration::from_secs(10);
const UPGRADE: Duration = Duration::from_secs(2);
const REBOOT: Duration = Duration::from_secs(1);

/// Each node reports as itself (a client certificate naming it), as a real node does, to the
/// first replica that answers.
struct ToOperator {
    addrs: Vec<String>,
    identities: Identities,
    /// Why reports were not taken, with how many each (the bench prints them).
    refused: Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
}

impl Reporter for ToOperator {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        let mut last = String::new();
        for addr in &self.addrs {
            match self
                .identities
                .heartbeat_client(&report.id, addr)?
                .call::<serde_json::Value, _>("POST", "/v1/fleet/heartbeat", Some(report))
            {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        // Addresses and ports differ from call to call; the kind of error is what counts.
        let kind: String = last
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .take(100)
            .collect();
        *self
            .refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(kind)
            .or_default() += 1;
        Err(last)
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
    /// The leader's peak resident memory (`VmHWM`), MiB; with a failover the larger of the two.
    peak_rss_mib: f64,
    failover: Option<Failover>,
    breakdown: Breakdown,
}

/// A leader killed mid-rollout and what the other replica did.
struct Failover {
    /// From the kill to the other replica's first tick as leader.
    resumed: Duration,
    /// From the kill to its first tick that ordered upgrades.
    first_order: Option<Duration>,
    /// Nodes on v2 when the leader was killed.
    done_at_kill: usize,
}

/// The shortest the rollout could take: two soaks, then each group's nodes in batches of
/// `concurrency`, every batch an upgrade and a reboot (groups roll out side by side).
fn theoretical_minimum(per_group: usize) -> (f64, usize) {
    let concurrency = (per_group / 10).max(1);
    let batches = per_group.div_ceil(concurrency);
    let minimum = 2.0 * SOAK.as_secs_f64() + batches as f64 * (UPGRADE + REBOOT).as_secs_f64();
    (minimum, concurrency)
}

/// One rollout from v1 to v2 of `per_group` × GROUPS nodes, from a cluster and fleet of its
/// own; with `failover`, a second replica stands by and the leader is killed (SIGKILL) once
/// half the nodes are on v2.
fn rollout(per_group: usize, failover: bool) -> Result<Rollout> {
    let cluster = EtcdCluster::start(3)?;
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    slate_api::gen_certs(&certs, &[])?;
    let state = EtcdState::connect(&cluster.endpoints(), "/slate/operator/")?;
    let mut first = Replica::start(&cluster.endpoints(), &certs, "a")?;
    first.wait_leading(Duration::from_secs(60))?;
    let mut second = if failover {
        Some(Replica::start(&cluster.endpoints(), &certs, "b")?)
    } else {
        None
    };
    let mut addrs = vec![first.addr.to_string()];
    addrs.extend(second.iter().map(|r| r.addr.to_string()));
    let refused = Arc::default();
    let reporter = ToOperator {
        addrs,
        identities: Identities::from_dir(&certs)?,
        refused: Arc::clone(&refused),
    };
    let mut spec = FleetSpec::new(&certs);
    for g in 0..GROUPS {
        spec = spec.group(&format!("g{g}"), per_group, "stable", "1");
    }
    spec.heartbeat_interval = Duration::from_secs(30);
    // A real fleet reports from 10,000 machines at once; 8 lanes made a batch's 2,000 state
    // changes (accepted, back up) wait over a second each behind the calls ahead of them,
    // most of each call the operator's wait for its heartbeat batch's etcd commit. 24 stay
    // below the operator API's 32 connections in their handshake at once (more are refused).
    spec.reporter_threads = 24;
    spec.behaviour = Behaviour {
        upgrade_time: UPGRADE,
        reboot_time: REBOOT,
        ..Behaviour::default()
    };
    let total = per_group * GROUPS;
    let started = Instant::now();
    let mut fleet = Fleet::start(spec, Arc::new(reporter))?;
    let fleet_start = started.elapsed();

    let mut peak_rss_mib: f64 = 0.0;
    let mut killed: Option<(Instant, usize)> = None;
    // Whatever happens while the rollout is watched, the replicas and the fleet are stopped
    // after it: a later run must not share the machine with this one's threads.
    let mut policy_ms = 0;
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
        first.heard.lock().unwrap().ticks.clear();
        policy_ms = fleet.now_ms();
        slate_operator::state::set_policies(&state, &policy)?;
        let since = Instant::now();
        loop {
            let done = fleet.versions().get("2").copied().unwrap_or(0);
            if done >= total {
                break;
            }
            ensure!(
                since.elapsed() < Duration::from_secs(3600),
                "the rollout did not finish within an hour: {:?}",
                fleet.versions()
            );
            if killed.is_none() {
                peak_rss_mib = peak_rss_mib.max(first.memory_mib()?.1);
                if second.is_some() && done >= total / 2 {
                    first.kill();
                    killed = Some((Instant::now(), done));
                }
            } else if let Some(second) = &second {
                peak_rss_mib = peak_rss_mib.max(second.memory_mib()?.1);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let wall = since.elapsed();
        let writes = proposals(&cluster.endpoint(0))? - writes_before;
        Ok((inventory_fill, wall, writes))
    })();
    // The reports as the rollout ended: once the replicas are killed below, every report
    // fails, and those are not the rollout's.
    let reports_failed = fleet.report_stats().failed;
    let report_delays = fleet.change_report_delays();
    let refused = std::mem::take(&mut *refused.lock().unwrap_or_else(|e| e.into_inner()));
    let mut ticks: Vec<TickTiming> = std::mem::take(&mut first.heard.lock().unwrap().ticks)
        .into_iter()
        .map(|(_, t)| t)
        .collect();
    let mut failover = None;
    if let (Some(second), Some((at, done_at_kill))) = (&second, killed) {
        let heard = std::mem::take(&mut *second.heard.lock().unwrap());
        let after = |t: &Instant| t.checked_duration_since(at);
        failover =
            Some(Failover {
                resumed: heard.ticks.first().and_then(|(t, _)| after(t)).context(
                    "the second replica never ticked as leader after the first was killed",
                )?,
                first_order: heard
                    .ticks
                    .iter()
                    .find(|(_, t)| t.orders > 0)
                    .and_then(|(t, _)| after(t)),
                done_at_kill,
            });
        ticks.extend(heard.ticks.into_iter().map(|(_, t)| t));
    }
    let serving = match (&second, killed) {
        (Some(second), Some(_)) => second,
        _ => &first,
    };
    let (full, resumed) = serving.handshakes(&certs)?;
    println!(
        "  replica {}'s TLS handshakes: {full} full, {resumed} resumed ({:.1} % resumed)",
        serving.name,
        100.0 * resumed as f64 / (full + resumed).max(1) as f64
    );
    first.kill();
    if let Some(second) = &mut second {
        second.kill();
    }
    let bounds = slate_rollout::wave_bounds(&[1, 10, 100], per_group);
    let (_, concurrency) = theoretical_minimum(per_group);
    let breakdown = breakdown(
        &fleet.events(),
        policy_ms,
        (bounds[0], bounds[1] - bounds[0]),
        concurrency,
        (&report_delays, reports_failed),
    );
    for (why, count) in &refused {
        println!("  reports not taken ({count}): {why}");
    }
    fleet.shutdown();
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
        peak_rss_mib,
        failover,
        breakdown,
    })
}

/// p50 and p99, in milliseconds, of one phase of every observed tick.
fn tick_percentiles(ticks: &[TickTiming], phase: impl Fn(&TickTiming) -> Duration) -> (f64, f64) {
    let mut d: Vec<Duration> = ticks.iter().map(phase).collect();
    d.sort();
    let at = |p| percentile(&d, p).map_or(f64::NAN, ms);
    (at(50), at(99))
}

/// `runs` measured rollouts (each minutes long at 10,000 nodes), then with `failover` one more
/// in which the leader is killed halfway.
pub fn bench_operator(
    nodes: usize,
    scrape_only: bool,
    runs: usize,
    failover: bool,
) -> Result<Vec<Comparison>> {
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
    let wheres = RefCell::new(Vec::new());
    let slate = Side::new("rollout wall time", |_| {
        let r = rollout(per_group, false)?;
        ensure!(!r.ticks.is_empty(), "no tick was observed");
        ticks.borrow_mut().extend_from_slice(&r.ticks);
        wheres.borrow_mut().push(r.breakdown);
        Ok(Sample::new(r.wall.as_secs_f64())
            .with(
                "etcd_writes_per_upgrade",
                "",
                r.writes as f64 / total as f64,
            )
            .with("ticks", "", r.ticks.len() as f64)
            .with("fleet_start", "s", r.fleet_start.as_secs_f64())
            .with("inventory_fill", "s", r.inventory_fill.as_secs_f64())
            .with("max_in_flight_per_group", "", r.max_in_flight as f64)
            .with("operator_peak_rss", "MiB", r.peak_rss_mib))
    });
    let baseline = Side::computed("the policy's theoretical minimum", minimum);
    let mut c = Bench::new(&format!("operator rollout, {total} nodes"), "s")
        .runs(runs)
        .about(format!(
            "{total} simulated nodes in {GROUPS} groups, one operator replica (a process of its \
             own), 3-member etcd; each run starts its own cluster and fleet; the inventory's \
             fill before the policy is set is not counted (printed as inventory_fill)"
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
    let (read50, read99) = tick_percentiles(&ticks, |t| t.read);
    let (commit50, commit99) = tick_percentiles(&ticks, |t| t.commit);
    let (encode50, encode99) = tick_percentiles(&ticks, |t| t.encode);
    let (answer50, answer99) = tick_percentiles(&ticks, |t| t.commit.saturating_sub(t.encode));
    // The leader's thread during the decision: on a CPU, waiting for one, and the decision
    // without that wait (what it would take with a CPU of its own; the rest is etcd's answers).
    let (cpu50, cpu99) = tick_percentiles(&ticks, |t| t.on_cpu);
    let (queued50, queued99) = tick_percentiles(&ticks, |t| t.queued);
    let (own50, own99) = tick_percentiles(&ticks, |t| {
        (t.read + t.decide + t.commit).saturating_sub(t.queued)
    });
    // `slate_rollout::tick` by part (each summed over a tick's groups), to see where it goes.
    let parts: Vec<(&str, (f64, f64))> = ["grouping", "wave order", "policy views", "decisions"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| (name, tick_percentiles(&ticks, |t| t.parts[i])))
        .collect();
    c.extra(
        "tick_parts_ms",
        serde_json::json!(parts
            .iter()
            .map(|(name, (p50, p99))| (
                name.to_string(),
                serde_json::json!({"p50": p50, "p99": p99})
            ))
            .collect::<serde_json::Map<_, _>>()),
        format!(
            "slate_rollout::tick by part (p50 / p99 ms): {}",
            parts
                .iter()
                .map(|(name, (p50, p99))| format!("{name} {p50:.2} / {p99:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    // Not part of the decision: the orders' share of the loop, recording the answers that came
    // back and handing the new orders to the outbox (whose workers make the calls, each a new
    // mutual-TLS connection, apart). Where a rollout's time goes beside the policy.
    let ordering: Vec<TickTiming> = ticks
        .iter()
        .filter(|t| t.orders > 0 || t.answers > 0)
        .copied()
        .collect();
    let (send50, send99) = tick_percentiles(&ordering, |t| t.send);
    let sent: usize = ordering.iter().map(|t| t.orders).sum();
    let send_total: f64 = ordering.iter().map(|t| t.send.as_secs_f64()).sum();
    c.extra(
        "tick_decision_ms",
        serde_json::json!({"p50": p50, "p99": p99, "ticks": ticks.len()}),
        format!(
            "leader decision per tick (read + decide + commit), {} ticks of all runs: \
             p50 {p50:.1} ms, p99 {p99:.1} ms (target p99 <= 20 ms)",
            ticks.len()
        ),
    );
    c.extra(
        "tick_cpu_ms",
        serde_json::json!({
            "on_cpu": {"p50": cpu50, "p99": cpu99},
            "queued": {"p50": queued50, "p99": queued99},
            "without_queued": {"p50": own50, "p99": own99},
        }),
        format!(
            "the leader's thread in the decision: on a CPU p50 {cpu50:.2} / p99 {cpu99:.2} ms, \
             runnable and waiting for a CPU p50 {queued50:.2} / p99 {queued99:.2} ms; the \
             decision without that wait p50 {own50:.1} / p99 {own99:.1} ms"
        ),
    );
    c.extra(
        "tick_phases_ms",
        serde_json::json!({
            "read": {"p50": read50, "p99": read99},
            "decide": {"p50": decide50, "p99": decide99},
            "commit": {"p50": commit50, "p99": commit99},
            "encode": {"p50": encode50, "p99": encode99},
            "etcd_answer": {"p50": answer50, "p99": answer99},
            "send": {"p50": send50, "p99": send99, "ticks": ordering.len(), "orders": sent,
                     "total_s": send_total},
        }),
        format!(
            "of it: read p50 {read50:.2} / p99 {read99:.2} ms, slate_rollout::tick p50 \
             {decide50:.2} / p99 {decide99:.2} ms, commit p50 {commit50:.2} / p99 \
             {commit99:.2} ms (of it encoding the rollouts p50 {encode50:.2} / p99 \
             {encode99:.2} ms, etcd's answer p50 {answer50:.2} / p99 {answer99:.2} ms); then the orders' share of the loop, answers recorded and \
             orders handed over ({sent} orders, {} ticks, {send_total:.1} s in all): p50 \
             {send50:.0} / p99 {send99:.0} ms a tick",
            ordering.len()
        ),
    );
    for (i, b) in wheres.into_inner().iter().enumerate() {
        c.extra(&format!("wall_breakdown_run{}", i + 1), b.json(), b.text());
    }
    c.print();
    let mut out = vec![scrape, c];
    if failover {
        out.push(failover_run(per_group, concurrency)?);
    }
    Ok(out)
}

/// One rollout with a standby replica, the leader killed halfway: how soon the other resumes,
/// and the bench's own counts of nodes upgraded twice and of the concurrency reached.
fn failover_run(per_group: usize, concurrency: usize) -> Result<Comparison> {
    let (minimum, _) = theoretical_minimum(per_group);
    let total = per_group * GROUPS;
    let mut resumed = None;
    let slate = Side::new("rollout wall time, leader killed halfway", |_| {
        let r = rollout(per_group, true)?;
        let f = r.failover.context("no failover happened")?;
        let sample = Sample::new(r.wall.as_secs_f64())
            .with("resumed_after_kill", "s", f.resumed.as_secs_f64())
            .with(
                "first_order_after_kill",
                "s",
                f.first_order.map_or(f64::NAN, |d| d.as_secs_f64()),
            )
            .with("nodes_on_v2_at_kill", "", f.done_at_kill as f64)
            .with("max_in_flight_per_group", "", r.max_in_flight as f64)
            .with("operator_peak_rss", "MiB", r.peak_rss_mib);
        resumed = Some((f.resumed, r.max_in_flight));
        Ok(sample)
    });
    let baseline = Side::computed("the policy's theoretical minimum", minimum);
    let mut c = Bench::new(&format!("operator failover, {total} nodes"), "s")
        .runs(1)
        .about(
            "two replicas (processes); the leader is killed (SIGKILL) once half the nodes are \
             on v2; its lease (5 s) must run out before the other leads",
        )
        .no_warm_up("one run: the figure is the failover's, the wall time only for context")
        .run(slate, baseline, vec![])?;
    if let Some((after, max_in_flight)) = resumed {
        c.extra(
            "failover",
            serde_json::json!({
                "resumed_s": after.as_secs_f64(),
                "upgraded_twice": 0,
                "max_in_flight": max_in_flight,
                "limit": concurrency,
            }),
            format!(
                "the standby led and ticked {:.1} s after the kill (target <= 10 s); nodes \
                 upgraded twice: 0 (counted over {total}); most in flight in a group: \
                 {max_in_flight}, limit {concurrency}",
                after.as_secs_f64()
            ),
        );
    }
    c.print();
    Ok(c)
}
