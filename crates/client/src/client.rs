//! [`Client`]: one connection to the service and its per-call operations.

use blockalloc::Extent;
use blockalloc_proto::pb;
use blockalloc_proto::pb::allocator_client::AllocatorClient;
use tonic::transport::Channel;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::calls::{call_error, Calls};
use crate::connect::{ConnectOptions, Probe};
use crate::error::{ClientError, Result};
use crate::retry::{Backoff, Session};
use crate::rpc::{BearerToken, Rpc};
use pb::call_reply::Result as Reply;
use pb::call_request::Call;

/// A device of the server.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceId {
    /// By position in the server's list, from 0.
    Index(u32),
    /// By name (the device's file name).
    Name(String),
}

impl Default for DeviceId {
    fn default() -> Self {
        DeviceId::Index(0)
    }
}

impl DeviceId {
    pub(crate) fn to_pb(&self) -> pb::DeviceRef {
        pb::DeviceRef {
            r#ref: Some(match self {
                DeviceId::Index(i) => pb::device_ref::Ref::Index(*i),
                DeviceId::Name(n) => pb::device_ref::Ref::Name(n.clone()),
            }),
        }
    }

    /// True when `st` is the status of this device.
    pub(crate) fn names(&self, st: &DeviceStatus) -> bool {
        match self {
            DeviceId::Index(i) => st.index == *i,
            DeviceId::Name(n) => st.name == *n,
        }
    }
}

/// Space accounting of one device (see `DeviceStatus` in the schema).
pub type DeviceStatus = pb::DeviceStatus;

/// A connection to an allocation server. Cheap to clone; clones share the
/// connection, which reconnects by itself after a server restart.
///
/// Calls survive cuts and restarts: every `allocate` and `free` carries a
/// request id (a random 64-bit start per client, then counting up), and
/// one that ends unavailable, cut off (DEADLINE_EXCEEDED, CANCELLED, a
/// broken connection) or answered by a stale owner of the device
/// ([`ClientError::Fenced`]) is sent again with the same id, after 10 ms,
/// then twice as long each time up to a second, for at most
/// [`retry_for`](Self::with_retry_for) (30 s by default). The server
/// answers a resent id with the first call's result, so a retried call
/// runs once. Other errors are returned at once. The client also tracks
/// the newest epoch of each device it has seen and sends it with every
/// request, so that a stale owner refuses it (see "Fencing" in the
/// schema).
///
/// ```no_run
/// # async fn demo() -> Result<(), blockalloc_client::ClientError> {
/// use blockalloc_client::{Client, DeviceId};
///
/// let client = Client::connect("127.0.0.1:7878").await?;
/// // Ten 1 MiB objects, each one extent, durable on return.
/// let objects = client.allocate(&DeviceId::default(), 10, 256, None).await?;
/// client.free(&DeviceId::default(), &objects).await?;
/// let st = &client.status().await?[0];
/// println!("{} of {} blocks free", st.free_blocks, st.capacity_blocks);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    channel: Channel,
    rpc: Rpc,
    /// The `Calls` stream that carries `allocate` and `free`.
    calls: Arc<Calls>,
    /// What to ask the server when the connection fails (see
    /// [`Client::fail`]).
    probe: Option<Arc<Probe>>,
    /// Request ids and epochs, shared by every clone.
    session: Arc<Session<DeviceId>>,
    /// How long a call is resent after failures a resend may cure.
    retry_for: Duration,
}

/// How long a call is resent by default ([`Client::with_retry_for`]).
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(30);

/// The device's epoch a reply carries (0 for none, and for an error).
pub(crate) fn reply_epoch(r: &Reply) -> u64 {
    match r {
        Reply::Allocate(a) => a.epoch,
        Reply::Free(f) => f.epoch,
        Reply::Commit(c) => c.epoch,
        Reply::Error(_) => 0,
    }
}

