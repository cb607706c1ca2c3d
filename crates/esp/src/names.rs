//! Boot Loader Specification names and `loader.conf` (docs/formats.md §2).

use crate::EspError;

/// Longest file name the Boot Loader Specification (and FAT's long names) allow.
pub const MAX_FILE_NAME: usize = 255;

/// Characters the Boot Loader Specification allows in entry file names.
fn is_bls_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '_' | '.')
}

fn invalid(name: &str, reason: impl Into<String>) -> EspError {
    EspError::InvalidFileName {
        name: name.to_string(),
        reason: reason.into(),
    }
}

/// The file name of a UKI in `EFI/Linux/`: `<name>-<version>[+<tries>].efi`.
///
/// `name` and `version` may use ASCII letters, digits, `-`, `_` and `.`, but not `+`: systemd-boot
/// reads a boot counter after the *last* `+` of the name, so a `+` in a version (`1.0+3`) would
/// be taken for a counter. `tries` is the boot-counting budget (`+3` = three attempts before the
/// entry is marked bad); `Some(0)` would write an entry already bad and is refused.
pub fn uki_file_name(name: &str, version: &str, tries: Option<u32>) -> Result<String, EspError> {
    for (what, part) in [("name", name), ("version", version)] {
        if part.is_empty() {
            return Err(invalid(part, format!("the {what} is empty")));
        }
        if let Some(c) = part.chars().find(|&c| !is_bls_char(c) || c == '+') {
            return Err(invalid(
                part,
                format!(
                    "the {what} contains {c:?}; only ASCII letters, digits, '-', '_' and '.' are \
                     allowed ('+' starts a boot counter)"
                ),
            ));
        }
    }
    let file = match tries {
        Some(0) => {
            return Err(invalid(
                &format!("{name}-{version}+0.efi"),
                "a boot counter of 0 tries marks the entry bad from the start",
            ))
        }
        Some(tries) => format!("{name}-{version}+{tries}.efi"),
        None => format!("{name}-{version}.efi"),
    };
    validate_uki_file_name(&file)?;
    Ok(file)
}

/// Checks a UKI file name against the Boot Loader Specification rules that systemd-boot
/// applies to `EFI/Linux/*.efi`: 1-255 ASCII letters, digits, `+ - _ .`; ending in `.efi`; not
/// starting with `.` or `auto-` (systemd-boot skips those).
pub fn validate_uki_file_name(file: &str) -> Result<(), EspError> {
    if file.is_empty() || file.len() > MAX_FILE_NAME {
        return Err(invalid(
            file,
            format!("must be 1 to {MAX_FILE_NAME} characters"),
        ));
    }
    if let Some(c) = file.chars().find(|&c| !is_bls_char(c)) {
        return Err(invalid(
            file,
            format!(
                "contains {c:?}; only ASCII letters, digits, '+', '-', '_' and '.' are allowed"
            ),
        ));
    }
    let lower = file.to_ascii_lowercase();
    if lower.starts_with('.') || lower.starts_with("auto-") {
        return Err(invalid(
            file,
            "systemd-boot skips names starting with '.' or 'auto-'",
        ));
    }
    if !lower.ends_with(".efi") || lower.len() == ".efi".len() {
        return Err(invalid(
            file,
            "a UKI's name must end in .efi after a non-empty stem",
        ));
    }
    Ok(())
}

/// The content of `loader/loader.conf`.
///
/// - `timeout <seconds>`: a finite number, so an unattended machine always boots on its own
///   (`menu-force`, which waits for a key, is deliberately not offered); 0 boots at once and
///   shows the menu only on a key press.
/// - `default <pattern>`: a glob over entry IDs (lower-cased file names), e.g. `slate-*`;
///   systemd-boot picks the first match in its menu order, which puts the highest version first
///   and entries out of tries last, so the newest not-bad slate boots.
/// - `editor no`: nobody at the console can edit the kernel command line (e.g. `init=/bin/sh`);
///   the command line is the one signed into the UKI.
pub fn loader_conf(default_pattern: &str, timeout_secs: u32) -> Result<String, EspError> {
    let allowed = |c: char| is_bls_char(c) || matches!(c, '*' | '?' | '[' | ']' | '!' | '@');
    let ok = !default_pattern.is_empty() && default_pattern.chars().all(allowed);
    if !ok {
        return Err(EspError::InvalidLoaderDefault {
            pattern: default_pattern.to_string(),
        });
    }
    Ok(format!(
        "timeout {timeout_secs}\ndefault {default_pattern}\neditor no\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uki_names() {
        assert_eq!(
            uki_file_name("slate", "1.0.0", Some(3)).unwrap(),
            "slate-1.0.0+3.efi"
        );
        assert_eq!(
            uki_file_name("slate", "1.0.0-rc1", None).unwrap(),
            "slate-1.0.0-rc1.efi"
        );
        assert_eq!(
            uki_file_name("slate_x", "2", Some(10)).unwrap(),
            "slate_x-2+10.efi"
        );
        for (name, version, tries) in [
            ("slate", "1.0+3", None),
            ("sla te", "1", None),
            ("slaté", "1", None),
            ("slate", "1/2", None),
            ("", "1", None),
            ("slate", "", None),
            ("slate", "1", Some(0)),
            (".slate", "1", None),
            ("auto-slate", "1", None),
            ("AUTO-x", "1", Some(1)),
        ] {
            let err = uki_file_name(name, version, tries).unwrap_err();
            assert!(matches!(err, EspError::InvalidFileName { .. }), "{err}");
        }
        let long = "v".repeat(250);
        assert!(uki_file_name("slate", &long, None).is_err());
    }

    #[test]
    fn file_name_rules() {
        assert!(validate_uki_file_name("slate-1.0.0+3-0.efi").is_ok());
        assert!(validate_uki_file_name("Slate-1.EFI").is_ok());
        assert!(validate_uki_file_name(".efi").is_err());
        assert!(validate_uki_file_name("slate-1.conf").is_err());
        assert!(validate_uki_file_name("slate 1.efi").is_err());
        let err = validate_uki_file_name("a\nb.efi").unwrap_err().to_string();
        assert!(err.contains("'\\n'"), "{err}");
    }

    #[test]
    fn loader_conf_is_finite_and_plain() {
        assert_eq!(
            loader_conf("slate-*", 3).unwrap(),
            "timeout 3\ndefault slate-*\neditor no\n"
        );
        assert!(loader_conf("slate-*\ntimeout menu-force", 3).is_err());
        assert!(loader_conf("slate *", 3).is_err());
        assert!(loader_conf("", 3).is_err());
        assert!(loader_conf("@saved", 0).is_ok());
    }
}
