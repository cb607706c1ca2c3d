//! Secure Boot with the owner's keys (issue 16): OVMF's Secure Boot firmware starting from
//! empty variables (setup mode). The image ships PK/KEK/db in `ESP/loader/keys/auto` and
//! `secure-boot-enroll force`: its first boot enrols them and resets, and from then on the
//! firmware enforces. An online upgrade to a v2 signed with the owner's db key commits under
//! enforcement; a v2 signed with a foreign db key is refused by the node before any write; and,
//! as the control that shows why that check exists, the same foreign-signed UKI copied onto the
//! ESP offline (past slate) is refused by the firmware at each of its three tries; slate's own
//! boot options start the loader again after each refusal, so v2 comes back unattended.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};

use super::{ensure_logged, online_upgrade, Node, Prepared, BOOT_TIMEOUT, RUNNING};
use crate::util::{output, repo_root};
use crate::vm::Vm;

/// The demo profile with a `[secureboot]` section (paths absolute).
fn secure_profile(work: &Path, name: &str, keys: &Path, enroll: bool) -> Result<PathBuf> {
    let profiles = repo_root().join("profiles");
    let text = fs::read_to_string(profiles.join("demo.toml")).context("reading demo.toml")?;
    let mut out = text.replace("\"../", &format!("\"{}/../", profiles.display()));
    out.push_str(&format!(
        "\n[secureboot]\nkey = \"{k}/db.key\"\ncert = \"{k}/db.crt\"\n",
        k = keys.display()
    ));
    if enroll {
        out.push_str(&format!("enroll = \"{}\"\n", keys.display()));
    }
    let path = work.join(format!("{name}.toml"));
    fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn gen_keys(slate: &Path, out: &Path, name: &str) -> Result<()> {
    let _ = fs::remove_dir_all(out);
    output(
        Command::new(slate)
            .args(["gen", "secureboot-keys", "--name", name, "--out"])
            .arg(out),
    )
    .map(drop)
}

fn sbverify(cert: &Path, image: &Path) -> Result<String> {
    let out = Command::new("sbverify")
        .arg("--cert")
        .arg(cert)
        .arg(image)
        .output()
        .context("running sbverify (apt-get install sbsigntool)")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "sbverify --cert {}: {text}",
        cert.display()
    );
    Ok(text)
}

/// Copy one file out of the disk image's ESP (at 1 MiB) with mtools.
fn esp_copy_out(image: &Path, esp_path: &str, to: &Path) -> Result<()> {
    output(
        Command::new("mcopy")
            .args(["-n", "-i"])
            .arg(format!("{}@@1M", image.display()))
            .arg(format!("::/{esp_path}"))
            .arg(to),
    )
    .map(drop)
}

/// A console line without the firmware's terminal escape sequences (`ESC [ … letter`).
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip to the sequence's final byte, a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The ESP and META of the demo layout (1 MiB on, 96 + 1 MiB): what an upgrade writes. The rest
/// of the disk is the node's /var and STATE, which an upload does write.
fn boot_partitions(image: &Path) -> Result<Vec<u8>> {
    let disk = fs::read(image)?;
    disk.get(1 << 20..98 << 20)
        .map(<[u8]>::to_vec)
        .context("the disk image is smaller than its ESP and META")
}

