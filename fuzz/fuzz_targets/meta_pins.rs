//! Arbitrary bytes as META `PinnedVersions`: nothing panics, a value that parsed formats back to
//! the same bytes and holds at most `MAX_PINNED` versions that can each be pinned.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_meta::pins;

fuzz_target!(|data: &[u8]| {
    match pins::parse_pinned(data) {
        Ok(versions) => {
            assert!(versions.len() <= pins::MAX_PINNED);
            for v in &versions {
                pins::check_version(v).expect("a parsed pin is a pinnable version");
            }
            assert_eq!(pins::format_pinned(&versions), data);
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
