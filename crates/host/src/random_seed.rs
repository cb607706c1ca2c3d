//! The kernel's random pool across reboots: a seed saved on persistent storage is credited at
//! the next boot, as systemd-random-seed does.
//!
//! Why: a node without a CPU random instruction the kernel trusts (QEMU's default CPU under TCG,
//! some ARM boards) has no initialized CRNG early in the boot, and the first `getrandom` blocks
//! until the kernel's jitter fallback has made enough entropy. machined's API start (TLS keys)
//! waited 1.07 s for it on a second boot (issue 17's boot breakdown: "random: crng init done"
//! printed just before "API listening").
//!
//! The seed is used once: it is removed (and the removal made durable) before it is credited, so
//! a crash can never credit the same bytes twice; a fresh seed is written only from the
//! initialized CRNG (`/dev/random` blocks until then), in place under the same name.

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{HostError, Result};

/// Bytes in a saved seed: 4096 bits, the size of the kernel's input pool on older kernels and
/// what systemd saves.
pub const RANDOM_SEED_LEN: usize = 512;

/// `RNDADDENTROPY`, `_IOW('R', 0x03, int[2])` from `<linux/random.h>` (neither `libc` nor `nix`
/// names it).
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;

/// `struct rand_pool_info` with its flexible array sized for one seed.
#[repr(C)]
struct RandPoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; RANDOM_SEED_LEN],
}

/// What [`consume_random_seed`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedOutcome {
    /// Credited to the kernel (bytes, bits credited).
    Credited { bytes: usize, bits: usize },
    /// No seed saved (a first boot, or the last one ended before its seed was written).
    Missing,
    /// A file that is not a seed slate wrote (too short, or readable by others): removed,
    /// mixed in without credit.
    Uncredited { bytes: usize, why: &'static str },
}

/// Reads the seed at `path`, removes it durably, then adds it to the kernel's pool, credited
/// when it looks like one slate wrote (a regular file of [`RANDOM_SEED_LEN`] bytes, mode 0600).
pub fn consume_random_seed(path: &Path) -> Result<SeedOutcome> {
    let io = |op: &'static str| {
        move |source| HostError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(SeedOutcome::Missing),
        Err(err) => return Err(io("opening the random seed")(err)),
    };
    let meta = file.metadata().map_err(io("reading the random seed"))?;
    let mut seed = Vec::with_capacity(RANDOM_SEED_LEN);
    Read::by_ref(&mut file)
        .take(RANDOM_SEED_LEN as u64)
        .read_to_end(&mut seed)
        .map_err(io("reading the random seed"))?;
    drop(file);
    fs::remove_file(path).map_err(io("removing the used random seed"))?;
    sync_parent(path)?;
    use std::os::unix::fs::PermissionsExt;
    let why = if !meta.is_file() {
        Some("not a regular file")
    } else if seed.len() < RANDOM_SEED_LEN {
        Some("shorter than a seed")
    } else if meta.permissions().mode() & 0o077 != 0 {
        Some("readable by others than root")
    } else {
        None
    };
    let bits = if why.is_none() { 8 * seed.len() } else { 0 };
    add_entropy(&seed, bits)?;
    Ok(match why {
        None => SeedOutcome::Credited {
            bytes: seed.len(),
            bits,
        },
        Some(why) => SeedOutcome::Uncredited {
            bytes: seed.len(),
            why,
        },
    })
}

/// Writes a fresh seed to `path` (mode 0600, fsync), read from `/dev/random`: it blocks until
/// the kernel's CRNG is initialized, so what is saved is never weaker than the kernel's own
/// output.
///
/// Straight into `path`, not a temp file renamed over it: the used seed is already gone (its
/// removal was synced before the credit), so a crash part-way leaves no file or a short one,
/// which the next boot mixes in uncredited, never a seed used twice. On ext4 the file's fsync
/// commits the journal transaction that holds its directory entry too; the rename and the
/// directory's fsync were a second commit on STATE in every boot.
pub fn save_random_seed(path: &Path) -> Result<()> {
    let mut seed = [0u8; RANDOM_SEED_LEN];
    let random = Path::new("/dev/random");
    File::open(random)
        .and_then(|mut f| f.read_exact(&mut seed))
        .map_err(|source| HostError::Io {
            op: "reading /dev/random",
            path: random.to_path_buf(),
            source,
        })?;
    let io = |op: &'static str| {
        move |source| HostError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io("creating the random seed"))?;
    // A file left there by someone else keeps its mode through O_CREAT.
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(io("making the random seed private"))?;
    file.write_all(&seed)
        .and_then(|()| file.sync_all())
        .map_err(io("writing the random seed"))
}