pub(super) fn secure_boot_enrol_and_enforce(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let owner = work.join("owner-keys");
    let foreign = work.join("foreign-keys");
    gen_keys(slate, &owner, "slate owner")?;
    gen_keys(slate, &foreign, "someone else")?;
    let profile = secure_profile(work, "secure", &owner, true)?;
    let foreign_profile = secure_profile(work, "foreign", &foreign, false)?;
    let image = work.join("secure.raw");
    let (v2, v3_foreign) = (work.join("bundle-v2"), work.join("bundle-v3-foreign"));
    super::rollback::build(slate, &profile, "image", "1.0.0", &[], &image)?;
    super::rollback::build(slate, &profile, "installer", "2.0.0", &[], &v2)?;
    super::rollback::build(
        slate,
        &foreign_profile,
        "installer",
        "3.0.0",
        &[],
        &v3_foreign,
    )?;
    let foreign_uki = work.join("foreign-3.0.0.efi");
    super::rollback::build(slate, &foreign_profile, "uki", "3.0.0", &[], &foreign_uki)?;

    // What the imager signed, judged by sbsigntool with the owner's db certificate.
    let loader = work.join("BOOTX64.EFI");
    let v1_uki = work.join("v1.efi");
    esp_copy_out(&image, "EFI/BOOT/BOOTX64.EFI", &loader)?;
    esp_copy_out(&image, "EFI/Linux/slate-1.0.0+3.efi", &v1_uki)?;
    let db_crt = owner.join("db.crt");
    let verified = sbverify(&db_crt, &loader)? + &sbverify(&db_crt, &v1_uki)?;
    ensure!(
        sbverify(&db_crt, &foreign_uki).is_err(),
        "the foreign UKI verified with the owner's db certificate"
    );
    let verified_line = verified
        .lines()
        .find(|l| l.contains("Signature verification OK"))
        .unwrap_or_default()
        .to_string();

    let mut vm = Vm::new(&image, &work.join("vm"))?.with_secure_boot();
    let node = Node {
        prepared,
        port: vm.api_port,
        name: super::image_node_name(&image),
    };
    // Boot 1: setup mode. systemd-boot enrols db, KEK, then PK, and resets the machine.
    let mut enrol = vm.start()?;
    let enrolled = enrol.expect(
        &["successfully enrolled", "Enrolling secure boot keys"],
        BOOT_TIMEOUT,
        "systemd-boot enrolling the keys",
    )?;
    enrol.wait_exit(Duration::from_secs(120))?;
    ensure!(
        !enrol.serial().contains(RUNNING),
        "the enrolling boot went on to start the OS"
    );

    // Boot 2: enforced.
    let mut boot = vm.start()?;
    boot.expect(&[RUNNING], BOOT_TIMEOUT, "v1 Running under Secure Boot")?;
    // The EFI stub and the kernel both saw enforcement (Debian's kernel then locks itself down).
    let stub_line = boot
        .wait_for(
            &["EFI stub: UEFI Secure Boot is enabled"],
            Duration::from_secs(1),
        )?
        .context("the EFI stub did not report Secure Boot")?;
    let kernel_line = boot
        .wait_for(
            &["locked down from EFI Secure Boot"],
            Duration::from_secs(1),
        )?
        .context("the kernel did not report lockdown by Secure Boot")?;
    let status = node.status()?;
    let sb = &status["secure_boot"];
    ensure!(
        sb["enabled"] == true && sb["setup_mode"] == false,
        "status after enrolment: {status}"
    );
    ensure!(
        sb["db"].to_string().contains("slate owner db"),
        "status names the image's db: {sb}"
    );
    let text = node.ok(&["status"])?;
    ensure!(text.contains("secureboot: enabled"), "{text}");

    // A bundle whose UKI the enrolled db refuses: the node's own check stops it before the
    // installer runs; nothing on the ESP changes.
    // Only a committed v1 is settled: its commit blesses the entry on the ESP.
    boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(120),
        "v1 committed",
    )?;
    let status = node.status()?;
    ensure!(status["committed"] == true, "v1 not committed: {status}");
    let before = boot_partitions(&image)?;
    let answer = node.ok(&[
        "upgrade",
        "--image",
        &format!("oci-layout:{}", v3_foreign.display()),
        "--cache",
        work.join("cache").to_str().unwrap_or("."),
    ])?;
    ensure!(answer.contains("accepted"), "slate upgrade: {answer}");
    let refusal = boot.expect(
        &["would be refused by this node's Secure Boot firmware"],
        Duration::from_secs(120),
        "the node refusing the foreign-signed UKI",
    )?;
    ensure!(
        !boot.serial().contains("running the 3.0.0 installer"),
        "the installer ran for a refused UKI"
    );
    let status = node.status()?;
    ensure!(
        status["version"] == "1.0.0" && status["stage"] == "Running",
        "after the refusal: {status}"
    );
    ensure!(
        status["last_failure"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("would be refused by this node's Secure Boot")),
        "status names the refusal: {status}"
    );
    ensure!(
        boot_partitions(&image)? == before,
        "the ESP or META changed"
    );

    // The owner-signed v2: installed, booted under enforcement, committed.
    online_upgrade(&node, &mut boot, &v2, "2.0.0")?;
    ensure_logged(&boot, "which this image's Secure Boot db")?;
    let mut boot = vm.start()?;
    boot.expect(&[RUNNING], BOOT_TIMEOUT, "v2 Running under Secure Boot")?;
    boot.expect(
        &["committed: slate-2.0.0"],
        Duration::from_secs(120),
        "v2 committed",
    )?;
    let status = node.status()?;
    ensure!(
        status["version"] == "2.0.0" && status["secure_boot"]["enabled"] == true,
        "v2: {status}"
    );
    // kexec under lockdown: the kernel would start only images signed by a key it trusts, so
    // the node says so and restarts through the firmware, whose checks cover the whole UKI.
    node.ok(&["reboot", "--mode", "kexec"])?;
    let fallback = boot.expect(
        &["kexec unavailable"],
        Duration::from_secs(60),
        "the kexec fallback under lockdown",
    )?;
    ensure!(fallback.contains("locked down"), "{fallback}");
    boot.wait_exit(Duration::from_secs(90))?;
    let mut boot = vm.start()?;
    boot.expect(
        &[RUNNING],
        BOOT_TIMEOUT,
        "v2 Running after the firmware reboot",
    )?;
    ensure_logged(&boot, "EFI stub: UEFI Secure Boot is enabled")?;
    node.ok(&["shutdown"])?;
    boot.wait_exit(Duration::from_secs(90))?;

    // Control: the foreign-signed UKI forced onto the ESP past slate, as the newest version.
    output(
        Command::new("mcopy")
            .args(["-i"])
            .arg(format!("{}@@1M", image.display()))
            .arg(&foreign_uki)
            .arg("::/EFI/Linux/slate-3.0.0+3.efi"),
    )?;
    let mut control = vm.start()?;
    let denied = control.expect(
        &["Access Denied"],
        BOOT_TIMEOUT,
        "the firmware refusing the foreign-signed UKI",
    )?;
    // No one resets the machine, and it does not wait at the firmware for a person: slate's
    // boot options start the loader again after each refusal, each start spends one of the
    // forced entry's tries, and the start after the last boots v2 (issue 44, item 4).
    control.expect(
        &[RUNNING],
        BOOT_TIMEOUT,
        "v2 Running after the refused UKI's tries, with no reset",
    )?;
    let refusals = control.serial().matches("Access Denied").count();
    ensure!(
        refusals >= 3,
        "each of the forced entry's three tries refused by the firmware: {refusals} refusal(s)"
    );
    let back = node.status()?;
    ensure!(back["version"] == "2.0.0", "back on v2: {back}");
    node.ok(&["shutdown"])?;
    control.wait_exit(Duration::from_secs(90))?;
    let (enrolled, denied) = (plain(&enrolled), plain(&denied));
    Ok(format!(
        "sbverify: {verified_line}; enrolment: {enrolled:?}; enforced: {stub_line:?}, \
         {kernel_line:?}; node: {refusal:?}; kexec: {fallback:?}; firmware: {denied:?}, then \
         v2 again by slate's boot options after {refusals} refusals"
    ))
}
