//! TLS for registries: rustls on ring with the compiled-in Mozilla roots (a node's root file
//! system has no CA store), plus the CA certificates a user names for a registry with a private
//! CA ([`CaCertificates`], `--ca-file`). A certificate the roots do not vouch for is a
//! [`TransportError::Certificate`], which says how to trust a private CA.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use crate::TransportError;

/// A CA file is read up to this size (a bundle of every public root is ~250 KiB).
const MAX_CA_FILE: u64 = 4 * 1024 * 1024;

/// CA certificates trusted besides the compiled-in roots.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CaCertificates(Vec<Vec<u8>>);

impl std::fmt::Debug for CaCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CaCertificates({} certificates)", self.0.len())
    }
}

impl CaCertificates {
    /// No extra CA: the compiled-in roots only.
    pub fn none() -> Self {
        Self::default()
    }

    /// Every certificate of the PEM file at `path` (other PEM items, such as keys, are
    /// ignored); a file without one is refused.
    pub fn from_pem_file(path: &Path) -> Result<Self, TransportError> {
        use std::io::Read as _;
        let mut pem = Vec::new();
        crate::files::open_regular(path)?
            .take(MAX_CA_FILE + 1)
            .read_to_end(&mut pem)
            .map_err(TransportError::io(path))?;
        if pem.len() as u64 > MAX_CA_FILE {
            return Err(TransportError::CaFile {
                path: path.to_owned(),
                reason: format!("it is larger than {MAX_CA_FILE} bytes"),
            });
        }
        Self::from_pem(&pem).map_err(|reason| TransportError::CaFile {
            path: path.to_owned(),
            reason,
        })
    }

    /// Every certificate in `pem`; why not when there is none or the PEM is broken.
    pub fn from_pem(pem: &[u8]) -> Result<Self, String> {
        let mut certs = Vec::new();
        for item in ureq::tls::parse_pem(pem) {
            match item.map_err(|e| e.to_string())? {
                PemItem::Certificate(cert) => certs.push(cert.der().to_vec()),
                _ => continue,
            }
        }
        if certs.is_empty() {
            return Err("it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
        }
        Ok(CaCertificates(certs))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The roots to verify servers with: the compiled-in ones, and these.
    fn root_certs(&self) -> RootCerts {
        if self.0.is_empty() {
            return RootCerts::WebPki;
        }
        let compiled_in = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .map(|der| Certificate::from_der(der.as_ref()).to_owned());
        let extra = self
            .0
            .iter()
            .map(|der| Certificate::from_der(der).to_owned());
        RootCerts::Specific(Arc::new(compiled_in.chain(extra).collect()))
    }
}

/// The HTTP agent for one registry: redirects keep `Authorization` on the same host only.
pub(crate) fn agent(ca: &CaCertificates) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(5)
        .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
        .user_agent(concat!("slate/", env!("CARGO_PKG_VERSION")))
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(120)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .tls_config(TlsConfig::builder().root_certs(ca.root_certs()).build())
        .build();
    ureq::Agent::new_with_config(config)
}

/// Why the server's certificate was refused, when that is what `error` is.
pub(crate) fn certificate_problem(error: &ureq::Error) -> Option<String> {
    let tls = match error {
        ureq::Error::Rustls(e) => Some(e),
        ureq::Error::Io(e) => e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()),
        _ => None,
    }?;
    matches!(tls, rustls::Error::InvalidCertificate(_)).then(|| tls.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_files_need_a_certificate() {
        assert!(CaCertificates::from_pem(b"").is_err());
        let key_only =
            b"-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
        let err = CaCertificates::from_pem(key_only).unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "hello").unwrap();
        let err = CaCertificates::from_pem_file(&path).unwrap_err();
        assert!(matches!(&err, TransportError::CaFile { .. }), "{err:?}");
        assert!(
            err.to_string().starts_with(&path.display().to_string()),
            "{err}"
        );
        assert!(matches!(
            CaCertificates::none().root_certs(),
            RootCerts::WebPki
        ));
    }
}
