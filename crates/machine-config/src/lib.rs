//! The machine configuration: one TOML document per node (`version = 1`) that gives the node
//! its name, hostname, network, the CAs of its API identity, its update settings and the /etc
//! files it keeps across versions. Images carry no per-node data; this document does.
//!
//! [`parse`] reads any supported version (older ones are migrated forward in memory, see
//! [`v0`]), refuses unknown keys with their dotted path, and validates every field before a
//! caller may write the document anywhere. No IO happens here.
//!
//! Architecture invariant: a [`MachineConfig`] value that exists has passed [`validate`]; the
//! edges (installer, machined, CLI) never write a document this crate refused.

pub mod trust;
mod update;
pub mod v0;
mod validate;

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

pub use trust::{check_trust, trust_findings};
pub use update::{
    describe_minute_of_week, duration, minute_of_week, minutes_until_open, Strategy,
    UpdateSettings, Weekday, Window,
};
pub use validate::{is_hostname, parse_cidr};

/// The version this slate writes; [`parse`] also reads every older one.
pub const CURRENT_VERSION: u32 = 1;
/// Where machined keeps the document, on STATE (relative to its mount point).
pub const STATE_PATH: &str = "config/machine.toml";
/// The document it replaced, kept by `apply-config`.
pub const PREVIOUS_STATE_PATH: &str = "config/machine.toml.previous";
/// What a secret shows as in [`MachineConfig::redacted`].
pub const REDACTED: &str = "<redacted>";
/// A document larger than this is refused before it is parsed.
pub const MAX_DOCUMENT_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfig {
    pub version: u32,
    pub node: Node,
    #[serde(default)]
    pub network: Network,
    pub api: Api,
    #[serde(default)]
    pub update: UpdateSettings,
    #[serde(default)]
    pub etc: Etc,
    #[serde(default, skip_serializing_if = "Reboot::is_unset")]
    pub reboot: Reboot,
    /// `[[services]]`: this node's own services, beside the image's (one of the same name
    /// replaces the image's). Dependencies may name the image's services: the whole set is
    /// checked on the node, against its image, before a document is written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<slate_services::ServiceSpec>,
    /// `[drain]`: what the node runs before it stops its services on every way down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
    /// `[var]`: how /var lives on this node (the image's mode when absent) and where a `tpm2`
    /// volume's recovery key goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub var: Option<Var>,
}

/// `[var]` (docs/node.md, "/var modes"). Each field left out keeps what the image says, so a
/// document that only names where the recovery key goes never turns an image's `tpm2` /var
/// into a `persistent` one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Var {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<slate_profile::VarMode>,
    /// Where a `tpm2` volume's recovery key goes when the volume is set up (the console when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_key: Option<RecoveryKey>,
}

/// Where a `tpm2` /var's recovery key goes, once, when the volume is set up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryKey {
    /// Printed to the console and the journal.
    #[default]
    Console,
    /// Written to [`RECOVERY_KEY_STATE_PATH`] on STATE, readable by root alone, and not
    /// printed. STATE is not encrypted: the file is there to be collected, then deleted.
    State,
    /// No recovery key slot is made: only this machine's TPM, under the same Secure Boot
    /// state, ever opens the volume.
    None,
}

/// Where `recovery_key = "state"` writes the key, relative to STATE's mount point.
pub const RECOVERY_KEY_STATE_PATH: &str = "recovery/var.key";

impl MachineConfig {
    /// The `[var] mode` this document sets, if any.
    pub fn var_mode(&self) -> Option<slate_profile::VarMode> {
        self.var.as_ref().and_then(|v| v.mode)
    }

    /// Where a `tpm2` /var's recovery key goes (the console unless this document says).
    pub fn recovery_key(&self) -> RecoveryKey {
        self.var
            .as_ref()
            .and_then(|v| v.recovery_key)
            .unwrap_or_default()
    }
}

