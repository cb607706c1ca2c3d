//! The upgrade story: v1 installed from its bundle, v2 uploaded over the API and committed, a
//! broken v3 reverted unattended, and one boot of another entry by `slate reboot --entry`.

use super::node_scrape::NodeScrape;
use super::*;

/// The upgrade story's artifacts: v1, v2 and a broken v3 (a setup hook fails) as installer
/// bundles in `work`, and v1 installed from its bundle onto the blank disk `image` by
/// `slate installer install` (the install mode). Returns (v2, v3) and the installer's output.
pub(super) fn build_upgrade_story(
    slate: &Path,
    image: &Path,
    work: &Path,
) -> Result<(PathBuf, PathBuf, String)> {
    let (v1, v2, v3) = build_v1_v2(slate, work)?;
    build_bundle(slate, "3.0.0", &["slate.debug.fail-hook"], &v3)?;
    let _ = fs::remove_file(image);
    fs::File::create(image)?.set_len(256 << 20)?;
    let config = node_config(slate, work, "node1")?;
    let install = |extra: &[&str]| {
        output(
            Command::new(slate)
                .args(["installer", "install", "--disk"])
                .arg(image)
                .arg("--bundle")
                .arg(&v1)
                .arg("--trusted-keys")
                .arg(demo_keys())
                .arg("--config")
                .arg(&config)
                .args(extra),
        )
    };
    let plan = install(&["--dry-run"])?;
    ensure!(
        plan.contains("would install slate 1.0.0") && plan.contains("META"),
        "install --dry-run: {plan}"
    );
    let installed = install(&[])?;
    ensure!(installed.contains("installed slate 1.0.0"), "{installed}");
    let again = Command::new(slate)
        .args(["installer", "install", "--disk"])
        .arg(image)
        .arg("--bundle")
        .arg(&v1)
        .arg("--trusted-keys")
        .arg(demo_keys())
        .output()?;
    ensure!(
        !again.status.success() && String::from_utf8_lossy(&again.stderr).contains("not blank"),
        "installing over a disk in use must be refused without --force"
    );
    Ok((v2, v3, format!("{plan}{installed}")))
}

pub(super) fn offline_upgrade(slate: &Path, image: &Path, bundle: &Path) -> Result<String> {
    output(
        Command::new(slate)
            .args(["installer", "upgrade", "--disk"])
            .arg(image)
            .arg("--bundle")
            .arg(bundle)
            .arg("--trusted-keys")
            .arg(demo_keys()),
    )
}

/// A copy of the layout at `bundle` without its signature manifests.
pub(super) fn strip_signatures(bundle: &Path, out: &Path) -> Result<PathBuf> {
    let _ = fs::remove_dir_all(out);
    run(Command::new("cp").arg("-a").arg(bundle).arg(out))?;
    let index_path = out.join("index.json");
    let mut index: serde_json::Value = serde_json::from_slice(&fs::read(&index_path)?)?;
    if let Some(manifests) = index["manifests"].as_array_mut() {
        manifests.retain(|m| {
            !m["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .is_some_and(|t| t.ends_with(".sig"))
        });
    }
    fs::write(&index_path, serde_json::to_vec_pretty(&index)?)?;
    Ok(out.to_owned())
}

/// `slate upgrade --image oci-layout:BUNDLE` against the running node: the client checks and
/// uploads the bundle, the node checks it again, runs the bundle's own installer and reboots.
/// Returns the console lines of the installer.
pub(super) fn online_upgrade(
    node: &Node,
    boot: &mut Running,
    bundle: &Path,
    version: &str,
) -> Result<String> {
    online_upgrade_from(
        node,
        boot,
        &format!("oci-layout:{}", bundle.display()),
        version,
    )
}

/// [`online_upgrade`] from any image reference `slate upgrade --image` takes.
pub(super) fn online_upgrade_from(
    node: &Node,
    boot: &mut Running,
    image: &str,
    version: &str,
) -> Result<String> {
    // A blob cache per VM: scenarios run side by side, and the cache takes no lock.
    let cache = repo_root().join(format!("target/vm-test-cache/{}", node.port));
    let answer = node.ok(&[
        "upgrade",
        "--image",
        image,
        "--cache",
        cache.to_str().unwrap_or("."),
    ])?;
    upgrade_went_through(boot, &answer, version)
}

/// What follows `slate upgrade`'s `answer`: the node took the bundle of `version`, its
/// installer finished — writing the UKI machined sealed on upload, not its file hashed again
/// (issue 43) — and the node rebooted. Returns the installer's console line.
pub(crate) fn upgrade_went_through(
    boot: &mut Running,
    answer: &str,
    version: &str,
) -> Result<String> {
    ensure!(
        answer.contains(&format!("uploaded slate {version}")) && answer.contains("accepted"),
        "slate upgrade: {answer}"
    );
    let installed = boot.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "the bundle's installer",
    )?;
    ensure!(
        installed.contains("UKI taken sealed from its verifier"),
        "the installer was not handed machined's sealed copy of the UKI: {installed}"
    );
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(boot, &format!("received bundle slate {version}"))?;
    ensure_logged(boot, "[slate] [machined] rebooting (default)")?;
    Ok(installed)
}

