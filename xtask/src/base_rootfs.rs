//! `xtask base-rootfs`: a minimal root filesystem directory for VM images: Debian's static
//! busybox with applet symlinks, e2fsprogs' `mke2fs`, `e2fsck` and `tune2fs` with the shared
//! libraries they need, `/etc/os-release`, the mount-point directories, and optionally the
//! `slate` binary at `/usr/bin/slate`.
//!
//! Deterministic: the same busybox package, version and slate binary give the same tree
//! (names, contents, modes, link targets); timestamps are not meaningful because the squashfs
//! builder replaces them with SOURCE_DATE_EPOCH.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::util::{self, output};

/// Applets linked in `/bin`: what `init`, scripts and an operator at the serial console use.
const APPLETS: &[&str] = &[
    "awk",
    "cat",
    "chmod",
    "chown",
    "chroot",
    "cp",
    "cut",
    "date",
    "dd",
    "df",
    "dmesg",
    "echo",
    "env",
    "false",
    "find",
    "free",
    "grep",
    "halt",
    "head",
    "hostname",
    // The demo profile's workload: a web server (`[[services]]` web).
    "httpd",
    "id",
    "insmod",
    "ip",
    "kill",
    "less",
    "ln",
    "ls",
    "lsmod",
    "mkdir",
    "mknod",
    "modprobe",
    "mount",
    "mv",
    "poweroff",
    "ps",
    "pwd",
    "readlink",
    "reboot",
    "rm",
    "rmdir",
    "sed",
    "sh",
    "sleep",
    "sort",
    "stat",
    "switch_root",
    "sync",
    "tail",
    "tee",
    "test",
    "touch",
    "tr",
    "true",
    "umount",
    "udhcpc",
    "uname",
    "vi",
    "wc",
    "which",
];

/// Empty directories and their modes (`/tmp` is world-writable and sticky like everywhere).
const DIRS: &[(&str, u32)] = &[
    ("bin", 0o755),
    ("dev", 0o755),
    ("etc", 0o755),
    // e2fsprogs' shared libraries and the dynamic loader (Debian's multiarch paths, which the
    // loader searches without an ld.so.cache).
    ("lib", 0o755),
    ("lib/x86_64-linux-gnu", 0o755),
    ("lib64", 0o755),
    ("mnt", 0o755),
    ("proc", 0o555),
    ("root", 0o700),
    ("run", 0o755),
    ("sys", 0o555),
    // Mount points machined needs on the read-only root: STATE, and the firmware variables.
    ("system", 0o755),
    ("system/state", 0o700),
    ("tmp", 0o1777),
    ("usr", 0o755),
    ("usr/bin", 0o755),
    ("usr/lib", 0o755),
    ("usr/lib/slate", 0o755),
    // The image's setup hooks: machined runs them after each reset of /etc.
    ("usr/lib/slate/setup.d", 0o755),
    ("var", 0o755),
];

