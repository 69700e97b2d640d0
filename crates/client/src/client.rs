//! [`Client`]: one connection to the service and its per-call operations.

use blockalloc::Extent;
use blockalloc_proto::pb;
use blockalloc_proto::pb::allocator_client::AllocatorClient;
use tonic::transport::Channel;

use std::sync::Arc;

use crate::calls::{call_error, Calls};
use crate::connect::{ConnectOptions, Probe};
use crate::error::{ClientError, Result};
use crate::rpc::{BearerToken, Rpc};
use pb::call_reply::Result as Reply;
use pb::call_request::Call;

/// A device of the server.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

pub(crate) fn extent(e: &pb::Extent) -> Result<Extent> {
    Extent::new(e.start, e.len)
        .map_err(|err| ClientError::BadReply(format!("extent {}+{}: {err}", e.start, e.len)))
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
        }
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
        let auth = BearerToken::default();
        Ok(Client {
            rpc: AllocatorClient::with_interceptor(channel.clone(), auth),
            channel,
            calls: Arc::new(Calls::new(opts.unary_calls)),
            probe,
        })
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
            .allocate_call(pb::AllocateRequest {
                device: Some(device.to_pb()),
                count,
                size: Some(pb::allocate_request::Size::Blocks(blocks)),
                scattered: false,
                hint,
                request_id: 0,
                epoch: 0,
            })
            .await?;
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
                "{} objects asked, {} returned",
                count,
                out.len()
            )));
        }
        Ok(out)
    }

    /// Allocates one object of `blocks` blocks in as few extents as the
    /// server finds; durable on return.
    ///
    /// # Errors
    /// As [`allocate`](Self::allocate).
    pub async fn allocate_scattered(&self, device: &DeviceId, blocks: u64) -> Result<Vec<Extent>> {
        let r = self
            .allocate_call(pb::AllocateRequest {
                device: Some(device.to_pb()),
                count: 1,
                size: Some(pb::allocate_request::Size::Blocks(blocks)),
                scattered: true,
                hint: None,
                request_id: 0,
                epoch: 0,
            })
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
            request_id: 0,
            epoch: 0,
        };
        match self.call(Call::Free(req)).await? {
            Reply::Free(r) => Ok(r.blocks),
            _ => Err(ClientError::BadReply(
                "a Free answered as another call".into(),
            )),
        }
    }

    /// An `Allocate` call (see [`call`](Self::call)).
    async fn allocate_call(&self, req: pb::AllocateRequest) -> Result<pb::AllocateResponse> {
        match self.call(Call::Allocate(req)).await? {
            Reply::Allocate(r) => Ok(r),
            _ => Err(ClientError::BadReply(
                "an Allocate answered as another call".into(),
            )),
        }
    }

    /// A lease's `Commit` call (see [`call`](Self::call)).
    pub(crate) async fn commit_call(&self, req: pb::CommitRequest) -> Result<pb::CommitResponse> {
        match self.call(Call::Commit(req)).await? {
            Reply::Commit(r) => Ok(r),
            _ => Err(ClientError::BadReply(
                "a Commit answered as another call".into(),
            )),
        }
    }

    /// An `Allocate`, `Free` or `Commit` call: on the connection's `Calls` stream, or
    /// unary when the stream does not take it. A reply's error is returned
    /// as the unary call's would be.
    async fn call(&self, call: Call) -> Result<Reply> {
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
        let r = self
            .rpc()
            .status(pb::StatusRequest {
                device: None,
                leases: true,
            })
            .await;
        match r {
            Ok(r) => Ok(r.into_inner()),
            Err(s) => Err(self.fail(s).await),
        }
    }

    /// Space accounting of every device.
    ///
    /// # Errors
    /// [`ClientError::Unavailable`].
    pub async fn status(&self) -> Result<Vec<DeviceStatus>> {
        let r = self
            .rpc()
            .status(pb::StatusRequest {
                device: None,
                leases: false,
            })
            .await;
        match r {
            Ok(r) => Ok(r.into_inner().devices),
            Err(s) => Err(self.fail(s).await),
        }
    }
}
