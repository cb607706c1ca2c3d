//! What a node's early boot sets up on its disk, shared by the two ways a slate image boots:
//! machined as PID 1 (slate's own OS, as Boot tasks) and slate's initramfs init before it
//! executes systemd (a systemd image, `[os] init = "systemd"`).
//!
//! - [`volumes`]: the data partitions found by GPT label, formatted when blank (a journaled
//!   ext4), checked with `e2fsck -p` when their superblock says so, mounted;
//! - [`etc`]: `/etc` as an overlay whose upper on STATE belongs to one version, reset (machine
//!   ID and listed files kept) when another version boots;
//! - [`hooks`]: the setup hooks run after such a reset, the image's and the user's;
//! - [`var_record`]: what init did with /var on a systemd image, for machined's status;
//! - [`var_crypt`]: a `tpm2` /var — LUKS2 with its key sealed to the TPM, set up at the first
//!   boot, opened unattended at every later one, erased by a reset.
//!
//! An edge crate: it mounts, formats and runs programs. The decisions are plain functions over
//! directories (tested on temporary ones) and values.

pub mod etc;
pub mod hooks;
pub mod var_crypt;
pub mod var_record;
pub mod volumes;

pub use etc::{EtcError, ETC, SETUP_HOOKS_DIR, USER_SETUP_HOOKS_DIR};
