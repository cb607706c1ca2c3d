//! The inventory as a replica serves heartbeats from it: read from the replica's watch of
//! `nodes/`, and written in batches.
//!
//! Each heartbeat that must be stored is a compare-and-swap on its node's record. Ten thousand
//! nodes write a few hundred records a second, and one transaction each is one Raft proposal,
//! one WAL fsync on every member. The writer commits the heartbeats that arrive within
//! [`LINGER`] of the first, and those that waited meanwhile, as one transaction (every
//! record's check and put; up to [`MAX_BATCH`], below etcd's default `--max-txn-ops` of 128),
//! so under load a proposal carries many records. A batch whose checks fail as a whole (one record moved under it) is committed
//! again record by record, so each heartbeat gets its own answer, as before.

use std::collections::{BTreeSet, VecDeque};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use slate_rollout::NodeRecord;

use super::{json, mirror_nodes, Nodes, NODES};
use crate::etcd::{Commit, EtcdState, Expect, Outcome, StateError};

/// Records per transaction at most.
pub const MAX_BATCH: usize = 100;
/// How long the first heartbeat of a batch waits for others. A heartbeat's answer is not
/// urgent (the node sends the next in 20 s); at 10,000 nodes a few hundred arrive a second,
/// so this turns them into at most a hundred proposals a second, whatever etcd's latency.
pub const LINGER: Duration = Duration::from_millis(10);

struct Job {
    key: String,
    value: Vec<u8>,
    expect: Expect,
    answer: SyncSender<Result<Outcome, String>>,
}

/// The replica's inventory: the mirror, and the batching writer.
pub struct NodeStore {
    pub mirror: Nodes,
    jobs: Mutex<Sender<Job>>,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore")
            .field("mirror", &self.mirror)
            .finish_non_exhaustive()
    }
}

impl NodeStore {
    /// Starts the watch and the writer's thread (which ends when the store is dropped).
    pub fn start(state: Arc<EtcdState>) -> Result<NodeStore, StateError> {
        let mirror = mirror_nodes(&state)?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("slate-operator-nodes".into())
            .spawn(move || write_batches(&state, &rx))
            .map_err(|e| StateError::Invalid(format!("starting the inventory's writer: {e}")))?;
        Ok(NodeStore {
            mirror,
            jobs: Mutex::new(tx),
        })
    }

    /// Writes a node's record if its key still stands as `expect` says, in the next batch;
    /// the mirror then holds it at once.
    pub fn put_if(&self, record: &NodeRecord, expect: Expect) -> Result<Outcome, String> {
        let (answer, answered) = mpsc::sync_channel(1);
        let id = &record.report.id;
        let job = Job {
            key: format!("{NODES}{id}"),
            value: json(record),
            expect,
            answer,
        };
        self.jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .send(job)
            .map_err(|_| "the inventory's writer has stopped".to_owned())?;
        let outcome = answered
            .recv()
            .map_err(|_| "the inventory's writer has stopped".to_owned())??;
        if let Outcome::Committed { revision } = outcome {
            self.mirror.note(id, record.clone(), revision);
        }
        Ok(outcome)
    }
}

fn write_batches(state: &EtcdState, jobs: &Receiver<Job>) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    loop {
        if pending.is_empty() {
            match jobs.recv() {
                Ok(job) => pending.push_back(job),
                Err(_) => return,
            }
        }
        let until = Instant::now() + LINGER;
        while pending.len() < MAX_BATCH {
            let Some(left) = until.checked_duration_since(Instant::now()) else {
                break;
            };
            // A disconnected channel ends the loop at the next `recv`.
            let Ok(job) = jobs.recv_timeout(left) else {
                break;
            };
            pending.push_back(job);
        }
        // In arrival order, up to the first key already in the batch (etcd refuses a key
        // twice in one transaction): a node's second write waits for the next batch.
        let mut keys = BTreeSet::new();
        let mut batch = Vec::new();
        while let Some(job) = pending.front() {
            if batch.len() >= MAX_BATCH || !keys.insert(job.key.clone()) {
                break;
            }
            batch.extend(pending.pop_front());
        }
        commit(state, batch);
    }
}

fn commit(state: &EtcdState, batch: Vec<Job>) {
    let together = Commit {
        checks: batch.iter().map(|j| (j.key.clone(), j.expect)).collect(),
        puts: batch
            .iter()
            .map(|j| (j.key.clone(), j.value.clone()))
            .collect(),
        ..Commit::default()
    };
    match state.commit(&together) {
        Ok(outcome @ Outcome::Committed { .. }) => {
            for job in batch {
                let _ = job.answer.send(Ok(outcome));
            }
        }
        Ok(_) if batch.len() > 1 => {
            for job in batch {
                commit(state, vec![job]);
            }
        }
        answer => {
            let answer = answer.map_err(|e| e.to_string());
            for job in batch {
                let _ = job.answer.send(answer.clone());
            }
        }
    }
}
