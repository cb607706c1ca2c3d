//! The initramfs' `extensions/manifest` (docs/formats.md §6.4): which system extension images
//! init layers over the root, topmost first, each with its name, version, size and SHA-256. The
//! imager writes it from the extensions' signed manifests (checked at build time); init checks
//! every image against it before layering; `slate bundle diff` reads the names and versions.

use std::fmt::Write as _;

/// The first line the imager writes (a comment: the format's name and fields).
pub const EXTENSIONS_MANIFEST_HEADER: &str =
    "# slate extensions 1: file name version size digest, topmost first";

/// One extension of an image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExtensionEntry {
    /// The image's file name in `extensions/`.
    pub file: String,
    pub name: String,
    pub version: String,
    pub size: u64,
    /// `sha256:` + 64 lower-case hex.
    pub digest: String,
}

/// The manifest's text for `entries` (topmost first).
pub fn render_extensions_manifest(entries: &[ExtensionEntry]) -> String {
    let mut text = format!("{EXTENSIONS_MANIFEST_HEADER}\n");
    for e in entries {
        let _ = writeln!(
            text,
            "{} {} {} {} {}",
            e.file, e.name, e.version, e.size, e.digest
        );
    }
    text
}

fn token_ok(token: &str, extra: &[u8]) -> bool {
    !token.is_empty()
        && token.len() <= 128
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

/// Parse the manifest: one extension per line, five fields separated by single spaces; blank
/// lines and `#` comments skipped. A file or name listed twice, a file that is not a plain
/// `.sqsh` name, a size that is not decimal or a digest that is not canonical is refused,
/// naming the line.
pub fn parse_extensions_manifest(text: &str) -> Result<Vec<ExtensionEntry>, String> {
    let mut entries: Vec<ExtensionEntry> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(' ').collect();
        let [file, name, version, size, digest] = fields[..] else {
            return Err(format!(
                "line {n}: {} fields, expected 5 (file name version size digest)",
                fields.len()
            ));
        };
        if !token_ok(file, b"._-") || !file.ends_with(".sqsh") || file.starts_with('.') {
            return Err(format!(
                "line {n}: {file:?} is not a .sqsh file name in the extensions directory"
            ));
        }
        if !token_ok(name, b"_-") || name.len() > 64 {
            return Err(format!("line {n}: {name:?} is not an extension name"));
        }
        if !token_ok(version, b".~^_+-") || version.len() > 64 {
            return Err(format!("line {n}: {version:?} is not an extension version"));
        }
        let size_ok =
            size.bytes().all(|b| b.is_ascii_digit()) && !(size.len() > 1 && size.starts_with('0'));
        let size: u64 = match size.parse() {
            Ok(s) if size_ok => s,
            _ => return Err(format!("line {n}: size {size:?} is not a decimal number")),
        };
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "line {n}: digest {digest:?} is not sha256: and 64 lower-case hex digits"
            ));
        }
        if let Some(prev) = entries.iter().find(|e| e.file == file || e.name == name) {
            return Err(format!(
                "line {n}: {file} ({name}) repeats the file or name of {} ({})",
                prev.file, prev.name
            ));
        }
        entries.push(ExtensionEntry {
            file: file.to_owned(),
            name: name.to_owned(),
            version: version.to_owned(),
            size,
            digest: digest.to_owned(),
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:5d3c4a0eb7f2ee57ad8b61b6d6ca8b7e5ab7f0bde3a73a2e6b4ab3e2c0d2a9a1";

    fn entry(file: &str, name: &str) -> ExtensionEntry {
        ExtensionEntry {
            file: file.into(),
            name: name.into(),
            version: "1.6.20-1".into(),
            size: 42,
            digest: D.into(),
        }
    }

    #[test]
    fn render_and_parse_round_trip() {
        let entries = vec![
            entry("containerd.sqsh", "containerd"),
            entry("debug.sqsh", "debug"),
        ];
        let text = render_extensions_manifest(&entries);
        assert_eq!(
            text,
            format!(
                "{EXTENSIONS_MANIFEST_HEADER}\ncontainerd.sqsh containerd 1.6.20-1 42 {D}\n\
                 debug.sqsh debug 1.6.20-1 42 {D}\n"
            )
        );
        assert_eq!(parse_extensions_manifest(&text).unwrap(), entries);
        assert_eq!(parse_extensions_manifest("\n# only\n").unwrap(), []);
    }

    #[test]
    fn bad_lines_are_refused_naming_the_line() {
        let cases = [
            ("a.sqsh", "line 1: 1 fields"),
            (&format!("a.sqsh a 1 2 {D} x"), "6 fields"),
            (&format!("../a.sqsh a 1 2 {D}"), "not a .sqsh file name"),
            (&format!("manifest a 1 2 {D}"), "not a .sqsh file name"),
            (&format!(".sqsh a 1 2 {D}"), "not a .sqsh file name"),
            (&format!("a.sqsh a/b 1 2 {D}"), "not an extension name"),
            (&format!("a.sqsh a 1:2 2 {D}"), "not an extension version"),
            (&format!("a.sqsh a 1 02 {D}"), "not a decimal number"),
            (&format!("a.sqsh a 1 -2 {D}"), "not a decimal number"),
            ("a.sqsh a 1 2 sha256:00", "not sha256:"),
            (&format!("a.sqsh a 1 2 {}", D.to_uppercase()), "not sha256:"),
            (
                &format!("a.sqsh a 1 2 {D}\nb.sqsh a 1 2 {D}"),
                "line 2: b.sqsh (a) repeats",
            ),
            (
                &format!("a.sqsh a 1 2 {D}\na.sqsh b 1 2 {D}"),
                "line 2: a.sqsh (b) repeats",
            ),
            (&format!("a.sqsh  a 1 2 {D}"), "6 fields"),
        ];
        for (text, expected) in cases {
            let err = parse_extensions_manifest(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }
}
