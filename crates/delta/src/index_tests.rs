use super::*;
use crate::{chunk_blob, sha256};

const VECTOR_PARAMS: ChunkParams = ChunkParams {
    min: 1 << 10,
    avg: 4 << 10,
    max: 16 << 10,
};

/// docs/formats.md §7.7's vector: 20000 bytes, byte i = bits 24..32 of (i × 2654435761 mod
/// 2³²) (Knuth's multiplicative hash: varied enough for the rolling hash to cut).
fn vector_bytes() -> Vec<u8> {
    (0u32..20_000)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

fn vector() -> ChunkIndex {
    ChunkIndex {
        params: VECTOR_PARAMS,
        blobs: vec![chunk_blob(&vector_bytes(), VECTOR_PARAMS)],
    }
}

#[test]
fn the_documented_vector() {
    let index = vector();
    let lengths: Vec<u32> = index.blobs[0].chunks.iter().map(|c| c.length).collect();
    assert_eq!(lengths, [1146, 2687, 1494, 6765, 2687, 5221]);
    assert_eq!(
        index.blobs[0].oci_digest(),
        "sha256:21d9fe8ebb5012b51d986ceb4433fd5d86c7ff3ca3b026216043e64a93492740"
    );
    let bytes = index.to_bytes();
    assert_eq!(bytes.len(), 24 + 44 + 6 * 44);
    assert_eq!(
        hex::encode(&bytes[..24]),
        "534c4348554e4b31000400000010000000400000\
         01000000"
    );
    assert_eq!(
        hex::encode(sha256(&bytes)),
        "7758c5ffa76d8f0731dbf7ac0de6024a7e599c587a0559fbb332ddafbada27b3"
    );
    assert_eq!(ChunkIndex::parse(&bytes).unwrap(), index);
    assert!(index.blob(&index.blobs[0].oci_digest()).is_some());
    assert!(index.blob("sha256:00").is_none());
}

/// Byte offsets in the vector's bytes: header 24, blob header 44, chunk `c` at 68 + 44·c.
fn chunk_at(c: usize) -> usize {
    68 + 44 * c
}

fn refused(bytes: &[u8]) -> String {
    ChunkIndex::parse(bytes).unwrap_err().to_string()
}

#[test]
fn malformed_indexes_are_refused_naming_the_fault() {
    let good = vector().to_bytes();
    let with = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        refused(&b)
    };
    let put_u32 =
        |b: &mut Vec<u8>, at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let put_u64 =
        |b: &mut Vec<u8>, at: usize, v: u64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    let cases: Vec<(String, &str)> = vec![
        (with(&|b| b[0] = b'X'), "does not start with"),
        (refused(&good[..5]), "ends inside the magic"),
        (refused(&good[..30]), "ends inside blob 0's header"),
        (
            refused(&good[..good.len() - 1]),
            "6 chunks cannot fit in the 263 bytes",
        ),
        (with(&|b| put_u32(b, 8, 10)), "not ones FastCDC takes"),
        (with(&|b| put_u32(b, 12, 512)), "not ones FastCDC takes"),
        // Odd sizes: v2020 would cut a byte off where they say.
        (with(&|b| put_u32(b, 8, 1025)), "not ones FastCDC takes"),
        (with(&|b| put_u32(b, 20, 0)), "lists 0 blobs"),
        (with(&|b| put_u32(b, 20, 17)), "lists 17 blobs"),
        (with(&|b| put_u32(b, 20, 2)), "ends inside blob 1's header"),
        // Overlap: chunk 2 starting one byte early.
        (
            with(&|b| put_u64(b, chunk_at(2), 1146 + 2687 - 1)),
            "(overlap)",
        ),
        (with(&|b| put_u64(b, chunk_at(2), 1146 + 2687 + 1)), "(gap)"),
        (with(&|b| put_u32(b, chunk_at(0) + 8, 0)), "length 0"),
        (
            with(&|b| put_u32(b, chunk_at(0) + 8, 20_000)),
            "length 20000",
        ),
        // Lengths not summing to the size, either way.
        (
            with(&|b| put_u64(b, 56, 19_999)),
            "cover 20000 bytes, the blob is 19999",
        ),
        (
            with(&|b| put_u64(b, 56, 20_001)),
            "cover 20000 bytes, the blob is 20001",
        ),
        // An absurd count is refused before any allocation.
        (
            with(&|b| put_u32(b, 64, u32::MAX)),
            "4294967295 chunks cannot fit",
        ),
        (with(&|b| b.push(0)), "1 bytes after its last blob"),
    ];
    for (err, fault) in &cases {
        assert!(err.contains(fault), "expected {fault:?}: {err}");
    }
    // The same blob twice.
    let mut twice = vector();
    twice.blobs.push(twice.blobs[0].clone());
    assert!(refused(&twice.to_bytes()).contains("lists blob sha256:21d9fe8e"));
    let huge = vec![0u8; MAX_INDEX_BYTES as usize + 1];
    assert!(refused(&huge).contains("more than 16777216"));
}

#[test]
fn an_empty_blob_has_no_chunks_and_round_trips() {
    let index = ChunkIndex {
        params: VECTOR_PARAMS,
        blobs: vec![chunk_blob(&[], VECTOR_PARAMS)],
    };
    assert!(index.blobs[0].chunks.is_empty());
    assert_eq!(ChunkIndex::parse(&index.to_bytes()).unwrap(), index);
}
