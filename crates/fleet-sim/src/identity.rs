//! Each simulated node's identity, made as a real node's is: a key of its own, a serving
//! certificate naming the node (the operator checks that the node it orders is the node that
//! answers) and a client certificate naming it for its heartbeats (the operator takes a
//! heartbeat only about the node whose certificate sent it; docs/trust.md). They are issued
//! straight from the certificate directory's fleet CA: a real node's come from its own issuing
//! CA under it, a layer the simulation skips as it skips the disk. Made on first use and kept,
//! as is each node's client configuration for its heartbeats: a real node keeps its own, and
//! resumes its TLS session with the operator on the next heartbeat.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use slate_api::{CertError, Client, ClientTls};

/// A client certificate outlives any simulation.
const CLIENT_VALIDITY: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// One node's key and certificates (PEM).
#[derive(Debug)]
pub struct NodeIdentity {
    pub key: String,
    /// serverAuth, the node's id as its DNS name; the chain up to the fleet CA.
    pub serving: String,
    /// clientAuth, the node's id as its DNS name, no role; the chain up to the fleet CA.
    pub client: String,
    /// Its heartbeats' TLS configuration and session cache, made on its first heartbeat.
    heartbeats: OnceLock<ClientTls>,
}

/// The identities of a fleet's nodes, issued from a `slate gen certs` directory.
#[derive(Debug)]
pub struct Identities {
    fleet_ca: String,
    fleet_key: String,
    by_node: Mutex<HashMap<String, Arc<NodeIdentity>>>,
}

thread_local! {
    /// The I/O runtime of the heartbeats sent from this thread (the configuration of the first
    /// node it sent for): a node always reports from the same reporter lane, so each node's
    /// configuration is used on the thread whose runtime it has.
    static LANE_RUNTIME: std::cell::RefCell<Option<ClientTls>> = const { std::cell::RefCell::new(None) };
}

impl Identities {
    /// Reads the fleet CA (`ca.crt`, `ca.key`) of `dir`.
    pub fn from_dir(dir: &Path) -> Result<Self, CertError> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| CertError::Io {
                path,
                cause: source,
            })
        };
        Ok(Identities {
            fleet_ca: read(slate_api::CA_CERT)?,
            fleet_key: read(slate_api::CA_KEY)?,
            by_node: Mutex::default(),
        })
    }

    /// The fleet CA: what a node verifies the operator against.
    pub fn fleet_ca(&self) -> &str {
        &self.fleet_ca
    }

    /// The node `id`'s identity, issued on first use.
    pub fn node(&self, id: &str) -> Result<Arc<NodeIdentity>, CertError> {
        if let Some(known) = self.lock().get(id) {
            return Ok(known.clone());
        }
        let key = slate_api::generate_key_pem()?;
        let names = [id.to_owned()];
        let identity = Arc::new(NodeIdentity {
            serving: slate_api::issue_serving_cert(&self.fleet_ca, &self.fleet_key, &key, &names)?,
            client: slate_api::issue_node_client_cert(
                &self.fleet_ca,
                &self.fleet_key,
                &key,
                id,
                CLIENT_VALIDITY,
            )?,
            key,
            heartbeats: OnceLock::new(),
        });
        Ok(self.lock().entry(id.to_owned()).or_insert(identity).clone())
    }

    /// A client of the operator replica at `addr` that speaks as the node `id`, over the
    /// node's own kept configuration: its next heartbeat resumes the session this one begins.
    pub fn heartbeat_client(&self, id: &str, addr: &str) -> Result<Client, String> {
        let identity = self.node(id).map_err(|e| e.to_string())?;
        let tls = match identity.heartbeats.get() {
            Some(tls) => tls,
            None => {
                let made = self.heartbeat_tls(&identity).map_err(|e| e.to_string())?;
                // Two threads may make one at once; either is the node's.
                identity.heartbeats.get_or_init(|| made)
            }
        };
        tls.client(addr)
            .map(|c| c.with_timeout(Duration::from_secs(10)))
            .map_err(|e| e.to_string())
    }

    fn heartbeat_tls(&self, identity: &NodeIdentity) -> Result<ClientTls, slate_api::ClientError> {
        let (ca, cert, key) = (
            self.fleet_ca.as_bytes(),
            identity.client.as_bytes(),
            identity.key.as_bytes(),
        );
        LANE_RUNTIME.with_borrow_mut(|lane| {
            let base = match lane.as_ref() {
                Some(base) => base,
                None => lane.insert(ClientTls::on_calling_thread(ca, cert, key)?),
            };
            base.with_identity(ca, cert, key)
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<NodeIdentity>>> {
        self.by_node.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
