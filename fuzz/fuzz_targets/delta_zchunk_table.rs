//! Arbitrary bytes into slate-delta's compressed chunk table parser (docs/formats.md §7.8) and
//! into the capped decompression a fetched chunk goes through. Nothing may panic or allocate
//! beyond the input's size (the table) or the cap (the decompression); what parses has frames that
//! tile the compressed blob exactly and is written back byte for byte (one spelling). The same
//! bytes go to the build cache's kept-frames entry parser (formats.md §6.7), whose frames must
//! lie within the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_delta::zchunks::{inflate, parse_kept_frames, ZChunk, MAX_ZCHUNK};
use slate_delta::ZTable;

/// The decompression cap tried on every input: a 32 KiB chunk, slate's average.
const CAP: usize = 32 << 10;

fuzz_target!(|data: &[u8]| {
    if let Some(kept) = parse_kept_frames(data) {
        let framed: usize = kept.values().flatten().map(|f| f.len() + 36).sum();
        assert!(framed <= data.len());
    }
    if let Ok(out) = inflate(data, CAP) {
        assert_eq!(out.len(), CAP);
    }
    let Ok(table) = ZTable::parse(data) else {
        return;
    };
    let mut end = 0;
    for chunk in &table.chunks {
        if let ZChunk::Zstd { offset, length, .. } = *chunk {
            assert_eq!(offset, end);
            assert!((1..=MAX_ZCHUNK).contains(&length));
            end += u64::from(length);
        }
    }
    assert_eq!(end, table.blob_size);
    assert_eq!(table.to_bytes(), data);
});
