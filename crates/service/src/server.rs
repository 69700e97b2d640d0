//! [`Server`]: the gRPC service over one or more devices, and graceful
//! shutdown.
//!
//! A call's path: admission (its caller's turn, [`crate::limits`]), then
//! the request is checked (shape, extents inside the device, batch size)
//! and becomes a [`Command`] sent to the owner of its device
//! ([`crate::owner`]), whose reply is the call's. Unary calls and the calls
//! of a `Calls` stream take the same path. Store work never runs on the
//! runtime's threads, so a slow device stalls neither the transport nor
//! the other devices.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc::Extent;
use tonic::{Request, Response, Status};

use crate::auth::{caller, Authenticate};
use crate::config::Config;
use crate::device::{scope_of, RecallSignal, ServedDevice};
use crate::error::{quoted, ServiceError};
use crate::leases::{CommitBatch, LeaseAsk, LeaseId};
use crate::limits::{Identity, Limiter, Turn};
use crate::metrics::Metrics;
use crate::owner::{AllocateAsk, Command, Reply, RequestId, Requests, Restored};
use crate::ownership::{DeviceOwners, OwnershipError};
use crate::pb::allocator_server::Allocator as AllocatorRpc;
use crate::records::{self, commit_key, lease_key, CommitRecord, LeaseRecord, RequestRecord};
use crate::tenants::{Tenant, Tenants};
use crate::{details, owner, pb};

/// Longest client id accepted, in bytes.
const MAX_CLIENT_ID: usize = 128;

/// The allocation service over a list of devices.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use blockalloc_service::{Config, ServedDevice, Server};
/// use blockalloc_store::{device::MemDevice, FormatOptions, Store};
///
/// let store = Store::format(MemDevice::new(256 << 20), FormatOptions::default())?;
/// let server = Server::new(vec![ServedDevice::new("mem0", Arc::new(store))], Config::default())?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// println!("listening on {}", listener.local_addr()?);
/// server.serve(listener, async { let _ = tokio::signal::ctrl_c().await; }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

struct Inner {
    devices: Vec<Arc<ServedDevice>>,
    /// Each device's owner, by device index.
    owners: Vec<mpsc::Sender<Command>>,
    limiter: Arc<Limiter>,
    cfg: Config,
    tenants: Arc<Tenants>,
    /// Set when a graceful stop begins: `Calls` streams send the stop
    /// notice and refuse the calls they read from then on.
    closing: tokio::sync::watch::Sender<bool>,
    /// The transport's metrics, for the calls made on `Calls` streams.
    metrics: std::sync::OnceLock<Metrics>,
    /// True while this server must acknowledge nothing (see
    /// [`Server::fence_with`]).
    fence: std::sync::OnceLock<Fence>,
    /// The cluster's topology, for `WatchTopology` (see
    /// [`Server::topology_from`]).
    topology: std::sync::OnceLock<tokio::sync::watch::Receiver<pb::Topology>>,
}

/// A check that says when a server must stop acknowledging calls: a
/// cluster member whose ownership lease may have ended.
pub type Fence = Arc<dyn Fn() -> bool + Send + Sync>;

/// Why a server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// No device, or two devices with one name.
    #[error("bad device list: {0}")]
    Devices(String),
    /// A device's region ownership could not be loaded.
    #[error(transparent)]
    Ownership(#[from] OwnershipError),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A device's owner thread could not be started.
    #[error("cannot start the owner thread of a device: {0}")]
    Owner(std::io::Error),
    /// The TLS files cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// TLS is required and not configured.
    #[error("TLS is required (require_tls) but no certificate and key are configured")]
    TlsRequired,
    /// A store could not close at shutdown (its commits are durable in the
    /// journal all the same).
    #[error("closing device {device}: {source}")]
    Close {
        /// The device's name.
        device: String,
        /// The store's error.
        #[source]
        source: blockalloc_store::StoreError,
    },
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("devices", &self.inner.devices.len())
            .finish_non_exhaustive()
    }
}

fn extent(e: &pb::Extent, capacity: u64, what: &str) -> Result<Extent, ServiceError> {
    if e.len == 0 {
        return Err(ServiceError::BadRequest(format!(
            "{what} extent at block {} has zero length",
            e.start
        )));
    }
    match e.start.checked_add(e.len) {
        Some(end) if end <= capacity => {
            Ok(Extent::new(e.start, e.len).expect("non-empty and in range"))
        }
        _ => Err(ServiceError::BadRequest(format!(
            "{what} extent {}+{} reaches past the device's {capacity} blocks",
            e.start, e.len
        ))),
    }
}

fn extents(list: &[pb::Extent], capacity: u64, what: &str) -> Result<Vec<Extent>, ServiceError> {
    list.iter().map(|e| extent(e, capacity, what)).collect()
}

/// [`extents`] of a list that must be pairwise disjoint (a batch of frees
/// or of allocations): two extents that overlap (or repeat) are a malformed
/// request, refused before the store sees either of them.
fn disjoint_extents(
    list: &[pb::Extent],
    capacity: u64,
    what: &str,
) -> Result<Vec<Extent>, ServiceError> {
    let out = extents(list, capacity, what)?;
    let mut order: Vec<&Extent> = out.iter().collect();
    order.sort_unstable_by_key(|e| e.start());
    for w in order.windows(2) {
        if w[1].start() < w[0].end() {
            return Err(ServiceError::BadRequest(format!(
                "{what} extents {}+{} and {}+{} overlap; a batch's extents must be pairwise disjoint",
                w[0].start(),
                w[0].len(),
                w[1].start(),
                w[1].len()
            )));
        }
    }
    Ok(out)
}

