use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::assemble::{assemble, plan, Seed};
use crate::test_data::{noise, Cache, File, SMALL as P};
use crate::{chunk_blob, BlobChunks, ChunkParams};

/// docs/formats.md §7.8's vector: an index of two blobs below the minimum chunk size (one
/// chunk each): 1000 bytes of "slate " repeated, and 1000 bytes of xorshift64 noise (13, 7,
/// 17 from 1, the low byte after each step), chunked at 1/4/16 KiB.
fn vector() -> (ChunkIndex, Vec<Vec<u8>>) {
    let text: Vec<u8> = b"slate ".iter().copied().cycle().take(1000).collect();
    let blobs = vec![text, noise(1000, 1)];
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    (index_of(&refs, VECTOR_PARAMS), blobs)
}

const VECTOR_PARAMS: ChunkParams = ChunkParams {
    min: 1 << 10,
    avg: 4 << 10,
    max: 16 << 10,
};

fn index_of(blobs: &[&[u8]], params: ChunkParams) -> ChunkIndex {
    ChunkIndex {
        params,
        blobs: blobs.iter().map(|b| chunk_blob(b, params)).collect(),
    }
}

#[test]
fn the_documented_vector() {
    let (index, blobs) = vector();
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    let (table, packed) = compress(&index, &refs, LEVEL).unwrap();
    let bytes = table.to_bytes();
    assert_eq!(
        hex::encode(sha256(&index.to_bytes())),
        "388cfa2329888767d4e8c71ecf0d2acdec56b486811baf4cf1009f1271db05db"
    );
    // zstd 1.5.7 at level 9: frame header with the content size (1000), no checksum.
    assert_eq!(
        hex::encode(&packed[..23]),
        "28b52ffd60e8026d000030736c617465200100df539522"
    );
    assert_eq!(
        packed.len(),
        23,
        "noise does not compress: it stays raw, not in the blob"
    );
    assert_eq!(
        hex::encode(&bytes),
        "534c5a43484e4b31\
         388cfa2329888767d4e8c71ecf0d2acdec56b486811baf4cf1009f1271db05db\
         ab89188a5cf374319154d5944b6aa21b2eecce577dcf7fca3127631bc4b89d51\
         1700000000000000\
         02000000\
         01\
         17000000\
         ab89188a5cf374319154d5944b6aa21b2eecce577dcf7fca3127631bc4b89d51\
         00"
    );
    assert_eq!(
        hex::encode(sha256(&bytes)),
        "e1f05a882a8b3e86f7b05a48248d84153a5d16aaea34d7ee399a72301ade19ed"
    );
    assert_eq!(
        table.chunks,
        [
            ZChunk::Zstd {
                offset: 0,
                length: 23,
                digest: sha256(&packed)
            },
            ZChunk::Raw
        ]
    );
    assert_eq!(ZTable::parse(&bytes).unwrap(), table);
    let z = table.check(&index).unwrap();
    assert_eq!(z.blob, format!("sha256:{}", hex::encode(sha256(&packed))));
}

#[test]
fn compression_is_reproducible_and_dedupes() {
    let text: Vec<u8> = b"a bundle of text "
        .iter()
        .copied()
        .cycle()
        .take(60_000)
        .collect();
    let blobs = [text.clone(), noise(50_000, 3), text];
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    let index = index_of(&refs, P);
    let one = compress(&index, &refs, LEVEL).unwrap();
    assert_eq!(one, compress(&index, &refs, LEVEL).unwrap());
    // The third blob is the first again: its chunks are stored once.
    assert_eq!(one.0.chunks.len(), distinct_chunks(&index).len());
    assert!(one.0.chunks.len() < index.blobs.iter().map(|b| b.chunks.len()).sum());
    // Noise does not compress: it stays raw, out of the blob; the text is in it, small.
    let raw: u64 = distinct_chunks(&index)
        .iter()
        .zip(&one.0.chunks)
        .filter(|(_, z)| **z == ZChunk::Raw)
        .map(|(c, _)| u64::from(c.length))
        .sum();
    assert!((50_000..50_000 + u64::from(P.max)).contains(&raw), "{raw}");
    assert!(one.1.len() < 2_000, "text compressed: {}", one.1.len());
}

