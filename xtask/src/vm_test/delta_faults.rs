//! The faults `delta_upgrade` injects (issue 41), and what the host expects of each, computed
//! from the signed chunk indexes of the bundles it built:
//!
//! A chunk corrupted in the registry's storage: the blob file under docker-registry's
//!   filesystem driver is the very bytes a range request is served from (distribution 2.8 keeps
//!   no content cache), so flipping one byte there is a corrupt registry without a proxy in
//!   the way. The corrupted chunk is the last one the node must fetch of the UKI, so every
//!   other chunk of the failed attempt is fetched (the fetchers take chunks in order and finish
//!   what they took) and kept in `incoming/chunks/`: the attempt after the repair must fetch
//!   exactly that one chunk.
//!
//! A byte of the running UKI corrupted on the ESP: flipped in the VM's disk image from the host
//! while the node runs, inside a chunk the next version's UKI shares with the running one and
//! that no other blob of the running index lists (so no other seed can stand in for it). The
//! byte is found by reading it through `fatfs` (slate's read-only ESP mount) over a disk that
//! notes where each read lands. Nothing in the guest has read the UKI's data since the firmware
//! loaded it (only a pull and `GET /v1/image` do), so its page cache holds none of it and the
//! pull reads the corrupted byte from the disk: the pull must refuse that chunk by its signed
//! digest and fetch it.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use slate_delta::{BlobChunks, Chunk, ChunkIndex};
use slate_disk::{Disk, DiskError, FileDisk};

use crate::vm::Running;

/// The chunks of `target` a node holding `held` must fetch, each digest once, in order.
pub(super) fn to_fetch(target: &BlobChunks, held: &[&ChunkIndex]) -> Vec<Chunk> {
    let mut have: std::collections::HashSet<_> = held
        .iter()
        .flat_map(|i| &i.blobs)
        .flat_map(|b| b.chunks.iter().map(|c| c.digest))
        .collect();
    target
        .chunks
        .iter()
        .filter(|c| have.insert(c.digest))
        .copied()
        .collect()
}

/// A chunk of `running` (a blob of `index`) that `next` lists once too and that no other chunk
/// of `index` shares, the one nearest the middle of the blob: the PE headers and the sections
/// systemd-boot reads for its menu lie at the start, the directory clusters elsewhere.
pub(super) fn shared_chunk(
    running: &BlobChunks,
    index: &ChunkIndex,
    next: &BlobChunks,
) -> Option<Chunk> {
    let count = |chunks: &mut dyn Iterator<Item = &Chunk>, digest| {
        chunks.filter(|c| c.digest == digest).count()
    };
    let middle = running.size / 2;
    running
        .chunks
        .iter()
        .filter(|c| {
            count(&mut index.blobs.iter().flat_map(|b| &b.chunks), c.digest) == 1
                && count(&mut next.chunks.iter(), c.digest) == 1
        })
        .min_by_key(|c| c.offset.abs_diff(middle))
        .copied()
}

/// A disk image read through [`FileDisk`], noting where each read lands; writes refused.
struct Noted {
    disk: FileDisk,
    reads: Mutex<Vec<(u64, usize)>>,
}

impl Disk for Noted {
    fn len(&self) -> u64 {
        self.disk.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        self.reads
            .lock()
            .expect("no panics hold it")
            .push((offset, buf.len()));
        self.disk.read_at(offset, buf)
    }
    fn write_at(&mut self, offset: u64, _: &[u8]) -> Result<(), DiskError> {
        Err(DiskError::Io {
            offset,
            source: std::io::ErrorKind::PermissionDenied.into(),
        })
    }
    fn flush(&mut self) -> Result<(), DiskError> {
        Ok(())
    }
}

/// The path on the ESP of the one UKI of `version` that `fs` holds.
fn uki_path(fs: &slate_esp::session::ReadOnlyFs<'_, Noted>, version: &str) -> Result<String> {
    let names: Vec<String> = fs
        .root_dir()
        .open_dir(slate_esp::UKI_DIR)?
        .iter()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .filter(|n| n.starts_with(&format!("slate-{version}")) && n.ends_with(".efi"))
        .collect();
    let [name] = &names[..] else {
        bail!("the ESP should hold one UKI of {version}: {names:?}");
    };
    Ok(format!("{}/{name}", slate_esp::UKI_DIR))
}

fn noted(image: &Path) -> Result<Noted> {
    Ok(Noted {
        disk: FileDisk::open_read_only(image).with_context(|| image.display().to_string())?,
        reads: Mutex::new(Vec::new()),
    })
}

/// The SHA-256 of the UKI of `version` on the ESP of the disk image `image`.
pub(super) fn esp_uki_digest(image: &Path, version: &str) -> Result<slate_delta::Sha256> {
    let noted = noted(image)?;
    let fs = slate_esp::session::mount_read_only(&noted)?;
    let path = uki_path(&fs, version)?;
    Ok(slate_delta::sha256(&slate_esp::session::read(&fs, &path)?))
}

