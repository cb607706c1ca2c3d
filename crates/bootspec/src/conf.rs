//! `loader.conf` and the `.osrel` fields systemd-boot reads, through one line reader that
//! follows systemd-boot's `line_get_key_value()`.

use crate::error::LoaderConfError;

/// One non-empty, non-comment line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line<'a> {
    /// 1-based, counting `\n`.
    pub(crate) number: usize,
    pub(crate) key: &'a str,
    /// `None`: no separator after the key (systemd-boot skips such lines).
    pub(crate) value: Option<&'a str>,
}

/// Splits text the way systemd-boot does: lines end at `\n` or `\r`; spaces and tabs around a
/// line are dropped; blank lines and lines starting with `#` are skipped; the key runs up to
/// the first separator, the value starts after the run of separators; a value enclosed in
/// matching `"` or `'` is unquoted. Reading stops at a NUL byte, as in C.
///
/// One deliberate difference: current systemd-boot misreads an *empty* value at the end of a
/// line (`ID=`) as the text of the following line (its unquote step runs past the line's NUL);
/// here it is empty. slate never writes empty values.
pub(crate) fn lines<'a>(
    text: &'a str,
    separators: &'a [char],
) -> impl Iterator<Item = Line<'a>> + 'a {
    let text = text.split('\0').next().unwrap_or("");
    let mut number = 1;
    text.split_inclusive(['\n', '\r']).filter_map(move |raw| {
        let this = number;
        if raw.ends_with('\n') {
            number += 1;
        }
        let line = raw.trim_end_matches(['\n', '\r']).trim_matches([' ', '\t']);
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let Some(split) = line.find(separators) else {
            return Some(Line {
                number: this,
                key: line,
                value: None,
            });
        };
        let value = line[split..].trim_start_matches(separators);
        Some(Line {
            number: this,
            key: &line[..split],
            value: Some(unquote(value)),
        })
    })
}

fn unquote(value: &str) -> &str {
    match value.chars().next() {
        Some(q @ ('"' | '\'')) if value.ends_with(q) => value.get(1..value.len() - 1).unwrap_or(""),
        _ => value,
    }
}

/// The `timeout` setting of `loader.conf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timeout {
    /// Seconds to show the menu. `0` behaves as `menu-hidden`; `4294967295` is systemd-boot's
    /// internal value for `menu-force`.
    Seconds(u32),
    /// Always show the menu, no timeout.
    MenuForce,
    /// Boot the default at once; the menu appears on a key press.
    MenuHidden,
    /// No menu at all (not known to systemd-boot 252, which ignores the line).
    MenuDisabled,
}

impl Timeout {
    fn parse(value: &str) -> Option<Timeout> {
        match value {
            "menu-force" => Some(Timeout::MenuForce),
            "menu-hidden" => Some(Timeout::MenuHidden),
            "menu-disabled" => Some(Timeout::MenuDisabled),
            digits if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                let trimmed = digits.trim_start_matches('0');
                if trimmed.len() > 10 {
                    return None;
                }
                u32::try_from(trimmed.parse::<u64>().unwrap_or(0))
                    .ok()
                    .map(Timeout::Seconds)
            }
            _ => None,
        }
    }
}

/// What slate needs from `$ESP/loader/loader.conf`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoaderConf {
    /// `default`: an entry-ID glob, or `@saved` (any case). Kept as written; matching
    /// lower-cases it.
    pub default: Option<String>,
    pub timeout: Option<Timeout>,
    /// Every other `key value` line, in file order (e.g. `editor no`), including keys
    /// systemd-boot does not know.
    pub other: Vec<(String, String)>,
}

/// Parses `loader.conf` text. Keys are case-sensitive, as in systemd-boot; a repeated
/// `default` or `timeout` takes its last value.
pub fn parse_loader_conf(text: &str) -> Result<LoaderConf, LoaderConfError> {
    if let Some(nul) = text.find('\0') {
        let line = text[..nul].matches('\n').count() + 1;
        return Err(LoaderConfError::Nul { line });
    }
    let mut conf = LoaderConf::default();
    for line in lines(text, &[' ', '\t']) {
        let Some(value) = line.value else {
            return Err(LoaderConfError::MissingValue {
                line: line.number,
                key: line.key.to_owned(),
            });
        };
        match line.key {
            "timeout" => {
                let timeout = Timeout::parse(value).ok_or(LoaderConfError::InvalidTimeout {
                    line: line.number,
                    value: value.to_owned(),
                })?;
                conf.timeout = Some(timeout);
            }
            "default" => {
                if value.starts_with('@') && !value.eq_ignore_ascii_case("@saved") {
                    return Err(LoaderConfError::UnsupportedDefault {
                        line: line.number,
                        value: value.to_owned(),
                    });
                }
                conf.default = Some(value.to_owned());
            }
            key => conf.other.push((key.to_owned(), value.to_owned())),
        }
    }
    Ok(conf)
}