pub fn base_rootfs(
    out: &Path,
    version: &str,
    slate_bin: Option<&Path>,
    replace: bool,
) -> Result<()> {
    // os-release values are shell-quoted strings; keep the version to a safe alphabet so it
    // can also be used in file names (UKI names carry it).
    ensure!(
        !version.is_empty()
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._+~-".contains(c)),
        "--version {version:?} must be non-empty ASCII letters, digits and ._+~-"
    );
    // Absolute from here on: the root's own loader lists e2fsprogs' libraries, and a loader
    // run by a relative path names itself relatively — outside the root, by the check below
    // (`--out rootfs` failed with "mke2fs needs a library the root lacks", issue 44).
    let out =
        &std::path::absolute(out).with_context(|| format!("making {} absolute", out.display()))?;
    // Built beside `out` and swapped in whole: scenarios started from other shells (and their
    // image builds, which read `out`) never see a half-made root.
    let final_out = out.as_path();
    if !replace && fs::read_dir(final_out).is_ok_and(|mut e| e.next().is_some()) {
        bail!(
            "{} exists and is not empty; remove it or pass --replace",
            final_out.display()
        );
    }
    let staging = final_out.with_file_name(format!(
        ".{}.staging-{}",
        final_out
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("rootfs"),
        std::process::id()
    ));
    util::remove_if_exists(&staging)?;
    prepare_out(&staging, true)?;
    let out = staging.as_path();
    let busybox = busybox_binary()?;

    for (dir, mode) in DIRS {
        let path = out.join(dir);
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        // Explicit modes: the umask of whoever runs xtask must not change the image.
        set_mode(&path, *mode)?;
    }
    // Merged-/usr style: applets live in /bin, and /sbin is the same directory.
    symlink("bin", out.join("sbin")).context("linking /sbin")?;

    let target = out.join("bin/busybox");
    fs::copy(&busybox, &target)
        .with_context(|| format!("copying {} to {}", busybox.display(), target.display()))?;
    set_mode(&target, 0o755)?;

    let available = output(Command::new(&busybox).arg("--list"))?;
    let available: Vec<&str> = available.lines().collect();
    for applet in APPLETS {
        ensure!(
            !E2FSPROGS.contains(applet),
            "busybox's {applet} would shadow e2fsprogs' (it makes ext2 without a journal)"
        );
        ensure!(
            available.contains(applet),
            "busybox at {} has no applet {applet}",
            busybox.display()
        );
        symlink("busybox", out.join("bin").join(applet))
            .with_context(|| format!("linking /bin/{applet}"))?;
    }

    let e2fsprogs_bytes = install_e2fsprogs(out)?;

    let os_release = format!(
        "NAME=slate\nID=slate\nVERSION=\"{version}\"\nVERSION_ID=\"{version}\"\n\
         PRETTY_NAME=\"slate {version}\"\n"
    );
    fs::write(out.join("etc/os-release"), os_release).context("writing /etc/os-release")?;
    set_mode(&out.join("etc/os-release"), 0o644)?;

    // The root's PID 1 until machined takes its place: it proves which root was switched to by
    // printing the version the imager wrote into this root's os-release, then powers off.
    let init = out.join("bin/init");
    fs::write(&init, DEMO_INIT).context("writing /bin/init")?;
    set_mode(&init, 0o755)?;

    // busybox's DHCP client hands the lease to a script; this one applies it with `ip`.
    let udhcpc = out.join("usr/share/udhcpc");
    fs::create_dir_all(&udhcpc).context("creating /usr/share/udhcpc")?;
    fs::write(udhcpc.join("default.script"), UDHCPC_SCRIPT).context("writing default.script")?;
    set_mode(&udhcpc.join("default.script"), 0o755)?;

    // What the demo's web service serves: a page, and the running version's os-release (a
    // link: the page follows the root it is served from, not the one this tree was built as).
    let www = out.join("usr/share/slate/www");
    fs::create_dir_all(&www).context("creating /usr/share/slate/www")?;
    set_mode(&www, 0o755)?;
    fs::write(www.join("index.html"), DEMO_PAGE).context("writing index.html")?;
    set_mode(&www.join("index.html"), 0o644)?;
    symlink("/etc/os-release", www.join("os-release")).context("linking www/os-release")?;

    // A file a profile's health check can name (`file = "/usr/lib/slate/healthy"`): present
    // in every demo root, so a root that lost it fails its check.
    let healthy = out.join("usr/lib/slate/healthy");
    fs::write(&healthy, "").context("writing /usr/lib/slate/healthy")?;
    set_mode(&healthy, 0o644)?;

    for (name, script) in SETUP_HOOKS {
        let hook = out.join("usr/lib/slate/setup.d").join(name);
        fs::write(&hook, script).with_context(|| format!("writing setup hook {name}"))?;
        set_mode(&hook, 0o755)?;
    }

    if let Some(slate) = slate_bin {
        let target = out.join("usr/bin/slate");
        fs::copy(slate, &target)
            .with_context(|| format!("copying {} to {}", slate.display(), target.display()))?;
        set_mode(&target, 0o755)?;
        // The real PID 1 of the booted root: slate under the name machined (argv[0] picks the
        // role).
        symlink("slate", out.join("usr/bin/machined")).context("linking /usr/bin/machined")?;
        println!("  /usr/bin/slate from {}", slate.display());
    }
    swap_in(&staging, final_out)?;
    println!(
        "base rootfs at {} (version {version}, busybox with {} applets, {} with their \
         libraries: {} KiB)",
        final_out.display(),
        APPLETS.len(),
        E2FSPROGS.join(", "),
        e2fsprogs_bytes / 1024
    );
    Ok(())
}

