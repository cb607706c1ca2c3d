//! `slate snapshot upgrade | commit | rollback | verify | generate-manifest | list | prune`:
//! atomic upgrades of a mutable Btrfs root (docs/update-transaction.md, "Btrfs snapshots";
//! `slate_snapshot_engine` does the work).

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand, ValueEnum};
use slate_snapshot::SnapshotName;
use slate_snapshot_engine::{self as engine, Change, Pool, UpgradeOptions, VerifyPolicy};

use crate::args::{NodeTarget, OutputFormat};

#[derive(Debug, Args)]
pub struct PoolArgs {
    /// The running root: a mounted Btrfs subvolume.
    #[arg(long, default_value = "/", global = true)]
    root: PathBuf,
    /// The disk (or disk image) whose GPT holds the EFI System Partition systemd-boot reads.
    #[arg(long, value_name = "PATH", global = true)]
    esp_disk: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Snapshot the running root, change the snapshot (a command chrooted in it, or an OS
    /// tree), validate it, record its manifest and register it to boot next on trial.
    Upgrade {
        /// Run this with /bin/sh -c inside the snapshot (/proc, /sys, /dev bound).
        #[arg(long, conflicts_with = "tree", required_unless_present = "tree")]
        command: Option<String>,
        /// Sync this OS tree into the snapshot.
        #[arg(long)]
        tree: Option<PathBuf>,
        /// Print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// With --node: the node reboots into the new snapshot after answering.
        #[arg(long)]
        reboot: bool,
        /// systemd-boot's boot-counting tries for the new snapshot, 1 to 15 (3 when absent):
        /// how many failed starts mark it bad before the previous one boots again. GRUB starts
        /// a new snapshot once, and refuses anything but 1.
        #[arg(long, value_parser = crate::args::parse_tries)]
        tries: Option<u32>,
    },
    /// Bless the booted snapshot's entry (it stays the default) and prune.
    Commit {
        #[arg(long)]
        dry_run: bool,
    },
    /// Boot the previous snapshot next, on trial; verify it first.
    Rollback {
        #[arg(long, value_enum, default_value_t = PolicyArg::Warn)]
        verify_on_rollback: PolicyArg,
        #[arg(long)]
        dry_run: bool,
    },
    /// Check snapshots against their manifests (all but the running root, or one).
    Verify {
        snapshot: Option<String>,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Re-stamp a snapshot's manifest after an intended change.
    GenerateManifest {
        snapshot: String,
        #[arg(long)]
        dry_run: bool,
    },
    /// The snapshots, their boot entries, which runs, which is the fallback, which boots next.
    List {
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Remove the oldest snapshots beyond three (never the running root, its fallback or the
    /// entry that boots next).
    Prune {
        #[arg(long)]
        dry_run: bool,
    },
    /// Install systemd units into --root: a oneshot that commits after the health check,
    /// OnFailure= a rollback and reboot, and a hardware-watchdog setting.
    InstallUnits {
        /// The health check (an ExecStart= line; exit 0 = healthy).
        #[arg(long, default_value = slate_snapshot::units::DEFAULT_HEALTH_CHECK)]
        health_check: String,
        /// Seconds the health check may take; longer counts as failed.
        #[arg(long, default_value_t = 120)]
        timeout: u32,
        /// RuntimeWatchdogSec= in seconds.
        #[arg(long, default_value_t = 30)]
        watchdog: u32,
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PolicyArg {
    Warn,
    Strict,
    Off,
}

fn open(pool: &PoolArgs, lock: bool) -> Result<Pool> {
    if !is_root() {
        bail!("slate snapshot needs root (subvolumes, mounts, chroot)");
    }
    let esp = pool
        .esp_disk
        .as_ref()
        .context("--esp-disk PATH is required: the disk holding the ESP")?;
    Pool::open(&pool.root, esp, lock)
        .with_context(|| format!("opening the Btrfs pool of {}", pool.root.display()))
}

/// The effective uid is 0 (`Uid:` in /proc/self/status: real, effective, saved, fs).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|r| r.split_whitespace().nth(1) == Some("0"))
            })
        })
        .unwrap_or(false)
}

fn name(s: &str) -> Result<SnapshotName> {
    Ok(SnapshotName::parse(s)?)
}

pub fn run(pool_args: &PoolArgs, target: &NodeTarget, cmd: SnapshotCommand) -> Result<()> {
    if target.node.is_some() {
        return run_remote(target, cmd);
    }
    let mut say = |line: String| println!("{line}");
    match cmd {
        SnapshotCommand::InstallUnits {
            health_check,
            timeout,
            watchdog,
            dry_run,
        } => {
            let esp = pool_args
                .esp_disk
                .as_ref()
                .context("--esp-disk PATH is required: the units commit and roll back on it")?;
            let slate = std::env::current_exe()
                .and_then(|p| p.canonicalize())
                .context("locating the slate binary")?;
            let spec = slate_snapshot::units::UnitsSpec {
                slate: slate.display().to_string(),
                esp_disk: esp.display().to_string(),
                health_check,
                timeout_secs: timeout,
                watchdog_secs: watchdog,
            };
            let written = engine::install_units(&pool_args.root, &spec, dry_run)
                .context("slate snapshot install-units")?;
            for p in written {
                println!(
                    "{}{}",
                    if dry_run {
                        "dry run: would write "
                    } else {
                        "wrote "
                    },
                    p.display()
                );
            }
            if !dry_run {
                println!("run `systemctl daemon-reload` (and reboot for the watchdog setting)");
            }
        }
        SnapshotCommand::Upgrade {
            command,
            tree,
            dry_run,
            reboot,
            tries,
        } => {
            if reboot {
                bail!("--reboot is for --node; on this machine, reboot through its init");
            }
            let change = match (command, tree) {
                (Some(c), None) => Change::Command(c),
                (None, Some(t)) => Change::Tree(t),
                _ => bail!("give exactly one of --command and --tree"),
            };
            let pool = open(pool_args, !dry_run)?;
            let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
            let opts = UpgradeOptions {
                change,
                dry_run,
                cmdline,
                now: None,
                tries,
            };
            engine::upgrade(&pool, &opts, &mut say).context("slate snapshot upgrade")?;
        }
        SnapshotCommand::Commit { dry_run } => {
            let pool = open(pool_args, !dry_run)?;
            let out = engine::commit(&pool, dry_run).context("slate snapshot commit")?;
            let (renamed, pruned) = (out.renamed, out.pruned);
            let tag = if dry_run { "dry run: " } else { "" };
            match (renamed, out.saved_entry) {
                (Some((from, to)), _) => println!("{tag}blessed: loader/entries/{from} -> {to}"),
                (None, Some((from, to))) => {
                    println!("{tag}committed: grubenv saved_entry {from} -> {to}")
                }
                (None, None) => println!("{tag}already good"),
            }
            println!(
                "{tag}pruned: {}",
                if pruned.is_empty() {
                    "nothing".into()
                } else {
                    pruned.join(", ")
                }
            );
        }
        SnapshotCommand::Rollback {
            verify_on_rollback,
            dry_run,
        } => {
            let policy = match verify_on_rollback {
                PolicyArg::Warn => VerifyPolicy::Warn,
                PolicyArg::Strict => VerifyPolicy::Strict,
                PolicyArg::Off => VerifyPolicy::Off,
            };
            let pool = open(pool_args, !dry_run)?;
            let out =
                engine::rollback(&pool, policy, dry_run).context("slate snapshot rollback")?;
            for n in &out.notes {
                println!("{n}");
            }
            let tag = if dry_run { "dry run: " } else { "" };
            println!(
                "{tag}{} boots next, on trial ({}); the running entry becomes {}",
                out.target, out.to_entry, out.from_entry
            );
        }
        SnapshotCommand::Verify { snapshot, output } => {
            let pool = open(pool_args, true)?;
            let which = snapshot.as_deref().map(name).transpose()?;
            let results = engine::verify(&pool, which.as_ref()).context("slate snapshot verify")?;
            if output == OutputFormat::Json {
                println!("{}", serde_json::to_string_pretty(&results)?);
            } else {
                for r in &results {
                    println!(
                        "{}: {}{}",
                        r.snapshot,
                        r.result,
                        if r.running {
                            " (running root: advisory)"
                        } else {
                            ""
                        }
                    );
                    for d in &r.detail {
                        println!("  {d}");
                    }
                }
            }
            if results
                .iter()
                .any(|r| !r.running && matches!(r.result.as_str(), "mismatch" | "bad-manifest"))
            {
                bail!("verification failed");
            }
        }
        SnapshotCommand::GenerateManifest { snapshot, dry_run } => {
            let pool = open(pool_args, !dry_run)?;
            let n = engine::generate_manifest(&pool, &name(&snapshot)?, dry_run)
                .context("slate snapshot generate-manifest")?;
            println!(
                "{}{snapshot}: manifest of {n} records",
                if dry_run { "dry run: " } else { "" }
            );
        }
        SnapshotCommand::List { output } => {
            let pool = open(pool_args, false)?;
            let listing = engine::list(&pool).context("slate snapshot list")?;
            print_listing(&listing, output)?;
        }
        SnapshotCommand::Prune { dry_run } => {
            let pool = open(pool_args, !dry_run)?;
            let pruned = engine::prune(&pool, dry_run).context("slate snapshot prune")?;
            println!(
                "{}pruned: {}",
                if dry_run { "dry run: " } else { "" },
                if pruned.is_empty() {
                    "nothing".into()
                } else {
                    pruned.join(", ")
                }
            );
        }
    }
    Ok(())
}

fn print_listing(listing: &engine::Listing, output: OutputFormat) -> Result<()> {
    if output == OutputFormat::Json {
        println!("{}", serde_json::to_string_pretty(listing)?);
        return Ok(());
    }
    println!(
        "pool {} — running {}, next boot {}",
        listing.pool_uuid,
        listing.running,
        listing.next_boot.as_deref().unwrap_or("(none)")
    );
    for s in &listing.snapshots {
        let flags: Vec<&str> = [
            (s.running, "running"),
            (s.fallback, "fallback"),
            (s.boots_next, "next"),
            (!s.manifest, "no-manifest"),
        ]
        .into_iter()
        .filter_map(|(on, f)| on.then_some(f))
        .collect();
        println!(
            "{}  {:13}  {}  {}",
            s.name,
            s.state,
            s.entry.as_deref().unwrap_or("-"),
            flags.join(",")
        );
    }
    for w in &listing.warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}

/// `--node`: `upgrade --command` and `list` through the node API (a slate node whose root is
/// a Btrfs snapshot runs them in machined); the other commands are local only.
/// The client is set up inside each arm: what cannot run remotely is refused before any key
/// material is read, so the refusal is the answer whether or not a client could be made.
fn run_remote(target: &NodeTarget, cmd: SnapshotCommand) -> Result<()> {
    match cmd {
        SnapshotCommand::Upgrade {
            command: Some(command),
            tree: None,
            dry_run,
            reboot,
            tries,
        } => {
            let client = target.client()?;
            let req = slate_api::SnapshotUpgradeRequest {
                command,
                reboot,
                dry_run,
                tries,
            };
            let report = client
                .snapshot_upgrade(&req)
                .with_context(|| format!("slate snapshot upgrade on {}", client.addr()))?;
            for line in report["lines"].as_array().into_iter().flatten() {
                println!("{}", line.as_str().unwrap_or_default());
            }
            if reboot && !dry_run {
                println!(
                    "{} is rebooting into {}",
                    client.addr(),
                    report["snapshot"].as_str().unwrap_or("?")
                );
            }
            Ok(())
        }
        SnapshotCommand::List { output } => {
            let client = target.client()?;
            let value = client
                .snapshots()
                .with_context(|| format!("slate snapshot list on {}", client.addr()))?;
            let listing: engine::Listing = serde_json::from_value(value)
                .with_context(|| format!("the listing {} answered", client.addr()))?;
            print_listing(&listing, output)
        }
        _ => bail!(
            "with --node, `slate snapshot` runs `upgrade --command` and `list` only; run the \
             others on the machine"
        ),
    }
}
