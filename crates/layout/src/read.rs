//! Reading a GPT, decoded by hand from the format (UEFI specification §5.3, docs/formats.md §5).
//!
//! Hand-written because the maintained `gpt` crate's reader panics on valid tables whose entries
//! are larger than 128 bytes and does not fall back to the backup when the primary partition
//! array is damaged. Every number read from the disk is checked before it is used, with checked
//! arithmetic, so a hostile table yields an error and never a panic or a huge allocation.
//!
//! The primary copy (LBA 1) is used when it passes every check; otherwise the backup (at the
//! primary's alternate LBA when the primary header itself is intact, then at the last LBA). The
//! entries of the copy used must then lie inside its usable area without overlapping: slate
//! writes into partitions it finds by label, and must not be led to write over another partition
//! or over the table itself.

use slate_disk::Disk;
use uuid::Uuid;

use crate::{LayoutError, PartitionInfo};

/// The sector size [`crate::read_gpt`] reads with.
pub const DEFAULT_SECTOR_SIZE: u64 = 512;
const SIGNATURE: &[u8; 8] = b"EFI PART";
const HEADER_MIN_SIZE: u32 = 92;
/// Entries are 128 × 2^n bytes (UEFI). The specification sets no upper bound; 4096 is far above
/// anything a partitioning tool writes and keeps one entry within one 4096-byte sector.
const ENTRY_MIN_SIZE: u32 = 128;
const ENTRY_MAX_SIZE: u32 = 4096;
/// The largest partition array accepted: 64 times the usual 16 KiB (128 entries of 128 bytes),
/// so that a hostile entry count cannot make the reader read or allocate gigabytes.
const ARRAY_MAX_BYTES: u64 = 1 << 20;
/// The bytes of an entry that carry meaning; larger entries end in bytes this reader ignores.
const ENTRY_USED_BYTES: usize = 128;
/// An error lists at most this many entry problems, then how many more there were.
const MAX_LISTED_PROBLEMS: usize = 16;

/// A partition table read from a disk, from whichever GPT copy was usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptTable {
    pub disk_guid: Uuid,
    pub sector_size: u64,
    pub first_usable_lba: u64,
    pub last_usable_lba: u64,
    /// The used entries (type GUID not nil), in table order.
    pub partitions: Vec<PartitionInfo>,
    /// Which copy the partitions were read from.
    pub source: GptSource,
    /// What is wrong with the disk's GPT without preventing the read (the primary refused, or
    /// the backup unusable), in words for a user. Empty on a healthy disk.
    pub warnings: Vec<String>,
}

impl GptTable {
    /// Whether the primary copy was refused and the backup used.
    pub fn used_backup(&self) -> bool {
        matches!(self.source, GptSource::Backup { .. })
    }
}

/// The GPT copy a [`GptTable`] was read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GptSource {
    Primary,
    /// The backup header at `lba`, because the primary was refused for `primary_problem`.
    Backup {
        lba: u64,
        primary_problem: String,
    },
}

/// Read the GPT of `disk` with sectors of `sector_size` bytes (512 or 4096). See
/// [`crate::read_gpt`].
pub fn read_gpt_with_sector_size<D: Disk>(
    disk: D,
    sector_size: u64,
) -> Result<GptTable, LayoutError> {
    if sector_size != 512 && sector_size != 4096 {
        return Err(LayoutError::InvalidLayout(format!(
            "sector size {sector_size}: only 512 and 4096 are supported"
        )));
    }
    let sectors = disk.len() / sector_size;
    // LBA 0 (protective MBR), LBA 1 (primary header) and a last LBA (backup header) at least.
    if sectors < 3 {
        return Err(LayoutError::NoGpt(format!(
            "the disk is {} bytes, too small to hold a GPT",
            disk.len()
        )));
    }
    let geometry = Geometry {
        sector_size,
        last_lba: sectors - 1,
    };
    match read_copy(&disk, &geometry, 1) {
        Ok(primary) => {
            let mut warnings = Vec::new();
            if let Err(backup) = read_backup(&disk, &geometry, Some(primary.header.alternate_lba)) {
                warnings.push(format!(
                    "the backup GPT is unusable ({}): the disk has no second copy of its \
                     partition table",
                    backup.reason
                ));
            }
            into_table(primary, &geometry, GptSource::Primary, warnings)
        }
        Err(primary) => match read_backup(&disk, &geometry, primary.trusted_alternate_lba) {
            Ok((lba, backup)) => {
                let warning = format!(
                    "the primary GPT is refused ({}); the backup at LBA {lba} is used",
                    primary.reason
                );
                let source = GptSource::Backup {
                    lba,
                    primary_problem: primary.reason,
                };
                into_table(backup, &geometry, source, vec![warning])
            }
            Err(backup) if !primary.has_signature && !backup.has_signature => {
                Err(LayoutError::NoGpt(format!(
                    "no \"EFI PART\" signature at LBA 1 nor at the last LBA ({})",
                    geometry.last_lba
                )))
            }
            Err(backup) => Err(LayoutError::BadGpt {
                primary: primary.reason,
                backup: backup.reason,
            }),
        },
    }
}

