//! Local OCI image layouts: the pull cache, the source of a push, a push destination.
//!
//! A blob enters a layout only through [`Incoming`]: bytes go to `incoming/<hex>.partial` and
//! are hashed as they are written; the file is flushed and renamed to `blobs/sha256/<hex>` only
//! once its size and digest match. So a file under `blobs/sha256` is always a verified blob, an
//! interrupted transfer leaves a partial that the next one continues, and `index.json` (rewritten
//! by rename) only ever names blobs that are already in place. Files are read only when they
//! are regular files (`files.rs`); writers hold the layout's lock (`cache.rs`).

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use oci_spec::image::{Descriptor, ImageIndex, ImageIndexBuilder, MediaType};
use slate_bundle::{Digest, Hasher, MAX_DOCUMENT_BYTES, REF_NAME_ANNOTATION};

use crate::files::{irregular_kind, open_regular};
use crate::{Event, TransportError};

const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;
pub(crate) const INCOMING: &str = "incoming";
/// Under [`INCOMING`]: where a delta keeps the chunks it fetched, so an interrupted one resumes
/// with them (issue 41); removed when a pull completes, and by `gc`.
pub(crate) const CHUNKS_DIR: &str = "chunks";
const BUFFER: usize = 256 * 1024;

/// A digest from a document or a caller, held to the canonical rule before it names a file.
pub(crate) fn parse_digest(digest: &str) -> Result<Digest, TransportError> {
    Digest::parse(digest).map_err(|e| TransportError::malformed(format!("digest {digest:?}"), e))
}

/// The tag of an index entry.
pub(crate) fn tag_of(d: &Descriptor) -> Option<&str> {
    d.annotations()
        .as_ref()
        .and_then(|a| a.get(REF_NAME_ANNOTATION))
        .map(String::as_str)
}

/// Read at most `limit` bytes from `reader`; more is [`TransportError::Oversize`].
pub(crate) fn read_capped(
    reader: impl Read,
    what: &str,
    limit: u64,
    io_path: &Path,
) -> Result<Vec<u8>, TransportError> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(TransportError::io(io_path))?;
    if bytes.len() as u64 > limit {
        return Err(TransportError::Oversize {
            what: what.to_owned(),
            limit,
        });
    }
    Ok(bytes)
}

/// Check `bytes` against the size and digest that name them.
pub(crate) fn verify(
    bytes: &[u8],
    what: &str,
    digest: &str,
    size: Option<u64>,
) -> Result<(), TransportError> {
    if let Some(size) = size {
        if bytes.len() as u64 != size {
            return Err(TransportError::SizeMismatch {
                what: what.to_owned(),
                expected: size,
                actual: bytes.len() as u64,
            });
        }
    }
    let actual = Digest::of(bytes);
    if actual != digest {
        return Err(TransportError::DigestMismatch {
            what: what.to_owned(),
            expected: digest.to_owned(),
            actual: actual.to_string(),
        });
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), TransportError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(TransportError::io(dir))
}

