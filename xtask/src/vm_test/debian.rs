//! debian_boots_systemd (issue 39): the Debian image (profiles/debian.toml, systemd as PID 1)
//! boots through slate's initramfs into systemd and reaches multi-user; slate-machined.service
//! answers `slate status` over mTLS and commits the boot once `boot-complete.target` is
//! reached. A user's setup hooks are put on /var by hand (the disk on a loop device between
//! boots); a boot that did not reset /etc runs none. v2 installed online resets /etc (the
//! machine ID kept), runs the image's and the user's executable hooks and skips the
//! non-executable file; systemd-bless-boot blesses it (`bootctl list` on the console before
//! and after) and machined's commit only drops the marker; a reboot by kexec goes through
//! `systemctl kexec` with no firmware; a v3 whose health check fails is reverted to v2
//! unattended, and a v4
//! staged (`--stage --tries 1`) whose init cannot execute systemd falls back to v2 by
//! systemd-boot's boot counting after its one try. `[var] mode = "ephemeral"` then starts /var afresh, and `[var] mode =
//! "tpm2"` on a blank EPHEMERAL with swtpm as the TPM (issue 40): set up at one boot, unlocked
//! unattended at the next, and from the host LUKS2 with slate's token and no plaintext.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

use super::{node_config, online_upgrade, rollback, Node, Prepared, BOOT_TIMEOUT};
use crate::util::{output, repo_root};
use crate::vm::{Running, Vm};

/// The image's `multi-user-reached.service` (ordered after the default target), through
/// journald to the console. Not systemd's own `Reached target` status line: PID 1's status
/// lines may stop once the serial getty starts on the console's TTY, before that one.
/// The line: `[   55.1] multi-user[210]: multi-user.target reached`.
const MULTI_USER: &str = "]: multi-user.target reached";
/// The user's hook: it prints the machine ID and which versions' marks /etc holds (one only,
/// when /etc was reset), then leaves its own mark.
const USER_HOOK: &str = "#!/bin/sh\n\
    echo \"user hook: version $SLATE_VERSION machine-id $(cat /etc/machine-id) \
    marks: $(ls /etc | grep '^user-hook-' | tr '\\n' ' ')\"\n\
    touch /etc/user-hook-$SLATE_VERSION\n";

/// What is wrong with a version.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Broken {
    Nothing,
    /// A health check that cannot pass.
    Health,
    /// Its init executes a program the root lacks (`slate.init=/nonexistent`, which the
    /// imager refuses beside `[os] init = "systemd"`, so that table goes): userspace is never
    /// reached.
    Init,
}

/// profiles/debian.toml with absolute paths, broken as `broken` says.
fn profile(work: &Path, name: &str, broken: Broken) -> Result<PathBuf> {
    let profiles = repo_root().join("profiles");
    let mut text = fs::read_to_string(profiles.join("debian.toml"))?
        .replace("\"../", &format!("\"{}/../", profiles.display()));
    if broken == Broken::Init {
        let os = "[os]\ninit = \"systemd\"\n";
        ensure!(text.contains(os), "debian.toml has {os:?}");
        text = text.replace(os, "");
    }
    let failing = broken == Broken::Health;
    if failing {
        ensure!(
            text.contains("[[health.checks]]"),
            "debian.toml has health checks"
        );
        text = text.replace("timeout_secs = 60", "timeout_secs = 15");
        text.push_str("\n[[health.checks]]\nfile = \"/etc/never-written\"\n");
    }
    let path = work.join(format!("{name}.toml"));
    fs::write(&path, text)?;
    Ok(path)
}

/// The partition labelled `label` of `image`, mounted on `dir` while `body` runs (through a
/// loop device over its extent: partition scanning needs udev, which a CI container lacks).
fn with_partition(
    image: &Path,
    label: &str,
    dir: &Path,
    body: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let table = output(
        Command::new("partx")
            .args(["-g", "-b", "-o", "START,SIZE,NAME"])
            .arg(image),
    )?;
    let (start, size) = table
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&label)).then(|| (f[0].parse::<u64>(), f[1].parse::<u64>()))
        })
        .with_context(|| format!("no partition {label} in {}: {table}", image.display()))?;
    let (start, size) = (start? * 512, size?);
    fs::create_dir_all(dir)?;
    output(
        Command::new("mount")
            .arg("-o")
            .arg(format!("loop,offset={start},sizelimit={size}"))
            .arg(image)
            .arg(dir),
    )?;
    let result = body();
    let unmounted = output(Command::new("umount").arg(dir));
    result.and(unmounted.map(drop))
}

