//! The bad-input corpus, generated deterministically (fixed keys, RFC 6979 signatures, bundles
//! written by `write_bundle`): every way a bundle can be untrustworthy or unfit for a node is
//! refused with a message that says which. Damaged downloads and registry garbage are the
//! transport's corpus.

use std::fs;
use std::path::{Path, PathBuf};

use slate_bundle::{
    add_signature, signature_tag, write_bundle, BlobInput, Bundle, BundleError, BundleSpec,
    SignatureLayer, BINARY_MEDIA_TYPE, MAX_DOCUMENT_BYTES, UKI_MEDIA_TYPE,
};
use slate_trust::{
    check_update, sign, signature_for, signature_over, verify, verify_blobs, NodeFacts, Payload,
    PolicyError, PrivateKey, PublicKey, TrustError, UpdateKind,
};

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from_scalar(&[seed; 32]).unwrap()
}

fn trusted() -> Vec<PublicKey> {
    vec![key(1).public_key()]
}

fn write(dir: &Path, version: &str, arch: &str, variant: &str) {
    write_bundle(
        dir,
        BundleSpec {
            name: "slate",
            version,
            arch,
            variant,
        },
        &[
            BlobInput {
                role: "uki",
                file_name: &format!("slate-{version}.efi"),
                media_type: UKI_MEDIA_TYPE,
                bytes: format!("MZ pretend UKI {version}").as_bytes(),
            },
            BlobInput {
                role: "installer",
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: b"\x7fELF pretend slate",
            },
        ],
    )
    .unwrap();
}

/// A bundle of `version`, signed by `signer` when given.
fn bundle(version: &str, signer: Option<u8>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), version, "amd64", "demo");
    if let Some(seed) = signer {
        sign(&Bundle::open(dir.path(), None).unwrap(), &key(seed)).unwrap();
    }
    dir
}

fn open(dir: &Path) -> Bundle {
    Bundle::open(dir, None).unwrap()
}

fn blob_path(dir: &Path, digest: &str) -> PathBuf {
    dir.join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
}

fn verify_err(dir: &Path) -> String {
    verify(&open(dir), &trusted()).unwrap_err().to_string()
}

fn node(running: &str, floor: Option<&str>) -> NodeFacts {
    NodeFacts {
        arch: "amd64".into(),
        variant: "demo".into(),
        running_version: running.into(),
        version_floor: floor.map(str::to_owned),
    }
}

#[test]
fn a_bundle_signed_by_a_trusted_key_verifies_and_still_opens_without_a_tag() {
    let dir = bundle("2.0.0", Some(1));
    let b = open(dir.path());
    let verified = verify(&b, &trusted()).unwrap();
    assert_eq!(verified.key_id, key(1).public_key().id());
    assert_eq!(verified.manifest_digest, b.manifest_digest());
    assert_eq!(verified.reference, "slate");
    let blobs = verify_blobs(&b).unwrap();
    assert_eq!(
        blobs.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["installer", "uki"]
    );
    // The signature manifest is cosign's: tagged sha256-<hex>.sig in index.json.
    let index = fs::read_to_string(dir.path().join("index.json")).unwrap();
    assert!(index.contains(&signature_tag(b.manifest_digest()).unwrap()));
    // Signing is deterministic: the same bundle and key give the same layout bytes.
    let again = bundle("2.0.0", Some(1));
    assert_eq!(
        fs::read(again.path().join("index.json")).unwrap(),
        index.as_bytes()
    );
}

#[test]
fn unsigned() {
    let dir = bundle("2.0.0", None);
    let err = verify_err(dir.path());
    assert!(
        err.starts_with(
            "the bundle is not signed: its layout has no signature manifest tagged sha256-"
        ),
        "{err}"
    );
}

#[test]
fn untrusted_key() {
    let dir = bundle("2.0.0", Some(2));
    let err = verify_err(dir.path());
    assert_eq!(
        err,
        format!(
            "the bundle is signed by key {}, which is not trusted (trusted: {})",
            key(2).public_key().id().short(),
            key(1).public_key().id().short()
        )
    );
}

