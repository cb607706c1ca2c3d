//! Reading PE/COFF headers (through `object`'s bounds-checked read side) and the PE checksum.

use object::pe::{
    ImageDosHeader, ImageNtHeaders32, ImageNtHeaders64, IMAGE_DIRECTORY_ENTRY_SECURITY,
    IMAGE_NT_OPTIONAL_HDR32_MAGIC, IMAGE_NT_OPTIONAL_HDR64_MAGIC,
};
use object::read::pe::{optional_header_magic, ImageNtHeaders, ImageOptionalHeader};
use object::LittleEndian as LE;

use crate::error::UkiError;

/// Size of one entry in the section table.
pub(crate) const SECTION_HEADER_LEN: usize = 40;

// Field offsets inside the COFF file header (which follows the 4-byte "PE\0\0" signature).
pub(crate) const COFF_NUMBER_OF_SECTIONS: usize = 2;
pub(crate) const COFF_POINTER_TO_SYMBOL_TABLE: usize = 8;
pub(crate) const COFF_NUMBER_OF_SYMBOLS: usize = 12;
pub(crate) const COFF_CHARACTERISTICS: usize = 18;

// Field offsets inside the optional header. They are the same for PE32 and PE32+: the two
// differ only in BaseOfData/ImageBase (4+4 vs 8 bytes, same total) before SectionAlignment,
// and in the stack/heap sizes that come after CheckSum.
pub(crate) const OPT_SIZE_OF_INITIALIZED_DATA: usize = 8;
pub(crate) const OPT_SIZE_OF_IMAGE: usize = 56;
pub(crate) const OPT_SIZE_OF_HEADERS: usize = 60;
pub(crate) const OPT_CHECKSUM: usize = 64;

// Field offsets inside a section header.
pub(crate) const SEC_VIRTUAL_SIZE: usize = 8;
pub(crate) const SEC_VIRTUAL_ADDRESS: usize = 12;
pub(crate) const SEC_SIZE_OF_RAW_DATA: usize = 16;
pub(crate) const SEC_POINTER_TO_RAW_DATA: usize = 20;
pub(crate) const SEC_CHARACTERISTICS: usize = 36;

/// One section header as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionInfo {
    /// The 8-byte name with trailing NULs removed (lossily decoded if not UTF-8).
    pub name: String,
    /// VirtualSize: bytes the loader maps (zero-filled past SizeOfRawData).
    pub virtual_size: u32,
    /// VirtualAddress: RVA of the section in the loaded image.
    pub virtual_address: u32,
    /// SizeOfRawData: bytes stored in the file.
    pub size_of_raw_data: u32,
    /// PointerToRawData: file offset of the stored bytes.
    pub pointer_to_raw_data: u32,
    /// Section flags (`IMAGE_SCN_*`).
    pub characteristics: u32,
}

impl SectionInfo {
    /// The number of bytes the section occupies in memory: VirtualSize, or SizeOfRawData when
    /// VirtualSize is 0 (which is how loaders treat such sections).
    pub fn memory_size(&self) -> u32 {
        if self.virtual_size == 0 {
            self.size_of_raw_data
        } else {
            self.virtual_size
        }
    }
}

/// The header fields UKI assembly reads or rewrites, plus where they live in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeInfo {
    /// PE32+ (64-bit) rather than PE32.
    pub is_pe32_plus: bool,
    /// COFF Machine, e.g. 0x8664 for x86-64.
    pub machine: u16,
    /// COFF Characteristics (`IMAGE_FILE_*`).
    pub characteristics: u16,
    /// COFF PointerToSymbolTable (0 when there is none).
    pub pointer_to_symbol_table: u32,
    /// COFF NumberOfSymbols.
    pub number_of_symbols: u32,
    /// Optional-header SectionAlignment.
    pub section_alignment: u32,
    /// Optional-header FileAlignment.
    pub file_alignment: u32,
    /// Optional-header SizeOfInitializedData.
    pub size_of_initialized_data: u32,
    /// Optional-header SizeOfImage.
    pub size_of_image: u32,
    /// Optional-header SizeOfHeaders.
    pub size_of_headers: u32,
    /// Optional-header CheckSum as stored.
    pub checksum: u32,
    /// Optional-header Subsystem (10 = EFI application).
    pub subsystem: u16,
    /// Security (certificate table) directory: file offset and size; (0, 0) when unsigned.
    pub security_directory: (u32, u32),
    /// File offset of the COFF file header.
    pub coff_header_offset: usize,
    /// File offset of the optional header.
    pub optional_header_offset: usize,
    /// File offset of the first section header.
    pub section_table_offset: usize,
    /// The section table, in table order.
    pub sections: Vec<SectionInfo>,
}

