//! VM scenarios run by the test command (`xtask vm-test`) and the demo (`xtask demo`): real
//! boots of images the imager built, judged by what the guest printed and what its API answered.

mod fleet;
mod grub;
mod kexec;
mod operator;
mod powercut;
mod rollback;
mod secureboot;
mod snapshot;
mod staged;
mod var_powercut;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::util::{output, repo_root, run};
use crate::vm::{Running, Vm};
use crate::{base_rootfs, kernel, slate_static};

const BOOT_TIMEOUT: Duration = Duration::from_secs(240);
const RUNNING: &str = "[slate] [machined] stage Running";

/// The static slate binary and the client identities for the demo node.
#[derive(Debug)]
pub struct Prepared {
    pub slate: PathBuf,
    pub pki: PathBuf,
}

/// The demo's signing key pair (`slate keygen`): profiles/demo.toml trusts `slate.pub`, and
/// the test harness signs every bundle it builds with `slate.key`.
pub fn demo_keys() -> PathBuf {
    repo_root().join("target/demo/keys")
}

/// Sign `bundle` with the demo key (as a release pipeline would after building it).
pub fn sign_bundle(slate: &Path, bundle: &Path) -> Result<()> {
    output(
        Command::new(slate)
            .args(["sign", "--bundle"])
            .arg(bundle)
            .arg("--key")
            .arg(demo_keys().join("slate.key")),
    )
    .map(drop)
}

/// The demo CA and the client certificates of every role (`slate gen certs`): the CA goes into
/// each node's machine configuration, the clients use the rest.
pub fn demo_pki() -> PathBuf {
    repo_root().join("target/demo/pki")
}

/// A machine configuration for the node `name` (`slate gen config` with the demo CA), written
/// to `dir/<name>.machine.toml` (beside profiles named `<something>.toml`, which it must not
/// replace). Node names are DNS labels: anything else in `name` becomes '-'.
pub fn node_config(slate: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    let name: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let text = output(
        Command::new(slate)
            .args(["gen", "config", "--name", &name, "--pki"])
            .arg(demo_pki()),
    )?;
    let path = dir.join(format!("{name}.machine.toml"));
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Put `config` onto the STATE partition of the disk image `disk`.
pub fn configure_disk(slate: &Path, disk: &Path, config: &Path) -> Result<()> {
    output(
        Command::new(slate)
            .args(["installer", "configure", "--disk"])
            .arg(disk)
            .arg("--config")
            .arg(config),
    )
    .map(drop)
}

/// Kernel cache, static slate, API certificates, the demo signing key, and the base root with
/// slate in it. Images carry no node identity: each node gets its configuration on STATE.
pub fn prepare() -> Result<Prepared> {
    kernel::kernel(false)?;
    let slate = slate_static::slate_static()?;
    let keys = demo_keys();
    if !keys.join("slate.pub").exists() {
        let _ = fs::remove_dir_all(&keys);
        run(Command::new(&slate).args(["keygen", "--out"]).arg(&keys))?;
    }
    let pki = demo_pki();
    if !pki.join("ca.crt").exists() {
        let _ = fs::remove_dir_all(&pki);
        run(Command::new(&slate)
            .args(["gen", "certs", "--out"])
            .arg(&pki))?;
    }
    let rootfs = repo_root().join("target/demo/rootfs");
    base_rootfs::base_rootfs(&rootfs, "0", Some(&slate), true)?;
    Ok(Prepared { slate, pki })
}

/// Build `kind` of the demo profile at `version` with the static slate (in its imager role, as
/// a release pipeline would), with extra kernel arguments.
fn build_demo(
    slate: &Path,
    kind: &str,
    version: &str,
    extra_args: &[&str],
    out: &Path,
) -> Result<()> {
    fs::create_dir_all(out.parent().unwrap_or(Path::new(".")))?;
    rollback::build(
        slate,
        &repo_root().join("profiles/demo.toml"),
        kind,
        version,
        extra_args,
        out,
    )
}

/// A disk image of the demo profile.
pub fn build_image(slate: &Path, version: &str, extra_args: &[&str], out: &Path) -> Result<()> {
    build_demo(slate, "image", version, extra_args, out)
}

fn esp_listing(image: &Path) -> Result<String> {
    output(
        Command::new("mdir")
            .args(["-/", "-b", "-i"])
            .arg(format!("{}@@1M", image.display()))
            .arg("::/EFI/Linux"),
    )
}

/// The slate CLI against the VM's API.
struct Node<'a> {
    prepared: &'a Prepared,
    port: u16,
}

