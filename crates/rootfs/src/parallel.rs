//! Data blocks compressed on several threads, with image bytes that do not depend on how many.
//!
//! backhand 0.25's writer compresses one block at a time, on the thread that calls `write`,
//! through the `CompressionAction` of the image's `Kind`; it takes no compressed data from
//! outside. But which blocks it will ask to compress, and in which order, follows from the file
//! contents alone (`DataWriter::add_bytes` and `finalize`): a file shorter than a block goes to
//! the fragment buffer, which is compressed first when the file does not fit in it any more; a
//! longer file is cut into blocks, each compressed unless it is all zeros (a hole); the
//! fragment buffer left after the last file is compressed last. So a reader thread reads the
//! files in the writer's order, replays those rules, and hands every block it predicts to a
//! pool of workers. The writer gets the file bytes from the reader as well (each file is read
//! once, and the writer cuts exactly the bytes the prediction saw), and [`PRECOMPRESSED`]
//! answers its requests with the workers' output.
//!
//! Why the image cannot depend on the thread count or on timing: a worker's output is only
//! returned for a request whose input is byte-equal to the block it compressed, and a worker
//! compresses a block exactly as backhand's own zstd path does (same level, one frame per
//! block; its context is reused, which gives the same frame as backhand's fresh one per call,
//! see the tests). A request that matches nothing (metadata blocks, or a prediction that went
//! wrong) is compressed on the spot by backhand's `DefaultCompressor`. Threads change when a
//! block is compressed, never what comes out.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;

use backhand::compression::{CompressionAction, Compressor, DefaultCompressor};
use backhand::kind::Kind;
use backhand::{BackhandError, FilesystemCompressor, SuperBlock};

use reader::{compress_blocks, ReadAhead};

mod reader;

/// Bytes read once and shared by the reader, a worker and the writer without copying.
pub(crate) type Bytes = Arc<Vec<u8>>;

/// Predicted jobs held by the writer's side beyond this many are dropped (and compressed on
/// the spot if ever asked for): a safety net for memory should a backhand version cut files
/// differently. A correct prediction holds at most a few.
const PENDING_MAX: usize = 64;

/// What the build needs to know to predict and compress the writer's blocks.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    /// Regular files, in the order the writer reads them.
    pub files: &'a [PathBuf],
    pub block_size: usize,
    pub zstd_level: i32,
    /// Frames kept from earlier builds, and where new ones go.
    pub cache: Option<&'a dyn crate::BlockCache>,
    /// Compression workers (the reader is one more thread).
    pub threads: usize,
}

/// How the prediction fared; a correct one has `stale == 0` and `hits == jobs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// Blocks handed to the workers.
    pub jobs: u64,
    /// Requests answered by a worker.
    pub hits: u64,
    /// Requests compressed on the spot (metadata blocks, or misses).
    pub inline: u64,
    /// Jobs never asked for.
    pub stale: u64,
}

/// A compression request the writer is expected to make: its input, and where the worker that
/// took it puts the output.
struct Job {
    input: Bytes,
    output: Receiver<io::Result<Vec<u8>>>,
}

/// A job as a worker sees it.
struct Work {
    input: Bytes,
    reply: SyncSender<io::Result<Vec<u8>>>,
}

/// What the reader sends to the writer's thread, in file order.
enum Event {
    /// Whole files shorter than a block, or why one could not be read; batched so that one
    /// event carries about a block of data however small the files, since the channel bounds
    /// the read-ahead in events.
    Small(Vec<io::Result<Vec<u8>>>),
    /// The next block of a file of at least one block; no job for a block of zeros, which
    /// backhand stores as a hole without compressing it.
    Block { data: Bytes, job: Option<Job> },
    /// The end of the file whose blocks came before.
    End,
    /// A read error after the blocks before it.
    Failed(io::Error),
    /// The fragment buffer, which the writer compresses when a small file no longer fits in it
    /// and once after the last file.
    Fragment(Job),
}

/// The start of a file, as the writer's side gets it.
pub(crate) enum Opened {
    Small(Vec<u8>),
    /// The first block; [`Feed::next_block`] gives the others.
    Blocks(Bytes),
}

