//! The plug pulled while /var is being written (issue 18, item 4): EPHEMERAL is a journaled
//! ext4 and machined runs `e2fsck -p` on it before the mount, so the next boot mounts it clean
//! — no "EXT4-fs error" (busybox's ext2 without a journal logged "bitmap inconsistent" here).
//!
//! The writes are the node's own: bundle uploads over the API, one after another, each
//! unpacked into a staging directory under /var/lib/slate/bundles, renamed over the one kept
//! before (files created, written, removed and renamed: data and metadata in flight). QEMU is
//! killed halfway through an upload.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::{build_bundle, build_image, ensure_logged, running, show, Node, Prepared};
use crate::vm::{tail, Vm};

/// Uploads run by the writer thread, and where it is.
#[derive(Default)]
struct Uploads {
    stop: AtomicBool,
    done: AtomicUsize,
    /// Bytes the upload in progress has sent.
    sent: AtomicU64,
    took: Mutex<Vec<Duration>>,
    error: Mutex<Option<String>>,
}

/// Upload the bundle in `layout` to the node at `port` again and again until told to stop.
/// The node is reached through a port forward on 127.0.0.1 and asked for by `name`, the one
/// name its certificate carries.
fn upload_loop(node: &Node<'_>, layout: &std::path::Path, uploads: &Arc<Uploads>) {
    let run = || -> Result<()> {
        let client = slate_api::Client::from_dir(
            &format!("127.0.0.1:{}", node.port),
            &node.prepared.pki,
            slate_api::Role::Admin,
        )?
        .with_server_name(&node.name)?;
        let bundle = Arc::new(slate_bundle::Bundle::open(layout, None)?);
        while !uploads.stop.load(Ordering::SeqCst) {
            let started = Instant::now();
            uploads.sent.store(0, Ordering::SeqCst);
            let exporting = bundle.clone();
            let progress = uploads.clone();
            let answer = client.upload_bundle(
                move |out| exporting.export_tar(out).map_err(std::io::Error::other),
                move |n| progress.sent.store(n, Ordering::SeqCst),
            );
            if uploads.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            answer.context("uploading the bundle")?;
            uploads
                .took
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(started.elapsed());
            uploads.done.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    };
    if let Err(e) = run() {
        *uploads.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(format!("{e:#}"));
    }
}

pub(super) fn var_survives_power_cut(
    prepared: &Prepared,
    work: &std::path::Path,
) -> Result<String> {
    let image = work.join("var-powercut.raw");
    build_image(&prepared.slate, "1.0.0", &[], &image)?;
    // Only ever uploaded (its payload is what /var receives), never installed.
    let layout = work.join("bundle-upload");
    build_bundle(&prepared.slate, "2.0.0", &[], &layout)?;
    let mut vm = Vm::new(&image, &work.join("vm-var-powercut"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(&image),
    };

    // Boot 1: EPHEMERAL formatted as a journaled ext4; STATE (seeded by `installer
    // configure`, ext4 too) checked before its mount.
    let mut boot = running(&mut vm)?;
    // The kernel's mount lines are KERN_INFO, below the console's loglevel: asked over the API.
    let first = node.ok(&["dmesg"])?;
    ensure_logged(
        &boot,
        "EPHEMERAL (/dev/vda4) is blank: formatting it (first boot)",
    )?;
    // STATE as `installer configure` left it: unmounted cleanly, so mounted without e2fsck.
    ensure_logged(
        &boot,
        "STATE: clean by its superblock (unmounted cleanly, no check due)",
    )?;
    for device in ["vda3", "vda4"] {
        let prefix = format!("EXT4-fs ({device}): mounted filesystem");
        let line = first
            .lines()
            .find(|l| l.contains(&prefix))
            .with_context(|| format!("no {prefix:?} in the kernel log:\n{}", tail(&first, 40)))?;
        ensure!(
            line.contains("ordered data mode"),
            "{device} should mount with its journal (ordered data mode): {line}"
        );
    }
    println!("  boot 1:");
    show(
        &boot,
        &[
            "e2fsck",
            "by its superblock",
            "is blank: formatting",
            "mounted on",
        ],
    );
    for line in first.lines().filter(|l| l.contains("EXT4-fs (vda")) {
        println!("  {}", line.trim());
    }

    // Uploads into /var, one after another; the plug is pulled halfway through the third.
    let uploads = Arc::new(Uploads::default());
    let (cut_into, cut_at, upload_time) = std::thread::scope(|scope| -> Result<_> {
        let writer = scope.spawn(|| upload_loop(&node, &layout, &uploads));
        let deadline = Instant::now() + Duration::from_secs(600);
        while uploads.done.load(Ordering::SeqCst) < 2 {
            let failed = uploads
                .error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(error) = failed {
                anyhow::bail!("the uploads before the cut failed: {error}");
            }
            ensure!(Instant::now() < deadline, "two uploads took over 600 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let took = uploads
            .took
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let average = took.iter().sum::<Duration>() / took.len() as u32;
        std::thread::sleep(average / 2);
        let done = uploads.done.load(Ordering::SeqCst);
        let sent = uploads.sent.load(Ordering::SeqCst);
        boot.kill();
        uploads.stop.store(true, Ordering::SeqCst);
        let _ = writer.join();
        let received = boot.serial().matches("received bundle").count();
        ensure!(
            received == done && sent > 0,
            "the cut should come mid-upload: {done} uploads done, {received} received by \
             the node, {sent} bytes of the next sent"
        );
        Ok((done + 1, sent, average))
    })?;

    // Boot 2: e2fsck -p before the mount, no ext4 error anywhere, /var mounted, Running.
    let mut boot = running(&mut vm)?;
    let serial = boot.serial();
    let position = |needle: &str| {
        serial
            .find(needle)
            .with_context(|| format!("no {needle:?} on the console:\n{}", tail(&serial, 40)))
    };
    // Checked because the superblock said the journal holds transactions (needs_recovery).
    let checked = position("EPHEMERAL: e2fsck -p (its journal needs replaying): ")?;
    let mounted = position("EPHEMERAL mounted on /var")?;
    ensure!(
        checked < mounted,
        "e2fsck must run before EPHEMERAL is mounted"
    );
    ensure!(
        !serial.contains("EXT4-fs error"),
        "the boot after the cut logged an ext4 error:\n{}",
        serial
            .lines()
            .filter(|l| l.contains("EXT4-fs"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    ensure!(
        !serial.contains("has no journal"),
        "EPHEMERAL was made with a journal"
    );
    let fsck_line = serial[checked..]
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    // The cut left EPHEMERAL mounted: e2fsck replayed its journal before the kernel saw it.
    ensure!(
        fsck_line.contains("recovering journal"),
        "e2fsck should have replayed EPHEMERAL's journal after the cut: {fsck_line}"
    );
    ensure!(node.status()?["stage"] == "Running", "the node is Running");
    let dmesg = node.ok(&["dmesg"])?;
    ensure!(
        !dmesg.contains("EXT4-fs error"),
        "the kernel log after the cut has an ext4 error:\n{}",
        dmesg
            .lines()
            .filter(|l| l.contains("EXT4-fs"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("  boot 2 (after the cut):");
    show(&boot, &["e2fsck", "mounted on"]);
    for line in dmesg
        .lines()
        .filter(|l| l.contains("EXT4-fs") || l.contains("jbd2"))
    {
        println!("  {}", line.trim());
    }

    // /var takes writes again: one more upload is received whole.
    let bundle = slate_bundle::Bundle::open(&layout, None)?;
    let client = slate_api::Client::from_dir(
        &format!("127.0.0.1:{}", vm.api_port),
        &prepared.pki,
        slate_api::Role::Admin,
    )?
    .with_server_name(&node.name)?;
    let bundle = Arc::new(bundle);
    client
        .upload_bundle(
            move |out| bundle.export_tar(out).map_err(std::io::Error::other),
            |_| {},
        )
        .context("uploading after the cut")?;
    boot.expect(
        &["received bundle"],
        Duration::from_secs(30),
        "the upload after the cut received",
    )?;
    ensure!(
        !boot.serial().contains("EXT4-fs error"),
        "an ext4 error after the cut:\n{}",
        tail(&boot.serial(), 20)
    );
    // Issue 40: the same node's /var, persistent and then ephemeral.
    let base = std::fs::read_to_string(work.join(format!("{}.machine.toml", node.name)))?;
    let (modes, mut boot) =
        super::var_modes::persistent_then_ephemeral(&node, &mut vm, boot, work, &base)?;
    boot.kill();
    Ok(format!(
        "boot 1: STATE and EPHEMERAL mounted with their journals (ordered data mode); power cut \
         {:.1} MiB into upload #{cut_into} to /var (an upload takes {upload_time:.1?}); boot 2: \
         `{fsck_line}` before the mount, no EXT4-fs error on the console or in dmesg, Running, and a new upload received; {modes}",
        cut_at as f64 / (1 << 20) as f64
    ))
}
