//! Type #1 entries (`loader/entries/*.conf`) as systemd-boot reads them (docs/formats.md §12.2):
//! the keys that decide sorting and what is loaded, through the same line reader as
//! `loader.conf` (keys and values separated by spaces or tabs).

use crate::conf::{lines, ucs2_lossy};
use crate::error::Type1Error;
use crate::name::EntryName;
use crate::select::Entry;

/// Longest entry file systemd-boot reads; slate refuses longer ones rather than guess.
pub const MAX_TYPE1_LEN: usize = 64 * 1024;

/// The keys of a Type #1 entry slate reads or writes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Type1Entry {
    pub title: Option<String>,
    pub version: Option<String>,
    pub machine_id: Option<String>,
    pub sort_key: Option<String>,
    /// `linux`: the kernel, a path on the ESP (absolute, `/`-separated).
    pub linux: Option<String>,
    /// Every `initrd` line, in order (systemd-boot loads them all, concatenated).
    pub initrd: Vec<String>,
    /// Every `options` line, in order; systemd-boot joins them with a space.
    pub options: Vec<String>,
    /// `efi`: an EFI program instead of a kernel.
    pub efi: Option<String>,
    /// Every other key, in file order.
    pub other: Vec<(String, String)>,
}

impl Type1Entry {
    /// Parses entry text. A repeated single-valued key takes its last value, as in
    /// systemd-boot. Refused: a NUL byte, a key without a value, more than [`MAX_TYPE1_LEN`]
    /// bytes, and an entry with neither `linux` nor `efi` (systemd-boot would skip it).
    pub fn parse(text: &str) -> Result<Type1Entry, Type1Error> {
        if text.len() > MAX_TYPE1_LEN {
            return Err(Type1Error::TooLong { len: text.len() });
        }
        if let Some(nul) = text.find('\0') {
            let line = text[..nul].matches('\n').count() + 1;
            return Err(Type1Error::Nul { line });
        }
        let mut entry = Type1Entry::default();
        for line in lines(text, &[' ', '\t']) {
            let Some(value) = line.value else {
                return Err(Type1Error::MissingValue {
                    line: line.number,
                    key: line.key.to_owned(),
                });
            };
            let value = value.to_owned();
            match line.key {
                "title" => entry.title = Some(ucs2_lossy(&value)),
                "version" => entry.version = Some(ucs2_lossy(&value)),
                "machine-id" => entry.machine_id = Some(value),
                "sort-key" => entry.sort_key = Some(value),
                "linux" => entry.linux = Some(value),
                "efi" => entry.efi = Some(value),
                "initrd" => entry.initrd.push(value),
                "options" => entry.options.push(value),
                key => entry.other.push((key.to_owned(), value)),
            }
        }
        if entry.linux.is_none() && entry.efi.is_none() {
            return Err(Type1Error::NoProgram);
        }
        Ok(entry)
    }

    /// The kernel command line systemd-boot passes: the `options` lines joined by spaces.
    pub fn cmdline(&self) -> String {
        self.options.join(" ")
    }

    /// The entry as the selection model sees it.
    pub fn to_entry(&self, name: EntryName) -> Entry {
        Entry {
            name,
            title: self.title.clone(),
            version: self.version.clone(),
            sort_key: self.sort_key.clone(),
            machine_id: self.machine_id.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_keys_slate_writes() {
        let text = "title Slate snapshot 2026-06-28 09:30:00\nversion root-20260628-093000\n\
                    linux /slate/root-20260628-093000/vmlinuz\n\
                    initrd /slate/root-20260628-093000/initrd\n\
                    options root=UUID=x rootflags=subvol=root-20260628-093000\n\
                    options quiet\narchitecture x64\n";
        let e = Type1Entry::parse(text).unwrap();
        assert_eq!(
            e.title.as_deref(),
            Some("Slate snapshot 2026-06-28 09:30:00")
        );
        assert_eq!(e.initrd, ["/slate/root-20260628-093000/initrd"]);
        assert_eq!(
            e.cmdline(),
            "root=UUID=x rootflags=subvol=root-20260628-093000 quiet"
        );
        assert_eq!(e.other, [("architecture".into(), "x64".into())]);
    }

    #[test]
    fn refusals() {
        assert_eq!(Type1Entry::parse("title x\n"), Err(Type1Error::NoProgram));
        assert_eq!(
            Type1Entry::parse("linux /a\ntitle\n"),
            Err(Type1Error::MissingValue {
                line: 2,
                key: "title".into()
            })
        );
        assert_eq!(
            Type1Entry::parse("linux /a\n\0"),
            Err(Type1Error::Nul { line: 2 })
        );
    }
}
