//! Services benchmark (not a test): what supervising a workload costs machined. The demo image
//! booted the way bench-boot boots it (QEMU direct kernel boot, TCG, one vCPU; kernel
//! timestamps off the console) with 50 services — the image's `web` and 49 from the machine
//! configuration: busybox httpd servers each with a TCP readiness check, and two that ignore
//! SIGTERM (grace 2 s) — and the same root with none. From the same boots:
//!
//! - boot: kernel start to machined's `services: all 50 ready`, against bench-boot's busybox
//!   /init mounting the same root, and slate's boot to stage Running with no services;
//! - memory: machined's resident set (`slate status`'s `memory`) with 50 services and with none,
//!   and the difference per service;
//! - drain: the power button's `services stopped in N ms` against the longest grace period (all
//!   stopped at once) and the stubborn services' grace periods added (one at a time).
//!
//! Each boot ends with the power button, as bench-boot's: the first boot of each disk (it formats
//! STATE and /var) is the warm-up.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::json;

use crate::bench::boot::{
    build_parts, kernel_timestamp, write_baseline_initramfs, DirectBoot, BASELINE_MARKER,
};
use crate::bench::{print_ratios, Bench, Comparison, Sample, Side};
use crate::util::{repo_root, run};
use crate::vm::Vm;
use crate::vm_test::{configure_disk, image_node_name, node_config, prepare};
use crate::vm_test::{Node, Prepared};

/// Services of the measured node, the image's `web` included.
pub const SERVICES: usize = 50;
/// Of the machine configuration's: those that ignore their stop signal, and their grace.
const STUBBORN: usize = 2;
const STUBBORN_GRACE_SECS: u32 = 2;
/// The other machine configuration services (httpd) keep the default grace; web has its own.
const HTTPD_GRACE_SECS: u32 = 10;
const WEB_GRACE_SECS: u32 = 5;
/// Their ports: 9001, 9002, …
const FIRST_PORT: u16 = 9001;

const RUNNING: &str = "[slate] [machined] stage Running";
const STOPPED: &str = "services stopped in ";
const TIMEOUT: Duration = Duration::from_secs(300);

/// The machine configuration's 49 services: httpd servers ready when their port accepts, then
/// the stubborn ones (`trap '' TERM`: their stop signal is ignored, the cgroup is killed after
/// their grace period).
fn extra_services() -> String {
    let mut text = String::new();
    let httpd = SERVICES - 1 - STUBBORN;
    for i in 0..httpd {
        let port = FIRST_PORT + i as u16;
        let _ = write!(
            text,
            "\n[[services]]\nname = \"httpd-{port}\"\n\
             command = [\"/bin/httpd\", \"-f\", \"-p\", \"{port}\", \"-h\", \"/usr/share/slate/www\"]\n\
             depends_on = [\"network\"]\nready = {{ tcp = \"127.0.0.1:{port}\" }}\n\
             stop_grace_secs = {HTTPD_GRACE_SECS}\n"
        );
    }
    for i in 1..=STUBBORN {
        let _ = write!(
            text,
            "\n[[services]]\nname = \"stubborn-{i}\"\n\
             command = [\"/bin/sh\", \"-c\", \"trap '' TERM; while :; do sleep 1; done\"]\n\
             stop_grace_secs = {STUBBORN_GRACE_SECS}\n"
        );
    }
    text
}

/// The demo profile with no services: its `[[services]]` tables and the health check that
/// waits for one left out, its relative paths made absolute (the copy lives elsewhere).
fn without_services(text: &str, profiles: &Path) -> String {
    let text = text.replace("\"../", &format!("\"{}/../", profiles.display()));
    // Blocks from one table header to the next.
    let mut blocks: Vec<String> = vec![String::new()];
    for line in text.lines() {
        if line.trim_start().starts_with('[') {
            blocks.push(String::new());
        }
        let block = blocks.last_mut().expect("one block at least");
        block.push_str(line);
        block.push('\n');
    }
    blocks
        .into_iter()
        .filter(|b| {
            let header = b.lines().next().unwrap_or_default().trim();
            let service_check =
                header == "[[health.checks]]" && b.lines().any(|l| l.starts_with("service ="));
            header != "[[services]]" && !header.starts_with("[services.") && !service_check
        })
        .collect()
}

