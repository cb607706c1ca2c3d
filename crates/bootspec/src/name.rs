//! Boot-loader-entry file names with boot counters (`<stem>+LEFT[-DONE].<conf|efi>`), and the
//! renames systemd-boot and systemd-bless-boot perform on them (docs/formats.md §2).

use std::ops::RangeInclusive;

use crate::error::NameError;

/// Longest BLS file name, in characters (all of them ASCII, so also bytes).
pub const MAX_NAME_LEN: usize = 255;

/// Largest counter value current systemd-boot accepts (`INT_MAX`); a name with a larger counter
/// is treated as uncounted. (systemd-boot 252 parsed counters up to `u64::MAX`.)
pub const MAX_TRIES: u32 = i32::MAX as u32;

/// The boot-counting tries slate gives a version it installs (`+N` of a new entry, GRUB's
/// attempts alike), wherever the number comes from: image profile, `slate installer upgrade
/// --tries`, `slate upgrade --tries`, the node API's upgrade request, a bundle's install
/// settings. [`check_install_tries`] is the one check.
///
/// Why 1 to 15, far below [`MAX_TRIES`]: 0 writes an entry that is bad before it ever boots,
/// and a counter above `INT_MAX` reads as *uncounted*, so that version would never be rolled
/// back. Between the two, every failed try is a whole boot attempt — up to an hour of watchdog
/// plus an hour of health checks with the largest node settings — so 15 tries already keep a
/// broken version in place for most of a day before the fallback boots; more buys nothing an
/// unattended node wants.
pub const INSTALL_TRIES: RangeInclusive<u32> = 1..=15;

/// The tries a new version gets when nobody says otherwise.
pub const DEFAULT_INSTALL_TRIES: u32 = 3;

/// A boot-counting tries value outside [`INSTALL_TRIES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{tries} boot-counting tries is not {min} to {max} (0 marks the version bad before it boots; \
     a counter too large is read as uncounted and never rolled back)",
    min = INSTALL_TRIES.start(),
    max = INSTALL_TRIES.end()
)]
pub struct InstallTriesError {
    pub tries: u32,
}

/// `tries` when it is within [`INSTALL_TRIES`].
pub fn check_install_tries(tries: u32) -> Result<u32, InstallTriesError> {
    if INSTALL_TRIES.contains(&tries) {
        Ok(tries)
    } else {
        Err(InstallTriesError { tries })
    }
}

/// Which kind of entry a file name denotes, by its suffix (matched case-insensitively).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// Type #1: `/loader/entries/*.conf`.
    Type1Conf,
    /// Type #2: a UKI in `/EFI/Linux/*.efi`.
    Type2Efi,
}

impl EntryKind {
    /// The suffix as systemd-boot spells it when it renames a file.
    pub fn suffix(self) -> &'static str {
        match self {
            EntryKind::Type1Conf => ".conf",
            EntryKind::Type2Efi => ".efi",
        }
    }
}

/// The two counters of a counted entry. A missing `-DONE` part reads as `tries_done == 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BootCounter {
    pub tries_left: u32,
    pub tries_done: u32,
}

/// Boot-assessment state of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BootState {
    /// No counter: blessed, or never subject to boot counting.
    Good,
    /// Counted with tries left: not yet assessed.
    Indeterminate,
    /// Counted with no tries left: sorted last, never auto-selected unless nothing else exists.
    Bad,
}

/// How systemd-boot derives an entry ID (the string in `LoaderEntry*` variables) from a file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdStyle {
    /// systemd-boot ≤ 258, incl. Debian 12's 252: the whole file name, lower-cased, counter
    /// included (`Slate-1.2+2-1.efi` → `slate-1.2+2-1.efi`), so the ID changes on every boot
    /// attempt.
    Sd252,
    /// Since systemd PR #38897 (Sep 2025): the counter is stripped (`slate-1.2.efi`), as
    /// `bootctl` always did.
    Current,
}

/// A validated BLS entry file name, with its boot counter (if any) parsed.
///
/// The original spelling is kept: [`EntryName::file_name`] returns exactly what was parsed, so
/// zero-padded counters (`+03-00`, the newest spec text) survive a round trip.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryName {
    name: String,
    kind: EntryKind,
    /// Bytes before the counter's `+`, or before the suffix when there is no counter.
    stem_len: usize,
    counter: Option<BootCounter>,
}

fn check_chars(s: &str) -> Result<(), NameError> {
    match s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '_' | '.')))
    {
        Some((offset, ch)) => Err(NameError::BadChar { ch, offset }),
        None => Ok(()),
    }
}

