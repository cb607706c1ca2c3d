//! A large blob (a UKI) handed to its writer without a private copy: the file is mapped, hashed
//! from the mapping, and the writer reads the same page-cache pages. Reading 256 MiB into fresh
//! memory cost more than hashing it: every 4 KiB page was faulted in and zeroed before the copy
//! (0.35 s of a 0.9 s `bench-apply` run on the 2-core CI machine).
//!
//! A mapping shows later changes to the file, so the bytes written could differ from the bytes
//! hashed. A blob is therefore mapped only when nobody but the caller can change it: the file is
//! owned by the effective user or by root and neither its group nor others may write it — and
//! whoever still can, can write the target disk directly. Otherwise it is read into private
//! memory as before ([`crate::blob::read_blob`]). A writer with those rights who truncated the
//! file would end this process with `SIGBUS`; an upgrade writes before its flip, so to the
//! crash matrix that is a power cut, which leaves the old version booting.

use std::fmt;
use std::fs::File;
use std::ops::Deref;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Mutex;

use crate::blob::{self, blob_path, lock, BlobReader};
use crate::{BundleError, ChunkDigests, Digest, Hasher, VerifiedBlobs};

/// Blobs from this size on are mapped (when [`private_to_caller`]); a smaller one is simply read.
pub(crate) const MAP_MIN: u64 = 16 << 20;

/// A verified blob's bytes: mapped from its file, or read into memory.
pub enum BlobBytes {
    Owned(Vec<u8>),
    Mapped(memmap2::Mmap),
}

impl Deref for BlobBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            BlobBytes::Owned(bytes) => bytes,
            BlobBytes::Mapped(map) => map,
        }
    }
}

impl fmt::Debug for BlobBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self {
            BlobBytes::Owned(_) => "owned",
            BlobBytes::Mapped(_) => "mapped",
        };
        write!(f, "BlobBytes({how}, {} bytes)", self.len())
    }
}

impl BlobBytes {
    pub fn is_mapped(&self) -> bool {
        matches!(self, BlobBytes::Mapped(_))
    }
}

/// Whether only the effective user (or root) can change the file behind `file`.
fn private_to_caller(file: &File) -> bool {
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let owner = meta.uid();
    (owner == 0 || owner == rustix::process::geteuid().as_raw()) && meta.mode() & 0o022 == 0
}

