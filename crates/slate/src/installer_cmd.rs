//! The installer role, one bundle reader for both modes:
//! - `slate installer install`: lay a bundle's version onto a blank disk (or, with `--force`,
//!   over whatever it holds): partition table, ESP with systemd-boot and the UKI, META.
//! - `slate installer upgrade`: write a bundle's version into the free slot of a slate disk and
//!   make it the next boot, with the running version recorded as the fallback. On a node the
//!   target version's own slate runs this; offline it upgrades a disk image.
//!
//! The image mode is `slate imager build --output image`, over the same `write_image`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand};
use slate_bootloader::{MemEfiVars, UpgradeRequest};
use slate_bundle::{Bundle, BundleManifest, NATIVE_ARCH};
use slate_disk::{Disk as _, FileDisk, PartitionView};
use slate_esp::{loader_conf, uki_file_name};
use slate_installer::{write_image, ImagePlan};
use slate_layout::LayoutParams;
use slate_meta::MetaStore;

#[derive(Debug, Subcommand)]
pub enum InstallerCommand {
    /// Install the bundle's version onto DISK, which must be blank (or `--force`).
    Install {
        /// The target disk (block device or image file).
        #[arg(long)]
        disk: PathBuf,
        /// An installer bundle (OCI image layout directory).
        #[arg(long)]
        bundle: PathBuf,
        #[command(flatten)]
        trust: TrustArgs,
        /// Wipe a disk that is not blank.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        dry_run: bool,
    },
    /// Upgrade the slate installation on DISK to the bundle's version.
    Upgrade(UpgradeArgs),
}

/// How the bundle is trusted: its signature checked against keys, or (explicitly) not at all.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct TrustArgs {
    /// Directory of trusted public keys (`*.pub`); on a node, /etc/slate/trusted-keys.
    #[arg(long)]
    trusted_keys: Option<PathBuf>,
    /// Skip the signature check (digests are still checked). For images you built yourself.
    #[arg(long)]
    no_verify: bool,
}

#[derive(Debug, Args)]
pub struct UpgradeArgs {
    /// The disk (image file or block device) holding the installation.
    #[arg(long)]
    disk: PathBuf,
    /// An installer bundle (OCI image layout directory, `slate imager build --output installer`).
    #[arg(long)]
    bundle: PathBuf,
    #[command(flatten)]
    trust: TrustArgs,
    /// The entry that is running now (default: the one systemd-boot would boot).
    #[arg(long)]
    running_entry: Option<String>,
    /// The running system's variant, which the bundle's must match (default: not checked).
    #[arg(long)]
    variant: Option<String>,
    /// Allow an older version than the running one (META `VersionFloor` still applies).
    #[arg(long)]
    allow_downgrade: bool,
    /// Boot-counting tries for the new entry.
    #[arg(long, default_value_t = 3)]
    tries: u32,
    #[arg(long)]
    dry_run: bool,
}

/// Open the bundle and, unless told not to, check its signature. The blobs the installer uses are
/// checked against their digests as they are read (`read_blob`), each hashed once: at 256 MiB
/// the hash is most of an upgrade's time.
fn open_trusted(dir: &Path, trust: &TrustArgs) -> Result<Bundle> {
    let bundle =
        Bundle::open(dir, None).with_context(|| format!("reading the bundle {}", dir.display()))?;
    match &trust.trusted_keys {
        Some(keys_dir) => {
            let keys = slate_trust::load_trusted_keys(keys_dir)
                .with_context(|| format!("loading trusted keys from {}", keys_dir.display()))?;
            let verified = slate_trust::verify(&bundle, &keys)
                .with_context(|| format!("verifying the bundle {}", dir.display()))?;
            println!(
                "verified {} {} ({}) signed by key {}",
                bundle.manifest().name,
                bundle.manifest().version,
                verified.manifest_digest,
                verified.key_id.short()
            );
        }
        None => println!("not verifying the bundle's signature (--no-verify)"),
    }
    Ok(bundle)
}

/// META `VersionFloor` of the slate disk, if one is kept.
fn version_floor(disk: &Path) -> Result<Option<String>> {
    let mut file = FileDisk::open_read_only(disk)?;
    let part = slate_layout::find_partition(&mut file, slate_layout::META_LABEL)
        .with_context(|| format!("finding META on {}", disk.display()))?;
    let store =
        MetaStore::open(PartitionView::new(file, part.start, part.len)?).context("reading META")?;
    Ok(store
        .get(slate_meta::tags::VERSION_FLOOR)
        .map(|v| String::from_utf8_lossy(v).trim().to_string()))
}

pub fn run(cmd: InstallerCommand) -> Result<()> {
    match cmd {
        InstallerCommand::Install {
            disk,
            bundle,
            trust,
            force,
            dry_run,
        } => install(&disk, &bundle, &trust, force, dry_run),
        InstallerCommand::Upgrade(args) => upgrade(args),
    }
}

/// Where the disk first holds a non-zero byte, looking at its head and tail (where partition
/// tables, filesystem superblocks and RAID/LVM labels live).
fn first_data(disk: &FileDisk) -> Result<Option<u64>> {
    const WINDOW: u64 = 1 << 20;
    let len = disk.len();
    let mut buf = vec![0u8; WINDOW.min(len) as usize];
    for start in [0, len.saturating_sub(WINDOW)] {
        disk.read_at(start, &mut buf)
            .context("reading the disk to see whether it is blank")?;
        if let Some(i) = buf.iter().position(|&b| b != 0) {
            return Ok(Some(start + i as u64));
        }
    }
    Ok(None)
}

