use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Mutex};

use super::*;

/// A node whose periodic report names it.
struct Quiet {
    id: String,
    queued: AtomicBool,
}

impl Heartbeating for Quiet {
    fn index(&self) -> usize {
        0
    }

    fn heartbeat_queued(&self, queued: bool) -> bool {
        self.queued.swap(queued, Ordering::AcqRel)
    }

    fn heartbeat(&self) -> Option<NodeReport> {
        Some(report(&self.id))
    }
}

fn report(id: &str) -> NodeReport {
    NodeReport::settled(id, "g", "127.0.0.1:1".into(), "1")
}

/// Records the ids in delivery order; the first call waits until the test lets it go, so
/// that everything after it is queued behind it.
struct Gate {
    first: Mutex<Option<mpsc::Receiver<()>>>,
    seen: Mutex<Vec<String>>,
}

impl Reporter for Gate {
    fn report(&self, report: &NodeReport) -> Result<(), String> {
        if let Some(wait) = self.first.lock().unwrap().take() {
            wait.recv().unwrap();
        }
        self.seen.lock().unwrap().push(report.id.clone());
        Ok(())
    }
}

#[test]
fn a_change_is_sent_before_the_periodic_heartbeats_queued_ahead_of_it() {
    let (go, wait) = mpsc::channel();
    let gate = Arc::new(Gate {
        first: Mutex::new(Some(wait)),
        seen: Mutex::default(),
    });
    let (queue, handles) = ReportQueue::start(1, gate.clone()).unwrap();
    queue.change(0, report("blocker"));
    // Let the one reporter thread take the blocker before anything else is queued.
    while queue.lanes[0].jobs.lock().unwrap().changes.len() == 1 {
        std::thread::yield_now();
    }
    let nodes: Vec<Arc<Quiet>> = (0..5)
        .map(|i| {
            Arc::new(Quiet {
                id: format!("p{i}"),
                queued: AtomicBool::new(false),
            })
        })
        .collect();
    for n in &nodes {
        queue.periodic(n);
    }
    queue.change(0, report("news-1"));
    queue.change(0, report("news-2"));
    go.send(()).unwrap();
    queue.close();
    for h in handles {
        h.join().unwrap();
    }
    let seen = gate.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        ["blocker", "news-1", "news-2", "p0", "p1", "p2", "p3", "p4"],
        "changes in their order, before the periodic heartbeats, none lost at close"
    );
    assert_eq!(queue.change_delays().len(), 3);
    assert_eq!(queue.stats().on_change, 3);
    assert_eq!(queue.stats().sent, 8);
}
