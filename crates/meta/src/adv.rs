//! One copy of the Talos ADV: a 256 KiB block of big-endian tag/size/value records, closed by a
//! SHA-256 over the block and two magics.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// Size of one ADV copy.
pub const ADV_LEN: usize = 256 * 1024;
const MAGIC1: u32 = 0x5A4B_3C2D;
const MAGIC2: u32 = 0xA5B4_C3D2;
const CHECKSUM_AT: usize = ADV_LEN - 36;
const MAGIC2_AT: usize = ADV_LEN - 4;
/// Bytes available to records: everything between magic1 and the checksum.
pub const DATA_LEN: usize = ADV_LEN - 40;
const RECORD_HEADER: usize = 8;

/// Why a copy of the ADV was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvError {
    #[error("the block is {0} bytes, an ADV copy is {ADV_LEN}")]
    WrongLength(usize),
    #[error("the leading magic is {0:#010x}, expected {MAGIC1:#010x}")]
    BadMagic1(u32),
    #[error("the trailing magic is {0:#010x}, expected {MAGIC2:#010x}")]
    BadMagic2(u32),
    #[error("the checksum does not match the content")]
    BadChecksum,
    #[error("the record of tag {tag} at offset {offset} claims {size} bytes, past the end of the record area")]
    RecordOverrun { tag: u32, offset: usize, size: u32 },
    #[error("tag {tag} at offset {offset} does not fit in a byte")]
    TagOutOfRange { tag: u32, offset: usize },
    #[error("tag {tag} appears twice")]
    DuplicateTag { tag: u8 },
    #[error("tag 0 marks the end of the records and cannot hold a value")]
    ReservedTag,
    #[error("the values need {needed} bytes of records; an ADV holds {DATA_LEN}")]
    TooLarge { needed: usize },
}

/// The tag set of one ADV copy. Tag 0 terminates the records, so it never holds a value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adv {
    tags: BTreeMap<u8, Vec<u8>>,
}

impl Adv {
    pub fn get(&self, tag: u8) -> Option<&[u8]> {
        self.tags.get(&tag).map(Vec::as_slice)
    }

    pub fn tags(&self) -> impl Iterator<Item = (u8, &[u8])> {
        self.tags.iter().map(|(t, v)| (*t, v.as_slice()))
    }

    /// Bytes the records take in the block.
    pub fn used(&self) -> usize {
        self.tags.values().map(|v| RECORD_HEADER + v.len()).sum()
    }

    /// Set `tag`, refusing (and changing nothing) if the result would not fit in one copy.
    pub fn set(&mut self, tag: u8, value: Vec<u8>) -> Result<(), AdvError> {
        if tag == 0 {
            return Err(AdvError::ReservedTag);
        }
        let old = self.tags.get(&tag).map_or(0, |v| RECORD_HEADER + v.len());
        let needed = self.used() - old + RECORD_HEADER + value.len();
        if needed > DATA_LEN {
            return Err(AdvError::TooLarge { needed });
        }
        self.tags.insert(tag, value);
        Ok(())
    }

    /// Remove `tag`; returns whether it was present.
    pub fn delete(&mut self, tag: u8) -> bool {
        self.tags.remove(&tag).is_some()
    }

    /// Parse and verify one copy.
    pub fn parse(block: &[u8]) -> Result<Self, AdvError> {
        if block.len() != ADV_LEN {
            return Err(AdvError::WrongLength(block.len()));
        }
        let magic1 = be32(block, 0);
        if magic1 != MAGIC1 {
            return Err(AdvError::BadMagic1(magic1));
        }
        let magic2 = be32(block, MAGIC2_AT);
        if magic2 != MAGIC2 {
            return Err(AdvError::BadMagic2(magic2));
        }
        if checksum(block) != block[CHECKSUM_AT..CHECKSUM_AT + 32] {
            return Err(AdvError::BadChecksum);
        }
        Self::parse_records(&block[4..4 + DATA_LEN])
    }

    /// Parse the record area alone (no magic or checksum check); offsets in errors are
    /// relative to the block, which the area starts 4 bytes into.
    pub fn parse_records(area: &[u8]) -> Result<Self, AdvError> {
        if area.len() > DATA_LEN {
            return Err(AdvError::TooLarge { needed: area.len() });
        }
        let mut tags = BTreeMap::new();
        let mut at = 0;
        while area.len() - at >= RECORD_HEADER {
            let tag = be32(area, at);
            if tag == 0 {
                break;
            }
            let size = be32(area, at + 4);
            let start = at + RECORD_HEADER;
            let end = start
                .checked_add(size as usize)
                .filter(|end| *end <= area.len())
                .ok_or(AdvError::RecordOverrun {
                    tag,
                    offset: 4 + at,
                    size,
                })?;
            let tag = u8::try_from(tag).map_err(|_| AdvError::TagOutOfRange {
                tag,
                offset: 4 + at,
            })?;
            if tags.insert(tag, area[start..end].to_vec()).is_some() {
                return Err(AdvError::DuplicateTag { tag });
            }
            at = end;
        }
        Ok(Self { tags })
    }

