use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// Run `f` on a thread of its own: a hang fails the test after 5 s instead of hanging it.
fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("hung for 5 s (or panicked)")
}

/// A FIFO, `/dev/zero`, a directory and a dangling link, with the kind each is refused as.
fn hostile(dir: &Path) -> Vec<(PathBuf, &'static str)> {
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let link = dir.join("dangling");
    std::os::unix::fs::symlink(dir.join("missing"), &link).unwrap();
    vec![
        (fifo, "is a FIFO (named pipe), not"),
        ("/dev/zero".into(), "is a character device, not"),
        (dir.join("."), "is a directory, not"),
        (link, "is a dangling symbolic link, not"),
    ]
}

#[test]
fn reads_refuse_what_is_not_a_regular_file_by_name_at_once() {
    let dir = tempfile::tempdir().unwrap();
    for (path, kind) in hostile(dir.path()) {
        for read in [
            |p: PathBuf| read_file_bounded(&p, 1 << 20, "the machine configuration").map(drop),
            |p: PathBuf| read_string_bounded(&p, 1 << 20, "the key").map(drop),
            |p: PathBuf| open_disk(&p, false).map(drop),
            |p: PathBuf| open_disk(&p, true).map(drop),
        ] {
            let p = path.clone();
            let err = within_5s(move || read(p)).unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains(&path.display().to_string()) && message.contains(kind),
                "{message}"
            );
        }
    }
}

#[test]
fn the_bound_holds_before_and_while_reading() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"12345").unwrap();
    assert_eq!(read_file_bounded(&file, 5, "f").unwrap(), b"12345");
    let err = read_file_bounded(&file, 4, "the profile").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("the profile {} is larger than 4 bytes", file.display())
    );
    std::fs::write(&file, [0xff, 0xfe]).unwrap();
    assert!(matches!(
        read_string_bounded(&file, 4, "f"),
        Err(FileError::NotText { .. })
    ));
    let missing = read_file_bounded(&dir.path().join("missing"), 4, "f").unwrap_err();
    assert!(missing.is_not_found(), "{missing:?}");
    // A link to a regular file is followed.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert_eq!(read_file_bounded(&link, 4, "f").unwrap(), [0xff, 0xfe]);
}

#[test]
fn a_disk_is_a_regular_file_or_a_block_device() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.raw");
    File::create(&image).unwrap().set_len(1 << 20).unwrap();
    let file = open_disk(&image, true).unwrap();
    let flags = OFlag::from_bits_truncate(fcntl(&file, FcntlArg::F_GETFL).unwrap());
    assert!(!flags.contains(OFlag::O_NONBLOCK), "{flags:?}");
    // Any block device the machine has will do (opening it may need root).
    if let Some(block) = std::fs::read_dir("/dev")
        .unwrap()
        .flatten()
        .find(|e| e.file_type().is_ok_and(|t| t.is_block_device()))
    {
        match open_disk(&block.path(), false) {
            Ok(_) => {}
            Err(FileError::Io { source, .. })
                if source.kind() == io::ErrorKind::PermissionDenied => {}
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_key_directory_with_a_fifo_key_is_refused_by_its_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.pub"), b"key").unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
    let wanted = |p: &Path| p.extension().is_some_and(|e| e == "pub");
    assert_eq!(
        files_in(dir.path(), "the trusted keys", wanted).unwrap(),
        [dir.path().join("a.pub")]
    );
    // A FIFO that is not wanted is not looked at.
    nix::unistd::mkfifo(&dir.path().join("x.txt"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    files_in(dir.path(), "the trusted keys", wanted).unwrap();
    nix::unistd::mkfifo(&dir.path().join("x.pub"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let err = files_in(dir.path(), "the trusted key", wanted).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the trusted key {} is a FIFO (named pipe), not a regular file",
            dir.path().join("x.pub").display()
        )
    );
    let err = files_in(&dir.path().join("a.pub"), "the trusted keys", wanted).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("is a regular file, not a directory"),
        "{err}"
    );
}
