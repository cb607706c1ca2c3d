//! The node's system disk, found the one way: by its META partition's GPT label (sysfs
//! `PARTNAME`). META is opened here and nowhere else in machined.

use slate_disk::FileDisk;
use slate_host::BlockPartition;
use slate_meta::MetaStore;
use slate_sequencer::error_chain;

/// The GPT label slate's installer gives META (the layout's reference label).
pub const META_LABEL: &str = slate_layout::META_LABEL;

/// The META partition of the system disk (`device` `/dev/vda2`, `disk` `/dev/vda`).
pub fn meta_partition() -> Result<BlockPartition, String> {
    slate_host::find_partition_by_label(META_LABEL, None).map_err(|e| e.to_string())
}

/// META on `part`, for reading (`writable` false) or for a change and a flush.
pub fn open_meta_on(part: &BlockPartition, writable: bool) -> Result<MetaStore<FileDisk>, String> {
    let disk = if writable {
        FileDisk::open(&part.device)
    } else {
        FileDisk::open_read_only(&part.device)
    }
    .map_err(|e| format!("opening {}: {e}", part.device.display()))?;
    let mut store = MetaStore::open(disk).map_err(|e| error_chain(&e))?;
    if writable {
        // The node's own META, found by label: a commit or revert must record itself even
        // over rotted copies (the reader's warning says what they held).
        store.overwrite_unrecognized();
    }
    Ok(store)
}

/// META on the system disk.
pub fn open_meta(writable: bool) -> Result<MetaStore<FileDisk>, String> {
    open_meta_on(&meta_partition()?, writable)
}
