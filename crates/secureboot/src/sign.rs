//! Authenticode signing (docs/formats.md §11.2): a CMS SignedData over an
//! `SpcIndirectDataContent` naming the image's digest, appended as a `WIN_CERTIFICATE` in the
//! PE certificate table, with the header's table entry and checksum fixed. No signing time and
//! no other varying attribute, so the same key signs the same image to the same bytes.

use authenticode::{DigestInfo, SpcAttributeTypeAndOptionalValue, SpcIndirectDataContent};
use cms::cert::{CertificateChoices, IssuerAndSerialNumber};
use cms::content_info::{CmsVersion, ContentInfo};
use cms::signed_data::{
    CertificateSet, EncapsulatedContentInfo, SignedData, SignerIdentifier, SignerInfo, SignerInfos,
};
use der::asn1::{OctetString, SetOfVec};
use der::{Any, Decode, DecodePem, Encode};
use ring::signature::KeyPair;
use sha2::{Digest, Sha256};
use spki::AlgorithmIdentifierOwned;
use x509_cert::attr::Attribute;
use x509_cert::Certificate;

use crate::pe::{image_digest, Pe};
use crate::x509::{oid, subject};
use crate::SignError;

/// `SpcPeImageData` as every signer writes it: no flags, and the obsolete file link
/// `<<<Obsolete>>>` (UTF-16BE), which the format still requires.
const SPC_PE_IMAGE_DATA: &[u8] = &[
    0x30, 0x25, 0x03, 0x01, 0x00, 0xa0, 0x20, 0xa2, 0x1e, 0x80, 0x1c, 0x00, 0x3c, 0x00, 0x3c, 0x00,
    0x3c, 0x00, 0x4f, 0x00, 0x62, 0x00, 0x73, 0x00, 0x6f, 0x00, 0x6c, 0x00, 0x65, 0x00, 0x74, 0x00,
    0x65, 0x00, 0x3e, 0x00, 0x3e, 0x00, 0x3e,
];

/// `WIN_CERTIFICATE`: revision 2.0, type PKCS#7 SignedData.
const WIN_CERT_REVISION_2_0: u16 = 0x0200;
const WIN_CERT_TYPE_PKCS_SIGNED_DATA: u16 = 0x0002;

