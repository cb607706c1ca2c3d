//! The settle of a snapshot root's boot: the facts come from the snapshot engine (the booted
//! snapshot's boot state and its fallback), the decision is [`decide`]'s, the same as an A/B
//! disk's, and the engine carries it out: a healthy boot of an entry on trial is blessed
//! (`slate snapshot commit`); a fatal error on one makes the previous snapshot boot next
//! (`slate snapshot rollback`), and the reboot that follows lands there.

use slate_bootspec::BootState;
use slate_snapshot_engine::{self as engine, Pool, VerifyPolicy};

use crate::base::node::Node;
use crate::base::snapshot_root::{open_pool, SnapshotRoot};
use crate::settle::decision::{
    decide, BootFacts, Decision, Idle, LoaderFacts, Phase, Refusal, REVERT_COUNTED,
};
use crate::settle::SettleError;

/// What a rollback after a failed boot checks of the snapshot it goes back to: a mismatch
/// with its manifest is logged, and the rollback goes on (the seed's default; going nowhere
/// would leave the node on the snapshot that just failed).
const ROLLBACK_POLICY: VerifyPolicy = VerifyPolicy::Warn;

/// The facts of a snapshot root's boot, and the pool to act through when it opened.
fn gather(root: &SnapshotRoot, phase: Phase) -> (BootFacts, Option<Pool>) {
    let booted_entry = Some(root.snapshot.to_string());
    let (loader, pool) = match open_pool(root, true) {
        Err(reason) => (LoaderFacts::Unavailable(reason), None),
        Ok(pool) => match engine::list(&pool) {
            Err(e) => (LoaderFacts::Unreadable(engine_chain(&e)), Some(pool)),
            Ok(listing) => {
                let booted = listing
                    .snapshots
                    .iter()
                    .find(|s| s.name == root.snapshot.as_str());
                let state = booted.and_then(|s| parse_state(&s.state));
                let fallback = listing.snapshots.iter().find(|s| s.fallback);
                let facts = LoaderFacts::of_snapshot(
                    root.snapshot.as_str(),
                    state,
                    fallback.map(|s| s.name.as_str()),
                );
                (facts, Some(pool))
            }
        },
    };
    let facts = BootFacts {
        phase,
        booted_entry,
        loader,
    };
    (facts, pool)
}

/// The engine's listing names states as `good`, `indeterminate`, `bad` or `none`.
fn parse_state(state: &str) -> Option<BootState> {
    match state {
        "good" => Some(BootState::Good),
        "indeterminate" => Some(BootState::Indeterminate),
        "bad" => Some(BootState::Bad),
        _ => None,
    }
}

/// Settles the boot through the snapshot engine (what `transaction::settle` does for A/B),
/// as [`decide`] says from the facts [`gather`] read. A boot that was committed already only
/// prunes, as every commit does.
pub fn settle(node: &Node, root: &SnapshotRoot, phase: Phase) -> Result<(), SettleError> {
    let (facts, pool) = gather(root, phase);
    // `decide` asks for a write only once the engine's listing was read, so the pool opened.
    let pool = || pool.ok_or_else(|| SettleError::Failed("no Btrfs pool to act through".into()));
    match decide(&facts) {
        Decision::Refuse(Refusal::Unhealthy(report)) => Err(SettleError::Unhealthy(report)),
        Decision::Refuse(refusal) => Err(SettleError::Failed(refusal.to_string())),
        Decision::Nothing(Idle::NoUpgradePending) => Ok(()),
        Decision::Nothing(Idle::AlreadyCommitted) => {
            let pruned = engine::prune(&pool()?, false).map_err(engine_err)?;
            node.journal.info(format_args!(
                "snapshot {} was committed already; {}",
                root.snapshot,
                pruned_line(&pruned)
            ));
            Ok(())
        }
        Decision::Commit { upgrade, .. } => {
            commit(node, root, &pool()?)?;
            node.journal.count(upgrade.counted());
            Ok(())
        }
        Decision::Revert { .. } => {
            rollback(node, root, &pool()?)?;
            node.journal.count(REVERT_COUNTED);
            Ok(())
        }
        Decision::KeepFallback { .. } | Decision::DropEmptyMarker { .. } => {
            rollback(node, root, &pool()?)
        }
    }
}

fn pruned_line(pruned: &[String]) -> String {
    if pruned.is_empty() {
        "nothing pruned".to_owned()
    } else {
        format!("pruned {}", pruned.join(", "))
    }
}

/// Bless the booted snapshot's entry (systemd-boot) or make it grubenv's `saved_entry`.
fn commit(node: &Node, root: &SnapshotRoot, pool: &Pool) -> Result<(), SettleError> {
    let outcome = engine::commit(pool, false).map_err(engine_err)?;
    let pruned = pruned_line(&outcome.pruned);
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

/// Mark the booted snapshot bad and make its fallback boot next.
fn rollback(node: &Node, root: &SnapshotRoot, pool: &Pool) -> Result<(), SettleError> {
    let outcome = engine::rollback(pool, ROLLBACK_POLICY, false).map_err(engine_err)?;
    for note in &outcome.notes {
        node.journal.info(format_args!("rollback: {note}"));
    }
    node.journal.info(format_args!(
        "snapshot reverted: {} failed its boot ({} marked bad); {} boots next ({})",
        root.snapshot, outcome.from_entry, outcome.target, outcome.to_entry
    ));
    Ok(())
}

fn engine_chain(e: &engine::EngineError) -> String {
    slate_sequencer::error_chain(e)
}

fn engine_err(e: engine::EngineError) -> SettleError {
    SettleError::Failed(engine_chain(&e))
}
