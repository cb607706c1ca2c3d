//! Measures the simulator itself: start time and memory of N nodes, and how many heartbeats
//! per second it delivers to a reporter that does nothing.
//!
//! `cargo run --release -p slate-fleet-sim --example scale -- [NODES] [SECONDS] [INTERVAL_MS]`
//! (memory is best read with one interval per process: freed memory is not given back)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_fleet_sim::{Fleet, FleetSpec, Reporter};
use slate_rollout::NodeReport;

#[derive(Default)]
struct Count(AtomicU64);

impl Reporter for Count {
    fn report(&self, _: &NodeReport) -> Result<(), String> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn run(nodes: usize, interval: Duration, seconds: u64, certs: &std::path::Path) {
    let counter = Arc::new(Count::default());
    let spec = FleetSpec {
        heartbeat_interval: interval,
        ..FleetSpec::new(certs).group("n", nodes, "stable", "1.0.0")
    };
    let before = rss_mib();
    let mut fleet = Fleet::start(spec, counter.clone()).expect("fleet");
    println!(
        "{nodes} nodes, heartbeat every {interval:?}: started in {:.2?}, RSS {:.0} MiB (was {before:.0})",
        fleet.start_time(),
        rss_mib()
    );
    std::thread::sleep(interval.min(Duration::from_secs(2)));
    let from = counter.0.load(Ordering::Relaxed);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(seconds));
    let sent = counter.0.load(Ordering::Relaxed) - from;
    let rate = sent as f64 / t.elapsed().as_secs_f64();
    let offered = nodes as f64 / interval.as_secs_f64();
    println!(
        "  heartbeats delivered: {rate:.0}/s (offered {offered:.0}/s), RSS {:.0} MiB, {:?}",
        rss_mib(),
        fleet.report_stats()
    );
    fleet.shutdown();
}

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let certs = tempfile::tempdir().expect("tempdir");
    slate_api::gen_certs(certs.path(), &[]).expect("certs");
    let intervals: Vec<u64> = match args.next().and_then(|a| a.parse().ok()) {
        Some(ms) => vec![ms],
        None => vec![5000, 100, 10],
    };
    for ms in intervals {
        run(nodes, Duration::from_millis(ms), seconds, certs.path());
    }
}
