//! slate's units on the built Debian root (`cargo xtask debian-rootfs`), as the imager adds
//! them, checked by `systemd-analyze verify` against the root's own systemd units: the
//! ordering targets exist, the program is executable, no unknown key (issue 39).

use std::path::{Path, PathBuf};
use std::process::Command;

use slate_imager::{assemble_root, Inputs, OutputKind};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

// The Debian root is built by `xtask vm-prep` (mmdebstrap), which scripts/test runs beside the
// host tests; this one runs once that is done: `cargo test -p slate-imager --test
// systemd_units -- --ignored`.
#[test]
#[ignore = "needs the Debian root of xtask vm-prep; scripts/test runs it after vm-prep"]
fn slates_units_verify_on_the_built_debian_root() {
    let base = repo().join("target/debian/rootfs");
    if !slate_testkit::require_tool("systemd-analyze")
        || !slate_testkit::require_path(&base, "cargo xtask debian-rootfs (root, network)")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("debian.toml");
    std::fs::write(
        &profile,
        format!(
            "name = \"debian\"\nversion = \"1.0.0\"\narch = \"amd64\"\nplatform = \"qemu\"\n\
             [os]\ninit = \"systemd\"\n[kernel]\nimage = \"k\"\nmodules_dir = \"m\"\n\
             [rootfs]\nbase = \"{}\"\n[boot]\nstub = \"s\"\nsystemd_boot = \"b\"\nslate = \"x\"\n\
             [health]\n[[health.checks]]\nfile = \"/etc/slate-setup-stamp\"\n",
            base.display()
        ),
    )
    .unwrap();
    let inputs = Inputs::resolve(&profile, None, &[], OutputKind::Rootfs, 0).unwrap();
    let tree = dir.path().join("root");
    std::fs::create_dir(&tree).unwrap();
    assemble_root(&inputs, &tree).unwrap();
    // The check template as the instance the imager linked for the one check; a drop-in as
    // the unit it changes (Debian's, from the systemd-boot package).
    let names: Vec<&str> = slate_profile::units::ALL
        .iter()
        .map(|u| match u.name {
            "slate-check@.service" => "slate-check@0.service",
            name => name.split_once(".d/").map_or(name, |(unit, _)| unit),
        })
        .collect();
    assert!(names.contains(&"systemd-bless-boot.service"), "{names:?}");
    let out = Command::new("systemd-analyze")
        .arg(format!("--root={}", tree.display()))
        .arg("verify")
        .args(&names)
        .arg("multi-user.target")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{text}"
    );
    // Anything it says about slate's units is a finding, even when the exit status is 0.
    for unit in &names {
        assert!(!text.contains(unit), "{text}");
    }
    let units = tree.join("usr/lib/systemd/system");
    // Enabled: pulled in by multi-user.target.
    for unit in ["slate-setup-hooks.service", "slate-machined.service"] {
        let wants = units.join("multi-user.target.wants").join(unit);
        assert!(wants.exists(), "{}", wants.display());
    }
    // The boot's assessment: the setup hooks and the check are required by
    // boot-complete.target and ordered before it; machined is ordered after it.
    for unit in ["slate-setup-hooks.service", "slate-check@0.service"] {
        let required = units.join("boot-complete.target.requires").join(unit);
        assert!(required.exists(), "{}", required.display());
    }
    // Debian's systemd-bless-boot (kept active once done) and slate's drop-in beside it (the
    // ESP mounted for it, and not kept active, so that efi.mount goes once it is done).
    // `systemd-analyze verify` above loaded the unit with the drop-in.
    let bless = std::fs::read_to_string(units.join("systemd-bless-boot.service"))
        .expect("Debian's systemd-boot package ships systemd-bless-boot.service");
    for line in [
        "ExecStart=/lib/systemd/systemd-bless-boot good",
        "RemainAfterExit=yes",
    ] {
        assert!(bless.contains(line), "no {line:?} in:\n{bless}");
    }
    let drop_in =
        std::fs::read_to_string(units.join("systemd-bless-boot.service.d/slate-esp.conf")).unwrap();
    for line in ["Wants=efi.mount", "RemainAfterExit=no"] {
        assert!(drop_in.contains(line), "no {line:?} in:\n{drop_in}");
    }
    let target = std::fs::read_to_string(units.join("boot-complete.target"))
        .expect("the root's systemd ships boot-complete.target");
    assert!(target.contains("[Unit]"), "{target}");
}
