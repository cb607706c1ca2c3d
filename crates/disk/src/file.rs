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

    /// Only a regular file or a block device is opened (`slate_files::open_disk`): a FIFO is
    /// refused without waiting for a writer, `/dev/zero` or a directory before a byte is read,
    /// each named in the error (issue 44).
    fn open_with(path: &Path, writable: bool) -> std::io::Result<Self> {
        let mut file =
            slate_files::open_disk(path, writable).map_err(slate_files::FileError::into_io)?;
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

    /// `sync_file_range(SYNC_FILE_RANGE_WRITE)`: queue the range's dirty pages for writing
    /// without waiting for them, so the next `fdatasync` finds most of a large file already on
    /// its way (`bench-apply`: the UKI's 2 MiB stages go out while the next ones are copied).
    fn start_writeback(&mut self, offset: u64, len: u64) -> Result<(), DiskError> {
        if !self.writable || len == 0 {
            return Ok(());
        }
        check_bounds(offset, usize::try_from(len).unwrap_or(usize::MAX), self.len)?;
        let (Ok(start), Ok(count)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Ok(());
        };
        // SAFETY: sync_file_range takes no pointers; the descriptor is owned by `self.file`
        // and open for the duration of the call.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sync_file_range(
                std::os::fd::AsRawFd::as_raw_fd(&self.file),
                start,
                count,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        // A hint that could not be given (a file system without writeback, say) is no error:
        // the flush still writes everything.
        let _ = rc;
        Ok(())
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

    /// The hint is checked against the disk's bounds like a write, and changes no byte.
    #[test]
    fn writeback_hints_are_bounded_and_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        let mut disk = FileDisk::create(&path, 1 << 20).unwrap();
        disk.write_at(4096, &[5; 8192]).unwrap();
        disk.start_writeback(4096, 8192).unwrap();
        disk.start_writeback(0, 0).unwrap();
        assert!(disk.start_writeback(1 << 20, 1).is_err());
        disk.flush().unwrap();
        assert_eq!(std::fs::read(&path).unwrap()[4096..4096 + 8192], [5; 8192]);
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
