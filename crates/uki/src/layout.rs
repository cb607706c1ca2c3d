//! The byte-level work of appending sections: preparing the stub, placing section data, and
//! rewriting the headers at the end.

use crate::error::UkiError;
use crate::pe::{
    checksum_excluding, PeInfo, SectionInfo, COFF_CHARACTERISTICS, COFF_NUMBER_OF_SECTIONS,
    COFF_NUMBER_OF_SYMBOLS, COFF_POINTER_TO_SYMBOL_TABLE, OPT_CHECKSUM, OPT_SIZE_OF_HEADERS,
    OPT_SIZE_OF_IMAGE, OPT_SIZE_OF_INITIALIZED_DATA, SECTION_HEADER_LEN, SEC_CHARACTERISTICS,
    SEC_POINTER_TO_RAW_DATA, SEC_SIZE_OF_RAW_DATA, SEC_VIRTUAL_ADDRESS, SEC_VIRTUAL_SIZE,
};

/// `IMAGE_FILE_LOCAL_SYMS_STRIPPED`, set (as ukify does) once the symbol table is gone.
const FILE_LOCAL_SYMS_STRIPPED: u16 = 0x0008;
/// The PE format caps FileAlignment at 64 KiB; larger values only come from corrupt input
/// and would make padding allocate absurd amounts.
const MAX_FILE_ALIGNMENT: u32 = 0x1_0000;
/// One COFF symbol table record.
const SYMBOL_LEN: u64 = 18;

/// The image being assembled: the output bytes plus the section table as it will be written.
#[derive(Debug)]
pub(crate) struct Work {
    out: Vec<u8>,
    sections: Vec<SectionInfo>,
    stub_sections: usize,
    file_alignment: u32,
    section_alignment: u32,
    size_of_headers: u32,
    header_capacity: usize,
    size_of_initialized_data: u32,
    symbol_table_stripped: bool,
}

impl Work {
    /// Steps 1–3 of docs/formats.md §3: refuse signed stubs, cut a trailing symbol table,
    /// re-align the stub's sections to FileAlignment, and work out how many section headers
    /// fit below SizeOfHeaders.
    pub(crate) fn prepare(stub: &[u8], info: &PeInfo) -> Result<Self, UkiError> {
        if info.security_directory != (0, 0) {
            return Err(UkiError::SignedStub);
        }
        let fa = info.file_alignment;
        let sa = info.section_alignment;
        if !fa.is_power_of_two() || fa > MAX_FILE_ALIGNMENT || !sa.is_power_of_two() {
            return Err(unsupported(format!(
                "FileAlignment {fa:#x} / SectionAlignment {sa:#x} are not sane powers of two"
            )));
        }
        let size_of_headers = info.size_of_headers as usize;
        if info.section_table_end() > size_of_headers {
            return Err(unsupported("the section table extends past SizeOfHeaders"));
        }

        let strip_at = symbol_table_start(stub, info);
        let end = strip_at.unwrap_or(stub.len());
        if size_of_headers > end {
            return Err(unsupported("SizeOfHeaders is larger than the file"));
        }

        let mut sections = info.sections.clone();
        let out = realign(stub, end, size_of_headers, fa, &mut sections)?;

        // Rounding SizeOfHeaders up only claims padding that precedes the first section's
        // (aligned) data anyway; never claim more than that.
        let first_data = sections
            .iter()
            .filter(|s| s.size_of_raw_data > 0)
            .map(|s| s.pointer_to_raw_data)
            .min();
        let mut soh = round_up(info.size_of_headers, fa)?;
        if let Some(first) = first_data {
            soh = soh.min(first);
        }
        let header_capacity =
            (soh as usize).saturating_sub(info.section_table_end()) / SECTION_HEADER_LEN;

        let mut work = Self {
            out,
            stub_sections: sections.len(),
            sections,
            file_alignment: fa,
            section_alignment: sa,
            size_of_headers: soh,
            header_capacity,
            size_of_initialized_data: info.size_of_initialized_data,
            symbol_table_stripped: strip_at.is_some(),
        };
        if work.out.len() < soh as usize {
            work.out.resize(soh as usize, 0);
        }
        Ok(work)
    }

