//! The ESP's FAT32 file system, written with the userspace `fatfs` crate over a partition view:
//! geometry (so capacity can be checked before anything is written), reproducible formatting
//! and timestamps, and the temp-name-then-rename file writer that upgrades reuse.

use std::collections::BTreeMap;
use std::io::{self, ErrorKind, Write};
use std::sync::Mutex;

use fatfs::{
    Date, DateTime, FatType, FileSystem, FormatVolumeOptions, FsOptions, ReadWriteSeek, Time,
    TimeProvider,
};
use slate_disk::{Disk, DiskIo};

use crate::EspError;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// FAT32 needs at least this many clusters; below it a reader takes the volume for FAT16.
pub const FAT32_MIN_CLUSTERS: u64 = 65525;

/// The FAT32 geometry slate formats an ESP of a given size with, and a lower bound of the space
/// it offers to files. Cluster sizes are pinned here rather than left to the `fatfs` crate, so
/// the capacity check and the formatter agree by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EspGeometry {
    pub sector_size: u64,
    pub cluster_size: u64,
    /// Clusters available to files and directories (a lower bound: the FAT is over-estimated and
    /// the root directory's cluster is excluded).
    pub data_clusters: u64,
}

impl EspGeometry {
    /// 512-byte clusters up to 260 MiB (the only size that gives a 100 MiB volume the 65525
    /// clusters FAT32 needs), 4 KiB up to 8 GiB, 32 KiB beyond; never smaller than a sector.
    pub fn new(esp_len: u64, sector_size: u64) -> Self {
        let cluster_size = match esp_len {
            n if n <= 260 * MIB => 512,
            n if n <= 8 * GIB => 4096,
            _ => 32768,
        }
        .max(sector_size);
        let sectors = esp_len / sector_size;
        let per_cluster = cluster_size / sector_size;
        // An upper bound of each FAT: one 4-byte entry per cluster of the whole volume, plus the
        // two reserved entries. `fatfs` reserves 8 sectors for FAT32; 32 is what most
        // formatters use, and the larger is the safer bound.
        let fat_sectors = ((sectors / per_cluster + 2) * 4).div_ceil(sector_size);
        let data_sectors = sectors.saturating_sub(32 + 2 * fat_sectors);
        Self {
            sector_size,
            cluster_size,
            data_clusters: (data_sectors / per_cluster).saturating_sub(1),
        }
    }

    /// Whether the volume has enough clusters to be FAT32.
    pub fn is_fat32(&self) -> bool {
        self.data_clusters >= FAT32_MIN_CLUSTERS
    }

    /// Clusters a file of `len` bytes occupies.
    pub fn clusters_for(&self, len: u64) -> u64 {
        len.div_ceil(self.cluster_size)
    }
}

/// Timestamps of every directory entry: a fixed instant, so the same inputs give the same
/// bytes. `fatfs` keeps its time provider as a `&'static`, so one provider per distinct instant
/// is allocated once and kept for the life of the process (a few bytes per distinct
/// `SOURCE_DATE_EPOCH`), rather than one leaked per image.
pub fn fixed_time(source_date_epoch: u64) -> &'static dyn TimeProvider {
    static PROVIDERS: Mutex<BTreeMap<u64, &'static FixedTime>> = Mutex::new(BTreeMap::new());
    let instant = fat_instant(source_date_epoch);
    let mut providers = PROVIDERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    *providers
        .entry(instant)
        .or_insert_with(|| Box::leak(Box::new(FixedTime(fat_date_time(instant)))))
}

#[derive(Debug)]
struct FixedTime(DateTime);

impl TimeProvider for FixedTime {
    fn get_current_date(&self) -> Date {
        self.0.date
    }
    fn get_current_date_time(&self) -> DateTime {
        self.0
    }
}

/// Seconds since the Unix epoch as a FAT timestamp in UTC, clamped to what FAT can store
/// (1980-01-01 to 2107-12-31) and rounded down to even seconds (FAT's modification times have
/// two-second resolution; rounding keeps creation and modification times equal).
pub fn fat_date_time(epoch: u64) -> DateTime {
    let t = fat_instant(epoch);
    let (year, month, day) = civil_from_days((t / 86_400) as i64);
    let secs = t % 86_400;
    DateTime {
        date: Date {
            year: year as u16,
            month: month as u16,
            day: day as u16,
        },
        time: Time {
            hour: (secs / 3600) as u16,
            min: (secs / 60 % 60) as u16,
            sec: (secs % 60) as u16,
            millis: 0,
        },
    }
}