/// Refuses a hint past the device's end.
fn check_hint(hint: Option<u64>, geo: blockalloc::Geometry) -> Result<(), ServiceError> {
    match hint {
        Some(h) if h > geo.capacity_blocks() => Err(ServiceError::BadRequest(format!(
            "hint block {h} is past the device's {} blocks",
            geo.capacity_blocks()
        ))),
        _ => Ok(()),
    }
}

/// CPU time (user + system) this process has used, in nanoseconds.
fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

fn to_pb(e: Extent) -> pb::Extent {
    pb::Extent {
        start: e.start(),
        len: e.len(),
    }
}

impl Server {
    /// A server over `devices` (at least one; names unique).
    ///
    /// # Errors
    /// [`ServeError::Devices`].
    pub fn new(devices: Vec<ServedDevice>, cfg: Config) -> Result<Server, ServeError> {
        Server::with_tenants(devices, cfg, Tenants::default())
    }

    /// A server over `devices` for `tenants` (none: an open server, as
    /// [`Server::new`]). With tenants every device needs an ownership file
    /// ([`ServedDevice::with_owners_file`]); each is loaded and checked
    /// against the device's allocations.
    ///
    /// # Errors
    /// [`ServeError::Devices`] (also for a tenant restricted to a device
    /// that is not served), [`ServeError::Ownership`].
    pub fn with_tenants(
        devices: Vec<ServedDevice>,
        cfg: Config,
        tenants: Tenants,
    ) -> Result<Server, ServeError> {
        if devices.is_empty() {
            return Err(ServeError::Devices("no device to serve".into()));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].iter().any(|o| o.name == d.name) {
                return Err(ServeError::Devices(format!(
                    "two devices are named {:?}",
                    d.name
                )));
            }
        }
        // Each device's epoch goes up, and its journaled leases take their
        // space back before anything else (a tenant's pool) can.
        let mut found = Vec::with_capacity(devices.len());
        for d in &devices {
            found.push(restore(d)?);
        }
        if !tenants.is_empty() {
            attach_owners(&devices, &tenants, cfg.region_bytes)?;
        }
        if devices.len() > usize::from(u16::MAX) {
            return Err(ServeError::Devices(format!(
                "{} devices; a server serves at most {}",
                devices.len(),
                u16::MAX
            )));
        }
        let devices: Vec<Arc<ServedDevice>> = devices.into_iter().map(Arc::new).collect();
        let mut owners = Vec::with_capacity(devices.len());
        for ((i, d), (leases, ended, requests)) in devices.iter().enumerate().zip(found) {
            let leases = homes(d, &tenants, leases)?;
            let restored = Restored {
                leases,
                ended,
                requests,
            };
            let (tx, rx) = mpsc::channel();
            owner::spawn(i, Arc::clone(d), cfg.clone(), restored, rx).map_err(ServeError::Owner)?;
            owners.push(tx);
        }
        Ok(Server {
            inner: Arc::new(Inner {
                devices,
                owners,
                limiter: Limiter::new(cfg.limits.clone()),
                cfg,
                tenants: Arc::new(tenants),
                closing: tokio::sync::watch::Sender::new(false),
                metrics: std::sync::OnceLock::new(),
                fence: std::sync::OnceLock::new(),
                topology: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Makes every call UNAVAILABLE ([`ServiceError::SelfFenced`]) while
    /// `fence` says so: checked when a call is admitted and again after its
    /// device answered, before the reply leaves, so that nothing is
    /// acknowledged once the check turns true (a call that ran is durable
    /// and, resent with its request id to the device's next owner, gets the
    /// same result). Set once; later calls are ignored.
    pub fn fence_with(&self, fence: Fence) {
        // The stores write nothing either while it holds (lease expiries,
        // checkpoints and closes included).
        for d in &self.inner.devices {
            d.store.set_fence(Arc::clone(&fence));
        }
        let _ = self.inner.fence.set(fence);
    }

    /// Serves `WatchTopology` from `topology`: the cluster as this server
    /// follows it in etcd. Without it the call is FAILED_PRECONDITION.
    pub fn topology_from(&self, topology: tokio::sync::watch::Receiver<pb::Topology>) {
        let _ = self.inner.topology.set(topology);
    }

    fn fenced(&self) -> Result<(), ServiceError> {
        if self.is_fenced() {
            return Err(ServiceError::SelfFenced);
        }
        Ok(())
    }

    /// Whether the fence ([`fence_with`](Self::fence_with)) refuses calls now.
    pub fn is_fenced(&self) -> bool {
        self.inner.fence.get().is_some_and(|f| f())
    }

    /// Whether a fence was set.
    pub(crate) fn has_fence(&self) -> bool {
        self.inner.fence.get().is_some()
    }

    /// The served devices, in index order.
    pub fn devices(&self) -> &[Arc<ServedDevice>] {
        &self.inner.devices
    }

    /// The server's tunables.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// The interceptor that authenticates this server's callers.
    pub(crate) fn authenticator(&self) -> Authenticate {
        Authenticate {
            tenants: Arc::clone(&self.inner.tenants),
        }
    }

    /// The limits this server enforces.
    pub(crate) fn limits(&self) -> &crate::limits::Limits {
        self.inner.limiter.limits()
    }

    /// Ends the `WatchRecalls` streams and has the `Calls` streams send
    /// their stop notice, refuse what they read from then on and end once
    /// their clients close their side ([`Config::stop_grace`] at most),
    /// which would otherwise keep the transport from finishing its calls.
    pub(crate) fn end_watches(&self) {
        for d in &self.inner.devices {
            d.recalls.send_modify(|r| r.closed = true);
        }
        self.inner.closing.send_replace(true);
    }

    /// Counts the calls of `Calls` streams in `metrics` (the transport
    /// counts each stream once, as a `Calls` call).
    pub(crate) fn observe(&self, metrics: Metrics) {
        let _ = self.inner.metrics.set(metrics);
    }

    /// One call read from a `Calls` stream, from the stream's caller: its
    /// own admission turn, then the same work as the unary call's.
    /// Past the request timeout the call is answered CANCELLED, as a unary
    /// call is (an operation on the device that started still completes).
    async fn stream_call(
        &self,
        who: &Result<Caller, Status>,
        msg: pb::CallRequest,
    ) -> pb::CallReply {
        use pb::call_reply::Result as Reply;
        use pb::call_request::Call;
        let t = Instant::now();
        let id = msg.id;
        let method = call_method(&msg);
        let run = async move {
            let Some(call) = msg.call else {
                return Err(Status::invalid_argument(
                    "a CallRequest with no call (Allocate, Free or Commit)",
                ));
            };
            let who = who.as_ref().map_err(Clone::clone)?;
            let _turn = self.admit_caller(who).await?;
            let tenant = who.tenant.clone();
            match call {
                Call::Allocate(a) => self.run_allocate(tenant, a).await.map(Reply::Allocate),
                Call::Free(f) => self.run_free(tenant, f).await.map(Reply::Free),
                Call::Commit(c) => self.run_commit(tenant, c).await.map(Reply::Commit),
            }
        };
        let result = tokio::time::timeout(self.limits().request_timeout, run)
            .await
            .unwrap_or_else(|_| Err(Status::cancelled("Timeout expired")));
        if let Some(m) = self.inner.metrics.get() {
            let code = result
                .as_ref()
                .map_or_else(Status::code, |_| tonic::Code::Ok);
            m.record(method, code, t.elapsed());
            if let Err(s) = &result {
                m.log_failure(method, s);
            }
        }
        pb::CallReply {
            id,
            result: Some(result.unwrap_or_else(|s| Reply::Error(details::call_error(&s)))),
        }
    }

    /// The rest of a `Calls` stream once a graceful stop began: tells the
    /// client with the stop notice (id 0, UNAVAILABLE) to close its side,
    /// and answers every call it still reads UNAVAILABLE without running
    /// it, until the client closes its side or goes away, at most
    /// `stop_grace`. Reading on (rather than ending the stream at once)
    /// is what lets every call the client sent get its reply: the calls
    /// taken before finish and are answered; the later ones surely did not
    /// run.
    async fn refuse_calls(
        &self,
        mut inbound: tonic::Streaming<pb::CallRequest>,
        tx: tokio::sync::mpsc::Sender<Result<pb::CallReply, Status>>,
    ) {
        use pb::call_reply::Result as Reply;
        let refusal = || {
            Some(Reply::Error(details::call_error(&Status::unavailable(
                STOPPING,
            ))))
        };
        let until = tokio::time::sleep(self.inner.cfg.stop_grace);
        tokio::pin!(until);
        let notice = pb::CallReply {
            id: 0,
            result: refusal(),
        };
        tokio::select! {
            _ = tx.send(Ok(notice)) => {}
            () = &mut until => return,
        }
        loop {
            let msg = tokio::select! {
                m = inbound.message() => m,
                () = &mut until => {
                    tracing::warn!(
                        grace_ms = self.inner.cfg.stop_grace.as_millis() as u64,
                        "shutdown: a Calls stream still open past stop_grace is ended"
                    );
                    return;
                }
            };
            let Some(msg) = call_read(msg, &tx).await else {
                return;
            };
            if let Some(m) = self.inner.metrics.get() {
                m.record(call_method(&msg), tonic::Code::Unavailable, Duration::ZERO);
            }
            let reply = pb::CallReply {
                id: msg.id,
                result: refusal(),
            };
            tokio::select! {
                _ = tx.send(Ok(reply)) => {}
                () = &mut until => return,
            }
        }
    }

    /// Ends every lease and closes every store (a final checkpoint and the
    /// close record; later writes are refused): the last step of a graceful
    /// stop, after the transport has finished its calls. Each device's owner
    /// does it and stops.
    pub(crate) async fn close(&self) -> Result<(), ServeError> {
        let mut ended = 0;
        for tx in &self.inner.owners {
            let (reply, rx) = tokio::sync::oneshot::channel();
            if tx.send(Command::EndLeases { reply }).is_ok() {
                ended += rx.await.unwrap_or(0);
            }
        }
        tracing::info!(leases = ended, "shutdown: leases released");
        let mut first_error = None;
        for (d, tx) in self.inner.devices.iter().zip(&self.inner.owners) {
            let (reply, rx) = tokio::sync::oneshot::channel();
            if tx.send(Command::Close { reply }).is_err() {
                continue;
            }
            match rx.await {
                Ok(Ok(())) => tracing::info!(device = %d.name, "shutdown: closed"),
                Ok(Err(source)) => {
                    first_error.get_or_insert(ServeError::Close {
                        device: d.name.clone(),
                        source,
                    });
                }
                Err(_) => {
                    first_error.get_or_insert(ServeError::Devices(format!(
                        "closing {}: its owner thread failed",
                        d.name
                    )));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Sends a command to device `i`'s owner and waits for its reply.
    async fn ask<T>(&self, i: usize, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Status> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let queued = &self.inner.devices[i].queued;
        queued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.inner.owners[i].send(make(reply)).is_err() {
            queued.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            return Err(ServiceError::ShuttingDown.into());
        }
        match rx.await {
            Ok(r) => {
                self.fenced()?;
                r
            }
            // The owner dropped the command unanswered: it stopped
            // (shutdown), or a bug failed its round.
            Err(_) => Err(Status::internal(format!(
                "device {} dropped the call unanswered (the server is stopping, or a fault; see its log)",
                self.inner.devices[i].name
            ))),
        }
    }

    /// The device index of lease `id` (its id carries it).
    fn lease_device(&self, id: u64) -> Result<usize, ServiceError> {
        let i = usize::from(LeaseId::of(id).device);
        if i >= self.inner.devices.len() {
            return Err(ServiceError::UnknownLease(id));
        }
        Ok(i)
    }

    /// Refuses a request of a caller that has seen a newer epoch of device
    /// `i` than this server's: this server is a stale owner.
    fn check_epoch(&self, i: usize, seen: u64) -> Result<u64, ServiceError> {
        self.fenced()?;
        let d = &self.inner.devices[i];
        let epoch = d.epoch();
        if seen > epoch {
            return Err(ServiceError::Fenced {
                device: d.name.clone(),
                epoch,
                seen,
            });
        }
        Ok(epoch)
    }

    /// Allocate's work once the call is admitted, unary or on a
    /// `Calls` stream.
    async fn run_allocate(
        &self,
        who: Option<Arc<Tenant>>,
        r: pb::AllocateRequest,
    ) -> Result<pb::AllocateResponse, Status> {
        let (i, dev) = self.device_for(r.device.as_ref(), who.as_deref())?;
        let epoch = self.check_epoch(i, r.epoch)?;
        let geo = dev.store.geometry();
        self.check_batch(r.count as usize, "count")?;
        let blocks = match r.size {
            Some(pb::allocate_request::Size::Blocks(b)) => b,
            Some(pb::allocate_request::Size::Bytes(b)) => b.div_ceil(geo.block_size()),
            None => 0,
        };
        if blocks == 0 {
            return Err(ServiceError::BadRequest("object size is zero (or unset)".into()).into());
        }
        check_hint(r.hint, geo)?;
        let ask = AllocateAsk {
            count: r.count,
            blocks,
            scattered: r.scattered,
            hint: r.hint,
            max_reply: self.inner.limiter.limits().max_message_bytes,
        };
        let request = (r.request_id != 0).then(|| {
            let mut contents = Vec::with_capacity(32);
            contents.extend_from_slice(&r.count.to_le_bytes());
            contents.extend_from_slice(&blocks.to_le_bytes());
            contents.push(u8::from(r.scattered));
            contents.extend_from_slice(&r.hint.map_or(u64::MAX, |h| h).to_le_bytes());
            RequestId::new(r.request_id, tenant_name(who.as_deref()), &contents)
        });
        let home = dev.home(who.as_ref());
        let out = self
            .ask(i, |reply| Command::Allocate {
                home,
                ask,
                request,
                reply,
            })
            .await?;
        Ok(pb::AllocateResponse {
            epoch,
            free_blocks: dev.store.free_blocks(),
            ..out
        })
    }

    /// Free's work once the call is admitted, unary or on a
    /// `Calls` stream.
    async fn run_free(
        &self,
        who: Option<Arc<Tenant>>,
        r: pb::FreeRequest,
    ) -> Result<pb::FreeResponse, Status> {
        let (i, dev) = self.device_for(r.device.as_ref(), who.as_deref())?;
        let epoch = self.check_epoch(i, r.epoch)?;
        self.check_batch(r.extents.len(), "extents")?;
        let extents = disjoint_extents(&r.extents, dev.store.geometry().capacity_blocks(), "free")?;
        let request = (r.request_id != 0).then(|| {
            let mut contents = Vec::with_capacity(16 * extents.len());
            for e in &extents {
                contents.extend_from_slice(&e.start().to_le_bytes());
                contents.extend_from_slice(&e.len().to_le_bytes());
            }
            RequestId::new(r.request_id, tenant_name(who.as_deref()), &contents)
        });
        let home = dev.home(who.as_ref());
        let (blocks, replayed) = self
            .ask(i, |reply| Command::Free {
                home,
                extents,
                request,
                reply,
            })
            .await?;
        Ok(pb::FreeResponse {
            blocks,
            replayed,
            epoch,
            free_blocks: dev.store.free_blocks(),
        })
    }

    /// Commit's work once the call is admitted, unary or on a
    /// `Calls` stream.
    async fn run_commit(
        &self,
        who: Option<Arc<Tenant>>,
        r: pb::CommitRequest,
    ) -> Result<pb::CommitResponse, Status> {
        self.check_batch(r.allocations.len() + r.frees.len(), "allocations + frees")?;
        if r.sequence == 0 {
            return Err(ServiceError::BadRequest("sequence numbers start at 1".into()).into());
        }
        let i = self.lease_device(r.lease_id)?;
        let epoch = self.check_epoch(i, r.epoch)?;
        let cap = self.inner.devices[i].store.geometry().capacity_blocks();
        let batch = CommitBatch {
            allocs: disjoint_extents(&r.allocations, cap, "allocation")?,
            frees: disjoint_extents(&r.frees, cap, "free")?,
            recycle: r.recycle_frees,
            fragments: r.fragment_blocks,
        };
        let out = self
            .ask(i, |reply| Command::Commit {
                lease: r.lease_id,
                scope: scope_of(who.as_deref()),
                seq: r.sequence,
                batch,
                reply,
            })
            .await?;
        Ok(pb::CommitResponse {
            unused_blocks: out.unused_blocks,
            replayed: out.replayed,
            recall: out.recall,
            recycled: out.recycled.into_iter().map(to_pb).collect(),
            grantable_blocks: out.grantable,
            epoch,
            ttl_ms: out.ttl.as_millis() as u64,
            margin_ms: self.inner.cfg.lease_margin().as_millis() as u64,
        })
    }

    fn device(
        &self,
        r: Option<&pb::DeviceRef>,
    ) -> Result<(usize, Arc<ServedDevice>), ServiceError> {
        let devs = &self.inner.devices;
        let found = match r.and_then(|r| r.r#ref.as_ref()) {
            None => Some(0),
            Some(pb::device_ref::Ref::Index(i)) => {
                let i = *i as usize;
                (i < devs.len()).then_some(i)
            }
            Some(pb::device_ref::Ref::Name(n)) => devs.iter().position(|d| &d.name == n),
        };
        match found {
            Some(i) => Ok((i, Arc::clone(&devs[i]))),
            None => Err(ServiceError::UnknownDevice(
                match r.and_then(|r| r.r#ref.as_ref()) {
                    Some(pb::device_ref::Ref::Index(i)) => format!("#{i}"),
                    Some(pb::device_ref::Ref::Name(n)) => quoted(n),
                    None => "#0".into(),
                },
            )),
        }
    }

    /// Admits a call: finds its tenant (on a server with tenants) and
    /// waits for the caller's turn (see [`crate::Limits`]), which counts
    /// against the tenant, else against the client's identity.
    async fn admit<T>(
        &self,
        req: &Request<T>,
    ) -> Result<(Turn, Option<Arc<Tenant>>), ServiceError> {
        let who = Caller::of(req)?;
        let turn = self.admit_caller(&who).await?;
        Ok((turn, who.tenant))
    }

    /// Waits for `who`'s turn (see [`crate::Limits`]).
    async fn admit_caller(&self, who: &Caller) -> Result<Turn, ServiceError> {
        self.inner.limiter.turn(who.id.clone()).await
    }

    /// [`Server::device`], for a caller that may use it.
    fn device_for(
        &self,
        r: Option<&pb::DeviceRef>,
        t: Option<&Tenant>,
    ) -> Result<(usize, Arc<ServedDevice>), ServiceError> {
        let (i, d) = self.device(r)?;
        d.check_tenant(t)?;
        Ok((i, d))
    }

    fn check_batch(&self, n: usize, what: &str) -> Result<(), ServiceError> {
        if n == 0 {
            return Err(ServiceError::BadRequest(format!("{what}: empty batch")));
        }
        if n > self.inner.cfg.max_batch {
            return Err(ServiceError::BadRequest(format!(
                "{what}: {n} is more than the limit of {} per call",
                self.inner.cfg.max_batch
            )));
        }
        Ok(())
    }
}

/// A lease journaled on a device, with the space it holds again (home
/// still to find).
type Found = crate::leases::RestoredLease;

/// Takes device `d` over: raises its owner epoch (durably), and takes back
/// the space of its journaled leases; returns them and its window of
/// per-call results.
#[allow(clippy::type_complexity)]
fn restore(
    d: &ServedDevice,
) -> Result<(Vec<Found>, Vec<(u64, CommitRecord)>, Requests), ServeError> {
    let bad = |why: String| ServeError::Devices(format!("device {}: {why}", d.name));
    let epoch = records::raise_epoch(&d.store, d.min_epoch).map_err(bad)?;
    d.set_epoch(epoch);
    let mut found = Vec::new();
    let mut commits = std::collections::HashMap::new();
    let mut requests = Vec::new();
    // Every record's extents, to sort: what two leases list goes to the
    // one whose record came last.
    let mut claims: Vec<(u64, u64, Vec<Extent>)> = Vec::new();
    let mut deltas: std::collections::HashMap<u64, Vec<Vec<u8>>> = Default::default();
    for (key, value) in d.store.records() {
        if let Some(r) = records::decode_delta(&key, &value) {
            let (id, order, extents) =
                r.map_err(|why| bad(format!("the journal's record of a lease: {why}")))?;
            claims.push((order, id, extents));
            deltas.entry(id).or_default().push(key);
        } else if let Some(r) = LeaseRecord::decode(&key, &value) {
            found.push(r.map_err(|why| bad(format!("the journal's record of a lease: {why}")))?);
        } else if let Some(r) = CommitRecord::decode(&key, &value) {
            let (id, c) =
                r.map_err(|why| bad(format!("the journal's record of a commit: {why}")))?;
            commits.insert(id, c);
        } else if let Some(r) = RequestRecord::decode(&key, &value) {
            let (_, _, rec) =
                r.map_err(|why| bad(format!("the journal's record of a call: {why}")))?;
            requests.push((key, rec));
        }
    }
    claims.extend(found.iter().map(|r| (r.order, r.id, r.held.clone())));
    claims.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
    let mut leases: std::collections::HashMap<u64, Found> = found
        .into_iter()
        .map(|rec| {
            let id = rec.id;
            let r = crate::leases::RestoredLease {
                last: commits.remove(&id),
                deltas: deltas.remove(&id).unwrap_or_default(),
                order: rec.order,
                rec,
                res: d.store.empty_reservation(),
                home: None,
            };
            (id, r)
        })
        .collect();
    let mut orphans = Vec::new();
    for (order, id, extents) in claims {
        let Some(l) = leases.get_mut(&id) else {
            continue;
        };
        l.order = l.order.max(order);
        for e in extents {
            l.res
                .take_range(e)
                .map_err(|e| bad(format!("the journal's record of lease {id}: {e}")))?;
        }
    }
    // `H` records of a lease that ended (deleted a round after it).
    for keys in deltas.into_values() {
        orphans.extend(keys);
    }
    if !orphans.is_empty() {
        let mut t = d.store.begin();
        for k in &orphans {
            let _ = t.delete_record(k);
        }
        t.commit()
            .map_err(|e| bad(format!("cannot delete records of ended leases: {e}")))?;
    }
    let leases = leases.into_values().collect();
    // Commit records left without their lease: the lease had ended.
    let ended = commits.into_iter().collect();
    Ok((leases, ended, Requests::restored(requests)))
}

/// The homes of device `d`'s journaled leases (their tenants' pools, on a
/// server with tenants); a lease whose tenant is no longer this server's
/// (or a tenant's lease on a server without tenants, or the reverse) ends:
/// its space is free again and its record goes.
fn homes(
    d: &ServedDevice,
    tenants: &Tenants,
    found: Vec<Found>,
) -> Result<Vec<crate::leases::RestoredLease>, ServeError> {
    let mut out = Vec::with_capacity(found.len());
    let mut gone = d.store.begin();
    for mut r in found {
        let tenant = tenants.by_name(&r.rec.tenant);
        let home = d.home(tenant);
        let kept = match (&home, r.rec.tenant.is_empty()) {
            (None, true) => d.owners.get().is_none(),
            (Some(_), false) => true,
            _ => false,
        };
        if !kept {
            tracing::warn!(
                device = %d.name,
                lease = r.rec.id,
                tenant = %r.rec.tenant,
                "a journaled lease's tenant is not this server's: the lease ends"
            );
            let _ = gone.delete_record(&lease_key(r.rec.id));
            let _ = gone.delete_record(&commit_key(r.rec.id));
            for k in &r.deltas {
                let _ = gone.delete_record(k);
            }
            r.res.cancel();
            continue;
        }
        if let Some(h) = &home {
            h.owners.adopt_lease(&h.tenant, r.res.blocks());
        }
        r.home = home;
        out.push(r);
    }
    gone.commit()
        .map_err(|e| ServeError::Devices(format!("device {}: {e}", d.name)))?;
    Ok(out)
}

/// Completes once `server`'s fence refuses calls (looked at every 100
/// ms, as health follows it); never without a fence.
async fn fenced(server: &Server) {
    if !server.has_fence() {
        return std::future::pending().await;
    }
    while !server.is_fenced() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The name a caller's request ids are kept under: its tenant's (none on
/// a server without tenants).
fn tenant_name(t: Option<&Tenant>) -> &str {
    t.map_or("", |t| t.name.as_str())
}

/// Loads the ownership of every device for `tenants`.
fn attach_owners(
    devices: &[ServedDevice],
    tenants: &Tenants,
    region_bytes: u64,
) -> Result<(), ServeError> {
    for t in tenants.iter() {
        for name in t.devices().unwrap_or_default() {
            if !tenants.names_devices_elsewhere() && !devices.iter().any(|d| &d.name == name) {
                return Err(ServeError::Devices(format!(
                    "tenant {} is given device {name:?}, which is not served",
                    t.name
                )));
            }
        }
    }
    for d in devices {
        let Some(path) = &d.owners_file else {
            return Err(ServeError::Devices(format!(
                "device {} has no ownership file, which a server with tenants needs",
                d.name
            )));
        };
        let owners = DeviceOwners::load(&d.name, &d.store, path, tenants, region_bytes)?;
        let _ = d.owners.set(Arc::new(owners));
    }
    Ok(())
}

/// The message of a `Calls` stream's stop notice, and of the calls it
/// reads once a stop began.
const STOPPING: &str =
    "the server is stopping: the call did not run; send it again to another server or once this one is back";

/// The method a `Calls` request carries, for metrics and logs.
/// Who a call comes from: its tenant (on a server with tenants) and the
/// identity its turns count against. A `Calls` stream finds it once, from
/// the stream's metadata, for all its calls.
#[derive(Clone, Debug)]
struct Caller {
    tenant: Option<Arc<Tenant>>,
    id: Identity,
}

impl Caller {
    fn of<T>(req: &Request<T>) -> Result<Caller, ServiceError> {
        let tenant = caller(req);
        let id = match &tenant {
            Some(t) => Identity::tenant(&t.name),
            None => Identity::of(req)?,
        };
        Ok(Caller { tenant, id })
    }
}

fn call_method(msg: &pb::CallRequest) -> &'static str {
    use pb::call_request::Call;
    match &msg.call {
        Some(Call::Allocate(_)) => "Allocate",
        Some(Call::Free(_)) => "Free",
        Some(Call::Commit(_)) => "Commit",
        None => "unknown",
    }
}

/// The replies of a `Calls` stream.
type CallReplies =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::CallReply, Status>> + Send>>;

/// The stream of a `WatchTopology` call.
type TopologyStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Topology, Status>> + Send>>;

/// The stream of a `WatchRecalls` call.
type RecallStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::RecallEvent, Status>> + Send>>;

#[tonic::async_trait]
impl AllocatorRpc for Server {
    type WatchRecallsStream = RecallStream;
    type WatchTopologyStream = TopologyStream;
    type CallsStream = CallReplies;

    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let (_turn, who) = self.admit(&req).await?;
        self.run_allocate(who, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn free(
        &self,
        req: Request<pb::FreeRequest>,
    ) -> Result<Response<pb::FreeResponse>, Status> {
        let (_turn, who) = self.admit(&req).await?;
        self.run_free(who, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let (_turn, who) = self.admit(&req).await?;
        let r = req.into_inner();
        let wanted: Vec<usize> = match r.device.as_ref() {
            Some(d) if d.r#ref.is_some() => vec![self.device_for(Some(d), who.as_deref())?.0],
            _ => (0..self.inner.devices.len())
                .filter(|&i| self.inner.devices[i].check_tenant(who.as_deref()).is_ok())
                .collect(),
        };
        let mut devices = Vec::with_capacity(wanted.len());
        let mut leases = Vec::new();
        for i in wanted {
            let tenant = who.clone();
            let (d, l) = self
                .ask(i, |reply| Command::Status {
                    tenant,
                    leases: r.leases,
                    reply,
                })
                .await?;
            devices.push(d);
            leases.extend(l);
        }
        Ok(Response::new(pb::StatusResponse {
            devices,
            server_cpu_ns: process_cpu_ns(),
            leases,
        }))
    }

    async fn lease(
        &self,
        req: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let (turn, who) = self.admit(&req).await?;
        let r = req.into_inner();
        let (i, dev) = self.device_for(r.device.as_ref(), who.as_deref())?;
        let epoch = self.check_epoch(i, r.epoch)?;
        let geo = dev.store.geometry();
        if r.min_blocks == 0 {
            return Err(ServiceError::BadRequest("min_blocks is zero".into()).into());
        }
        if r.client_id.len() > MAX_CLIENT_ID {
            return Err(ServiceError::BadRequest(format!(
                "client_id is longer than {MAX_CLIENT_ID} bytes"
            ))
            .into());
        }
        check_hint(r.hint, geo)?;
        // An extension adds to a lease that holds a slot already.
        let extend = (r.extend_lease_id != 0).then_some(r.extend_lease_id);
        if let Some(id) = extend {
            if let Ok(j) = self.lease_device(id) {
                if j != i {
                    return Err(ServiceError::BadRequest(format!(
                        "lease {id} is on device {}, not on {}; extend it on its own device",
                        self.inner.devices[j].name, dev.name
                    ))
                    .into());
                }
            }
        }
        let slot = match extend {
            None => Some(self.inner.limiter.lease_slot(turn.who())?),
            Some(_) => None,
        };
        let ask = LeaseAsk {
            client: r.client_id,
            min: r.min_blocks,
            want: r.want_blocks,
            hint: r.hint,
            extend,
        };
        let home = dev.home(who.as_ref());
        let g = self
            .ask(i, |reply| Command::Lease {
                home,
                ask,
                slot,
                reply,
            })
            .await?;
        Ok(Response::new(pb::LeaseResponse {
            lease_id: g.id,
            extents: g.extents.into_iter().map(to_pb).collect(),
            ttl_ms: g.ttl.as_millis() as u64,
            block_size: geo.block_size(),
            capacity_blocks: geo.capacity_blocks(),
            device_index: i as u32,
            grantable_blocks: g.grantable,
            epoch,
            margin_ms: self.inner.cfg.lease_margin().as_millis() as u64,
        }))
    }

    async fn commit(
        &self,
        req: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        let (_turn, who) = self.admit(&req).await?;
        self.run_commit(who, req.into_inner())
            .await
            .map(Response::new)
    }

    async fn renew(
        &self,
        req: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let (_turn, who) = self.admit(&req).await?;
        let r = req.into_inner();
        let i = self.lease_device(r.lease_id)?;
        let epoch = self.check_epoch(i, r.epoch)?;
        let out = self
            .ask(i, |reply| Command::Renew {
                lease: r.lease_id,
                scope: scope_of(who.as_deref()),
                fragments: r.fragment_blocks,
                reply,
            })
            .await?;
        Ok(Response::new(pb::RenewResponse {
            ttl_ms: out.ttl.as_millis() as u64,
            recall: out.recall,
            unused_blocks: out.unused_blocks,
            grantable_blocks: out.grantable,
            epoch,
            margin_ms: self.inner.cfg.lease_margin().as_millis() as u64,
        }))
    }

    async fn watch_recalls(
        &self,
        req: Request<pb::WatchRecallsRequest>,
    ) -> Result<Response<RecallStream>, Status> {
        use tokio_stream::StreamExt;
        // The turn is for taking the call in, not for the stream's life.
        let (_turn, who) = self.admit(&req).await?;
        let r = req.into_inner();
        let (i, d) = self.device_for(r.device.as_ref(), who.as_deref())?;
        // The caller hears of its own scope's recalls: its tenant's, or
        // everyone's on a server without tenants.
        let scope = scope_of(who.as_deref());
        let signals = tokio_stream::wrappers::WatchStream::new(d.recalls.subscribe());
        let mut seen: Option<u64> = None;
        let events = signals
            .map_while(|s: RecallSignal| (!s.closed).then_some(s))
            .filter_map(move |s| {
                // The first message is the state now; then one per recall
                // of this scope that starts.
                let started = s.started.get(&scope).copied().unwrap_or(0);
                let tell = seen.is_none_or(|n| started > n);
                seen = Some(started);
                tell.then(|| {
                    Ok(pb::RecallEvent {
                        device_index: i as u32,
                        recall: s.recalling(scope, Instant::now()),
                    })
                })
            });
        Ok(Response::new(Box::pin(events)))
    }

    async fn watch_topology(
        &self,
        req: Request<pb::WatchTopologyRequest>,
    ) -> Result<Response<TopologyStream>, Status> {
        let (_turn, who) = self.admit(&req).await?;
        let Some(topology) = self.inner.topology.get() else {
            return Err(Status::failed_precondition(
                "this server is not in a cluster (serve --etcd ENDPOINTS --cluster NAME)",
            ));
        };
        // A fenced member's view of the cluster may be stale: its clients
        // go to another member.
        self.fenced()?;
        let mut topology = topology.clone();
        let mut closing = self.inner.closing.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let server = self.clone();
        tokio::spawn(async move {
            loop {
                let mut t = topology.borrow_and_update().clone();
                // A tenant sees the devices it may use.
                if let Some(who) = &who {
                    t.devices.retain(|d| who.may_use(&d.name));
                }
                // Revision 0: the cluster was not read yet.
                if t.revision > 0 && tx.send(Ok(t)).await.is_err() {
                    return;
                }
                let fence = tokio::select! {
                    r = topology.changed() => if r.is_err() { return } else { false },
                    _ = closing.wait_for(|c| *c) => return,
                    () = tx.closed() => return,
                    () = fenced(&server) => true,
                };
                if fence {
                    let _ = tx.send(Err(ServiceError::SelfFenced.into())).await;
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn calls(
        &self,
        req: Request<tonic::Streaming<pb::CallRequest>>,
    ) -> Result<Response<CallReplies>, Status> {
        // Each call takes its own admission turn, as a unary call does; the
        // stream holds none.
        // A stream runs at most as many calls at once as a connection may
        // carry unary calls (the same bound on the memory its requests
        // hold), and reads no more of it until one is answered.
        let in_flight = (self.limits().max_streams_per_connection as usize).max(1);
        // Found once, from the stream's metadata; a caller that cannot be
        // told has each of its calls refused, as its unary calls would be.
        let who = Arc::new(Caller::of(&req).map_err(Status::from));
        let mut inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(in_flight);
        let slots = Arc::new(tokio::sync::Semaphore::new(in_flight));
        let mut closing = self.inner.closing.subscribe();
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                let slot = tokio::select! {
                    s = Arc::clone(&slots).acquire_owned() => s.expect("the semaphore is never closed"),
                    _ = closing.wait_for(|c| *c) => break,
                };
                let msg = tokio::select! {
                    m = inbound.message() => m,
                    _ = closing.wait_for(|c| *c) => break,
                };
                let Some(msg) = call_read(msg, &tx).await else {
                    return;
                };
                let (this, tx, who) = (this.clone(), tx.clone(), Arc::clone(&who));
                tokio::spawn(async move {
                    let reply = this.stream_call(&who, msg).await;
                    // A client that left no longer reads its replies.
                    let _ = tx.send(Ok(reply)).await;
                    drop(slot);
                });
            }
            this.refuse_calls(inbound, tx).await;
            // The stream ends once every call read is answered (each task
            // holds a sender).
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let (_turn, who) = self.admit(&req).await?;
        let r = req.into_inner();
        let i = self.lease_device(r.lease_id)?;
        let epoch = self.check_epoch(i, r.epoch)?;
        let n = self
            .ask(i, |reply| Command::Release {
                lease: r.lease_id,
                scope: scope_of(who.as_deref()),
                reply,
            })
            .await?;
        Ok(Response::new(pb::ReleaseResponse {
            released_blocks: n,
            epoch,
        }))
    }
}

/// The call a `Calls` stream read, or `None` when the stream is over: the
/// client closed its side or went away, or its bytes were no call (that
/// error is its last reply).
async fn call_read(
    msg: Result<Option<pb::CallRequest>, Status>,
    tx: &tokio::sync::mpsc::Sender<Result<pb::CallReply, Status>>,
) -> Option<pb::CallRequest> {
    match msg {
        Ok(m) => m,
        Err(s) => {
            let _ = tx.send(Err(s)).await;
            None
        }
    }
}