/// `[drain]`: a command run first in every drain — before an upgrade is installed, a reboot,
/// a rollback, a reset and a shutdown — e.g. what cordons the node and evicts its work from
/// its cluster. A live upgrade is refused when it fails (nothing written, the services keep
/// running); the other ways down log the failure and go on (docs/node.md, "Draining").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    /// argv: an absolute program path and its arguments (no shell, no PATH search).
    pub command: Vec<String>,
    /// How long it may run before its process group is killed and it counts as failed
    /// (1 to 3600; default 60).
    #[serde(default = "default_drain_timeout")]
    pub timeout_secs: u32,
}

/// The longest a drain command may be given.
pub const MAX_DRAIN_TIMEOUT_SECS: u32 = 3600;

fn default_drain_timeout() -> u32 {
    60
}

/// `[reboot]`: how the node restarts when a reboot asks for its default way (an upgrade's
/// reboot, `slate reboot` without `--mode`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reboot {
    /// Absent: what the image says (its `/etc/slate/node.toml`), else the firmware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<RebootMethod>,
}

impl Reboot {
    fn is_unset(&self) -> bool {
        self.mode.is_none()
    }
}

/// The two ways a node restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RebootMethod {
    /// Through the firmware and the boot loader (a full restart).
    Firmware,
    /// kexec into the entry the boot loader would start next, skipping the firmware.
    Kexec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    /// The node's name: unique in its fleet, one DNS label; in its certificate's SANs.
    pub name: String,
    /// The kernel hostname; the name when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    #[default]
    Dhcp,
    Static,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub mode: NetworkMode,
    /// The interface to configure; the first non-loopback one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// `address/prefix` (static only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The default route (static only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Name servers for /etc/resolv.conf (static only; DHCP brings its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<IpAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Api {
    /// Where the node API listens (default `0.0.0.0:50000`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// PEM: the node's own issuing CA, which issues its serving certificate and the client
    /// certificate it reports to the rollout operator with. `slate gen config` makes one per
    /// node, under the fleet CA, constrained to the node's names (docs/trust.md).
    pub ca_cert: String,
    /// PEM (PKCS#8, ECDSA P-256): its key. A secret: redacted by `config show`.
    pub ca_key: String,
    /// PEM: the CA(s) whose client certificates the API accepts. Never the issuer of
    /// `ca_cert` ([`check_trust`]).
    pub client_ca: String,
    /// PEM: the fleet CA, above `ca_cert`: the node verifies the rollout operator against it.
    /// Absent (configurations of the older shared-CA shape): `ca_cert` is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_ca: Option<String>,
    /// More names (DNS or IP) for the serving certificate, beside the node's name, hostname
    /// and addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_sans: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Etc {
    /// Paths under /etc (relative) kept when /etc is reset for a new version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep: Vec<String>,
    /// Files written into /etc at every boot (and so present in every version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<EtcFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcFile {
    /// Relative to /etc.
    pub path: String,
    pub content: String,
    /// Permission bits (default 0644).
    #[serde(default = "default_file_mode")]
    pub mode: u32,
}

fn default_file_mode() -> u32 {
    0o644
}

/// Why a document was refused. `field` is the dotted key path (`network.address`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("the machine configuration is not valid TOML: {0}")]
    Syntax(String),
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("the machine configuration is {len} bytes; at most {MAX_DOCUMENT_BYTES} are accepted")]
    TooLarge { len: usize },
}

impl ConfigError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The dotted path of the offending key, when one is known.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// A parsed, validated document and the version it was written in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub config: MachineConfig,
    /// `Some(v)` when the text was version `v` < [`CURRENT_VERSION`] and was migrated.
    pub migrated_from: Option<u32>,
}

/// Parse, migrate and validate a document.
pub fn parse(text: &str) -> Result<Parsed, ConfigError> {
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(ConfigError::TooLarge { len: text.len() });
    }
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigError::Syntax(e.message().to_owned()))?;
    let version = match table.get("version") {
        None => {
            return Err(ConfigError::invalid(
                "version",
                "missing (this slate writes 1)",
            ))
        }
        Some(toml::Value::Integer(v)) => *v,
        Some(other) => {
            return Err(ConfigError::invalid(
                "version",
                format!("must be an integer, not {}", other.type_str()),
            ))
        }
    };
    let (config, migrated_from) = match version {
        0 => (v0::migrate(deserialize::<v0::ConfigV0>(table)?), Some(0)),
        1 => (deserialize::<MachineConfig>(table)?, None),
        other => {
            return Err(ConfigError::invalid(
                "version",
                format!(
                "{other} is not a version this slate reads (0 and 1; it writes {CURRENT_VERSION})"
            ),
            ))
        }
    };
    validate::validate(&config)?;
    Ok(Parsed {
        config,
        migrated_from,
    })
}

