//! Arbitrary chunk annotations into slate-bundle's parser: the first 8 bytes are the layer's
//! size (little-endian, capped at 64 GiB), the rest `chunk-size\nchunk-digests`. Nothing may
//! panic, and what parses fits the layer (one digest per chunk it needs) and is written back
//! exactly as it was read.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use slate_bundle::{ChunkDigests, CHUNK_DIGESTS_ANNOTATION, CHUNK_SIZE_ANNOTATION};

fuzz_target!(|data: &[u8]| {
    let Some((size, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    let layer = u64::from_le_bytes(*size) % (64 << 30);
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let (chunk_size, digests) = text.split_once('\n').unwrap_or((text, ""));
    let annotations = HashMap::from([
        (CHUNK_SIZE_ANNOTATION.to_owned(), chunk_size.to_owned()),
        (CHUNK_DIGESTS_ANNOTATION.to_owned(), digests.to_owned()),
    ]);
    let Ok(Some(parsed)) = ChunkDigests::from_annotations(Some(&annotations), layer) else {
        return;
    };
    assert!(parsed.chunk_size().is_power_of_two());
    assert_eq!(
        parsed.digests().len() as u64,
        layer.div_ceil(parsed.chunk_size()).max(1)
    );
    let [(_, size_back), (_, digests_back)] = parsed.annotations();
    assert_eq!(size_back, chunk_size);
    assert_eq!(digests_back, digests);
});
