//! The one content digest slate speaks: SHA-256, written `sha256:` followed by 64 lower-case hex
//! digits. That is the OCI image spec's canonical form (its grammar registers sha256's encoded
//! part as `[a-f0-9]{64}`), and it is the only one accepted: a digest names a file
//! (`blobs/sha256/<hex>`, a received bundle's directory) and is compared as text with one slate
//! computed, so a second spelling of the same hash could pass a check and then name nothing.
//!
//! Every digest that comes from outside (a reference, a descriptor, a signature payload, an
//! upload's entry name, a bundle id) is parsed into a [`Digest`] before it is used; bytes are
//! hashed through [`Hasher`] (or [`DigestWriter`]), which also keeps a per-thread count of the
//! bytes hashed so tests can show that a path hashes each byte once.

use std::cell::Cell;
use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

use sha2::Digest as _;

/// The algorithm prefix of every digest slate accepts.
pub const SHA256_PREFIX: &str = "sha256:";
const HEX_LEN: usize = 64;

/// A SHA-256 digest in canonical form, `sha256:<64 lower-case hex>`; only [`Digest::parse`] and
/// the hashers make one, so holding one means the text is well formed.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

/// Why a text is not a digest slate accepts. The messages quote the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("{0:?} is not a digest (algorithm:hex)")]
    NotADigest(String),
    #[error("digest algorithm {algorithm:?} of {digest:?} is not supported (sha256 only)")]
    UnsupportedAlgorithm { digest: String, algorithm: String },
    #[error("{0:?} is not a sha256 digest (64 lowercase hex digits after `sha256:`)")]
    NotCanonical(String),
}

impl DigestError {
    /// The text that was refused.
    pub fn input(&self) -> &str {
        match self {
            DigestError::NotADigest(text)
            | DigestError::NotCanonical(text)
            | DigestError::UnsupportedAlgorithm { digest: text, .. } => text,
        }
    }
}