struct Geometry {
    sector_size: u64,
    last_lba: u64,
}

/// The fields of a header that passed its own checks.
struct Header {
    alternate_lba: u64,
    first_usable_lba: u64,
    last_usable_lba: u64,
    disk_guid: Uuid,
    entry_size: u32,
}

/// A GPT copy whose header and partition array passed every check.
struct Copy {
    header: Header,
    array: Vec<u8>,
}

/// Why a copy was refused.
struct Refusal {
    reason: String,
    /// Whether the header sector started with the GPT signature.
    has_signature: bool,
    /// The header's alternate LBA, when the header's CRC was right and the field can be trusted.
    trusted_alternate_lba: Option<u64>,
}

/// The backup copy: at `alternate_lba` (from an intact primary header) if it names a plausible
/// place, then at the disk's last LBA, where the backup belongs when the primary says nothing.
fn read_backup<D: Disk>(
    disk: &D,
    geometry: &Geometry,
    alternate_lba: Option<u64>,
) -> Result<(u64, Copy), Refusal> {
    let mut places = Vec::with_capacity(2);
    if let Some(lba) = alternate_lba.filter(|&lba| lba > 1 && lba != geometry.last_lba) {
        places.push(lba);
    }
    places.push(geometry.last_lba);
    let mut refusals = Vec::with_capacity(places.len());
    for lba in places {
        match read_copy(disk, geometry, lba) {
            Ok(copy) => return Ok((lba, copy)),
            Err(refusal) => refusals.push(refusal),
        }
    }
    Err(Refusal {
        reason: refusals
            .iter()
            .map(|r| r.reason.as_str())
            .collect::<Vec<_>>()
            .join("; "),
        has_signature: refusals.iter().any(|r| r.has_signature),
        trusted_alternate_lba: None,
    })
}

