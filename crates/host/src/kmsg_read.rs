//! Reading the kernel log from /dev/kmsg, one record per read.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;

use crate::{HostError, Result};

const KMSG: &str = "/dev/kmsg";

/// `[seconds.micros] message` from a /dev/kmsg record `prio,seq,usec,flags;message\n…`.
pub fn format_kmsg_record(record: &str) -> Option<String> {
    let (header, rest) = record.split_once(';')?;
    let usec: u64 = header.split(',').nth(2)?.parse().ok()?;
    let message = rest.lines().next().unwrap_or("");
    Some(format!(
        "[{:>5}.{:06}] {message}",
        usec / 1_000_000,
        usec % 1_000_000
    ))
}

/// The kernel log from its oldest retained record; with `follow`, waiting for new ones.
#[derive(Debug)]
pub struct KernelLog {
    file: File,
    follow: bool,
}

/// Open the kernel log for reading.
pub fn kernel_log(follow: bool) -> Result<KernelLog> {
    let mut options = OpenOptions::new();
    options.read(true);
    if !follow {
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(KMSG).map_err(|source| HostError::Open {
        path: KMSG.into(),
        source,
    })?;
    Ok(KernelLog { file, follow })
}

impl Iterator for KernelLog {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        let mut buf = vec![0u8; 8192];
        loop {
            match self.file.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => {
                    if let Some(line) = format_kmsg_record(&String::from_utf8_lossy(&buf[..n])) {
                        return Some(line);
                    }
                }
                // The ring buffer overwrote records we had not read yet: carry on.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock && !self.follow => return None,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_records() {
        assert_eq!(
            format_kmsg_record(
                "6,339,5140900,-;virtio_net virtio1 eth0: renamed\n SUBSYSTEM=net\n"
            )
            .as_deref(),
            Some("[    5.140900] virtio_net virtio1 eth0: renamed")
        );
        assert_eq!(format_kmsg_record("garbage"), None);
    }
}
