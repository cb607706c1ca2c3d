//! Process-level operations of an init: the console, kernel modules, `exec`, reboot.

use std::convert::Infallible;
use std::ffi::{CString, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd as _, IntoRawFd as _};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::kmod::{finit_module, ModuleInitFlags};
use nix::sys::reboot::RebootMode;
use nix::sys::stat::Mode;

use crate::error::{HostError, Result};

/// `MODULE_INIT_COMPRESSED_FILE` (Linux 6.x): the kernel decompresses the module itself.
const MODULE_INIT_COMPRESSED_FILE: u32 = 4;

/// Whether this process is PID 1 (the init of its PID namespace).
pub fn is_pid1() -> bool {
    nix::unistd::getpid().as_raw() == 1
}

/// Makes sure file descriptors 0, 1 and 2 are open, on `/dev/console` where they are not.
///
/// The kernel opens the console for init only if the initramfs contains `/dev/console`; without
/// it init starts with no stdio, and the program it execs would inherit none. Each `open`
/// takes the lowest free descriptor, so opening until a descriptor above 2 comes back fills
/// exactly the missing ones (without `O_CLOEXEC`, so they survive `exec`).
pub fn ensure_console_stdio() -> Result<()> {
    for _ in 0..4 {
        let fd = nix::fcntl::open(
            "/dev/console",
            OFlag::O_RDWR | OFlag::O_NOCTTY,
            Mode::empty(),
        )
        .map_err(|source| HostError::Console { source })?;
        if fd.as_raw_fd() > 2 {
            return Ok(()); // dropping it closes the spare descriptor
        }
        // It filled a stdio slot: keep it open for good.
        let _ = fd.into_raw_fd();
    }
    Ok(())
}

/// The running kernel's release (`uname -r`), which names its `/lib/modules` directory.
pub fn kernel_release() -> Result<String> {
    let uts = nix::sys::utsname::uname().map_err(|source| HostError::Uname { source })?;
    Ok(uts.release().to_string_lossy().into_owned())
}

/// Whether `load_module` inserted the module or found it already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModuleLoad {
    Loaded,
    AlreadyLoaded,
    /// The module refused to initialize because its device is absent (`ENODEV`), e.g.
    /// efivarfs on a machine not booted through UEFI.
    NoDevice,
    /// Not loaded, for this reason: nothing on this machine could use it ([`unusable_here`]).
    Unusable(&'static str),
}

/// Why a module would only fail on this machine, if it would: efivarfs when the kernel was not
/// booted through UEFI (no `/sys/firmware/efi`). Its init refuses with `ENODEV`, but only after
/// the whole module was read, checked and linked — 41 ms of an emulated boot.
pub fn unusable_here(module: &str) -> Option<&'static str> {
    (module == "efivarfs" && !Path::new("/sys/firmware/efi").exists())
        .then_some("not booted through UEFI")
}

/// Loads the kernel module file at `path` with `finit_module(2)`, without parameters.
/// A module that is already loaded (`EEXIST`) is success. Compressed modules (`.ko.xz`,
/// `.ko.zst`, `.ko.gz`) are handed to the kernel to decompress.
pub fn load_module(path: &Path) -> Result<ModuleLoad> {
    let file = File::open(path).map_err(|source| HostError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let compressed = [".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .any(|ext| path.as_os_str().as_bytes().ends_with(ext.as_bytes()));
    let flags = if compressed {
        ModuleInitFlags::from_bits_retain(MODULE_INIT_COMPRESSED_FILE)
    } else {
        ModuleInitFlags::empty()
    };
    match finit_module(&file, c"", flags) {
        Ok(()) => Ok(ModuleLoad::Loaded),
        Err(Errno::EEXIST) => Ok(ModuleLoad::AlreadyLoaded),
        Err(Errno::ENODEV) => Ok(ModuleLoad::NoDevice),
        Err(source) => Err(HostError::LoadModule {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Replaces this process with `path`, with `argv[0] = path` and `args` after it, keeping the
/// environment (the kernel passes unknown `key=value` parameters to init there).
/// Returns only on failure.
pub fn exec(path: &Path, args: &[OsString]) -> Result<Infallible> {
    let to_c = |s: &[u8]| {
        CString::new(s).map_err(|_| HostError::NulInArgument {
            arg: String::from_utf8_lossy(s).into_owned(),
        })
    };
    let program = to_c(path.as_os_str().as_bytes())?;
    let mut argv = vec![program.clone()];
    for arg in args {
        argv.push(to_c(arg.as_bytes())?);
    }
    nix::unistd::execv(&program, &argv).map_err(|source| HostError::Exec {
        path: path.to_path_buf(),
        source,
    })
}

/// Flushes filesystems and restarts the machine. Returns only on failure.
pub fn reboot() -> Result<Infallible> {
    nix::unistd::sync();
    nix::sys::reboot::reboot(RebootMode::RB_AUTOBOOT).map_err(|source| HostError::Reboot {
        how: "reboot",
        source,
    })
}

/// Flushes filesystems and powers the machine off. Returns only on failure.
pub fn poweroff() -> Result<Infallible> {
    nix::unistd::sync();
    nix::sys::reboot::reboot(RebootMode::RB_POWER_OFF).map_err(|source| HostError::Reboot {
        how: "power off",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_of_a_missing_program_fails_with_its_path() {
        let err = exec(Path::new("/nonexistent/slate-init"), &[]).unwrap_err();
        assert!(matches!(
            err,
            HostError::Exec {
                source: Errno::ENOENT,
                ..
            }
        ));
        assert_eq!(err.to_string(), "cannot execute /nonexistent/slate-init");
    }

    #[test]
    fn exec_refuses_nul_bytes() {
        let err = exec(Path::new("/bin/true"), &[OsString::from("a\0b")]).unwrap_err();
        assert!(matches!(err, HostError::NulInArgument { .. }));
    }

    #[test]
    fn missing_module_file_is_an_open_error() {
        let err = load_module(Path::new("/nonexistent/x.ko")).unwrap_err();
        assert!(matches!(err, HostError::Open { .. }), "{err}");
    }

    #[test]
    fn the_test_runner_is_not_pid1() {
        assert!(!is_pid1());
    }
}
