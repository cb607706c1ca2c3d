//! Appending sections to systemd-stub: the assembly steps of docs/formats.md §3, over raw bytes.

use std::borrow::Cow;
use std::fmt;

use crate::error::UkiError;
use crate::layout::Work;
use crate::pe::{parse_pe, section_data};
use crate::sbat;

/// `IMAGE_SCN_MEM_READ | IMAGE_SCN_CNT_INITIALIZED_DATA`: what ukify gives every added section.
pub const DATA_SECTION_FLAGS: u32 = 0x4000_0040;
/// `IMAGE_SCN_MEM_READ | IMAGE_SCN_CNT_CODE`: `.linux` only, because kernels booted through
/// the legacy EFI handover protocol are executed in place.
pub const LINUX_SECTION_FLAGS: u32 = 0x4000_0020;

/// Sections that may legitimately appear more than once in a UKI.
const REPEATABLE: [&str; 2] = [".dtbauto", ".efifw"];

/// What happened to the `.sbat` section requested with [`UkiBuilder::sbat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SbatOutcome {
    /// [`UkiBuilder::sbat`] was not called; the stub's `.sbat` (if any) is unchanged.
    NotRequested,
    /// The merged SBAT fitted the stub's `.sbat`, on disk and in memory, and replaced it.
    ReplacedInPlace {
        /// Bytes of merged SBAT written (including the final NUL).
        len: usize,
    },
    /// The stub had no `.sbat`; the merged SBAT became a new section.
    Appended {
        /// Bytes of merged SBAT written (including the final NUL).
        len: usize,
    },
    /// The merged SBAT did not fit the stub's `.sbat`, so the stub's section was left exactly
    /// as it was. shim rejects images with two `.sbat` sections, and growing the existing one
    /// would overlap the next section in memory, so this is the only safe choice. The UKI is
    /// then revocable through the stub's (systemd) entries but not through the kernel's or
    /// the `uki` line.
    KeptStub {
        /// Size the merged SBAT would have had.
        merged_len: usize,
        /// Bytes the stub's `.sbat` can hold without overlapping the next section.
        usable: usize,
    },
}

/// The assembled image and notes about decisions taken on the way.
#[derive(Clone, PartialEq, Eq)]
pub struct BuildReport {
    /// The finished, unsigned UKI.
    pub image: Vec<u8>,
    /// What happened to `.sbat`.
    pub sbat: SbatOutcome,
    /// Whether the stub's COFF symbol table was cut off the end of the file.
    pub symbol_table_stripped: bool,
}

impl fmt::Debug for BuildReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BuildReport")
            .field("image_len", &self.image.len())
            .field("sbat", &self.sbat)
            .field("symbol_table_stripped", &self.symbol_table_stripped)
            .finish()
    }
}

/// Assembles a Unified Kernel Image from an unsigned systemd-stub and section contents.
///
/// Sections are appended in the order they are added; use the canonical order
/// `.osrel .cmdline .uname .initrd .linux`, which is also the order systemd-stub measures
/// them into PCR 11. Problems (bad names, duplicates, no header room) are reported by
/// [`build`](Self::build), so the builder can be chained freely. The output depends only on
/// the inputs: building twice gives identical bytes.
///
/// ```no_run
/// # fn main() -> Result<(), slate_uki::UkiError> {
/// # let (stub, kernel, initrd) = (vec![], vec![], vec![]);
/// let uki = slate_uki::UkiBuilder::new(&stub)
///     .osrel("ID=slate\nVERSION_ID=1\n")
///     .cmdline("console=ttyS0 ro")
///     .uname("6.1.0-slate")
///     .initrd(&initrd)
///     .linux(&kernel)
///     .sbat(slate_uki::UKI_SBAT_LINE)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct UkiBuilder<'a> {
    stub: &'a [u8],
    sections: Vec<(String, Cow<'a, [u8]>)>,
    sbat_extra: Option<String>,
}

impl fmt::Debug for UkiBuilder<'_> {
    // Section contents can be hundreds of megabytes; show their sizes only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sections: Vec<(&str, usize)> = self
            .sections
            .iter()
            .map(|(name, data)| (name.as_str(), data.len()))
            .collect();
        f.debug_struct("UkiBuilder")
            .field("stub_len", &self.stub.len())
            .field("sections", &sections)
            .field("sbat_extra", &self.sbat_extra)
            .finish()
    }
}

