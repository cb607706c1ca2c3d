//! Arbitrary certificates into the trust check of machine configurations (machine-config's
//! trust.rs, issue 36): the input is `api.ca_cert`, a NUL, then `api.client_ca` (PEM text), put
//! into a valid document. Nothing may panic; the refusal of `check_trust` and the findings
//! agree; a name constraint that permits a name is read back the same way twice.
#![no_main]

use libfuzzer_sys::fuzz_target;

const DOCUMENT: &str =
    include_str!("../../crates/machine-config/tests/fixtures/node-v1-own-ca.toml");

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (ca_cert, client_ca) = text.split_once('\0').unwrap_or((text, text));
    let mut config = slate_machine_config::parse(DOCUMENT)
        .expect("the fixture parses")
        .config;
    config.api.ca_cert = ca_cert.to_owned();
    config.api.client_ca = client_ca.to_owned();
    let findings = slate_machine_config::trust_findings(&config);
    let checked = slate_machine_config::check_trust(&config);
    assert_eq!(findings.is_empty(), checked.is_ok());
    if let Ok(ca) = slate_machine_config::trust::issuing_ca(ca_cert) {
        if let Some(constraints) = ca.constraints {
            for name in ["node1", "10.0.2.15", "::1", "a.b.example", ""] {
                assert_eq!(constraints.permits(name), constraints.permits(name));
            }
        }
    }
});
