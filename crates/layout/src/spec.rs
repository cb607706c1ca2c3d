//! The layout as a value: which partitions, in which order, how big, and where they land on a
//! disk of a given size. Pure: nothing here touches a disk.

use uuid::Uuid;

use crate::guid::{disk_guid, partition_guid};
use crate::LayoutError;

/// One mebibyte.
pub const MIB: u64 = 1024 * 1024;

/// GPT type of an EFI System Partition.
pub const ESP_TYPE: Uuid = Uuid::from_u128(0xC12A7328_F81F_11D2_BA4B_00A0C93EC93B);
/// GPT type "Linux filesystem data".
pub const LINUX_DATA_TYPE: Uuid = Uuid::from_u128(0x0FC63DAF_8483_4772_8E79_3D69D8477DE4);
/// GPT type of a Discoverable Partitions `/var` partition.
pub const VAR_TYPE: Uuid = Uuid::from_u128(0x4D21B016_B534_45C2_A9FB_5C16E091FD2D);

/// GPT type "Linux root (x86-64)" (Discoverable Partitions): the Btrfs pool of a
/// `btrfs-image` disk, which holds the root snapshots.
pub const LINUX_ROOT_X86_64_TYPE: Uuid = Uuid::from_u128(0x4F68BCE3_E8CD_4DB1_96E7_FBCAF984B709);
/// The partition name of that pool (docs/formats.md §12.8).
pub const POOL_LABEL: &str = "SLATE-POOL";

/// Partition labels of the reference layout.
pub const EFI_LABEL: &str = "EFI";
pub const META_LABEL: &str = "META";
pub const STATE_LABEL: &str = "STATE";
pub const EPHEMERAL_LABEL: &str = "EPHEMERAL";

/// The META partition is exactly this size: Talos' volume locator checks it.
pub const META_SIZE: u64 = MIB;

/// Number of entries of each GPT partition array, and the size of one entry. 128 × 128 bytes is
/// what every partitioner writes and what firmware expects.
const ENTRIES: u64 = 128;
const ENTRY_SIZE: u64 = 128;

/// How big a partition is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionSize {
    /// Exactly this many bytes (a multiple of the layout's alignment).
    Bytes(u64),
    /// Everything from its start to the last alignment boundary before the backup GPT, but at
    /// least `min` bytes. Only the last partition may be sized this way. Its end is aligned too
    /// (giving up less than one alignment unit), as partitioners do, so that every partition
    /// can be encrypted or resized in whole units.
    RestOfDisk { min: u64 },
}

/// One partition of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpec {
    /// GPT partition name; partitions are found by it. ASCII, 1-36 characters, no `:`.
    pub label: String,
    pub type_guid: Uuid,
    pub size: PartitionSize,
    /// GPT attribute bits (docs/formats.md §5).
    pub attributes: u64,
}

/// The sizes a caller may choose for the reference layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutParams {
    /// Size of the EFI System Partition (FAT32 needs at least about 33 MiB).
    pub esp_size: u64,
    /// Size of STATE (machine configuration).
    pub state_size: u64,
    /// The smallest EPHEMERAL (`/var`) the disk must leave room for; it gets the rest.
    pub ephemeral_min_size: u64,
    /// GPT type of EPHEMERAL: [`LINUX_DATA_TYPE`] (the default: slate mounts by label, and
    /// systemd's auto-discovery of a [`VAR_TYPE`] partition would also require its GUID to be
    /// keyed to the machine id) or [`VAR_TYPE`].
    pub ephemeral_type: Uuid,
    /// Logical sector size of the target disk: 512 or 4096.
    pub sector_size: u64,
}

impl Default for LayoutParams {
    fn default() -> Self {
        Self {
            esp_size: 100 * MIB,
            state_size: 100 * MIB,
            ephemeral_min_size: 32 * MIB,
            ephemeral_type: LINUX_DATA_TYPE,
            sector_size: 512,
        }
    }
}