/// An OCI image layout directory.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// An existing layout (it must have an `index.json`).
    pub fn open(dir: &Path) -> Result<Self, TransportError> {
        let index = dir.join("index.json");
        if fs::symlink_metadata(&index).is_err() {
            return Err(TransportError::NotFound {
                what: "an OCI image layout".into(),
                location: format!("{} has no index.json", dir.display()),
            });
        }
        Ok(Layout {
            dir: dir.to_owned(),
        })
    }

    /// A layout to write into: created when missing; an existing directory must be a layout or
    /// empty (so a mistyped path never gets blobs sprinkled into it).
    pub fn create(dir: &Path) -> Result<Self, TransportError> {
        let marker = dir.join("oci-layout");
        check_writable(dir)?;
        for sub in ["blobs/sha256", INCOMING] {
            let path = dir.join(sub);
            fs::create_dir_all(&path).map_err(TransportError::io(&path))?;
        }
        let layout = Layout {
            dir: dir.to_owned(),
        };
        if !marker.exists() {
            layout.write_atomically("oci-layout", OCI_LAYOUT)?;
        }
        if !dir.join("index.json").exists() {
            layout.write_index(&empty_index()?)?;
        }
        Ok(layout)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, TransportError> {
        Ok(self
            .dir
            .join("blobs/sha256")
            .join(parse_digest(digest)?.hex()))
    }

    /// Whether the blob is in place with the right size. A file of the wrong size (or anything
    /// but a regular file) under its digest is not that blob: it is removed so that it is
    /// fetched again.
    pub fn has_blob(&self, digest: &str, size: u64) -> Result<bool, TransportError> {
        let path = self.blob_path(digest)?;
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_file() && meta.len() == size => Ok(true),
            Ok(_) => {
                fs::remove_file(&path).map_err(TransportError::io(&path))?;
                Ok(false)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(TransportError::io(path)(e)),
        }
    }

    /// A small document (a manifest), read with the document cap and verified.
    pub fn read_document(
        &self,
        what: &str,
        digest: &str,
        size: Option<u64>,
    ) -> Result<Vec<u8>, TransportError> {
        if size.is_some_and(|s| s > MAX_DOCUMENT_BYTES) {
            return Err(TransportError::Oversize {
                what: what.to_owned(),
                limit: MAX_DOCUMENT_BYTES,
            });
        }
        let path = self.blob_path(digest)?;
        let file = open_regular(&path)?;
        let bytes = read_capped(file, what, MAX_DOCUMENT_BYTES, &path)?;
        verify(&bytes, what, digest, size)?;
        Ok(bytes)
    }

    /// Store a document whose digest the caller has verified.
    pub fn put_document(&self, digest: &str, bytes: &[u8]) -> Result<(), TransportError> {
        if self.has_blob(digest, bytes.len() as u64)? {
            return Ok(());
        }
        let name = format!("blobs/sha256/{}", parse_digest(digest)?.hex());
        self.write_atomically(&name, bytes)
    }

    /// Open a blob to read from `offset`, checking its size first.
    pub fn open_blob(
        &self,
        what: &str,
        digest: &str,
        size: u64,
        offset: u64,
    ) -> Result<File, TransportError> {
        let path = self.blob_path(digest)?;
        let mut file = match open_regular(&path) {
            Ok(file) => file,
            Err(TransportError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(TransportError::NotFound {
                    what: what.to_owned(),
                    location: path.display().to_string(),
                })
            }
            Err(e) => return Err(e),
        };
        let actual = file.metadata().map_err(TransportError::io(&path))?.len();
        if actual != size {
            return Err(TransportError::SizeMismatch {
                what: what.to_owned(),
                expected: size,
                actual,
            });
        }
        file.seek(SeekFrom::Start(offset))
            .map_err(TransportError::io(&path))?;
        Ok(file)
    }

    pub fn read_index(&self) -> Result<ImageIndex, TransportError> {
        let path = self.dir.join("index.json");
        let file = open_regular(&path)?;
        let bytes = read_capped(file, "index.json", MAX_DOCUMENT_BYTES, &path)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| TransportError::malformed(format!("{}", path.display()), e))
    }

    /// Replace `index.json` (sorted keys, like the bundle writer) after making every blob
    /// rename durable, so the index never names a blob that a power cut could lose.
    pub fn write_index(&self, index: &ImageIndex) -> Result<(), TransportError> {
        let value =
            serde_json::to_value(index).map_err(|e| TransportError::malformed("index.json", e))?;
        let bytes = serde_json::to_vec_pretty(&value)
            .map_err(|e| TransportError::malformed("index.json", e))?;
        if bytes.len() as u64 > MAX_DOCUMENT_BYTES {
            return Err(TransportError::Oversize {
                what: format!(
                    "{} (too many tags: remove some)",
                    self.dir.join("index.json").display()
                ),
                limit: MAX_DOCUMENT_BYTES,
            });
        }
        let blobs = self.dir.join("blobs/sha256");
        if blobs.is_dir() {
            sync_dir(&blobs)?;
        }
        self.write_atomically("index.json", &bytes)
    }

    /// Write `name` under a temporary name, flush, rename, flush the directory.
    fn write_atomically(&self, name: &str, bytes: &[u8]) -> Result<(), TransportError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(INCOMING).join(format!(
            "{}.{}.tmp",
            name.replace('/', "_"),
            std::process::id()
        ));
        if let Some(parent) = tmp.parent() {
            fs::create_dir_all(parent).map_err(TransportError::io(parent))?;
        }
        let result = (|| {
            let mut file = File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(&tmp);
            return Err(TransportError::io(&path)(e));
        }
        sync_dir(path.parent().unwrap_or(&self.dir))
    }
}

