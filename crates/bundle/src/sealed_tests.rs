use std::io::Write as _;

use super::*;

const WHAT: &str = "the uki blob";

fn bytes() -> Vec<u8> {
    (0..70_000u32).map(|i| (i ^ (i >> 7)) as u8).collect()
}

fn take(
    fd: OwnedFd,
    claimed: &Digest,
    signed: &Digest,
    size: u64,
) -> Result<BlobBytes, HandoverError> {
    let verified = Mutex::new(VerifiedBlobs::new());
    let got = handed_over(WHAT, fd, claimed, signed, size, &verified);
    assert_eq!(
        got.is_ok(),
        lock(&verified).contains(signed, size),
        "remembered as verified exactly when taken"
    );
    got
}

/// A sealed memfd of the signed digest and size is mapped as it is, and no byte is hashed.
#[test]
fn a_sealed_memfd_of_the_signed_digest_is_taken_without_hashing() {
    let bytes = bytes();
    let digest = Digest::of(&bytes);
    let fd = seal_verified("slate-test-uki", &bytes).unwrap();
    let before = crate::hashed_on_this_thread();
    let blob = take(fd, &digest, &digest, bytes.len() as u64).unwrap();
    assert_eq!(crate::hashed_on_this_thread(), before, "not hashed again");
    assert!(blob.is_mapped() && *blob == *bytes);
}

/// The kernel holds the sealed bytes still: a write, a truncation or a growth is refused.
#[test]
fn the_seals_refuse_every_change() {
    let fd = seal_verified("slate-test-uki", b"verified").unwrap();
    let mut file = File::from(fd);
    assert!(file.write_all(b"tampered").is_err());
    assert!(file.set_len(3).is_err());
    assert!(file.set_len(100).is_err());
    assert!(
        fcntl_add_seals(&file, SealFlags::FUTURE_WRITE).is_err(),
        "sealed seals"
    );
}

/// A memfd left writable, one sealed only in part, or a plain file are refused.
#[test]
fn an_unsealed_memfd_or_a_file_is_refused() {
    let bytes = bytes();
    let digest = Digest::of(&bytes);
    let size = bytes.len() as u64;

    let open = memfd_create("slate-test-open", MemfdFlags::CLOEXEC).unwrap();
    File::from(open.try_clone().unwrap())
        .write_all(&bytes)
        .unwrap();
    let err = take(open, &digest, &digest, size).unwrap_err();
    assert!(matches!(err, HandoverError::NotSealed { .. }), "{err}");

    let part = memfd_create(
        "slate-test-part",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    File::from(part.try_clone().unwrap())
        .write_all(&bytes)
        .unwrap();
    fcntl_add_seals(&part, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL).unwrap();
    let err = take(part, &digest, &digest, size).unwrap_err();
    assert!(
        err.to_string().contains("is not sealed against changes"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("uki");
    std::fs::write(&path, &bytes).unwrap();
    let file = OwnedFd::from(File::open(&path).unwrap());
    let err = take(file, &digest, &digest, size).unwrap_err();
    assert!(matches!(err, HandoverError::NotMemfd { .. }), "{err}");
}

/// A sealed memfd named with another digest than the signed one, or of another size, is
/// refused: the parent's word must be about the blob the bundle signs.
#[test]
fn a_wrong_digest_or_size_is_refused() {
    let bytes = bytes();
    let digest = Digest::of(&bytes);
    let other = Digest::of(b"another blob");
    let size = bytes.len() as u64;
    let fd = seal_verified("slate-test-uki", &bytes).unwrap();
    let err = take(fd, &other, &digest, size).unwrap_err();
    assert!(matches!(err, HandoverError::WrongDigest { .. }), "{err}");

    let fd = seal_verified("slate-test-uki", &bytes[1..]).unwrap();
    let err = take(fd, &digest, &digest, size).unwrap_err();
    assert!(
        matches!(err, HandoverError::WrongSize { expected, actual, .. } if expected == size && actual == size - 1),
        "{err}"
    );
}
