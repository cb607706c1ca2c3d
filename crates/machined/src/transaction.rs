//! The node's side of the upgrade transaction: commit once the new version is up, revert when
//! it fails. Here machined gathers the facts and executes what `decision.rs` decides; the
//! bootloader backend does the writes (through the Disk trait, never mounting the ESP).

use slate_bootloader::{Bootloader, CommitOutcome, EfiVars, EfiVarsError};
use slate_disk::FileDisk;
use slate_sequencer::error_chain;

use super::decision::{decide, BootFacts, Decision, LoaderFacts, Phase, Refusal};
use super::node::Node;

/// The firmware's variables as efivarfs shows them. Reading is all the systemd-boot backend
/// needs for slate's own flows (the loader.conf glob does the flipping); a write it would ask
/// for fails with a clear error rather than being dropped.
#[derive(Debug)]
pub struct FirmwareVars;

impl EfiVars for FirmwareVars {
    fn get(&self, name: &str) -> Option<String> {
        slate_host::read_loader_string(name)
    }

    fn set(&mut self, name: &str, _value: &str) -> Result<(), EfiVarsError> {
        Err(EfiVarsError {
            name: name.into(),
            reason: "machined does not write EFI variables".into(),
        })
    }

    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError> {
        if slate_host::read_loader_string(name).is_none() {
            return Ok(());
        }
        Err(EfiVarsError {
            name: name.into(),
            reason: "machined does not write EFI variables".into(),
        })
    }
}

/// The backend of the loader the system disk was installed with (systemd-boot or GRUB).
fn system_loader() -> Result<Box<dyn Bootloader>, String> {
    let meta = crate::system_disk::meta_partition()?;
    let disk =
        FileDisk::open(&meta.disk).map_err(|e| format!("opening {}: {e}", meta.disk.display()))?;
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

/// `GET /v1/boot`: the system disk's boot entries, with the firmware's variables.
pub fn explain() -> Result<serde_json::Value, String> {
    let explanation = system_loader()?.explain().map_err(|e| error_chain(&e))?;
    serde_json::to_value(explanation).map_err(|e| e.to_string())
}

/// The entry that booted: `LoaderEntrySelected` (systemd-boot), else the slot GRUB's menu entry
/// names on the kernel command line (`slate.slot=A`).
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

/// Why the transaction could not be settled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettleError {
    /// A health check failed (its report): the boot is not committed.
    #[error("{0}")]
    Unhealthy(String),
    /// The loader could not be read or written, or the facts were incomplete.
    #[error("{0}")]
    Failed(String),
}

/// The facts, the backend to act through when it opened, and the entries that carried a boot
/// counter before any write (to name the one a commit renamed).
struct Gathered {
    facts: BootFacts,
    loader: Option<Box<dyn Bootloader>>,
    counted: Vec<String>,
}

