//! Treat the input as a stub: assembly either fails cleanly or yields an image that parses,
//! carries a valid checksum, and holds the added sections where its headers say.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_uki::{parse_pe, section_data, verify_checksum, UkiBuilder};

fuzz_target!(|stub: &[u8]| {
    let Ok(image) = UkiBuilder::new(stub)
        .osrel("ID=fuzz\n")
        .cmdline("quiet")
        .linux(stub)
        .sbat(slate_uki::UKI_SBAT_LINE)
        .build()
    else {
        return;
    };
    let info = parse_pe(&image).expect("assembled image must parse");
    assert!(verify_checksum(&image).expect("checksum readable"));
    assert_eq!(
        section_data(&image, ".osrel").unwrap(),
        Some(&b"ID=fuzz\n"[..])
    );
    assert_eq!(
        section_data(&image, ".cmdline").unwrap(),
        Some(&b"quiet"[..])
    );
    assert!(info.section_table_end() <= info.size_of_headers as usize);
});
