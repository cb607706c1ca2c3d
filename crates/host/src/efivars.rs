//! The Boot Loader Interface's EFI variables, read through efivarfs.

use std::path::PathBuf;

use crate::{mount, MsFlags, Result};

pub use slate_bootspec::LOADER_GUID;
const EFIVARS: &str = "/sys/firmware/efi/efivars";

/// Mount efivarfs if the machine booted through UEFI and it is not mounted yet.
pub fn mount_efivarfs() -> Result<bool> {
    let dir = std::path::Path::new(EFIVARS);
    if !dir.exists() {
        return Ok(false);
    }
    if crate::is_mount_point(dir)? {
        return Ok(true);
    }
    mount(
        "efivarfs",
        dir,
        "efivarfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None,
    )?;
    Ok(true)
}

/// The file of a loader variable.
pub fn loader_var_path(name: &str) -> PathBuf {
    PathBuf::from(format!("{EFIVARS}/{name}-{LOADER_GUID}"))
}

/// A string loader variable such as `LoaderEntrySelected`, if set.
pub fn read_loader_string(name: &str) -> Option<String> {
    let bytes = std::fs::read(loader_var_path(name)).ok()?;
    slate_bootspec::decode_efivar_string(&bytes)
        .ok()
        .map(|(_, value)| value)
}

/// `EFI_GLOBAL_VARIABLE`: the vendor GUID of `SecureBoot`, `SetupMode`, `PK`, …
pub const EFI_GLOBAL_GUID: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// A one-byte global variable such as `SecureBoot` or `SetupMode`, if the firmware has it.
/// efivarfs files are the variable's 4-byte attributes, then its data.
pub fn read_global_u8(name: &str) -> Option<u8> {
    let bytes = std::fs::read(format!("{EFIVARS}/{name}-{EFI_GLOBAL_GUID}")).ok()?;
    match bytes.as_slice() {
        [_, _, _, _, value] => Some(*value),
        _ => None,
    }
}

/// `FS_IOC_GETFLAGS`/`FS_IOC_SETFLAGS` on an efivarfs file: the kernel marks every variable
/// immutable (`FS_IMMUTABLE_FL`), except a few it knows are safe, so that `rm -rf` over
/// efivarfs cannot brick a machine whose firmware dies without its variables.
mod attr {
    #![allow(unsafe_code)]

    use std::fs::File;
    use std::os::fd::AsRawFd as _;

    use nix::{ioctl_read, ioctl_write_ptr};

    /// `FS_IMMUTABLE_FL` of `<linux/fs.h>`.
    pub const IMMUTABLE: libc::c_long = 0x10;

    // The kernel reads and writes an `int` through these although their numbers say `long`;
    // a zeroed `long` holds it in its low half on little-endian machines, as chattr does it.
    ioctl_read!(get_flags, b'f', 1, libc::c_long);
    ioctl_write_ptr!(set_flags, b'f', 2, libc::c_long);

    pub fn get(file: &File) -> nix::Result<libc::c_long> {
        let mut flags: libc::c_long = 0;
        // SAFETY: `flags` is a live, exclusively borrowed integer the kernel writes; `file` is
        // an open efivarfs file.
        unsafe { get_flags(file.as_raw_fd(), &mut flags) }?;
        Ok(flags)
    }

    pub fn set(file: &File, flags: libc::c_long) -> nix::Result<()> {
        // SAFETY: the kernel only reads `flags`, a live integer; `file` is open.
        unsafe { set_flags(file.as_raw_fd(), &flags) }.map(drop)
    }
}

fn var_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> crate::HostError + '_ {
    move |source| crate::HostError::Write {
        path: path.to_owned(),
        source,
    }
}

