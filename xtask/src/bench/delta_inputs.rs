//! The inputs of bench-delta's pairs, copied or made under target/bench/delta/inputs so builds
//! elsewhere do not change them mid-run: the demo profile's kernel, root, slate binaries and
//! keys, and the variants the pairs change —
//!
//! - (b) the root with one 1 MiB file of random bytes added;
//! - (c) the root with Debian's libc6 of an older build (2.36-9+deb12u7, still in bookworm's
//!   archive) in place of the current one: the old version of the pair;
//! - (d) slate built again with `SLATE_BENCH_SMALL_CHANGE` set, which adds one statement to its
//!   `main` (crates/slate/src/main.rs), both as the installer and as the root's
//!   `/usr/bin/slate` (a release carries the same binary in both): the new version of the pair;
//! - (e) the kernel of the previous point release (linux-image-amd64 6.1.176-1's), unpacked
//!   like `xtask kernel`'s under .cache/bench-kernel: the old version of the pair.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util::{self, repo_root, run};

/// The libc6 build of pair (c)'s old version.
const OLD_LIBC: &str = "2.36-9+deb12u7";
/// The files of libc6 the root carries (base_rootfs copies them for e2fsprogs).
const LIBC_FILES: [&str; 2] = ["libc.so.6", "ld-linux-x86-64.so.2"];
/// The kernel of pair (e)'s old version: the package linux-image-amd64 6.1.176-1 depends on.
const OLD_KERNEL: (&str, &str) = ("linux-image-6.1.0-50-amd64", "6.1.176-1");

/// Where each input of a profile is.
#[derive(Clone)]
pub(super) struct Inputs {
    pub kernel: PathBuf,
    pub root: PathBuf,
    pub static_dir: PathBuf,
    pub keys: PathBuf,
}

impl Inputs {
    /// The demo profile with these inputs' absolute paths.
    pub fn profile(&self) -> Result<String> {
        let text = fs::read_to_string(repo_root().join("profiles/demo.toml"))?;
        let dir = |p: &Path| format!("{}/", p.display());
        Ok(text
            .replace("../.cache/kernel/", &dir(&self.kernel))
            .replace("../target/demo/rootfs", &self.root.display().to_string())
            .replace(
                "../target/static/x86_64-unknown-linux-gnu/release/",
                &dir(&self.static_dir),
            )
            .replace("../target/demo/keys/", &dir(&self.keys)))
    }
}

/// The variants' inputs under `inputs` but pair (d)'s ([`changed_slate`]): (plain, plus, old
/// libc, old kernel).
pub(super) fn prepare(inputs: &Path) -> Result<[Inputs; 4]> {
    let root = repo_root();
    let _ = fs::remove_dir_all(inputs);
    fs::create_dir_all(inputs.join("kernel"))?;
    fs::create_dir_all(inputs.join("static"))?;
    let static_dir = root.join("target/static/x86_64-unknown-linux-gnu/release");
    for (from, to) in [
        (root.join(".cache/kernel/vmlinuz"), inputs.join("kernel")),
        (root.join(".cache/kernel/modules"), inputs.join("kernel")),
        (root.join("target/demo/rootfs"), inputs.join("rootfs")),
        (root.join("target/demo/keys"), inputs.join("keys")),
        (static_dir.join("slate"), inputs.join("static")),
        (static_dir.join("slate-init"), inputs.join("static")),
    ] {
        if !from.exists() {
            bail!(
                "{} is missing: run `cargo xtask kernel`, `cargo xtask slate-static` and \
                 `cargo xtask base-rootfs` first",
                from.display()
            );
        }
        // -H: the inputs may be links (a worktree's to a checkout's), their insides not.
        run(Command::new("cp").arg("-aH").arg(&from).arg(&to))?;
    }
    let plain = Inputs {
        kernel: inputs.join("kernel"),
        root: inputs.join("rootfs"),
        static_dir: inputs.join("static"),
        keys: inputs.join("keys"),
    };
    let with = |f: &dyn Fn(&mut Inputs)| {
        let mut i = plain.clone();
        f(&mut i);
        i
    };
    let plus = with(&|i| i.root = inputs.join("rootfs-plus"));
    copy_root(&plain.root, &plus.root)?;
    fs::write(plus.root.join("root/added.bin"), random_mib(41))?;

    let old_libc = with(&|i| i.root = inputs.join("rootfs-oldlibc"));
    copy_root(&plain.root, &old_libc.root)?;
    replace_libc(&old_libc.root, &inputs.join("libc6"))?;

    let old_kernel = with(&|i| i.kernel = inputs.join("kernel-old"));
    let cache = root.join(".cache/bench-kernel");
    crate::kernel::kernel_at(&cache, OLD_KERNEL.0, OLD_KERNEL.1)?;
    fs::create_dir_all(&old_kernel.kernel)?;
    for name in ["vmlinuz", "modules"] {
        run(Command::new("cp")
            .arg("-aH")
            .arg(cache.join(name))
            .arg(&old_kernel.kernel))?;
    }
    Ok([plain, plus, old_libc, old_kernel])
}

/// Pair (d)'s new inputs: `plain` with slate built again with one statement more, as the
/// installer and in the root. Last of the
/// pairs, since it compiles: target/static is built again as it was afterwards.
pub(super) fn changed_slate(plain: &Inputs, inputs: &Path) -> Result<Inputs> {
    let mut changed = plain.clone();
    changed.static_dir = inputs.join("static-changed");
    changed.root = inputs.join("rootfs-slate");
    fs::create_dir_all(&changed.static_dir)?;
    let variant = crate::slate_static::slate_static_changed()?;
    fs::copy(&variant, changed.static_dir.join("slate"))?;
    copy_root(&plain.root, &changed.root)?;
    fs::copy(&variant, changed.root.join("usr/bin/slate"))?;
    let same = fs::read(&variant)? == fs::read(plain.static_dir.join("slate"))?;
    fs::copy(
        plain.static_dir.join("slate-init"),
        changed.static_dir.join("slate-init"),
    )?;
    // Built again as it was, so what target/static holds is the checkout's slate.
    crate::slate_static::slate_static()?;
    if same {
        bail!("slate built with SLATE_BENCH_SMALL_CHANGE is the same binary: no change to measure");
    }
    Ok(changed)
}

fn copy_root(from: &Path, to: &Path) -> Result<()> {
    run(Command::new("cp").arg("-a").arg(from).arg(to))
}

/// 1 MiB of xorshift bytes: the same every run.
fn random_mib(mut x: u64) -> Vec<u8> {
    (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// libc6's files in `root` replaced by those of [`OLD_LIBC`] (downloaded into `work`).
fn replace_libc(root: &Path, work: &Path) -> Result<()> {
    let deb = util::download_deb("libc6", OLD_LIBC, work)?;
    let tree = work.join("tree");
    util::unpack_deb(&deb, &tree)?;
    let libdir = root.join("lib/x86_64-linux-gnu");
    for name in LIBC_FILES {
        let from = ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"]
            .iter()
            .find_map(|dir| util::resolve_in(&tree, &Path::new(dir).join(name)))
            .with_context(|| format!("no {name} in libc6 {OLD_LIBC}"))?;
        let to = libdir.join(name);
        let before = fs::read(&to).with_context(|| format!("{}", to.display()))?;
        fs::copy(&from, &to)?;
        if fs::read(&to)? == before {
            bail!("libc6 {OLD_LIBC}'s {name} is the root's own: no change to measure");
        }
    }
    Ok(())
}
