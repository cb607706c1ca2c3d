//! How a call reaches etcd: as a task on the state's runtime that the calling thread waits
//! for, repeated with a backoff while the failure is the transient kind. (fleetlock-server's
//! `etcd_store` does the same; see the parent module documentation.)

use std::future::Future;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Error as EtcdError};

#[cfg(doc)]
use super::REQUEST_TIMEOUT;
use super::RETRY_BUDGET;

const FIRST_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Runs `future` as a task on `runtime` and blocks this thread until it is done; works from
/// any thread, even one inside another runtime's async context (it blocks that thread, but
/// does not panic). `None`: the task panicked or the runtime is shutting down.
pub(super) fn wait<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    future: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = tx.send(future.await);
    });
    rx.recv().ok()
}

/// Whether a failed call may succeed when repeated: nothing answered in time (refused, the
/// connection broke mid-call, or [`REQUEST_TIMEOUT`] passed: tonic reports those as a status
/// whose source is a transport or I/O error), or the member that answered has no leader at the
/// moment (etcd says `Unavailable`: "no leader", "leader changed", "request timed out"; its
/// election service passes the same errors on as `Unknown`, known by their text).
pub(super) fn transient(e: &EtcdError) -> bool {
    const UNAVAILABLE: [&str; 5] = [
        "etcdserver: no leader",
        "etcdserver: leader changed",
        "etcdserver: request timed out",
        "etcdserver: server stopped",
        "etcdserver: unhealthy cluster",
    ];
    match e {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => true,
        EtcdError::GRpcStatus(status) => {
            if status.code() == tonic::Code::Unavailable
                || UNAVAILABLE.iter().any(|m| status.message().starts_with(m))
            {
                return true;
            }
            let mut cause = std::error::Error::source(status);
            while let Some(c) = cause {
                if c.is::<tonic::transport::Error>() || c.is::<std::io::Error>() {
                    return true;
                }
                cause = c.source();
            }
            false
        }
        _ => false,
    }
}

/// The pauses between repeats of one call, within [`RETRY_BUDGET`] from its start.
pub(super) struct Backoff {
    start: Instant,
    next: Duration,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Backoff {
            start: Instant::now(),
            next: FIRST_BACKOFF,
        }
    }

    /// After a failure: pauses and answers `true` if the call is worth repeating (a transient
    /// error, budget left), else answers `false` at once.
    pub(super) async fn again(&mut self, e: &EtcdError) -> bool {
        if !transient(e) || self.start.elapsed() + self.next >= RETRY_BUDGET {
            return false;
        }
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        true
    }
}

pub(super) async fn retrying<T, F, Fut>(client: Client, mut call: F) -> Result<T, EtcdError>
where
    F: FnMut(Client) -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    let mut backoff = Backoff::new();
    loop {
        match call(client.clone()).await {
            Err(e) if backoff.again(&e).await => {}
            result => return result,
        }
    }
}
