//! `slate installer upgrade`: write a bundle's version into the free slot of a slate disk and
//! make it the next boot, with the running version recorded as the fallback. On a node the
//! target version's own slate runs this; offline it upgrades a disk image.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::Subcommand;
use sha2::{Digest, Sha256};
use slate_bootloader::{Bootloader, MemEfiVars, SystemdBoot, UpgradeRequest};
use slate_disk::FileDisk;
use slate_imager::BundleManifest;

#[derive(Debug, Subcommand)]
pub enum InstallerCommand {
    /// Upgrade the slate installation on DISK to the bundle's version.
    Upgrade {
        /// The disk (image file or block device) holding the installation.
        #[arg(long)]
        disk: PathBuf,
        /// An installer bundle (OCI image layout directory, `slate imager build --output installer`).
        #[arg(long)]
        bundle: PathBuf,
        /// The entry that is running now (default: the one systemd-boot would boot).
        #[arg(long)]
        running_entry: Option<String>,
        /// Boot-counting tries for the new entry.
        #[arg(long, default_value_t = 3)]
        tries: u32,
        #[arg(long)]
        dry_run: bool,
    },
}

/// A blob of the bundle, read and checked against its digest.
fn blob(bundle: &Path, digest: &str) -> Result<Vec<u8>> {
    let hex = digest
        .strip_prefix("sha256:")
        .with_context(|| format!("unsupported digest {digest:?}"))?;
    let path = bundle.join("blobs/sha256").join(hex);
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != hex {
        bail!(
            "{} does not match its digest (sha256:{actual})",
            path.display()
        );
    }
    Ok(bytes)
}

/// The bundle's manifest (the config blob of the one image in index.json) and its UKI.
pub fn read_bundle(bundle: &Path) -> Result<(BundleManifest, Vec<u8>)> {
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(bundle.join("index.json"))
            .with_context(|| format!("reading {}/index.json", bundle.display()))?,
    )
    .context("index.json is not JSON")?;
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .context("index.json names no manifest")?;
    let manifest: serde_json::Value = serde_json::from_slice(&blob(bundle, manifest_digest)?)
        .context("the image manifest is not JSON")?;
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .context("the image manifest has no config")?;
    let config: BundleManifest = serde_json::from_slice(&blob(bundle, config_digest)?)
        .context("the bundle manifest is malformed")?;
    let uki = config
        .blobs
        .get("uki")
        .context("the bundle carries no UKI")?;
    let bytes = blob(bundle, &uki.digest)?;
    if bytes.len() as u64 != uki.size {
        bail!(
            "the UKI blob is {} bytes, the manifest says {}",
            bytes.len(),
            uki.size
        );
    }
    Ok((config, bytes))
}

pub fn run(cmd: InstallerCommand) -> Result<()> {
    let InstallerCommand::Upgrade {
        disk,
        bundle,
        running_entry,
        tries,
        dry_run,
    } = cmd;
    let (manifest, uki) =
        read_bundle(&bundle).with_context(|| format!("reading the bundle {}", bundle.display()))?;
    let file = if dry_run {
        FileDisk::open_read_only(&disk)
    } else {
        FileDisk::open(&disk)
    }
    .with_context(|| format!("opening {}", disk.display()))?;
    // Offline there are no firmware variables to consult; on a node machined passes its own.
    let mut loader = SystemdBoot::new(file, MemEfiVars::new());
    let status = loader
        .status()
        .context("reading the installed boot entries")?;
    let running = match running_entry {
        Some(entry) => entry,
        None => status
            .selected_file()
            .context("systemd-boot would boot nothing on this disk")?
            .to_string(),
    };
    if dry_run {
        println!(
            "would upgrade {} from {running} to {} {} ({} bytes of UKI, {tries} tries)",
            disk.display(),
            manifest.name,
            manifest.version,
            uki.len()
        );
        return Ok(());
    }
    let outcome = loader
        .upgrade(&UpgradeRequest {
            uki: &uki,
            name: &manifest.name,
            version: &manifest.version,
            tries,
            running_entry: &running,
        })
        .with_context(|| format!("upgrading {} to {}", disk.display(), manifest.version))?;
    println!(
        "installed {} (fallback {}{})",
        outcome.file_name,
        outcome.fallback,
        if outcome.removed.is_empty() {
            String::new()
        } else {
            format!(", pruned {}", outcome.removed.join(" "))
        }
    );
    Ok(())
}
