//! Arbitrary bytes as a signed PE image: verification never panics and, with no trusted
//! certificate, never accepts anything (a signature that verifies still names an untrusted
//! signer).
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_secureboot::{verify_pe, TrustedCerts, VerifyError};

fuzz_target!(|data: &[u8]| {
    match verify_pe(data, &TrustedCerts::default()) {
        Ok(signer) => panic!("accepted with no trusted certificate: {signer:?}"),
        Err(VerifyError::NotTrusted { trusted, .. }) => assert_eq!(trusted, "none"),
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