/// The demo web service's page.
const DEMO_PAGE: &str = "<!doctype html>\n<title>slate demo node</title>\n<p>A workload on a \
slate node. Its version: <a href=\"os-release\">os-release</a>.</p>\n";

const DEMO_INIT: &str = r#"#!/bin/sh
. /etc/os-release
while read -r dev mnt fstype rest; do
  [ "$mnt" = / ] && root_fs=$fstype
done < /proc/mounts
echo "SLATE-ROOT-OK name=$ID version=$IMAGE_VERSION rootfs=$root_fs"
poweroff -f
"#;

/// The demo's setup hooks (`/usr/lib/slate/setup.d`): the VM tests read their lines on the
/// console and the stamp in /etc; `slate.debug.fail-hook` on the kernel command line makes
/// `20-check` fail (fault injection, as `slate.debug.fail-task`).
const SETUP_HOOKS: &[(&str, &str)] = &[
    (
        "10-stamp",
        r#"#!/bin/sh
. /etc/os-release
echo "$VERSION_ID" > /etc/slate-setup-stamp
echo "setup: 10-stamp wrote /etc/slate-setup-stamp"
"#,
    ),
    (
        "20-check",
        r#"#!/bin/sh
echo "setup: 20-check ran"
for arg in $(cat /proc/cmdline); do
  [ "${arg%%=*}" = slate.debug.fail-hook ] && { echo "setup: 20-check fails (slate.debug.fail-hook)"; exit 1; }
done
exit 0
"#,
    ),
];

const UDHCPC_SCRIPT: &str = r#"#!/bin/sh
case "$1" in
  deconfig) ip addr flush dev "$interface"; ip link set "$interface" up ;;
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    [ -n "$router" ] && ip route replace default via "${router%% *}" dev "$interface"
    ;;
esac
exit 0
"#;

/// Replaces `out` by the finished `staging` (two renames; the old tree is removed after).
fn swap_in(staging: &Path, out: &Path) -> Result<()> {
    let old = staging.with_extension("old");
    util::remove_if_exists(&old)?;
    if out.exists() {
        fs::rename(out, &old).with_context(|| format!("moving {} aside", out.display()))?;
    }
    fs::rename(staging, out)
        .with_context(|| format!("moving the new root to {}", out.display()))?;
    util::remove_if_exists(&old)
}

fn prepare_out(out: &Path, replace: bool) -> Result<()> {
    match fs::read_dir(out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
        Ok(mut entries) => {
            if entries.next().is_some() {
                if !replace {
                    bail!(
                        "{} exists and is not empty; remove it or pass --replace",
                        out.display()
                    );
                }
                util::remove_if_exists(out)?;
            }
        }
    }
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    set_mode(out, 0o755)
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting mode {mode:o} on {}", path.display()))
}

/// `bin/busybox` from the `busybox-static` package, unpacked once into
/// `<repo>/.cache/busybox/` (re-unpacked when apt's candidate version changes).
fn busybox_binary() -> Result<PathBuf> {
    let cache = util::repo_root().join(".cache/busybox");
    let version = util::candidate_version("busybox-static")?;
    let stamp = cache.join("STAMP");
    let stamp_text = format!("busybox-static {version}\n");
    let binary = cache.join("root/bin/busybox");
    if !(fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text) && binary.is_file()) {
        println!("unpacking busybox-static {version}");
        let deb = util::download_deb("busybox-static", &version, &cache.join("debs"))?;
        util::unpack_deb(&deb, &cache.join("root"))?;
        ensure!(binary.is_file(), "busybox-static has no bin/busybox");
        util::write_atomic(&stamp, &stamp_text)?;
    }
    Ok(binary)
}

