//! Arbitrary bytes into slate-delta's chunk index parser (docs/formats.md §7.7). Nothing may
//! panic or allocate beyond the input's size; what parses tiles each blob exactly and is
//! written back byte for byte as it was read (one spelling).
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_delta::ChunkIndex;

fuzz_target!(|data: &[u8]| {
    let Ok(index) = ChunkIndex::parse(data) else {
        return;
    };
    for blob in &index.blobs {
        let mut end = 0;
        for chunk in &blob.chunks {
            assert_eq!(chunk.offset, end);
            assert!(chunk.length >= 1 && chunk.length <= index.params.max);
            end += u64::from(chunk.length);
        }
        assert_eq!(end, blob.size);
    }
    assert_eq!(index.to_bytes(), data);
});
