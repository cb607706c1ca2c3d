//! `xtask soak` (issue 18, item 7): one VM, a long row of online upgrades alternating good and
//! broken versions, and the node API under many concurrent status clients during one of them.
//! Not part of `xtask vm-test` (it takes about 20 minutes; CI's budget is 45).
//!
//! - v1 is a disk image of the demo profile; the upgrades are installer bundles of versions
//!   `2.0.10` … `2.0.29` (every name the same length, so that every UKI takes the same room on
//!   the ESP), all built before the VM starts (a bundle takes a few seconds). Odd upgrades are
//!   good; even ones carry `slate.debug.fail-hook` (a setup hook fails, as the broken v3 of
//!   `upgrade_commit_and_revert`), so machined takes the fatal path and reverts them unattended.
//! - Each upgrade is `slate upgrade --image oci-layout:BUNDLE` against the running node. A good
//!   one must boot and commit (`committed: slate-V`); a broken one must be reverted (`upgrade
//!   reverted: the next boot is slate-PREV.efi`), the node back on the previous good version
//!   with its status's `last_failure` naming the broken one.
//! - After the broken upgrade 2 and the last broken one, with the VM off between the revert
//!   and the next boot, the ESP's free bytes (counted from the FAT) and the bytes META's
//!   records take are read from the disk image: they must be equal (pruning keeps
//!   `keep_versions` = 2 versions, the marker is dropped, nothing accumulates).
//! - During one good upgrade (`--load-at`), 50 clients, each with a reader certificate of its
//!   own (the node allows a client certificate 8 connections), ask `GET /v1/status` from
//!   before the upload until the installer has finished (the reboot follows), each pausing
//!   `--think-ms` (1 s; `slate … --wait` polls every 2 s) between its requests and starting at
//!   its own offset. The node sheds connections beyond 32 in their TLS handshake (and beyond
//!   64 in all) by closing them: such an attempt is tried again (50 ms, doubling to 1 s) and
//!   counted. Every request must be answered, each within [`LATENCY_BOUND`] of its first
//!   attempt, answers must never stop for longer than that, and the upgrade must go through.
//!   With `--think-ms 0` the clients ask in a tight loop: the shedding then also turns away
//!   the operator's own `slate upgrade` (it does not retry), which fails the run.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use slate_disk::FileDisk;

mod load;

use crate::util::{output, repo_root};
use crate::vm::{Running, Vm};
use crate::vm_test::{build_bundle, build_image, prepare, running, upgrade_went_through, Node};
use load::{ask, clients, pause, percentile, without_port, Load, Sample, StatusClient};

const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
/// Concurrent status clients during the loaded upgrade.
const CLIENTS: usize = 50;
/// The longest a status request may take under that load (QEMU TCG, one vCPU, the node also
/// receiving, verifying and installing a 43 MB bundle). Each request is a TLS handshake with a
/// client certificate; the node served about 18 a second, so 50 clients queue: measured p50
/// 1 s, p99 7 s, max 8 s, never more than 0.8 s without an answer (docs/testing.md).
const LATENCY_BOUND: Duration = Duration::from_secs(10);
/// Each client's own time limit for one request (a request over it counts as unanswered).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The version of upgrade `i` (1-based): 2.0.10, 2.0.11, …; every name the same length.
fn version(i: usize) -> String {
    format!("2.0.{}", 9 + i)
}

/// Odd upgrades are good, even ones broken.
fn is_broken(i: usize) -> bool {
    i % 2 == 0
}

/// What the disk image holds after an upgrade, read with the VM off.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DiskFigures {
    /// Free bytes of the ESP, counted from its first FAT.
    esp_free: u64,
    /// The UKIs under EFI/Linux.
    ukis: Vec<String>,
    /// Bytes META's records take in its ADV (each record's header and value).
    meta_used: usize,
    /// META's tags by name.
    meta_tags: Vec<String>,
}