/// Parses a run of decimal digits (at least one) at the start of `s`, as systemd-boot's
/// `parse_number16()` does, with the `INT_MAX` cap. Returns the value and the rest.
fn counter_number(s: &str) -> Option<(u32, &str)> {
    let len = s.bytes().take_while(u8::is_ascii_digit).count();
    if len == 0 {
        return None;
    }
    let value = s.as_bytes()[..len].iter().fold(0u64, |v, d| {
        v.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    });
    let value = u32::try_from(value).ok().filter(|v| *v <= MAX_TRIES)?;
    Some((value, &s[len..]))
}

/// Finds the boot counter the way current systemd-boot does: after the last `+`, digits,
/// optionally `-` and digits, and then nothing but the suffix. Returns the `+`'s offset.
fn find_counter(name: &str, suffix_len: usize) -> Option<(usize, BootCounter)> {
    let plus = name.rfind('+')?;
    let (tries_left, rest) = counter_number(&name[plus + 1..])?;
    let (tries_done, rest) = match rest.strip_prefix('-') {
        Some(done) => counter_number(done)?,
        None => (0, rest),
    };
    (rest.len() == suffix_len).then_some((
        plus,
        BootCounter {
            tries_left,
            tries_done,
        },
    ))
}

impl EntryName {
    /// Parses and validates a file name (no directory part).
    ///
    /// Accepted: 1-255 characters from `A-Z a-z 0-9 + - _ .`; not starting with `.` or `auto-`
    /// (systemd-boot skips those); ending in `.conf` or `.efi` in any case; a non-empty stem. The
    /// counter is taken from after the last `+` if digits (`-digits`) lead exactly to the suffix;
    /// padded digits are accepted. Anything else (e.g. `a+3x.efi`, `a+3-1-2.efi`) is an uncounted
    /// name whose stem contains the `+`, exactly as systemd-boot reads it.
    pub fn parse(file_name: &str) -> Result<EntryName, NameError> {
        if file_name.is_empty() {
            return Err(NameError::Empty);
        }
        if file_name.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong {
                len: file_name.len(),
            });
        }
        check_chars(file_name)?;
        if file_name.starts_with('.') {
            return Err(NameError::Hidden);
        }
        if file_name.len() >= 5 && file_name[..5].eq_ignore_ascii_case("auto-") {
            return Err(NameError::AutoPrefix);
        }
        let lower = file_name.to_ascii_lowercase();
        let kind = [EntryKind::Type1Conf, EntryKind::Type2Efi]
            .into_iter()
            .find(|k| lower.ends_with(k.suffix()))
            .ok_or(NameError::NoSuffix)?;
        let suffix_len = kind.suffix().len();
        let (stem_len, counter) = match find_counter(file_name, suffix_len) {
            Some((plus, counter)) => (plus, Some(counter)),
            None => (file_name.len() - suffix_len, None),
        };
        if stem_len == 0 {
            return Err(NameError::EmptyStem);
        }
        Ok(EntryName {
            name: file_name.to_owned(),
            kind,
            stem_len,
            counter,
        })
    }

    /// Builds an uncounted name `<stem><suffix>`. Unlike [`EntryName::parse`], a `+` in the stem
    /// is refused: slate's own names must never be read as carrying a counter.
    pub fn new(stem: &str, kind: EntryKind) -> Result<EntryName, NameError> {
        if let Some(offset) = stem.find('+') {
            return Err(NameError::PlusInStem { offset });
        }
        if stem.is_empty() {
            return Err(NameError::EmptyStem);
        }
        EntryName::parse(&format!("{stem}{}", kind.suffix()))
    }

    /// The file name exactly as parsed or built.
    pub fn file_name(&self) -> &str {
        &self.name
    }

    pub fn kind(&self) -> EntryKind {
        self.kind
    }

    /// The name before the counter (or before the suffix, when uncounted).
    pub fn stem(&self) -> &str {
        &self.name[..self.stem_len]
    }

    /// The suffix as written (`.efi`, `.EFI`, `.conf`, ...).
    pub fn suffix(&self) -> &str {
        &self.name[self.name.len() - self.kind.suffix().len()..]
    }

    pub fn counter(&self) -> Option<BootCounter> {
        self.counter
    }

    pub fn state(&self) -> BootState {
        match self.counter {
            None => BootState::Good,
            Some(c) if c.tries_left > 0 => BootState::Indeterminate,
            Some(_) => BootState::Bad,
        }
    }

    /// The entry ID systemd-boot derives from this name (ASCII lower-cased, as `strtolower16()`).
    pub fn id(&self, style: IdStyle) -> String {
        let id = match (style, self.counter) {
            (IdStyle::Current, Some(_)) => format!("{}{}", self.stem(), self.suffix()),
            _ => self.name.clone(),
        };
        id.to_ascii_lowercase()
    }

    /// The name systemd-boot renames a counted entry to before starting it:
    /// `+{max(LEFT-1, 0)}-{DONE+1}` in unpadded decimal with its own lower-case suffix (`a+3.efi`
    /// → `a+2-1.efi`; `a+0-3.efi` → `a+0-4.efi` if it is booted anyway). Uncounted names are not
    /// renamed.
    pub fn after_boot_attempt(&self) -> Result<EntryName, NameError> {
        let Some(c) = self.counter else {
            return Ok(self.clone());
        };
        let left = c.tries_left.saturating_sub(1);
        let done = c.tries_done.saturating_add(1).min(MAX_TRIES);
        EntryName::parse(&format!(
            "{}+{left}-{done}{}",
            self.stem(),
            self.kind.suffix()
        ))
    }

    /// What `systemd-bless-boot good` renames to: the counter dropped, suffix kept as written.
    ///
    /// The result is re-read like any name, so a stem that itself ends in `+digits` yields a
    /// counted name again (`a+5+2-1.efi` → `a+5.efi`) — as on a real ESP.
    pub fn blessed(&self) -> Result<EntryName, NameError> {
        match self.counter {
            None => Ok(self.clone()),
            Some(_) => EntryName::parse(&format!("{}{}", self.stem(), self.suffix())),
        }
    }

    /// What `systemd-bless-boot bad` renames to: `+0-DONE`, or `+0` when DONE is 0. An uncounted
    /// name gets `+0` (bless-boot itself only acts on counted entries; slate uses this to mark a
    /// good version bad).
    pub fn marked_bad(&self) -> Result<EntryName, NameError> {
        let done = self.counter.map_or(0, |c| c.tries_done);
        let counter = if done > 0 {
            format!("+0-{done}")
        } else {
            "+0".to_owned()
        };
        EntryName::parse(&format!("{}{counter}{}", self.stem(), self.suffix()))
    }

    /// The same stem and suffix with a fresh counter `+tries_left` (what an installer writes).
    pub fn with_tries(&self, tries_left: u32) -> Result<EntryName, NameError> {
        if tries_left > MAX_TRIES {
            return Err(NameError::TriesOutOfRange { tries: tries_left });
        }
        EntryName::parse(&format!("{}+{tries_left}{}", self.stem(), self.suffix()))
    }
}

