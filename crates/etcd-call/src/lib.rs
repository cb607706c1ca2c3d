//! How slate reaches etcd, once for both of its etcd users: fleetlock-server's etcd store
//! (FleetLock semaphores, `crates/fleetlock-server/src/etcd_store.rs`) and the rollout
//! operator's state and leader election (`crates/operator/src/etcd.rs`). Two users, one set of
//! rules: the same timeouts, the same endpoint checks, the same judgement of which failures are
//! worth repeating and the same backoff within the same budget, so that a cluster losing a
//! member or its leader looks the same to both. What a call *does* (keys, transactions, what a
//! repeat of it means) stays with each user, with its own error type.
//!
//! # Calls
//!
//! Both users' APIs are synchronous and etcd's client is async: each owns a small
//! [`CallRuntime`], and every call runs as a task there while the calling thread waits on a
//! channel ([`CallRuntime::wait`]). That is correct from any thread (tokio's blocking pool, a
//! CLI's main, a thread inside another runtime's async context) and never nests one runtime's
//! `block_on` in another's. Dropping a [`CallRuntime`] does not wait for its workers
//! (`shutdown_background`): the last reference may go away inside an async context, where
//! dropping a runtime would wait on them and panic, and nothing in flight is worth waiting for
//! (every call's caller waits for its own answer).
//!
//! # Failover
//!
//! The client balances over every endpoint given ([`connect_options`]). A call that fails
//! because a member is unreachable, between leaders or too slow ([`transient`]) is repeated,
//! after a pause doubling from [`FIRST_BACKOFF`] to at most [`MAX_BACKOFF`] ([`Backoff`]),
//! within [`RETRY_BUDGET`] ([`retrying`], [`CallRuntime::call`]); each attempt is bounded by
//! [`CONNECT_TIMEOUT`] and [`REQUEST_TIMEOUT`]. Whether a repeat is safe is the caller's to
//! know: both users' writes are compare-and-swap transactions, whose repeat fails its compare
//! if the first attempt committed, and their module documentation says what they answer then.
//!
//! Plain `http://` endpoints only: etcd-client is built without TLS, and [`check_endpoints`]
//! refuses the rest before anything is sent.

use std::future::Future;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Error as EtcdError};

/// Connecting to one member: an unreachable member's address fails over to another instead of
/// hanging.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One request to one member (a call that waits server-side, such as an election campaign,
/// excepted: [`waiting_options`]). Short enough to be repeated within [`RETRY_BUDGET`]: a write
/// that a follower forwarded to a leader that then died waits for etcd's own timeout (5 s and
/// more) before it fails, while the repeat goes to the new leader (elected within about a
/// second). A healthy cluster answers in milliseconds.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one call keeps repeating a request that found no member or no leader, or timed
/// out.
pub const RETRY_BUDGET: Duration = Duration::from_secs(5);
/// The pause before the first repeat; it doubles with every further one.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// The longest pause between two repeats.
pub const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Endpoints refused before anything is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("no endpoints given")]
    Missing,
    /// `endpoint` is one of `endpoints` (all of them, comma-separated).
    #[error("{endpoint}: TLS to etcd is not implemented yet; use http:// endpoints")]
    Tls { endpoints: String, endpoint: String },
}

impl EndpointError {
    /// What was being done, for the context of a message: `connecting to etcd`, with the
    /// endpoints when there are any.
    pub fn what(&self) -> String {
        match self {
            EndpointError::Missing => "connecting to etcd".into(),
            EndpointError::Tls { endpoints, .. } => format!("connecting to etcd at {endpoints}"),
        }
    }
}

/// Refuses an empty list and `https://` endpoints (no TLS yet).
pub fn check_endpoints(endpoints: &[String]) -> Result<(), EndpointError> {
    if endpoints.is_empty() {
        return Err(EndpointError::Missing);
    }
    match endpoints.iter().find(|e| e.starts_with("https://")) {
        Some(https) => Err(EndpointError::Tls {
            endpoints: endpoints.join(","),
            endpoint: https.clone(),
        }),
        None => Ok(()),
    }
}

/// The options of a client for ordinary requests: [`waiting_options`] with every request
/// bounded by [`REQUEST_TIMEOUT`].
pub fn connect_options() -> ConnectOptions {
    waiting_options().with_timeout(REQUEST_TIMEOUT)
}

