//! Content-defined chunking: FastCDC (the 2020 variant, normalization level 1), so an
//! insertion moves the cut points only around itself and the chunks after it are the same
//! bytes at other offsets, found again by digest.
//!
//! A PE image (a UKI, systemd-boot) or an ELF binary (the installer) is also cut where each
//! section's stored bytes start and end, and FastCDC runs within each span. A UKI's small
//! sections change with every release (`.osrel` with the version, the header with the PE
//! checksum) and sit between the stub's code and the initrd: cut by content alone, each
//! dragged a whole chunk of its neighbours (tens of KB of compressed squashfs or code) into
//! every delta; cut at its edges it costs its own bytes. In a binary, a change of code leaves
//! whole sections unchanged that a chunk straddling their edge would have dragged along.

use fastcdc::v2020::FastCDC;
use object::{FileKind, Object as _, ObjectSection as _};

use crate::index::{BlobChunks, Chunk, ChunkParams};
use crate::sha256;

/// `bytes` cut into chunks with their digests, and the whole blob's digest. An empty blob has
/// no chunks.
pub fn chunk_blob(bytes: &[u8], params: ChunkParams) -> BlobChunks {
    assert!(params.valid(), "chunk sizes {params:?}");
    let mut chunks = Vec::new();
    let mut start = 0;
    for end in section_edges(bytes).into_iter().chain([bytes.len()]) {
        let span = &bytes[start..end];
        chunks.extend(
            FastCDC::new(
                span,
                params.min as usize,
                params.avg as usize,
                params.max as usize,
            )
            .map(|c| {
                let offset = start + c.offset;
                Chunk {
                    offset: offset as u64,
                    length: c.length as u32,
                    digest: sha256(&bytes[offset..offset + c.length]),
                }
            }),
        );
        start = end;
    }
    BlobChunks {
        digest: sha256(bytes),
        size: bytes.len() as u64,
        chunks,
    }
}

/// Where a PE image's or an ELF file's sections start and end in the file (sections with
/// stored bytes), strictly inside it, ascending and without repeats; none for anything else
/// (noise, an archive, a file whose headers do not parse).
pub fn section_edges(bytes: &[u8]) -> Vec<usize> {
    // Only formats with a magic: object also reads COFF objects, which have none, so noise
    // would pass for one now and then.
    let kind = FileKind::parse(bytes);
    if !matches!(
        kind,
        Ok(FileKind::Elf32 | FileKind::Elf64 | FileKind::Pe32 | FileKind::Pe64)
    ) {
        return Vec::new();
    }
    let Ok(file) = object::File::parse(bytes) else {
        return Vec::new();
    };
    let mut edges: Vec<usize> = file
        .sections()
        .filter_map(|s| s.file_range())
        .filter(|&(_, size)| size > 0)
        .flat_map(|(start, size)| [start, start.saturating_add(size)])
        .filter_map(|edge| usize::try_from(edge).ok())
        .filter(|&edge| edge > 0 && edge < bytes.len())
        .collect();
    edges.sort_unstable();
    edges.dedup();
    edges
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_data::{noise, SMALL};
    use proptest::prelude::*;
    use std::collections::HashSet;

    #[test]
    fn chunks_tile_the_blob_within_the_bounds() {
        let data = noise(300_000, 7);
        let blob = chunk_blob(&data, SMALL);
        assert_eq!(blob.size, 300_000);
        let mut end = 0;
        for (i, c) in blob.chunks.iter().enumerate() {
            assert_eq!(c.offset, end);
            assert!(c.length <= SMALL.max);
            if i + 1 < blob.chunks.len() {
                assert!(c.length >= SMALL.min);
            }
            assert_eq!(
                c.digest,
                sha256(&data[c.offset as usize..][..c.length as usize])
            );
            end += u64::from(c.length);
        }
        assert_eq!(end, 300_000);
        assert!(chunk_blob(&[], SMALL).chunks.is_empty());
    }

    proptest! {
        // A fixed seed: the same 48 cases in every run, so a CI failure is a real one.
        #![proptest_config(ProptestConfig {
            cases: 48,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x5eed_0041),
            ..ProptestConfig::default()
        })]
        /// An insertion anywhere changes only the chunks around it: all but a few of the old
        /// chunks are found again, whatever was inserted where.
        #[test]
        fn boundaries_are_stable_under_insertions(
            seed in 1u64..u64::MAX,
            at in 0usize..200_000,
            inserted in proptest::collection::vec(any::<u8>(), 1..5000),
        ) {
            let old = noise(200_000, seed);
            let mut new = old.clone();
            new.splice(at..at, inserted.iter().copied());
            let old_chunks = chunk_blob(&old, SMALL);
            let new_chunks = chunk_blob(&new, SMALL);
            let known: HashSet<_> = old_chunks.chunks.iter().map(|c| c.digest).collect();
            let lost = new_chunks.chunks.iter().filter(|c| !known.contains(&c.digest)).count();
            // The inserted bytes span at most 5000 / min + 1 chunks; FastCDC re-synchronises
            // within a few chunks on each side (at most 6 beyond the inserted span in 3,000
            // random trials of this shape).
            let bound = inserted.len() / SMALL.min as usize + 8;
            prop_assert!(lost <= bound, "{lost} new chunks of {}, bound {bound}", new_chunks.chunks.len());
        }
    }
}
