//! Helpers of the service tests: an in-process server on `127.0.0.1:0`
//! over in-memory stores, and a raw HTTP/2 caller that sends any bytes as a
//! gRPC request.

#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockalloc_client::{Client, LeaseOptions, LeasingAllocator};
use blockalloc_service::pb;
use blockalloc_service::{Config, Launch, Metrics, ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::oneshot;
use tonic::Code;

/// A server task over in-memory devices; stopped gracefully by
/// [`TestServer::stop`], aborted on drop.
pub struct TestServer {
    pub addr: SocketAddr,
    pub server: Server,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(sizes: &[u64], cfg: Config) -> TestServer {
        TestServer::start_with_metrics(sizes, cfg).await.0
    }

    /// Serves `server` on a fresh loopback port.
    pub async fn serving(server: Server) -> TestServer {
        TestServer::serving_with_metrics(server).await.0
    }

    /// [`TestServer::serving`], with the server's metrics (serve them with
    /// [`Metrics::serve`]).
    pub async fn serving_with_metrics(server: Server) -> (TestServer, Metrics) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let launch = Launch::start(listener, server.config()).await.unwrap();
        let metrics = launch.metrics();
        // Open before the first call, which would otherwise find the
        // service still closed.
        launch.open(&server).await;
        let (tx, rx) = oneshot::channel();
        let s = server.clone();
        let task = tokio::spawn(async move {
            launch
                .serve(s, async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        let s = TestServer {
            addr,
            server,
            stop: Some(tx),
            task: Some(task),
        };
        (s, metrics)
    }

    /// [`TestServer::start`], with the server's metrics.
    pub async fn start_with_metrics(sizes: &[u64], cfg: Config) -> (TestServer, Metrics) {
        let devices = sizes
            .iter()
            .enumerate()
            .map(|(i, &bytes)| {
                let store = Store::format(MemDevice::new(bytes), FormatOptions::default()).unwrap();
                ServedDevice::new(format!("dev{i}"), Arc::new(store))
            })
            .collect();
        TestServer::serving_with_metrics(Server::new(devices, cfg).unwrap()).await
    }

    /// [`TestServer::start`], and a client of it: the setup of most tests.
    pub async fn start_with_client(sizes: &[u64], cfg: Config) -> (TestServer, Client) {
        let srv = TestServer::start(sizes, cfg).await;
        let c = srv.client().await;
        (srv, c)
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.addr.to_string()).await.unwrap()
    }

    pub fn store(&self, i: usize) -> &Arc<Store> {
        &self.server.devices()[i].store
    }

    /// Every device's Status, after checking every store's invariants.
    pub async fn state(&self) -> Vec<pb::DeviceStatus> {
        for d in self.server.devices() {
            d.store.verify().unwrap();
        }
        self.client().await.status().await.unwrap()
    }

    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Starts a recall on device 0 of a server without tenants as a real
/// shortage does: a per-call allocation of more than the unleased free
/// space, which a lease (taken here, and released once the recall runs)
/// could make up. Returns once the recall runs (at once when one runs
/// already); it lasts one TTL.
pub async fn start_a_recall(c: &Client) {
    let dev0 = Some(pb::DeviceRef {
        r#ref: Some(pb::device_ref::Ref::Index(0)),
    });
    let mut watch = c
        .rpc()
        .watch_recalls(pb::WatchRecallsRequest {
            device: dev0.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    if watch.message().await.unwrap().unwrap().recall {
        return;
    }
    let held = c
        .rpc()
        .lease(pb::LeaseRequest {
            device: dev0.clone(),
            client_id: "recall-trigger".into(),
            min_blocks: 16,
            want_blocks: 16,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let free = c.status().await.unwrap()[0].free_blocks;
    // An allocation that waits for the leases. It is not cancelled (a call
    // the client gave up on could still run once the lease is back, before
    // the server notices): once the recall runs, the lease goes back and
    // the allocation is awaited, then freed.
    let mut rpc = c.rpc();
    let short = tokio::spawn(async move {
        rpc.allocate(pb::AllocateRequest {
            device: dev0,
            count: 1,
            size: Some(pb::allocate_request::Size::Blocks(free + 1)),
            scattered: false,
            hint: None,
            ..Default::default()
        })
        .await
    });
    loop {
        let e = tokio::time::timeout(Duration::from_secs(30), watch.message())
            .await
            .expect("a recall starts")
            .unwrap()
            .expect("the stream stays open");
        if e.recall {
            break;
        }
    }
    c.rpc()
        .release(pb::ReleaseRequest {
            lease_id: held.lease_id,
            ..Default::default()
        })
        .await
        .unwrap();
    match short.await.unwrap() {
        Ok(r) => {
            let got: Vec<blockalloc::Extent> = r
                .into_inner()
                .objects
                .iter()
                .flat_map(|o| &o.extents)
                .map(|e| blockalloc::Extent::new(e.start, e.len).unwrap())
                .collect();
            c.free(&blockalloc_client::DeviceId::Index(0), &got)
                .await
                .unwrap();
        }
        // Not within the space the leases gave back.
        Err(s) => assert_eq!(s.code(), Code::ResourceExhausted, "{s}"),
    }
}

/// Small leases and quick expiry; leases that outlive any test that does
/// not wait for them to end, however loaded the machine (a test that needs
/// its leases alive fails on nothing but the load when they expire under
/// it). Tests that wait for an expiry use [`expiring`].
pub fn quick() -> Config {
    Config {
        lease_ttl: Duration::from_secs(60),
        expiry_interval: Duration::from_millis(50),
        lease_initial_blocks: 256,
        lease_max_blocks: 4096,
        ..Config::default()
    }
}

/// The lease TTL of [`expiring`].
pub const SHORT_TTL: Duration = Duration::from_millis(400);

/// [`quick`] with leases of [`SHORT_TTL`], for tests that wait for one to
/// expire. What such a test needs alive it sets up with [`before_expiry`].
pub fn expiring() -> Config {
    Config {
        lease_ttl: SHORT_TTL,
        ..quick()
    }
}

/// The lease TTL of [`renewing`].
pub const RENEWING_TTL: Duration = Duration::from_millis(1200);

/// [`quick`] with leases of [`RENEWING_TTL`], for tests that wait for a
/// leasing client's renewals (every third of the TTL). Such a test runs in
/// [`before_expiry`]: a renewal that a loaded machine delays by more than
/// two thirds of the TTL lets the lease expire.
pub fn renewing() -> Config {
    Config {
        lease_ttl: RENEWING_TTL,
        ..quick()
    }
}

/// Runs `setup` (which starts its own server) until a run succeeds, and
/// returns what it returned. A run that failed after more than `ttl` from
/// its start proves nothing (a loaded machine can delay it that long, and
/// the server may end any lease granted in it then) and is run again; one
/// that failed sooner fails the test, as every lease it took was still
/// live throughout.
pub async fn before_expiry<T, F, Fut>(ttl: Duration, mut setup: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    // A failure that is not the load's comes back in every run: the last
    // run's panic is the test's.
    const TRIES: usize = 10;
    for run in 1.. {
        let t = Instant::now();
        match tokio::spawn(setup()).await {
            Ok(v) => return v,
            Err(e) if e.is_panic() && t.elapsed() >= ttl && run < TRIES => {
                eprintln!("run {run} took {:?}, more than the TTL: again", t.elapsed());
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("{e}"),
        }
    }
    unreachable!()
}

/// The sum of the series of `metrics` whose line starts with `prefix`.
pub fn counted(metrics: &Metrics, prefix: &str) -> u64 {
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

/// Leases that expired on the server of `metrics` (not renewed within
/// their TTL).
pub fn expiries(metrics: &Metrics) -> u64 {
    counted(metrics, "blockalloc_lease_expiries_total")
}

/// Waits (at most a minute: a "never", not a bound on the time it takes)
/// until `cond` holds.
pub async fn wait_until<Fut: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> Fut) {
    let t = Instant::now();
    while !cond().await {
        assert!(t.elapsed() < Duration::from_secs(60), "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The Status of device `i`.
pub async fn status(c: &Client, i: usize) -> pb::DeviceStatus {
    c.status().await.unwrap()[i].clone()
}

/// A leasing allocator on device 0 that commits only when asked (or on
/// close), so that a test decides when a batch goes out.
pub fn committing_on_demand(c: &Client, min_blocks: u64) -> LeasingAllocator {
    LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    )
}

/// A raw lease on the default device, which must be granted.
pub async fn lease(c: &Client, min: u64, want: u64) -> pb::LeaseResponse {
    c.rpc()
        .lease(pb::LeaseRequest {
            device: None,
            client_id: "raw".into(),
            min_blocks: min,
            want_blocks: want,
            hint: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// A raw renewal, which must be accepted.
pub async fn renew(c: &Client, id: u64) -> pb::RenewResponse {
    c.rpc()
        .renew(pb::RenewRequest {
            lease_id: id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// A raw release, which must be accepted.
pub async fn release(c: &Client, id: u64) -> pb::ReleaseResponse {
    c.rpc()
        .release(pb::ReleaseRequest {
            lease_id: id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// An extent as the protocol spells it.
pub fn x(start: u64, len: u64) -> pb::Extent {
    pb::Extent { start, len }
}

/// A raw Commit of lease `id`, answered either way.
pub async fn commit(
    c: &Client,
    id: u64,
    seq: u64,
    allocs: Vec<pb::Extent>,
    frees: Vec<pb::Extent>,
) -> Result<pb::CommitResponse, tonic::Status> {
    c.rpc()
        .commit(pb::CommitRequest {
            lease_id: id,
            sequence: seq,
            allocations: allocs,
            frees,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// A gRPC message as framed on the wire: no compression, big-endian length.
pub fn frame(msg: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + msg.len());
    b.put_u8(0);
    b.put_u32(msg.len() as u32);
    b.put_slice(msg);
    b.freeze()
}

/// What came back for a raw call.
#[derive(Debug)]
pub struct RawReply {
    /// The HTTP status.
    pub http: u16,
    /// The gRPC status, from the headers (trailers-only reply) or the
    /// trailers.
    pub code: Option<Code>,
    /// The `grpc-message`, percent-decoded.
    pub message: String,
    /// The reply's body bytes.
    pub body: Vec<u8>,
}

/// One HTTP/2 connection that sends arbitrary bytes as gRPC requests.
pub struct RawConn {
    addr: SocketAddr,
    h2: h2::client::SendRequest<Bytes>,
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> RawConn {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (h2, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        RawConn { addr, h2 }
    }

    /// Settings the server announced, once a call has gone through.
    pub fn max_send_streams(&self) -> usize {
        self.h2.current_max_send_streams()
    }

    /// Starts a call of `method` with `headers` and sends nothing yet.
    pub async fn open(
        &mut self,
        method: &str,
        headers: &[(&str, &str)],
    ) -> (h2::client::ResponseFuture, h2::SendStream<Bytes>) {
        let mut req = http::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{}/blockalloc.v1.Allocator/{method}",
                self.addr
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut ready = self.h2.clone().ready().await.unwrap();
        ready.send_request(req.body(()).unwrap(), false).unwrap()
    }

    /// Sends `body` as the whole request of `method` and reads the reply.
    pub async fn call(&mut self, method: &str, body: Bytes) -> RawReply {
        self.call_with(method, &[], body).await
    }

    /// [`RawConn::call`] with extra request headers.
    pub async fn call_with(
        &mut self,
        method: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> RawReply {
        let (resp, mut send) = self.open(method, headers).await;
        send.send_data(body, true).unwrap();
        reply(resp).await
    }
}

/// Reads a reply to its end.
pub async fn reply(resp: h2::client::ResponseFuture) -> RawReply {
    let (parts, mut body) = resp.await.unwrap().into_parts();
    let grpc = |h: &http::HeaderMap| {
        h.get("grpc-status").map(|s| {
            let n: i32 = s.to_str().unwrap().parse().unwrap();
            (
                Code::from(n),
                h.get("grpc-message")
                    .map(|m| {
                        percent_encoding::percent_decode(m.as_bytes())
                            .decode_utf8_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default(),
            )
        })
    };
    let mut data = Vec::new();
    let mut status = grpc(&parts.headers);
    if status.is_none() {
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
        }
        status = body.trailers().await.unwrap().as_ref().and_then(grpc);
    }
    let (code, message) = match status {
        Some((c, m)) => (Some(c), m),
        None => (None, String::new()),
    };
    RawReply {
        http: parts.status.as_u16(),
        code,
        message,
        body: data,
    }
}

/// Holds every device sync while closed; counts the syncs waiting.
#[derive(Default)]
pub struct SyncGate {
    closed: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    /// Syncs waiting at the gate.
    pub waiting: std::sync::atomic::AtomicUsize,
}

impl SyncGate {
    /// Closes (`true`) or opens the gate.
    pub fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }

    /// Waits (off the runtime, whose threads may be held at the gate) until
    /// a sync waits at the gate.
    pub async fn held(self: &Arc<Self>) {
        let g = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            for _ in 0..2000 {
                if g.waiting.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("no sync reached the gate in 20 s");
        })
        .await
        .unwrap();
    }
}

/// Opens the gate when dropped, so that a failing test unwinds instead of
/// waiting for runtime threads held at the gate.
pub struct OpenOnDrop(pub Arc<SyncGate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// A memory device whose syncs wait at a [`SyncGate`].
pub struct GatedDevice {
    pub mem: MemDevice,
    pub gate: Arc<SyncGate>,
}

impl blockalloc_store::device::Device for GatedDevice {
    fn len(&self) -> u64 {
        self.mem.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.mem.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.mem.write_at(offset, data)
    }
    fn sync(&self) -> std::io::Result<()> {
        use std::sync::atomic::Ordering;
        let mut closed = self.gate.closed.lock().unwrap();
        self.gate.waiting.fetch_add(1, Ordering::SeqCst);
        while *closed {
            closed = self.gate.opened.wait(closed).unwrap();
        }
        self.gate.waiting.fetch_sub(1, Ordering::SeqCst);
        self.mem.sync()
    }
    fn describe(&self) -> String {
        "gated memory".into()
    }
}
