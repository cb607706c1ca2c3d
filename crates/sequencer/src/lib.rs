//! machined's sequencer: how a slate node moves through its lifecycle.
//!
//! A node's life is a handful of *sequences* (initialize, install, boot, reboot, reset,
//! upgrade, …). Each is an ordered list of named *phases*; each phase is a set of named *tasks*
//! that run concurrently. Ordering is expressed only by phase boundaries: two steps that must
//! happen one after the other go in two phases, two that may race are sibling tasks.
//!
//! - [`Sequence::run`] runs phases serially and the tasks of a phase on scoped threads; the
//!   first failure ends the sequence once that phase's tasks have finished; cancellation is
//!   checked at every phase boundary. Every task logs its `k/n` progress.
//! - [`PhaseListBuilder`] builds phase lists with conditional and deferred phases.
//! - [`PriorityLock`] lets one sequence run at a time; a request may preempt the running one
//!   only as [`can_take_over`] allows (or always, with the SIGTERM / power-button escape).
//! - [`Mode`] and [`Capabilities`] say what the platform allows.
//! - [`SequenceError`] makes "reboot" an error that unwinds to machined's top-level handler,
//!   which matches on its [`Disposition`]; [`run_boot`] is the Initialize → Install → Boot path.
//!
//! The crate is pure: no processes, syscalls, mounts or files. Tasks are closures supplied by
//! machined, and log lines go to a [`Logger`] it implements (over /dev/kmsg), so the whole
//! machinery is testable on a development host. The model follows Talos' machined sequencer.

mod boot;
mod cancel;
mod error;
mod kind;
mod lock;
mod log;
mod mode;
mod phase;
mod runner;
mod task;

pub use boot::{run_boot, BootOutcome};
pub use cancel::CancelToken;
pub use error::{
    Disposition, LockError, ParseRebootModeError, RebootMode, SequenceError, REBOOT_REQUESTED,
};
pub use kind::{can_take_over, ParseSequenceKindError, SequenceKind};
pub use lock::{PriorityLock, SequenceGuard};
pub use log::{error_chain, Logger, MemoryLogger, NullLogger, Span};
pub use mode::{Capabilities, Mode, ParseModeError};
pub use phase::{Phase, PhaseCheck, PhaseListBuilder, Sequence};
pub use task::{Progress, Task, TaskContext, TaskError, TaskFn};
