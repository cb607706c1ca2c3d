//! Arbitrary bytes as a snapshot root's GRUB menu, `grub/snapshots.cfg` (docs/formats.md
//! §12.9): nothing panics, and a menu that parses is exactly what rendering its entries writes
//! (the one form slate reads back), each entry passing the checks a new one does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_bootloader::grub::snapshots::menu::{parse_menu, render_menu};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_menu(text) {
        Ok(entries) => {
            assert_eq!(render_menu(&entries), text, "canonical form");
            let mut names: Vec<_> = entries.iter().map(|e| &e.snapshot).collect();
            names.dedup();
            assert_eq!(names.len(), entries.len(), "one entry per snapshot");
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});