/// e2fsprogs' programs in `/bin` (= `/sbin`): machined formats STATE and EPHEMERAL as journaled
/// ext4 with `mke2fs`, checks them with `e2fsck -p` before each mount, and adds a journal to an
/// older node's ext2 with `tune2fs -j` (docs/node.md, "Volumes"). Debian has no static build of
/// mke2fs, so they are Debian's dynamically linked ones with the libraries below.
const E2FSPROGS: &[&str] = &["mke2fs", "e2fsck", "tune2fs"];

/// The Debian packages that hold them, their shared libraries and the dynamic loader.
const E2FSPROGS_PACKAGES: &[&str] = &[
    "e2fsprogs",
    "libext2fs2",
    "libcom-err2",
    "libblkid1",
    "libuuid1",
    "libc6",
];

/// Their `DT_NEEDED` closure (checked below with the loader's `--list`).
const E2FSPROGS_LIBS: &[&str] = &[
    "libext2fs.so.2",
    "libe2p.so.2",
    "libcom_err.so.2",
    "libblkid.so.1",
    "libuuid.so.1",
    "libc.so.6",
];

/// The program interpreter the binaries name: `/lib64/ld-linux-x86-64.so.2`.
const LOADER: &str = "ld-linux-x86-64.so.2";

/// Copy e2fsprogs' programs, `/etc/mke2fs.conf` (so the node's `-t ext4` means what the
/// build host's does), the libraries and the loader into `out`, then check with the copied
/// loader that every library resolves inside `out`. Returns the bytes added.
fn install_e2fsprogs(out: &Path) -> Result<u64> {
    let trees = e2fsprogs_trees()?;
    let find = |dirs: &[&str], name: &str| -> Result<PathBuf> {
        trees
            .iter()
            .flat_map(|tree| {
                dirs.iter()
                    .map(move |dir| (tree, Path::new(dir).join(name)))
            })
            .find_map(|(tree, rel)| util::resolve_in(tree, &rel))
            .with_context(|| format!("no {name} in the unpacked {E2FSPROGS_PACKAGES:?}"))
    };
    let mut bytes = 0;
    let mut copy = |from: &Path, to: &Path, mode: u32| -> Result<()> {
        fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        set_mode(to, mode)?;
        bytes += fs::metadata(to)?.len();
        Ok(())
    };
    for program in E2FSPROGS {
        let from = find(&["sbin", "usr/sbin"], program)?;
        copy(&from, &out.join("bin").join(program), 0o755)?;
    }
    copy(
        &find(&["etc"], "mke2fs.conf")?,
        &out.join("etc/mke2fs.conf"),
        0o644,
    )?;
    let libdir = out.join("lib/x86_64-linux-gnu");
    let lib_dirs = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"];
    for lib in E2FSPROGS_LIBS.iter().chain([&LOADER]) {
        copy(&find(&lib_dirs, lib)?, &libdir.join(lib), 0o755)?;
    }
    symlink(
        format!("../lib/x86_64-linux-gnu/{LOADER}"),
        out.join("lib64").join(LOADER),
    )
    .context("linking /lib64/ld-linux-x86-64.so.2")?;
    // Every library each program needs resolves to a copy in `out` (a missing one would fall
    // back to the build host's and pass unnoticed).
    let out_abs = fs::canonicalize(out)?;
    for program in E2FSPROGS {
        let list = output(
            Command::new(libdir.join(LOADER))
                .arg("--library-path")
                .arg(out_abs.join("lib/x86_64-linux-gnu"))
                .arg("--list")
                .arg(out.join("bin").join(program)),
        )?;
        for line in list.lines().filter(|l| l.contains("=>")) {
            let target = line.split("=>").nth(1).unwrap_or("").trim();
            ensure!(
                target.starts_with(out_abs.to_string_lossy().as_ref()),
                "{program} needs a library the root lacks: {}",
                line.trim()
            );
        }
    }
    Ok(bytes)
}

/// [`E2FSPROGS_PACKAGES`] at apt's candidate versions, each unpacked once into
/// `<repo>/.cache/e2fsprogs/<package>/` (re-unpacked when a candidate version changes).
fn e2fsprogs_trees() -> Result<Vec<PathBuf>> {
    util::unpacked_packages(
        &util::repo_root().join(".cache/e2fsprogs"),
        E2FSPROGS_PACKAGES,
    )
}
