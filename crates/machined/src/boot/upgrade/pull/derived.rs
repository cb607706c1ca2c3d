//! A seed a pull derives once the new slate binary is in place: the root image in the new UKI
//! holds that binary again, as its squashfs data blocks, and a node that has the binary can
//! make those blocks itself (`slate_rootfs::file_data`) instead of fetching them a second time
//! (docs/formats.md §7.7, "Derived seeds"). For a release whose slate changed, that is about
//! as many bytes as the binary's own delta.
//!
//! The blocks come out the same only with the image's block size and zstd level — read from
//! the running UKI's root, on the bet that the next root is stored alike — and the same zstd
//! library; when any differs the derived chunks match nothing and are simply not used. Like
//! every seed, nothing of it is trusted: a chunk is used only where its bytes hash to a digest
//! the target's signed index lists.

use std::path::Path;
use std::time::Instant;

use slate_bundle::BINARY_MEDIA_TYPE;
use slate_rootfs::Storage;
use slate_transport::{DeriveSeeds, MemSeed, SeedBlob};

use crate::base::journal::Journal;

/// Derives the root image's copy of the new slate binary, stored as `storage` says.
pub struct RootCopy<'a> {
    pub storage: Storage,
    pub journal: &'a Journal,
    /// The version being pulled, for the journal.
    pub version: &'a str,
}

impl DeriveSeeds for RootCopy<'_> {
    fn derive(&self, media_type: &str, path: &Path) -> Vec<SeedBlob> {
        if media_type != BINARY_MEDIA_TYPE {
            return Vec::new();
        }
        let start = Instant::now();
        let made = std::fs::read(path).and_then(|binary| root_copy(&binary, self.storage));
        match made {
            Ok(Some(seed)) => {
                self.journal.info(format_args!(
                    "pull {}: derived the root image's copy of the new slate binary ({} bytes \
                     in {} chunks, {} KiB blocks at zstd {}) in {} ms: a seed for the UKI",
                    self.version,
                    seed.chunks.size,
                    seed.chunks.chunks.len(),
                    self.storage.block_size / 1024,
                    self.storage.zstd_level,
                    start.elapsed().as_millis()
                ));
                vec![seed]
            }
            Ok(None) => Vec::new(),
            Err(e) => {
                self.journal.info(format_args!(
                    "pull {}: no seed derived from the new slate binary: {e}",
                    self.version
                ));
                Vec::new()
            }
        }
    }
}

/// The data blocks a root image stored as `storage` holds for `binary`, chunked as the imager
/// chunks a UKI; `None` for a binary shorter than one block (it would sit in a fragment).
pub fn root_copy(binary: &[u8], storage: Storage) -> std::io::Result<Option<SeedBlob>> {
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let data = slate_rootfs::file_data(
        binary,
        storage.block_size as usize,
        storage.zstd_level,
        threads,
    )?;
    if data.is_empty() {
        return Ok(None);
    }
    Ok(Some(SeedBlob {
        chunks: slate_delta::chunk_blob(&data, slate_delta::DEFAULT_PARAMS),
        file: Box::new(MemSeed(data)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the slate binary gives a seed, and only when it fills a block; the seed is the
    /// binary's blocks as `slate_rootfs::file_data` makes them, chunked to tile them.
    #[test]
    fn the_binary_gives_its_blocks_and_nothing_else_gives_anything() {
        let journal = Journal::new(slate_host::KmsgLogger::stderr("test"));
        let derive = RootCopy {
            storage: Storage {
                block_size: 4096,
                zstd_level: 15,
            },
            journal: &journal,
            version: "2.0.0",
        };
        let dir = tempfile::tempdir().unwrap();
        let binary: Vec<u8> = (0..100_000u32).map(|i| (i * 7 / 3) as u8).collect();
        let path = dir.path().join("slate");
        std::fs::write(&path, &binary).unwrap();
        assert!(derive
            .derive(slate_bundle::UKI_MEDIA_TYPE, &path)
            .is_empty());
        let seeds = derive.derive(BINARY_MEDIA_TYPE, &path);
        assert_eq!(seeds.len(), 1);
        let data = slate_rootfs::file_data(&binary, 4096, 15, 1).unwrap();
        assert!(!data.is_empty() && data.len() < binary.len());
        assert_eq!(seeds[0].chunks.size, data.len() as u64);
        assert_eq!(seeds[0].chunks.digest, slate_delta::sha256(&data));
        let mut copy = vec![0; data.len()];
        seeds[0].file.read_at(0, &mut copy).unwrap();
        assert!(copy == data);

        std::fs::write(&path, &binary[..1000]).unwrap();
        assert!(derive.derive(BINARY_MEDIA_TYPE, &path).is_empty());
        std::fs::remove_file(&path).unwrap();
        assert!(derive.derive(BINARY_MEDIA_TYPE, &path).is_empty());
    }
}
