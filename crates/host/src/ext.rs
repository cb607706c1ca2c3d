//! ext4 data partitions (STATE, EPHEMERAL): made with a journal by e2fsprogs' mke2fs, checked
//! with `e2fsck -p` before every mount, an old journal-less one given a journal.

use std::path::Path;
use std::process::Command;

use crate::{filesystem_signature, run_command, HostError, Result};

/// Make a journaled ext4 filesystem labelled `label` with e2fsprogs' mke2fs (`-t ext4 -j`:
/// the features of `/etc/mke2fs.conf`'s ext4 type, metadata checksums included, which need
/// the kernel's crc32c). The journal is what lets the kernel and `e2fsck -p` bring the
/// filesystem back consistent after a power cut; busybox's mke2fs makes ext2 without one,
/// so the image ships the real mke2fs (docs/node.md, "Volumes").
pub fn format_ext(device: &Path, label: &str) -> Result<()> {
    run_command(
        Command::new("mke2fs")
            .args(["-q", "-F", "-t", "ext4", "-j", "-L", label])
            .arg(device),
    )
    .map(drop)
}

/// What `e2fsck -p` found on a filesystem it could leave consistent (exit codes 0, 1 and 2 of
/// e2fsck(8); 4 and above are [`check_ext`]'s error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsckOutcome {
    /// Exit 0: nothing needed fixing (a journal replay alone can still end here).
    pub clean: bool,
    /// Exit 2: errors were corrected and e2fsck advises a reboot (meant for a mounted root;
    /// slate checks only unmounted filesystems, so it is reported, not acted on).
    pub reboot_advised: bool,
    /// What e2fsck printed, stdout and stderr as they came.
    pub output: String,
}

impl FsckOutcome {
    /// `clean` or `errors corrected`, then what e2fsck printed (its first four lines, joined
    /// with ` | `): `clean: EPHEMERAL: recovering journal | EPHEMERAL: clean, 11/8192 files, …`.
    pub fn summary(&self) -> String {
        let lines: Vec<&str> = self
            .output
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let mut first = lines
            .iter()
            .take(4)
            .copied()
            .collect::<Vec<_>>()
            .join(" | ");
        if lines.len() > 4 {
            first.push_str(&format!(" | … ({} lines)", lines.len()));
        }
        let verdict = match (self.clean, self.reboot_advised) {
            (true, _) => "clean",
            (false, false) => "errors corrected",
            (false, true) => "errors corrected (e2fsck advises a reboot)",
        };
        if first.is_empty() {
            verdict.to_owned()
        } else {
            format!("{verdict}: {first}")
        }
    }

    /// Whether e2fsck replayed the journal (the filesystem was not unmounted cleanly).
    pub fn journal_recovered(&self) -> bool {
        self.output.contains("recovering journal")
    }
}

/// The longest a check may run before it is killed: a filesystem of many millions of inodes
/// takes minutes; an hour means something is wrong with the disk.
const FSCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// What e2fsck's exit code `code` (4 or more) says, bit by bit (e2fsck(8)).
fn fsck_failure(code: i32) -> String {
    let bits = [
        (4, "errors left uncorrected"),
        (8, "operational error"),
        (16, "usage or syntax error"),
        (32, "cancelled"),
        (128, "shared-library error"),
    ];
    let what: Vec<&str> = bits
        .iter()
        .filter(|(bit, _)| code & bit != 0)
        .map(|(_, what)| *what)
        .collect();
    format!("exit code {code}: {}", what.join(", "))
}

