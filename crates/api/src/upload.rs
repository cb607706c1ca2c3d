//! Streaming a large request body (an installer bundle) between the async HTTP side and the
//! blocking code on either end, through a bounded channel so neither side buffers it whole.

use std::io::{self, Read, Write};
use std::path::Path;

use hyper::body::Bytes;
use tokio::sync::mpsc;

/// The largest upload the node accepts: a bundle is a UKI and a binary, tens of MiB.
pub const MAX_UPLOAD_BYTES: u64 = 2 << 30;
/// The bytes an upload into `dir` may take: the free space of its file system that an
/// unprivileged writer may use (`f_bavail`; the blocks reserved for root stay for the node's
/// own logs and state).
pub fn upload_room(dir: &Path) -> io::Result<u64> {
    let fs = rustix::fs::statvfs(dir)?;
    Ok(fs.f_bavail.saturating_mul(fs.f_frsize))
}

/// Chunks in flight between the two sides.
pub(crate) const UPLOAD_CHANNEL: usize = 16;
const CHUNK: usize = 256 * 1024;

/// The blocking side of an incoming body: `read` waits for the next chunk.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Result<Bytes, String>>,
    current: Bytes,
}

impl ChannelReader {
    pub(crate) fn new(rx: mpsc::Receiver<Result<Bytes, String>>) -> Self {
        ChannelReader {
            rx,
            current: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(message)) => return Err(io::Error::other(message)),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// The blocking side of an outgoing body: writes are gathered into chunks and sent.
pub(crate) struct ChannelWriter {
    tx: mpsc::Sender<Bytes>,
    pending: Vec<u8>,
    pub(crate) sent: u64,
}

impl ChannelWriter {
    pub(crate) fn new(tx: mpsc::Sender<Bytes>) -> Self {
        ChannelWriter {
            tx,
            pending: Vec::with_capacity(CHUNK),
            sent: 0,
        }
    }

    fn send_pending(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.pending,
            Vec::with_capacity(CHUNK),
        ));
        self.sent += chunk.len() as u64;
        self.tx.blocking_send(chunk).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the node stopped reading the upload",
            )
        })
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = CHUNK - self.pending.len();
        let n = buf.len().min(room);
        self.pending.extend_from_slice(&buf[..n]);
        if self.pending.len() == CHUNK {
            self.send_pending()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_room_for_an_upload_is_the_free_space_of_its_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let room = upload_room(dir.path()).unwrap();
        assert!(room > 0);
        let total = rustix::fs::statvfs(dir.path()).unwrap();
        assert!(room <= total.f_blocks * total.f_frsize);
        assert!(upload_room(&dir.path().join("missing")).is_err());
    }
}
