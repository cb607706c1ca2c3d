//! `slate meta` end to end, on a disk image partitioned by the real `sgdisk`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sha2::{Digest, Sha256};

fn slate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(args)
        .output()
        .expect("run slate")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "slate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn disk_with_meta(dir: &Path) -> PathBuf {
    let path = dir.join("disk.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let out = Command::new("sgdisk")
        .args([
            "-n",
            "1:2048:+8M",
            "-c",
            "1:EFI",
            "-n",
            "2:0:+1M",
            "-c",
            "2:META",
        ])
        .arg(&path)
        .output()
        .expect("sgdisk is installed by the test command");
    assert!(out.status.success());
    path
}

fn hash(path: &Path) -> Vec<u8> {
    Sha256::digest(std::fs::read(path).unwrap()).to_vec()
}

#[test]
fn set_get_list_delete_on_a_partitioned_disk() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_with_meta(dir.path());
    let d = disk.to_str().unwrap();

    // A blank partition reads as empty, without a warning: nothing was lost.
    let out = slate(&["meta", "list", "--disk", d]);
    assert_eq!(stdout(&out), "");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");

    stdout(&slate(&[
        "meta",
        "set",
        "Upgrade",
        "slate-1.0.0.efi",
        "--disk",
        d,
    ]));
    stdout(&slate(&["meta", "set", "0xc", "hello", "--disk", d]));
    assert_eq!(
        stdout(&slate(&["meta", "get", "6", "--disk", d])),
        "slate-1.0.0.efi\n"
    );
    assert_eq!(
        stdout(&slate(&["meta", "list", "--disk", d])),
        "6 (Upgrade)\tslate-1.0.0.efi\n12 (UserReserved1)\thello\n"
    );
    let json: serde_json::Value = serde_json::from_str(&stdout(&slate(&[
        "meta", "list", "--disk", d, "--output", "json",
    ])))
    .unwrap();
    assert_eq!(json[0]["tag"], 6);
    assert_eq!(json[0]["name"], "Upgrade");
    assert_eq!(json[0]["value"], "slate-1.0.0.efi");

    let before = hash(&disk);
    let out = slate(&["meta", "delete", "Upgrade", "--disk", d, "--dry-run"]);
    assert_eq!(stdout(&out), "would delete 6 (Upgrade)\n");
    assert_eq!(hash(&disk), before, "--dry-run writes nothing");

    stdout(&slate(&["meta", "delete", "Upgrade", "--disk", d]));
    let out = slate(&["meta", "get", "Upgrade", "--disk", d]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tag 6 (Upgrade) is not set"));
}

#[test]
fn an_oversized_value_is_refused_and_the_disk_is_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_with_meta(dir.path());
    let d = disk.to_str().unwrap();
    stdout(&slate(&["meta", "set", "Upgrade", "A", "--disk", d]));
    let before = hash(&disk);
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'x'; 300 * 1024]).unwrap();
    let big = big.to_str().unwrap();
    let out = slate(&[
        "meta",
        "set",
        "UserReserved2",
        "--from-file",
        big,
        "--disk",
        d,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("setting tag 13 (UserReserved2)"), "{err}");
    assert!(err.contains("an ADV holds 262104"), "{err}");
    assert_eq!(hash(&disk), before, "not one byte written");
}

#[test]
fn bad_disks_and_tags_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_with_meta(dir.path());
    let d = disk.to_str().unwrap();
    let err = |args: &[&str]| {
        let out = slate(args);
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(err(&["meta", "list", "--disk", d, "--partition", "STATE"])
        .contains("no partition labelled \"STATE\" (found: EFI, META)"));
    assert!(err(&["meta", "get", "Bogus", "--disk", d]).contains("neither a known tag name"));
    let blank = dir.path().join("blank.img");
    std::fs::write(&blank, vec![0u8; 1 << 20]).unwrap();
    assert!(err(&["meta", "list", "--disk", blank.to_str().unwrap()]).contains("no valid GPT"));
    assert!(err(&["meta", "list", "--disk", "/nonexistent"]).contains("opening /nonexistent"));
}

#[test]
fn raw_meta_areas_work_too() {
    let dir = tempfile::tempdir().unwrap();
    let area = dir.path().join("meta.raw");
    std::fs::write(&area, vec![0u8; 1 << 20]).unwrap();
    let a = area.to_str().unwrap();
    stdout(&slate(&[
        "meta",
        "set",
        "StagedUpgradeImageRef",
        "reg/slate:v4",
        "--disk",
        a,
        "--raw",
    ]));
    assert_eq!(
        stdout(&slate(&["meta", "get", "7", "--disk", a, "--raw"])),
        "reg/slate:v4\n"
    );
}

