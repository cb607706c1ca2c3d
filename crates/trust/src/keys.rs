//! Keys: ECDSA P-256 (cosign's default scheme). Private keys as PKCS#8 PEM (`BEGIN PRIVATE KEY`;
//! SEC1 `BEGIN EC PRIVATE KEY`, as `openssl ecparam -genkey` writes, is read too); public keys as
//! SPKI PEM (`BEGIN PUBLIC KEY`), which is what cosign's `cosign.pub` holds. A key's id is the
//! SHA-256 of its SPKI DER (uncompressed point, as slate writes it).

use std::fmt;
use std::path::Path;

use p256::ecdsa::signature::{Signer as _, Verifier as _};
use p256::ecdsa::{DerSignature, Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _, EncodePrivateKey as _};
use p256::pkcs8::{EncodePublicKey as _, LineEnding};
use sha2::{Digest as _, Sha256};

use crate::TrustError;

/// How many hex digits of a key id messages show.
pub const SHORT_KEY_ID_LEN: usize = 16;

/// SHA-256 of a public key's SPKI DER. `Display` is the full hex; [`KeyId::short`] is for
/// messages.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId([u8; 32]);

impl KeyId {
    /// All 64 hex digits (trusted key files are named `<hex>.pub`).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first [`SHORT_KEY_ID_LEN`] hex digits.
    pub fn short(&self) -> String {
        self.to_hex()[..SHORT_KEY_ID_LEN].to_owned()
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({})", self.short())
    }
}

/// A public key that may verify bundle signatures.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
    id: KeyId,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.id.short())
    }
}

impl PublicKey {
    fn new(key: VerifyingKey) -> Self {
        let der = key
            .to_public_key_der()
            .expect("a P-256 point always encodes as SPKI");
        let id = KeyId(Sha256::digest(der.as_bytes()).into());
        Self { key, id }
    }

    /// Parse an SPKI PEM (`-----BEGIN PUBLIC KEY-----`) holding a P-256 key.
    pub fn from_pem(pem: &str) -> Result<Self, TrustError> {
        VerifyingKey::from_public_key_pem(pem.trim())
            .map(Self::new)
            .map_err(|e| TrustError::BadKey {
                what: "the public key".into(),
                reason: format!("not an SPKI PEM P-256 public key ({e})"),
            })
    }

    /// The key as SPKI PEM (LF line endings).
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .expect("a P-256 point always encodes as SPKI PEM")
    }

    pub fn id(&self) -> KeyId {
        self.id
    }

    /// `true` if `signature` (DER) is this key's ECDSA-P256-SHA256 signature of `message`.
    pub(crate) fn verifies(&self, message: &[u8], signature: &Signature) -> bool {
        self.key.verify(message, signature).is_ok()
    }
}

/// A private key that signs bundles. `Debug` shows only the key id.
#[derive(Clone)]
pub struct PrivateKey {
    key: SigningKey,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey({})", self.public_key().id().short())
    }
}

impl PrivateKey {
    /// Parse a PKCS#8 PEM (`BEGIN PRIVATE KEY`) or SEC1 PEM (`BEGIN EC PRIVATE KEY`) P-256 key.
    /// Encrypted keys (cosign's `ENCRYPTED SIGSTORE PRIVATE KEY`, PKCS#8 `ENCRYPTED PRIVATE
    /// KEY`) are refused by name.
    pub fn from_pem(pem: &str) -> Result<Self, TrustError> {
        let pem = pem.trim();
        let bad = |reason: String| TrustError::BadKey {
            what: "the private key".into(),
            reason,
        };
        if pem.contains("ENCRYPTED") {
            return Err(bad(
                "it is encrypted; slate reads unencrypted PKCS#8 or SEC1 PEM P-256 keys".into(),
            ));
        }
        if pem.starts_with("-----BEGIN EC PRIVATE KEY-----") {
            return p256::SecretKey::from_sec1_pem(pem)
                .map(|secret| Self {
                    key: SigningKey::from(secret),
                })
                .map_err(|e| bad(format!("not a SEC1 PEM P-256 private key ({e})")));
        }
        SigningKey::from_pkcs8_pem(pem)
            .map(|key| Self { key })
            .map_err(|e| bad(format!("not a PKCS#8 PEM P-256 private key ({e})")))
    }

    /// A key from its 32-byte scalar (tests and corpora that need fixed keys).
    pub fn from_scalar(bytes: &[u8; 32]) -> Result<Self, TrustError> {
        SigningKey::from_bytes(bytes.into())
            .map(|key| Self { key })
            .map_err(|_| TrustError::BadKey {
                what: "the private key".into(),
                reason: "the scalar is zero or not below the curve order".into(),
            })
    }

    /// The key as PKCS#8 PEM (LF line endings).
    pub fn to_pem(&self) -> String {
        self.key
            .to_pkcs8_pem(LineEnding::LF)
            .expect("a P-256 scalar always encodes as PKCS#8 PEM")
            .to_string()
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey::new(*self.key.verifying_key())
    }

    /// ECDSA-P256-SHA256 of `message`, DER-encoded. Deterministic (RFC 6979): the same key and
    /// message give the same bytes, so signed bundles stay reproducible.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let signature: Signature = self.key.sign(message);
        DerSignature::from(signature).as_bytes().to_vec()
    }
}

