//! The connections the transport takes: at most `max_connections` open at
//! once, and each closed unless it finishes its handshake (TLS, when on,
//! and the HTTP/2 preface) within `handshake_timeout`. HTTP/2 keep-alive
//! only covers connections past the preface: without these bounds, sockets
//! that never send a byte would hold a descriptor each until the process
//! ran out.
//!
//! The handshake is seen from the socket, below TLS: it is finished once
//! the client has answered the server twice under TLS (its handshake's
//! last flight after the server's, then its HTTP/2 frames after the
//! server's first ones), once without (its preface after the server's
//! SETTINGS). A client that stays silent, or stops in the middle, is cut
//! off at the deadline.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// How often at most each kind of refusal is logged (with a count of those
/// since the last line).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A WARN line at most every [`LOG_EVERY`], counting what happened since.
#[derive(Default)]
pub(crate) struct RateLimitedWarn {
    last: Mutex<Option<Instant>>,
    since: AtomicU64,
}

impl RateLimitedWarn {
    /// Counts one event; logs `what` with the count when the last line is
    /// old enough.
    fn note(&self, what: &'static str, limit: u64) {
        let n = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        self.since.fetch_sub(n, Ordering::Relaxed);
        tracing::warn!(connections = n, limit, "{what}");
    }
}

/// The accepted connections of a listener, bounded (see the module docs).
pub(crate) struct Accepted {
    incoming: TcpIncoming,
    slots: Arc<Semaphore>,
    max: usize,
    handshake: Duration,
    turns: u8,
    warn: Arc<Warnings>,
}

#[derive(Default)]
struct Warnings {
    full: RateLimitedWarn,
    slow: RateLimitedWarn,
}

impl Accepted {
    /// `incoming` with at most `max` connections open (at least 1) and
    /// `handshake` to finish the handshake in; `tls` says whether a TLS
    /// handshake comes first.
    pub(crate) fn new(incoming: TcpIncoming, max: usize, handshake: Duration, tls: bool) -> Self {
        let max = max.max(1);
        Accepted {
            incoming,
            slots: Arc::new(Semaphore::new(max)),
            max,
            handshake,
            turns: if tls { 2 } else { 1 },
            warn: Arc::default(),
        }
    }
}

impl Stream for Accepted {
    type Item = Result<Guarded, io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let io = match Pin::new(&mut this.incoming).poll_next(cx) {
                Poll::Ready(Some(Ok(io))) => io,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            let Ok(slot) = Arc::clone(&this.slots).try_acquire_owned() else {
                // Closed at once: the client sees the connection reset
                // rather than a server that never answers.
                drop(io);
                this.warn.full.note(
                    "connection refused: max_connections are open (limits.max_connections)",
                    this.max as u64,
                );
                continue;
            };
            return Poll::Ready(Some(Ok(Guarded {
                io,
                handshake: Some(Handshake {
                    deadline: Box::pin(tokio::time::sleep(this.handshake)),
                    turns_left: this.turns,
                    wrote: false,
                    limit_ms: this.handshake.as_millis() as u64,
                    warn: Arc::clone(&this.warn),
                }),
                _slot: slot,
            })));
        }
    }
}

/// A connection's handshake in progress.
struct Handshake {
    deadline: Pin<Box<tokio::time::Sleep>>,
    /// Answers of the client (data read after the server wrote) still
    /// needed.
    turns_left: u8,
    /// The server wrote since the client's last answer.
    wrote: bool,
    limit_ms: u64,
    warn: Arc<Warnings>,
}

/// An accepted connection: holds its slot among `max_connections`, and
/// fails its reads once the handshake deadline passes unfinished.
pub(crate) struct Guarded {
    io: TcpStream,
    handshake: Option<Handshake>,
    _slot: OwnedSemaphorePermit,
}

impl Connected for Guarded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.io.connect_info()
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(h) = &mut this.handshake {
            if h.deadline.as_mut().poll(cx).is_ready() {
                h.warn.slow.note(
                    "connection closed: no TLS and HTTP/2 handshake within limits.handshake_timeout",
                    h.limit_ms,
                );
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the connection did not finish its handshake in time",
                )));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(h)) = (&r, &mut this.handshake) {
            if buf.filled().len() > before && h.wrote {
                h.wrote = false;
                h.turns_left -= 1;
                if h.turns_left == 0 {
                    this.handshake = None;
                }
            }
        }
        r
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, data);
        if let (Poll::Ready(Ok(n)), Some(h)) = (&r, &mut this.handshake) {
            h.wrote |= *n > 0;
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(h)) = (&r, &mut this.handshake) {
            h.wrote |= *n > 0;
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