/// A fresh identity for the disk's GUIDs: two machines installed from one bundle must not share
/// partition GUIDs (images are reproducible instead, see the imager).
fn install_id(manifest: &BundleManifest) -> Result<String> {
    let mut seed = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .context("reading /dev/urandom")?;
    Ok(format!(
        "{}-{}-{}",
        manifest.name,
        manifest.version,
        hex::encode(seed)
    ))
}

fn install(disk: &Path, dir: &Path, trust: &TrustArgs, force: bool, dry_run: bool) -> Result<()> {
    let bundle = open_trusted(dir, trust)?;
    let manifest = bundle.manifest().clone();
    if manifest.arch != NATIVE_ARCH {
        bail!(
            "the bundle is for {}, this installer for {NATIVE_ARCH}",
            manifest.arch
        );
    }
    let defaults = manifest.install.with_context(|| {
        format!(
            "the bundle {} {} carries no install settings (it was built for upgrades only)",
            manifest.name, manifest.version
        )
    })?;
    let uki = bundle.read_blob(slate_bundle::UKI_ROLE)?;
    let systemd_boot = bundle.read_blob(slate_bundle::SYSTEMD_BOOT_ROLE)?;
    let plan = ImagePlan {
        image_id: install_id(&manifest)?,
        layout: LayoutParams {
            esp_size: defaults.esp_mib << 20,
            state_size: defaults.state_mib << 20,
            ..LayoutParams::default()
        },
        source_date_epoch: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        systemd_boot,
        uki_name: uki_file_name(&manifest.name, &manifest.version, Some(defaults.tries))?,
        uki,
        loader_conf: loader_conf(&format!("{}-*", manifest.name), defaults.menu_timeout)?,
    };
    let mut file = if dry_run {
        FileDisk::open_read_only(disk)
    } else {
        FileDisk::open(disk)
    }
    .with_context(|| format!("opening {}", disk.display()))?;
    let placed = plan
        .disk_layout()
        .place(file.len())
        .with_context(|| format!("laying out {}", disk.display()))?;
    if let Some(offset) = first_data(&file)? {
        if !force {
            bail!(
                "{} is not blank (data at byte {offset}); refusing to install over it — pass \
                 --force to wipe it",
                disk.display()
            );
        }
        println!("{} is not blank; --force: wiping it", disk.display());
    }
    let sector = placed.sector_size;
    let plan_lines: Vec<String> = placed
        .partitions
        .iter()
        .map(|p| {
            format!(
                "  {} {:<9} {:>6} MiB at {} MiB",
                p.number,
                p.label,
                ((p.last_lba + 1 - p.first_lba) * sector) >> 20,
                (p.first_lba * sector) >> 20
            )
        })
        .collect();
    println!(
        "{} {} {} onto {} ({} MiB): systemd-boot, EFI/Linux/{} ({} bytes), META\n{}",
        if dry_run {
            "would install"
        } else {
            "installing"
        },
        manifest.name,
        manifest.version,
        disk.display(),
        file.len() >> 20,
        plan.uki_name,
        plan.uki.len(),
        plan_lines.join("\n")
    );
    if dry_run {
        return Ok(());
    }
    write_image(&mut file, &plan, &mut |_| {})
        .with_context(|| format!("installing onto {}", disk.display()))?;
    println!("installed {} {}", manifest.name, manifest.version);
    Ok(())
}

fn upgrade(args: UpgradeArgs) -> Result<()> {
    let UpgradeArgs {
        disk,
        bundle: dir,
        trust,
        running_entry,
        variant,
        allow_downgrade,
        tries,
        dry_run,
    } = args;
    // Everything about the bundle is settled before the disk is opened for writing.
    let bundle = open_trusted(&dir, &trust)?;
    let manifest = bundle.manifest().clone();
    let uki = bundle.read_blob(slate_bundle::UKI_ROLE)?;
    // The loader the disk was installed with (systemd-boot, or GRUB: grub/grubenv on the ESP).
    let status = slate_bootloader::probe(
        FileDisk::open_read_only(&disk).with_context(|| format!("opening {}", disk.display()))?,
        MemEfiVars::new(),
    )
    .and_then(|loader| loader.status())
    .with_context(|| format!("reading the boot entries on {}", disk.display()))?;
    let running = match running_entry {
        Some(entry) => entry,
        None => status
            .selected_file()
            .context("systemd-boot would boot nothing on this disk")?
            .to_string(),
    };
    let running_version = status
        .entry(&running)
        .and_then(|e| e.version.clone())
        .with_context(|| format!("no entry on {} is {running:?}", disk.display()))?;
    let facts = slate_trust::NodeFacts {
        arch: NATIVE_ARCH.into(),
        variant: variant.unwrap_or_else(|| manifest.variant.clone()),
        running_version: running_version.clone(),
        version_floor: version_floor(&disk)?,
    };
    let kind =
        slate_trust::check_update(&manifest, &facts, allow_downgrade).with_context(|| {
            format!(
                "upgrading {} from {running_version} to {}",
                disk.display(),
                manifest.version
            )
        })?;
    if dry_run {
        println!(
            "would upgrade {} from {running} to {} {} ({kind:?}, {} bytes of UKI, {tries} tries)",
            disk.display(),
            manifest.name,
            manifest.version,
            uki.len()
        );
        return Ok(());
    }
    let file = FileDisk::open(&disk).with_context(|| format!("opening {}", disk.display()))?;
    // Offline there are no firmware variables to consult.
    let mut loader = slate_bootloader::probe(file, MemEfiVars::new())
        .with_context(|| format!("reading the boot loader on {}", disk.display()))?;
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
