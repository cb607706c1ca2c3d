//! The node's runtime configuration travels in the image: a profile's `[health]` and
//! `[watchdog]` become `/etc/slate/node.toml` in the squashfs root (read back with the real
//! `unsquashfs`), byte-identical across builds and parsed back to the same configuration.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use slate_imager::{build_rootfs, Inputs, OutputKind};
use slate_profile::{HealthCheck, NodeConfig, NODE_CONFIG_PATH};

use common::BASE_PROFILE as BASE;

const NODE: &str = r#"
[health]
timeout_secs = 20
[[health.checks]]
tcp = "127.0.0.1:50000"
[[health.checks]]
file = "/etc/os-release"
[[health.checks]]
command = ["/bin/sh", "-c", "test -d /var"]
[watchdog]
timeout_secs = 45
"#;

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(profile: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::write(root.join("bin/init"), "#!/bin/sh\n").unwrap();
        fs::write(dir.path().join("profile.toml"), profile).unwrap();
        Self { dir }
    }

    fn rootfs(&self, name: &str) -> PathBuf {
        let inputs = Inputs::resolve(
            &self.dir.path().join("profile.toml"),
            None,
            &[],
            OutputKind::Rootfs,
            1_700_000_000,
        )
        .unwrap();
        let bytes = build_rootfs(&inputs, &mut |_| {}).unwrap();
        let out = self.dir.path().join(name);
        fs::write(&out, bytes).unwrap();
        out
    }
}

fn unsquashfs(args: &[&str], image: &Path) -> String {
    let out = Command::new("unsquashfs")
        .args(args)
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "unsquashfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn health_and_watchdog_reach_the_image() {
    let fx = Fixture::new(&format!("{BASE}{NODE}"));
    let image = fx.rootfs("a.sqsh");
    assert_eq!(
        fs::read(&image).unwrap(),
        fs::read(fx.rootfs("b.sqsh")).unwrap(),
        "two builds give the same bytes"
    );

    let listing = unsquashfs(&["-lln"], &image);
    let line = |path: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!("squashfs-root/{path}")))
            .unwrap_or_else(|| panic!("{path} missing:\n{listing}"))
            .to_string()
    };
    assert!(
        line(NODE_CONFIG_PATH).starts_with("-rw-r--r-- 0/0"),
        "{listing}"
    );
    assert!(line("etc/slate").starts_with("drwxr-xr-x 0/0"), "{listing}");
    assert!(
        line("etc/os-release").starts_with("-rw-r--r-- 0/0"),
        "{listing}"
    );

    let extract = fx.dir.path().join("x");
    unsquashfs(&["-no-progress", "-d", extract.to_str().unwrap()], &image);
    let text = fs::read_to_string(extract.join(NODE_CONFIG_PATH)).unwrap();
    let config = NodeConfig::parse(&text).unwrap();
    let health = config.health.as_ref().unwrap();
    assert_eq!(health.timeout_secs, 20);
    assert_eq!(
        health.checks[0],
        HealthCheck::Tcp("127.0.0.1:50000".parse().unwrap())
    );
    assert_eq!(health.checks.len(), 3);
    let watchdog = config.enabled_watchdog().unwrap();
    assert_eq!(watchdog.timeout_secs, 45);
    assert_eq!(watchdog.device, Path::new("/dev/watchdog"));
}

#[test]
fn no_sections_no_file() {
    let fx = Fixture::new(BASE);
    let listing = unsquashfs(&["-l"], &fx.rootfs("plain.sqsh"));
    assert!(
        !listing.contains("node.toml"),
        "no [health] and no [watchdog]: machined finds no file\n{listing}"
    );
    assert!(
        listing.contains("squashfs-root/etc/os-release"),
        "{listing}"
    );
}

#[test]
fn the_profile_replaces_a_base_file() {
    let fx = Fixture::new(&format!("{BASE}[watchdog]\ntimeout_secs = 30\n"));
    let etc = fx.dir.path().join("rootfs/etc/slate");
    fs::create_dir_all(&etc).unwrap();
    fs::write(etc.join("node.toml"), "[watchdog]\ntimeout_secs = 999\n").unwrap();
    let image = fx.rootfs("replaced.sqsh");
    let extract = fx.dir.path().join("y");
    unsquashfs(&["-no-progress", "-d", extract.to_str().unwrap()], &image);
    let config =
        NodeConfig::parse(&fs::read_to_string(extract.join(NODE_CONFIG_PATH)).unwrap()).unwrap();
    assert_eq!(config.enabled_watchdog().unwrap().timeout_secs, 30);
    assert_eq!(config.health, None);
}