impl<'a> UkiBuilder<'a> {
    /// Start from an unsigned systemd-stub image (e.g. `linuxx64.efi.stub`).
    pub fn new(stub: &'a [u8]) -> Self {
        Self {
            stub,
            sections: Vec::new(),
            sbat_extra: None,
        }
    }

    /// Add a section named `name` (at most 8 bytes) with the given contents. A name the stub
    /// already has replaces that section in place, which fails if the contents do not fit.
    pub fn section(mut self, name: &str, data: impl Into<Cow<'a, [u8]>>) -> Self {
        self.sections.push((name.to_owned(), data.into()));
        self
    }

    /// `.osrel`: the os-release text boot menus show.
    pub fn osrel(self, text: &str) -> Self {
        self.section(".osrel", text.as_bytes().to_vec())
    }

    /// `.cmdline`: the kernel command line. With Secure Boot on, systemd-stub ignores any
    /// command line passed by the boot loader when this section exists.
    pub fn cmdline(self, text: &str) -> Self {
        self.section(".cmdline", text.as_bytes().to_vec())
    }

    /// `.uname`: the kernel release (`uname -r`).
    pub fn uname(self, text: &str) -> Self {
        self.section(".uname", text.as_bytes().to_vec())
    }

    /// `.initrd`: one initramfs, or several joined with `slate_cpio::concat_initrds`.
    pub fn initrd(self, data: impl Into<Cow<'a, [u8]>>) -> Self {
        self.section(".initrd", data)
    }

    /// `.linux`: the EFI-stub kernel image. If it parses as PE and its SizeOfImage exceeds its
    /// length, the section's VirtualSize is that SizeOfImage, so the loader reserves (and
    /// zero-fills) the memory the kernel expects to find after itself.
    pub fn linux(self, data: impl Into<Cow<'a, [u8]>>) -> Self {
        self.section(".linux", data)
    }

    /// Request a merged `.sbat`: the stub's lines, then the kernel's (if `.linux` is a PE with
    /// a `.sbat`), then `extra` (SBAT CSV lines; a header line in it is ignored). Pass
    /// [`crate::UKI_SBAT_LINE`] for ukify's default. See [`SbatOutcome`] for where it ends up;
    /// with Debian 12's stub it does not fit and the stub's `.sbat` is kept.
    pub fn sbat(mut self, extra: &str) -> Self {
        self.sbat_extra = Some(extra.to_owned());
        self
    }

    /// Assemble the image.
    pub fn build(self) -> Result<Vec<u8>, UkiError> {
        self.build_with_report().map(|report| report.image)
    }

    /// Assemble the image and report what happened to `.sbat` and the symbol table.
    pub fn build_with_report(self) -> Result<BuildReport, UkiError> {
        self.check_sections()?;
        let info = parse_pe(self.stub)?;
        let mut work = Work::prepare(self.stub, &info)?;

        for (name, data) in &self.sections {
            if let Some(index) = work.stub_section(name) {
                let usable = work.usable_in_place(index);
                if data.len() > usable {
                    return Err(UkiError::ExistingSectionTooSmall {
                        name: name.clone(),
                        len: data.len(),
                        usable,
                    });
                }
                work.replace(index, data)?;
            } else if name == ".linux" {
                let size = linux_virtual_size(data)?;
                work.append(name, data, size, LINUX_SECTION_FLAGS)?;
            } else {
                let size = u32::try_from(data.len())
                    .map_err(|_| UkiError::TooLarge("section contents"))?;
                work.append(name, data, size, DATA_SECTION_FLAGS)?;
            }
        }

        let sbat = match &self.sbat_extra {
            None => SbatOutcome::NotRequested,
            Some(extra) => self.place_sbat(&mut work, extra)?,
        };
        let symbol_table_stripped = work.symbol_table_stripped();
        let image = work.finish(&info)?;
        Ok(BuildReport {
            image,
            sbat,
            symbol_table_stripped,
        })
    }

