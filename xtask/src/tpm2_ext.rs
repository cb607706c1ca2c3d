//! `xtask tpm2-ext`: the `tpm2` system extension (issue 40) — Debian's cryptsetup and
//! tpm2-tools with every shared library the base root lacks, and the TCTI library
//! `libtss2-tctildr` opens at run time (`libtss2-tcti-device`, the kernel's `/dev/tpmrm0`) —
//! made into a signed extension with `slate imager extension` under `target/tpm2/ext/`.
//!
//! An extension, not part of the base root: the demo root stays as it is (and its UKI as
//! small) for every image that has no use for a TPM. slate is a static binary and
//! libcryptsetup has no static library, so a `tpm2` /var runs these programs
//! (ARCHITECTURE.md, "Hand-written formats, and why" has the choice).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context as _, Result};

use crate::util::{self, output, repo_root, run};

/// The Debian packages unpacked into `.cache/tpm2/<package>/`: the two programs' packages and
/// those holding their libraries' closure (checked below: a library found in none fails the
/// build, never falls back to the build host's).
const PACKAGES: &[&str] = &[
    "cryptsetup-bin",
    "libcryptsetup12",
    "libpopt0",
    "libdevmapper1.02.1",
    "libssl3",
    "libargon2-1",
    "libjson-c5",
    "libselinux1",
    "libudev1",
    "libpcre2-8-0",
    "libc6",
    "tpm2-tools",
    "libtss2-esys-3.0.2-0",
    "libtss2-mu0",
    "libtss2-rc0",
    "libtss2-sys1",
    "libtss2-tctildr0",
    "libtss2-tcti-device0",
    // tpm2-tools links libcurl (for tpm2_getekcertificate, which slate never runs); its
    // closure is the bulk of the extension.
    "libcurl3-gnutls",
    "libbrotli1",
    "libffi8",
    "libgmp10",
    "libgnutls30",
    "libgssapi-krb5-2",
    "libhogweed6",
    "libidn2-0",
    "libk5crypto3",
    "libkeyutils1",
    "libkrb5-3",
    "libkrb5support0",
    "libldap-2.5-0",
    "libnettle8",
    "libnghttp2-14",
    "libp11-kit0",
    "libpsl5",
    "librtmp1",
    "libsasl2-2",
    "libssh2-1",
    "libtasn1-6",
    "libunistring2",
    "zlib1g",
    "libzstd1",
];

/// The programs: path inside the unpacked packages, and in the image (where the image contract
/// says a node runs them).
const PROGRAMS: &[(&str, &str)] = &[
    ("sbin/cryptsetup", "usr/sbin/cryptsetup"),
    ("usr/bin/tpm2", "usr/bin/tpm2"),
];

/// tpm2-tools' names slate runs: links to the multi-call `tpm2`, as Debian installs them.
const TPM2_LINKS: &[&str] = &[
    "tpm2_createprimary",
    "tpm2_createpolicy",
    "tpm2_create",
    "tpm2_load",
    "tpm2_unseal",
    "tpm2_flushcontext",
    "tpm2_pcrread",
];

/// Opened by name at run time (`dlopen`), so no `DT_NEEDED` names it: the TCTI for
/// `device:/dev/tpmrm0`.
const DLOPENED: &[&str] = &["libtss2-tcti-device.so.0"];

const LIB_DIRS: &[&str] = &["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"];

