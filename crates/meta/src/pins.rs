//! META `PinnedVersions`: the versions kept on the ESP whatever pruning says
//! (docs/formats.md §3, slate's own tags). Pure: bytes in, versions out.

/// At most this many versions may be pinned: each pin holds a whole UKI on a small ESP.
pub const MAX_PINNED: usize = 8;
/// The longest version a pin may name.
pub const MAX_PINNED_VERSION_LEN: usize = 64;

/// Why a `PinnedVersions` value or a version to pin is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    #[error("PinnedVersions is not UTF-8")]
    NotUtf8,
    #[error("{0:?} is not a version that can be pinned: 1 to 64 of 0-9 A-Z a-z . ~ ^ _ -")]
    BadVersion(String),
    #[error("{0} versions are pinned already: at most {MAX_PINNED}")]
    TooMany(usize),
}

/// The version text a pin may hold (what profiles allow in a version, and no `,`).
pub fn check_version(version: &str) -> Result<(), PinError> {
    let ok = !version.is_empty()
        && version.len() <= MAX_PINNED_VERSION_LEN
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".~^_-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(PinError::BadVersion(version.to_owned()))
    }
}

/// The pinned versions a `PinnedVersions` value holds, in their stored order. An empty value
/// pins nothing.
pub fn parse_pinned(value: &[u8]) -> Result<Vec<String>, PinError> {
    let text = std::str::from_utf8(value).map_err(|_| PinError::NotUtf8)?;
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let versions: Vec<String> = text.split(',').map(str::to_owned).collect();
    for version in &versions {
        check_version(version)?;
    }
    if versions.len() > MAX_PINNED {
        return Err(PinError::TooMany(versions.len()));
    }
    Ok(versions)
}

/// The value for `versions`.
pub fn format_pinned(versions: &[String]) -> Vec<u8> {
    versions.join(",").into_bytes()
}

/// `versions` with `version` added (kept once, at the end); `Ok(false)` when it was already
/// pinned.
pub fn pin(versions: &mut Vec<String>, version: &str) -> Result<bool, PinError> {
    check_version(version)?;
    if versions.iter().any(|v| v == version) {
        return Ok(false);
    }
    if versions.len() >= MAX_PINNED {
        return Err(PinError::TooMany(versions.len()));
    }
    versions.push(version.to_owned());
    Ok(true)
}

/// `versions` without `version`; `false` when it was not pinned.
pub fn unpin(versions: &mut Vec<String>, version: &str) -> bool {
    let before = versions.len();
    versions.retain(|v| v != version);
    versions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_bad_ones_are_refused() {
        assert_eq!(parse_pinned(b"").unwrap(), Vec::<String>::new());
        let pins = parse_pinned(b"1.0.0,2.1.0~rc1").unwrap();
        assert_eq!(pins, ["1.0.0", "2.1.0~rc1"]);
        assert_eq!(format_pinned(&pins), b"1.0.0,2.1.0~rc1");
        for bad in [&b"1.0.0,"[..], b",1", b"1.0 0", b"\xff", b"a/b"] {
            assert!(parse_pinned(bad).is_err(), "{bad:?}");
        }
        let nine = ["1"; 9].join(",");
        assert_eq!(parse_pinned(nine.as_bytes()), Err(PinError::TooMany(9)));
        assert!(check_version(&"9".repeat(65)).is_err());
    }

    #[test]
    fn pinning_is_idempotent_and_bounded() {
        let mut pins = Vec::new();
        assert_eq!(pin(&mut pins, "1.0.0"), Ok(true));
        assert_eq!(pin(&mut pins, "1.0.0"), Ok(false));
        assert_eq!(pins, ["1.0.0"]);
        assert!(pin(&mut pins, "1,2").is_err());
        for v in 2..=8 {
            pin(&mut pins, &v.to_string()).unwrap();
        }
        assert_eq!(pin(&mut pins, "9"), Err(PinError::TooMany(8)));
        assert!(unpin(&mut pins, "1.0.0"));
        assert!(!unpin(&mut pins, "1.0.0"));
        assert_eq!(pins.len(), 7);
    }
}
