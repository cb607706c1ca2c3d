//! The node's runtime configuration: what machined checks before it commits a boot (`[health]`),
//! the hardware watchdog it arms (`[watchdog]`) and how it restarts by default (`[reboot]`).
//!
//! A profile carries these sections; the imager writes them into the root filesystem as
//! [`NODE_CONFIG_PATH`] (TOML, the same sections), so every OS image brings its own checks, and
//! machined reads that file at startup. An image without the file has no checks and no watchdog.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ProfileError;

pub use crate::image_contract::NODE_CONFIG_PATH;

/// Bounds of `health.timeout_secs`.
pub const HEALTH_TIMEOUT_RANGE: std::ops::RangeInclusive<u32> = 1..=3600;
/// Bounds of an enabled `watchdog.timeout_secs`: below the lower bound no boot reaches its
/// commit before the reset; most watchdog hardware cannot count beyond the upper one.
pub const WATCHDOG_TIMEOUT_RANGE: std::ops::RangeInclusive<u32> = 5..=3600;

fn default_health_timeout() -> u32 {
    60
}

fn default_watchdog_device() -> PathBuf {
    PathBuf::from("/dev/watchdog")
}

/// `[health]`: checks that must all pass, each retried until it does or `timeout_secs` (for all
/// of them together) expires, before a boot is committed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    #[serde(default = "default_health_timeout")]
    pub timeout_secs: u32,
    #[serde(default)]
    pub checks: Vec<HealthCheck>,
}

/// One health check (`[[health.checks]]` with exactly one of `file`, `command`, `tcp` or `service`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "RawCheck", into = "RawCheck")]
pub enum HealthCheck {
    /// The path exists.
    File(PathBuf),
    /// The program exits 0 (argv; the first word is the program).
    Command(Vec<String>),
    /// A TCP connection to the address is accepted (a service is up).
    Tcp(SocketAddr),
    /// The node's service of that name is ready (`[[services]]`, its `ready` check).
    Service(String),
}

/// The TOML shape of a check: a table with one key.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawCheck {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tcp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    service: Option<String>,
}

impl TryFrom<RawCheck> for HealthCheck {
    type Error = String;

    fn try_from(raw: RawCheck) -> Result<Self, String> {
        match (raw.file, raw.command, raw.tcp, raw.service) {
            (None, None, None, Some(service)) => {
                if service.is_empty() {
                    return Err("health check `service`: names no service".into());
                }
                Ok(HealthCheck::Service(service))
            }
            (Some(file), None, None, None) => {
                if !file.is_absolute() {
                    return Err(format!(
                        "health check `file`: {} is not an absolute path",
                        file.display()
                    ));
                }
                Ok(HealthCheck::File(file))
            }
            (None, Some(command), None, None) => {
                slate_services::check_argv(&command)
                    .map_err(|e| format!("health check `command`: {e}"))?;
                Ok(HealthCheck::Command(command))
            }
            (None, None, Some(tcp), None) => Ok(HealthCheck::Tcp(
                slate_services::check_socket_addr(&tcp)
                    .map_err(|e| format!("health check `tcp`: {e}"))?,
            )),
            _ => Err(
                "a health check has exactly one of `file`, `command`, `tcp` or `service`".into(),
            ),
        }
    }
}

impl From<HealthCheck> for RawCheck {
    fn from(check: HealthCheck) -> Self {
        match check {
            HealthCheck::File(file) => RawCheck {
                file: Some(file),
                ..RawCheck::default()
            },
            HealthCheck::Command(command) => RawCheck {
                command: Some(command),
                ..RawCheck::default()
            },
            HealthCheck::Tcp(addr) => RawCheck {
                tcp: Some(addr.to_string()),
                ..RawCheck::default()
            },
            HealthCheck::Service(name) => RawCheck {
                service: Some(name),
                ..RawCheck::default()
            },
        }
    }
}

impl fmt::Display for HealthCheck {
    /// `file /path`, `command /bin/sh -c 'exit 0'`, `tcp 127.0.0.1:50000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HealthCheck::File(path) => write!(f, "file {}", path.display()),
            HealthCheck::Command(argv) => {
                f.write_str("command")?;
                for arg in argv {
                    let plain = !arg.is_empty()
                        && arg
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@%".contains(&b));
                    if plain {
                        write!(f, " {arg}")?;
                    } else {
                        write!(f, " '{}'", arg.replace('\'', "'\\''"))?;
                    }
                }
                Ok(())
            }
            HealthCheck::Tcp(addr) => write!(f, "tcp {addr}"),
            HealthCheck::Service(name) => write!(f, "service {name}"),
        }
    }
}

