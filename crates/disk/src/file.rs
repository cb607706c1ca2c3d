//! A disk backed by a regular file (a disk image) or a block device node.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::{check_bounds, Disk, DiskError};

/// A regular file or a block device, accessed with positioned reads and writes.
///
/// The length is taken once at open: for a block device by seeking to its end (the kernel reports
/// the device size that way, so no ioctl is needed), for a file from its metadata. `flush` is
/// `fdatasync`, which for a block device also flushes the device's write cache.
#[derive(Debug)]
pub struct FileDisk {
    file: File,
    path: PathBuf,
    len: u64,
    writable: bool,
}

impl FileDisk {
    /// Open read-write.
    pub fn open(path: impl AsRef<Path>) -> std::io::Result<Self> {
        Self::open_with(path.as_ref(), true)
    }

    /// Open read-only; writes fail with a permission error.
    pub fn open_read_only(path: impl AsRef<Path>) -> std::io::Result<Self> {
        Self::open_with(path.as_ref(), false)
    }

    /// Create (or truncate) a regular file of `len` bytes, sparse where the filesystem allows.
    pub fn create(path: impl AsRef<Path>, len: u64) -> std::io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(len)?;
        Ok(Self {
            file,
            path: path.to_owned(),
            len,
            writable: true,
        })
    }

    fn open_with(path: &Path, writable: bool) -> std::io::Result<Self> {
        let mut file = OpenOptions::new().read(true).write(writable).open(path)?;
        let len = file.seek(SeekFrom::End(0))?;
        Ok(Self {
            file,
            path: path.to_owned(),
            len,
            writable,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Disk for FileDisk {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DiskError> {
        check_bounds(offset, buf.len(), self.len)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|source| DiskError::Io { offset, source })
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<(), DiskError> {
        check_bounds(offset, data.len(), self.len)?;
        if !self.writable {
            return Err(DiskError::Io {
                offset,
                source: std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("{} is open read-only", self.path.display()),
                ),
            });
        }
        self.file
            .write_all_at(data, offset)
            .map_err(|source| DiskError::Io { offset, source })
    }

    fn flush(&mut self) -> Result<(), DiskError> {
        if !self.writable {
            return Ok(());
        }
        // fdatasync: the data and what is needed to find it (blocks a sparse image allocates),
        // without a journal commit for the modification time that every fsync would force.
        self.file.sync_data().map_err(DiskError::Flush)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_disk_round_trips_and_keeps_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let mut disk = FileDisk::create(&path, 4096).unwrap();
        disk.write_at(4000, b"slate").unwrap();
        disk.flush().unwrap();
        assert!(
            disk.write_at(4094, b"xyz").is_err(),
            "writes never grow the file"
        );
        let reopened = FileDisk::open_read_only(&path).unwrap();
        assert_eq!(reopened.len(), 4096);
        assert_eq!(reopened.read_vec(4000, 5).unwrap(), b"slate");
    }

    #[test]
    fn read_only_file_disk_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        FileDisk::create(&path, 512).unwrap();
        let mut disk = FileDisk::open_read_only(&path).unwrap();
        assert!(disk.write_at(0, b"x").is_err());
    }
}
