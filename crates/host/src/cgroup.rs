//! cgroup v2 for the services machined runs: one cgroup per service, its limits written before
//! the program starts, and a kill that reaches every process in it, however it forked
//! (`cgroup.kill`, Linux 5.14; before that, SIGKILL to each member until none is left).

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::{HostError, MsFlags, Result};

/// Where machined mounts the unified hierarchy when nothing is mounted there.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The unified hierarchy at [`CGROUP_ROOT`], mounted now if nothing is there. Answers its path.
pub fn mount_cgroup2() -> Result<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    if is_cgroup2(root) {
        return Ok(root.to_owned());
    }
    fs::create_dir_all(root).map_err(|source| HostError::CreateDir {
        path: root.to_owned(),
        source,
    })?;
    crate::mount(
        "cgroup2",
        root,
        "cgroup2",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    Ok(root.to_owned())
}

/// Whether `path` is the root of a cgroup2 mount.
pub fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// A cgroup directory of the unified hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// The cgroup at `path`, made if it is not there.
    pub fn create(path: &Path) -> Result<Cgroup> {
        match fs::create_dir(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(HostError::CreateDir {
                    path: path.to_owned(),
                    source,
                })
            }
        }
        Ok(Cgroup {
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A child cgroup, made if it is not there.
    pub fn child(&self, name: &str) -> Result<Cgroup> {
        Cgroup::create(&self.path.join(name))
    }

    /// Let children use `wanted` controllers, those of them this cgroup has; answers those.
    pub fn delegate(&self, wanted: &[&str]) -> Result<Vec<String>> {
        let available = self.read("cgroup.controllers")?;
        let have: Vec<String> = available
            .split_whitespace()
            .filter(|c| wanted.contains(c))
            .map(str::to_owned)
            .collect();
        if !have.is_empty() {
            let line: Vec<String> = have.iter().map(|c| format!("+{c}")).collect();
            self.write("cgroup.subtree_control", &line.join(" "))?;
        }
        Ok(have)
    }

    pub fn read(&self, file: &str) -> Result<String> {
        let path = self.path.join(file);
        fs::read_to_string(&path).map_err(|source| HostError::Read { path, source })
    }

    pub fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.path.join(file);
        fs::write(&path, value).map_err(|source| HostError::Write { path, source })
    }

    /// `cgroup.procs` opened for writing: a child writes `0` into it before it runs its
    /// program, so nothing it starts is ever outside (see `process::spawn_supervised`).
    pub(crate) fn procs_for_writing(&self) -> Result<File> {
        let path = self.path.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|source| HostError::Open { path, source })
    }

    /// The processes in the cgroup (not its children's).
    pub fn pids(&self) -> Result<Vec<i32>> {
        Ok(self
            .read("cgroup.procs")?
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect())
    }

    /// Signal number `signal` to every process in the cgroup.
    pub fn signal(&self, signal: i32) -> Result<()> {
        let signal = Signal::try_from(signal).map_err(|_| HostError::Device {
            what: format!("signal {signal}"),
            reason: "not a signal number".into(),
        })?;
        for pid in self.pids()? {
            let _ = kill(Pid::from_raw(pid), signal);
        }
        Ok(())
    }

    /// Kills every process in the cgroup and waits (up to `wait`) until none is left.
    /// Answers whether it is empty.
    pub fn kill_all(&self, wait: Duration) -> Result<bool> {
        let killed = self.write("cgroup.kill", "1");
        let deadline = Instant::now() + wait;
        loop {
            if killed.is_err() {
                // Before 5.14: one member at a time; a fork between reads is caught next time.
                self.signal(Signal::SIGKILL as i32)?;
            }
            if self.pids()?.is_empty() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `memory.current`, when the memory controller is on.
    pub fn memory_current(&self) -> Option<u64> {
        self.read("memory.current").ok()?.trim().parse().ok()
    }

    /// Removes the (empty) cgroup.
    pub fn remove(&self) -> Result<()> {
        match fs::remove_dir(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(HostError::Write {
                path: self.path.clone(),
                source,
            }),
        }
    }
}

/// The first cgroup2 mount of this process's mount table (tests run on hosts where the unified
/// hierarchy sits beside v1's, at `/sys/fs/cgroup/unified`).
pub fn cgroup2_mount_point() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mounts").ok()?;
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(fields[1]))
    })
}
