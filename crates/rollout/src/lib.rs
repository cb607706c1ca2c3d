//! The rollout operator's decisions, as values: no IO, no clock, no randomness. The operator
//! (crates/operator) reads the inventory, the policies, the release index and the rollouts
//! from etcd, calls [`tick`], stores what it returns and then sends the orders.
//!
//! - [`PolicySet`]: the policy file, checked whole.
//! - [`Rollout`]: one group's move to one version, and each node's [`Step`].
//! - [`tick`]: follow the nodes, pause on a spent failure budget, start the nodes every
//!   applicable policy allows, complete; [`tick_explained`] also says why each waiting node
//!   waits; [`tick_marked`], the leader's, keeps each group's wave order in a [`TickCache`]
//!   between calls and reports each part of the tick as it ends (for timing).
//! - [`pause`], [`resume`], [`abort`]: what `slate fleet pause|resume|abort` do to a rollout.
//! - [`plan`]: the dry run: which node in which wave, not before when.
//! - [`progress`]: each group's rollout as numbers (the operator's metrics).

mod control;
mod follow;
mod held;
mod in_place;
mod limits;
mod node;
mod plan;
mod policy;
mod progress;
mod rollout;
mod start;
mod tick;
mod tick_cache;
mod waves;

pub use control::{abort, pause, resume, ControlError};
pub use node::{FailureReport, Inventory, NodeRecord, NodeReport};
pub use plan::{plan, PlanRow};
pub use policy::{
    probe_target, Limit, Policy, PolicyError, PolicyFile, PolicySet, PolicySpec, Rate, Strategy,
    Wave, WaveSpec, DEFAULT_UPGRADE_TIMEOUT,
};
pub use progress::{progress, GroupProgress};
pub use rollout::{
    Event, EventKind, NodeProgress, Order, Rollout, RolloutState, Step, RATE_MEMORY_SECONDS,
};
pub use tick::{tick, tick_explained, tick_in_place, tick_marked, Decision, Tick, RESEND_AFTER};
pub use tick_cache::{TickCache, TickPart};
pub use waves::{wave_bounds, wave_key};
