//! Driving a node: the upgrade order goes to the node's own API (`POST /v1/upgrade`) with the
//! operator's client certificate, as `slate upgrade` would send it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use slate_api::{ClientError, ClientTls, Role, UpgradeRequest};
use slate_rollout::{Order, Strategy};

/// How long one upgrade call may take: the node answers as soon as it has taken its lock.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Why an order did not reach a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriveError {
    /// The node answered no (locked, refused the image, …): the attempt failed.
    #[error("the node refused: {0}")]
    Refused(String),
    /// No answer: the node may or may not have taken it.
    #[error("no answer: {0}")]
    Unreachable(String),
}

/// What sends orders; the API client in production, a recorder in unit tests.
pub trait NodeDriver: Send + Sync {
    fn upgrade(&self, order: &Order) -> Result<(), DriveError>;

    /// A leadership begins: what the driver holds from the last one (certificates read then)
    /// is read again, so a replaced certificate is taken at the next term at the latest.
    fn new_term(&self) {}
}

/// Sends orders through the node API with `operator.crt`/`operator.key` and `ca.crt` from a
/// certificate directory (as `slate gen certs` writes it).
///
/// The certificates are read, and the TLS configuration and I/O runtime built, once per
/// leadership and shared by every order of it: at 10,000 nodes building them per order (and a
/// full handshake with no session cache) held the leader's ticks for seconds.
#[derive(Debug)]
pub struct ApiDriver {
    certs: PathBuf,
    tls: Mutex<Option<ClientTls>>,
    built: AtomicUsize,
}

impl ApiDriver {
    pub fn new(certs: &Path) -> Self {
        ApiDriver {
            certs: certs.to_owned(),
            tls: Mutex::new(None),
            built: AtomicUsize::new(0),
        }
    }

    /// How many TLS configurations this driver has built (one per term that sent orders).
    pub fn configs_built(&self) -> usize {
        self.built.load(Ordering::Relaxed)
    }

    /// The term's configuration, built on its first order. A failure is not kept: the next
    /// order tries again (the certificates may be being replaced).
    fn tls(&self) -> Result<ClientTls, ClientError> {
        let mut held = self.tls.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tls) = held.as_ref() {
            return Ok(tls.clone());
        }
        let tls = ClientTls::from_dir(&self.certs, Role::Operator)?;
        self.built.fetch_add(1, Ordering::Relaxed);
        *held = Some(tls.clone());
        Ok(tls)
    }
}

impl NodeDriver for ApiDriver {
    fn upgrade(&self, order: &Order) -> Result<(), DriveError> {
        // The node's certificate must name the node ordered, whatever address it advertised:
        // a node cannot send the operator's orders for another node to itself.
        let client = self
            .tls()
            .and_then(|tls| tls.client(&order.endpoint))
            .and_then(|c| c.with_server_name(&order.node))
            .map_err(|e| DriveError::Unreachable(e.to_string()))?
            .with_timeout(CALL_TIMEOUT);
        let request = UpgradeRequest {
            // The node keeps its configuration across the wipe (META ReplaceOnBoot): the
            // operator holds no node's secrets.
            replace: order.strategy == Strategy::Replace,
            ..UpgradeRequest::new(order.image.clone())
        };
        match client.upgrade(&request) {
            Ok(()) => Ok(()),
            // No request went through, or no answer came back, or the node is busy with a
            // sequence (perhaps this very upgrade, sent by a leader that died before it
            // recorded the answer): the node's reports decide what happened.
            Err(
                e @ (ClientError::Timeout { .. }
                | ClientError::Protocol { .. }
                | ClientError::Connect { .. }
                | ClientError::Tls { .. }
                | ClientError::Locked(_)),
            ) => Err(DriveError::Unreachable(e.to_string())),
            Err(e) => Err(DriveError::Refused(e.to_string())),
        }
    }

    fn new_term(&self) {
        *self.tls.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(node: &str, endpoint: &str) -> Order {
        Order {
            group: "g".into(),
            rollout: 1,
            node: node.into(),
            endpoint: endpoint.into(),
            image: "registry/os:2@sha256:00".into(),
            strategy: Strategy::InPlace,
        }
    }

    /// Orders of one term share one TLS configuration: at 10,000 nodes one built per order
    /// was most of what held the leader's ticks.
    #[test]
    fn one_configuration_per_term() {
        let dir = tempfile::tempdir().unwrap();
        slate_api::gen_certs(dir.path(), &["node-1.example".to_owned()]).unwrap();
        // Nothing listens there: each order fails at connect, after its client was made.
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = free.local_addr().unwrap().to_string();
        drop(free);
        let driver = ApiDriver::new(dir.path());
        for node in ["node-1", "node-2", "node-3"] {
            let answer = driver.upgrade(&order(node, &endpoint));
            assert!(
                matches!(answer, Err(DriveError::Unreachable(_))),
                "{answer:?}"
            );
        }
        assert_eq!(driver.configs_built(), 1);
        driver.new_term();
        let _ = driver.upgrade(&order("node-1", &endpoint));
        assert_eq!(driver.configs_built(), 2);
    }

    /// Unreadable certificates are not remembered: the next order reads them again.
    #[test]
    fn a_failed_configuration_is_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let driver = ApiDriver::new(dir.path());
        let answer = driver.upgrade(&order("node-1", "127.0.0.1:1"));
        assert!(
            matches!(answer, Err(DriveError::Unreachable(_))),
            "{answer:?}"
        );
        assert_eq!(driver.configs_built(), 0);
        slate_api::gen_certs(dir.path(), &["node-1.example".to_owned()]).unwrap();
        let _ = driver.upgrade(&order("node-1", "127.0.0.1:1"));
        assert_eq!(driver.configs_built(), 1);
    }
}
