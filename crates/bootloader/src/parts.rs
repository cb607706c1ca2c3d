//! The partitions every backend opens, opened one way: the ESP (read-only, or read-write over a
//! [`SectorBuffer`] so a directory entry changes in one write) and META, both found by GPT
//! label.

use std::io;

use fatfs::FileSystem;
use slate_disk::{Disk, DiskIo, PartitionView, SectorBuffer};
use slate_esp::{fat, ReadOnly};
use slate_layout::{find_partition, open_partition, EFI_LABEL, META_LABEL};
use slate_meta::{tags, MetaStore};

use crate::BootloaderError;

pub(crate) type Result<T> = std::result::Result<T, BootloaderError>;

/// The ESP file system as the backends mount it for writing.
pub(crate) type EspFs<'fs, 'disk, D> =
    FileSystem<DiskIo<&'fs mut SectorBuffer<PartitionView<&'disk mut D>>>>;

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

pub(crate) fn esp_read_only<D: Disk>(disk: &D) -> Result<PartitionView<ReadOnly<'_, D>>> {
    Ok(open_partition(ReadOnly(disk), EFI_LABEL)?)
}

/// The content of a file on the ESP (`/`-separated path).
pub(crate) fn read_esp_file<D: Disk>(
    disk: &D,
    source_date_epoch: u64,
    path: &str,
) -> Result<Vec<u8>> {
    let fs = fat::mount(esp_read_only(disk)?, source_date_epoch)?;
    let mut bytes = Vec::new();
    fs.root_dir()
        .open_file(path)
        .and_then(|mut f| io::Read::read_to_end(&mut f, &mut bytes))
        .map_err(fat_err("reading", path))?;
    Ok(bytes)
}

/// Mount the ESP read-write over a [`SectorBuffer`], run `f`, unmount (FSInfo) and flush.
pub(crate) fn with_esp<D: Disk, R>(
    disk: &mut D,
    source_date_epoch: u64,
    f: impl FnOnce(&EspFs<'_, '_, D>) -> Result<R>,
) -> Result<R> {
    let info = find_partition(&mut *disk, EFI_LABEL)?;
    let mut esp = SectorBuffer::new(PartitionView::new(disk, info.start, info.len)?);
    let fs = fat::mount(&mut esp, source_date_epoch)?;
    let out = f(&fs)?;
    fat::unmount(fs)?;
    esp.flush()?;
    Ok(out)
}

/// Trim the deleted entries at the end of the ESP's `dir` ([`slate_esp::trim_deleted_tail`]),
/// so that the firmware's next rename there reuses the space instead of growing the
/// directory. Flushed. Returns how many entries were trimmed.
pub(crate) fn trim_esp_dir<D: Disk>(disk: &mut D, dir: &str) -> Result<usize> {
    let info = find_partition(&mut *disk, EFI_LABEL)?;
    let mut esp = SectorBuffer::new(PartitionView::new(disk, info.start, info.len)?);
    let trimmed = slate_esp::trim_deleted_tail(&mut esp, dir).map_err(|e| {
        BootloaderError::Esp(slate_esp::EspError::Fs {
            action: "trimming the deleted entries of a directory",
            source: io::Error::other(e),
        })
    })?;
    esp.flush()?;
    Ok(trimmed)
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