/// Runs `write` while the reader and `plan.threads` workers run, with [`kind`]'s compressor
/// served by them on this thread. `write` must read the files through the [`Feed`], each once,
/// in `plan.files` order.
pub(crate) fn with_workers<R>(
    plan: &Plan<'_>,
    write: impl FnOnce(&Rc<Feed>) -> R,
) -> io::Result<(R, Report)> {
    let threads = plan.threads.max(1);
    let (work_tx, work_rx) = mpsc::channel::<Work>();
    let work_rx = Mutex::new(work_rx);
    // Enough read-ahead to keep every worker busy while the writer waits on the oldest block.
    let (event_tx, event_rx) = mpsc::sync_channel(4 * threads);
    let feed = Rc::new(Feed {
        state: RefCell::new(FeedState {
            events: Some(event_rx),
            lookahead: None,
            small: VecDeque::new(),
            pending: VecDeque::new(),
            next_file: 0,
            report: Report::default(),
        }),
    });
    thread::scope(|scope| {
        for _ in 0..threads {
            let queue = &work_rx;
            let (level, cache) = (plan.zstd_level, plan.cache);
            // On failure, returning drops `work_tx`, so the workers already started end.
            thread::Builder::new()
                .name("rootfs-zstd".into())
                .spawn_scoped(scope, move || compress_blocks(queue, level, cache))?;
        }
        let (files, block_size) = (plan.files, plan.block_size);
        let reader = ReadAhead::new(block_size, event_tx, work_tx);
        let reader = thread::Builder::new()
            .name("rootfs-read".into())
            .spawn_scoped(scope, move || reader.run(files))?;
        let active = Active::install(Rc::clone(&feed));
        let written = write(&feed);
        // Closing lets the reader and the workers end even if `write` stopped early.
        let mut report = active.finish();
        // A panic in the reader (which `write` saw as its files ending early) goes on here.
        report.jobs = match reader.join() {
            Ok(jobs) => jobs,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        Ok((written, report))
    })
}

/// The writer's end of the reader's events: file bytes for the writer's `Read`ers, compressed
/// blocks for [`PRECOMPRESSED`]. Used on the writer's thread only.
pub(crate) struct Feed {
    state: RefCell<FeedState>,
}

struct FeedState {
    /// None once the build is over.
    events: Option<Receiver<Event>>,
    /// An event looked at by the compressor but not yet used.
    lookahead: Option<Event>,
    /// The rest of the current batch of small files.
    small: VecDeque<io::Result<Vec<u8>>>,
    /// Jobs passed in the events, in the order the writer will ask for them.
    pending: VecDeque<Job>,
    next_file: usize,
    report: Report,
}

fn internal(what: &str) -> io::Error {
    io::Error::other(format!(
        "internal error in the parallel squashfs build: {what}"
    ))
}

impl FeedState {
    /// The next event that is not a fragment job; those go to `pending`.
    fn next_event(&mut self) -> Option<Event> {
        loop {
            let event = match self.lookahead.take() {
                Some(event) => event,
                None => self.events.as_ref()?.recv().ok()?,
            };
            match event {
                Event::Fragment(job) => self.expect(job),
                other => return Some(other),
            }
        }
    }

    fn expect(&mut self, job: Job) {
        if self.pending.len() >= PENDING_MAX {
            self.pending.pop_front();
            self.report.stale += 1;
        }
        self.pending.push_back(job);
    }
}

impl Feed {
    /// The start of file `index`, which must be the next in the plan's order.
    pub(crate) fn open(&self, index: usize) -> io::Result<Opened> {
        let mut state = self.state.borrow_mut();
        if index != state.next_file {
            // The writer visits files in an order the build did not plan for: refusing beats
            // giving it another file's bytes.
            return Err(internal(&format!(
                "file #{index} read where #{} was expected",
                state.next_file
            )));
        }
        state.next_file += 1;
        if state.small.is_empty() {
            match state.next_event() {
                Some(Event::Small(batch)) => state.small = batch.into(),
                Some(Event::Block { data, job }) => {
                    if let Some(job) = job {
                        state.expect(job);
                    }
                    return Ok(Opened::Blocks(data));
                }
                Some(_) => return Err(internal("a file started with the end of another")),
                None => return Err(internal("the reader stopped early")),
            }
        }
        match state.small.pop_front() {
            Some(file) => file.map(Opened::Small),
            None => Err(internal("an empty batch of files")),
        }
    }

    /// The next block of the file opened last, or None at its end.
    pub(crate) fn next_block(&self) -> io::Result<Option<Bytes>> {
        let mut state = self.state.borrow_mut();
        match state.next_event() {
            Some(Event::Block { data, job }) => {
                if let Some(job) = job {
                    state.expect(job);
                }
                Ok(Some(data))
            }
            Some(Event::End) => Ok(None),
            Some(Event::Failed(e)) => Err(e),
            Some(_) => Err(internal("small files inside a large one")),
            None => Err(internal("the reader stopped early")),
        }
    }

    /// The workers' output for the writer's next request, if that is the predicted one.
    fn take(&self, bytes: &[u8]) -> Option<io::Result<Vec<u8>>> {
        let mut state = self.state.borrow_mut();
        if state.pending.is_empty() && state.lookahead.is_none() {
            // The last fragment comes after every file's bytes, so no read has passed it; this
            // waits for the reader only until its next event.
            state.lookahead = state.events.as_ref().and_then(|e| e.recv().ok());
        }
        if state.pending.is_empty() {
            if let Some(Event::Fragment(job)) =
                state.lookahead.take_if(|e| matches!(e, Event::Fragment(_)))
            {
                state.pending.push_back(job);
            }
        }
        let matches = state
            .pending
            .front()
            .is_some_and(|job| job.input.as_slice() == bytes);
        if !matches {
            state.report.inline += 1;
            return None;
        }
        let job = state.pending.pop_front()?;
        state.report.hits += 1;
        drop(state);
        Some(
            job.output
                .recv()
                .unwrap_or_else(|_| Err(internal("a compression worker stopped"))),
        )
    }

    /// Ends the build: the reader and the workers stop at their next send.
    fn close(&self) -> Report {
        let mut state = self.state.borrow_mut();
        let mut stale = state.pending.len() as u64;
        let left = state.lookahead.take().into_iter();
        // Bounded: after an error the reader is still reading, and what it sends is not looked
        // at anyway; after a build that went to the end it has sent everything.
        let rest: Vec<Event> = match state.events.take() {
            Some(events) => left.chain(events.try_iter().take(PENDING_MAX)).collect(),
            None => left.collect(),
        };
        for event in &rest {
            if matches!(
                event,
                Event::Fragment(_) | Event::Block { job: Some(_), .. }
            ) {
                stale += 1;
            }
        }
        state.pending.clear();
        state.small.clear();
        state.report.stale += stale;
        state.report
    }
}

thread_local! {
    /// The feed of the build running on this thread. backhand takes the compressor as a
    /// `&'static` and calls it on the thread that called `write`, so a build's own state can
    /// only be reached through the thread.
    static ACTIVE: RefCell<Option<Rc<Feed>>> = const { RefCell::new(None) };
}

/// Makes a feed the active one for this thread until finished or dropped.
struct Active {
    feed: Rc<Feed>,
    previous: Option<Rc<Feed>>,
    report: Option<Report>,
}

impl Active {
    fn install(feed: Rc<Feed>) -> Self {
        let previous = ACTIVE.with(|a| a.replace(Some(Rc::clone(&feed))));
        Self {
            feed,
            previous,
            report: None,
        }
    }

    fn finish(mut self) -> Report {
        let report = self.feed.close();
        self.report = Some(report);
        report
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        if self.report.is_none() {
            // `write` panicked: the threads must still end for the scope to join them.
            self.feed.close();
        }
        ACTIVE.with(|a| a.replace(self.previous.take()));
    }
}

/// The compressor of every image slate writes: a block the workers compressed is taken from
/// them; anything else is compressed here by backhand's own code.
#[derive(Debug)]
pub(crate) struct Precompressed;

pub(crate) static PRECOMPRESSED: Precompressed = Precompressed;

/// The squashfs kind slate writes (little-endian 4.0, backhand's default) with
/// [`PRECOMPRESSED`] as its compressor.
pub(crate) fn kind() -> Kind {
    Kind::new_v4(&PRECOMPRESSED)
}

impl CompressionAction for Precompressed {
    type Error = BackhandError;
    type Compressor = Compressor;
    type FilesystemCompressor = FilesystemCompressor;
    type SuperBlock = SuperBlock;

    fn decompress(
        &self,
        bytes: &[u8],
        out: &mut Vec<u8>,
        compressor: Compressor,
    ) -> Result<(), BackhandError> {
        DefaultCompressor.decompress(bytes, out, compressor)
    }

    // `fc` is not compared with the workers' level: only slate's writer uses this compressor,
    // configured from the same options (and backhand keeps `fc`'s fields private).
    fn compress(
        &self,
        bytes: &[u8],
        fc: FilesystemCompressor,
        block_size: u32,
    ) -> Result<Vec<u8>, BackhandError> {
        let feed = ACTIVE.with(|a| a.borrow().clone());
        match feed.and_then(|feed| feed.take(bytes)) {
            Some(done) => done.map_err(BackhandError::from),
            None => DefaultCompressor.compress(bytes, fc, block_size),
        }
    }

    fn compression_options(
        &self,
        superblock: &mut SuperBlock,
        kind: &Kind,
        fc: FilesystemCompressor,
    ) -> Result<Option<Vec<u8>>, BackhandError> {
        DefaultCompressor.compression_options(superblock, kind, fc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SquashfsOptions;
    use backhand::compression::{CompressionOptions, Zstd};
    use std::num::NonZeroUsize;

    /// The reader must predict every request the writer makes for file data: all its jobs
    /// taken, none left, whatever the shapes of the files.
    #[test]
    fn every_predicted_block_is_asked_for() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let bs = 4096;
        let text =
            |n: usize| -> Vec<u8> { (0..n).map(|i| b"squashfs fragments\n"[i % 19]).collect() };
        std::fs::create_dir(root.join("dir")).unwrap();
        // Sizes around the block size and around what fills the fragment buffer.
        for (i, len) in [
            0, 1, 2000, 2096, 4095, 4096, 4097, 8192, 3000, 1100, 20_000, 0, 4000,
        ]
        .into_iter()
        .enumerate()
        {
            let mut data = text(len + i);
            data.truncate(len);
            std::fs::write(root.join(format!("dir/f{i:02}")), data).unwrap();
        }
        let mut holes = text(5 * bs);
        holes[bs..3 * bs].fill(0);
        std::fs::write(root.join("holes"), holes).unwrap();
        std::fs::write(root.join("zeros"), vec![0u8; 2 * bs + 7]).unwrap();
        for threads in [1, 4] {
            let opts = SquashfsOptions {
                block_size: bs as u32,
                threads: NonZeroUsize::new(threads),
                ..SquashfsOptions::default()
            };
            let mut out = io::Cursor::new(Vec::new());
            let (_, report) = crate::build(root, &mut out, &opts, None, &mut |_, _| {}).unwrap();
            assert!(report.jobs > 10, "{report:?}");
            assert_eq!(report.hits, report.jobs, "{report:?}");
            assert_eq!(report.stale, 0, "{report:?}");
        }
    }

    /// The workers' reused context must give the frames backhand's fresh one per block gives,
    /// whatever came before it (sizes that change zstd's parameters, incompressible data).
    #[test]
    fn a_reused_context_compresses_as_backhand_does() {
        let level = 15;
        let fc = FilesystemCompressor::new(
            Compressor::Zstd,
            Some(CompressionOptions::Zstd(Zstd {
                compression_level: level,
            })),
        )
        .unwrap();
        let mut rng = slate_testkit::Xorshift(0x2545_f491_4f6c_dd1d);
        let mut noise = |len: usize| rng.bytes(len);
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("line {} of {}\n", i % 977, i / 3).into_bytes())
            .collect();
        let inputs: Vec<Vec<u8>> = vec![
            text[..131_072].to_vec(),
            noise(131_072),
            Vec::new(),
            text[5..4_001].to_vec(),
            noise(17),
            text[..1 << 20].to_vec(),
            text[1000..131_072].to_vec(),
            [noise(60_000), text[..71_072].to_vec()].concat(),
        ];
        let mut reused = zstd::bulk::Compressor::new(level as i32).unwrap();
        for input in inputs.iter().chain(inputs.iter().rev()) {
            let ours = reused.compress(input).unwrap();
            let theirs = DefaultCompressor.compress(input, fc, 131_072).unwrap();
            assert_eq!(ours, theirs, "input of {} bytes", input.len());
        }
    }
}
