//! End-to-end checks of the newc writer: round trips through our reader, GNU cpio agreeing
//! with what we wrote (and us agreeing with what GNU cpio writes), and determinism.

use std::io::Write;
use std::process::{Command, Stdio};

use proptest::prelude::*;
use slate_cpio::{concat_initrds, parse_newc, CpioWriter, EntryKind};

/// What a caller asked for, in a form comparable with what the reader returns.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Spec {
    Dir(String, u32),
    File(String, u32, Vec<u8>),
    Symlink(String, String),
    CharDevice(String, u32, u32, u32),
}

fn write(specs: &[Spec], mtime: u32) -> Vec<u8> {
    let mut w = CpioWriter::with_mtime(mtime);
    for spec in specs {
        match spec {
            Spec::Dir(p, m) => w.dir(p, *m),
            Spec::File(p, m, d) => w.file(p, *m, d.clone()),
            Spec::Symlink(p, t) => w.symlink(p, t),
            Spec::CharDevice(p, m, maj, min) => w.char_device(p, *m, *maj, *min),
        }
        .expect("valid spec");
    }
    w.finish()
}

fn read_back(archive: &[u8]) -> Vec<Spec> {
    parse_newc(archive)
        .expect("our own output parses")
        .into_iter()
        .map(|e| {
            let name = e.name_str().expect("utf-8 name").to_owned();
            match e.kind().expect("known kind") {
                EntryKind::Directory => Spec::Dir(name, e.permissions()),
                EntryKind::File => Spec::File(name, e.permissions(), e.data),
                EntryKind::Symlink => {
                    Spec::Symlink(name, String::from_utf8(e.data).expect("utf-8 target"))
                }
                EntryKind::CharDevice => {
                    Spec::CharDevice(name, e.permissions(), e.rdev_major, e.rdev_minor)
                }
                other => panic!("writer never emits {other:?}"),
            }
        })
        .collect()
}

fn sample_specs() -> Vec<Spec> {
    vec![
        Spec::Dir("dev".into(), 0o755),
        Spec::CharDevice("dev/console".into(), 0o600, 5, 1),
        Spec::Dir("etc".into(), 0o755),
        Spec::File(
            "etc/os-release".into(),
            0o644,
            b"ID=slate\nVERSION_ID=1\n".to_vec(),
        ),
        Spec::File("etc/empty".into(), 0o600, Vec::new()),
        Spec::Dir("sbin".into(), 0o755),
        Spec::File(
            "sbin/slate".into(),
            0o755,
            vec![0x7f, b'E', b'L', b'F', 2, 1, 1],
        ),
        Spec::Symlink("init".into(), "sbin/slate".into()),
    ]
}

#[test]
fn round_trip_with_fixed_metadata() {
    let archive = write(&sample_specs(), 1_700_000_000);
    assert_eq!(archive.len() % 4, 0);
    assert_eq!(read_back(&archive), sample_specs());

    let entries = parse_newc(&archive).unwrap();
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.ino as usize, i + 1, "inodes count up from 1");
        assert_eq!((e.uid, e.gid), (0, 0));
        assert_eq!(e.mtime, 1_700_000_000);
        let dir = e.kind() == Some(EntryKind::Directory);
        assert_eq!(e.nlink, if dir { 2 } else { 1 });
    }
}

#[test]
fn leading_slash_is_stripped() {
    let mut w = CpioWriter::new();
    w.file("/init", 0o755, b"x".to_vec()).unwrap();
    assert_eq!(parse_newc(&w.finish()).unwrap()[0].name, b"init");
}

#[test]
fn output_is_deterministic() {
    let a = write(&sample_specs(), 0);
    let b = write(&sample_specs(), 0);
    assert_eq!(a, b);
    // And the mtime is the only input beyond the entries.
    assert_ne!(a, write(&sample_specs(), 1));
}

#[test]
fn concatenated_archives_parse_as_one_stream() {
    let first = write(&sample_specs()[..2], 0);
    let second = write(&[Spec::File("etc/extra".into(), 0o644, b"abc".to_vec())], 0);
    // An odd-length member in between: the padding rule must keep the next archive aligned.
    let joined = concat_initrds(&[&first, &[0u8; 3], &second]);
    let names: Vec<_> = parse_newc(&joined)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, [&b"dev"[..], b"dev/console", b"etc/extra"]);
}