#[test]
fn key_rotation_old_and_new_signatures_and_keys() {
    // Signed by the old key (2) and the new one (1): a node trusting either accepts it.
    let dir = bundle("2.0.0", Some(2));
    sign(&open(dir.path()), &key(1)).unwrap();
    for keys in [vec![key(1).public_key()], vec![key(2).public_key()]] {
        let v = verify(&open(dir.path()), &keys).unwrap();
        assert_eq!(v.key_id, keys[0].id());
    }
    // A node trusting both accepts a bundle signed by either one.
    let both = vec![key(1).public_key(), key(2).public_key()];
    assert!(verify(&open(bundle("2.0.0", Some(2)).path()), &both).is_ok());
    // Re-signing with the same key replaces its signature instead of piling up.
    sign(&open(dir.path()), &key(1)).unwrap();
    assert_eq!(open(dir.path()).signatures().unwrap().unwrap().len(), 2);
    // Neither trusted: both failures are reported.
    let err = verify(&open(dir.path()), &[key(3).public_key()])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "none of the bundle's 2 signatures is valid: 1) the bundle is signed by key"
        ),
        "{err}"
    );
}

#[test]
fn bad_signature() {
    // The payload altered after signing (here: its reference), the signature kept.
    let dir = bundle("2.0.0", None);
    let b = open(dir.path());
    let mut layer = signature_for(&b, &key(1));
    layer.payload = Payload::new("evil", b.manifest_digest()).to_bytes();
    add_signature(dir.path(), b.manifest_digest(), &layer).unwrap();
    let err = verify_err(dir.path());
    assert_eq!(
        err,
        format!(
            "bad signature: it does not verify with the key it names ({}); the payload or the \
             signature was altered",
            key(1).public_key().id().short()
        )
    );
    // Without the signer's key in the layer (as cosign writes it) the cause cannot be told.
    layer.public_key = None;
    let dir = bundle("2.0.0", None);
    add_signature(dir.path(), b.manifest_digest(), &layer).unwrap();
    let err = verify(&open(dir.path()), &trusted()).unwrap_err();
    assert!(matches!(err, TrustError::NotVerified { .. }), "{err}");
    assert!(err.to_string().starts_with("no trusted key ("), "{err}");
}

#[test]
fn tampered_blob() {
    let dir = bundle("2.0.0", Some(1));
    let b = open(dir.path());
    let uki = b.blob_ref("uki").unwrap().digest.clone();
    fs::write(blob_path(dir.path(), &uki), b"MZ pretend UKX 2.0.0").unwrap();
    // The signature is over the manifest, which names the blob's digest: the blob fails on read.
    verify(&b, &trusted()).unwrap();
    let err = verify_blobs(&b).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "the uki blob does not match its digest: expected {uki}, got sha256:"
        )),
        "{err}"
    );
}

#[test]
fn truncated_blob() {
    let dir = bundle("2.0.0", Some(1));
    let b = open(dir.path());
    let installer = b.blob_ref("installer").unwrap().digest.clone();
    fs::write(blob_path(dir.path(), &installer), b"\x7fELF").unwrap();
    let err = verify_blobs(&b).unwrap_err().to_string();
    assert_eq!(err, "the installer blob is 4 bytes, its descriptor says 18");
}

#[test]
fn manifest_digest_mismatch() {
    // The manifest the index points at was altered in place (e.g. a blob swapped for another of
    // the same name): its bytes no longer hash to the digest that was signed.
    let dir = bundle("2.0.0", Some(1));
    let digest = open(dir.path()).manifest_digest().to_owned();
    let path = blob_path(dir.path(), &digest);
    let text = fs::read_to_string(&path).unwrap().replace("2.0.0", "9.0.0");
    fs::write(&path, text).unwrap();
    let err = Bundle::open(dir.path(), None).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!(
            "the image manifest does not match its digest: expected {digest}, got sha256:"
        )),
        "{err}"
    );
}

#[test]
fn rewritten_bundle_whose_signature_is_for_the_original() {
    // An attacker rewrites the bundle (new version, every digest recomputed): its manifest has a
    // new digest, for which no signature exists; the old one names the original.
    let dir = bundle("2.0.0", Some(1));
    let original = open(dir.path()).manifest_digest().to_owned();
    let index = fs::read_to_string(dir.path().join("index.json")).unwrap();
    write(dir.path(), "9.0.0", "amd64", "demo");
    let rewritten = fs::read_to_string(dir.path().join("index.json")).unwrap();
    let sig_entry: serde_json::Value = serde_json::from_str(&index).unwrap();
    let mut new_index: serde_json::Value = serde_json::from_str(&rewritten).unwrap();
    new_index["manifests"]
        .as_array_mut()
        .unwrap()
        .push(sig_entry["manifests"][1].clone());
    fs::write(dir.path().join("index.json"), new_index.to_string()).unwrap();
    let err = verify_err(dir.path());
    assert!(
        err.ends_with(&format!(
            "(it has signatures for other manifests: {})",
            signature_tag(&original).unwrap()
        )),
        "{err}"
    );
}