/// The user's hooks, as an owner would deploy them: an executable, and a file that is not.
fn deploy_user_hooks(image: &Path, work: &Path) -> Result<()> {
    let mnt = work.join("ephemeral");
    with_partition(image, "EPHEMERAL", &mnt, || {
        let hooks = mnt.join("lib/slate/etc-setup-hooks");
        ensure!(
            hooks.is_dir(),
            "init made {} at the first boot",
            hooks.display()
        );
        let hook = hooks.join("50-user");
        fs::write(&hook, USER_HOOK)?;
        fs::set_permissions(&hook, fs::Permissions::from_mode(0o755))?;
        let notes = hooks.join("60-notes.txt");
        fs::write(&notes, "not a hook: not executable\n")?;
        fs::set_permissions(&notes, fs::Permissions::from_mode(0o644))?;
        Ok(())
    })
}

/// systemd reached multi-user and boot-complete.target (the check units passed); with
/// `commits`, slate-machined's line about the commit begins so (`committed: ENTRY` when an
/// upgrade's marker was dropped, `nothing to commit: ENTRY is blessed` when systemd-bless-boot had
/// blessed it and nothing was pending).
fn booted(boot: &mut Running, commits: Option<&str>) -> Result<()> {
    boot.expect(&[MULTI_USER], BOOT_TIMEOUT, "systemd reaching multi-user")?;
    let (needle, what) = match commits {
        Some(line) => (line.to_owned(), "slate-machined committing the boot"),
        None => (
            "boot assessment: boot-complete.target reached".to_owned(),
            "slate-machined's boot assessment",
        ),
    };
    boot.expect(&[&needle], Duration::from_secs(120), what)?;
    Ok(())
}

/// The UKIs on the ESP of `image` (the VM is off), sorted.
fn uki_names(image: &Path) -> Result<Vec<String>> {
    let listing = super::esp_listing(image)?;
    let mut names: Vec<String> = listing
        .lines()
        .filter_map(|l| l.rsplit('/').next())
        .filter(|n| n.ends_with(".efi"))
        .map(str::to_owned)
        .collect();
    names.sort();
    Ok(names)
}