/// An owner's `db` key: an RSA private key and its X.509 certificate.
pub struct SigningKey {
    key: ring::rsa::KeyPair,
    cert: Certificate,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("cert", &subject(&self.cert))
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A PEM private key (PKCS#8 `PRIVATE KEY` or PKCS#1 `RSA PRIVATE KEY`) and the PEM
    /// certificate of its public key.
    pub fn from_pem(key_pem: &[u8], cert_pem: &[u8]) -> Result<Self, SignError> {
        let (label, der) =
            der::pem::decode_vec(key_pem).map_err(|e| SignError::Key(format!("not PEM: {e}")))?;
        let key = match label {
            "PRIVATE KEY" => ring::rsa::KeyPair::from_pkcs8(&der),
            "RSA PRIVATE KEY" => ring::rsa::KeyPair::from_der(&der),
            other => {
                return Err(SignError::Key(format!(
                    "a PEM {other:?}; expected an RSA PRIVATE KEY or PRIVATE KEY"
                )))
            }
        }
        .map_err(|e| SignError::Key(format!("not an RSA key ring accepts: {e}")))?;
        let cert = Certificate::from_pem(cert_pem).map_err(|e| SignError::Cert(e.to_string()))?;
        let spki = &cert.tbs_certificate.subject_public_key_info;
        if spki.subject_public_key.raw_bytes() != key.public_key().as_ref() {
            return Err(SignError::KeyCertMismatch(subject(&cert)));
        }
        Ok(Self { key, cert })
    }

    /// The certificate's subject, for messages.
    pub fn subject(&self) -> String {
        subject(&self.cert)
    }

    /// The certificate, DER.
    pub fn cert_der(&self) -> Vec<u8> {
        self.cert.to_der().unwrap_or_default()
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignError> {
        let mut signature = vec![0; self.key.public().modulus_len()];
        // PKCS#1 v1.5 is deterministic; ring takes a generator for its blinding only.
        self.key
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                message,
                &mut signature,
            )
            .map_err(|_| SignError::Encode("RSA signing failed".into()))?;
        Ok(signature)
    }
}

fn algorithm(oid: der::asn1::ObjectIdentifier) -> AlgorithmIdentifierOwned {
    AlgorithmIdentifierOwned {
        oid,
        parameters: Some(Any::from(der::asn1::Null)),
    }
}

fn encode_err(e: der::Error) -> SignError {
    SignError::Encode(e.to_string())
}

fn attribute(oid: der::asn1::ObjectIdentifier, value: Any) -> Result<Attribute, SignError> {
    Ok(Attribute {
        oid,
        values: SetOfVec::try_from(vec![value]).map_err(encode_err)?,
    })
}

/// The CMS SignedData (in its ContentInfo) that signs an image whose Authenticode digest is
/// `digest`.
fn signed_data(digest: [u8; 32], key: &SigningKey) -> Result<Vec<u8>, SignError> {
    let indirect = SpcIndirectDataContent {
        data: SpcAttributeTypeAndOptionalValue {
            value_type: oid::SPC_PE_IMAGE_DATA,
            value: Any::from_der(SPC_PE_IMAGE_DATA).map_err(encode_err)?,
        },
        message_digest: DigestInfo {
            digest_algorithm: algorithm(oid::SHA256),
            digest: OctetString::new(digest.to_vec()).map_err(encode_err)?,
        },
    };
    let econtent = Any::encode_from(&indirect).map_err(encode_err)?;
    // Authenticode's quirk: the message digest covers the content's value, not its header.
    let content_digest = Sha256::digest(econtent.value());
    let attrs = SetOfVec::try_from(vec![
        attribute(
            oid::CONTENT_TYPE,
            Any::encode_from(&oid::SPC_INDIRECT_DATA).map_err(encode_err)?,
        )?,
        attribute(
            oid::MESSAGE_DIGEST,
            Any::encode_from(&OctetString::new(content_digest.to_vec()).map_err(encode_err)?)
                .map_err(encode_err)?,
        )?,
    ])
    .map_err(encode_err)?;
    // The signature is over the attributes encoded as a SET OF, not as the [0] they sit in.
    let signature = key.sign(&attrs.to_der().map_err(encode_err)?)?;
    let tbs = &key.cert.tbs_certificate;
    let signer = SignerInfo {
        version: CmsVersion::V1,
        sid: SignerIdentifier::IssuerAndSerialNumber(IssuerAndSerialNumber {
            issuer: tbs.issuer.clone(),
            serial_number: tbs.serial_number.clone(),
        }),
        digest_alg: algorithm(oid::SHA256),
        signed_attrs: Some(attrs),
        signature_algorithm: algorithm(oid::RSA_ENCRYPTION),
        signature: OctetString::new(signature).map_err(encode_err)?,
        unsigned_attrs: None,
    };
    let data = SignedData {
        version: CmsVersion::V1,
        digest_algorithms: SetOfVec::try_from(vec![algorithm(oid::SHA256)]).map_err(encode_err)?,
        encap_content_info: EncapsulatedContentInfo {
            econtent_type: oid::SPC_INDIRECT_DATA,
            econtent: Some(econtent),
        },
        certificates: Some(CertificateSet(
            SetOfVec::try_from(vec![CertificateChoices::Certificate(key.cert.clone())])
                .map_err(encode_err)?,
        )),
        crls: None,
        signer_infos: SignerInfos(SetOfVec::try_from(vec![signer]).map_err(encode_err)?),
    };
    ContentInfo {
        content_type: oid::SIGNED_DATA,
        content: Any::encode_from(&data).map_err(encode_err)?,
    }
    .to_der()
    .map_err(encode_err)
}

/// Sign an unsigned PE image: pad it to 8 bytes, append the certificate table, point the
/// header's security directory at it and fix the checksum. The input must not be signed.
pub fn sign_pe(image: &[u8], key: &SigningKey) -> Result<Vec<u8>, SignError> {
    let pe = Pe::parse(image).map_err(SignError::NotPe)?;
    if pe.info.security_directory != (0, 0) {
        return Err(SignError::AlreadySigned);
    }
    let entry = pe.security_entry().ok_or(SignError::NoSecurityDirectory)?;
    let checksum_at = pe.info.checksum_offset();
    let mut out = image.to_vec();
    // The table starts 8-aligned; the padding before it is part of the hashed image.
    out.resize(out.len().next_multiple_of(8), 0);
    let digest =
        image_digest(&Pe::parse(&out).map_err(SignError::NotPe)?).map_err(SignError::NotPe)?;
    let cms = signed_data(digest, key)?;
    let table_at = out.len();
    let length = u32::try_from(8 + cms.len()).map_err(|_| SignError::Encode("too large".into()))?;
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&WIN_CERT_REVISION_2_0.to_le_bytes());
    out.extend_from_slice(&WIN_CERT_TYPE_PKCS_SIGNED_DATA.to_le_bytes());
    out.extend_from_slice(&cms);
    out.resize(out.len().next_multiple_of(8), 0);
    let table_len =
        u32::try_from(out.len() - table_at).map_err(|_| SignError::Encode("too large".into()))?;
    let table_at =
        u32::try_from(table_at).map_err(|_| SignError::Encode("image over 4 GiB".into()))?;
    out[entry..entry + 4].copy_from_slice(&table_at.to_le_bytes());
    out[entry + 4..entry + 8].copy_from_slice(&table_len.to_le_bytes());
    let checksum = slate_uki::pe_checksum(&out).map_err(|e| SignError::NotPe(e.to_string()))?;
    out[checksum_at..checksum_at + 4].copy_from_slice(&checksum.to_le_bytes());
    Ok(out)
}
