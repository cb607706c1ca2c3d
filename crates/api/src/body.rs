//! The HTTP body used by both ends: a whole buffer, or chunks from a channel (streams).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::{Body as HttpBody, Bytes, Frame, SizeHint};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use tokio::sync::mpsc;

#[derive(Debug)]
pub(crate) enum Body {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl Body {
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data = data.into();
        if data.is_empty() {
            Body::Full(None)
        } else {
            Body::Full(Some(data))
        }
    }
}

impl HttpBody for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Body::Stream(rx) => rx.poll_recv(cx).map(|c| c.map(|d| Ok(Frame::data(d)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Body::Stream(_) => SizeHint::default(),
        }
    }
}

/// The next data chunk of a body; `Ok(None)` at its end (trailers are skipped).
pub(crate) async fn next_chunk<B>(body: &mut B) -> Result<Option<Bytes>, B::Error>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    loop {
        match std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
            None => return Ok(None),
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// Why [`collect`] failed.
#[derive(Debug)]
pub(crate) enum CollectError<E> {
    TooLarge,
    Body(E),
}

/// The whole body, refusing more than `limit` bytes.
pub(crate) async fn collect<B>(
    body: &mut B,
    limit: usize,
) -> Result<Vec<u8>, CollectError<B::Error>>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    let mut buf = Vec::new();
    while let Some(chunk) = next_chunk(body).await.map_err(CollectError::Body)? {
        if buf.len() + chunk.len() > limit {
            return Err(CollectError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

pub(crate) fn response(
    status: StatusCode,
    content_type: &'static str,
    body: Body,
) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}
