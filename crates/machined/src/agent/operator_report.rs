//! The operator strategy: the node does not choose releases; it reports itself to the
//! rollout operator (docs/operator.md) every poll interval, and the operator upgrades it
//! through the node API. The report goes over mutual TLS with the node's own client
//! certificate (`credentials.rs`), which the operator takes as [`slate_api::Role::Node`] and
//! accepts a report about that node only (docs/trust.md); the operator is verified against
//! the fleet CA.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use slate_api::Stage;
use slate_machine_config::MachineConfig;
use slate_rollout::{FailureReport, NodeReport};

use super::credentials::Credentials;
use crate::base::node::Node;

const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Reports the node to the first replica that takes it; answers which one did.
pub(super) fn report(
    credentials: &mut Credentials,
    node: &Node,
    config: &MachineConfig,
) -> Result<String, String> {
    let report = node_report(node, config);
    let identity = credentials.current(config)?;
    identity.keep_clients_of(&config.update.operator);
    let mut errors = Vec::new();
    for endpoint in &config.update.operator {
        // The identity's kept client: the next report resumes this one's TLS session.
        let sent = identity.client(endpoint, CALL_TIMEOUT).and_then(|c| {
            c.call::<serde_json::Value, _>("POST", "/v1/fleet/heartbeat", Some(&report))
        });
        match sent {
            Ok(_) => return Ok(endpoint.clone()),
            Err(e) => errors.push(format!("{endpoint}: {e}")),
        }
    }
    Err(errors.join("; "))
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::{json, Value};
    use slate_api::{BackendError, Caller, JsonService, Role, ServerConfig, ServiceRoute};
    use slate_machine_config::{Api, Etc, Network, Node as NodeSection, Strategy, UpdateSettings};

    use super::*;

    const HEARTBEAT: ServiceRoute = ServiceRoute::new("POST", "/v1/fleet/heartbeat", Role::Node);

    /// The operator API's heartbeat route, recording what arrives and from whom.
    #[derive(Default)]
    struct Operator {
        seen: Mutex<Vec<(Caller, NodeReport)>>,
    }

    impl JsonService for Operator {
        fn routes(&self) -> &[ServiceRoute] {
            std::slice::from_ref(&HEARTBEAT)
        }

        fn call(
            &self,
            _: &ServiceRoute,
            caller: &Caller,
            _: Option<&str>,
            body: &[u8],
        ) -> Result<Value, BackendError> {
            let report = serde_json::from_slice(body)
                .map_err(|e| BackendError::InvalidArgument(e.to_string()))?;
            self.seen.lock().unwrap().push((caller.clone(), report));
            Ok(json!({ "written": true }))
        }

        /// None of its own: the server's counters (its handshakes) answer.
        fn metrics(&self) -> Option<String> {
            Some(String::new())
        }
    }

    #[test]
    fn the_node_reports_itself_as_itself_with_a_certificate_from_its_own_ca() {
        let pki = tempfile::tempdir().unwrap();
        slate_api::gen_certs(pki.path(), &[]).unwrap();
        let trust =
            slate_api::NodeTrust::issue(pki.path(), "node7", &["node7".into()], &[]).unwrap();
        let operator = Arc::new(Operator::default());
        let server = slate_api::spawn_service(
            ServerConfig::from_dir("127.0.0.1:0".parse().unwrap(), pki.path()).unwrap(),
            operator.clone(),
        )
        .unwrap();
        let config = MachineConfig {
            version: slate_machine_config::CURRENT_VERSION,
            node: NodeSection {
                name: "node7".into(),
                hostname: None,
            },
            network: Network::default(),
            api: Api {
                listen: None,
                ca_cert: trust.ca_cert,
                ca_key: trust.ca_key,
                client_ca: trust.client_ca,
                fleet_ca: Some(trust.fleet_ca),
                extra_sans: Vec::new(),
            },
            update: UpdateSettings {
                enabled: true,
                strategy: Strategy::Operator,
                // The first replica is down: the report goes to the next.
                operator: vec!["127.0.0.1:1".into(), server.local_addr().to_string()],
                group: Some("web".into()),
                labels: [("zone".to_owned(), "a".to_owned())].into(),
                advertise: Some("127.0.0.1:50007".into()),
                ..UpdateSettings::default()
            },
            etc: Etc::default(),
            reboot: Default::default(),
            services: Vec::new(),
            drain: None,
            var: None,
        };
        let (node, _requests) = Node::for_tests("");
        let mut reporter = Credentials::default();
        let replica = report(&mut reporter, &node, &config).unwrap();
        assert_eq!(replica, server.local_addr().to_string());
        report(&mut reporter, &node, &config).unwrap();
        let seen = operator.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        let (caller, sent) = &seen[0];
        assert_eq!(caller.role, Role::Node, "a node, not an operator");
        assert_eq!(caller.node_names, ["node7"]);
        assert_eq!(sent.id, "node7");
        assert_eq!(sent.group, "web");
        assert_eq!(sent.labels["zone"], "a");
        assert_eq!(sent.endpoint, "127.0.0.1:50007");
        assert_eq!(sent.version, node.version);
        assert!(sent.committed && sent.healthy && !sent.busy);
        assert!(seen[1].1.sent_at_ms >= sent.sent_at_ms && sent.sent_at_ms > 0);
        // The second report resumed the first one's TLS session, and the operator still took
        // it as the node (it judges the resumed session's chain again).
        assert_eq!(seen[1].0, *caller);
        let reader =
            slate_api::Client::from_dir(&server.local_addr().to_string(), pki.path(), Role::Reader)
                .unwrap();
        let metrics = reader.get_text("/metrics").unwrap();
        for line in [
            r#"slate_api_tls_handshakes_total{kind="resumed"} 1"#,
            // The first report's and the reader's.
            r#"slate_api_tls_handshakes_total{kind="full"} 2"#,
        ] {
            assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
        }
        // Another fleet's operator (another CA) is not reported to.
        let other = tempfile::tempdir().unwrap();
        slate_api::gen_certs(other.path(), &[]).unwrap();
        let foreign = slate_api::spawn_service(
            ServerConfig::from_dir("127.0.0.1:0".parse().unwrap(), other.path()).unwrap(),
            Arc::new(Operator::default()),
        )
        .unwrap();
        let mut elsewhere = config.clone();
        elsewhere.update.operator = vec![foreign.local_addr().to_string()];
        assert!(report(&mut reporter, &node, &elsewhere).is_err());
        server.shutdown().unwrap();
        foreign.shutdown().unwrap();
    }
}
