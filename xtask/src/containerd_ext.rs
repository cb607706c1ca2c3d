//! `xtask containerd-ext`: the `containerd` system extension (issue 38) — Debian's containerd
//! and runc with the libraries the base root lacks, a containerd configuration, the web
//! container's OCI archive and its service wrapper — made into a signed extension with
//! `slate imager extension` under `target/containerd/ext/`.
//!
//! The container archive lives in the extension, not in the base root: the base stays the
//! demo's (the same image with and without containerd), and the archive only means something
//! where ctr can import it.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context as _, Result};

use crate::oci_archive::{write_web_image, WEB_IMAGE_TAG};
use crate::util::{self, output, repo_root, run};

/// The Debian packages unpacked into `.cache/containerd/<package>/`.
const PACKAGES: &[&str] = &["containerd", "runc", "libseccomp2", "busybox-static"];

/// The programs the extension carries, from the unpacked packages (path inside them).
const PROGRAMS: &[&str] = &[
    "usr/bin/containerd",
    "usr/bin/containerd-shim-runc-v2",
    "usr/bin/ctr",
    "usr/sbin/runc",
];

/// What runc needs beyond the base root's glibc.
const LIBS: &[&str] = &["libseccomp.so.2"];

/// The image name `ctr images import --base-name` gives the archive (`<name>:<tag>`).
pub const WEB_IMAGE_NAME: &str = "slate.local/web";

/// The port the web container listens on: 8080 (the VM forwards it), or another for a
/// version whose container never becomes ready.
pub fn containerd_ext(version: &str, web_port: u16, slate: &Path) -> Result<PathBuf> {
    let trees = unpacked()?;
    let find = |rel: &str| -> Result<PathBuf> {
        trees
            .iter()
            .find_map(|t| resolve_in(t, Path::new(rel)))
            .with_context(|| format!("no {rel} in the unpacked {PACKAGES:?}"))
    };
    let work = repo_root().join("target/containerd");
    let tree = work.join(format!("tree-{version}"));
    util::remove_if_exists(&tree)?;
    for dir in [
        "usr/bin",
        "usr/sbin",
        "usr/libexec/slate",
        "usr/share/slate/containerd",
        "usr/share/slate/containers",
        "lib/x86_64-linux-gnu",
    ] {
        fs::create_dir_all(tree.join(dir))?;
    }
    let copy = |from: &Path, to: &Path, mode: u32| -> Result<()> {
        fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    for program in PROGRAMS {
        copy(&find(program)?, &tree.join(program), 0o755)?;
    }
    for lib in LIBS {
        let rel = format!("usr/lib/x86_64-linux-gnu/{lib}");
        let from = find(&rel).or_else(|_| find(&format!("lib/x86_64-linux-gnu/{lib}")))?;
        copy(&from, &tree.join("lib/x86_64-linux-gnu").join(lib), 0o755)?;
    }
    check_libraries(&tree)?;
    fs::write(
        tree.join("usr/share/slate/containerd/config.toml"),
        CONTAINERD_CONFIG,
    )?;
    write_web_image(
        &find("bin/busybox")?,
        &tree.join("usr/share/slate/containers/web.tar"),
    )?;
    let wrapper = tree.join("usr/libexec/slate/web");
    fs::write(
        &wrapper,
        WEB_WRAPPER
            .replace("@VERSION@", version)
            .replace("@PORT@", &web_port.to_string())
            .replace("@IMAGE@", &format!("{WEB_IMAGE_NAME}:{WEB_IMAGE_TAG}"))
            .replace("@NAME@", WEB_IMAGE_NAME),
    )?;
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755))?;
    symlink("../sbin/runc", tree.join("usr/bin/runc"))?;
    // `ctr run --net-host` bind-mounts the node's /etc/hosts and /etc/resolv.conf into the
    // container; the demo root has neither (runc: `stat /etc/hosts: no such file or
    // directory`). In the extension's /etc they are the overlay's lowest layer: a node's own
    // (DHCP's resolv.conf) still wins.
    fs::create_dir_all(tree.join("etc"))?;
    fs::write(
        tree.join("etc/hosts"),
        "127.0.0.1 localhost\n::1 localhost\n",
    )?;
    fs::write(tree.join("etc/resolv.conf"), "")?;

    let out = work.join("ext");
    run(Command::new(slate)
        .args([
            "imager",
            "extension",
            "--name",
            "containerd",
            "--version",
            version,
        ])
        .arg("--tree")
        .arg(&tree)
        .arg("--key")
        .arg(repo_root().join("target/demo/keys/slate.key"))
        .arg("--output")
        .arg(&out)
        .env("SOURCE_DATE_EPOCH", "0"))?;
    Ok(out.join(format!("containerd-{version}.ext")))
}

