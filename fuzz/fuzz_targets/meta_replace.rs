//! Arbitrary bytes as META `ReplaceOnBoot`: nothing panics, and a value that parsed names a
//! valid version, carries a configuration within the limit, and writes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_meta::replace::{parse_replace, ReplaceOnBoot, MAX_REPLACE_CONFIG};

fuzz_target!(|data: &[u8]| {
    match parse_replace(data) {
        Ok(record) => {
            assert!(record.config.len() <= MAX_REPLACE_CONFIG);
            let again = ReplaceOnBoot::new(&record.version, &record.config)
                .expect("a parsed record is a record that can be written");
            assert_eq!(again.to_bytes(), data);
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
