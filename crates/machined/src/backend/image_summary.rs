//! `GET /v1/image`: the running version taken apart as `slate upgrade --check` compares it with
//! a bundle (`slate_bundle_diff::running_summary`, docs/formats.md §7.5). The booted entry's
//! UKI is read from the system disk's ESP through the boot loader backend, the disk opened
//! read-only: nothing is written anywhere. Beside the summary, `held_chunks`: the chunks an
//! upgrade would reuse (issue 41). One summary at a time (it holds a UKI and its root
//! image in memory and hashes every file): a request meanwhile is answered `Locked`.

use std::sync::{Mutex, TryLockError};
use std::time::Instant;

use slate_api::BackendError;
use slate_bootloader::{Bootloader, BootloaderError};
use slate_bundle_diff::{running_summary, Identity, MAX_UKI_BYTES};
use slate_sequencer::error_chain;

use crate::base::node::{os_release_value, Node};
use crate::settle::transaction::{booted_entry, read_only_loader};

/// Held while a summary is made.
static BUSY: Mutex<()> = Mutex::new(());

/// What `slate bundle diff` is for when the node cannot answer.
const OFFLINE: &str = "compare bundles offline with `slate bundle diff OLD NEW`";

/// The running version's `Summary`, as JSON.
pub fn image_summary(node: &Node) -> Result<serde_json::Value, BackendError> {
    let _busy =
        match BUSY.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return Err(BackendError::Locked(
                "the running image is being read for another request; ask again when it is done"
                    .into(),
            )),
        };
    let booted = booted_entry(node).ok_or_else(|| {
        BackendError::Unsupported(format!(
            "the firmware did not say which entry booted (LoaderEntrySelected); {OFFLINE}"
        ))
    })?;
    let started = Instant::now();
    let loader = read_only_loader().map_err(BackendError::Failed)?;
    let uki = read_booted(&*loader, &booted)?;
    let uki_len = uki.len();
    let summary = running_summary(uki, identity(node))
        .map_err(|e| BackendError::Failed(format!("reading {booted}: {}", error_chain(&e))))?;
    node.journal.info(format_args!(
        "image summary of {booted} ({uki_len} bytes, {} root filesystem entries) made in {} ms",
        summary.rootfs.len(),
        started.elapsed().as_millis()
    ));
    let mut value =
        serde_json::to_value(&summary).map_err(|e| BackendError::Failed(e.to_string()))?;
    // The chunks an upgrade could reuse (issue 41), for `slate upgrade --check` to say how
    // much it would fetch: digests only, read by no one but that estimate.
    if let (Some(index), Some(object)) = (
        crate::boot::upgrade::pull::held_index(node),
        value.as_object_mut(),
    ) {
        object.insert(
            HELD_CHUNKS.into(),
            serde_json::Value::String(hex::encode(index.to_bytes())),
        );
    }
    Ok(value)
}

/// The field of `GET /v1/image` that lists the chunks the node holds (a chunk index, formats.md
/// §7.7, in hex); absent on a node older than delta updates.
pub const HELD_CHUNKS: &str = "held_chunks";

/// What a bundle manifest would say of the running version: the node's version and variant
/// (os-release, as the node reads them at start), os-release `IMAGE_ID` (the profile's name,
/// as the manifest's), and the architecture this binary was built for.
fn identity(node: &Node) -> Identity {
    let os_release = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    Identity {
        name: os_release_value(&os_release, "IMAGE_ID").unwrap_or_else(|| "unknown".into()),
        version: node.version.clone(),
        arch: slate_bundle::NATIVE_ARCH.into(),
        variant: node.variant.clone(),
    }
}

/// The booted entry's UKI, at most [`MAX_UKI_BYTES`]. What the loader refuses (a GRUB slot, an
/// entry not on the disk, one too large) is `Unsupported`; a read that fails is `Failed`.
fn read_booted(loader: &dyn Bootloader, booted: &str) -> Result<Vec<u8>, BackendError> {
    loader.read_uki(booted, MAX_UKI_BYTES).map_err(|e| match e {
        BootloaderError::Invalid(why) => BackendError::Unsupported(format!("{why}; {OFFLINE}")),
        BootloaderError::EntryNotFound(_) => BackendError::Unsupported(format!(
            "the booted entry {booted} is not on the system disk's EFI partition; {OFFLINE}"
        )),
        other => BackendError::Failed(format!("reading {booted}: {}", error_chain(&other))),
    })
}

#[cfg(test)]
mod tests {
    use slate_bootloader::{Grub, MemEfiVars, SystemdBoot};
    use slate_disk::MemDisk;

    use super::*;

    #[test]
    fn a_grub_slot_is_refused_as_unsupported() {
        // Refused before any read: the disk is blank.
        let err = read_booted(&Grub::new(MemDisk::zeroed(4096)), "A").unwrap_err();
        assert_eq!(
            err,
            BackendError::Unsupported(
                "slot A holds no UKI: a GRUB slot is a kernel, an initramfs and a command line; \
                 compare bundles offline with `slate bundle diff OLD NEW`"
                    .into()
            )
        );
    }

    #[test]
    fn a_disk_that_cannot_be_read_is_a_failure() {
        let loader = SystemdBoot::new(MemDisk::zeroed(1 << 20), MemEfiVars::new());
        let err = read_booted(&loader, "slate-1.efi").unwrap_err();
        assert!(
            matches!(&err, BackendError::Failed(m) if m.starts_with("reading slate-1.efi: ")),
            "{err:?}"
        );
    }

    #[test]
    fn a_second_summary_meanwhile_is_locked() {
        let (node, _requests) = Node::for_tests("");
        let _busy = BUSY.lock().unwrap();
        let err = image_summary(&node).unwrap_err();
        assert!(matches!(&err, BackendError::Locked(_)), "{err:?}");
    }
}