impl std::fmt::Display for EntryName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(name: &str) -> Option<(u32, u32)> {
        EntryName::parse(name)
            .unwrap()
            .counter()
            .map(|c| (c.tries_left, c.tries_done))
    }

    #[test]
    fn install_tries_stay_counted_and_bounded() {
        assert_eq!(check_install_tries(DEFAULT_INSTALL_TRIES), Ok(3));
        assert_eq!(check_install_tries(1), Ok(1));
        assert_eq!(check_install_tries(15), Ok(15));
        for bad in [0, 16, 3_000_000_000, MAX_TRIES, u32::MAX] {
            let err = check_install_tries(bad).unwrap_err();
            assert_eq!(err, InstallTriesError { tries: bad });
            assert!(
                err.to_string()
                    .starts_with(&format!("{bad} boot-counting tries is not 1 to 15")),
                "{err}"
            );
        }
        // Every accepted value makes a counted name, as systemd-boot reads it.
        let name = EntryName::new("slate-2.0.0", EntryKind::Type2Efi).unwrap();
        for tries in INSTALL_TRIES {
            let counted = name.with_tries(tries).unwrap();
            assert_eq!(counted.state(), BootState::Indeterminate, "{counted}");
        }
        assert!(INSTALL_TRIES.contains(&DEFAULT_INSTALL_TRIES));
    }

    #[test]
    fn counter_edge_cases() {
        assert_eq!(counter("a+3.efi"), Some((3, 0)));
        assert_eq!(counter("a+3-0.efi"), Some((3, 0)));
        assert_eq!(counter("a+03-00.efi"), Some((3, 0)));
        assert_eq!(counter("a+1+2.efi"), Some((2, 0)));
        assert_eq!(counter("a+2-1.EFI"), Some((2, 1)));
        assert_eq!(counter("a+2147483647.efi"), Some((MAX_TRIES, 0)));
        assert_eq!(counter("a+2147483648.efi"), None);
        assert_eq!(counter("a+99999999999999999999999.efi"), None);
        assert_eq!(counter("a+3x.efi"), None);
        assert_eq!(counter("a+3-.efi"), None);
        assert_eq!(counter("a+-1.efi"), None);
        assert_eq!(counter("a+3-1-2.efi"), None);
        assert_eq!(counter("a+3.x.efi"), None);
        assert_eq!(counter("a+3+x.efi"), None, "the last '+' decides");
    }
}
