//! The upload importer (`import_tar`, formats.md §7.4): layout names only, signature before any
//! blob, each byte hashed once. The judge is slate-trust's `verify` against one trusted key, as
//! machined's is. Hashing is counted with `hashed_on_this_thread` (the importer runs on the
//! test's thread).

use std::fs;
use std::io::{self, Read};
use std::path::Path;

mod support;

use slate_bundle::{
    hashed_on_this_thread, import_tar, Bundle, Digest, ImportError, Imported, JudgeError, Refusal,
    INSTALLER_ROLE,
};
use slate_trust::{PrivateKey, PublicKey, TrustError};

/// Large enough that reading it by mistake shows; small enough for a test.
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
    support::write_test_bundle(dir, &uki(), Some(INSTALLER));
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

/// Unpack `body` into `staging`, judged by slate-trust against [`trusted`]: the signer's short
/// key id.
fn import(body: impl Read, staging: &Path) -> Result<Imported<String>, ImportError> {
    let keys = trusted();
    import_tar(body, staging, &mut |bundle| {
        let verified = slate_trust::verify(bundle, &keys).map_err(|e| match e {
            TrustError::Bundle(e) => JudgeError::Bundle(e),
            e => JudgeError::Refused(e.to_string()),
        })?;
        Ok(verified.key_id.short())
    })
}

/// Where the header of the entry `name` starts in `tar`.
fn header_offset(tar: &[u8], name: &str) -> usize {
    let mut archive = tar::Archive::new(tar);
    let entry = archive
        .entries()
        .unwrap()
        .map(Result::unwrap)
        .find(|e| e.path().unwrap() == Path::new(name))
        .unwrap_or_else(|| panic!("no {name} in the tar"));
    entry.raw_header_position() as usize
}

/// An upload body that fails any read at or past `limit`: an importer that gets there has read
/// into the entry that starts there.
struct Fence<'a> {
    bytes: &'a [u8],
    at: usize,
    limit: usize,
}

impl Read for Fence<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at >= self.bytes.len() {
            return Ok(0);
        }
        if self.at >= self.limit {
            return Err(io::Error::other("read past the documents, into a blob"));
        }
        let n = buf.len().min(self.limit - self.at);
        buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

fn uki_entry() -> String {
    format!("blobs/sha256/{}", Digest::of(&uki()).hex())
}

fn tar_with(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, kind, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(*kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        if *kind == tar::EntryType::Symlink {
            header.set_link_name("/etc/shadow").unwrap();
        }
        header.set_cksum();
        builder.append_data(&mut header, name, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

#[test]
fn links_and_foreign_names_are_refused_and_nothing_is_left_outside() {
    let dir = tempfile::tempdir().unwrap();
    let link = tar_with(&[("index.json", tar::EntryType::Symlink, b"")]);
    let err = import(&link[..], dir.path()).unwrap_err();
    assert!(err.to_string().contains("plain files only"), "{err}");
    assert!(matches!(err, ImportError::NotPlainFile { .. }), "{err:?}");
    let foreign = tar_with(&[("etc/cron.d/x", tar::EntryType::Regular, b"* * * * *")]);
    let err = import(&foreign[..], dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("not a file of an OCI layout"),
        "{err}"
    );
    assert!(!dir.path().join("etc").exists());
    let twice = tar_with(&[
        ("oci-layout", tar::EntryType::Regular, b"{}"),
        ("./oci-layout", tar::EntryType::Regular, b"{}"),
    ]);
    let err = import(&twice[..], dir.path()).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
}

#[test]
fn an_unsigned_upload_is_refused_before_any_blob_is_read() {
    let src = tempfile::tempdir().unwrap();
    let unsigned = bundle(src.path(), None);
    // The image manifest and its config, verified by opening the bundle.
    let documents: u64 = unsigned.verified_blobs().total_bytes();
    let tar = export(&unsigned);
    let first_blob = header_offset(&tar, &uki_entry());
    let mut body = Fence {
        bytes: &tar,
        at: 0,
        limit: first_blob,
    };
    let staging = tempfile::tempdir().unwrap();
    let hashed = hashed_on_this_thread();
    let err = import(&mut body, staging.path()).unwrap_err();
    assert!(
        err.to_string().contains("the bundle is not signed") && err.to_string().contains(".sig"),
        "{err}"
    );
    assert!(body.at <= first_blob, "{} > {first_blob}", body.at);
    // Hashed: the image manifest and its config, nothing else.
    assert_eq!(hashed_on_this_thread() - hashed, documents);
    assert!(documents < 4096, "{documents}");
    assert!(!staging.path().join(uki_entry()).exists());
}

#[test]
fn an_upload_signed_by_an_untrusted_key_is_refused_before_any_blob_is_read() {
    let src = tempfile::tempdir().unwrap();
    let tar = export(&bundle(src.path(), Some(2)));
    let first_blob = header_offset(&tar, &uki_entry());
    let mut body = Fence {
        bytes: &tar,
        at: 0,
        limit: first_blob,
    };
    let staging = tempfile::tempdir().unwrap();
    let err = import(&mut body, staging.path()).unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "signed by key {}",
            key(2).public_key().id().short()
        )) && err.to_string().contains("not trusted"),
        "{err}"
    );
    assert!(body.at <= first_blob);
}