/// The UKI of `version` on the ESP of the disk image `image`: its path on the ESP, checked to
/// hold `chunk` at the chunk's offset, and where the byte in the middle of that chunk lies on
/// the disk.
pub(super) fn esp_uki_byte(image: &Path, version: &str, chunk: &Chunk) -> Result<(String, u64)> {
    let noted = noted(image)?;
    let fs = slate_esp::session::mount_read_only(&noted)?;
    let path = uki_path(&fs, version)?;
    let mut file = fs.root_dir().open_file(&path)?;
    file.seek(SeekFrom::Start(chunk.offset))?;
    let mut bytes = vec![0; chunk.length as usize];
    file.read_exact(&mut bytes)?;
    ensure!(
        slate_delta::sha256(&bytes) == chunk.digest,
        "{path} does not hold the chunk at {} the index lists",
        chunk.offset
    );
    let middle = chunk.offset + u64::from(chunk.length) / 2;
    file.seek(SeekFrom::Start(middle))?;
    noted.reads.lock().expect("no panics hold it").clear();
    let mut byte = [0u8];
    file.read_exact(&mut byte)?;
    let reads = noted.reads.lock().expect("no panics hold it").clone();
    let [(at, 1)] = reads[..] else {
        bail!("reading byte {middle} of {path} read {reads:?}, not one byte");
    };
    ensure!(noted.disk.read_vec(at, 1)? == byte, "byte {at} of the disk");
    Ok((path, at))
}

/// Where docker-registry's filesystem driver keeps the blob `digest` (`sha256:<hex>`).
pub(super) fn registry_blob(storage: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
    let path = storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    ensure!(path.is_file(), "{} is not in the registry", path.display());
    Ok(path)
}

/// Invert the byte at `offset` of the host file `path` (a registry's blob, a VM's disk image;
/// flipping it again repairs it).
pub(super) fn flip(path: &Path, offset: u64) -> Result<()> {
    let mut file = fs::OpenOptions::new().read(true).write(true).open(path)?;
    let mut byte = [0u8];
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut byte)?;
    file.seek(SeekFrom::Start(offset))?;
    file.write_all(&[!byte[0]])?;
    file.sync_all()?;
    Ok(())
}

/// `F bytes in K chunks to fetch` of a `pull …: blob … by delta:` journal line.
pub(super) fn planned(line: &str) -> Result<(u64, usize)> {
    let words: Vec<&str> = line
        .split_once("by delta: ")
        .with_context(|| format!("no plan in {line:?}"))?
        .1
        .split_whitespace()
        .collect();
    ensure!(
        words.len() >= 5 && words[1] == "bytes" && words[2] == "in" && words[4] == "chunks",
        "no plan in {line:?}"
    );
    Ok((words[0].parse()?, words[3].parse()?))
}

/// The `n`th (from 1) complete console line of this boot containing `needle`.
pub(super) fn nth_line(
    boot: &Running,
    needle: &str,
    n: usize,
    timeout: Duration,
    what: &str,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let serial = boot.serial();
        let complete = &serial[..serial.rfind('\n').map_or(0, |end| end + 1)];
        if let Some(line) = complete.lines().filter(|l| l.contains(needle)).nth(n - 1) {
            return Ok(line.trim().to_owned());
        }
        if Instant::now() > deadline {
            bail!(
                "{what}: not seen after {timeout:?}; console ended with:\n{}",
                crate::vm::tail(&serial, 40)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_plan_is_read_back() {
        let line = "[  12.5] machined: pull 2.0.0: blob sha256:ab (18300000 bytes) by delta: \
                    65536 bytes in 3 chunks to fetch, 18234464 bytes in 560 chunks reused";
        assert_eq!(planned(line).unwrap(), (65536, 3));
        assert!(planned("pull 2.0.0: blob sha256:ab is downloaded whole: why").is_err());
    }

    #[test]
    fn the_chunks_to_fetch_are_the_new_ones_once_each() {
        let chunk = |offset, digest| Chunk {
            offset,
            length: 10,
            digest: [digest; 32],
        };
        let held = ChunkIndex {
            params: slate_delta::DEFAULT_PARAMS,
            blobs: vec![BlobChunks {
                digest: [9; 32],
                size: 20,
                chunks: vec![chunk(0, 1), chunk(10, 2)],
            }],
        };
        let target = BlobChunks {
            digest: [8; 32],
            size: 40,
            chunks: vec![chunk(0, 1), chunk(10, 3), chunk(20, 4), chunk(30, 3)],
        };
        let fetched: Vec<u64> = to_fetch(&target, &[&held])
            .iter()
            .map(|c| c.offset)
            .collect();
        assert_eq!(fetched, [10, 20]);
    }

    #[test]
    fn the_rotted_chunk_is_one_only_the_running_blob_holds_and_the_next_shares() {
        let chunk = |offset, digest| Chunk {
            offset,
            length: 10,
            digest: [digest; 32],
        };
        let blob = |digest, chunks: Vec<Chunk>| BlobChunks {
            digest: [digest; 32],
            size: 10 * chunks.len() as u64,
            chunks,
        };
        // 2 is also in the installer, 3 is listed twice by the next UKI, 5 is not in the next
        // one: of 1, 4 and 6, 4 is nearest the middle.
        let running = blob(
            9,
            vec![
                chunk(0, 1),
                chunk(10, 2),
                chunk(20, 3),
                chunk(30, 4),
                chunk(40, 5),
                chunk(50, 6),
            ],
        );
        let index = ChunkIndex {
            params: slate_delta::DEFAULT_PARAMS,
            blobs: vec![running.clone(), blob(8, vec![chunk(0, 2)])],
        };
        let next = blob(
            7,
            vec![
                chunk(0, 1),
                chunk(10, 2),
                chunk(20, 3),
                chunk(30, 3),
                chunk(40, 4),
                chunk(50, 6),
            ],
        );
        assert_eq!(shared_chunk(&running, &index, &next), Some(chunk(30, 4)));
        let unrelated = blob(6, vec![chunk(0, 7)]);
        assert_eq!(shared_chunk(&running, &index, &unrelated), None);
    }
}
