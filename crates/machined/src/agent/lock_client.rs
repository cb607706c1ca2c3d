//! The FleetLock v1 client (docs/formats.md §8): the same two requests zincati sends, so the
//! agent works against slate's lock server, airlock, or any other.

use std::time::Duration;

use slate_fleetlock::request::{PROTOCOL_HEADER, PROTOCOL_HEADER_VALUE};
use slate_fleetlock::{ClientId, ClientParams, GroupName, Operation, ReceivedRefusal};

#[derive(Debug)]
pub struct LockClient {
    agent: ureq::Agent,
    server: String,
    body: Vec<u8>,
}

/// Why a lock or unlock did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// The server answered, and said no (`failed_lock`: the group's slots are taken).
    #[error("{kind}: {value}")]
    Refused { kind: String, value: String },
    #[error("lock server {server}: {reason}")]
    Unreachable { server: String, reason: String },
}

/// Mutual TLS toward the lock server (PEM): the roots its certificate must chain to, and the
/// node's client certificate chain and key.
#[derive(Debug, Clone)]
pub struct LockTls {
    pub roots_pem: String,
    pub chain_pem: String,
    pub key_pem: String,
}

impl LockClient {
    /// `server` is the base URL (`http://host:port`, or `https://…` with `tls`); `id` is this
    /// node's name.
    pub fn new(server: &str, group: &str, id: &str, tls: Option<&LockTls>) -> Result<Self, String> {
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)));
        if let Some(tls) = tls {
            use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
            let certs = |pem: &str, what: &str| -> Result<Vec<Certificate<'static>>, String> {
                ureq::tls::parse_pem(pem.as_bytes())
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                        Ok(_) => None,
                        Err(e) => Some(Err(format!("{what}: {e}"))),
                    })
                    .collect()
            };
            let key = PrivateKey::from_pem(tls.key_pem.as_bytes())
                .map_err(|e| format!("the client key: {e}"))?;
            let tls_config = TlsConfig::builder()
                .root_certs(RootCerts::new_with_certs(&certs(
                    &tls.roots_pem,
                    "the fleet CA",
                )?))
                .client_cert(Some(ClientCert::new_with_certs(
                    &certs(&tls.chain_pem, "the client certificate")?,
                    key,
                )))
                .build();
            config = config.tls_config(tls_config);
        }
        // The protocol's own rules, before anything is sent.
        let params = ClientParams {
            id: ClientId::new(id).map_err(|e| format!("the node name as a FleetLock id: {e}"))?,
            group: GroupName::new(group).map_err(|e| format!("update.lock_group: {e}"))?,
        };
        Ok(LockClient {
            agent: ureq::Agent::new_with_config(config.build()),
            server: server.trim_end_matches('/').to_owned(),
            body: slate_fleetlock::encode_body(&params),
        })
    }

    /// `POST /v1/pre-reboot`: take a slot (idempotent for the same id).
    pub fn lock(&self) -> Result<(), LockError> {
        self.post(Operation::Lock)
    }

    /// `POST /v1/steady-state`: give the slot back (idempotent; fine when none is held).
    pub fn unlock(&self) -> Result<(), LockError> {
        self.post(Operation::Unlock)
    }

    fn post(&self, operation: Operation) -> Result<(), LockError> {
        let url = format!("{}{}", self.server, operation.path());
        let unreachable = |reason: String| LockError::Unreachable {
            server: self.server.clone(),
            reason,
        };
        let mut response = self
            .agent
            .post(&url)
            .header(PROTOCOL_HEADER, PROTOCOL_HEADER_VALUE)
            .content_type("application/json")
            .send(&self.body[..])
            .map_err(|e| unreachable(e.to_string()))?;
        let status = response.status();
        if status.as_u16() == 200 {
            return Ok(());
        }
        let text = response
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_string()
            .unwrap_or_default();
        match ReceivedRefusal::parse(text.as_bytes()) {
            Some(refusal) => Err(LockError::Refused {
                kind: refusal.kind,
                value: refusal.value,
            }),
            None => Err(unreachable(format!(
                "answered {status} without a FleetLock error body"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use slate_fleetlock::{Groups, Service};
    use slate_fleetlock_server::{FileStore, Server, Tls};

    use super::*;

    /// The client against slate's own lock server (file store), one slot: what zincati's
    /// requests get, byte for byte the same answers.
    #[test]
    fn two_nodes_share_one_slot_through_a_real_server() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::create(dir.path()).unwrap();
        let groups = Groups::new(["workers=1".parse().unwrap()]).unwrap();
        let server = Server::bind("127.0.0.1:0".parse().unwrap())
            .unwrap()
            .spawn(
                Arc::new(Service::new(groups, store)),
                Arc::new(|_: &str| {}),
            )
            .unwrap();
        let url = format!("http://{}", server.local_addr());
        let a = LockClient::new(&url, "workers", "node-a", None).unwrap();
        let b = LockClient::new(&format!("{url}/"), "workers", "node-b", None).unwrap();
        a.lock().unwrap();
        a.lock().unwrap();
        match b.lock() {
            Err(LockError::Refused { kind, value }) => {
                assert_eq!(kind, "failed_lock");
                assert!(
                    value.contains("all 1 semaphore slots currently locked"),
                    "{value}"
                );
            }
            other => panic!("node-b must wait for the slot: {other:?}"),
        }
        b.unlock().unwrap();
        a.unlock().unwrap();
        b.lock().unwrap();
        let other_group = LockClient::new(&url, "nobody", "node-c", None).unwrap();
        assert!(matches!(
            other_group.lock(),
            Err(LockError::Refused { kind, .. }) if kind == "unknown_group"
        ));
        server.shutdown().unwrap();
        let gone = LockClient::new(&url, "workers", "node-a", None).unwrap();
        assert!(matches!(gone.unlock(), Err(LockError::Unreachable { .. })));
    }

    /// `slate fleetlock serve --tls-cert service.crt --tls-key service.key --client-ca ca.crt`
    /// (a `slate gen certs` directory): a node reaches it with its own client certificate and
    /// the fleet CA, and takes a slot for itself only.
    #[test]
    fn a_node_locks_for_itself_only_over_mutual_tls() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("pki");
        slate_api::gen_certs(&pki, &[]).unwrap();
        let tls = Tls::from_files(
            &pki.join(slate_api::SERVICE_CERT),
            &pki.join(slate_api::SERVICE_KEY),
            Some(&pki.join(slate_api::CA_CERT)),
        )
        .unwrap();
        let store = FileStore::create(&dir.path().join("store")).unwrap();
        let groups = Groups::new(["workers=2".parse().unwrap()]).unwrap();
        let server = Server::bind("127.0.0.1:0".parse().unwrap())
            .unwrap()
            .with_tls(tls)
            .spawn(
                Arc::new(Service::new(groups, store)),
                Arc::new(|_: &str| {}),
            )
            .unwrap();
        let url = format!("https://{}", server.local_addr());
        let trust = slate_api::NodeTrust::issue(&pki, "node-a", &["node-a".into()], &[]).unwrap();
        let key = slate_api::generate_key_pem().unwrap();
        let cert = slate_api::issue_node_client_cert(
            &trust.ca_cert,
            &trust.ca_key,
            &key,
            "node-a",
            Duration::from_secs(600),
        )
        .unwrap();
        let tls = LockTls {
            roots_pem: trust.fleet_ca,
            chain_pem: cert,
            key_pem: key,
        };
        let own = LockClient::new(&url, "workers", "node-a", Some(&tls)).unwrap();
        own.lock().unwrap();
        own.unlock().unwrap();
        let other = LockClient::new(&url, "workers", "node-b", Some(&tls)).unwrap();
        match other.lock() {
            Err(LockError::Refused { kind, value }) => {
                assert_eq!(kind, "invalid_client_identity");
                assert!(value.contains("does not name \"node-b\""), "{value}");
            }
            other => panic!("node-a's certificate took node-b's slot: {other:?}"),
        }
        // Without a certificate the handshake fails.
        let anonymous = LockClient::new(&url, "workers", "node-a", None).unwrap();
        assert!(matches!(
            anonymous.lock(),
            Err(LockError::Unreachable { .. })
        ));
        server.shutdown().unwrap();
    }
}