/// The instant FAT records for `epoch`: clamped to FAT's range, rounded down to even seconds.
fn fat_instant(epoch: u64) -> u64 {
    const FAT_MIN: u64 = 315_532_800; // 1980-01-01T00:00:00Z
    const FAT_MAX: u64 = 4_354_819_198; // 2107-12-31T23:59:58Z
    epoch.clamp(FAT_MIN, FAT_MAX) & !1
}

/// Proleptic Gregorian (year, month, day) of a count of days since 1970-01-01, by splitting the
/// count into 400-year eras of 146097 days and working in years that start on March 1st, so
/// that the leap day is the last day of its year.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Format `partition` as FAT32 with `geometry`, the given volume id and label.
pub fn format<D: Disk>(
    partition: D,
    geometry: &EspGeometry,
    volume_id: u32,
    label: &str,
) -> Result<(), EspError> {
    let mut volume_label = [b' '; 11];
    for (slot, byte) in volume_label.iter_mut().zip(label.bytes()) {
        *slot = byte.to_ascii_uppercase();
    }
    let options = FormatVolumeOptions::new()
        .fat_type(FatType::Fat32)
        .bytes_per_sector(geometry.sector_size as u16)
        .bytes_per_cluster(geometry.cluster_size as u32)
        .volume_id(volume_id)
        .volume_label(volume_label);
    fatfs::format_volume(DiskIo::new(partition), options).map_err(|source| EspError::Fs {
        action: "formatting FAT32",
        source,
    })
}

/// Mount the FAT file system on `partition`, stamping every change with `source_date_epoch`.
/// Refuses anything but FAT32, so a mistaken partition is never written as FAT12/16.
pub fn mount<D: Disk>(
    partition: D,
    source_date_epoch: u64,
) -> Result<FileSystem<DiskIo<D>>, EspError> {
    let options = FsOptions::new()
        .update_accessed_date(false)
        .time_provider(fixed_time(source_date_epoch));
    let fs = FileSystem::new(DiskIo::new(partition), options).map_err(|source| EspError::Fs {
        action: "mounting FAT",
        source,
    })?;
    if fs.fat_type() != FatType::Fat32 {
        return Err(EspError::Fs {
            action: "mounting FAT",
            source: io::Error::other(format!("the file system is {:?}, not FAT32", fs.fat_type())),
        });
    }
    Ok(fs)
}

/// Unmount, first making sure FSInfo will hold an exact free-cluster count: a fresh volume
/// says "unknown", which is legal but which `fsck.fat` reports, and which makes every reader
/// scan the whole FAT to tell free space. The scan happens here once; later mounts trust the
/// count and `fatfs` keeps it current.
pub fn unmount<T: ReadWriteSeek>(fs: FileSystem<T>) -> Result<(), EspError> {
    let fail = |action| move |source| EspError::Fs { action, source };
    fs.stats().map_err(fail("counting free clusters"))?;
    // Writes the FSInfo sector and clears the volume's dirty flag.
    fs.unmount().map_err(fail("unmounting FAT"))
}

/// Create the directories `paths` (each `/`-separated from the root; missing parents are
/// created too) on the FAT32 volume `esp`, which must not be mounted.
///
/// Each directory is created by `fatfs` and then repaired (module `dot_entries`), which
/// needs the raw volume: hence one short mount per directory.
pub fn create_dirs<D: Disk>(
    esp: &mut D,
    source_date_epoch: u64,
    paths: &[&str],
) -> Result<(), EspError> {
    for path in paths {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        for depth in 1..=parts.len() {
            let prefix = parts[..depth].join("/");
            let fail = |action| file_err(&prefix, action);
            let fs = mount(&mut *esp, source_date_epoch)?;
            fs.root_dir()
                .create_dir(&prefix)
                .map_err(fail("creating directory"))?;
            unmount(fs)?;
            crate::dot_entries::fix(&mut *esp, &prefix)
                .map_err(|e| fail("repairing the . and .. entries of")(io::Error::other(e)))?;
        }
    }
    Ok(())
}

/// The name a file is written under before it is renamed to `name`. The leading dot makes
/// systemd-boot skip it, so a half-written UKI left by a power cut is never offered for boot.
pub fn temp_name(name: &str) -> String {
    format!(".{name}.tmp")
}

