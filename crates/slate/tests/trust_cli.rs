//! `slate keygen`, `slate sign` and `slate verify` end to end, with the real `openssl` as the
//! independent reader of what slate writes: it verifies slate's signatures with slate's public
//! key files, and slate reads keys openssl generated.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use base64::Engine as _;
use sha2::{Digest, Sha256};
use slate_bundle::{
    write_bundle, BlobInput, Bundle, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE,
};

fn slate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(args)
        .output()
        .expect("run slate")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "slate failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn fails(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "slate succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr.clone()).unwrap()
}

fn openssl(args: &[&str]) -> Output {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl is installed (Debian's openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn bundle(dir: &Path, version: &str) -> PathBuf {
    let out = dir.join(format!("bundle-{version}"));
    write_bundle(
        &out,
        BundleSpec {
            name: "slate",
            version,
            arch: "amd64",
            variant: "test",
        },
        &[
            BlobInput {
                role: "uki",
                file_name: "slate-2.0.0.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: b"MZ pretend UKI",
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
    out
}

fn keygen(dir: &Path) -> (PathBuf, PathBuf, String) {
    let out = ok(&slate(&["keygen", "--out", s(dir)]));
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("key id "))
        .expect("keygen prints the key id")
        .to_owned();
    (dir.join("slate.key"), dir.join("slate.pub"), id)
}

#[test]
fn keygen_writes_a_private_key_0600_and_never_overwrites() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    let (private, public, id) = keygen(&keys);
    let mode = fs::metadata(&private).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(fs::read_to_string(&private)
        .unwrap()
        .starts_with("-----BEGIN PRIVATE KEY-----\n"));
    assert!(fs::read_to_string(&public)
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----\n"));
    // The key id is the SHA-256 of the SPKI DER, as openssl encodes it.
    let der = openssl(&["pkey", "-pubin", "-in", s(&public), "-outform", "DER"]).stdout;
    assert_eq!(id, hex::encode(Sha256::digest(&der)));
    // openssl reads the private key as a P-256 key.
    let text = String::from_utf8(openssl(&["pkey", "-in", s(&private), "-noout", "-text"]).stdout)
        .unwrap();
    assert!(text.contains("NIST CURVE: P-256"), "{text}");

    let before = fs::read(&private).unwrap();
    let err = fails(&slate(&["keygen", "--out", s(&keys)]));
    assert!(err.contains("slate.key already exists"), "{err}");
    assert_eq!(fs::read(&private).unwrap(), before);
}

#[test]
fn sign_then_verify_and_openssl_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public, id) = keygen(&dir.path().join("keys"));
    let b = bundle(dir.path(), "2.0.0");
    let digest = Bundle::open(&b, None).unwrap().manifest_digest().to_owned();
    let index = fs::read(b.join("index.json")).unwrap();

    // Unsigned: refused by name.
    let err = fails(&slate(&[
        "verify",
        "--bundle",
        s(&b),
        "--trusted-key",
        s(&public),
    ]));
    assert!(err.contains("the bundle is not signed"), "{err}");

    // A dry run writes nothing.
    let out = ok(&slate(&[
        "sign",
        "--bundle",
        s(&b),
        "--key",
        s(&private),
        "--dry-run",
    ]));
    assert!(
        out.starts_with(&format!(
            "would sign slate 2.0.0 (manifest {digest}) with key {id}"
        )),
        "{out}"
    );
    assert_eq!(fs::read(b.join("index.json")).unwrap(), index);

    let out = ok(&slate(&["sign", "--bundle", s(&b), "--key", s(&private)]));
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    assert_eq!(
        out,
        format!("signed slate 2.0.0 (manifest {digest}) with key {id} as {tag}\n")
    );

    let out = ok(&slate(&[
        "verify",
        "--bundle",
        s(&b),
        "--trusted-key",
        s(&public),
    ]));
    assert!(
        out.starts_with("verified slate 2.0.0 (arch amd64, variant test)\n"),
        "{out}"
    );
    assert!(
        out.contains(&format!("  manifest {digest}\n  signed by key {id}\n")),
        "{out}"
    );
    assert!(out.contains("  blob uki slate-2.0.0.efi sha256:"), "{out}");
    let json: serde_json::Value = serde_json::from_str(&ok(&slate(&[
        "verify",
        "--bundle",
        s(&b),
        "--trusted-key",
        s(&public),
        "--output",
        "json",
    ])))
    .unwrap();
    assert_eq!(json["key_id"], id.as_str());
    assert_eq!(json["manifest_digest"], digest.as_str());
    assert_eq!(json["blobs"].as_array().unwrap().len(), 2);
    // The installer still opens the signed layout without naming a tag.
    Bundle::open(&b, None).unwrap();

    // openssl verifies the stored signature over the stored payload with slate.pub.
    let layers = Bundle::open(&b, None)
        .unwrap()
        .signatures()
        .unwrap()
        .unwrap();
    let payload = dir.path().join("payload");
    let sig = dir.path().join("sig.der");
    fs::write(&payload, &layers[0].payload).unwrap();
    fs::write(
        &sig,
        base64::engine::general_purpose::STANDARD
            .decode(&layers[0].signature)
            .unwrap(),
    )
    .unwrap();
    let out = openssl(&[
        "dgst",
        "-sha256",
        "-verify",
        s(&public),
        "-signature",
        s(&sig),
        s(&payload),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Verified OK\n");
}

#[test]
fn verify_refuses_untrusted_keys_and_tampered_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let (private, _, signer) = keygen(&dir.path().join("a"));
    let (_, other, other_id) = keygen(&dir.path().join("b"));
    let b = bundle(dir.path(), "2.0.0");
    ok(&slate(&["sign", "--bundle", s(&b), "--key", s(&private)]));

    let err = fails(&slate(&[
        "verify",
        "--bundle",
        s(&b),
        "--trusted-key",
        s(&other),
    ]));
    assert!(
        err.contains(&format!(
            "the bundle is signed by key {}, which is not trusted (trusted: {})",
            &signer[..16],
            &other_id[..16]
        )),
        "{err}"
    );
    // A directory of trusted keys (rotation: several at once) works too.
    let trusted = dir.path().join("trusted");
    fs::create_dir(&trusted).unwrap();
    fs::copy(&other, trusted.join("other.pub")).unwrap();
    fs::copy(dir.path().join("a/slate.pub"), trusted.join("signer.pub")).unwrap();
    ok(&slate(&[
        "verify",
        "--bundle",
        s(&b),
        "--trusted-key",
        s(&trusted),
    ]));

    // A blob changed after signing: the signature still verifies, the blob does not.
    let bundle = Bundle::open(&b, None).unwrap();
    let uki = &bundle.blob_ref("uki").unwrap().digest;
    fs::write(
        b.join("blobs/sha256")
            .join(uki.trim_start_matches("sha256:")),
        b"MZ pretend UKX",
    )
    .unwrap();
    let err = fails(&slate(&[
        "verify",
        "--bundle",
        s(&b),
        "--trusted-key",
        s(&trusted),
    ]));
    assert!(
        err.contains("the uki blob does not match its digest"),
        "{err}"
    );
    // And signing a damaged bundle is refused before anything is written.
    let index = fs::read(b.join("index.json")).unwrap();
    let err = fails(&slate(&["sign", "--bundle", s(&b), "--key", s(&private)]));
    assert!(
        err.contains("the uki blob does not match its digest"),
        "{err}"
    );
    assert_eq!(fs::read(b.join("index.json")).unwrap(), index);
}

#[test]
fn keys_made_by_openssl_sign_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("k.pem");
    let public = dir.path().join("k.pub");
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        s(&key),
    ]);
    openssl(&["pkey", "-in", s(&key), "-pubout", "-out", s(&public)]);
    let b = bundle(dir.path(), "3.0.0");
    ok(&slate(&["sign", "--bundle", s(&b), "--key", s(&key)]));
    ok(&slate(&[
        "verify",
        "--bundle",
        s(&b),
        "--trusted-key",
        s(&public),
    ]));
    // SEC1 (`openssl ecparam -genkey`) keys too.
    let sec1 = dir.path().join("sec1.pem");
    openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        s(&sec1),
    ]);
    ok(&slate(&[
        "sign",
        "--bundle",
        s(&b),
        "--key",
        s(&sec1),
        "--dry-run",
    ]));
    // An RSA key is refused by name.
    let rsa = dir.path().join("rsa.pem");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:1024",
        "-out",
        s(&rsa),
    ]);
    let err = fails(&slate(&["sign", "--bundle", s(&b), "--key", s(&rsa)]));
    assert!(err.contains("not a PKCS#8 PEM P-256 private key"), "{err}");
}
