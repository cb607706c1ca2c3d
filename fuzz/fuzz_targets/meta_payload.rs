//! The kernel-argument payload decoder on arbitrary text: never panics, and what decodes
//! re-encodes to something that decodes to the same values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_meta::payload;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(values) = payload::decode(text) {
        if values.iter().any(|(_, v)| v.contains(';')) || values.is_empty() {
            return;
        }
        let borrowed: Vec<(u8, &str)> = values.iter().map(|(t, v)| (*t, v.as_str())).collect();
        let encoded = payload::encode(&borrowed).expect("decoded values encode");
        assert_eq!(payload::decode(&encoded).expect("re-decodes"), values);
    }
});