/// v1 → v2 with `slate upgrade` over the API (the v2 bundle's own installer writes v2 beside
/// v1): v2 boots on its first try, machined commits it (entry blessed, META marker gone), and
/// v2 is still what boots after another reboot. Then a broken v3 (a setup hook fails) goes the
/// same way, takes the fatal path, machined reverts to v2 (v3 marked bad), and after the reboot
/// v2 is up again with no human action, its status naming v3's failure.
pub(super) fn upgrade_commit_and_revert(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("upgrade.raw");
    let (v2, v3, _) = build_upgrade_story(&prepared.slate, &image, work)?;
    let mut vm = Vm::new(&image, &work.join("vm-upgrade"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "node1".into(),
    };
    let meta_upgrade = || -> Result<Output> {
        Ok(Command::new(&prepared.slate)
            .args(["meta", "get", "Upgrade", "--disk"])
            .arg(&image)
            .output()?)
    };

    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(30),
        "v1 blessed",
    )?;
    // Prometheus scrapes the node from here to the end: its counters are asked below, after
    // each commit and revert, and must never go down across the reboots.
    let scrape = NodeScrape::start(&node, work)?;
    let families = scrape.promtool()?;
    let mut metrics = vec![
        format!("promtool check metrics: v1's /metrics passes ({families} families)"),
        scrape.expect("slate_node_version_info{version=\"1.0.0\"}", 1.0)?,
        scrape.expect("slate_node_upgrades_total{outcome=\"committed\"}", 0.0)?,
    ];
    let boots_before = scrape.value("slate_node_boots_total{outcome=\"committed\"}")?;
    // The workload: v1's web service answers, and the node answers for it.
    let web_v1 = workload::serves_version(vm.web_port, "1.0.0")?;
    let services = workload::services_answer(&node, vm.web_port)?;
    let identity = node_identity(prepared, &boot, &node, work)?;
    let machine_id = identity.machine_id.clone();
    // The node refuses what its image's keys did not sign, and keeps running.
    let unsigned = strip_signatures(&v2, &work.join("bundle-v2-unsigned"))?;
    let refused = node.refused(&[
        "upgrade",
        "--image",
        &format!("oci-layout:{}", unsigned.display()),
    ])?;
    ensure!(
        refused.contains("the bundle is not signed"),
        "an unsigned bundle: {refused}"
    );
    ensure!(node.status()?["stage"] == "Running");
    // v2 travels through a real registry: pushed by the release pipeline, pulled (and checked)
    // by `slate upgrade --image 127.0.0.1:PORT/slate/installer:2.0.0`, uploaded to the node.
    let registry = crate::registry::Registry::start(&work.join("registry"))?;
    let reference = format!("{}/slate/installer:2.0.0", registry.host);
    run(Command::new(&prepared.slate)
        .args(["push", "--bundle"])
        .arg(&v2)
        .args(["--image", &reference]))?;
    // Issue 38's live apply and drain command, then the upgrade that drains with it.
    let base = fs::read_to_string(work.join("node1-renamed.toml"))?;
    let drain_story =
        drain::refused_then_cordoned(&node, &boot, work, &base, &reference, vm.web_port)?;
    let installed = online_upgrade_from(&node, &mut boot, &reference, "2.0.0")?;
    drop(registry);
    // Drained before the installer wrote a byte: the drain command cordoned the node, then
    // the web service was stopped by its signal.
    let serial = boot.serial();
    let (drained, stopped) = workload::drained(&serial, "an upgrade is installed")?;
    let cordoned = serial.find(drain::CORDONED_LINE);
    ensure!(
        cordoned.is_some_and(|at| Some(at) < serial.find(&drained)),
        "`{}` on the console before `{drained}`",
        drain::CORDONED_LINE
    );
    ensure!(
        installed.contains("installed slate-2.0.0+3.efi (fallback slate-1.0.0.efi"),
        "upgrade to v2: {installed}"
    );
    let marker = meta_upgrade()?;
    ensure!(
        String::from_utf8_lossy(&marker.stdout).trim() == "slate-1.0.0.efi",
        "META Upgrade should name the fallback"
    );
    let mut boot = running(&mut vm)?;
    let committed = boot.expect(
        &["committed: slate-2.0.0"],
        Duration::from_secs(30),
        "v2 committed",
    )?;
    ensure!(
        committed.contains("slate-2.0.0+2-1.efi blessed as slate-2.0.0.efi; upgrade marker (fallback slate-1.0.0.efi) dropped"),
        "commit line: {committed}"
    );
    ensure!(node.status()?["version"] == "2.0.0");
    // The upgrade counted twice: installed (just before its reboot) and committed (at v2's
    // boot); both outlived the reboot. The version info moved with it.
    metrics.push(scrape.expect("slate_node_upgrades_total{outcome=\"committed\"}", 1.0)?);
    metrics.push(scrape.expect("slate_node_upgrades_total{outcome=\"installed\"}", 1.0)?);
    metrics.push(scrape.expect("slate_node_version_info{version=\"2.0.0\"}", 1.0)?);
    metrics.push(scrape.expect("count(slate_node_version_info)", 1.0)?);
    let web_v2 = workload::serves_version(vm.web_port, "2.0.0")?;
    // A new version: /etc reset to v2's, keeping machine-id; v2's hooks ran once, in order.
    let reset = said_line(&boot, "/etc reset from 1.0.0 to 2.0.0: kept machine-id")?;
    let hooks = hook_order(&boot)?;
    ensure!(
        hooks == ["10-stamp", "20-check"],
        "v2's setup hooks: {hooks:?}"
    );
    let status = node.status()?;
    ensure!(
        status["machine_id"] == machine_id.as_str() && status["hostname"] == "node1-renamed",
        "machine-id and the configured hostname survive the upgrade: {status}"
    );
    node.ok(&["reboot"])?;
    boot.wait_exit(Duration::from_secs(90))?;
    ensure!(
        !meta_upgrade()?.status.success(),
        "after the commit META holds no Upgrade marker"
    );

    // Still v2 after another reboot, and /etc with it: the hooks do not run again, and the
    // file 10-stamp wrote is there for the health check.
    let mut boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0" && status["booted_entry"] == "slate-2.0.0.efi",
        "the second boot of v2: {status}"
    );
    said_line(&boot, "/etc unchanged at 2.0.0")?;
    said_line(&boot, "setup hooks already ran for 2.0.0")?;
    ensure!(
        hook_order(&boot)?.is_empty(),
        "hooks ran twice for one version"
    );
    boot.expect(
        &["health: 4/4 checks passed"],
        Duration::from_secs(60),
        "/etc/slate-setup-stamp kept across the reboot",
    )?;
    let (once, mut boot) = boot_once(&node, &mut vm, boot)?;
    let installed = online_upgrade(&node, &mut boot, &v3, "3.0.0")?;
    ensure!(
        installed.contains("installed slate-3.0.0+3.efi (fallback slate-2.0.0.efi"),
        "{installed}"
    );
    // Mid-upgrade, powered off: v3 boots next, on trial, with v2 the fallback.
    let mid = explain_disk(&prepared.slate, &image)?;
    ensure!(
        mid["next_boot"] == "slate-3.0.0+3.efi" && mid["upgrade_tag"] == "slate-2.0.0.efi",
        "boot explain mid-upgrade: {mid}"
    );
    let mut boot = vm.start()?;
    boot.expect(
        &["[slate] [machined] fatal:"],
        BOOT_TIMEOUT,
        "v3's fatal boot",
    )?;
    let reverted = boot.expect(
        &["upgrade reverted: the next boot is"],
        Duration::from_secs(30),
        "the revert",
    )?;
    ensure!(reverted.contains("slate-2.0.0.efi"), "{reverted}");
    boot.wait_exit(Duration::from_secs(90))?;
    let listing = esp_listing(&image)?;
    ensure!(
        listing.contains("slate-3.0.0+0-1.efi"),
        "v3 marked bad: {listing}"
    );
    let after = explain_disk(&prepared.slate, &image)?;
    ensure!(
        after["next_boot"] == "slate-2.0.0.efi",
        "boot explain after the revert: {after}"
    );

    let mut boot = running(&mut vm)?;
    let status = node.status()?;
    ensure!(status["version"] == "2.0.0", "after the revert: {status}");
    // The revert was counted on v3's fatal path (kept on STATE), and v2 reports it.
    for (query, value) in [
        ("slate_node_rollbacks_total{outcome=\"reverted\"}", 1.0),
        ("slate_node_upgrades_total{outcome=\"reverted\"}", 1.0),
        ("slate_node_upgrades_total{outcome=\"installed\"}", 2.0),
        ("slate_node_upgrades_total{outcome=\"committed\"}", 1.0),
        ("slate_node_boots_total{outcome=\"failed\"}", 1.0),
        ("slate_node_version_info{version=\"2.0.0\"}", 1.0),
        // v2's commit, its reboot, v1 once and v2 again, v2 after the revert.
        (
            "slate_node_boots_total{outcome=\"committed\"}",
            boots_before + 5.0,
        ),
        // Seven boots, and not one counter went down in Prometheus' eyes (one `resets` per
        // family: it drops the name, and the families share outcome labels).
        (
            "sum(resets(slate_node_upgrades_total[1h])) + \
             sum(resets(slate_node_rollbacks_total[1h])) + \
             sum(resets(slate_node_boots_total[1h]))",
            0.0,
        ),
    ] {
        metrics.push(scrape.expect(query, value)?);
    }
    let families = scrape.promtool()?;
    metrics.push(format!(
        "promtool check metrics: v2's /metrics after the revert passes ({families} families)"
    ));
    let web_reverted = workload::serves_version(vm.web_port, "2.0.0")?;
    // The VM's real choice is the one explained; the node explains the same online.
    ensure!(
        status["booted_entry"] == after["next_boot"],
        "explained {after}, booted {status}"
    );
    let online: serde_json::Value =
        serde_json::from_str(&node.ok(&["boot", "explain", "--output", "json"])?)?;
    ensure!(
        online["next_boot"] == "slate-2.0.0.efi"
            && online["entries"].as_array().is_some_and(|e| e
                .iter()
                .any(|e| e["name"] == "slate-3.0.0+0-1.efi" && e["state"] == "bad")),
        "boot explain --node: {online}"
    );
    ensure!(
        status["last_failure"]["version"] == "3.0.0"
            && status["last_failure"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("setup hook 20-check failed: exit status 1")),
        "status says which version failed and why: {status}"
    );
    // The revert gave /etc back to v2: reset from v3's, v2's hooks again.
    let back = said_line(&boot, "/etc reset from 3.0.0 to 2.0.0: kept machine-id")?;
    ensure!(
        hook_order(&boot)? == ["10-stamp", "20-check"],
        "v2's hooks after the revert"
    );
    ensure!(
        status["machine_id"] == machine_id.as_str(),
        "machine-id after the revert: {status}"
    );
    let bad = node.refused(&["reboot", "--entry", "slate-3.0.0+0-1.efi"])?;
    ensure!(bad.contains("is marked bad"), "a bad entry: {bad}");
    ensure!(boot.is_running(), "a refused reboot left the node running");
    boot.kill();
    Ok(format!(
        "{}; Prometheus scraping the node: {}; unsigned bundle refused by the node; v1 -> v2 by `slate upgrade --image \
         127.0.0.1:PORT/slate/installer:2.0.0` (real registry; signed; the bundle's own \
         installer), committed \
         (blessed, marker dropped), still v2 after a reboot; `{reset}`, hooks 10-stamp then \
         20-check; boot explain mid-upgrade: next {} (fallback {}); v3 with a failing setup hook \
         reverted to v2 unattended ({reverted}); boot explain after the revert: next {} = what \
         booted; `{back}`; {once}; a bad entry refused for --entry; workload: v1 {web_v1}; \
         {services}; {drain_story}; drained for the upgrade (`{}`, `{drained}`, `{stopped}`); \
         v2 {web_v2}; after the \
         revert {web_reverted}",
        identity.summary,
        metrics.join(", "),
        mid["next_boot"],
        mid["upgrade_tag"],
        after["next_boot"],
        drain::CORDONED_LINE
    ))
}

