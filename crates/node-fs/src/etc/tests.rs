//! `prepare_upper` on a temporary directory: first boot, unchanged, reset, and a simulated power
//! cut before every step of a reset.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use super::upper::{prepare_upper_steps, EtcChange};
use super::*;

/// Every entry under `root`: a file's content, a symlink's `-> target`, a directory's `/`.
fn tree(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).unwrap();
                out.insert(rel, format!("-> {}", target.display()));
            } else if meta.is_dir() {
                out.insert(rel, "/".into());
                walk(root, &path, out);
            } else {
                out.insert(rel, fs::read_to_string(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    if root.exists() {
        walk(root, root, &mut out);
    }
    out
}

fn entries(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn paths(list: &[&str]) -> Vec<PathBuf> {
    list.iter().map(PathBuf::from).collect()
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

const ID: &str = "0123456789abcdef0123456789abcdef";

/// A STATE `etc` directory whose upper belongs to 1.0.0 and holds runtime changes: the machine
/// ID, a hostname, an sshd config in a directory, files that must not survive.
fn booted_v1(dir: &Path) {
    let upper = dir.join(UPPER);
    fs::create_dir_all(upper.join("ssh/keys")).unwrap();
    fs::create_dir_all(dir.join("work/work")).unwrap();
    fs::write(dir.join("work/work/junk"), "overlay scratch").unwrap();
    fs::write(upper.join(MACHINE_ID), format!("{ID}\n")).unwrap();
    fs::write(upper.join("hostname"), "node-7\n").unwrap();
    fs::set_permissions(upper.join("hostname"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(upper.join("ssh"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::write(upper.join("ssh/sshd_config"), "Port 22\n").unwrap();
    fs::write(upper.join("ssh/keys/host"), "secret\n").unwrap();
    symlink("/usr/share/zoneinfo/UTC", upper.join("localtime")).unwrap();
    fs::write(upper.join("resolv.conf"), "nameserver 10.0.0.1\n").unwrap();
    fs::write(upper.join("slate-setup-stamp"), "1.0.0\n").unwrap();
    fs::write(dir.join(VERSION_RECORD), "1.0.0\n").unwrap();
    fs::write(dir.join(HOOKS_RECORD), "1.0.0\n").unwrap();
}

fn keep_v1() -> Vec<PathBuf> {
    paths(&[
        "hostname",
        "/etc/ssh/sshd_config",
        "ssh/keys",
        "localtime",
        "absent.conf",
    ])
}

/// What a reset of [`booted_v1`] to 2.0.0 with [`keep_v1`] must leave.
fn reset_v1_upper() -> BTreeMap<String, String> {
    entries(&[
        ("hostname", "node-7\n"),
        ("localtime", "-> /usr/share/zoneinfo/UTC"),
        ("machine-id", &format!("{ID}\n")),
        ("ssh", "/"),
        ("ssh/keys", "/"),
        ("ssh/keys/host", "secret\n"),
        ("ssh/sshd_config", "Port 22\n"),
    ])
}

#[test]
fn the_first_boot_creates_a_machine_id_and_records_the_version() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("etc");
    let prepared = prepare_upper(&dir, "1.0.0", &[]).unwrap();
    assert_eq!(prepared.change, EtcChange::FirstBoot);
    assert!(prepared.machine_id_generated);
    assert!(prepared.hooks_due);
    let id = &prepared.machine_id;
    assert_eq!(id.len(), 32);
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{id}"
    );
    // A version 4 UUID, as systemd makes them.
    assert_eq!(&id[12..13], "4", "{id}");
    assert_eq!(
        tree(&dir.join(UPPER)),
        entries(&[("machine-id", &format!("{id}\n"))])
    );
    assert_eq!(mode(&dir.join(UPPER)), 0o755);
    assert_eq!(mode(&dir.join(UPPER).join(MACHINE_ID)), 0o444);
    assert!(tree(&dir.join(WORK)).is_empty());
    assert_eq!(
        fs::read_to_string(dir.join(VERSION_RECORD)).unwrap(),
        "1.0.0\n"
    );
    assert!(!dir.join(HOOKS_RECORD).exists());
    assert_eq!(
        prepared.summary(),
        format!("/etc first boot at 1.0.0: machine-id {id} generated")
    );
    // Two first boots make two identities.
    let other = prepare_upper(&tmp.path().join("other"), "1.0.0", &[]).unwrap();
    assert_ne!(other.machine_id, prepared.machine_id);
}

#[test]
fn the_same_version_leaves_the_upper_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    booted_v1(dir);
    let before = tree(dir);
    let prepared = prepare_upper(dir, "1.0.0", &keep_v1()).unwrap();
    assert_eq!(prepared.change, EtcChange::Unchanged);
    assert_eq!(prepared.machine_id, ID);
    assert!(!prepared.machine_id_generated);
    assert!(!prepared.hooks_due);
    assert_eq!(tree(dir), before);
    assert_eq!(prepared.summary(), "/etc unchanged at 1.0.0");
    // Hooks that did not finish are still due.
    fs::remove_file(dir.join(HOOKS_RECORD)).unwrap();
    assert!(prepare_upper(dir, "1.0.0", &[]).unwrap().hooks_due);
}

#[test]
fn a_machine_id_deleted_at_run_time_is_generated_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    booted_v1(dir);
    fs::remove_file(dir.join(UPPER).join(MACHINE_ID)).unwrap();
    let prepared = prepare_upper(dir, "1.0.0", &[]).unwrap();
    assert_eq!(prepared.change, EtcChange::Unchanged);
    assert!(prepared.machine_id_generated);
    assert_ne!(prepared.machine_id, ID);
    assert_eq!(
        fs::read_to_string(dir.join(UPPER).join(MACHINE_ID)).unwrap(),
        format!("{}\n", prepared.machine_id)
    );
}

#[test]
fn a_new_version_resets_the_upper_keeping_the_machine_id_and_listed_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    booted_v1(dir);
    let prepared = prepare_upper(dir, "2.0.0", &keep_v1()).unwrap();
    assert_eq!(
        prepared.change,
        EtcChange::Reset {
            from: "1.0.0".into()
        }
    );
    assert_eq!(prepared.machine_id, ID);
    assert!(!prepared.machine_id_generated);
    assert!(prepared.hooks_due);
    assert_eq!(
        prepared.kept,
        paths(&["hostname", "ssh/sshd_config", "ssh/keys", "localtime"])
    );
    assert_eq!(prepared.missing, paths(&["absent.conf"]));
    assert_eq!(tree(&dir.join(UPPER)), reset_v1_upper());
    // Modes come along, of the files and of the directories created for them.
    assert_eq!(mode(&dir.join(UPPER).join("hostname")), 0o600);
    assert_eq!(mode(&dir.join(UPPER).join("ssh")), 0o750);
    assert!(tree(&dir.join(WORK)).is_empty());
    assert_eq!(
        fs::read_to_string(dir.join(VERSION_RECORD)).unwrap(),
        "2.0.0\n"
    );
    assert!(!dir.join(HOOKS_RECORD).exists());
    assert!(!dir.join(UPPER_OLD).exists() && !dir.join(UPPER_NEXT).exists());
    assert_eq!(
        prepared.summary(),
        "/etc reset from 1.0.0 to 2.0.0: kept machine-id, hostname, ssh/sshd_config, ssh/keys, \
         localtime; not in the old upper: absent.conf"
    );
    // A boot of 2.0.0 whose setup hooks did not all succeed starts from a fresh upper again
    // (nothing a half run wrote stays), machine ID kept...
    fs::write(dir.join(UPPER).join("half-run"), "x").unwrap();
    let again = prepare_upper(dir, "2.0.0", &keep_v1()).unwrap();
    assert_eq!(again.change, EtcChange::Unfinished);
    assert_eq!(again.machine_id, ID);
    assert!(again.hooks_due);
    assert!(!dir.join(UPPER).join("half-run").exists());
    assert_eq!(
        again.summary(),
        "/etc reset again at 2.0.0 (its setup hooks did not all succeed): kept machine-id, \
         hostname, ssh/sshd_config, ssh/keys, localtime; not in the old upper: absent.conf"
    );
    // ...and once they did, the next boot of 2.0.0 leaves it alone.
    fs::write(dir.join(HOOKS_RECORD), "2.0.0\n").unwrap();
    fs::write(dir.join(UPPER).join("runtime"), "x").unwrap();
    let again = prepare_upper(dir, "2.0.0", &keep_v1()).unwrap();
    assert_eq!(again.change, EtcChange::Unchanged);
    assert!(!again.hooks_due);
    assert!(dir.join(UPPER).join("runtime").exists());
}

#[test]
fn a_revert_resets_to_the_old_version_the_same_way_and_its_hooks_run_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    booted_v1(dir);
    prepare_upper(dir, "2.0.0", &paths(&["hostname"])).unwrap();
    fs::write(dir.join(UPPER).join("written-by-2"), "x").unwrap();
    // 2.0.0's hooks failed: the node reverts to 1.0.0, whose hooks had once succeeded.
    let back = prepare_upper(dir, "1.0.0", &paths(&["hostname"])).unwrap();
    assert_eq!(
        back.change,
        EtcChange::Reset {
            from: "2.0.0".into()
        }
    );
    assert!(back.hooks_due);
    assert_eq!(back.machine_id, ID);
    assert_eq!(
        tree(&dir.join(UPPER)),
        entries(&[("hostname", "node-7\n"), ("machine-id", &format!("{ID}\n"))])
    );
}

#[test]
fn kept_paths_must_stay_under_etc_and_symlinks_are_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    booted_v1(&dir);
    for bad in [
        "../state/upper.version",
        "/var/lib/x",
        "ssh/../hostname",
        "",
        "/etc",
    ] {
        let err = prepare_upper(&dir, "2.0.0", &paths(&[bad])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("cannot keep {bad} in /etc: ")),
            "{bad}: {err}"
        );
    }
    // Nothing was touched by the refusals.
    assert_eq!(
        fs::read_to_string(dir.join(VERSION_RECORD)).unwrap(),
        "1.0.0\n"
    );
    // A directory symlink in the old upper is copied as a link, never walked through.
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("secret"), "not /etc's").unwrap();
    symlink(&outside, dir.join(UPPER).join("linked")).unwrap();
    let prepared = prepare_upper(&dir, "2.0.0", &paths(&["linked/secret", "machine-id"])).unwrap();
    assert_eq!(prepared.kept, Vec::<PathBuf>::new());
    assert_eq!(prepared.missing, paths(&["linked/secret"]));
    assert_eq!(
        tree(&dir.join(UPPER)),
        entries(&[("machine-id", &format!("{ID}\n"))])
    );
}

