//! The signed manifest of a system extension (docs/formats.md §7.6): a squashfs image's name,
//! version, file name, size and SHA-256, signed with a slate-trust key. Text, one `key value`
//! pair per line in a fixed order; the signature covers every byte before the `signature` line.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use crate::{decode_signature, KeyId, PrivateKey, PublicKey};

/// The first line of every extension manifest.
pub const EXTENSION_MAGIC: &str = "slate-extension 1";
/// A manifest is a few hundred bytes; anything longer is refused unread.
pub const MAX_EXTENSION_MANIFEST_BYTES: usize = 4096;
/// The file name suffix slate gives a manifest (`<name>-<version>.ext`).
pub const EXTENSION_MANIFEST_SUFFIX: &str = ".ext";

/// What an extension manifest states (the signed part).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtensionManifest {
    /// `[a-z0-9][a-z0-9_-]{0,63}`: unique within an image.
    pub name: String,
    /// A UAPI version string: 1 to 64 of `A-Z a-z 0-9 . ~ ^ _ + -`.
    pub version: String,
    /// The squashfs image's file name, beside the manifest: `[A-Za-z0-9._-]`, ends in `.sqsh`.
    pub image: String,
    /// The image's length in bytes.
    pub size: u64,
    /// `sha256:` + 64 lower-case hex of the image.
    pub digest: String,
}

/// A manifest as read: what it states, who signed it, and the signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedExtension {
    pub manifest: ExtensionManifest,
    /// The signer's key id (64 hex, as in `key` line).
    pub key_id: String,
    /// The signed bytes: everything before the `signature` line.
    signed: Vec<u8>,
    /// Standard base64 of the DER signature.
    signature: String,
}

/// Why a manifest was refused. Each names the line or the check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExtensionError {
    #[error("the extension manifest is malformed: {0}")]
    Malformed(String),
    #[error(
        "the extension {name} is signed by key {key_id}, which is not trusted (trusted: {trusted})"
    )]
    UntrustedKey {
        name: String,
        key_id: String,
        trusted: String,
    },
    #[error("the signature of the extension {name} does not verify with key {key_id}: the manifest or its signature was altered")]
    BadSignature { name: String, key_id: String },
    #[error("the image of the extension {name} is {actual} bytes, its manifest says {expected}")]
    SizeMismatch {
        name: String,
        expected: u64,
        actual: u64,
    },
    #[error("the image of the extension {name} has digest {actual}, its manifest says {expected}")]
    DigestMismatch {
        name: String,
        expected: String,
        actual: String,
    },
}

fn malformed(reason: impl Into<String>) -> ExtensionError {
    ExtensionError::Malformed(reason.into())
}

/// `true` for an extension name: `[a-z0-9][a-z0-9_-]{0,63}`.
pub fn valid_extension_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `true` for an extension version: 1 to 64 of `A-Z a-z 0-9 . ~ ^ _ + -`.
pub fn valid_extension_version(version: &str) -> bool {
    (1..=64).contains(&version.len())
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".~^_+-".contains(&b))
}

