//! The node's side of the upgrade transaction: commit once the new version is up, revert when
//! it fails. Here machined gathers the facts and executes what `decision.rs` decides; the
//! bootloader backend does the writes (through the Disk trait, never mounting the ESP).

use slate_bootloader::{Bootloader, CommitOutcome, EfiVars, EfiVarsError, EntryStatus};
use slate_disk::FileDisk;
use slate_sequencer::error_chain;

use crate::base::node::Node;
use crate::settle::decision::{
    decide, BootFacts, Decision, Idle, LoaderFacts, Phase, Refusal, Upgrade, REVERT_COUNTED,
};
use crate::settle::SettleError;

/// The firmware's variables through efivarfs: read, and written when the backend asks (an
/// upgrade dropping a stale `LoaderEntryOneShot`/`LoaderEntryDefault`, a revert setting
/// `LoaderEntryDefault`, a reboot into one entry once).
#[derive(Debug)]
pub struct FirmwareVars;

impl EfiVars for FirmwareVars {
    fn get(&self, name: &str) -> Option<String> {
        slate_host::read_loader_string(name)
    }

    fn set(&mut self, name: &str, value: &str) -> Result<(), EfiVarsError> {
        slate_host::write_loader_string(name, value).map_err(|e| EfiVarsError {
            name: name.into(),
            reason: error_chain(&e),
        })
    }

    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError> {
        slate_host::remove_loader_var(name).map_err(|e| EfiVarsError {
            name: name.into(),
            reason: error_chain(&e),
        })
    }
}

/// The backend of the loader the system disk was installed with (systemd-boot or GRUB).
fn system_loader() -> Result<Box<dyn Bootloader>, String> {
    loader_over(|path| {
        crate::base::system_disk::esp_unmounted(path).map_err(std::io::Error::other)?;
        FileDisk::open(path)
    })
}

/// `entry` boots next, once: the loader's checks, then `LoaderEntryOneShot` written through
/// efivarfs. Returns the entry ID written.
pub fn boot_once(entry: &str) -> Result<String, slate_api::BackendError> {
    let mut loader = system_loader().map_err(slate_api::BackendError::Failed)?;
    loader.boot_once(entry).map_err(|e| match e {
        slate_bootloader::BootloaderError::EfiVars(e) => {
            slate_api::BackendError::Failed(e.to_string())
        }
        other => slate_api::BackendError::InvalidArgument(error_chain(&other)),
    })
}

/// [`system_loader`] over the disk opened read-only: for readers that must write nothing.
pub fn read_only_loader() -> Result<Box<dyn Bootloader>, String> {
    loader_over(|path| FileDisk::open_read_only(path))
}

fn loader_over(
    open: impl FnOnce(&std::path::Path) -> std::io::Result<FileDisk>,
) -> Result<Box<dyn Bootloader>, String> {
    let meta = crate::base::system_disk::meta_partition()?;
    let disk = open(&meta.disk).map_err(|e| format!("opening {}: {e}", meta.disk.display()))?;
    slate_bootloader::probe(disk, FirmwareVars).map_err(|e| error_chain(&e))
}

/// Why a rollback was not made: refused as asked (nothing to go back to, an upgrade pending),
/// or the boot loader could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackError {
    Refused(String),
    Failed(String),
}

/// `POST /v1/rollback`: the previous version on trial with the booted entry as its fallback
/// ([`Bootloader::rollback`]); with `dry_run`, the same checks and plan, nothing written.
pub fn rollback(
    node: &Node,
    tries: u32,
    dry_run: bool,
) -> Result<slate_bootloader::RollbackPlan, RollbackError> {
    let running = booted_entry(node).ok_or_else(|| {
        RollbackError::Refused(
            "the firmware did not say which entry booted (LoaderEntrySelected): nothing to \
             roll back from"
                .into(),
        )
    })?;
    let mut loader = system_loader().map_err(RollbackError::Failed)?;
    let outcome = if dry_run {
        loader.plan_rollback(&running, tries)
    } else {
        loader.rollback(&running, tries)
    };
    if let (false, Ok(plan)) = (dry_run, &outcome) {
        record_rollback(
            node,
            &node.version,
            &plan.version,
            "asked by hand (slate rollback)",
        );
    }
    outcome.map_err(|e| {
        let chain = format!("the rollback is refused: {}", error_chain(&e));
        match e {
            slate_bootloader::BootloaderError::Invalid(_)
            | slate_bootloader::BootloaderError::EntryNotFound(_)
            | slate_bootloader::BootloaderError::WouldNotBoot { .. } => {
                RollbackError::Refused(chain)
            }
            _ => RollbackError::Failed(chain),
        }
    })
}

