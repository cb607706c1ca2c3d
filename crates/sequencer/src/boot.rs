//! The boot path: Initialize → Install → Boot, strictly in order.

use crate::error::SequenceError;
use crate::lock::PriorityLock;
use crate::log::Logger;
use crate::phase::Sequence;

/// How [`run_boot`] ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootOutcome {
    /// All three sequences completed: the node is up.
    Booted,
    /// Initialize was taken over (SIGTERM, power button); Install and Boot never ran.
    InitializeCancelled,
    /// Boot was taken over (reboot, reset, upgrade, …); the taker is in charge now.
    BootCancelled,
}

/// Runs the three boot sequences in order, each under `lock` (a request arriving in between
/// contends normally).
///
/// `install` and `boot` are built only when their turn comes, because what they contain
/// depends on what Initialize found (the configuration, whether the disk is installed); the
/// `boot` closure is also the place to start the API, which must not come up before Install.
///
/// - Initialize cancelled → `Ok(InitializeCancelled)`, neither `install` nor `boot` is called.
/// - Boot cancelled → `Ok(BootCancelled)`: being taken over while coming up is normal.
/// - Anything else, including Install's reboot request (install-then-reboot is its normal
///   end), is returned for the top-level handler's [`disposition`](SequenceError::disposition).
pub fn run_boot<'a>(
    lock: &PriorityLock,
    logger: &dyn Logger,
    initialize: Sequence<'a>,
    install: impl FnOnce() -> Sequence<'a>,
    boot: impl FnOnce() -> Sequence<'a>,
) -> Result<BootOutcome, SequenceError> {
    match lock.run(initialize, logger) {
        Ok(()) => {}
        Err(SequenceError::Cancelled { .. }) => {
            logger.log("initialize sequence cancelled: skipping install and boot");
            return Ok(BootOutcome::InitializeCancelled);
        }
        Err(error) => return Err(error),
    }
    lock.run(install(), logger)?;
    match lock.run(boot(), logger) {
        Ok(()) => Ok(BootOutcome::Booted),
        Err(SequenceError::Cancelled { .. }) => Ok(BootOutcome::BootCancelled),
        Err(error) => Err(error),
    }
}
