//! Reading blobs by digest: the size is checked before a byte is read, the hash as the bytes go
//! by, and a blob that matched once is remembered ([`VerifiedBlobs`]) so that the same process
//! never hashes it again. Only regular files are opened ([`open_regular`]): a FIFO, a device, a
//! socket or a symbolic link in a layout is refused, never waited on.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{BundleError, ChunkDigests, ChunkMismatch, Digest, Hasher};

/// Blobs known to match their digests, with their sizes: hashed in this process as they were
/// received (machined's upload), or by an earlier read. A blob listed here is read with a size
/// check only. Whoever fills the set vouches that the files have not changed since they were
/// hashed (they live in directories only slate writes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifiedBlobs(BTreeMap<Digest, u64>);

impl VerifiedBlobs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Record that the blob `digest` of `size` bytes was hashed and matched.
    pub fn insert(&mut self, digest: Digest, size: u64) {
        self.0.insert(digest, size);
    }

    /// Whether `digest` was verified with exactly `size` bytes.
    pub fn contains(&self, digest: &Digest, size: u64) -> bool {
        self.0.get(digest) == Some(&size)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Digest, u64)> {
        self.0.iter().map(|(d, s)| (d, *s))
    }

    /// The sum of the sizes: how many bytes were hashed to fill the set (saturating).
    pub fn total_bytes(&self) -> u64 {
        self.0
            .values()
            .fold(0, |sum, size| sum.saturating_add(*size))
    }
}

/// No file is larger (`off_t` is signed): a descriptor declaring more names no blob.
pub(crate) const MAX_FILE_BYTES: u64 = i64::MAX as u64;

pub use slate_files::irregular_kind;

/// Open `path` for reading, only if it is a regular file: a FIFO would block the open until a
/// writer came (`slate verify` hung on a FIFO `index.json`), a device could be read without
/// end, a link points anywhere. The name is looked at without following a link before it is
/// opened, and what was opened is checked again. A refusal is an `Io` error of kind
/// `InvalidInput` saying what the file is.
pub(crate) fn open_regular(path: &Path) -> Result<File, BundleError> {
    slate_files::open_regular_no_link(path, "").map_err(|e| BundleError::Io {
        path: path.to_owned(),
        source: match e {
            slate_files::FileError::NotAFile { kind, .. } => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("it is {kind}, not a regular file: refused"),
            ),
            slate_files::FileError::Io { source, .. } => source,
            other => other.into_io(),
        },
    })
}

/// `blobs/sha256/<hex>` under `dir`.
pub(crate) fn blob_path(dir: &Path, digest: &Digest) -> PathBuf {
    dir.join("blobs/sha256").join(digest.hex())
}

/// The digest a descriptor or a bundle manifest names, held to the canonical rule.
pub(crate) fn parse_digest(text: &str) -> Result<Digest, BundleError> {
    Digest::parse(text).map_err(|_| BundleError::UnsupportedDigest(text.to_owned()))
}

/// The [`BundleError`] inside an I/O error from a [`BlobReader`], or the I/O error itself.
pub(crate) fn from_io(path: &Path, error: io::Error) -> BundleError {
    let plain = |source| BundleError::Io {
        path: path.to_owned(),
        source,
    };
    if !error
        .get_ref()
        .is_some_and(|inner| inner.is::<BundleError>())
    {
        return plain(error);
    }
    let kind = error.kind();
    match error
        .into_inner()
        .map(|inner| inner.downcast::<BundleError>())
    {
        Some(Ok(bundle_error)) => *bundle_error,
        Some(Err(inner)) => plain(io::Error::new(kind, inner)),
        None => plain(io::Error::from(kind)),
    }
}

/// A blob's bytes, at most its descriptor's size. Unless the blob is already verified, the bytes
/// are hashed as they are read and the end of the stream is an error if the size or the digest
/// does not match (an `io::Error` holding the [`BundleError`]); only then is the blob recorded as
/// verified. A caller that streams the bytes somewhere must therefore drop what it wrote when
/// reading fails.
#[derive(Debug)]
pub struct BlobReader<'a> {
    what: String,
    digest: Digest,
    size: u64,
    file: io::Take<File>,
    read: u64,
    /// `None`: the blob was verified before, only its size is checked.
    hasher: Option<Hasher>,
    verified: &'a Mutex<VerifiedBlobs>,
    done: bool,
}

