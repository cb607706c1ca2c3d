//! Arbitrary bytes into slate-delta's compressed chunk table parser (docs/formats.md §7.8) and
//! into the capped decompression a fetched chunk goes through. Nothing may panic or allocate
//! beyond the input's size (the table) or the cap (the decompression); what parses has frames that
//! tile the compressed blob exactly and is written back byte for byte (one spelling).
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_delta::zchunks::{inflate, ZChunk, MAX_ZCHUNK};
use slate_delta::ZTable;

/// The decompression cap tried on every input: a 32 KiB chunk, slate's average.
const CAP: usize = 32 << 10;

fuzz_target!(|data: &[u8]| {
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
