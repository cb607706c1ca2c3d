//! Each node's API listener: a real `slate_api::serve` on its own `127.0.0.1:PORT`, stopped
//! and started again around a simulated reboot.
//!
//! Ports. `serve` takes an address, not a listener, so the port is chosen first. Asking the
//! kernel (`bind` to port 0) gets slow as thousands of ports are taken — it searches the
//! ephemeral range for a free one on every call (10,000 nodes took ~10 s, nearly all of it in
//! the kernel's bind-conflict checks) — and competes with every other program's outgoing
//! connections. So ports come from a process-wide cursor over 10000..32767, below Linux's
//! default ephemeral range (32768..60999), starting at a per-process random offset; a port in
//! use is simply skipped. To skip it rather than publish a dead endpoint, the server's future
//! is polled once before it is handed to the runtime: `serve` checks the certificates and
//! binds synchronously in its first poll, so it is then either finished with `Bind` (try the
//! next port) or pending in its accept loop (listening).
//!
//! Reboots. A rebooting node keeps its port with a socket that is bound but not listening:
//! clients get *connection refused*, exactly as from a machine that is down, and the port is
//! not handed out meanwhile, so the node comes back where the operator knows it (see
//! `placeholder` for the one way a stranger could still take it).

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};
use slate_api::NodeBackend;
use tokio::sync::oneshot;

use crate::shared::Shared;

/// What a listener needs of the node it serves, besides its API.
pub(crate) trait Served: NodeBackend + 'static {
    fn shared(&self) -> &Arc<Shared>;
    fn id(&self) -> &str;
    /// Keeps the sender that stops the listener just started.
    fn set_api_stop(&self, stop: oneshot::Sender<()>);
}

const FIRST_PORT: u32 = 10_000;
const END_PORT: u32 = 32_768;
/// A rebooted node tries its old port this often (the placeholder is dropped just before, so
/// this only matters if a stranger grabbed it in between) before it moves to a new one.
const SAME_PORT_TRIES: u32 = 20;
const RETRY_DELAY: Duration = Duration::from_millis(20);

/// The next candidate port: the cursor goes round the range once per full pass.
fn next_port() -> u16 {
    static CURSOR: OnceLock<AtomicU32> = OnceLock::new();
    let cursor = CURSOR.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let offset =
            (std::process::id().wrapping_mul(2_654_435_761) ^ nanos) % (END_PORT - FIRST_PORT);
        AtomicU32::new(offset)
    });
    let n = cursor.fetch_add(1, Ordering::Relaxed) % (END_PORT - FIRST_PORT);
    u16::try_from(FIRST_PORT + n).unwrap_or(u16::MAX)
}

/// Starts `node`'s API, on `port` when given (after a reboot: the operator knows the node
/// there) and else on the next free port of the range; answers the address it listens on.
pub(crate) async fn start_api<N: Served>(
    node: &Arc<N>,
    port: Option<u16>,
) -> Result<SocketAddr, String> {
    let mut last_error = String::from("no free port");
    if let Some(port) = port {
        for _ in 0..SAME_PORT_TRIES {
            match bind(node, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await {
                Ok(addr) => return Ok(addr),
                Err(e) => last_error = e,
            }
            if node.shared().is_shutting_down() {
                return Err(last_error);
            }
            tokio::time::sleep(RETRY_DELAY).await;
        }
    }
    for _ in FIRST_PORT..END_PORT {
        match bind(node, SocketAddr::from((Ipv4Addr::LOCALHOST, next_port()))).await {
            Ok(addr) => return Ok(addr),
            Err(e) => last_error = e,
        }
        if node.shared().is_shutting_down() {
            break;
        }
    }
    Err(last_error)
}

async fn bind<N: Served>(node: &Arc<N>, addr: SocketAddr) -> Result<SocketAddr, String> {
    let shared = node.shared();
    let mut config = shared.server.clone();
    config.listen = addr;
    let identity = shared
        .identities
        .node(node.id())
        .map_err(|e| format!("issuing its certificate: {e}"))?;
    config.cert_pem = identity.serving.clone().into_bytes();
    config.key_pem = identity.key.clone().into_bytes();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let fleet_down = shared.shutdown.clone();
    let stop = async move {
        tokio::select! {
            _ = stop_rx => {}
            () = fleet_down.wait() => {}
        }
    };
    let backend: Arc<dyn NodeBackend> = node.clone();
    let mut server = Box::pin(slate_api::serve(config, backend, stop));
    match std::future::poll_fn(|cx| Poll::Ready(server.as_mut().poll(cx))).await {
        Poll::Ready(Err(e)) => Err(e.to_string()),
        Poll::Ready(Ok(())) => Err("the fleet is shutting down".into()),
        Poll::Pending => {
            node.set_api_stop(stop_tx);
            let id = node.id().to_owned();
            let shared = shared.clone();
            tokio::spawn(async move {
                if let Err(e) = server.await {
                    shared.api_error(format!("{id}: API server failed: {e}"));
                }
            });
            Ok(addr)
        }
    }
}

/// A bound, never listening TCP socket on `addr`: holds the port of a node that is down.
/// Retries for a while because the stopped server drops its listener on its own task.
pub(crate) async fn hold_port(addr: SocketAddr) -> Result<OwnedFd, String> {
    let SocketAddr::V4(v4) = addr else {
        return Err(format!("{addr}: not IPv4"));
    };
    let mut last = String::new();
    for _ in 0..100 {
        match placeholder(v4) {
            Ok(fd) => return Ok(fd),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("cannot hold {addr}: {last}"))
}

fn placeholder(addr: SocketAddrV4) -> nix::Result<OwnedFd> {
    // Without SO_REUSEADDR first: only that keeps a stranger's listener (tokio and std set it)
    // off the port. The old server's closed connections usually linger in TIME_WAIT on the
    // port, though, and then only SO_REUSEADDR binds; such a placeholder still refuses
    // connections, but a listener binding this exact port with SO_REUSEADDR (another program,
    // or this process once its port cursor has gone round the range) could take it; the node
    // then comes back on a new port and says so in its heartbeat.
    placeholder_with(addr, false).or_else(|_| placeholder_with(addr, true))
}

fn placeholder_with(addr: SocketAddrV4, reuse: bool) -> nix::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    if reuse {
        socket::setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    }
    socket::bind(fd.as_raw_fd(), &SockaddrIn::from(addr))?;
    Ok(fd)
}
