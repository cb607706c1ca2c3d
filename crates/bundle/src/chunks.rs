//! Chunk digests: a large layer's SHA-256 per fixed-size chunk, carried as two annotations of
//! its descriptor in the (signed) image manifest, so that the blob can be verified on every core
//! at once. SHA-256 is sequential: one digest over 256 MiB takes one core 0.15–0.26 s here, as
//! long as writing the bytes out, and "a tampered bundle is refused before a single byte is
//! written" puts that whole time in front of the first write. Per-chunk digests divide it by
//! the cores (docs/formats.md §7.1, "Chunk digests"; `xtask bench-apply`'s floors measure both).
//!
//! The annotations sit in the image manifest, not in the bundle manifest: readers ignore
//! annotations they do not know, while older slate refuses unknown bundle-manifest fields, so a
//! bundle with chunk digests still opens (and is verified whole) under an older slate.
//!
//! - `dev.slate.chunk-size`: the chunk size in bytes, decimal with no leading zero, a power of
//!   two from 1 MiB to 1 GiB; every chunk but the last is that long.
//! - `dev.slate.chunk-digests`: the chunks' digests in order, comma-separated, exactly as many
//!   as the layer's size needs (at least one).
//!
//! Both or neither; anything else refuses the bundle when its manifest is read.

use std::collections::HashMap;

use crate::digest::count_hashed;
use crate::Digest;

pub const CHUNK_SIZE_ANNOTATION: &str = "dev.slate.chunk-size";
pub const CHUNK_DIGESTS_ANNOTATION: &str = "dev.slate.chunk-digests";

/// The chunk size slate writes.
pub const CHUNK_SIZE: u64 = 8 << 20;
/// Layers from this size on get chunk digests when written (the size from which a blob is
/// mapped rather than read, `mapped::MAP_MIN`).
pub const CHUNKED_MIN: u64 = 16 << 20;
const MIN_CHUNK: u64 = 1 << 20;
const MAX_CHUNK: u64 = 1 << 30;
/// Threads a verification uses at most: beyond this, memory bandwidth is the limit.
const MAX_THREADS: usize = 8;

/// A layer's chunk digests, checked against the layer's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkDigests {
    size: u64,
    digests: Vec<Digest>,
}

/// The first chunk whose bytes do not match, with both digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkMismatch {
    pub index: usize,
    /// Byte range of the chunk in the blob.
    pub start: u64,
    pub end: u64,
    pub expected: Digest,
    pub actual: Digest,
}

impl ChunkDigests {
    /// The digests of `bytes` in chunks of `size` bytes (a power of two, 1 MiB – 1 GiB).
    pub fn of(bytes: &[u8], size: u64) -> ChunkDigests {
        assert!(valid_chunk_size(size), "chunk size {size}");
        ChunkDigests {
            size,
            digests: chunks_of(bytes, size).into_iter().map(Digest::of).collect(),
        }
    }

