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

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use slate_delta::{BlobChunks, Chunk, ChunkIndex};

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

/// Invert the byte at `offset` of the host file `path` (a registry's blob; flipping it again
/// repairs it).
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
}