/// Extra characters [`temp_name`] adds; names must leave room for them under FAT's 255.
pub const TEMP_NAME_EXTRA: usize = 5;

/// Write `bytes` to `path` (`/`-separated, relative to the root; its directory must exist) so
/// that the name never refers to a partial file: write the whole content under [`temp_name`],
/// flush it (data, FAT chains and directory entry, then the disk), and only then rename it to
/// `path`, and flush again.
///
/// FAT has no atomic replace: if `path` exists it is removed just before the rename, and `fatfs`
/// marks the old directory entry free before writing the new one. A cut inside that window
/// leaves `path` absent (its content complete only in the temp file). That is acceptable for
/// what slate writes here: a new UKI whose absence just means the old version keeps booting,
/// and a `loader.conf` without which systemd-boot still boots its first entry.
pub fn write_file_atomically<T: ReadWriteSeek>(
    fs: &FileSystem<T>,
    path: &str,
    bytes: &[u8],
) -> Result<(), EspError> {
    let fail = |action| file_err(path, action);
    let (dir_path, name) = path.rsplit_once('/').unwrap_or(("", path));
    let root = fs.root_dir();
    let dir = if dir_path.is_empty() {
        root
    } else {
        root.open_dir(dir_path)
            .map_err(fail("opening the directory of"))?
    };
    let tmp = temp_name(name);
    // A temp file left by an interrupted earlier attempt is garbage: start over.
    remove_if_present(&dir, &tmp).map_err(fail("removing a stale temp file of"))?;
    {
        let mut file = dir
            .create_file(&tmp)
            .map_err(fail("creating a temp file for"))?;
        file.write_all(bytes).map_err(fail("writing"))?;
        file.flush().map_err(fail("flushing"))?;
    }
    remove_if_present(&dir, name).map_err(fail("removing the previous"))?;
    dir.rename(&tmp, &dir, name)
        .map_err(fail("renaming the temp file to"))?;
    // `fatfs` has no file-system-wide flush; flushing a file writes its (unchanged) entry and
    // then flushes the disk, which is what makes the rename durable.
    dir.open_file(name)
        .and_then(|mut file| file.flush())
        .map_err(fail("flushing the rename of"))
}

/// An I/O error of `action` on the file or directory at `path`.
pub(crate) fn file_err(path: &str, action: &'static str) -> impl FnOnce(io::Error) -> EspError {
    let path = path.to_owned();
    move |source| EspError::File {
        path,
        action,
        source,
    }
}

