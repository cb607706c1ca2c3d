//! The command-line surface. Thin: every command parses its arguments and calls a library.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Result;
use clap::{CommandFactory as _, Parser, Subcommand};

use crate::args::{NodeTarget, OutputFormat, RebootModeArg};
use crate::boot_cmd::{self, BootCommand};
use crate::bundle_cmd::{self, BundleCommand};
#[cfg(feature = "etcd")]
use crate::fleet_cmd::{self, FleetCommand, OperatorCommand};
use crate::fleetlock_cmd::{self, FleetlockCommand};
use crate::imager_cmd::{self, ImagerCommand};
use crate::installer_cmd::{self, InstallerCommand};
use crate::meta_cmd::{self, MetaCommand};
use crate::node_cmd;
use crate::release_cmd::{self, ReleaseCommand};
use crate::snapshot_cmd::{self, PoolArgs, SnapshotCommand};
use crate::{config_cmd, services_cmd, transport_cmd, trust_cmd, upgrade_cmd};

#[derive(Debug, Parser)]
#[command(
    name = "slate",
    version,
    about = "Atomic, image-based OS updates with automatic rollback"
)]
pub struct Cli {
    #[command(flatten)]
    pub target: NodeTarget,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read and change the META partition (values kept across reboots).
    #[command(subcommand)]
    Meta(MetaCommand),
    /// Build images from a profile (also the `imager` role).
    #[command(subcommand)]
    Imager(ImagerCommand),
    /// Run as the initramfs init (PID 1): mount the root image and switch to it.
    #[command(hide = true, disable_help_flag = true)]
    Init {
        /// Arguments the kernel passed to init, handed on to the real init.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Run the setup hooks due after a reset of /etc (a systemd image's
    /// slate-setup-hooks.service).
    #[command(hide = true)]
    SetupHooks,
    /// Install or upgrade slate on a disk (also the `installer` role).
    #[command(subcommand)]
    Installer(InstallerCommand),
    /// Run the image's health check N (`slate-check@N.service` on a systemd image).
    #[command(hide = true)]
    HealthCheck {
        /// The check's index in the image's `[[health.checks]]`.
        index: usize,
    },
    /// Run as machined, the node's real PID 1 (or, with --under-systemd, slate-machined.service
    /// on a systemd image).
    #[command(hide = true)]
    Machined {
        /// Run as a service of systemd: the node API, the update agent, health checks and the
        /// commit; systemd owns the volumes, the network, the services and the way down.
        #[arg(long)]
        under_systemd: bool,
    },
    /// The boot loader's view of a disk: `boot explain` shows which entry boots next and why.
    #[command(subcommand)]
    Boot(BootCommand),
    /// Make identities: `gen certs` for the node API.
    #[command(subcommand)]
    Gen(GenCommand),
    /// Make a key pair that signs installer bundles (slate.key 0600, slate.pub).
    Keygen(trust_cmd::KeygenArgs),
    /// Sign an installer bundle (cosign's signature layout, kept in the bundle's OCI layout).
    Sign(trust_cmd::SignArgs),
    /// Verify an installer bundle's signature against trusted keys, and every blob's digest.
    Verify(trust_cmd::VerifyArgs),
    /// Installer bundles offline: `bundle diff A B` shows what changed between two versions.
    #[command(subcommand)]
    Bundle(BundleCommand),
    /// Push an installer bundle (every tag in it) to an OCI registry or another OCI layout.
    Push(transport_cmd::PushArgs),
    /// Pull an installer bundle (and its signature) from an OCI registry or layout into a local
    /// layout cache; prints the layout and the manifest digest.
    Pull(transport_cmd::PullArgs),
    /// Releases in a registry repository: publish a signed bundle to a channel (alpha, beta,
    /// stable), promote, yank, list; the release index and the channel tags follow.
    #[command(subcommand)]
    Release(ReleaseCommand),
    /// The node's booted version, stage and running sequence.
    Status {
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
        /// Only the boot breakdown: firmware, loader, init's milestones, machined's phases and
        /// tasks, each with when it started and how long it took.
        #[arg(long)]
        boot_times: bool,
    },
    /// The node's version.
    Version {
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Reboot the node.
    Reboot {
        #[arg(long, value_enum, default_value_t)]
        mode: RebootModeArg,
        /// Boot this entry (an ID such as `slate-1.0.0.efi`, `slate boot explain` lists them)
        /// for the next boot only, then the default again (admin; systemd-boot's
        /// `LoaderEntryOneShot`).
        #[arg(long, value_name = "ENTRY")]
        entry: Option<String>,
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        wait: crate::wait::WaitArgs,
        /// `json` with --wait: one progress event per line.
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Keep a version's UKI on the node's ESP whatever later upgrades prune (admin; META
    /// PinnedVersions, kept across upgrades and reverts; systemd-boot disks only).
    Pin {
        version: String,
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Let later upgrades prune a pinned version again (admin).
    Unpin {
        version: String,
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Go back to the previous version still on the node's disk (admin): it boots next on trial
    /// with the running version recorded to return to, and the node reboots. Its health
    /// checks then commit it, or a failure brings the node back, as after an upgrade.
    Rollback {
        /// Boot-counting tries for the previous version, 1 to 15 (the node's default, 3, when
        /// absent; systemd-boot only: GRUB boots it once).
        #[arg(long, value_parser = crate::args::parse_tries)]
        tries: Option<u32>,
        #[arg(long, value_enum, default_value_t)]
        reboot_mode: RebootModeArg,
        /// Ask the node what would boot next; nothing is written, nothing reboots.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        wait: crate::wait::WaitArgs,
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Shut the node down in order (operator): the same teardown as a reboot, then power
    /// off. It stays off until powered on.
    Shutdown {
        #[arg(long)]
        dry_run: bool,
    },
    /// A `tpm2` /var on this machine (root, on the node).
    #[command(subcommand)]
    Var(crate::var_cmd::VarCommand),
    /// Reset the node: wipe STATE and EPHEMERAL, reboot.
    Reset {
        #[arg(long)]
        dry_run: bool,
    },
    /// Upgrade the node to an installer bundle: upload it, then the node installs it with
    /// the bundle's own installer and reboots.
    Upgrade(upgrade_cmd::UpgradeArgs),
    /// machined's log.
    Logs {
        #[arg(short, long)]
        follow: bool,
        /// Only one service's: its output and what machined said of it.
        #[arg(long, value_name = "NAME")]
        service: Option<String>,
    },
    /// The node's services: state, pid, readiness, restarts, memory, last exit.
    Services {
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Start, stop or restart one of the node's services (operator).
    #[command(subcommand)]
    Service(services_cmd::ServiceCommand),
    /// The node's kernel log.
    Dmesg {
        #[arg(short, long)]
        follow: bool,
    },
    /// Send a machine configuration to the node (admin; `--insecure --token` for a node in
    /// maintenance mode). It is validated here and again on the node before it is written.
    ApplyConfig(config_cmd::ApplyConfigArgs),
    /// The node's machine configuration.
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// A FleetLock v1 lock server (zincati's reboot-slot protocol) and its admin commands.
    #[command(subcommand)]
    Fleetlock(FleetlockCommand),
    /// Atomic upgrades of a mutable Btrfs root: snapshot, change, validate, boot on trial,
    /// commit or fall back (root only).
    Snapshot {
        #[command(flatten)]
        pool: PoolArgs,
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// The rollout operator: `operator run` is one replica (state in etcd).
    #[cfg(feature = "etcd")]
    #[command(subcommand)]
    Operator(OperatorCommand),
    /// The rollout operator's API (`--node` or SLATE_OPERATOR names a replica): status, plan,
    /// pause/resume/abort, policies.
    #[cfg(feature = "etcd")]
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
pub enum GenCommand {
    /// Make the fleet's two CAs — the client CA (admin/operator/reader certificates) and the
    /// fleet CA (each node's own CA, `slate gen config`; the services' certificate) — and the
    /// certificates made from them. Both CA keys stay with you, never on a node.
    Certs {
        #[arg(long)]
        out: PathBuf,
        /// Extra names (DNS or IP) of the services' certificate (`service.crt`: the rollout
        /// operator, a FleetLock server with TLS), beside localhost.
        #[arg(long = "san")]
        sans: Vec<String>,
        #[arg(long)]
        dry_run: bool,
    },
    /// Print a machine configuration for one node (`--name`): its own CA, constrained to its
    /// names, from the fleet CA of `--pki`.
    Config(Box<config_cmd::GenConfigArgs>),
    /// Make an owner's Secure Boot keys in a new directory: PK, KEK and db keys and
    /// certificates, and the signed PK.auth, KEK.auth and db.auth a Secure Boot image enrols
    /// (needs openssl and efitools). A profile then names them in `[secureboot]`.
    SecurebootKeys {
        #[arg(long)]
        out: PathBuf,
        /// The certificates' common-name prefix.
        #[arg(long, default_value = "slate owner")]
        name: String,
        #[arg(long)]
        dry_run: bool,
    },
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Meta(cmd) => meta_cmd::run(cmd),
        Command::Boot(cmd) => boot_cmd::run(&cli.target, cmd),
        Command::Init { args } => slate_init::run(args),
        Command::Imager(cmd) => imager_cmd::run(cmd),
        Command::HealthCheck { index } => slate_machined::health_check_unit(index),
        Command::Machined { under_systemd } => match under_systemd {
            false => slate_machined::run(),
            true => slate_machined::run_under_systemd(),
        },
        Command::SetupHooks => slate_init::systemd::setup_hooks(),
        Command::Var(cmd) => crate::var_cmd::run(cmd),
        Command::Installer(cmd) => installer_cmd::run(cmd),
        Command::Gen(GenCommand::Certs { out, sans, dry_run }) => {
            node_cmd::gen_certs(out, sans, dry_run)
        }
        Command::Gen(GenCommand::Config(args)) => config_cmd::gen_config(*args),
        Command::Gen(GenCommand::SecurebootKeys { out, name, dry_run }) => {
            node_cmd::gen_secureboot_keys(&out, &name, dry_run)
        }
        Command::Keygen(args) => trust_cmd::keygen(args),
        Command::Sign(args) => trust_cmd::sign(args),
        Command::Verify(args) => trust_cmd::verify(args),
        Command::Bundle(cmd) => bundle_cmd::run(cmd),
        Command::Push(args) => transport_cmd::push(args),
        Command::Pull(args) => transport_cmd::pull(args),
        Command::Release(cmd) => release_cmd::run(cmd),
        Command::Snapshot { pool, command } => snapshot_cmd::run(&pool, &cli.target, command),
        Command::Status { output, boot_times } => node_cmd::status(&cli.target, output, boot_times),
        Command::Version { output } => node_cmd::version(&cli.target, output),
        Command::Reboot {
            mode,
            entry,
            dry_run,
            wait,
            output,
        } => node_cmd::reboot(&cli.target, mode, entry.as_deref(), dry_run, &wait, output),
        Command::Pin {
            version,
            dry_run,
            output,
        } => node_cmd::pin(
            &cli.target,
            &slate_api::PinRequest {
                version,
                pin: true,
                dry_run,
            },
            output,
        ),
        Command::Unpin {
            version,
            dry_run,
            output,
        } => node_cmd::pin(
            &cli.target,
            &slate_api::PinRequest {
                version,
                pin: false,
                dry_run,
            },
            output,
        ),
        Command::Rollback {
            tries,
            reboot_mode,
            dry_run,
            wait,
            output,
        } => node_cmd::rollback(
            &cli.target,
            &slate_api::RollbackRequest {
                dry_run,
                tries,
                reboot_mode: reboot_mode.into(),
            },
            &wait,
            output,
        ),
        Command::Reset { dry_run } => node_cmd::reset(&cli.target, dry_run),
        Command::Shutdown { dry_run } => node_cmd::shutdown(&cli.target, dry_run),
        Command::Upgrade(args) => upgrade_cmd::run(&cli.target, args),
        Command::ApplyConfig(args) => config_cmd::apply_config(&cli.target, args),
        Command::Config(cmd) => config_cmd::run(&cli.target, cmd),
        Command::Logs { follow, service } => {
            node_cmd::logs(&cli.target, follow, false, service.as_deref())
        }
        Command::Services { output } => services_cmd::list(&cli.target, output),
        Command::Service(cmd) => services_cmd::run(&cli.target, cmd),
        Command::Dmesg { follow } => node_cmd::logs(&cli.target, follow, true, None),
        Command::Fleetlock(cmd) => fleetlock_cmd::run(cmd),
        #[cfg(feature = "etcd")]
        Command::Operator(cmd) => fleet_cmd::run_operator(cmd),
        #[cfg(feature = "etcd")]
        Command::Fleet(cmd) => fleet_cmd::run_fleet(&cli.target, cmd),
        Command::Completions { shell } => {
            let mut out = std::io::stdout().lock();
            clap_complete::generate(shell, &mut Cli::command(), "slate", &mut out);
            out.flush()?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn init_accepts_whatever_the_kernel_passes() {
        // A parse error would make PID 1 exit and panic the kernel.
        let cli = Cli::try_parse_from(["slate", "init", "single", "-b", "--help", "x=1"]).unwrap();
        match cli.command {
            Command::Init { args } => assert_eq!(args, ["single", "-b", "--help", "x=1"]),
            other => panic!("parsed as {other:?}"),
        }
        let cli = Cli::try_parse_from(["slate", "init"]).unwrap();
        assert!(matches!(cli.command, Command::Init { args } if args.is_empty()));
    }
}
