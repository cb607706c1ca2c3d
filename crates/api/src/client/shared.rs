//! One TLS configuration and one I/O runtime for many [`Client`]s: what a program that calls
//! many nodes (the rollout operator's orders) builds once instead of once per call.
//!
//! [`Client::from_dir`] reads three PEM files, parses and checks the certificates, builds a
//! rustls configuration and starts a runtime: at fleet scale that is most of an order's cost
//! besides the handshake. Sharing the `rustls::ClientConfig` also shares its session cache, so a
//! node called again resumes its TLS session instead of a full mutual-TLS handshake.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::{parse_addr, Client, ClientError, REQUEST_TIMEOUT};
use crate::certs::{self, CertError};
use crate::tls;
use crate::types::Role;

/// Threads that run the connections' tasks of the clients of one [`ClientTls`]; the calls
/// themselves (and their handshakes) run on the threads that make them.
const IO_THREADS: usize = 2;
/// The servers whose sessions a [`ClientTls::with_identity`] keeps.
const FEW_SERVERS: usize = 4;

/// The TLS configuration and I/O runtime shared by the clients it makes; cheap to clone.
/// The clients may be used from many threads at once (each call blocks its own thread).
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    rt: Arc<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusting `ca_pem` and presenting `cert_pem`/`key_pem`, as [`Client::new`].
    pub fn new(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, ClientError> {
        // A multi-thread runtime: a current-thread one would run every connection's task on
        // whichever caller happens to hold it, one at a time.
        let mut runtime = tokio::runtime::Builder::new_multi_thread();
        runtime
            .worker_threads(IO_THREADS)
            .thread_name("slate-api-client");
        Self::on_runtime(ca_pem, cert_pem, key_pem, runtime)
    }

    /// As [`ClientTls::new`], with the connections run on the thread that calls, as a
    /// [`Client`] of its own runs them: for a program whose calls through it come from one thread
    /// (the fleet simulator's reporter lanes), where handing each connection to I/O threads and
    /// back would cost more than the call.
    pub fn on_calling_thread(
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread();
        Self::on_runtime(ca_pem, cert_pem, key_pem, runtime)
    }

    fn on_runtime(
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        mut runtime: tokio::runtime::Builder,
    ) -> Result<Self, ClientError> {
        let config = tls::client_config(ca_pem, Some((cert_pem, key_pem)))?;
        let rt = runtime
            .enable_all()
            .build()
            .map_err(|e| ClientError::Protocol {
                addr: String::new(),
                message: format!("cannot start the I/O runtime: {e}"),
            })?;
        Ok(ClientTls {
            connector: TlsConnector::from(Arc::new(config)),
            rt: Arc::new(rt),
        })
    }

    /// With `ca.crt` and `<role>.crt`/`<role>.key` from `dir`, as [`Client::from_dir`].
    pub fn from_dir(dir: &Path, role: Role) -> Result<Self, ClientError> {
        let read = |name: &str| {
            let path = dir.join(name);
            certs::read_pem(&path).map_err(|cause| CertError::Io { path, cause })
        };
        let ca = read(certs::CA_CERT)?;
        let cert = read(&certs::client_cert_file(role))?;
        let key = read(&certs::client_key_file(role))?;
        Self::new(&ca, &cert, &key)
    }

    /// Another identity's configuration (trusting `ca_pem`, presenting `cert_pem`/`key_pem`) on
    /// this one's I/O runtime: what a program speaking as many nodes (the fleet simulator) keeps
    /// per node, so that each resumes its own TLS sessions without a runtime of its own. Its
    /// session cache holds four servers' sessions: a node calls its operator's few replicas.
    pub fn with_identity(
        &self,
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
    ) -> Result<Self, ClientError> {
        let mut config = tls::client_config(ca_pem, Some((cert_pem, key_pem)))?;
        // rustls' default cache sets room for 256 servers aside: about 40 KiB per identity.
        config.resumption = rustls::client::Resumption::in_memory_sessions(FEW_SERVERS);
        Ok(ClientTls {
            connector: TlsConnector::from(Arc::new(config)),
            rt: self.rt.clone(),
        })
    }

    /// A client of the node at `addr` (as [`Client::new`]) over this configuration: no file
    /// read, no configuration or runtime built.
    pub fn client(&self, addr: &str) -> Result<Client, ClientError> {
        let (host, port) = parse_addr(addr).ok_or_else(|| ClientError::Address(addr.into()))?;
        let server_name =
            ServerName::try_from(host.clone()).map_err(|_| ClientError::Address(addr.into()))?;
        Ok(Client {
            rt: self.rt.clone(),
            connector: self.connector.clone(),
            host,
            port,
            server_name,
            request_timeout: REQUEST_TIMEOUT,
            maintenance_token: None,
        })
    }

    /// Whether `client` was made by this configuration (it shares its session cache).
    pub fn made(&self, client: &Client) -> bool {
        Arc::ptr_eq(self.connector.config(), client.connector.config())
            && Arc::ptr_eq(&self.rt, &client.rt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_share_one_configuration() {
        let dir = tempfile::tempdir().unwrap();
        crate::gen_certs(dir.path(), &["node-1.example".to_owned()]).unwrap();
        let tls = ClientTls::from_dir(dir.path(), Role::Operator).unwrap();
        let a = tls.client("10.0.0.1:50000").unwrap();
        let b = tls.clone().client("node-2.example").unwrap();
        assert!(tls.made(&a) && tls.made(&b));
        assert_eq!(b.addr(), "node-2.example:50000");
        let own = Client::from_dir("10.0.0.1:50000", dir.path(), Role::Operator).unwrap();
        assert!(!tls.made(&own));
        assert!(matches!(tls.client("a b:1"), Err(ClientError::Address(_))));
    }
}