fn gather(node: &Node, phase: Phase) -> Gathered {
    let booted_entry = booted_entry(node);
    let (loader, facts, counted) = match system_loader() {
        Err(reason) => (None, LoaderFacts::Unavailable(reason), Vec::new()),
        Ok(loader) => match loader.status() {
            Err(e) => (
                Some(loader),
                LoaderFacts::Unreadable(error_chain(&e)),
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
                (Some(loader), facts, counted)
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
    }
}

/// Settle the upgrade transaction: at stage Running (`phase` carrying the health verdict)
/// commit a healthy boot, on a fatal error revert a pending upgrade — as [`decide`] says, from
/// the facts gathered here. What was done is logged (`committed: …`, `upgrade reverted: …`);
/// what could not be done is returned. Nothing is written when there is nothing to do. The
/// loader is read even after a failed health check, so the facts are whole before anything is
/// decided; reading writes nothing.
pub fn settle(node: &Node, phase: Phase) -> Result<(), SettleError> {
    let Gathered {
        facts,
        loader,
        counted,
    } = gather(node, phase);
    // `decide` asks for a write only once the loader was read, which means it opened.
    let loader =
        || loader.ok_or_else(|| SettleError::Failed("no boot loader to act through".into()));
    match decide(&facts) {
        Decision::Nothing(_) => Ok(()),
        Decision::Refuse(Refusal::Unhealthy(report)) => Err(SettleError::Unhealthy(report)),
        Decision::Refuse(refusal) => Err(SettleError::Failed(refusal.to_string())),
        Decision::Commit { entry, .. } => {
            commit(node, loader()?, &entry, &counted).map_err(SettleError::Failed)
        }
        Decision::Revert { failed, .. }
        | Decision::KeepFallback { entry: failed }
        | Decision::DropEmptyMarker { failed } => {
            revert(node, loader()?, &failed).map_err(SettleError::Failed)
        }
    }
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
        .map_or(entry, String::as_str);
    format!(
        "committed: {renamed} blessed as {}{}",
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
    // Through the whole disk, as the boot loader backend reads and rewrites META: the two block
    // devices (disk and partition) have separate page caches, and a revert that had read META
    // through the disk earlier would write the stale copy back over this record.
    let part = crate::system_disk::meta_partition()?;
    let disk =
        FileDisk::open(&part.disk).map_err(|e| format!("opening {}: {e}", part.disk.display()))?;
    let view = slate_layout::open_partition(disk, crate::system_disk::META_LABEL)
        .map_err(|e| error_chain(&e))?;
    let mut store = slate_meta::MetaStore::open(view).map_err(|e| error_chain(&e))?;
    // As in system_disk::open_meta_on: the record of a failure must not be lost to rot.
    store.overwrite_unrecognized();
    let json = failure_record(&node.version, reason).map_err(|e| e.to_string())?;
    store
        .set(slate_meta::tags::LAST_BOOT_FAILURE, json.into_bytes())
        .map_err(|e| error_chain(&e))?;
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
mod tests {
    use super::*;

    fn outcome(blessed: &str, previous: Option<&str>) -> CommitOutcome {
        CommitOutcome {
            blessed: blessed.into(),
            previous: previous.map(str::to_owned),
        }
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn the_slot_comes_from_the_kernel_command_line() {
        let cmdline = "BOOT_IMAGE=/A/vmlinuz console=ttyS0 slate.slot=B quiet";
        assert_eq!(slot_from_cmdline(cmdline).as_deref(), Some("B"));
        assert_eq!(slot_from_cmdline("console=ttyS0 panic=0"), None);
        // A prefix of the key is another key.
        assert_eq!(slot_from_cmdline("xslate.slot=A"), None);
    }

    #[test]
    fn a_commit_names_the_counted_entry_it_renamed() {
        let before = names(&["slate-2.0.0+2-1.efi"]);
        let after = names(&["slate-1.0.0.efi", "slate-2.0.0.efi"]);
        assert_eq!(
            committed_line(
                &before,
                &after,
                "slate-2.0.0+2-1.efi",
                &outcome("slate-2.0.0.efi", Some("slate-1.0.0.efi"))
            ),
            "committed: slate-2.0.0+2-1.efi blessed as slate-2.0.0.efi; \
             upgrade marker (fallback slate-1.0.0.efi) dropped"
        );
    }

    #[test]
    fn a_commit_that_renamed_nothing_names_the_booted_entry() {
        // GRUB: slots are never renamed, and no upgrade was pending.
        let slots = names(&["A", "B"]);
        assert_eq!(
            committed_line(&[], &slots, "A", &outcome("A", None)),
            "committed: A blessed as A"
        );
        // A counted entry that is still there was not the one blessed.
        let still = names(&["slate-3.0.0+0-3.efi"]);
        assert_eq!(
            committed_line(&still, &still, "B", &outcome("B", Some("A"))),
            "committed: B blessed as B; upgrade marker (fallback A) dropped"
        );
    }

    #[test]
    fn the_failure_record_is_the_api_failure_as_json() {
        let json = failure_record("2.0.0", "health check `file /x` failed").unwrap();
        assert_eq!(
            serde_json::from_str::<slate_api::Failure>(&json).unwrap(),
            slate_api::Failure {
                version: "2.0.0".into(),
                reason: "health check `file /x` failed".into()
            }
        );
    }

    #[test]
    fn a_long_failure_reason_is_cut_to_fit_meta() {
        let reason = "x".repeat(5000);
        let json = failure_record("2.0.0", &reason).unwrap();
        assert!(json.len() <= 4096, "{}", json.len());
        let failure: slate_api::Failure = serde_json::from_str(&json).unwrap();
        assert_eq!(failure.reason, "x".repeat(3000));
        // Cut by characters, never inside one.
        let failure: slate_api::Failure =
            serde_json::from_str(&failure_record("2.0.0", &"é".repeat(5000)).unwrap()).unwrap();
        assert_eq!(failure.reason, "é".repeat(3000));
        // Below the limit it is kept whole.
        let reason = "x".repeat(4000);
        let failure: slate_api::Failure =
            serde_json::from_str(&failure_record("2.0.0", &reason).unwrap()).unwrap();
        assert_eq!(failure.reason, reason);
    }

    #[test]
    fn machined_refuses_to_write_efi_variables() {
        let mut vars = FirmwareVars;
        let err = vars
            .set("LoaderEntryDefault", "slate-1.0.0.efi")
            .unwrap_err();
        assert_eq!(err.name, "LoaderEntryDefault");
        assert_eq!(err.reason, "machined does not write EFI variables");
        // Removing what is not there is no write.
        assert!(vars.remove("SlateNoSuchVariableForTests").is_ok());
    }

    #[test]
    fn settle_errors_display_their_reason() {
        assert_eq!(
            SettleError::Unhealthy("check x".into()).to_string(),
            "check x"
        );
        assert_eq!(SettleError::Failed("no META".into()).to_string(), "no META");
    }
}
