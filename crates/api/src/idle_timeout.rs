//! A bound on how long a kept-alive connection may sit idle between an answer and the next
//! request (`http.idle_timeout_ms`), shorter than the bound on reading a request's headers.
//!
//! hyper starts its `header_read_timeout` for the next request as soon as an answer is queued, so
//! without this an idle connection is kept as long as a slow client may take to send its headers:
//! one host could hold its share of connections idle for that long at no cost. [`IdleTimeout`]
//! wraps the accepted stream: once a write has made progress (an answer going out), the
//! connection is idle until the client sends a byte again; a read that is still waiting for that
//! byte when the bound has passed fails with `TimedOut`, and hyper drops the connection. Any byte
//! read disarms it, so a request whose headers trickle in is bounded by `header_read_timeout`
//! alone, and a request in progress (read, not yet answered) is never idle. A new connection is
//! not idle before its first answer: `header_read_timeout` bounds its first request.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::{Sleep, Timer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose reads fail once the connection has been idle for longer than `timeout` after
/// an answer.
pub struct IdleTimeout<S, T> {
    inner: S,
    timeout: Duration,
    timer: T,
    /// Kept across idle spells and reset, not allocated anew for each.
    deadline: Option<Pin<Box<dyn Sleep>>>,
    /// Whether `deadline` counts: something was written since the last byte read.
    idle: bool,
}

impl<S, T> IdleTimeout<S, T> {
    /// Wraps `inner`; `timer` tells the time and makes the deadline.
    pub fn new(inner: S, timeout: Duration, timer: T) -> Self {
        Self { inner, timeout, timer, deadline: None, idle: false }
    }
}

impl<S: std::fmt::Debug, T> std::fmt::Debug for IdleTimeout<S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdleTimeout")
            .field("inner", &self.inner)
            .field("timeout", &self.timeout)
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl<S, T: Timer> IdleTimeout<S, T> {
    /// After a write or flush: one that made progress starts the idle spell afresh (an answer
    /// went out; the client may send nothing more); one that waits for the client to read ends
    /// it (the connection is busy, and `http.write_timeout_ms` bounds that wait).
    fn wrote<R>(&mut self, polled: &Poll<io::Result<R>>, progress: impl Fn(&R) -> bool) {
        match polled {
            Poll::Ready(Ok(done)) if progress(done) => {
                let at = self.timer.now() + self.timeout;
                match &mut self.deadline {
                    Some(deadline) => self.timer.reset(deadline, at),
                    None => self.deadline = Some(self.timer.sleep_until(at)),
                }
                self.idle = true;
            }
            Poll::Pending => self.idle = false,
            Poll::Ready(_) => {}
        }
    }
}

impl<S: AsyncRead + Unpin, T: Unpin> AsyncRead for IdleTimeout<S, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        match polled {
            Poll::Ready(Ok(())) if buf.filled().len() > before => this.idle = false,
            Poll::Ready(_) => {}
            Poll::Pending => {
                let passed = this.idle
                    && this.deadline.as_mut().is_some_and(|at| at.as_mut().poll(cx).is_ready());
                if passed {
                    this.idle = false;
                    let message =
                        format!("idle for {} ms after an answer", this.timeout.as_millis());
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, message)));
                }
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin, T: Timer + Unpin> AsyncWrite for IdleTimeout<S, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.wrote(&polled, |written| *written > 0);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.wrote(&polled, |written| *written > 0);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        if polled.is_pending() {
            this.idle = false;
        }
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
