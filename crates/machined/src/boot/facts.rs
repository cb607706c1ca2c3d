//! What the Initialize sequence learns for the later ones (Install, Boot): the system disk, a
//! staged upgrade or a replacement taken out of META, the armed watchdog.

use std::path::PathBuf;
use std::sync::Mutex;

/// What Initialize learns for the later sequences.
#[derive(Debug, Default)]
pub struct Facts {
    /// The disk holding META: slate is installed there.
    pub system_disk: Mutex<Option<PathBuf>>,
    /// A staged upgrade taken out of META (consumed: the tags are already gone).
    pub staged: Mutex<Option<crate::boot::upgrade::Staged>>,
    /// The armed watchdog: fed while the node waits in maintenance mode.
    pub watchdog: Option<std::sync::Arc<slate_host::Watchdog>>,
    /// The network was brought up with DHCP for maintenance mode already.
    pub network_up: std::sync::atomic::AtomicBool,
    /// The image's services (its node configuration's `[[services]]`).
    pub image_services: Vec<slate_services::ServiceSpec>,
    /// How the image says /var lives (its `[var] mode`; the machine configuration's wins).
    pub image_var: slate_profile::VarMode,
    /// Why /var was refused at this boot (the node then waits in maintenance mode).
    pub var_refused: Mutex<Option<String>>,
    /// This boot is an upgrade by replacement's first: its data partitions start afresh.
    pub replace: Mutex<Option<slate_meta::replace::ReplaceOnBoot>>,
}

impl Facts {
    pub fn system_disk(&self) -> Option<PathBuf> {
        self.system_disk
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
