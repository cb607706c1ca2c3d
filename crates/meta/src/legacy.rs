//! The legacy syslinux ADV kept in the last 1024 bytes of META (two 512-byte copies,
//! little-endian). slate reads its tags (as Talos does, after the Talos ADV) and writes it only
//! when formatting; it never rewrites it otherwise, so bytes another tool owns stay untouched.

use std::collections::BTreeMap;

/// Size of the whole legacy area (two copies).
pub const LEGACY_LEN: usize = 1024;
const COPY_LEN: usize = 512;
const HEAD: u32 = 0x5A2D_2FA5;
const TAIL: u32 = 0xDD28_BF64;
const CHECKSUM_BASE: u32 = 0xA304_1767;
const RECORDS: std::ops::Range<usize> = 8..508;

/// The tags of the legacy ADV. Values are at most 255 bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LegacyAdv {
    tags: BTreeMap<u8, Vec<u8>>,
}

impl LegacyAdv {
    pub fn get(&self, tag: u8) -> Option<&[u8]> {
        self.tags.get(&tag).map(Vec::as_slice)
    }

    pub fn tags(&self) -> impl Iterator<Item = (u8, &[u8])> {
        self.tags.iter().map(|(t, v)| (*t, v.as_slice()))
    }

    /// Read the first valid copy of `area` (the last 1024 bytes of META); `None` when neither
    /// copy is valid, which is the normal state of a partition no syslinux ever touched.
    pub fn parse(area: &[u8]) -> Option<Self> {
        area.chunks_exact(COPY_LEN)
            .take(2)
            .find_map(Self::parse_copy)
    }

    fn parse_copy(copy: &[u8]) -> Option<Self> {
        if le32(copy, 0) != HEAD || le32(copy, 508) != TAIL {
            return None;
        }
        if le32(copy, 4).wrapping_add(word_sum(copy)) != CHECKSUM_BASE {
            return None;
        }
        let records = &copy[RECORDS];
        let mut tags = BTreeMap::new();
        let mut at = 0;
        while at + 2 <= records.len() {
            let (tag, len) = (records[at], records[at + 1] as usize);
            if tag == 0 {
                break;
            }
            let value = records.get(at + 2..at + 2 + len)?;
            tags.insert(tag, value.to_vec());
            at += 2 + len;
        }
        Some(Self { tags })
    }

    /// Both copies of an ADV with no tags: what a freshly formatted META carries.
    pub fn empty_area() -> Vec<u8> {
        let mut copy = vec![0u8; COPY_LEN];
        copy[0..4].copy_from_slice(&HEAD.to_le_bytes());
        copy[508..512].copy_from_slice(&TAIL.to_le_bytes());
        let checksum = CHECKSUM_BASE.wrapping_sub(word_sum(&copy));
        copy[4..8].copy_from_slice(&checksum.to_le_bytes());
        copy.repeat(2)
    }
}

fn word_sum(copy: &[u8]) -> u32 {
    copy[RECORDS]
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")))
        .fold(0u32, u32::wrapping_add)
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area_with(records: &[u8]) -> Vec<u8> {
        let mut area = LegacyAdv::empty_area();
        area[8..8 + records.len()].copy_from_slice(records);
        let checksum = CHECKSUM_BASE.wrapping_sub(word_sum(&area[..COPY_LEN]));
        area[4..8].copy_from_slice(&checksum.to_le_bytes());
        area
    }

    #[test]
    fn empty_area_parses_as_no_tags() {
        assert_eq!(
            LegacyAdv::parse(&LegacyAdv::empty_area()),
            Some(LegacyAdv::default())
        );
        assert_eq!(LegacyAdv::parse(&[0; LEGACY_LEN]), None);
    }

    #[test]
    fn reads_records_and_falls_back_to_the_second_copy() {
        let mut area = area_with(&[6, 1, b'B', 2, 2, b'h', b'i']);
        let adv = LegacyAdv::parse(&area).unwrap();
        assert_eq!(adv.get(6), Some(&b"B"[..]));
        assert_eq!(adv.get(2), Some(&b"hi"[..]));

        let second = area[..COPY_LEN].to_vec();
        area[COPY_LEN..].copy_from_slice(&second);
        area[9] = 9; // breaks copy 1's checksum
        assert_eq!(LegacyAdv::parse(&area), Some(adv));
    }

    #[test]
    fn a_record_past_the_area_invalidates_the_copy() {
        let mut records = vec![1, 255];
        records.extend([7; 255]);
        records.extend([2, 255]);
        let area = area_with(&records);
        assert_eq!(LegacyAdv::parse(&area[..COPY_LEN]), None);
    }
}