impl<'a> BlobReader<'a> {
    /// Open the blob `digest` in the layout at `dir`, refusing a file of another size at once.
    pub(crate) fn open(
        dir: &Path,
        what: &str,
        digest: &Digest,
        size: u64,
        verified: &'a Mutex<VerifiedBlobs>,
    ) -> Result<Self, BundleError> {
        if size > MAX_FILE_BYTES {
            return Err(declared_too_large(what, size));
        }
        let path = blob_path(dir, digest);
        let file = open_regular(&path)?;
        let actual = file
            .metadata()
            .map_err(|source| BundleError::Io {
                path: path.clone(),
                source,
            })?
            .len();
        if actual != size {
            return Err(BundleError::SizeMismatch {
                what: what.to_owned(),
                expected: size,
                actual,
            });
        }
        let known = lock(verified).contains(digest, size);
        Ok(BlobReader {
            what: what.to_owned(),
            digest: digest.clone(),
            size,
            file: file.take(size),
            read: 0,
            hasher: (!known).then(Hasher::new),
            verified,
            done: false,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The open blob file (nothing read from it yet, when called before reading).
    pub(crate) fn file(&self) -> &File {
        self.file.get_ref()
    }

    /// Whether the bytes are hashed as they are read (the blob was not verified before).
    pub fn hashes(&self) -> bool {
        self.hasher.is_some()
    }

    fn end(&mut self) -> Result<(), BundleError> {
        if self.read != self.size {
            return Err(BundleError::SizeMismatch {
                what: self.what.clone(),
                expected: self.size,
                actual: self.read,
            });
        }
        if let Some(hasher) = self.hasher.take() {
            let actual = hasher.finish();
            if actual != self.digest {
                return Err(BundleError::DigestMismatch {
                    what: self.what.clone(),
                    expected: self.digest.to_string(),
                    actual: actual.to_string(),
                });
            }
            lock(self.verified).insert(self.digest.clone(), self.size);
        }
        Ok(())
    }
}

impl Read for BlobReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        let n = self.file.read(buf)?;
        if n > 0 {
            self.read += n as u64;
            if let Some(hasher) = &mut self.hasher {
                hasher.update(&buf[..n]);
            }
            return Ok(n);
        }
        self.done = true;
        self.end()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(0)
    }
}

/// The set, even if a thread panicked while holding it (it is only ever inserted into, so it
/// is never half-updated).
pub(crate) fn lock(verified: &Mutex<VerifiedBlobs>) -> std::sync::MutexGuard<'_, VerifiedBlobs> {
    verified
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A descriptor whose size no file can have, refused with the size it declares.
pub(crate) fn declared_too_large(what: &str, size: u64) -> BundleError {
    BundleError::Malformed {
        what: what.to_owned(),
        reason: format!(
            "its descriptor declares {size} bytes, more than any file can hold ({MAX_FILE_BYTES})"
        ),
    }
}

/// The blob `digest` of `size` bytes, read whole and verified (size first, then hash unless it
/// was verified before); at most `limit` bytes. A layer with signed chunk digests is judged by
/// them, chunk by chunk, and not by its whole digest (formats.md §7.1): the one rule every
/// reader applies, mapped or not, so `slate verify` and the installers agree (issue 44).
pub(crate) fn read_blob(
    dir: &Path,
    what: &str,
    digest: &Digest,
    size: u64,
    limit: u64,
    chunks: Option<&ChunkDigests>,
    verified: &Mutex<VerifiedBlobs>,
) -> Result<Vec<u8>, BundleError> {
    if size > limit {
        return Err(BundleError::Oversize {
            what: format!("{what} (it declares {size} bytes)"),
            limit,
        });
    }
    let mut reader = BlobReader::open(dir, what, digest, size, verified)?;
    if let (Some(chunks), true) = (chunks, reader.hashes()) {
        reader.hasher = None; // the stream's end then checks the size only
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 30));
        reader
            .read_to_end(&mut bytes)
            .map_err(|e| from_io(&blob_path(dir, digest), e))?;
        chunks
            .verify(&bytes)
            .map_err(|m| chunk_mismatch(what, &m))?;
        lock(verified).insert(digest.clone(), size);
        return Ok(bytes);
    }
    if reader.hashes() && size >= OVERLAP_MIN {
        return reader
            .read_hashing_alongside()
            .map_err(|e| from_io(&blob_path(dir, digest), e));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 30));
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| from_io(&blob_path(dir, digest), e))?;
    Ok(bytes)
}

