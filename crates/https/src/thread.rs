//! A listener for a non-async program: the socket bound before anything runs (so that an
//! address in use is an error at once), and the accept loop on a thread of its own with a
//! current-thread runtime.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::runtime::Runtime;

use crate::listen::{run, Accept, Handler};

/// How long a stopped runtime waits for its blocking tasks before it is dropped anyway.
const RUNTIME_STOP: Duration = Duration::from_millis(100);

/// Why a listener's thread did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The runtime or the thread could not be made.
    #[error("{0}")]
    Runtime(std::io::Error),
    /// The bound socket could not join the runtime.
    #[error("{0}")]
    Listen(std::io::Error),
}

/// A bound, non-blocking listening socket; nothing is served yet.
#[derive(Debug)]
pub struct Bound {
    listener: std::net::TcpListener,
    local_addr: SocketAddr,
}

impl Bound {
    /// Binds `addr` (port 0: any free port; see [`Bound::local_addr`]).
    pub fn bind(addr: SocketAddr) -> std::io::Result<Bound> {
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let local_addr = listener.local_addr()?;
        Ok(Bound {
            listener,
            local_addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The socket on `rt`'s reactor.
    pub fn listen(self, rt: &Runtime) -> std::io::Result<TcpListener> {
        let _guard = rt.enter();
        TcpListener::from_std(self.listener)
    }

    /// Serves on a new thread named `name` until `shutdown` resolves, then lets the runtime
    /// stop (see [`runtime`] for its worker threads' name).
    pub fn spawn<H: Handler>(
        self,
        name: &str,
        accept: Accept,
        handler: Arc<H>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<std::thread::JoinHandle<()>, StartError> {
        let rt = runtime(name).map_err(StartError::Runtime)?;
        let listener = self.listen(&rt).map_err(StartError::Listen)?;
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                rt.block_on(run(listener, accept, handler, shutdown));
                stop(rt);
            })
            .map_err(StartError::Runtime)
    }
}

/// A current-thread runtime with I/O and time, whose blocking threads are `<name>-worker`.
pub fn runtime(name: &str) -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name(format!("{name}-worker"))
        .build()
}

/// Stops a runtime whose server has returned, waiting a little for its blocking tasks.
pub fn stop(rt: Runtime) {
    rt.shutdown_timeout(RUNTIME_STOP);
}
