//! A bound on how long a write to a client may make no progress (`http.write_timeout_ms`).
//!
//! hyper times the reading of a request's headers, and nothing else. A client that sends
//! pipelined requests and never reads the answers fills the socket's send buffer: hyper's write
//! stays pending, the next request waits behind it (so no header-read timer runs either), and
//! the connection, its buffers and its place among `http.max_connections` are held for ever; a
//! graceful shutdown waits on it too. (An answer with no request behind it happens to be cut by
//! the header-read timer, which hyper 1.x starts for the next request as soon as the answer is
//! queued, written or not.) [`WriteTimeout`] wraps the accepted stream: a write, flush or
//! shutdown that stays pending for longer than the bound fails with a `TimedOut` error, on which
//! hyper drops the connection.
//!
//! The bound is on a pause, not on a whole answer: every write that makes progress disarms the
//! timer, and the next one that must wait starts it afresh, so this bound never cuts a large
//! answer to a slow client that reads. Reads pass through untouched (hyper's
//! `header_read_timeout` and the edge's body timeout bound them).
//!
//! The timer is hyper's [`Timer`], the one the connection builder already has, so that the unit
//! tests below drive a clock of their own instead of sleeping.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::rt::{Sleep, Timer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A stream whose writes fail once one has been pending for longer than `timeout`.
pub struct WriteTimeout<S, T> {
    inner: S,
    timeout: Duration,
    timer: T,
    /// Kept across stalls and reset, not allocated anew for each.
    deadline: Option<Pin<Box<dyn Sleep>>>,
    /// Whether `deadline` counts: a write has been pending since the last progress.
    armed: bool,
}

impl<S, T> WriteTimeout<S, T> {
    /// Wraps `inner`; `timer` tells the time and makes the deadline.
    pub fn new(inner: S, timeout: Duration, timer: T) -> Self {
        Self { inner, timeout, timer, deadline: None, armed: false }
    }
}

impl<S: std::fmt::Debug, T> std::fmt::Debug for WriteTimeout<S, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTimeout")
            .field("inner", &self.inner)
            .field("timeout", &self.timeout)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

/// The cause inside the `TimedOut` error of a write that made no progress for too long, so that
/// whoever sees the connection end can tell it from other errors ([`WriteStalled::caused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteStalled {
    /// The bound that was passed.
    pub timeout: Duration,
}

impl std::fmt::Display for WriteStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the client read nothing for {} ms while an answer waited to be written",
            self.timeout.as_millis()
        )
    }
}

impl std::error::Error for WriteStalled {}

impl WriteStalled {
    /// Whether `err` or anything in its chain of sources is a stalled write (hyper's error keeps
    /// the I/O error as its source).
    pub fn caused(err: &(dyn std::error::Error + 'static)) -> bool {
        let mut next = Some(err);
        while let Some(err) = next {
            let stalled = err.is::<WriteStalled>()
                || err
                    .downcast_ref::<io::Error>()
                    .and_then(io::Error::get_ref)
                    .is_some_and(|inner| inner.is::<WriteStalled>());
            if stalled {
                return true;
            }
            next = err.source();
        }
        false
    }
}

impl<S, T: Timer> WriteTimeout<S, T> {
    /// After a write, flush or shutdown of the inner stream: progress disarms the deadline; a
    /// pending operation arms it (if it is not already counting) and fails once it has passed.
    fn check<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            // The stale deadline may still wake the task once; a spurious wake-up is harmless.
            self.armed = false;
            return polled;
        }
        if !self.armed {
            let at = self.timer.now() + self.timeout;
            match &mut self.deadline {
                Some(deadline) => self.timer.reset(deadline, at),
                None => self.deadline = Some(self.timer.sleep_until(at)),
            }
            self.armed = true;
        }
        let passed =
            self.deadline.as_mut().is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
        if passed {
            self.armed = false;
            let stalled = WriteStalled { timeout: self.timeout };
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, stalled)));
        }
        Poll::Pending
    }
}

