//! Signing a bundle and verifying its signature against trusted keys.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use p256::ecdsa::Signature;
use slate_bundle::{BlobRef, Bundle, SignatureLayer};

use crate::{Payload, PrivateKey, PublicKey, TrustError};

/// What a successful verification established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The trusted key whose signature verified.
    pub key_id: crate::KeyId,
    /// The image manifest digest the signature covers (= the bundle's).
    pub manifest_digest: String,
    /// The payload's `docker-reference` (informational; not checked, as in cosign).
    pub reference: String,
}

/// The signature layer `key` makes for `bundle`: the simple-signing payload naming the bundle's
/// manifest digest (and its name as the reference), its DER signature in base64, and the public
/// key. Nothing is written; see [`sign`].
pub fn signature_for(bundle: &Bundle, key: &PrivateKey) -> SignatureLayer {
    signature_over(
        &Payload::new(&bundle.manifest().name, bundle.manifest_digest()),
        key,
    )
}

/// The signature layer of an arbitrary payload (corpora and tests make wrong ones with it).
pub fn signature_over(payload: &Payload, key: &PrivateKey) -> SignatureLayer {
    let bytes = payload.to_bytes();
    SignatureLayer {
        signature: BASE64.encode(key.sign(&bytes)),
        payload: bytes,
        public_key: Some(key.public_key().to_pem()),
    }
}

/// Sign `bundle` with `key` and store the signature in its layout (see
/// [`slate_bundle::add_signature`]). Returns the stored layer.
pub fn sign(bundle: &Bundle, key: &PrivateKey) -> Result<SignatureLayer, TrustError> {
    let layer = signature_for(bundle, key);
    slate_bundle::add_signature(bundle.dir(), bundle.manifest_digest(), &layer)?;
    Ok(layer)
}