/// Build the extension at `version`; returns its path.
pub fn tpm2_ext(version: &str, slate: &Path) -> Result<PathBuf> {
    let trees = util::unpacked_packages(&repo_root().join(".cache/tpm2"), PACKAGES)?;
    let find = |rel: &str| -> Result<PathBuf> {
        trees
            .iter()
            .find_map(|t| util::resolve_in(t, Path::new(rel)))
            .with_context(|| format!("no {rel} in the unpacked {PACKAGES:?}"))
    };
    let work = repo_root().join("target/tpm2");
    let tree = work.join(format!("tree-{version}"));
    util::remove_if_exists(&tree)?;
    for dir in ["usr/bin", "usr/sbin", "lib/x86_64-linux-gnu"] {
        fs::create_dir_all(tree.join(dir))?;
    }
    let copy = |from: &Path, to: &Path| -> Result<()> {
        fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        fs::set_permissions(to, fs::Permissions::from_mode(0o755))?;
        Ok(())
    };
    for (from, to) in PROGRAMS {
        copy(&find(from)?, &tree.join(to))?;
    }
    for link in TPM2_LINKS {
        symlink("tpm2", tree.join("usr/bin").join(link))?;
    }
    let base = base_libs()?;
    let libdir = tree.join("lib/x86_64-linux-gnu");
    let mut dlopened = Vec::new();
    for lib in DLOPENED {
        let from = LIB_DIRS
            .iter()
            .find_map(|d| find(&format!("{d}/{lib}")).ok())
            .with_context(|| format!("no {lib} in the unpacked packages"))?;
        copy(&from, &libdir.join(lib))?;
        dlopened.push(libdir.join(lib));
    }
    // The closure of every program and dlopen'ed library, resolved against the unpacked
    // packages: what the base root has stays out, the rest is copied.
    let search: Vec<String> = trees
        .iter()
        .flat_map(|t| LIB_DIRS.iter().map(move |d| t.join(d)))
        .filter(|d| d.is_dir())
        .map(|d| d.display().to_string())
        .collect();
    let loader = base.join("ld-linux-x86-64.so.2");
    let mut copied = BTreeSet::new();
    let objects: Vec<PathBuf> = PROGRAMS
        .iter()
        .map(|(_, to)| tree.join(to))
        .chain(dlopened)
        .collect();
    for object in &objects {
        let list = output(
            Command::new(&loader)
                .arg("--library-path")
                .arg(search.join(":"))
                .arg("--list")
                .arg(object),
        )?;
        for line in list.lines().filter(|l| l.contains("=>")) {
            let name = line.split("=>").next().unwrap_or("").trim().to_owned();
            let target = line.split("=>").nth(1).unwrap_or("").trim();
            let path = target.split(" (").next().unwrap_or("").trim();
            if base.join(&name).exists() {
                continue;
            }
            ensure!(
                trees
                    .iter()
                    .any(|t| path.starts_with(&*t.to_string_lossy())),
                "{} needs {name}, which no unpacked package has: {}",
                object.display(),
                line.trim()
            );
            if !copied.insert(name.clone()) {
                continue;
            }
            copy(Path::new(path), &libdir.join(&name))?;
        }
    }
    check_libraries(&tree, &base, &objects)?;
    let bytes = dir_bytes(&tree)?;
    println!(
        "tpm2 extension tree: cryptsetup, tpm2-tools, {} libraries ({} KiB)",
        copied.len() + DLOPENED.len(),
        bytes / 1024
    );
    let out = work.join("ext");
    run(Command::new(slate)
        .args([
            "imager",
            "extension",
            "--name",
            "tpm2",
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
    Ok(out.join(format!("tpm2-{version}.ext")))
}

/// The base root's library directory (made by `xtask vm-prep` or `base-rootfs`).
fn base_libs() -> Result<PathBuf> {
    let base = repo_root().join("target/demo/rootfs/lib/x86_64-linux-gnu");
    ensure!(
        base.join("ld-linux-x86-64.so.2").exists(),
        "{} is missing: run `xtask vm-prep` (or base-rootfs) first",
        base.display()
    );
    Ok(fs::canonicalize(base)?)
}

/// Every library each object needs resolves in the base root or the extension, with the
/// base root's loader and nothing else on the path (as on the node).
fn check_libraries(tree: &Path, base: &Path, objects: &[PathBuf]) -> Result<()> {
    let tree = fs::canonicalize(tree)?;
    for object in objects {
        let list = output(
            Command::new(base.join("ld-linux-x86-64.so.2"))
                .arg("--library-path")
                .arg(format!(
                    "{}:{}",
                    tree.join("lib/x86_64-linux-gnu").display(),
                    base.display()
                ))
                .arg("--list")
                .arg(object),
        )?;
        for line in list.lines().filter(|l| l.contains("=>")) {
            let target = line.split("=>").nth(1).unwrap_or("").trim();
            ensure!(
                target.starts_with(&*tree.to_string_lossy())
                    || target.starts_with(&*base.to_string_lossy()),
                "{} needs a library neither the base root nor the extension has: {}",
                object.display(),
                line.trim()
            );
        }
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
