//! A PE image as Authenticode sees it: where the checksum, the certificate-table directory
//! entry and the headers end (docs/formats.md §11.1), read by `slate_uki`'s header parser.

use std::ops::Range;

use authenticode::{PeOffsetError, PeOffsets, PeTrait};
use slate_uki::PeInfo;

/// Offset of the data directories inside the optional header: PE32 and PE32+ differ by the
/// 4 bytes of wider stack and heap fields.
const DATA_DIRECTORIES_PE32: usize = 96;
const DATA_DIRECTORIES_PE32_PLUS: usize = 112;
/// `NumberOfRvaAndSizes` is the field just before the directories.
const NUMBER_OF_RVA_AND_SIZES_BACK: usize = 4;
/// The certificate table is data directory 4; each entry is 8 bytes.
const SECURITY_ENTRY: usize = 4 * 8;

#[derive(Debug)]
pub(crate) struct Pe<'a> {
    data: &'a [u8],
    pub(crate) info: PeInfo,
    /// File offset of the certificate-table directory entry, if the header has one.
    security_entry: Option<usize>,
}

impl<'a> Pe<'a> {
    pub(crate) fn parse(data: &'a [u8]) -> Result<Self, String> {
        let info = slate_uki::parse_pe(data).map_err(|e| e.to_string())?;
        let directories = info.optional_header_offset
            + if info.is_pe32_plus {
                DATA_DIRECTORIES_PE32_PLUS
            } else {
                DATA_DIRECTORIES_PE32
            };
        let count_at = directories - NUMBER_OF_RVA_AND_SIZES_BACK;
        let count = data
            .get(count_at..count_at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or("the optional header is cut short")?;
        let entry = directories + SECURITY_ENTRY;
        let security_entry = (count > 4 && entry + 8 <= info.size_of_headers as usize)
            .then_some(entry)
            .filter(|&e| e + 8 <= data.len());
        Ok(Self {
            data,
            info,
            security_entry,
        })
    }

    pub(crate) fn security_entry(&self) -> Option<usize> {
        self.security_entry
    }
}

impl PeTrait for Pe<'_> {
    fn data(&self) -> &[u8] {
        self.data
    }

    fn num_sections(&self) -> usize {
        self.info.sections.len()
    }

    /// `index` counts from 1, as `object`'s section indices do (the crate's digest asks for
    /// `1..=num_sections`).
    fn section_data_range(&self, index: usize) -> Result<Range<usize>, PeOffsetError> {
        let section = index
            .checked_sub(1)
            .and_then(|i| self.info.sections.get(i))
            .ok_or(PeOffsetError)?;
        let start = section.pointer_to_raw_data as usize;
        let end = start
            .checked_add(section.size_of_raw_data as usize)
            .ok_or(PeOffsetError)?;
        Ok(start..end)
    }

    fn certificate_table_range(&self) -> Result<Option<Range<usize>>, PeOffsetError> {
        let (start, size) = self.info.security_directory;
        if size == 0 {
            return Ok(None);
        }
        let start = start as usize;
        let end = start.checked_add(size as usize).ok_or(PeOffsetError)?;
        Ok(Some(start..end))
    }

    fn offsets(&self) -> Result<PeOffsets, PeOffsetError> {
        let check_sum = self.info.checksum_offset();
        let security_data_dir = self.security_entry.ok_or(PeOffsetError)?;
        let after_header = self.info.size_of_headers as usize;
        if after_header > self.data.len() || security_data_dir + 8 > after_header {
            return Err(PeOffsetError);
        }
        Ok(PeOffsets {
            check_sum,
            after_check_sum: check_sum + 4,
            security_data_dir,
            after_security_data_dir: security_data_dir + 8,
            after_header,
        })
    }
}

/// The image's Authenticode SHA-256 digest: the file without its checksum, its certificate
/// table entry and the table itself, sections in file order.
pub(crate) fn image_digest(pe: &Pe<'_>) -> Result<[u8; 32], String> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    authenticode::authenticode_digest(pe, &mut hasher)
        .map_err(|_| "a header or section offset is out of range".to_string())?;
    Ok(hasher.finalize().into())
}
