//! Arbitrary bytes into the release index parser: nothing may panic, and what parses is in
//! version order, has no version twice, names no release like one of slate's own tags, has an
//! RFC 3339 `created` on each, and serializes to a document that parses back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_release::ReleaseIndex;

fuzz_target!(|data: &[u8]| {
    let Ok(index) = ReleaseIndex::parse(data) else {
        return;
    };
    for pair in index.releases.windows(2) {
        assert_eq!(
            slate_release::compare(&pair[0].version, &pair[1].version),
            std::cmp::Ordering::Less
        );
    }
    for r in &index.releases {
        assert!(slate_release::check_release_version(&r.version).is_ok());
        assert!(r.created.ends_with('Z') && r.created.len() >= 20, "{}", r.created);
    }
    let again = ReleaseIndex::parse(index.to_json().as_bytes()).expect("its own JSON parses");
    assert_eq!(again, index);
});
