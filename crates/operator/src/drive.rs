//! Driving a node: the upgrade order goes to the node's own API (`POST /v1/upgrade`) with the
//! operator's client certificate, as `slate upgrade` would send it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use slate_api::{Client, ClientError, Role, UpgradeRequest};
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
}

/// Sends orders through the node API with `operator.crt`/`operator.key` and `ca.crt` from a
/// certificate directory (as `slate gen certs` writes it).
#[derive(Debug, Clone)]
pub struct ApiDriver {
    certs: PathBuf,
}

impl ApiDriver {
    pub fn new(certs: &Path) -> Self {
        ApiDriver {
            certs: certs.to_owned(),
        }
    }
}

impl NodeDriver for ApiDriver {
    fn upgrade(&self, order: &Order) -> Result<(), DriveError> {
        // The node's certificate must name the node ordered, whatever address it advertised:
        // a node cannot send the operator's orders for another node to itself.
        let client = Client::from_dir(&order.endpoint, &self.certs, Role::Operator)
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
}