/// The options of a client whose requests may wait server-side for as long as they need (an
/// election campaign): [`CONNECT_TIMEOUT`], and no request timeout. Both kinds require a
/// leader: a member cut off from the leader answers at once instead of waiting for one.
pub fn waiting_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_require_leader(true)
}

/// Why [`CallRuntime::call`] has no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// etcd's last answer, or the transport's failure: not [`transient`], or the
    /// [`RETRY_BUDGET`] was spent.
    #[error(transparent)]
    Etcd(EtcdError),
    /// The task never answered: it panicked (a bug in the client) or the runtime is shutting
    /// down.
    #[error("the etcd call was abandoned")]
    Abandoned,
}

/// A small tokio runtime of its own that synchronous callers run their etcd calls on (see the
/// crate documentation). Dropped without waiting for its workers.
#[derive(Debug)]
pub struct CallRuntime {
    /// `Some` until dropped; see `Drop`.
    runtime: Option<tokio::runtime::Runtime>,
}

impl CallRuntime {
    /// A runtime whose threads are named `thread_name`. Two workers: the gRPC traffic needs
    /// one; the second keeps a slow call (a long poll, a keep-alive, a large listing) from
    /// stalling the others.
    pub fn new(thread_name: &str) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(thread_name)
            .enable_all()
            .build()?;
        Ok(CallRuntime {
            runtime: Some(runtime),
        })
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .expect("the runtime is only taken when dropped")
    }

    /// Runs `future` as a task on the runtime and blocks this thread until it is done. Unlike
    /// `Runtime::block_on` this works from any thread, even one inside another runtime's async
    /// context (it then blocks that thread, but does not panic). `None`: the task panicked or
    /// the runtime is shutting down.
    pub fn wait<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.runtime().spawn(async move {
            let _ = tx.send(future.await);
        });
        rx.recv().ok()
    }

    /// Runs `call` with `client` on the runtime, repeated per [`retrying`], and waits for it.
    pub fn call<T, F, Fut>(&self, client: &Client, call: F) -> Result<T, CallError>
    where
        T: Send + 'static,
        F: FnMut(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, EtcdError>> + Send + 'static,
    {
        match self.wait(retrying(client.clone(), call)) {
            Some(answer) => answer.map_err(CallError::Etcd),
            None => Err(CallError::Abandoned),
        }
    }

    /// Spawns `future` on the runtime (a background task: a keep-alive, a campaign that the
    /// caller polls).
    pub fn spawn<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> tokio::task::JoinHandle<T> {
        self.runtime().spawn(future)
    }
}

