//! Reading blobs by digest: the size is checked before a byte is read, the hash as the bytes go
//! by, and a blob that matched once is remembered ([`VerifiedBlobs`]) so that the same process
//! never hashes it again. Only regular files are opened ([`open_regular`]): a FIFO, a device, a
//! socket or a symbolic link in a layout is refused, never waited on.

use std::collections::BTreeMap;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::{BundleError, Digest, Hasher};

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

/// What kind of file `meta` describes, when it is not a regular file (for refusals: "it is a
/// FIFO (named pipe), not a regular file"). The transport's layout reader applies it too.
pub fn irregular_kind(meta: &Metadata) -> Option<&'static str> {
    let kind = meta.file_type();
    if kind.is_file() {
        None
    } else if kind.is_symlink() {
        Some("a symbolic link")
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if kind.is_socket() {
        Some("a socket")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_char_device() {
        Some("a character device")
    } else {
        Some("not a regular file")
    }
}

/// Open `path` for reading, only if it is a regular file: a FIFO would block the open until a
/// writer came (`slate verify` hung on a FIFO `index.json`), a device could be read without
/// end, a link points anywhere. The name is looked at without following a link before it is
/// opened, and what was opened is checked again. A refusal is an `Io` error of kind
/// `InvalidInput` saying what the file is.
pub(crate) fn open_regular(path: &Path) -> Result<File, BundleError> {
    let refuse = |kind: &str| BundleError::Io {
        path: path.to_owned(),
        source: io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {kind}, not a regular file: refused"),
        ),
    };
    let io = |source| BundleError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::symlink_metadata(path).map_err(io)?;
    if let Some(kind) = irregular_kind(&meta) {
        return Err(refuse(kind));
    }
    let file = File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    match irregular_kind(&meta) {
        Some(kind) => Err(refuse(kind)),
        None => Ok(file),
    }
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
/// was verified before); at most `limit` bytes.
pub(crate) fn read_blob(
    dir: &Path,
    what: &str,
    digest: &Digest,
    size: u64,
    limit: u64,
    verified: &Mutex<VerifiedBlobs>,
) -> Result<Vec<u8>, BundleError> {
    if size > limit {
        return Err(BundleError::Oversize {
            what: format!("{what} (it declares {size} bytes)"),
            limit,
        });
    }
    let mut reader = BlobReader::open(dir, what, digest, size, verified)?;
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0).min(1 << 30));
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| from_io(&blob_path(dir, digest), e))?;
    Ok(bytes)
}
