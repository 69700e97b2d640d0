//! [`Limits`]: what one client may hold and ask for at once, and the
//! transport's bounds, so that no client — broken, malicious or merely
//! busy — can starve the others or hold server resources forever.
//!
//! Every limit is counted per [`Identity`]: today the `blockalloc-client`
//! request header ([`CLIENT_HEADER`]), else the caller's connection; a
//! tenant's authenticated id replaces it once tenants exist. A self-chosen
//! header protects against floods by clients that identify themselves (a
//! misbehaving batch job); the per-connection bounds (streams, message
//! size, keep-alive) and the server-wide lease limit hold for everyone.
//!
//! What happens when a limit is hit:
//! * a message larger than `max_message_bytes` — tonic refuses it with
//!   OUT_OF_RANGE ("decoded message length too large ... the limit is N");
//! * more than `max_streams_per_connection` concurrent calls on one
//!   connection — HTTP/2 makes the client wait for a free stream;
//! * more than `max_in_flight_per_client` calls of one identity — the rest
//!   wait in line, each identity with its own line, so a flood waits behind
//!   itself and not in front of others; past `max_queued_per_client`
//!   waiting calls, UNAVAILABLE ("retry later") at once;
//! * more than `max_leases_per_client` or `max_leases` live leases —
//!   RESOURCE_EXHAUSTED naming the limit;
//! * a call not done within `request_timeout` (including a request whose
//!   body never arrives) — CANCELLED ("Timeout expired");
//! * a connection that stops answering HTTP/2 pings for `keepalive_timeout`
//!   — closed, its calls cancelled; its leases expire within their TTL;
//! * a connection that has not finished its handshake (TLS and the HTTP/2
//!   preface) within `handshake_timeout` — closed;
//! * more than `max_connections` open connections — the next ones are
//!   closed as soon as they are accepted.
//!
//! The last two are logged at WARN, at most every 10 s each, with a count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Request;

use crate::error::ServiceError;
use crate::sync::lock;

/// The request header that names the calling client (ASCII, at most
/// [`MAX_IDENTITY`] bytes). Calls without it count against their
/// connection.
pub const CLIENT_HEADER: &str = "blockalloc-client";

/// Longest identity accepted, in bytes.
pub const MAX_IDENTITY: usize = 128;

/// The server's limits; see the module documentation for what happens when
/// each is hit. `Limits::default()` suits a server with a few hundred
/// clients. In a configuration file: `[server.limits]`, durations in
/// seconds or with a unit (`"400ms"`), sizes in bytes or with a unit
/// (`"4MiB"`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest request or reply message, in bytes. The largest legitimate
    /// request (a Commit of `max_batch` extents) takes under 100 KiB.
    #[serde(deserialize_with = "crate::units::bytes_usize")]
    pub max_message_bytes: usize,
    /// Most calls of one client being served at once.
    pub max_in_flight_per_client: usize,
    /// Most calls of one client waiting for their turn; beyond, calls are
    /// refused at once.
    pub max_queued_per_client: usize,
    /// Most live leases of one client.
    pub max_leases_per_client: usize,
    /// Most live leases of all clients together.
    pub max_leases: usize,
    /// Most concurrent calls (HTTP/2 streams) on one connection.
    pub max_streams_per_connection: u32,
    /// Longest a call may take, from its arrival to its reply, waiting for
    /// its turn included. A call cancelled while its device operation runs
    /// still completes that operation; so this is far above a device sync.
    #[serde(deserialize_with = "crate::units::seconds")]
    pub request_timeout: Duration,
    /// How often an idle connection is pinged (HTTP/2 keep-alive).
    #[serde(deserialize_with = "crate::units::seconds")]
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    #[serde(deserialize_with = "crate::units::seconds")]
    pub keepalive_timeout: Duration,
    /// Most connections open at once; the next ones are closed as soon as
    /// they are accepted (logged at WARN, at most every 10 s). Keep it
    /// under the process's descriptor limit, with room for the devices.
    pub max_connections: usize,
    /// How long a new connection may take to finish its handshake (TLS,
    /// when on, and the HTTP/2 preface) before it is closed (logged at
    /// WARN, at most every 10 s).
    #[serde(deserialize_with = "crate::units::seconds")]
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 4 << 20,
            max_in_flight_per_client: 32,
            max_queued_per_client: 4096,
            max_leases_per_client: 256,
            max_leases: 16384,
            max_streams_per_connection: 256,
            request_timeout: Duration::from_secs(60),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// A tonic transport configured with these limits (streams, timeouts,
    /// keep-alive).
    pub(crate) fn transport(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.max_streams_per_connection)
            .timeout(self.request_timeout)
            .http2_keepalive_interval(Some(self.keepalive_interval))
            .http2_keepalive_timeout(Some(self.keepalive_timeout))
            .tcp_keepalive(Some(self.keepalive_interval))
    }
}

