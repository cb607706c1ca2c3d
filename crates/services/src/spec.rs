//! One service's declaration (`[[services]]`), a closed table: an unknown key is refused by
//! the parser, every value by [`ServiceSpec::check`] with the field's name.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::order::Milestone;
use crate::restart::RestartPolicy;
use crate::ServiceError;

/// Bounds of `restart_delay_ms` (the first delay) and of `restart_delay_max_ms`.
pub const RESTART_DELAY_RANGE_MS: std::ops::RangeInclusive<u64> = 10..=3_600_000;
/// Bounds of `stop_grace_secs`: the time between the stop signal and SIGKILL of the cgroup.
pub const STOP_GRACE_RANGE_SECS: std::ops::RangeInclusive<u32> = 1..=600;
/// Bounds of `ready_timeout_secs`.
pub const READY_TIMEOUT_RANGE_SECS: std::ops::RangeInclusive<u32> = 1..=3600;
/// cgroup v2's `cpu.weight` range.
pub const CPU_WEIGHT_RANGE: std::ops::RangeInclusive<u32> = 1..=10_000;
/// A `memory.max` below this leaves no room for even a static program's pages.
pub const MEMORY_MAX_MIN: u64 = 1 << 20;
/// Longest service name: it names a cgroup directory and prefixes journal lines.
pub const NAME_MAX: usize = 63;

fn default_restart_delay_ms() -> u64 {
    500
}

fn default_restart_delay_max_ms() -> u64 {
    30_000
}

fn default_stop_grace_secs() -> u32 {
    10
}

fn default_ready_timeout_secs() -> u32 {
    60
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// A service: a program machined starts, supervises and stops.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSpec {
    /// `[a-z0-9][a-z0-9-]*`, at most [`NAME_MAX`]; not a milestone's name.
    pub name: String,
    /// argv; the first word is an absolute path to the program (no shell, no `PATH` search).
    pub command: Vec<String>,
    /// The whole environment the program gets (nothing is inherited from machined).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    /// Where it starts (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_directory: Option<PathBuf>,
    /// Numeric user and group ids (default 0: a slate root has no user database to look
    /// names up in).
    #[serde(default, skip_serializing_if = "is_default")]
    pub user: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub group: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub restart: RestartPolicy,
    /// The delay before the first restart; each failure in a row doubles it, up to
    /// `restart_delay_max_ms`.
    #[serde(default = "default_restart_delay_ms")]
    pub restart_delay_ms: u64,
    #[serde(default = "default_restart_delay_max_ms")]
    pub restart_delay_max_ms: u64,
    /// Services (by name) that must be ready first, and milestones of the boot that must be
    /// reached ([`Milestone`]: `network`, `var`, `etc`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// What says the service is ready; none: ready once started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<ReadyCheck>,
    #[serde(default = "default_ready_timeout_secs")]
    pub ready_timeout_secs: u32,
    #[serde(default, skip_serializing_if = "is_default")]
    pub stop_signal: StopSignal,
    #[serde(default = "default_stop_grace_secs")]
    pub stop_grace_secs: u32,
    /// cgroup v2 limits of the service's cgroup.
    #[serde(default, skip_serializing_if = "is_default")]
    pub limits: Limits,
}

/// `[services.limits]`: written into the service's cgroup before its program starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// `memory.max`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<u64>,
    /// `cpu.weight`, 1 to 10000 (100 is the kernel's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u32>,
    /// `pids.max`: processes and threads together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u32>,
}

/// The signal that asks a service to stop; after `stop_grace_secs` its cgroup is killed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum StopSignal {
    #[default]
    Term,
    Int,
    Quit,
    Hup,
    Usr1,
    Usr2,
    Kill,
}

impl StopSignal {
    /// The Linux signal number.
    pub fn number(self) -> i32 {
        match self {
            StopSignal::Hup => 1,
            StopSignal::Int => 2,
            StopSignal::Quit => 3,
            StopSignal::Kill => 9,
            StopSignal::Usr1 => 10,
            StopSignal::Usr2 => 12,
            StopSignal::Term => 15,
        }
    }
}