#[test]
fn signature_payload_for_another_digest() {
    // A genuine signature by a trusted key, over another bundle's manifest, filed under this one.
    let other = bundle("1.0.0", None);
    let other_digest = open(other.path()).manifest_digest().to_owned();
    let dir = bundle("2.0.0", None);
    let digest = open(dir.path()).manifest_digest().to_owned();
    let layer = signature_over(&Payload::new("slate", &other_digest), &key(1));
    add_signature(dir.path(), &digest, &layer).unwrap();
    let err = verify_err(dir.path());
    assert_eq!(
        err,
        format!(
            "the signature by key {} is for manifest {other_digest}, not this bundle's {digest}",
            key(1).public_key().id().short()
        )
    );
}

#[test]
fn malformed_signatures_and_payloads() {
    let dir = bundle("2.0.0", None);
    let digest = open(dir.path()).manifest_digest().to_owned();
    let good = signature_for(&open(dir.path()), &key(1));
    let cases: [(SignatureLayer, &str); 4] = [
        (
            SignatureLayer {
                signature: "not base64!".into(),
                ..good.clone()
            },
            "the signature is malformed: the signature is not base64",
        ),
        (
            SignatureLayer {
                signature: "AAAA".into(),
                ..good.clone()
            },
            "the signature is malformed: the signature (3 bytes) is not a DER-encoded ECDSA P-256 signature",
        ),
        (
            SignatureLayer {
                payload: b"{\"critical\":{}}".to_vec(),
                ..good.clone()
            },
            "the signature payload is malformed: not a simple-signing document: missing field",
        ),
        (
            SignatureLayer {
                public_key: Some("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n".into()),
                signature: signature_for(&open(dir.path()), &key(2)).signature,
                ..good.clone()
            },
            "the signature is malformed: its signer public-key annotation is unusable",
        ),
    ];
    for (layer, message) in cases {
        let d = bundle("2.0.0", None);
        add_signature(d.path(), &digest, &layer).unwrap();
        let err = verify_err(d.path());
        assert!(err.starts_with(message), "{err}\nexpected: {message}");
    }
}

#[test]
fn malformed_signature_manifest() {
    let dir = bundle("2.0.0", Some(1));
    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(dir.path().join("index.json")).unwrap()).unwrap();
    let sig_digest = index["manifests"][1]["digest"].as_str().unwrap().to_owned();
    let path = blob_path(dir.path(), &sig_digest);
    let text = fs::read_to_string(&path).unwrap();
    // Altered in place: caught by its digest.
    fs::write(&path, text.replace("simplesigning", "simplesignin_")).unwrap();
    let err = verify_err(dir.path());
    assert!(
        err.starts_with("the signature manifest does not match its digest"),
        "{err}"
    );
    // Re-digested garbage: caught by its shape, by name.
    for (from, to, message) in [
        ("simplesigning", "simplesignin_", "layer 1 is application/vnd.dev.cosign.simplesignin_.v1+json, not a simple-signing payload"),
        ("dev.cosignproject.cosign/signature", "dev.cosignproject.cosign/signaturX", "layer 1 has no dev.cosignproject.cosign/signature annotation"),
        ("\"layers\"", "\"layerz\"", "the signature manifest is malformed: missing field `layers`"),
    ] {
        let garbage = text.replace(from, to);
        let digest = slate_bundle::sha256_digest(garbage.as_bytes());
        fs::write(blob_path(dir.path(), &digest), &garbage).unwrap();
        let new_index = fs::read_to_string(dir.path().join("index.json"))
            .unwrap()
            .replace(&sig_digest, &digest)
            .replace(
                &format!("\"size\": {}", text.len()),
                &format!("\"size\": {}", garbage.len()),
            );
        let d = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), d.path());
        fs::write(d.path().join("index.json"), new_index).unwrap();
        let err = verify(&Bundle::open(d.path(), None).unwrap(), &trusted())
            .unwrap_err()
            .to_string();
        assert!(err.contains(message), "{err}\nexpected: {message}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to.join("blobs/sha256")).unwrap();
    for file in ["index.json", "oci-layout"] {
        fs::copy(from.join(file), to.join(file)).unwrap();
    }
    for entry in fs::read_dir(from.join("blobs/sha256")).unwrap() {
        let entry = entry.unwrap();
        fs::copy(
            entry.path(),
            to.join("blobs/sha256").join(entry.file_name()),
        )
        .unwrap();
    }
}

