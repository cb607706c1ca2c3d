//! The ADV parsers on arbitrary input: a whole copy (magics, checksum), the record parser on its
//! own (so the fuzzer is not stopped by the SHA-256), the legacy syslinux parser, and the store
//! over a META area starting with the input (when it starts with the ADV magic). None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_disk::MemDisk;
use slate_meta::{Adv, LegacyAdv, MetaStore, ADV_LEN, LEGACY_LEN};

fuzz_target!(|data: &[u8]| {
    let _ = Adv::parse(data);

    if let Ok(adv) = Adv::parse_records(data) {
        assert!(adv.used() <= data.len(), "records cannot claim more than the input");
        assert!(adv.get(0).is_none(), "tag 0 terminates, it never holds a value");
    }

    let _ = LegacyAdv::parse(&data[..data.len().min(LEGACY_LEN)]);

    // A whole store only when the input looks like a copy 1, so the hot path stays cheap.
    if data.starts_with(&[0x5A, 0x4B, 0x3C, 0x2D]) {
        let mut area = vec![0u8; 2 * ADV_LEN + LEGACY_LEN];
        area[..data.len()].copy_from_slice(data);
        if let Ok(store) = MetaStore::open(MemDisk::from_bytes(area)) {
            let _ = store.entries();
        }
    }
});
