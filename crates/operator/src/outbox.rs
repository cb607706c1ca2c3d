//! Upgrade orders sent off the leader's loop: the tick hands its orders over and goes on; a
//! fixed set of workers (the leader's `parallel_orders`) makes the calls, and their answers
//! wait here until a later tick of the same leadership records them.
//!
//! Sending used to hold the loop: at 10,000 nodes a third of the rollout went by with no
//! commit followed and no slot refilled while the orders' handshakes ran.
//!
//! What keeps this safe:
//! - A node is recorded as upgrading (fenced) before its order is handed over, and the limits
//!   are counted from the rollouts, so nothing here can let more nodes move than allowed.
//! - A node is *pending* from the moment its order is accepted until the leader takes its
//!   answer: an order for a pending node is not queued again, so a node is never called twice
//!   at once, nor again while its first answer waits to be recorded.
//! - Each order carries the term it was handed over in. When a term ends its unsent orders
//!   are dropped, and an answer from another term than the one taking answers is dropped
//!   unrecorded: a leader records only what it asked under its own fence.

use std::collections::{BTreeSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::Scope;

use slate_rollout::Order;

use crate::drive::{DriveError, NodeDriver};

/// One call's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The term the order was handed over in.
    pub term: u64,
    pub order: Order,
    pub result: Result<(), DriveError>,
}

#[derive(Debug, Default)]
struct Queue {
    /// The current term; 0: none (nothing is accepted).
    term: u64,
    waiting: VecDeque<(u64, Order)>,
    /// Nodes whose order is waiting, in a call, or answered and not yet taken.
    pending: BTreeSet<String>,
    in_call: usize,
    answers: Vec<Answer>,
    closed: bool,
}

/// Orders and answers between the leader's loop and the workers that call the nodes.
#[derive(Debug, Default)]
pub struct Outbox {
    queue: Mutex<Queue>,
    /// Signalled when an order is queued or the outbox closes.
    work: Condvar,
}

/// What [`Outbox::take_answers`] gives the leader.
#[derive(Debug, Default)]
pub struct Taken {
    /// This term's answers, to record.
    pub answers: Vec<Answer>,
    /// Answers to orders of an earlier term, dropped.
    pub stale: usize,
}

impl Outbox {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `workers` threads in `scope` that call `driver`, each one call at a time: at most
    /// `workers` calls are ever in flight. They end when [`Outbox::close`] is called.
    pub fn spawn_workers<'scope, 'env>(
        &'env self,
        scope: &'scope Scope<'scope, 'env>,
        driver: &'env dyn NodeDriver,
        workers: usize,
    ) {
        for _ in 0..workers.max(1) {
            scope.spawn(move || self.work_loop(driver));
        }
    }

    fn work_loop(&self, driver: &dyn NodeDriver) {
        let mut queue = self.lock();
        loop {
            if queue.closed {
                return;
            }
            let Some((term, order)) = queue.waiting.pop_front() else {
                queue = self.work.wait(queue).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            queue.in_call += 1;
            drop(queue);
            let result = driver.upgrade(&order);
            queue = self.lock();
            queue.in_call -= 1;
            queue.answers.push(Answer {
                term,
                order,
                result,
            });
        }
    }

    /// A leadership begins: orders handed over from now on belong to `term` (which must
    /// differ from every earlier one).
    pub fn begin_term(&self, term: u64) {
        let mut queue = self.lock();
        queue.term = term;
    }

    /// The leadership ended: its orders not yet sent are dropped (a deposed leader asks
    /// nobody), and nothing more is accepted until the next [`Outbox::begin_term`]. Calls in
    /// flight finish; their answers are dropped by the next term's [`Outbox::take_answers`].
    pub fn end_term(&self) {
        let mut queue = self.lock();
        queue.term = 0;
        let dropped: Vec<(u64, Order)> = queue.waiting.drain(..).collect();
        for (_, order) in dropped {
            queue.pending.remove(&order.node);
        }
    }

    /// Queues `orders` under the current term, each unless its node is pending. Returns how
    /// many were queued. Does not wait for any call.
    pub fn submit(&self, orders: Vec<Order>) -> usize {
        let mut queue = self.lock();
        let term = queue.term;
        if term == 0 || queue.closed {
            return 0;
        }
        let mut queued = 0;
        for order in orders {
            if queue.pending.insert(order.node.clone()) {
                queue.waiting.push_back((term, order));
                queued += 1;
            }
        }
        drop(queue);
        if queued > 0 {
            self.work.notify_all();
        }
        queued
    }

    /// Every answer that came back since the last call: those of the current term to record,
    /// the others counted and dropped. Their nodes are no longer pending.
    pub fn take_answers(&self) -> Taken {
        let mut queue = self.lock();
        let term = queue.term;
        let answers = std::mem::take(&mut queue.answers);
        let mut taken = Taken::default();
        for answer in answers {
            queue.pending.remove(&answer.order.node);
            if term != 0 && answer.term == term {
                taken.answers.push(answer);
            } else {
                taken.stale += 1;
            }
        }
        taken
    }

    /// Gives back answers taken but not recorded (etcd failed): the next tick tries again,
    /// and their nodes are pending until then.
    pub fn give_back(&self, answers: Vec<Answer>) {
        let mut queue = self.lock();
        for answer in &answers {
            queue.pending.insert(answer.order.node.clone());
        }
        let newer = std::mem::replace(&mut queue.answers, answers);
        queue.answers.extend(newer);
    }

    /// Orders waiting for a worker, and calls in flight.
    pub fn backlog(&self) -> (usize, usize) {
        let queue = self.lock();
        (queue.waiting.len(), queue.in_call)
    }

    /// Whether `node` is pending (its order waiting, in a call, or its answer not taken).
    pub fn is_pending(&self, node: &str) -> bool {
        self.lock().pending.contains(node)
    }

    /// Stops the workers once their calls return; orders not sent are dropped.
    pub fn close(&self) {
        let mut queue = self.lock();
        queue.closed = true;
        queue.waiting.clear();
        drop(queue);
        self.work.notify_all();
    }
}

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
