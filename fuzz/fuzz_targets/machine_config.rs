//! Arbitrary text into the machine configuration parser: nothing may panic, a refusal names a
//! field or says why, and what parses is valid, serializes, and parses back to the same value
//! (so a document machined accepted is one it can write and read again).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match slate_machine_config::parse(text) {
        Ok(parsed) => {
            slate_machine_config::validate(&parsed.config).expect("parse returned an invalid config");
            let again = slate_machine_config::parse(&parsed.config.to_toml())
                .expect("a parsed configuration must parse again");
            assert_eq!(again.config, parsed.config);
            assert_eq!(again.migrated_from, None);
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
