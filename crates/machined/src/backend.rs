//! The node API's view of machined: queries read the node's state; mutating calls take the
//! sequence lock here (so a refusal is answered at once) and hand the guard to the main loop.

use std::collections::VecDeque;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use slate_api::{
    BackendError, EventStream, LineStream, MemoryUse, NodeBackend, PinRequest, PinResult,
    RollbackRequest, RollbackResult, Status, UpgradeRequest, UploadedBundle, VersionInfo,
};
use slate_sequencer::{Capabilities, LockError, RebootMode, SequenceKind};

use crate::base::journal::Journal;
use crate::base::node::{Node, Request};
use crate::boot::upgrade;

mod image_summary;
pub mod snapshots;

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

impl Backend {
    /// `POST /v1/upgrade` with a pinned registry reference (the rollout operator's order):
    /// the lock is taken now, so the answer means the node took it; the pull and the checks
    /// run after the answer, and a failure there is the node's last failure for that version
    /// (what the operator watches for), the lock then given back.
    fn upgrade_from_registry(&self, req: UpgradeRequest) -> Result<(), BackendError> {
        let pinned = upgrade::pull::pinned(&req.image).map_err(|e| {
            BackendError::InvalidArgument(format!(
                "{e}; or upload the bundle first (POST /v1/bundles, or `slate upgrade --image …`) \
                 and name it as {}<id>",
                upgrade::BUNDLE_SCHEME
            ))
        })?;
        if req.stage || req.allow_downgrade {
            return Err(BackendError::InvalidArgument(
                "a registry upgrade is immediate and forward only (stage or downgrade from an \
                 uploaded bundle)"
                    .into(),
            ));
        }
        // Checked now, while the caller still gets the refusal: the pull runs after the answer.
        let tries = upgrade::requested_tries(&req)?;
        crate::boot::replace::check_request(&req)?;
        let options = slate_transport::Options {
            insecure: self.0.machine.current().is_some_and(|c| c.update.insecure),
            ..slate_transport::Options::default()
        };
        let guard = self
            .0
            .lock
            .try_lock(SequenceKind::Upgrade)
            .map_err(locked)?;
        let node = self.0.clone();
        node.journal.info(format_args!(
            "upgrade to {} requested: pulling {}",
            pinned.version, req.image
        ));
        let spawned = std::thread::Builder::new()
            .name("registry-upgrade".into())
            .spawn(
                move || match upgrade::pull::pull(&node, &pinned, &options) {
                    Ok((mut plan, moved)) => {
                        node.journal.info(format_args!(
                            "{} pulled and verified ({moved})",
                            pinned.version
                        ));
                        plan.tries = tries;
                        plan.reboot = req.reboot_mode;
                        plan.replace = req.replace;
                        if let Err(err) = node.request(Request::Upgrade(plan, guard)) {
                            node.journal
                                .error(format_args!("upgrade to {}: {err}", pinned.version));
                        }
                    }
                    Err(reason) => {
                        node.journal.error(format_args!(
                            "upgrade to {} refused: {reason}",
                            pinned.version
                        ));
                        *node.last_failure.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(slate_api::Failure {
                                version: pinned.version.clone(),
                                reason: format!("pulling {}: {reason}", req.image),
                            });
                        drop(guard);
                    }
                },
            );
        spawned
            .map(drop)
            .map_err(|e| BackendError::Failed(format!("cannot start the pull: {e}")))
    }
}

impl Backend {
    /// `rollback` itself (the trait's method counts its outcome).
    fn rollback_now(&self, req: RollbackRequest) -> Result<RollbackResult, BackendError> {
        self.require(Capabilities::UPGRADE, "rollback")?;
        let tries = slate_bootspec::check_install_tries(
            req.tries.unwrap_or(slate_bootspec::DEFAULT_INSTALL_TRIES),
        )
        .map_err(|e| BackendError::InvalidArgument(format!("the rollback is refused: {e}")))?;
        let guard = self.0.lock.try_lock(SequenceKind::Reboot).map_err(locked)?;
        let plan = crate::settle::transaction::rollback(&self.0, tries, req.dry_run).map_err(
            |e| match e {
                crate::settle::transaction::RollbackError::Refused(why) => {
                    BackendError::InvalidArgument(why)
                }
                crate::settle::transaction::RollbackError::Failed(why) => BackendError::Failed(why),
            },
        )?;
        let result = RollbackResult {
            from: plan.from,
            to: plan.to_on_trial,
            version: plan.version,
            dry_run: req.dry_run,
        };
        if req.dry_run {
            return Ok(result);
        }
        self.0.journal.info(format_args!(
            "rollback to {} requested: {} boots next on trial, {} recorded to return to; rebooting",
            result.version, result.to, result.from
        ));
        self.0
            .request(Request::Reboot(req.reboot_mode, guard))
            .map_err(BackendError::Failed)?;
        Ok(result)
    }
}