fn short_ids(keys: &[PublicKey]) -> String {
    keys.iter()
        .map(|k| k.id().short())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Verify that `bundle` carries a signature by one of `trusted` over its manifest digest.
///
/// The signature manifest tagged `sha256-<hex>.sig` is found in the layout; each of its layers
/// is tried: the payload must be a cosign simple-signing document, the signature must verify
/// with a trusted key, and the payload's `docker-manifest-digest` must be the bundle's. The first
/// layer that passes wins (several keys may be trusted at once, and a bundle may carry several
/// signatures, for key rotation). Blobs are not read here: every blob's digest is named by the
/// signed manifest (through the bundle manifest), and [`Bundle::read_blob`] (or
/// [`verify_blobs`]) checks each against it.
pub fn verify(bundle: &Bundle, trusted: &[PublicKey]) -> Result<Verified, TrustError> {
    if trusted.is_empty() {
        return Err(TrustError::NoTrustedKeys {
            place: "the list of trusted keys".into(),
        });
    }
    let digest = bundle.manifest_digest();
    let Some(layers) = bundle.signatures()? else {
        let others = bundle.signature_tags()?;
        return Err(TrustError::Unsigned {
            tag: slate_bundle::signature_tag_of(bundle.digest()),
            others,
        });
    };
    let mut errors = Vec::new();
    for layer in &layers {
        match verify_layer(layer, digest, trusted) {
            Ok(verified) => return Ok(verified),
            Err(err) => errors.push(err),
        }
    }
    Err(if errors.len() == 1 {
        errors.remove(0)
    } else {
        TrustError::NoValidSignature { errors }
    })
}

/// Whether the bundle carries a signature bound to its manifest digest, whoever made it: what a
/// publisher checks before a release goes up (which keys to trust is each node's to say, in
/// [`verify`]). Refused: no signature manifest for the digest ([`TrustError::Unsigned`]), or
/// none of its payloads naming the digest ([`TrustError::Unbound`]).
pub fn check_signature_present(bundle: &Bundle) -> Result<(), TrustError> {
    let digest = bundle.manifest_digest();
    let Some(layers) = bundle.signatures()? else {
        return Err(TrustError::Unsigned {
            tag: slate_bundle::signature_tag_of(bundle.digest()),
            others: bundle.signature_tags()?,
        });
    };
    let bound = layers
        .iter()
        .any(|layer| Payload::parse(&layer.payload).is_ok_and(|p| p.manifest_digest() == digest));
    if bound {
        Ok(())
    } else {
        Err(TrustError::Unbound {
            digest: digest.to_owned(),
        })
    }
}

/// Check one stored signature of the manifest `digest` against `trusted`.
pub fn verify_layer(
    layer: &SignatureLayer,
    digest: &str,
    trusted: &[PublicKey],
) -> Result<Verified, TrustError> {
    let payload = Payload::parse(&layer.payload)?;
    let signature = decode_signature(&layer.signature)?;
    if let Some(key) = trusted
        .iter()
        .find(|k| k.verifies(&layer.payload, &signature))
    {
        if payload.manifest_digest() != digest {
            return Err(TrustError::SignedAnotherDigest {
                key_id: key.id().short(),
                signed: payload.manifest_digest().to_owned(),
                bundle: digest.to_owned(),
            });
        }
        return Ok(Verified {
            key_id: key.id(),
            manifest_digest: digest.to_owned(),
            reference: payload.critical.identity.docker_reference,
        });
    }
    // No trusted key verifies it. The signer's key, when the layer names it, tells an untrusted
    // signer from a damaged signature; it is never trusted itself.
    let Some(pem) = &layer.public_key else {
        return Err(TrustError::NotVerified {
            trusted: short_ids(trusted),
        });
    };
    let named = PublicKey::from_pem(pem).map_err(|e| TrustError::MalformedSignature {
        reason: format!("its signer public-key annotation is unusable: {e}"),
    })?;
    if named.verifies(&layer.payload, &signature) {
        Err(TrustError::UntrustedKey {
            key_id: named.id().short(),
            trusted: short_ids(trusted),
        })
    } else {
        Err(TrustError::BadSignature {
            key_id: named.id().short(),
        })
    }
}

/// A signature annotation: standard base64 of a DER-encoded ECDSA P-256 signature.
pub fn decode_signature(text: &str) -> Result<Signature, TrustError> {
    let der = BASE64
        .decode(text.trim())
        .map_err(|e| TrustError::MalformedSignature {
            reason: format!("the signature is not base64 ({e})"),
        })?;
    Signature::from_der(&der).map_err(|_| TrustError::MalformedSignature {
        reason: format!(
            "the signature ({} bytes) is not a DER-encoded ECDSA P-256 signature",
            der.len()
        ),
    })
}

/// The one verification of a bundle (issue 44): its signature by one of `trusted` over its
/// manifest digest ([`verify`]), then every blob the bundle manifest names — a regular file,
/// not a link; its size; its digest, or its signed chunk digests when the layer declares them
/// (formats.md §7.1) — whether or not the caller will read it, and the chunk index when the
/// bundle carries one (§7.7). `slate verify`, `slate installer
/// install|upgrade` and so the node (which runs the bundle's own installer) all call this, so
/// what one accepts the others accept and what one refuses the others refuse. Each blob is
/// hashed once: the bundle remembers it, and the installers' later reads only check its size.
pub fn verify_bundle(
    bundle: &Bundle,
    trusted: &[PublicKey],
) -> Result<(Verified, Vec<(String, BlobRef)>), TrustError> {
    let verified = verify(bundle, trusted)?;
    let blobs = verify_blobs(bundle)?;
    Ok((verified, blobs))
}

/// Check every blob the bundle manifest names against its size and digest, streaming (a blob
/// the bundle verified before is only checked for size: see [`Bundle::open_with`]); returns
/// them by role. Run after [`verify`]: the digests it checks against are the signed ones.
pub fn verify_blobs(bundle: &Bundle) -> Result<Vec<(String, BlobRef)>, TrustError> {
    // The chunk index too, when there is one (issue 41): its digest, its form, and that each
    // blob it lists is one of these, so a bundle whose index a node would refuse for a delta is
    // refused whole as well. Its chunk digests are checked against bytes when chunks are used.
    bundle.chunk_index()?;
    // And the compressed chunk table (formats.md §7.8): bound to that index, its frames tiling
    // the compressed blob it names.
    bundle.zchunk_table()?;
    bundle
        .manifest()
        .blobs
        .keys()
        .map(|role| Ok((role.clone(), bundle.verify_blob(role)?.clone())))
        .collect()
}