/// Check the unmounted ext2/3/4 filesystem on `device` with `e2fsck -p` (preen: replay the
/// journal, fix what is safe to fix without a human). Exit 0 → clean, 1 or 2 → corrected;
/// anything else (errors left uncorrected, an operational error, a signal) is an error that
/// carries e2fsck's output.
pub fn check_ext(device: &Path) -> Result<FsckOutcome> {
    let mut output = String::new();
    let end = crate::run_command_logged(
        Command::new("e2fsck").arg("-p").arg(device),
        FSCK_TIMEOUT,
        &|| false,
        &mut |line| {
            output.push_str(line);
            output.push('\n');
        },
    )?;
    let failed = |status: String, output: String| HostError::CommandFailed {
        program: format!("e2fsck -p {}", device.display()),
        status,
        output: output.trim().to_owned(),
    };
    let status = match end {
        crate::CommandEnd::Exited(status) => status,
        crate::CommandEnd::TimedOut => {
            return Err(failed(format!("killed after {FSCK_TIMEOUT:?}"), output))
        }
        crate::CommandEnd::Cancelled => return Err(failed("cancelled".into(), output)),
    };
    match status.code() {
        Some(0) => Ok(FsckOutcome {
            clean: true,
            reboot_advised: false,
            output,
        }),
        Some(code @ (1 | 2)) => Ok(FsckOutcome {
            clean: false,
            reboot_advised: code == 2,
            output,
        }),
        Some(code) => Err(failed(fsck_failure(code), output)),
        None => Err(failed(status.to_string(), output)),
    }
}

/// `s_feature_compat`'s `has_journal` bit, in the ext superblock (at 1024 of the device).
const EXT_COMPAT_OFFSET: usize = 1024 + 0x5C;
const EXT_COMPAT_HAS_JOURNAL: u32 = 0x4;

/// Whether the ext2/3/4 filesystem at the head of `head` has a journal; `None` if `head` is
/// not one.
pub fn ext_has_journal(head: &[u8]) -> Option<bool> {
    if filesystem_signature(head) != Some("ext2/3/4") {
        return None;
    }
    let compat = head.get(EXT_COMPAT_OFFSET..EXT_COMPAT_OFFSET + 4)?;
    let compat = u32::from_le_bytes(compat.try_into().ok()?);
    Some(compat & EXT_COMPAT_HAS_JOURNAL != 0)
}

/// [`ext_has_journal`] of the filesystem on `device`.
pub fn device_ext_has_journal(device: &Path) -> Result<Option<bool>> {
    Ok(ext_has_journal(&crate::block::read_head(device, 2048)?))
}

/// Why `e2fsck -p` would do more than say "clean" about a filesystem, read from its
/// superblock (`None`: nothing to do, the check can be skipped). These are e2fsck's own reasons
/// not to skip a check (its `check_if_skip`), save its comparison with the backup superblock,
/// plus two of slate's: a superblock whose checksum does not match, and orphans left to
/// release. The layout is docs/formats.md, "ext4 superblock".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckDue {
    /// The head is not an ext2/3/4 filesystem (e2fsck will say what it is not).
    NotExt,
    /// `metadata_csum` is on and the superblock's CRC32C does not match its bytes.
    BadChecksum,
    /// `s_state` has the error bit: the kernel met an inconsistency.
    Errors,
    /// `s_state` lacks the valid bit: not cleanly unmounted (a journal-less filesystem).
    NotClean,
    /// `needs_recovery`: the journal holds transactions to replay (a power cut while mounted).
    JournalReplay,
    /// `s_last_orphan` or `orphan_present`: inodes deleted while open, to release.
    Orphans,
    /// Mounted `count` times, the limit is `max`.
    MountCount { count: u16, max: u16 },
    /// The last check is `since` seconds ago; the interval is `interval`.
    Interval { since: u64, interval: u32 },
    /// The last check is in the future (a clock that was, or is, wrong).
    LastCheckInFuture,
}

impl std::fmt::Display for CheckDue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotExt => f.write_str("not an ext2/3/4 superblock"),
            Self::BadChecksum => f.write_str("the superblock's checksum does not match"),
            Self::Errors => f.write_str("the filesystem is marked with errors"),
            Self::NotClean => f.write_str("not cleanly unmounted"),
            Self::JournalReplay => f.write_str("its journal needs replaying"),
            Self::Orphans => f.write_str("orphan inodes to release"),
            Self::MountCount { count, max } => write!(f, "mounted {count} times (limit {max})"),
            Self::Interval { since, interval } => {
                write!(f, "last checked {since} s ago (interval {interval} s)")
            }
            Self::LastCheckInFuture => f.write_str("its last check is in the future"),
        }
    }
}