/// `[services.ready]`, exactly one of `tcp`, `http`, `file` or `command`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "RawReady", into = "RawReady")]
pub enum ReadyCheck {
    /// A TCP connection to the address is accepted.
    Tcp(SocketAddr),
    /// `GET` of the URL (plain `http://IP:PORT/PATH`) answers 2xx.
    Http { addr: SocketAddr, path: String },
    /// The path exists.
    File(PathBuf),
    /// The program exits 0.
    Command(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawReady {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tcp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    http: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
}

impl TryFrom<RawReady> for ReadyCheck {
    type Error = String;

    fn try_from(raw: RawReady) -> Result<Self, String> {
        match (raw.tcp, raw.http, raw.file, raw.command) {
            (Some(tcp), None, None, None) => Ok(ReadyCheck::Tcp(socket_addr(&tcp, "tcp")?)),
            (None, Some(url), None, None) => {
                let rest = url.strip_prefix("http://").ok_or_else(|| {
                    format!("ready.http: {url:?} is not an http:// URL (TLS is not checked)")
                })?;
                let (authority, path) = match rest.find('/') {
                    Some(i) => (&rest[..i], &rest[i..]),
                    None => (rest, "/"),
                };
                if path.chars().any(|c| c.is_control() || c == ' ') {
                    return Err(format!(
                        "ready.http: {url:?} has a space or a control character"
                    ));
                }
                Ok(ReadyCheck::Http {
                    addr: socket_addr(authority, "http")?,
                    path: path.to_owned(),
                })
            }
            (None, None, Some(file), None) => {
                if !file.is_absolute() {
                    return Err(format!(
                        "ready.file: {} is not an absolute path",
                        file.display()
                    ));
                }
                Ok(ReadyCheck::File(file))
            }
            (None, None, None, Some(command)) => {
                check_argv(&command).map_err(|e| format!("ready.command: {e}"))?;
                Ok(ReadyCheck::Command(command))
            }
            _ => Err("ready has exactly one of `tcp`, `http`, `file` or `command`".into()),
        }
    }
}

impl From<ReadyCheck> for RawReady {
    fn from(check: ReadyCheck) -> Self {
        match check {
            ReadyCheck::Tcp(addr) => RawReady {
                tcp: Some(addr.to_string()),
                ..RawReady::default()
            },
            ReadyCheck::Http { addr, path } => RawReady {
                http: Some(format!("http://{addr}{path}")),
                ..RawReady::default()
            },
            ReadyCheck::File(file) => RawReady {
                file: Some(file),
                ..RawReady::default()
            },
            ReadyCheck::Command(command) => RawReady {
                command: Some(command),
                ..RawReady::default()
            },
        }
    }
}

impl fmt::Display for ReadyCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadyCheck::Tcp(addr) => write!(f, "tcp {addr}"),
            ReadyCheck::Http { addr, path } => write!(f, "http http://{addr}{path}"),
            ReadyCheck::File(path) => write!(f, "file {}", path.display()),
            ReadyCheck::Command(argv) => write!(f, "command {}", argv.join(" ")),
        }
    }
}

/// A readiness check's address, its reason prefixed with the field.
fn socket_addr(text: &str, field: &str) -> Result<SocketAddr, String> {
    check_socket_addr(text).map_err(|e| format!("ready.{field}: {e}"))
}

/// An address a check connects to: an IP address and a port, never a name (nothing resolves
/// names at boot), never port 0 (nothing listens there: the check could never pass). Shared
/// with the image's health checks.
pub fn check_socket_addr(text: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text.parse().map_err(|_| {
        format!(
            "{text:?} is not an IP address and port (e.g. \"127.0.0.1:8080\"; names are not \
             resolved at boot)"
        )
    })?;
    if addr.port() == 0 {
        return Err(format!("{text:?} has port 0, which nothing listens on"));
    }
    Ok(addr)
}

/// An argv machined runs without a shell: a program by absolute path, no NUL byte anywhere.
/// Shared by services, readiness and health checks and the drain command.
pub fn check_argv(argv: &[String]) -> Result<(), String> {
    let Some(program) = argv.first() else {
        return Err("names no program (an argv list, e.g. [\"/bin/busybox\", \"httpd\"])".into());
    };
    if !program.starts_with('/') {
        return Err(format!(
            "{program:?} is not an absolute path (no shell and no PATH search run it)"
        ));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err("an argument contains a NUL byte".into());
    }
    Ok(())
}

/// Whether `name` may name a service.
fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !first_ok
        || name.len() > NAME_MAX
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(format!(
            "{name:?} is not 1 to {NAME_MAX} of a-z, 0-9 and '-', starting with a letter or digit"
        ));
    }
    if Milestone::parse(name).is_some() {
        return Err(format!(
            "{name:?} is a milestone's name ({})",
            Milestone::NAMES.join(", ")
        ));
    }
    Ok(())
}

