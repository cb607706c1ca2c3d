//! `modules.load` and the order init loads it in: each module as soon as the modules it needs
//! are in, on as many threads as the machine has CPUs (at most [`MAX_LOADERS`]).
//!
//! The format (docs/formats.md §6.3): one module per line, relative to
//! `/lib/modules/<release>/`, in an order that loads every module after what it needs;
//! `path: dep dep …` names what it needs (each on an earlier line). A line without `:` (images
//! made before the format had dependencies) waits for the line before it, which is the
//! one-after-another loading those images were made for. Blank lines and `#` comments are
//! skipped.

use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Result};

/// Threads loading modules at once: `finit_module` decompresses and links in the caller's
/// context, so more than the CPUs buys nothing, and the closures images carry are small.
pub const MAX_LOADERS: usize = 4;

/// One line of `modules.load`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleToLoad<'a> {
    pub path: &'a str,
    /// The earlier lines (indices) that must be loaded first.
    pub after: Vec<usize>,
}

pub fn parse_modules_load(text: &str) -> Result<Vec<ModuleToLoad<'_>>> {
    let mut modules: Vec<ModuleToLoad<'_>> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let number = i + 1;
        let (path, after) = match line.split_once(':') {
            Some((path, deps)) => {
                let mut after = Vec::new();
                for dep in deps.split_whitespace() {
                    let index = modules.iter().position(|m| m.path == dep).ok_or_else(|| {
                        anyhow!(
                            "line {number}: {} needs {dep}, which no earlier line loads",
                            path.trim()
                        )
                    })?;
                    after.push(index);
                }
                (path.trim(), after)
            }
            // The old format: after the line before.
            None => (line, modules.len().checked_sub(1).into_iter().collect()),
        };
        let escapes = path.is_empty()
            || path.contains(char::is_whitespace)
            || Path::new(path)
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)));
        ensure!(
            !escapes,
            "line {number}: {path:?} must be a plain path relative to /lib/modules/<release>/"
        );
        ensure!(
            !modules.iter().any(|m| m.path == path),
            "line {number}: {path} is listed twice"
        );
        modules.push(ModuleToLoad { path, after });
    }
    Ok(modules)
}

/// What happened to one module, for the log.
#[derive(Debug)]
pub struct Loaded<'m, T> {
    /// 1-based, in the order the loads ended.
    pub done: usize,
    pub path: &'m str,
    pub outcome: T,
    pub took: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Loading,
    Done,
}

struct Board {
    states: Vec<State>,
    done: usize,
    failed: bool,
}

