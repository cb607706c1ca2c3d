//! An idle leader asks etcd nothing per tick: the inventory comes from the replica's watch of
//! `nodes/`, and whether the policies or a rollout moved from the leadership's watches of them
//! (`state/watched.rs`). Counted on a real three-member etcd cluster on loopback by the
//! members' own `etcd_mvcc_range_total`. Run with `CI=true` to make a missing etcd a failure.

mod common;

use common::{put_node, until};

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use slate_operator::etcd::{EtcdState, DEFAULT_PREFIX};
use slate_operator::leader::{self, LeaderConfig, Log, ReleaseSource, TickObserver};
use slate_operator::state;
use slate_operator::{DriveError, NodeDriver, OperatorMetrics};
use slate_release::ReleaseIndex;
use slate_rollout::Order;
use slate_testkit::etcd::{one_at_a_time, three_members};

/// Only the release the nodes run: nothing to roll out, every tick decides nothing.
struct NothingNewer;

impl ReleaseSource for NothingNewer {
    fn index(&self) -> Result<ReleaseIndex, String> {
        Ok(ReleaseIndex {
            releases: vec![common::release("1")],
            ..ReleaseIndex::default()
        })
    }
}

struct NoCalls;

impl NodeDriver for NoCalls {
    fn upgrade(&self, order: &Order) -> Result<(), DriveError> {
        panic!("nothing is newer, yet {} was ordered", order.node);
    }
}

/// The ranges every member has served, from their `/metrics`.
fn ranges_served(endpoints: &[String]) -> u64 {
    endpoints
        .iter()
        .map(|endpoint| {
            let addr = endpoint.trim_start_matches("http://");
            let mut stream = TcpStream::connect(addr).expect("reaching an etcd member");
            write!(
                stream,
                "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut text = String::new();
            stream.read_to_string(&mut text).unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with("etcd_mvcc_range_total "))
                .unwrap_or_else(|| panic!("{endpoint} has no etcd_mvcc_range_total"));
            let value: f64 = line["etcd_mvcc_range_total ".len()..]
                .trim()
                .parse()
                .unwrap();
            value as u64
        })
        .sum()
}

#[test]
fn an_idle_leader_reads_nothing_from_etcd_per_tick() {
    let _serial = one_at_a_time();
    let Some(cluster) = three_members() else {
        return;
    };
    let endpoints = cluster.endpoints();
    let state = EtcdState::connect(&endpoints, DEFAULT_PREFIX).unwrap();
    state::set_policies(
        &state,
        "[[policy]]\nname = \"all\"\nmax_unavailable = \"1\"\n",
    )
    .unwrap();
    for id in ["web-1", "web-2"] {
        put_node(&state, id, "web");
    }
    let nodes = state::mirror_nodes(&state).unwrap();
    let config = LeaderConfig {
        name: "a".into(),
        repository: "registry.invalid/os".into(),
        tick: Duration::from_millis(50),
        stale_after: Duration::from_secs(600),
        lease_ttl: Duration::from_secs(5),
        release_refresh: Duration::from_secs(600),
        parallel_orders: 1,
        event_retention: Duration::from_secs(3600),
    };
    let ticks = Arc::new(AtomicUsize::new(0));
    let counted = ticks.clone();
    let observer: TickObserver = Arc::new(move |_| {
        counted.fetch_add(1, Ordering::Relaxed);
    });
    let log: Log = Arc::new(|_: &str| {});
    let stop = AtomicBool::new(false);
    let metrics = OperatorMetrics::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            leader::run(
                &state,
                &config,
                &NoCalls,
                &NothingNewer,
                Some(&nodes),
                &stop,
                &log,
                Some(&observer),
                &metrics,
            )
        });
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let _stop = StopOnDrop(&stop);
        // The first ticks may read while the watches list.
        until("the leader never ticked", Duration::from_secs(20), || {
            ticks.load(Ordering::Relaxed) >= 5
        });
        let (ranges_before, ticks_before) =
            (ranges_served(&endpoints), ticks.load(Ordering::Relaxed));
        until(
            "the leader stopped ticking",
            Duration::from_secs(20),
            || ticks.load(Ordering::Relaxed) >= ticks_before + 20,
        );
        let ticked = ticks.load(Ordering::Relaxed) - ticks_before;
        let ranges = ranges_served(&endpoints) - ranges_before;
        // One range a tick before the watches (the revisions of `policies` and `rollouts/`),
        // and a listing of `nodes/` a tick before the inventory's.
        assert!(
            ranges <= 2,
            "{ranges} ranges served during {ticked} idle ticks of the leader"
        );
    });
}
