//! machined's side of an upload: the judge (slate-trust against the node's keys, an installer
//! required), the mapping of refusals onto the API's errors, and what is remembered for `plan`
//! and the Upgrade sequence. The tar itself (names, order, sizes) is tested with the importer
//! in `crates/bundle/tests/import.rs`. Hashing is counted with
//! `slate_bundle::hashed_on_this_thread` (the receiver runs on the test's thread).

use std::fs;
use std::path::Path;

use slate_bundle::{
    hashed_on_this_thread, write_bundle, BlobInput, Bundle, BundleSpec, VerifiedBlobs,
    BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE,
};
use slate_trust::{PrivateKey, PublicKey};

use super::super::{check_signed, write_installer};
use super::*;

/// Large enough that reading it by mistake shows; small enough for a unit test.
const UKI_BYTES: usize = 4 << 20;
const INSTALLER: &[u8] = b"\x7fELF pretend slate installer";

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from_scalar(&[seed; 32]).unwrap()
}

fn trusted() -> Vec<PublicKey> {
    vec![key(1).public_key()]
}

fn uki() -> Vec<u8> {
    (0..UKI_BYTES).map(|i| (i * 31 % 251) as u8).collect()
}

/// A bundle in `dir` with a 4 MiB UKI, signed by `signer` when given.
fn bundle(dir: &Path, signer: Option<u8>) -> Bundle {
    bundle_with(dir, signer, true)
}

/// [`bundle`], with or without its installer binary.
fn bundle_with(dir: &Path, signer: Option<u8>, installer: bool) -> Bundle {
    versioned(dir, signer, installer, "2.0.0")
}

/// [`bundle_with`] of another version (another id).
fn versioned(dir: &Path, signer: Option<u8>, installer: bool, version: &str) -> Bundle {
    let uki = uki();
    let blobs = [
        BlobInput {
            role: "uki",
            file_name: "slate-2.0.0.efi",
            media_type: UKI_MEDIA_TYPE,
            bytes: &uki,
        },
        BlobInput {
            role: INSTALLER_ROLE,
            file_name: "slate",
            media_type: BINARY_MEDIA_TYPE,
            bytes: INSTALLER,
        },
    ];
    let count = if installer { 2 } else { 1 };
    write_bundle(
        dir,
        BundleSpec {
            name: "slate",
            version,
            arch: "amd64",
            variant: "demo",
        },
        &blobs[..count],
    )
    .unwrap();
    let bundle = Bundle::open(dir, None).unwrap();
    if let Some(seed) = signer {
        slate_trust::sign(&bundle, &key(seed)).unwrap();
    }
    Bundle::open(dir, None).unwrap()
}

fn export(bundle: &Bundle) -> Vec<u8> {
    let mut tar = Vec::new();
    bundle.export_tar(&mut tar).unwrap();
    tar
}

fn receive(tar: &[u8], staging: &Path) -> Result<Received, BackendError> {
    receive_into(staging, &trusted(), &mut &tar[..])
}