impl PeInfo {
    /// File offset just past the last section header.
    pub fn section_table_end(&self) -> usize {
        self.section_table_offset + self.sections.len() * SECTION_HEADER_LEN
    }

    /// File offset of the optional header's CheckSum field.
    pub fn checksum_offset(&self) -> usize {
        self.optional_header_offset + OPT_CHECKSUM
    }

    /// The first section called `name`.
    pub fn section(&self, name: &str) -> Option<&SectionInfo> {
        self.sections.iter().find(|s| s.name == name)
    }
}

/// Parse the DOS, COFF and optional headers and the section table of a PE32 or PE32+ image.
/// Never panics: every read is bounds-checked, and malformed input yields
/// [`UkiError::InvalidPe`].
pub fn parse_pe(image: &[u8]) -> Result<PeInfo, UkiError> {
    match optional_header_magic(image)? {
        IMAGE_NT_OPTIONAL_HDR32_MAGIC => parse_generic::<ImageNtHeaders32>(image),
        IMAGE_NT_OPTIONAL_HDR64_MAGIC => parse_generic::<ImageNtHeaders64>(image),
        other => Err(UkiError::InvalidPe(format!(
            "unknown optional header magic {other:#06x}"
        ))),
    }
}

/// The section table of a PE image, in table order. See [`parse_pe`] for the full headers.
pub fn parse_sections(image: &[u8]) -> Result<Vec<SectionInfo>, UkiError> {
    parse_pe(image).map(|info| info.sections)
}

/// The contents of the first section called `name`, cut to the bytes that are both stored in
/// the file and mapped in memory (`min(memory size, SizeOfRawData)`), which is what a loader
/// exposes to code reading its own sections. `Ok(None)` if there is no such section.
pub fn section_data<'a>(image: &'a [u8], name: &str) -> Result<Option<&'a [u8]>, UkiError> {
    let info = parse_pe(image)?;
    let Some(section) = info.section(name) else {
        return Ok(None);
    };
    let len = section.memory_size().min(section.size_of_raw_data) as usize;
    let start = section.pointer_to_raw_data as usize;
    start
        .checked_add(len)
        .and_then(|end| image.get(start..end))
        .map(Some)
        .ok_or_else(|| UkiError::InvalidPe(format!("section {name} data is out of bounds")))
}

fn parse_generic<Pe: ImageNtHeaders>(image: &[u8]) -> Result<PeInfo, UkiError> {
    let dos = ImageDosHeader::parse(image)?;
    let nt_offset = u64::from(dos.nt_headers_offset());
    let mut offset = nt_offset;
    let (nt, directories) = Pe::parse(image, &mut offset)?;
    let table = nt.sections(image, offset)?;
    let file = nt.file_header();
    let opt = nt.optional_header();

    // Read the Security entry raw: `DataDirectories::get` hides entries whose address is 0,
    // but a non-zero size alone already means somebody meant to attach a certificate table.
    let security = directories
        .iter()
        .nth(IMAGE_DIRECTORY_ENTRY_SECURITY)
        .map_or((0, 0), |d| (d.virtual_address.get(LE), d.size.get(LE)));

    let sections = table
        .iter()
        .map(|h| {
            let raw = h.raw_name();
            SectionInfo {
                name: String::from_utf8_lossy(raw).into_owned(),
                virtual_size: h.virtual_size.get(LE),
                virtual_address: h.virtual_address.get(LE),
                size_of_raw_data: h.size_of_raw_data.get(LE),
                pointer_to_raw_data: h.pointer_to_raw_data.get(LE),
                characteristics: h.characteristics.get(LE).0,
            }
        })
        .collect();

    // The parser has read these ranges, so they are in bounds of a slice and fit in usize.
    let to_usize = |v: u64| usize::try_from(v).map_err(|_| UkiError::TooLarge("header offset"));
    Ok(PeInfo {
        is_pe32_plus: opt.magic() == IMAGE_NT_OPTIONAL_HDR64_MAGIC,
        machine: file.machine.get(LE).0,
        characteristics: file.characteristics.get(LE).0,
        pointer_to_symbol_table: file.pointer_to_symbol_table.get(LE),
        number_of_symbols: file.number_of_symbols.get(LE),
        section_alignment: opt.section_alignment(),
        file_alignment: opt.file_alignment(),
        size_of_initialized_data: opt.size_of_initialized_data(),
        size_of_image: opt.size_of_image(),
        size_of_headers: opt.size_of_headers(),
        checksum: opt.check_sum(),
        subsystem: opt.subsystem().0,
        security_directory: security,
        coff_header_offset: to_usize(nt_offset + 4)?,
        optional_header_offset: to_usize(nt_offset + 24)?,
        section_table_offset: to_usize(offset)?,
        sections,
    })
}

