//! The machine configuration from the command line: `slate gen config` writes one,
//! `slate apply-config` sends one to a node (also to a node in maintenance mode), `slate config
//! show` prints the one in effect.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Subcommand, ValueEnum};
use slate_api::{ApplyConfigRequest, ApplyMode, Client};
use slate_machine_config::{
    Api, Etc, MachineConfig, Network, NetworkMode, Node, Reboot, RebootMethod, Strategy,
    UpdateSettings, Window, CURRENT_VERSION,
};

use crate::args::{read_config_text, read_text, NodeTarget, OutputFormat, MAX_SMALL_FILE_BYTES};

/// `slate gen config`.
#[derive(Debug, Args)]
pub struct GenConfigArgs {
    /// The node's name (one DNS label).
    #[arg(long)]
    pub name: String,
    /// The directory `slate gen certs` wrote: its fleet CA issues the node's own issuing CA,
    /// constrained to the node's names; the node accepts clients of its client CA. Neither
    /// CA's key goes into the configuration.
    #[arg(long)]
    pub pki: PathBuf,
    /// Another name (DNS or IP address) clients reach the node by, repeatable: in its
    /// serving certificate and its issuing CA's name constraints (`api.extra_sans`).
    #[arg(long = "san", value_name = "NAME")]
    pub sans: Vec<String>,
    /// Another client CA the node accepts (PEM file), repeatable: the old CA while a fleet
    /// migrates from a shared CA (docs/trust.md).
    #[arg(long = "also-accept-client-ca", value_name = "FILE")]
    pub also_accept_client_cas: Vec<PathBuf>,
    /// The kernel hostname (the name by default).
    #[arg(long)]
    pub hostname: Option<String>,
    /// A static address/prefix instead of DHCP (with --gateway).
    #[arg(long, requires = "gateway")]
    pub address: Option<String>,
    #[arg(long)]
    pub gateway: Option<std::net::IpAddr>,
    #[arg(long)]
    pub dns: Vec<std::net::IpAddr>,
    /// The release channel the node follows.
    #[arg(long, default_value = "stable")]
    pub channel: String,
    #[arg(long, value_enum, default_value_t = StrategyArg::Immediate)]
    pub strategy: StrategyArg,
    /// The release repository (REG/REPO) the node follows; turns the update agent on
    /// (`update.enabled`).
    #[arg(long)]
    pub image: Option<String>,
    /// Plain HTTP to that registry.
    #[arg(long, requires = "image")]
    pub insecure_registry: bool,
    /// How often the agent reads the release index (`15m`, `1h`; at least 10s).
    #[arg(long, default_value = "1h")]
    pub poll_interval: String,
    /// A maintenance window, repeatable: `DAYS START LENGTH`, e.g. `sat,sun 02:00 4h` or
    /// `* 00:00 7d` (periodic and fleet-lock strategies).
    #[arg(long = "window", value_name = "DAYS START LENGTH")]
    pub windows: Vec<String>,
    /// The FleetLock server (`http://host:port`, fleet-lock strategy).
    #[arg(long)]
    pub lock_server: Option<String>,
    /// The FleetLock group (default `default`).
    #[arg(long)]
    pub lock_group: Option<String>,
    /// A rollout operator replica, HOST:PORT, repeatable (operator strategy; turns the update
    /// agent on).
    #[arg(long = "operator", value_name = "HOST:PORT")]
    pub operators: Vec<String>,
    /// The node group the operator rolls out by (default `default`).
    #[arg(long)]
    pub group: Option<String>,
    /// A label the operator's policies select on, KEY=VALUE, repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Where the operator reaches this node's API, HOST:PORT (the node name and port 50000
    /// by default).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Paths under /etc kept when /etc is reset for a new version.
    #[arg(long = "keep-etc")]
    pub keep_etc: Vec<String>,
    /// How the node restarts by default (`[reboot] mode`; the image's setting, else the
    /// firmware, when absent).
    #[arg(long, value_enum)]
    pub reboot: Option<RebootArg>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RebootArg {
    Firmware,
    Kexec,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StrategyArg {
    Immediate,
    Periodic,
    FleetLock,
    Operator,
}

impl From<StrategyArg> for Strategy {
    fn from(s: StrategyArg) -> Self {
        match s {
            StrategyArg::Immediate => Strategy::Immediate,
            StrategyArg::Periodic => Strategy::Periodic,
            StrategyArg::FleetLock => Strategy::FleetLock,
            StrategyArg::Operator => Strategy::Operator,
        }
    }
}

/// `DAYS START LENGTH` (`sat,sun 02:00 4h`) as a window; the configuration's check judges
/// the fields.
fn parse_window(text: &str) -> Result<Window> {
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [days, start, length] = parts.as_slice() else {
        bail!("--window {text:?}: expected DAYS START LENGTH, e.g. \"sat,sun 02:00 4h\"");
    };
    Ok(Window {
        days: days.split(',').map(str::to_owned).collect(),
        start: (*start).to_owned(),
        length: (*length).to_owned(),
    })
}

/// Print a machine configuration for one node; it is checked as a node would check it.
pub fn gen_config(args: GenConfigArgs) -> Result<()> {
    // The names the node's issuing CA may certify: its name, hostname, static address and
    // extra names. An address DHCP gives it later is not among them (docs/trust.md).
    let mut names = vec![args.name.clone()];
    names.extend(args.hostname.iter().cloned());
    if let Some(address) = &args.address {
        let (ip, _) = slate_machine_config::parse_cidr(address)
            .with_context(|| format!("--address {address:?} is not address/prefix"))?;
        names.push(ip.to_string());
    }
    names.extend(args.sans.iter().cloned());
    names.dedup();
    let extra_client_cas = args
        .also_accept_client_cas
        .iter()
        .map(|path| read_text(path, MAX_SMALL_FILE_BYTES, "the client CA certificate"))
        .collect::<Result<Vec<_>>>()?;
    let trust = slate_api::NodeTrust::issue(&args.pki, &args.name, &names, &extra_client_cas)
        .with_context(|| {
            format!(
                "issuing node {}'s CA from {}",
                args.name,
                args.pki.display()
            )
        })?;
    let config = MachineConfig {
        version: CURRENT_VERSION,
        node: Node {
            name: args.name,
            hostname: args.hostname,
        },
        network: match args.address {
            Some(address) => Network {
                mode: NetworkMode::Static,
                interface: None,
                address: Some(address),
                gateway: args.gateway,
                dns: args.dns,
            },
            None => Network::default(),
        },
        api: Api {
            listen: None,
            ca_cert: trust.ca_cert,
            ca_key: trust.ca_key,
            client_ca: trust.client_ca,
            fleet_ca: Some(trust.fleet_ca),
            extra_sans: args.sans,
        },
        update: UpdateSettings {
            enabled: args.image.is_some() || !args.operators.is_empty(),
            image: args.image,
            insecure: args.insecure_registry,
            channel: args.channel,
            strategy: args.strategy.into(),
            poll_interval: args.poll_interval,
            windows: args
                .windows
                .iter()
                .map(|w| parse_window(w))
                .collect::<Result<_>>()?,
            lock_server: args.lock_server,
            lock_group: args.lock_group,
            operator: args.operators,
            group: args.group,
            labels: args
                .labels
                .iter()
                .map(|l| {
                    l.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                        .with_context(|| format!("--label {l:?}: expected KEY=VALUE"))
                })
                .collect::<Result<_>>()?,
            advertise: args.advertise,
            ..UpdateSettings::default()
        },
        etc: Etc {
            keep: args.keep_etc,
            files: Vec::new(),
        },
        reboot: Reboot {
            mode: args.reboot.map(|r| match r {
                RebootArg::Firmware => RebootMethod::Firmware,
                RebootArg::Kexec => RebootMethod::Kexec,
            }),
        },
        services: Vec::new(),
        drain: None,
        var: None,
    };
    slate_machine_config::validate(&config)
        .and_then(|()| slate_machine_config::check_trust(&config))
        .context("the configuration would be refused")?;
    print!("{}", config.to_toml());
    Ok(())
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum ApplyModeArg {
    /// Live when possible, else write and reboot.
    #[default]
    Auto,
    /// Live only; refused when a change needs a reboot.
    NoReboot,
    Reboot,
    /// For the next boot.
    Staged,
}

impl From<ApplyModeArg> for ApplyMode {
    fn from(m: ApplyModeArg) -> Self {
        match m {
            ApplyModeArg::Auto => ApplyMode::Auto,
            ApplyModeArg::NoReboot => ApplyMode::NoReboot,
            ApplyModeArg::Reboot => ApplyMode::Reboot,
            ApplyModeArg::Staged => ApplyMode::Staged,
        }
    }
}

/// `slate apply-config`.
#[derive(Debug, Args)]
pub struct ApplyConfigArgs {
    pub file: PathBuf,
    #[arg(long, value_enum, default_value_t)]
    pub mode: ApplyModeArg,
    /// Check it and say what would change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// A node in maintenance mode: no certificates; the token it printed on its console.
    #[arg(long, requires = "token")]
    pub insecure: bool,
    #[arg(long)]
    pub token: Option<String>,
    /// With --insecure: accept only the maintenance certificate with this SHA-256 (printed on
    /// the node's console).
    #[arg(long, requires = "insecure")]
    pub fingerprint: Option<String>,
}

pub fn apply_config(target: &NodeTarget, args: ApplyConfigArgs) -> Result<()> {
    let text = read_document(&args.file)?;
    let client = match (&args.token, args.insecure) {
        (Some(token), true) => {
            let node = target
                .node
                .as_deref()
                .context("no node given: pass --node HOST[:PORT] or set SLATE_NODE")?;
            let pin = match &args.fingerprint {
                Some(hex_text) => {
                    let mut pin = [0u8; 32];
                    hex::decode_to_slice(hex_text.trim(), &mut pin)
                        .context("--fingerprint is not 64 hex digits")?;
                    Some(pin)
                }
                None => None,
            };
            Client::maintenance(node, token, pin)?
        }
        (Some(_), false) => bail!("--token goes with --insecure (a node in maintenance mode)"),
        (None, _) => target.client()?,
    };
    let result = client
        .apply_config(&ApplyConfigRequest {
            config: text,
            mode: args.mode.into(),
            dry_run: args.dry_run,
        })
        .with_context(|| format!("applying {} to {}", args.file.display(), client.addr()))?;
    let changed = if result.changed.is_empty() {
        "nothing".to_owned()
    } else {
        result.changed.join(", ")
    };
    println!(
        "{}: {changed} changed; {}{}",
        result.outcome,
        if result.reboot_required {
            "a reboot is needed"
        } else {
            "no reboot needed"
        },
        if args.dry_run {
            " (dry run: nothing written)"
        } else {
            ""
        }
    );
    Ok(())
}

/// The document, refused here with the node's own rules before anything is sent.
fn read_document(path: &Path) -> Result<String> {
    let text = read_config_text(path)?;
    let parsed = slate_machine_config::parse_for_writing(&text)
        .with_context(|| format!("{} is not a valid machine configuration", path.display()))?;
    if let Some(version) = parsed.migrated_from {
        eprintln!(
            "note: {} is version {version}; the node migrates it to version {}",
            path.display(),
            parsed.config.version
        );
    }
    Ok(text)
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// The machine configuration in effect on the node, secrets redacted.
    Show {
        #[arg(long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Check a machine configuration file as a node would, offline.
    Validate { file: PathBuf },
}

pub fn run(target: &NodeTarget, cmd: ConfigCommand) -> Result<()> {
    match cmd {
        ConfigCommand::Show { output } => {
            let view = target
                .client()?
                .show_config()
                .context("asking the node for its machine configuration")?;
            match output {
                OutputFormat::Json => {
                    println!("{}", serde_json::to_string_pretty(&view)?);
                }
                OutputFormat::Text => {
                    let config: MachineConfig = serde_json::from_value(view.config)
                        .context("the node answered a configuration this slate cannot read")?;
                    if let Some(v) = view.migrated_from {
                        println!("# stored as version {v}, migrated in memory");
                    }
                    if view.pending_reboot {
                        println!("# a newer configuration is written and waits for a reboot");
                    }
                    print!("{}", config.to_toml());
                }
            }
            Ok(())
        }
        ConfigCommand::Validate { file } => {
            read_document(&file)?;
            println!("{}: valid", file.display());
            Ok(())
        }
    }
}
