//! `slate imager build` end to end on small synthetic inputs (a fake kernel, a two-module
//! modules.dep, a tiny root) with Debian's real systemd-stub and systemd-boot: reproducibility of
//! every output kind, conformance with the real tools, and refusal of bad profiles.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

const STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";
const SYSTEMD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";
const KINDS: [&str; 7] = [
    "rootfs",
    "initramfs",
    "cmdline",
    "kernel",
    "uki",
    "image",
    "installer",
];

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // The stub is a PE like a kernel image is; the UKI builder only needs a PE for .linux.
        fs::copy(STUB, d.join("vmlinuz")).unwrap();
        let modules = d.join("modules/6.1.0-test");
        fs::create_dir_all(modules.join("kernel/fs")).unwrap();
        fs::create_dir_all(modules.join("kernel/lib")).unwrap();
        fs::write(modules.join("kernel/fs/alpha.ko"), b"alpha module").unwrap();
        fs::write(modules.join("kernel/lib/beta.ko"), b"beta module").unwrap();
        fs::write(
            modules.join("modules.dep"),
            "kernel/fs/alpha.ko: kernel/lib/beta.ko\nkernel/lib/beta.ko:\n",
        )
        .unwrap();
        let root = d.join("rootfs");
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::create_dir_all(root.join("etc")).unwrap();
        fs::write(root.join("bin/init"), "#!/bin/sh\necho hi\n").unwrap();
        std::os::unix::fs::symlink("init", root.join("bin/sh")).unwrap();
        fs::write(d.join("slate"), b"\x7fELF not really").unwrap();
        fs::write(
            d.join("profile.toml"),
            Self::profile("vmlinuz", "alpha", "rootfs"),
        )
        .unwrap();
        fs::create_dir(d.join("out")).unwrap();
        Self { dir }
    }

    fn profile(kernel: &str, module: &str, rootfs: &str) -> String {
        format!(
            r#"name = "slate"
version = "1.0.0"
arch = "amd64"
platform = "qemu"
variant = "test"
[kernel]
image = "{kernel}"
modules_dir = "modules/6.1.0-test"
modules = ["{module}"]
args = ["console=ttyS0", "panic=10"]
[rootfs]
base = "{rootfs}"
zstd_level = 3
[boot]
stub = "{STUB}"
systemd_boot = "{SYSTEMD_BOOT}"
slate = "slate"
[image]
size_mib = 128
esp_mib = 40
state_mib = 8
"#
        )
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn build(&self, kind: &str, out: &Path, epoch: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_slate"))
            .args(["imager", "build", "--profile"])
            .arg(self.path("profile.toml"))
            .args(["--output", kind, "--out"])
            .arg(out)
            .env("SOURCE_DATE_EPOCH", epoch)
            .output()
            .unwrap()
    }

    fn built(&self, kind: &str, name: &str) -> PathBuf {
        let out = self.path("out").join(name);
        let result = self.build(kind, &out, "1700000000");
        assert!(
            result.status.success(),
            "building {kind}: {}",
            String::from_utf8_lossy(&result.stderr)
        );
        out
    }
}

