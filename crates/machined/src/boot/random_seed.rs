//! Task `randomSeed`: credit the seed the last boot saved on STATE to the kernel's random pool,
//! then save the next one (`slate_host::consume_random_seed`, docs/node.md "Random seed").
//!
//! Without it the API's start waited for the kernel's CRNG: 1.07 s of a 2.1 s boot sequence on
//! a second boot under TCG, where the CPU offers no random instruction the kernel trusts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use slate_host::SeedOutcome;
use slate_sequencer::{TaskContext, TaskError};

use crate::base::journal::Journal;
use crate::base::paths::STATE_MOUNT;

/// The seed's file on STATE (root only, 512 bytes).
pub(crate) const RANDOM_SEED_FILE: &str = "random-seed";

pub(crate) fn random_seed_path() -> PathBuf {
    Path::new(STATE_MOUNT).join(RANDOM_SEED_FILE)
}

/// Never fails the boot: without a seed the kernel still initializes its CRNG, only later.
pub(crate) fn random_seed_task(
    ctx: &TaskContext<'_>,
    journal: &Arc<Journal>,
) -> Result<(), TaskError> {
    let path = random_seed_path();
    match slate_host::consume_random_seed(&path) {
        Ok(SeedOutcome::Credited { bytes, bits }) => {
            ctx.log(&format!(
                "random seed: {bytes} bytes saved by the last boot credited ({bits} bits)"
            ));
        }
        Ok(SeedOutcome::Missing) => {
            ctx.log("random seed: none saved (a first boot); the kernel gathers its own");
        }
        Ok(SeedOutcome::Uncredited { bytes, why }) => {
            ctx.log(&format!(
                "random seed: {}: {why}: {bytes} bytes mixed in without credit",
                path.display()
            ));
        }
        Err(err) => {
            ctx.log(&format!(
                "random seed: {:#} (continuing without it)",
                anyhow::Error::from(err)
            ));
        }
    }
    // After a credit the pool is initialized and the next seed is read at once; without one,
    // reading it blocks until the kernel has gathered enough entropy by itself. Either way no
    // boot waits for it: the write and its fsyncs cost 46 ms of an emulated boot's critical
    // path. A cut before it lands leaves no seed (this one is already gone), never a reused one.
    let journal = Arc::clone(journal);
    let spawned = std::thread::Builder::new()
        .name("random-seed".into())
        .spawn(move || save(&path, &journal));
    if let Err(err) = spawned {
        ctx.log(&format!("random seed: not saved: starting a thread: {err}"));
    }
    Ok(())
}

fn save(path: &Path, journal: &Journal) {
    match slate_host::save_random_seed(path) {
        Ok(()) => journal.info(format_args!(
            "random seed: {} bytes saved for the next boot",
            slate_host::RANDOM_SEED_LEN
        )),
        Err(err) => journal.error(format_args!(
            "random seed: not saved for the next boot: {:#}",
            anyhow::Error::from(err)
        )),
    }
}