fn deserialize<T: serde::de::DeserializeOwned>(table: toml::Table) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = inner.message().to_owned();
        // The path ends with an unknown key already; only at the top it is ".".
        let field = match unknown_key(&message) {
            Some(key) if path == "." => key.to_owned(),
            _ => path,
        };
        ConfigError::invalid(field, message)
    })
}

/// The key in serde's "unknown field `x`, expected …".
fn unknown_key(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `")?;
    rest.split('`').next()
}

/// [`parse`] a document about to be written to a node (`slate config validate`, the
/// installer, `apply-config`): also refused when its key could sign for other nodes or for
/// clients ([`check_trust`]). A node already running such a document still boots with
/// [`parse`] and reports [`trust_findings`].
pub fn parse_for_writing(text: &str) -> Result<Parsed, ConfigError> {
    let parsed = parse(text)?;
    check_trust(&parsed.config)?;
    Ok(parsed)
}

/// Check a value built in code (e.g. by `slate gen config`) as [`parse`] checks a document.
pub fn validate(config: &MachineConfig) -> Result<(), ConfigError> {
    validate::validate(config)
}

impl MachineConfig {
    /// The CA(s) the node verifies fleet services (the rollout operator) against.
    pub fn fleet_ca(&self) -> &str {
        self.api.fleet_ca.as_deref().unwrap_or(&self.api.ca_cert)
    }

    /// The kernel hostname the node takes.
    pub fn hostname(&self) -> &str {
        self.node.hostname.as_deref().unwrap_or(&self.node.name)
    }

    /// The document as TOML (`version = 1`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a machine configuration always serializes")
    }

    /// The same document with every secret replaced by [`REDACTED`].
    pub fn redacted(&self) -> MachineConfig {
        let mut copy = self.clone();
        copy.api.ca_key = REDACTED.to_owned();
        copy
    }

    /// Every /etc path kept across versions: the `keep` list and the configured files.
    pub fn etc_keep(&self) -> Vec<String> {
        let mut paths: Vec<String> = self.etc.keep.clone();
        paths.extend(self.etc.files.iter().map(|f| f.path.clone()));
        paths.sort();
        paths.dedup();
        paths
    }
}

/// What a change from `old` to `new` asks of a running node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigChange {
    /// The top-level sections that differ, in document order.
    pub changed: Vec<String>,
    /// Whether the running node must reboot for all of it to take effect (network, API
    /// identity and listener, node name); the hostname, update settings, /etc files, services
    /// and the drain command apply live.
    pub reboot_required: bool,
}

/// Compare two documents section by section.
pub fn change(old: &MachineConfig, new: &MachineConfig) -> ConfigChange {
    let mut changed = Vec::new();
    let mut reboot_required = false;
    let mut note = |name: &str, differs: bool, needs_reboot: bool| {
        if differs {
            changed.push(name.to_owned());
            reboot_required |= needs_reboot;
        }
    };
    note("node.name", old.node.name != new.node.name, true);
    note("node.hostname", old.hostname() != new.hostname(), false);
    note("network", old.network != new.network, true);
    note("api", old.api != new.api, true);
    note("update", old.update != new.update, false);
    note("etc", old.etc != new.etc, false);
    // Read when the node goes down, so it applies to the next reboot without one.
    note("reboot", old.reboot != new.reboot, false);
    // machined stops what was removed or changed and starts what is new (docs/node.md).
    note("services", old.services != new.services, false);
    // Read when the node drains, so it applies to the next drain without a reboot.
    note("drain", old.drain != new.drain, false);
    // /var is mounted once per boot.
    note("var", old.var != new.var, true);
    ConfigChange {
        changed,
        reboot_required,
    }
}

#[cfg(test)]
mod tests;
