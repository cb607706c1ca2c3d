//! A system extension's signed manifest (docs/formats.md §7.6) and the initramfs' extensions
//! manifest (§6.4) on arbitrary bytes: never panics; what parses re-signs (with the fuzz key)
//! to a manifest that parses to the same fields and verifies; a manifest verifies against the
//! fixed trusted key only if it is that key's signature of exactly those fields; what the
//! initramfs manifest parser accepts renders and parses back to the same entries.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use slate_profile::{parse_extensions_manifest, render_extensions_manifest};
use slate_trust::{PrivateKey, SignedExtension};

fn key() -> &'static PrivateKey {
    static KEY: OnceLock<PrivateKey> = OnceLock::new();
    KEY.get_or_init(|| PrivateKey::from_scalar(&[1; 32]).unwrap())
}

fuzz_target!(|data: &[u8]| {
    if let Ok(signed) = SignedExtension::parse(data) {
        let trusted = [key().public_key()];
        if let Ok(manifest) = signed.verify(&trusted) {
            // Signatures are deterministic: a verified manifest is exactly the key's own.
            assert_eq!(manifest.sign(key()).unwrap(), data);
        }
        let again = signed.manifest.sign(key()).expect("parsed fields sign");
        let reparsed = SignedExtension::parse(&again).expect("a signed manifest parses");
        assert_eq!(reparsed.manifest, signed.manifest);
        reparsed.verify(&trusted).expect("a fresh signature verifies");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(entries) = parse_extensions_manifest(text) {
            let rendered = render_extensions_manifest(&entries);
            assert_eq!(parse_extensions_manifest(&rendered).unwrap(), entries);
        }
    }
});
