//! A node whose root is a Btrfs snapshot (`slate imager build --output btrfs-image`; the
//! seed's mutable root, docs/update-transaction.md "Btrfs snapshots"): no META, no A/B UKIs.
//! Its persistent state is the pool's `@state` subvolume on `/system/state` and its users'
//! data `@home` on `/home`, both outside every snapshot so that a rollback keeps them. The
//! boot is settled by the snapshot engine: a healthy boot of an entry on trial is blessed
//! (`slate snapshot commit`); a fatal error on one makes the previous snapshot boot next
//! (`slate snapshot rollback`), and the reboot that follows lands there.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use slate_api::BackendError;
use slate_bootspec::BootState;
use slate_sequencer::{Task, TaskContext, TaskError};
use slate_snapshot::SnapshotName;
use slate_snapshot_engine::{self as engine, Change, Pool, UpgradeOptions, VerifyPolicy};

use crate::decision::{HealthOutcome, Phase};
use crate::node::Node;
use crate::task::{failed, task};
use crate::transaction::SettleError;

pub use slate_snapshot::{HOME_SUBVOLUME, STATE_SUBVOLUME};
/// What a rollback after a failed boot checks of the snapshot it goes back to: a mismatch
/// with its manifest is logged, and the rollback goes on (the seed's default; going nowhere
/// would leave the node on the snapshot that just failed).
const ROLLBACK_POLICY: VerifyPolicy = VerifyPolicy::Warn;

/// Where the running root comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRoot {
    /// The snapshot mounted on `/`.
    pub snapshot: SnapshotName,
    /// The pool's partition (`/dev/vda2`).
    pub device: PathBuf,
    /// Its disk (`/dev/vda`), whose GPT also holds the ESP.
    pub disk: PathBuf,
}

/// The snapshot root as `/proc/self/mountinfo` shows it: `/` is Btrfs, mounted from a
/// top-level `root-…` subvolume. `None` on an image (squashfs) root.
pub fn from_mountinfo(text: &str) -> Option<(SnapshotName, PathBuf)> {
    let mounts = engine::mountinfo::parse(text);
    let root = engine::mountinfo::mount_at(&mounts, Path::new("/"))?;
    if root.fstype != "btrfs" {
        return None;
    }
    let snapshot = SnapshotName::parse(root.root.trim_start_matches('/')).ok()?;
    Some((snapshot, PathBuf::from(&root.source)))
}

/// Detects the snapshot root of this boot.
pub fn detect() -> Option<SnapshotRoot> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (snapshot, device) = from_mountinfo(&text)?;
    let disk = slate_host::disk_of_partition(&device).ok()?;
    Some(SnapshotRoot {
        snapshot,
        device,
        disk,
    })
}

fn open_pool(root: &SnapshotRoot, lock: bool) -> Result<Pool, String> {
    Pool::open(Path::new("/"), &root.disk, lock).map_err(|e| pool_error(&e))
}

fn pool_error(e: &engine::EngineError) -> String {
    format!(
        "opening the Btrfs pool: {}",
        slate_sequencer::error_chain(e)
    )
}

/// [`open_pool`] for an API request: a held lock is `locked` (409), anything else `failed`.
fn open_pool_for_request(root: &SnapshotRoot, lock: bool) -> Result<Pool, BackendError> {
    Pool::open(Path::new("/"), &root.disk, lock).map_err(|e| match e {
        engine::EngineError::Locked(_) => backend_err(e),
        other => BackendError::Failed(pool_error(&other)),
    })
}

/// Initialize's task on a snapshot root: the pool's disk is the system disk, and what an
/// upgrade cut short by a power cut or a kill left on the pool is removed now, before the
/// boot is settled and before any new upgrade.
pub fn initialize(
    ctx: &TaskContext<'_>,
    node: &Node,
    system_disk: &Mutex<Option<PathBuf>>,
) -> Result<(), TaskError> {
    let Some(root) = &node.snapshot_root else {
        return Ok(());
    };
    ctx.log(&format!(
        "the root is Btrfs snapshot {} on {} (disk {}): no META, the snapshot engine settles \
         the boot",
        root.snapshot,
        root.device.display(),
        root.disk.display()
    ));
    let pool = open_pool(root, true).map_err(failed)?;
    engine::clean_up_interrupted(&pool, &mut |line| ctx.log(&line))
        .map_err(|e| failed(slate_sequencer::error_chain(&e)))?;
    *system_disk.lock().unwrap_or_else(|p| p.into_inner()) = Some(root.disk.clone());
    Ok(())
}

/// Boot's volumes on a snapshot root: `@state` on `/system/state`, `@home` on `/home`.
pub fn volume_tasks(node: &Node) -> Vec<Task<'_>> {
    let mounts = [
        ("mountState", STATE_SUBVOLUME, crate::sequences::STATE_MOUNT),
        ("mountHome", HOME_SUBVOLUME, "/home"),
    ];
    mounts
        .into_iter()
        .map(|(name, subvolume, target)| {
            task(node, name, move |ctx| match &node.snapshot_root {
                Some(root) => mount_subvolume(ctx, root, subvolume, Path::new(target)),
                None => Ok(()),
            })
        })
        .collect()
}