/// Clears the immutable attribute of an existing variable file; returns whether it was set.
fn make_mutable(path: &std::path::Path) -> Result<bool> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(var_err(path)(e)),
    };
    let flags = attr::get(&file).map_err(|e| var_err(path)(e.into()))?;
    if flags & attr::IMMUTABLE == 0 {
        return Ok(false);
    }
    attr::set(&file, flags & !attr::IMMUTABLE).map_err(|e| var_err(path)(e.into()))?;
    Ok(true)
}

/// Writes `bytes` (attributes, then data) to the variable file at `path`, creating it: in one
/// write(2), as efivarfs requires (each write is one SetVariable() call), after clearing the
/// immutable attribute, which is set again afterwards if it was.
pub fn write_var_file(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let was_immutable = make_mutable(path)?;
    // No O_TRUNC: efivarfs replaces the variable on write and cannot truncate it.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
        .map_err(var_err(path))?;
    let written = file.write(bytes).map_err(var_err(path))?;
    if written != bytes.len() {
        return Err(var_err(path)(std::io::Error::other(format!(
            "a short write ({written} of {} bytes)",
            bytes.len()
        ))));
    }
    if was_immutable {
        let flags = attr::get(&file).map_err(|e| var_err(path)(e.into()))?;
        attr::set(&file, flags | attr::IMMUTABLE).map_err(|e| var_err(path)(e.into()))?;
    }
    Ok(())
}

/// Deletes the variable file at `path` (absent: nothing to do), clearing its immutable
/// attribute first.
pub fn remove_var_file(path: &std::path::Path) -> Result<()> {
    make_mutable(path)?;
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(var_err(path)(e)),
    }
}

/// Sets the string loader variable `name` (`LoaderEntryOneShot`, `LoaderEntryDefault`) in the
/// firmware, as systemd writes it: attributes 0x07, UTF-16LE text with its NUL.
pub fn write_loader_string(name: &str, value: &str) -> Result<()> {
    write_var_file(
        &loader_var_path(name),
        &slate_bootspec::encode_efivar_string(value),
    )
}

/// Deletes the loader variable `name` from the firmware (absent: nothing to do).
pub fn remove_loader_var(name: &str) -> Result<()> {
    remove_var_file(&loader_var_path(name))
}

/// The efivarfs file of a global variable (`Boot0001`, `BootOrder`).
pub fn global_var_path(name: &str) -> PathBuf {
    PathBuf::from(format!("{EFIVARS}/{name}-{EFI_GLOBAL_GUID}"))
}

/// The names of the firmware's global variables (`Boot0001`, `BootOrder`, …): efivarfs'
/// `<name>-<GUID>` files of `EFI_GLOBAL_VARIABLE`.
pub fn global_var_names() -> Result<Vec<String>> {
    let dir = std::path::Path::new(EFIVARS);
    let read_err = |source| crate::HostError::Read {
        path: dir.to_owned(),
        source,
    };
    let suffix = format!("-{EFI_GLOBAL_GUID}");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let name = entry.map_err(read_err)?.file_name();
        if let Some(name) = name.to_str().and_then(|n| n.strip_suffix(&suffix)) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// A global variable's efivarfs file (attributes, then data); `None` when absent. A variable
/// file is small (the firmware's store is a few hundred KiB), and efivarfs is no FIFO.
pub fn read_global(name: &str) -> Result<Option<Vec<u8>>> {
    let path = global_var_path(name);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(crate::HostError::Read { path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off efivarfs (a tmpfs or ext4 file) the attribute ioctls may be unsupported; what can
    /// be checked here is the single write of the encoded bytes and the removal. The VM
    /// scenario `upgrade_commit_and_revert` writes a real variable through OVMF.
    #[test]
    fn writes_the_encoded_variable_in_one_piece_and_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("LoaderEntryOneShot-x");
        let bytes = slate_bootspec::encode_efivar_string("slate-1.0.0.efi");
        write_var_file(&path, &bytes).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        remove_var_file(&path).unwrap();
        assert!(!path.exists());
        remove_var_file(&path).unwrap();
    }
}