#[test]
fn a_signed_upload_is_hashed_once_and_not_again_before_its_installer_runs() {
    let src = tempfile::tempdir().unwrap();
    let signed = bundle(src.path(), Some(1));
    let tar = export(&signed);
    let upload_blobs: u64 = tar::Archive::new(&tar[..])
        .entries()
        .unwrap()
        .map(Result::unwrap)
        .filter(|e| e.path().unwrap().starts_with("blobs/sha256"))
        .map(|e| e.size())
        .sum();
    let staging = tempfile::tempdir().unwrap();
    let start = hashed_on_this_thread();
    let received = receive(&tar, staging.path()).unwrap();
    assert_eq!(received.signed, key(1).public_key().id().short());
    assert_eq!(received.bundle.digest(), signed.digest());
    assert_eq!(
        hashed_on_this_thread() - start,
        upload_blobs,
        "every blob of the upload hashed exactly once as it arrived"
    );

    // plan and the Upgrade sequence, in the same boot: the remembered digests are trusted,
    // nothing is hashed again, and the installer comes out whole.
    let id = received.bundle.digest().clone();
    remember(&id, received.bundle.verified_blobs());
    let after_receive = hashed_on_this_thread();
    let (bundle, signer) = check_signed(staging.path(), &id, remembered(&id), &trusted()).unwrap();
    assert_eq!(signer, key(1).public_key().id().short());
    bundle.verify_blobs().unwrap();
    let installer = staging.path().join("installer");
    assert_eq!(
        write_installer(&bundle, &installer).unwrap(),
        INSTALLER.len() as u64
    );
    assert_eq!(fs::read(&installer).unwrap(), INSTALLER);
    assert_eq!(hashed_on_this_thread(), after_receive);

    // After a reboot (a staged upgrade) nothing is remembered: each byte is hashed once more.
    let (bundle, _) = check_signed(staging.path(), &id, VerifiedBlobs::new(), &trusted()).unwrap();
    bundle.verify_blobs().unwrap();
    write_installer(&bundle, &installer).unwrap();
    assert_eq!(
        hashed_on_this_thread() - after_receive,
        bundle.verified_blobs().total_bytes()
    );
}

#[test]
fn a_refused_upload_is_an_invalid_argument_in_the_importers_words() {
    let src = tempfile::tempdir().unwrap();
    let staging = tempfile::tempdir().unwrap();
    let err = receive(&export(&bundle(src.path(), None)), staging.path()).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidArgument(m)
            if m.starts_with("the bundle is refused: the bundle is not signed") && m.contains(".sig")),
        "{err:?}"
    );

    let src = tempfile::tempdir().unwrap();
    let staging = tempfile::tempdir().unwrap();
    let err = receive(&export(&bundle(src.path(), Some(2))), staging.path()).unwrap_err();
    let untrusted = format!(
        "the bundle is refused: the bundle is signed by key {}, which is not trusted",
        key(2).public_key().id().short()
    );
    assert!(
        matches!(&err, BackendError::InvalidArgument(m) if m.starts_with(&untrusted)),
        "{err:?}"
    );

    let staging = tempfile::tempdir().unwrap();
    let err = receive(b"not a tar", staging.path()).unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
}

#[test]
fn a_signed_bundle_without_an_installer_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let tar = export(&bundle_with(src.path(), Some(1), false));
    let staging = tempfile::tempdir().unwrap();
    let err = receive(&tar, staging.path()).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidArgument(m)
            if m == "the bundle is refused: the bundle carries no installer blob"),
        "{err:?}"
    );
}

#[test]
fn a_staging_directory_that_cannot_be_written_is_a_failure_not_the_uploads_fault() {
    let src = tempfile::tempdir().unwrap();
    let tar = export(&bundle(src.path(), Some(1)));
    let not_a_dir = tempfile::NamedTempFile::new().unwrap();
    let err = receive(&tar, not_a_dir.path()).unwrap_err();
    assert!(
        matches!(&err, BackendError::Failed(m) if m.starts_with(&not_a_dir.path().display().to_string())),
        "{err:?}"
    );
}

/// A signed upload of `version`, exported.
fn upload_of(version: &str) -> (Vec<u8>, Digest) {
    let src = tempfile::tempdir().unwrap();
    let bundle = versioned(src.path(), Some(1), true, version);
    (export(&bundle), bundle.digest().clone())
}

/// An upload body that stops after `first` bytes until `go` says so.
struct Stalled {
    data: Vec<u8>,
    at: usize,
    first: usize,
    go: Option<std::sync::mpsc::Receiver<()>>,
    stalled: Option<std::sync::mpsc::Sender<()>>,
}

