//! `slate installer install|upgrade` (also the `installer` role): the arguments and the printing
//! around `slate_installer::install` and `slate_installer::upgrade`.
//!
//! machined runs a bundle's own slate as `slate installer upgrade …` and logs its stdout, and the
//! tests read that output: flags and lines here are an interface between versions.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand};

use crate::args::{check_disk, parse_tries, read_bytes, read_config_text, MAX_SMALL_FILE_BYTES};
use slate_installer::{
    InstallEvent, InstallRequest, Provenance, Trust, UpgradeEvent, UpgradeRequest,
};

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
        /// The node's machine configuration (`slate gen config`), written to STATE; without
        /// one the node boots into maintenance mode.
        #[arg(long)]
        config: Option<PathBuf>,
        /// PEM certificates the machine's Secure Boot firmware trusts (its db): systemd-boot
        /// and the UKI must be signed under one of them.
        #[arg(long, value_name = "PEM")]
        secureboot_db: Option<PathBuf>,
        #[arg(long)]
        dry_run: bool,
    },
    /// Upgrade the slate installation on DISK to the bundle's version.
    Upgrade(UpgradeArgs),
    /// Go back to the previous version on DISK: it boots next on trial, with the version the
    /// disk boots now recorded to return to (as `slate rollback` does on a running node).
    Rollback {
        #[arg(long)]
        disk: PathBuf,
        /// Boot-counting tries for the previous version, 1 to 15 (systemd-boot only).
        #[arg(long, value_parser = parse_tries, default_value_t = slate_bootspec::DEFAULT_INSTALL_TRIES)]
        tries: u32,
        #[arg(long)]
        dry_run: bool,
    },
    /// Put a machine configuration onto the STATE partition of an installed slate disk
    /// (formatting STATE: refused when it holds data, unless --force).
    Configure {
        #[arg(long)]
        disk: PathBuf,
        #[arg(long)]
        config: PathBuf,
        #[arg(long)]
        force: bool,
        #[arg(long)]
        dry_run: bool,
    },
}

