//! One accepted connection as its server gets it: the stream (TLS, or plain for a listener
//! without TLS), the peer, the drain signal of a shutdown, and HTTP/1.1 served on it until the
//! client is done or the drain lets the request in flight finish.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::server::conn::http1;
use hyper::service::HttpService;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;

/// A connection past its handshake.
#[derive(Debug)]
pub struct Connection {
    pub stream: Stream,
    pub peer: SocketAddr,
}

/// The bytes of a connection: inside TLS, or plain on a listener without TLS.
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    // Boxed: a TLS session is a kilobyte of state next to a socket's few words.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// The chain the client presented (end-entity first), which the handshake verified; `None`
    /// on a plain stream or when none was asked for.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        match self {
            Stream::Plain(_) => None,
            Stream::Tls(tls) => tls.get_ref().1.peer_certificates(),
        }
    }

    /// Whether the TLS handshake resumed an earlier session (no certificate was sent or
    /// signed); `false` on a plain stream.
    pub fn resumed(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(tls) => {
                tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed)
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(tcp) => tcp.is_write_vectored(),
            Stream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Raised when the server shuts down: a connection lets its request in flight finish, then
/// closes. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Drain(pub(crate) watch::Receiver<bool>);

impl Drain {
    /// Resolves once the server is shutting down.
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|d| *d).await;
    }
}

/// hyper's HTTP/1.1 server on tokio's timer, with `header_timeout` for each request head (and
/// for an idle keep-alive connection).
pub fn http1(header_timeout: Duration) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
}

/// Serves `service` on `stream` with `builder` until the client closes, a timeout, or `drain`:
/// then the request in flight finishes and the connection closes.
pub async fn serve_http1<S, B>(
    builder: &http1::Builder,
    stream: Stream,
    service: S,
    drain: &mut Drain,
) -> Result<(), hyper::Error>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let conn = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => return result,
        () = drain.wait() => {}
    }
    conn.as_mut().graceful_shutdown();
    conn.await
}
