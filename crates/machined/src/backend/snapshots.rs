//! The node API's snapshot requests on a snapshot root (`base::snapshot_root`): the engine's
//! listing, and an upgrade by a new snapshot, which waits for this boot's settle.

use std::path::Path;
use std::time::{Duration, Instant};

use slate_api::BackendError;
use slate_snapshot_engine::{self as engine, Change, Pool, UpgradeOptions};

use crate::base::node::Node;
use crate::base::snapshot_root::{pool_error, SnapshotRoot};

/// The pool opened for an API request: a held lock is `locked` (409), anything else `failed`.
fn open_pool_for_request(root: &SnapshotRoot, lock: bool) -> Result<Pool, BackendError> {
    Pool::open(Path::new("/"), &root.disk, lock).map_err(|e| match e {
        engine::EngineError::Locked(_) => backend_err(e),
        other => BackendError::Failed(pool_error(&other)),
    })
}

fn backend_err(e: engine::EngineError) -> BackendError {
    match e {
        engine::EngineError::Invalid(why) => BackendError::InvalidArgument(why),
        engine::EngineError::Locked(_) => BackendError::Locked(e.to_string()),
        other => BackendError::Failed(slate_sequencer::error_chain(&other)),
    }
}

fn require(node: &Node) -> Result<&SnapshotRoot, BackendError> {
    node.snapshot_root.as_ref().ok_or_else(|| {
        BackendError::Unsupported("this node's root is an image, not a Btrfs snapshot".into())
    })
}

/// How long a snapshot upgrade asked for over the API waits for this boot to be settled.
const SETTLE_WAIT: Duration = Duration::from_secs(60);

/// Waits until this boot is committed. The API answers from stage Running on, while the health
/// checks run and then the engine's commit holds the pool's lock: an upgrade asked for in that
/// window would find the lock taken (and must not snapshot a root still on trial), so it waits
/// for the settle, as an A/B upgrade waits in machined's queue. Refused as `locked` when the
/// boot is not committed within `wait` (a failed boot is being reverted, or no settle runs).
fn wait_until_settled(node: &Node, wait: Duration) -> Result<(), BackendError> {
    let deadline = Instant::now() + wait;
    while !node.is_committed() {
        if Instant::now() >= deadline {
            return Err(BackendError::Locked(format!(
                "this boot is not committed after {} s (health checks or the commit still \
                 running, or the boot failed): no snapshot upgrade until it is",
                wait.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `GET /v1/snapshots`: the engine's listing.
pub fn list(node: &Node) -> Result<serde_json::Value, BackendError> {
    let root = require(node)?;
    let pool = open_pool_for_request(root, false)?;
    let listing = engine::list(&pool).map_err(backend_err)?;
    serde_json::to_value(listing).map_err(|e| BackendError::Failed(e.to_string()))
}

/// `POST /v1/snapshots/upgrade`: the eight steps up to the reboot, logged as they go; the
/// answer is the engine's report with the lines it printed.
pub fn upgrade(
    node: &Node,
    req: &slate_api::SnapshotUpgradeRequest,
) -> Result<serde_json::Value, BackendError> {
    let root = require(node)?;
    if !req.dry_run {
        wait_until_settled(node, SETTLE_WAIT)?;
    }
    let pool = open_pool_for_request(root, !req.dry_run)?;
    let mut lines = Vec::new();
    let mut say = |line: String| {
        node.journal.info(format_args!("snapshot upgrade: {line}"));
        lines.push(line);
    };
    engine::clean_up_interrupted(&pool, &mut say).map_err(backend_err)?;
    let opts = UpgradeOptions {
        change: Change::Command(req.command.clone()),
        dry_run: req.dry_run,
        cmdline: slate_host::kernel_cmdline().unwrap_or_default(),
        now: None,
        tries: req.tries,
    };
    let report = engine::upgrade(&pool, &opts, &mut say).map_err(backend_err)?;
    let mut value =
        serde_json::to_value(report).map_err(|e| BackendError::Failed(e.to_string()))?;
    value["lines"] = serde_json::Value::from(lines);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn an_upgrade_waits_for_the_boot_to_be_committed_and_is_refused_locked_without_it() {
        let (node, _requests) = Node::for_tests("");
        let started = Instant::now();
        let refused = wait_until_settled(&node, Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(
            matches!(&refused, BackendError::Locked(why) if why.contains("not committed")),
            "{refused:?}"
        );
        std::thread::scope(|s| {
            let waiter = s.spawn(|| wait_until_settled(&node, Duration::from_secs(30)));
            std::thread::sleep(Duration::from_millis(150));
            assert!(!waiter.is_finished(), "returned before the commit");
            node.set_committed();
            waiter.join().unwrap().unwrap();
        });
    }

    #[test]
    fn a_held_pool_lock_is_a_409_not_a_500() {
        let held = engine::EngineError::Locked(PathBuf::from("/run/slate/btrfs-x/.slate/lock"));
        assert!(matches!(backend_err(held), BackendError::Locked(why)
            if why == "another slate snapshot command holds /run/slate/btrfs-x/.slate/lock"));
    }
}
