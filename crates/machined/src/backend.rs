//! The node API's view of machined: queries read the node's state; mutating calls take the
//! sequence lock here (so a refusal is answered at once) and hand the guard to the main loop.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use slate_api::{
    BackendError, EventStream, LineStream, NodeBackend, RebootMode as ApiRebootMode, Status,
    UpgradeRequest, UploadedBundle, VersionInfo,
};
use slate_sequencer::{Capabilities, LockError, RebootMode, SequenceKind};

use super::journal::Journal;
use super::node::{Node, Request};
use super::upgrade;

#[derive(Debug)]
pub struct Backend(pub Arc<Node>);

fn locked(err: LockError) -> BackendError {
    BackendError::Locked(err.to_string())
}

impl Backend {
    fn require(&self, capability: Capabilities, what: &str) -> Result<(), BackendError> {
        if self.0.mode.capabilities().contains(capability) {
            Ok(())
        } else {
            Err(BackendError::Unsupported(format!(
                "{what} is not available in {} mode",
                self.0.mode.as_str()
            )))
        }
    }
}

impl NodeBackend for Backend {
    fn version(&self) -> VersionInfo {
        VersionInfo {
            version: self.0.version.clone(),
            arch: "amd64".into(),
            booted_entry: self.0.booted_entry.clone(),
            kernel: self.0.kernel.clone(),
        }
    }

    fn status(&self) -> Status {
        Status {
            version: self.0.version.clone(),
            booted_entry: self.0.booted_entry.clone(),
            stage: self.0.stage(),
            running_sequence: self.0.running_sequence().map(|k| k.to_string()),
            mode: self.0.api_mode(),
            staged_image: None,
            last_failure: self
                .0
                .last_failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    fn reboot(&self, mode: ApiRebootMode) -> Result<(), BackendError> {
        self.require(Capabilities::REBOOT, "reboot")?;
        let guard = self.0.lock.try_lock(SequenceKind::Reboot).map_err(locked)?;
        let mode = match mode {
            ApiRebootMode::Default => RebootMode::Default,
            ApiRebootMode::Powercycle => RebootMode::Powercycle,
        };
        self.0
            .request(Request::Reboot(mode, guard))
            .map_err(BackendError::Failed)
    }

    fn reset(&self) -> Result<(), BackendError> {
        let guard = self.0.lock.try_lock(SequenceKind::Reset).map_err(locked)?;
        self.0
            .request(Request::Reset(guard))
            .map_err(BackendError::Failed)
    }

    fn upgrade(&self, req: UpgradeRequest) -> Result<(), BackendError> {
        self.require(Capabilities::UPGRADE, "upgrade")?;
        let plan = upgrade::plan(&self.0, &req)?;
        let guard = self
            .0
            .lock
            .try_lock(SequenceKind::Upgrade)
            .map_err(locked)?;
        self.0
            .journal
            .info(format_args!("upgrade to {} requested", plan.version));
        self.0
            .request(Request::Upgrade(plan, guard))
            .map_err(BackendError::Failed)
    }

    fn receive_bundle(&self, body: &mut dyn Read) -> Result<UploadedBundle, BackendError> {
        self.require(Capabilities::UPGRADE, "upgrade")?;
        upgrade::receive(&self.0, body)
    }

    fn events(&self) -> EventStream {
        self.0.subscribe()
    }

    fn logs(&self, follow: bool) -> Result<LineStream, BackendError> {
        Ok(Box::new(JournalLines {
            journal: self.0.journal.clone(),
            next: 0,
            buffered: VecDeque::new(),
            follow,
        }))
    }

    fn dmesg(&self, follow: bool) -> Result<LineStream, BackendError> {
        slate_host::kernel_log(follow)
            .map(|lines| Box::new(lines) as LineStream)
            .map_err(|e| BackendError::Failed(e.to_string()))
    }

    fn log_api(&self, message: &str) {
        self.0.journal.info(format_args!("api: {message}"));
    }
}

/// machined's journal as a line stream, following it when asked.
struct JournalLines {
    journal: Arc<Journal>,
    next: u64,
    buffered: VecDeque<String>,
    follow: bool,
}

impl Iterator for JournalLines {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        loop {
            if let Some(line) = self.buffered.pop_front() {
                return Some(line);
            }
            let wait = self.follow.then_some(Duration::from_secs(1));
            let (lines, next) = self.journal.read_from(self.next, wait);
            self.next = next;
            if lines.is_empty() && !self.follow {
                return None;
            }
            self.buffered.extend(lines);
        }
    }
}
