//! A node through its life (first boot, API roles, reboots, reset, maintenance, power button)
//! and a Boot task that fails.

use super::*;

/// One node through its life: first boot (through systemd-boot and the UKI into slate's init,
/// the squashfs root and machined; STATE and EPHEMERAL formatted because blank), the API with
/// its roles, a reboot asked over the API, a second boot that keeps STATE, two concurrent resets
/// of which one is refused as locked, the third boot that formats again and waits in
/// maintenance mode, and the ACPI power button that shuts it down.
pub(super) fn node_lifecycle(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("node.raw");
    build_image(&prepared.slate, "1.0.0", &[], &image)?;
    ensure!(
        esp_listing(&image)?.contains("slate-1.0.0+3.efi"),
        "a fresh image carries the UKI with 3 tries"
    );
    // No RDRAND: its second boot proves the saved seed readies the CRNG before the API.
    let mut vm = Vm::new(&image, &work.join("vm-node"))?.without_cpu_rng();
    let node = Node {
        prepared,
        port: vm.api_port,
        name: image_node_name(&image),
    };

    // Boot 1.
    let mut boot = running(&mut vm)?;
    let first_boot = boot.elapsed();
    for line in [
        "[slate] [initramfs] loaded 22/22",
        "[slate] [initramfs] switched root; executing /usr/bin/machined",
        "[slate] [machined] starting slate",
        "root squashfs",
        // STATE holds the machine configuration the image was given; /var starts blank.
        "STATE mounted on /system/state",
        "machine configuration /system/state/config/machine.toml: node node, hostname node",
        "EPHEMERAL (/dev/vda4) is blank: formatting it (first boot)",
        "API listening on 0.0.0.0:50000",
    ] {
        ensure_logged(&boot, line)?;
    }
    // systemd-boot counted the try (+3 -> +2-1) and machined blessed the entry at Running.
    boot.expect(
        &["committed: slate-1.0.0+2-1.efi blessed as slate-1.0.0.efi"],
        Duration::from_secs(30),
        "the booted entry blessed",
    )?;
    ensure!(
        esp_listing(&image)?.contains("slate-1.0.0.efi"),
        "the ESP should hold the blessed entry"
    );
    let breakdown = boot_breakdown(&node)?;
    let status = node.status()?;
    ensure!(status["version"] == "1.0.0", "status: {status}");
    ensure!(status["stage"] == "Running", "status: {status}");
    ensure!(
        status["node_name"] == "node",
        "the configured name: {status}"
    );
    ensure_logged(&boot, "API identity: serving certificate sha256 ")?;
    let entry = status["booted_entry"].as_str().unwrap_or("");
    ensure!(entry.starts_with("slate-1.0.0"), "booted entry: {status}");
    let version = node.ok(&["version"])?;
    ensure!(version.starts_with("1.0.0 (amd64)"), "version: {version}");

    let no_cert = node.refused(&["--no-certificate", "status"])?;
    ensure!(
        no_cert.to_lowercase().contains("tls") || no_cert.contains("certificate"),
        "no certificate: {no_cert}"
    );
    let reader = node.refused(&["--role", "reader", "reboot"])?;
    ensure!(reader.contains("permission"), "reader reboot: {reader}");
    let logs = node.ok(&["logs"])?;
    ensure!(logs.contains("stage Running"), "logs: {logs}");
    let dmesg = node.ok(&["dmesg"])?;
    ensure!(
        dmesg.contains("Linux version"),
        "dmesg lacks the kernel banner"
    );

    let flooded = api_flood(&node)?;

    // The first boot has no seed; it saves one once the kernel's CRNG is ready.
    ensure_logged(&boot, "random seed: none saved (a first boot)")?;
    boot.expect(
        &["random seed: 512 bytes saved for the next boot"],
        Duration::from_secs(60),
        "the first boot saving a random seed",
    )?;
    node.ok(&["reboot"])?;
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(&boot, "[slate] [machined] rebooting (default)")?;

    // Boot 2: STATE survives a reboot.
    let boot = running(&mut vm)?;
    ensure!(
        !boot.serial().contains("is blank: formatting"),
        "the second boot must find STATE and EPHEMERAL formatted"
    );
    ensure_logged(&boot, "(kept)")?;
    ensure!(node.status()?["stage"] == "Running");
    // The seed boot 1 saved is credited before the API starts, so its TLS does not wait for
    // the kernel to gather entropy (issue 17: it waited 1.07 s here), and it is replaced.
    ensure_logged(
        &boot,
        "random seed: 512 bytes saved by the last boot credited (4096 bits)",
    )?;
    let serial = boot.serial();
    let (crng, listening) = (
        serial.find("random: crng init done"),
        serial.find("API listening on"),
    );
    ensure!(
        matches!((crng, listening), (Some(c), Some(l)) if c < l)
            && serial.contains("random seed: 512 bytes saved for the next boot"),
        "the CRNG ready before the API listens on the second boot, and a new seed saved:\n{}",
        crate::vm::tail(&serial, 60)
    );

    // Two resets at once: the lock admits one.
    let spawn = || -> Result<std::process::Child> {
        Ok(node
            .command(&["reset"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?)
    };
    let (a, b) = (spawn()?, spawn()?);
    let (first, second) = (a.wait_with_output()?, b.wait_with_output()?);
    let outcomes = [&first, &second];
    let accepted = outcomes.iter().filter(|o| o.status.success()).count();
    let locked = outcomes
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stderr).contains("locked"))
        .count();
    ensure!(
        accepted == 1 && locked == 1,
        "expected one reset accepted and one locked: {:?}",
        outcomes
            .iter()
            .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
            .collect::<Vec<_>>()
    );
    let mut boot = boot;
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(&boot, "STATE (/dev/vda3) wiped")?;

    // Boot 3: the reset wiped the volumes, so they are formatted again, and without a machine
    // configuration the node waits in maintenance mode for one, applied with its token.
    let mut boot = vm.start()?;
    let token = boot.expect(&["maintenance token: "], BOOT_TIMEOUT, "maintenance mode")?;
    let token = token
        .rsplit("maintenance token: ")
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    let pin = boot.expect(
        &["maintenance certificate sha256: "],
        Duration::from_secs(10),
        "the maintenance certificate's fingerprint",
    )?;
    let pin = pin
        .rsplit("sha256: ")
        .next()
        .unwrap_or("")
        .trim()
        .to_owned();
    ensure_logged(
        &boot,
        "STATE (/dev/vda3) is blank: formatting it (first boot)",
    )?;
    let mtls = node.refused(&["status"])?;
    ensure!(
        mtls.contains("certificate"),
        "a node in maintenance mode has no identity the CA vouches for: {mtls}"
    );
    let config = node_config(&prepared.slate, work, "reconfigured")?;
    let config_arg = config.to_str().unwrap_or_default();
    let wrong = node.refused(&[
        "apply-config",
        config_arg,
        "--insecure",
        "--token",
        "not-it",
    ])?;
    ensure!(wrong.contains("token"), "a wrong token: {wrong}");
    let applied = node.ok(&[
        "apply-config",
        config_arg,
        "--insecure",
        "--token",
        &token,
        "--fingerprint",
        &pin,
    ])?;
    ensure!(applied.starts_with("applied"), "apply-config: {applied}");
    boot.expect(&[RUNNING], BOOT_TIMEOUT, "Running once configured")?;
    // Its certificate names it by its new name.
    let reconfigured = Node {
        prepared: node.prepared,
        port: node.port,
        name: "reconfigured".into(),
    };
    let status = reconfigured.status()?;
    ensure!(
        status["node_name"] == "reconfigured" && status["hostname"] == "reconfigured",
        "configured out of maintenance mode: {status}"
    );

    // The ACPI power button (what a host asks a guest to shut down with): machined stops
    // everything, unmounts, syncs and powers off, and QEMU ends by itself.
    ensure_logged(
        &boot,
        "[slate] [machined] power button: watching /dev/input/event",
    )?;
    boot.system_powerdown()?;
    let pressed = std::time::Instant::now();
    boot.wait_exit(Duration::from_secs(60))
        .context("the power button should power the node off")?;
    let powered_off = pressed.elapsed();
    for line in [
        "[slate] [machined] shutdown: power button pressed",
        "[slate] [machined] stage ShuttingDown",
        "[slate] [machined] teardown: stopping all processes",
        "[slate] [machined] teardown: unmounted ",
        "[slate] [machined] teardown: synced in ",
        "[slate] [machined] powering off",
    ] {
        ensure_logged(&boot, line)?;
    }
    let serial = boot.serial();
    ensure!(
        !serial.contains("detached busy mounts") && !serial.contains("sync did not finish"),
        "the power-off teardown should unmount and sync cleanly:\n{}",
        crate::vm::tail(&serial, 20)
    );
    Ok(format!(
        "first boot to Running in {first_boot:.1?}; +3 -> +2-1 counted by systemd-boot and blessed; \
         API roles enforced; reboot, STATE kept, the saved random seed credited before the API started; concurrent resets: 1 accepted, 1 locked; \
         volumes reformatted after reset; maintenance mode (no configuration): mTLS refused, a \
         wrong token refused, configured with the console's token and pinned certificate \
         ({pin:.16}…), Running as node `reconfigured`; power button: unmounted, synced, powered \
         off in {powered_off:.1?}; boot breakdown: {breakdown}; {flooded}"
    ))
}

