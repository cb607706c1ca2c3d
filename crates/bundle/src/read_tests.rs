use std::path::Path;
use std::time::Duration;

use super::*;
use crate::{write_bundle, BlobInput, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE};

fn bundle(dir: &Path) {
    write_bundle(
        dir,
        BundleSpec {
            name: "demo",
            version: "2.0.0",
            arch: "amd64",
            variant: "generic",
        },
        &[
            BlobInput {
                role: crate::UKI_ROLE,
                file_name: "slate.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: b"a unified kernel image",
            },
            BlobInput {
                role: crate::INSTALLER_ROLE,
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: b"an installer",
            },
        ],
    )
    .unwrap();
}

/// Run `f` on another thread; a hang is a failure, not a stuck test run.
fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("it answered within 10 s (a FIFO must not be waited on)")
}

fn replace_with_fifo(path: &Path) {
    std::fs::remove_file(path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(made.success());
}

/// issue 19: a FIFO `index.json` made `slate verify` hang; a FIFO, socket or link in a
/// layout is refused at once, saying what it is.
#[test]
fn only_regular_files_are_opened() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("bundle");
    bundle(&dir);
    let opened = Bundle::open(&dir, None).unwrap();
    let uki = opened.blob_ref(crate::UKI_ROLE).unwrap().clone();
    let uki_path = dir
        .join("blobs/sha256")
        .join(uki.digest.strip_prefix("sha256:").unwrap());

    // A FIFO index.json.
    let fifo_dir = work.path().join("fifo-index");
    bundle(&fifo_dir);
    replace_with_fifo(&fifo_dir.join("index.json"));
    let err = within_seconds(move || {
        let err = Bundle::open(&fifo_dir, None).unwrap_err();
        format!("{err}: {}", std::error::Error::source(&err).unwrap())
    });
    assert!(
        err.contains("index.json: it is a FIFO (named pipe), not a regular file"),
        "{err}"
    );

    // A FIFO blob: refused when read, not waited on.
    replace_with_fifo(&uki_path);
    let reopened = Bundle::open(&dir, None).unwrap();
    let err = within_seconds(move || {
        let err = reopened.verify_blob(crate::UKI_ROLE).unwrap_err();
        format!("{err}: {}", std::error::Error::source(&err).unwrap())
    });
    assert!(
        err.contains("it is a FIFO (named pipe), not a regular file: refused"),
        "{err}"
    );

    // A socket, and a link to a good copy.
    std::fs::remove_file(&uki_path).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(&uki_path).unwrap();
    let err = Bundle::open(&dir, None)
        .unwrap()
        .verify_blob(crate::UKI_ROLE)
        .unwrap_err();
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("a socket"),
        "{err:?}"
    );
    std::fs::remove_file(&uki_path).unwrap();
    let copy = work.path().join("uki-copy");
    std::fs::write(&copy, b"a unified kernel image").unwrap();
    std::os::unix::fs::symlink(&copy, &uki_path).unwrap();
    let err = Bundle::open(&dir, None)
        .unwrap()
        .verify_blob(crate::UKI_ROLE)
        .unwrap_err();
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("a symbolic link"),
        "{err:?}"
    );
    let index = dir.join("index.json");
    let moved = work.path().join("index.json");
    std::fs::rename(&index, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &index).unwrap();
    let err = Bundle::open(&dir, None).unwrap_err();
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("a symbolic link"),
        "{err:?}"
    );
}

/// Rewrite the image manifest of the layout at `dir` (and its bundle manifest, the config)
/// with `edit`, and the index entry.
fn edit_documents(dir: &Path, edit: impl FnOnce(&mut serde_json::Value, &mut serde_json::Value)) {
    let blobs = dir.join("blobs/sha256");
    let read = |digest: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(blobs.join(&digest[7..])).unwrap()).unwrap()
    };
    let write = |value: &serde_json::Value| -> (String, usize) {
        let bytes = serde_json::to_vec(value).unwrap();
        let digest = Digest::of(&bytes);
        std::fs::write(blobs.join(digest.hex()), &bytes).unwrap();
        (digest.to_string(), bytes.len())
    };
    let index_path = dir.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let mut manifest = read(index["manifests"][0]["digest"].as_str().unwrap());
    let mut config = read(manifest["config"]["digest"].as_str().unwrap());
    edit(&mut manifest, &mut config);
    let (digest, size) = write(&config);
    manifest["config"]["digest"] = digest.into();
    manifest["config"]["size"] = size.into();
    let (digest, size) = write(&manifest);
    index["manifests"][0]["digest"] = digest.into();
    index["manifests"][0]["size"] = size.into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
}

/// issue 19: a blob declaring 2^64-1 bytes was reported as "is 0 bytes" (and overflowed in
/// a debug build); it is refused when the manifest is read, stating the declared size.
#[test]
fn sizes_no_file_can_have_are_refused_stating_them() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("bundle");
    bundle(&dir);
    // A consistent hostile bundle: the UKI is the empty blob, declared 2^64-1 bytes by the
    // image manifest and the bundle manifest alike.
    let empty = Digest::of(b"");
    std::fs::write(dir.join("blobs/sha256").join(empty.hex()), b"").unwrap();
    edit_documents(&dir, |manifest, config| {
        for layer in manifest["layers"].as_array_mut().unwrap() {
            if layer["digest"] == config["blobs"]["uki"]["digest"] {
                layer["digest"] = empty.to_string().into();
                layer["size"] = u64::MAX.into();
            }
        }
        config["blobs"]["uki"]["digest"] = empty.to_string().into();
        config["blobs"]["uki"]["size"] = u64::MAX.into();
    });
    let err = Bundle::open(&dir, None).unwrap_err().to_string();
    assert!(err.contains("declares 18446744073709551615 bytes"), "{err}");
    assert!(err.contains(empty.as_str()), "{err}");
    assert!(!err.contains("is 0 bytes"), "{err}");

    // The index entry of the image manifest, and a document cap.
    let dir = work.path().join("bundle2");
    bundle(&dir);
    let index_path = dir.join("index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    index["manifests"][0]["size"] = u64::MAX.into();
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let err = Bundle::open(&dir, None).unwrap_err().to_string();
    assert!(
        err.contains("it declares 18446744073709551615 bytes")
            && err.contains("larger than 262144 bytes"),
        "{err}"
    );

    let mut verified = VerifiedBlobs::new();
    verified.insert(Digest::of(b"a"), u64::MAX);
    verified.insert(Digest::of(b"b"), 2);
    assert_eq!(verified.total_bytes(), u64::MAX);
}
