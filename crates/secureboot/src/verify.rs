//! Authenticode verification (docs/formats.md §11.3), as a firmware does it: the image's
//! digest must be the one signed, the signature must verify with the signer's certificate,
//! and that certificate must be in the trusted set or issued by one in it.

use authenticode::{AttributeCertificateIterator, SpcIndirectDataContent};
use cms::cert::CertificateChoices;
use cms::content_info::ContentInfo;
use cms::signed_data::{SignedData, SignerIdentifier, SignerInfo};
use der::asn1::OctetString;
use der::{Decode, Encode, SliceReader};
use sha2::{Digest, Sha256};
use x509_cert::Certificate;

use crate::pe::{image_digest, Pe};
use crate::x509::{oid, subject};
use crate::VerifyError;

/// The certificates a target trusts: its firmware's `db` (or what the running image says it
/// is).
#[derive(Debug, Clone, Default)]
pub struct TrustedCerts {
    certs: Vec<Certificate>,
}

impl TrustedCerts {
    /// Certificates from DER, each refused if it does not parse.
    pub fn from_der<'a>(ders: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, String> {
        let certs = ders
            .into_iter()
            .map(|der| Certificate::from_der(der).map_err(|e| format!("a certificate: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { certs })
    }

    /// One or more PEM certificates.
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let certs =
            Certificate::load_pem_chain(pem).map_err(|e| format!("PEM certificates: {e}"))?;
        if certs.is_empty() {
            return Err("no certificate in the PEM text".into());
        }
        Ok(Self { certs })
    }

    pub fn is_empty(&self) -> bool {
        self.certs.is_empty()
    }

    /// The subjects, for messages.
    pub fn subjects(&self) -> Vec<String> {
        self.certs.iter().map(subject).collect()
    }
}

/// Who signed an accepted image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// The signing certificate's subject.
    pub subject: String,
    /// The trusted certificate that vouched for it (itself, or its issuer).
    pub trusted_by: String,
}

