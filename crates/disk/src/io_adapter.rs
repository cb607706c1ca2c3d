//! `Read + Write + Seek` over a [`Disk`], for crates (GPT, FAT) that speak std I/O.

use std::io::{self, Read, Seek, SeekFrom, Write};

use crate::Disk;

/// A cursor over a disk. `Write::flush` is [`Disk::flush`], so a crate flushing its writer makes
/// them durable the same way slate's own writers do.
#[derive(Debug)]
pub struct DiskIo<D> {
    disk: D,
    position: u64,
}

impl<D: Disk> DiskIo<D> {
    pub fn new(disk: D) -> Self {
        Self { disk, position: 0 }
    }

    pub fn into_inner(self) -> D {
        self.disk
    }

    pub fn get_ref(&self) -> &D {
        &self.disk
    }
}

fn to_io(err: crate::DiskError) -> io::Error {
    match err {
        crate::DiskError::Io { source, .. } | crate::DiskError::Flush(source) => source,
        other => io::Error::other(other),
    }
}

impl<D: Disk> Read for DiskIo<D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let remaining = self.disk.len().saturating_sub(self.position);
        let n = (buf.len() as u64).min(remaining) as usize;
        self.disk
            .read_at(self.position, &mut buf[..n])
            .map_err(to_io)?;
        self.position += n as u64;
        Ok(n)
    }
}

impl<D: Disk> Write for DiskIo<D> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let remaining = self.disk.len().saturating_sub(self.position);
        if remaining == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write past the end of the disk",
            ));
        }
        let n = (buf.len() as u64).min(remaining) as usize;
        self.disk
            .write_at(self.position, &buf[..n])
            .map_err(to_io)?;
        self.position += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.disk.flush().map_err(to_io)
    }
}

impl<D: Disk> Seek for DiskIo<D> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        let target = match pos {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.disk.len().checked_add_signed(d),
            SeekFrom::Current(d) => self.position.checked_add_signed(d),
        };
        match target {
            Some(p) => {
                self.position = p;
                Ok(p)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek to a negative or overflowing position",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemDisk;

    #[test]
    fn std_io_over_a_disk_is_bounded() {
        let mut io = DiskIo::new(MemDisk::zeroed(16));
        io.seek(SeekFrom::End(-4)).unwrap();
        assert_eq!(io.write(b"abcdef").unwrap(), 4);
        assert!(io.write(b"g").is_err());
        io.seek(SeekFrom::Start(12)).unwrap();
        let mut out = Vec::new();
        io.read_to_end(&mut out).unwrap();
        assert_eq!(out, b"abcd");
    }
}
