//! A `tpm2` /var on the host: Debian's swtpm as the TPM (tpm2-tools' `swtpm:` TCTI), a loop
//! device as EPHEMERAL, the real cryptsetup. Set up once, unlocked again with the same TPM,
//! refused once PCR 7 changed and by a fresh TPM, each with the header's bytes unchanged,
//! opened by the recovery key, erased. The keys are checked with `cryptsetup open --test-passphrase`, which needs no
//! device-mapper (the CI host's kernel has none; the VM scenario tpm2_var activates it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};
use slate_node_fs::var_crypt::{self, CryptError, Recovery, Setting, RECOVERY_LINE};

struct Swtpm {
    child: Child,
    port: u16,
}

impl Swtpm {
    fn start(state: &Path) -> Swtpm {
        std::fs::create_dir_all(state).unwrap();
        let port = free_port_pair();
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2", "--flags", "not-need-init,startup-clear"])
            .arg("--tpmstate")
            .arg(format!("dir={}", state.display()))
            .arg("--server")
            .arg(format!("type=tcp,port={port}"))
            .arg("--ctrl")
            .arg(format!("type=tcp,port={}", port + 1))
            .stdout(Stdio::null())
            .spawn()
            .expect("starting swtpm");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "swtpm did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Swtpm { child, port }
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two consecutive free ports (swtpm's server and control channel).
fn free_port_pair() -> u16 {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if port < 65535 && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port;
        }
    }
}

struct Loop(PathBuf);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn setting(tpm: &Swtpm, dir: &Path, name: &str) -> Setting {
    Setting {
        tcti: format!("swtpm:host=127.0.0.1,port={}", tpm.port),
        tpm_device: None,
        tools_dir: "/usr/bin".into(),
        scratch: dir.join("scratch"),
        mapper_name: name.into(),
    }
}

fn header_hash(device: &Path) -> String {
    let bytes = std::fs::read(device).unwrap();
    format!("{:x}", Sha256::digest(&bytes[..16 << 20]))
}

#[test]
fn sealed_reopened_refused_by_another_tpm_recovered_and_erased() {
    if !slate_testkit::require_root()
        || !["swtpm", "cryptsetup", "tpm2_createprimary", "losetup"]
            .iter()
            .all(|t| slate_testkit::require_tool(t))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("ephemeral.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "losetup: {out:?}");
    let device = Loop(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let name = format!("slate-var-test-{}", std::process::id());
    let tpm = Swtpm::start(&dir.path().join("tpm-a"));
    let lines = std::sync::Mutex::new(Vec::<String>::new());
    let log = |l: &str| lines.lock().unwrap().push(l.to_owned());

    let first = var_crypt::unlock(
        &device.0,
        "EPHEMERAL",
        &setting(&tpm, dir.path(), &name),
        &Recovery::Log,
        &log,
    )
    .expect("set up");
    assert_eq!(
        (first.slot(), first.how()),
        (0, "TPM (sealed at this boot, PCR 7)")
    );
    assert!(opens(&device.0, first.key_file(), 0));
    drop(first);
    let recovery = {
        let lines = lines.lock().unwrap();
        let line = lines
            .iter()
            .find(|l| l.starts_with(RECOVERY_LINE))
            .unwrap_or_else(|| panic!("no recovery key line in {lines:?}"));
        line.rsplit(' ').next().unwrap().to_owned()
    };
    let dump = Command::new("cryptsetup")
        .arg("luksDump")
        .arg(&device.0)
        .output()
        .unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.contains("slate-tpm2"), "{dump}");
    assert!(
        dump.lines()
            .any(|l| l.starts_with("Label:") && l.trim_end().ends_with("\tslate-var")),
        "{dump}"
    );

    let again = var_crypt::unlock(
        &device.0,
        "EPHEMERAL",
        &setting(&tpm, dir.path(), &name),
        &Recovery::Log,
        &log,
    )
    .expect("unlocked again");
    assert_eq!(again.how(), "TPM (PCR sha256:7)");
    assert!(opens(&device.0, again.key_file(), 0));
    assert!(
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("EPHEMERAL: unlocked with the TPM (PCR 7, key slot 0)")),
        "{:?}",
        lines.lock().unwrap()
    );
    drop(again);

    // The Secure Boot state changes (PCR 7 extended): the same TPM refuses the policy.
    let before = header_hash(&image);
    let extended = Command::new("tpm2_pcrextend")
        .arg(format!("7:sha256={}", "01".repeat(32)))
        .env(
            "TPM2TOOLS_TCTI",
            format!("swtpm:host=127.0.0.1,port={}", tpm.port),
        )
        .status()
        .unwrap();
    assert!(extended.success());
    let err = var_crypt::unlock(
        &device.0,
        "EPHEMERAL",
        &setting(&tpm, dir.path(), &name),
        &Recovery::Log,
        &log,
    )
    .unwrap_err();
    assert!(
        matches!(&err, CryptError::Refused(why) if why.contains("refused the PCR 7 policy")),
        "{err}"
    );
    assert_eq!(header_hash(&image), before, "a refusal writes nothing");
    drop(tpm);

    let before = header_hash(&image);
    let other = Swtpm::start(&dir.path().join("tpm-b"));
    let err = var_crypt::unlock(
        &device.0,
        "EPHEMERAL",
        &setting(&other, dir.path(), &name),
        &Recovery::Log,
        &log,
    )
    .unwrap_err();
    assert!(
        matches!(&err, CryptError::Refused(why) if why.contains("could not be unlocked with this machine's TPM") && why.contains("another TPM")),
        "{err}"
    );
    assert_eq!(header_hash(&image), before, "a refusal writes nothing");

    let key = dir.path().join("recovery");
    std::fs::write(&key, &recovery).unwrap();
    assert!(opens(&device.0, &key, 1), "the recovery key opens slot 1");

    let erased = var_crypt::erase(&device.0, &setting(&other, dir.path(), &name)).unwrap();
    assert!(erased);
    assert!(
        !opens(&device.0, &key, 1),
        "no key slot is left after the erase"
    );
}

/// `cryptsetup open --test-passphrase` with `key` on `slot`.
fn opens(device: &Path, key: &Path, slot: u32) -> bool {
    Command::new("cryptsetup")
        .args([
            "open",
            "--test-passphrase",
            "--key-slot",
            &slot.to_string(),
            "--key-file",
        ])
        .arg(key)
        .arg(device)
        .status()
        .unwrap()
        .success()
}

/// A first boot cut short after `luksFormat` (the setup label, no token yet) is set up again;
/// a LUKS2 volume without slate's token under another label, and an unencrypted filesystem,
/// are refused with their bytes unchanged.
#[test]
fn an_unfinished_setup_is_redone_and_anything_else_refused_untouched() {
    if !slate_testkit::require_root()
        || ![
            "swtpm",
            "cryptsetup",
            "tpm2_createprimary",
            "losetup",
            "mke2fs",
        ]
        .iter()
        .all(|t| slate_testkit::require_tool(t))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("ephemeral.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&image)
        .output()
        .unwrap();
    let device = Loop(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let tpm = Swtpm::start(&dir.path().join("tpm"));
    let setting = setting(&tpm, dir.path(), "unused");
    let key = dir.path().join("some.key");
    std::fs::write(&key, "a passphrase").unwrap();
    let format = |label: &str| {
        let done = Command::new("cryptsetup")
            .args([
                "luksFormat",
                "--type",
                "luks2",
                "--batch-mode",
                "--label",
                label,
            ])
            .args([
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
            ])
            .arg(&key)
            .arg(&device.0)
            .status()
            .unwrap();
        assert!(done.success());
    };
    let lines = std::sync::Mutex::new(Vec::<String>::new());
    let log = |l: &str| lines.lock().unwrap().push(l.to_owned());

    format("slate-var-setup");
    let redone = var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &Recovery::Log, &log)
        .expect("set up again");
    assert_eq!(redone.how(), "TPM (sealed at this boot, PCR 7)");
    assert!(lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("setup was cut short before its token was stored")));
    assert!(!opens(&device.0, &key, 0), "the old header's key is gone");

    format("someone-elses");
    let before = header_hash(&image);
    let err =
        var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &Recovery::Log, &log).unwrap_err();
    assert!(
        matches!(&err, CryptError::Refused(why) if why.contains("without slate's slate-tpm2 token")),
        "{err}"
    );
    assert_eq!(header_hash(&image), before);