/// Superblock fields, as offsets into the device's head (the superblock is at 1024).
mod sb {
    pub const START: usize = 1024;
    pub const LEN: usize = 1024;
    pub const MNT_COUNT: usize = START + 0x34;
    pub const MAX_MNT_COUNT: usize = START + 0x36;
    pub const STATE: usize = START + 0x3A;
    pub const LASTCHECK: usize = START + 0x40;
    pub const CHECKINTERVAL: usize = START + 0x44;
    pub const FEATURE_INCOMPAT: usize = START + 0x60;
    pub const FEATURE_RO_COMPAT: usize = START + 0x64;
    pub const LAST_ORPHAN: usize = START + 0xE8;
    pub const LASTCHECK_HI: usize = START + 0x277;
    pub const CHECKSUM: usize = START + 0x3FC;

    pub const STATE_VALID: u16 = 0x1;
    pub const STATE_ERROR: u16 = 0x2;
    pub const INCOMPAT_RECOVER: u32 = 0x4;
    pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
    pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;
}

/// e2fsck's allowance for a clock a little behind the last check (its `accept_time_fudge`).
const TIME_FUDGE_SECS: u64 = 86_400;

/// [`CheckDue`] for the filesystem whose first 2 KiB are `head`, at `now` (Unix seconds).
pub fn ext_check_due(head: &[u8], now: u64) -> Option<CheckDue> {
    if filesystem_signature(head) != Some("ext2/3/4") || head.len() < sb::START + sb::LEN {
        return Some(CheckDue::NotExt);
    }
    let u16_at = |at: usize| u16::from_le_bytes([head[at], head[at + 1]]);
    let u32_at =
        |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let ro_compat = u32_at(sb::FEATURE_RO_COMPAT);
    if ro_compat & sb::RO_COMPAT_METADATA_CSUM != 0 {
        // The kernel's crc32c_le(~0, …) without the final inversion CRC-32C applies.
        let crc = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI).checksum(&head[sb::START..sb::CHECKSUM]);
        if !crc != u32_at(sb::CHECKSUM) {
            return Some(CheckDue::BadChecksum);
        }
    }
    let state = u16_at(sb::STATE);
    if state & sb::STATE_ERROR != 0 {
        return Some(CheckDue::Errors);
    }
    if state & sb::STATE_VALID == 0 {
        return Some(CheckDue::NotClean);
    }
    if u32_at(sb::FEATURE_INCOMPAT) & sb::INCOMPAT_RECOVER != 0 {
        return Some(CheckDue::JournalReplay);
    }
    if u32_at(sb::LAST_ORPHAN) != 0 || ro_compat & sb::RO_COMPAT_ORPHAN_PRESENT != 0 {
        return Some(CheckDue::Orphans);
    }
    let (count, max) = (u16_at(sb::MNT_COUNT), u16_at(sb::MAX_MNT_COUNT) as i16);
    if max > 0 && count >= max as u16 {
        return Some(CheckDue::MountCount {
            count,
            max: max as u16,
        });
    }
    let lastcheck = u64::from(u32_at(sb::LASTCHECK)) | u64::from(head[sb::LASTCHECK_HI]) << 32;
    if lastcheck > now.saturating_add(TIME_FUDGE_SECS) {
        return Some(CheckDue::LastCheckInFuture);
    }
    let interval = u32_at(sb::CHECKINTERVAL);
    let since = now.saturating_sub(lastcheck);
    if interval > 0 && since >= u64::from(interval) {
        return Some(CheckDue::Interval { since, interval });
    }
    None
}

/// [`ext_check_due`] of the filesystem on `device`, now.
pub fn device_ext_check_due(device: &Path) -> Result<Option<CheckDue>> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(ext_check_due(&crate::block::read_head(device, 2048)?, now))
}

