//! What `slate fleet pause | resume | abort` do to a rollout, as values.

use slate_release::ReleaseIndex;

use crate::rollout::{Event, EventKind, Rollout, RolloutState, Step};
use crate::tick::withdrawn;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("rollout {id} of group {group} is {state}: nothing to {action}")]
    WrongState {
        group: String,
        id: u64,
        state: &'static str,
        action: &'static str,
    },
}

fn event(r: &Rollout, now: u64, kind: EventKind, detail: String) -> Event {
    Event {
        at: now,
        group: r.group.clone(),
        rollout: r.id,
        node: None,
        kind,
        detail,
    }
}

fn wrong(r: &Rollout, action: &'static str) -> ControlError {
    ControlError::WrongState {
        group: r.group.clone(),
        id: r.id,
        state: r.state.name(),
        action,
    }
}

/// Stops starting nodes; the ones upgrading are still followed.
pub fn pause(r: &mut Rollout, reason: &str, now: u64) -> Result<Event, ControlError> {
    if r.state != RolloutState::Running {
        return Err(wrong(r, "pause"));
    }
    r.state = RolloutState::Paused {
        reason: reason.to_owned(),
        since: now,
    };
    Ok(event(r, now, EventKind::Paused, reason.to_owned()))
}

/// Goes on after a pause: the failures so far are accepted (they no longer count against the
/// failure budget). When the target was yanked meanwhile, the rollout ends instead and the
/// next tick starts one to the next release.
pub fn resume(r: &mut Rollout, index: &ReleaseIndex, now: u64) -> Result<Event, ControlError> {
    if !matches!(r.state, RolloutState::Paused { .. }) {
        return Err(wrong(r, "resume"));
    }
    if let Some(reason) = withdrawn(index, &r.target) {
        let reason = format!("resumed, but {reason}: moving on to the next release");
        r.state = RolloutState::Aborted {
            reason: reason.clone(),
            at: now,
        };
        return Ok(event(r, now, EventKind::Aborted, reason));
    }
    let failed: Vec<String> = r
        .nodes
        .iter()
        .filter(|(_, p)| matches!(p.step, Step::Failed { .. }))
        .map(|(id, _)| id.clone())
        .collect();
    let detail = format!("{} failed nodes accepted", failed.len());
    r.acknowledged.extend(failed);
    r.state = RolloutState::Running;
    Ok(event(r, now, EventKind::Resumed, detail))
}

/// Ends the rollout for good (a newer release starts a new one).
pub fn abort(r: &mut Rollout, reason: &str, now: u64) -> Result<Event, ControlError> {
    if !r.state.is_active() {
        return Err(wrong(r, "abort"));
    }
    r.state = RolloutState::Aborted {
        reason: reason.to_owned(),
        at: now,
    };
    Ok(event(r, now, EventKind::Aborted, reason.to_owned()))
}
