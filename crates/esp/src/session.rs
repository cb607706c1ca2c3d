//! The ESP of a whole disk, found and opened one way for every writer: both boot loaders'
//! A/B backends and a snapshot root's entries. Read-only through [`ReadOnly`] (a status never
//! needs `&mut`), read-write over a [`SectorBuffer`] (`fatfs` changes a directory entry field by
//! field, and a cut between two of those writes must not show a new name over old content),
//! with FSInfo written and the disk flushed before the session ends.

use std::io::{self, Read, Seek, SeekFrom, Write};

use fatfs::{FileSystem, ReadWriteSeek};
use slate_disk::{BorrowedWrites, Disk, DiskIo, PartitionView, SectorBuffer};
use slate_layout::{partitions, PartitionInfo, EFI_LABEL, ESP_TYPE};

use crate::{fat, EspError, ReadOnly};

/// The ESP's file system as a read-write session mounts it: writes of the session's source
/// (a UKI) taken by reference, everything else buffered per sector.
pub type EspFs<'fs, 'src, 'disk, D> =
    FileSystem<DiskIo<&'fs mut BorrowedWrites<'src, SectorBuffer<PartitionView<&'disk mut D>>>>>;

/// The ESP's file system mounted read-only.
pub type ReadOnlyFs<'disk, D> = FileSystem<DiskIo<PartitionView<ReadOnly<'disk, D>>>>;

/// FAT timestamps of a read-only mount: nothing is written, so any instant does.
const READ_ONLY_EPOCH: u64 = 0;

/// The ESP among `disk`'s GPT partitions: the one of the EFI System type, which is how firmware
/// finds it, so a disk slate did not partition (a Debian machine under the snapshot engine)
/// works too. A disk with several is resolved by slate's own label, `EFI`.
pub fn locate<D: Disk>(disk: D) -> Result<PartitionInfo, EspError> {
    let all = partitions(disk)?;
    let esps: Vec<&PartitionInfo> = all.iter().filter(|p| p.type_guid == ESP_TYPE).collect();
    match esps[..] {
        [one] => Ok(one.clone()),
        [] => Err(EspError::Locate("the disk has no EFI System partition")),
        _ => {
            let mut labelled = esps.iter().filter(|p| p.label == EFI_LABEL);
            match (labelled.next(), labelled.next()) {
                (Some(p), None) => Ok((*p).clone()),
                _ => Err(EspError::Locate(
                    "the disk has more than one EFI System partition",
                )),
            }
        }
    }
}

/// A window onto `disk`'s ESP ([`locate`]).
pub fn open<D: Disk>(mut disk: D) -> Result<PartitionView<D>, EspError> {
    let esp = locate(&mut disk)?;
    Ok(PartitionView::new(disk, esp.start, esp.len)?)
}

/// The ESP's window, reads only.
pub fn read_only<D: Disk>(disk: &D) -> Result<PartitionView<ReadOnly<'_, D>>, EspError> {
    open(ReadOnly(disk))
}

/// The ESP's file system, mounted read-only.
pub fn mount_read_only<D: Disk>(disk: &D) -> Result<ReadOnlyFs<'_, D>, EspError> {
    fat::mount(read_only(disk)?, READ_ONLY_EPOCH)
}

/// Mounts the ESP read-write, runs `f`, unmounts (FSInfo) and flushes. Changes are stamped
/// with `source_date_epoch`.
pub fn with_esp<D: Disk, R, E: From<EspError>>(
    disk: &mut D,
    source_date_epoch: u64,
    f: impl FnOnce(&EspFs<'_, '_, '_, D>) -> Result<R, E>,
) -> Result<R, E> {
    with_esp_writing(disk, source_date_epoch, &[], f)
}

/// [`with_esp`] for a session that writes `source` into a file: `fatfs`'s writes of its
/// bytes reach the disk straight from it, in large pieces ([`BorrowedWrites`]), not copied.
pub fn with_esp_writing<'src, D: Disk, R, E: From<EspError>>(
    disk: &mut D,
    source_date_epoch: u64,
    source: &'src [u8],
    f: impl FnOnce(&EspFs<'_, 'src, '_, D>) -> Result<R, E>,
) -> Result<R, E> {
    let mut esp = BorrowedWrites::new(SectorBuffer::new(open(&mut *disk)?), source);
    let fs = fat::mount(&mut esp, source_date_epoch)?;
    let out = f(&fs)?;
    fat::unmount(fs)?;
    esp.flush().map_err(EspError::from)?;
    Ok(out)
}

/// The content of the file at `path` (`/`-separated, from the root).
pub fn read<T: ReadWriteSeek>(fs: &FileSystem<T>, path: &str) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    fs.root_dir().open_file(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// A file on `disk`'s ESP, `None` when it cannot be read (absent).
pub fn read_file<D: Disk>(disk: &D, path: &str) -> Result<Option<Vec<u8>>, EspError> {
    Ok(read(&mount_read_only(disk)?, path).ok())
}

/// Creates the directories of `paths` that are missing, parents too ([`fat::create_dirs`]:
/// one mount each), flushed.
pub fn ensure_dirs<D: Disk>(
    disk: &mut D,
    source_date_epoch: u64,
    paths: &[&str],
) -> Result<(), EspError> {
    let missing: Vec<&str> = {
        let fs = mount_read_only(disk)?;
        paths
            .iter()
            .copied()
            .filter(|p| fs.root_dir().open_dir(p).is_err())
            .collect()
    };
    if missing.is_empty() {
        return Ok(());
    }
    let mut esp = SectorBuffer::new(open(&mut *disk)?);
    fat::create_dirs(&mut esp, source_date_epoch, &missing)?;
    Ok(esp.flush()?)
}

/// Trims the deleted entries at the end of the ESP's `dir` ([`crate::trim_deleted_tail`]), so
/// that the firmware's next rename there reuses the space instead of growing the directory.
/// Flushed. Returns how many entries were trimmed.
pub fn trim_dir<D: Disk>(disk: &mut D, dir: &str) -> Result<usize, EspError> {
    let mut esp = SectorBuffer::new(open(&mut *disk)?);
    let trimmed = crate::trim_deleted_tail(&mut esp, dir).map_err(|e| EspError::Fs {
        action: "trimming the deleted entries of a directory",
        source: io::Error::other(e),
    })?;
    esp.flush()?;
    Ok(trimmed)
}

/// Rewrites the file at `path` in place with `bytes`, the same length over the same clusters,
/// flushed; refused ([`EspError::WrongLength`]) when the file is not `bytes.len()` long. This
/// is how a GRUB environment block is written: GRUB's `save_env` writes through the block list
/// it found at boot, so the file is never re-created.
pub fn rewrite_in_place<D: Disk>(
    disk: &mut D,
    source_date_epoch: u64,
    path: &str,
    bytes: &[u8],
) -> Result<(), EspError> {
    let fail = |action| fat::file_err(path, action);
    with_esp(disk, source_date_epoch, |fs| {
        let mut f = fs.root_dir().open_file(path).map_err(fail("opening"))?;
        let len = f.seek(SeekFrom::End(0)).map_err(fail("sizing"))?;
        if len != bytes.len() as u64 {
            return Err(EspError::WrongLength {
                path: path.to_owned(),
                len,
                expected: bytes.len() as u64,
            });
        }
        f.seek(SeekFrom::Start(0))
            .and_then(|_| f.write_all(bytes))
            .and_then(|()| f.flush())
            .map_err(fail("rewriting"))
    })
}