fn in_range<T: PartialOrd + fmt::Display>(
    value: T,
    range: &std::ops::RangeInclusive<T>,
    unit: &str,
) -> Result<(), String> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{value} is outside {}..={}{unit}",
            range.start(),
            range.end()
        ))
    }
}

impl ServiceSpec {
    /// A service running `command` with every other field at its default.
    pub fn new(name: &str, command: &[&str]) -> Self {
        ServiceSpec {
            name: name.to_owned(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            environment: BTreeMap::new(),
            working_directory: None,
            user: 0,
            group: 0,
            restart: RestartPolicy::default(),
            restart_delay_ms: default_restart_delay_ms(),
            restart_delay_max_ms: default_restart_delay_max_ms(),
            depends_on: Vec::new(),
            ready: None,
            ready_timeout_secs: default_ready_timeout_secs(),
            stop_signal: StopSignal::default(),
            stop_grace_secs: default_stop_grace_secs(),
            limits: Limits::default(),
        }
    }

    /// Every check of one declaration, the first failure named by its field. `has_program`
    /// answers whether the image holds an executable at a path (the command's program, and
    /// the ready command's).
    pub fn check(&self, has_program: &dyn Fn(&Path) -> bool) -> Result<(), ServiceError> {
        let invalid = |field: &'static str, reason: String| ServiceError::Invalid {
            service: self.name.clone(),
            field,
            reason,
        };
        check_name(&self.name).map_err(|r| invalid("name", r))?;
        check_argv(&self.command).map_err(|r| invalid("command", r))?;
        let program = Path::new(&self.command[0]);
        if !has_program(program) {
            return Err(invalid(
                "command",
                format!("the image holds no executable {}", program.display()),
            ));
        }
        for (key, value) in &self.environment {
            let key_ok = key
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !key_ok {
                return Err(invalid(
                    "environment",
                    format!("{key:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"),
                ));
            }
            if value.contains('\0') {
                return Err(invalid(
                    "environment",
                    format!("{key}'s value contains a NUL byte"),
                ));
            }
        }
        if let Some(dir) = &self.working_directory {
            if !dir.is_absolute() {
                return Err(invalid(
                    "working_directory",
                    format!("{} is not an absolute path", dir.display()),
                ));
            }
        }
        in_range(self.restart_delay_ms, &RESTART_DELAY_RANGE_MS, " ms")
            .map_err(|r| invalid("restart_delay_ms", r))?;
        in_range(self.restart_delay_max_ms, &RESTART_DELAY_RANGE_MS, " ms")
            .map_err(|r| invalid("restart_delay_max_ms", r))?;
        if self.restart_delay_max_ms < self.restart_delay_ms {
            return Err(invalid(
                "restart_delay_max_ms",
                format!(
                    "{} is below restart_delay_ms ({})",
                    self.restart_delay_max_ms, self.restart_delay_ms
                ),
            ));
        }
        for dependency in &self.depends_on {
            if *dependency == self.name {
                return Err(invalid(
                    "depends_on",
                    "a service cannot depend on itself".into(),
                ));
            }
        }
        if let Some(ReadyCheck::Command(argv)) = &self.ready {
            let program = Path::new(&argv[0]);
            if !has_program(program) {
                return Err(invalid(
                    "ready.command",
                    format!("the image holds no executable {}", program.display()),
                ));
            }
        }
        in_range(self.ready_timeout_secs, &READY_TIMEOUT_RANGE_SECS, " s")
            .map_err(|r| invalid("ready_timeout_secs", r))?;
        in_range(self.stop_grace_secs, &STOP_GRACE_RANGE_SECS, " s")
            .map_err(|r| invalid("stop_grace_secs", r))?;
        if let Some(memory) = self.limits.memory_max {
            if memory < MEMORY_MAX_MIN {
                return Err(invalid(
                    "limits.memory_max",
                    format!("{memory} bytes is below 1 MiB"),
                ));
            }
        }
        if let Some(weight) = self.limits.cpu_weight {
            in_range(weight, &CPU_WEIGHT_RANGE, "").map_err(|r| invalid("limits.cpu_weight", r))?;
        }
        if self.limits.pids_max == Some(0) {
            return Err(invalid(
                "limits.pids_max",
                "0 would let the program itself not start".into(),
            ));
        }
        Ok(())
    }
}