impl Read for Stalled {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at >= self.first {
            if let Some(stalled) = self.stalled.take() {
                stalled.send(()).unwrap();
            }
            if let Some(go) = self.go.take() {
                go.recv().unwrap();
            }
        }
        let end = if self.at < self.first {
            self.first
        } else {
            self.data.len()
        };
        let n = buf.len().min(end - self.at);
        buf[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn kept_ids(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// issue 19: with one upload stalled and one fast, the fast one was answered 200 and then
/// "no received bundle": the stalled one's start had removed it, and its own staging was
/// removed under it ("index.json: No such file or directory"). Each now keeps its own.
#[test]
fn two_uploads_at_once_both_keep_their_bundle() {
    let root = tempfile::tempdir().unwrap();
    let (slow_tar, slow_id) = upload_of("2.0.0");
    let (fast_tar, fast_id) = upload_of("2.1.0");
    let (go, wait) = std::sync::mpsc::channel();
    let (stalled, is_stalled) = std::sync::mpsc::channel();
    let slow = {
        let root = root.path().to_owned();
        std::thread::spawn(move || {
            let mut body = Stalled {
                first: slow_tar.len() / 2,
                data: slow_tar,
                at: 0,
                go: Some(wait),
                stalled: Some(stalled),
            };
            keep_upload(&root, &trusted(), &mut body).map(|k| k.bytes)
        })
    };
    is_stalled.recv().unwrap();
    let fast = keep_upload(root.path(), &trusted(), &mut &fast_tar[..]).unwrap();
    assert_eq!(fast.received.bundle.digest(), &fast_id);
    // The importer stops at the end-of-archive marker.
    assert!(fast.bytes > 0 && fast.bytes <= fast_tar.len() as u64);
    go.send(()).unwrap();
    slow.join().unwrap().unwrap();
    for id in [&slow_id, &fast_id] {
        let dir = root.path().join(id.hex());
        let bundle = super::super::open_received(&dir, id, remembered(id)).unwrap();
        assert_eq!(bundle.digest(), id);
    }
    assert_eq!(kept_ids(root.path()).len(), 2, "no staging left behind");
}

/// The retention rule: three bundles kept, the oldest removed first; never the one an upgrade
/// is using; a pull counts its own as the newest; an installed bundle is removed; staging left
/// by an earlier process is removed.
#[test]
fn the_last_three_bundles_are_kept_oldest_removed_first() {
    let root = tempfile::tempdir().unwrap();
    // Versions of this test's own: the remembered digests are the process's.
    let uploads: Vec<_> = ["3.0.0", "3.0.1", "3.0.2", "3.0.3", "3.0.4"]
        .iter()
        .map(|v| upload_of(v))
        .collect();
    let stale = root.path().join(".incoming-1-0");
    fs::create_dir_all(stale.join("blobs")).unwrap();
    for (tar, _) in &uploads[..4] {
        keep_upload(root.path(), &trusted(), &mut &tar[..]).unwrap();
    }
    let hex = |i: usize| uploads[i].1.hex().to_owned();
    let mut newest: Vec<String> = (1..4).map(hex).collect();
    newest.sort();
    assert_eq!(
        kept_ids(root.path()),
        newest,
        "3.0.0 went first, and the stale staging"
    );
    assert_eq!(remembered(&uploads[0].1), VerifiedBlobs::new());

    // 3.0.1, the oldest, is being installed: it keeps its place, the next upload removes
    // 3.0.2 instead.
    hold(&uploads[1].1);
    keep_upload(root.path(), &trusted(), &mut &uploads[4].0[..]).unwrap();
    let mut expected: Vec<String> = [1, 3, 4].map(hex).to_vec();
    expected.sort();
    assert_eq!(kept_ids(root.path()), expected);
    // Installed: removed, and no longer held.
    used(&root.path().join(hex(1)), &uploads[1].1).unwrap();
    let mut expected: Vec<String> = [3, 4].map(hex).to_vec();
    expected.sort();
    assert_eq!(kept_ids(root.path()), expected);

    // A pull into a new directory counts as the newest: two others stay.
    keep_upload(root.path(), &trusted(), &mut &uploads[0].0[..]).unwrap();
    let pulled = root.path().join("ab".repeat(32));
    retain(root.path(), Some(&pulled));
    let mut expected: Vec<String> = [0, 4].map(hex).to_vec();
    expected.sort();
    assert_eq!(kept_ids(root.path()), expected);
}

/// What a power cut mid-upload left is removed at start, before any upload is given its room
/// (var_survives_power_cut's upload after the cut was refused 413 once for want of it).
#[test]
fn tidy_removes_an_earlier_process_staging_and_keeps_three() {
    let root = tempfile::tempdir().unwrap();
    assert_eq!(tidy(&root.path().join("absent")), 0);
    let stale = root.path().join(".incoming-1-7");
    fs::create_dir_all(stale.join("blobs/sha256")).unwrap();
    fs::write(stale.join("blobs/sha256/half"), vec![0u8; 4096]).unwrap();
    let uploads: Vec<_> = ["4.0.0", "4.0.1", "4.0.2", "4.0.3"]
        .iter()
        .map(|v| upload_of(v))
        .collect();
    for (i, (_, id)) in uploads.iter().enumerate() {
        let dir = root.path().join(id.hex());
        fs::create_dir_all(&dir).unwrap();
        let when = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + i as u64);
        fs::File::open(&dir).unwrap().set_modified(when).unwrap();
    }
    assert_eq!(tidy(root.path()), 1);
    assert!(!stale.exists());
    let mut newest: Vec<String> = uploads[1..]
        .iter()
        .map(|(_, id)| id.hex().to_owned())
        .collect();
    newest.sort();
    assert_eq!(kept_ids(root.path()), newest, "the oldest of four went");
    assert_eq!(tidy(root.path()), 0, "nothing more to do");
}

/// An upload that outgrows the room there was for it is refused before it fills /var.
#[test]
fn an_upload_larger_than_the_free_space_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (tar, _) = upload_of("2.0.0");
    let mut body = Guarded {
        inner: &mut &tar[..],
        bytes: 0,
        room: Some(1 << 20),
        root: root.path(),
    };
    let err = receive_into(root.path(), &trusted(), &mut body).unwrap_err();
    assert!(
        matches!(&err, BackendError::InvalidArgument(m) if m.contains("1048576 bytes that were free")),
        "{err:?}"
    );
}

/// An upload's UKI is kept sealed for the installer without hashing it again: the copy, made
/// from where the bundle is kept, passes the installer's own check (a memfd, every seal, the
/// signed size and digest) and holds the UKI's bytes; the bundle's removal lets it go.
#[test]
fn an_uploads_uki_is_sealed_for_the_installer_without_hashing_it_again() {
    use super::super::sealed_uki;
    let root = tempfile::tempdir().unwrap();
    // A version of its own: the other tests' retention must not forget this one's bundle.
    let (tar, id) = upload_of("2.0.0-sealed");
    let start = hashed_on_this_thread();
    let kept = keep_upload(root.path(), &trusted(), &mut &tar[..]).unwrap();
    let upload_blobs = kept.received.bundle.verified_blobs().total_bytes();
    assert!(
        hashed_on_this_thread() - start <= upload_blobs,
        "the UKI hashed again to seal it"
    );
    let sealed = kept.sealed.unwrap();
    let (fd, digest) = sealed.parts();
    assert_eq!(digest, Digest::of(&uki()));
    let installer_side = Bundle::open(&root.path().join(id.hex()), None).unwrap();
    let before = hashed_on_this_thread();
    let mapped = installer_side
        .handed_over_blob("uki", fd.try_clone().unwrap(), &digest)
        .unwrap();
    assert!(*mapped == *uki());
    assert_eq!(hashed_on_this_thread(), before, "the installer hashed it");

    sealed_uki::keep(sealed);
    assert!(sealed_uki::of(&id).is_some());
    assert!(sealed_uki::of(&Digest::of(b"another bundle")).is_none());
    forget(id.hex());
    assert!(sealed_uki::of(&id).is_none(), "kept after its bundle went");
}