/// A freshly generated key pair: what `slate keygen` writes.
#[derive(Clone)]
pub struct KeyPair {
    /// PKCS#8 PEM.
    pub private_pem: String,
    /// SPKI PEM.
    pub public_pem: String,
    pub id: KeyId,
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPair({})", self.id.short())
    }
}

/// A new P-256 key pair from the operating system's random source.
pub fn generate_keypair() -> KeyPair {
    let private = PrivateKey {
        key: SigningKey::random(&mut rand_core::OsRng),
    };
    let public = private.public_key();
    KeyPair {
        private_pem: private.to_pem(),
        public_pem: public.to_pem(),
        id: public.id(),
    }
}

/// The trusted keys in `dir`: every `*.pub` file (SPKI PEM), sorted by key id, duplicates
/// dropped. A node keeps them in `/etc/slate/trusted-keys` (the image contract's `TRUSTED_KEYS`). A
/// missing directory, one without keys, or a file that does not parse is an error: a node must
/// never fall back to trusting nothing, or anything.
///
pub fn load_trusted_keys(dir: &Path) -> Result<Vec<PublicKey>, TrustError> {
    // Every `*.pub` must be a regular file (a FIFO would block the read): refused by name
    // before any is read.
    let paths = slate_files::files_in(dir, "the trusted key", |p| {
        p.extension().is_some_and(|e| e == "pub")
    })?;
    let mut keys = Vec::new();
    for path in paths {
        keys.push(read_public_key(&path)?);
    }
    keys.sort_by_key(PublicKey::id);
    keys.dedup_by_key(|k| k.id());
    if keys.is_empty() {
        return Err(TrustError::NoTrustedKeys {
            place: dir.display().to_string(),
        });
    }
    Ok(keys)
}

/// One public key file (SPKI PEM), at most [`MAX_KEY_FILE_BYTES`].
pub fn read_public_key(path: &Path) -> Result<PublicKey, TrustError> {
    let text = read_key_file(path)?;
    PublicKey::from_pem(&text).map_err(|e| e.in_file(path))
}

/// One private key file (PKCS#8 or SEC1 PEM), at most [`MAX_KEY_FILE_BYTES`].
pub fn read_private_key(path: &Path) -> Result<PrivateKey, TrustError> {
    let text = read_key_file(path)?;
    PrivateKey::from_pem(&text).map_err(|e| e.in_file(path))
}

/// Key files are a few hundred bytes; anything past this is not a key.
pub const MAX_KEY_FILE_BYTES: u64 = 16 * 1024;

fn read_key_file(path: &Path) -> Result<String, TrustError> {
    slate_files::read_string_bounded(path, MAX_KEY_FILE_BYTES, "the key file").map_err(
        |e| match e {
            slate_files::FileError::TooLarge { .. } => TrustError::BadKey {
                what: path.display().to_string(),
                reason: format!("it is larger than {MAX_KEY_FILE_BYTES} bytes"),
            },
            e => e.into(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_round_trip_through_pem() {
        let pair = generate_keypair();
        assert!(pair
            .private_pem
            .starts_with("-----BEGIN PRIVATE KEY-----\n"));
        assert!(pair.public_pem.starts_with("-----BEGIN PUBLIC KEY-----\n"));
        let private = PrivateKey::from_pem(&pair.private_pem).unwrap();
        let public = PublicKey::from_pem(&pair.public_pem).unwrap();
        assert_eq!(private.public_key(), public);
        assert_eq!(public.id(), pair.id);
        assert_eq!(pair.id.to_hex().len(), 64);
        assert_eq!(pair.id.short().len(), SHORT_KEY_ID_LEN);
        let sig = private.sign(b"payload");
        let sig = Signature::from_der(&sig).unwrap();
        assert!(public.verifies(b"payload", &sig));
        assert!(!public.verifies(b"payloaD", &sig));
        assert_ne!(generate_keypair().id, pair.id);
        // Debug never prints key material.
        assert!(!format!("{private:?}{pair:?}").contains("BEGIN"));
    }

    #[test]
    fn the_key_id_is_the_sha256_of_the_spki_der() {
        let key = PrivateKey::from_scalar(&[7; 32]).unwrap().public_key();
        let pem = key.to_pem();
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        use base64::Engine as _;
        let der = base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap();
        assert_eq!(key.id().to_hex(), hex::encode(Sha256::digest(&der)));
    }

    #[test]
    fn sec1_private_keys_are_read_and_encrypted_ones_refused_by_name() {
        let key = PrivateKey::from_scalar(&[9; 32]).unwrap();
        let sec1 = p256::SecretKey::from_bytes((&[9u8; 32]).into())
            .unwrap()
            .to_sec1_pem(LineEnding::LF)
            .unwrap();
        assert_eq!(
            PrivateKey::from_pem(&sec1).unwrap().public_key(),
            key.public_key()
        );
        let err = PrivateKey::from_pem(
            "-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nabc\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("encrypted"), "{err}");
        let err = PublicKey::from_pem(&key.to_pem()).unwrap_err();
        assert!(
            err.to_string().contains("not an SPKI PEM P-256 public key"),
            "{err}"
        );
        assert!(PrivateKey::from_scalar(&[0; 32]).is_err());
    }
}
