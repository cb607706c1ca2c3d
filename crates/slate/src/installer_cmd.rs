//! `slate installer upgrade`: write a bundle's version into the free slot of a slate disk and
//! make it the next boot, with the running version recorded as the fallback. On a node the
//! target version's own slate runs this; offline it upgrades a disk image.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Subcommand;
use slate_bootloader::{Bootloader, MemEfiVars, SystemdBoot, UpgradeRequest};
use slate_disk::FileDisk;
use slate_bundle::{Bundle, BundleManifest};

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

/// The bundle's manifest and its UKI, every byte checked against the digests before use.
pub fn read_bundle(dir: &Path) -> Result<(BundleManifest, Vec<u8>)> {
    let bundle = Bundle::open(dir, None)?;
    let uki = bundle.read_blob(slate_bundle::UKI_ROLE)?;
    Ok((bundle.manifest().clone(), uki))
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