    pub(crate) fn symbol_table_stripped(&self) -> bool {
        self.symbol_table_stripped
    }

    /// Index of the stub's own section called `name`.
    pub(crate) fn stub_section(&self, name: &str) -> Option<usize> {
        self.sections[..self.stub_sections]
            .iter()
            .position(|s| s.name == name)
    }

    /// Bytes section `index` can hold without growing on disk (SizeOfRawData) or running into
    /// the next section in memory. The second limit is the one ukify forgets: Debian 12's
    /// `.sbat` has 512 bytes on disk but only 256 before `.sdmagic` in memory.
    pub(crate) fn usable_in_place(&self, index: usize) -> usize {
        let section = &self.sections[index];
        let next_va = self
            .sections
            .iter()
            .map(|s| s.virtual_address)
            .filter(|&va| va > section.virtual_address)
            .min()
            .unwrap_or(u32::MAX);
        let memory_room = next_va - section.virtual_address;
        section.size_of_raw_data.min(memory_room) as usize
    }

    /// Step 5: overwrite a stub section's contents (zero-filling the rest of its raw data).
    /// The caller has checked `data.len() <= usable_in_place(index)`.
    pub(crate) fn replace(&mut self, index: usize, data: &[u8]) -> Result<(), UkiError> {
        let section = &mut self.sections[index];
        let start = section.pointer_to_raw_data as usize;
        let raw = self
            .out
            .get_mut(start..start + section.size_of_raw_data as usize)
            .ok_or_else(|| unsupported(format!("{} data is out of bounds", section.name)))?;
        let (head, tail) = raw.split_at_mut(data.len().min(raw.len()));
        head.copy_from_slice(&data[..head.len()]);
        tail.fill(0);
        section.virtual_size = u32::try_from(data.len()).map_err(|_| too_large("section"))?;
        Ok(())
    }

    /// Step 4: append a new section after everything else, on disk and in memory.
    pub(crate) fn append(
        &mut self,
        name: &str,
        data: &[u8],
        virtual_size: u32,
        characteristics: u32,
    ) -> Result<(), UkiError> {
        if self.sections.len() - self.stub_sections >= self.header_capacity {
            return Err(UkiError::NoHeaderRoom {
                name: name.to_owned(),
                capacity: self.header_capacity,
                stub_sections: self.stub_sections,
                size_of_headers: self.size_of_headers,
            });
        }
        let virtual_address = round_up(self.memory_end()?, self.section_alignment)?;
        virtual_address
            .checked_add(virtual_size)
            .ok_or_else(|| too_large("VirtualAddress + VirtualSize"))?;
        self.size_of_initialized_data = self
            .size_of_initialized_data
            .checked_add(virtual_size)
            .ok_or_else(|| too_large("SizeOfInitializedData"))?;

        pad_to(&mut self.out, self.file_alignment);
        let pointer = u32::try_from(self.out.len()).map_err(|_| too_large("file size"))?;
        self.out.extend_from_slice(data);
        pad_to(&mut self.out, self.file_alignment);
        let raw_size =
            u32::try_from(self.out.len() - pointer as usize).map_err(|_| too_large("file size"))?;
        u32::try_from(self.out.len()).map_err(|_| too_large("file size"))?;

        self.sections.push(SectionInfo {
            name: name.to_owned(),
            virtual_size,
            virtual_address,
            size_of_raw_data: raw_size,
            pointer_to_raw_data: pointer,
            characteristics,
        });
        Ok(())
    }

