//! Upgrade by replacement (`POST /v1/upgrade` with `replace`, the rollout operator's strategy
//! `replace`): the new version is installed beside the running one exactly as in place, and
//! its first boot starts from fresh data partitions — STATE and EPHEMERAL formatted, so a new
//! node key, a new machine-id, an empty /var — with the node's machine configuration put back.
//!
//! The order, each step safe to repeat after a power cut (docs/formats.md §3, `ReplaceOnBoot`):
//! 1. before the installer runs, META `ReplaceOnBoot` = the target version and the
//!    configuration document as stored (every in-place upgrade deletes a leftover one here, so
//!    a replacement whose install failed can never wipe a later in-place upgrade's boot);
//! 2. at a boot of that version: the heads of STATE and EPHEMERAL zeroed (the volumes phase
//!    then formats them as on a first boot), the configuration stored, and only then the tag
//!    deleted; a boot of any other version deletes the tag untouched (the install or the new
//!    version failed, and the old version keeps its data).

use std::path::{Path, PathBuf};

use slate_api::BackendError;
use slate_meta::replace::{parse_replace, ReplaceOnBoot};
use slate_meta::tags::REPLACE_ON_BOOT;
use slate_sequencer::{error_chain as chain, Task, TaskContext, TaskError};

use crate::base::node::{Node, UpgradePlan};
use crate::base::paths::state_dir;
use crate::base::task::{failed, task};
use crate::boot::volumes::wipe_head;

/// `replace` is immediate: a staged upgrade runs from the Install sequence, before the volumes
/// a replacement would wipe are even found.
pub fn check_request(req: &slate_api::UpgradeRequest) -> Result<(), BackendError> {
    if req.replace && req.stage {
        return Err(BackendError::InvalidArgument(
            "the upgrade is refused: replace cannot be staged (it is immediate)".into(),
        ));
    }
    Ok(())
}

/// The replace phase's tasks: the heads of STATE and EPHEMERAL zeroed, concurrently.
pub fn wipe_tasks(node: &Node, disk: Option<PathBuf>) -> Vec<Task<'_>> {
    let other = disk.clone();
    vec![
        task(node, "wipeState", move |ctx| {
            wipe_head(ctx, "STATE", disk.as_deref())
        }),
        task(node, "wipeEphemeral", move |ctx| {
            wipe_head(ctx, "EPHEMERAL", other.as_deref())
        }),
    ]
}

/// The restore phase's task (none without a replacement).
pub fn restore_tasks(node: &Node, record: Option<ReplaceOnBoot>) -> Vec<Task<'_>> {
    record
        .map(|record| task(node, "restoreConfig", move |ctx| restore(ctx, &record)))
        .into_iter()
        .collect()
}

/// What a boot does with the `ReplaceOnBoot` value META holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AtBoot {
    /// No replacement waits.
    Nothing,
    /// This boot is the replacement's: wipe, restore this record's configuration.
    Replace(ReplaceOnBoot),
    /// A value to delete without acting on it, and why.
    Drop(String),
}

/// Decide, from the tag's value and the booted version, what this boot does.
pub fn at_boot(value: Option<&[u8]>, booted_version: &str) -> AtBoot {
    let Some(value) = value else {
        return AtBoot::Nothing;
    };
    match parse_replace(value) {
        Ok(record) if record.version == booted_version => AtBoot::Replace(record),
        Ok(record) => AtBoot::Drop(format!(
            "the replacement by {} did not boot (this is {booted_version}): its data \
             partitions are kept",
            record.version
        )),
        Err(err) => AtBoot::Drop(format!("META ReplaceOnBoot is not readable: {err}")),
    }
}

