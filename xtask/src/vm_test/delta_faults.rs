//! The faults `delta_upgrade` injects (issue 41), and what the host expects of each, computed
//! from the signed chunk indexes of the bundles it built:
//!
//! - a chunk corrupted in the registry's storage: the blob file under docker-registry's
//!   filesystem driver is the very bytes a range request is served from (distribution 2.8 keeps
//!   no content cache), so flipping one byte there is a corrupt registry without a proxy in
//!   the way. The corrupted chunk is the last one the node must fetch of the UKI, so every
//!   other chunk of the failed attempt is fetched (the fetchers take chunks in order and finish
//!   what they took) and kept in `incoming/chunks/`: the attempt after the repair must fetch
//!   exactly that one chunk;
//! - a running UKI corrupted on the ESP (the VM off): one byte of the PE header's padding, which
//!   neither the firmware nor the stub reads, so the node still boots it while the chunk that
//!   holds it no longer matches the running version's signed index.

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

/// The offset of a byte of the PE header's padding (after the section table, before
/// `SizeOfHeaders`): never read by a loader, yet covered by the file's first chunk.
fn header_padding(pe: &[u8]) -> Result<u64> {
    let u16_at = |at: usize| -> Result<usize> {
        Ok(u16::from_le_bytes(pe.get(at..at + 2).context("a short PE")?.try_into()?) as usize)
    };
    let u32_at = |at: usize| -> Result<usize> {
        Ok(u32::from_le_bytes(pe.get(at..at + 4).context("a short PE")?.try_into()?) as usize)
    };
    let coff = u32_at(0x3c)? + 4;
    let sections = u16_at(coff + 2)?;
    let optional = coff + 20;
    let table_end = optional + u16_at(coff + 16)? + 40 * sections;
    let headers = u32_at(optional + 60)?;
    ensure!(
        table_end + 16 < headers,
        "the UKI's headers have no padding ({table_end} of {headers} bytes used)"
    );
    let at = table_end + (headers - table_end) / 2;
    ensure!(pe[at] == 0, "byte {at} of the UKI's headers is not padding");
    Ok(at as u64)
}

/// Flip a padding byte of the running UKI of `version` on the ESP of the disk image `image`
/// (the VM off), which must be the blob `chunks` lists; the chunk that held it.
pub(super) fn corrupt_running_uki(
    image: &Path,
    version: &str,
    chunks: &BlobChunks,
) -> Result<Chunk> {
    let mut disk = slate_disk::FileDisk::open(image)?;
    let prefix = format!("slate-{version}");
    let name = {
        let fs = slate_esp::session::mount_read_only(&disk)?;
        let dir = fs.root_dir().open_dir(slate_esp::UKI_DIR)?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let name = entry?.file_name();
            if name.starts_with(&prefix) && name.ends_with(".efi") {
                names.push(name);
            }
        }
        match names.as_slice() {
            [one] => format!("{}/{one}", slate_esp::UKI_DIR),
            _ => bail!("the ESP holds {names:?} for {version}, not one UKI"),
        }
    };
    let mut bytes = slate_esp::session::read_file(&disk, &name)?
        .with_context(|| format!("{name} cannot be read"))?;
    ensure!(
        slate_delta::sha256(&bytes) == chunks.digest,
        "{name} is not the bundle's UKI"
    );
    let at = header_padding(&bytes)?;
    bytes[at as usize] ^= 0xff;
    slate_esp::session::rewrite_in_place(&mut disk, 0, &name, &bytes)?;
    let chunk = chunks
        .chunks
        .iter()
        .find(|c| (c.offset..c.offset + u64::from(c.length)).contains(&at))
        .copied()
        .context("no chunk holds the byte")?;
    Ok(chunk)
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
    fn the_padding_after_the_section_table_is_found() {
        // A PE head: e_lfanew 0x80, two sections, a 240-byte optional header, 0x400 of headers.
        let mut pe = vec![0u8; 0x400];
        pe[0x3c] = 0x80;
        let coff = 0x84;
        pe[coff + 2] = 2;
        pe[coff + 16] = 240;
        pe[coff + 20 + 60..coff + 20 + 64].copy_from_slice(&0x400u32.to_le_bytes());
        let table_end = coff + 20 + 240 + 80;
        let at = header_padding(&pe).unwrap() as usize;
        assert!(at >= table_end && at < 0x400, "{at}");
        pe[at] = 1;
        assert!(header_padding(&pe).is_err(), "a used byte is not padding");
    }
}
