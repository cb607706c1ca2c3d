//! The engine's directory on a pool an image build has just made (`slate imager build
//! --output btrfs-image`): the manifest key, and the first snapshot's manifest — its `/usr` and
//! `/boot` and the kernel copies about to go onto the ESP — exactly as an upgrade's step 5
//! writes them, so `slate snapshot verify` on the first boot checks the image's root.

use std::fs;
use std::path::Path;

use slate_snapshot::entry;
use slate_snapshot::manifest::{sha256, Manifest, Record};
use slate_snapshot::SnapshotName;

use crate::pool::Pool;
use crate::{io_err, tree, EngineError, Result};

/// What [`seed_engine_dir`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedReport {
    /// `<top>/.slate/manifests/<snapshot>.manifest`.
    pub manifest: std::path::PathBuf,
    pub records: usize,
}

/// Writes `<top>/.slate/` for the pool mounted (top level, subvolid 5) at `top`: the
/// directories an opened pool creates, a new manifest key (32 random bytes, 0600) and the
/// manifest of `snapshot` (a subvolume directly under `top`), with `esp_copies` (kernel,
/// initramfs) as its ESP copies (`slate/<snapshot>/vmlinuz`, `initrd.img`) on systemd-boot;
/// `None` on GRUB, which boots the snapshot's own /boot. Refused when `top` has an engine
/// directory already: a key is never replaced.
pub fn seed_engine_dir(
    top: &Path,
    pool_uuid: &str,
    snapshot: &SnapshotName,
    esp_copies: Option<(&[u8], &[u8])>,
) -> Result<SeedReport> {
    let pool = Pool::at_top(top, pool_uuid);
    let dir = pool.engine_dir();
    if dir.exists() {
        return Err(EngineError::Invalid(format!(
            "{} exists already: the pool has a manifest key",
            dir.display()
        )));
    }
    let root = pool.path_of(snapshot);
    if !slate_host::is_subvolume(&root)? {
        return Err(EngineError::Invalid(format!(
            "{} is not a subvolume",
            root.display()
        )));
    }
    for d in [dir.clone(), dir.join("manifests"), dir.join("in-progress")] {
        fs::create_dir_all(&d).map_err(io_err("creating", &d))?;
    }
    let mut manifest = Manifest::new(snapshot.clone());
    tree::walk_into(&root, &mut manifest)?;
    let copies = esp_copies.map(|(kernel, initrd)| {
        [
            (entry::kernel_path(snapshot), kernel),
            (entry::initrd_path(snapshot), initrd),
        ]
    });
    for (path, bytes) in copies.into_iter().flatten() {
        manifest.insert(
            path.as_bytes(),
            Record::Esp {
                size: bytes.len() as u64,
                sha256: sha256(bytes),
            },
        )?;
    }
    pool.write_manifest(&manifest)?;
    Ok(SeedReport {
        manifest: pool.manifest_path(snapshot),
        records: manifest.records.len(),
    })
}
