//! The running version's signed chunk index, kept on STATE (issue 41; formats.md §7.7), so
//! that the next upgrade can reuse the chunks of the UKI on the ESP and of the running
//! installer instead of downloading them.
//!
//! What is kept is the installed bundle's layout without its large blobs: `index.json`, the
//! image manifest, the bundle manifest, the chunk index and the signature image —
//! `<STATE>/delta/<manifest hex>/`, written after the installer succeeded. Nothing kept is
//! trusted for being on STATE: the next pull opens it as a bundle, checks its signature against
//! the image's keys and the chunk index's digest against the signed manifest, and even then
//! each chunk read from the ESP or this binary is re-hashed against that index, and used only
//! where the target's own signed index lists the same digest. A rotten or doctored byte costs a
//! fetch, never a wrong byte.

use std::fs;
use std::path::{Path, PathBuf};

use slate_bundle::{Bundle, INSTALLER_ROLE, SYSTEMD_BOOT_ROLE, UKI_ROLE};
use slate_delta::ChunkIndex;
use slate_sequencer::error_chain as chain;
use slate_transport::chunks::FileSeed;
use slate_transport::{MemSeed, SeedBlob};
use slate_trust::PublicKey;

/// Under STATE.
pub const KEPT_DIR: &str = "delta";

/// Keep the documents of the installed `bundle` under `state`, then remove what was kept for
/// any version other than `running` (the one still booted, the way back) and the new one.
/// Returns where they went.
pub fn keep(state: &Path, bundle: &Bundle, running: &str) -> Result<PathBuf, String> {
    let root = state.join(KEPT_DIR);
    fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let name = bundle.digest().hex().to_owned();
    let dest = root.join(&name);
    let temp = root.join(format!(".{name}.tmp"));
    let _ = fs::remove_dir_all(&temp);
    copy_documents(bundle, &temp).inspect_err(|_| {
        let _ = fs::remove_dir_all(&temp);
    })?;
    let _ = fs::remove_dir_all(&dest);
    fs::rename(&temp, &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let version = &bundle.manifest().version;
    for entry in fs::read_dir(&root).map_err(|e| format!("{}: {e}", root.display()))? {
        let Ok(entry) = entry else { continue };
        let path = entry.path();
        if path == dest {
            continue;
        }
        let keep = Bundle::open(&path, None)
            .is_ok_and(|b| b.manifest().version == running && running != version);
        if !keep {
            let _ = fs::remove_dir_all(&path);
        }
    }
    Ok(dest)
}

/// Everything of the bundle's layout but the blobs its roles name.
fn copy_documents(bundle: &Bundle, dest: &Path) -> Result<(), String> {
    let large: Vec<&str> = bundle
        .manifest()
        .blobs
        .values()
        .filter_map(|b| b.digest.strip_prefix("sha256:"))
        .collect();
    let blobs = dest.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(|e| format!("{}: {e}", blobs.display()))?;
    let src = bundle.dir();
    for file in ["oci-layout", "index.json"] {
        let from = src.join(file);
        if from.is_file() {
            fs::copy(&from, dest.join(file)).map_err(|e| format!("{}: {e}", from.display()))?;
        }
    }
    let src_blobs = src.join("blobs/sha256");
    for entry in fs::read_dir(&src_blobs).map_err(|e| format!("{}: {e}", src_blobs.display()))? {
        let entry = entry.map_err(|e| format!("{}: {e}", src_blobs.display()))?;
        let name = entry.file_name();
        let Some(hex) = name.to_str() else { continue };
        if large.contains(&hex) || !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        fs::copy(entry.path(), blobs.join(hex))
            .map_err(|e| format!("{}: {e}", entry.path().display()))?;
    }
    Ok(())
}

/// The kept documents of `version` whose signature verifies against `keys`, and their chunk
/// index. `Ok(None)`: nothing is kept for it (a node installed before issue 41, or from an
/// image, has none until its first upgrade), or its bundle had no index.
pub fn running_index(
    state: &Path,
    version: &str,
    keys: &[PublicKey],
) -> Result<Option<(Bundle, ChunkIndex)>, String> {
    let root = state.join(KEPT_DIR);
    let Ok(entries) = fs::read_dir(&root) else {
        return Ok(None);
    };
    let mut refused = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(bundle) = Bundle::open(&path, None) else {
            continue;
        };
        if bundle.manifest().version != version {
            continue;
        }
        let checked = slate_trust::verify(&bundle, keys)
            .map_err(|e| chain(&e))
            .and_then(|_| bundle.chunk_index().map_err(|e| chain(&e)));
        match checked {
            Ok(Some(index)) => return Ok(Some((bundle, index))),
            Ok(None) => {}
            Err(e) => refused.push(format!("{}: {e}", path.display())),
        }
    }
    if refused.is_empty() {
        Ok(None)
    } else {
        Err(format!(
            "the kept chunk index of {version} is refused ({})",
            refused.join("; ")
        ))
    }
}

/// What a node holds of its running version, as seeds: the UKI's and the boot loader's bytes
/// (read from the ESP) and the installer (this binary).
#[derive(Debug, Default)]
pub struct Running {
    pub uki: Option<Vec<u8>>,
    pub loader: Option<Vec<u8>>,
    pub installer: Option<fs::File>,
}

/// The seeds of a delta: `held`, each listed by the running bundle's signed index. A role the
/// index does not list (systemd-boot, before bundles listed it), or whose bytes are missing,
/// gives no seed.
pub fn seeds(running: &Bundle, index: &ChunkIndex, held: Running) -> Vec<SeedBlob> {
    let listed = |role: &str| {
        let blob = running.manifest().blobs.get(role)?;
        index.blob(&blob.digest).cloned()
    };
    let mut seeds = Vec::new();
    for (role, bytes) in [(UKI_ROLE, held.uki), (SYSTEMD_BOOT_ROLE, held.loader)] {
        if let (Some(chunks), Some(bytes)) = (listed(role), bytes) {
            seeds.push(SeedBlob {
                chunks,
                file: Box::new(MemSeed(bytes)),
            });
        }
    }
    if let (Some(chunks), Some(file)) = (listed(INSTALLER_ROLE), held.installer) {
        seeds.push(SeedBlob {
            chunks,
            file: Box::new(FileSeed(file)),
        });
    }
    seeds
}

/// Seeds without a kept index (a node installed from an image, or whose kept documents were
/// refused): what the node holds, chunked here as the imager chunks. Nothing vouches for these
/// chunk lists, so nothing of them is trusted: a chunk is used only where its bytes hash to a
/// digest the target's signed index lists.
pub fn unlisted_seeds(held: Running) -> Vec<SeedBlob> {
    let installer = held.installer.and_then(|mut file| {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).ok()?;
        Some(bytes)
    });
    [held.uki, held.loader, installer]
        .into_iter()
        .flatten()
        .map(|bytes| SeedBlob {
            chunks: slate_delta::chunk_blob(&bytes, slate_delta::DEFAULT_PARAMS),
            file: Box::new(MemSeed(bytes)),
        })
        .collect()
}

#[cfg(test)]
#[path = "kept_index_tests.rs"]
mod tests;
