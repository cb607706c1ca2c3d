//! Arbitrary text into slate-bundle's digest parser: nothing may panic, and what parses is
//! canonical: `sha256:` and 64 lower-case hex digits, printed back as written, its hex the file
//! name under `blobs/sha256`, and round-tripping through oci-spec's type unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_bundle::Digest;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(digest) = Digest::parse(text) else {
        return;
    };
    assert_eq!(digest.as_str(), text);
    assert_eq!(digest.to_string(), text);
    let hex = digest.hex();
    assert_eq!(hex.len(), 64);
    assert!(hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    assert_eq!(format!("sha256:{hex}"), text);
    assert_eq!(Digest::from_oci(&digest.to_oci()).as_ref(), Ok(&digest));
});