#[test]
fn oversize_manifest() {
    // An image manifest past the document cap is refused before it is parsed or hashed in full.
    let dir = bundle("2.0.0", Some(1));
    let digest = open(dir.path()).manifest_digest().to_owned();
    let huge = vec![b' '; MAX_DOCUMENT_BYTES as usize + 1];
    let huge_digest = slate_bundle::sha256_digest(&huge);
    fs::write(blob_path(dir.path(), &huge_digest), &huge).unwrap();
    let index = fs::read_to_string(dir.path().join("index.json")).unwrap();
    let size_of = |d: &str| fs::metadata(blob_path(dir.path(), d)).unwrap().len();
    let index = index.replacen(&digest, &huge_digest, 1).replacen(
        &format!("\"size\": {}", size_of(&digest)),
        &format!("\"size\": {}", huge.len()),
        1,
    );
    fs::write(dir.path().join("index.json"), index).unwrap();
    let err = Bundle::open(dir.path(), None).unwrap_err();
    assert!(matches!(err, BundleError::Oversize { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "the image manifest (it declares {} bytes) is larger than {MAX_DOCUMENT_BYTES} bytes",
            huge.len()
        )
    );
    // So is an oversize signature payload.
    let dir = bundle("2.0.0", None);
    let b = open(dir.path());
    let mut layer = signature_for(&b, &key(1));
    layer.payload = huge.clone();
    add_signature(dir.path(), b.manifest_digest(), &layer).unwrap();
    assert_eq!(
        verify_err(dir.path()),
        format!("signature payload 1 is larger than {MAX_DOCUMENT_BYTES} bytes")
    );
}

#[test]
fn no_trusted_keys() {
    let dir = bundle("2.0.0", Some(1));
    let err = verify(&open(dir.path()), &[]).unwrap_err().to_string();
    assert_eq!(
        err,
        "no trusted keys in the list of trusted keys: nothing could verify a bundle"
    );
    let empty = tempfile::tempdir().unwrap();
    fs::write(empty.path().join("README"), "not a key").unwrap();
    let err = slate_trust::load_trusted_keys(empty.path()).unwrap_err();
    assert!(err.to_string().starts_with("no trusted keys in "), "{err}");
    fs::write(empty.path().join("bad.pub"), "-----BEGIN PUBLIC KEY-----\n").unwrap();
    let err = slate_trust::load_trusted_keys(empty.path()).unwrap_err();
    assert!(
        err.to_string()
            .contains("bad.pub: not an SPKI PEM P-256 public key"),
        "{err}"
    );
}

#[test]
fn trusted_keys_load_from_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    for seed in [1, 2, 1] {
        let key = key(seed).public_key();
        fs::write(
            dir.path().join(format!("{seed}-{}.pub", key.id().short())),
            key.to_pem(),
        )
        .unwrap();
    }
    let keys = slate_trust::load_trusted_keys(dir.path()).unwrap();
    assert_eq!(keys.len(), 2);
    let signed = bundle("2.0.0", Some(2));
    assert_eq!(
        verify(&open(signed.path()), &keys).unwrap().key_id,
        key(2).public_key().id()
    );
}

fn manifest(dir: &Path) -> slate_bundle::BundleManifest {
    open(dir).manifest().clone()
}

#[test]
fn wrong_arch() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "2.0.0", "arm64", "demo");
    let err = check_update(&manifest(dir.path()), &node("1.0.0", None), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the bundle is for arch arm64, this node is amd64"
    );
}

#[test]
fn wrong_variant() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "2.0.0", "amd64", "edge");
    let err = check_update(&manifest(dir.path()), &node("1.0.0", None), false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the bundle is variant \"edge\", this node runs variant \"demo\""
    );
}

#[test]
fn downgrade() {
    let dir = bundle("1.0.0", Some(1));
    let m = manifest(dir.path());
    assert_eq!(
        check_update(&m, &node("2.0.0", None), false)
            .unwrap_err()
            .to_string(),
        "1.0.0 is older than the running 2.0.0; a downgrade needs --allow-downgrade"
    );
    assert_eq!(
        check_update(&m, &node("2.0.0", None), true),
        Ok(UpdateKind::Downgrade)
    );
    assert!(matches!(
        check_update(&m, &node("2.0.0", Some("1.5.0")), true),
        Err(PolicyError::BelowFloor { .. })
    ));
    assert_eq!(
        check_update(&m, &node("1.0.0", Some("1.0.0")), false),
        Ok(UpdateKind::Reinstall)
    );
}