fn sync_parent(path: &Path) -> Result<()> {
    let parent = path.parent().unwrap_or(Path::new("/"));
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| HostError::Io {
            op: "syncing the directory of the random seed",
            path: parent.to_path_buf(),
            source,
        })
}

/// Mixes `bytes` (at most [`RANDOM_SEED_LEN`]) into the kernel's pool, crediting `bits`.
fn add_entropy(bytes: &[u8], bits: usize) -> Result<()> {
    #![allow(unsafe_code)]
    let urandom = Path::new("/dev/urandom");
    let io = |source| HostError::Io {
        op: "adding entropy (RNDADDENTROPY)",
        path: urandom.to_path_buf(),
        source,
    };
    let len = bytes.len().min(RANDOM_SEED_LEN);
    let mut info = RandPoolInfo {
        entropy_count: libc::c_int::try_from(bits.min(8 * len)).unwrap_or(libc::c_int::MAX),
        buf_size: libc::c_int::try_from(len).unwrap_or(0),
        buf: [0; RANDOM_SEED_LEN],
    };
    info.buf[..len].copy_from_slice(&bytes[..len]);
    let file = OpenOptions::new().write(true).open(urandom).map_err(io)?;
    // SAFETY: `file` is an open descriptor for the duration of the call; `info` is a live
    // `#[repr(C)]` `struct rand_pool_info` whose `buf_size` never exceeds its buffer, which is
    // all the kernel reads (RNDADDENTROPY copies `buf_size` bytes after the two ints).
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), RNDADDENTROPY as _, &info) };
    if ret < 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // /proc/self belongs to the process's effective user.
        std::os::unix::fs::MetadataExt::uid(&fs::metadata("/proc/self").unwrap()) == 0
    }

    /// Crediting needs CAP_SYS_ADMIN: CI runs as root; elsewhere the test stops here unless
    /// CI=true says it must not.
    fn root_or_skip() -> bool {
        if is_root() {
            return true;
        }
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: the random-seed tests need root (RNDADDENTROPY)"
        );
        false
    }

    #[test]
    fn a_saved_seed_is_credited_once_and_removed_first() {
        if !root_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("random-seed");
        assert_eq!(consume_random_seed(&path).unwrap(), SeedOutcome::Missing);
        save_random_seed(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.len(), RANDOM_SEED_LEN as u64);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(!path.with_extension("new").exists());
        let first = fs::read(&path).unwrap();
        assert_eq!(
            consume_random_seed(&path).unwrap(),
            SeedOutcome::Credited {
                bytes: 512,
                bits: 4096
            }
        );
        assert!(!path.exists(), "a used seed is gone before the next boot");
        assert_eq!(consume_random_seed(&path).unwrap(), SeedOutcome::Missing);
        save_random_seed(&path).unwrap();
        assert_ne!(fs::read(&path).unwrap(), first, "each seed is new");
    }

    #[test]
    fn a_seed_is_saved_in_place_private_and_new() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("random-seed");
        // Someone else's readable file of another length under the name.
        fs::write(&path, b"not a seed").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        save_random_seed(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), RANDOM_SEED_LEN as u64);
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let first = fs::read(&path).unwrap();
        save_random_seed(&path).unwrap();
        assert_ne!(fs::read(&path).unwrap(), first, "each seed is new");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temp file beside the seed");
    }

    #[test]
    fn a_seed_slate_did_not_write_is_mixed_in_without_credit() {
        if !root_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("random-seed");
        fs::write(&path, b"short").unwrap();
        assert_eq!(
            consume_random_seed(&path).unwrap(),
            SeedOutcome::Uncredited {
                bytes: 5,
                why: "shorter than a seed"
            }
        );
        assert!(!path.exists());
        fs::write(&path, [7u8; RANDOM_SEED_LEN]).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            consume_random_seed(&path).unwrap(),
            SeedOutcome::Uncredited {
                bytes: 512,
                why: "readable by others than root"
            }
        );
    }
}