fn read_config(path: &Path) -> Result<String> {
    read_config_text(path)
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

impl From<TrustArgs> for Trust {
    fn from(args: TrustArgs) -> Self {
        match args.trusted_keys {
            Some(dir) => Trust::KeysIn(dir),
            None => Trust::NotVerified,
        }
    }
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
    /// Boot-counting tries for the new entry, 1 to 15.
    #[arg(long, default_value_t = slate_bootspec::DEFAULT_INSTALL_TRIES, value_parser = parse_tries)]
    tries: u32,
    /// PEM certificates the target's Secure Boot firmware trusts (its db); the new UKI must be
    /// signed by one. Default: the db.auth the disk's ESP enrols, if any (machined passes the
    /// certificate its running image carries).
    #[arg(long, value_name = "PEM")]
    secureboot_db: Option<PathBuf>,
    #[arg(long)]
    dry_run: bool,
}

pub fn run(cmd: InstallerCommand) -> Result<()> {
    match cmd {
        InstallerCommand::Install {
            disk,
            bundle,
            trust,
            force,
            config,
            secureboot_db,
            dry_run,
        } => {
            check_disk(&disk)?;
            let request = InstallRequest {
                bundle,
                trust: trust.into(),
                force,
                dry_run,
                config: config.as_deref().map(read_config).transpose()?,
                secure_boot_db: secureboot_db.as_deref().map(read_db).transpose()?,
            };
            let report = slate_installer::install(&disk, &request, &mut |event| {
                print_install_event(&disk, dry_run, event)
            })?;
            if report.written {
                println!("installed {} {}", report.plan.name, report.plan.version);
            }
            Ok(())
        }
        InstallerCommand::Upgrade(args) => upgrade(args),
        InstallerCommand::Rollback {
            disk,
            tries,
            dry_run,
        } => {
            check_disk(&disk)?;
            let plan = slate_installer::rollback(&disk, tries, dry_run)?;
            println!(
                "{} {}: {} (version {}) boots next on trial, {} {} to return to{}",
                if dry_run {
                    "would roll back"
                } else {
                    "rolled back"
                },
                disk.display(),
                plan.to_on_trial,
                plan.version,
                plan.from,
                if dry_run { "kept" } else { "recorded" },
                if dry_run {
                    " (dry run: nothing written)"
                } else {
                    ""
                }
            );
            Ok(())
        }
        InstallerCommand::Configure {
            disk,
            config,
            force,
            dry_run,
        } => {
            check_disk(&disk)?;
            let text = read_config(&config)?;
            let report = slate_installer::seed_config(&disk, &text, force, dry_run)?;
            println!(
                "{} the machine configuration of node {} onto {} ({} bytes) of {}",
                if report.written {
                    "wrote"
                } else {
                    "would write"
                },
                report.node_name,
                report.place,
                report.state_len,
                disk.display()
            );
            Ok(())
        }
    }
}

fn print_provenance(provenance: &Provenance) {
    match provenance {
        Provenance::Signed {
            name,
            version,
            manifest_digest,
            key_id,
        } => println!(
            "verified {name} {version} ({manifest_digest}) signed by key {}",
            key_id.short()
        ),
        Provenance::NotVerified => println!("not verifying the bundle's signature (--no-verify)"),
    }
}

fn print_install_event(disk: &Path, dry_run: bool, event: InstallEvent<'_>) {
    match event {
        InstallEvent::Opened(provenance) => print_provenance(provenance),
        InstallEvent::Wiping { .. } => {
            println!("{} is not blank; --force: wiping it", disk.display())
        }
        InstallEvent::Planned(plan) => {
            let partitions: Vec<String> = plan
                .layout
                .partitions
                .iter()
                .map(|p| {
                    format!(
                        "  {} {:<9} {:>6} MiB at {} MiB",
                        p.number,
                        p.label,
                        p.len() >> 20,
                        p.start() >> 20
                    )
                })
                .collect();
            let boot = match plan.loader {
                slate_bootloader::LoaderKind::SystemdBoot => {
                    format!(
                        "systemd-boot, EFI/Linux/{} ({} bytes)",
                        plan.uki_name, plan.uki_len
                    )
                }
                slate_bootloader::LoaderKind::Grub => format!(
                    "GRUB, grub.cfg, grubenv, slot {} (kernel and initramfs, {} bytes)",
                    plan.uki_name, plan.uki_len
                ),
            };
            println!(
                "{} {} {} onto {} ({} MiB): {boot}, META\n{}",
                if dry_run {
                    "would install"
                } else {
                    "installing"
                },
                plan.name,
                plan.version,
                disk.display(),
                plan.disk_len >> 20,
                partitions.join("\n")
            );
        }
        InstallEvent::Image(_) => {}
    }
}

/// `--secureboot-db PEM`: the certificates a target's firmware trusts.
fn read_db(path: &Path) -> Result<slate_installer::TrustedCerts> {
    let pem = read_bytes(path, MAX_SMALL_FILE_BYTES, "--secureboot-db")?;
    slate_installer::trusted_from_pem(&pem)
        .with_context(|| format!("--secureboot-db {}", path.display()))
}

fn upgrade(args: UpgradeArgs) -> Result<()> {
    check_disk(&args.disk)?;
    let request = UpgradeRequest {
        bundle: args.bundle,
        trust: args.trust.into(),
        running_entry: args.running_entry,
        variant: args.variant,
        allow_downgrade: args.allow_downgrade,
        tries: args.tries,
        dry_run: args.dry_run,
        secure_boot_db: args.secureboot_db.as_deref().map(read_db).transpose()?,
        uki_handover: slate_installer::UkiHandover::from_env()?,
    };
    // Said on the line machined logs, so that a node's journal (and the VM tests) show which
    // upgrades wrote the verifier's sealed copy.
    let handed_over = if request.uki_handover.is_some() {
        "; UKI taken sealed from its verifier, not hashed again"
    } else {
        ""
    };
    let report = slate_installer::upgrade(&args.disk, &request, &mut |event| match event {
        UpgradeEvent::Opened(provenance) => print_provenance(provenance),
    })?;
    match &report.outcome {
        None => println!(
            "would upgrade {} from {} to {} {} ({:?}, {} bytes of UKI, {} tries, keeping at most \
             {} versions){}",
            args.disk.display(),
            report.running_entry,
            report.name,
            report.version,
            report.kind,
            report.uki_len,
            report.tries,
            report.keep_versions,
            if report.prune.is_empty() {
                String::new()
            } else {
                format!(", pruning {}", report.prune.join(" "))
            }
        ),
        Some(outcome) => println!(
            "installed {} (fallback {}{}{handed_over})",
            outcome.file_name,
            outcome.fallback,
            if outcome.removed.is_empty() {
                String::new()
            } else {
                format!(", pruned {}", outcome.removed.join(" "))
            }
        ),
    }
    Ok(())
}
