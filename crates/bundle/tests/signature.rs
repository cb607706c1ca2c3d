//! Signature manifests in the bundle's layout: stored the way cosign stores them (tag
//! `sha256-<hex>.sig`, simple-signing layers, the signature in a layer annotation), read back
//! with every payload checked against its digest, and invisible to an untagged `Bundle::open`.

use std::fs;
use std::path::Path;

mod support;

use slate_bundle::{
    add_signature, parse_signature_manifest, signature_tag, Bundle, BundleError, SignatureLayer,
    MAX_SIGNATURES,
};

fn write(dir: &Path) -> String {
    support::write_test_bundle(dir, b"MZ pretend UKI", None);
    Bundle::open(dir, None)
        .unwrap()
        .manifest_digest()
        .to_owned()
}

fn layer(payload: &str, signature: &str, key: Option<&str>) -> SignatureLayer {
    SignatureLayer {
        payload: payload.as_bytes().to_vec(),
        signature: signature.into(),
        public_key: key.map(str::to_owned),
    }
}

#[test]
fn signatures_are_stored_under_cosigns_tag_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let digest = write(dir.path());
    let bundle = Bundle::open(dir.path(), None).unwrap();
    assert_eq!(bundle.signatures().unwrap(), None);
    assert!(bundle.signature_tags().unwrap().is_empty());

    let a = layer("payload a", "c2lnIGE=", Some("key a"));
    add_signature(dir.path(), &digest, &a).unwrap();
    let tag = signature_tag(&digest).unwrap();
    assert_eq!(tag, format!("sha256-{}.sig", &digest[7..]));
    // Still opens without a tag: signature manifests are not images to install.
    let bundle = Bundle::open(dir.path(), None).unwrap();
    assert_eq!(bundle.manifest_digest(), digest);
    assert_eq!(bundle.signatures().unwrap(), Some(vec![a.clone()]));
    assert_eq!(bundle.signature_tags().unwrap(), [tag]);

    // Another key adds a layer; the same key replaces its own.
    let b = layer("payload b", "c2lnIGI=", Some("key b"));
    add_signature(dir.path(), &digest, &b).unwrap();
    let a2 = layer("payload a2", "c2lnIGEy", Some("key a"));
    add_signature(dir.path(), &digest, &a2).unwrap();
    assert_eq!(bundle.signatures().unwrap(), Some(vec![b, a2]));
    let index = fs::read_to_string(dir.path().join("index.json")).unwrap();
    assert_eq!(index.matches(".sig\"").count(), 1, "{index}");
}

#[test]
fn signature_manifests_are_bounded_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let digest = write(dir.path());
    for i in 0..MAX_SIGNATURES {
        add_signature(dir.path(), &digest, &layer("p", &format!("s{i}"), None)).unwrap();
    }
    let err = add_signature(dir.path(), &digest, &layer("p", "one more", None)).unwrap_err();
    assert!(err.to_string().contains("more than 16 signatures"), "{err}");
    assert!(matches!(
        signature_tag("md5:abc"),
        Err(BundleError::UnsupportedDigest(_))
    ));
    let err = |text: &str| {
        parse_signature_manifest(text.as_bytes())
            .unwrap_err()
            .to_string()
    };
    assert!(err("{}").starts_with("the signature manifest is malformed"));
    let empty = r#"{"schemaVersion":2,"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:98d7c2afecebd8e1910422d3410a8e5efdca1d372fe24b2efc7f639a45fa9e2c","size":2},"layers":[]}"#;
    assert!(err(empty).ends_with("it has no signature layer"));
}