impl Limits {
    /// The allocator service with these limits on message sizes.
    pub(crate) fn service<S>(
        &self,
        svc: crate::pb::allocator_server::AllocatorServer<S>,
    ) -> crate::pb::allocator_server::AllocatorServer<S>
    where
        S: crate::pb::allocator_server::Allocator,
    {
        svc.max_decoding_message_size(self.max_message_bytes)
            .max_encoding_message_size(self.max_message_bytes)
    }
}

/// Refuses a reply that would not fit in `max_message_bytes`.
///
/// # Errors
/// [`ServiceError::OverLimit`].
pub(crate) fn check_reply_size(
    reply: &impl prost::Message,
    max_message_bytes: usize,
) -> Result<(), ServiceError> {
    let len = reply.encoded_len();
    if len > max_message_bytes {
        return Err(ServiceError::OverLimit(format!(
            "the reply would take {len} bytes, more than max_message_bytes = {max_message_bytes}; \
             ask for fewer objects (or fewer, larger extents) per call"
        )));
    }
    Ok(())
}

/// Who a call counts against: on a server with tenants the authenticated
/// tenant; else the [`CLIENT_HEADER`] value, else the caller's connection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity(String);

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Identity {
    /// The identity of an authenticated tenant: every call of the tenant
    /// counts against it, whatever client name its callers send, so a
    /// tenant cannot take another's turn by naming itself after it.
    pub(crate) fn tenant(name: &str) -> Identity {
        Identity(format!("tenant {name:?}"))
    }

    /// The identity of a request.
    ///
    /// # Errors
    /// [`ServiceError::BadRequest`] for a header that is not ASCII or is
    /// longer than [`MAX_IDENTITY`].
    pub fn of<T>(req: &Request<T>) -> Result<Identity, ServiceError> {
        match req.metadata().get(CLIENT_HEADER) {
            Some(v) => {
                let s = v.to_str().map_err(|_| {
                    ServiceError::BadRequest(format!("the {CLIENT_HEADER} header is not ASCII"))
                })?;
                if s.is_empty() || s.len() > MAX_IDENTITY {
                    return Err(ServiceError::BadRequest(format!(
                        "the {CLIENT_HEADER} header must have 1 to {MAX_IDENTITY} bytes"
                    )));
                }
                Ok(Identity(format!("client {s:?}")))
            }
            None => Ok(Identity(match req.remote_addr() {
                Some(a) => format!("connection {a}"),
                None => "an unnamed local caller".into(),
            })),
        }
    }
}

/// One identity's line: its permits and how many of its calls hold or
/// wait for one.
struct Line {
    permits: Arc<Semaphore>,
    users: AtomicUsize,
}

/// The live counters behind [`Limits`].
pub(crate) struct Limiter {
    limits: Limits,
    lines: Mutex<HashMap<Identity, Arc<Line>>>,
    leases: Mutex<LeaseCounts>,
}

#[derive(Default)]
struct LeaseCounts {
    total: usize,
    per_client: HashMap<Identity, usize>,
}

/// A call's turn: held while the call runs.
pub(crate) struct Turn {
    limiter: Arc<Limiter>,
    who: Identity,
    line: Arc<Line>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Turn {
    /// Whose turn it is.
    pub(crate) fn who(&self) -> &Identity {
        &self.who
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.line.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            // Forget idle identities, so that clients that come and go do
            // not grow the table; a call that joined meanwhile keeps it.
            let mut lines = lock(&self.limiter.lines);
            if self.line.users.load(Ordering::Acquire) == 0 {
                lines.remove(&self.who);
            }
        }
    }
}

/// A live lease's place in the lease counts; freed on drop.
pub(crate) struct LeaseSlot {
    limiter: Arc<Limiter>,
    who: Identity,
}

impl Drop for LeaseSlot {
    fn drop(&mut self) {
        let mut c = lock(&self.limiter.leases);
        c.total -= 1;
        if let Some(n) = c.per_client.get_mut(&self.who) {
            *n -= 1;
            if *n == 0 {
                c.per_client.remove(&self.who);
            }
        }
    }
}

