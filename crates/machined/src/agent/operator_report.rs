//! The operator strategy: the node does not choose releases; it reports itself to the
//! rollout operator (docs/operator.md) every poll interval, and the operator upgrades it
//! through the node API. The report goes over mutual TLS with a client certificate the node
//! issues itself from its machine configuration's CA (the configuration holds the CA key, as
//! Talos' does), with the operator role the operator's API asks of heartbeats; it lives only
//! in memory and is renewed every [`RENEW_AFTER`].

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use slate_api::{Client, Role, Stage};
use slate_machine_config::MachineConfig;
use slate_rollout::{FailureReport, NodeReport};

use crate::node::Node;

const CLIENT_VALIDITY: Duration = Duration::from_secs(24 * 60 * 60);
const RENEW_AFTER: Duration = Duration::from_secs(12 * 60 * 60);
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The node's heartbeat identity, kept between ticks.
#[derive(Default)]
pub(super) struct OperatorReporter {
    identity: Option<Identity>,
}

struct Identity {
    /// The CA it was issued from: a new configuration with another CA needs a new one.
    ca_cert: String,
    cert: String,
    key: String,
    issued: Instant,
}

impl OperatorReporter {
    /// Reports the node to the first replica that takes it; answers which one did.
    pub(super) fn report(&mut self, node: &Node, config: &MachineConfig) -> Result<String, String> {
        let report = node_report(node, config);
        let identity = self.identity(config)?;
        let mut errors = Vec::new();
        for endpoint in &config.update.operator {
            let sent = Client::new(
                endpoint,
                identity.ca_cert.as_bytes(),
                identity.cert.as_bytes(),
                identity.key.as_bytes(),
            )
            .map(|c| c.with_timeout(CALL_TIMEOUT))
            .and_then(|c| {
                c.call::<serde_json::Value, _>("POST", "/v1/fleet/heartbeat", Some(&report))
            });
            match sent {
                Ok(_) => return Ok(endpoint.clone()),
                Err(e) => errors.push(format!("{endpoint}: {e}")),
            }
        }
        Err(errors.join("; "))
    }

    fn identity(&mut self, config: &MachineConfig) -> Result<&Identity, String> {
        let fresh = self
            .identity
            .as_ref()
            .is_some_and(|i| i.ca_cert == config.api.ca_cert && i.issued.elapsed() < RENEW_AFTER);
        if !fresh {
            let key = slate_api::generate_key_pem().map_err(|e| e.to_string())?;
            let cert = slate_api::issue_client_cert(
                &config.api.ca_cert,
                &config.api.ca_key,
                &key,
                Role::Operator,
                &config.node.name,
                CLIENT_VALIDITY,
            )
            .map_err(|e| format!("issuing the heartbeat certificate: {e}"))?;
            self.identity = Some(Identity {
                ca_cert: config.api.ca_cert.clone(),
                cert,
                key,
                issued: Instant::now(),
            });
        }
        Ok(self.identity.as_ref().expect("set above"))
    }
}

/// What the node says about itself. The agent runs only after the boot is committed, and
/// machined's health checks passed for that commit; a fatal stage is unhealthy.
fn node_report(node: &Node, config: &MachineConfig) -> NodeReport {
    let update = &config.update;
    let port = config
        .api
        .listen
        .map_or(slate_api::DEFAULT_PORT, |listen| listen.port());
    NodeReport {
        id: config.node.name.clone(),
        group: update.group.clone().unwrap_or_else(|| "default".into()),
        labels: update.labels.clone(),
        endpoint: update
            .advertise
            .clone()
            .unwrap_or_else(|| format!("{}:{port}", config.node.name)),
        version: node.version.clone(),
        channel: update.channel.clone(),
        committed: true,
        healthy: node.stage() != Stage::Failed,
        busy: node.running_sequence().is_some(),
        last_failure: node
            .last_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|f| FailureReport {
                version: f.version.clone(),
                reason: f.reason.clone(),
            }),
        sent_at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}