    /// Serialize into one 256 KiB copy (records in ascending tag order, so output is
    /// reproducible; readers never depend on order).
    pub fn serialize(&self) -> Vec<u8> {
        let mut block = vec![0u8; ADV_LEN];
        let mut at = 4;
        for (tag, value) in &self.tags {
            block[at..at + 4].copy_from_slice(&u32::from(*tag).to_be_bytes());
            block[at + 4..at + 8].copy_from_slice(&(value.len() as u32).to_be_bytes());
            block[at + 8..at + 8 + value.len()].copy_from_slice(value);
            at += RECORD_HEADER + value.len();
        }
        Self::seal(&mut block);
        block
    }

    /// Write both magics and the checksum around the records already in `block`, making it a
    /// copy that passes verification whatever its records say (used by the writer, and by
    /// the fuzz target to reach the record parser).
    pub fn seal(block: &mut [u8]) {
        assert_eq!(block.len(), ADV_LEN, "an ADV copy is {ADV_LEN} bytes");
        block[0..4].copy_from_slice(&MAGIC1.to_be_bytes());
        block[MAGIC2_AT..].copy_from_slice(&MAGIC2.to_be_bytes());
        let sum = checksum(block);
        block[CHECKSUM_AT..CHECKSUM_AT + 32].copy_from_slice(&sum);
    }
}

/// SHA-256 of the block with the checksum field taken as zero.
fn checksum(block: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(&block[..CHECKSUM_AT]);
    hasher.update([0u8; 32]);
    hasher.update(&block[CHECKSUM_AT + 32..]);
    hasher.finalize().into()
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Test vectors from docs/formats.md §1a.
    #[test]
    fn empty_adv_matches_the_reference_checksum() {
        let block = Adv::default().serialize();
        assert_eq!(
            hex::encode(&block[CHECKSUM_AT..CHECKSUM_AT + 32]),
            "e7a327df2cfb2c3010ac1a387e9573d46ea52cac7f25db80ad8fbb41aceabf70"
        );
        assert_eq!(&block[ADV_LEN - 4..], &[0xA5, 0xB4, 0xC3, 0xD2]);
    }

    #[test]
    fn upgrade_tag_matches_the_reference_bytes_and_checksum() {
        let mut adv = Adv::default();
        adv.set(6, b"A".to_vec()).unwrap();
        let block = adv.serialize();
        assert_eq!(hex::encode(&block[..13]), "5a4b3c2d000000060000000141");
        assert_eq!(
            hex::encode(&block[CHECKSUM_AT..CHECKSUM_AT + 32]),
            "6ffa9fa1ddf9f3b7ae06dd2286299f55dbd01b12282d1b2dd2206c198daad85b"
        );
        assert_eq!(Adv::parse(&block).unwrap(), adv);
    }

    #[test]
    fn damaged_copies_are_refused_with_the_reason() {
        let mut adv = Adv::default();
        adv.set(7, b"registry/slate:v2".to_vec()).unwrap();
        let good = adv.serialize();

        let mut flipped = good.clone();
        flipped[20] ^= 1;
        assert_eq!(Adv::parse(&flipped), Err(AdvError::BadChecksum));
        let mut no_magic = good.clone();
        no_magic[0] = 0;
        assert!(matches!(Adv::parse(&no_magic), Err(AdvError::BadMagic1(_))));
        assert!(matches!(
            Adv::parse(&vec![0; ADV_LEN]),
            Err(AdvError::BadMagic1(0))
        ));
        assert_eq!(
            Adv::parse(&good[1..]),
            Err(AdvError::WrongLength(ADV_LEN - 1))
        );
    }

    #[test]
    fn a_record_running_past_the_area_is_refused_even_with_a_valid_checksum() {
        let mut block = Adv::default().serialize();
        block[4..8].copy_from_slice(&9u32.to_be_bytes());
        block[8..12].copy_from_slice(&(DATA_LEN as u32).to_be_bytes());
        let sum = checksum(&block);
        block[CHECKSUM_AT..CHECKSUM_AT + 32].copy_from_slice(&sum);
        assert!(matches!(
            Adv::parse(&block),
            Err(AdvError::RecordOverrun { tag: 9, .. })
        ));
    }

    #[test]
    fn values_that_do_not_fit_are_refused_and_change_nothing() {
        let mut adv = Adv::default();
        adv.set(10, vec![1; DATA_LEN - RECORD_HEADER]).unwrap();
        let before = adv.clone();
        assert_eq!(
            adv.set(11, vec![]),
            Err(AdvError::TooLarge {
                needed: DATA_LEN + RECORD_HEADER
            })
        );
        assert_eq!(adv, before);
        // Replacing the value in place frees its old record first.
        adv.set(10, vec![2; DATA_LEN - RECORD_HEADER]).unwrap();
        assert_eq!(adv.set(0, vec![]), Err(AdvError::ReservedTag));
    }

    proptest! {
        #[test]
        fn round_trips(tags in proptest::collection::btree_map(1u8.., proptest::collection::vec(any::<u8>(), 0..300), 0..20)) {
            let mut adv = Adv::default();
            for (tag, value) in &tags {
                adv.set(*tag, value.clone()).unwrap();
            }
            let parsed = Adv::parse(&adv.serialize()).unwrap();
            prop_assert_eq!(parsed.tags().map(|(t, v)| (t, v.to_vec())).collect::<BTreeMap<_, _>>(), tags);
        }
    }
}