fn measure(image: &Path) -> Result<DiskFigures> {
    let open = || FileDisk::open_read_only(image).with_context(|| format!("{}", image.display()));
    let esp = slate_esp::session::open(open()?)?;
    let space = slate_esp::fat_space(&esp).context("counting the ESP's free clusters")?;
    let meta = slate_layout::open_partition(open()?, slate_layout::META_LABEL)?;
    let store = slate_meta::MetaStore::open(meta).context("reading META")?;
    let meta_tags = store
        .entries()
        .iter()
        .map(|e| {
            slate_meta::tag_name(e.tag).map_or_else(|| format!("tag {}", e.tag), str::to_owned)
        })
        .collect();
    let listing = output(
        Command::new("mdir")
            .args(["-/", "-b", "-i"])
            .arg(format!("{}@@1M", image.display()))
            .arg("::/EFI/Linux"),
    )?;
    let ukis = listing
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .filter(|n| n.ends_with(".efi"))
        .map(str::to_owned)
        .collect();
    Ok(DiskFigures {
        esp_free: space.free_clusters * space.cluster_size,
        ukis,
        meta_used: store.adv().used(),
        meta_tags,
    })
}

/// `slate upgrade --image oci-layout:BUNDLE` against the running node, up to the installer's
/// line and QEMU's exit for the reboot that follows; with `load`, the status clients ask all
/// the while, from before the upload until the installer has finished. Returns the installer's
/// line and, with `load`, what the clients measured.
fn upgrade(
    node: &Node,
    boot: &mut Running,
    bundle: &Path,
    version: &str,
    cache: &Path,
    load: Option<Vec<StatusClient>>,
    think: Duration,
) -> Result<(String, Option<Load>)> {
    let mut child = node
        .command(&[
            "upgrade",
            "--image",
            &format!("oci-layout:{}", bundle.display()),
            "--cache",
            cache.to_str().unwrap_or("."),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting slate upgrade")?;
    let stop = AtomicBool::new(false);
    let stopped_at: Mutex<Option<Instant>> = Mutex::new(None);
    let samples: Mutex<Vec<Sample>> = Mutex::new(Vec::new());
    let began = Instant::now();
    let watched: Result<()> = std::thread::scope(|scope| {
        for (index, client) in load.into_iter().flatten().enumerate() {
            let (stop, samples) = (&stop, &samples);
            scope.spawn(move || {
                // Unsynchronised, like independent pollers: each starts at its own offset.
                pause(think * index as u32 / CLIENTS as u32, stop);
                let mut mine = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    mine.push(ask(&client, stop));
                    pause(think, stop);
                }
                samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(mine);
            });
        }
        // Until the installer has finished (the reboot begins), QEMU exits, or the upgrade
        // command fails.
        // No `?` before `stop` is set: the clients would never end, nor the scope.
        let deadline = Instant::now() + Duration::from_secs(600);
        let result = loop {
            if boot.serial().contains("installer: installed") || !boot.is_running() {
                break Ok(());
            }
            match child.try_wait() {
                Ok(Some(status)) if !status.success() => break Ok(()),
                Ok(_) => {}
                Err(e) => break Err(anyhow::Error::from(e).context("waiting for slate upgrade")),
            }
            if Instant::now() > deadline {
                break Err(anyhow::anyhow!("no `installer: installed` within 600 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        *stopped_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        stop.store(true, Ordering::SeqCst);
        result
    });
    let window = began.elapsed();
    let out = child.wait_with_output()?;
    let answer = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "slate upgrade {version} failed: {}{answer}",
        String::from_utf8_lossy(&out.stderr)
    );
    watched?;
    let installed = upgrade_went_through(boot, &answer, version)?;

    let samples = samples.into_inner().unwrap_or_else(|p| p.into_inner());
    if samples.is_empty() {
        return Ok((installed, None));
    }
    let stopped_at = stopped_at
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .unwrap_or_else(Instant::now);
    let (failed, ok): (Vec<&Sample>, Vec<&Sample>) =
        samples.iter().partition(|s| s.error.is_some());
    let early: Vec<&&Sample> = failed.iter().filter(|s| s.ended < stopped_at).collect();
    if let Some(first) = early.first() {
        bail!(
            "{} of {} status requests failed while the node was up (before its installer \
             finished); the first after {:.1?}: {}",
            early.len(),
            samples.len(),
            first.ended.duration_since(began),
            first.error.as_deref().unwrap_or_default()
        );
    }
    let mut latencies: Vec<Duration> = ok.iter().map(|s| s.latency).collect();
    latencies.sort();
    let mut ends: Vec<Instant> = ok.iter().map(|s| s.ended).collect();
    ends.sort();
    let longest_gap = ends
        .windows(2)
        .map(|w| w[1].duration_since(w[0]))
        .chain(ends.first().map(|first| first.duration_since(began)))
        .max()
        .unwrap_or(window);
    let mut refused = std::collections::BTreeMap::new();
    for error in samples.iter().flat_map(|s| &s.refused) {
        *refused.entry(without_port(error)).or_insert(0) += 1;
    }
    Ok((
        installed,
        Some(Load {
            refused,
            retried: ok.iter().filter(|s| !s.refused.is_empty()).count(),
            answered: ok.len(),
            after_stop: failed.len(),
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
            max: latencies.last().copied().unwrap_or_default(),
            longest_gap,
            window,
        }),
    ))
}

/// One upgrade's line in the summary.
struct Outcome {
    index: usize,
    from: String,
    to: String,
    broken: bool,
    outcome: String,
    took: Duration,
    boots: usize,
}

pub fn soak(upgrades: usize, load_at: usize, think: Duration, reuse_clients: bool) -> Result<()> {
    ensure!(upgrades >= 1, "--upgrades: at least 1");
    ensure!(
        (1..=upgrades).contains(&load_at) && !is_broken(load_at),
        "--load-at {load_at}: a good upgrade (odd) among the {upgrades}"
    );
    let started = Instant::now();
    let prepared = prepare()?;
    let prepared_in = started.elapsed();
    let slate = &prepared.slate;
    let work = repo_root().join("target/soak");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let image = work.join("soak.raw");
    build_image(slate, "1.0.0", &[], &image)?;
    let built = Instant::now();
    let bundles: Vec<PathBuf> = (1..=upgrades)
        .map(|i| {
            let (v, out) = (version(i), work.join(format!("bundle-{}", version(i))));
            let args: &[&str] = if is_broken(i) {
                &["slate.debug.fail-hook"]
            } else {
                &[]
            };
            build_bundle(slate, &v, args, &out).with_context(|| format!("bundle {v}"))?;
            Ok(out)
        })
        .collect::<Result<_>>()?;
    println!(
        "soak: prepared in {:.0} s; v1 image and {upgrades} bundles ({} good, {} broken) built \
         in {:.0} s ({:.1} s a bundle)",
        prepared_in.as_secs_f64(),
        upgrades.div_ceil(2),
        upgrades / 2,
        (started.elapsed() - prepared_in).as_secs_f64(),
        built.elapsed().as_secs_f64() / upgrades as f64
    );

    let vm_dir = work.join("vm");
    let mut vm = Vm::new(&image, &vm_dir)?;
    let node = Node {
        prepared: &prepared,
        port: vm.api_port,
        name: crate::vm_test::image_node_name(&image),
    };
    let cache = work.join("cache");
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(60),
        "v1 committed",
    )?;
    println!(
        "soak: v1 up and committed after {:.0} s",
        boot.elapsed().as_secs_f64()
    );
    let mut good = "1.0.0".to_owned();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut figures: Vec<(usize, DiskFigures)> = Vec::new();
    let last_broken = (1..=upgrades).rev().find(|&i| is_broken(i));
    let mut load = None;
    for (i, bundle) in (1..=upgrades).zip(&bundles) {
        let v = version(i);
        let from = good.clone();
        let began = Instant::now();
        let boots_before = crate::vm::boots_under(&vm_dir).0;
        let clients = if i == load_at {
            Some(clients(vm.api_port, &node.name, reuse_clients)?)
        } else {
            None
        };
        let (installed, measured) = upgrade(&node, &mut boot, bundle, &v, &cache, clients, think)
            .with_context(|| format!("upgrade {i} to {v}"))?;
        if measured.is_some() {
            load = measured;
        }
        ensure!(
            installed.contains(&format!(
                "installed slate-{v}+3.efi (fallback slate-{good}.efi"
            )),
            "upgrade {i}: {installed}"
        );
        let outcome = if is_broken(i) {
            boot = vm.start()?;
            boot.expect(
                &["[slate] [machined] fatal:"],
                BOOT_TIMEOUT,
                &format!("{v}'s fatal boot"),
            )?;
            let reverted = boot.expect(
                &["upgrade reverted: the next boot is"],
                Duration::from_secs(60),
                &format!("{v} reverted"),
            )?;
            ensure!(
                reverted.contains(&format!("slate-{good}.efi")),
                "upgrade {i}: {reverted}"
            );
            boot.wait_exit(Duration::from_secs(90))?;
            if i == 2 || Some(i) == last_broken {
                figures.push((i, measure(&image)?));
            }
            boot = running(&mut vm)?;
            let status = node.status()?;
            ensure!(
                status["version"] == good.as_str()
                    && status["last_failure"]["version"] == v.as_str()
                    && status["last_failure"]["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("setup hook 20-check failed")),
                "upgrade {i}: back on {good}, naming {v}'s failure: {status}"
            );
            format!("reverted to {good}")
        } else {
            boot = running(&mut vm)?;
            let committed = boot.expect(
                &[&format!("committed: slate-{v}")],
                Duration::from_secs(60),
                &format!("{v} committed"),
            )?;
            ensure!(
                committed.contains(&format!("blessed as slate-{v}.efi")),
                "upgrade {i}: {committed}"
            );
            let status = node.status()?;
            ensure!(
                status["version"] == v.as_str(),
                "upgrade {i}: {v} running: {status}"
            );
            good = v.clone();
            "committed".to_owned()
        };
        let o = Outcome {
            index: i,
            from,
            to: v,
            broken: is_broken(i),
            outcome,
            took: began.elapsed(),
            boots: crate::vm::boots_under(&vm_dir).0 - boots_before,
        };
        println!("soak: {}", o.line());
        outcomes.push(o);
    }
    boot.kill();

    println!(
        "\nsoak: {upgrades} online upgrades on one VM in {:.0} s (all: {:.0} s)",
        outcomes.iter().map(|o| o.took.as_secs_f64()).sum::<f64>(),
        started.elapsed().as_secs_f64()
    );
    println!("  #  from    -> to      kind    outcome              time  boots");
    for o in &outcomes {
        println!("  {}", o.line());
    }
    for (i, f) in &figures {
        println!(
            "  after upgrade {i:2}: ESP {} bytes free, UKIs {}; META {} bytes used, tags {}",
            f.esp_free,
            f.ukis.join(" "),
            f.meta_used,
            f.meta_tags.join(" ")
        );
    }
    if let Some(l) = &load {
        println!(
            "  {CLIENTS} status clients during upgrade {load_at} ({:.0} s, upload to installer \
             done): {} answered, 0 failed while up, {} cut by the reboot; latency p50 {:.0?}, \
             p99 {:.0?}, max {:.0?} (bound {LATENCY_BOUND:?}); longest time without an answer \
             {:.1?}",
            l.window.as_secs_f64(),
            l.answered,
            l.after_stop,
            l.p50,
            l.p99,
            l.max,
            l.longest_gap
        );
        println!(
            "  {} of them needed more than one attempt; attempts the node turned away: {}",
            l.retried,
            if l.refused.is_empty() {
                "none".to_owned()
            } else {
                l.refused
                    .iter()
                    .map(|(e, n)| format!("{n} × {e}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            }
        );
    }
    if let [(first_i, first), .., (last_i, last)] = figures.as_slice() {
        ensure!(
            first.esp_free == last.esp_free && first.meta_used == last.meta_used,
            "the ESP's free space or META's size changed between upgrade {first_i} and upgrade \
             {last_i}: {first:?} then {last:?}"
        );
    } else {
        println!("  (fewer than two broken upgrades: ESP and META not compared)");
    }
    if let Some(l) = &load {
        ensure!(l.answered > 0, "no status request was answered");
        ensure!(
            l.max <= LATENCY_BOUND,
            "a status request took {:.1?}, over the bound {LATENCY_BOUND:?}",
            l.max
        );
        ensure!(
            l.longest_gap <= LATENCY_BOUND,
            "no answer for {:.1?}",
            l.longest_gap
        );
    }
    println!("soak: ok");
    Ok(())
}

impl Outcome {
    fn line(&self) -> String {
        format!(
            "{:2}  {:7} -> {:7} {:7} {:20} {:4.0} s {:3}",
            self.index,
            self.from,
            self.to,
            if self.broken { "broken" } else { "good" },
            self.outcome,
            self.took.as_secs_f64(),
            self.boots
        )
    }
}