/// The lock file in a layout that slate writes.
pub(crate) const LOCK_FILE: &str = ".lock";

/// A directory a layout may be written into: missing, empty, a layout (it has `oci-layout`), or
/// one slate is making a layout of (it has the lock file, created only in such directories), so
/// a mistyped path never gets blobs sprinkled into it.
pub(crate) fn check_writable(dir: &Path) -> Result<(), TransportError> {
    if !dir.is_dir() || dir.join("oci-layout").exists() || dir.join(LOCK_FILE).exists() {
        return Ok(());
    }
    let mut entries = fs::read_dir(dir).map_err(TransportError::io(dir))?;
    if entries.next().is_some() {
        return Err(TransportError::Usage(format!(
            "{} is neither an OCI image layout (no oci-layout file) nor empty",
            dir.display()
        )));
    }
    Ok(())
}

pub(crate) fn empty_index() -> Result<ImageIndex, TransportError> {
    ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(Vec::new())
        .build()
        .map_err(|e| TransportError::malformed("index.json", e))
}

/// Name `descriptor` `name` in `index`: an entry with the same name is replaced. With no name the
/// manifest is listed once, untagged.
pub(crate) fn set_entry(index: &mut ImageIndex, descriptor: &Descriptor, name: Option<&str>) {
    let mut descriptor = descriptor.clone();
    let mut annotations: HashMap<String, String> = HashMap::new();
    if let Some(name) = name {
        annotations.insert(REF_NAME_ANNOTATION.to_owned(), name.to_owned());
    }
    descriptor.set_annotations((!annotations.is_empty()).then_some(annotations));
    let mut manifests = index.manifests().clone();
    match name {
        Some(name) => manifests.retain(|d| tag_of(d) != Some(name)),
        None => {
            if manifests
                .iter()
                .any(|d| d.digest() == descriptor.digest() && tag_of(d).is_none())
            {
                return;
            }
        }
    }
    manifests.push(descriptor);
    index.set_manifests(manifests);
}

/// A blob on its way into a layout: `incoming/<hex>.partial`, hashed as it is written.
#[derive(Debug)]
pub(crate) struct Incoming {
    what: String,
    digest: String,
    size: u64,
    partial: PathBuf,
    blob: PathBuf,
    file: File,
    hasher: Hasher,
    written: u64,
    /// Bytes received by this process (not the resumed prefix).
    pub received: u64,
}

impl Incoming {
    /// Start (or continue) receiving `digest`: an existing partial no longer than `size` is kept
    /// and its bytes are hashed first, so the transfer can resume after them.
    pub fn begin(
        layout: &Layout,
        what: &str,
        digest: &str,
        size: u64,
    ) -> Result<Self, TransportError> {
        let parsed = parse_digest(digest)?;
        let hex = parsed.hex();
        let dir = layout.dir.join(INCOMING);
        fs::create_dir_all(&dir).map_err(TransportError::io(&dir))?;
        let partial = dir.join(format!("{hex}.partial"));
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
            .open(&partial)
            .map_err(TransportError::io(&partial))?;
        let meta = file.metadata().map_err(TransportError::io(&partial))?;
        if let Some(kind) = irregular_kind(&meta) {
            return Err(TransportError::NotRegularFile {
                path: partial,
                kind,
            });
        }
        let mut hasher = Hasher::new();
        let mut written = meta.len();
        if written > size {
            file.set_len(0).map_err(TransportError::io(&partial))?;
            written = 0;
        } else if written > 0 {
            let mut buf = vec![0u8; BUFFER];
            let mut hashed = 0;
            loop {
                let n = file.read(&mut buf).map_err(TransportError::io(&partial))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                hashed += n as u64;
            }
            written = hashed;
        }
        file.seek(SeekFrom::Start(written))
            .map_err(TransportError::io(&partial))?;
        Ok(Incoming {
            what: what.to_owned(),
            digest: digest.to_owned(),
            size,
            partial,
            blob: layout.blob_path(digest)?,
            file,
            hasher,
            written,
            received: 0,
        })
    }