/// The header at `lba` and the partition array it describes, if every check passes.
fn read_copy<D: Disk>(disk: &D, geometry: &Geometry, lba: u64) -> Result<Copy, Refusal> {
    let mut refusal = Refusal {
        reason: String::new(),
        has_signature: false,
        trusted_alternate_lba: None,
    };
    let refuse = |refusal: &Refusal, problem: String| Refusal {
        reason: format!("header at LBA {lba}: {problem}"),
        has_signature: refusal.has_signature,
        trusted_alternate_lba: refusal.trusted_alternate_lba,
    };

    let sector_size = geometry.sector_size;
    let offset = match lba.checked_mul(sector_size) {
        Some(offset) if lba <= geometry.last_lba => offset,
        _ => {
            let problem = format!("past the end of the disk (last LBA {})", geometry.last_lba);
            return Err(refuse(&refusal, problem));
        }
    };
    let sector = disk
        .read_vec(offset, sector_size as usize)
        .map_err(|e| refuse(&refusal, format!("cannot be read: {e}")))?;
    if !sector.starts_with(SIGNATURE) {
        return Err(refuse(&refusal, "no \"EFI PART\" signature".into()));
    }
    refusal.has_signature = true;

    let revision = le_u32(&sector, 8);
    if revision >> 16 != 1 {
        let problem = format!("unsupported revision {revision:#010x} (expected 1.x)");
        return Err(refuse(&refusal, problem));
    }
    let header_size = le_u32(&sector, 12);
    if !(u64::from(HEADER_MIN_SIZE)..=sector_size).contains(&u64::from(header_size)) {
        let problem =
            format!("header size {header_size} is not between {HEADER_MIN_SIZE} and {sector_size}");
        return Err(refuse(&refusal, problem));
    }
    let mut covered = sector
        .get(..header_size as usize)
        .unwrap_or_default()
        .to_vec();
    if let Some(crc_field) = covered.get_mut(16..20) {
        crc_field.fill(0);
    }
    let (stored_crc, computed_crc) = (le_u32(&sector, 16), crc32fast::hash(&covered));
    if stored_crc != computed_crc {
        let problem = format!(
            "header CRC32 is wrong (stored {stored_crc:#010x}, computed {computed_crc:#010x})"
        );
        return Err(refuse(&refusal, problem));
    }
    let alternate_lba = le_u64(&sector, 32);
    refusal.trusted_alternate_lba = Some(alternate_lba);

    let my_lba = le_u64(&sector, 24);
    if my_lba != lba {
        let problem = format!("it says it lies at LBA {my_lba}");
        return Err(refuse(&refusal, problem));
    }
    let entry_size = le_u32(&sector, 84);
    if !(ENTRY_MIN_SIZE..=ENTRY_MAX_SIZE).contains(&entry_size) || !entry_size.is_power_of_two() {
        let problem = format!(
            "partition entry size {entry_size} is not 128 × 2^n bytes between {ENTRY_MIN_SIZE} \
             and {ENTRY_MAX_SIZE}"
        );
        return Err(refuse(&refusal, problem));
    }
    let entry_count = le_u32(&sector, 80);
    let array_bytes = match u64::from(entry_count).checked_mul(u64::from(entry_size)) {
        Some(bytes) if bytes <= ARRAY_MAX_BYTES => bytes,
        _ => {
            let problem = format!(
                "{entry_count} entries of {entry_size} bytes exceed the {ARRAY_MAX_BYTES}-byte \
                 partition array this reader accepts"
            );
            return Err(refuse(&refusal, problem));
        }
    };

    let array_lba = le_u64(&sector, 72);
    let array_sectors = array_bytes.div_ceil(sector_size);
    let array_range = match array_sectors.checked_sub(1) {
        None => None, // no entries, no array
        Some(extra) => match array_lba.checked_add(extra) {
            Some(array_last) if array_last <= geometry.last_lba => Some((array_lba, array_last)),
            _ => {
                let problem = format!(
                    "the partition array (LBA {array_lba}, {array_sectors} sectors) runs past \
                     the end of the disk (last LBA {})",
                    geometry.last_lba
                );
                return Err(refuse(&refusal, problem));
            }
        },
    };
    let reserved = [
        (0, "the protective MBR".to_string()),
        (lba, format!("this header (LBA {lba})")),
        (
            alternate_lba,
            format!("the other header (LBA {alternate_lba})"),
        ),
    ];
    if let Some((first, last)) = array_range {
        if let Some((_, what)) = reserved.iter().find(|(at, _)| (first..=last).contains(at)) {
            let problem = format!("the partition array (LBA {first}-{last}) overlaps {what}");
            return Err(refuse(&refusal, problem));
        }
    }

    let (first_usable_lba, last_usable_lba) = (le_u64(&sector, 40), le_u64(&sector, 48));
    let usable = first_usable_lba..=last_usable_lba;
    let usable_problem = if first_usable_lba > last_usable_lba {
        Some(format!(
            "the first usable LBA {first_usable_lba} is after the last usable LBA {last_usable_lba}"
        ))
    } else if last_usable_lba > geometry.last_lba {
        Some(format!(
            "the last usable LBA {last_usable_lba} is past the end of the disk (last LBA {})",
            geometry.last_lba
        ))
    } else if let Some((_, what)) = reserved.iter().find(|(at, _)| usable.contains(at)) {
        Some(format!(
            "the usable area (LBA {first_usable_lba}-{last_usable_lba}) contains {what}"
        ))
    } else {
        array_range
            .filter(|&(first, last)| first <= last_usable_lba && first_usable_lba <= last)
            .map(|(first, last)| {
                format!(
                    "the usable area (LBA {first_usable_lba}-{last_usable_lba}) overlaps the \
                     partition array (LBA {first}-{last})"
                )
            })
    };
    if let Some(problem) = usable_problem {
        return Err(refuse(&refusal, problem));
    }

    // Bounded by ARRAY_MAX_BYTES and inside the disk, both checked above.
    let array_offset = array_lba.saturating_mul(sector_size);
    let array = disk
        .read_vec(array_offset, array_bytes as usize)
        .map_err(|e| refuse(&refusal, format!("the partition array cannot be read: {e}")))?;
    let (stored_crc, computed_crc) = (le_u32(&sector, 88), crc32fast::hash(&array));
    if stored_crc != computed_crc {
        let problem = format!(
            "the partition array CRC32 is wrong (stored {stored_crc:#010x}, computed \
             {computed_crc:#010x})"
        );
        return Err(refuse(&refusal, problem));
    }

    Ok(Copy {
        header: Header {
            alternate_lba,
            first_usable_lba,
            last_usable_lba,
            disk_guid: Uuid::from_bytes_le(field(&sector, 56)),
            entry_size,
        },
        array,
    })
}

/// One used entry of a partition array.
struct Entry {
    /// 1-based, as tools number partitions.
    number: usize,
    type_guid: Uuid,
    unique_guid: Uuid,
    first_lba: u64,
    last_lba: u64,
    label: String,
}

impl Entry {
    /// How error messages name the entry: label, number and LBA range.
    fn describe(&self) -> String {
        format!(
            "{:?} (entry {}, LBA {}-{})",
            self.label, self.number, self.first_lba, self.last_lba
        )
    }
}

