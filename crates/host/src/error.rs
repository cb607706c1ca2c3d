//! The one error type of the crate. Each variant names the operation and its path; the
//! underlying `errno` or I/O error is the `source`, so `{:#}` prints the whole sentence.

use std::path::PathBuf;

use nix::errno::Errno;

/// Result alias for everything in this crate.
pub type Result<T, E = HostError> = std::result::Result<T, E>;

/// What went wrong, and where.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot mount {fstype} {what} on {target} (options {data:?})")]
    Mount {
        what: String,
        target: PathBuf,
        fstype: String,
        data: String,
        #[source]
        source: Errno,
    },
    #[error("cannot unmount {target}")]
    Unmount {
        target: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot move mount {from} to {to}")]
    MoveMount {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} failed ({status}): {output}")]
    CommandFailed {
        program: String,
        status: String,
        output: String,
    },
    #[error("{what}: {reason}")]
    Device { what: String, reason: String },
    #[error("invalid overlay: {reason}")]
    InvalidOverlay { reason: String },
    #[error("cannot create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot load kernel module {path}")]
    LoadModule {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{op} on {device}")]
    Loop {
        op: String,
        device: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("loop device {device} did not appear within {waited_ms} ms (is devtmpfs on /dev?)")]
    LoopDeviceMissing { device: PathBuf, waited_ms: u64 },
    #[error("no free loop device after {attempts} attempts (others kept taking the free one)")]
    NoFreeLoop { attempts: u32 },
    #[error("switch_root to {new_root}: {step}")]
    SwitchRoot {
        step: &'static str,
        new_root: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot execute {path}")]
    Exec {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("argument {arg:?} contains a NUL byte")]
    NulInArgument { arg: String },
    #[error("{how} failed")]
    Reboot {
        how: &'static str,
        #[source]
        source: Errno,
    },
    #[error("{op} failed")]
    Signals {
        op: &'static str,
        #[source]
        source: Errno,
    },
    #[error("{op} failed{hint}")]
    Kexec {
        op: &'static str,
        /// What the errno usually means for kexec (", the kernel refused the image: …").
        hint: &'static str,
        #[source]
        source: Errno,
    },
    #[error("uname failed")]
    Uname {
        #[source]
        source: Errno,
    },
    #[error("cannot set up the console as stdin/stdout/stderr")]
    Console {
        #[source]
        source: Errno,
    },
    #[error("{op} {interface}")]
    Network {
        op: &'static str,
        interface: String,
        #[source]
        source: Errno,
    },
    #[error("btrfs: {op} {path}")]
    Btrfs {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{op}: {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