/// Add a journal to the unmounted, checked ext2 filesystem on `device` (`tune2fs -j`: what
/// turns ext2 into ext3; the kernel's ext4 driver mounts both).
pub fn add_ext_journal(device: &Path) -> Result<()> {
    run_command(Command::new("tune2fs").arg("-j").arg(device)).map(drop)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::PathBuf;

    use super::*;
    use crate::is_blank;

    #[test]
    fn formats_and_recognizes_a_real_ext_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("state.img");
        fs::File::create(&img).unwrap().set_len(8 << 20).unwrap();
        assert!(is_blank(&img).unwrap());
        if !slate_testkit::require_tool("mke2fs") {
            return;
        }
        format_ext(&img, "STATE").unwrap();
        assert!(!is_blank(&img).unwrap());
    }

    fn image(dir: &Path, len: u64) -> PathBuf {
        let img = dir.join("volume.img");
        fs::File::create(&img).unwrap().set_len(len).unwrap();
        img
    }

    /// e2fsprogs' mke2fs, e2fsck, tune2fs and debugfs (one package, e2fsprogs).
    fn have_e2fsprogs() -> bool {
        ["mke2fs", "e2fsck", "tune2fs", "debugfs"]
            .iter()
            .all(|tool| slate_testkit::require_tool(tool))
    }

    #[test]
    fn formats_a_journaled_ext4_that_checks_clean() {
        if !have_e2fsprogs() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path(), 32 << 20);
        format_ext(&img, "EPHEMERAL").unwrap();
        assert_eq!(device_ext_has_journal(&img).unwrap(), Some(true));
        let features = run_command(Command::new("debugfs").args(["-R", "features"]).arg(&img))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap();
        for feature in ["has_journal", "extent", "metadata_csum"] {
            assert!(features.contains(feature), "{feature} in {features}");
        }
        let outcome = check_ext(&img).unwrap();
        assert!(outcome.clean, "{outcome:?}");
        assert!(
            outcome.summary().starts_with("clean: EPHEMERAL: clean, "),
            "{outcome:?}"
        );
        assert!(!outcome.journal_recovered());
    }

    /// A harmless inconsistency (a wrong free-blocks count in the superblock and group
    /// descriptors): `e2fsck -p` fixes it by itself, exit 1.
    #[test]
    fn e2fsck_preen_corrects_a_harmless_inconsistency() {
        if !have_e2fsprogs() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path(), 32 << 20);
        format_ext(&img, "STATE").unwrap();
        run_command(
            Command::new("debugfs")
                .args(["-w", "-R", "set_bg 0 free_blocks_count 7"])
                .arg(&img),
        )
        .unwrap();
        run_command(
            Command::new("debugfs")
                .args(["-w", "-R", "ssv state 0"])
                .arg(&img),
        )
        .unwrap();
        let outcome = check_ext(&img).unwrap();
        assert!(!outcome.clean, "{outcome:?}");
        assert!(!outcome.reboot_advised, "{outcome:?}");
        let summary = outcome.summary();
        assert!(summary.starts_with("errors corrected: "), "{summary}");
        // Fixed for good: the next check is clean.
        assert!(check_ext(&img).unwrap().clean);
    }

    fn debugfs_write(img: &Path, request: &str) {
        run_command(Command::new("debugfs").args(["-w", "-R", request]).arg(img)).unwrap();
    }

    fn head(img: &Path) -> Vec<u8> {
        crate::block::read_head(img, 2048).unwrap()
    }

    /// A real mke2fs filesystem (metadata checksums on) is clean by its superblock; each
    /// reason e2fsck -p would not skip, made with debugfs (which keeps the checksum right),
    /// is named; a byte changed behind debugfs's back fails the checksum.
    #[test]
    fn the_superblock_says_when_a_check_is_due() {
        if !have_e2fsprogs() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path(), 32 << 20);
        format_ext(&img, "STATE").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(ext_check_due(&head(&img), now), None);
        assert_eq!(device_ext_check_due(&img).unwrap(), None);
        assert!(check_ext(&img).unwrap().clean, "e2fsck agrees");

        debugfs_write(&img, "ssv mnt_count 20");
        debugfs_write(&img, "ssv max_mnt_count 20");
        assert_eq!(
            ext_check_due(&head(&img), now),
            Some(CheckDue::MountCount { count: 20, max: 20 })
        );
        debugfs_write(&img, "ssv max_mnt_count -1");
        assert_eq!(ext_check_due(&head(&img), now), None);

        debugfs_write(&img, "ssv checkinterval 3600");
        let due = ext_check_due(&head(&img), now + 7200).unwrap();
        assert!(
            matches!(due, CheckDue::Interval { interval: 3600, .. }),
            "{due}"
        );
        assert_eq!(ext_check_due(&head(&img), now), None);
        assert_eq!(
            ext_check_due(&head(&img), now - 3 * TIME_FUDGE_SECS),
            Some(CheckDue::LastCheckInFuture)
        );
        debugfs_write(&img, "ssv checkinterval 0");

        debugfs_write(&img, "feature needs_recovery");
        assert_eq!(
            ext_check_due(&head(&img), now),
            Some(CheckDue::JournalReplay)
        );
        debugfs_write(&img, "feature ^needs_recovery");
        debugfs_write(&img, "ssv last_orphan 12");
        assert_eq!(ext_check_due(&head(&img), now), Some(CheckDue::Orphans));
        debugfs_write(&img, "ssv last_orphan 0");
        debugfs_write(&img, "ssv state 3");
        assert_eq!(ext_check_due(&head(&img), now), Some(CheckDue::Errors));
        debugfs_write(&img, "ssv state 0");
        assert_eq!(ext_check_due(&head(&img), now), Some(CheckDue::NotClean));
        debugfs_write(&img, "ssv state 1");
        assert_eq!(ext_check_due(&head(&img), now), None);

        // The volume name (s_volume_name, 0x78), rewritten without the checksum.
        let mut bytes = fs::read(&img).unwrap();
        bytes[1024 + 0x78] ^= 0x20;
        assert_eq!(
            ext_check_due(&bytes[..2048], now),
            Some(CheckDue::BadChecksum)
        );
        assert_eq!(ext_check_due(&bytes[..1500], now), Some(CheckDue::NotExt));
        assert_eq!(ext_check_due(&[0; 2048], now), Some(CheckDue::NotExt));
        assert_eq!(
            CheckDue::MountCount { count: 20, max: 20 }.to_string(),
            "mounted 20 times (limit 20)"
        );
    }

    #[test]
    fn e2fsck_refuses_what_is_not_an_ext_filesystem() {
        if !have_e2fsprogs() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path(), 8 << 20);
        let garbage: Vec<u8> = (0..8u32 << 20)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        fs::write(&img, garbage).unwrap();
        let err = check_ext(&img).unwrap_err().to_string();
        assert!(err.contains("e2fsck -p"), "{err}");
        assert!(err.contains("exit code 8: operational error"), "{err}");
        assert_eq!(device_ext_has_journal(&img).unwrap(), None);
    }

    /// A filesystem made by an older slate (busybox: ext2, no journal) is checked and gets
    /// a journal.
    #[test]
    fn adds_a_journal_to_an_ext2_filesystem() {
        if !have_e2fsprogs() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let img = image(dir.path(), 16 << 20);
        run_command(
            Command::new("mke2fs")
                .args(["-q", "-F", "-t", "ext2"])
                .arg(&img),
        )
        .unwrap();
        assert_eq!(device_ext_has_journal(&img).unwrap(), Some(false));
        assert!(check_ext(&img).unwrap().clean);
        add_ext_journal(&img).unwrap();
        assert_eq!(device_ext_has_journal(&img).unwrap(), Some(true));
        assert!(check_ext(&img).unwrap().clean);
    }

    #[test]
    fn reads_the_journal_flag_and_names_fsck_exit_codes() {
        let mut head = vec![0u8; 2048];
        assert_eq!(ext_has_journal(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xEF;
        assert_eq!(ext_has_journal(&head), Some(false));
        head[EXT_COMPAT_OFFSET] = 0x3c;
        assert_eq!(ext_has_journal(&head), Some(true));
        assert_eq!(fsck_failure(4), "exit code 4: errors left uncorrected");
        assert_eq!(
            fsck_failure(12),
            "exit code 12: errors left uncorrected, operational error"
        );
        let corrected = FsckOutcome {
            clean: false,
            reboot_advised: true,
            output: "a\n\nb\nc\nd\ne\n".into(),
        };
        assert_eq!(
            corrected.summary(),
            "errors corrected (e2fsck advises a reboot): a | b | c | d | … (5 lines)"
        );
        let replayed = FsckOutcome {
            clean: true,
            reboot_advised: false,
            output: "V: recovering journal\nV: clean, 11/8192 files\n".into(),
        };
        assert!(replayed.journal_recovered());
        assert_eq!(
            replayed.summary(),
            "clean: V: recovering journal | V: clean, 11/8192 files"
        );
        let silent = FsckOutcome {
            output: String::new(),
            ..replayed
        };
        assert_eq!(silent.summary(), "clean");
    }
}
