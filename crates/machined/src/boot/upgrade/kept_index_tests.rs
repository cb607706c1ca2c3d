use std::path::Path;

use slate_bundle::{
    write_installable_bundle_with, BlobInput, BundleSpec, InstallDefaults, BINARY_MEDIA_TYPE,
    UKI_MEDIA_TYPE,
};
use slate_trust::PrivateKey;

use super::*;

fn key(seed: u8) -> PrivateKey {
    PrivateKey::from_scalar(&[seed; 32]).unwrap()
}

/// Bytes that do not repeat (so every chunk is its own).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A signed bundle of `version` with a chunk index, as the imager writes one.
fn signed(dir: &Path, version: &str) -> Bundle {
    let (uki, installer) = (noise(1, 2 << 20), noise(2, 1 << 20));
    write_installable_bundle_with(
        dir,
        BundleSpec {
            name: "slate",
            version,
            arch: "amd64",
            variant: "demo",
        },
        InstallDefaults {
            esp_mib: 64,
            state_mib: 32,
            tries: 3,
            menu_timeout: 1,
            keep_versions: 2,
        },
        &[
            BlobInput {
                role: UKI_ROLE,
                file_name: "slate.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: &uki,
            },
            BlobInput {
                role: INSTALLER_ROLE,
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: &installer,
            },
        ],
        slate_delta::DEFAULT_PARAMS,
    )
    .unwrap();
    let bundle = Bundle::open(dir, None).unwrap();
    slate_trust::sign(&bundle, &key(1)).unwrap();
    Bundle::open(dir, None).unwrap()
}

fn du(dir: &Path) -> u64 {
    fs::read_dir(dir.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn the_installed_bundles_documents_are_kept_and_verified_again_when_read() {
    let (b1, b2, state) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let (v1, v2) = (signed(b1.path(), "1.0.0"), signed(b2.path(), "2.0.0"));
    let trusted = [key(1).public_key()];

    let kept = keep(state.path(), &v1, "0.9.0").unwrap();
    // The documents, not the 3 MiB of blobs.
    assert!(du(&kept) < 256 << 10, "{}", du(&kept));
    let (bundle, index) = running_index(state.path(), "1.0.0", &trusted)
        .unwrap()
        .expect("kept");
    assert_eq!(bundle.digest(), v1.digest());
    assert_eq!(index, v1.chunk_index().unwrap().unwrap());
    // Another version, or keys that did not sign it: nothing, or a refusal.
    assert!(running_index(state.path(), "2.0.0", &trusted)
        .unwrap()
        .is_none());
    let err = running_index(state.path(), "1.0.0", &[key(2).public_key()]).unwrap_err();
    assert!(err.contains("refused"), "{err}");

    // Upgrading 1.0.0 -> 2.0.0 keeps both (the way back); 2.0.0 -> 3.0.0 would drop 1.0.0.
    keep(state.path(), &v2, "1.0.0").unwrap();
    assert!(running_index(state.path(), "1.0.0", &trusted)
        .unwrap()
        .is_some());
    assert!(running_index(state.path(), "2.0.0", &trusted)
        .unwrap()
        .is_some());
    let b3 = tempfile::tempdir().unwrap();
    keep(state.path(), &signed(b3.path(), "3.0.0"), "2.0.0").unwrap();
    assert!(running_index(state.path(), "1.0.0", &trusted)
        .unwrap()
        .is_none());
    assert_eq!(
        fs::read_dir(state.path().join(KEPT_DIR)).unwrap().count(),
        2
    );
}

#[test]
fn a_kept_index_changed_on_state_is_refused() {
    let (b1, state) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let v1 = signed(b1.path(), "1.0.0");
    let kept = keep(state.path(), &v1, "0.9.0").unwrap();
    let index = v1.chunk_index().unwrap().unwrap();
    let hex = hex::encode(slate_delta::sha256(&index.to_bytes()));
    let path = kept.join("blobs/sha256").join(hex);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&path, bytes).unwrap();
    let err = running_index(state.path(), "1.0.0", &[key(1).public_key()]).unwrap_err();
    assert!(err.contains("chunk index"), "{err}");
}

#[test]
fn seeds_are_the_roles_the_running_index_lists() {
    let b1 = tempfile::tempdir().unwrap();
    let v1 = signed(b1.path(), "1.0.0");
    let index = v1.chunk_index().unwrap().unwrap();
    let uki = v1.read_blob(UKI_ROLE).unwrap();
    let installer = fs::File::open(
        b1.path()
            .join("blobs/sha256")
            .join(&v1.blob_ref(INSTALLER_ROLE).unwrap().digest["sha256:".len()..]),
    )
    .unwrap();
    let both = seeds(
        &v1,
        &index,
        Running {
            uki: Some(uki),
            loader: None,
            installer: Some(installer),
        },
    );
    let listed: Vec<String> = both.iter().map(|s| s.chunks.oci_digest()).collect();
    assert_eq!(
        listed,
        [
            v1.blob_ref(UKI_ROLE).unwrap().digest.clone(),
            v1.blob_ref(INSTALLER_ROLE).unwrap().digest.clone()
        ]
    );
    assert!(seeds(&v1, &index, Running::default()).is_empty());
}
