//! What every node and task of a fleet shares: the runtime, the log, the behaviour, the
//! heartbeat queue, the servers' configuration and identities.

use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use slate_api::{ServerConfig, Shutdown};

use crate::behaviour::Behaviour;
use crate::heartbeat::ReportQueue;
use crate::identity::Identities;
use crate::log::EventLog;

/// What every node and task of a fleet shares.
pub(crate) struct Shared {
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) log: EventLog,
    pub(crate) behaviour: RwLock<Behaviour>,
    pub(crate) reports: Arc<ReportQueue>,
    pub(crate) shutdown: Shutdown,
    /// The server configuration of every node but its address and certificate.
    pub(crate) server: ServerConfig,
    /// Every node's key and certificates.
    pub(crate) identities: Arc<Identities>,
    pub(crate) seed: u64,
    pub(crate) api_errors: Mutex<Vec<String>>,
}

impl Shared {
    pub(crate) fn behaviour(&self) -> RwLockReadGuard<'_, Behaviour> {
        self.behaviour
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn api_error(&self, message: String) {
        if !self.shutdown.is_triggered() {
            self.api_errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(message);
        }
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutdown.is_triggered()
    }
}
