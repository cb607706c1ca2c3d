//! Talking to a node's API: `slate --node ADDR status|version|reboot|reset|upgrade|logs|dmesg`,
//! and `slate gen certs` to make the identities both sides use.

use std::io::Write as _;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::{Args, Subcommand, ValueEnum};
use slate_api::{Client, RebootMode, Role};

use crate::cli::OutputFormat;

/// How to reach a node and as whom.
#[derive(Debug, Args)]
pub struct NodeTarget {
    /// The node's API address (HOST or HOST:PORT; port 50000 by default).
    #[arg(long, global = true, env = "SLATE_NODE")]
    pub node: Option<String>,
    /// Directory holding ca.crt and the client certificates (`slate gen certs`).
    #[arg(long, global = true, env = "SLATE_CERTS", default_value = "pki")]
    pub certs: PathBuf,
    /// Which client certificate to use.
    #[arg(long, global = true, value_enum, default_value_t = RoleArg::Admin)]
    pub role: RoleArg,
    /// Connect without a client certificate (the node refuses; useful to check it does).
    #[arg(long, global = true, hide = true)]
    pub no_certificate: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Admin,
    Operator,
    Reader,
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum RebootModeArg {
    #[default]
    Default,
    Powercycle,
}

impl From<RebootModeArg> for RebootMode {
    fn from(mode: RebootModeArg) -> Self {
        match mode {
            RebootModeArg::Default => RebootMode::Default,
            RebootModeArg::Powercycle => RebootMode::Powercycle,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum GenCommand {
    /// Make a CA, the node's certificate and admin/operator/reader client certificates.
    Certs {
        #[arg(long)]
        out: PathBuf,
        /// Extra names (DNS or IP) the node certificate is valid for.
        #[arg(long = "san")]
        sans: Vec<String>,
        #[arg(long)]
        dry_run: bool,
    },
}

pub fn gen(cmd: GenCommand) -> Result<()> {
    let GenCommand::Certs { out, sans, dry_run } = cmd;
    if dry_run {
        println!(
            "would write ca, node ({}) and admin/operator/reader certificates to {}",
            sans.join(", "),
            out.display()
        );
        return Ok(());
    }
    let generated = slate_api::gen_certs(&out, &sans)
        .with_context(|| format!("generating certificates in {}", out.display()))?;
    for file in generated.files {
        println!("{}", file.display());
    }
    Ok(())
}

pub fn client(target: &NodeTarget) -> Result<Client> {
    let node = target
        .node
        .as_deref()
        .context("no node given: pass --node HOST[:PORT] or set SLATE_NODE")?;
    let role = match target.role {
        RoleArg::Admin => Role::Admin,
        RoleArg::Operator => Role::Operator,
        RoleArg::Reader => Role::Reader,
    };
    let dir: &Path = &target.certs;
    let client = if target.no_certificate {
        let ca = std::fs::read(dir.join(slate_api::CA_CERT))
            .with_context(|| format!("reading {}", dir.join(slate_api::CA_CERT).display()))?;
        Client::without_certificate(node, &ca)
    } else {
        Client::from_dir(node, dir, role)
    };
    client.with_context(|| format!("setting up the client for {node}"))
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

fn print_line(line: &str) -> ControlFlow<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|_| out.flush()) {
        Ok(()) => ControlFlow::Continue(()),
        Err(_) => ControlFlow::Break(()),
    }
}

pub fn status(target: &NodeTarget, output: OutputFormat) -> Result<()> {
    let status = client(target)?
        .status()
        .context("asking the node for its status")?;
    match output {
        OutputFormat::Json => print_json(&status),
        OutputFormat::Text => {
            println!("version:  {}", status.version);
            println!(
                "booted:   {}",
                status.booted_entry.as_deref().unwrap_or("unknown")
            );
            println!("stage:    {:?}", status.stage);
            println!("mode:     {:?}", status.mode);
            if let Some(seq) = &status.running_sequence {
                println!("running:  {seq}");
            }
            if let Some(failure) = &status.last_failure {
                println!("failed:   {} ({})", failure.version, failure.reason);
            }
            Ok(())
        }
    }
}

pub fn version(target: &NodeTarget, output: OutputFormat) -> Result<()> {
    let version = client(target)?
        .version()
        .context("asking the node for its version")?;
    match output {
        OutputFormat::Json => print_json(&version),
        OutputFormat::Text => {
            println!(
                "{} ({}) kernel {} entry {}",
                version.version,
                version.arch,
                version.kernel.as_deref().unwrap_or("?"),
                version.booted_entry.as_deref().unwrap_or("?")
            );
            Ok(())
        }
    }
}

pub fn reboot(target: &NodeTarget, mode: RebootModeArg, dry_run: bool) -> Result<()> {
    let client = client(target)?;
    if dry_run {
        println!("would reboot {} ({mode:?})", client.addr());
        return Ok(());
    }
    client.reboot(mode.into()).context("rebooting the node")?;
    println!("reboot accepted by {}", client.addr());
    Ok(())
}

pub fn reset(target: &NodeTarget, dry_run: bool) -> Result<()> {
    let client = client(target)?;
    if dry_run {
        println!(
            "would reset {}: wipe STATE and EPHEMERAL, reboot",
            client.addr()
        );
        return Ok(());
    }
    client.reset().context("resetting the node")?;
    println!("reset accepted by {}", client.addr());
    Ok(())
}

pub fn logs(target: &NodeTarget, follow: bool, kernel: bool) -> Result<()> {
    let client = client(target)?;
    if kernel {
        client
            .dmesg(follow, print_line)
            .context("reading the kernel log")
    } else {
        client
            .logs(follow, print_line)
            .context("reading machined's log")
    }
}
