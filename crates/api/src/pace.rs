//! Reading a request body against the clock. hyper bounds the time to send a request head, not
//! a body: a client that declares a gigabyte and sends a byte every five seconds held its
//! connection (and the request's task) forever (issue 19). [`Paced`] cuts a body that sends
//! nothing for `body_timeout`, and one slower than `body_min_rate` over each `body_timeout` of
//! waiting. Only the time spent waiting for the client counts: while the server itself holds
//! the body back (an upload waiting for the disk) the clock stands still.

use std::time::Duration;

use hyper::body::{Body as _, Bytes, Incoming};
use tokio::time::Instant;

use crate::body::next_chunk;
use crate::limits::Limits;

/// Why a body was not read to its end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the request body stalled: nothing arrived for {} s", .0.as_secs_f64())]
    Stalled(Duration),
    #[error(
        "the request body is too slow: {got} bytes in {} s, the node requires {min_rate} bytes/s",
        .window.as_secs_f64()
    )]
    TooSlow {
        got: u64,
        window: Duration,
        min_rate: u64,
    },
    #[error("cannot read the request body: {0}")]
    Broken(#[from] hyper::Error),
}

impl BodyError {
    /// The client was too slow (408), rather than the body broken (400).
    pub(crate) fn is_timeout(&self) -> bool {
        !matches!(self, BodyError::Broken(_))
    }
}

/// A request body read with the server's body timeouts.
pub(crate) struct Paced {
    body: Incoming,
    timeout: Duration,
    min_rate: u64,
    /// Time spent waiting for the client in the current window, and bytes it brought.
    waited: Duration,
    bytes: u64,
    /// Everything read so far.
    pub(crate) total: u64,
}

impl Paced {
    pub(crate) fn new(body: Incoming, limits: &Limits) -> Self {
        Paced {
            body,
            // A zero timeout would cut every body before its first byte.
            timeout: limits.body_timeout.max(Duration::from_millis(1)),
            min_rate: limits.body_min_rate,
            waited: Duration::ZERO,
            bytes: 0,
            total: 0,
        }
    }

    /// The length the client declared (`Content-Length`), if it did.
    pub(crate) fn declared(&self) -> Option<u64> {
        self.body.size_hint().exact()
    }

    /// The next chunk; `Ok(None)` at the end of the body.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>, BodyError> {
        let call = Instant::now();
        loop {
            let idle_left = self.timeout.saturating_sub(call.elapsed());
            let window_left = self.timeout.saturating_sub(self.waited);
            let started = Instant::now();
            let got =
                tokio::time::timeout(idle_left.min(window_left), next_chunk(&mut self.body)).await;
            self.waited += started.elapsed();
            match got {
                Ok(Ok(Some(chunk))) => {
                    self.bytes += chunk.len() as u64;
                    self.total += chunk.len() as u64;
                    self.check_window()?;
                    return Ok(Some(chunk));
                }
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(e)) => return Err(BodyError::Broken(e)),
                Err(_) if call.elapsed() >= self.timeout => {
                    return Err(BodyError::Stalled(self.timeout))
                }
                Err(_) => self.check_window()?,
            }
        }
    }

    /// At the end of a window of waiting: enough bytes came, and a new window starts; or not.
    fn check_window(&mut self) -> Result<(), BodyError> {
        if self.waited < self.timeout {
            return Ok(());
        }
        let need = u128::from(self.min_rate) * self.waited.as_millis() / 1000;
        if u128::from(self.bytes) < need {
            return Err(BodyError::TooSlow {
                got: self.bytes,
                window: self.waited,
                min_rate: self.min_rate,
            });
        }
        self.waited = Duration::ZERO;
        self.bytes = 0;
        Ok(())
    }
}