/// What one boot of a node gave.
#[derive(Debug, Clone, Copy)]
struct Booted {
    /// Kernel timestamp of the line waited for (all services ready, or Running).
    at: f64,
    running: f64,
    rss_kib: f64,
    /// Of that resident set, what machined's journal keeps.
    journal_bytes: f64,
    /// machined's own figure: `services: all N ready X ms after their start`.
    ready_after_ms: Option<f64>,
    /// `services stopped in N ms` of the power button's drain (none without services).
    drain_ms: Option<f64>,
    /// Services killed after their grace period in that drain.
    killed: usize,
}

/// A node: its VM (OVMF and systemd-boot: a boot is committed only when the firmware says
/// which entry booted, which a direct kernel boot cannot) and what ends the measured part of
/// its boot.
struct Setup<'a> {
    prepared: &'a Prepared,
    vm: Vm,
    name: String,
    marker: String,
    services: usize,
}

impl Setup<'_> {
    fn new<'a>(
        prepared: &'a Prepared,
        disk: &Path,
        marker: &str,
        services: usize,
    ) -> Result<Setup<'a>> {
        Ok(Setup {
            prepared,
            vm: Vm::new(disk, &disk.with_extension("vm"))?,
            name: image_node_name(disk),
            marker: marker.to_owned(),
            services,
        })
    }

    /// Boots the node, waits for the marker, Running and the commit, reads machined's memory,
    /// then presses the power button and reads the drain off the console.
    fn boot(&mut self, run: usize) -> Result<Booted> {
        let mut boot = self.vm.start()?;
        boot.expect(&[&self.marker], TIMEOUT, &self.marker)?;
        boot.expect(&[RUNNING], TIMEOUT, "stage Running")?;
        let serial = boot.serial();
        let ready_after_ms = number_after(&serial, "ready ", " ms after their start");
        let stamp = |marker: &str| {
            kernel_timestamp(&serial, marker)
                .with_context(|| format!("no kernel timestamp on {marker:?}"))
        };
        let (at, running) = (stamp(&self.marker)?, stamp(RUNNING)?);
        let node = Node {
            prepared: self.prepared,
            port: self.vm.api_port,
            name: self.name.clone(),
        };
        let deadline = Instant::now() + TIMEOUT;
        let status = loop {
            if let Ok(status) = node.status() {
                if status["committed"] == true {
                    break status;
                }
            }
            ensure!(
                Instant::now() < deadline,
                "the node did not commit; console:\n{}",
                crate::vm::tail(&boot.serial(), 30)
            );
            std::thread::sleep(Duration::from_millis(500));
        };
        ensure!(status["stage"] == "Running", "stage Running: {status}");
        self.check_services(&node)?;
        // Read after the boot's last API answers, as the node sits with its workload.
        let status = node.status()?;
        let memory = |key: &str| {
            status["memory"][key]
                .as_f64()
                .with_context(|| format!("no memory.{key} in the status: {status}"))
        };
        let (rss_kib, journal_bytes) = (memory("rss_kib")?, memory("journal_bytes")?);
        boot.system_powerdown()?;
        boot.wait_exit(TIMEOUT)?;
        let serial = boot.serial();
        if run > 0 && serial.contains("recovering journal") {
            bail!("boot {run} replayed a journal: the power-off before it was not clean");
        }
        Ok(Booted {
            at,
            running,
            rss_kib,
            journal_bytes,
            ready_after_ms,
            drain_ms: number_after(&serial, STOPPED, " ms"),
            killed: serial.matches("after signal 15; killed").count(),
        })
    }

    /// `slate services` lists every service running and ready.
    fn check_services(&self, node: &Node) -> Result<()> {
        let out = node
            .command(&["services", "--output", "json"])
            .output()
            .context("running slate services")?;
        ensure!(out.status.success(), "slate services failed");
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let services = listed["services"].as_array().cloned().unwrap_or_default();
        ensure!(
            services.len() == self.services
                && services
                    .iter()
                    .all(|s| s["state"] == "running" && s["ready"] == true),
            "{} services, all running and ready: {listed}",
            self.services
        );
        Ok(())
    }
}