impl Digest {
    /// `sha256:` and exactly 64 lower-case hex digits; anything else is refused (upper-case hex
    /// included: see the module comment).
    pub fn parse(text: &str) -> Result<Self, DigestError> {
        let (algorithm, encoded) = text
            .split_once(':')
            .ok_or_else(|| DigestError::NotADigest(text.to_owned()))?;
        if algorithm != "sha256" {
            return Err(DigestError::UnsupportedAlgorithm {
                digest: text.to_owned(),
                algorithm: algorithm.to_owned(),
            });
        }
        let canonical = encoded.len() == HEX_LEN
            && encoded
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !canonical {
            return Err(DigestError::NotCanonical(text.to_owned()));
        }
        Ok(Digest(text.to_owned()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        let mut hasher = Hasher::new();
        hasher.update(bytes);
        hasher.finish()
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits, without `sha256:` (the file name under `blobs/sha256`).
    pub fn hex(&self) -> &str {
        &self.0[SHA256_PREFIX.len()..]
    }

    /// The same digest as `oci-spec`'s type, for building descriptors.
    pub fn to_oci(&self) -> oci_spec::image::Digest {
        oci_spec::image::Sha256Digest::from_str(self.hex())
            .expect("64 lower-case hex digits are a valid sha256 encoding")
            .into()
    }

    /// The digest an `oci-spec` descriptor names, held to slate's rule.
    pub fn from_oci(digest: &oci_spec::image::Digest) -> Result<Self, DigestError> {
        Digest::parse(digest.as_ref())
    }

    /// A raw SHA-256 (32 bytes) as a digest.
    pub fn from_raw(hash: [u8; 32]) -> Self {
        Self::from_hash(&hash)
    }

    fn from_hash(hash: &[u8]) -> Self {
        Digest(format!("{SHA256_PREFIX}{}", hex::encode(hash)))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Digest::parse(text)
    }
}

impl AsRef<str> for Digest {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for Digest {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Digest {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Digest::parse(&text).map_err(serde::de::Error::custom)
    }
}

thread_local! {
    static HASHED_ON_THIS_THREAD: Cell<u64> = const { Cell::new(0) };
}

/// How many bytes [`Hasher`]s have hashed on the calling thread so far. A debugging and test
/// aid (tests show with it that a path hashes each byte once); per thread so that tests running
/// in parallel do not count each other's work.
pub fn hashed_on_this_thread() -> u64 {
    HASHED_ON_THIS_THREAD.with(Cell::get)
}

/// Credit the calling thread with `bytes` hashed for it on another thread.
pub(crate) fn count_hashed(bytes: u64) {
    HASHED_ON_THIS_THREAD.with(|n| n.set(n.get() + bytes));
}

/// SHA-256 over a stream of bytes, ending in a [`Digest`]. Also an [`io::Write`] sink, so
/// `io::copy(&mut reader, &mut hasher)` hashes a file without holding it.
#[derive(Clone, Default)]
pub struct Hasher {
    sha: sha2::Sha256,
    bytes: u64,
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hasher")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Hasher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.sha.update(bytes);
        self.bytes += bytes.len() as u64;
        HASHED_ON_THIS_THREAD.with(|n| n.set(n.get() + bytes.len() as u64));
    }

    /// How many bytes were hashed.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn finish(self) -> Digest {
        Digest::from_hash(&self.sha.finalize())
    }
}

impl Write for Hasher {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A writer that hashes what it passes on: a blob is hashed on its way to disk, never read back
/// to be checked.
#[derive(Debug)]
pub struct DigestWriter<W> {
    inner: W,
    hasher: Hasher,
}

impl<W: Write> DigestWriter<W> {
    pub fn new(inner: W) -> Self {
        DigestWriter {
            inner,
            hasher: Hasher::new(),
        }
    }

    /// How many bytes went through.
    pub fn bytes(&self) -> u64 {
        self.hasher.bytes()
    }

    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    pub fn get_mut(&mut self) -> &mut W {
        &mut self.inner
    }

    /// The writer back, and the digest of everything written through it.
    pub fn finish(self) -> (W, Digest) {
        (self.inner, self.hasher.finish())
    }
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    // SHA-256("abc"), FIPS 180-2 appendix B.1.
    const ABC: &str = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn known_vectors() {
        assert_eq!(Digest::of(b""), EMPTY);
        assert_eq!(Digest::of(b"abc"), ABC);
        assert_eq!(Digest::parse(EMPTY).unwrap(), Digest::of(b""));
        assert_eq!(
            Digest::of(b"").hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::of(b"abc").to_string(), ABC);
        assert_eq!(Digest::of(b"abc").to_oci().to_string(), ABC);
        assert_eq!(
            Digest::from_oci(&ABC.parse().unwrap()).unwrap(),
            Digest::of(b"abc")
        );
    }

    #[test]
    fn only_the_canonical_form_parses() {
        let upper = EMPTY.to_uppercase().replacen("SHA256", "sha256", 1);
        let mixed = format!("sha256:E{}", &EMPTY[8..]);
        assert_eq!(
            Digest::parse(&upper),
            Err(DigestError::NotCanonical(upper.clone()))
        );
        assert!(matches!(
            Digest::parse(&mixed),
            Err(DigestError::NotCanonical(_))
        ));
        for wrong_length in ["sha256:", "sha256:00", &EMPTY[..EMPTY.len() - 1]] {
            assert!(
                matches!(
                    Digest::parse(wrong_length),
                    Err(DigestError::NotCanonical(_))
                ),
                "{wrong_length}"
            );
        }
        assert!(matches!(
            Digest::parse(&format!("{EMPTY}0")),
            Err(DigestError::NotCanonical(_))
        ));
        let sha512 = format!("sha512:{}", "ab".repeat(64));
        let err = Digest::parse(&sha512).unwrap_err();
        assert!(matches!(err, DigestError::UnsupportedAlgorithm { .. }));
        assert!(err.to_string().contains("sha256 only"), "{err}");
        assert!(matches!(
            Digest::parse(&EMPTY.replacen("sha256", "SHA256", 1)),
            Err(DigestError::UnsupportedAlgorithm { .. })
        ));
        assert!(matches!(
            Digest::parse("md5:abc"),
            Err(DigestError::UnsupportedAlgorithm { .. })
        ));
        assert!(matches!(
            Digest::parse(&EMPTY[7..]),
            Err(DigestError::NotADigest(_))
        ));
        assert!(matches!(
            Digest::parse(&format!(" {EMPTY}")),
            Err(DigestError::UnsupportedAlgorithm { .. })
        ));
        assert_eq!(Digest::parse("md5:abc").unwrap_err().input(), "md5:abc");
    }

    #[test]
    fn streaming_hashers_agree_with_one_shot() {
        let mut hasher = Hasher::new();
        hasher.update(b"a");
        hasher.update(b"bc");
        assert_eq!(hasher.bytes(), 3);
        assert_eq!(hasher.finish(), ABC);

        let before = hashed_on_this_thread();
        let mut writer = DigestWriter::new(Vec::new());
        writer.write_all(b"ab").unwrap();
        writer.write_all(b"c").unwrap();
        assert_eq!(writer.bytes(), 3);
        let (bytes, digest) = writer.finish();
        assert_eq!(bytes, b"abc");
        assert_eq!(digest, ABC);
        assert_eq!(hashed_on_this_thread() - before, 3);

        let mut sink = Hasher::new();
        io::copy(&mut &b"abc"[..], &mut sink).unwrap();
        assert_eq!(sink.finish(), ABC);
    }

    #[test]
    fn serde_is_the_string_and_refuses_other_forms() {
        let digest = Digest::of(b"");
        let json = serde_json::to_string(&digest).unwrap();
        assert_eq!(json, format!("\"{EMPTY}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), digest);
        assert!(serde_json::from_str::<Digest>(&json.to_uppercase()).is_err());
    }
}