fn hash_tree(path: &Path) -> Vec<u8> {
    let mut hasher = Sha256::new();
    if path.is_dir() {
        let mut entries: Vec<_> = walk(path);
        entries.sort();
        for entry in entries {
            hasher.update(entry.strip_prefix(path).unwrap().to_str().unwrap());
            hasher.update(fs::read(&entry).unwrap());
        }
    } else {
        hasher.update(fs::read(path).unwrap());
    }
    hasher.finalize().to_vec()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_output_kind_is_reproducible() {
    let fx = Fixture::new();
    for kind in KINDS {
        let a = fx.built(kind, &format!("{kind}.a"));
        let b = fx.built(kind, &format!("{kind}.b"));
        assert_eq!(
            hash_tree(&a),
            hash_tree(&b),
            "{kind} differs between two builds"
        );
    }
    let later = fx.path("out/rootfs.later");
    assert!(fx.build("rootfs", &later, "1800000000").status.success());
    assert_ne!(
        hash_tree(&later),
        hash_tree(&fx.path("out/rootfs.a")),
        "SOURCE_DATE_EPOCH reaches the artifact"
    );
}

#[test]
fn artifacts_pass_the_real_tools() {
    let fx = Fixture::new();
    let rootfs = fx.built("rootfs", "rootfs.sqsh");
    let listing = tool("unsquashfs", &["-l", rootfs.to_str().unwrap()]);
    for path in [
        "squashfs-root/bin/init",
        "squashfs-root/bin/sh",
        "squashfs-root/etc/os-release",
    ] {
        assert!(
            listing.lines().any(|l| l == path),
            "{path} missing:\n{listing}"
        );
    }

    let initramfs = fx.built("initramfs", "initramfs.cpio");
    let cpio = Command::new("cpio")
        .args(["-it", "--quiet"])
        .stdin(fs::File::open(&initramfs).unwrap())
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&cpio.stdout);
    for name in [
        "init",
        "rootfs.sqsh",
        "dev/console",
        "etc/slate/modules.load",
        "lib/modules/6.1.0-test/kernel/lib/beta.ko",
        "lib/modules/6.1.0-test/kernel/fs/alpha.ko",
    ] {
        assert!(names.lines().any(|l| l == name), "{name} missing:\n{names}");
    }
    let extract = fx.path("initramfs-x");
    fs::create_dir(&extract).unwrap();
    let status = Command::new("cpio")
        .args(["-id", "--quiet", "etc/slate/modules.load"])
        .current_dir(&extract)
        .stdin(fs::File::open(&initramfs).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        fs::read_to_string(extract.join("etc/slate/modules.load")).unwrap(),
        "kernel/lib/beta.ko:\nkernel/fs/alpha.ko: kernel/lib/beta.ko\n",
        "dependencies load first, each line naming what it needs (formats.md §6.3)"
    );

    let uki = fx.built("uki", "slate.efi");
    let headers = tool("objdump", &["-h", uki.to_str().unwrap()]);
    let mut found = Vec::new();
    for line in headers.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 6 && cols[1].starts_with('.') {
            let vma = u64::from_str_radix(cols[3], 16).unwrap();
            let offset = u64::from_str_radix(cols[5], 16).unwrap();
            if [".osrel", ".cmdline", ".uname", ".initrd", ".linux"].contains(&cols[1]) {
                assert_eq!(vma % 0x200, 0, "{} VMA {vma:#x} unaligned", cols[1]);
                assert_eq!(
                    offset % 0x200,
                    0,
                    "{} offset {offset:#x} unaligned",
                    cols[1]
                );
                found.push(cols[1].to_string());
            }
        }
    }
    assert_eq!(found, [".osrel", ".cmdline", ".uname", ".initrd", ".linux"]);
    let cmdline = fx.built("cmdline", "cmdline");
    assert_eq!(
        fs::read_to_string(cmdline).unwrap(),
        "console=ttyS0 panic=10\n"
    );

    let image = fx.built("image", "disk.raw");
    let verify = tool("sgdisk", &["-v", image.to_str().unwrap()]);
    assert!(verify.contains("No problems found"), "{verify}");
    let mdir = tool(
        "mdir",
        &["-/", "-b", "-i", &format!("{}@@1M", image.display()), "::"],
    );
    assert!(mdir.contains("::/EFI/Linux/slate-1.0.0+3.efi"), "{mdir}");
    assert!(mdir.contains("::/EFI/BOOT/BOOTX64.EFI"), "{mdir}");
    let esp = fx.path("esp.img");
    let mut esp_bytes = fs::read(&image).unwrap();
    esp_bytes.drain(..1 << 20);
    esp_bytes.truncate(40 << 20);
    fs::write(&esp, esp_bytes).unwrap();
    tool("fsck.vfat", &["-n", esp.to_str().unwrap()]);

    let bundle = fx.built("installer", "bundle");
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(bundle.join("index.json")).unwrap()).unwrap();
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        "1.0.0"
    );
    for blob in walk(&bundle.join("blobs/sha256")) {
        let digest = hex_digest(&fs::read(&blob).unwrap());
        assert_eq!(blob.file_name().unwrap().to_str().unwrap(), digest);
    }
}

