//! The bytes an image stores for one file's data, made without the image: what a node needs to
//! rebuild the part of a new root filesystem that holds a file it already has (its new slate
//! binary, assembled first), so a delta need not fetch those bytes twice (docs/formats.md §7.7,
//! "Derived seeds").
//!
//! The writer's rules for a file of at least one block (`parallel.rs` replays the same ones):
//! its data is cut into blocks of the image's size, the last one shorter; a block of zeros is a
//! hole and stores nothing; any other is zstd at the image's level, one frame per block, kept
//! when the frame is not longer than the block and stored raw otherwise. The blocks lie one
//! after the other. A file shorter than a block is packed into a fragment with other files'
//! tails and stores no data blocks of its own: none of its bytes can be rebuilt alone.

use std::io::{self, Cursor};
use std::thread;

use backhand::compression::CompressionOptions;
use backhand::{BackhandError, FilesystemReader};

/// How an image stores its files' data: what [`file_data`] needs to make a file's blocks as
/// the image holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Storage {
    pub block_size: u32,
    pub zstd_level: i32,
}

/// Why an image's [`Storage`] could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("not a squashfs image slate can read: {0}")]
    Squashfs(BackhandError),
    #[error("it records no zstd compression level (not an image slate wrote)")]
    NoZstdLevel,
}

/// The block size and zstd level of the squashfs `image` (its superblock and the compressor
/// options slate always writes). An image of another compressor, or that records no level, is
/// an error: its blocks cannot be made again.
pub fn storage_of(image: &[u8]) -> Result<Storage, StorageError> {
    let fs = FilesystemReader::from_reader(Cursor::new(image)).map_err(StorageError::Squashfs)?;
    match fs.compression_options {
        Some(CompressionOptions::Zstd(zstd)) => Ok(Storage {
            block_size: fs.block_size,
            zstd_level: i32::try_from(zstd.compression_level)
                .map_err(|_| StorageError::NoZstdLevel)?,
        }),
        _ => Err(StorageError::NoZstdLevel),
    }
}

/// The file's data blocks as an image made with `block_size` and zstd `level` stores them, in
/// order, on up to `threads` threads (the bytes do not depend on how many). Empty for a file
/// shorter than one block.
pub fn file_data(
    contents: &[u8],
    block_size: usize,
    level: i32,
    threads: usize,
) -> io::Result<Vec<u8>> {
    if block_size == 0 || contents.len() < block_size {
        return Ok(Vec::new());
    }
    let blocks: Vec<&[u8]> = contents.chunks(block_size).collect();
    let threads = threads.clamp(1, blocks.len());
    let per_thread = blocks.len().div_ceil(threads);
    let stored: Vec<Vec<Vec<u8>>> = thread::scope(|scope| {
        let workers: Vec<_> = blocks
            .chunks(per_thread)
            .map(|share| scope.spawn(move || store_blocks(share, level)))
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(io::Error::other("a worker panicked")))
            })
            .collect::<io::Result<_>>()
    })?;
    Ok(stored.into_iter().flatten().flatten().collect())
}

/// Each of `blocks` as the writer stores it (nothing for a hole).
fn store_blocks(blocks: &[&[u8]], level: i32) -> io::Result<Vec<Vec<u8>>> {
    let mut zstd = zstd::bulk::Compressor::new(level)?;
    blocks
        .iter()
        .map(|block| {
            if block.iter().all(|b| *b == 0) {
                return Ok(Vec::new());
            }
            let frame = zstd.compress(block)?;
            Ok(if frame.len() > block.len() {
                block.to_vec()
            } else {
                frame
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{build_squashfs, Compression, SquashfsOptions};

    /// A file of text, noise and a block of zeros, with a short last block: the image holds its
    /// data exactly as `file_data` makes it, whatever the thread count.
    #[test]
    fn the_image_holds_the_file_data_made_without_it() {
        let bs = 4096;
        let mut contents = Vec::new();
        contents.extend((0..3 * bs).map(|i| b"derived seed\n"[i % 13]));
        let mut x = 0x2545_f491_u32;
        contents.extend((0..2 * bs).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        }));
        contents.extend(std::iter::repeat_n(0u8, bs));
        contents.extend((0..1000).map(|i| (i % 7) as u8));
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("small"), b"a fragment").unwrap();
        std::fs::write(tmp.path().join("slate"), &contents).unwrap();
        let opts = SquashfsOptions {
            compression: Compression::Zstd { level: 15 },
            block_size: bs as u32,
            ..SquashfsOptions::default()
        };
        let mut image = Cursor::new(Vec::new());
        build_squashfs(tmp.path(), &mut image, &opts).unwrap();
        let image = image.into_inner();

        let data = file_data(&contents, bs, 15, 3).unwrap();
        assert_eq!(data, file_data(&contents, bs, 15, 1).unwrap());
        // Compressed text, raw noise (its frame is longer), no hole, the compressed tail.
        assert!(data.len() > 2 * bs && data.len() < 3 * bs, "{}", data.len());
        assert!(
            image.windows(data.len()).any(|w| w == data.as_slice()),
            "the image does not hold the derived data"
        );
        // Other blocks make other frames, which the image does not hold.
        let other = file_data(&contents, 2 * bs, 15, 2).unwrap();
        assert!(other != data);
        assert!(!image.windows(other.len()).any(|w| w == other.as_slice()));
    }

    #[test]
    fn a_file_shorter_than_a_block_has_no_data_of_its_own() {
        assert!(file_data(&[1; 100], 4096, 15, 2).unwrap().is_empty());
        assert!(file_data(&[1; 100], 0, 15, 2).unwrap().is_empty());
        assert!(file_data(&[0; 8192], 4096, 15, 2).unwrap().is_empty());
    }

    #[test]
    fn the_storage_is_read_from_the_superblock() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), [7; 10_000]).unwrap();
        for (block_size, level) in [(4096u32, 15u32), (131_072, 3)] {
            let opts = SquashfsOptions {
                compression: Compression::Zstd { level },
                block_size,
                ..SquashfsOptions::default()
            };
            let mut out = Cursor::new(Vec::new());
            build_squashfs(tmp.path(), &mut out, &opts).unwrap();
            let storage = storage_of(&out.into_inner()).unwrap();
            assert_eq!(storage.block_size, block_size);
            assert_eq!(storage.zstd_level, level as i32);
        }
        let err = storage_of(b"hsqs and nothing else").unwrap_err();
        assert!(err.to_string().contains("not a squashfs image"), "{err}");
    }
}
