//! tpm2_var (issue 40): profiles/tpm2.toml — the demo with `[var] mode = "tpm2"` and the tpm2
//! extension — on a VM whose TPM is Debian's swtpm (QEMU's tpm-crb). The first boot sets /var
//! up (LUKS2, key sealed under PCR 7, recovery key shown once) and loses its power as the key
//! is shown; the next finishes or restarts the job, and a service leaves a marker; the
//! machine configuration sends the recovery key to STATE (`[var] recovery_key = "state"`), so
//! the console never shows it and the host reads it from the powered-off disk;
//! the next boot unlocks it unattended and finds the marker. From the host, with the VM off:
//! the partition is LUKS2 with slate's token and no plaintext of the marker. The same disk
//! with a fresh swtpm state (another TPM) and with no TPM at all is refused — console, status,
//! maintenance mode over the API — and the header's bytes are unchanged; the recovery key opens
//! the key slot on the host. Back on its own TPM: unlocked, upgraded to v2 and reverted from a
//! broken v3 with the marker there each time; `slate reset` destroys the key slots.

use std::fs;
use std::io::{Read as _, Seek as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use sha2::{Digest as _, Sha256};

use super::stolen::{read_state_file, stat_state_file};
use super::var_modes::{marker_said, reboot};
use super::{install_blank_disk, node_config, online_upgrade, rollback, running, Node, Prepared};
use crate::tpm2_ext::tpm2_ext;
use crate::util::{output, repo_root};
use crate::vm::{Running, Vm};

/// The extension's version (profiles/tpm2.toml names this file).
const EXT_VERSION: &str = "2.6.1-1";
/// What the marker service writes to /var, put together by the shell so that the machine
/// configuration (on STATE, which is not encrypted) never holds it whole.
const MARKER: &str = "SLATE-TPM2-MARKER-c0ffee";
const RECOVERY_LINE: &str = "recovery key for /var";
/// Where `[var] recovery_key = "state"` puts it, on STATE and on the node.
const RECOVERY_FILE: &str = "/recovery/var.key";
const RECOVERY_WRITTEN: &str = "written to /system/state/recovery/var.key (root only";
const UNLOCKED_LINE: &str = "EPHEMERAL: unlocked with the TPM (PCR 7, key slot 0)";
const LOCKED_LINE: &str = "maintenance mode: /var is locked";

/// The service: says whether its marker is on /var, then leaves it (64 lines of it).
fn marker_service() -> String {
    let (head, tail) = MARKER.split_at(11);
    format!(
        "\n[[services]]\nname = \"marker\"\ncommand = ['/bin/sh', '-c', 'mkdir -p /var/lib; \
         f=/var/lib/tpm2-marker; \
         if [ -e $f ]; then echo \"marker found\"; else echo \"marker absent\"; i=0; while [ $i \
         -lt 64 ]; do echo {head}\"\"{tail}; i=$((i+1)); done > $f; sync; fi']\nrestart = \
         \"never\"\ndepends_on = [\"var\"]\n"
    )
}

/// profiles/tpm2.toml with its paths absolute and `extension` in place of its own.
fn profile(work: &Path, extension: &Path) -> Result<PathBuf> {
    let profiles = repo_root().join("profiles");
    let text = fs::read_to_string(profiles.join("tpm2.toml"))?
        .replace("\"../", &format!("\"{}/../", profiles.display()));
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let ext = lines
        .iter()
        .position(|l| l.starts_with("extensions = "))
        .context("profiles/tpm2.toml has no `extensions =` line")?;
    lines[ext] = format!("extensions = [\"{}\"]", extension.display());
    let path = work.join("tpm2.toml");
    fs::write(&path, lines.join("\n") + "\n")?;
    Ok(path)
}

/// EPHEMERAL's byte range in the disk image (`partx`).
pub(super) fn ephemeral_range(image: &Path) -> Result<(u64, u64)> {
    let table = output(
        Command::new("partx")
            .args(["--show", "--noheadings", "--output", "START,SECTORS,NAME"])
            .arg(image),
    )?;
    let line = table
        .lines()
        .find(|l| l.trim_end().ends_with("EPHEMERAL"))
        .with_context(|| format!("no EPHEMERAL partition: {table}"))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .take(2)
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    Ok((fields[0] * 512, fields[1] * 512))
}

/// A read-only loop device over EPHEMERAL, detached on drop.
pub(super) struct Loop(pub(super) String);

/// `recovery` (the key a node printed or stored), written to `key_file`, opens key slot 1 of
/// the LUKS2 volume on `dev` (`cryptsetup open --test-passphrase`: nothing is mapped).
pub(super) fn recovery_key_opens_slot_1(dev: &Loop, key_file: &Path, recovery: &str) -> Result<()> {
    fs::write(key_file, recovery)?;
    output(
        Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--key-slot", "1", "--key-file"])
            .arg(key_file)
            .arg(&dev.0),
    )
    .context("the recovery key opens key slot 1")?;
    Ok(())
}

impl Loop {
    pub(super) fn over(image: &Path) -> Result<Loop> {
        let (offset, size) = ephemeral_range(image)?;
        let dev = output(
            Command::new("losetup")
                .args(["--find", "--show", "--read-only", "--offset"])
                .arg(offset.to_string())
                .arg("--sizelimit")
                .arg(size.to_string())
                .arg(image),
        )?;
        Ok(Loop(dev.trim().to_owned()))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// SHA-256 of EPHEMERAL's first 16 MiB (the LUKS2 headers and key slots).
pub(super) fn header_hash(image: &Path) -> Result<String> {
    let (offset, _) = ephemeral_range(image)?;
    let mut file = fs::File::open(image)?;
    file.seek(std::io::SeekFrom::Start(offset))?;
    let mut head = vec![0u8; 16 << 20];
    file.read_exact(&mut head)?;
    Ok(format!("{:x}", Sha256::digest(&head)))
}

fn shut_down(node: &Node<'_>, mut boot: Running) -> Result<()> {
    node.ok(&["shutdown"])?;
    boot.wait_exit(Duration::from_secs(90))
}

/// The console line that holds `needle`, without the kernel's timestamp.
fn line_with(boot: &Running, needle: &str) -> Result<String> {
    let serial = boot.serial();
    let line = serial
        .lines()
        .find(|l| l.contains(needle))
        .with_context(|| {
            format!(
                "{needle:?} on the console; it ended with:\n{}",
                crate::vm::tail(&serial, 40)
            )
        })?;
    Ok(line
        .split_once("] ")
        .map_or(line, |(_, rest)| rest)
        .trim()
        .to_owned())
}

/// The recovery key as the node wrote it to STATE (read from the powered-off disk): 8 groups
/// of 8 hex digits, readable by root alone, never on the console.
fn recovery_key_on_state(image: &Path, work: &Path, consoles: &[String]) -> Result<String> {
    let key = read_state_file(image, work, RECOVERY_FILE)?;
    ensure!(
        key.len() == 71 && key.split('-').all(|g| g.len() == 8),
        "a recovery key in {RECOVERY_FILE}: {key:?}"
    );
    let stat = stat_state_file(image, work, RECOVERY_FILE)?;
    ensure!(
        stat.contains("Mode:  0600") && stat.contains("User:     0"),
        "{RECOVERY_FILE} readable by root alone: {stat}"
    );
    ensure!(
        consoles.iter().all(|serial| !serial.contains(&key)),
        "the recovery key was printed on the console"
    );
    Ok(key)
}

/// A boot that unlocked /var by itself and found the marker; `status`'s var line checked.
fn unlocked_with_marker(node: &Node<'_>, boot: &Running) -> Result<()> {
    line_with(boot, UNLOCKED_LINE)?;
    ensure!(marker_said(node)? == "marker found", "the marker on /var");
    let text = node.ok(&["status"])?;
    ensure!(
        text.contains("var:      tpm2, encrypted, unlocked by TPM (PCR sha256:7)"),
        "{text}"
    );
    Ok(())
}

/// A boot refused: the reason on the console, maintenance mode over the API, the status.
fn refused(node: &Node<'_>, vm: &mut Vm, why: &str) -> Result<String> {
    let mut boot = vm.start()?;
    boot.expect(
        &[LOCKED_LINE],
        super::BOOT_TIMEOUT,
        "maintenance mode with /var locked",
    )?;
    let reason = line_with(&boot, why)?;
    let status = node.status()?;
    ensure!(
        status["var"]["prepared"] == "not mounted: locked"
            && status["var"]["encrypted"] == true
            && status["last_failure"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains(why)),
        "status of a locked node: {status}"
    );
    let text = node.ok(&["status"])?;
    ensure!(
        text.contains("var:      tpm2, encrypted (not mounted: locked)"),
        "{text}"
    );
    ensure!(
        !boot.serial().contains("formatting"),
        "nothing is formatted on a refusal"
    );
    shut_down(node, boot)?;
    Ok(reason)
}

/// The tools a tpm2 scenario or benchmark runs on the host: missing, it fails (under `CI=true`
/// and elsewhere alike), never skips.
pub(crate) fn require_tools() -> Result<()> {
    for tool in ["swtpm", "cryptsetup", "losetup", "partx"] {
        ensure!(
            slate_testkit::find_tool(tool).is_some(),
            "{tool} is missing (scripts/install-deps installs it)"
        );
    }
    Ok(())
}

/// The tpm2 extension and profiles/tpm2.toml's installer bundle at `version` in `out`.
pub(crate) fn tpm2_bundle(
    prepared: &Prepared,
    work: &Path,
    version: &str,
    extra_args: &[&str],
    out: &Path,
) -> Result<()> {
    let extension = tpm2_ext(EXT_VERSION, &prepared.slate)?;
    let profile = profile(work, &extension)?;
    rollback::build(
        &prepared.slate,
        &profile,
        "installer",
        version,
        extra_args,
        out,
    )
}

pub(super) fn tpm2_var(prepared: &Prepared, work: &Path) -> Result<String> {
    require_tools()?;
    let slate = &prepared.slate;
    let bundles: Vec<PathBuf> = (1..=3).map(|v| work.join(format!("bundle-v{v}"))).collect();
    tpm2_bundle(prepared, work, "1.0.0", &[], &bundles[0])?;
    let extension = tpm2_ext(EXT_VERSION, slate)?;
    let profile = profile(work, &extension)?;
    rollback::build(slate, &profile, "installer", "2.0.0", &[], &bundles[1])?;
    let broken = ["slate.debug.fail-hook"];
    rollback::build(slate, &profile, "installer", "3.0.0", &broken, &bundles[2])?;
    let config = node_config(slate, work, "node1")?;
    let mut text = fs::read_to_string(&config)?;
    ensure!(
        !text.contains("[var]"),
        "the node's configuration has a [var]"
    );
    text.push_str("\n[var]\nrecovery_key = \"state\"\n");
    text.push_str(&marker_service());
    fs::write(&config, text)?;
    let image = work.join("tpm2.raw");
    install_blank_disk(slate, &image, &bundles[0], "1.0.0", &config)?;
    let own_tpm = work.join("tpm-own");
    let mut vm = Vm::new(&image, &work.join("vm"))?.with_tpm(Some(&own_tpm));
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "node1".into(),
    };

    // The first boot's power is cut as the recovery key is shown (before the token is stored,
    // or between the token and the filesystem): the next boot sets it up again, or opens it and
    // makes the filesystem — never a refusal, never a second volume over a used one.
    let mut cut = vm.start()?;
    cut.expect(
        &[RECOVERY_LINE],
        super::BOOT_TIMEOUT,
        "the first boot's setup",
    )?;
    cut.kill();
    let written = line_with(&cut, RECOVERY_LINE)?;
    ensure!(written.contains(RECOVERY_WRITTEN), "{written}");
    let mut consoles = vec![cut.serial()];
    drop(cut);
    let boot = running(&mut vm)?;
    let after_cut = line_with(&boot, "setup was cut short")
        .or_else(|_| line_with(&boot, UNLOCKED_LINE))
        .context("after the power cut: set up again, or opened")?;
    let sealed = if after_cut.contains("cut short") {
        let again = line_with(&boot, RECOVERY_LINE)?;
        ensure!(again.contains(RECOVERY_WRITTEN), "{again}");
        line_with(&boot, "tpm2: LUKS2 set up")?
    } else {
        line_with(&boot, UNLOCKED_LINE)?
    };
    ensure!(marker_said(&node)? == "marker absent", "a first marker");
    let text = node.ok(&["status"])?;
    ensure!(
        text.contains("var:      tpm2, encrypted, unlocked by TPM ("),
        "{text}"
    );
    consoles.push(boot.serial());
    let boot = reboot(&node, &mut vm, boot)?;
    unlocked_with_marker(&node, &boot)?;
    let unlocked = line_with(&boot, UNLOCKED_LINE)?;
    consoles.push(boot.serial());
    shut_down(&node, boot)?;
    let recovery = recovery_key_on_state(&image, work, &consoles)?;

    // From the host: LUKS2 with slate's token, no plaintext.
    let dump = {
        let dev = Loop::over(&image)?;
        let dump = output(Command::new("cryptsetup").args(["luksDump", &dev.0]))?;
        ensure!(
            dump.contains("Version:       \t2") && dump.contains("slate-tpm2"),
            "luksDump: {dump}"
        );
        let plain = Command::new("grep")
            .args(["-a", "-F", "-q", MARKER, &dev.0])
            .status()?;
        ensure!(
            plain.code() == Some(1),
            "the marker's plaintext is on the raw partition ({plain})"
        );
        dump
    };
    println!("tpm2_var: cryptsetup luksDump of EPHEMERAL:\n{dump}");
    let before = header_hash(&image)?;

    // Another TPM, then none: refused, nothing written.
    vm.set_tpm(Some(&work.join("tpm-other")));
    let foreign = refused(
        &node,
        &mut vm,
        "/var could not be unlocked with this machine's TPM",
    )?;
    ensure!(
        header_hash(&image)? == before,
        "the foreign TPM's boot wrote to /var"
    );
    vm.set_tpm(None);
    let none = refused(&node, &mut vm, "needs a TPM 2.0 and this machine has none")?;
    ensure!(
        header_hash(&image)? == before,
        "the boot without a TPM wrote to /var"
    );

    // The recovery key opens the volume's key slot on the host.
    recovery_key_opens_slot_1(&Loop::over(&image)?, &work.join("recovery.key"), &recovery)?;

    // Its own TPM again: unlocked; v2 and a broken v3 reverted, the marker there each time.
    vm.set_tpm(Some(&own_tpm));
    let mut boot = running(&mut vm)?;
    unlocked_with_marker(&node, &boot)?;
    online_upgrade(&node, &mut boot, &bundles[1], "2.0.0")?;
    let mut boot = running(&mut vm)?;
    unlocked_with_marker(&node, &boot)?;
    ensure!(node.status()?["version"] == "2.0.0", "v2 runs");
    boot.expect(&["committed:"], Duration::from_secs(90), "v2 committed")?;
    online_upgrade(&node, &mut boot, &bundles[2], "3.0.0")?;
    let mut boot = vm.start()?;
    boot.expect(&["upgrade reverted"], super::BOOT_TIMEOUT, "v3 reverted")?;
    line_with(&boot, UNLOCKED_LINE)?;
    boot.wait_exit(Duration::from_secs(90))?;
    let mut boot = running(&mut vm)?;
    unlocked_with_marker(&node, &boot)?;
    ensure!(node.status()?["version"] == "2.0.0", "back on v2");

    // Reset: the key slots go first.
    node.ok(&["reset"])?;
    boot.wait_exit(Duration::from_secs(90))?;
    let erased = line_with(&boot, "LUKS2 key slots destroyed")?;
    {
        let dev = Loop::over(&image)?;
        let is_luks = Command::new("cryptsetup")
            .args(["isLuks", &dev.0])
            .status()?;
        ensure!(!is_luks.success(), "a LUKS header after the reset");
    }
    Ok(format!(
        "power cut at the first boot's recovery key (`{written}`), then `{after_cut}`; \
         `{sealed}`; the key in {RECOVERY_FILE} on STATE (0600, root), never on the console; \
         `{unlocked}`; luksDump shows token slate-tpm2, no plaintext marker; \
         another TPM: `{foreign}`; no TPM: `{none}` (header hash unchanged both times); the \
         recovery key opens key slot 1; v2 and v3's revert unlocked with the marker; reset: \
         `{erased}`"
    ))
}