fn decode_entries(array: &[u8], entry_size: usize) -> Vec<Entry> {
    array
        .chunks_exact(entry_size.max(ENTRY_USED_BYTES))
        .enumerate()
        .filter_map(|(index, raw)| {
            let type_guid = Uuid::from_bytes_le(field(raw, 0));
            if type_guid.is_nil() {
                return None;
            }
            let units: Vec<u16> = (0..36)
                .map(|unit| u16::from_le_bytes(field(raw, 56 + 2 * unit)))
                .take_while(|&unit| unit != 0)
                .collect();
            Some(Entry {
                number: index + 1,
                type_guid,
                unique_guid: Uuid::from_bytes_le(field(raw, 16)),
                first_lba: le_u64(raw, 32),
                last_lba: le_u64(raw, 40),
                label: String::from_utf16_lossy(&units),
            })
        })
        .collect()
}

/// Every way the used entries break the layout rules: reversed ranges, ranges outside the usable
/// area, overlaps.
fn entry_problems(entries: &[Entry], header: &Header, geometry: &Geometry) -> Vec<String> {
    let mut problems = Vec::new();
    let (first_usable, last_usable) = (header.first_usable_lba, header.last_usable_lba);
    for entry in entries {
        let what = entry.describe();
        if entry.first_lba > entry.last_lba {
            problems.push(format!("partition {what} ends before it starts"));
        } else if entry.last_lba > geometry.last_lba {
            problems.push(format!(
                "partition {what} runs past the end of the disk (last LBA {})",
                geometry.last_lba
            ));
        } else if entry.first_lba < first_usable {
            problems.push(format!(
                "partition {what} starts before the first usable LBA {first_usable}, over the \
                 protective MBR or the primary GPT"
            ));
        } else if entry.last_lba > last_usable {
            problems.push(format!(
                "partition {what} ends after the last usable LBA {last_usable}, over the backup \
                 GPT"
            ));
        }
    }

    // Sorted by start, an entry overlaps an earlier one exactly when it starts at or before the
    // furthest end seen so far: one message per overlapping entry, naming that earlier one.
    let mut ordered: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.first_lba <= e.last_lba)
        .collect();
    ordered.sort_by_key(|e| (e.first_lba, e.last_lba));
    let mut furthest: Option<&Entry> = None;
    for entry in ordered {
        if let Some(earlier) = furthest {
            if entry.first_lba <= earlier.last_lba {
                problems.push(format!(
                    "partitions {} and {} overlap",
                    earlier.describe(),
                    entry.describe()
                ));
            }
        }
        if furthest.is_none_or(|earlier| entry.last_lba > earlier.last_lba) {
            furthest = Some(entry);
        }
    }
    problems
}

/// The table of a copy that passed its checks, if its entries obey the layout rules.
fn into_table(
    copy: Copy,
    geometry: &Geometry,
    source: GptSource,
    warnings: Vec<String>,
) -> Result<GptTable, LayoutError> {
    let which = match source {
        GptSource::Primary => "primary",
        GptSource::Backup { .. } => "backup",
    };
    let entries = decode_entries(&copy.array, copy.header.entry_size as usize);
    let mut problems = entry_problems(&entries, &copy.header, geometry);
    if problems.len() > MAX_LISTED_PROBLEMS {
        let more = problems.len() - MAX_LISTED_PROBLEMS;
        problems.truncate(MAX_LISTED_PROBLEMS);
        problems.push(format!("and {more} more problems"));
    }
    if !problems.is_empty() {
        return Err(LayoutError::InvalidTable { which, problems });
    }
    let partitions = entries
        .into_iter()
        .map(|entry| {
            // Inside the disk (checked above), so these products fit in the disk's length.
            let sectors = entry.last_lba - entry.first_lba + 1;
            PartitionInfo {
                label: entry.label,
                type_guid: entry.type_guid,
                // A table holds far fewer than 2^32 entries (the array is read whole).
                number: u32::try_from(entry.number).unwrap_or(u32::MAX),
                unique_guid: entry.unique_guid,
                start: entry.first_lba.saturating_mul(geometry.sector_size),
                len: sectors.saturating_mul(geometry.sector_size),
            }
        })
        .collect();
    Ok(GptTable {
        disk_guid: copy.header.disk_guid,
        sector_size: geometry.sector_size,
        first_usable_lba: copy.header.first_usable_lba,
        last_usable_lba: copy.header.last_usable_lba,
        partitions,
        source,
        warnings,
    })
}

/// `N` bytes at `at`; zeros past the end of `bytes` (callers read fixed fields of buffers at
/// least a header or an entry long, so this never happens, but it must not panic either).
fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    at.checked_add(N)
        .and_then(|end| bytes.get(at..end))
        .and_then(|slice| slice.try_into().ok())
        .unwrap_or([0; N])
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(field(bytes, at))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(field(bytes, at))
}