impl<S: AsyncRead + Unpin, T: Unpin> AsyncRead for WriteTimeout<S, T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin, T: Timer + Unpin> AsyncWrite for WriteTimeout<S, T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        // hyper queues an answer's head and body without copying them when the stream can
        // write them in one call; keep what the socket says.
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, polled)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)] // a panic in a test is a failed test
mod tests {
    use std::sync::{Arc, Mutex};
    use std::task::Waker;
    use std::time::Instant;

    use futures::FutureExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};

    use super::*;

    const BOUND: Duration = Duration::from_secs(30);
    /// What the in-memory pipe holds before a write must wait for its reader.
    const PIPE_BYTES: usize = 64;

    /// A clock that moves only when the test says so, and wakes the deadlines it passes.
    #[derive(Debug, Clone)]
    struct ManualClock(Arc<Mutex<ClockState>>);

    #[derive(Debug)]
    struct ClockState {
        now: Instant,
        waiting: Vec<Waker>,
    }

    impl ManualClock {
        fn new() -> Self {
            Self(Arc::new(Mutex::new(ClockState { now: Instant::now(), waiting: Vec::new() })))
        }

        fn advance(&self, by: Duration) {
            let mut state = self.0.lock().unwrap();
            state.now += by;
            state.waiting.drain(..).for_each(Waker::wake);
        }
    }

    #[derive(Debug)]
    struct ManualSleep {
        clock: ManualClock,
        until: Instant,
    }

    impl Future for ManualSleep {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut state = self.clock.0.lock().unwrap();
            if state.now >= self.until {
                return Poll::Ready(());
            }
            state.waiting.push(cx.waker().clone());
            Poll::Pending
        }
    }

    impl Sleep for ManualSleep {}

    impl Timer for ManualClock {
        fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
            self.sleep_until(self.now() + duration)
        }

        fn sleep_until(&self, until: Instant) -> Pin<Box<dyn Sleep>> {
            Box::pin(ManualSleep { clock: self.clone(), until })
        }

        fn now(&self) -> Instant {
            self.0.lock().unwrap().now
        }
    }

    /// A server's end wrapped in the bound, the client's end, and the clock.
    fn pipe() -> (WriteTimeout<DuplexStream, ManualClock>, DuplexStream, ManualClock) {
        let (server, client) = tokio::io::duplex(PIPE_BYTES);
        let clock = ManualClock::new();
        (WriteTimeout::new(server, BOUND, clock.clone()), client, clock)
    }

    /// One poll of a write: `None` while it waits.
    fn try_write<S: AsyncWrite + Unpin>(stream: &mut S) -> Option<io::Result<usize>> {
        stream.write(&[7; PIPE_BYTES]).now_or_never()
    }

    fn is_stalled(err: &io::Error) -> bool {
        err.kind() == io::ErrorKind::TimedOut && WriteStalled::caused(err)
    }

    #[tokio::test]
    async fn a_write_pending_past_the_bound_fails_as_timed_out() {
        let (mut server, _client, clock) = pipe();
        assert_eq!(try_write(&mut server).unwrap().unwrap(), PIPE_BYTES, "the pipe takes one");
        assert!(try_write(&mut server).is_none(), "the full pipe makes the write wait");
        clock.advance(BOUND - Duration::from_millis(1));
        assert!(try_write(&mut server).is_none(), "still within the bound");
        clock.advance(Duration::from_millis(1));
        let err = try_write(&mut server).expect("the bound has passed").unwrap_err();
        assert!(is_stalled(&err), "{err:?}");
    }

    #[tokio::test]
    async fn the_deadline_wakes_a_waiting_writer_by_itself() {
        let (mut server, _client, clock) = pipe();
        server.write_all(&[7; PIPE_BYTES]).await.unwrap();
        let writing = tokio::spawn(async move { server.write_all(b"more").await });
        // Real time only bounds a bug here (a deadline never armed, a writer never woken).
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            // Let the writer reach its pending write and arm the deadline.
            while clock.0.lock().unwrap().waiting.is_empty() {
                tokio::task::yield_now().await;
            }
            clock.advance(BOUND);
            writing.await.unwrap()
        })
        .await;
        let err = ended.expect("the deadline wakes the writer").unwrap_err();
        assert!(is_stalled(&err), "{err:?}");
    }

    #[tokio::test]
    async fn progress_starts_the_bound_afresh() {
        let (mut server, mut client, clock) = pipe();
        try_write(&mut server).unwrap().unwrap();
        assert!(try_write(&mut server).is_none());
        clock.advance(BOUND - Duration::from_secs(1));
        // The client reads a little: the next write makes progress, then waits again.
        let mut taken = [0; PIPE_BYTES / 2];
        client.read_exact(&mut taken).await.unwrap();
        assert_eq!(try_write(&mut server).unwrap().unwrap(), PIPE_BYTES / 2);
        assert!(try_write(&mut server).is_none());
        clock.advance(BOUND - Duration::from_secs(1));
        assert!(try_write(&mut server).is_none(), "counted from the progress, not the first wait");
        clock.advance(Duration::from_secs(1));
        let err = try_write(&mut server).unwrap().unwrap_err();
        assert!(is_stalled(&err), "{err:?}");
    }

    #[tokio::test]
    async fn time_between_writes_does_not_count() {
        let (mut server, mut client, clock) = pipe();
        try_write(&mut server).unwrap().unwrap();
        assert!(try_write(&mut server).is_none(), "a wait arms the deadline");
        let mut taken = [0; PIPE_BYTES];
        client.read_exact(&mut taken).await.unwrap();
        try_write(&mut server).unwrap().unwrap();
        // An idle keep-alive connection: nothing to write for longer than the bound.
        clock.advance(BOUND * 3);
        client.read_exact(&mut taken).await.unwrap();
        assert_eq!(try_write(&mut server).unwrap().unwrap(), PIPE_BYTES);
        assert!(try_write(&mut server).is_none(), "a new wait is not already late");
    }

    #[tokio::test]
    async fn reads_are_not_bounded() {
        let (mut server, _client, clock) = pipe();
        let mut buffer = [0; 8];
        assert!(server.read(&mut buffer).now_or_never().is_none());
        clock.advance(BOUND * 3);
        assert!(server.read(&mut buffer).now_or_never().is_none(), "a read waits on");
    }

    /// A stream whose flush and shutdown never finish, as on a socket that cannot send.
    #[derive(Debug)]
    struct NeverDone;

    impl AsyncWrite for NeverDone {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Pending
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_flush_or_a_shutdown_pending_past_the_bound_fails_too() {
        let clock = ManualClock::new();
        let mut stream = WriteTimeout::new(NeverDone, BOUND, clock.clone());
        assert!(stream.flush().now_or_never().is_none());
        clock.advance(BOUND);
        let err = stream.flush().now_or_never().unwrap().unwrap_err();
        assert!(is_stalled(&err), "{err:?}");

        let mut stream = WriteTimeout::new(NeverDone, BOUND, clock.clone());
        assert!(stream.shutdown().now_or_never().is_none());
        clock.advance(BOUND);
        let err = stream.shutdown().now_or_never().unwrap().unwrap_err();
        assert!(is_stalled(&err), "{err:?}");
    }

    #[test]
    fn a_stalled_write_is_found_under_other_errors_and_nothing_else_is() {
        let stalled = io::Error::new(io::ErrorKind::TimedOut, WriteStalled { timeout: BOUND });
        assert!(WriteStalled::caused(&stalled));
        assert!(!WriteStalled::caused(&io::Error::from(io::ErrorKind::TimedOut)));
        assert!(!WriteStalled::caused(&io::Error::from(io::ErrorKind::ConnectionReset)));
    }
}
