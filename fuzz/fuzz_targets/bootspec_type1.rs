//! Arbitrary text as a Type #1 boot entry (`loader/entries/*.conf`, docs/formats.md §12.2):
//! nothing panics; an entry that parses names a program (`linux` or `efi`), and its command
//! line is its `options` lines joined.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_bootspec::Type1Entry;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Type1Entry::parse(text) {
        Ok(entry) => {
            assert!(entry.linux.is_some() || entry.efi.is_some());
            assert_eq!(entry.cmdline(), entry.options.join(" "));
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