impl Node<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.prepared.slate);
        cmd.arg("--node")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--certs")
            .arg(&self.prepared.pki)
            .args(args);
        cmd
    }

    fn run(&self, args: &[&str]) -> Result<Output> {
        self.command(args)
            .output()
            .with_context(|| format!("running slate {args:?}"))
    }

    fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args)?;
        ensure!(
            out.status.success(),
            "slate {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn refused(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args)?;
        ensure!(
            !out.status.success(),
            "slate {args:?} should have been refused"
        );
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn status(&self) -> Result<serde_json::Value> {
        Ok(serde_json::from_str(
            &self.ok(&["status", "--output", "json"])?,
        )?)
    }
}

fn running(vm: &mut Vm) -> Result<Running> {
    let mut boot = vm.start()?;
    boot.expect(&[RUNNING], BOOT_TIMEOUT, "machined reaching stage Running")?;
    Ok(boot)
}

fn ensure_logged(boot: &Running, line: &str) -> Result<()> {
    let serial = boot.serial();
    ensure!(
        serial.contains(line),
        "expected {line:?} on the console; it ended with:\n{}",
        crate::vm::tail(&serial, 40)
    );
    Ok(())
}

/// `slate status --boot-times` on a node that just committed its boot: the loader's
/// timestamps, each of init's milestones and machined's in order, the Boot sequence's phases.
/// Returns the summary line, which the scenario prints.
fn boot_breakdown(node: &Node) -> Result<String> {
    let text = node.ok(&["status", "--boot-times"])?;
    let order = [
        "kernel started → init started",
        "init started → modules loaded",
        "modules loaded → root mounted",
        "root mounted → switched root",
        "switched root → machined started",
        "machined started → running",
        "running → committed",
        "machined: Initialize sequence",
        "machined: Boot sequence",
        "  phase volumes",
        "    task mountState",
        "Running ",
    ];
    let mut from = 0;
    for step in order {
        let at = text[from..]
            .find(step)
            .with_context(|| format!("{step:?} in order in the boot breakdown:\n{text}"))?;
        from += at + step.len();
    }
    // systemd-boot sets no LoaderTime* variables under a hypervisor (its TSC timer is off).
    ensure!(
        text.contains("firmware and systemd-boot: not measured (no LoaderTimeInitUSec)"),
        "the loader's timestamps, absent in a VM, said so:\n{text}"
    );
    println!("{text}");
    Ok(text.lines().last().unwrap_or_default().to_owned())
}

/// One node through its life: first boot (through systemd-boot and the UKI into slate's init,
/// the squashfs root and machined; STATE and EPHEMERAL formatted because blank), the API with
/// its roles, a reboot asked over the API, a second boot that keeps STATE, two concurrent resets
/// of which one is refused as locked, the third boot that formats again and waits in
/// maintenance mode, and the ACPI power button that shuts it down.
fn node_lifecycle(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("node.raw");
    build_image(&prepared.slate, "1.0.0", &[], &image)?;
    ensure!(
        esp_listing(&image)?.contains("slate-1.0.0+3.efi"),
        "a fresh image carries the UKI with 3 tries"
    );
    let mut vm = Vm::new(&image, &work.join("vm-node"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
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
    let status = node.status()?;
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
         API roles enforced; reboot, STATE kept; concurrent resets: 1 accepted, 1 locked; \
         volumes reformatted after reset; maintenance mode (no configuration): mTLS refused, a \
         wrong token refused, configured with the console's token and pinned certificate \
         ({pin:.16}…), Running as node `reconfigured`; power button: unmounted, synced, powered \
         off in {powered_off:.1?}; boot breakdown: {breakdown}"
    ))
}