impl Limiter {
    pub(crate) fn new(limits: Limits) -> Arc<Limiter> {
        Arc::new(Limiter {
            limits,
            lines: Mutex::new(HashMap::new()),
            leases: Mutex::new(LeaseCounts::default()),
        })
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Waits for `who`'s turn to run a call.
    ///
    /// # Errors
    /// [`ServiceError::Busy`] when `who` already has the most calls running
    /// and waiting.
    pub(crate) async fn turn(self: &Arc<Self>, who: Identity) -> Result<Turn, ServiceError> {
        let line = {
            let mut lines = lock(&self.lines);
            let line = lines.entry(who.clone()).or_insert_with(|| {
                Arc::new(Line {
                    permits: Arc::new(Semaphore::new(self.limits.max_in_flight_per_client)),
                    users: AtomicUsize::new(0),
                })
            });
            line.users.fetch_add(1, Ordering::AcqRel);
            Arc::clone(line)
        };
        let mut turn = Turn {
            limiter: Arc::clone(self),
            who,
            line,
            _permit: None,
        };
        let most = self.limits.max_in_flight_per_client + self.limits.max_queued_per_client;
        let users = turn.line.users.load(Ordering::Acquire);
        if users > most {
            return Err(ServiceError::Busy(format!(
                "{} has {} calls running or waiting, more than its limit of {} \
                 (max_in_flight_per_client {} + max_queued_per_client {})",
                turn.who,
                users - 1,
                most,
                self.limits.max_in_flight_per_client,
                self.limits.max_queued_per_client
            )));
        }
        let permit = Arc::clone(&turn.line.permits)
            .acquire_owned()
            .await
            .map_err(|_| ServiceError::ShuttingDown)?;
        turn._permit = Some(permit);
        Ok(turn)
    }

    /// Counts a new lease of `who`.
    ///
    /// # Errors
    /// [`ServiceError::OverLimit`] when `who` or the server holds the most
    /// leases.
    pub(crate) fn lease_slot(self: &Arc<Self>, who: &Identity) -> Result<LeaseSlot, ServiceError> {
        let mut c = lock(&self.leases);
        if c.total >= self.limits.max_leases {
            return Err(ServiceError::OverLimit(format!(
                "the server holds {} leases, its limit (max_leases = {}); \
                 retry when some are released or expire",
                c.total, self.limits.max_leases
            )));
        }
        let mine = c.per_client.get(who).copied().unwrap_or(0);
        if mine >= self.limits.max_leases_per_client {
            return Err(ServiceError::OverLimit(format!(
                "{who} holds {mine} leases, its limit (max_leases_per_client = {}); \
                 release some before asking for more",
                self.limits.max_leases_per_client
            )));
        }
        c.total += 1;
        *c.per_client.entry(who.clone()).or_insert(0) += 1;
        Ok(LeaseSlot {
            limiter: Arc::clone(self),
            who: who.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(in_flight: usize, queued: usize, leases: usize, per_client: usize) -> Arc<Limiter> {
        Limiter::new(Limits {
            max_in_flight_per_client: in_flight,
            max_queued_per_client: queued,
            max_leases: leases,
            max_leases_per_client: per_client,
            ..Limits::default()
        })
    }

    fn who(s: &str) -> Identity {
        Identity(s.into())
    }

    #[tokio::test]
    async fn a_client_past_its_line_is_busy_and_others_still_get_a_turn() {
        let l = limiter(1, 1, 10, 10);
        let first = l.turn(who("a")).await.unwrap();
        let waiting = {
            let l = Arc::clone(&l);
            tokio::spawn(async move { l.turn(who("a")).await.map(|_| ()) })
        };
        while l.lines.lock().unwrap()[&who("a")]
            .users
            .load(Ordering::Acquire)
            < 2
        {
            tokio::task::yield_now().await;
        }
        let e = l.turn(who("a")).await.err().expect("over the line");
        assert!(matches!(e, ServiceError::Busy(_)), "{e}");
        assert!(e.to_string().contains("max_queued_per_client 1"), "{e}");
        // Another client is not behind "a".
        drop(l.turn(who("b")).await.unwrap());
        drop(first);
        waiting.await.unwrap().unwrap();
        assert!(
            l.lines.lock().unwrap().is_empty(),
            "idle lines are forgotten"
        );
    }

    #[test]
    fn lease_slots_count_per_client_and_in_total_until_dropped() {
        let l = limiter(1, 1, 3, 2);
        let a1 = l.lease_slot(&who("a")).unwrap();
        let _a2 = l.lease_slot(&who("a")).unwrap();
        let e = l.lease_slot(&who("a")).err().unwrap();
        assert!(e.to_string().contains("max_leases_per_client = 2"), "{e}");
        let _b1 = l.lease_slot(&who("b")).unwrap();
        let e = l.lease_slot(&who("c")).err().unwrap();
        assert!(e.to_string().contains("max_leases = 3"), "{e}");
        drop(a1);
        let _c1 = l.lease_slot(&who("c")).unwrap();
        assert_eq!(l.leases.lock().unwrap().total, 3);
    }
}
