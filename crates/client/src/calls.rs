//! [`Calls`]: a connection's `Calls` stream, which carries its per-call
//! `Allocate` and `Free` calls and its leases' `Commit` calls at about two
//! thirds of a unary call's time.
//!
//! One stream per [`Client`](crate::Client) (and its clones), opened by the
//! first call and again by the first call after it ended. Calls from many
//! tasks share it: each request carries an id, and a reader task hands each
//! reply to the caller waiting for that id. A server without the method
//! (UNIMPLEMENTED) is remembered, and every call goes unary from then on;
//! after any other failure to open, calls go unary for [`REOPEN_PAUSE`]
//! before one tries again, so that callers do not queue behind one failing
//! open after another while the server cannot be reached.
//!
//! When a server begins a graceful stop it sends a stop notice (a reply
//! with id 0): the stream takes no more calls (the next call opens another
//! stream, or goes unary, and is refused as UNAVAILABLE by the stopping
//! server) and closes its side once the calls queued on it are sent; the
//! server answers each of them, UNAVAILABLE for those it did not run, and
//! then ends the stream. When a stream ends otherwise, the calls still
//! waiting fail with [`ClientError::OutcomeUnknown`], as a unary call cut
//! off by a lost connection does: whether the server ran them is not
//! known.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use blockalloc_proto::pb;
use pb::call_request::Call;
use tokio::sync::{mpsc, oneshot};
use tonic::Code;

use crate::error::{ClientError, Result};
use crate::rpc::Rpc;

/// Requests a caller may queue on the stream before it waits for room.
const QUEUE: usize = 1024;

/// How long calls go unary after the stream could not be opened.
pub(crate) const REOPEN_PAUSE: Duration = Duration::from_secs(1);

type Waiting = HashMap<u64, oneshot::Sender<Result<pb::call_reply::Result>>>;

/// The mutex's guard, also after a panic elsewhere poisoned it (every
/// module of the crate takes its locks through this).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

enum State {
    /// No stream: the next call opens one.
    Closed,
    Open(Stream),
    /// Opening failed then (not for want of the method): calls go unary
    /// until [`REOPEN_PAUSE`] has passed.
    Failed(Instant),
    /// The server does not know the method, or the client was set to
    /// make unary calls.
    Unsupported,
}

#[derive(Clone)]
struct Stream {
    /// The stream's side for requests; `None` once the server's stop
    /// notice came (dropping the last sender closes the side). A caller
    /// holds a clone only while it sends.
    requests: Arc<Mutex<Option<mpsc::Sender<pb::CallRequest>>>>,
    waiting: Arc<Mutex<Option<Waiting>>>,
}

impl Stream {
    /// True while the stream takes calls: not ended, no stop notice.
    fn takes_calls(&self) -> bool {
        lock(&self.waiting).is_some() && lock(&self.requests).is_some()
    }
}

/// A connection's `Calls` stream; see the module docs.
pub(crate) struct Calls {
    state: tokio::sync::Mutex<State>,
    next_id: AtomicU64,
    /// Every call unary, by choice ([`ConnectOptions::unary_calls`](crate::ConnectOptions::unary_calls)).
    unary: bool,
}

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calls").finish_non_exhaustive()
    }
}

impl Calls {
    /// No stream yet; with `unary`, never one.
    pub(crate) fn new(unary: bool) -> Calls {
        Calls {
            state: tokio::sync::Mutex::new(if unary {
                State::Unsupported
            } else {
                State::Closed
            }),
            next_id: AtomicU64::new(1),
            unary,
        }
    }

    /// A stream of its own for another client of the same connection
    /// (another token), made the same way.
    pub(crate) fn another(&self) -> Calls {
        Calls::new(self.unary)
    }