    /// The chunk digests a layer of `layer_size` bytes declares in `annotations`: `Ok(None)`
    /// when it declares none; an error naming the fault when they are malformed.
    pub fn from_annotations(
        annotations: Option<&HashMap<String, String>>,
        layer_size: u64,
    ) -> Result<Option<ChunkDigests>, String> {
        let get = |key| annotations.and_then(|a| a.get(key)).map(String::as_str);
        let (size, digests) = match (get(CHUNK_SIZE_ANNOTATION), get(CHUNK_DIGESTS_ANNOTATION)) {
            (None, None) => return Ok(None),
            (Some(size), Some(digests)) => (size, digests),
            _ => {
                return Err(format!(
                    "{CHUNK_SIZE_ANNOTATION} and {CHUNK_DIGESTS_ANNOTATION} come together"
                ))
            }
        };
        let size = parse_chunk_size(size)?;
        let digests = digests
            .split(',')
            .map(|text| Digest::parse(text).map_err(|e| format!("{CHUNK_DIGESTS_ANNOTATION}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let needed = layer_size.div_ceil(size).max(1);
        if digests.len() as u64 != needed {
            return Err(format!(
                "{CHUNK_DIGESTS_ANNOTATION} lists {} digests; {layer_size} bytes in chunks of \
                 {size} need {needed}",
                digests.len()
            ));
        }
        Ok(Some(ChunkDigests { size, digests }))
    }

    /// The two annotations, as written into the layer's descriptor.
    pub fn annotations(&self) -> [(&'static str, String); 2] {
        let digests: Vec<&str> = self.digests.iter().map(Digest::as_str).collect();
        [
            (CHUNK_SIZE_ANNOTATION, self.size.to_string()),
            (CHUNK_DIGESTS_ANNOTATION, digests.join(",")),
        ]
    }

    pub fn chunk_size(&self) -> u64 {
        self.size
    }

    pub fn digests(&self) -> &[Digest] {
        &self.digests
    }

    /// Hashes `bytes` chunk by chunk on up to as many threads as there are cores and compares
    /// every chunk; the calling thread is credited with the bytes hashed
    /// ([`crate::hashed_on_this_thread`]). `bytes` must be the layer's bytes (its size checked
    /// by the caller).
    pub fn verify(&self, bytes: &[u8]) -> Result<(), ChunkMismatch> {
        let chunks = chunks_of(bytes, self.size);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let threads = cores.min(MAX_THREADS).min(chunks.len()).max(1);
        // Thread t takes chunks t, t + threads, …: neighbours hash at once, and the last
        // (shorter) chunk costs no thread a whole chunk more than another.
        let actual: Vec<Digest> = std::thread::scope(|s| {
            let hashing: Vec<_> = (0..threads)
                .map(|t| {
                    let chunks = &chunks;
                    s.spawn(move || {
                        chunks
                            .iter()
                            .skip(t)
                            .step_by(threads)
                            .map(|chunk| Digest::of(chunk))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let per_thread: Vec<Vec<Digest>> = hashing
                .into_iter()
                .map(|h| h.join().expect("a hashing thread panicked"))
                .collect();
            (0..chunks.len())
                .map(|i| per_thread[i % threads][i / threads].clone())
                .collect()
        });
        count_hashed(bytes.len() as u64);
        let found = self.digests.iter().zip(&actual).position(|(e, a)| e != a);
        match found {
            None if actual.len() == self.digests.len() => Ok(()),
            found => {
                let index = found.unwrap_or(actual.len().min(self.digests.len()));
                let start = index as u64 * self.size;
                Err(ChunkMismatch {
                    index,
                    start,
                    end: (start + self.size).min(bytes.len() as u64),
                    expected: self
                        .digests
                        .get(index)
                        .cloned()
                        .unwrap_or_else(|| Digest::of(&[])),
                    actual: actual
                        .get(index)
                        .cloned()
                        .unwrap_or_else(|| Digest::of(&[])),
                })
            }
        }
    }
}

/// `bytes` in chunks of `size`; an empty blob is one empty chunk.
fn chunks_of(bytes: &[u8], size: u64) -> Vec<&[u8]> {
    if bytes.is_empty() {
        return vec![bytes];
    }
    bytes.chunks(size as usize).collect()
}

fn valid_chunk_size(size: u64) -> bool {
    size.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(&size)
}

fn parse_chunk_size(text: &str) -> Result<u64, String> {
    // One spelling per number, as for digests: plain digits, no sign, no leading zero.
    let canonical = text.bytes().all(|b| b.is_ascii_digit()) && !text.starts_with('0');
    let size = text
        .parse::<u64>()
        .ok()
        .filter(|_| canonical)
        .ok_or_else(|| {
            format!("{CHUNK_SIZE_ANNOTATION} {text:?} is not a decimal number (no leading zero)")
        })?;
    if !valid_chunk_size(size) {
        return Err(format!(
            "{CHUNK_SIZE_ANNOTATION} {size} is not a power of two from {MIN_CHUNK} to {MAX_CHUNK}"
        ));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(size: &str, digests: &str) -> HashMap<String, String> {
        HashMap::from([
            (CHUNK_SIZE_ANNOTATION.to_owned(), size.to_owned()),
            (CHUNK_DIGESTS_ANNOTATION.to_owned(), digests.to_owned()),
        ])
    }

    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i ^ (i >> 11)) as u8).collect()
    }

    #[test]
    fn chunk_digests_round_trip_through_their_annotations_and_verify() {
        let data = bytes(5 * (1 << 20) + 17);
        let chunks = ChunkDigests::of(&data, 1 << 20);
        assert_eq!(chunks.digests().len(), 6);
        assert_eq!(chunks.digests()[5], Digest::of(&data[5 << 20..]));
        let map: HashMap<String, String> = chunks
            .annotations()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let parsed = ChunkDigests::from_annotations(Some(&map), data.len() as u64).unwrap();
        assert_eq!(parsed.as_ref(), Some(&chunks));
        let before = crate::hashed_on_this_thread();
        chunks.verify(&data).unwrap();
        assert_eq!(crate::hashed_on_this_thread() - before, data.len() as u64);
        assert_eq!(ChunkDigests::from_annotations(None, 10).unwrap(), None);
    }

    /// docs/formats.md §7.1's vector: bytes `i % 251` for i < 2 MiB + 3, chunks of 1 MiB.
    #[test]
    fn the_documented_vector() {
        let data: Vec<u8> = (0..(2usize << 20) + 3).map(|i| (i % 251) as u8).collect();
        let chunks = ChunkDigests::of(&data, 1 << 20);
        let [size, digests] = chunks.annotations();
        assert_eq!(size, (CHUNK_SIZE_ANNOTATION, "1048576".to_owned()));
        assert_eq!(
            digests.1,
            "sha256:631b84027d6b9e52b539c4e8373622d23032dfadc64d60af87339c9037e4f769,\
             sha256:729b9155f00261a681000ccd0ff20e750ed3d525b5b1e6fc961837a3bb666fd6,\
             sha256:bcad817b76c3a321a134c26ee63b549b42244d30a0fae10f19a2e1d1cb0bc15d"
        );
        assert_eq!(
            Digest::of(&data).as_str(),
            "sha256:9d5bd11e1a0db7e737b58c7b3c0eaabeab2d7adb4b328b455607f2c50ad029d2"
        );
    }

    #[test]
    fn a_changed_byte_is_found_in_its_chunk() {
        let mut data = bytes(3 << 20);
        let chunks = ChunkDigests::of(&data, 1 << 20);
        data[(2 << 20) + 5] ^= 1;
        let mismatch = chunks.verify(&data).unwrap_err();
        assert_eq!(
            (mismatch.index, mismatch.start, mismatch.end),
            (2, 2 << 20, 3 << 20)
        );
        assert_eq!(mismatch.expected, chunks.digests()[2]);
        assert_eq!(mismatch.actual, Digest::of(&data[2 << 20..]));
        // A blob shorter than its digests say is refused too.
        let mismatch = chunks.verify(&data[..2 << 20]).unwrap_err();
        assert_eq!(mismatch.index, 2);
    }

    #[test]
    fn malformed_chunk_annotations_are_refused_naming_the_fault() {
        let one = Digest::of(b"x").to_string();
        let two = format!("{one},{one}");
        let size = (1u64 << 20).to_string();
        let cases: &[(HashMap<String, String>, u64, &str)] = &[
            (annotated(&size, &one), (2 << 20) + 1, "lists 1 digests"),
            (annotated(&size, &two), 1 << 20, "lists 2 digests"),
            (annotated("1048577", &one), 10, "not a power of two"),
            (annotated("524288", &one), 10, "not a power of two"),
            (annotated("2147483648", &one), 10, "not a power of two"),
            (annotated("+1048576", &one), 10, "not a decimal number"),
            (annotated("01048576", &one), 10, "not a decimal number"),
            (annotated(&size, "sha256:ABC"), 10, "not a sha256 digest"),
            (annotated(&size, &format!("{one},")), 10, "is not a digest"),
            (
                HashMap::from([(CHUNK_SIZE_ANNOTATION.to_owned(), size.clone())]),
                10,
                "come together",
            ),
        ];
        for (map, layer, fault) in cases {
            let err = ChunkDigests::from_annotations(Some(map), *layer).unwrap_err();
            assert!(err.contains(fault), "{map:?}: {err}");
        }
        // An empty layer has one (empty) chunk.
        let empty = annotated(&size, Digest::of(&[]).as_ref());
        assert!(ChunkDigests::from_annotations(Some(&empty), 0)
            .unwrap()
            .is_some());
    }
}