/// What a build cache keeps (`frames`) gives back the same table and blob through
/// `compress_reusing`, for the chunks it knows and those it does not; a kept frame is used as
/// kept (a wrong one would show in the output, which is why the cache keys it by level and
/// zstd's version).
#[test]
fn kept_frames_give_the_same_output() {
    let text: Vec<u8> = b"kept frames "
        .iter()
        .copied()
        .cycle()
        .take(40_000)
        .collect();
    let blobs = [text, noise(40_000, 8)];
    let refs: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    let index = index_of(&refs, P);
    let (table, blob) = compress(&index, &refs, LEVEL).unwrap();
    let kept = frames(&index, &table, &blob).unwrap();
    assert_eq!(kept.len(), table.chunks.len());
    assert!(kept.iter().any(|(_, f)| f.is_none()) && kept.iter().any(|(_, f)| f.is_some()));
    let all: KnownFrames = kept
        .iter()
        .map(|(d, f)| (*d, f.map(<[u8]>::to_vec)))
        .collect();
    assert_eq!(
        compress_reusing(&index, &refs, LEVEL, &all).unwrap(),
        (table.clone(), blob.clone())
    );
    // Half of them known, the rest compressed anew.
    let half: KnownFrames = all
        .iter()
        .step_by(2)
        .map(|(d, f)| (*d, f.clone()))
        .collect();
    assert_eq!(
        compress_reusing(&index, &refs, LEVEL, &half).unwrap(),
        (table.clone(), blob.clone())
    );
    // A kept frame is taken as it is.
    let (digest, frame) = kept.iter().find(|(_, f)| f.is_some()).unwrap();
    let mut other = all.clone();
    let mut changed = frame.unwrap().to_vec();
    changed.push(0);
    other.insert(*digest, Some(changed));
    assert_ne!(
        compress_reusing(&index, &refs, LEVEL, &other).unwrap().1,
        blob
    );
    // A table of another blob describes nothing.
    assert!(frames(&index, &table, &blob[1..]).is_none());
}

/// A build cache's entry of kept frames: written, read back; every cut short refused.
#[test]
fn kept_frames_entries_round_trip_and_cut_ones_are_refused() {
    let frames: Vec<ChunkFrame<'_>> = vec![([1; 32], Some(b"abc")), ([2; 32], None)];
    let bytes = kept_frames_to_bytes(&frames);
    assert_eq!(bytes.len(), 32 + 4 + 3 + 32 + 4);
    let expected: KnownFrames = [([1; 32], Some(b"abc".to_vec())), ([2; 32], None)].into();
    assert_eq!(parse_kept_frames(&bytes), Some(expected));
    for cut in 1..bytes.len() {
        // After the first entry, a whole entry: valid on its own.
        if cut != 39 {
            assert_eq!(parse_kept_frames(&bytes[..cut]), None, "cut at {cut}");
        }
    }
    assert_eq!(parse_kept_frames(&[]), Some(KnownFrames::new()));
}

fn sample() -> (ChunkIndex, ZTable, Vec<u8>) {
    // Text first: entry 0 is a frame, at a fixed place in the table's bytes.
    let mut blob: Vec<u8> = b"slate ".iter().copied().cycle().take(30_000).collect();
    blob.extend(noise(30_000, 9));
    let index = index_of(&[&blob], P);
    let (table, packed) = compress(&index, &[&blob], LEVEL).unwrap();
    (index, table, packed)
}

#[test]
fn parse_refuses_every_truncation_and_trailing_bytes() {
    let (_, table, _) = sample();
    let bytes = table.to_bytes();
    for n in 0..bytes.len() {
        let e = ZTable::parse(&bytes[..n]).unwrap_err();
        assert!(
            matches!(
                e,
                ZTableError::Truncated(_) | ZTableError::Count { .. } | ZTableError::BadMagic
            ),
            "{n}: {e}"
        );
    }
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(ZTable::parse(&long), Err(ZTableError::Trailing(1)));
    assert_eq!(
        ZTable::parse(&vec![0; MAX_ZTABLE_BYTES as usize + 1]),
        Err(ZTableError::TooLarge(MAX_ZTABLE_BYTES + 1))
    );
}

/// `table`'s bytes with `edit` applied to them.
fn edited(table: &ZTable, edit: impl Fn(&mut Vec<u8>)) -> Result<ZTable, ZTableError> {
    let mut bytes = table.to_bytes();
    edit(&mut bytes);
    ZTable::parse(&bytes)
}

