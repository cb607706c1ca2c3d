//! Each simulated node's identity, made as a real node's is: a key of its own, a serving
//! certificate naming the node (the operator checks that the node it orders is the node that
//! answers) and a client certificate naming it for its heartbeats (the operator takes a
//! heartbeat only about the node whose certificate sent it; docs/trust.md). They are issued
//! straight from the certificate directory's fleet CA: a real node's come from its own issuing
//! CA under it, a layer the simulation skips as it skips the disk. Made on first use and kept.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use slate_api::{CertError, Client};

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
}

/// The identities of a fleet's nodes, issued from a `slate gen certs` directory.
#[derive(Debug)]
pub struct Identities {
    fleet_ca: String,
    fleet_key: String,
    by_node: Mutex<HashMap<String, Arc<NodeIdentity>>>,
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
        });
        Ok(self.lock().entry(id.to_owned()).or_insert(identity).clone())
    }

    /// A client of the operator replica at `addr` that speaks as the node `id`.
    pub fn heartbeat_client(&self, id: &str, addr: &str) -> Result<Client, String> {
        let identity = self.node(id).map_err(|e| e.to_string())?;
        Client::new(
            addr,
            self.fleet_ca.as_bytes(),
            identity.client.as_bytes(),
            identity.key.as_bytes(),
        )
        .map(|c| c.with_timeout(Duration::from_secs(10)))
        .map_err(|e| e.to_string())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<NodeIdentity>>> {
        self.by_node.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