impl Drop for CallRuntime {
    fn drop(&mut self) {
        // Possibly inside an async context, where dropping a runtime would wait on its workers
        // and panic. Nothing in flight is worth waiting for.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Whether a failed call may succeed when repeated: nothing answered in time (refused, the
/// connection broke mid-call, or [`REQUEST_TIMEOUT`] passed: tonic reports those as a status
/// whose source is a transport or I/O error), or the member that answered has no leader at the
/// moment (etcd says `Unavailable`: "no leader", "leader changed", "request timed out"; its
/// election service passes the same errors on as `Unknown`, known by their text).
pub fn transient(e: &EtcdError) -> bool {
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
#[derive(Debug)]
pub struct Backoff {
    start: Instant,
    next: Duration,
}

impl Backoff {
    /// The budget starts now.
    pub fn new() -> Self {
        Backoff {
            start: Instant::now(),
            next: FIRST_BACKOFF,
        }
    }

    /// After a failure: pauses and answers `true` if the call is worth repeating (a
    /// [`transient`] error, and budget left after the pause), else answers `false` at once.
    pub async fn again(&mut self, e: &EtcdError) -> bool {
        if !transient(e) || self.start.elapsed() + self.next >= RETRY_BUDGET {
            return false;
        }
        tokio::time::sleep(self.next).await;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        true
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// Calls `call` with a clone of `client` until it succeeds, fails for good, or fails
/// transiently with the budget spent (per [`Backoff`]); answers the last answer.
pub async fn retrying<T, F, Fut>(client: Client, mut call: F) -> Result<T, EtcdError>
where
    F: FnMut(Client) -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    let mut backoff = Backoff::new();
    loop {
        match call(client.clone()).await {
            Err(e) if backoff.again(&e).await => {}
            answer => return answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn bad_endpoints_are_refused() {
        let err = check_endpoints(&[]).unwrap_err();
        assert_eq!(
            format!("{}: {err}", err.what()),
            "connecting to etcd: no endpoints given"
        );
        let eps = ["http://a:2379".to_owned(), "https://b:2379".to_owned()];
        let err = check_endpoints(&eps).unwrap_err();
        assert_eq!(
            format!("{}: {err}", err.what()),
            "connecting to etcd at http://a:2379,https://b:2379: https://b:2379: TLS to etcd is \
             not implemented yet; use http:// endpoints"
        );
        assert_eq!(check_endpoints(&eps[..1]), Ok(()));
    }

    #[test]
    fn transient_errors() {
        let status = |code, message: &str| EtcdError::GRpcStatus(tonic::Status::new(code, message));
        for e in [
            EtcdError::IoError(std::io::Error::other("reset")),
            status(tonic::Code::Unavailable, "etcdserver: no leader"),
            status(tonic::Code::Unknown, "etcdserver: leader changed"),
            status(tonic::Code::Unknown, "etcdserver: request timed out"),
            status(tonic::Code::Unknown, "etcdserver: server stopped"),
            status(tonic::Code::Unknown, "etcdserver: unhealthy cluster"),
            // A call that timed out or broke: the I/O error is the status' source.
            EtcdError::GRpcStatus(tonic::Status::from_error(Box::new(std::io::Error::other(
                "broken pipe",
            )))),
        ] {
            assert!(transient(&e), "{e}");
        }
        for e in [
            status(
                tonic::Code::Unknown,
                "etcdserver: requested lease not found",
            ),
            status(
                tonic::Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            status(
                tonic::Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            EtcdError::InvalidArgs("no".into()),
        ] {
            assert!(!transient(&e), "{e}");
        }
    }

    /// `retrying` repeats transient failures only, with growing pauses; the client is never
    /// used (a lazy one to a closed port).
    #[test]
    fn only_transient_failures_are_repeated() {
        let runtime = CallRuntime::new("test-etcd-call").unwrap();
        let client = runtime
            .wait(Client::connect([closed_port()], Some(connect_options())))
            .unwrap()
            .unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = |fail_times: usize, failure: fn() -> EtcdError| {
            let calls = calls.clone();
            calls.store(0, Ordering::SeqCst);
            move |_client| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < fail_times {
                        Err(failure())
                    } else {
                        Ok(n)
                    }
                }
            }
        };
        let unavailable =
            || EtcdError::GRpcStatus(tonic::Status::unavailable("etcdserver: no leader"));
        let start = Instant::now();
        assert_eq!(runtime.call(&client, counted(3, unavailable)).unwrap(), 3);
        let took = start.elapsed();
        // 20 + 40 + 80 ms.
        assert!(took >= FIRST_BACKOFF * 7, "{took:?}");

        let refused = || EtcdError::InvalidArgs("refused".into());
        let err = runtime.call(&client, counted(3, refused)).unwrap_err();
        assert!(
            matches!(err, CallError::Etcd(EtcdError::InvalidArgs(_))),
            "{err}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1, "repeated");
    }

    /// A cluster that is down: the call is repeated until the budget is spent, and answers the
    /// transport's failure. The runtime is made, used and dropped inside another runtime's
    /// async context (where `Runtime::block_on` or dropping a runtime would panic).
    #[test]
    fn a_dead_cluster_is_repeated_within_the_budget() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (err, took) = outer.block_on(async {
            let runtime = CallRuntime::new("test-etcd-call").unwrap();
            let client = runtime
                .wait(Client::connect([closed_port()], Some(connect_options())))
                .unwrap()
                .unwrap();
            let start = Instant::now();
            let get = |mut client: Client| async move { client.get("k", None).await };
            let err = runtime.call(&client, get).unwrap_err();
            (err, start.elapsed())
        });
        let CallError::Etcd(e) = &err else {
            panic!("{err}")
        };
        assert!(transient(e), "{e}");
        assert!(took >= FIRST_BACKOFF * 3, "{took:?}: not repeated");
        assert!(took < RETRY_BUDGET + REQUEST_TIMEOUT, "{took:?}");
    }

    /// `http://127.0.0.1:<port>` of a port nobody listens on: bound, then closed.
    fn closed_port() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("http://127.0.0.1:{port}")
    }
}