/// Every library the programs need resolves in the base root or the extension (checked with
/// the base root's loader; a missing one would fall back to the build host's unnoticed).
fn check_libraries(tree: &Path) -> Result<()> {
    let base = repo_root().join("target/demo/rootfs/lib/x86_64-linux-gnu");
    let loader = base.join("ld-linux-x86-64.so.2");
    ensure!(
        loader.exists(),
        "{} is missing: run `xtask vm-prep` (or base-rootfs) first",
        loader.display()
    );
    let tree = fs::canonicalize(tree)?;
    let base = fs::canonicalize(&base)?;
    for program in PROGRAMS {
        let list = output(
            Command::new(&loader)
                .arg("--library-path")
                .arg(format!(
                    "{}:{}",
                    tree.join("lib/x86_64-linux-gnu").display(),
                    base.display()
                ))
                .arg("--list")
                .arg(tree.join(program)),
        )
        .unwrap_or_default(); // a static Go binary: "not a dynamic executable"
        for line in list.lines().filter(|l| l.contains("=>")) {
            let target = line.split("=>").nth(1).unwrap_or("").trim();
            ensure!(
                target.starts_with(&*tree.to_string_lossy())
                    || target.starts_with(&*base.to_string_lossy()),
                "{program} needs a library neither the base root nor the extension has: {}",
                line.trim()
            );
        }
    }
    Ok(())
}

/// `rel` inside `tree`, following symlinks inside it.
fn resolve_in(tree: &Path, rel: &Path) -> Option<PathBuf> {
    let mut path = tree.join(rel);
    for _ in 0..8 {
        let meta = fs::symlink_metadata(&path).ok()?;
        if !meta.file_type().is_symlink() {
            return meta.is_file().then_some(path);
        }
        let target = fs::read_link(&path).ok()?;
        path = match target.strip_prefix("/") {
            Ok(absolute) => tree.join(absolute),
            Err(_) => path.parent()?.join(target),
        };
    }
    None
}

/// [`PACKAGES`] at apt's candidate versions, unpacked once each.
fn unpacked() -> Result<Vec<PathBuf>> {
    let cache = repo_root().join(".cache/containerd");
    let mut trees = Vec::new();
    for package in PACKAGES {
        let version = util::candidate_version(package)?;
        let tree = cache.join(package);
        let stamp = cache.join(format!("{package}.STAMP"));
        let stamp_text = format!("{package} {version}\n");
        if !(fs::read_to_string(&stamp).is_ok_and(|s| s == stamp_text) && tree.is_dir()) {
            println!("unpacking {package} {version}");
            let deb = util::download_deb(package, &version, &cache.join("debs"))?;
            util::unpack_deb(&deb, &tree)?;
            util::write_atomic(&stamp, &stamp_text)?;
        }
        trees.push(tree);
    }
    Ok(trees)
}

/// containerd without the CRI plugin or snapshotters the node has no use for; its state on
/// /var (persistent) and /run (per boot).
const CONTAINERD_CONFIG: &str = r#"# The containerd extension's configuration (xtask containerd-ext, issue 38).
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.internal.v1.opt",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "/run/containerd/containerd.sock"
"#;

/// The `web` service: notes this start on /var (the page), imports the archive once,
/// removes a container a kill left behind, and runs the container in the foreground: `ctr`
/// forwards the stop signal, and the container's shell ends httpd on it.
const WEB_WRAPPER: &str = r#"#!/bin/sh
# The web container as a service of the node (xtask containerd-ext, issue 38).
set -u
ctr="ctr -n slate"
mkdir -p /var/lib/web
. /etc/os-release
echo "start: image ${IMAGE_VERSION:-?} extension containerd @VERSION@ port @PORT@ boot $(cat /proc/sys/kernel/random/boot_id)" >> /var/lib/web/index.html
if ! $ctr images ls -q | grep -qx '@IMAGE@'; then
    echo "web: importing @IMAGE@"
    $ctr images import --base-name @NAME@ /usr/share/slate/containers/web.tar || exit 1
fi
if $ctr containers ls -q | grep -qx web; then
    echo "web: removing the container a previous run left"
    $ctr tasks delete --force web 2>/dev/null
    $ctr containers delete web || exit 1
fi
echo "web: running @IMAGE@ on port @PORT@"
exec $ctr run --rm --net-host \
    --mount type=bind,src=/var/lib/web,dst=/data,options=rbind:rw \
    @IMAGE@ web /bin/sh -c 'trap "kill \$p; exit 0" TERM; /bin/httpd -f -p @PORT@ -h /data & p=$!; wait'
"#;