/// The refusal of a blob whose chunk `m` does not match its signed digest.
pub(crate) fn chunk_mismatch(what: &str, m: &ChunkMismatch) -> BundleError {
    BundleError::DigestMismatch {
        what: format!("{what}, chunk {} (bytes {}..{})", m.index, m.start, m.end),
        expected: m.expected.to_string(),
        actual: m.actual.to_string(),
    }
}

/// Blobs this large (a UKI) are hashed on a second thread while the next chunk is read: the
/// read's copy and SHA-256 take about as long as each other, so overlapping them nearly halves
/// the time. Smaller ones are not worth a thread.
const OVERLAP_MIN: u64 = 16 << 20;

/// What the reading thread hands the hashing thread at a time.
const OVERLAP_CHUNK: usize = 4 << 20;

impl BlobReader<'_> {
    /// The whole blob, read in chunks on this thread and hashed on another as each arrives,
    /// then judged as [`Read`] judges it at the end of the stream. The bytes hashed are counted
    /// on this thread ([`crate::hashed_on_this_thread`]), where the caller looks.
    fn read_hashing_alongside(mut self) -> io::Result<Vec<u8>> {
        let mut hasher = self.hasher.take().expect("only called when hashing");
        let mut bytes = vec![0; usize::try_from(self.size).map_err(io::Error::other)?];
        let file = &mut self.file;
        let (read, hashed) = std::thread::scope(|scope| {
            let (chunks, arrived) = std::sync::mpsc::sync_channel::<&[u8]>(2);
            let worker = scope.spawn(move || {
                for chunk in arrived {
                    hasher.update(chunk);
                }
                hasher
            });
            let mut read = Ok(0u64);
            for chunk in bytes.chunks_mut(OVERLAP_CHUNK) {
                match fill(file, chunk) {
                    Ok(n) => {
                        let total = read.as_mut().expect("stops at the first error");
                        *total += n as u64;
                        if n < chunk.len() || chunks.send(&chunk[..n]).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        read = Err(e);
                        break;
                    }
                }
            }
            drop(chunks);
            let hasher = worker
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (read, hasher)
        });
        crate::digest::count_hashed(hashed.bytes());
        self.read = read?;
        self.hasher = Some(hashed);
        self.done = true;
        self.end()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(bytes)
    }
}

/// Read into all of `buf` unless the stream ends first; how many bytes were read.
fn fill(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match reader.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob large enough to be hashed alongside its read: returned whole, hashed once (and
    /// counted on the caller's thread), remembered; a flipped byte or a short file refused.
    #[test]
    fn a_large_blob_is_hashed_alongside_its_read() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..OVERLAP_MIN + 12_345)
            .map(|i| (i ^ (i >> 11)) as u8)
            .collect();
        let digest = Digest::of(&bytes);
        let path = blob_path(dir.path(), &digest);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let size = bytes.len() as u64;
        let verified = Mutex::new(VerifiedBlobs::new());
        let start = crate::hashed_on_this_thread();
        let read = read_blob(
            dir.path(),
            "the UKI",
            &digest,
            size,
            u64::MAX,
            None,
            &verified,
        )
        .unwrap();
        assert!(read == bytes, "the bytes read back");
        assert_eq!(crate::hashed_on_this_thread() - start, size);
        assert!(lock(&verified).contains(&digest, size));

        let mut flipped = bytes.clone();
        flipped[OVERLAP_CHUNK + 7] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let fresh = Mutex::new(VerifiedBlobs::new());
        let err =
            read_blob(dir.path(), "the UKI", &digest, size, u64::MAX, None, &fresh).unwrap_err();
        assert!(matches!(err, BundleError::DigestMismatch { .. }), "{err:?}");
        assert!(fresh.lock().unwrap().is_empty());

        // Shrunk after its size was checked: the read ends early.
        std::fs::write(&path, &bytes).unwrap();
        let reader = BlobReader::open(dir.path(), "the UKI", &digest, size, &fresh).unwrap();
        std::fs::write(&path, &bytes[..OVERLAP_CHUNK + 1]).unwrap();
        let err = from_io(&path, reader.read_hashing_alongside().unwrap_err());
        assert!(
            matches!(err, BundleError::SizeMismatch { actual, .. } if actual == OVERLAP_CHUNK as u64 + 1),
            "{err:?}"
        );
    }
}
