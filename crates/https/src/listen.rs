//! The accept loop: connections up to a limit, TLS handshakes up to a limit and within a
//! timeout, each connection handed to its server's [`Handler`] on a task of its own, and a
//! graceful shutdown. What a connection carries, and how refusals are logged, is the
//! handler's.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::conn::{Connection, Drain, Stream};

/// How long a client gets to complete the TLS handshake unless its server says otherwise.
/// Without a bound, a client that connects and sends nothing would hold a task and a socket for
/// as long as it likes (hyper's header timeout only starts once the handshake is done).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections get to finish after shutdown before they are cut.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long the loop waits after a failed accept (out of file descriptors and the like), so as
/// not to spin.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// How much of what a refused client had sent is read and dropped, and for how long.
const LINGER_BYTES: usize = 1 << 20;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// How a listener accepts: TLS or plain, and its limits.
#[derive(Clone)]
pub struct Accept {
    tls: Option<TlsAcceptor>,
    handshake_timeout: Duration,
    max_connections: usize,
    max_handshakes: usize,
    handshakes_outlive_shutdown: bool,
}

impl fmt::Debug for Accept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The acceptor holds the private key: never shown.
        f.debug_struct("Accept")
            .field("tls", &self.tls.is_some())
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_connections", &self.max_connections)
            .field("max_handshakes", &self.max_handshakes)
            .field(
                "handshakes_outlive_shutdown",
                &self.handshakes_outlive_shutdown,
            )
            .finish()
    }
}

impl Accept {
    /// TLS only (a plain-HTTP request fails its handshake), with no limit on connections and a
    /// shutdown that cuts handshakes in progress.
    pub fn tls(config: Arc<rustls::ServerConfig>, handshake_timeout: Duration) -> Self {
        Accept {
            tls: Some(TlsAcceptor::from(config)),
            handshake_timeout,
            ..Accept::plain()
        }
    }

    /// Plain TCP, no limit on connections.
    pub fn plain() -> Self {
        Accept {
            tls: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_connections: usize::MAX,
            max_handshakes: usize::MAX,
            handshakes_outlive_shutdown: false,
        }
    }

    /// At most `connections` at once, handshakes included (one more is closed as it is
    /// accepted), and at most `handshakes` of them in their TLS handshake.
    pub fn with_limits(self, connections: usize, handshakes: usize) -> Self {
        Accept {
            max_connections: connections,
            max_handshakes: handshakes,
            ..self
        }
    }

    /// A shutdown gives connections still in their handshake the same grace as the others,
    /// instead of cutting them at once.
    pub fn handshakes_outlive_shutdown(self) -> Self {
        Accept {
            handshakes_outlive_shutdown: true,
            ..self
        }
    }
}

/// A connection the listener did not hand over, or an accept that failed. Its text is the log
/// line's (after the server's own prefix), the peer first.
#[derive(Debug)]
pub enum Refusal<'a> {
    /// `accept(2)` failed; the loop goes on after a pause.
    Accept(&'a std::io::Error),
    /// Closed as accepted: the server holds its most connections.
    Full { peer: SocketAddr, max: usize },
    /// Closed before its handshake: the most handshakes are in progress.
    Handshakes { peer: SocketAddr, max: usize },
    /// The TLS handshake failed (the alert is sent).
    Handshake {
        peer: SocketAddr,
        error: &'a std::io::Error,
    },
    /// The TLS handshake took longer than the timeout.
    HandshakeTimedOut { peer: SocketAddr },
}

impl fmt::Display for Refusal<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Accept(e) => write!(f, "accept failed: {e}"),
            Refusal::Full { peer, max } => write!(
                f,
                "{peer}: refused a connection: the server holds {max} connections"
            ),
            Refusal::Handshakes { peer, max } => write!(
                f,
                "{peer}: refused a connection: {max} others are in their TLS handshake"
            ),
            Refusal::Handshake { peer, error } => {
                write!(f, "{peer}: TLS handshake refused: {error}")
            }
            Refusal::HandshakeTimedOut { peer } => write!(f, "{peer}: TLS handshake timed out"),
        }
    }
}

/// What a server does with what its listener accepts.
pub trait Handler: Send + Sync + 'static {
    /// Serves one connection past its handshake, until it ends or `drain` is raised (then
    /// the request in flight should finish, see [`crate::serve_http1`]).
    fn serve(self: Arc<Self>, conn: Connection, drain: Drain) -> impl Future<Output = ()> + Send;

    /// Told of each [`Refusal`], on the listener's task: log it, count it.
    fn refused(&self, refusal: Refusal<'_>);
}

/// Accepts on `listener` until `shutdown` resolves, then stops accepting, raises the drain and
/// gives open connections [`SHUTDOWN_GRACE`] before cutting them.
pub async fn run<H: Handler>(
    listener: TcpListener,
    accept: Accept,
    handler: Arc<H>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let max = accept.max_connections;
    let accept = Arc::new(Accepting {
        accept,
        handshaking: Arc::default(),
    });
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) if conns.len() >= max => {
                    // Closed at once: a connection held open here would be one more.
                    drop(tcp);
                    handler.refused(Refusal::Full { peer, max });
                }
                Ok((tcp, peer)) => {
                    let drain = Drain(drain_rx.clone());
                    conns.spawn(connection(tcp, peer, accept.clone(), handler.clone(), drain));
                }
                Err(e) => {
                    handler.refused(Refusal::Accept(&e));
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    drain_tx.send_replace(true);
    let drained = async { while conns.join_next().await.is_some() {} };
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, drained).await;
    conns.abort_all();
}

