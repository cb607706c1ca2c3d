//! The strict reader must reject or accept any input without panicking, and whatever it
//! accepts must survive being written back out and parsed again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_cpio::{parse_newc, CpioWriter, EntryKind};

fuzz_target!(|data: &[u8]| {
    let Ok(entries) = parse_newc(data) else {
        return;
    };
    // Re-encode what the writer can express; it must parse back to the same names and data.
    let mut writer = CpioWriter::new();
    let mut kept = Vec::new();
    for e in &entries {
        let Some(name) = e.name_str() else { continue };
        let added = match e.kind() {
            Some(EntryKind::Directory) => writer.dir(name, e.permissions()).is_ok(),
            Some(EntryKind::File) => writer.file(name, e.permissions(), e.data.clone()).is_ok(),
            _ => false,
        };
        if added {
            kept.push((name.trim_matches('/').to_owned(), e.data.clone()));
        }
    }
    let reparsed = parse_newc(&writer.finish()).expect("writer output must parse");
    let reparsed: Vec<_> = reparsed
        .into_iter()
        .map(|e| (e.name_str().unwrap().to_owned(), e.data))
        .collect();
    assert_eq!(reparsed, kept);
});
