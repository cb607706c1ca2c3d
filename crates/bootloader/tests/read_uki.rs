//! `Bootloader::read_uki`, what `slate upgrade --check` reads on a node: the booted entry's UKI,
//! found by any of its names, its length checked before it is read; GRUB refuses.

mod common;

use common::*;
use slate_bootloader::{Bootloader, BootloaderError, Grub};
use slate_disk::MemDisk;

#[test]
fn the_booted_uki_is_read_by_file_name_or_entry_id() {
    let v1 = uki(1, 20_000);
    let boot = sdboot(running_v1(&v1));
    // Committed: the file is `slate-1.efi`; the firmware may still name it as it booted.
    for reference in ["slate-1.efi", "slate-1+2-1.efi", "slate-1+3.efi"] {
        assert_eq!(
            boot.read_uki(reference, u64::MAX).unwrap(),
            v1,
            "{reference}"
        );
    }
    assert_eq!(boot.read_uki("slate-1.efi", 20_000).unwrap(), v1);
}

#[test]
fn an_unknown_entry_or_one_over_the_limit_is_refused() {
    let boot = sdboot(running_v1(&uki(1, 20_000)));
    let err = boot.read_uki("slate-9.efi", u64::MAX).unwrap_err();
    assert!(
        matches!(&err, BootloaderError::EntryNotFound(r) if r == "slate-9.efi"),
        "{err:?}"
    );
    let err = boot.read_uki("slate-1+2-1.efi", 19_999).unwrap_err();
    assert!(
        matches!(&err, BootloaderError::Invalid(m)
            if m == "EFI/Linux/slate-1.efi is 20000 bytes, more than the 19999 bytes it may be \
                     read into"),
        "{err:?}"
    );
}

#[test]
fn grub_slots_hold_no_uki() {
    // Refused before any read: the disk is blank.
    let err = Grub::new(MemDisk::zeroed(4096))
        .read_uki("A", u64::MAX)
        .unwrap_err();
    assert!(
        matches!(&err, BootloaderError::Invalid(m) if m.starts_with("slot A holds no UKI")),
        "{err:?}"
    );
}
