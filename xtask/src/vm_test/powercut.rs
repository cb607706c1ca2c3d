//! Real power cuts: the plug is pulled on QEMU at several moments of an online upgrade, and the
//! next boot must come up on the old version or the new one, every time.
//!
//! QEMU writes the raw disk image with plain `pwrite`s, so what the guest had handed to its
//! virtio disk survives the kill and what was still in the guest's page cache does not: the
//! installer's flushes are what decides. Each cut starts from the same snapshot of a committed
//! v1 disk.

use std::fs;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Result};

use super::{build_bundle, build_image, running, Node, Prepared};
use crate::vm::Vm;

/// When the plug is pulled, counted from machined's "running the installer" line.
#[derive(Debug, Clone, Copy)]
enum Cut {
    After(Duration),
    /// Once the installer reported success (before machined's reboot): the new version is
    /// durable by then and must be what boots.
    AfterInstalled,
}

pub(super) fn power_cuts_during_upgrade(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("powercut.raw");
    build_image(&prepared.slate, "1.0.0", &[], &image)?;
    let v2 = work.join("bundle-powercut-v2");
    build_bundle(&prepared.slate, "2.0.0", &[], &v2)?;
    let mut vm = Vm::new(&image, &work.join("vm-powercut"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(&image),
    };
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(30),
        "v1 committed",
    )?;
    boot.kill();
    let snapshot = work.join("powercut-v1-committed.raw");
    fs::copy(&image, &snapshot)?;

    let cuts = [
        Cut::After(Duration::ZERO),
        Cut::After(Duration::from_millis(800)),
        Cut::After(Duration::from_millis(1600)),
        Cut::AfterInstalled,
    ];
    let mut outcomes = Vec::new();
    let mut installer_time = None;
    for cut in cuts {
        fs::copy(&snapshot, &image)?;
        let mut boot = running(&mut vm)?;
        let answer = node.ok(&[
            "upgrade",
            "--image",
            &format!("oci-layout:{}", v2.display()),
        ])?;
        ensure!(answer.contains("accepted"), "slate upgrade: {answer}");
        boot.expect(
            &["running the 2.0.0 installer"],
            Duration::from_secs(60),
            "the installer starting",
        )?;
        let started = std::time::Instant::now();
        match cut {
            Cut::After(delay) => std::thread::sleep(delay),
            Cut::AfterInstalled => {
                boot.expect(
                    &["installer: installed"],
                    Duration::from_secs(120),
                    "the installer finishing",
                )?;
                installer_time = Some(started.elapsed());
            }
        }
        let finished = boot.serial().contains("installer: installed");
        boot.kill();

        let mut boot = running(&mut vm)?;
        let status = node.status()?;
        let version = status["version"].as_str().unwrap_or("").to_owned();
        ensure!(
            version == "1.0.0" || version == "2.0.0",
            "after a cut {cut:?} the node came up as {status}"
        );
        if matches!(cut, Cut::AfterInstalled) {
            ensure!(
                version == "2.0.0",
                "the installer said it was done, yet v1 came up after the cut"
            );
        }
        if version == "2.0.0" {
            boot.expect(
                &["committed: slate-2.0.0"],
                Duration::from_secs(30),
                "v2 committed after the cut",
            )?;
        } else {
            // v1 was committed before the upgrade; it commits again only if the cut came after
            // the installer recorded META `Upgrade` (then the marker is dropped).
            boot.wait_for(&["committed:"], Duration::from_secs(3))?;
        }
        boot.kill();
        let when = match cut {
            Cut::After(delay) => format!("{}ms", delay.as_millis()),
            Cut::AfterInstalled => "after `installed`".into(),
        };
        outcomes.push(format!(
            "{when}{} -> {version}",
            if finished { " (installer done)" } else { "" }
        ));
    }
    Ok(format!(
        "{} cuts into a v1 -> v2 upgrade, each booted old or new: {} (installer run {:.1?})",
        outcomes.len(),
        outcomes.join(", "),
        installer_time.unwrap_or_default()
    ))
}