/// Mounts the pool's `subvolume` on `target` (a Boot task).
pub fn mount_subvolume(
    ctx: &TaskContext<'_>,
    root: &SnapshotRoot,
    subvolume: &str,
    target: &Path,
) -> Result<(), TaskError> {
    std::fs::create_dir_all(target)
        .map_err(|e| failed(format!("creating {}: {e}", target.display())))?;
    slate_host::mount(
        &root.device,
        target,
        "btrfs",
        slate_host::MsFlags::MS_NOSUID | slate_host::MsFlags::MS_NODEV,
        Some(&format!("subvol={subvolume}")),
    )?;
    ctx.log(&format!(
        "mounted {subvolume} of {} on {}",
        root.device.display(),
        target.display()
    ));
    Ok(())
}

/// Settles the boot through the snapshot engine (what `transaction::settle` does for A/B).
pub fn settle(node: &Node, root: &SnapshotRoot, phase: Phase) -> Result<(), SettleError> {
    match phase {
        Phase::Running {
            health: HealthOutcome::Failed(report),
        } => Err(SettleError::Unhealthy(report)),
        Phase::Running {
            health: HealthOutcome::Passed,
        } => {
            let pool = open_pool(root, true).map_err(SettleError::Failed)?;
            let outcome = engine::commit(&pool, false)
                .map_err(|e| SettleError::Failed(slate_sequencer::error_chain(&e)))?;
            let pruned = if outcome.pruned.is_empty() {
                "nothing pruned".to_owned()
            } else {
                format!("pruned {}", outcome.pruned.join(", "))
            };
            match (outcome.renamed, outcome.saved_entry) {
                (Some((from, to)), _) => node.journal.info(format_args!(
                    "committed: snapshot {} (loader/entries/{from} -> {to}); {pruned}",
                    root.snapshot
                )),
                (None, Some((from, to))) => node.journal.info(format_args!(
                    "committed: snapshot {} (grubenv saved_entry {from} -> {to}); {pruned}",
                    root.snapshot
                )),
                (None, None) => node.journal.info(format_args!(
                    "snapshot {} was committed already; {pruned}",
                    root.snapshot
                )),
            }
            Ok(())
        }
        Phase::Fatal => {
            let pool = open_pool(root, true).map_err(SettleError::Failed)?;
            let state = engine::boot_state(&pool, &root.snapshot).map_err(engine_err)?;
            if state != Some(BootState::Indeterminate) {
                // Committed (or already marked bad): it stays what boots; nothing to revert.
                return Ok(());
            }
            let outcome = engine::rollback(&pool, ROLLBACK_POLICY, false).map_err(engine_err)?;
            for note in &outcome.notes {
                node.journal.info(format_args!("rollback: {note}"));
            }
            node.journal.info(format_args!(
                "snapshot reverted: {} failed its boot ({} marked bad); {} boots next ({})",
                root.snapshot, outcome.from_entry, outcome.target, outcome.to_entry
            ));
            Ok(())
        }
    }
}

fn engine_err(e: engine::EngineError) -> SettleError {
    SettleError::Failed(slate_sequencer::error_chain(&e))
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
    };
    let report = engine::upgrade(&pool, &opts, &mut say).map_err(backend_err)?;
    let mut value =
        serde_json::to_value(report).map_err(|e| BackendError::Failed(e.to_string()))?;
    value["lines"] = serde_json::Value::from(lines);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNAPSHOT_ROOT: &str = "\
22 1 0:21 /root-20261202-034907 / rw,relatime shared:1 - btrfs /dev/vda2 rw,space_cache=v2,subvolid=256,subvol=/root-20261202-034907
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw,size=10240k
";

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

    #[test]
    fn a_snapshot_root_is_recognised_from_mountinfo() {
        let (snapshot, device) = from_mountinfo(SNAPSHOT_ROOT).unwrap();
        assert_eq!(snapshot.as_str(), "root-20261202-034907");
        assert_eq!(device, PathBuf::from("/dev/vda2"));
    }

    #[test]
    fn image_roots_and_other_subvolumes_are_not_snapshot_roots() {
        let squashfs = "22 1 7:0 / / ro,relatime - squashfs /dev/loop0 ro\n";
        assert_eq!(from_mountinfo(squashfs), None);
        let at = "22 1 0:21 /@ / rw - btrfs /dev/vda2 rw,subvol=/@\n";
        assert_eq!(from_mountinfo(at), None);
        // The last mount on / is the one in effect.
        let over = format!("{SNAPSHOT_ROOT}30 22 0:30 / / rw - tmpfs tmpfs rw\n");
        assert_eq!(from_mountinfo(&over), None);
    }
}