impl NodeBackend for Backend {
    fn version(&self) -> VersionInfo {
        VersionInfo {
            version: self.0.version.clone(),
            arch: slate_bundle::NATIVE_ARCH.into(),
            booted_entry: self.0.booted_entry.clone(),
            kernel: self.0.kernel.clone(),
        }
    }

    fn status(&self) -> Status {
        Status {
            boot_id: self.0.boot_id.clone(),
            committed: self.0.is_committed(),
            last_rollback: self
                .0
                .last_rollback
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            pinned: self
                .0
                .pinned
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            secure_boot: crate::boot::secure_boot::status(),
            var: self.0.var.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            boot_times: Some(self.0.journal.boot.times()),
            memory: slate_host::resident_kib().ok().map(|rss_kib| MemoryUse {
                rss_kib,
                journal_bytes: self.0.journal.held_bytes() as u64,
            }),
            version: self.0.version.clone(),
            booted_entry: self.0.booted_entry.clone(),
            stage: self.0.stage(),
            running_sequence: self.0.running_sequence().map(|k| k.to_string()),
            mode: self.0.mode,
            staged_image: None,
            last_failure: self
                .0
                .last_failure
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            warnings: self
                .0
                .machine
                .current()
                .map(|c| crate::boot::machine::warnings(&c))
                .unwrap_or_default(),
            node_name: self.0.machine.current().map(|c| c.node.name),
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned()),
            machine_id: crate::boot::machine::read_machine_id(),
            agent: self
                .0
                .agent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        }
    }

    fn boot_explain(&self) -> Result<serde_json::Value, BackendError> {
        crate::settle::transaction::explain().map_err(BackendError::Failed)
    }

    fn services(&self) -> Result<slate_api::ServicesView, BackendError> {
        let services = self.0.services.get().map(|s| s.list()).unwrap_or_default();
        Ok(slate_api::ServicesView { services })
    }

    /// A stop waits for the service's processes to be gone (its grace period at most), on a
    /// blocking thread of the server's pool like every backend call.
    fn control_service(
        &self,
        req: slate_api::ServiceControlRequest,
    ) -> Result<slate_api::NodeServiceStatus, BackendError> {
        let services = self.0.services.get().ok_or_else(|| {
            BackendError::InvalidArgument(format!("this node runs no service {:?}", req.name))
        })?;
        let status = services
            .control(&req.name, req.action)
            .map_err(BackendError::InvalidArgument)?;
        self.0.journal.info(format_args!(
            "service {}: {:?} asked over the API; now {}",
            req.name, req.action, status.state
        ));
        Ok(status)
    }

    fn snapshot_list(&self) -> Result<serde_json::Value, BackendError> {
        snapshots::list(&self.0)
    }

    /// Under the upgrade lock; the reboot (if asked) follows the answer like any other.
    fn snapshot_upgrade(
        &self,
        req: slate_api::SnapshotUpgradeRequest,
    ) -> Result<serde_json::Value, BackendError> {
        let guard = self
            .0
            .lock
            .try_lock(SequenceKind::Upgrade)
            .map_err(locked)?;
        self.0.journal.info(format_args!(
            "snapshot upgrade requested: `{}`",
            req.command.chars().take(256).collect::<String>()
        ));
        let report = snapshots::upgrade(&self.0, &req)?;
        drop(guard);
        if req.reboot && !req.dry_run {
            let guard = self.0.lock.try_lock(SequenceKind::Reboot).map_err(locked)?;
            self.0
                .request(Request::Reboot(RebootMode::Default, guard))
                .map_err(BackendError::Failed)?;
        }
        Ok(report)
    }

    fn image_summary(&self) -> Result<serde_json::Value, BackendError> {
        self.require(Capabilities::UPGRADE, "describing the running image")?;
        image_summary::image_summary(&self.0)
    }

    fn show_config(&self) -> Result<slate_api::ConfigView, BackendError> {
        crate::boot::machine::show(&self.0)
    }

    fn apply_config(
        &self,
        req: slate_api::ApplyConfigRequest,
    ) -> Result<slate_api::ApplyConfigResult, BackendError> {
        crate::boot::machine::apply(&self.0, req)
    }

    fn reboot(&self, mode: RebootMode) -> Result<(), BackendError> {
        self.require(Capabilities::REBOOT, "reboot")?;
        let guard = self.0.lock.try_lock(SequenceKind::Reboot).map_err(locked)?;
        self.0
            .request(Request::Reboot(mode, guard))
            .map_err(BackendError::Failed)
    }

    /// The variable is written here, under the reboot lock, so that the answer says whether it
    /// was; the reboot follows the answer like any other.
    fn reboot_once_into(&self, entry: &str, mode: RebootMode) -> Result<(), BackendError> {
        self.require(Capabilities::REBOOT, "reboot")?;
        if self.0.snapshot_root.is_some() {
            return Err(BackendError::Unsupported(
                "a snapshot root boots its snapshots' entries; `slate snapshot rollback` puts \
                 the previous one on trial"
                    .into(),
            ));
        }
        let guard = self.0.lock.try_lock(SequenceKind::Reboot).map_err(locked)?;
        let id = crate::settle::transaction::boot_once(entry)?;
        self.0.journal.info(format_args!(
            "{id} boots next, once (LoaderEntryOneShot written); rebooting"
        ));
        self.0
            .request(Request::Reboot(mode, guard))
            .map_err(BackendError::Failed)
    }

    /// The loader's writes are made here, under the reboot lock, so that the answer says what
    /// boots next; the reboot follows the answer like any other.
    fn rollback(&self, req: RollbackRequest) -> Result<RollbackResult, BackendError> {
        let dry_run = req.dry_run;
        let result = self.rollback_now(req);
        if !dry_run {
            let outcome = if result.is_ok() { "done" } else { "failed" };
            let journal = &self.0.journal;
            journal.not_kept(journal.counters.rollback(outcome));
        }
        result
    }

    fn metrics(&self) -> slate_api::NodeMetrics {
        let journal = &self.0.journal;
        let cpu = slate_host::process_cpu_time().ok();
        journal
            .counters
            .snapshot(journal.dropped(), cpu.map(|t| t.as_secs_f64()))
    }

    fn pin(&self, req: PinRequest) -> Result<PinResult, BackendError> {
        self.require(Capabilities::UPGRADE, "pin")?;
        // Under the reboot lock: not while an upgrade writes the ESP or a reboot is under way.
        let _guard = self.0.lock.try_lock(SequenceKind::Reboot).map_err(locked)?;
        let outcome = crate::settle::transaction::pin(&self.0, &req.version, req.pin, req.dry_run)
            .map_err(|e| match e {
                crate::settle::transaction::RollbackError::Refused(why) => {
                    BackendError::InvalidArgument(why)
                }
                crate::settle::transaction::RollbackError::Failed(why) => BackendError::Failed(why),
            })?;
        Ok(PinResult {
            pinned: outcome.pinned,
            changed: outcome.changed,
            dry_run: req.dry_run,
        })
    }

    /// The same request as the power button's, but refused while a sequence runs (an API
    /// call does not take an upgrade over).
    fn shutdown(&self) -> Result<(), BackendError> {
        self.require(Capabilities::REBOOT, "shutdown")?;
        let guard = self
            .0
            .lock
            .try_lock(SequenceKind::Shutdown)
            .map_err(locked)?;
        self.0.journal.info(format_args!("shutdown requested"));
        self.0
            .request(Request::Reboot(RebootMode::PowerOff, guard))
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
        if !req.image.starts_with(upgrade::BUNDLE_SCHEME) {
            return self.upgrade_from_registry(req);
        }
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
            // A batch at a time: a follower copies at most 64 lines (of at most 4 KiB) out of
            // the journal, not the whole ring.
            let (lines, next) = self.journal.read_some(self.next, wait, 64);
            self.next = next;
            if lines.is_empty() && !self.follow {
                return None;
            }
            self.buffered.extend(lines);
        }
    }
}

#[cfg(test)]
mod tests;