fn valid_image_name(image: &str) -> bool {
    (6..=128).contains(&image.len())
        && image.ends_with(".sqsh")
        && !image.starts_with('.')
        && image
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `sha256:` + 64 lower-case hex digits (§7.3).
pub fn valid_sha256_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// The digest string of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

impl ExtensionManifest {
    /// Check every field's spelling.
    pub fn check(&self) -> Result<(), ExtensionError> {
        if !valid_extension_name(&self.name) {
            return Err(malformed(format!(
                "name {:?} is not 1 to 64 of a-z 0-9 _ - starting with a letter or digit",
                self.name
            )));
        }
        if !valid_extension_version(&self.version) {
            return Err(malformed(format!(
                "version {:?} is not 1 to 64 of A-Z a-z 0-9 . ~ ^ _ + -",
                self.version
            )));
        }
        if !valid_image_name(&self.image) {
            return Err(malformed(format!(
                "image {:?} is not a file name of A-Z a-z 0-9 . _ - ending in .sqsh",
                self.image
            )));
        }
        if !valid_sha256_digest(&self.digest) {
            return Err(malformed(format!(
                "digest {:?} is not sha256: and 64 lower-case hex digits",
                self.digest
            )));
        }
        Ok(())
    }

    /// The signed part: every line up to and including `key`.
    fn signed_text(&self, key_id: &KeyId) -> String {
        format!(
            "{EXTENSION_MAGIC}\nname {}\nversion {}\nimage {}\nsize {}\ndigest {}\nkey {}\n",
            self.name,
            self.version,
            self.image,
            self.size,
            self.digest,
            key_id.to_hex()
        )
    }

    /// The whole manifest, signed with `key`.
    pub fn sign(&self, key: &PrivateKey) -> Result<Vec<u8>, ExtensionError> {
        self.check()?;
        let mut text = self.signed_text(&key.public_key().id());
        let signature = BASE64.encode(key.sign(text.as_bytes()));
        text.push_str(&format!("signature {signature}\n"));
        Ok(text.into_bytes())
    }

    /// Whether `image` (its bytes) is what the manifest names.
    pub fn check_image(&self, image: &[u8]) -> Result<(), ExtensionError> {
        if image.len() as u64 != self.size {
            return Err(ExtensionError::SizeMismatch {
                name: self.name.clone(),
                expected: self.size,
                actual: image.len() as u64,
            });
        }
        let actual = sha256_digest(image);
        if actual != self.digest {
            return Err(ExtensionError::DigestMismatch {
                name: self.name.clone(),
                expected: self.digest.clone(),
                actual,
            });
        }
        Ok(())
    }
}

impl SignedExtension {
    /// Parse a manifest strictly: the magic line, then `name`, `version`, `image`, `size`,
    /// `digest`, `key`, `signature` in that order, each once, `key value` separated by one space,
    /// every line ending in `\n`, nothing after. The signature is not checked here.
    pub fn parse(bytes: &[u8]) -> Result<Self, ExtensionError> {
        if bytes.len() > MAX_EXTENSION_MANIFEST_BYTES {
            return Err(malformed(format!(
                "{} bytes, more than {MAX_EXTENSION_MANIFEST_BYTES}",
                bytes.len()
            )));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| malformed("not UTF-8"))?;
        let Some(body) = text.strip_suffix('\n') else {
            return Err(malformed("the last line does not end with a newline"));
        };
        let lines: Vec<&str> = body.split('\n').collect();
        const KEYS: [&str; 7] = [
            "name",
            "version",
            "image",
            "size",
            "digest",
            "key",
            "signature",
        ];
        if lines.first() != Some(&EXTENSION_MAGIC) {
            return Err(malformed(format!(
                "line 1 is not {EXTENSION_MAGIC:?}: not an extension manifest or another version"
            )));
        }
        if lines.len() != KEYS.len() + 1 {
            return Err(malformed(format!(
                "{} lines, expected {}",
                lines.len(),
                KEYS.len() + 1
            )));
        }
        let mut values = Vec::with_capacity(KEYS.len());
        for (i, (line, key)) in lines[1..].iter().zip(KEYS).enumerate() {
            let value = line
                .strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(' '))
                .filter(|v| !v.is_empty() && !v.contains([' ', '\t', '\r']))
                .ok_or_else(|| {
                    malformed(format!("line {} is not `{key} <value>`: {line:?}", i + 2))
                })?;
            values.push(value);
        }
        let size = values[3];
        if size.len() > 1 && size.starts_with('0') || !size.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed(format!(
                "size {size:?} is not a decimal number without leading zeros"
            )));
        }
        let size: u64 = size
            .parse()
            .map_err(|_| malformed(format!("size {size} is out of range")))?;
        let key_id = values[5];
        if key_id.len() != 64
            || !key_id
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(malformed(format!(
                "key {key_id:?} is not a key id (64 lower-case hex digits)"
            )));
        }
        let manifest = ExtensionManifest {
            name: values[0].to_owned(),
            version: values[1].to_owned(),
            image: values[2].to_owned(),
            size,
            digest: values[4].to_owned(),
        };
        manifest.check()?;
        let signature = values[6].to_owned();
        decode_signature(&signature).map_err(|e| malformed(e.to_string()))?;
        let signed_len = bytes.len() - lines[7].len() - 1;
        Ok(Self {
            manifest,
            key_id: key_id.to_owned(),
            signed: bytes[..signed_len].to_vec(),
            signature,
        })
    }

    /// Check the signature against `trusted`: the key the manifest names must be one of them
    /// and must verify the signed bytes.
    pub fn verify(&self, trusted: &[PublicKey]) -> Result<&ExtensionManifest, ExtensionError> {
        let name = self.manifest.name.clone();
        let Some(key) = trusted.iter().find(|k| k.id().to_hex() == self.key_id) else {
            let ids: Vec<String> = trusted.iter().map(|k| k.id().short()).collect();
            return Err(ExtensionError::UntrustedKey {
                name,
                key_id: self.key_id[..crate::SHORT_KEY_ID_LEN].to_owned(),
                trusted: if ids.is_empty() {
                    "none".to_owned()
                } else {
                    ids.join(", ")
                },
            });
        };
        let signature = decode_signature(&self.signature).map_err(|e| malformed(e.to_string()))?;
        if key.verifies(&self.signed, &signature) {
            Ok(&self.manifest)
        } else {
            Err(ExtensionError::BadSignature {
                name,
                key_id: key.id().short(),
            })
        }
    }
}

#[cfg(test)]
mod tests;
