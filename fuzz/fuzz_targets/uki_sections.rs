//! Header parsing, section lookup and checksumming must never panic on any input; and the
//! delta chunker's cuts at a PE image's or ELF file's section edges
//! (slate_delta::section_edges) are
//! strictly inside the input, ascending, and the chunks still tile it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sections) = slate_uki::parse_sections(data) {
        for s in &sections {
            let _ = slate_uki::section_data(data, &s.name);
        }
    }
    let _ = slate_uki::pe_checksum(data);

    let edges = slate_delta::section_edges(data);
    assert!(edges.windows(2).all(|w| w[0] < w[1]), "{edges:?}");
    assert!(edges.iter().all(|&e| e > 0 && e < data.len()), "{edges:?}");
    let params = slate_delta::ChunkParams {
        min: 64,
        avg: 256,
        max: 1024,
    };
    let blob = slate_delta::chunk_blob(data, params);
    let mut end = 0u64;
    for c in &blob.chunks {
        assert_eq!(c.offset, end);
        assert!(c.length > 0 && c.length <= params.max);
        end += u64::from(c.length);
    }
    assert_eq!(end, data.len() as u64);
});