fn remove_if_present<T: ReadWriteSeek>(dir: &fatfs::Dir<'_, T>, name: &str) -> io::Result<()> {
    match dir.remove(name) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use slate_disk::MemDisk;

    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(11_017), (2000, 3, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(19_675), (2023, 11, 14));
        let t = fat_date_time(1_700_000_000); // 2023-11-14T22:13:20Z
        assert_eq!((t.date.year, t.date.month, t.date.day), (2023, 11, 14));
        assert_eq!((t.time.hour, t.time.min, t.time.sec), (22, 13, 20));
        assert_eq!(fat_date_time(0).date.year, 1980);
        let max = fat_date_time(u64::MAX);
        assert_eq!(
            (max.date.year, max.date.month, max.date.day),
            (2107, 12, 31)
        );
        assert_eq!((max.time.hour, max.time.min, max.time.sec), (23, 59, 58));
        assert_eq!(fat_date_time(1_700_000_001).time.sec, 20);
    }

    #[test]
    fn geometry_bounds() {
        let g = EspGeometry::new(100 * MIB, 512);
        assert_eq!(g.cluster_size, 512);
        assert!(g.is_fat32());
        assert!(!EspGeometry::new(32 * MIB, 512).is_fat32());
        assert!(EspGeometry::new(33 * MIB, 512).is_fat32());
        assert!(
            !EspGeometry::new(100 * MIB, 4096).is_fat32(),
            "4Kn needs a bigger ESP"
        );
        assert!(EspGeometry::new(300 * MIB, 4096).is_fat32());
    }

    fn formatted(len: u64) -> MemDisk {
        let mut disk = MemDisk::zeroed(len as usize);
        format(&mut disk, &EspGeometry::new(len, 512), 0x1234_5678, "EFI").unwrap();
        disk
    }

    #[test]
    fn smallest_fat32_volume_formats_and_its_estimate_is_a_lower_bound() {
        let mut disk = formatted(33 * MIB);
        let fs = mount(&mut disk, 0).unwrap();
        let stats = fs.stats().unwrap();
        let estimate = EspGeometry::new(33 * MIB, 512).data_clusters;
        assert!(
            u64::from(stats.free_clusters()) >= estimate,
            "{stats:?} vs {estimate}"
        );
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_file() {
        let mut disk = formatted(40 * MIB);
        let fs = mount(&mut disk, 1_700_000_000).unwrap();
        drop(fs);
        create_dirs(&mut disk, 1_700_000_000, &["EFI/Linux"]).unwrap();
        let fs = mount(&mut disk, 1_700_000_000).unwrap();
        write_file_atomically(&fs, "EFI/Linux/a+3.efi", b"first").unwrap();
        write_file_atomically(&fs, "EFI/Linux/a+3.efi", b"second, longer").unwrap();
        write_file_atomically(&fs, "top.txt", b"root").unwrap();
        let dir = fs.root_dir().open_dir("EFI/Linux").unwrap();
        let names: Vec<String> = dir
            .iter()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n != "." && n != "..")
            .collect();
        assert_eq!(names, ["a+3.efi"]);
        let mut content = String::new();
        dir.open_file("a+3.efi")
            .unwrap()
            .read_to_string(&mut content)
            .unwrap();
        assert_eq!(content, "second, longer");
        let entry = dir
            .iter()
            .map(Result::unwrap)
            .find(|e| e.file_name() == "a+3.efi")
            .unwrap();
        assert_eq!(entry.modified(), fat_date_time(1_700_000_000));
        assert_eq!(entry.created(), fat_date_time(1_700_000_000));
    }

    /// Counts the bytes that reach it straight from `source`'s memory.
    struct Witness<'a> {
        disk: MemDisk,
        source: &'a [u8],
        from_source: usize,
        writes: usize,
    }

    impl Disk for Witness<'_> {
        fn len(&self) -> u64 {
            self.disk.len()
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), slate_disk::DiskError> {
            self.disk.read_at(offset, buf)
        }
        fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), slate_disk::DiskError> {
            if self.source.as_ptr_range().contains(&data.as_ptr()) {
                self.from_source += data.len();
            }
            self.writes += 1;
            self.disk.write_at(offset, data)
        }
        fn flush(&mut self) -> Result<(), slate_disk::DiskError> {
            Ok(())
        }
    }

    /// A file written in a session whose source it is reaches the disk straight from the
    /// source's memory (not copied through the sector buffer's stage), all but its partial
    /// last sector, in few writes, and reads back whole.
    #[test]
    fn a_file_of_the_borrowed_source_reaches_the_disk_uncopied() {
        use slate_disk::{BorrowedWrites, SectorBuffer};
        let uki: Vec<u8> = (0..5 * MIB as usize + 100)
            .map(|i| (i % 253) as u8)
            .collect();
        let mut witness = Witness {
            disk: formatted(40 * MIB),
            source: &uki,
            from_source: 0,
            writes: 0,
        };
        let mut esp = BorrowedWrites::new(SectorBuffer::new(&mut witness), &uki);
        let fs = mount(&mut esp, 0).unwrap();
        write_file_atomically(&fs, "a.efi", &uki).unwrap();
        unmount(fs).unwrap();
        esp.flush().unwrap();
        drop(esp);
        assert!(
            witness.from_source == uki.len() - 100 && witness.writes < 40,
            "{} bytes from the source in {} writes",
            witness.from_source,
            witness.writes
        );
        let fs = mount(&mut witness.disk, 0).unwrap();
        let mut back = Vec::new();
        fs.root_dir()
            .open_file("a.efi")
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        assert!(back == uki, "the file reads back whole");
    }

    #[test]
    fn a_missing_directory_is_reported_with_the_path() {
        let mut disk = formatted(40 * MIB);
        let fs = mount(&mut disk, 0).unwrap();
        let err = write_file_atomically(&fs, "nope/x.efi", b"x").unwrap_err();
        assert!(err.to_string().contains("nope/x.efi"), "{err}");
    }

    #[test]
    fn fixed_time_providers_are_shared_per_instant() {
        let a = fixed_time(42) as *const dyn TimeProvider as *const ();
        let b = fixed_time(42) as *const dyn TimeProvider as *const ();
        assert_eq!(a, b);
    }
}
