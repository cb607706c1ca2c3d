//! Heartbeats: each node tells the operator about itself every interval, and at once when its
//! state changes. Delivery goes through the caller's [`Reporter`] on a few dedicated threads,
//! because a real reporter makes a blocking HTTPS call and must not stall the servers.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use slate_rollout::NodeReport;

use crate::behaviour::SplitMix64;

/// Where heartbeats go: the operator's `POST /v1/fleet/heartbeat` in the binary, a recorder
/// in tests. Called on a reporter thread (never on the async executor), so it may block; calls
/// for one node arrive in order, calls for different nodes concurrently. An `Err` is counted
/// and not retried: the node's next periodic heartbeat carries its then-current state.
pub trait Reporter: Send + Sync {
    fn report(&self, report: &NodeReport) -> Result<(), String>;
}

/// Counters of heartbeat delivery since the fleet started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportStats {
    /// Reports the reporter accepted.
    pub sent: u64,
    /// Reports the reporter refused (or panicked on).
    pub failed: u64,
    /// Of all reports handed to the reporter, those sent because the node's state changed.
    pub on_change: u64,
    /// Periodic heartbeats skipped because the node's previous one was still queued (the
    /// reporter is slower than the fleet's heartbeat rate).
    pub coalesced: u64,
}

/// What the queue asks of a node: its lane, whether a heartbeat of it waits already, and its
/// report as it is now (`None` while it reboots).
pub(crate) trait Heartbeating: Send + Sync {
    fn index(&self) -> usize;
    /// Sets whether a periodic heartbeat is queued; answers whether one was.
    fn heartbeat_queued(&self, queued: bool) -> bool;
    fn heartbeat(&self) -> Option<NodeReport>;
}

pub(crate) enum Job {
    /// A periodic heartbeat: the report is taken when it is sent, so it is never stale.
    Periodic(Arc<dyn Heartbeating>),
    /// A state change: the report as it was at the change, so none is lost to a later one.
    Change(NodeReport),
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    failed: AtomicU64,
    on_change: AtomicU64,
    coalesced: AtomicU64,
}

/// One FIFO lane per reporter thread; a node always uses the same lane, so its reports are
/// delivered in the order its state changed.
pub(crate) struct ReportQueue {
    lanes: RwLock<Vec<mpsc::Sender<Job>>>,
    counters: Counters,
}

impl std::fmt::Debug for ReportQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportQueue")
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl ReportQueue {
    pub(crate) fn start(
        threads: usize,
        reporter: Arc<dyn Reporter>,
    ) -> std::io::Result<(Arc<Self>, Vec<JoinHandle<()>>)> {
        let queue = Arc::new(ReportQueue {
            lanes: RwLock::new(Vec::new()),
            counters: Counters::default(),
        });
        let mut handles = Vec::new();
        let mut lanes = Vec::new();
        for i in 0..threads.max(1) {
            let (tx, rx) = mpsc::channel::<Job>();
            let reporter = reporter.clone();
            let q = queue.clone();
            let handle = std::thread::Builder::new()
                .name(format!("fleet-report-{i}"))
                .spawn(move || {
                    for job in rx {
                        q.deliver(&*reporter, job);
                    }
                })?;
            lanes.push(tx);
            handles.push(handle);
        }
        *queue.lanes.write().unwrap_or_else(PoisonError::into_inner) = lanes;
        Ok((queue, handles))
    }

    fn deliver(&self, reporter: &dyn Reporter, job: Job) {
        let report = match job {
            Job::Change(report) => {
                self.counters.on_change.fetch_add(1, Ordering::Relaxed);
                report
            }
            Job::Periodic(node) => {
                node.heartbeat_queued(false);
                match node.heartbeat() {
                    Some(report) => report,
                    None => return, // rebooting: a real node could not send either
                }
            }
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| reporter.report(&report)));
        let counter = match outcome {
            Ok(Ok(())) => &self.counters.sent,
            Ok(Err(_)) | Err(_) => &self.counters.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn push(&self, lane: usize, job: Job) {
        let lanes = self.lanes.read().unwrap_or_else(PoisonError::into_inner);
        if !lanes.is_empty() {
            let _ = lanes[lane % lanes.len()].send(job);
        }
    }

    /// Queues the report of a state change.
    pub(crate) fn change(&self, lane: usize, report: NodeReport) {
        self.push(lane, Job::Change(report));
    }

    /// Queues a periodic heartbeat unless the node's previous one is still waiting.
    pub(crate) fn periodic<N: Heartbeating + 'static>(&self, node: &Arc<N>) {
        if node.heartbeat_queued(true) {
            self.counters.coalesced.fetch_add(1, Ordering::Relaxed);
        } else {
            self.push(node.index(), Job::Periodic(node.clone()));
        }
    }

    /// Ends the reporter threads once they have drained their lanes.
    pub(crate) fn close(&self) {
        self.lanes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    pub(crate) fn stats(&self) -> ReportStats {
        let c = &self.counters;
        ReportStats {
            sent: c.sent.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            on_change: c.on_change.load(Ordering::Relaxed),
            coalesced: c.coalesced.load(Ordering::Relaxed),
        }
    }
}

/// A node's periodic heartbeats: first after `phase` (the fleet spreads phases evenly over the
/// interval, so 10,000 nodes do not report in one burst), then every `interval` ± 10 %.
pub(crate) async fn tick<N: Heartbeating + 'static>(
    node: Arc<N>,
    queue: Arc<ReportQueue>,
    interval: Duration,
    phase: Duration,
    mut rng: SplitMix64,
) {
    tokio::time::sleep(phase).await;
    loop {
        queue.periodic(&node);
        let spread = interval / 5;
        let next = interval - interval / 10 + rng.up_to(spread);
        tokio::time::sleep(next.max(Duration::from_millis(1))).await;
    }
}
