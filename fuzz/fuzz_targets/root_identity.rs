//! What slate's init reads to find a block root: the kernel command line's `root=`,
//! `rootfstype=`, `rootflags=`, `rw`/`ro` (any bytes as text), and a device's head, whose
//! Btrfs or ext4 superblock names the filesystem's UUID. Nothing panics; a UUID read from a
//! head is always the canonical 36-character lower-case form `root=UUID=` is compared with,
//! and a parsed `root=UUID=` is lower case and 32 hex digits apart from its hyphens.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_init::RootSource;

fuzz_target!(|data: &[u8]| {
    if let Some(identity) = slate_host::filesystem_identity(data) {
        let uuid = identity.uuid.as_bytes();
        assert_eq!(uuid.len(), 36);
        for (i, c) in uuid.iter().enumerate() {
            if matches!(i, 8 | 13 | 18 | 23) {
                assert_eq!(*c, b'-');
            } else {
                assert!(c.is_ascii_digit() || (b'a'..=b'f').contains(c));
            }
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(Some(root)) = slate_init::block_root(text) {
            if let RootSource::Uuid(uuid) = &root.source {
                let hex: Vec<char> = uuid.chars().filter(|c| *c != '-').collect();
                assert_eq!(hex.len(), 32);
                assert!(hex.iter().all(|c| c.is_ascii_digit() || ('a'..='f').contains(c)));
            }
        }
    }
});
