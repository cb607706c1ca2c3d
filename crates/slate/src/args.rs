//! Argument types more than one command takes. The `*_cmd` modules import these, never `cli.rs`,
//! so the command modules and the top-level parser cannot depend on each other in a cycle.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::{Args, ValueEnum};
use slate_api::{Client, RebootMode, Role};
use slate_transport::{Credentials, Options};

/// How a status-like command prints its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    #[default]
    Text,
    Json,
}

/// How to reach a node and as whom.
#[derive(Debug, Args)]
pub struct NodeTarget {
    /// The node's API address (HOST or HOST:PORT; port 50000 by default).
    #[arg(long, global = true, env = "SLATE_NODE")]
    pub node: Option<String>,
    /// The name the node's certificate must carry, when --node is not one of its names (a
    /// port forward, an address DHCP gave it): usually the node's name. A node's certificate
    /// names only that node, so this is how the client knows which node it wants.
    #[arg(long, global = true, env = "SLATE_SERVER_NAME", value_name = "NAME")]
    pub server_name: Option<String>,
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

impl NodeTarget {
    /// The API client for the node and role given.
    pub fn client(&self) -> Result<Client> {
        let node = self
            .node
            .as_deref()
            .context("no node given: pass --node HOST[:PORT] or set SLATE_NODE")?;
        let dir: &Path = &self.certs;
        let client = if self.no_certificate {
            let ca = read_bytes(
                &dir.join(slate_api::CA_CERT),
                MAX_SMALL_FILE_BYTES,
                "the CA certificate",
            )?;
            Client::without_certificate(node, &ca)
        } else {
            Client::from_dir(node, dir, self.role.into())
        };
        let client = match &self.server_name {
            Some(name) => client.and_then(|c| c.with_server_name(name)),
            None => client,
        };
        client.with_context(|| format!("setting up the client for {node}"))
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleArg {
    Admin,
    Operator,
    Reader,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Self {
        match role {
            RoleArg::Admin => Role::Admin,
            RoleArg::Operator => Role::Operator,
            RoleArg::Reader => Role::Reader,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum RebootModeArg {
    /// The node's configured way (`[reboot] mode`; the firmware unless that says kexec).
    #[default]
    Default,
    /// Through the firmware, whatever the node's configuration says.
    Powercycle,
    /// kexec into the entry the boot loader would start next, skipping the firmware (the node
    /// falls back to the firmware, and logs why, when it cannot).
    Kexec,
}

impl From<RebootModeArg> for RebootMode {
    fn from(mode: RebootModeArg) -> Self {
        match mode {
            RebootModeArg::Default => RebootMode::Default,
            RebootModeArg::Powercycle => RebootMode::Powercycle,
            RebootModeArg::Kexec => RebootMode::Kexec,
        }
    }
}

/// How to talk to an OCI registry.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Plain HTTP to a registry that is not on this machine (127.0.0.1 and localhost always get
    /// plain HTTP).
    #[arg(long)]
    pub insecure: bool,
    /// Registry user; the password is read from SLATE_REGISTRY_PASSWORD.
    #[arg(long, env = "SLATE_REGISTRY_USERNAME")]
    pub username: Option<String>,
}

impl RegistryArgs {
    /// The transport's options; the password comes from the environment so that it never shows
    /// in a process listing.
    pub fn options(&self) -> Result<Options> {
        let credentials = match &self.username {
            Some(username) => Some(Credentials {
                username: username.clone(),
                password: std::env::var("SLATE_REGISTRY_PASSWORD")
                    .context("--username needs the password in SLATE_REGISTRY_PASSWORD")?,
            }),
            None => None,
        };
        Ok(Options {
            insecure: self.insecure,
            credentials,
            chunk_size: None,
        })
    }
}

/// The most bytes of a small file a user names (a certificate, a policy, a META value from a
/// file): far above any real one, and a bound on what a FIFO or a device could make slate read.
pub const MAX_SMALL_FILE_BYTES: u64 = 1 << 20;

/// A text file the user named, read as [`slate_files::read_string_bounded`] does: a regular
/// file of at most `max` bytes, anything else refused at once with its path and what it is
/// (issue 44). `what` names it: "the machine configuration".
pub fn read_text(path: &Path, max: u64, what: &str) -> Result<String> {
    Ok(slate_files::read_string_bounded(path, max, what)?)
}

/// [`read_text`] for bytes.
pub fn read_bytes(path: &Path, max: u64, what: &str) -> Result<Vec<u8>> {
    Ok(slate_files::read_file_bounded(path, max, what)?)
}

/// A machine configuration file, at most `slate_machine_config::MAX_DOCUMENT_BYTES`: the bound
/// holds while reading, not after (`config validate /dev/zero` once grew to gigabytes).
pub fn read_config_text(path: &Path) -> Result<String> {
    read_text(
        path,
        slate_machine_config::MAX_DOCUMENT_BYTES as u64,
        "the machine configuration",
    )
}

/// `--disk`: a disk image or a block device, checked before anything else is read (a FIFO
/// would block the GPT reader for ever, `/dev/zero` or a directory be taken for a disk). The
/// library opens it again the same way (`FileDisk`); this only makes the refusal come first.
pub fn check_disk(path: &Path) -> Result<()> {
    slate_files::open_disk(path, false)?;
    Ok(())
}

/// `--tries`: a number within [`slate_bootspec::INSTALL_TRIES`], refused while the arguments
/// are parsed, before anything is opened. 0 would mark the version bad before it boots, and a
/// counter above `INT_MAX` is read as uncounted, so that version would never be rolled back.
pub fn parse_tries(text: &str) -> Result<u32, String> {
    let tries: u32 = text
        .parse()
        .map_err(|e| format!("{text:?} is not a number of boot-counting tries: {e}"))?;
    slate_bootspec::check_install_tries(tries).map_err(|e| e.to_string())
}

/// A diff on stdout: its text, or its JSON (pretty, one value). `slate upgrade --check` prints
/// with this too.
pub fn print_diff(diff: &slate_bundle_diff::BundleDiff, output: OutputFormat) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut out, diff)?;
            writeln!(out)?;
        }
        OutputFormat::Text => out.write_all(slate_bundle_diff::render_text(diff).as_bytes())?,
    }
    out.flush()?;
    Ok(())
}

/// `value` as pretty JSON on stdout, a newline after it (`--output json`).
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}
