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

    // A blank partition reads as empty, with a warning.
    let out = slate(&["meta", "list", "--disk", d]);
    assert_eq!(stdout(&out), "");
    assert!(String::from_utf8_lossy(&out.stderr).contains("both META copies are invalid"));

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
