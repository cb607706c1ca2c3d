//! `xtask debian-rootfs`: a minimal Debian bookworm root with systemd as PID 1 for the
//! systemd-image profile (`profiles/debian.toml`, issue 39): `mmdebstrap --variant=minbase`
//! with systemd, systemd-sysv, udev, e2fsprogs (slate's init formats and checks STATE and
//! EPHEMERAL with them), kmod, and iproute2 for systemd-networkd (DHCP on every en*/eth*
//! link), the static slate at `/usr/bin/slate`, `/etc/machine-id` = `uninitialized` (an
//! image's marker: slate's init puts the node's own ID into the /etc overlay) and an empty
//! `/var` (EPHEMERAL is mounted over it; systemd-tmpfiles makes its directories).
//!
//! Reproducible as far as Debian allows: `SOURCE_DATE_EPOCH` is fixed (mmdebstrap then makes
//! the same tree from the same packages), documentation, manual pages and locales are left
//! out, and the exact package versions are written beside the tree (`<out>.packages`). What
//! is not pinned: the packages themselves, which follow bookworm's point and security
//! releases on deb.debian.org (snapshot.debian.org is not reachable from the build machines).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util;

const SUITE: &str = "bookworm";
const MIRROR: &str = "http://deb.debian.org/debian";
/// mmdebstrap's clock: file times, and what packages' postinst scripts see.
const SOURCE_DATE_EPOCH: &str = "1704067200";
const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    "e2fsprogs",
    "kmod",
    "iproute2",
    // systemd-bless-boot (the counter dropped once boot-complete.target is reached) and
    // bootctl; its systemd-boot-update.service is masked: slate owns the loader on the ESP.
    "systemd-boot",
    // A `tpm2` /var (docs/node.md, "/var modes"): slate's init runs the root's own cryptsetup
    // and tpm2-tools before systemd, as machined runs the tpm2 extension's on slate's own OS.
    // libtss2-tctildr opens its TCTI at run time, so the kernel device's is named.
    "cryptsetup-bin",
    "tpm2-tools",
    "libtss2-tcti-device0",
];
/// Left out of the image: nothing on a node reads them.
const EXCLUDED: &[&str] = &[
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
];
/// The image's own setup hook (`/usr/lib/slate/setup.d/10-stamp`): what a reset of /etc runs
/// first. It leaves the stamp the health check looks for, and says which machine ID /etc has.
const IMAGE_HOOK: &str =
    "#!/bin/sh\n# Written on every reset of /etc: the version whose hooks ran.\n\
    echo \"$SLATE_VERSION\" > /etc/slate-setup-stamp\n\
    echo \"image hook: version $SLATE_VERSION machine-id $(cat /etc/machine-id)\"\n";
/// e2scrub's units, masked (see the hook that masks them).
const MASKED_E2SCRUB: &[&str] = &["e2scrub_reap.service", "e2scrub_all.timer"];
/// The boot loader's entries on the console, as systemd sees them (`bootctl list`): once
/// before systemd-bless-boot runs and once after. The image's own diagnostics, for a person at
/// the serial console (and the VM test, which reads the names from them).
const BOOT_ENTRIES_BEFORE: &str = "[Unit]\n\
    Description=Boot loader entries before the boot is blessed\n\
    Wants=efi.mount\nAfter=efi.mount\nBefore=systemd-bless-boot.service\n\n\
    [Service]\nType=oneshot\nExecStart=/usr/bin/bootctl --no-pager list\n\
    StandardOutput=journal+console\n\n[Install]\nWantedBy=multi-user.target\n";
const BOOT_ENTRIES_AFTER: &str = "[Unit]\n\
    Description=Boot loader entries after the boot is blessed\n\
    Wants=efi.mount\nAfter=efi.mount systemd-bless-boot.service boot-complete.target\n\n\
    [Service]\nType=oneshot\nExecStart=/usr/bin/bootctl --no-pager list\n\
    StandardOutput=journal+console\n\n[Install]\nWantedBy=multi-user.target\n";
