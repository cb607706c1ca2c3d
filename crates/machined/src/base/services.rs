//! What the rest of machined asks of the node's services — the API, the health checks, the
//! sequences that drain the node — without knowing how they run: the boot layer's supervisor
//! (`boot::services`) implements [`Workload`] and is set on the node once it starts.

use slate_api::{NodeServiceStatus, ServiceAction};
use slate_services::ServiceSpec;

pub trait Workload: Send + Sync + std::fmt::Debug {
    /// Every service, in start order.
    fn list(&self) -> Vec<NodeServiceStatus>;
    /// Starts, stops or restarts one service; answers its state once the action is done (a
    /// stop within its grace period, a start once its program runs).
    fn control(&self, name: &str, action: ServiceAction) -> Result<NodeServiceStatus, String>;
    /// Whether the service is ready; `None`: no such service.
    fn is_ready(&self, name: &str) -> Option<bool>;
    /// Stops every service, in reverse start order, each within its grace period; `why` is
    /// logged with each. Services stay stopped until [`Workload::start_all`].
    fn stop_all(&self, why: &str);
    /// Starts again what [`Workload::stop_all`] stopped (an upgrade that failed after its
    /// drain leaves the node running as it was).
    fn start_all(&self);
    /// Makes `services` (checked, in start order) the node's set while it runs: a service
    /// removed or changed is stopped, a new or changed one started, the others left as they
    /// are. Answers what changed, for the journal and the API.
    fn replace(&self, services: Vec<ServiceSpec>) -> String;
}
