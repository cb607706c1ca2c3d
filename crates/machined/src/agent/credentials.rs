//! The node's client credentials toward fleet services (the rollout operator, a FleetLock
//! server with mutual TLS): a key and a client certificate the node issues itself from its own
//! issuing CA (its machine configuration's `api.ca_key`) — no role, only the node's name, which
//! a service takes as that node and nothing more (docs/trust.md) — and the fleet CA to verify
//! the service against. They live only in memory and are renewed every [`RENEW_AFTER`].

use std::time::{Duration, Instant};

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
}

/// The node's credentials, kept between ticks.
#[derive(Default)]
pub(super) struct Credentials {
    identity: Option<Identity>,
}

impl Credentials {
    /// The current set, issued anew when the configuration's CAs changed or it is old.
    pub(super) fn current(&mut self, config: &MachineConfig) -> Result<&Identity, String> {
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
            });
        }
        Ok(self.identity.as_ref().expect("set above"))
    }
}
