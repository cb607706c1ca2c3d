//! kexec: load a kernel, its initramfs and command line with `kexec_file_load(2)` and restart
//! into it, skipping the firmware. The images go through memfds, so nothing is written to a
//! disk; the kernel reads them (and, where its policy says so, checks their signature) itself.

use std::convert::Infallible;
use std::ffi::CString;
use std::fs::File;
use std::io::Write as _;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::MsFlags;
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::reboot::RebootMode;

use crate::error::{HostError, Result};

/// Where the kernel says whether (and how) it is locked down.
pub const LOCKDOWN_PATH: &str = "/sys/kernel/security/lockdown";
/// `1` when a kexec image is loaded.
const KEXEC_LOADED_PATH: &str = "/sys/kernel/kexec_loaded";
/// `KEXEC_FILE_UNLOAD` (include/uapi/linux/kexec.h).
const KEXEC_FILE_UNLOAD: libc::c_ulong = 0x1;

/// Where securityfs, which holds [`LOCKDOWN_PATH`], is mounted.
const SECURITYFS: &str = "/sys/kernel/security";

/// The lockdown level the kernel enforces: the bracketed word of [`LOCKDOWN_PATH`]
/// (`none [integrity] confidentiality` → `integrity`), securityfs mounted first when it is not
/// (a node mounts only /proc, /sys and /dev). `None` when the file is absent (no lockdown LSM)
/// or unreadable; a kernel that is locked down anyway refuses the load, which says so.
pub fn lockdown() -> Option<String> {
    let dir = Path::new(SECURITYFS);
    if dir.is_dir() && !crate::is_mount_point(dir).unwrap_or(true) {
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        let _ = crate::mount("securityfs", dir, "securityfs", flags, None);
    }
    let text = std::fs::read_to_string(LOCKDOWN_PATH).ok()?;
    selected_lockdown(&text).map(str::to_owned)
}

/// The bracketed word of the lockdown file's text.
pub fn selected_lockdown(text: &str) -> Option<&str> {
    text.split_whitespace()
        .find_map(|word| word.strip_prefix('[')?.strip_suffix(']'))
}

/// Load `kernel` (a bzImage, as a UKI's `.linux` holds), `initrd` and `cmdline` as the image
/// the next [`kexec_reboot`] starts. An image loaded before is replaced.
pub fn kexec_load(kernel: &[u8], initrd: &[u8], cmdline: &str) -> Result<()> {
    let kernel_fd = memfd_with("slate-kexec-kernel", kernel)?;
    let initrd_fd = memfd_with("slate-kexec-initrd", initrd)?;
    let cmdline = CString::new(cmdline).map_err(|_| HostError::NulInArgument {
        arg: cmdline.to_owned(),
    })?;
    sys::kexec_file_load(Some((&kernel_fd, &initrd_fd)), &cmdline, 0).map_err(|errno| {
        HostError::Kexec {
            op: "kexec_file_load",
            hint: refusal_hint(errno),
            source: errno,
        }
    })
}

/// Unload a loaded kexec image (after a failure between loading it and the jump, so that
/// nothing else starts it by surprise).
pub fn kexec_unload() -> Result<()> {
    sys::kexec_file_load(None, c"", KEXEC_FILE_UNLOAD).map_err(|source| HostError::Kexec {
        op: "kexec_file_load (unload)",
        hint: "",
        source,
    })
}

/// The raw system call, which neither `nix` nor `libc` wrap: this module is the file's only
/// unsafe code, and it exposes a safe function over owned descriptors and a `CStr`.
mod sys {
    #![allow(unsafe_code)]

    use std::ffi::CStr;
    use std::os::fd::{AsRawFd as _, OwnedFd};

    use nix::errno::Errno;

