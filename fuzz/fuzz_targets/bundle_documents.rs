//! Arbitrary bytes as a bundle's three documents (index.json, image manifest, bundle manifest),
//! split at the first two NUL bytes: the parsers must refuse or accept without panicking, and
//! what they accept names only blobs that are layers of the image.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (Some(index), Some(manifest), Some(config)) = (parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    for tag in [None, Some("2.0.0")] {
        if let Ok(bundle) = slate_bundle::parse_documents(index, tag, manifest, config) {
            for blob in bundle.blobs.values() {
                assert!(!blob.digest.is_empty());
            }
        }
    }
});