    let made = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4"])
        .arg(&device.0)
        .status()
        .unwrap();
    assert!(made.success());
    let before = header_hash(&image);
    let err =
        var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &Recovery::Log, &log).unwrap_err();
    assert!(
        matches!(&err, CryptError::Refused(why) if why.contains("an unencrypted ext2/3/4 filesystem")),
        "{err}"
    );
    assert_eq!(header_hash(&image), before);
}

/// A loop device over a new 64 MiB file in `dir`, and the file.
fn loop_device(dir: &Path) -> (Loop, PathBuf) {
    let image = dir.join("ephemeral.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "losetup: {out:?}");
    let device = Loop(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    (device, image)
}

/// The key slots a LUKS2 header holds.
fn key_slots(device: &Path) -> Vec<String> {
    let out = Command::new("cryptsetup")
        .args(["luksDump", "--dump-json-metadata"])
        .arg(device)
        .output()
        .unwrap();
    assert!(out.status.success(), "luksDump: {out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    json["keyslots"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// `[var] recovery_key = "state"`: the key is in a root-only file (written before the
/// partition was touched), not in the log, and opens key slot 1. `"none"`: no recovery slot.
#[test]
fn the_recovery_key_goes_to_a_root_only_file_or_nowhere() {
    use std::os::unix::fs::PermissionsExt as _;
    if !slate_testkit::require_root()
        || !["swtpm", "cryptsetup", "tpm2_createprimary", "losetup"]
            .iter()
            .all(|t| slate_testkit::require_tool(t))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (device, _image) = loop_device(dir.path());
    let tpm = Swtpm::start(&dir.path().join("tpm"));
    let setting = setting(&tpm, dir.path(), "unused");
    let lines = std::sync::Mutex::new(Vec::<String>::new());
    let log = |l: &str| lines.lock().unwrap().push(l.to_owned());

    let file = dir.path().join("state/recovery/var.key");
    let to_file = Recovery::File(file.clone());
    var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &to_file, &log).expect("set up");
    let key = std::fs::read_to_string(&file).unwrap();
    assert_eq!(key.len(), 71, "{key:?}");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(file.parent().unwrap()), 0o700);
    {
        let lines = lines.lock().unwrap();
        let said = lines.iter().find(|l| l.starts_with(RECOVERY_LINE)).unwrap();
        assert!(
            said.contains(&format!("written to {}", file.display())),
            "{said}"
        );
        assert!(lines.iter().all(|l| !l.contains(&key)), "the key is logged");
    }
    assert!(opens(&device.0, &file, 1), "the file's key opens slot 1");
    assert_eq!(key_slots(&device.0), ["0", "1"]);

    // Blank again (as after a reset), then set up with no recovery key at all.
    {
        use std::io::Write as _;
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&device.0)
            .unwrap();
        dev.write_all(&vec![0u8; 16 << 20]).unwrap();
        dev.sync_all().unwrap();
    }
    lines.lock().unwrap().clear();
    let opened = var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &Recovery::None, &log)
        .expect("set up without a recovery key");
    assert!(opens(&device.0, opened.key_file(), 0));
    assert_eq!(key_slots(&device.0), ["0"]);
    assert!(lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.starts_with("no recovery key for /var (EPHEMERAL)")));
}

