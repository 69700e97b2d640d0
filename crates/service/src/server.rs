//! [`Server`]: the gRPC service over one or more stores, its lease expiry
//! task, the health service, and graceful shutdown.
//!
//! The server translates requests and checks their shape; the store decides
//! about space (allocate, free, reserve, publish) and the lease table about
//! leases. Calls that wait for the device (every durable one) run on
//! tokio's blocking pool, so a device sync never stalls the reactor, and
//! concurrent calls share syncs through the store's group commit.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use blockalloc::Extent;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::config::Config;
use crate::error::ServiceError;
use crate::leases::{Leases, ServedDevice};
use crate::pb;
use crate::pb::allocator_server::{Allocator as AllocatorRpc, AllocatorServer};

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
    leases: Leases,
    cfg: Config,
}

/// Why a server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// No device, or two devices with one name.
    #[error("bad device list: {0}")]
    Devices(String),
    /// The transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A store could not checkpoint at shutdown (its commits are durable in
    /// the journal all the same).
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

fn to_pb(e: Extent) -> pb::Extent {
    pb::Extent {
        start: e.start(),
        len: e.len(),
    }
}

/// Runs a blocking closure on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ServiceError> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(Status::from),
        Err(e) => Err(Status::internal(format!("request task failed: {e}"))),
    }
}

impl Server {
    /// A server over `devices` (at least one; names unique).
    ///
    /// # Errors
    /// [`ServeError::Devices`].
    pub fn new(devices: Vec<ServedDevice>, cfg: Config) -> Result<Server, ServeError> {
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
        Ok(Server {
            inner: Arc::new(Inner {
                devices: devices.into_iter().map(Arc::new).collect(),
                leases: Leases::new(cfg.clone()),
                cfg,
            }),
        })
    }

    /// The served devices, in index order.
    pub fn devices(&self) -> &[Arc<ServedDevice>] {
        &self.inner.devices
    }

    /// Serves on `listener` until `shutdown` completes, with the health
    /// service (`grpc.health.v1`) reporting SERVING meanwhile. Then ends
    /// every lease (their unused parts were never durable) and checkpoints
    /// every store, so the next open replays nothing.
    ///
    /// # Errors
    /// [`ServeError::Transport`], [`ServeError::Close`].
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter.set_serving::<AllocatorServer<Server>>().await;
        let expiry = {
            let inner = Arc::clone(&self.inner);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(inner.cfg.expiry_interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    inner.leases.expire(Instant::now());
                }
            })
        };
        let inner = Arc::clone(&self.inner);
        let r = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(AllocatorServer::new(self))
            .serve_with_incoming_shutdown(
                // Without TCP_NODELAY a small reply waits for the client's
                // delayed acknowledgement: tens of milliseconds per call.
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                shutdown,
            )
            .await;
        expiry.abort();
        reporter.set_not_serving::<AllocatorServer<Server>>().await;
        inner.leases.end_all();
        r?;
        for d in &inner.devices {
            let store = Arc::clone(&d.store);
            let name = d.name.clone();
            tokio::task::spawn_blocking(move || store.checkpoint())
                .await
                .map_err(|e| ServeError::Devices(format!("closing {name}: {e}")))?
                .map_err(|source| ServeError::Close {
                    device: d.name.clone(),
                    source,
                })?;
        }
        Ok(())
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
                    Some(pb::device_ref::Ref::Name(n)) => format!("{n:?}"),
                    None => "#0".into(),
                },
            )),
        }
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

/// The Status entry of device `i`.
fn status_of(i: usize, d: &ServedDevice) -> pb::DeviceStatus {
    let st = d.store.status();
    let leased = d.leased_unused_blocks();
    let cap = st.space.capacity_blocks;
    let free = st.space.free_blocks;
    pb::DeviceStatus {
        name: d.name.clone(),
        index: i as u32,
        block_size: st.geometry.block_size(),
        capacity_blocks: cap,
        used_blocks: cap - free - leased.min(cap - free),
        free_blocks: free,
        leased_unused_blocks: leased,
        leases: d.live_leases(),
        free_extents: st.space.free_extents,
        largest_free_extent: st.space.largest_free_extent,
        fragmentation: st.space.fragmentation,
        meta_blocks: st.meta_blocks,
    }
}