    /// Runs `call` on the stream and returns its reply; `Err(call)`, the
    /// call given back unsent, when the server has no `Calls` method or the
    /// stream could not take it (the caller then makes the unary call).
    pub(crate) async fn call(
        &self,
        rpc: &Rpc,
        call: Call,
    ) -> std::result::Result<Result<pb::call_reply::Result>, Call> {
        let Some(stream) = self.stream(rpc).await else {
            return Err(call);
        };
        // Taken before the call waits for its reply, so that a stop notice
        // meanwhile closes the side once the calls queued are sent.
        let Some(requests) = lock(&stream.requests).clone() else {
            return Err(call);
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match lock(&stream.waiting).as_mut() {
            Some(w) => w.insert(id, tx),
            // The stream ended since it was looked up.
            None => return Err(call),
        };
        let req = pb::CallRequest {
            id,
            call: Some(call),
        };
        let sent = requests.send(req).await;
        drop(requests);
        if let Err(unsent) = sent {
            if let Some(w) = lock(&stream.waiting).as_mut() {
                w.remove(&id);
            }
            return Err(unsent.0.call.expect("set above"));
        }
        drop(stream);
        Ok(rx.await.unwrap_or_else(|_| {
            Err(ClientError::OutcomeUnknown(
                "the call stream ended before the reply".into(),
            ))
        }))
    }

    /// The open stream, opening it if needed.
    async fn stream(&self, rpc: &Rpc) -> Option<Stream> {
        let mut st = self.state.lock().await;
        match &*st {
            State::Unsupported => return None,
            State::Failed(at) if at.elapsed() < REOPEN_PAUSE => return None,
            State::Open(s) if s.takes_calls() => return Some(s.clone()),
            _ => {}
        }
        let (requests, rx) = mpsc::channel(QUEUE);
        let out = tokio_stream::wrappers::ReceiverStream::new(rx);
        let inbound = match rpc.clone().calls(out).await {
            Ok(r) => r.into_inner(),
            Err(s) if s.code() == Code::Unimplemented => {
                *st = State::Unsupported;
                return None;
            }
            Err(_) => {
                *st = State::Failed(Instant::now());
                return None;
            }
        };
        let s = Stream {
            requests: Arc::new(Mutex::new(Some(requests))),
            waiting: Arc::new(Mutex::new(Some(HashMap::new()))),
        };
        tokio::spawn(read_replies(inbound, s.clone()));
        *st = State::Open(s.clone());
        Some(s)
    }
}

/// The id of the server's stop notice (a client's ids start at 1).
const STOP_NOTICE: u64 = 0;

/// Hands each reply to its caller, and on the server's stop notice closes
/// the stream's side; when the stream ends, fails every call still waiting
/// and marks the stream ended.
async fn read_replies(mut inbound: tonic::Streaming<pb::CallReply>, stream: Stream) {
    let Stream { requests, waiting } = stream;
    let why = loop {
        match inbound.message().await {
            Ok(Some(r)) if r.id == STOP_NOTICE => {
                // The server answers every call sent before the side
                // closes, and ends the stream after.
                lock(&requests).take();
            }
            Ok(Some(r)) => {
                let Some(tx) = lock(&waiting).as_mut().and_then(|w| w.remove(&r.id)) else {
                    continue;
                };
                let _ = tx
                    .send(r.result.ok_or_else(|| {
                        ClientError::BadReply("a call reply with no result".into())
                    }));
            }
            Ok(None) => break "the server ended the call stream".to_string(),
            Err(s) => break format!("the call stream failed: {}", s.message()),
        }
    };
    lock(&requests).take();
    for (_, tx) in lock(&waiting).take().into_iter().flatten() {
        let _ = tx.send(Err(ClientError::OutcomeUnknown(why.clone())));
    }
}

/// The error a call's reply carries, as the unary call would have failed.
/// An error reply whose code is OK is no error the server sends: a bad
/// reply.
pub(crate) fn call_error(e: pb::CallError) -> ClientError {
    match Code::from_i32(e.code) {
        Code::Ok => ClientError::BadReply(format!("an error reply with code OK: {}", e.message)),
        _ => ClientError::from(blockalloc_proto::details::status_of(&e)),
    }
}
