//! What one client may hold of the server: timeouts, the size of a request head, connections
//! per client (and the 429 of one too many), and the quiet log for refusals that a flood would
//! otherwise repeat. The numbers
//! are the terms of the memory bound stated in `server.rs`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hyper::header::{HeaderValue, CONNECTION};
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::body::response;
use crate::body::Body;

/// The largest request head (request line and headers) hyper buffers: a 400 KB method is
/// refused by the parser (431) instead of being kept, logged and echoed. Also the largest
/// chunk of a body read at once.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// How long a client has to send a whole request head (also how long an idle keep-alive
/// connection is kept).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// A body that sends nothing for this long is cut; it is also the window over which
/// [`BODY_MIN_RATE`] is measured.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The slowest body the server waits for, in bytes per second averaged over each
/// [`BODY_TIMEOUT`]: a trickle of a byte every few seconds never trips the idle timeout, so
/// without a rate it would hold its connection forever. 8 KiB/s is far below any real link.
pub const BODY_MIN_RATE: u64 = 8 * 1024;
/// Connections one client certificate (maintenance mode: one peer address) may hold at once.
pub const CONNECTIONS_PER_CLIENT: usize = 8;
/// Connections the server holds at once, whoever holds them (TLS handshakes included).
pub const MAX_CONNECTIONS: usize = 64;
/// How long a connection over its client's limit gets to send the request its 429 answers.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The server's limits. [`Limits::default`] is what a node uses; tests shorten the timeouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// See [`HEADER_TIMEOUT`].
    pub header_timeout: Duration,
    /// See [`BODY_TIMEOUT`].
    pub body_timeout: Duration,
    /// See [`BODY_MIN_RATE`].
    pub body_min_rate: u64,
    /// See [`CONNECTIONS_PER_CLIENT`].
    pub connections_per_client: usize,
    /// See [`MAX_CONNECTIONS`]; at most half of them may be in their TLS handshake, so that
    /// clients without a certificate cannot take every place.
    pub max_connections: usize,
    /// Where uploads are kept (machined: its bundle directory). When set, an upload is
    /// refused (507) before a byte is read when its `Content-Length` exceeds the free space
    /// of that directory's file system, and cut when it grows past it.
    pub upload_dir: Option<PathBuf>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            body_min_rate: BODY_MIN_RATE,
            connections_per_client: CONNECTIONS_PER_CLIENT,
            max_connections: MAX_CONNECTIONS,
            upload_dir: None,
        }
    }
}

impl Limits {
    pub(crate) fn max_handshakes(&self) -> usize {
        (self.max_connections / 2).max(1)
    }
}

/// Who a connection's limit is counted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    /// SHA-256 of the verified end-entity certificate.
    Certificate([u8; 32]),
    /// Maintenance mode asks for no certificate: the peer address.
    Peer(IpAddr),
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientKey::Certificate(sha) => {
                write!(f, "certificate sha256 {}…", hex::encode(&sha[..8]))
            }
            ClientKey::Peer(ip) => write!(f, "address {ip}"),
        }
    }
}

/// Open connections per client. An entry lives while its client holds a connection, so the
/// map is never larger than the number of connections.
#[derive(Debug, Default)]
pub(crate) struct PerClient {
    open: Mutex<HashMap<ClientKey, usize>>,
}

impl PerClient {
    /// A place for one more connection of `key`, or `None` when it holds `limit` already.
    pub(crate) fn take(self: &Arc<Self>, key: ClientKey, limit: usize) -> Option<Place> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(key).or_insert(0);
        if *n >= limit {
            if *n == 0 {
                open.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(Place {
            owner: self.clone(),
            key,
        })
    }
}

/// One connection's place in [`PerClient`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Place {
    owner: Arc<PerClient>,
    key: ClientKey,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self
            .owner
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// At most one line per interval for an event a flood repeats (refused handshakes,
/// connections over a limit, unparseable requests); the next line says how many were not.
#[derive(Debug)]
pub(crate) struct Quiet {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Quiet {
    pub(crate) fn new(every: Duration) -> Self {
        Quiet {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(n)` when this occurrence should be logged, `n` the occurrences not logged since
    /// the last line; `None` when it should only be counted.
    pub(crate) fn note(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match state.0 {
            Some(last) if now.duration_since(last) < self.every => {
                state.1 += 1;
                None
            }
            _ => {
                let quiet = std::mem::take(&mut state.1);
                state.0 = Some(now);
                Some(quiet)
            }
        }
    }
}

/// " (N more since the last such line)" for a [`Quiet::note`], or nothing.
pub(crate) fn more(quiet: u64) -> String {
    if quiet == 0 {
        String::new()
    } else {
        format!(" ({quiet} more since the last such line)")
    }
}

/// Answers the request of a connection over its client's limit with 429 and closes it.
pub(crate) async fn refuse_over_limit<I>(io: TokioIo<I>, limits: &Limits)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let limit = limits.connections_per_client;
    let service = service_fn(move |_req| async move {
        let message = format!(
            "this client holds {limit} connections to the node already, the most it may: \
             close one and try again\n"
        );
        let mut r: Response<Body> = response(
            StatusCode::TOO_MANY_REQUESTS,
            "text/plain; charset=utf-8",
            Body::full(message),
        );
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        Ok::<_, Infallible>(r)
    });
    let conn = slate_https::http1(REFUSE_TIMEOUT.min(limits.header_timeout))
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(io, service);
    let _ = tokio::time::timeout(REFUSE_TIMEOUT, conn).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_counted_per_client_and_given_back() {
        let per = Arc::new(PerClient::default());
        let a = ClientKey::Certificate([1; 32]);
        let b = ClientKey::Peer(IpAddr::from([127, 0, 0, 1]));
        let held: Vec<_> = (0..3).map(|_| per.take(a, 3).unwrap()).collect();
        assert!(per.take(a, 3).is_none());
        let other = per.take(b, 3).unwrap();
        drop(held);
        assert!(per.take(a, 3).is_some());
        drop(other);
        assert!(
            per.open.lock().unwrap().is_empty(),
            "no entry outlives its connections"
        );
        assert!(per.take(a, 0).is_none());
        assert!(per.open.lock().unwrap().is_empty());
    }

    #[test]
    fn quiet_lines_count_what_they_left_out() {
        let quiet = Quiet::new(Duration::from_secs(3600));
        assert_eq!(quiet.note(), Some(0));
        assert_eq!(quiet.note(), None);
        assert_eq!(quiet.note(), None);
        let soon = Quiet::new(Duration::ZERO);
        assert_eq!(soon.note(), Some(0));
        assert_eq!(soon.note(), Some(0));
        assert_eq!(more(0), "");
        assert_eq!(more(2), " (2 more since the last such line)");
    }
}