/// Loads `modules` with `load` on `loaders` threads (this one among them), each module once all
/// of its `after` are done, the earliest line first among those ready. Stops starting loads at
/// the first error and returns it once the loads under way have ended.
pub fn load_in_order<'m, T: Send>(
    modules: &'m [ModuleToLoad<'m>],
    loaders: usize,
    load: impl Fn(&str) -> Result<T> + Sync,
    report: impl Fn(Loaded<'m, T>) + Sync,
) -> Result<()> {
    let board = Mutex::new(Board {
        states: vec![State::Waiting; modules.len()],
        done: 0,
        failed: false,
    });
    let changed = Condvar::new();
    let first_error = Mutex::new(None);
    let work = || loop {
        let index = {
            let mut b = board.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if b.failed || b.done == modules.len() {
                    return;
                }
                let ready = modules.iter().enumerate().position(|(i, m)| {
                    b.states[i] == State::Waiting
                        && m.after.iter().all(|&d| b.states[d] == State::Done)
                });
                match ready {
                    Some(i) => {
                        b.states[i] = State::Loading;
                        break i;
                    }
                    None => b = changed.wait(b).unwrap_or_else(|p| p.into_inner()),
                }
            }
        };
        let started = Instant::now();
        let result = load(modules[index].path);
        let mut b = board.lock().unwrap_or_else(|p| p.into_inner());
        match result {
            Ok(outcome) => {
                b.states[index] = State::Done;
                b.done += 1;
                let done = b.done;
                drop(b);
                report(Loaded {
                    done,
                    path: modules[index].path,
                    outcome,
                    took: started.elapsed(),
                });
            }
            Err(err) => {
                b.failed = true;
                drop(b);
                first_error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(err);
            }
        }
        changed.notify_all();
    };
    std::thread::scope(|scope| {
        for _ in 1..loaders.clamp(1, MAX_LOADERS) {
            scope.spawn(work);
        }
        work();
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(err) => Err(err),
        None => {
            let b = board.into_inner().unwrap_or_else(|p| p.into_inner());
            if b.done != modules.len() {
                bail!("{} of {} modules loaded", b.done, modules.len());
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    const LOAD: &str = "# generated by slate imager\n\
        kernel/lib/crc16.ko:\n\
        kernel/fs/jbd2/jbd2.ko:\n\n\
        kernel/fs/ext4/ext4.ko: kernel/lib/crc16.ko kernel/fs/jbd2/jbd2.ko\n\
        kernel/drivers/virtio/virtio_ring.ko:\n\
        kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko\n";

    #[test]
    fn lines_name_what_they_need() {
        let modules = parse_modules_load(LOAD).unwrap();
        let after: Vec<(&str, Vec<usize>)> =
            modules.iter().map(|m| (m.path, m.after.clone())).collect();
        assert_eq!(
            after,
            [
                ("kernel/lib/crc16.ko", vec![]),
                ("kernel/fs/jbd2/jbd2.ko", vec![]),
                ("kernel/fs/ext4/ext4.ko", vec![0, 1]),
                ("kernel/drivers/virtio/virtio_ring.ko", vec![]),
                ("kernel/drivers/block/virtio_blk.ko", vec![3]),
            ]
        );
        assert!(parse_modules_load("").unwrap().is_empty());
    }

    #[test]
    fn lines_without_dependencies_load_one_after_another() {
        let text = "kernel/drivers/block/loop.ko\n\n  kernel/fs/squashfs/squashfs.ko  \n\
                    kernel/fs/overlayfs/overlay.ko.xz\n";
        let modules = parse_modules_load(text).unwrap();
        let after: Vec<Vec<usize>> = modules.iter().map(|m| m.after.clone()).collect();
        assert_eq!(after, [vec![], vec![0], vec![1]]);
        assert_eq!(modules[1].path, "kernel/fs/squashfs/squashfs.ko");
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        for bad in [
            "/lib/modules/x.ko",
            "kernel/../../x.ko",
            "./x.ko",
            "b.ko: c.ko",
            "a.ko",
            "a.ko:",
            ": a.ko",
        ] {
            let err = parse_modules_load(&format!("a.ko:\n{bad}\n")).unwrap_err();
            assert!(err.to_string().starts_with("line 2: "), "{bad}: {err}");
        }
    }

    /// Each module starts only after what it needs has ended, whatever the thread count, and
    /// with several threads independent modules overlap.
    #[test]
    fn modules_wait_for_what_they_need_and_the_rest_overlap() {
        let modules = parse_modules_load(LOAD).unwrap();
        for loaders in [1, 2, 4] {
            let events = Mutex::new(Vec::new());
            let running = AtomicUsize::new(0);
            let most = AtomicUsize::new(0);
            load_in_order(
                &modules,
                loaders,
                |path| {
                    events.lock().unwrap().push(("start", path.to_owned()));
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(30));
                    running.fetch_sub(1, Ordering::SeqCst);
                    events.lock().unwrap().push(("end", path.to_owned()));
                    Ok(())
                },
                |_| {},
            )
            .unwrap();
            let events = events.into_inner().unwrap();
            let at = |kind: &str, path: &str| {
                events
                    .iter()
                    .position(|(k, p)| *k == kind && p == path)
                    .unwrap()
            };
            for m in &modules {
                for &dep in &m.after {
                    assert!(
                        at("end", modules[dep].path) < at("start", m.path),
                        "{loaders} loaders: {} started before {} ended",
                        m.path,
                        modules[dep].path
                    );
                }
            }
            assert_eq!(events.len(), 2 * modules.len());
            let most = most.into_inner();
            if loaders == 1 {
                assert_eq!(most, 1);
            } else {
                assert!(most >= 2, "{loaders} loaders never overlapped");
            }
        }
    }

    #[test]
    fn the_first_failure_stops_further_loads() {
        let modules = parse_modules_load(LOAD).unwrap();
        let started = Mutex::new(Vec::new());
        let err = load_in_order(
            &modules,
            1,
            |path| {
                started.lock().unwrap().push(path.to_owned());
                if path.ends_with("jbd2.ko") {
                    bail!("no such file");
                }
                Ok(())
            },
            |_| {},
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "no such file");
        // ext4 needs jbd2, and nothing starts after a failure.
        assert_eq!(
            started.into_inner().unwrap(),
            ["kernel/lib/crc16.ko", "kernel/fs/jbd2/jbd2.ko"]
        );
    }

    #[test]
    fn reports_count_in_the_order_loads_end() {
        let modules = parse_modules_load(LOAD).unwrap();
        let seen = Mutex::new(Vec::new());
        load_in_order(
            &modules,
            2,
            |_| Ok(7),
            |l| seen.lock().unwrap().push((l.done, l.outcome)),
        )
        .unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, [(1, 7), (2, 7), (3, 7), (4, 7), (5, 7)]);
    }
}