/// The number between `before` and `after` on the last console line that has both (`services
/// stopped in N ms`).
fn number_after(serial: &str, before: &str, after: &str) -> Option<f64> {
    serial.lines().rev().find_map(|line| {
        let (_, rest) = line.split_once(before)?;
        rest.split_once(after)?.0.trim().parse().ok()
    })
}

/// A disk image of `profile` at 1.0.0 whose machine configuration (`slate gen config` for the
/// node named after the file) ends with `services`.
fn node_image(prepared: &Prepared, profile: &Path, services: &str, out: &Path) -> Result<()> {
    run(Command::new(&prepared.slate)
        .args(["imager", "build", "--profile"])
        .arg(profile)
        .args(["--version", "1.0.0", "--output", "image", "--out"])
        .arg(out))?;
    let dir = out.parent().unwrap_or(Path::new("."));
    let config = node_config(&prepared.slate, dir, &image_node_name(out))?;
    let mut text = fs::read_to_string(&config)?;
    text.push_str(services);
    fs::write(&config, text)?;
    configure_disk(&prepared.slate, out, &config)
}

/// Every boot of a node, by run.
type Boots = RefCell<BTreeMap<usize, Booted>>;

/// A side that gives, run by run, what `sample` reads off the boot measured earlier.
fn replay<'a>(name: &str, boots: &'a Boots, sample: fn(&Booted) -> Result<Sample>) -> Side<'a> {
    Side::new(name, move |run| {
        let boots = boots.borrow();
        sample(
            boots
                .get(&run)
                .with_context(|| format!("no boot of run {run}"))?,
        )
    })
}

/// machined's resident set, with the journal's part of it.
fn memory(b: &Booted) -> Result<Sample> {
    Ok(Sample::new(b.rss_kib).with("journal", "B", b.journal_bytes))
}

