//! The reader thread, which predicts the writer's compression requests, and the workers.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};

use super::{Bytes, Event, Job, Work};

/// Small files sent in one event, at most (empty files carry no bytes to count).
const BATCH_FILES: usize = 256;

/// A worker: compresses blocks until the reader is done and the queue empty; with a cache, a
/// block whose frame it holds is not compressed again.
pub(super) fn compress_blocks(
    queue: &Mutex<Receiver<Work>>,
    level: i32,
    cache: Option<&dyn crate::BlockCache>,
) {
    // One context per worker, reused: backhand makes a fresh one per block, which gives the
    // same frame and only costs more to set up.
    let mut zstd = zstd::bulk::Compressor::new(level);
    loop {
        let next = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok(work) = next else { return };
        let key = cache.map(|_| crate::block_key(level, &work.input));
        let output = match cache.zip(key.as_ref()).and_then(|(c, key)| c.get(key)) {
            Some(frame) => Ok(frame),
            None => {
                let made = match &mut zstd {
                    Ok(zstd) => zstd.compress(&work.input),
                    Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
                };
                if let (Some(cache), Some(key), Ok(frame)) = (cache, &key, &made) {
                    cache.put(key, frame);
                }
                made
            }
        };
        // Nobody waits for it if the writer stopped on an error.
        let _ = work.reply.send(output);
    }
}

/// The writer's side is gone; the reader stops.
struct Stopped;

/// The reader thread: reads every file once, sends its bytes to the writer's side and the
/// blocks the writer will compress to the workers.
pub(super) struct ReadAhead {
    block_size: usize,
    events: SyncSender<Event>,
    work: Sender<Work>,
    /// A copy of backhand's fragment buffer.
    fragment: Vec<u8>,
    batch: Vec<io::Result<Vec<u8>>>,
    batch_bytes: usize,
    /// The first block of the current file.
    first: Vec<u8>,
    jobs: u64,
}

impl ReadAhead {
    pub(super) fn new(block_size: usize, events: SyncSender<Event>, work: Sender<Work>) -> Self {
        Self {
            block_size,
            events,
            work,
            fragment: Vec::new(),
            batch: Vec::new(),
            batch_bytes: 0,
            first: vec![0; block_size],
            jobs: 0,
        }
    }

    /// Returns the number of jobs made.
    pub(super) fn run(mut self, files: &[PathBuf]) -> u64 {
        let _ = files
            .iter()
            .try_for_each(|path| self.file(path))
            .and_then(|()| self.flush())
            // backhand compresses the fragment buffer after the last file, even when empty.
            .and_then(|()| self.close_fragment());
        self.jobs
    }

    /// Mirrors `DataWriter::add_bytes`.
    fn file(&mut self, path: &Path) -> Result<(), Stopped> {
        let bs = self.block_size;
        let opened = File::open(path).and_then(|mut file| {
            let n = fill(&mut file, &mut self.first)?;
            Ok((file, n))
        });
        let (mut file, n) = match opened {
            Ok(opened) => opened,
            Err(e) => return self.small(Err(e)),
        };
        if n < bs {
            let data = self.first[..n].to_vec();
            // An empty file gets no fragment; one that does not fit closes the buffer first.
            if n > 0 {
                if self.fragment.len() + n > bs {
                    self.close_fragment()?;
                }
                self.fragment.extend_from_slice(&data);
            }
            return self.small(Ok(data));
        }
        self.flush()?;
        let mut block = std::mem::replace(&mut self.first, vec![0; bs]);
        loop {
            self.block(block)?;
            let mut next = vec![0; bs];
            match fill(&mut file, &mut next) {
                Ok(0) => return self.send(Event::End),
                Ok(n) => {
                    next.truncate(n);
                    block = next;
                }
                Err(e) => return self.send(Event::Failed(e)),
            }
        }
    }

    fn small(&mut self, file: io::Result<Vec<u8>>) -> Result<(), Stopped> {
        self.batch_bytes += file.as_ref().map_or(0, Vec::len);
        self.batch.push(file);
        if self.batch_bytes >= self.block_size || self.batch.len() >= BATCH_FILES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Stopped> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.batch_bytes = 0;
        let batch = std::mem::take(&mut self.batch);
        self.send(Event::Small(batch))
    }

    fn block(&mut self, data: Vec<u8>) -> Result<(), Stopped> {
        let data = Arc::new(data);
        let job = if data.iter().all(|&b| b == 0) {
            None
        } else {
            Some(self.job(Arc::clone(&data))?)
        };
        self.send(Event::Block { data, job })
    }

    fn close_fragment(&mut self) -> Result<(), Stopped> {
        let next = Vec::with_capacity(self.block_size);
        let input = Arc::new(std::mem::replace(&mut self.fragment, next));
        let job = self.job(input)?;
        self.send(Event::Fragment(job))
    }

    fn job(&mut self, input: Bytes) -> Result<Job, Stopped> {
        let (reply, output) = mpsc::sync_channel(1);
        let work = Work {
            input: Arc::clone(&input),
            reply,
        };
        self.work.send(work).map_err(|_| Stopped)?;
        self.jobs += 1;
        Ok(Job { input, output })
    }

    fn send(&self, event: Event) -> Result<(), Stopped> {
        self.events.send(event).map_err(|_| Stopped)
    }
}

/// Reads until `buf` is full or the file ends, as backhand's chunk reader does.
fn fill(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(read) => n += read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