/// `POST /v1/pins`: pin or unpin `version` on the system disk ([`Bootloader::pin`]); the
/// node's status follows what was written.
pub fn pin(
    node: &Node,
    version: &str,
    pin: bool,
    dry_run: bool,
) -> Result<slate_bootloader::PinOutcome, RollbackError> {
    let mut loader = system_loader().map_err(RollbackError::Failed)?;
    let outcome = loader.pin(version, pin, dry_run).map_err(|e| {
        let chain = error_chain(&e);
        match e {
            slate_bootloader::BootloaderError::Invalid(_) => RollbackError::Refused(chain),
            _ => RollbackError::Failed(chain),
        }
    })?;
    if !dry_run {
        *node.pinned.lock().unwrap_or_else(|p| p.into_inner()) = outcome.pinned.clone();
        if outcome.changed {
            node.journal.info(format_args!(
                "{} {version}; pinned now: {}",
                if pin { "pinned" } else { "unpinned" },
                if outcome.pinned.is_empty() {
                    "none".to_owned()
                } else {
                    outcome.pinned.join(", ")
                }
            ));
        }
    }
    Ok(outcome)
}

/// `GET /v1/boot`: the system disk's boot entries, with the firmware's variables.
pub fn explain() -> Result<serde_json::Value, String> {
    let explanation = system_loader()?.explain().map_err(|e| error_chain(&e))?;
    serde_json::to_value(explanation).map_err(|e| e.to_string())
}

/// The systemd-boot entry this boot started from, as machined reads it at its start:
/// `slate.entry=` on the kernel command line when a kexec started it (machined's kexec puts
/// it there), else `LoaderEntrySelected` — which, after a kexec, still names the entry the
/// firmware started before, so it must not be preferred.
pub fn booted_entry_at_start(
    cmdline: &str,
    loader_entry_selected: Option<String>,
) -> Option<String> {
    slate_bootloader::sdboot::entry_from_cmdline(cmdline).or(loader_entry_selected)
}

/// The entry that booted: the systemd-boot entry ([`booted_entry_at_start`]: `slate.entry=`
/// after a kexec, else `LoaderEntrySelected`), else the slot GRUB's menu entry names on the
/// kernel command line (`slate.slot=A`).
pub fn booted_entry(node: &Node) -> Option<String> {
    node.booted_entry.clone().or_else(|| {
        let cmdline = slate_host::kernel_cmdline().unwrap_or_default();
        slot_from_cmdline(&cmdline)
    })
}

/// `slate.slot=<label>` on a kernel command line.
fn slot_from_cmdline(cmdline: &str) -> Option<String> {
    cmdline
        .split_whitespace()
        .find_map(|arg| arg.strip_prefix("slate.slot="))
        .map(str::to_owned)
}

/// The facts, the backend to act through when it opened, and the entries that carried a boot
/// counter before any write (to name the one a commit renamed).
struct Gathered {
    facts: BootFacts,
    loader: Option<Box<dyn Bootloader>>,
    counted: Vec<String>,
    /// The entries as read before any write, to name the versions a rollback record names.
    entries: Vec<EntryStatus>,
}

fn gather(node: &Node, phase: Phase) -> Gathered {
    let booted_entry = booted_entry(node);
    let (loader, facts, counted, entries) = match system_loader() {
        Err(reason) => (
            None,
            LoaderFacts::Unavailable(reason),
            Vec::new(),
            Vec::new(),
        ),
        Ok(loader) => match loader.status() {
            Err(e) => (
                Some(loader),
                LoaderFacts::Unreadable(error_chain(&e)),
                Vec::new(),
                Vec::new(),
            ),
            Ok(status) => {
                let counted = status
                    .entries
                    .iter()
                    .filter(|e| e.file_name.contains('+'))
                    .map(|e| e.file_name.clone())
                    .collect();
                let facts = LoaderFacts::Read {
                    upgrade_marker: status.upgrade_tag.clone(),
                    default_entry: status.selected_file().map(str::to_owned),
                };
                (Some(loader), facts, counted, status.entries)
            }
        },
    };
    Gathered {
        facts: BootFacts {
            phase,
            booted_entry,
            loader: facts,
        },
        loader,
        counted,
        entries,
    }
}