#[test]
fn parse_refuses_bad_fields() {
    let (_, table, _) = sample();
    let entry = |_: usize| HEADER;
    assert!(matches!(table.chunks[0], ZChunk::Zstd { .. }));
    assert_eq!(edited(&table, |b| b[0] = b'X'), Err(ZTableError::BadMagic));
    assert_eq!(
        edited(&table, |b| b[entry(0)] = 2),
        Err(ZTableError::BadCoding {
            chunk: 0,
            coding: 2
        })
    );
    assert_eq!(
        edited(&table, |b| b[entry(0) + 1..entry(0) + 5]
            .copy_from_slice(&0u32.to_le_bytes())),
        Err(ZTableError::BadLength {
            chunk: 0,
            length: 0
        })
    );
    assert_eq!(
        edited(&table, |b| b[entry(0) + 1..entry(0) + 5]
            .copy_from_slice(&(MAX_ZCHUNK + 1).to_le_bytes())),
        Err(ZTableError::BadLength {
            chunk: 0,
            length: MAX_ZCHUNK + 1
        })
    );
    // Chunks reaching outside the blob, or not covering it.
    let size = table.blob_size;
    assert_eq!(
        edited(&table, |b| b[72..80]
            .copy_from_slice(&(size - 1).to_le_bytes())),
        Err(ZTableError::SizeMismatch {
            covered: size,
            size: size - 1
        })
    );
    assert!(matches!(
        edited(&table, |b| b[72..80].copy_from_slice(&(size + 1).to_le_bytes())),
        Err(ZTableError::SizeMismatch { covered, .. }) if covered == size
    ));
    // A count the bytes cannot hold is refused before anything is allocated.
    assert!(matches!(
        edited(&table, |b| b[80..84]
            .copy_from_slice(&u32::MAX.to_le_bytes())),
        Err(ZTableError::Count {
            count: u32::MAX,
            ..
        })
    ));
}

#[test]
fn check_binds_the_table_to_its_index() {
    let (index, table, _) = sample();
    table.check(&index).unwrap();
    let other = index_of(&[&noise(10_000, 4)], P);
    assert!(matches!(
        table.check(&other),
        Err(ZTableError::OtherIndex { .. })
    ));
    let mut bad = table.clone();
    let raw_length = index.blobs[0].chunks[0].length;
    let ZChunk::Zstd { length, .. } = &mut bad.chunks[0] else {
        panic!("text compresses");
    };
    *length = raw_length;
    assert!(matches!(
        bad.check(&index),
        Err(ZTableError::Mismatch {
            chunk: 0,
            why: "compressed, but not shorter",
            ..
        })
    ));
    let mut bad = table;
    bad.chunks.pop();
    assert!(matches!(
        bad.check(&index),
        Err(ZTableError::CountMismatch { .. })
    ));
}

/// A registry of blobs by digest, serving ranges and counting what it served.
#[derive(Default)]
struct Registry {
    blobs: HashMap<String, Vec<u8>>,
    served: AtomicUsize,
}
impl Remote for Registry {
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        let bytes = self
            .blobs
            .get(blob)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, blob.to_owned()))?;
        let s = chunk.offset as usize;
        let out = bytes[s..s + chunk.length as usize].to_vec();
        self.served.fetch_add(out.len(), Ordering::SeqCst);
        Ok(out)
    }
}

/// v1 and v2 of a blob (v2: a changed middle, text that compresses), their indexes, v2's
/// compressed chunks, and a registry holding v2's blob and its compressed blob.
fn upgrade() -> (Vec<u8>, BlobChunks, ChunkIndex, ZChunks, Registry, Vec<u8>) {
    let text: Vec<u8> = b"version 1 of a file in the root\n"
        .iter()
        .copied()
        .cycle()
        .take(40_000)
        .collect();
    let mut v1 = noise(60_000, 5);
    v1.extend(&text);
    v1.extend(noise(60_000, 6));
    let mut v2 = v1.clone();
    let changed: Vec<u8> = b"version 2, and more: "
        .iter()
        .copied()
        .cycle()
        .take(40_000)
        .collect();
    v2[60_000..100_000].copy_from_slice(&changed);
    let old = chunk_blob(&v1, P);
    let index = index_of(&[&v2], P);
    let (table, packed) = compress(&index, &[&v2], LEVEL).unwrap();
    let z = table.check(&index).unwrap();
    let mut registry = Registry::default();
    registry
        .blobs
        .insert(index.blobs[0].oci_digest(), v2.clone());
    registry.blobs.insert(z.blob.clone(), packed.clone());
    (v1, old, index, z, registry, v2)
}

fn run(
    v1: &[u8],
    old: &BlobChunks,
    index: &ChunkIndex,
    remote: &dyn Remote,
) -> Result<Vec<u8>, crate::AssembleError> {
    let file = File(v1.to_vec());
    let seeds = [Seed {
        chunks: old,
        file: &file,
    }];
    let cache = Cache::default();
    let target = &index.blobs[0];
    let plan = plan(target, &seeds, Some(&cache))?;
    let mut out = Vec::new();
    assemble(target, &plan, &seeds, &cache, remote, 4, &mut out)?;
    Ok(out)
}