#[test]
fn a_signed_upload_is_hashed_once_as_it_arrives() {
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
    let imported = import(&tar[..], staging.path()).unwrap();
    assert_eq!(imported.signed, key(1).public_key().id().short());
    assert_eq!(imported.bundle.digest(), signed.digest());
    assert_eq!(imported.bundle.dir(), staging.path());
    assert_eq!(
        hashed_on_this_thread() - start,
        upload_blobs,
        "every blob of the upload hashed exactly once as it arrived"
    );
    // The image's blobs are known verified: reading them hashes nothing more.
    imported.bundle.verify_blobs().unwrap();
    assert_eq!(
        imported.bundle.read_blob(INSTALLER_ROLE).unwrap(),
        INSTALLER
    );
    assert_eq!(hashed_on_this_thread() - start, upload_blobs);
}

/// The layout at `dir` as a tar in the order older clients sent: blobs first, index last.
fn index_last(dir: &Path) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    builder
        .append_path_with_name(dir.join("oci-layout"), "oci-layout")
        .unwrap();
    for entry in fs::read_dir(dir.join("blobs/sha256")).unwrap() {
        let entry = entry.unwrap();
        let name = format!(
            "blobs/sha256/{}",
            entry.file_name().to_str().unwrap().to_owned()
        );
        builder.append_path_with_name(entry.path(), name).unwrap();
    }
    builder
        .append_path_with_name(dir.join("index.json"), "index.json")
        .unwrap();
    builder.into_inner().unwrap()
}

#[test]
fn an_upload_with_its_index_last_is_still_checked_and_hashed_once() {
    for signer in [Some(1), None] {
        let src = tempfile::tempdir().unwrap();
        bundle(src.path(), signer);
        let tar = index_last(src.path());
        let blob_bytes: u64 = fs::read_dir(src.path().join("blobs/sha256"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        let staging = tempfile::tempdir().unwrap();
        let start = hashed_on_this_thread();
        let result = import(&tar[..], staging.path());
        match signer {
            Some(_) => {
                result.unwrap();
            }
            None => {
                let err = result.unwrap_err();
                assert!(err.to_string().contains("not signed"), "{err}");
            }
        }
        // Refused or not, the blobs were hashed as they arrived and never read again.
        assert_eq!(hashed_on_this_thread() - start, blob_bytes, "{signer:?}");
    }
}

#[test]
fn a_blob_that_does_not_match_its_name_is_refused_as_it_arrives() {
    let src = tempfile::tempdir().unwrap();
    let tar = export(&bundle(src.path(), Some(1)));
    let uki = uki();
    let at = tar.windows(64).position(|w| w == &uki[..64]).unwrap();
    let mut damaged = tar.clone();
    damaged[at + 1000] ^= 1;
    let staging = tempfile::tempdir().unwrap();
    let err = import(&damaged[..], staging.path()).unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "the blob {} does not match its name",
            Digest::of(&uki)
        )),
        "{err}"
    );
}

#[test]
fn only_documents_may_come_between_the_index_and_the_signature() {
    let src = tempfile::tempdir().unwrap();
    bundle(src.path(), Some(1));
    let uki = uki();
    let read = |name: &str| fs::read(src.path().join(name)).unwrap();
    let big = tar_with(&[
        ("oci-layout", tar::EntryType::Regular, &read("oci-layout")),
        ("index.json", tar::EntryType::Regular, &read("index.json")),
        (&uki_entry(), tar::EntryType::Regular, &uki),
    ]);
    let staging = tempfile::tempdir().unwrap();
    let err = import(&big[..], staging.path()).unwrap_err();
    assert!(
        err.to_string()
            .contains("came before the signature could be checked"),
        "{err}"
    );

    // After the signature, only the signed image's blobs, at their signed sizes.
    let signed = Bundle::open(src.path(), None).unwrap();
    let mut tar = export(&signed);
    let end = tar.len() - 1024; // the two zero blocks that end a tar
    tar.truncate(end);
    let stranger = tar_with(&[(
        &format!("blobs/sha256/{}", Digest::of(b"extra").hex()),
        tar::EntryType::Regular,
        b"extra",
    )]);
    tar.extend_from_slice(&stranger);
    let staging = tempfile::tempdir().unwrap();
    let err = import(&tar[..], staging.path()).unwrap_err();
    assert!(
        err.to_string().contains("is not part of the signed image"),
        "{err}"
    );
    assert!(
        matches!(err, ImportError::Refused(Refusal::NotInImage { .. })),
        "{err:?}"
    );
}

#[test]
fn an_upload_without_an_index_or_cut_short_is_refused() {
    let staging = tempfile::tempdir().unwrap();
    let err = import(io::empty(), staging.path()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the bundle is refused: the upload has no index.json"
    );

    // The image's last blob never arrives.
    let src = tempfile::tempdir().unwrap();
    let tar = export(&bundle(src.path(), Some(1)));
    let last = header_offset(
        &tar,
        &format!("blobs/sha256/{}", Digest::of(INSTALLER).hex()),
    );
    let mut cut = tar[..last].to_vec();
    cut.extend_from_slice(&[0; 1024]);
    let staging = tempfile::tempdir().unwrap();
    let err = import(&cut[..], staging.path()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the bundle is refused: the upload lacks the blob {}",
            Digest::of(INSTALLER)
        )
    );
}

#[test]
fn a_document_over_the_cap_is_refused_before_it_is_read() {
    let big = vec![b' '; slate_bundle::MAX_DOCUMENT_BYTES as usize + 1];
    let tar = tar_with(&[("index.json", tar::EntryType::Regular, &big)]);
    let mut body = Fence {
        bytes: &tar,
        at: 0,
        limit: 1024, // the header and a little of its bytes
    };
    let staging = tempfile::tempdir().unwrap();
    let err = import(&mut body, staging.path()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "the bundle is refused: index.json is larger than {} bytes",
            slate_bundle::MAX_DOCUMENT_BYTES
        )
    );
    assert!(!staging.path().join("index.json").exists());
}
