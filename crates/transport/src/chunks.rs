//! The IO side of a delta (issue 41; formats.md §7.7): what `slate_delta::assemble` reads and
//! fetches through. A seed is a file read at offsets (the running UKI on the ESP, the running
//! installer); the chunk cache is a directory of chunks named by their hex digest, each written
//! whole under a temporary name then renamed, so a cut leaves no half chunk under a real name
//! (and a rotted one is re-hashed and refetched by the assembler); the remote here is an OCI
//! image layout, a chunk being a read at its offset of the target's blob.
//!
//! From a registry, a chunk is `Range: bytes=a-b` on the target's blob ([`RegistryRemote`]).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use slate_delta::{Chunk, ChunkCache, ReadAt, Remote, Sha256};

/// A local file as a seed.
#[derive(Debug)]
pub struct FileSeed(pub File);

impl ReadAt for FileSeed {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
}

/// A directory of chunks, `<hex digest>` each.
#[derive(Debug, Clone)]
pub struct DirCache {
    dir: PathBuf,
}

/// A cached file longer than this is no chunk (FastCDC's largest max is 16 MiB).
const MAX_CHUNK_FILE: u64 = 16 << 20;

impl DirCache {
    /// The cache in `dir`, created if missing.
    pub fn new(dir: &Path) -> std::io::Result<DirCache> {
        std::fs::create_dir_all(dir)?;
        Ok(DirCache {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, digest: &Sha256) -> PathBuf {
        self.dir.join(hex::encode(digest))
    }
}

impl ChunkCache for DirCache {
    fn get(&self, digest: &Sha256) -> std::io::Result<Option<Vec<u8>>> {
        let file = match slate_files::open_regular_no_link(&self.path(digest), "a cached chunk") {
            Ok(file) => file,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into_io()),
        };
        let mut bytes = Vec::new();
        file.take(MAX_CHUNK_FILE + 1).read_to_end(&mut bytes)?;
        // Too long to be a chunk: the assembler's digest check would refuse it anyway.
        Ok((bytes.len() as u64 <= MAX_CHUNK_FILE).then_some(bytes))
    }

    fn put(&self, digest: &Sha256, bytes: &[u8]) -> std::io::Result<()> {
        let path = self.path(digest);
        let partial = path.with_extension("partial");
        std::fs::write(&partial, bytes)?;
        std::fs::rename(&partial, &path)
    }
}

/// The target's blobs in an OCI image layout.
#[derive(Debug, Clone)]
pub struct LayoutRemote {
    dir: PathBuf,
}

impl LayoutRemote {
    pub fn new(dir: &Path) -> LayoutRemote {
        LayoutRemote {
            dir: dir.to_owned(),
        }
    }
}

impl Remote for crate::source::LayoutSource {
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        LayoutRemote::new(self.layout.dir()).fetch(blob, chunk)
    }
}

impl Remote for crate::registry::Registry {
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        self.get_range(
            &format!("{blob}, bytes {}+{}", chunk.offset, chunk.length),
            blob,
            chunk.offset,
            u64::from(chunk.length),
        )
        .map_err(std::io::Error::other)
    }
}

impl Remote for LayoutRemote {
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        let hex = blob
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| std::io::Error::other(format!("{blob:?} is not a sha256 digest")))?;
        let file = slate_files::open_regular_no_link(
            &self.dir.join("blobs/sha256").join(hex),
            "the target's blob",
        )
        .map_err(slate_files::FileError::into_io)?;
        let mut buf = vec![0; chunk.length as usize];
        file.read_exact_at(&mut buf, chunk.offset)?;
        Ok(buf)
    }
}

/// The target's blobs in a registry, a chunk a range request each (formats.md §7.7 says why not
/// a blob per chunk).
#[derive(Debug)]
pub struct RegistryRemote {
    registry: crate::registry::Registry,
}

impl RegistryRemote {
    /// The repository `reference` names (its tag and digest do not matter here); `None` for a
    /// layout reference (use [`LayoutRemote`]).
    pub fn new(
        client: &crate::Client,
        reference: &crate::Reference,
    ) -> Result<Option<RegistryRemote>, crate::TransportError> {
        let (Some(host), Some(repository)) = (reference.registry(), reference.repository()) else {
            return Ok(None);
        };
        Ok(Some(RegistryRemote {
            registry: crate::registry::Registry::new(host, repository, client, false)?,
        }))
    }
}

impl Remote for RegistryRemote {
    fn fetch(&self, blob: &str, chunk: &Chunk) -> std::io::Result<Vec<u8>> {
        self.registry.fetch(blob, chunk)
    }
}
