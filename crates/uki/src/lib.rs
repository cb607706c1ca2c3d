//! Unified Kernel Images for slate: one signed PE file that systemd-boot (or firmware)
//! starts, carrying the kernel, initrd, command line and os-release for one OS version.
//!
//! A UKI is systemd-stub with extra PE sections appended. This crate does that appending
//! itself, over bytes, following the procedure ukify uses (docs/formats.md §3): refuse a signed
//! stub, cut a trailing COFF symbol table, re-align the stub's sections, add one section
//! header per new section below SizeOfHeaders, lay the data out after the stub on disk and
//! in memory, fix up the optional header, and — unlike ukify, which leaves 0 — write the real
//! PE checksum. Doing it in-process keeps image builds free of Python/pefile and makes the
//! output a pure function of the inputs.
//!
//! Headers are read with the `object` crate's bounds-checked parser; everything written is
//! ours. The crate does no I/O. The result is unsigned; sign it afterwards (sbsign/pesign).

mod builder;
mod error;
mod layout;
mod pe;
mod sbat;

pub use builder::{BuildReport, SbatOutcome, UkiBuilder, DATA_SECTION_FLAGS, LINUX_SECTION_FLAGS};
pub use error::UkiError;
pub use pe::{
    parse_pe, parse_sections, pe_checksum, section_data, verify_checksum, PeInfo, SectionInfo,
};
pub use sbat::{SBAT_HEADER_LINE, UKI_SBAT_LINE};