pub fn bench_services() -> Result<Vec<Comparison>> {
    let prepared = prepare()?;
    let work = repo_root().join("target/bench/services");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(work.join("demo"))?;
    let profiles = repo_root().join("profiles");
    let demo = build_parts(
        &prepared.slate,
        &profiles.join("demo.toml"),
        &work.join("demo"),
    )?;
    let bare_profile = work.join("bare.toml");
    fs::write(
        &bare_profile,
        without_services(&fs::read_to_string(profiles.join("demo.toml"))?, &profiles),
    )?;
    let baseline_initrd = work.join("baseline.cpio");
    write_baseline_initramfs(&demo.rootfs, &baseline_initrd)?;

    // The node with 50 services: the demo image, its machine configuration with 49 more; the
    // node with none: the same root without them, a machine configuration without any.
    let loaded = work.join("services.raw");
    node_image(
        &prepared,
        &profiles.join("demo.toml"),
        &extra_services(),
        &loaded,
    )?;
    let empty = work.join("bare.raw");
    node_image(&prepared, &bare_profile, "", &empty)?;

    let mut with = Setup::new(
        &prepared,
        &loaded,
        &format!("[slate] [machined] services: all {SERVICES} ready"),
        SERVICES,
    )?;
    let mut without = Setup::new(&prepared, &empty, RUNNING, 0)?;
    // Each boot, by run: the comparisons after the first are read off the same boots.
    let (boots_with, boots_without) = (Boots::default(), Boots::default());
    let slate = Side::new(&format!("slate, {SERVICES} services ready"), |run| {
        let b = with.boot(run)?;
        boots_with.borrow_mut().insert(run, b);
        let sample = Sample::new(b.at).with("running", "s", b.running);
        Ok(match b.ready_after_ms {
            Some(ms) => sample.with("ready_after_their_start", "s", ms / 1e3),
            None => sample,
        })
    });
    let baseline = Side::new("busybox /init to root mounted", |run| {
        let log = work.join(format!("baseline-{run}.log"));
        let mut boot =
            DirectBoot::start(&demo.kernel, &baseline_initrd, &loaded, &demo.cmdline, &log)?;
        boot.wait_for(BASELINE_MARKER, TIMEOUT).map(Sample::new)
    });
    let bare_side = Side::new("slate, no services, to Running", |run| {
        let b = without.boot(run)?;
        boots_without.borrow_mut().insert(run, b);
        Ok(Sample::new(b.at))
    });
    let mut comparisons = Vec::new();
    let boot = Bench::new(&format!("boot to {SERVICES} services ready"), "s")
        .about("kernel start to machined's `services: all 50 ready` (the image's web and 47")
        .about("httpd with TCP checks, 2 shells that ignore SIGTERM) vs a mounted squashfs root")
        .about("(busybox /init) and vs slate's stage Running with no services; kernel timestamps,")
        .about("QEMU TCG, 1 vCPU; slate through OVMF and systemd-boot (a boot commits only when")
        .about("the firmware names the entry), busybox by direct kernel boot as in bench-boot;")
        .about("each slate boot ends with the power button, the first of each disk is the warm-up")
        .run(slate, baseline, vec![bare_side])?;
    boot.print();
    comparisons.push(boot);

    let mut memory = Bench::new("machined memory with 50 services", "KiB")
        .about("machined's resident set (`slate status`, memory.rss_kib) once the boot is")
        .about("committed and every service ready, read off the boots above")
        .run(
            replay(&format!("{SERVICES} services"), &boots_with, memory),
            replay("no services", &boots_without, memory),
            vec![],
        )?;
    let per_service =
        (memory.slate.stats().median - memory.baseline.stats().median) / SERVICES as f64;
    memory.extra(
        "per_service_kib",
        json!(per_service),
        format!("per service: {per_service:.1} KiB of machined's resident set (medians)"),
    );
    memory.print();
    comparisons.push(memory);

    let stubborn = f64::from(STUBBORN_GRACE_SECS);
    let all_graces = f64::from(WEB_GRACE_SECS)
        + (SERVICES - 1 - STUBBORN) as f64 * f64::from(HTTPD_GRACE_SECS)
        + STUBBORN as f64 * stubborn;
    let mut drain_cmp = Bench::new(&format!("drain of {SERVICES} services"), "s")
        .about("the power button's `services stopped in N ms` (the boots above) vs the longest")
        .about("grace period a service used (all stopped at once) and the grace periods of those")
        .about("that ignore SIGTERM added up (stopped one at a time); the others stop at SIGTERM")
        .run(
            replay(
                &format!("slate drain, {SERVICES} services"),
                &boots_with,
                |b| {
                    let ms = b
                        .drain_ms
                        .context("no `services stopped in` on the console")?;
                    Ok(Sample::new(ms / 1e3).with("killed_after_their_grace", "", b.killed as f64))
                },
            ),
            Side::computed("longest grace used (all at once)", stubborn),
            vec![Side::computed(
                "graces used, added (one at a time)",
                stubborn * STUBBORN as f64,
            )],
        )?;
    drain_cmp.extra(
        "every_grace_added_s",
        json!(all_graces),
        format!("every grace period added (had none answered its signal): {all_graces} s"),
    );
    drain_cmp.print();
    comparisons.push(drain_cmp);
    print_ratios(&comparisons);
    Ok(comparisons)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_configuration_adds_49_services() {
        let text = extra_services();
        assert_eq!(text.matches("[[services]]").count(), SERVICES - 1);
        assert!(text.contains("name = \"httpd-9047\""), "{text}");
        assert!(text.contains("ready = { tcp = \"127.0.0.1:9001\" }"));
        assert_eq!(text.matches("stop_grace_secs = 2\n").count(), STUBBORN);
    }

    #[test]
    fn the_bare_profile_has_no_services_and_no_check_for_one() {
        let demo = fs::read_to_string(repo_root().join("profiles/demo.toml")).unwrap();
        let bare = without_services(&demo, Path::new("/p"));
        assert!(!bare.contains("[[services]]") && !bare.contains("service = \"web\""));
        assert!(bare.contains("tcp = \"127.0.0.1:50000\"") && bare.contains("[watchdog]"));
        assert!(bare.contains("\"/p/../target/demo/rootfs\""), "{bare}");
    }

    #[test]
    fn reads_the_drain_off_the_console() {
        let serial =
            "[   8.2] [slate] [machined] services: all 50 ready 998 ms after their start\n\
                      [   9.1] [slate] [machined] drain: services stopped in 4213 ms\n";
        assert_eq!(number_after(serial, STOPPED, " ms"), Some(4213.0));
        let ready = number_after(serial, "ready ", " ms after their start");
        assert_eq!(ready, Some(998.0));
        assert_eq!(number_after("nothing", STOPPED, " ms"), None);
    }
}
