//! The scenarios' lanes: each lane takes the next scenario from one queue (longest first), runs
//! it in a directory of its own and prints its duration, boots and QEMU time; the run ends
//! with the counts and the machine's CPU use over it.

use std::collections::VecDeque;
use std::fs;
use std::path::Path;

use anyhow::{ensure, Context as _, Result};

use super::{Prepared, Scenario};

/// How many scenarios run at once unless `SLATE_VM_PARALLEL` says otherwise: each VM is one TCG
/// vCPU and these machines have two cores. Three lanes were tried in a fresh-clone run
/// (2026-12-05): every scenario took 1.4–1.8× its two-lane time, so the lane as a whole did
/// no better: the boots are CPU-bound (firmware and the kernel's XZ decompression under
/// emulation). The guests still idle a third of their time in the scenarios built around
/// waits (watchdogs, soaks; docs/testing.md has each scenario's CPU time), which the test
/// command's fuzz smoke fills. The run's CPU use is printed at the end (`cpu busy`).
const PARALLEL_SCENARIOS: usize = 2;

/// The lanes: `SLATE_VM_PARALLEL` (1–8), else [`PARALLEL_SCENARIOS`].
fn parallel_scenarios() -> Result<usize> {
    match std::env::var("SLATE_VM_PARALLEL") {
        Err(_) => Ok(PARALLEL_SCENARIOS),
        Ok(text) => match text.parse::<usize>() {
            Ok(n @ 1..=8) => Ok(n),
            _ => anyhow::bail!("SLATE_VM_PARALLEL={text:?}: expected a number from 1 to 8"),
        },
    }
}

/// The machine's CPU time so far from /proc/stat's first line: (busy, all), in ticks.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map_while(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: idle and iowait are not busy.
    let all: u64 = fields.iter().take(8).sum();
    let idle = fields.get(3)? + fields.get(4).unwrap_or(&0);
    Some((all - idle, all))
}

/// Runs `scenarios` (in order, on [`parallel_scenarios`] lanes) under `work`.
pub(super) fn run(scenarios: &[(&str, Scenario)], prepared: &Prepared, work: &Path) -> Result<()> {
    let queue = std::sync::Mutex::new(scenarios.iter().collect::<VecDeque<_>>());
    let lanes = parallel_scenarios()?;
    let cpu_before = cpu_ticks();
    let started = std::time::Instant::now();
    let failed = std::sync::Mutex::new(Vec::<String>::new());
    let passed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..lanes {
            scope.spawn(|| loop {
                let Some(&(name, scenario)) =
                    queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
                else {
                    return;
                };
                // Each scenario in a directory of its own: they run side by side.
                let dir = work.join(name);
                let began = std::time::Instant::now();
                println!("vm {name} ... started");
                let result = fs::create_dir_all(&dir)
                    .map_err(anyhow::Error::from)
                    .and_then(|()| scenario(prepared, &dir))
                    .with_context(|| format!("scenario {name}"));
                let took = began.elapsed().as_secs_f64();
                let (boots, vm_time) = crate::vm::boots_under(&dir);
                let took = format!(
                    "{took:.0} s ({boots} boots, {:.0} s of them in QEMU)",
                    vm_time.as_secs_f64()
                );
                match result {
                    Ok(detail) => {
                        passed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        println!("vm {name} ... ok in {took}: {detail}");
                    }
                    Err(err) => {
                        println!("vm {name} ... FAILED in {took}: {err:#}");
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(format!("{name} ({took}): {err:#}"));
                    }
                }
            });
        }
    });
    let passed = passed.into_inner();
    let failed = failed.into_inner().unwrap_or_else(|p| p.into_inner());
    let cpu_busy = match (cpu_before, cpu_ticks()) {
        (Some((busy0, all0)), Some((busy1, all1))) if all1 > all0 => format!(
            ", cpu busy {:.0} % (all work on the machine)",
            100.0 * (busy1 - busy0) as f64 / (all1 - all0) as f64
        ),
        _ => String::new(),
    };
    println!(
        "vm: {passed} passed, {} failed in {:.0} s ({lanes} at a time{cpu_busy})",
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    // Again at the end: a CI log is often read from its tail only.
    for failure in &failed {
        println!("vm FAILED: {failure}");
    }
    ensure!(failed.is_empty(), "{} VM scenario(s) failed", failed.len());
    Ok(())
}
