//! Conformance of `GrubEnv` with the real `grub-editenv` (grub-common 2.06, Debian 12): the same
//! edits give the same bytes, files slate writes are listed correctly by `grub-editenv FILE
//! list`, and files grub-editenv writes parse. Skipped, with a note, where grub-editenv is not
//! installed (`scripts/install-deps` installs it); failed then under `CI=true`.

use std::path::Path;
use std::process::Command;

use slate_bootspec::{GrubEnv, GRUBENV_LEN};

fn editenv(file: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("grub-editenv")
        .arg(file)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn available() -> bool {
    if !slate_testkit::require_tool("grub-editenv") {
        return false;
    }
    let version = Command::new("grub-editenv").arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "grub-editenv --version: {version:?}"
    );
    true
}

/// What `grub-editenv list` prints for `env`: `name=value` lines, values unescaped.
fn listing(env: &GrubEnv) -> String {
    env.vars().map(|(n, v)| format!("{n}={v}\n")).collect()
}

#[test]
fn same_edits_same_bytes_as_grub_editenv() {
    if !available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grubenv");
    editenv(&file, &["create"]).unwrap();
    let mut env = GrubEnv::new();
    assert_eq!(std::fs::read(&file).unwrap(), env.to_bytes(), "create");

    const NAMES: [&str; 6] = [
        "saved_entry",
        "next_entry",
        "prev_saved_entry",
        "recordfail",
        "a",
        "boot_once",
    ];
    const ALPHABET: &[u8] = b"AB01 -_#.\\\nxyz";
    let mut rng = slate_testkit::Xorshift(0x5eed_1234_abcd_0001);
    let (mut sets, mut unsets, mut refused) = (0, 0, 0);
    for step in 0..300 {
        let name = NAMES[rng.below(NAMES.len())];
        let what = if rng.below(4) == 0 {
            unsets += 1;
            assert_eq!(
                editenv(&file, &["unset", name]).map(|_| ()),
                Ok(()),
                "unset {name}"
            );
            env.unset(name);
            format!("unset {name}")
        } else {
            // Mostly short values, now and then one long enough to overflow the block.
            let len = if rng.below(10) == 0 {
                rng.below(900)
            } else {
                rng.below(24)
            };
            let value: String = (0..len)
                .map(|_| ALPHABET[rng.below(ALPHABET.len())] as char)
                .collect();
            let theirs = editenv(&file, &["set", &format!("{name}={value}")]);
            let ours = env.set(name, &value);
            match (&theirs, &ours) {
                (Ok(_), Ok(())) => sets += 1,
                (Err(e), Err(_)) if e.contains("too small") => refused += 1,
                _ => panic!(
                    "step {step}: set {name}={value:?}: grub-editenv {theirs:?}, slate {ours:?}"
                ),
            }
            format!("set {name}={value:?}")
        };
        let bytes = std::fs::read(&file).unwrap();
        assert_eq!(bytes.len(), GRUBENV_LEN);
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&env.to_bytes()),
            "step {step}: {what}"
        );
        // What grub-editenv writes parses, back to the same block.
        assert_eq!(GrubEnv::parse(&bytes).unwrap(), env, "step {step}");
        assert_eq!(
            editenv(&file, &["list"]).unwrap(),
            listing(&env),
            "step {step}"
        );
    }
    assert!(
        sets > 100 && unsets > 30 && refused > 0,
        "{sets} {unsets} {refused}"
    );
    println!("grub-editenv conformance: {sets} sets, {unsets} unsets, {refused} refused as too big for the block: same bytes at every step");
}

#[test]
fn grub_editenv_lists_what_slate_writes() {
    if !available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grubenv");
    let mut env = GrubEnv::new();
    env.set("saved_entry", "A").unwrap();
    env.set("next_entry", "B").unwrap();
    env.set("cmd", "a\\b\nc d").unwrap();
    std::fs::write(&file, env.to_bytes()).unwrap();
    assert_eq!(
        editenv(&file, &["list"]).unwrap(),
        "saved_entry=A\nnext_entry=B\ncmd=a\\b\nc d\n"
    );
    // And grub-editenv can keep editing it: GRUB's save_env and grub-reboot do.
    editenv(&file, &["set", "next_entry="]).unwrap();
    let back = GrubEnv::parse(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(back.get("next_entry"), Some(""));
    assert_eq!(back.get("cmd"), Some("a\\b\nc d"));
}