#[test]
fn payload_encode_and_decode() {
    assert_eq!(
        stdout(&slate(&[
            "meta",
            "decode",
            "MHhhPXsiZXh0ZXJuYWxJUHMiOlsiMS4yLjMuNCJdfQ=="
        ])),
        "0xa={\"externalIPs\":[\"1.2.3.4\"]}\n"
    );
    assert_eq!(
        stdout(&slate(&[
            "meta",
            "encode",
            "0xa={\"externalIPs\":[\"1.2.3.4\"]}"
        ])),
        "MHhhPXsiZXh0ZXJuYWxJUHMiOlsiMS4yLjMuNCJdfQ==\n"
    );
    let out = slate(&["meta", "decode", "not base64!"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not valid standard base64"));
}

#[test]
fn completions_are_generated() {
    let script = stdout(&slate(&["completions", "bash"]));
    assert!(script.contains("meta"));
}

/// EFI, META and an ext4 STATE (the real mke2fs), as on a slate disk.
fn disk_with_state(dir: &Path) -> PathBuf {
    let path = disk_with_meta(dir);
    let out = Command::new("sgdisk")
        .args(["-n", "3:0:+8M", "-c", "3:STATE"])
        .arg(&path)
        .output()
        .expect("sgdisk");
    assert!(out.status.success());
    // STATE starts after EFI (2048 + 8 MiB) and META (1 MiB): sector 20480.
    let state = dir.join("state.ext4");
    let out = Command::new("mke2fs")
        .args(["-q", "-t", "ext4", "-F"])
        .arg(&state)
        .arg("8M")
        .output()
        .expect("mke2fs is installed by the test command");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fs = std::fs::read(&state).unwrap();
    let mut image = std::fs::read(&path).unwrap();
    image[20480 * 512..20480 * 512 + fs.len()].copy_from_slice(&fs);
    std::fs::write(&path, image).unwrap();
    path
}

fn refused(args: &[&str]) -> String {
    let out = slate(args);
    assert!(!out.status.success(), "{args:?} should be refused");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_data_partition_is_never_written_as_meta() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_with_state(dir.path());
    let d = disk.to_str().unwrap();
    let before = hash(&disk);
    let set = [
        "meta",
        "set",
        "Upgrade",
        "x",
        "--disk",
        d,
        "--partition",
        "STATE",
    ];
    let err = refused(&set);
    assert!(err.contains("partition \"STATE\""), "{err}");
    assert!(err.contains("is not a META partition"), "{err}");
    let err = refused(&["meta", "format", "--disk", d, "--partition", "STATE"]);
    assert!(err.contains("is not a META partition"), "{err}");
    assert_eq!(hash(&disk), before, "not one byte written");
    // Reading it is harmless, and says what is there.
    let out = slate(&["meta", "list", "--disk", d, "--partition", "STATE"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("both META copies are invalid"));
    // Relabelled META, the content check still holds: an ext4 is neither an ADV nor blank.
    let out = Command::new("sgdisk")
        .args(["-c", "3:META", "-c", "2:OLD"])
        .arg(&disk)
        .output()
        .unwrap();
    assert!(out.status.success());
    let before = hash(&disk);
    let err = refused(&["meta", "set", "Upgrade", "x", "--disk", d]);
    assert!(err.contains("this is not a META area"), "{err}");
    assert!(err.contains("non-zero bytes"), "{err}");
    assert_eq!(hash(&disk), before, "not one byte written");
}

#[test]
fn a_whole_disk_given_as_a_raw_area_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_with_meta(dir.path());
    let d = disk.to_str().unwrap();
    let before = hash(&disk);
    for args in [
        &["meta", "set", "Upgrade", "x", "--disk", d, "--raw"][..],
        &["meta", "delete", "Upgrade", "--disk", d, "--raw"],
        &["meta", "format", "--disk", d, "--raw"],
    ] {
        let err = refused(args);
        assert!(err.contains("this is not a META area"), "{args:?}: {err}");
    }
    assert_eq!(hash(&disk), before, "the MBR and GPT are intact");
}

#[test]
fn corrupt_copies_are_kept_until_forced_and_format_is_deliberate() {
    let dir = tempfile::tempdir().unwrap();
    let disk = disk_with_meta(dir.path());
    let d = disk.to_str().unwrap();
    stdout(&slate(&["meta", "set", "Upgrade", "A", "--disk", d]));
    stdout(&slate(&[
        "meta",
        "set",
        "VersionFloor",
        "2.0.0",
        "--disk",
        d,
    ]));
    // META is sectors 18432.. (after EFI's 8 MiB from 2048): damage a record in both copies.
    let meta_at = 18432 * 512;
    let mut image = std::fs::read(&disk).unwrap();
    for copy in [0, 256 * 1024] {
        image[meta_at + copy + 8] ^= 0xff;
    }
    std::fs::write(&disk, image).unwrap();
    let before = hash(&disk);
    let err = refused(&["meta", "set", "Upgrade", "B", "--disk", d]);
    assert!(err.contains("copy 1: the checksum does not match"), "{err}");
    assert!(err.contains("copy 2: the checksum does not match"), "{err}");
    let err = refused(&["meta", "set", "Upgrade", "B", "--disk", d, "--dry-run"]);
    assert!(err.contains("this is not a META area"), "{err}");
    assert_eq!(hash(&disk), before, "not one byte written");

    // Forced: written, and readable again.
    stdout(&slate(&[
        "meta", "set", "Upgrade", "B", "--disk", d, "--force",
    ]));
    assert_eq!(
        stdout(&slate(&["meta", "get", "Upgrade", "--disk", d])),
        "B\n"
    );

    // Format refuses to erase values, says which, and erases them with --force.
    let err = refused(&["meta", "format", "--disk", d]);
    assert!(err.contains("holds 1 value(s) (6 (Upgrade))"), "{err}");
    assert!(stdout(&slate(&[
        "meta",
        "format",
        "--disk",
        d,
        "--dry-run",
        "--force"
    ]))
    .starts_with("would format META"));
    stdout(&slate(&["meta", "format", "--disk", d, "--force"]));
    assert_eq!(stdout(&slate(&["meta", "list", "--disk", d])), "");
}