    /// Where the next section may start in memory: after every section and the headers.
    fn memory_end(&self) -> Result<u32, UkiError> {
        let end = self
            .sections
            .iter()
            .map(|s| u64::from(s.virtual_address) + u64::from(s.memory_size()))
            .chain([u64::from(self.size_of_headers)])
            .max()
            .unwrap_or(0);
        u32::try_from(end).map_err(|_| too_large("VirtualAddress"))
    }

    /// Step 6: rewrite the COFF and optional headers and the section table, then the checksum.
    pub(crate) fn finish(mut self, info: &PeInfo) -> Result<Vec<u8>, UkiError> {
        let coff = info.coff_header_offset;
        let opt = info.optional_header_offset;
        let count = u16::try_from(self.sections.len()).map_err(|_| too_large("section count"))?;
        // Never shrink SizeOfImage below the stub's own value: the linker may have reserved
        // memory past the last section header's extent.
        let size_of_image =
            round_up(self.memory_end()?, self.section_alignment)?.max(info.size_of_image);

        let out = &mut self.out;
        put_u16(out, coff + COFF_NUMBER_OF_SECTIONS, count)?;
        if self.symbol_table_stripped {
            put_u32(out, coff + COFF_POINTER_TO_SYMBOL_TABLE, 0)?;
            put_u32(out, coff + COFF_NUMBER_OF_SYMBOLS, 0)?;
            let flags = info.characteristics | FILE_LOCAL_SYMS_STRIPPED;
            put_u16(out, coff + COFF_CHARACTERISTICS, flags)?;
        }
        put_u32(
            out,
            opt + OPT_SIZE_OF_INITIALIZED_DATA,
            self.size_of_initialized_data,
        )?;
        put_u32(out, opt + OPT_SIZE_OF_IMAGE, size_of_image)?;
        put_u32(out, opt + OPT_SIZE_OF_HEADERS, self.size_of_headers)?;
        put_u32(out, opt + OPT_CHECKSUM, 0)?;

        for (i, s) in self.sections.iter().enumerate() {
            let at = info.section_table_offset + i * SECTION_HEADER_LEN;
            if i >= self.stub_sections {
                // A fresh header: name padded with NULs, no relocations or line numbers.
                let header = out
                    .get_mut(at..at + SECTION_HEADER_LEN)
                    .ok_or_else(|| unsupported("section table is out of bounds"))?;
                header.fill(0);
                header[..s.name.len()].copy_from_slice(s.name.as_bytes());
                put_u32(out, at + SEC_VIRTUAL_ADDRESS, s.virtual_address)?;
                put_u32(out, at + SEC_CHARACTERISTICS, s.characteristics)?;
            }
            put_u32(out, at + SEC_VIRTUAL_SIZE, s.virtual_size)?;
            put_u32(out, at + SEC_SIZE_OF_RAW_DATA, s.size_of_raw_data)?;
            put_u32(out, at + SEC_POINTER_TO_RAW_DATA, s.pointer_to_raw_data)?;
        }

        let checksum = checksum_excluding(out, opt + OPT_CHECKSUM);
        put_u32(out, opt + OPT_CHECKSUM, checksum)?;
        Ok(self.out)
    }
}

/// Start of the COFF symbol table if it (plus its string table) is the very end of the file
/// and lies after all headers and section data. Image files should not carry one, and
/// leaving it would put our sections after debris that nothing points at; anything not at
/// the end is left alone, as ukify does, because cutting it would lose data.
fn symbol_table_start(stub: &[u8], info: &PeInfo) -> Option<usize> {
    let start = u64::from(info.pointer_to_symbol_table);
    if start == 0 {
        return None;
    }
    let strings_at = start + SYMBOL_LEN * u64::from(info.number_of_symbols);
    let strings_len = usize::try_from(strings_at)
        .ok()
        .and_then(|at| stub.get(at..at.checked_add(4)?))
        .map_or(0, |b| {
            u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        });
    let start = usize::try_from(start).ok()?;
    let after_data = info
        .sections
        .iter()
        .map(|s| u64::from(s.pointer_to_raw_data) + u64::from(s.size_of_raw_data))
        .chain([u64::from(info.size_of_headers)])
        .all(|end| end <= start as u64);
    (strings_at + strings_len == stub.len() as u64 && after_data).then_some(start)
}