/// A disk layout: partitions in table order plus what makes its GUIDs reproducible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskLayout {
    /// Seed of every GUID of the disk (see [`crate::partition_guid`]).
    pub image_id: String,
    pub partitions: Vec<PartitionSpec>,
    /// Partition starts are multiples of this many bytes (1 MiB: right for every SSD erase
    /// block, RAID stripe and 4K-sector disk in practice, and what Talos and sgdisk use).
    pub alignment: u64,
    pub sector_size: u64,
}

/// A partition placed on a disk of known size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedPartition {
    /// 1-based GPT entry number (`/dev/sda<number>`).
    pub number: u32,
    pub label: String,
    pub type_guid: Uuid,
    pub guid: Uuid,
    pub first_lba: u64,
    /// Inclusive, as GPT stores it.
    pub last_lba: u64,
    pub attributes: u64,
    pub sector_size: u64,
}

impl PlacedPartition {
    /// Byte offset of the partition on the disk.
    pub fn start(&self) -> u64 {
        self.first_lba * self.sector_size
    }

    /// Length of the partition in bytes.
    pub fn len(&self) -> u64 {
        (self.last_lba + 1 - self.first_lba) * self.sector_size
    }

    /// Never true for a placed partition; present for symmetry with [`Self::len`].
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A layout placed on a disk of known size: everything the GPT will hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedLayout {
    pub disk_guid: Uuid,
    pub sector_size: u64,
    /// Total sectors of the disk.
    pub total_lba: u64,
    pub first_usable_lba: u64,
    pub last_usable_lba: u64,
    pub partitions: Vec<PlacedPartition>,
}

impl PlacedLayout {
    /// The partition labelled `label`.
    pub fn get(&self, label: &str) -> Option<&PlacedPartition> {
        self.partitions.iter().find(|p| p.label == label)
    }
}

impl DiskLayout {
    /// The reference layout of DESIGN.md: EFI, META, STATE, EPHEMERAL (rest of disk).
    pub fn reference(image_id: &str, params: &LayoutParams) -> Self {
        let part = |label: &str, type_guid, size| PartitionSpec {
            label: label.to_string(),
            type_guid,
            size,
            attributes: 0,
        };
        Self {
            image_id: image_id.to_string(),
            partitions: vec![
                part(EFI_LABEL, ESP_TYPE, PartitionSize::Bytes(params.esp_size)),
                part(META_LABEL, LINUX_DATA_TYPE, PartitionSize::Bytes(META_SIZE)),
                part(
                    STATE_LABEL,
                    LINUX_DATA_TYPE,
                    PartitionSize::Bytes(params.state_size),
                ),
                part(
                    EPHEMERAL_LABEL,
                    params.ephemeral_type,
                    PartitionSize::RestOfDisk {
                        min: params.ephemeral_min_size,
                    },
                ),
            ],
            alignment: MIB,
            sector_size: params.sector_size,
        }
    }