#[test]
fn a_whiteout_or_other_special_file_is_not_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    booted_v1(dir);
    // A FIFO stands in for a whiteout (a 0:0 character device needs CAP_MKNOD).
    let fifo = dir.join(UPPER).join("hostname.fifo");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        return;
    }
    let prepared = prepare_upper(dir, "2.0.0", &paths(&["hostname.fifo"])).unwrap();
    assert_eq!(prepared.missing, paths(&["hostname.fifo"]));
    assert!(!dir.join(UPPER).join("hostname.fifo").exists());
}

#[test]
fn an_invalid_version_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for bad in ["", "1.0\n2.0"] {
        assert!(matches!(
            prepare_upper(tmp.path(), bad, &[]),
            Err(EtcError::InvalidVersion(_))
        ));
    }
}

/// The steps of a reset, in order, as `prepare_upper_steps` announces them.
fn reset_steps() -> Vec<&'static str> {
    let tmp = tempfile::tempdir().unwrap();
    booted_v1(tmp.path());
    let mut steps = Vec::new();
    prepare_upper_steps(tmp.path(), "2.0.0", &keep_v1(), &mut |s| {
        steps.push(s);
        false
    })
    .unwrap();
    steps
}

#[test]
fn a_reset_interrupted_before_any_step_is_completed_by_the_next_boot() {
    let steps = reset_steps();
    assert_eq!(steps.len(), 8, "{steps:?}");
    for (i, step) in steps.iter().enumerate() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        booted_v1(dir);
        let err = prepare_upper_steps(dir, "2.0.0", &keep_v1(), &mut |s| s == *step).unwrap_err();
        assert!(
            matches!(err, EtcError::Interrupted(s) if s == *step),
            "{err}"
        );
        // The recorded version still names the old upper until the last steps, and whatever is
        // recorded, `upper` (or `upper.old`, put back) holds it.
        let recorded = fs::read_to_string(dir.join(VERSION_RECORD)).unwrap();
        let upper = if dir.join(UPPER).exists() {
            tree(&dir.join(UPPER))
        } else {
            tree(&dir.join(UPPER_OLD))
        };
        if recorded == "1.0.0\n" {
            assert!(
                upper.contains_key("resolv.conf") || upper == reset_v1_upper(),
                "{step}"
            );
        } else {
            assert_eq!(upper, reset_v1_upper(), "{step}");
        }
        // The next boot of 2.0.0 ends where an uninterrupted one does.
        let next = prepare_upper(dir, "2.0.0", &keep_v1()).unwrap();
        assert_eq!(next.machine_id, ID, "step {i}: {step}");
        assert!(next.hooks_due, "step {i}: {step}");
        assert_eq!(tree(&dir.join(UPPER)), reset_v1_upper(), "step {i}: {step}");
        assert!(tree(&dir.join(WORK)).is_empty());
        assert_eq!(
            fs::read_to_string(dir.join(VERSION_RECORD)).unwrap(),
            "2.0.0\n"
        );
        assert!(!dir.join(UPPER_OLD).exists(), "step {i}: {step}");
        assert!(!dir.join(UPPER_NEXT).exists(), "step {i}: {step}");
        // Cut after the version record, the hooks had not run: reset again at the same version.
        let again = next.change == EtcChange::Unfinished;
        assert_eq!(again, *step == "removing the old upper", "{step}");
        if again {
            assert_eq!(next.recovered, ["upper.old removed"]);
        }
    }
}