/// Copy `stub[..end]`, moving each section's raw data to a FileAlignment boundary and padding
/// it to a multiple of FileAlignment, as ukify does for stubs whose tail was stripped. Bytes
/// between sections are kept. Updates the pointers and sizes in `sections`.
fn realign(
    stub: &[u8],
    end: usize,
    size_of_headers: usize,
    fa: u32,
    sections: &mut [SectionInfo],
) -> Result<Vec<u8>, UkiError> {
    let mut order: Vec<usize> = (0..sections.len())
        .filter(|&i| sections[i].size_of_raw_data > 0)
        .collect();
    order.sort_by_key(|&i| sections[i].pointer_to_raw_data);

    let mut out = Vec::with_capacity(end + order.len() * fa as usize);
    let mut cursor = 0;
    for i in order {
        let section = &mut sections[i];
        let start = section.pointer_to_raw_data as usize;
        let stop = start
            .checked_add(section.size_of_raw_data as usize)
            .filter(|&stop| stop <= end)
            .ok_or_else(|| {
                unsupported(format!("{} raw data lies outside the file", section.name))
            })?;
        if start < cursor.max(size_of_headers) {
            return Err(unsupported(format!(
                "{} raw data overlaps the headers or another section",
                section.name
            )));
        }
        out.extend_from_slice(&stub[cursor..start]);
        pad_to(&mut out, fa);
        let pointer = out.len();
        out.extend_from_slice(&stub[start..stop]);
        pad_to(&mut out, fa);
        section.pointer_to_raw_data = u32::try_from(pointer).map_err(|_| too_large("file size"))?;
        section.size_of_raw_data =
            u32::try_from(out.len() - pointer).map_err(|_| too_large("file size"))?;
        cursor = stop;
    }
    out.extend_from_slice(&stub[cursor..end]);
    Ok(out)
}

fn round_up(value: u32, alignment: u32) -> Result<u32, UkiError> {
    // `alignment` is a non-zero power of two (checked in `prepare`).
    value
        .checked_add(alignment - 1)
        .map(|v| v & !(alignment - 1))
        .ok_or_else(|| too_large("aligned size"))
}

fn pad_to(out: &mut Vec<u8>, alignment: u32) {
    let alignment = alignment as usize;
    let rem = out.len() % alignment;
    if rem != 0 {
        out.resize(out.len() + alignment - rem, 0);
    }
}

fn put_u16(out: &mut [u8], at: usize, value: u16) -> Result<(), UkiError> {
    put(out, at, &value.to_le_bytes())
}

fn put_u32(out: &mut [u8], at: usize, value: u32) -> Result<(), UkiError> {
    put(out, at, &value.to_le_bytes())
}

fn put(out: &mut [u8], at: usize, bytes: &[u8]) -> Result<(), UkiError> {
    out.get_mut(at..at + bytes.len())
        .ok_or_else(|| unsupported("header field is out of bounds"))?
        .copy_from_slice(bytes);
    Ok(())
}

fn unsupported(reason: impl Into<String>) -> UkiError {
    UkiError::UnsupportedStub(reason.into())
}

fn too_large(what: &'static str) -> UkiError {
    UkiError::TooLarge(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding() {
        assert_eq!(round_up(0x19134, 0x200), Ok(0x19200));
        assert_eq!(round_up(0x19200, 0x200), Ok(0x19200));
        assert_eq!(round_up(0, 0x1000), Ok(0));
        assert!(round_up(u32::MAX, 0x200).is_err());
        let mut v = vec![1; 3];
        pad_to(&mut v, 8);
        assert_eq!(v, [1, 1, 1, 0, 0, 0, 0, 0]);
    }
}
