//! The signature side of a bundle on arbitrary bytes: the signature manifest parser, the
//! simple-signing payload parser (what parses re-serializes to the same payload) and the
//! verification of one layer against a fixed trusted key (input split at NUL bytes into payload,
//! signature annotation and signer key annotation). Never panics; never accepts a signature for
//! another digest.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use slate_bundle::{parse_signature_manifest, signature_tag, SignatureLayer, MAX_SIGNATURES};
use slate_trust::{verify_layer, Payload, PrivateKey, PublicKey};

const DIGEST: &str = "sha256:24849107838ed93df4c5556cd3ec7ca9fa5225382cecfb9a7fa51480624206ee";

fn trusted() -> &'static [PublicKey] {
    static KEYS: OnceLock<Vec<PublicKey>> = OnceLock::new();
    KEYS.get_or_init(|| vec![PrivateKey::from_scalar(&[1; 32]).unwrap().public_key()])
}

fuzz_target!(|data: &[u8]| {
    if let Ok(layers) = parse_signature_manifest(data) {
        assert!(!layers.is_empty() && layers.len() <= MAX_SIGNATURES);
        for layer in &layers {
            signature_tag(&layer.digest).expect("a parsed layer has a sha256 digest");
        }
    }
    if let Ok(payload) = Payload::parse(data) {
        assert_eq!(
            Payload::parse(&payload.to_bytes()).expect("re-parses"),
            payload
        );
    }
    let mut parts = data.splitn(3, |&b| b == 0);
    let payload = parts.next().unwrap_or_default().to_vec();
    let text = |part: Option<&[u8]>| part.map(|p| String::from_utf8_lossy(p).into_owned());
    let signature = text(parts.next()).unwrap_or_default();
    let layer = SignatureLayer {
        payload,
        signature,
        public_key: text(parts.next()),
    };
    if let Ok(verified) = verify_layer(&layer, DIGEST, trusted()) {
        assert_eq!(verified.manifest_digest, DIGEST);
        assert_eq!(
            Payload::parse(&layer.payload).unwrap().manifest_digest(),
            DIGEST
        );
    }
});
