//! Merging SBAT (Secure Boot Advanced Targeting) metadata the way ukify does.

use crate::error::UkiError;

/// The mandatory first line of every `.sbat` section.
pub const SBAT_HEADER_LINE: &str =
    "sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md";

/// The line ukify adds for the UKI itself, so a broken UKI build can be revoked on its own.
pub const UKI_SBAT_LINE: &str =
    "uki,1,UKI,uki,1,https://uapi-group.org/specifications/specs/unified_kernel_image/";

/// Combine existing `.sbat` contents (stub first, then kernel) with caller-supplied lines.
///
/// Each source's own header line is dropped and one header is written first, because shim
/// requires exactly one, at the top. Sources that are not UTF-8 or do not start with the
/// header are skipped, as ukify does. Exact duplicate lines are kept once. The result ends in
/// `"\n\0"` like ukify's, since shim parses up to the NUL.
pub(crate) fn merge(sources: &[&[u8]], extra: &str) -> Result<Vec<u8>, UkiError> {
    let mut lines: Vec<String> = Vec::new();
    let mut push = |line: &str| {
        if !lines.iter().any(|l| l == line) {
            lines.push(line.to_owned());
        }
    };
    for source in sources {
        let trimmed = trim_trailing_nuls(source);
        let Ok(text) = std::str::from_utf8(trimmed) else {
            continue;
        };
        let mut source_lines = text.lines().map(|l| l.trim_end_matches('\r'));
        if !source_lines.next().is_some_and(|l| l.starts_with("sbat,")) {
            continue;
        }
        source_lines.filter(|l| !l.is_empty()).for_each(&mut push);
    }
    for line in extra.lines().map(|l| l.trim_end_matches('\r')) {
        if line.is_empty() || line.starts_with("sbat,") {
            continue;
        }
        validate_line(line)?;
        push(line);
    }

    let mut out = String::from(SBAT_HEADER_LINE);
    out.push('\n');
    for line in &lines {
        out.push_str(line);
        out.push('\n');
    }
    out.push('\0');
    Ok(out.into_bytes())
}

fn trim_trailing_nuls(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &bytes[..end]
}

/// shim parses SBAT as plain comma-separated fields without quoting, so a line with the
/// wrong number of fields or a non-numeric generation would be misread or rejected at boot;
/// catch it at build time instead.
fn validate_line(line: &str) -> Result<(), UkiError> {
    let invalid = |reason| UkiError::InvalidSbat {
        line: line.to_owned(),
        reason,
    };
    if line.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    let fields: Vec<&str> = line.split(',').collect();
    if fields.len() != 6 {
        return Err(invalid(
            "expected 6 fields: component,generation,vendor,package,version,url",
        ));
    }
    if fields[0].is_empty() {
        return Err(invalid("empty component name"));
    }
    if fields[1].parse::<u32>().is_err() {
        return Err(invalid("generation is not a number"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const STUB: &[u8] =
        b"sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
        systemd,1,The systemd Developers,systemd,252,https://systemd.io/\n\0\0\0";

    #[test]
    fn merges_stub_kernel_and_extra_with_one_header() {
        let kernel =
            b"sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
            linux,1,The Linux Developers,linux,6.1,https://linux.org\n";
        let merged = merge(&[STUB, kernel], UKI_SBAT_LINE).unwrap();
        let expected = format!(
            "{SBAT_HEADER_LINE}\nsystemd,1,The systemd Developers,systemd,252,https://systemd.io/\n\
             linux,1,The Linux Developers,linux,6.1,https://linux.org\n{UKI_SBAT_LINE}\n\0"
        );
        assert_eq!(String::from_utf8(merged).unwrap(), expected);
    }

    #[test]
    fn invalid_sources_are_skipped_and_duplicates_dropped() {
        let merged = merge(&[STUB, b"garbage\n", &[0xFF, 0xFE], STUB], "").unwrap();
        let text = String::from_utf8(merged).unwrap();
        assert_eq!(text.matches("systemd,1,").count(), 1);
        assert_eq!(text.lines().filter(|l| l.starts_with("sbat,")).count(), 1);
        assert!(text.ends_with("\n\0"));
    }

    #[test]
    fn malformed_extra_lines_are_errors() {
        for bad in [
            "uki,1,UKI",
            "uki,x,UKI,uki,1,url",
            ",1,a,b,c,d",
            "a,1,b,c,d,e,f",
        ] {
            assert!(
                matches!(merge(&[], bad), Err(UkiError::InvalidSbat { .. })),
                "{bad:?}"
            );
        }
        // A header line in the extra text is tolerated and dropped.
        let merged = merge(&[], &format!("{SBAT_HEADER_LINE}\n{UKI_SBAT_LINE}\n")).unwrap();
        assert_eq!(
            merged,
            format!("{SBAT_HEADER_LINE}\n{UKI_SBAT_LINE}\n\0").into_bytes()
        );
    }
}