/// Step 1, before the installer: record the replacement (with the configuration read from
/// STATE), or delete a leftover record for an in-place upgrade. Returns what to log, if
/// anything was written.
pub fn record_before_install(plan: &UpgradePlan) -> Result<Option<String>, String> {
    let mut store = crate::base::system_disk::open_meta(true)?;
    if !plan.replace {
        if store.get(REPLACE_ON_BOOT).is_none() {
            return Ok(None);
        }
        store.delete(REPLACE_ON_BOOT);
        store.flush().map_err(|e| chain(&e))?;
        return Ok(Some(
            "an earlier replacement's META record was deleted: this upgrade is in place".into(),
        ));
    }
    let config = read_config(&state_dir())?;
    let record = ReplaceOnBoot::new(&plan.version, &config).map_err(|e| e.to_string())?;
    store
        .set(REPLACE_ON_BOOT, record.to_bytes())
        .map_err(|e| chain(&e))?;
    store.flush().map_err(|e| chain(&e))?;
    Ok(Some(format!(
        "replacement recorded in META: {}'s first boot formats STATE and EPHEMERAL and restores \
         the machine configuration ({} bytes)",
        plan.version,
        config.len()
    )))
}

/// The stored configuration document verbatim; empty when the node has none.
fn read_config(state: &Path) -> Result<String, String> {
    let path = state.join(slate_machine_config::STATE_PATH);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("reading {}: {e}", path.display())),
    }
}

/// Step 2's end, once STATE is formatted and mounted: store the configuration, then delete
/// the tag.
pub fn restore(ctx: &TaskContext<'_>, record: &ReplaceOnBoot) -> Result<(), TaskError> {
    restore_into(&state_dir(), record).map_err(failed)?;
    let mut store = crate::base::system_disk::open_meta(true).map_err(failed)?;
    store.delete(REPLACE_ON_BOOT);
    store.flush().map_err(|e| failed(chain(&e)))?;
    ctx.log(&if record.config.is_empty() {
        "replaced: STATE and EPHEMERAL formatted afresh; there was no machine configuration to \
         restore"
            .to_owned()
    } else {
        format!(
            "replaced: STATE and EPHEMERAL formatted afresh, the machine configuration restored \
             ({} bytes)",
            record.config.len()
        )
    });
    Ok(())
}

fn restore_into(state: &Path, record: &ReplaceOnBoot) -> Result<(), String> {
    if record.config.is_empty() {
        return Ok(());
    }
    let path = state.join(slate_machine_config::STATE_PATH);
    crate::base::files::write_atomically(&path, record.config.as_bytes(), 0o600)
        .map_err(|e| format!("restoring {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_version_replaces_and_anything_else_is_dropped() {
        let value = b"2.0.0\nversion = 1\n";
        assert_eq!(at_boot(None, "2.0.0"), AtBoot::Nothing);
        assert_eq!(
            at_boot(Some(value), "2.0.0"),
            AtBoot::Replace(ReplaceOnBoot::new("2.0.0", "version = 1\n").unwrap())
        );
        // The old version came back (install or new version failed): its data stays.
        match at_boot(Some(value), "1.0.0") {
            AtBoot::Drop(why) => assert!(why.contains("by 2.0.0 did not boot"), "{why}"),
            other => panic!("{other:?}"),
        }
        match at_boot(Some(b"2.0.0"), "2.0.0") {
            AtBoot::Drop(why) => assert!(why.contains("no version line"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replace_and_stage_together_are_refused() {
        let req = |stage, replace| slate_api::UpgradeRequest {
            stage,
            replace,
            ..slate_api::UpgradeRequest::new("bundle:sha256:00")
        };
        assert!(check_request(&req(false, true)).is_ok());
        assert!(check_request(&req(true, false)).is_ok());
        assert!(matches!(
            check_request(&req(true, true)),
            Err(BackendError::InvalidArgument(m)) if m.contains("cannot be staged")
        ));
    }

    #[test]
    fn the_configuration_is_read_verbatim_and_restored_verbatim() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_config(dir.path()).unwrap(), "");
        let text = "version = 1\n# kept as written\n";
        let record = ReplaceOnBoot::new("2.0.0", text).unwrap();
        restore_into(dir.path(), &record).unwrap();
        let path = dir.path().join(slate_machine_config::STATE_PATH);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(read_config(dir.path()).unwrap(), text);
        // Nothing to restore: nothing written (the node comes up in maintenance mode).
        let empty = tempfile::tempdir().unwrap();
        restore_into(empty.path(), &ReplaceOnBoot::new("2.0.0", "").unwrap()).unwrap();
        assert!(!empty.path().join("config").exists());
    }
}
