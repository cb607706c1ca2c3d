//! Tag numbers, as Talos assigns them (`Upgrade = iota + 6`).

/// Well-known tags. Any other byte value may be used by number.
pub mod tags {
    /// Previous boot label, stored by an upgrade; its presence means "not yet committed".
    pub const UPGRADE: u8 = 6;
    pub const STAGED_UPGRADE_IMAGE_REF: u8 = 7;
    /// JSON-serialized install options of a staged upgrade.
    pub const STAGED_UPGRADE_INSTALL_OPTIONS: u8 = 8;
    pub const STATE_ENCRYPTION_CONFIG: u8 = 9;
    pub const METAL_NETWORK_PLATFORM_CONFIG: u8 = 10;
    pub const DOWNLOAD_URL_CODE: u8 = 11;
    pub const USER_RESERVED_1: u8 = 12;
    pub const USER_RESERVED_2: u8 = 13;
    pub const USER_RESERVED_3: u8 = 14;
    pub const UUID_OVERRIDE: u8 = 15;
    pub const UNIQUE_MACHINE_TOKEN: u8 = 16;
    pub const DISK_IMAGE_BOOTLOADER: u8 = 17;
    /// slate's own: JSON `{"version", "reason"}` of the last boot that failed fatally, so the
    /// version the node returned to can say which one failed and why.
    pub const LAST_BOOT_FAILURE: u8 = 0x40;
    /// slate's own: the lowest version this node may ever be updated to (UAPI version order),
    /// whatever `--allow-downgrade` says; absent, a downgrade needs only that flag.
    pub const VERSION_FLOOR: u8 = 0x41;
    /// slate's own: JSON `{"from", "to", "reason", "time"}` of the last return to an older
    /// version (a revert, a boot-counting fallback, or `slate rollback`).
    pub const LAST_ROLLBACK: u8 = 0x42;
    /// slate's own: the versions pinned on the ESP, comma-separated (never pruned).
    pub const PINNED_VERSIONS: u8 = 0x43;
    /// slate's own: an upgrade by replacement waiting for its version's first boot: the
    /// version, a line feed, the machine configuration to restore (`replace.rs`).
    pub const REPLACE_ON_BOOT: u8 = 0x44;
}

const NAMES: &[(u8, &str)] = &[
    (tags::UPGRADE, "Upgrade"),
    (tags::STAGED_UPGRADE_IMAGE_REF, "StagedUpgradeImageRef"),
    (
        tags::STAGED_UPGRADE_INSTALL_OPTIONS,
        "StagedUpgradeInstallOptions",
    ),
    (tags::STATE_ENCRYPTION_CONFIG, "StateEncryptionConfig"),
    (
        tags::METAL_NETWORK_PLATFORM_CONFIG,
        "MetalNetworkPlatformConfig",
    ),
    (tags::DOWNLOAD_URL_CODE, "DownloadURLCode"),
    (tags::USER_RESERVED_1, "UserReserved1"),
    (tags::USER_RESERVED_2, "UserReserved2"),
    (tags::USER_RESERVED_3, "UserReserved3"),
    (tags::UUID_OVERRIDE, "UUIDOverride"),
    (tags::UNIQUE_MACHINE_TOKEN, "UniqueMachineToken"),
    (tags::DISK_IMAGE_BOOTLOADER, "DiskImageBootloader"),
    (tags::LAST_BOOT_FAILURE, "LastBootFailure"),
    (tags::VERSION_FLOOR, "VersionFloor"),
    (tags::LAST_ROLLBACK, "LastRollback"),
    (tags::PINNED_VERSIONS, "PinnedVersions"),
    (tags::REPLACE_ON_BOOT, "ReplaceOnBoot"),
];

/// The Talos name of a tag, if it has one.
pub fn tag_name(tag: u8) -> Option<&'static str> {
    NAMES.iter().find(|(t, _)| *t == tag).map(|(_, n)| *n)
}

/// A tag given by name (case-insensitive) or by number (decimal, `0x` hex, `0o` octal, `0b`
/// binary), as the command line and the kernel-argument payload accept them.
pub fn parse_tag(text: &str) -> Option<u8> {
    if let Some((tag, _)) = NAMES.iter().find(|(_, n)| n.eq_ignore_ascii_case(text)) {
        return Some(*tag);
    }
    parse_u8_like_go(text)
}

/// Go's `strconv.ParseUint(s, 0, 8)`: base from the prefix, `_` separators only with a prefix.
pub(crate) fn parse_u8_like_go(text: &str) -> Option<u8> {
    let lower = text.to_ascii_lowercase();
    let (digits, radix, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (rest, 16, true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (rest, 8, true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (rest, 2, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (&lower[1..], 8, true)
    } else {
        (lower.as_str(), 10, false)
    };
    let digits = if prefixed {
        if digits.starts_with('_') || digits.ends_with('_') || digits.contains("__") {
            return None;
        }
        digits.replace('_', "")
    } else {
        digits.to_string()
    };
    if digits.is_empty() || digits.starts_with('+') || digits.starts_with('-') {
        return None;
    }
    u8::from_str_radix(&digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_parse_by_name_and_number() {
        assert_eq!(parse_tag("upgrade"), Some(6));
        assert_eq!(parse_tag("StagedUpgradeImageRef"), Some(7));
        assert_eq!(parse_tag("0xa"), Some(10));
        assert_eq!(parse_tag("0XA"), Some(10));
        assert_eq!(parse_tag("012"), Some(10));
        assert_eq!(parse_tag("0b1010"), Some(10));
        assert_eq!(parse_tag("10"), Some(10));
        assert_eq!(parse_tag("256"), None);
        assert_eq!(parse_tag("-1"), None);
        assert_eq!(parse_tag(""), None);
        assert_eq!(parse_tag("1_0"), None);
        assert_eq!(tag_name(6), Some("Upgrade"));
        assert_eq!(parse_tag("versionfloor"), Some(tags::VERSION_FLOOR));
        assert_eq!(tag_name(0x41), Some("VersionFloor"));
        assert_eq!(tag_name(200), None);
    }
}