/// A Boot task that fails sends the node down the fatal path: the error chain on the console,
/// teardown, and a reboot after the pause.
pub(super) fn fatal_boot_task(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("fatal.raw");
    build_image(
        &prepared.slate,
        "1.0.1",
        &["slate.debug.fail-task=network"],
        &image,
    )?;
    let mut vm = Vm::new(&image, &work.join("vm-fatal"))?;
    let mut boot = vm.start()?;
    let fatal = boot.expect(
        &["[slate] [machined] fatal:"],
        BOOT_TIMEOUT,
        "the fatal path",
    )?;
    ensure!(
        fatal.contains("fault injected by slate.debug.fail-task=network"),
        "the fatal line names the cause: {fatal}"
    );
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(&boot, "[slate] [machined] rebooting in 1s")?;
    Ok(fatal)
}

/// What nine in ten of an admin's status requests may take while the flood runs (TCG, one
/// vCPU, the node decrypting and parsing 60 KB heads from six connections), and the longest
/// any may. A bound on the slowest alone failed once at 3.07 s on a host shared with two
/// compiles; the node of the report answered every request in 13.5 s or more.
const STATUS_UNDER_FLOOD: Duration = Duration::from_secs(3);
const STATUS_UNDER_FLOOD_MAX: Duration = Duration::from_secs(10);
/// How much machined's resident set may grow over the flood: the journal's 1 MiB, hyper's
/// buffers for six 64 KiB heads, the TLS sessions, the allocator's slack.
const FLOOD_GROWTH_KIB: u64 = 16 * 1024;
/// More requests than the node of the original report took before it ran out of memory
/// (2,123), and enough for their log lines (about 330 bytes each) to fill the journal's 1 MiB.
const FLOOD_REQUESTS: usize = 4_000;