/// The machine ID a hook printed (`… machine-id ID …`).
fn machine_id(line: &str) -> Result<String> {
    line.split("machine-id ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(str::to_owned)
        .with_context(|| format!("no machine-id in {line:?}"))
}

/// The `source:` lines of the two `bootctl list` runs (boot-entries-before.service and
/// boot-entries-after.service) that name `version`'s UKI: counted before systemd-bless-boot
/// ran, without the counter after.
fn bootctl_listings(serial: &str, version: &str) -> Result<(String, String)> {
    let sources: Vec<&str> = serial
        .lines()
        .filter(|l| l.contains("bootctl[") && l.contains("source:") && l.contains(version))
        .map(str::trim)
        .collect();
    let counted = sources
        .iter()
        .position(|l| l.contains(&format!("/{version}+")))
        .with_context(|| format!("no counted {version} in bootctl's listings: {sources:?}"))?;
    let blessed = sources
        .iter()
        .skip(counted)
        .position(|l| l.contains(&format!("/{version}.efi")))
        .with_context(|| format!("no blessed {version} after the counted one: {sources:?}"))?;
    let path = |line: &str| {
        line.split("source:")
            .nth(1)
            .unwrap_or(line)
            .trim()
            .to_owned()
    };
    Ok((path(sources[counted]), path(sources[counted + blessed])))
}

fn console_line(boot: &Running, needle: &str) -> Result<String> {
    let serial = boot.serial();
    serial
        .lines()
        .find(|l| l.contains(needle))
        .map(|l| l.trim().to_owned())
        .with_context(|| {
            format!(
                "no {needle:?} on the console; it ended with:\n{}",
                crate::vm::tail(&serial, 40)
            )
        })
}

pub(super) fn debian_boots_systemd(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let started = Instant::now();
    let mut bundles = Vec::new();
    // v3's health check fails; v4's init cannot execute systemd.
    let versions: [(Broken, &[&str]); 4] = [
        (Broken::Nothing, &[]),
        (Broken::Nothing, &[]),
        (Broken::Health, &[]),
        (Broken::Init, &["slate.init=/nonexistent"]),
    ];
    for (i, (broken, args)) in versions.into_iter().enumerate() {
        let profile = profile(work, &format!("debian-v{}", i + 1), broken)?;
        let bundle = work.join(format!("bundle-v{}", i + 1));
        let version = format!("{}.0.0", i + 1);
        rollback::build(slate, &profile, "installer", &version, args, &bundle)?;
        bundles.push(bundle);
    }
    let uki = fs::read_dir(bundles[0].join("blobs/sha256"))?
        .flatten()
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .max()
        .unwrap_or(0);
    let image = work.join("debian.raw");
    let config = node_config(slate, work, "node1")?;
    super::install_blank_disk(slate, &image, &bundles[0], "1.0.0", &config)?;
    let built = started.elapsed();

    let mut vm = Vm::new(&image, &work.join("vm"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "node1".into(),
    };
    // v1, first boot: init formats /var and STATE, resets /etc, and the image's hook runs.
    let mut boot = vm.start()?;
    // systemd-bless-boot blessed the first boot; no upgrade was pending, so machined writes
    // nothing.
    booted(
        &mut boot,
        Some("nothing to commit: slate-1.0.0+3.efi is blessed"),
    )?;
    let to_multi_user = boot.elapsed();
    let init_line = console_line(&boot, "setup hooks due (slate-setup-hooks.service)")?;
    let v1_id = machine_id(&console_line(&boot, "image hook: version 1.0.0")?)?;
    let status = node.status()?;
    ensure!(
        status["version"] == "1.0.0" && status["committed"] == true,
        "status of v1: {status}"
    );
    ensure!(
        status["var"]["mode"] == "persistent"
            && status["var"]["prepared"] == "formatted (blank) by init, the image's mode",
        "/var as init left it at the first boot: {status}"
    );
    node.ok(&["shutdown"])?;
    boot.wait_exit(Duration::from_secs(120))?;

    deploy_user_hooks(&image, work)?;
    // v1 again: /etc was not reset, so no hook runs.
    let mut boot = vm.start()?;
    booted(&mut boot, None)?;
    let not_reset = console_line(&boot, "setup hooks already ran for 1.0.0")?;
    ensure!(
        !boot.serial().contains("user hook:"),
        "a boot that did not reset /etc ran the user's hook"
    );

    // v2 online: the entry is written with its tries, /etc reset, the hooks run.
    let installer = online_upgrade(&node, &mut boot, &bundles[1], "2.0.0")?;
    // systemd-boot's names on the ESP: v2 on trial with its tries, v1 blessed.
    let on_trial = uki_names(&image)?;
    ensure!(
        on_trial.contains(&"slate-2.0.0+3.efi".to_owned())
            && on_trial.contains(&"slate-1.0.0.efi".to_owned()),
        "the ESP after the upgrade: {on_trial:?}"
    );
    let mut boot = vm.start()?;
    booted(&mut boot, Some("committed: slate-2.0.0"))?;
    let user_hook = console_line(&boot, "user hook: version 2.0.0")?;
    ensure!(
        user_hook.contains("marks: user-hook-2.0.0") || user_hook.ends_with("marks:"),
        "/etc was reset: v1's mark is gone: {user_hook}"
    );
    let skipped = console_line(&boot, "60-notes.txt")?;
    let v2_id = machine_id(&console_line(&boot, "image hook: version 2.0.0")?)?;
    ensure!(
        v1_id == v2_id && v1_id.len() == 32,
        "the machine ID survives the reset of /etc: {v1_id} then {v2_id}"
    );
    let v2_status = node.status()?;
    ensure!(
        v2_status["version"] == "2.0.0" && v2_status["committed"] == true,
        "status of v2: {v2_status}"
    );
    // systemd's own boot assessment blessed it: bootctl saw the counted name before
    // systemd-bless-boot ran and the plain one after; machined then only dropped the marker.
    // systemd's status line, its middle cut to the console's width.
    let bless = boot
        .serial()
        .lines()
        .find(|l| l.contains("Finished") && l.contains("Loader Entry as Good."))
        .map(|l| l.trim().to_owned())
        .context("no `Finished systemd-bless-boot.service` on the console")?;
    let (listed_before, listed_after) = bootctl_listings(&boot.serial(), "slate-2.0.0")?;
    let commit = console_line(&boot, "committed: slate-2.0.0")?;
    ensure!(
        commit.contains("already blessed as slate-2.0.0.efi"),
        "systemd-bless-boot renamed the entry before machined's commit: {commit}"
    );

    // A reboot by kexec through systemd: the attempt counted, `systemctl kexec`, and v2 again
    // in the same QEMU process, with no firmware on the console.
    node.ok(&["reboot", "--mode", "kexec", "--wait"])?;
    let kexec = super::kexec::kexec_was_clean(&mut boot)?;
    ensure!(
        node.status()?["version"] == "2.0.0",
        "v2 again after the kexec"
    );

    // v3: its health check fails; machined marks it bad and systemd reboots into v2.
    let answer = node.ok(&[
        "upgrade",
        "--image",
        &format!("oci-layout:{}", bundles[2].display()),
    ])?;
    super::upgrade_went_through(&mut boot, &answer, "3.0.0")?;
    // systemd-bless-boot dropped v2's counter from the name.
    let blessed = uki_names(&image)?;
    ensure!(
        blessed.contains(&"slate-2.0.0.efi".to_owned())
            && blessed.contains(&"slate-3.0.0+3.efi".to_owned()),
        "the ESP after v2's commit and v3's install: {blessed:?}"
    );
    let mut boot = vm.start()?;
    boot.expect(&[MULTI_USER], BOOT_TIMEOUT, "v3 reaching multi-user")?;
    let fatal = boot.expect(
        &["[slate] [machined] fatal:"],
        Duration::from_secs(120),
        "v3's failed health check",
    )?;
    let check = console_line(&boot, "`file /etc/never-written` failed")?;
    boot.wait_exit(Duration::from_secs(120))?;
    let mut boot = vm.start()?;
    booted(&mut boot, None)?;
    let back = node.status()?;
    ensure!(
        back["version"] == "2.0.0"
            && back["last_failure"]["version"] == "3.0.0"
            && back["last_failure"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("failed units: slate-check@2.service")),
        "back on v2 with v3's failure: {back}"
    );

    // v4, staged (`--stage`: recorded in META, installed by slate-machined at the next boot
    // before its Boot sequence) with one try (`--tries 1`, kept in META with the stage; three
    // are kernel_cannot_start's): init cannot execute systemd, so nothing runs to revert: boot
    // counting spends its try and systemd-boot falls back to v2, which drops the upgrade's
    // marker.
    let installed = super::staged::stage(
        &node,
        &mut boot,
        &mut vm,
        &bundles[3],
        "4.0.0",
        &["--tries", "1"],
    )?;
    ensure!(
        installed.contains("installed slate-4.0.0+1.efi"),
        "v4 staged with one try: {installed}"
    );
    let counting = Instant::now();
    for attempt in 1..=1 {
        let mut boot = vm.start()?;
        boot.expect(
            &["[slate] [initramfs] rebooting in"],
            BOOT_TIMEOUT,
            &format!("v4's init failing (try {attempt})"),
        )?;
        boot.wait_exit(Duration::from_secs(90))?;
        ensure!(
            !boot.serial().contains("[slate] [machined]"),
            "machined never starts in v4"
        );
    }
    let mut boot = vm.start()?;
    booted(&mut boot, Some("committed: slate-2.0.0"))?;
    let dropped = console_line(&boot, "upgrade marker (fallback slate-2.0.0.efi) dropped")?;
    let recovered = counting.elapsed();
    ensure!(
        node.status()?["version"] == "2.0.0",
        "v2 again after v4's try"
    );

    // `[var] mode = "ephemeral"` in the machine configuration, applied with a reboot: init
    // formats EPHEMERAL afresh before systemd starts, and the user's hooks (on /var) are gone.
    let ephemeral = work.join("node1-ephemeral.machine.toml");
    fs::write(
        &ephemeral,
        format!(
            "{}\n[var]\nmode = \"ephemeral\"\n",
            fs::read_to_string(&config)?
        ),
    )?;
    node.ok(&[
        "apply-config",
        &ephemeral.to_string_lossy(),
        "--mode",
        "reboot",
    ])?;
    boot.wait_exit(Duration::from_secs(120))?;
    let mut boot = vm.start()?;
    booted(&mut boot, None)?;
    let afresh = console_line(&boot, "ephemeral: formatting it afresh")?;
    let var_line = console_line(&boot, "/var: ephemeral (the machine configuration's mode)")?;
    let var = node.status()?["var"].clone();
    ensure!(
        var["mode"] == "ephemeral"
            && var["prepared"] == "formatted (ephemeral) by init, the machine configuration's mode",
        "status.var on an ephemeral /var: {var}"
    );
    let ephemeral_boots = console_line(&boot, "var-boots: this boot")?;
    ensure!(
        ephemeral_boots
            .trim_end()
            .ends_with("earlier on this /var:"),
        "an ephemeral /var remembers no boot: {ephemeral_boots}"
    );
    // `[var] mode = "tpm2"` for the next boot (staged: written to STATE, read by init).
    let tpm2 = work.join("node1-tpm2.machine.toml");
    fs::write(
        &tpm2,
        format!("{}\n[var]\nmode = \"tpm2\"\n", fs::read_to_string(&config)?),
    )?;
    node.ok(&["apply-config", &tpm2.to_string_lossy(), "--mode", "staged"])?;
    // On the disk: the user's hooks went with the old /var; init made their directory anew.
    node.ok(&["shutdown"])?;
    boot.wait_exit(Duration::from_secs(120))?;
    let mnt = work.join("ephemeral");
    with_partition(&image, "EPHEMERAL", &mnt, || {
        let hooks = mnt.join("lib/slate/etc-setup-hooks");
        let left: Vec<_> = fs::read_dir(&hooks)
            .with_context(|| format!("init made {} again", hooks.display()))?
            .flatten()
            .map(|e| e.file_name())
            .collect();
        ensure!(left.is_empty(), "an ephemeral /var kept {left:?}");
        Ok(())
    })?;
    let tpm2 = tpm2_var(&node, &mut vm, &image, work)?;

    Ok(format!(
        "built in {:.0} s (UKI {:.1} MB); v1 multi-user and committed {:.0} s after power-on; \
         `{init_line}`; `{not_reset}`; v2 `{installer}`, ESP {on_trial:?} then {blessed:?}, `{user_hook}`, `{skipped}`; \
         bootctl list: {listed_before} then {listed_after}, `{bless}`, `{commit}`; `{kexec}`; \
         v3 `{check}`, `{fatal}` then v2 again; machine-id {v1_id} kept; v4 (`{installed}`) by counting: `{dropped}` \
         {:.0} s after its one try; ephemeral /var: `{afresh}`, `{var_line}`, \
         `{ephemeral_boots}`; {tpm2}",
        built.as_secs_f64(),
        uki as f64 / 1e6,
        to_multi_user.as_secs_f64(),
        recovered.as_secs_f64(),
    ))
}

/// The console line's text after the kernel's timestamp.
fn untimed(line: &str) -> &str {
    line.split_once("] ").map_or(line, |(_, rest)| rest).trim()
}

/// A `tpm2` /var on the systemd image (issue 40), two boots with swtpm as the TPM: init sets
/// LUKS2 up on the blank EPHEMERAL with the root's cryptsetup and tpm2-tools and prints the
/// recovery key; `var-boots.service` leaves this boot's ID on /var; the next boot unlocks it
/// unattended and finds the ID. From the host, powered off: LUKS2 with slate's token, no
/// plaintext of the ID, and the recovery key opens its key slot.
fn tpm2_var(node: &Node<'_>, vm: &mut Vm, image: &Path, work: &Path) -> Result<String> {
    super::var_tpm2::require_tools()?;
    // A blank EPHEMERAL, as a new disk's: tpm2 sets up only a blank partition (the ephemeral
    // /var's ext4 is refused, never formatted over).
    {
        let (offset, _) = super::var_tpm2::ephemeral_range(image)?;
        let mut disk = fs::OpenOptions::new().write(true).open(image)?;
        std::io::Seek::seek(&mut disk, std::io::SeekFrom::Start(offset))?;
        std::io::Write::write_all(&mut disk, &vec![0u8; 1 << 20])?;
        disk.sync_all()?;
    }
    vm.set_tpm(Some(&work.join("tpm")));
    let mut boot = vm.start()?;
    booted(&mut boot, None)?;
    let sealed = console_line(&boot, "tpm2: LUKS2 set up, key sealed to the TPM")?;
    let shown = console_line(
        &boot,
        "recovery key for /var (EPHEMERAL, key slot 1; shown once",
    )?;
    let recovery = shown
        .rsplit(": ")
        .next()
        .map(str::trim)
        .filter(|k| k.len() == 71)
        .with_context(|| format!("a recovery key in {shown:?}"))?
        .to_owned();
    let first = console_line(&boot, "var-boots: this boot")?;
    let boot_id = first
        .split("this boot ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .map(str::to_owned)
        .with_context(|| format!("a boot ID in {first:?}"))?;
    ensure!(
        boot_id.len() == 36 && first.trim_end().ends_with("earlier on this /var:"),
        "a new /var remembers no boot: {first}"
    );
    let var = node.status()?["var"].clone();
    ensure!(
        var["mode"] == "tpm2"
            && var["encrypted"] == true
            && var["unlocked"] == "TPM (sealed at this boot, PCR 7)"
            && var["prepared"] == "formatted (blank) by init, the machine configuration's mode",
        "status.var at the tpm2 /var's first boot: {var}"
    );
    node.ok(&["reboot"])?;
    boot.wait_exit(Duration::from_secs(120))?;

    let mut boot = vm.start()?;
    booted(&mut boot, None)?;
    let unlocked = console_line(
        &boot,
        "EPHEMERAL: unlocked with the TPM (PCR 7, key slot 0)",
    )?;
    let second = console_line(&boot, "var-boots: this boot")?;
    ensure!(
        second.contains(&format!("earlier on this /var: {boot_id}")),
        "the tpm2 /var kept the first boot's ID {boot_id}: {second}"
    );
    let text = node.ok(&["status"])?;
    ensure!(
        text.contains("var:      tpm2, encrypted, unlocked by TPM (PCR sha256:7) (mounted by init")
            || text.contains(
                "var:      tpm2, encrypted, unlocked by TPM (PCR sha256:7) (checked by init"
            ),
        "slate status on the tpm2 /var: {text}"
    );
    ensure!(
        !boot.serial().contains(&recovery),
        "the recovery key was shown again"
    );
    node.ok(&["shutdown"])?;
    boot.wait_exit(Duration::from_secs(120))?;

    let dev = super::var_tpm2::Loop::over(image)?;
    let dump = output(Command::new("cryptsetup").args(["luksDump", &dev.0]))?;
    ensure!(
        dump.contains("Version:       \t2") && dump.contains("slate-tpm2"),
        "luksDump of the Debian node's EPHEMERAL: {dump}"
    );
    let plain = Command::new("grep")
        .args(["-a", "-F", "-q", &boot_id, &dev.0])
        .status()?;
    ensure!(
        plain.code() == Some(1),
        "the boot ID written to /var is in plaintext on the raw partition ({plain})"
    );
    super::var_tpm2::recovery_key_opens_slot_1(&dev, &work.join("debian-recovery.key"), &recovery)?;
    println!("debian_boots_systemd: cryptsetup luksDump of EPHEMERAL:\n{dump}");
    Ok(format!(
        "tpm2 /var: `{}`, `{}`; `{}`; luksDump shows token slate-tpm2, no plaintext of boot \
         {boot_id}, the printed recovery key opens key slot 1",
        untimed(&sealed),
        untimed(&unlocked),
        untimed(&second),
    ))
}
