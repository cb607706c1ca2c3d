//! What machined knows of its machine configuration while it runs: the document in effect,
//! whether a written one waits for a reboot, and the addresses the serving certificate names.
//! Loading, storing and applying documents is the boot layer's (`boot::machine`).

use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use slate_machine_config::{MachineConfig, Parsed};

/// What machined knows of its configuration.
#[derive(Debug, Default)]
pub struct MachineState {
    /// The configuration in effect (`None` before it is loaded, and in maintenance mode).
    pub config: Mutex<Option<Parsed>>,
    /// A configuration was written that takes effect at the next boot.
    pub pending_reboot: AtomicBool,
    /// The addresses the network task found, for the serving certificate's names.
    pub addresses: Mutex<Vec<String>>,
}

impl MachineState {
    pub fn current(&self) -> Option<MachineConfig> {
        self.config
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|p| p.config.clone())
    }

    pub fn addresses(&self) -> Vec<String> {
        self.addresses
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set(&self, parsed: Parsed) {
        *self.config.lock().unwrap_or_else(|p| p.into_inner()) = Some(parsed);
    }
}
