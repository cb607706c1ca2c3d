//! The CPU cost of a Prometheus scrape of a node (not a test; issue 42's "the node's scrape adds
//! ≤ 1 % CPU at a 15 s interval"). One committed node in a VM (QEMU TCG, 1 vCPU); machined's
//! own CPU time is read from its `process_cpu_seconds_total` (`CLOCK_PROCESS_CPUTIME_ID`, every
//! thread) at the start and the end of a fixed wall-clock window:
//!
//! - slate: [`SCRAPES`] scrapes of `/metrics` — each a new mutual-TLS connection with the
//!   reader certificate, as a Prometheus without keep-alive would make, so the handshake is in
//!   the cost — then idle to the window's end;
//! - baseline: the same window with the node left idle (its agent, reaper and journal run).
//!
//! Both windows are bracketed by the same two reads, so their cost cancels in the difference:
//! a scrape's cost is (slate − baseline) / [`SCRAPES`], and at a 15 s interval it adds that
//! over 15 s of CPU. In a VM under TCG every guest instruction is emulated, so the figures are
//! an upper bound for real hardware. A VM rather than machined on the host: machined runs only
//! as PID 1 (or under systemd), and its `/metrics` reads the real node's status.

use std::cell::Cell;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use slate_testkit::prometheus::https_get;

use crate::bench::{Bench, Comparison, Sample, Side};
use crate::util::{output, repo_root};
use crate::vm::Vm;
use crate::vm_test::{build_image, image_node_name, prepare, Prepared};

const RUNNING: &str = "[slate] [machined] stage Running";
const TIMEOUT: Duration = Duration::from_secs(240);
/// Scrapes in a window.
const SCRAPES: usize = 30;
/// Each side's window, wall clock: room for [`SCRAPES`] under TCG and a loaded host.
const WINDOW: Duration = Duration::from_secs(40);
/// Prometheus' default scrape interval, which the target is stated for.
const INTERVAL_SECS: f64 = 15.0;
/// The target: CPU added at that interval, percent of one CPU.
pub const TARGET_PERCENT: f64 = 1.0;

struct Target<'a> {
    prepared: &'a Prepared,
    port: u16,
}

impl Target<'_> {
    fn metrics(&self) -> Result<String> {
        let pki = &self.prepared.pki;
        let (status, body) = https_get(
            &format!("127.0.0.1:{}", self.port),
            &pki.join("ca.crt"),
            &pki.join("reader.crt"),
            &pki.join("reader.key"),
            "/metrics",
        )
        .map_err(|e| anyhow!("GET /metrics: {e}"))?;
        if status != 200 {
            bail!("GET /metrics answered {status}: {body}");
        }
        Ok(body)
    }

    /// machined's CPU seconds so far, from its own scrape.
    fn cpu(&self) -> Result<f64> {
        let text = self.metrics()?;
        text.lines()
            .find_map(|l| l.strip_prefix("process_cpu_seconds_total "))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("no process_cpu_seconds_total in /metrics:\n{text}"))
    }

    /// machined's CPU milliseconds over one [`WINDOW`] with `scrapes` scrapes at its start.
    fn window(&self, scrapes: usize) -> Result<f64> {
        let start = Instant::now();
        let before = self.cpu()?;
        for _ in 0..scrapes {
            self.metrics()?;
        }
        let busy = start.elapsed();
        if busy > WINDOW {
            bail!("{scrapes} scrapes took {busy:?}, longer than the {WINDOW:?} window");
        }
        std::thread::sleep(WINDOW - busy);
        Ok((self.cpu()? - before) * 1e3)
    }
}

fn wait_committed(prepared: &Prepared, port: u16, name: &str) -> Result<()> {
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        let status = output(
            Command::new(&prepared.slate)
                .arg("--node")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--server-name")
                .arg(name)
                .arg("--certs")
                .arg(&prepared.pki)
                .args(["status", "--output", "json"]),
        );
        if let Ok(text) = status {
            let status: serde_json::Value = serde_json::from_str(&text)?;
            if status["committed"] == true && status["stage"] == "Running" {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("the node did not commit within {TIMEOUT:?}")
}

pub fn bench_node_scrape() -> Result<Vec<Comparison>> {
    let prepared = prepare()?;
    let work = repo_root().join("target/bench/node-scrape");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let disk = work.join("node.raw");
    build_image(&prepared.slate, "1.0.0", &[], &disk)?;
    let mut vm = Vm::new(&disk, &work.join("vm"))?;
    let mut boot = vm.start()?;
    boot.expect(&[RUNNING], TIMEOUT, "the first boot")?;
    wait_committed(&prepared, vm.api_port, &image_node_name(&disk))?;
    let target = Target {
        prepared: &prepared,
        port: vm.api_port,
    };
    let result = measure(&target);
    boot.kill();
    let _ = fs::remove_file(Path::new(&disk));
    result
}

fn measure(target: &Target) -> Result<Vec<Comparison>> {
    // The idle window last measured, for the scraped window after it.
    let idle = Cell::new(f64::NAN);
    let scraped = Side::new(
        &format!("{SCRAPES} scrapes in {} s", WINDOW.as_secs()),
        |_| {
            let ms = target.window(SCRAPES)?;
            let per_scrape = (ms - idle.get()) / SCRAPES as f64;
            Ok(Sample::new(ms)
                .with("per_scrape_cpu", "ms", per_scrape)
                .with(
                    "cpu_at_15s_interval",
                    "%",
                    per_scrape / 1e3 / INTERVAL_SECS * 100.0,
                ))
        },
    );
    let quiet = Side::new(&format!("idle node, {} s", WINDOW.as_secs()), |_| {
        let ms = target.window(0)?;
        idle.set(ms);
        Ok(Sample::new(ms))
    });
    let mut c = Bench::new("node scrape CPU", "ms")
        .about("machined's CPU time (process_cpu_seconds_total) over the same wall-clock window")
        .about(format!(
            "{SCRAPES} scrapes of /metrics (a new mutual-TLS connection each, reader certificate) \
             vs none; QEMU TCG, 1 vCPU, one committed node"
        ))
        .run(scraped, quiet, vec![])?;
    let (slate, baseline) = (c.slate.stats().median, c.baseline.stats().median);
    let per_scrape = (slate - baseline) / SCRAPES as f64;
    let percent = per_scrape / 1e3 / INTERVAL_SECS * 100.0;
    let idle_percent = baseline / 1e3 / WINDOW.as_secs_f64() * 100.0;
    c.extra(
        "per_scrape",
        serde_json::json!({
            "cpu_ms": per_scrape,
            "cpu_percent_at_15s": percent,
            "idle_cpu_percent": idle_percent,
            "target_percent": TARGET_PERCENT,
        }),
        format!(
            "a scrape costs machined {per_scrape:.2} ms of CPU (medians: ({slate:.1} − \
             {baseline:.1}) / {SCRAPES}); at a 15 s interval that is {percent:.3} % of a CPU \
             (target ≤ {TARGET_PERCENT} %: {}); the idle node itself uses {idle_percent:.3} %",
            if percent <= TARGET_PERCENT {
                "met"
            } else {
                "NOT met"
            }
        ),
    );
    c.print();
    Ok(vec![c])
}
