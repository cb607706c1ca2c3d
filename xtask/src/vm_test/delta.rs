//! Delta upgrades through a real registry (issue 41): a node on v1 follows `stable`; v2 — the
//! same profile, only the version changed — is published, and the update agent pulls it by
//! delta: the running UKI read from the ESP and the running slate binary as seeds, the missing
//! chunks by range requests on the registry's blobs. slate's own counters (the agent's download
//! line) say what went over the wire, against the bundle's whole size; v2 commits, and its
//! signed documents are kept on STATE, so v3 is then planned from v2's signed index.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use super::{build_v1_v2, ensure_logged, running, Node, Prepared};
use crate::registry::Registry;
use crate::util::output;
use crate::vm::Vm;

/// The figures of `update agent: 2.0.0 downloaded and verified (N bytes fetched, M cached, R
/// reused from chunks this node holds)`.
fn moved(line: &str) -> Result<(u64, u64)> {
    let inside = line
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inside, _)| inside)
        .with_context(|| format!("no counts in {line:?}"))?;
    let number = |word: &str| -> Result<u64> {
        inside
            .split(", ")
            .find(|part| part.contains(word))
            .and_then(|part| part.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no {word} count in {line:?}"))
    };
    Ok((number("fetched")?, number("reused")?))
}

pub(super) fn delta_upgrade(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let (v1, v2, _) = build_v1_v2(slate, work)?;
    let total: u64 = slate_bundle::Bundle::open(&v2, None)?
        .image_blobs()
        .iter()
        .map(|(_, size)| size)
        .sum();
    let registry = Registry::start(&work.join("registry"))?;
    let repo = format!("{}/slate/os", registry.host);
    let port = registry.host.rsplit(':').next().unwrap_or_default();
    let guest_repo = format!("10.0.2.2:{port}/slate/os");
    let publish = |bundle: &Path| -> Result<String> {
        output(
            Command::new(slate)
                .args(["release", "publish", "--bundle"])
                .arg(bundle)
                .args(["--image", &repo, "--channel", "stable"]),
        )
    };
    publish(&v1)?;
    let config = output(
        Command::new(slate)
            .args(["gen", "config", "--name", "delta1", "--pki"])
            .arg(super::demo_pki())
            .args(["--image", &guest_repo, "--insecure-registry"])
            .args(["--poll-interval", "10s"]),
    )?;
    let config_path = work.join("delta1.machine.toml");
    fs::write(&config_path, config)?;
    let image = work.join("delta.raw");
    super::install_blank_disk_of(256, slate, &image, &v1, "1.0.0", &config_path)?;

    let mut vm = Vm::new(&image, &work.join("vm-delta"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "delta1".into(),
    };
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(60),
        "v1 committed",
    )?;
    publish(&v2)?;
    // Before a byte of the UKI is fetched, the agent's log says what it will cost.
    let planned = boot.expect(
        &["pull 2.0.0: blob sha256:"],
        Duration::from_secs(120),
        "the delta's plan in the journal",
    )?;
    ensure!(planned.contains("by delta:"), "the plan: {planned}");
    let downloaded = boot.expect(
        &["update agent: 2.0.0 downloaded and verified ("],
        Duration::from_secs(180),
        "v2 downloaded",
    )?;
    let (fetched, reused) = moved(&downloaded)?;
    // v1 was installed, not upgraded to: its chunks were listed by the node itself.
    ensure_logged(&boot, "no chunk index is kept for the running 1.0.0")?;
    ensure!(
        fetched * 20 < total && reused > total / 2,
        "a version-only change should fetch under 5 % of the bundle: {downloaded} ({total} \
         bytes whole)"
    );
    boot.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "v2's installer",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(
        &boot,
        "the chunk index of 2.0.0 is kept in /system/state/delta/",
    )?;

    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-2.0.0"],
        Duration::from_secs(60),
        "v2 committed",
    )?;
    ensure!(node.status()?["version"] == "2.0.0");
    // v2 came by an upgrade, so v3 is planned from v2's signed index kept on STATE.
    let v3 = work.join("bundle-v3");
    super::build_bundle(slate, "3.0.0", &[], &v3)?;
    publish(&v3)?;
    let downloaded3 = boot.expect(
        &["update agent: 3.0.0 downloaded and verified ("],
        Duration::from_secs(180),
        "v3 downloaded",
    )?;
    ensure!(
        !boot
            .serial()
            .contains("no chunk index is kept for the running 2.0.0"),
        "v2's kept index was not used"
    );
    let (fetched3, reused3) = moved(&downloaded3)?;
    ensure!(
        fetched3 * 20 < total && reused3 > total / 2,
        "v2 -> v3 by the kept index: {downloaded3}"
    );
    boot.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "v3's installer",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-3.0.0"],
        Duration::from_secs(60),
        "v3 committed",
    )?;
    drop(registry);
    let percent = |n: u64| n as f64 * 100.0 / total as f64;
    Ok(format!(
        "version-only upgrades by the update agent through a registry, of {total} bytes whole: \
         v1 -> v2 (v1's chunks listed by the node) fetched {fetched} ({:.2} %), reused \
         {reused}; v2 -> v3 (v2's signed index kept on STATE) fetched {fetched3} ({:.2} %), \
         reused {reused3}; both committed",
        percent(fetched),
        percent(fetched3)
    ))
}
