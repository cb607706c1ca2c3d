//! The `Read`er backhand's writer gets for each regular file.

use std::cell::RefCell;
use std::io::{self, Read};
use std::path::PathBuf;
use std::rc::Rc;

use crate::parallel;

/// What the files of one build share: progress, and the first read error with its path
/// (backhand's error loses the path).
pub(crate) struct Shared<'p> {
    done: u64,
    total: u64,
    progress: &'p mut dyn FnMut(u64, u64),
    failure: Option<(PathBuf, io::Error)>,
}

impl<'p> Shared<'p> {
    pub(crate) fn new(total: u64, progress: &'p mut dyn FnMut(u64, u64)) -> Self {
        Self {
            done: 0,
            total,
            progress,
            failure: None,
        }
    }

    /// Reports that no file is done yet.
    pub(crate) fn start(&mut self) {
        (self.progress)(0, self.total);
    }

    pub(crate) fn take_failure(&mut self) -> Option<(PathBuf, io::Error)> {
        self.failure.take()
    }
}

/// Where a file's bytes come from: the parallel reader, which read it ahead (so the build holds
/// no descriptor of its own per file). Reports progress when backhand has consumed it.
pub(crate) struct TreeFile<'p> {
    /// The file's place in the parallel reader's order.
    index: usize,
    path: PathBuf,
    source: Source,
    feed: Rc<parallel::Feed>,
    shared: Rc<RefCell<Shared<'p>>>,
}

enum Source {
    Unopened,
    Small { data: Vec<u8>, pos: usize },
    Blocks { block: parallel::Bytes, pos: usize },
    Finished,
}

impl<'p> TreeFile<'p> {
    /// File `index` of the parallel reader's order, at `path` (for errors).
    pub(crate) fn new(
        index: usize,
        path: PathBuf,
        feed: Rc<parallel::Feed>,
        shared: Rc<RefCell<Shared<'p>>>,
    ) -> Self {
        Self {
            index,
            path,
            source: Source::Unopened,
            feed,
            shared,
        }
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        let copy = io::Error::new(e.kind(), e.to_string());
        self.shared.borrow_mut().failure = Some((self.path.clone(), e));
        self.source = Source::Finished;
        copy
    }

    fn finish(&mut self) {
        self.source = Source::Finished;
        let mut s = self.shared.borrow_mut();
        s.done += 1;
        let (done, total) = (s.done, s.total);
        (s.progress)(done, total);
    }
}

/// Copies what is left of `from` after `pos` into `buf`.
fn serve(from: &[u8], pos: &mut usize, buf: &mut [u8]) -> usize {
    let n = buf.len().min(from.len() - *pos);
    buf[..n].copy_from_slice(&from[*pos..*pos + n]);
    *pos += n;
    n
}

impl Read for TreeFile<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            match &mut self.source {
                Source::Finished => return Ok(0),
                Source::Unopened => match self.feed.open(self.index) {
                    Ok(parallel::Opened::Small(data)) => {
                        self.source = Source::Small { data, pos: 0 };
                    }
                    Ok(parallel::Opened::Blocks(block)) => {
                        self.source = Source::Blocks { block, pos: 0 };
                    }
                    Err(e) => return Err(self.fail(e)),
                },
                Source::Small { data, pos } => {
                    if *pos < data.len() {
                        return Ok(serve(data, pos, buf));
                    }
                    self.finish();
                }
                Source::Blocks { block, pos } => {
                    if *pos < block.len() {
                        return Ok(serve(block, pos, buf));
                    }
                    match self.feed.next_block() {
                        Ok(Some(next)) => (*block, *pos) = (next, 0),
                        Ok(None) => self.finish(),
                        Err(e) => return Err(self.fail(e)),
                    }
                }
            }
        }
    }
}