    /// Checks everything that does not depend on the disk: labels, sizes, sector size,
    /// alignment, that "rest of disk" is last.
    pub fn validate(&self) -> Result<(), LayoutError> {
        let invalid = |reason: String| Err(LayoutError::InvalidLayout(reason));
        if self.image_id.is_empty() {
            return invalid("the image id is empty".into());
        }
        if self.sector_size != 512 && self.sector_size != 4096 {
            return invalid(format!(
                "sector size {} is not 512 or 4096",
                self.sector_size
            ));
        }
        if self.alignment == 0 || self.alignment % self.sector_size != 0 {
            return invalid(format!(
                "alignment {} is not a positive multiple of the sector size {}",
                self.alignment, self.sector_size
            ));
        }
        if self.partitions.is_empty() || self.partitions.len() as u64 > ENTRIES {
            return invalid(format!(
                "{} partitions; a GPT of {ENTRIES} entries holds 1 to {ENTRIES}",
                self.partitions.len()
            ));
        }
        for (i, p) in self.partitions.iter().enumerate() {
            validate_label(&p.label)?;
            if self.partitions[..i].iter().any(|q| q.label == p.label) {
                return invalid(format!("more than one partition is labelled {:?}", p.label));
            }
            if p.type_guid.is_nil() {
                return invalid(format!(
                    "partition {:?} has the nil type GUID, which marks an unused entry",
                    p.label
                ));
            }
            match p.size {
                PartitionSize::Bytes(n) if n == 0 || n % self.alignment != 0 => {
                    return invalid(format!(
                        "partition {:?} is {n} bytes, not a positive multiple of the {}-byte alignment",
                        p.label, self.alignment
                    ));
                }
                PartitionSize::RestOfDisk { .. } if i + 1 != self.partitions.len() => {
                    return invalid(format!(
                        "partition {:?} takes the rest of the disk but is not the last one",
                        p.label
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// GPT geometry of a disk of `total_lba` sectors: first and last usable LBA.
    fn usable(&self, total_lba: u64) -> Option<(u64, u64)> {
        let array_lba = (ENTRIES * ENTRY_SIZE).div_ceil(self.sector_size);
        // LBA 0 protective MBR, LBA 1 header, then the array; mirrored at the end.
        let first = 2 + array_lba;
        let last = total_lba.checked_sub(2 + array_lba)?;
        (first <= last).then_some((first, last))
    }

    /// Partition starts and minimal lengths, and the disk size they need, in sectors. Sizes come
    /// from profiles and bundles, so every sum is checked: a layout that would need more than
    /// 2^64 bytes is refused, naming the partition where the count ran out, rather than wrapping
    /// around into a small disk that seems to fit.
    fn starts(&self) -> Result<(Vec<(u64, u64)>, u64), LayoutError> {
        let lb = self.sector_size;
        let align = self.alignment / lb;
        let array_lba = (ENTRIES * ENTRY_SIZE).div_ceil(lb);
        let too_large = |label: &str| {
            LayoutError::InvalidLayout(format!(
                "partition {label:?} ends beyond 2^64 bytes: the partition sizes add up to more \
                 than any disk"
            ))
        };
        let align_up = |sectors: u64| sectors.div_ceil(align).checked_mul(align);
        let mut cursor = 2 + array_lba;
        let mut spans = Vec::new();
        for p in &self.partitions {
            let start = align_up(cursor).ok_or_else(|| too_large(&p.label))?;
            let len = match p.size {
                PartitionSize::Bytes(n) => n / lb,
                PartitionSize::RestOfDisk { min } => {
                    align_up(min.div_ceil(lb).max(1)).ok_or_else(|| too_large(&p.label))?
                }
            };
            spans.push((start, len));
            cursor = start
                .checked_add(len)
                .filter(|end| end.checked_mul(lb).is_some())
                .ok_or_else(|| too_large(&p.label))?;
        }
        // The backup array and header follow the last usable sector.
        let total = cursor
            .checked_add(array_lba + 1)
            .filter(|sectors| sectors.checked_mul(lb).is_some())
            .ok_or_else(|| too_large(self.partitions.last().map_or("", |p| p.label.as_str())))?;
        Ok((spans, total))
    }

    /// The smallest disk, in bytes, this layout fits on.
    pub fn min_disk_len(&self) -> Result<u64, LayoutError> {
        self.validate()?;
        // `starts` checked that the sector count times the sector size fits.
        Ok(self.starts()?.1 * self.sector_size)
    }

    /// Where every partition lands on a disk of `disk_len` bytes. Fails, before anything is
    /// written, when the layout is invalid or the disk too small.
    pub fn place(&self, disk_len: u64) -> Result<PlacedLayout, LayoutError> {
        let needed = self.min_disk_len()?;
        let lb = self.sector_size;
        if disk_len < needed {
            return Err(LayoutError::DiskTooSmall {
                have: disk_len,
                needed,
            });
        }
        if disk_len % lb != 0 {
            return Err(LayoutError::InvalidLayout(format!(
                "the disk is {disk_len} bytes, not a whole number of {lb}-byte sectors"
            )));
        }
        let total_lba = disk_len / lb;
        let (first_usable, last_usable) =
            self.usable(total_lba).ok_or(LayoutError::DiskTooSmall {
                have: disk_len,
                needed,
            })?;
        let (spans, _) = self.starts()?;
        let align = self.alignment / lb;
        let aligned_end = (last_usable + 1) / align * align - 1;
        let partitions = self
            .partitions
            .iter()
            .zip(spans)
            .enumerate()
            .map(|(i, (p, (start, len)))| {
                let last_lba = match p.size {
                    PartitionSize::Bytes(_) => start + len - 1,
                    PartitionSize::RestOfDisk { .. } => aligned_end,
                };
                PlacedPartition {
                    number: i as u32 + 1,
                    label: p.label.clone(),
                    type_guid: p.type_guid,
                    guid: partition_guid(&self.image_id, &p.label),
                    first_lba: start,
                    last_lba,
                    attributes: p.attributes,
                    sector_size: lb,
                }
            })
            .collect();
        Ok(PlacedLayout {
            disk_guid: disk_guid(&self.image_id),
            sector_size: lb,
            total_lba,
            first_usable_lba: first_usable,
            last_usable_lba: last_usable,
            partitions,
        })
    }
}

/// GPT names hold 36 UTF-16 code units; slate keeps them ASCII so that a label is the same
/// string to every tool, and free of `:` so that GUID keys stay unambiguous.
fn validate_label(label: &str) -> Result<(), LayoutError> {
    let ok = !label.is_empty()
        && label.len() <= 36
        && label.bytes().all(|b| b.is_ascii_graphic() && b != b':');
    if ok {
        Ok(())
    } else {
        Err(LayoutError::InvalidLayout(format!(
            "partition label {label:?} must be 1-36 printable ASCII characters without spaces or ':'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> DiskLayout {
        DiskLayout::reference("test", &LayoutParams::default())
    }

    #[test]
    fn reference_layout_on_512_mib() {
        let placed = reference().place(512 * MIB).unwrap();
        let spans: Vec<_> = placed
            .partitions
            .iter()
            .map(|p| (p.label.as_str(), p.first_lba, p.last_lba))
            .collect();
        assert_eq!(
            spans,
            [
                ("EFI", 2048, 2048 + 204800 - 1),
                ("META", 206848, 206848 + 2048 - 1),
                ("STATE", 208896, 208896 + 204800 - 1),
                ("EPHEMERAL", 413696, 1048576 - 2048 - 1),
            ]
        );
        assert_eq!(placed.get("META").unwrap().len(), META_SIZE);
        assert_eq!(
            (placed.first_usable_lba, placed.last_usable_lba),
            (34, 1048542)
        );
    }

    #[test]
    fn min_disk_len_is_exactly_the_fitting_size() {
        let layout = reference();
        let min = layout.min_disk_len().unwrap();
        assert_eq!(min, (1 + 100 + 1 + 100 + 32) * MIB + 33 * 512);
        assert!(layout.place(min).is_ok());
        let err = layout.place(min - 512).unwrap_err();
        assert!(matches!(err, LayoutError::DiskTooSmall { needed, .. } if needed == min));
        let placed = layout.place(min).unwrap();
        assert_eq!(placed.get("EPHEMERAL").unwrap().len(), 32 * MIB);
    }

    #[test]
    fn four_k_sectors() {
        let params = LayoutParams {
            sector_size: 4096,
            ..LayoutParams::default()
        };
        let placed = DiskLayout::reference("t", &params)
            .place(512 * MIB)
            .unwrap();
        assert_eq!(placed.partitions[0].first_lba, 256);
        assert_eq!(
            (placed.first_usable_lba, placed.last_usable_lba),
            (6, 131072 - 6)
        );
        assert_eq!(placed.get("META").unwrap().len(), META_SIZE);
    }

    #[test]
    fn invalid_layouts_are_refused() {
        let mut l = reference();
        l.partitions[1].size = PartitionSize::Bytes(MIB + 512);
        assert!(l.validate().unwrap_err().to_string().contains("META"));
        let mut l = reference();
        l.partitions.swap(2, 3);
        assert!(l
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not the last"));
        let mut l = reference();
        l.partitions[2].label = "META".into();
        assert!(l.validate().is_err());
        let mut l = reference();
        l.partitions[0].label = "a:b".into();
        assert!(l.validate().is_err());
        let mut l = reference();
        l.sector_size = 1024;
        assert!(l.validate().is_err());
    }

    /// issue 18: sizes near 2^64 bytes once wrapped around (a huge layout "fitting" a small
    /// disk, or a panic in a debug build); now the layout is refused naming the partition.
    #[test]
    fn sizes_that_overflow_are_refused_naming_the_partition() {
        let huge = u64::MAX / MIB * MIB;
        let mut l = reference();
        l.partitions[0].size = PartitionSize::Bytes(huge);
        let err = l.min_disk_len().unwrap_err().to_string();
        assert!(err.contains("\"EFI\" ends beyond 2^64 bytes"), "{err}");
        assert!(l.place(512 * MIB).is_err());

        let mut l = reference();
        l.partitions[2].size = PartitionSize::Bytes(1 << 62);
        l.partitions[3].size = PartitionSize::RestOfDisk { min: 3 << 62 };
        let err = l.place(u64::MAX / 512 * 512).unwrap_err().to_string();
        assert!(
            err.contains("\"EPHEMERAL\" ends beyond 2^64 bytes"),
            "{err}"
        );

        // Each size alone fits in sectors, but not the disk in bytes.
        let mut l = reference();
        l.partitions[3].size = PartitionSize::RestOfDisk {
            min: u64::MAX - MIB,
        };
        let err = l.min_disk_len().unwrap_err().to_string();
        assert!(err.contains("EPHEMERAL"), "{err}");

        // The largest layout that fits is still placed.
        let mut l = reference();
        l.partitions[2].size = PartitionSize::Bytes(1 << 62);
        let min = l.min_disk_len().unwrap();
        assert!(l.place(min).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn placed_partitions_are_aligned_ordered_and_inside(
            sizes in proptest::collection::vec(1u64..64, 1..6),
            extra in 0u64..(64 * MIB),
            sector_4k in proptest::bool::ANY,
        ) {
            let sector_size = if sector_4k { 4096 } else { 512 };
            let mut partitions: Vec<_> = sizes.iter().enumerate().map(|(i, s)| PartitionSpec {
                label: format!("P{i}"),
                type_guid: LINUX_DATA_TYPE,
                size: PartitionSize::Bytes(s * MIB),
                attributes: 0,
            }).collect();
            partitions.push(PartitionSpec {
                label: "REST".into(),
                type_guid: LINUX_DATA_TYPE,
                size: PartitionSize::RestOfDisk { min: MIB },
                attributes: 0,
            });
            let layout = DiskLayout { image_id: "p".into(), partitions, alignment: MIB, sector_size };
            let len = (layout.min_disk_len().unwrap() + extra) / sector_size * sector_size;
            let placed = layout.place(len).unwrap();
            let mut end = placed.first_usable_lba;
            for p in &placed.partitions {
                proptest::prop_assert_eq!(p.start() % MIB, 0);
                proptest::prop_assert!(p.first_lba >= end);
                proptest::prop_assert!(p.last_lba <= placed.last_usable_lba);
                end = p.last_lba + 1;
            }
            let rest = placed.partitions.last().unwrap();
            let align = MIB / sector_size;
            proptest::prop_assert_eq!((rest.last_lba + 1) % align, 0);
            proptest::prop_assert!(placed.last_usable_lba - rest.last_lba < align);
            proptest::prop_assert!(rest.len() >= MIB);
        }
    }
}