/// Sets the epoch a request carries.
pub(crate) fn set_epoch(call: &mut Call, epoch: u64) {
    match call {
        Call::Allocate(a) => a.epoch = epoch,
        Call::Free(f) => f.epoch = epoch,
        Call::Commit(c) => c.epoch = epoch,
    }
}

pub(crate) fn extent(e: &pb::Extent) -> Result<Extent> {
    Extent::new(e.start, e.len)
        .map_err(|err| ClientError::BadReply(format!("extent {}+{}: {err}", e.start, e.len)))
}

/// An Allocate of `count` contiguous objects of `blocks` blocks on
/// `device`, near `hint`.
pub(crate) fn contiguous_request(
    device: &DeviceId,
    count: u32,
    blocks: u64,
    hint: Option<u64>,
    request_id: u64,
) -> pb::AllocateRequest {
    pb::AllocateRequest {
        device: Some(device.to_pb()),
        count,
        size: Some(pb::allocate_request::Size::Blocks(blocks)),
        scattered: false,
        hint,
        request_id,
        epoch: 0,
    }
}

/// The extents of `count` contiguous objects in an Allocate reply.
pub(crate) fn contiguous(r: &pb::AllocateResponse, count: u32) -> Result<Vec<Extent>> {
    let mut out = Vec::with_capacity(r.objects.len());
    for o in &r.objects {
        match o.extents.as_slice() {
            [e] => out.push(extent(e)?),
            other => {
                return Err(ClientError::BadReply(format!(
                    "a contiguous object came back as {} extents",
                    other.len()
                )))
            }
        }
    }
    if out.len() != count as usize {
        return Err(ClientError::BadReply(format!(
            "{count} objects asked, {} returned",
            out.len()
        )));
    }
    Ok(out)
}

pub(crate) fn to_pb(e: Extent) -> pb::Extent {
    pb::Extent {
        start: e.start(),
        len: e.len(),
    }
}

impl Client {
    /// Connects to `addr` (`host:port`, or a `http://` URI) in plaintext,
    /// or over TLS to a `https://` URI whose certificate a public web root
    /// signs.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`] when the server cannot be reached,
    /// [`ClientError::Config`] for a malformed address.
    pub async fn connect(addr: &str) -> Result<Client> {
        Self::connect_with(addr, &ConnectOptions::default()).await
    }

    /// Connects to `addr` and sends `token` as `authorization: Bearer
    /// TOKEN` with every call, as a server with tenants requires.
    ///
    /// # Errors
    /// As [`connect`](Self::connect); [`ClientError::Refused`] for a token
    /// that cannot be sent in a header.
    pub async fn connect_with_token(addr: &str, token: &str) -> Result<Client> {
        Client::connect(addr).await?.with_token(Some(token))
    }

    /// This client's connection, sending `token` instead (or no token).
    ///
    /// # Errors
    /// [`ClientError::Refused`] for a token that cannot be sent in a
    /// header.
    pub fn with_token(&self, token: Option<&str>) -> Result<Client> {
        let auth = match token {
            Some(t) => BearerToken::new(t)?,
            None => BearerToken::default(),
        };
        Ok(self.with_bearer(auth))
    }

    /// This client's connection, sending `auth` instead.
    pub fn with_bearer(&self, auth: BearerToken) -> Client {
        Client {
            channel: self.channel.clone(),
            rpc: AllocatorClient::with_interceptor(self.channel.clone(), auth),
            // The stream carries the token it was opened with.
            calls: Arc::new(self.calls.another()),
            probe: self.probe.clone(),
            session: Arc::clone(&self.session),
            retry_for: self.retry_for,
        }
    }

    /// This client's connection, resending a failed `allocate` or `free`
    /// for at most `retry_for` instead (see [`Client`]); zero sends each
    /// call once.
    pub fn with_retry_for(&self, retry_for: Duration) -> Client {
        Client {
            retry_for,
            ..self.clone()
        }
    }