fn hex_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn bad_profiles_fail_clearly_and_leave_nothing_behind() {
    let fx = Fixture::new();
    let out_dir = fx.path("out");
    let cases = [
        (
            "vmlinuz.missing",
            "alpha",
            "rootfs",
            "uki",
            "the kernel image",
        ),
        ("vmlinuz", "gamma", "rootfs", "uki", "gamma"),
        (
            "vmlinuz",
            "alpha",
            "rootfs.missing",
            "rootfs",
            "the base rootfs",
        ),
    ];
    for (kernel, module, rootfs, kind, expected) in cases {
        fs::write(
            fx.path("profile.toml"),
            Fixture::profile(kernel, module, rootfs),
        )
        .unwrap();
        let out = fx.build(kind, &out_dir.join("artifact"), "0");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{kind} with {expected} wrong succeeded"
        );
        assert!(
            err.contains(expected),
            "error does not name {expected}: {err}"
        );
    }
    fs::write(
        fx.path("profile.toml"),
        Fixture::profile("vmlinuz", "alpha", "rootfs"),
    )
    .unwrap();

    let out = fx.build("iso", &out_dir.join("artifact"), "0");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("possible values: rootfs, initramfs"));

    let not_a_dir = fx.path("out/file");
    fs::write(&not_a_dir, b"").unwrap();
    let out = fx.build("uki", &not_a_dir.join("slate.efi"), "0");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be written"));

    fs::write(fx.path("profile.toml"), "name = \"slate\"\nversion = 1\n").unwrap();
    let out = fx.build("uki", &out_dir.join("artifact"), "0");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid TOML for a slate profile"));

    let left: Vec<_> = fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["file"], "no artifact or temporary left behind");
}

/// `--cache` (issue 43): a rebuild after one file of the root changed takes blocks and the
/// initramfs from the cache and writes the bundle a clean build of the changed tree writes; a
/// damaged entry is found by its digest and made again, never used.
#[test]
fn a_cached_rebuild_writes_what_a_clean_build_writes() {
    let fx = Fixture::new();
    // Enough root for several data blocks and fragments: text that compresses, in files larger
    // and smaller than a 128 KiB block.
    let root = fx.path("rootfs");
    fs::create_dir_all(root.join("usr/share/doc")).unwrap();
    for i in 0..8 {
        let text: String = (0..(40_000 * i + 900))
            .map(|n| format!("line {} of file {i}\n", n % 977))
            .collect();
        fs::write(root.join(format!("usr/share/doc/file{i}.txt")), text).unwrap();
    }
    let cache = fx.path("cache");
    let build = |name: &str, cached: bool| -> (Vec<u8>, String) {
        let out = fx.path("out").join(name);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_slate"));
        cmd.args(["imager", "build", "--profile"])
            .arg(fx.path("profile.toml"))
            .args(["--output", "installer", "--out"])
            .arg(&out)
            .env("SOURCE_DATE_EPOCH", "1700000000");
        if cached {
            cmd.arg("--cache").arg(&cache);
        }
        let result = cmd.output().unwrap();
        let said = String::from_utf8_lossy(&result.stdout).into_owned();
        assert!(
            result.status.success(),
            "{name}: {said}{}",
            String::from_utf8_lossy(&result.stderr)
        );
        (hash_tree(&out), said)
    };
    // A count of the CLI's "build cache: N reused, M stored, K damaged entries rebuilt" line.
    let count = |said: &str, label: &str| -> u64 {
        let line = said
            .lines()
            .find(|l| l.starts_with("build cache:"))
            .unwrap();
        let part = line["build cache: ".len()..]
            .split(", ")
            .find(|p| p.ends_with(label))
            .unwrap_or_else(|| panic!("no {label:?} in {line:?}"));
        part.split(' ').next().unwrap().parse().unwrap()
    };
    let reused = |said: &str| count(said, "reused");

    let (clean, _) = build("clean-1", false);
    let (first, said) = build("cached-1", true);
    assert_eq!(
        first, clean,
        "a build with an empty cache writes the same bytes"
    );
    assert_eq!(reused(&said), 0, "{said}");

    fs::write(root.join("usr/share/doc/file5.txt"), "changed\n").unwrap();
    let (rebuilt, said) = build("cached-2", true);
    let (clean_changed, _) = build("clean-2", false);
    assert_ne!(clean_changed, clean, "the change reaches the bundle");
    assert_eq!(
        rebuilt, clean_changed,
        "the cached rebuild is the clean build"
    );
    let reused_before = reused(&said);
    assert!(
        reused_before >= 5,
        "unchanged blocks and the initramfs reused: {said}"
    );
    // The compressed chunks' frames are kept too, one entry per indexed blob.
    let frames = walk(&cache.join("v1").join("chunk-frames"));
    assert!(!frames.is_empty(), "no chunk frames kept");

    // Every entry damaged (one bit of each payload, and one cut short): each is found, removed
    // and made again, and the bundle is still the clean one.
    let mut damaged = 0;
    for stage in ["squashfs-block", "initramfs-zstd", "chunk-frames"] {
        for entry in walk(&cache.join("v1").join(stage)) {
            let mut bytes = fs::read(&entry).unwrap();
            if damaged == 0 {
                bytes.truncate(10);
            } else {
                *bytes.last_mut().unwrap() ^= 0x40;
            }
            fs::write(&entry, bytes).unwrap();
            damaged += 1;
        }
    }
    assert!(damaged >= 5, "{damaged} entries");
    let (again, said) = build("cached-3", true);
    assert_eq!(
        again, clean_changed,
        "damaged entries never reach the bundle"
    );
    assert_eq!(reused(&said), 0, "{said}");
    // Every entry the rebuild looked up is damaged: each counted, and made and kept again.
    let found = count(&said, "damaged entries rebuilt");
    assert!(
        found >= reused_before && found <= damaged,
        "{found} of {damaged}: {said}"
    );
    assert_eq!(count(&said, "stored"), found, "{said}");
    let (healed, said) = build("cached-4", true);
    assert_eq!(healed, clean_changed);
    assert!(
        reused(&said) >= 5,
        "the rebuilt entries are used again: {said}"
    );
}

