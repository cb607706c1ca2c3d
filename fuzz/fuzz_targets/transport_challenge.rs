//! Arbitrary text as a `WWW-Authenticate` challenge, and as a URL or `host[:port]` naming
//! where credentials would go: nothing panics; a challenge's scheme and keys come back lower
//! case and trimmed; an authority that parsed has a host and reads back as itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_transport::challenge::{is_loopback, parse_challenge, Authority};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (scheme, params) = parse_challenge(text);
    assert_eq!(scheme, scheme.to_ascii_lowercase());
    for (key, _) in &params {
        assert_eq!(key, &key.to_ascii_lowercase());
        assert_eq!(key.trim(), key);
    }
    if let Some(authority) = Authority::parse(text) {
        assert!(!authority.host.is_empty());
        let again = Authority::parse(&authority.display()).expect("an authority reads back");
        assert_eq!(again, authority);
        assert!(authority.same("https", &again, "https"));
        let _ = is_loopback(&authority.display());
    }
    if let Some((scheme, authority)) = Authority::of_url(text) {
        assert!(scheme == "http" || scheme == "https");
        assert!(!authority.host.is_empty());
    }
});