/// An installer bundle of the demo profile, signed with the demo key.
/// Bundles 1.0.0 and 2.0.0 of the demo profile in `work`, and where a third goes.
fn build_v1_v2(slate: &Path, work: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let (v1, v2, v3) = (
        work.join("bundle-v1"),
        work.join("bundle-v2"),
        work.join("bundle-v3"),
    );
    build_bundle(slate, "1.0.0", &[], &v1)?;
    build_bundle(slate, "2.0.0", &[], &v2)?;
    Ok((v1, v2, v3))
}

fn build_bundle(slate: &Path, version: &str, extra_args: &[&str], out: &Path) -> Result<()> {
    build_demo(slate, "installer", version, extra_args, out)
}

/// The upgrade story's artifacts: v1, v2 and a broken v3 (a setup hook fails) as installer
/// bundles in `work`, and v1 installed from its bundle onto the blank disk `image` by
/// `slate installer install` (the install mode). Returns (v2, v3) and the installer's output.
fn build_upgrade_story(
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

fn offline_upgrade(slate: &Path, image: &Path, bundle: &Path) -> Result<String> {
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
fn strip_signatures(bundle: &Path, out: &Path) -> Result<PathBuf> {
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
fn online_upgrade(node: &Node, boot: &mut Running, bundle: &Path, version: &str) -> Result<String> {
    online_upgrade_from(
        node,
        boot,
        &format!("oci-layout:{}", bundle.display()),
        version,
    )
}

/// [`online_upgrade`] from any image reference `slate upgrade --image` takes.
fn online_upgrade_from(
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
    ensure!(
        answer.contains(&format!("uploaded slate {version}")) && answer.contains("accepted"),
        "slate upgrade: {answer}"
    );
    let installed = boot.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "the bundle's installer",
    )?;
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
fn upgrade_commit_and_revert(prepared: &Prepared, work: &Path) -> Result<String> {
    let image = work.join("upgrade.raw");
    let (v2, v3, _) = build_upgrade_story(&prepared.slate, &image, work)?;
    let mut vm = Vm::new(&image, &work.join("vm-upgrade"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
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
    let installed = online_upgrade_from(&node, &mut boot, &reference, "2.0.0")?;
    drop(registry);
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
        &["health: 3/3 checks passed"],
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
        "{}; unsigned bundle refused by the node; v1 -> v2 by `slate upgrade --image \
         127.0.0.1:PORT/slate/installer:2.0.0` (real registry; signed; the bundle's own \
         installer), committed \
         (blessed, marker dropped), still v2 after a reboot; `{reset}`, hooks 10-stamp then \
         20-check; boot explain mid-upgrade: next {} (fallback {}); v3 with a failing setup hook \
         reverted to v2 unattended ({reverted}); boot explain after the revert: next {} = what \
         booted; `{back}`; {once}; a bad entry refused for --entry",
        identity.summary, mid["next_boot"], mid["upgrade_tag"], after["next_boot"]
    ))
}

/// `slate reboot --entry`: refused for a missing entry; v1 boots once through the
/// `LoaderEntryOneShot` machined wrote into the firmware's variables (OVMF keeps them in the
/// VM's variable store), which systemd-boot consumed; the boot after is v2's again.
fn boot_once(node: &Node, vm: &mut Vm, mut boot: Running) -> Result<(String, Running)> {
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

/// A Boot task that fails sends the node down the fatal path: the error chain on the console,
/// teardown, and a reboot after the pause.
fn fatal_boot_task(prepared: &Prepared, work: &Path) -> Result<String> {
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
    ensure_logged(&boot, "[slate] [machined] rebooting in 10s")?;
    Ok(fatal)
}

/// `slate boot explain --disk` as JSON.
fn explain_disk(slate: &Path, disk: &Path) -> Result<serde_json::Value> {
    let text = output(
        Command::new(slate)
            .args(["boot", "explain", "--output", "json", "--disk"])
            .arg(disk),
    )?;
    Ok(serde_json::from_str(&text)?)
}

/// What [`node_identity`] saw.
struct Identity {
    machine_id: String,
    summary: String,
}

/// The console line (without its prefixes) that contains `text`.
fn said_line(boot: &Running, text: &str) -> Result<String> {
    let serial = boot.serial();
    let line = serial.lines().find(|l| l.contains(text)).with_context(|| {
        format!(
            "expected {text:?} on the console; it ended with:\n{}",
            crate::vm::tail(&serial, 40)
        )
    })?;
    Ok(line
        .split_once("): ")
        .map_or(line, |(_, rest)| rest)
        .trim()
        .to_owned())
}

/// The setup hooks this boot ran, in order (`setup hook NAME ok`).
fn hook_order(boot: &Running) -> Result<Vec<String>> {
    Ok(boot
        .serial()
        .lines()
        .filter_map(|l| l.split_once("setup hook ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.strip_suffix(')').and(rest.split_once(" ok (")))
        .map(|(name, _)| name.to_owned())
        .collect())
}

/// The serving certificate's fingerprint this boot logged.
fn fingerprint(boot: &Running) -> Result<String> {
    let line = said_line(boot, "API identity: serving certificate sha256 ")?;
    Ok(line
        .split("sha256 ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_owned())
}

/// Issue 12 on a freshly installed, configured v1: its own identity (a second node installed
/// from the same bundle answers with another certificate; a client of another CA is refused),
/// the first boot's /etc and setup hooks, `apply-config` (live hostname change; a change that
/// needs a reboot and a malformed document refused, nothing written), and /etc surviving a
/// reboot.
fn node_identity(
    prepared: &Prepared,
    boot: &Running,
    node: &Node,
    work: &Path,
) -> Result<Identity> {
    let slate = &prepared.slate;
    let first = said_line(boot, "/etc first boot at 1.0.0: machine-id ")?;
    let machine_id = first
        .rsplit("machine-id ")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_owned();
    ensure!(
        hook_order(boot)? == ["10-stamp", "20-check"],
        "v1's setup hooks in order"
    );
    let status = node.status()?;
    ensure!(
        status["machine_id"] == machine_id.as_str() && status["node_name"] == "node1",
        "status: {status}"
    );
    let fp1 = fingerprint(boot)?;

    // A second node from the same bundle: its own key, its own certificate.
    let disk2 = work.join("node2.raw");
    fs::File::create(&disk2)?.set_len(256 << 20)?;
    let config2 = node_config(slate, work, "node2")?;
    output(
        Command::new(slate)
            .args(["installer", "install", "--disk"])
            .arg(&disk2)
            .arg("--bundle")
            .arg(work.join("bundle-v1"))
            .arg("--trusted-keys")
            .arg(demo_keys())
            .arg("--config")
            .arg(&config2),
    )?;
    let mut vm2 = Vm::new(&disk2, &work.join("vm-node2"))?;
    let mut boot2 = running(&mut vm2)?;
    let fp2 = fingerprint(&boot2)?;
    let node2 = Node {
        prepared,
        port: vm2.api_port,
    };
    let status2 = node2.status()?;
    boot2.kill();
    ensure!(
        fp1 != fp2,
        "two nodes from one bundle share a certificate ({fp1})"
    );
    ensure!(
        status2["node_name"] == "node2" && status2["machine_id"] != machine_id.as_str(),
        "the second node: {status2}"
    );

    // A client whose CA is another: the node is not trusted by it, nor it by the node.
    let other = work.join("other-pki");
    let _ = fs::remove_dir_all(&other);
    run(Command::new(slate)
        .args(["gen", "certs", "--out"])
        .arg(&other))?;
    let stranger = Command::new(slate)
        .arg("--node")
        .arg(format!("127.0.0.1:{}", node.port))
        .arg("--certs")
        .arg(&other)
        .arg("status")
        .output()?;
    ensure!(
        !stranger.status.success(),
        "a client of another CA was answered"
    );

    // apply-config: the hostname changes live; what needs a reboot, or is malformed, is
    // refused with nothing written.
    let shown = node.ok(&["config", "show", "--output", "json"])?;
    // node1's configuration with `extra` arguments to `slate gen config`, in `work/FILE`.
    let node1_config = |file: &str, extra: &[&str]| -> Result<(PathBuf, String)> {
        let text = output(
            Command::new(slate)
                .args(["gen", "config", "--name", "node1"])
                .args(extra)
                .arg("--pki")
                .arg(demo_pki()),
        )?;
        let path = work.join(file);
        fs::write(&path, &text)?;
        Ok((path, text))
    };
    let no_reboot = |path: &Path| {
        node.refused(&[
            "apply-config",
            path.to_str().unwrap_or(""),
            "--mode",
            "no-reboot",
        ])
    };
    let (renamed, text) = node1_config("node1-renamed.toml", &["--hostname", "node1-renamed"])?;
    let (static_net, _) = node1_config(
        "node1-static.toml",
        &["--address", "10.0.2.15/24", "--gateway", "10.0.2.2"],
    )?;
    let needs_reboot = no_reboot(&static_net)?;
    ensure!(
        needs_reboot.contains("network cannot change without a reboot"),
        "{needs_reboot}"
    );
    let unknown = work.join("node1-typo.toml");
    fs::write(
        &unknown,
        text.replace("[node]\n", "[node]\nhostnme = \"x\"\n"),
    )?;
    let typo = no_reboot(&unknown)?;
    ensure!(
        typo.contains("node.hostnme"),
        "an unknown key is named: {typo}"
    );
    ensure!(
        node.ok(&["config", "show", "--output", "json"])? == shown,
        "a refused configuration changed what the node holds"
    );
    let applied = node.ok(&[
        "apply-config",
        renamed.to_str().unwrap_or(""),
        "--mode",
        "no-reboot",
    ])?;
    ensure!(
        applied.starts_with("applied: node.hostname changed; no reboot needed"),
        "apply-config: {applied}"
    );
    ensure!(
        node.status()?["hostname"] == "node1-renamed",
        "the hostname changed live"
    );
    Ok(Identity {
        summary: format!(
            "node1 sha256 {fp1:.16}…, node2 (same bundle) {fp2:.16}…; a client of another CA \
             refused; machine-id {machine_id} from the first boot; apply-config: hostname live, \
             a network change with --mode no-reboot and an unknown key (node.hostnme) refused \
             with the configuration unchanged"
        ),
        machine_id,
    })
}

/// A scenario gets the prepared artifacts and a work directory, and describes what it saw.
type Scenario = fn(&Prepared, &Path) -> Result<String>;

/// How many scenarios run at once: each VM is one TCG vCPU, and these machines have two cores.
const PARALLEL_SCENARIOS: usize = 2;

pub fn vm_test(only: &[String]) -> Result<()> {
    let prepared = prepare()?;
    // A run of some scenarios works apart, so it can run beside a full one.
    let work = match only {
        [] => repo_root().join("target/vm-test"),
        names => repo_root().join(format!("target/vm-test-{}", names.join("-"))),
    };
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    // Longest first, so the two lanes end close together.
    let scenarios: &[(&str, Scenario)] = &[
        // Three VMs at once: the longest by far (about 600 s alone).
        ("operator_rollout", operator::operator_rollout),
        // About 320 s: five upgrades, two of them spending three boot tries each.
        ("btrfs_snapshot_upgrades", snapshot::btrfs_snapshot_upgrades),
        (
            "broken_upgrades_roll_back",
            rollback::broken_upgrades_roll_back,
        ),
        ("grub_upgrade_and_revert", grub::grub_upgrade_and_revert),
        ("upgrade_commit_and_revert", upgrade_commit_and_revert),
        ("fleet_lock_updates", fleet::fleet_lock_updates),
        ("staged_upgrades", staged::staged_upgrades),
        (
            "secure_boot_enrol_and_enforce",
            secureboot::secure_boot_enrol_and_enforce,
        ),
        (
            "power_cuts_during_upgrade",
            powercut::power_cuts_during_upgrade,
        ),
        ("kexec_reboots", kexec::kexec_reboots),
        (
            "var_survives_power_cut",
            var_powercut::var_survives_power_cut,
        ),
        ("node_lifecycle", node_lifecycle),
        ("fatal_boot_task", fatal_boot_task),
    ];
    if let Some(unknown) = only
        .iter()
        .find(|o| !scenarios.iter().any(|(name, _)| name == o))
    {
        anyhow::bail!("no VM scenario is called {unknown}");
    }
    let queue = std::sync::Mutex::new(
        scenarios
            .iter()
            .filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name))
            .collect::<std::collections::VecDeque<_>>(),
    );
    let started = std::time::Instant::now();
    let failed = std::sync::atomic::AtomicUsize::new(0);
    let passed = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_SCENARIOS {
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
                    .and_then(|()| scenario(&prepared, &dir))
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
                        failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        println!("vm {name} ... FAILED in {took}: {err:#}");
                    }
                }
            });
        }
    });
    let (passed, failed) = (passed.into_inner(), failed.into_inner());
    println!(
        "vm: {passed} passed, {failed} failed in {:.0} s ({PARALLEL_SCENARIOS} at a time)",
        started.elapsed().as_secs_f64()
    );
    ensure!(failed == 0, "{failed} VM scenario(s) failed");
    Ok(())
}

fn show(boot: &Running, filter: &[&str]) {
    for line in boot.serial().lines() {
        if filter.iter().any(|f| line.contains(f)) {
            println!("  {}", line.trim());
        }
    }
}

/// The main job: build v1 as a disk image and v2 and a broken v3 as installer bundles, boot v1,
/// upgrade to v2 (committed once it is up), try v3 and watch the node return to v2 by itself.
pub fn demo() -> Result<()> {
    let prepared = prepare()?;
    let work = repo_root().join("target/demo/run");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let image = work.join("disk.raw");
    println!("== the plan for v1");
    run(Command::new(&prepared.slate)
        .args(["imager", "build", "--profile"])
        .arg(repo_root().join("profiles/demo.toml"))
        .args(["--output", "installer", "--dry-run", "--out"])
        .arg(&image))?;
    println!(
        "== building v1, v2 and a broken v3 (installer bundles); installing v1 onto a blank disk"
    );
    let (v2, v3, installed) = build_upgrade_story(&prepared.slate, &image, &work)?;
    print!("{installed}");
    println!("{}", output(Command::new("sgdisk").arg("-p").arg(&image))?);
    println!("{}", esp_listing(&image)?);

    println!("== booting v1 (QEMU, OVMF, systemd-boot, -accel tcg)");
    let mut vm = Vm::new(&image, &work.join("vm"))?;
    let node = Node {
        prepared: &prepared,
        port: vm.api_port,
    };
    let mut boot = running(&mut vm)?;
    boot.expect(&["committed:"], Duration::from_secs(30), "v1 committed")?;
    show(&boot, &["[slate]"]);
    println!("== asking the node over mutual TLS");
    print!("{}", node.ok(&["status"])?);
    println!("== slate upgrade --image oci-layout:bundle-v2 (uploaded over mutual TLS; the node runs v2's own installer)");
    online_upgrade(&node, &mut boot, &v2, "2.0.0")?;
    show(&boot, &["received bundle", "installer", "rebooting"]);
    println!("{}", esp_listing(&image)?);
    println!("== booting v2: systemd-boot tries it (+3), machined commits it at Running");
    let mut boot = running(&mut vm)?;
    boot.expect(&["committed:"], Duration::from_secs(30), "v2 committed")?;
    show(&boot, &["committed", "stage Running"]);
    print!("{}", node.ok(&["status"])?);
    println!("== upgrading to the broken v3 (its setup hook 20-check fails)");
    online_upgrade(&node, &mut boot, &v3, "3.0.0")?;
    show(&boot, &["installer: installed"]);
    println!("== slate boot explain --disk (the machine is off, mid-upgrade)");
    print!(
        "{}",
        output(
            Command::new(&prepared.slate)
                .args(["boot", "explain", "--disk"])
                .arg(&image)
        )?
    );
    let mut boot = vm.start()?;
    boot.expect(&["upgrade reverted"], BOOT_TIMEOUT, "the revert")?;
    boot.wait_exit(Duration::from_secs(90))?;
    show(
        &boot,
        &["setup hook", "fatal:", "upgrade reverted", "rebooting"],
    );
    println!("{}", esp_listing(&image)?);
    println!("== the node came back on v2 by itself");
    let _boot = running(&mut vm)?;
    print!("{}", node.ok(&["status"])?);
    println!("== slate boot explain (asked of the node)");
    print!("{}", node.ok(&["boot", "explain"])?);
    Ok(())
}
