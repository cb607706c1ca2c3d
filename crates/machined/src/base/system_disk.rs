//! The node's system disk, found the one way: by its META partition's GPT label (sysfs
//! `PARTNAME`). META is opened here and nowhere else in machined.

use slate_disk::{FileDisk, PartitionView};
use slate_host::BlockPartition;
use slate_meta::MetaStore;
use slate_sequencer::error_chain;

/// The GPT label slate's installer gives META (the layout's reference label).
pub const META_LABEL: &str = slate_layout::META_LABEL;

/// The META partition of the system disk (`device` `/dev/vda2`, `disk` `/dev/vda`).
pub fn meta_partition() -> Result<BlockPartition, String> {
    slate_host::find_partition_by_label(META_LABEL, None).map_err(|e| e.to_string())
}

/// META as machined holds it: the partition's range of the whole disk.
pub type SystemMeta = MetaStore<PartitionView<FileDisk>>;

/// META on the disk of `part`, for reading (`writable` false) or for a change and a flush.
///
/// Through the whole disk (`/dev/vda`), found again by its GPT label, as the boot loader code
/// and the installer open it — never through the partition's own device (`/dev/vda2`): the
/// two block devices keep separate page caches, so a record written through one was not seen
/// by a later read through the other, and the installer wrote the stale copy back (a
/// replacement's record vanished that way).
pub fn open_meta_on(part: &BlockPartition, writable: bool) -> Result<SystemMeta, String> {
    let disk = if writable {
        FileDisk::open(&part.disk)
    } else {
        FileDisk::open_read_only(&part.disk)
    }
    .map_err(|e| format!("opening {}: {e}", part.disk.display()))?;
    let view = slate_layout::open_partition(disk, META_LABEL)
        .map_err(|e| format!("{}: {}", part.disk.display(), error_chain(&e)))?;
    let mut store = MetaStore::open(view).map_err(|e| error_chain(&e))?;
    if writable {
        // The node's own META, found by label: a commit or revert must record itself even
        // over rotted copies (the reader's warning says what they held).
        store.overwrite_unrecognized();
    }
    Ok(store)
}

/// META on the system disk.
pub fn open_meta(writable: bool) -> Result<SystemMeta, String> {
    open_meta_on(&meta_partition()?, writable)
}
