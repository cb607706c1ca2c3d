//! The ext superblock reader machined trusts to skip `e2fsck -p`: any head, any clock, no
//! panic; and it may call a filesystem clean only if the head is an ext one with the valid
//! bit set, the error bit clear and no journal to replay.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (now, head) = match data.split_first_chunk::<8>() {
        Some((now, head)) => (u64::from_le_bytes(*now), head),
        None => (0, data),
    };
    if slate_host::ext_check_due(head, now).is_none() {
        assert!(head.len() >= 2048 && head[1080..1082] == [0x53, 0xEF]);
        let state = u16::from_le_bytes([head[1024 + 0x3A], head[1024 + 0x3B]]);
        assert_eq!(state & 0x3, 0x1, "valid and no errors");
        assert_eq!(head[1024 + 0x60] & 0x4, 0, "no journal to replay");
    }
});