/// After a Secure Boot change (PCR 7 extended) the sealed key no longer unseals; the recovery
/// key reseals it to the current PCR 7 (a dry run first, which writes nothing), and the next
/// unlock is unattended again, from the new key slot; the old slot is gone; /var's contents
/// (a marker inside the encrypted area) are untouched. A wrong recovery key is refused with
/// nothing written.
#[test]
fn a_changed_pcr_7_is_resealed_with_the_recovery_key_and_nothing_is_lost() {
    if !slate_testkit::require_root()
        || ![
            "swtpm",
            "cryptsetup",
            "tpm2_createprimary",
            "tpm2_pcrextend",
            "losetup",
        ]
        .iter()
        .all(|t| slate_testkit::require_tool(t))
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (device, image) = loop_device(dir.path());
    let tpm = Swtpm::start(&dir.path().join("tpm"));
    let setting = setting(&tpm, dir.path(), "unused");
    let lines = std::sync::Mutex::new(Vec::<String>::new());
    let log = |l: &str| lines.lock().unwrap().push(l.to_owned());
    let file = dir.path().join("state/recovery/var.key");
    drop(
        var_crypt::unlock(
            &device.0,
            "EPHEMERAL",
            &setting,
            &Recovery::File(file.clone()),
            &log,
        )
        .expect("set up"),
    );
    let recovery = std::fs::read(&file).unwrap();
    // Bytes in the data area stand for /var's encrypted contents: no reseal may touch them.
    {
        use std::io::{Seek as _, Write as _};
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&device.0)
            .unwrap();
        dev.seek(std::io::SeekFrom::Start(40 << 20)).unwrap();
        dev.write_all(&[0x5a; 1 << 20]).unwrap();
        dev.sync_all().unwrap();
    }
    let data = |image: &Path| {
        let bytes = std::fs::read(image).unwrap();
        format!("{:x}", Sha256::digest(&bytes[16 << 20..]))
    };
    let contents = data(&image);

    let extended = Command::new("tpm2_pcrextend")
        .arg(format!("7:sha256={}", "02".repeat(32)))
        .env("TPM2TOOLS_TCTI", &setting.tcti)
        .status()
        .unwrap();
    assert!(extended.success());
    let err =
        var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &Recovery::Log, &log).unwrap_err();
    assert!(
        matches!(&err, CryptError::Refused(why) if why.contains("refused the PCR 7 policy")),
        "{err}"
    );

    let before = header_hash(&image);
    let mut wrong = recovery.clone();
    wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
    let err = var_crypt::reseal(&device.0, "EPHEMERAL", &setting, &wrong, false, &log).unwrap_err();
    assert!(
        matches!(&err, CryptError::Refused(why) if why.contains("the recovery key does not open")),
        "{err}"
    );
    assert_eq!(
        header_hash(&image),
        before,
        "a refused reseal writes nothing"
    );

    // A key file as an owner writes it, with a newline.
    let mut typed = recovery.clone();
    typed.push(b'\n');
    let planned =
        var_crypt::reseal(&device.0, "EPHEMERAL", &setting, &typed, true, &log).expect("dry run");
    assert_eq!(
        (planned.old_slot, planned.new_slot, planned.dry_run),
        (0, 2, true)
    );
    assert_eq!(header_hash(&image), before, "a dry run writes nothing");

    let done =
        var_crypt::reseal(&device.0, "EPHEMERAL", &setting, &typed, false, &log).expect("resealed");
    assert_eq!((done.old_slot, done.new_slot), (0, 2));
    assert_eq!(key_slots(&device.0), ["1", "2"]);
    assert!(
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l
                .starts_with("EPHEMERAL: resealed to the TPM's current PCR sha256:7: key slot 2")),
        "{:?}",
        lines.lock().unwrap()
    );
    let again = var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &Recovery::Log, &log)
        .expect("unlocked unattended after the reseal");
    assert_eq!(again.slot(), 2);
    assert!(opens(&device.0, again.key_file(), 2));
    assert!(
        opens(&device.0, &file, 1),
        "the recovery key still opens slot 1"
    );
    assert_eq!(
        data(&image),
        contents,
        "the volume's contents are untouched"
    );
    drop(again);

    // Another change, another reseal: back to slot 0.
    let extended = Command::new("tpm2_pcrextend")
        .arg(format!("7:sha256={}", "03".repeat(32)))
        .env("TPM2TOOLS_TCTI", &setting.tcti)
        .status()
        .unwrap();
    assert!(extended.success());
    let done = var_crypt::reseal(&device.0, "EPHEMERAL", &setting, &recovery, false, &log)
        .expect("resealed twice");
    assert_eq!((done.old_slot, done.new_slot), (2, 0));
    assert_eq!(key_slots(&device.0), ["0", "1"]);
    let again = var_crypt::unlock(&device.0, "EPHEMERAL", &setting, &Recovery::Log, &log)
        .expect("unlocked after the second reseal");
    assert_eq!(again.slot(), 0);
}