/// What every connection of one listener shares.
struct Accepting {
    accept: Accept,
    handshaking: Arc<AtomicUsize>,
}

/// One of the connections in their TLS handshake, counted while it lives.
struct Handshaking(Arc<AtomicUsize>);

impl Drop for Handshaking {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection<H: Handler>(
    tcp: TcpStream,
    peer: SocketAddr,
    accepting: Arc<Accepting>,
    handler: Arc<H>,
    mut drain: Drain,
) {
    let accept = &accepting.accept;
    let Some(acceptor) = &accept.tls else {
        let _ = tcp.set_nodelay(true);
        let conn = Connection {
            stream: Stream::Plain(tcp),
            peer,
        };
        return handler.serve(conn, drain).await;
    };
    let handshaking = Handshaking(accepting.handshaking.clone());
    if handshaking.0.fetch_add(1, Ordering::Relaxed) >= accept.max_handshakes {
        let max = accept.max_handshakes;
        handler.refused(Refusal::Handshakes { peer, max });
        return;
    }
    let _ = tcp.set_nodelay(true);
    let handshake = tokio::time::timeout(accept.handshake_timeout, async {
        // A connection closed before its first byte offered no handshake, so none was
        // refused: it is a TCP probe — a node's own `tcp` health check of its API on every
        // boot, a load balancer's check, a port scan — and is closed without a line (issue
        // 44). Anything that sends a byte is judged, and logged, as before.
        let mut first = [0u8; 1];
        if matches!(tcp.peek(&mut first).await, Ok(0)) {
            return None;
        }
        Some(acceptor.accept(tcp).into_fallible().await)
    });
    let done = if accept.handshakes_outlive_shutdown {
        handshake.await
    } else {
        // A handshake has no request to finish.
        tokio::select! {
            done = handshake => done,
            () = drain.wait() => return,
        }
    };
    let stream = match done {
        Ok(None) => return,
        Ok(Some(Ok(stream))) => stream,
        Ok(Some(Err((error, tcp)))) => {
            handler.refused(Refusal::Handshake {
                peer,
                error: &error,
            });
            linger(tcp).await;
            return;
        }
        // Dropping the socket closes it (a FIN): a client this slow or silent gets no alert.
        Err(_) => {
            handler.refused(Refusal::HandshakeTimedOut { peer });
            return;
        }
    };
    drop(handshaking);
    let conn = Connection {
        stream: Stream::Tls(Box::new(stream)),
        peer,
    };
    handler.serve(conn, drain).await;
}

/// After a refused handshake (the alert is already sent): close our side and read what the
/// client had already sent, so that the kernel does not answer unread data with a reset that
/// could destroy the alert before the client reads it.
async fn linger(mut tcp: TcpStream) {
    let _ = tcp.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        while let Ok(n @ 1..) = tcp.read(&mut buf).await {
            total += n;
            if total > LINGER_BYTES {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Holds each connection until the drain, and keeps what it was told.
    #[derive(Default)]
    struct Recorder {
        served: AtomicUsize,
        refused: Mutex<Vec<String>>,
    }

    impl Handler for Recorder {
        async fn serve(self: Arc<Self>, _conn: Connection, mut drain: Drain) {
            self.served.fetch_add(1, Ordering::Relaxed);
            drain.wait().await;
        }

        fn refused(&self, refusal: Refusal<'_>) {
            self.refused.lock().unwrap().push(refusal.to_string());
        }
    }

    #[test]
    fn refusals_read_as_the_log_lines_tests_and_vm_scenarios_look_for() {
        let peer: SocketAddr = "192.0.2.1:4000".parse().unwrap();
        let error = std::io::Error::other("peer sent no certificates");
        let lines = [
            Refusal::Accept(&error),
            Refusal::Full { peer, max: 64 },
            Refusal::Handshakes { peer, max: 32 },
            Refusal::Handshake {
                peer,
                error: &error,
            },
            Refusal::HandshakeTimedOut { peer },
        ]
        .map(|r| r.to_string());
        assert_eq!(
            lines,
            [
                "accept failed: peer sent no certificates",
                "192.0.2.1:4000: refused a connection: the server holds 64 connections",
                "192.0.2.1:4000: refused a connection: 32 others are in their TLS handshake",
                "192.0.2.1:4000: TLS handshake refused: peer sent no certificates",
                "192.0.2.1:4000: TLS handshake timed out",
            ]
        );
    }

    #[tokio::test]
    async fn a_connection_over_the_limit_is_closed_and_shutdown_drains_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let recorder = Arc::new(Recorder::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(run(
            listener,
            Accept::plain().with_limits(1, 1),
            recorder.clone(),
            async move {
                let _ = stopped.await;
            },
        ));

        let _held = TcpStream::connect(addr).await.unwrap();
        while recorder.served.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut over = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), over.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        let refused = recorder.refused.lock().unwrap().clone();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].ends_with("refused a connection: the server holds 1 connections"),
            "{refused:?}"
        );

        // The held connection returns at the drain, well within the grace period.
        let start = std::time::Instant::now();
        stop.send(()).unwrap();
        server.await.unwrap();
        assert!(start.elapsed() < SHUTDOWN_GRACE, "{:?}", start.elapsed());
        assert_eq!(recorder.served.load(Ordering::Relaxed), 1);
    }
}