/// Settle the upgrade transaction: at stage Running (`phase` carrying the health verdict)
/// commit a healthy boot, on a fatal error revert a pending upgrade — as [`decide`] says, from
/// the facts gathered here. What was done is logged (`committed: …`, `upgrade reverted: …`);
/// what could not be done is returned. Nothing is written when there is nothing to do. The
/// loader is read even after a failed health check, so the facts are whole before anything is
/// decided; reading writes nothing.
pub fn settle(node: &Node, phase: Phase) -> Result<(), SettleError> {
    if let Some(root) = &node.snapshot_root {
        return crate::settle::snapshot::settle(node, root, phase);
    }
    let Gathered {
        facts,
        loader,
        counted,
        entries,
    } = gather(node, phase);
    // `decide` asks for a write only once the loader was read, which means it opened.
    let loader =
        || loader.ok_or_else(|| SettleError::Failed("no boot loader to act through".into()));
    match decide(&facts) {
        Decision::Nothing(Idle::AlreadyCommitted) => {
            // Every boot of a committed version; on a systemd image also the first boot after
            // an install, whose counter systemd-bless-boot dropped before machined looked.
            node.journal.info(format_args!(
                "nothing to commit: {} is blessed and no upgrade is pending",
                facts.booted_entry.as_deref().unwrap_or("the booted entry")
            ));
            Ok(())
        }
        Decision::Nothing(Idle::NoUpgradePending) => Ok(()),
        Decision::Refuse(Refusal::Unhealthy(report)) => Err(SettleError::Unhealthy(report)),
        Decision::Refuse(refusal) => Err(SettleError::Failed(refusal.to_string())),
        Decision::Commit { entry, upgrade } => {
            commit(node, loader()?, &entry, &counted).map_err(SettleError::Failed)?;
            node.journal.count(upgrade.counted());
            if let Upgrade::AlreadyFailed { .. } = upgrade {
                if let Some(failed) = failed_version(&entries, &entry, &node.version) {
                    let reason = match failure_reason(node, &failed) {
                        Some(reason) => reason,
                        None => {
                            // Nothing of that version ran to say why (its kernel never started,
                            // or init failed, or it hung): status still names it.
                            let reason = format!("{failed} did not come up in its boot tries");
                            if let Err(err) = record_failure_of(node, &failed, &reason) {
                                node.journal.error(format_args!(
                                    "cannot record {failed}'s failure in META: {err}"
                                ));
                            }
                            reason
                        }
                    };
                    record_rollback(node, &failed, &node.version, &reason);
                }
            }
            Ok(())
        }
        Decision::Revert { failed, to } => {
            revert(node, loader()?, &failed).map_err(SettleError::Failed)?;
            node.journal.count(REVERT_COUNTED);
            let to = version_of(&entries, &to).unwrap_or(to);
            let reason =
                failure_reason(node, &node.version).unwrap_or_else(|| "its boot failed".to_owned());
            record_rollback(node, &node.version, &to, &reason);
            Ok(())
        }
        Decision::KeepFallback { entry: failed } | Decision::DropEmptyMarker { failed } => {
            revert(node, loader()?, &failed).map_err(SettleError::Failed)
        }
    }
}

/// The version of the entry `reference` names (a file name, an entry ID or a GRUB slot).
fn version_of(entries: &[EntryStatus], reference: &str) -> Option<String> {
    entries
        .iter()
        .find(|e| {
            e.file_name == reference
                || slate_bootspec::EntryName::parse(&e.file_name).is_ok_and(|name| {
                    slate_bootspec::refers_to(&slate_bootspec::Entry::new(name), reference)
                })
        })
        .and_then(|e| e.version.clone())
}

/// When boot counting (or GRUB's one-shot) brought the fallback back: the version that did not
/// come up — another version than the running one, marked bad if any is, the newest first.
fn failed_version(entries: &[EntryStatus], booted: &str, running_version: &str) -> Option<String> {
    let booted_version = version_of(entries, booted);
    entries
        .iter()
        .filter_map(|e| Some((e.version.as_deref()?, e.state)))
        .filter(|(v, _)| *v != running_version && Some(*v) != booted_version.as_deref())
        .max_by(|(a, sa), (b, sb)| {
            let bad = |s: &slate_bootspec::BootState| *s == slate_bootspec::BootState::Bad;
            bad(sa)
                .cmp(&bad(sb))
                .then_with(|| slate_bootspec::compare_versions(a, b))
        })
        .map(|(v, _)| v.to_owned())
}

/// The reason `version` failed, when the node's failure record names it.
fn failure_reason(node: &Node, version: &str) -> Option<String> {
    node.last_failure
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .filter(|f| f.version == version)
        .map(|f| f.reason.clone())
}