/// The os-release fields systemd-boot reads from a UKI's `.osrel` section.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OsRelease {
    pub pretty_name: Option<String>,
    pub image_id: Option<String>,
    pub name: Option<String>,
    pub id: Option<String>,
    pub image_version: Option<String>,
    pub version: Option<String>,
    pub version_id: Option<String>,
    pub build_id: Option<String>,
}

/// What systemd-boot keeps of a UTF-8 string: characters outside the Basic Multilingual Plane
/// are dropped by its UTF-8 → UCS-2 conversion.
pub(crate) fn ucs2_lossy(s: &str) -> String {
    s.chars().filter(|c| u32::from(*c) <= 0xFFFF).collect()
}

impl OsRelease {
    /// Reads `KEY=value` lines as systemd-boot does (no shell unescaping; a later line wins;
    /// `KEY = value` with spaces is a different key).
    pub fn parse(text: &str) -> OsRelease {
        let mut os = OsRelease::default();
        for line in lines(text, &['=']) {
            let Some(value) = line.value else { continue };
            let slot = match line.key {
                "PRETTY_NAME" => &mut os.pretty_name,
                "IMAGE_ID" => &mut os.image_id,
                "NAME" => &mut os.name,
                "ID" => &mut os.id,
                "IMAGE_VERSION" => &mut os.image_version,
                "VERSION" => &mut os.version,
                "VERSION_ID" => &mut os.version_id,
                "BUILD_ID" => &mut os.build_id,
                _ => continue,
            };
            *slot = Some(ucs2_lossy(value));
        }
        os
    }

    /// Menu title: `PRETTY_NAME ?: IMAGE_ID ?: NAME ?: ID`. `None` means systemd-boot skips the UKI.
    pub fn title(&self) -> Option<&str> {
        [&self.pretty_name, &self.image_id, &self.name, &self.id]
            .into_iter()
            .find_map(|v| v.as_deref())
    }

    /// `IMAGE_VERSION ?: VERSION ?: VERSION_ID ?: BUILD_ID`.
    pub fn entry_version(&self) -> Option<&str> {
        [
            &self.image_version,
            &self.version,
            &self.version_id,
            &self.build_id,
        ]
        .into_iter()
        .find_map(|v| v.as_deref())
    }

    /// `IMAGE_ID ?: ID`: a UKI with either always sorts "new style".
    pub fn sort_key(&self) -> Option<&str> {
        self.image_id.as_deref().or(self.id.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(text: &str, seps: &[char]) -> Vec<(usize, String, Option<String>)> {
        lines(text, seps)
            .map(|l| (l.number, l.key.to_owned(), l.value.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn line_reader() {
        let got = kv(
            " title  \t Slate OS \r\n# c\n\n  \nlonely\ndefault \"x y\"\n",
            &[' ', '\t'],
        );
        assert_eq!(
            got,
            vec![
                (1, "title".into(), Some("Slate OS".into())),
                (5, "lonely".into(), None),
                (6, "default".into(), Some("x y".into())),
            ]
        );
        assert_eq!(kv("ID='a'\nX==b\nY=\"\nZ=", &['=']).len(), 4);
        assert_eq!(kv("ID='a'", &['='])[0].2.as_deref(), Some("a"));
        assert_eq!(kv("X==b", &['='])[0].2.as_deref(), Some("b"));
        assert_eq!(kv("Y=\"", &['='])[0].2.as_deref(), Some(""));
        assert_eq!(kv("ID=a\0VERSION=1", &['=']).len(), 1);
    }

    #[test]
    fn timeouts() {
        assert_eq!(Timeout::parse("0"), Some(Timeout::Seconds(0)));
        assert_eq!(
            Timeout::parse("0004294967295"),
            Some(Timeout::Seconds(u32::MAX))
        );
        assert_eq!(Timeout::parse("4294967296"), None);
        assert_eq!(Timeout::parse("99999999999999999999999"), None);
        assert_eq!(Timeout::parse("5s"), None);
        assert_eq!(Timeout::parse("-1"), None);
        assert_eq!(Timeout::parse("Menu-Force"), None);
    }
}