    /// How many bytes are already here.
    pub fn offset(&self) -> u64 {
        self.written
    }

    /// Throw away the prefix (the source sends the whole blob instead of the rest).
    pub fn restart(&mut self) -> Result<(), TransportError> {
        self.file
            .set_len(0)
            .map_err(TransportError::io(&self.partial))?;
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(TransportError::io(&self.partial))?;
        self.hasher = Hasher::new();
        self.written = 0;
        Ok(())
    }

    /// Receive everything `reader` has. A reader that ends or fails early leaves the partial in
    /// place ([`TransportError::Truncated`]); a reader with more than the descriptor's size is a
    /// lie, and the partial goes.
    pub fn receive(
        &mut self,
        reader: &mut dyn Read,
        progress: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), TransportError> {
        let mut buf = vec![0u8; BUFFER];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.file
                        .flush()
                        .map_err(TransportError::io(&self.partial))?;
                    return Err(TransportError::Truncated {
                        what: self.what.clone(),
                        received: self.written,
                        expected: self.size,
                        cause: Some(e),
                    });
                }
            };
            if self.written + n as u64 > self.size {
                self.discard();
                return Err(TransportError::Oversize {
                    what: format!(
                        "{} (the source sent more than its descriptor's size)",
                        self.what
                    ),
                    limit: self.size,
                });
            }
            self.file
                .write_all(&buf[..n])
                .map_err(TransportError::io(&self.partial))?;
            self.hasher.update(&buf[..n]);
            self.written += n as u64;
            self.received += n as u64;
            progress(Event::Bytes(n as u64));
        }
        if self.written < self.size {
            return Err(TransportError::Truncated {
                what: self.what.clone(),
                received: self.written,
                expected: self.size,
                cause: None,
            });
        }
        Ok(())
    }

    /// Append `bytes` assembled here (a delta's chunks, in order), hashed as written; more
    /// than the descriptor's size is refused.
    pub fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.written + bytes.len() as u64 > self.size {
            return Err(std::io::Error::other(format!(
                "{}: more than its descriptor's {} bytes",
                self.what, self.size
            )));
        }
        self.file.write_all(bytes)?;
        self.hasher.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Check the digest; only then flush and rename the partial into `blobs/sha256`. A mismatch
    /// deletes the partial.
    pub fn finish(mut self) -> Result<(), TransportError> {
        if self.written != self.size {
            let actual = self.written;
            self.discard();
            return Err(TransportError::SizeMismatch {
                what: self.what.clone(),
                expected: self.size,
                actual,
            });
        }
        let actual = std::mem::take(&mut self.hasher).finish();
        if actual != self.digest.as_str() {
            self.discard();
            return Err(TransportError::DigestMismatch {
                what: self.what.clone(),
                expected: self.digest.clone(),
                actual: actual.to_string(),
            });
        }
        self.file
            .sync_all()
            .map_err(TransportError::io(&self.partial))?;
        fs::rename(&self.partial, &self.blob).map_err(TransportError::io(&self.blob))?;
        Ok(())
    }

    /// Remove the partial (best effort: the error being reported matters more).
    pub fn discard(&mut self) {
        let _ = fs::remove_file(&self.partial);
    }
}