/// `slate reboot --entry`: refused for a missing entry; v1 boots once through the
/// `LoaderEntryOneShot` machined wrote into the firmware's variables (OVMF keeps them in the
/// VM's variable store), which systemd-boot consumed; the boot after is v2's again.
pub(super) fn boot_once(node: &Node, vm: &mut Vm, mut boot: Running) -> Result<(String, Running)> {
    let missing = node.refused(&["reboot", "--entry", "slate-9.9.9.efi"])?;
    ensure!(
        missing.contains("slate-9.9.9.efi"),
        "a missing entry: {missing}"
    );
    ensure!(boot.is_running(), "a refused reboot left the node running");
    node.ok(&["reboot", "--entry", "slate-1.0.0.efi"])?;
    boot.wait_exit(Duration::from_secs(90))?;
    let written = said_line(&boot, "boots next, once (LoaderEntryOneShot written)")?;
    let mut boot = running(vm)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "1.0.0" && status["booted_entry"] == "slate-1.0.0.efi",
        "v1 for one boot: {status}"
    );
    let explained: serde_json::Value =
        serde_json::from_str(&node.ok(&["boot", "explain", "--output", "json"])?)?;
    ensure!(
        explained["next_boot"] == "slate-2.0.0.efi",
        "the one-shot consumed, v2 next: {explained}"
    );
    node.ok(&["reboot"])?;
    boot.wait_exit(Duration::from_secs(90))?;
    let boot = running(vm)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0" && status["booted_entry"] == "slate-2.0.0.efi",
        "v2 again after the one-shot boot: {status}"
    );
    Ok((
        format!(
            "`reboot --entry` refused a missing entry; `{written}` → booted slate-1.0.0.efi \
             once, then slate-2.0.0.efi"
        ),
        boot,
    ))
}
