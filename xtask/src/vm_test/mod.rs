//! VM scenarios run by the test command (`xtask vm-test`) and the demo (`xtask demo`): real
//! boots of images the imager built, judged by what the guest printed and what its API answered.

mod containerd;
mod debian;
mod delta;
mod delta_faults;
mod drain;
mod fleet;
mod flood;
mod grub;
mod identity;
mod kernel_start;
mod kexec;
mod lanes;
mod lifecycle;
mod node_scrape;
mod operator;
mod powercut;
mod rollback;
mod secureboot;
mod snapshot;
mod snapshot_grub;
mod staged;
mod stolen;
mod upgrade;
mod var_modes;
mod var_powercut;
mod var_tpm2;
mod workload;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::util::{output, repo_root, run};
use crate::vm::{Running, Vm};
use crate::{base_rootfs, kernel, slate_static};
use identity::{explain_disk, hook_order, node_identity, said_line};
use lifecycle::{fatal_boot_task, node_lifecycle};
pub(crate) use upgrade::upgrade_went_through;
use upgrade::{build_upgrade_story, offline_upgrade, online_upgrade, upgrade_commit_and_revert};
pub(crate) use var_tpm2::{require_tools as require_tpm2_tools, tpm2_bundle};

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
    let name = node_name(name);
    let text = output(
        Command::new(slate)
            .args(["gen", "config", "--name", &name, "--pki"])
            .arg(demo_pki()),
    )?;
    let path = dir.join(format!("{name}.machine.toml"));
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// `name` as a node name (a DNS label): anything else becomes '-'.
pub fn node_name(name: &str) -> String {
    name.to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The node name a disk image built by [`build_image`] was configured with (its file stem).
pub fn image_node_name(image: &Path) -> String {
    node_name(image.file_stem().and_then(|s| s.to_str()).unwrap_or("node"))
}

/// A blank 512 MiB disk image at `image` with `bundle` (version `version`) installed by the
/// host's slate and `config` on its STATE, as a provisioning step would.
pub(crate) fn install_blank_disk(
    slate: &Path,
    image: &Path,
    bundle: &Path,
    version: &str,
    config: &Path,
) -> Result<()> {
    install_blank_disk_of(512, slate, image, bundle, version, config)
}

/// [`install_blank_disk`] on a disk of `size_mib` MiB.
pub(crate) fn install_blank_disk_of(
    size_mib: u64,
    slate: &Path,
    image: &Path,
    bundle: &Path,
    version: &str,
    config: &Path,
) -> Result<()> {
    fs::File::create(image)?.set_len(size_mib << 20)?;
    let installed = output(
        Command::new(slate)
            .args(["installer", "install", "--disk"])
            .arg(image)
            .arg("--bundle")
            .arg(bundle)
            .arg("--trusted-keys")
            .arg(demo_keys())
            .arg("--config")
            .arg(config),
    )?;
    ensure!(
        installed.contains(&format!("installed slate {version}")),
        "{installed}"
    );
    Ok(())
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
    // A directory of the older shared-CA shape (no client CA) is made anew.
    if !pki.join(slate_api::CLIENT_CA_CERT).exists() {
        let _ = fs::remove_dir_all(&pki);
        run(Command::new(&slate)
            .args(["gen", "certs", "--out"])
            .arg(&pki))?;
    }
    let rootfs = repo_root().join("target/demo/rootfs");
    base_rootfs::base_rootfs(&rootfs, "0", Some(&slate), true)?;
    // The systemd image's root (mmdebstrap, about a minute; kept between runs).
    crate::debian_rootfs::ensure(&crate::debian_rootfs::default_out(), &slate)?;
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

/// Kernel arguments every image and bundle the scenarios (and the demo) build carries after
/// the profile's: `panic=1`, which the kernel, init and machined all follow after a failure
/// (docs/node.md), instead of the profiles' `panic=10`. The scenarios fail boots on purpose
/// 23 times; at 10 s each that was about 180 s of the VM lanes spent waiting.
pub(crate) const FAILURE_KERNEL_ARGS: &[&str] = &["panic=1"];

/// The imager's stage cache every scenario's builds share (`slate imager build --cache`,
/// formats.md §6.7): the versions a scenario builds differ from each other, and from other
/// scenarios' builds of the same profile, in a few files of the root, so most squashfs blocks
/// and the compressed initramfs come from the cache (a rebuild after a one-file change took
/// 0.10× a clean build). Entries are content-addressed and written under a temporary name,
/// so the scenarios running side by side share it safely. Outside `target/vm-test`, which
/// each run deletes: entries from earlier runs are as good as new ones.
pub(crate) fn imager_cache() -> PathBuf {
    repo_root().join("target/imager-cache")
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
pub(crate) struct Node<'a> {
    pub(crate) prepared: &'a Prepared,
    pub(crate) port: u16,
    /// The node's name: the API is reached through a port forward on 127.0.0.1, so the
    /// client asks for the node by name (`--server-name`), as its certificate names only it.
    pub(crate) name: String,
}

impl Node<'_> {
    pub(crate) fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.prepared.slate);
        cmd.arg("--node")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--server-name")
            .arg(&self.name)
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

    pub(crate) fn status(&self) -> Result<serde_json::Value> {
        Ok(serde_json::from_str(
            &self.ok(&["status", "--output", "json"])?,
        )?)
    }
}