/// How many boots this /var has seen, on the console: each boot's ID appended to a file on /var
/// and the earlier ones printed. The image's own diagnostic of /var's mode (persistent and
/// tpm2 keep the list, ephemeral starts it afresh); the VM test reads it, and greps the raw
/// partition of a `tpm2` /var for a boot ID it holds.
const VAR_BOOTS: &str = "[Unit]\n\
    Description=Boots this /var has seen\n\
    RequiresMountsFor=/var\n\n\
    [Service]\nType=oneshot\nExecStart=/usr/lib/slate/var-boots\n\
    StandardOutput=journal+console\n\n[Install]\nWantedBy=multi-user.target\n";
const VAR_BOOTS_SCRIPT: &str = "#!/bin/sh\n\
    f=/var/lib/slate/var-boots\n\
    mkdir -p /var/lib/slate\n\
    id=$(cat /proc/sys/kernel/random/boot_id)\n\
    echo \"var-boots: this boot $id; earlier on this /var: $(cat $f 2>/dev/null | tr '\\n' ' ')\"\n\
    echo \"$id\" >> $f\n\
    sync $f\n";
/// One line on the console once the default target is reached, through journald. systemd's
/// own `Reached target multi-user.target` status line cannot be relied on: under load PID 1's
/// status lines stopped from about when the serial getty started on ttyS0 (= /dev/console)
/// while journald's went on, so that line never came (a 240 s wait in debian_boots_systemd).
const MULTI_USER_REACHED: &str = "[Unit]\n\
    Description=Say on the console that multi-user.target is reached\n\
    After=multi-user.target\n\n\
    [Service]\nType=oneshot\nExecStart=/usr/bin/echo \"multi-user.target reached\"\n\
    SyslogIdentifier=multi-user\nStandardOutput=journal+console\n\n\
    [Install]\nWantedBy=multi-user.target\n";
/// DHCP on the first Ethernet link, by systemd-networkd.
const NETWORK: &str = "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n";

