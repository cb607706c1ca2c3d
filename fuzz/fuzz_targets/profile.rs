//! Arbitrary text into the image profile and node configuration parsers: nothing may panic, a
//! refusal says why, the sizes of a profile that parsed are computed without overflow, and a
//! node configuration that parsed writes out and parses back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match slate_profile::Profile::parse(text) {
        Ok(profile) => {
            for size in [
                profile.image.size_bytes(),
                profile.image.esp_bytes(),
                profile.image.state_bytes(),
            ] {
                if let Err(err) = size {
                    assert!(!err.to_string().is_empty());
                }
            }
            let _ = profile.cmdline();
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
    match slate_profile::NodeConfig::parse(text) {
        Ok(config) => {
            let again = slate_profile::NodeConfig::parse(&config.to_toml())
                .expect("a parsed node configuration must parse again");
            assert_eq!(again, config);
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