/// The crash reproduction of issue 19 (six reader connections sending requests with huge
/// methods) while an admin asks for status: every request answered, status answered within
/// [`STATUS_UNDER_FLOOD`] (nine in ten) and [`STATUS_UNDER_FLOOD_MAX`], the journal at its 1 MiB bound, machined's memory within
/// [`FLOOD_GROWTH_KIB`] of before. Returns a summary.
fn api_flood(node: &Node) -> Result<String> {
    let memory = |status: &serde_json::Value| -> Result<(u64, u64)> {
        let m = &status["memory"];
        Ok((
            m["rss_kib"]
                .as_u64()
                .context("status without memory.rss_kib")?,
            m["journal_bytes"]
                .as_u64()
                .context("status without memory.journal_bytes")?,
        ))
    };
    let (rss_before, journal_before) = memory(&node.status()?)?;
    let addr = format!("127.0.0.1:{}", node.port);
    let admin = slate_api::Client::from_dir(&addr, &node.prepared.pki, slate_api::Role::Admin)?
        .with_server_name(&node.name)?
        .with_timeout(Duration::from_secs(30));
    let done = std::sync::atomic::AtomicBool::new(false);
    let (flood, latencies) = std::thread::scope(|scope| {
        let polls = scope.spawn(|| {
            let mut latencies = Vec::new();
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let asked = std::time::Instant::now();
                latencies.push(admin.status().map(|_| asked.elapsed()));
                std::thread::sleep(Duration::from_millis(250));
            }
            latencies
        });
        let flood = flood::flood(&node.prepared.pki, &node.name, node.port, 6, FLOOD_REQUESTS);
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (flood, polls.join())
    });
    let flood = flood?;
    let latencies = latencies
        .map_err(|_| anyhow::anyhow!("the status poller panicked"))?
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .context("an admin's status during the flood")?;
    let mut sorted = latencies.clone();
    sorted.sort_unstable();
    let slowest = sorted.last().copied().unwrap_or_default();
    let p90 = sorted
        .get(sorted.len().saturating_sub(1) * 9 / 10)
        .copied()
        .unwrap_or_default();
    let (rss_after, journal_after) = memory(&node.status()?)?;
    let summary = format!(
        "flood: {} requests with 60 KB/400 KB methods on {} reader connections in {:.0?} \
         (answers {:?}); admin status answered {} times, p90 {p90:.2?}, slowest {slowest:.2?}; \
         machined {} -> \
         {} KiB resident, journal {} -> {} bytes",
        flood.requests,
        flood.connections,
        flood.took,
        flood.answers,
        latencies.len(),
        rss_before,
        rss_after,
        journal_before,
        journal_after
    );
    println!("vm node_lifecycle: {summary}");
    let logged = flood.answers.get(&405).copied().unwrap_or(0);
    ensure!(
        flood.requests == FLOOD_REQUESTS && logged >= FLOOD_REQUESTS * 8 / 10,
        "every 60 KB-method request is answered 405: {summary}"
    );
    ensure!(
        !latencies.is_empty() && p90 <= STATUS_UNDER_FLOOD && slowest <= STATUS_UNDER_FLOOD_MAX,
        "status within {STATUS_UNDER_FLOOD:?} (p90) and {STATUS_UNDER_FLOOD_MAX:?} (all): {summary}"
    );
    ensure!(
        journal_after <= 1 << 20 && journal_after > 900 << 10,
        "the journal full at its 1 MiB bound and no more: {summary}"
    );
    ensure!(
        rss_after <= rss_before + FLOOD_GROWTH_KIB,
        "machined grew by more than {FLOOD_GROWTH_KIB} KiB: {summary}"
    );
    Ok(format!(
        "flood of {} requests: status p90 {p90:.1?}, slowest {slowest:.1?}, machined +{} KiB, journal {} KiB",
        flood.requests,
        rss_after.saturating_sub(rss_before),
        journal_after >> 10
    ))
}