    fn place_sbat(&self, work: &mut Work, extra: &str) -> Result<SbatOutcome, UkiError> {
        // Unreadable sources are skipped rather than fatal, as in ukify: a kernel without
        // (valid) SBAT simply contributes nothing.
        let stub_sbat = section_data(self.stub, ".sbat").ok().flatten();
        let kernel_sbat = self
            .sections
            .iter()
            .find(|(name, _)| name == ".linux")
            .and_then(|(_, data)| section_data(data, ".sbat").ok().flatten());
        let sources: Vec<&[u8]> = [stub_sbat, kernel_sbat].into_iter().flatten().collect();
        let merged = sbat::merge(&sources, extra)?;

        match work.stub_section(".sbat") {
            Some(index) => {
                let usable = work.usable_in_place(index);
                if merged.len() <= usable {
                    work.replace(index, &merged)?;
                    Ok(SbatOutcome::ReplacedInPlace { len: merged.len() })
                } else {
                    Ok(SbatOutcome::KeptStub {
                        merged_len: merged.len(),
                        usable,
                    })
                }
            }
            None => {
                let size = u32::try_from(merged.len()).map_err(|_| UkiError::TooLarge(".sbat"))?;
                work.append(".sbat", &merged, size, DATA_SECTION_FLAGS)?;
                Ok(SbatOutcome::Appended { len: merged.len() })
            }
        }
    }

    /// Name, emptiness and duplicate checks, done before any copying.
    fn check_sections(&self) -> Result<(), UkiError> {
        let mut seen: Vec<&str> = Vec::new();
        let sbat = self.sbat_extra.as_ref().map(|_| (".sbat", &[0u8][..]));
        let requested = self
            .sections
            .iter()
            .map(|(name, data)| (name.as_str(), data.as_ref()))
            .chain(sbat);
        for (name, data) in requested {
            validate_name(name)?;
            if data.is_empty() {
                return Err(UkiError::EmptySection {
                    name: name.to_owned(),
                });
            }
            if name == ".profile" {
                // Each profile may repeat the per-profile sections.
                seen.clear();
            }
            if seen.contains(&name) && !REPEATABLE.contains(&name) {
                return Err(UkiError::DuplicateSection {
                    name: name.to_owned(),
                });
            }
            seen.push(name);
        }
        Ok(())
    }
}

fn validate_name(name: &str) -> Result<(), UkiError> {
    let invalid = |reason| UkiError::InvalidSectionName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.len() > 8 {
        return Err(invalid(
            "longer than 8 bytes (image section headers have no string table for long names)",
        ));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid("only printable ASCII without spaces is allowed"));
    }
    Ok(())
}

fn linux_virtual_size(kernel: &[u8]) -> Result<u32, UkiError> {
    let len = u32::try_from(kernel.len()).map_err(|_| UkiError::TooLarge(".linux"))?;
    let image_size = parse_pe(kernel).map_or(0, |info| info.size_of_image);
    Ok(len.max(image_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name(".cmdline").is_ok());
        for bad in ["", ".toolong9", ".a b", ".\u{e9}"] {
            assert!(
                matches!(validate_name(bad), Err(UkiError::InvalidSectionName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn duplicates_and_empties_are_refused_before_parsing() {
        let b = UkiBuilder::new(&[]).osrel("a").osrel("b");
        assert_eq!(
            b.check_sections(),
            Err(UkiError::DuplicateSection {
                name: ".osrel".into()
            })
        );
        let b = UkiBuilder::new(&[]).cmdline("");
        assert!(matches!(
            b.check_sections(),
            Err(UkiError::EmptySection { .. })
        ));
        let b = UkiBuilder::new(&[])
            .section(".sbat", b"x".to_vec())
            .sbat("");
        assert!(matches!(
            b.check_sections(),
            Err(UkiError::DuplicateSection { .. })
        ));
        let ok = UkiBuilder::new(&[])
            .section(".dtbauto", b"x".to_vec())
            .section(".dtbauto", b"y".to_vec())
            .section(".profile", b"ID=a".to_vec())
            .osrel("x")
            .section(".profile", b"ID=b".to_vec())
            .osrel("y");
        assert_eq!(ok.check_sections(), Ok(()));
    }
}
