//! Heartbeats: each node tells the operator about itself every interval, and at once when its
//! state changes. Delivery goes through the caller's [`Reporter`] on a few dedicated threads,
//! because a real reporter makes a blocking HTTPS call and must not stall the servers.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// A state change: the report as it was at the change, so none is lost to a later one,
    /// and when it was queued.
    Change(Box<NodeReport>, Instant),
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    failed: AtomicU64,
    on_change: AtomicU64,
    coalesced: AtomicU64,
    /// From each state change's queuing to the reporter's return: what a node's news waits
    /// for before the operator has it (the lanes are shared with the periodic heartbeats).
    change_delays: Mutex<Vec<Duration>>,
}

/// One lane per reporter thread; a node always uses the same lane, so its reports are
/// delivered in the order its state changed. A lane sends its state changes before its
/// periodic heartbeats: a real node sends its news on its own connection at once, so in the
/// simulation a node's news must not wait behind other nodes' periodic heartbeats either (a
/// FIFO shared by 1,250 nodes held a commit's report for about 4 s at 10,000 nodes, which was
/// the simulator's delay, not the operator's). A periodic heartbeat takes the node's state
/// when it is sent, so it is never older than a change queued before it.
pub(crate) struct ReportQueue {
    lanes: Vec<Arc<Lane>>,
    counters: Counters,
}

#[derive(Default)]
struct Lane {
    jobs: Mutex<LaneJobs>,
    ready: Condvar,
}

#[derive(Default)]
struct LaneJobs {
    changes: VecDeque<Job>,
    periodic: VecDeque<Job>,
    closed: bool,
}

impl Lane {
    /// The next job, changes first; `None` once closed and drained.
    fn next(&self) -> Option<Job> {
        let mut jobs = self.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(job) = jobs
                .changes
                .pop_front()
                .or_else(|| jobs.periodic.pop_front())
            {
                return Some(job);
            }
            if jobs.closed {
                return None;
            }
            jobs = self
                .ready
                .wait(jobs)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
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
        let lanes: Vec<Arc<Lane>> = (0..threads.max(1)).map(|_| Arc::default()).collect();
        let queue = Arc::new(ReportQueue {
            lanes: lanes.clone(),
            counters: Counters::default(),
        });
        let mut handles = Vec::new();
        for (i, lane) in lanes.into_iter().enumerate() {
            let reporter = reporter.clone();
            let q = queue.clone();
            let handle = std::thread::Builder::new()
                .name(format!("fleet-report-{i}"))
                .spawn(move || {
                    while let Some(job) = lane.next() {
                        q.deliver(&*reporter, job);
                    }
                })?;
            handles.push(handle);
        }
        Ok((queue, handles))
    }

    fn deliver(&self, reporter: &dyn Reporter, job: Job) {
        let (report, queued) = match job {
            Job::Change(report, queued) => {
                self.counters.on_change.fetch_add(1, Ordering::Relaxed);
                (*report, Some(queued))
            }
            Job::Periodic(node) => {
                node.heartbeat_queued(false);
                match node.heartbeat() {
                    Some(report) => (report, None),
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
        if let Some(queued) = queued {
            self.counters
                .change_delays
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(queued.elapsed());
        }
    }

    fn push(&self, lane: usize, job: Job) {
        let lane = &self.lanes[lane % self.lanes.len()];
        let mut jobs = lane.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        if jobs.closed {
            return;
        }
        match job {
            Job::Change(..) => jobs.changes.push_back(job),
            Job::Periodic(_) => jobs.periodic.push_back(job),
        }
        drop(jobs);
        lane.ready.notify_one();
    }

    /// Queues the report of a state change.
    pub(crate) fn change(&self, lane: usize, report: NodeReport) {
        self.push(lane, Job::Change(Box::new(report), Instant::now()));
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
        for lane in &self.lanes {
            lane.jobs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .closed = true;
            lane.ready.notify_all();
        }
    }

    /// Each state change's wait, from its queuing to its delivery's end, so far.
    pub(crate) fn change_delays(&self) -> Vec<Duration> {
        self.counters
            .change_delays
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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

#[cfg(test)]
#[path = "heartbeat_tests.rs"]
mod tests;
