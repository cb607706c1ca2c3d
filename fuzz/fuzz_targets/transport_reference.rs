//! Arbitrary text into slate-transport's image reference parser: nothing may panic, and what
//! parses keeps its invariants: it prints back to the same text, the printed form parses to the
//! same reference, tags and digests obey the grammar, and a registry reference names a host.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_transport::{Location, Reference};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(reference) = Reference::parse(text) else {
        return;
    };
    let printed = reference.to_string();
    assert_eq!(printed, text, "a parsed reference prints back as written");
    assert_eq!(Reference::parse(&printed).as_ref(), Ok(&reference));
    if let Some(tag) = reference.tag() {
        assert!(!tag.is_empty() && tag.len() <= 128);
        assert!(tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)));
        assert!(!tag.starts_with(['.', '-']));
    }
    if let Some(digest) = reference.digest() {
        let hex = digest.strip_prefix("sha256:").expect("sha256 only");
        assert_eq!(hex.len(), 64);
        assert!(hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    }
    match reference.location() {
        Location::Registry { host, repository } => {
            assert!(!host.is_empty() && !host.contains('/'));
            assert!(!repository.is_empty() && !repository.starts_with('/'));
            assert!(!repository.ends_with('/') && !repository.contains("//"));
            assert!(!repository.bytes().any(|b| b.is_ascii_uppercase()));
            assert!(host.len() + 1 + repository.len() <= 255);
        }
        Location::Layout { path } => assert!(!path.as_os_str().is_empty()),
    }
    if let Some(tag) = reference.tag() {
        let retagged = reference.with_tag(tag).expect("a parsed tag is valid");
        assert_eq!(retagged.tag(), Some(tag));
        assert_eq!(retagged.digest(), None);
    }
});