/// `[watchdog]`: the hardware watchdog machined arms at startup and feeds only once the boot is
/// committed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Watchdog {
    /// Seconds without a keepalive before the hardware resets the machine; 0 disables.
    #[serde(default)]
    pub timeout_secs: u32,
    #[serde(default = "default_watchdog_device")]
    pub device: PathBuf,
}

impl Watchdog {
    pub fn enabled(&self) -> bool {
        self.timeout_secs > 0
    }
}

/// The node's runtime configuration file ([`NODE_CONFIG_PATH`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<Watchdog>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot: Option<Reboot>,
    /// `[[services]]`: what machined starts and supervises (the machine configuration adds
    /// its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<slate_services::ServiceSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub var: Option<Var>,
}

/// `[var]`: how /var (the EPHEMERAL partition) lives across boots (docs/node.md, "/var
/// modes"). The machine configuration's `[var] mode` wins over the image's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Var {
    #[serde(default)]
    pub mode: VarMode,
}

/// How /var lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VarMode {
    /// Kept across reboots, upgrades and reverts (formatted only when blank).
    #[default]
    Persistent,
    /// Formatted afresh at every boot before anything mounts it: nothing of the last boot's
    /// contents is read.
    Ephemeral,
    /// Persistent, inside a LUKS2 volume whose key is sealed to the machine's TPM 2.0 (PCR 7:
    /// the Secure Boot state), unlocked unattended at every boot (docs/node.md, "/var modes").
    Tpm2,
}

impl VarMode {
    pub fn name(self) -> &'static str {
        match self {
            VarMode::Persistent => "persistent",
            VarMode::Ephemeral => "ephemeral",
            VarMode::Tpm2 => "tpm2",
        }
    }
}

/// `[reboot]`: how the node restarts when a reboot asks for its default way (an upgrade's,
/// `slate reboot` without `--mode`). The machine configuration's `[reboot] mode` wins over it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Reboot {
    #[serde(default)]
    pub mode: RebootMethod,
}

/// The two ways a node restarts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RebootMethod {
    /// Through the firmware and the boot loader.
    #[default]
    Firmware,
    /// kexec into the entry the boot loader would start next, skipping the firmware.
    Kexec,
}

impl NodeConfig {
    /// Parse and validate the file's text.
    pub fn parse(text: &str) -> Result<Self, ProfileError> {
        let config: NodeConfig = toml::from_str(text)?;
        validate(config.health.as_ref(), config.watchdog.as_ref())?;
        validate_services(&config.services, config.health.as_ref())?;
        Ok(config)
    }

    /// The file's text. Deterministic: the same configuration gives the same bytes.
    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).unwrap_or_else(|e| {
            // Only maps with non-string keys or values TOML cannot express fail, and this
            // type has neither.
            unreachable!("the node configuration is always expressible in TOML: {e}")
        });
        format!(
            "# The node's runtime configuration, written by slate's imager from the image \
             profile.\n# machined reads it at startup: health checks before commit, the \
             watchdog.\n{body}"
        )
    }

    /// The watchdog when it is enabled.
    pub fn enabled_watchdog(&self) -> Option<&Watchdog> {
        self.watchdog.as_ref().filter(|w| w.enabled())
    }
}

/// The services as a set (each declaration, names, dependencies, circles). Whether the
/// programs exist is the imager's check, against the root it builds.
pub(crate) fn validate_services(
    services: &[slate_services::ServiceSpec],
    health: Option<&Health>,
) -> Result<(), ProfileError> {
    slate_services::start_order(services, &|_| true).map_err(|e| ProfileError::Invalid {
        field: "services",
        reason: e.to_string(),
    })?;
    let checks = health.map(|h| h.checks.as_slice()).unwrap_or_default();
    for check in checks {
        if let HealthCheck::Service(name) = check {
            if !services.iter().any(|s| s.name == *name) {
                return Err(ProfileError::Invalid {
                    field: "health.checks",
                    reason: format!("`service {name}`: the image declares no service {name:?}"),
                });
            }
        }
    }
    Ok(())
}

