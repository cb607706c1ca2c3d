//! `slate var`: what an owner does to a node's /var on the node itself (root).

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Subcommand;

use slate_node_fs::var_crypt::{self, Setting};

#[derive(Debug, Subcommand)]
pub enum VarCommand {
    /// Seal a `tpm2` /var's key to this machine's TPM again after its Secure Boot state changed
    /// (a db or dbx update, another shim, Secure Boot turned on or off): the recovery key
    /// authorises a new key sealed to the current PCR 7; no data is touched (root, on the
    /// node; docs/node.md, "/var modes").
    Reseal {
        /// A file holding the recovery key, as printed or written when /var was set up
        /// (surrounding whitespace ignored).
        #[arg(long, value_name = "FILE")]
        recovery_key_file: PathBuf,
        /// The EPHEMERAL partition (default: the partition labelled EPHEMERAL).
        #[arg(long, value_name = "DEVICE")]
        device: Option<PathBuf>,
        /// Check everything (the volume, the recovery key, that the TPM seals and unseals)
        /// and say what would change; nothing is written.
        #[arg(long)]
        dry_run: bool,
    },
}

/// A recovery key is 71 characters; a file much larger is not one.
const MAX_RECOVERY_FILE: u64 = 4096;

pub fn run(cmd: VarCommand) -> Result<()> {
    match cmd {
        VarCommand::Reseal {
            recovery_key_file,
            device,
            dry_run,
        } => {
            let key = slate_files::read_file_bounded(
                &recovery_key_file,
                MAX_RECOVERY_FILE,
                "the recovery key file",
            )?;
            let device = match device {
                Some(device) => device,
                None => {
                    slate_host::find_partition_by_label("EPHEMERAL", None)
                        .context("finding the partition labelled EPHEMERAL (--device names it)")?
                        .device
                }
            };
            let mut setting = Setting::node();
            // Not machined's scratch directory: it may be unlocking at the same time.
            setting.scratch = "/run/slate/var-reseal".into();
            let log = |line: &str| println!("{line}");
            var_crypt::reseal(&device, "EPHEMERAL", &setting, &key, dry_run, &log)
                .with_context(|| format!("resealing /var on {}", device.display()))?;
            if !dry_run {
                println!("the next boot unlocks /var with the TPM again");
            }
            Ok(())
        }
    }
}