pub(crate) fn running(vm: &mut Vm) -> Result<Running> {
    let mut boot = vm.start()?;
    boot.expect(&[RUNNING], BOOT_TIMEOUT, "machined reaching stage Running")?;
    Ok(boot)
}

pub(crate) fn ensure_logged(boot: &Running, line: &str) -> Result<()> {
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

/// An installer bundle of the demo profile, signed with the demo key.
pub(crate) fn build_bundle(
    slate: &Path,
    version: &str,
    extra_args: &[&str],
    out: &Path,
) -> Result<()> {
    build_demo(slate, "installer", version, extra_args, out)
}

/// A scenario gets the prepared artifacts and a work directory, and describes what it saw.
type Scenario = fn(&Prepared, &Path) -> Result<String>;

pub fn vm_test(only: &[String]) -> Result<()> {
    let prepared = prepare()?;
    // A run of some scenarios works apart, so it can run beside a full one.
    let work = match only {
        [] => repo_root().join("target/vm-test"),
        names => repo_root().join(format!("target/vm-test-{}", names.join("-"))),
    };
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    // Longest first, so the lanes end close together.
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
        // Four boots of a 48 MB UKI and two 50 MB uploads.
        ("containerd_workload", containerd::containerd_workload),
        // Twelve boots of a 60 MB UKI with systemd as PID 1, the last two with swtpm and a
        // tpm2 /var (issue 40).
        ("debian_boots_systemd", debian::debian_boots_systemd),
        // About 6 boots: v1, v2 committed, v3 and its rollback, v4's panic and v2 again.
        ("btrfs_snapshot_grub", snapshot_grub::btrfs_snapshot_grub),
        ("upgrade_commit_and_revert", upgrade_commit_and_revert),
        // About 9 boots with swtpm as the TPM: seal, unlock, another TPM, none, v2, v3
        // reverted, reset (issue 40).
        ("tpm2_var", var_tpm2::tpm2_var),
        ("fleet_lock_updates", fleet::fleet_lock_updates),
        // Three boots: v1, v2 pulled by delta from a registry by the update agent, then v3
        // pulled with a byte of the running UKI on the ESP rotten.
        ("delta_upgrade", delta::delta_upgrade),
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
        // Two boots each: v2 writes its boot options; a corrupted v3 fails to start and the
        // firmware's next option brings v2 back in the same power-on (issue 44).
        (
            "kernel_cannot_start",
            kernel_start::sdboot_kernel_cannot_start,
        ),
        (
            "grub_kernel_cannot_start",
            kernel_start::grub_kernel_cannot_start,
        ),
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
    let chosen: Vec<_> = scenarios
        .iter()
        .filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name))
        .copied()
        .collect();
    lanes::run(&chosen, &prepared, &work)
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
        name: "node1".into(),
    };
    let mut boot = running(&mut vm)?;
    boot.expect(&["committed:"], Duration::from_secs(30), "v1 committed")?;
    show(&boot, &["[slate]"]);
    println!("== asking the node over mutual TLS");
    print!("{}", node.ok(&["status"])?);
    println!("== its workload: the web service machined runs (`slate services`, and its page)");
    print!("{}", node.ok(&["services"])?);
    println!("{}", workload::serves_version(vm.web_port, "1.0.0")?);
    println!("== slate upgrade --image oci-layout:bundle-v2 (uploaded over mutual TLS; the node drains its services, then runs v2's own installer)");
    online_upgrade(&node, &mut boot, &v2, "2.0.0")?;
    show(
        &boot,
        &["received bundle", "service web:", "installer", "rebooting"],
    );
    println!("{}", esp_listing(&image)?);
    println!("== booting v2: systemd-boot tries it (+3), machined commits it at Running");
    let mut boot = running(&mut vm)?;
    boot.expect(&["committed:"], Duration::from_secs(30), "v2 committed")?;
    show(&boot, &["committed", "stage Running", "service web:"]);
    print!("{}", node.ok(&["status"])?);
    println!("{}", workload::serves_version(vm.web_port, "2.0.0")?);
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
    println!("{}", workload::serves_version(vm.web_port, "2.0.0")?);
    println!("== slate boot explain (asked of the node)");
    print!("{}", node.ok(&["boot", "explain"])?);
    Ok(())
}
