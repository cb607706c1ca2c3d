//! The signed payload: cosign's "simple signing" document (containers-signature(5) JSON format,
//! with cosign's type string). Its `critical.image.docker-manifest-digest` binds the signature
//! to one image manifest; `critical.identity.docker-reference` is written (the bundle's name) but,
//! as cosign's spec says, not checked.

use serde::{Deserialize, Serialize};

use crate::TrustError;

/// `critical.type` of a cosign signature.
pub const COSIGN_SIGNATURE_TYPE: &str = "cosign container image signature";

/// A simple-signing payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payload {
    pub critical: Critical,
    /// Free-form claims; cosign writes `null` when there are none.
    pub optional: Option<serde_json::Value>,
}

/// The claims a verifier must understand (unknown ones are refused, as containers-signature(5)
/// requires).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Critical {
    pub identity: Identity,
    pub image: Image,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    #[serde(rename = "docker-reference")]
    pub docker_reference: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Image {
    /// cosign's spec shows `Docker-manifest-digest`, its code writes the lowercase name; Go's
    /// JSON decoder accepts either, so slate reads both and writes the lowercase one.
    #[serde(rename = "docker-manifest-digest", alias = "Docker-manifest-digest")]
    pub docker_manifest_digest: String,
}

impl Payload {
    /// The payload signing `manifest_digest` under the name `reference`.
    pub fn new(reference: &str, manifest_digest: &str) -> Self {
        Payload {
            critical: Critical {
                identity: Identity {
                    docker_reference: reference.to_owned(),
                },
                image: Image {
                    docker_manifest_digest: manifest_digest.to_owned(),
                },
                kind: COSIGN_SIGNATURE_TYPE.to_owned(),
            },
            optional: None,
        }
    }

    /// The bytes that are signed: compact JSON in cosign's field order.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a payload serializes")
    }

    /// Parse payload bytes: valid JSON of this shape, cosign's type, a `sha256:<64 hex>` digest.
    pub fn parse(bytes: &[u8]) -> Result<Self, TrustError> {
        let bad = |reason: String| TrustError::MalformedPayload { reason };
        let payload: Payload = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not a simple-signing document: {e}")))?;
        if payload.critical.kind != COSIGN_SIGNATURE_TYPE {
            return Err(bad(format!(
                "its type is {:?}, not {COSIGN_SIGNATURE_TYPE:?}",
                payload.critical.kind
            )));
        }
        let digest = &payload.critical.image.docker_manifest_digest;
        if slate_bundle::Digest::parse(digest).is_err() {
            return Err(bad(format!(
                "its docker-manifest-digest {digest:?} is not sha256:<64 lowercase hex digits>"
            )));
        }
        Ok(payload)
    }

    pub fn manifest_digest(&self) -> &str {
        &self.critical.image.docker_manifest_digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "sha256:4c1c50d0ffc614f90b93b07d778028dc765548e823f676fb027f61d281ac380d";

    #[test]
    fn the_payload_is_cosigns_simple_signing_document() {
        let payload = Payload::new("slate", DIGEST);
        assert_eq!(
            String::from_utf8(payload.to_bytes()).unwrap(),
            format!(
                "{{\"critical\":{{\"identity\":{{\"docker-reference\":\"slate\"}},\"image\":\
                 {{\"docker-manifest-digest\":\"{DIGEST}\"}},\"type\":\"cosign container image \
                 signature\"}},\"optional\":null}}"
            )
        );
        assert_eq!(Payload::parse(&payload.to_bytes()).unwrap(), payload);
    }

    #[test]
    fn cosign_variants_parse_and_garbage_is_refused_by_name() {
        // The spec's capitalized key and free-form optional claims.
        let text = format!(
            r#"{{"critical":{{"identity":{{"docker-reference":"x"}},"image":{{"Docker-manifest-digest":"{DIGEST}"}},"type":"cosign container image signature"}},"optional":{{"creator":"atomic"}}}}"#
        );
        assert_eq!(
            Payload::parse(text.as_bytes()).unwrap().manifest_digest(),
            DIGEST
        );
        let err = |text: &str| Payload::parse(text.as_bytes()).unwrap_err().to_string();
        assert!(err("{").contains("not a simple-signing document"));
        assert!(err(&text.replace("cosign container", "atomic container")).contains("its type is"));
        assert!(err(&text.replace(DIGEST, "sha256:00")).contains("is not sha256:<64"));
        assert!(err(&text.replace(DIGEST, &DIGEST.to_uppercase())).contains("is not sha256:<64"));
        assert!(err(&text.replace("\"type\"", "\"extra\":1,\"type\"")).contains("unknown field"));
    }
}