/// Bless the booted entry and drop the marker; the backend knows how for its loader.
fn commit(
    node: &Node,
    mut loader: Box<dyn Bootloader>,
    entry: &str,
    counted: &[String],
) -> Result<(), String> {
    let outcome = loader.commit(entry).map_err(|e| error_chain(&e))?;
    let after = loader.status().map_err(|e| error_chain(&e))?;
    let after: Vec<String> = after.entries.into_iter().map(|e| e.file_name).collect();
    node.journal
        .info(committed_line(counted, &after, entry, &outcome));
    Ok(())
}

/// `committed: <entry as it was named before> blessed as <its name now>[; upgrade marker
/// (fallback <previous>) dropped]` — the line the VM tests wait for.
fn committed_line(
    counted_before: &[String],
    entries_after: &[String],
    entry: &str,
    outcome: &CommitOutcome,
) -> String {
    let renamed = counted_before
        .iter()
        .find(|c| !entries_after.contains(c))
        .map(String::as_str);
    // Counted when the firmware started it, but no longer when machined looked: renamed
    // before this commit (systemd-bless-boot on a systemd image, or an earlier commit cut off
    // before it dropped the marker).
    let how = match renamed {
        None if entry != outcome.blessed => "already blessed as",
        _ => "blessed as",
    };
    format!(
        "committed: {} {how} {}{}",
        renamed.unwrap_or(entry),
        outcome.blessed,
        match &outcome.previous {
            Some(previous) => format!("; upgrade marker (fallback {previous}) dropped"),
            None => String::new(),
        }
    )
}

/// Return to the marker's entry (the backend marks the failed entry bad, or keeps a failing
/// fallback, and deletes the marker).
fn revert(node: &Node, mut loader: Box<dyn Bootloader>, failed: &str) -> Result<(), String> {
    if let Some(label) = loader.revert(failed).map_err(|e| error_chain(&e))? {
        node.journal
            .info(format_args!("upgrade reverted: the next boot is {label}"));
    }
    Ok(())
}

/// Remember in META which version failed and why; the next boot reports it in its status.
pub fn record_failure(node: &Node, reason: &str) -> Result<(), String> {
    record_failure_of(node, &node.version, reason)
}

/// [`record_failure`] of `version`, which need not be the running one.
fn record_failure_of(node: &Node, version: &str, reason: &str) -> Result<(), String> {
    *node.last_failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(slate_api::Failure {
        version: version.to_owned(),
        reason: reason.to_owned(),
    });
    let json = failure_record(version, reason).map_err(|e| e.to_string())?;
    write_meta_value(slate_meta::tags::LAST_BOOT_FAILURE, json.into_bytes())
}

/// Remember in META the return to an older version; the version returned to reports it as
/// `last_rollback`. Failing to write it loses only the report, never the rollback itself.
fn record_rollback(node: &Node, from: &str, to: &str, reason: &str) {
    let record = slate_api::RollbackRecord {
        from: from.to_owned(),
        to: to.to_owned(),
        reason: reason.chars().take(3000).collect(),
        time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let written = serde_json::to_vec(&record)
        .map_err(|e| e.to_string())
        .and_then(|json| write_meta_value(slate_meta::tags::LAST_ROLLBACK, json));
    match written {
        Ok(()) => node.journal.info(format_args!(
            "rollback recorded: {from} -> {to}: {}",
            record.reason
        )),
        Err(err) => node
            .journal
            .error(format_args!("cannot record the rollback in META: {err}")),
    }
    *node.last_rollback.lock().unwrap_or_else(|p| p.into_inner()) = Some(record);
}

/// Set one META value and flush.
pub fn write_meta_value(tag: u8, value: Vec<u8>) -> Result<(), String> {
    // Through the whole disk, as the boot loader backend reads and rewrites META
    // (`system_disk::open_meta_on` says why), over rotted copies if need be.
    let mut store = crate::base::system_disk::open_meta(true)?;
    store.set(tag, value).map_err(|e| error_chain(&e))?;
    store.flush().map_err(|e| error_chain(&e))
}

/// META's `LastBootFailure` value: `{"version":…,"reason":…}`.
fn failure_record(version: &str, reason: &str) -> Result<String, serde_json::Error> {
    let record = |reason: String| {
        serde_json::to_string(&slate_api::Failure {
            version: version.to_owned(),
            reason,
        })
    };
    let json = record(reason.to_owned())?;
    // META values travel through fixed-size records: keep the reason to a sane length.
    if json.len() > 4096 {
        return record(reason.chars().take(3000).collect());
    }
    Ok(json)
}

#[cfg(test)]
#[path = "transaction_tests.rs"]
mod tests;