#[test]
fn gnu_cpio_lists_what_we_wrote() {
    if !slate_testkit::require_tool("cpio") {
        return;
    }
    let archive = write(&sample_specs(), 1_700_000_000);
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&archive).unwrap();
    file.flush().unwrap();

    let listing = |verbose: bool| {
        let out = Command::new("cpio")
            .arg(if verbose { "-itv" } else { "-it" })
            .arg("--quiet")
            .stdin(std::fs::File::open(file.path()).unwrap())
            .env("TZ", "UTC")
            .env("LC_ALL", "C")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cpio failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };

    let names: Vec<String> = listing(false).lines().map(str::to_owned).collect();
    assert_eq!(
        names,
        [
            "dev",
            "dev/console",
            "etc",
            "etc/os-release",
            "etc/empty",
            "sbin",
            "sbin/slate",
            "init"
        ]
    );

    let verbose = listing(true);
    let line = |name: &str| {
        verbose
            .lines()
            .find(|l| l.ends_with(name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{verbose}"))
            .to_owned()
    };
    assert!(line("dev/console").starts_with("crw-------"), "{verbose}");
    let console = line("dev/console");
    let words: Vec<&str> = console.split_whitespace().collect();
    assert!(words.windows(2).any(|w| w == ["5,", "1"]), "{console}");
    assert!(
        line("etc/os-release").starts_with("-rw-r--r--"),
        "{verbose}"
    );
    assert!(line("sbin").starts_with("drwxr-xr-x"), "{verbose}");
    assert!(
        line("init -> sbin/slate").starts_with("lrwxrwxrwx"),
        "{verbose}"
    );
}

#[test]
fn we_parse_what_gnu_cpio_writes() {
    if !slate_testkit::require_tool("cpio") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("etc")).unwrap();
    std::fs::write(dir.path().join("etc/hostname"), b"node-1\n").unwrap();
    let mut child = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"etc\netc/hostname\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    // GNU cpio pads to 512-byte blocks; the reader must skip those zeros.
    assert_eq!(out.stdout.len() % 512, 0);
    let entries = parse_newc(&out.stdout).unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].kind(), Some(EntryKind::Directory));
    assert_eq!(entries[1].name, b"etc/hostname");
    assert_eq!(entries[1].data, b"node-1\n");
}

fn component() -> impl Strategy<Value = String> {
    // Starts with a non-dot so "." and ".." never appear.
    "[a-z0-9_][a-zA-Z0-9_.-]{0,11}"
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(component(), 1..4).prop_map(|c| c.join("/"))
}

fn spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (path(), 0u32..0o7777).prop_map(|(p, m)| Spec::Dir(p, m)),
        (
            path(),
            0u32..0o7777,
            prop::collection::vec(any::<u8>(), 0..300)
        )
            .prop_map(|(p, m, d)| Spec::File(p, m, d)),
        (path(), "[ -~]{1,40}").prop_map(|(p, t)| Spec::Symlink(p, t)),
        (path(), 0u32..0o7777, any::<u32>(), any::<u32>())
            .prop_map(|(p, m, a, b)| Spec::CharDevice(p, m, a, b)),
    ]
}

proptest! {
    #[test]
    fn parse_inverts_write(specs in prop::collection::vec(spec(), 0..20), mtime in any::<u32>()) {
        let archive = write(&specs, mtime);
        prop_assert_eq!(archive.len() % 4, 0);
        prop_assert_eq!(read_back(&archive), specs);
    }

    #[test]
    fn parser_never_panics_on_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_newc(&bytes);
    }

    #[test]
    fn parser_never_panics_on_mutated_archives(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut archive = write(&sample_specs(), 0);
        for (at, byte) in flips {
            let i = at.index(archive.len());
            archive[i] = byte;
        }
        let keep = cut.index(archive.len() + 1);
        let _ = parse_newc(&archive[..keep]);
    }
}
