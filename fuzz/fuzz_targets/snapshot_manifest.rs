//! Arbitrary bytes as a snapshot manifest (docs/formats.md §12.3): nothing panics; a manifest
//! that parses renders back to the same body (one canonical spelling), and re-signing it under
//! a key verifies to the same manifest, while the bytes as given verify only if their tag is
//! that key's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_snapshot::manifest::{Manifest, KEY_LEN};

fuzz_target!(|data: &[u8]| {
    let key = [0x5a; KEY_LEN];
    match Manifest::parse_unauthenticated(data) {
        Ok((manifest, _tag)) => {
            let body = manifest.body();
            assert_eq!(body.as_bytes(), &data[..body.len()], "canonical body");
            let signed = manifest.render_signed(&key);
            assert_eq!(Manifest::verify(&signed, &key).as_ref(), Ok(&manifest));
            if Manifest::verify(data, &key).is_ok() {
                assert_eq!(signed, data);
            }
        }
        Err(err) => {
            assert!(!err.to_string().is_empty());
            assert!(Manifest::verify(data, &key).is_err());
        }
    }
});
