use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::chunk_blob;
use crate::test_data::{noise, Cache, File, SMALL as P};

/// The target blob, counting requests and bytes; `corrupt` flips a byte of that offset's chunk.
struct Blob {
    bytes: Vec<u8>,
    corrupt: Option<u64>,
    requests: AtomicUsize,
    served: AtomicUsize,
}
impl Blob {
    fn new(bytes: Vec<u8>) -> Blob {
        Blob {
            bytes,
            corrupt: None,
            requests: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
        }
    }
}
impl Remote for Blob {
    fn fetch(&self, _blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.served
            .fetch_add(chunk.length as usize, Ordering::SeqCst);
        let start = chunk.offset as usize;
        let mut out = self.bytes[start..start + chunk.length as usize].to_vec();
        if self.corrupt == Some(chunk.offset) {
            out[0] ^= 1;
        }
        Ok(out)
    }
}

/// v1, and v2 = v1 with 3000 bytes inserted in the middle and 100 changed near the end.
fn versions() -> (Vec<u8>, Vec<u8>) {
    let v1 = noise(400_000, 3);
    let mut v2 = v1.clone();
    v2.splice(200_000..200_000, noise(3000, 9));
    for b in &mut v2[390_000..390_100] {
        *b ^= 0x55;
    }
    (v1, v2)
}

#[test]
fn a_mix_of_local_and_fetched_chunks_assembles_the_exact_blob() {
    let (v1, v2) = versions();
    let (old, new) = (chunk_blob(&v1, P), chunk_blob(&v2, P));
    let file = File(v1);
    let seeds = [Seed {
        chunks: &old,
        file: &file,
    }];
    let cache = Cache::default();
    let remote = Blob::new(v2.clone());
    let plan = plan(&new, &seeds, Some(&cache)).unwrap();
    assert!(plan.worth_it());
    assert_eq!(plan.fetch_bytes + plan.reuse_bytes, v2.len() as u64);
    // An insertion and a small change cost a handful of 4 KiB chunks, not the blob.
    assert!(plan.fetch_chunks <= 8, "{plan:?}");
    assert!(plan.fetch_bytes < 40_000, "{}", plan.fetch_bytes);
    let mut out = Vec::new();
    let done = assemble(&new, &plan, &seeds, &cache, &remote, 4, &mut out).unwrap();
    assert_eq!(out, v2);
    assert_eq!(done.fetched_bytes, plan.fetch_bytes);
    assert_eq!(
        remote.served.load(Ordering::SeqCst) as u64,
        plan.fetch_bytes
    );
    assert_eq!(remote.requests.load(Ordering::SeqCst), plan.fetch_chunks);

    // Again, as after an interruption: what was fetched is in the cache, nothing is fetched.
    let again = super::plan(&new, &seeds, Some(&cache)).unwrap();
    assert_eq!((again.fetch_bytes, again.fetch_chunks), (0, 0));
    let remote = Blob::new(v2.clone());
    let mut out = Vec::new();
    assemble(&new, &again, &seeds, &cache, &remote, 4, &mut out).unwrap();
    assert_eq!((out, remote.requests.load(Ordering::SeqCst)), (v2, 0));
}

#[test]
fn a_corrupted_local_chunk_is_not_reused() {
    let (v1, v2) = versions();
    let (old, new) = (chunk_blob(&v1, P), chunk_blob(&v2, P));
    let clean = File(v1.clone());
    let baseline = plan(
        &new,
        &[Seed {
            chunks: &old,
            file: &clean,
        }],
        None,
    )
    .unwrap();
    // One bit of the running blob's first chunk flipped, as rot on the ESP would.
    let mut rotten = v1;
    rotten[10] ^= 1;
    let rotten = File(rotten);
    let seeds = [Seed {
        chunks: &old,
        file: &rotten,
    }];
    let plan = plan(&new, &seeds, None).unwrap();
    assert_eq!(plan.sources[0], Source::Fetch);
    assert_eq!(plan.fetch_chunks, baseline.fetch_chunks + 1);
    // Said, so the node can tell its owner which bytes of the running blob went bad.
    assert!(baseline.refused.is_empty());
    assert_eq!(
        plan.refused,
        [Refused {
            seed: 0,
            chunk: old.chunks[0]
        }]
    );
    let remote = Blob::new(v2.clone());
    let mut out = Vec::new();
    assemble(&new, &plan, &seeds, &Cache::default(), &remote, 2, &mut out).unwrap();
    assert_eq!(out, v2);
    // A second seed listing the same chunks (the running installer in the root and in the
    // bundle) stands in for the rotten one: nothing more is fetched.
    let both = [
        seeds[0],
        Seed {
            chunks: &old,
            file: &clean,
        },
    ];
    let plan = super::plan(&new, &both, None).unwrap();
    assert_eq!(plan.fetch_chunks, baseline.fetch_chunks);
    assert_eq!(plan.sources[0], Source::Seed { seed: 1, offset: 0 });
    assert_eq!(plan.refused.len(), 1);
    // A cached chunk whose bytes rotted is fetched again, not used.
    let cache = Cache::default();
    cache.put(&new.chunks[0].digest, b"not the chunk").unwrap();
    let plan = super::plan(&new, &[], Some(&cache)).unwrap();
    assert_eq!(plan.reuse_chunks, 0);
}

#[test]
fn a_corrupted_remote_chunk_is_refused_by_its_digest() {
    let (v1, v2) = versions();
    let (old, new) = (chunk_blob(&v1, P), chunk_blob(&v2, P));
    let file = File(v1);
    let seeds = [Seed {
        chunks: &old,
        file: &file,
    }];
    let plan = plan(&new, &seeds, None).unwrap();
    let bad = plan
        .sources
        .iter()
        .position(|s| *s == Source::Fetch)
        .unwrap();
    let mut remote = Blob::new(v2);
    remote.corrupt = Some(new.chunks[bad].offset);
    let cache = Cache::default();
    let mut out = Vec::new();
    let err = assemble(&new, &plan, &seeds, &cache, &remote, 3, &mut out).unwrap_err();
    assert!(
        matches!(err, AssembleError::RemoteCorrupt { index, .. } if index == bad),
        "{err}"
    );
    assert!(
        out.is_empty(),
        "nothing is written before every chunk is in hand"
    );
    assert!(cache.get(&new.chunks[bad].digest).unwrap().is_none());
}

#[test]
fn with_nothing_in_common_a_whole_download_is_chosen() {
    let other = chunk_blob(&noise(100_000, 5), P);
    let target = chunk_blob(&noise(100_000, 6), P);
    let file = File(noise(100_000, 5));
    let plan = plan(
        &target,
        &[Seed {
            chunks: &other,
            file: &file,
        }],
        None,
    )
    .unwrap();
    assert_eq!(plan.reuse_bytes, 0);
    assert!(!plan.worth_it());
}