/// The PE image checksum as Windows' `CheckSumMappedFile` defines it: the one's-complement
/// style sum of the file as little-endian 16-bit words (a trailing odd byte counts as a word
/// with a zero high byte), with the CheckSum field itself counted as zero, folded to 16 bits,
/// plus the file length.
pub fn pe_checksum(image: &[u8]) -> Result<u32, UkiError> {
    let info = parse_pe(image)?;
    Ok(checksum_excluding(image, info.checksum_offset()))
}

/// Whether the stored CheckSum matches [`pe_checksum`].
pub fn verify_checksum(image: &[u8]) -> Result<bool, UkiError> {
    let info = parse_pe(image)?;
    Ok(checksum_excluding(image, info.checksum_offset()) == info.checksum)
}

/// Checksum with the four bytes at `field` treated as zero.
pub(crate) fn checksum_excluding(image: &[u8], field: usize) -> u32 {
    // Summing into a u64 and folding once gives the same 16-bit result as folding the carry
    // after every addition (end-around carry is addition modulo 0xFFFF either way), and lets
    // the field's bytes be taken back out with plain subtraction.
    let mut chunks = image.chunks_exact(2);
    let mut sum: u64 = chunks
        .by_ref()
        .map(|w| u64::from(u16::from_le_bytes([w[0], w[1]])))
        .sum();
    if let [last] = chunks.remainder() {
        sum += u64::from(*last);
    }
    for i in field..field.saturating_add(4) {
        if let Some(&b) = image.get(i) {
            sum -= u64::from(b) << (8 * (i % 2));
        }
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    // Truncation is the definition for (impossible) images of 4 GiB or more.
    (sum as u32).wrapping_add(image.len() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook loop: fold after every word, zero the field in a copy.
    fn reference_checksum(image: &[u8], field: usize) -> u32 {
        let mut copy = image.to_vec();
        for b in copy.iter_mut().skip(field).take(4) {
            *b = 0;
        }
        if copy.len() % 2 == 1 {
            copy.push(0);
        }
        let mut sum: u32 = 0;
        for w in copy.chunks(2) {
            sum += u32::from(u16::from_le_bytes([w[0], w[1]]));
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        sum + image.len() as u32
    }

    #[test]
    fn checksum_matches_the_textbook_loop() {
        let data: Vec<u8> = (0..1001u32)
            .map(|i| (i * 7919 % 251) as u8 ^ 0xA5)
            .collect();
        for field in [0, 1, 2, 3, 500, 997, 998, 999, 1000, 5000] {
            assert_eq!(
                checksum_excluding(&data, field),
                reference_checksum(&data, field),
                "field at {field}"
            );
        }
        let ones = vec![0xFF; 64];
        assert_eq!(checksum_excluding(&ones, 8), reference_checksum(&ones, 8));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(matches!(parse_pe(b"MZ"), Err(UkiError::InvalidPe(_))));
        assert!(matches!(parse_sections(&[]), Err(UkiError::InvalidPe(_))));
    }
}