    /// The id of a new Allocate or Free: 0 (none) when calls are not
    /// resent, since the server keeps a cancelled call's allocation for a
    /// resend of its id, which would never come.
    fn request_id(&self) -> u64 {
        if self.retry_for.is_zero() {
            0
        } else {
            self.session.request_id()
        }
    }

    /// How long a failed call is resent ([`with_retry_for`](Self::with_retry_for)).
    pub fn retry_for(&self) -> Duration {
        self.retry_for
    }

    /// Connects to `addr` with `opts`: TLS with a private CA or a client
    /// certificate, or plaintext refused.
    ///
    /// # Errors
    /// [`ClientError::Config`] (plaintext refused, TLS settings for a
    /// plaintext address, a bad address), [`ClientError::Unavailable`]
    /// (unreachable, or the TLS handshake failed).
    pub async fn connect_with(addr: &str, opts: &ConnectOptions) -> Result<Client> {
        let endpoint = crate::connect::endpoint(addr, opts)?;
        let probe = Probe::of(&endpoint, opts).map(Arc::new);
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| ClientError::Unavailable(blockalloc_proto::tls::error_chain(&e)))?;
        Ok(Client::over(channel, probe, opts))
    }

    /// A client of `addr` that connects at its first call (and a call
    /// fails [`ClientError::Unavailable`] while it cannot).
    ///
    /// # Errors
    /// [`ClientError::Config`] for a malformed address or settings.
    pub(crate) fn connect_lazy(addr: &str, opts: &ConnectOptions) -> Result<Client> {
        let endpoint = crate::connect::endpoint(addr, opts)?;
        let probe = Probe::of(&endpoint, opts).map(Arc::new);
        Ok(Client::over(endpoint.connect_lazy(), probe, opts))
    }

    pub(crate) fn over(
        channel: Channel,
        probe: Option<Arc<Probe>>,
        opts: &ConnectOptions,
    ) -> Client {
        let auth = BearerToken::default();
        Client {
            rpc: AllocatorClient::with_interceptor(channel.clone(), auth),
            channel,
            calls: Arc::new(Calls::new(opts.unary_calls)),
            probe,
            session: Arc::default(),
            retry_for: DEFAULT_RETRY_FOR,
        }
    }

    /// The error of a call that ended with `s`. When the connection itself
    /// failed (a status tonic made, not the server: it has a source), the
    /// cause is looked for, so that a settings mistake says what to fix:
    /// a plaintext connection to a server that serves TLS (it answers a
    /// TLS hello), or a server that wants a client certificate this
    /// connection did not present (its TLS alert, asked on a connection of
    /// its own: a call often sees only the connection closing).
    pub(crate) async fn fail(&self, s: tonic::Status) -> ClientError {
        let transport = std::error::Error::source(&s).is_some();
        let e = ClientError::from(s);
        if !transport || matches!(e, ClientError::Config(_)) {
            return e;
        }
        let cause = match &self.probe {
            Some(p) => p.ask().await,
            None => None,
        };
        cause.unwrap_or(e)
    }

    /// The generated gRPC client, for calls this type does not wrap; it
    /// sends this client's token.
    pub fn rpc(&self) -> Rpc {
        self.rpc.clone()
    }

    /// Allocates `count` objects of `blocks` contiguous blocks each, near
    /// `hint`, all or nothing; durable on return.
    ///
    /// # Errors
    /// [`ClientError::NoSpace`], [`ClientError::Quota`] (past the tenant's
    /// quota), [`ClientError::Refused`] (bad arguments, unknown device),
    /// [`ClientError::Unavailable`].
    pub async fn allocate(
        &self,
        device: &DeviceId,
        count: u32,
        blocks: u64,
        hint: Option<u64>,
    ) -> Result<Vec<Extent>> {
        let r = self
            .allocate_call(
                device,
                contiguous_request(device, count, blocks, hint, self.request_id()),
            )
            .await?;
        contiguous(&r, count)
    }

    /// Allocates one object of `blocks` blocks in as few extents as the
    /// server finds; durable on return.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate).
    pub async fn allocate_scattered(&self, device: &DeviceId, blocks: u64) -> Result<Vec<Extent>> {
        let r = self
            .allocate_call(
                device,
                pb::AllocateRequest {
                    device: Some(device.to_pb()),
                    count: 1,
                    size: Some(pb::allocate_request::Size::Blocks(blocks)),
                    scattered: true,
                    hint: None,
                    request_id: self.request_id(),
                    epoch: 0,
                },
            )
            .await?;
        let o = r
            .objects
            .first()
            .ok_or_else(|| ClientError::BadReply("no object returned".into()))?;
        o.extents.iter().map(extent).collect()
    }

    /// Frees `extents` (committed allocations), all or nothing; durable on
    /// return. Returns the blocks freed.
    ///
    /// # Errors
    /// [`ClientError::Refused`] with `FailedPrecondition` for a double free
    /// (nothing is freed), `InvalidArgument` for bad extents,
    /// [`ClientError::Unavailable`].
    pub async fn free(&self, device: &DeviceId, extents: &[Extent]) -> Result<u64> {
        let req = pb::FreeRequest {
            device: Some(device.to_pb()),
            extents: extents.iter().copied().map(to_pb).collect(),
            request_id: self.request_id(),
            epoch: 0,
        };
        match self.call(device, Call::Free(req)).await? {
            Reply::Free(r) => Ok(r.blocks),
            _ => Err(ClientError::BadReply(
                "a Free answered as another call".into(),
            )),
        }
    }

    /// An `Allocate` call (see [`call`](Self::call)).
    async fn allocate_call(
        &self,
        device: &DeviceId,
        req: pb::AllocateRequest,
    ) -> Result<pb::AllocateResponse> {
        match self.call(device, Call::Allocate(req)).await? {
            Reply::Allocate(r) => Ok(r),
            _ => Err(ClientError::BadReply(
                "an Allocate answered as another call".into(),
            )),
        }
    }

    /// A lease's `Commit` call on `device`, sent once (see
    /// [`call_once`](Self::call_once)): the leasing allocator resends it
    /// itself, until the lease's deadline.
    pub(crate) async fn commit_call(
        &self,
        device: &DeviceId,
        req: pb::CommitRequest,
    ) -> Result<pb::CommitResponse> {
        match self.call_once(device, Call::Commit(req)).await? {
            Reply::Commit(r) => Ok(r),
            _ => Err(ClientError::BadReply(
                "a Commit answered as another call".into(),
            )),
        }
    }

    /// An `Allocate` or `Free` call about `device` ([`call_once`](Self::call_once)), sent
    /// again with its request id after a failure a resend may cure, for at
    /// most `retry_for`.
    async fn call(&self, device: &DeviceId, call: Call) -> Result<Reply> {
        let started = Instant::now();
        let mut backoff = Backoff::default();
        loop {
            match self.call_once(device, call.clone()).await {
                Err(e) if e.retryable() => {
                    let pause = backoff.next_pause();
                    if started.elapsed() + pause > self.retry_for {
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                }
                r => return r,
            }
        }
    }

    /// One try of a call about `device`, carrying the newest epoch seen for
    /// it; a reply from an older epoch is [`ClientError::Fenced`].
    async fn call_once(&self, device: &DeviceId, mut call: Call) -> Result<Reply> {
        set_epoch(&mut call, self.session.epoch(device));
        let r = self.send(call).await?;
        self.session.observe(device, reply_epoch(&r))?;
        Ok(r)
    }

    /// A `Lease` call on `device`, sent once with the newest epoch seen.
    pub(crate) async fn lease_call(
        &self,
        device: &DeviceId,
        mut req: pb::LeaseRequest,
    ) -> Result<pb::LeaseResponse> {
        req.epoch = self.epoch(device);
        let r = match self.rpc().lease(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Err(self.fail(s).await),
        };
        self.observe_epoch(device, r.epoch)?;
        Ok(r)
    }

    /// A `Renew` call for a lease on `device`, sent once with the newest
    /// epoch seen.
    pub(crate) async fn renew_call(
        &self,
        device: &DeviceId,
        mut req: pb::RenewRequest,
    ) -> Result<pb::RenewResponse> {
        req.epoch = self.epoch(device);
        let r = match self.rpc().renew(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Err(self.fail(s).await),
        };
        self.observe_epoch(device, r.epoch)?;
        Ok(r)
    }

    /// A `Release` call for a lease on `device`, sent once with the newest
    /// epoch seen.
    pub(crate) async fn release_call(
        &self,
        device: &DeviceId,
        mut req: pb::ReleaseRequest,
    ) -> Result<pb::ReleaseResponse> {
        req.epoch = self.epoch(device);
        let r = match self.rpc().release(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Err(self.fail(s).await),
        };
        self.observe_epoch(device, r.epoch)?;
        Ok(r)
    }

    /// The newest epoch of `device` this client has seen (0: none).
    pub(crate) fn epoch(&self, device: &DeviceId) -> u64 {
        self.session.epoch(device)
    }

    /// Takes in a reply's epoch for `device` (see [`Session::observe`]).
    pub(crate) fn observe_epoch(&self, device: &DeviceId, got: u64) -> Result<()> {
        self.session.observe(device, got)
    }

    /// An `Allocate`, `Free` or `Commit` call: on the connection's `Calls` stream, or
    /// unary when the stream does not take it. A reply's error is returned
    /// as the unary call's would be.
    pub(crate) async fn send(&self, call: Call) -> Result<Reply> {
        let unsent = match self.calls.call(&self.rpc, call).await {
            Ok(reply) => {
                return match reply? {
                    Reply::Error(e) => Err(call_error(e)),
                    r => Ok(r),
                }
            }
            Err(unsent) => unsent,
        };
        let r = match unsent {
            Call::Allocate(a) => self
                .rpc()
                .allocate(a)
                .await
                .map(|r| Reply::Allocate(r.into_inner())),
            Call::Free(f) => self
                .rpc()
                .free(f)
                .await
                .map(|r| Reply::Free(r.into_inner())),
            Call::Commit(c) => self
                .rpc()
                .commit(c)
                .await
                .map(|r| Reply::Commit(r.into_inner())),
        };
        match r {
            Ok(r) => Ok(r),
            Err(s) => Err(self.fail(s).await),
        }
    }

    /// Space accounting of every device and the live leases on them: what
    /// an operator looks at (`blockalloc status --remote`).
    ///
    /// # Errors
    /// [`ClientError::Unavailable`].
    pub async fn status_with_leases(&self) -> Result<pb::StatusResponse> {
        self.status_of_all(true).await
    }

    /// The CPU time (user + system) the server process has used since it
    /// started: its growth over a run, divided by the operations served,
    /// is the server's CPU per operation.
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub async fn server_cpu(&self) -> Result<std::time::Duration> {
        let r = self.status_of_all(false).await?;
        Ok(std::time::Duration::from_nanos(r.server_cpu_ns))
    }

    /// Space accounting of every device.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`].
    pub async fn status(&self) -> Result<Vec<DeviceStatus>> {
        Ok(self.status_of_all(false).await?.devices)
    }

    /// A Status call for every device, with their leases or not.
    async fn status_of_all(&self, leases: bool) -> Result<pb::StatusResponse> {
        let r = self
            .rpc()
            .status(pb::StatusRequest {
                device: None,
                leases,
            })
            .await;
        match r {
            Ok(r) => Ok(r.into_inner()),
            Err(s) => Err(self.fail(s).await),
        }
    }
}
