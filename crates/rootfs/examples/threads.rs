//! `cargo run --release -p slate-rootfs --example threads -- SRC_DIR [THREADS...]`: build an
//! image of SRC_DIR in memory with each thread count (default 1, 2 and all cores), three times
//! each, print the median time, and check that every build gave the same bytes.

use std::io::Cursor;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1);
    let Some(src) = args.next().map(PathBuf::from) else {
        return Err("usage: threads SRC_DIR [THREADS...]".into());
    };
    let mut counts: Vec<Option<NonZeroUsize>> = Vec::new();
    for arg in args {
        let n: usize = arg.to_string_lossy().parse()?;
        counts.push(Some(
            NonZeroUsize::new(n).ok_or("thread counts start at 1")?,
        ));
    }
    if counts.is_empty() {
        counts = vec![NonZeroUsize::new(1), NonZeroUsize::new(2), None];
    }
    let mut first: Option<Vec<u8>> = None;
    for threads in counts {
        let opts = slate_rootfs::SquashfsOptions {
            threads,
            ..slate_rootfs::SquashfsOptions::from_env()?
        };
        let mut times: Vec<Duration> = Vec::new();
        for _ in 0..3 {
            let mut out = Cursor::new(Vec::new());
            let start = Instant::now();
            slate_rootfs::build_squashfs(&src, &mut out, &opts)?;
            times.push(start.elapsed());
            let image = out.into_inner();
            match &first {
                None => first = Some(image),
                Some(first) if *first == image => {}
                Some(_) => return Err(format!("{threads:?} threads: different bytes").into()),
            }
        }
        times.sort();
        let label = threads.map_or("all cores".to_owned(), |n| n.to_string());
        println!(
            "threads {label}: median {:.2?} (runs {:.2?})",
            times[1], times
        );
    }
    println!("all builds byte-identical");
    Ok(())
}