    /// `kexec_file_load(kernel, initrd, cmdline_len, cmdline, flags)`; `images` `None` with
    /// `KEXEC_FILE_UNLOAD`, which ignores the descriptors and the command line.
    pub fn kexec_file_load(
        images: Option<(&OwnedFd, &OwnedFd)>,
        cmdline: &CStr,
        flags: libc::c_ulong,
    ) -> Result<(), Errno> {
        let (kernel, initrd) = images.map_or((-1, -1), |(k, i)| (k.as_raw_fd(), i.as_raw_fd()));
        let bytes = cmdline.to_bytes_with_nul();
        // SAFETY: the call only reads: the descriptors are open (borrowed for the call's
        // duration) or -1 with KEXEC_FILE_UNLOAD, which does not use them, and `bytes` is
        // `bytes.len()` live bytes ending in the NUL the kernel requires at
        // `cmdline_len - 1`.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_kexec_file_load,
                kernel,
                initrd,
                bytes.len() as libc::c_ulong,
                bytes.as_ptr(),
                flags,
            )
        };
        if ret == 0 {
            Ok(())
        } else {
            Err(Errno::last())
        }
    }
}

/// Whether the kernel holds a loaded kexec image.
pub fn kexec_loaded() -> bool {
    std::fs::read_to_string(Path::new(KEXEC_LOADED_PATH)).is_ok_and(|t| t.trim() == "1")
}

/// Flush file systems and start the loaded kexec image. Returns only on failure.
pub fn kexec_reboot() -> Result<Infallible> {
    nix::unistd::sync();
    nix::sys::reboot::reboot(RebootMode::RB_KEXEC).map_err(|source| HostError::Reboot {
        how: "kexec reboot",
        source,
    })
}

/// What an errno of `kexec_file_load` usually means, for the log line.
pub fn refusal_hint(errno: Errno) -> &'static str {
    match errno {
        Errno::EPERM => {
            ": the kernel refused the image (lockdown, or its signature policy, or no \
             CAP_SYS_BOOT)"
        }
        Errno::EKEYREJECTED | Errno::EBADMSG | Errno::ENOKEY => {
            ": the kernel refused the image's signature"
        }
        Errno::ENOSYS => ": this kernel has no kexec_file_load (CONFIG_KEXEC_FILE)",
        Errno::ENOEXEC => ": the kernel does not recognise the image as one it can start",
        Errno::EBUSY => ": a kexec image is in use",
        _ => "",
    }
}

/// A memfd named `name` holding `bytes`, its offset back at 0 for the kernel to read from.
fn memfd_with(name: &str, bytes: &[u8]) -> Result<OwnedFd> {
    let path = format!("memfd:{name}");
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(|source| HostError::Open {
        path: path.clone().into(),
        source: source.into(),
    })?;
    let mut file = File::from(fd);
    file.write_all(bytes)
        .and_then(|()| {
            use std::io::Seek as _;
            file.rewind()
        })
        .map_err(|source| HostError::Write {
            path: path.into(),
            source,
        })?;
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lockdown_level_is_the_bracketed_word() {
        assert_eq!(
            selected_lockdown("[none] integrity confidentiality\n"),
            Some("none")
        );
        assert_eq!(
            selected_lockdown("none [integrity] confidentiality\n"),
            Some("integrity")
        );
        assert_eq!(
            selected_lockdown("none integrity [confidentiality]"),
            Some("confidentiality")
        );
        assert_eq!(selected_lockdown(""), None);
    }

    #[test]
    fn a_memfd_holds_the_bytes_from_its_start() {
        use std::io::Read as _;
        let fd = memfd_with("slate-test", b"bzImage").unwrap();
        let mut text = String::new();
        File::from(fd).read_to_string(&mut text).unwrap();
        assert_eq!(text, "bzImage");
    }

    #[test]
    fn refusals_explain_themselves() {
        assert!(refusal_hint(Errno::EPERM).contains("lockdown"));
        assert!(refusal_hint(Errno::ENOSYS).contains("CONFIG_KEXEC_FILE"));
        assert_eq!(refusal_hint(Errno::EIO), "");
        let err = HostError::Kexec {
            op: "kexec_file_load",
            hint: refusal_hint(Errno::EKEYREJECTED),
            source: Errno::EKEYREJECTED,
        };
        assert_eq!(
            err.to_string(),
            "kexec_file_load failed: the kernel refused the image's signature"
        );
    }
}
