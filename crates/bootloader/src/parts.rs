//! What every backend opens besides the ESP (which `slate_esp::session` finds and opens):
//! META, found by GPT label, and the errors both backends report.

use std::io;

use slate_disk::{Disk, PartitionView};
use slate_esp::{session, ReadOnly};
use slate_layout::{open_partition, META_LABEL};
use slate_meta::{tags, MetaStore};

use crate::BootloaderError;

pub(crate) type Result<T> = std::result::Result<T, BootloaderError>;

pub(crate) fn fat_err(
    action: &'static str,
    path: &str,
) -> impl FnOnce(io::Error) -> BootloaderError {
    let path = path.to_owned();
    move |source| BootloaderError::Fat {
        action,
        path,
        source,
    }
}

pub(crate) fn invalid(e: impl std::fmt::Display) -> BootloaderError {
    BootloaderError::Invalid(e.to_string())
}

/// A snapshot root's entries refused or not written ([`BootloaderError::SnapshotEsp`]).
pub(crate) fn esp_err(what: impl std::fmt::Display) -> BootloaderError {
    BootloaderError::SnapshotEsp(what.to_string())
}

/// FAT timestamps of a snapshot root's entries: a fixed instant (1980-01-01, FAT's first), as
/// the A/B backends use by default; nothing reads them.
pub(crate) const FAT_EPOCH: u64 = 0;

/// The content of a file on the ESP (`/`-separated path).
pub(crate) fn read_esp_file<D: Disk>(disk: &D, path: &str) -> Result<Vec<u8>> {
    session::read(&session::mount_read_only(disk)?, path).map_err(fat_err("reading", path))
}

/// META opened for writing. The partition was found by its label on a slate disk whose
/// installer checked META before writing anything (`version_floor`); a node's commit or
/// revert must still be able to record itself over copies that have since rotted.
pub(crate) fn meta_mut<D: Disk>(disk: &mut D) -> Result<MetaStore<PartitionView<&mut D>>> {
    let mut store = MetaStore::open(open_partition(disk, META_LABEL)?)?;
    store.overwrite_unrecognized();
    Ok(store)
}

/// What the loaders read from META besides the ESP.
pub(crate) struct MetaFacts {
    /// META `Upgrade`: the entry or slot to fall back to.
    pub(crate) upgrade_tag: Option<String>,
    /// META `PinnedVersions`, or why its value is unreadable.
    pub(crate) pinned: std::result::Result<Vec<String>, slate_meta::pins::PinError>,
    pub(crate) warnings: Vec<String>,
}

/// META `Upgrade`, `PinnedVersions` and META's read warnings, from one read of META.
pub(crate) fn read_meta_facts<D: Disk>(disk: &D) -> Result<MetaFacts> {
    let meta = MetaStore::open(open_partition(ReadOnly(disk), META_LABEL)?)?;
    let upgrade_tag = meta
        .get(tags::UPGRADE)
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let pinned = meta
        .get(tags::PINNED_VERSIONS)
        .map_or(Ok(Vec::new()), slate_meta::pins::parse_pinned);
    let mut warnings = meta.warnings().to_vec();
    if let Err(e) = &pinned {
        warnings.push(format!("META PinnedVersions: {e}"));
    }
    Ok(MetaFacts {
        upgrade_tag,
        pinned,
        warnings,
    })
}

/// META `PinnedVersions` set to `versions` (deleted when empty), flushed.
pub(crate) fn set_pinned<D: Disk>(disk: &mut D, versions: &[String]) -> Result<()> {
    let mut meta = meta_mut(disk)?;
    if versions.is_empty() {
        meta.delete(tags::PINNED_VERSIONS);
    } else {
        meta.set(
            tags::PINNED_VERSIONS,
            slate_meta::pins::format_pinned(versions),
        )?;
    }
    Ok(meta.flush()?)
}

/// A rollback may not go below META `VersionFloor` (the anti-rollback floor an upgrade can
/// raise): refused, naming both versions.
pub(crate) fn check_rollback_floor<D: Disk>(disk: &D, version: &str) -> Result<()> {
    let meta = MetaStore::open(open_partition(ReadOnly(disk), META_LABEL)?)?;
    let Some(floor) = meta
        .get(tags::VERSION_FLOOR)
        .map(|v| String::from_utf8_lossy(v).trim().to_owned())
    else {
        return Ok(());
    };
    if slate_bootspec::compare_versions(version, &floor) == std::cmp::Ordering::Less {
        return Err(invalid(format!(
            "the previous version {version} is below this disk's version floor {floor} \
             (META VersionFloor)"
        )));
    }
    Ok(())
}

/// META `Upgrade` set to `label` (`Some`) or deleted (`None`), flushed (both copies).
pub(crate) fn set_upgrade_tag<D: Disk>(disk: &mut D, label: Option<&str>) -> Result<()> {
    let mut meta = meta_mut(disk)?;
    match label {
        Some(l) => meta.set(tags::UPGRADE, l.as_bytes())?,
        None => {
            meta.delete(tags::UPGRADE);
        }
    }
    Ok(meta.flush()?)
}
