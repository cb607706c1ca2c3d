//! The node API's endpoints as [`Client`] methods: each one route, its body and its answer's
//! type; the connection, the error mapping and the streaming are `client.rs`'s.

use std::ops::ControlFlow;

use super::{Client, ClientError};
use crate::routes::Endpoint;
use crate::types::{
    ApplyConfigRequest, ApplyConfigResult, ConfigView, Event, PinRequest, PinResult, RebootMode,
    RebootRequest, RollbackRequest, RollbackResult, Status, UpgradeRequest, VersionInfo,
};

impl Client {
    /// `GET /v1/version` (reader).
    pub fn version(&self) -> Result<VersionInfo, ClientError> {
        self.unary(Endpoint::Version, None::<&()>)
    }

    /// `GET /v1/status` (reader).
    pub fn status(&self) -> Result<Status, ClientError> {
        self.unary(Endpoint::Status, None::<&()>)
    }

    /// `POST /v1/reboot` (operator).
    pub fn reboot(&self, mode: RebootMode) -> Result<(), ClientError> {
        let req = RebootRequest { mode, entry: None };
        self.unary::<serde_json::Value, _>(Endpoint::Reboot, Some(&req))
            .map(drop)
    }

    /// `POST /v1/reboot` with an entry (admin): that entry boots once, then the default again.
    pub fn reboot_once_into(&self, entry: &str, mode: RebootMode) -> Result<(), ClientError> {
        let req = RebootRequest {
            mode,
            entry: Some(entry.to_owned()),
        };
        self.unary::<serde_json::Value, _>(Endpoint::Reboot, Some(&req))
            .map(drop)
    }

    /// `POST /v1/shutdown` (operator).
    pub fn shutdown(&self) -> Result<(), ClientError> {
        self.unary::<serde_json::Value, ()>(Endpoint::Shutdown, None)
            .map(drop)
    }

    /// `POST /v1/reset` (admin).
    pub fn reset(&self) -> Result<(), ClientError> {
        self.unary::<serde_json::Value, ()>(Endpoint::Reset, None)
            .map(drop)
    }

    /// `POST /v1/upgrade` (operator).
    pub fn upgrade(&self, req: &UpgradeRequest) -> Result<(), ClientError> {
        self.unary::<serde_json::Value, _>(Endpoint::Upgrade, Some(req))
            .map(drop)
    }

    /// `POST /v1/pins` (admin): the pins after pinning or unpinning a version.
    pub fn pin(&self, req: &PinRequest) -> Result<PinResult, ClientError> {
        self.unary(Endpoint::Pin, Some(req))
    }

    /// `POST /v1/rollback` (admin): what boots next; the node then reboots (not on a dry run).
    pub fn rollback(&self, req: &RollbackRequest) -> Result<RollbackResult, ClientError> {
        self.unary(Endpoint::Rollback, Some(req))
    }

    /// `GET /v1/snapshots` (reader): a snapshot root's listing, as JSON.
    pub fn snapshots(&self) -> Result<serde_json::Value, ClientError> {
        self.unary(Endpoint::SnapshotList, None::<&()>)
    }

    /// `POST /v1/snapshots/upgrade` (admin): the engine's report, as JSON.
    pub fn snapshot_upgrade(
        &self,
        req: &crate::SnapshotUpgradeRequest,
    ) -> Result<serde_json::Value, ClientError> {
        self.unary(Endpoint::SnapshotUpgrade, Some(req))
    }

    /// `GET /v1/services` (reader): the node's services.
    pub fn services(&self) -> Result<crate::ServicesView, ClientError> {
        self.unary(Endpoint::Services, None::<&()>)
    }

    /// `POST /v1/services` (operator): start, stop or restart one service.
    pub fn control_service(
        &self,
        req: &crate::ServiceControlRequest,
    ) -> Result<crate::NodeServiceStatus, ClientError> {
        self.unary(Endpoint::ControlService, Some(req))
    }

    /// `GET /v1/boot` (reader): the node's boot entries and its next boot, as JSON.
    pub fn boot_explain(&self) -> Result<serde_json::Value, ClientError> {
        self.unary(Endpoint::BootExplain, None::<&()>)
    }

    /// `GET /v1/config` (reader): the machine configuration in effect, secrets redacted.
    pub fn show_config(&self) -> Result<ConfigView, ClientError> {
        self.unary(Endpoint::ShowConfig, None::<&()>)
    }

    /// `POST /v1/config` (admin, or the maintenance token).
    pub fn apply_config(&self, req: &ApplyConfigRequest) -> Result<ApplyConfigResult, ClientError> {
        self.unary(Endpoint::ApplyConfig, Some(req))
    }

    /// `GET /v1/logs` (reader): `on_line` gets each line (without its newline) as it arrives,
    /// until the node ends the stream or `on_line` breaks.
    pub fn logs(
        &self,
        follow: bool,
        on_line: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<(), ClientError> {
        self.lines(Endpoint::Logs, follow, on_line)
    }

    /// `GET /v1/dmesg` (reader), like [`Client::logs`].
    pub fn dmesg(
        &self,
        follow: bool,
        on_line: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<(), ClientError> {
        self.lines(Endpoint::Dmesg, follow, on_line)
    }

    /// `GET /v1/events` (reader): `on_event` gets each event as it arrives.
    pub fn events(
        &self,
        follow: bool,
        mut on_event: impl FnMut(Event) -> ControlFlow<()>,
    ) -> Result<(), ClientError> {
        let mut bad = None;
        self.lines(Endpoint::Events, follow, |line| {
            if line.trim().is_empty() {
                return ControlFlow::Continue(());
            }
            match serde_json::from_str(line) {
                Ok(event) => on_event(event),
                Err(e) => {
                    bad = Some(format!("bad event {line:?}: {e}"));
                    ControlFlow::Break(())
                }
            }
        })?;
        match bad {
            Some(message) => Err(self.protocol(message)),
            None => Ok(()),
        }
    }
}