#[test]
fn assembly_from_compressed_remote_and_local_chunks_is_the_blob() {
    let (v1, old, index, z, registry, v2) = upgrade();
    let remote = ZRemote {
        table: Some(&z),
        inner: &registry,
    };
    assert_eq!(run(&v1, &old, &index, &remote).unwrap(), v2);
    let compressed = registry.served.load(Ordering::SeqCst) as u64;
    let estimate = crate::estimate(
        &index,
        &[&ChunkIndex {
            params: P,
            blobs: vec![old.clone()],
        }],
    );
    let raw = estimate.blobs[0].fetch_bytes;
    assert!(
        raw >= 40_000 && compressed * 10 < raw,
        "{compressed} of {raw}"
    );
    let held = ChunkIndex {
        params: P,
        blobs: vec![old],
    };
    assert_eq!(
        compressed_fetch(&index, &[&held], &z),
        (compressed, estimate.blobs[0].fetch_chunks)
    );
}

#[test]
fn without_a_table_chunks_come_raw_from_the_target_blob() {
    let (v1, old, index, z, mut registry, v2) = upgrade();
    // An older bundle: no compressed blob in the registry, no table.
    registry.blobs.remove(&z.blob);
    let remote = ZRemote {
        table: None,
        inner: &registry,
    };
    assert_eq!(run(&v1, &old, &index, &remote).unwrap(), v2);
    assert!(registry.served.load(Ordering::SeqCst) >= 40_000);
    // With a table naming a blob the registry lacks, the assembly fails cleanly (the caller
    // then takes the raw path or the whole blob).
    let remote = ZRemote {
        table: Some(&z),
        inner: &registry,
    };
    let e = run(&v1, &old, &index, &remote).unwrap_err();
    assert!(matches!(e, crate::AssembleError::Fetch { .. }), "{e}");
}

#[test]
fn a_corrupted_compressed_chunk_is_refused_before_decompression() {
    let (v1, old, index, z, mut registry, _) = upgrade();
    let (offset, length, digest) = z
        .by_raw
        .values()
        .find_map(|c| match *c {
            ZChunk::Zstd {
                offset,
                length,
                digest,
            } => Some((offset, length, digest)),
            ZChunk::Raw => None,
        })
        .unwrap();
    // A valid zstd frame of other bytes, at the same length: decompressing it would succeed,
    // so only the compressed digest can refuse it.
    let packed = registry.blobs.get_mut(&z.blob).unwrap();
    let start = offset as usize;
    let mut forged = zstd::bulk::compress(&vec![b'x'; 100_000], 3).unwrap();
    forged.resize(length as usize, 0);
    packed[start..start + length as usize].copy_from_slice(&forged);
    let remote = ZRemote {
        table: Some(&z),
        inner: &registry,
    };
    let e = run(&v1, &old, &index, &remote).unwrap_err();
    let text = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(text.contains("refused before decompression"), "{text}");
    assert!(text.contains(&hex::encode(digest)), "{text}");
}

#[test]
fn an_over_long_decompression_is_refused() {
    // A frame whose digest the table vouches for but that inflates past its chunk's length.
    let bomb = zstd::bulk::compress(&vec![0; 1 << 20], 3).unwrap();
    let raw = vec![0u8; 4096];
    let chunk = Chunk {
        offset: 0,
        length: 4096,
        digest: sha256(&raw),
    };
    let z = ZChunks {
        blob: format!("sha256:{}", hex::encode(sha256(&bomb))),
        by_raw: HashMap::from([(
            chunk.digest,
            ZChunk::Zstd {
                offset: 0,
                length: bomb.len() as u32,
                digest: sha256(&bomb),
            },
        )]),
    };
    let mut registry = Registry::default();
    registry.blobs.insert(z.blob.clone(), bomb.clone());
    let remote = ZRemote {
        table: Some(&z),
        inner: &registry,
    };
    let e = remote.fetch("sha256:target", &chunk).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("at most 4096 bytes"), "{e}");
    // A frame without its size in the header (a streamed one) is capped the same way, and one
    // that inflates short is refused too.
    let streamed = zstd::stream::encode_all(&vec![0u8; 1 << 20][..], 3).unwrap();
    assert!(inflate(&streamed, 4096)
        .unwrap_err()
        .contains("at most 4096"));
    let short = zstd::bulk::compress(&[0; 100], 3).unwrap();
    assert!(inflate(&short, 4096)
        .unwrap_err()
        .contains("into 100 bytes"));
    assert_eq!(inflate(&short, 100).unwrap(), vec![0; 100]);
}
