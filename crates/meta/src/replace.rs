//! META `ReplaceOnBoot`: an upgrade by replacement waiting for its version's first boot, with
//! the machine configuration to restore once STATE and EPHEMERAL are formatted afresh
//! (docs/formats.md §3, slate's own tags). Pure: bytes in, record out.
//!
//! The configuration travels in META because META is the one place that survives the wipe
//! and is written atomically (two copies); the boot that acts on the record deletes it only
//! after the configuration is back on the new STATE, so a power cut anywhere in between
//! repeats the wipe and the restore rather than leaving a node without its configuration.

use crate::pins::check_version;

/// The largest configuration document a replacement carries. Machine configurations are a few
/// KiB (certificates, keys, a handful of /etc files); META holds 256 KiB for every record.
pub const MAX_REPLACE_CONFIG: usize = 64 * 1024;

/// A replacement waiting for the first boot of `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaceOnBoot {
    /// The version whose first boot formats the data partitions.
    pub version: String,
    /// The machine configuration document to store on the new STATE, as it was stored;
    /// empty when the node had none (it then comes up in maintenance mode).
    pub config: String,
}

/// Why a `ReplaceOnBoot` value (or one about to be written) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplaceError {
    #[error("ReplaceOnBoot is not UTF-8")]
    NotUtf8,
    #[error("ReplaceOnBoot has no version line")]
    NoVersion,
    #[error("ReplaceOnBoot names {0:?}, which is not a version: 1 to 64 of 0-9 A-Z a-z . ~ ^ _ -")]
    BadVersion(String),
    #[error(
        "the machine configuration is {0} bytes: a replacement carries at most \
         {MAX_REPLACE_CONFIG}"
    )]
    ConfigTooLarge(usize),
}

impl ReplaceOnBoot {
    /// A record for `version` carrying `config`, checked as [`parse_replace`] checks it.
    pub fn new(version: &str, config: &str) -> Result<Self, ReplaceError> {
        check_version(version).map_err(|_| ReplaceError::BadVersion(version.to_owned()))?;
        if config.len() > MAX_REPLACE_CONFIG {
            return Err(ReplaceError::ConfigTooLarge(config.len()));
        }
        Ok(ReplaceOnBoot {
            version: version.to_owned(),
            config: config.to_owned(),
        })
    }

    /// The value: the version, a line feed, then the configuration document verbatim.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut value = Vec::with_capacity(self.version.len() + 1 + self.config.len());
        value.extend_from_slice(self.version.as_bytes());
        value.push(b'\n');
        value.extend_from_slice(self.config.as_bytes());
        value
    }
}

/// The record a `ReplaceOnBoot` value holds.
pub fn parse_replace(value: &[u8]) -> Result<ReplaceOnBoot, ReplaceError> {
    let text = std::str::from_utf8(value).map_err(|_| ReplaceError::NotUtf8)?;
    let (version, config) = text.split_once('\n').ok_or(ReplaceError::NoVersion)?;
    ReplaceOnBoot::new(version, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_byte_for_byte() {
        let config = "version = 1\n[node]\nname = \"n1\"\n";
        let record = ReplaceOnBoot::new("2.0.0", config).unwrap();
        let bytes = record.to_bytes();
        assert_eq!(bytes, b"2.0.0\nversion = 1\n[node]\nname = \"n1\"\n");
        assert_eq!(parse_replace(&bytes).unwrap(), record);
        // A node without a configuration replaces into maintenance mode.
        let bare = parse_replace(b"3.1.0~rc1\n").unwrap();
        assert_eq!(
            (bare.version.as_str(), bare.config.as_str()),
            ("3.1.0~rc1", "")
        );
    }

    #[test]
    fn bad_values_are_refused_with_what_is_wrong() {
        assert_eq!(parse_replace(b"2.0.0"), Err(ReplaceError::NoVersion));
        assert_eq!(parse_replace(b""), Err(ReplaceError::NoVersion));
        assert_eq!(parse_replace(b"\xff\n"), Err(ReplaceError::NotUtf8));
        for bad in ["\nconfig", "2.0.0 \n", "2,0\n", "../x\n"] {
            assert!(
                matches!(
                    parse_replace(bad.as_bytes()),
                    Err(ReplaceError::BadVersion(_))
                ),
                "{bad:?}"
            );
        }
        let huge = format!("2.0.0\n{}", "#".repeat(MAX_REPLACE_CONFIG + 1));
        assert_eq!(
            parse_replace(huge.as_bytes()),
            Err(ReplaceError::ConfigTooLarge(MAX_REPLACE_CONFIG + 1))
        );
        let most = format!("2.0.0\n{}", "#".repeat(MAX_REPLACE_CONFIG));
        assert!(parse_replace(most.as_bytes()).is_ok());
    }
}