/// Range checks shared by the profile and the node configuration file.
pub(crate) fn validate(
    health: Option<&Health>,
    watchdog: Option<&Watchdog>,
) -> Result<(), ProfileError> {
    if let Some(health) = health {
        if !HEALTH_TIMEOUT_RANGE.contains(&health.timeout_secs) {
            return Err(ProfileError::Invalid {
                field: "health.timeout_secs",
                reason: format!(
                    "{} is outside {}..={} seconds",
                    health.timeout_secs,
                    HEALTH_TIMEOUT_RANGE.start(),
                    HEALTH_TIMEOUT_RANGE.end()
                ),
            });
        }
    }
    if let Some(watchdog) = watchdog {
        if watchdog.enabled() && !WATCHDOG_TIMEOUT_RANGE.contains(&watchdog.timeout_secs) {
            return Err(ProfileError::Invalid {
                field: "watchdog.timeout_secs",
                reason: format!(
                    "{} is outside {}..={} seconds (0 disables the watchdog)",
                    watchdog.timeout_secs,
                    WATCHDOG_TIMEOUT_RANGE.start(),
                    WATCHDOG_TIMEOUT_RANGE.end()
                ),
            });
        }
        if !watchdog.device.is_absolute() {
            return Err(ProfileError::Invalid {
                field: "watchdog.device",
                reason: format!("{} is not an absolute path", watchdog.device.display()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
[health]
timeout_secs = 30
[[health.checks]]
file = "/etc/os-release"
[[health.checks]]
command = ["/bin/sh", "-c", "test -d /var"]
[[health.checks]]
tcp = "127.0.0.1:50000"
[watchdog]
timeout_secs = 45
[reboot]
mode = "kexec"
"#;

    #[test]
    fn parses_checks_and_watchdog_with_defaults() {
        let c = NodeConfig::parse(FULL).unwrap();
        let health = c.health.as_ref().unwrap();
        assert_eq!(health.timeout_secs, 30);
        assert_eq!(
            health.checks,
            [
                HealthCheck::File("/etc/os-release".into()),
                HealthCheck::Command(vec!["/bin/sh".into(), "-c".into(), "test -d /var".into()]),
                HealthCheck::Tcp("127.0.0.1:50000".parse().unwrap()),
            ]
        );
        assert_eq!(c.reboot.as_ref().unwrap().mode, RebootMethod::Kexec);
        let dog = c.enabled_watchdog().unwrap();
        assert_eq!(
            (dog.timeout_secs, dog.device.to_str()),
            (45, Some("/dev/watchdog"))
        );

        let defaults = NodeConfig::parse("[health]\n[watchdog]\n").unwrap();
        assert_eq!(defaults.health.as_ref().unwrap().timeout_secs, 60);
        assert!(defaults.watchdog.is_some() && defaults.enabled_watchdog().is_none());
        assert_eq!(NodeConfig::parse("").unwrap(), NodeConfig::default());
    }

    #[test]
    fn round_trips_through_its_file() {
        let c = NodeConfig::parse(FULL).unwrap();
        let text = c.to_toml();
        assert_eq!(NodeConfig::parse(&text).unwrap(), c, "{text}");
        assert_eq!(text, c.clone().to_toml(), "deterministic");
        assert!(text.contains("tcp = \"127.0.0.1:50000\""), "{text}");
        assert_eq!(
            NodeConfig::default()
                .to_toml()
                .lines()
                .filter(|l| !l.starts_with('#'))
                .count(),
            0
        );
    }

    #[test]
    fn bad_checks_and_ranges_are_explained() {
        let err = |text: &str| NodeConfig::parse(text).unwrap_err().to_string();
        let e = err("[[health.checks]]\nfile = \"/a\"\ntcp = \"127.0.0.1:1\"\n");
        assert!(
            e.contains("exactly one of `file`, `command`, `tcp` or `service`"),
            "{e}"
        );
        let e = err("[[health.checks]]\n");
        assert!(e.contains("exactly one of"), "{e}");
        // A service check names a service the image declares.
        let e = err("[[health.checks]]\nservice = \"web\"\n");
        assert!(
            e.contains("health.checks: `service web`: the image declares no service \"web\""),
            "{e}"
        );
        let with_web = "[[services]]\nname = \"web\"\ncommand = [\"/bin/httpd\"]\n\
                        [health]\n[[health.checks]]\nservice = \"web\"\n";
        let config = NodeConfig::parse(with_web).unwrap();
        assert_eq!(
            config.health.as_ref().unwrap().checks,
            [HealthCheck::Service("web".into())]
        );
        assert_eq!(NodeConfig::parse(&config.to_toml()).unwrap(), config);
        let e = err("[[health.checks]]\nfile = \"relative\"\n");
        assert!(e.contains("not an absolute path"), "{e}");
        let e = err("[[health.checks]]\ncommand = []\n");
        assert!(e.contains("names no program"), "{e}");
        let e = err("[[health.checks]]\ntcp = \"localhost:50000\"\n");
        assert!(e.contains("not an IP address and port"), "{e}");
        let e = err("[[health.checks]]\ntcp = \"127.0.0.1:0\"\n");
        assert!(e.contains("port 0"), "{e}");
        let e = err("[[health.checks]]\ntcp = \"127.0.0.1:65536\"\n");
        assert!(e.contains("not an IP address and port"), "{e}");
        let e = err("[health]\ntimeout_secs = 4294967295\n");
        assert!(
            e.starts_with("health.timeout_secs: 4294967295 is outside"),
            "{e}"
        );
        let e = err("[[health.checks]]\nhttp = \"x\"\n");
        assert!(e.contains("unknown field `http`"), "{e}");
        let e = err("[health]\ntimeout = 5\n");
        assert!(e.contains("unknown field `timeout`"), "{e}");
        let e = err("[health]\ntimeout_secs = 0\n");
        assert!(e.starts_with("health.timeout_secs: 0 is outside"), "{e}");
        let e = err("[watchdog]\ntimeout_secs = 2\n");
        assert!(
            e.starts_with("watchdog.timeout_secs: 2 is outside 5..=3600"),
            "{e}"
        );
        let e = err("[watchdog]\ntimeout_secs = 10\ndevice = \"watchdog0\"\n");
        assert!(e.starts_with("watchdog.device:"), "{e}");
        let e = err("[watchdog]\ntimeout_secs = -1\n");
        assert!(e.contains("timeout_secs"), "{e}");
        let e = err("[reboot]\nmode = \"warm\"\n");
        assert!(e.contains("unknown variant `warm`"), "{e}");
        let e = err("[extra]\n");
        assert!(e.contains("unknown field `extra`"), "{e}");
    }

    #[test]
    fn a_profiles_reboot_mode_becomes_the_node_config() {
        let profile = "name = \"slate\"\nversion = \"1.0.0\"\narch = \"amd64\"\n\
                       platform = \"qemu\"\n[kernel]\nimage = \"vmlinuz\"\n\
                       modules_dir = \"modules\"\nmodules = []\nargs = []\n[rootfs]\n\
                       base = \"rootfs\"\n[boot]\nstub = \"stub.efi\"\n\
                       systemd_boot = \"sd.efi\"\nslate = \"slate\"\n";
        let without = crate::Profile::parse(profile).unwrap();
        assert_eq!(without.node_config(), None);
        let with =
            crate::Profile::parse(&format!("{profile}[reboot]\nmode = \"kexec\"\n")).unwrap();
        let node = with
            .node_config()
            .expect("a [reboot] section alone is a node config");
        assert_eq!(
            node.reboot.as_ref().map(|r| r.mode),
            Some(RebootMethod::Kexec)
        );
        assert_eq!(NodeConfig::parse(&node.to_toml()).unwrap(), node);
    }

    #[test]
    fn var_modes_parse_by_name_and_an_unknown_one_is_refused() {
        for (name, mode) in [
            ("persistent", VarMode::Persistent),
            ("ephemeral", VarMode::Ephemeral),
            ("tpm2", VarMode::Tpm2),
        ] {
            let config = NodeConfig::parse(&format!("[var]\nmode = \"{name}\"\n")).unwrap();
            assert_eq!(config.var.as_ref().map(|v| v.mode), Some(mode));
            assert_eq!(mode.name(), name);
            assert_eq!(NodeConfig::parse(&config.to_toml()).unwrap(), config);
        }
        let e = NodeConfig::parse("[var]\nmode = \"luks\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `luks`"), "{e}");
        assert!(e.contains("`tpm2`"), "{e}");
    }

    #[test]
    fn checks_name_themselves() {
        let shown = |c: HealthCheck| c.to_string();
        assert_eq!(
            shown(HealthCheck::Tcp("127.0.0.1:9".parse().unwrap())),
            "tcp 127.0.0.1:9"
        );
        assert_eq!(shown(HealthCheck::File("/x".into())), "file /x");
        assert_eq!(
            shown(HealthCheck::Command(vec![
                "/bin/sh".into(),
                "-c".into(),
                "it's up".into()
            ])),
            "command /bin/sh -c 'it'\\''s up'"
        );
    }
}