pub fn debian_rootfs(out: &Path, slate_bin: &Path, replace: bool) -> Result<()> {
    if !replace && fs::read_dir(out).is_ok_and(|mut e| e.next().is_some()) {
        bail!(
            "{} exists and is not empty; remove it or pass --replace",
            out.display()
        );
    }
    let staging = out.with_file_name(format!(
        ".{}.staging-{}",
        out.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("debian-rootfs"),
        std::process::id()
    ));
    util::remove_if_exists(&staging)?;
    if let Some(parent) = staging.parent() {
        fs::create_dir_all(parent)?;
    }
    let started = std::time::Instant::now();
    let mut cmd = Command::new("mmdebstrap");
    cmd.env("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)
        .args(["--variant=minbase", "--mode=root", "--format=directory"])
        .arg(format!("--include={}", PACKAGES.join(",")));
    for path in EXCLUDED {
        cmd.arg(format!("--dpkgopt=path-exclude={path}"));
    }
    cmd.arg("--dpkgopt=path-include=/usr/share/locale/locale.alias")
        // Enabled as presets would on a first boot: the image has no first boot of its own.
        .arg("--customize-hook=chroot \"$1\" systemctl enable systemd-networkd.service")
        .arg("--customize-hook=chroot \"$1\" systemctl mask systemd-boot-update.service")
        // e2fsprogs' reaper of LVM snapshots (there is no LVM here) runs with SCHED_IDLE and is
        // wanted by multi-user.target: on a busy single vCPU it held the target back for
        // minutes.
        .arg(format!(
            "--customize-hook=chroot \"$1\" systemctl mask {}",
            MASKED_E2SCRUB.join(" ")
        ))
        .arg("--customize-hook=chroot \"$1\" dpkg-query -W -f '${Package} ${Version}\\n' > \"$1/.packages\"")
        .arg(SUITE)
        .arg(&staging)
        .arg(MIRROR);
    util::run(&mut cmd).context("mmdebstrap (apt-get install -y mmdebstrap; run as root)")?;
    finish(&staging, slate_bin)?;
    let packages = staging.join(".packages");
    let listing = out.with_extension("packages");
    fs::rename(&packages, &listing)
        .with_context(|| format!("moving the package list to {}", listing.display()))?;
    if replace {
        util::remove_if_exists(out)?;
    }
    fs::rename(&staging, out).with_context(|| format!("renaming into {}", out.display()))?;
    println!(
        "debian-rootfs: {} ({} packages, listed in {}) in {:.0} s",
        out.display(),
        fs::read_to_string(&listing)?.lines().count(),
        listing.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What a slate image needs beyond Debian's packages.
fn finish(root: &Path, slate_bin: &Path) -> Result<()> {
    let write = |rel: &str, text: &str, mode: u32| -> Result<()> {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        util::remove_if_exists(&path)?;
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    write("etc/machine-id", "uninitialized\n", 0o444)?;
    write("etc/systemd/network/20-dhcp.network", NETWORK, 0o644)?;
    write("etc/hostname", "debian-slate\n", 0o644)?;
    let slate = root.join("usr/bin/slate");
    fs::copy(slate_bin, &slate)
        .with_context(|| format!("copying {} into the root", slate_bin.display()))?;
    fs::set_permissions(&slate, fs::Permissions::from_mode(0o755))?;
    // The image's own setup hook: what a reset of /etc runs first.
    write("usr/lib/slate/setup.d/10-stamp", IMAGE_HOOK, 0o755)?;
    write("usr/lib/slate/var-boots", VAR_BOOTS_SCRIPT, 0o755)?;
    for (name, text) in [
        ("boot-entries-before.service", BOOT_ENTRIES_BEFORE),
        ("boot-entries-after.service", BOOT_ENTRIES_AFTER),
        ("var-boots.service", VAR_BOOTS),
        ("multi-user-reached.service", MULTI_USER_REACHED),
    ] {
        write(&format!("usr/lib/systemd/system/{name}"), text, 0o644)?;
        // Enabled by the image (a vendor link), not by /etc, which a reset rebuilds.
        let link = root
            .join("usr/lib/systemd/system/multi-user.target.wants")
            .join(name);
        fs::create_dir_all(link.parent().unwrap_or(root))?;
        util::remove_if_exists(&link)?;
        std::os::unix::fs::symlink(format!("../{name}"), &link)?;
    }
    // Empty: EPHEMERAL is mounted over /var, and systemd-tmpfiles makes what systemd needs;
    // /dev is devtmpfs (mmdebstrap leaves device nodes, which a squashfs root does not carry).
    for dir in ["var", "dev"] {
        let path = root.join(dir);
        fs::remove_dir_all(&path).with_context(|| format!("emptying {}", path.display()))?;
        fs::create_dir(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    }
    fs::create_dir_all(root.join("system/state"))?;
    Ok(())
}

/// What the root is made from: a root built from anything else is built again by [`ensure`].
fn recipe() -> String {
    format!(
        "{SUITE} {MIRROR} {SOURCE_DATE_EPOCH} {} {} {NETWORK:?} {IMAGE_HOOK:?} \
         {BOOT_ENTRIES_BEFORE:?} {BOOT_ENTRIES_AFTER:?} {VAR_BOOTS:?} {VAR_BOOTS_SCRIPT:?} {MULTI_USER_REACHED:?} mask systemd-boot-update {}\n",
        PACKAGES.join(","),
        EXCLUDED.join(","),
        MASKED_E2SCRUB.join(",")
    )
}

/// `xtask vm-prep`: the root at `out`, built when missing or made from another recipe, and
/// `slate_bin` copied into it (the static slate changes far more often than Debian's packages).
pub fn ensure(out: &Path, slate_bin: &Path) -> Result<()> {
    let stamp = out.with_extension("recipe");
    let current = fs::read_to_string(&stamp).ok();
    if current.as_deref() != Some(recipe().as_str())
        || !out.join("usr/lib/systemd/systemd").exists()
    {
        debian_rootfs(out, slate_bin, true)?;
        fs::write(&stamp, recipe())?;
        return Ok(());
    }
    let slate = out.join("usr/bin/slate");
    if fs::read(&slate).ok() != Some(fs::read(slate_bin)?) {
        util::remove_if_exists(&slate)?;
        fs::copy(slate_bin, &slate)
            .with_context(|| format!("copying {} into the root", slate_bin.display()))?;
        fs::set_permissions(&slate, fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// Where `xtask vm-prep` and the scenario keep the Debian root.
pub fn default_out() -> PathBuf {
    util::repo_root().join("target/debian/rootfs")
}
