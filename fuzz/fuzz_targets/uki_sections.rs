//! Header parsing, section lookup and checksumming must never panic on any input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sections) = slate_uki::parse_sections(data) {
        for s in &sections {
            let _ = slate_uki::section_data(data, &s.name);
        }
    }
    let _ = slate_uki::pe_checksum(data);
});