/// Accept `image` if one of its signatures verifies and chains to `trusted`. Every signature
/// is tried, as a firmware does; the error is the first one's.
pub fn verify_pe(image: &[u8], trusted: &TrustedCerts) -> Result<Signer, VerifyError> {
    let pe = Pe::parse(image).map_err(VerifyError::NotPe)?;
    let table = AttributeCertificateIterator::new(&pe)
        .map_err(|e| VerifyError::Malformed(e.to_string()))?
        .ok_or(VerifyError::NotSigned)?;
    let digest = image_digest(&pe).map_err(VerifyError::Malformed)?;
    let mut first_error = None;
    for entry in table {
        let entry = entry.map_err(|e| VerifyError::Malformed(e.to_string()))?;
        if entry.revision != 0x0200 || entry.certificate_type != 0x0002 {
            first_error.get_or_insert(VerifyError::Malformed(format!(
                "a certificate entry of revision {:#06x}, type {:#06x}",
                entry.revision, entry.certificate_type
            )));
            continue;
        }
        match verify_one(entry.data, &digest, trusted) {
            Ok(signer) => return Ok(signer),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(first_error.unwrap_or(VerifyError::NotSigned))
}

fn malformed(what: &str) -> impl Fn(der::Error) -> VerifyError + '_ {
    move |e| VerifyError::Malformed(format!("{what}: {e}"))
}

fn require_sha256(
    what: &'static str,
    oid: &der::asn1::ObjectIdentifier,
) -> Result<(), VerifyError> {
    if *oid == oid::SHA256 {
        Ok(())
    } else {
        Err(VerifyError::Unsupported {
            what,
            oid: oid.to_string(),
        })
    }
}

fn verify_one(
    cms_der: &[u8],
    digest: &[u8; 32],
    trusted: &TrustedCerts,
) -> Result<Signer, VerifyError> {
    // The entry is padded to 8 bytes: read one ContentInfo and ignore what follows.
    let mut reader = SliceReader::new(cms_der).map_err(malformed("the signature"))?;
    let info = ContentInfo::decode(&mut reader).map_err(malformed("the ContentInfo"))?;
    if info.content_type != oid::SIGNED_DATA {
        return Err(VerifyError::Malformed(format!(
            "content type {} is not SignedData",
            info.content_type
        )));
    }
    let data: SignedData = info
        .content
        .decode_as()
        .map_err(malformed("the SignedData"))?;
    let [signer] = data.signer_infos.0.as_slice() else {
        return Err(VerifyError::Malformed(format!(
            "{} signer infos (Authenticode has exactly one)",
            data.signer_infos.0.len()
        )));
    };
    require_sha256("digest algorithm", &signer.digest_alg.oid)?;
    if data.encap_content_info.econtent_type != oid::SPC_INDIRECT_DATA {
        return Err(VerifyError::Malformed(
            "the signed content is not an SpcIndirectDataContent".into(),
        ));
    }
    let econtent = data
        .encap_content_info
        .econtent
        .as_ref()
        .ok_or_else(|| VerifyError::Malformed("the signed content is empty".into()))?;
    let indirect: SpcIndirectDataContent = econtent
        .decode_as()
        .map_err(malformed("the SpcIndirectDataContent"))?;
    require_sha256(
        "image digest algorithm",
        &indirect.message_digest.digest_algorithm.oid,
    )?;
    if indirect.message_digest.digest.as_bytes() != digest {
        return Err(VerifyError::ImageModified);
    }
    let message = signed_message(signer, econtent.value())?;
    let cert = signer_certificate(&data, signer)?;
    check_signature(&cert, &message, signer.signature.as_bytes())
        .map_err(|()| VerifyError::BadSignature(subject(&cert)))?;
    trust(&cert, trusted)
}

/// What the signature covers: the signed attributes as a SET OF, once their message digest is
/// checked against the content; or, without attributes, the content itself.
fn signed_message(signer: &SignerInfo, content: &[u8]) -> Result<Vec<u8>, VerifyError> {
    let Some(attrs) = &signer.signed_attrs else {
        return Ok(content.to_vec());
    };
    let want = Sha256::digest(content);
    let digest = attrs
        .iter()
        .find(|a| a.oid == oid::MESSAGE_DIGEST)
        .and_then(|a| a.values.iter().next())
        .ok_or_else(|| VerifyError::Malformed("no messageDigest attribute".into()))?
        .decode_as::<OctetString>()
        .map_err(malformed("the messageDigest attribute"))?;
    if digest.as_bytes() != want.as_slice() {
        return Err(VerifyError::Malformed(
            "the messageDigest attribute does not match the signed content".into(),
        ));
    }
    attrs.to_der().map_err(malformed("the signed attributes"))
}

fn signer_certificate(data: &SignedData, signer: &SignerInfo) -> Result<Certificate, VerifyError> {
    let SignerIdentifier::IssuerAndSerialNumber(id) = &signer.sid else {
        return Err(VerifyError::Malformed(
            "the signer is named by key identifier, not issuer and serial".into(),
        ));
    };
    data.certificates
        .iter()
        .flat_map(|set| set.0.iter())
        .find_map(|choice| match choice {
            CertificateChoices::Certificate(c)
                if c.tbs_certificate.issuer == id.issuer
                    && c.tbs_certificate.serial_number == id.serial_number =>
            {
                Some(c.clone())
            }
            _ => None,
        })
        .ok_or_else(|| {
            VerifyError::Malformed(format!(
                "the signer's certificate (issuer {}) is not in the signature",
                id.issuer
            ))
        })
}

/// RSA PKCS#1 v1.5 with SHA-256 by `cert`'s key.
fn check_signature(cert: &Certificate, message: &[u8], signature: &[u8]) -> Result<(), ()> {
    let spki = &cert.tbs_certificate.subject_public_key_info;
    if spki.algorithm.oid != oid::RSA_ENCRYPTION {
        return Err(());
    }
    ring::signature::UnparsedPublicKey::new(
        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
        spki.subject_public_key.raw_bytes(),
    )
    .verify(message, signature)
    .map_err(|_| ())
}

/// The signer is trusted if it is a trusted certificate, or one of them issued it (a `db`
/// holding a CA, as Microsoft's does).
fn trust(cert: &Certificate, trusted: &TrustedCerts) -> Result<Signer, VerifyError> {
    let signer = subject(cert);
    let der = cert
        .to_der()
        .map_err(malformed("the signer's certificate"))?;
    for anchor in &trusted.certs {
        let vouches = if anchor.to_der().ok().as_deref() == Some(der.as_slice()) {
            true
        } else {
            anchor.tbs_certificate.subject == cert.tbs_certificate.issuer
                && cert.signature_algorithm.oid == oid::SHA256_WITH_RSA
                && cert
                    .tbs_certificate
                    .to_der()
                    .ok()
                    .zip(cert.signature.as_bytes())
                    .is_some_and(|(tbs, sig)| check_signature(anchor, &tbs, sig).is_ok())
        };
        if vouches {
            return Ok(Signer {
                subject: signer,
                trusted_by: subject(anchor),
            });
        }
    }
    Err(VerifyError::NotTrusted {
        signer,
        trusted: match trusted.subjects() {
            s if s.is_empty() => "none".into(),
            s => s.join("; "),
        },
    })
}
