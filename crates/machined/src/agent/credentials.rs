//! The node's client credentials toward fleet services (the rollout operator, a FleetLock
//! server with mutual TLS): a key and a client certificate the node issues itself from its own
//! issuing CA (its machine configuration's `api.ca_key`) — no role, only the node's name, which
//! a service takes as that node and nothing more (docs/trust.md) — and the fleet CA to verify
//! the service against. They live only in memory and are renewed every [`RENEW_AFTER`].
//! Each set keeps its clients, one per service endpoint, so that the next call resumes the TLS
//! session the last one began; a renewed set starts with none.

use std::time::{Duration, Instant};

use slate_api::{Client, ClientError};

use slate_machine_config::MachineConfig;

const CLIENT_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);
const RENEW_AFTER: Duration = Duration::from_secs(12 * 60 * 60);

/// One issued set.
pub(super) struct Identity {
    /// The CA it was issued from: a new configuration with another CA needs a new one.
    ca_cert: String,
    /// What the service's certificate must chain to (PEM).
    pub(super) fleet_ca: String,
    /// The client certificate and its issuing CA (PEM).
    pub(super) cert: String,
    pub(super) key: String,
    issued: Instant,
    /// By endpoint: a client made from this set, with its TLS session cache.
    clients: Vec<(String, Client)>,
}

impl Identity {
    /// The client of `endpoint` made from this set, its calls bounded by `timeout`: made on
    /// first use and kept.
    pub(super) fn client(
        &mut self,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<&Client, ClientError> {
        let at = match self.clients.iter().position(|(e, _)| e == endpoint) {
            Some(at) => at,
            None => {
                let client = Client::new(
                    endpoint,
                    self.fleet_ca.as_bytes(),
                    self.cert.as_bytes(),
                    self.key.as_bytes(),
                )?
                .with_timeout(timeout);
                self.clients.push((endpoint.to_owned(), client));
                self.clients.len() - 1
            }
        };
        Ok(&self.clients[at].1)
    }

    /// Drops the clients of endpoints no longer configured.
    pub(super) fn keep_clients_of(&mut self, endpoints: &[String]) {
        self.clients.retain(|(e, _)| endpoints.contains(e));
    }
}

/// The node's credentials, kept between ticks.
#[derive(Default)]
pub(super) struct Credentials {
    identity: Option<Identity>,
}

impl Credentials {
    /// The current set, issued anew when the configuration's CAs changed or it is old.
    pub(super) fn current(&mut self, config: &MachineConfig) -> Result<&mut Identity, String> {
        let fresh = self.identity.as_ref().is_some_and(|i| {
            i.ca_cert == config.api.ca_cert
                && i.fleet_ca == config.fleet_ca()
                && i.issued.elapsed() < RENEW_AFTER
        });
        if !fresh {
            let key = slate_api::generate_key_pem().map_err(|e| e.to_string())?;
            let cert = slate_api::issue_node_client_cert(
                &config.api.ca_cert,
                &config.api.ca_key,
                &key,
                &config.node.name,
                CLIENT_VALIDITY,
            )
            .map_err(|e| format!("issuing the node's client certificate: {e}"))?;
            self.identity = Some(Identity {
                ca_cert: config.api.ca_cert.clone(),
                fleet_ca: config.fleet_ca().to_owned(),
                cert,
                key,
                issued: Instant::now(),
                clients: Vec::new(),
            });
        }
        Ok(self.identity.as_mut().expect("set above"))
    }
}