#[test]
fn an_interrupted_first_boot_keeps_the_machine_id_it_made() {
    for step in reset_steps() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut first_id = None;
        let err = prepare_upper_steps(dir, "1.0.0", &[], &mut |s| s == step).unwrap_err();
        assert!(matches!(err, EtcError::Interrupted(_)));
        let upper_id = |d: &Path| fs::read_to_string(d.join(MACHINE_ID)).ok();
        if let Some(id) = upper_id(&dir.join(UPPER)) {
            first_id = Some(id);
        }
        let next = prepare_upper(dir, "1.0.0", &[]).unwrap();
        assert!(
            matches!(next.change, EtcChange::FirstBoot | EtcChange::Unfinished),
            "{step}"
        );
        // Once an upper with a machine ID was in place, that ID is the node's for good.
        if let Some(id) = first_id {
            assert_eq!(format!("{}\n", next.machine_id), id, "{step}");
            assert!(!next.machine_id_generated, "{step}");
        }
        assert_eq!(
            fs::read_to_string(dir.join(VERSION_RECORD)).unwrap(),
            "1.0.0\n"
        );
    }
}

#[test]
fn a_leftover_upper_next_is_discarded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    booted_v1(dir);
    fs::create_dir_all(dir.join(UPPER_NEXT).join("half")).unwrap();
    fs::write(dir.join(UPPER_NEXT).join(MACHINE_ID), "ffff").unwrap();
    let same = prepare_upper(dir, "1.0.0", &[]).unwrap();
    assert_eq!(same.change, EtcChange::Unchanged);
    assert_eq!(same.recovered, ["upper.next removed"]);
    assert!(!dir.join(UPPER_NEXT).exists());
    assert!(dir.join(UPPER).join("resolv.conf").exists());
}

#[test]
fn a_missing_version_record_with_an_upper_is_a_first_boot_keeping_its_machine_id() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    booted_v1(dir);
    fs::remove_file(dir.join(VERSION_RECORD)).unwrap();
    let prepared = prepare_upper(dir, "2.0.0", &paths(&["hostname"])).unwrap();
    assert_eq!(prepared.change, EtcChange::FirstBoot);
    assert_eq!(prepared.machine_id, ID);
    assert_eq!(
        tree(&dir.join(UPPER)),
        entries(&[("hostname", "node-7\n"), ("machine-id", &format!("{ID}\n"))])
    );
}
