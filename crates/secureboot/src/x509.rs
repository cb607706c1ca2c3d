//! What signing and verifying share: the object identifiers of Authenticode's CMS structures,
//! and a certificate's subject as text.

use x509_cert::Certificate;

/// The object identifiers both sides name.
pub(crate) mod oid {
    use der::asn1::ObjectIdentifier as Oid;
    pub const SHA256: Oid = Oid::new_unwrap("2.16.840.1.101.3.4.2.1");
    pub const RSA_ENCRYPTION: Oid = Oid::new_unwrap("1.2.840.113549.1.1.1");
    pub const SHA256_WITH_RSA: Oid = Oid::new_unwrap("1.2.840.113549.1.1.11");
    pub const SIGNED_DATA: Oid = Oid::new_unwrap("1.2.840.113549.1.7.2");
    pub const CONTENT_TYPE: Oid = Oid::new_unwrap("1.2.840.113549.1.9.3");
    pub const MESSAGE_DIGEST: Oid = Oid::new_unwrap("1.2.840.113549.1.9.4");
    pub const SPC_PE_IMAGE_DATA: Oid = Oid::new_unwrap("1.3.6.1.4.1.311.2.1.15");
    pub use authenticode::SPC_INDIRECT_DATA_OBJID as SPC_INDIRECT_DATA;
}

/// The subject as RFC 4514 text, as `slate secureboot` prints it.
pub(crate) fn subject(cert: &Certificate) -> String {
    cert.tbs_certificate.subject.to_string()
}