/// The blob `digest` of `size` bytes, verified (size, then hash unless verified before), mapped
/// when it is large and private to the caller (module documentation), else read.
pub(crate) fn map_blob(
    dir: &Path,
    what: &str,
    digest: &Digest,
    size: u64,
    chunks: Option<&ChunkDigests>,
    verified: &Mutex<VerifiedBlobs>,
) -> Result<BlobBytes, BundleError> {
    let read = || blob::read_blob(dir, what, digest, size, u64::MAX, chunks, verified);
    if size < MAP_MIN {
        return read().map(BlobBytes::Owned);
    }
    let reader = BlobReader::open(dir, what, digest, size, verified)?;
    let file = reader.file();
    if !private_to_caller(file) {
        return read().map(BlobBytes::Owned);
    }
    let path = blob_path(dir, digest);
    let len = usize::try_from(size).map_err(|_| blob::declared_too_large(what, size))?;
    // SAFETY: mapping is a syscall with no Rust-level preconditions; what the slice then relies
    // on is that the file's bytes and length do not change while it is mapped. The file is a
    // regular file of exactly `size` bytes (checked at open) that only this user or root can
    // write (`private_to_caller`); the consequences if such a writer changes it anyway are in
    // the module documentation.
    #[allow(unsafe_code)]
    let map =
        unsafe { memmap2::MmapOptions::new().len(len).populate().map(file) }.map_err(|source| {
            BundleError::Io {
                path: path.clone(),
                source,
            }
        })?;
    if reader.hashes() {
        match chunks {
            // Signed chunk digests cover every byte: checked on all cores (`crate::chunks`).
            Some(chunks) => chunks
                .verify(&map)
                .map_err(|m| blob::chunk_mismatch(what, &m))?,
            None => {
                let mut hasher = Hasher::new();
                hasher.update(&map);
                let actual = hasher.finish();
                if actual != *digest {
                    return Err(BundleError::DigestMismatch {
                        what: what.to_owned(),
                        expected: digest.to_string(),
                        actual: actual.to_string(),
                    });
                }
            }
        }
        lock(verified).insert(digest.clone(), size);
    }
    Ok(BlobBytes::Mapped(map))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn layout_with(bytes: &[u8]) -> (tempfile::TempDir, Digest, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let digest = Digest::of(bytes);
        let path = blob_path(dir.path(), &digest);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        (dir, digest, path)
    }

    fn large() -> Vec<u8> {
        (0..MAP_MIN + 4_321).map(|i| (i ^ (i >> 9)) as u8).collect()
    }

    /// A large private blob is mapped, hashed once and remembered; a flipped byte is refused
    /// before anything is returned.
    #[test]
    fn a_large_private_blob_is_mapped_and_hashed_once() {
        let bytes = large();
        let (dir, digest, path) = layout_with(&bytes);
        let size = bytes.len() as u64;
        let verified = Mutex::new(VerifiedBlobs::new());
        let start = crate::hashed_on_this_thread();
        let blob = map_blob(dir.path(), "the UKI", &digest, size, None, &verified).unwrap();
        assert!(blob.is_mapped(), "{blob:?}");
        assert!(*blob == *bytes);
        assert_eq!(crate::hashed_on_this_thread() - start, size);
        assert!(lock(&verified).contains(&digest, size));
        let again = map_blob(dir.path(), "the UKI", &digest, size, None, &verified).unwrap();
        assert_eq!(
            crate::hashed_on_this_thread() - start,
            size,
            "verified before: not hashed again"
        );
        drop((blob, again));

        let mut flipped = bytes.clone();
        flipped[MAP_MIN as usize / 2] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let fresh = Mutex::new(VerifiedBlobs::new());
        let err = map_blob(dir.path(), "the UKI", &digest, size, None, &fresh).unwrap_err();
        assert!(matches!(err, BundleError::DigestMismatch { .. }), "{err:?}");
        assert!(lock(&fresh).is_empty());
    }

    /// With chunk digests the mapped blob is checked chunk by chunk (each byte hashed once, on
    /// all cores); a flipped byte is refused naming its chunk, and nothing is remembered.
    #[test]
    fn a_chunked_blob_is_verified_by_its_chunks_and_a_flipped_byte_named() {
        let bytes = large();
        let (dir, digest, path) = layout_with(&bytes);
        let size = bytes.len() as u64;
        let chunks = ChunkDigests::of(&bytes, 1 << 20);
        let verified = Mutex::new(VerifiedBlobs::new());
        let start = crate::hashed_on_this_thread();
        let blob = map_blob(
            dir.path(),
            "the UKI",
            &digest,
            size,
            Some(&chunks),
            &verified,
        )
        .unwrap();
        assert!(blob.is_mapped() && *blob == *bytes);
        assert_eq!(crate::hashed_on_this_thread() - start, size);
        assert!(lock(&verified).contains(&digest, size));
        drop(blob);

        let mut flipped = bytes.clone();
        flipped[(3 << 20) + 7] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let fresh = Mutex::new(VerifiedBlobs::new());
        let err =
            map_blob(dir.path(), "the UKI", &digest, size, Some(&chunks), &fresh).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("the UKI, chunk 3 (bytes 3145728..4194304) does not match"),
            "{err}"
        );
        assert!(lock(&fresh).is_empty());
    }

    /// A blob others may write is copied, not mapped (and still verified); so is a small one.
    #[test]
    fn a_blob_others_may_write_or_a_small_one_is_read_not_mapped() {
        let bytes = large();
        let (dir, digest, path) = layout_with(&bytes);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let verified = Mutex::new(VerifiedBlobs::new());
        let blob = map_blob(
            dir.path(),
            "the UKI",
            &digest,
            bytes.len() as u64,
            None,
            &verified,
        )
        .unwrap();
        assert!(!blob.is_mapped(), "{blob:?}");
        assert!(*blob == *bytes);

        let small = b"a small blob".to_vec();
        let (dir, digest, _) = layout_with(&small);
        let blob = map_blob(dir.path(), "the UKI", &digest, 12, None, &verified).unwrap();
        assert!(!blob.is_mapped());
        assert_eq!(&*blob, &small[..]);
    }
}