#[tonic::async_trait]
impl AllocatorRpc for Server {
    async fn allocate(
        &self,
        req: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let r = req.into_inner();
        let (_, dev) = self.device(r.device.as_ref())?;
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
        if let Some(h) = r.hint {
            if h > geo.capacity_blocks() {
                return Err(ServiceError::BadRequest(format!(
                    "hint block {h} is past the device's {} blocks",
                    geo.capacity_blocks()
                ))
                .into());
            }
        }
        let objects = blocking(move || {
            let mut txn = dev.store.begin();
            let mut objects = Vec::with_capacity(r.count as usize);
            let mut hint = r.hint;
            for _ in 0..r.count {
                let extents = if r.scattered {
                    txn.allocate_scattered(blocks)?
                } else {
                    let e = txn.allocate(blocks, hint)?;
                    hint = hint.map(|_| e.end());
                    vec![e]
                };
                objects.push(pb::Object {
                    extents: extents.into_iter().map(to_pb).collect(),
                });
            }
            txn.commit()?;
            Ok(objects)
        })
        .await?;
        Ok(Response::new(pb::AllocateResponse {
            objects,
            block_size: geo.block_size(),
        }))
    }

    async fn free(
        &self,
        req: Request<pb::FreeRequest>,
    ) -> Result<Response<pb::FreeResponse>, Status> {
        let r = req.into_inner();
        let (_, dev) = self.device(r.device.as_ref())?;
        self.check_batch(r.extents.len(), "extents")?;
        let list = extents(&r.extents, dev.store.geometry().capacity_blocks(), "free")?;
        let blocks = blocking(move || {
            let mut txn = dev.store.begin();
            let mut n = 0;
            for &e in &list {
                txn.free(e)?;
                n += e.len();
            }
            txn.commit()?;
            Ok(n)
        })
        .await?;
        Ok(Response::new(pb::FreeResponse { blocks }))
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let r = req.into_inner();
        let wanted: Vec<(usize, Arc<ServedDevice>)> = match r.device.as_ref() {
            Some(d) if d.r#ref.is_some() => vec![self.device(Some(d))?],
            _ => self.inner.devices.iter().cloned().enumerate().collect(),
        };
        // A store's status waits for its journal writer, which may be in
        // the middle of a device sync.
        let devices = blocking(move || {
            Ok(wanted
                .iter()
                .map(|(i, d)| status_of(*i, d))
                .collect::<Vec<_>>())
        })
        .await?;
        Ok(Response::new(pb::StatusResponse { devices }))
    }

    async fn lease(
        &self,
        req: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let r = req.into_inner();
        let (i, dev) = self.device(r.device.as_ref())?;
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
        if let Some(h) = r.hint {
            if h > geo.capacity_blocks() {
                return Err(ServiceError::BadRequest(format!(
                    "hint block {h} is past the device's {} blocks",
                    geo.capacity_blocks()
                ))
                .into());
            }
        }
        let inner = Arc::clone(&self.inner);
        let d = Arc::clone(&dev);
        // A grant reads the store's status, which waits for its journal
        // writer.
        let g = blocking(move || {
            inner
                .leases
                .grant(&d, i, &r.client_id, r.min_blocks, r.want_blocks, r.hint)
        })
        .await?;
        Ok(Response::new(pb::LeaseResponse {
            lease_id: g.id,
            extents: g.extents.into_iter().map(to_pb).collect(),
            ttl_ms: g.ttl.as_millis() as u64,
            block_size: geo.block_size(),
            capacity_blocks: geo.capacity_blocks(),
            device_index: i as u32,
        }))
    }

    async fn commit(
        &self,
        req: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        let r = req.into_inner();
        self.check_batch(r.allocations.len() + r.frees.len(), "allocations + frees")?;
        if r.sequence == 0 {
            return Err(ServiceError::BadRequest("sequence numbers start at 1".into()).into());
        }
        let dev = self.inner.leases.device_of(r.lease_id)?;
        let cap = dev.store.geometry().capacity_blocks();
        let allocs = extents(&r.allocations, cap, "allocation")?;
        let frees = extents(&r.frees, cap, "free")?;
        let inner = Arc::clone(&self.inner);
        let out =
            blocking(move || inner.leases.commit(r.lease_id, r.sequence, &allocs, &frees)).await?;
        Ok(Response::new(pb::CommitResponse {
            unused_blocks: out.unused_blocks,
            replayed: out.replayed,
            recall: out.recall,
        }))
    }

    async fn renew(
        &self,
        req: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let r = req.into_inner();
        // A commit of the same lease may hold its lock while it waits for
        // the device.
        let inner = Arc::clone(&self.inner);
        let out = blocking(move || inner.leases.renew(r.lease_id)).await?;
        Ok(Response::new(pb::RenewResponse {
            ttl_ms: out.ttl.as_millis() as u64,
            recall: out.recall,
            unused_blocks: out.unused_blocks,
        }))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let r = req.into_inner();
        let inner = Arc::clone(&self.inner);
        let n = blocking(move || inner.leases.release(r.lease_id)).await?;
        Ok(Response::new(pb::ReleaseResponse { released_blocks: n }))
    }
}
