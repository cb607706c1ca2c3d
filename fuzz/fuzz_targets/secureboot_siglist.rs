//! Arbitrary bytes as EFI signature lists and as a `.auth` payload: nothing panics, every
//! certificate returned lies inside the input, and parsing them as X.509 never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_secureboot::{certs_from_auth, certs_from_signature_lists, TrustedCerts};

fuzz_target!(|data: &[u8]| {
    for certs in [certs_from_signature_lists(data), certs_from_auth(data)]
        .into_iter()
        .flatten()
    {
        let total: usize = certs.iter().map(Vec::len).sum();
        assert!(total <= data.len());
        let _ = TrustedCerts::from_der(certs.iter().map(Vec::as_slice));
    }
});