/// A slate binary of 40,000 numbered lines from `first` (compressible, so the root stores it as
/// zstd frames), in the bundle and as the root's `/usr/bin/slate`, as the demo profile has it.
fn with_binary(fx: &Fixture, first: u32) {
    let binary: String = (first..first + 40_000)
        .map(|i| format!("{i} {}\n", u64::from(i) * u64::from(i)))
        .collect();
    fs::write(fx.path("slate"), &binary).unwrap();
    fs::create_dir_all(fx.path("rootfs/usr/bin")).unwrap();
    fs::write(fx.path("rootfs/usr/bin/slate"), &binary).unwrap();
}

/// `slate bundle diff A B` counts what a node running A derives from B's new slate binary
/// (formats.md §7.7, "Derived seeds"): B's root holds the new binary again as squashfs blocks,
/// which the node makes from the binary rather than fetching; with the same binary on both
/// sides, nothing is derived.
#[test]
fn bundle_diff_counts_the_root_copy_a_node_derives_from_a_new_binary() {
    let fx = Fixture::new();
    with_binary(&fx, 0);
    let v1 = fx.built("installer", "v1");
    let same = fx.built("installer", "same");
    // Every line numbered one more: every block of the binary, and of its root copy, changes.
    with_binary(&fx, 1);
    let v2 = fx.built("installer", "v2");
    let diff = |b: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_slate"))
            .args(["bundle", "diff"])
            .arg(&v1)
            .arg(b)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = diff(&same);
    assert!(!text.contains("derived on the node"), "{text}");
    let text = diff(&v2);
    let binary = fs::read(fx.path("slate")).unwrap();
    // The fixture's root is zstd 3 in 128 KiB blocks.
    let blocks = slate_rootfs::file_data(&binary, 128 << 10, 3, 1).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("derived on the node"))
        .unwrap_or_else(|| panic!("no derived seed counted: {text}"));
    assert!(
        line.contains(&format!(
            "B's root copy of its new slate binary ({} bytes)",
            blocks.len()
        )),
        "{line}"
    );
    let saved: u64 = line
        .rsplit("saves fetching ")
        .next()
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    // Most of the copy: all but the chunks at its two ends, which hold other bytes too.
    assert!(
        saved * 2 > blocks.len() as u64,
        "saved {saved} of {}: {text}",
        blocks.len()
    );
}
