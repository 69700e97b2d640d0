//! The client through pauses, cuts and restarts, against a scripted
//! in-process server: it answers what each test tells it (late replies,
//! refusals, stale epochs, the schema's lease margins) and records what it
//! was sent.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockalloc_client::pb::allocator_server::{Allocator, AllocatorServer};
use blockalloc_client::{pb, Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tonic::{Request, Response, Status};

/// Blocks of the scripted device.
const CAPACITY: u64 = 1 << 20;

/// What the scripted server answers, and what it saw.
#[derive(Default)]
struct Script {
    /// The device's epoch in every reply.
    epoch: u64,
    /// The next `Allocate` replies carry these epochs instead, one each.
    stale_epochs: Vec<u64>,
    /// Lease replies: TTL and margin.
    ttl_ms: u64,
    margin_ms: u64,
    /// How long a `Lease` waits before it replies.
    lease_delay: Duration,
    /// Commits refused UNAVAILABLE before one is answered.
    commit_refusals: usize,
    /// Renewals get no reply at all.
    renewals_hang: bool,
    /// The first `Allocate` gets no reply (its arrival is announced).
    first_allocate_hangs: bool,
    /// `(request_id, epoch)` of each `Allocate`, in arrival order.
    allocates: Vec<(u64, u64)>,
    /// `(lease_id, sequence)` of each `Commit`.
    commits: Vec<(u64, u64)>,
    renewals: usize,
    /// The next block an `Allocate` hands out.
    next_block: u64,
}

#[derive(Clone)]
struct Stub {
    script: Arc<Mutex<Script>>,
    /// Told when an `Allocate` arrives.
    arrived: Arc<Notify>,
}

impl Stub {
    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap()
    }
}

type Never<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Allocator for Stub {
    async fn allocate(
        &self,
        r: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let r = r.into_inner();
        let (hang, reply) = {
            let mut s = self.script();
            s.allocates.push((r.request_id, r.epoch));
            let hang = s.first_allocate_hangs && s.allocates.len() == 1;
            let epoch = if s.stale_epochs.is_empty() {
                s.epoch
            } else {
                s.stale_epochs.remove(0)
            };
            let blocks = match r.size {
                Some(pb::allocate_request::Size::Blocks(b)) => b,
                _ => 1,
            };
            let objects = (0..r.count)
                .map(|_| {
                    let start = 1_000_000 + s.next_block;
                    s.next_block += blocks;
                    pb::Object {
                        extents: vec![pb::Extent { start, len: blocks }],
                    }
                })
                .collect();
            let replayed = s.allocates[..s.allocates.len() - 1]
                .iter()
                .any(|&(id, _)| id == r.request_id);
            (
                hang,
                pb::AllocateResponse {
                    objects,
                    block_size: 4096,
                    replayed,
                    epoch,
                    free_blocks: 0,
                },
            )
        };
        self.arrived.notify_one();
        if hang {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(reply))
    }

    async fn free(
        &self,
        r: Request<pb::FreeRequest>,
    ) -> Result<Response<pb::FreeResponse>, Status> {
        let r = r.into_inner();
        Ok(Response::new(pb::FreeResponse {
            blocks: r.extents.iter().map(|e| e.len).sum(),
            replayed: false,
            epoch: self.script().epoch,
            free_blocks: 0,
        }))
    }

    async fn status(
        &self,
        _: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(pb::StatusResponse::default()))
    }

    async fn lease(
        &self,
        _: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let delay = self.script().lease_delay;
        tokio::time::sleep(delay).await;
        let s = self.script();
        Ok(Response::new(pb::LeaseResponse {
            lease_id: 1,
            extents: vec![pb::Extent {
                start: 0,
                len: 4096,
            }],
            ttl_ms: s.ttl_ms,
            block_size: 4096,
            capacity_blocks: CAPACITY,
            device_index: 0,
            grantable_blocks: 0,
            epoch: s.epoch,
            margin_ms: s.margin_ms,
        }))
    }

    async fn commit(
        &self,
        r: Request<pb::CommitRequest>,
    ) -> Result<Response<pb::CommitResponse>, Status> {
        let r = r.into_inner();
        let mut s = self.script();
        s.commits.push((r.lease_id, r.sequence));
        if s.commit_refusals > 0 {
            s.commit_refusals -= 1;
            return Err(Status::unavailable("the server is opening its devices"));
        }
        Ok(Response::new(pb::CommitResponse {
            epoch: s.epoch,
            ttl_ms: s.ttl_ms,
            margin_ms: s.margin_ms,
            ..Default::default()
        }))
    }

    async fn renew(
        &self,
        _: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let hang = {
            let mut s = self.script();
            s.renewals += 1;
            s.renewals_hang
        };
        if hang {
            std::future::pending::<()>().await;
        }
        let s = self.script();
        Ok(Response::new(pb::RenewResponse {
            ttl_ms: s.ttl_ms,
            margin_ms: s.margin_ms,
            epoch: s.epoch,
            ..Default::default()
        }))
    }

    async fn release(
        &self,
        _: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        Ok(Response::new(pb::ReleaseResponse {
            released_blocks: 0,
            epoch: self.script().epoch,
        }))
    }

    type WatchRecallsStream = Never<pb::RecallEvent>;

    async fn watch_recalls(
        &self,
        _: Request<pb::WatchRecallsRequest>,
    ) -> Result<Response<Self::WatchRecallsStream>, Status> {
        Err(Status::unimplemented("scripted"))
    }

    type WatchTopologyStream = Never<pb::Topology>;

    async fn watch_topology(
        &self,
        _: Request<pb::WatchTopologyRequest>,
    ) -> Result<Response<Self::WatchTopologyStream>, Status> {
        Err(Status::unimplemented("scripted"))
    }

    type CallsStream = Never<pb::CallReply>;

    /// Unary calls only: the client remembers it and sends each call
    /// unary.
    async fn calls(
        &self,
        _: Request<tonic::Streaming<pb::CallRequest>>,
    ) -> Result<Response<Self::CallsStream>, Status> {
        Err(Status::unimplemented("scripted"))
    }
}

/// Serves `script` on a loopback port; the server stops with the test.
async fn serve(script: Script) -> (SocketAddr, Stub) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let stub = Stub {
        script: Arc::new(Mutex::new(script)),
        arrived: Arc::new(Notify::new()),
    };
    let svc = AllocatorServer::new(stub.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l)),
    );
    (addr, stub)
}

/// A TCP proxy to `to` on a loopback port. Sending on the returned
/// channel breaks every connection open then; later ones are proxied
/// again.
async fn breakable_proxy(to: SocketAddr) -> (String, watch::Sender<u64>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (breaks, rx) = watch::channel(0u64);
    tokio::spawn(async move {
        while let Ok((mut a, _)) = l.accept().await {
            let mut broken = rx.clone();
            broken.borrow_and_update();
            tokio::spawn(async move {
                let Ok(mut b) = TcpStream::connect(to).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                    _ = broken.changed() => {}
                }
            });
        }
    });
    (addr, breaks)
}

/// A leasing allocator that commits only when asked.
fn on_demand(c: &Client) -> LeasingAllocator {
    LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks: 16,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    )
}

/// Waits (at most a minute: a "never", not a bound on the time it takes)
/// until `cond` holds.
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(60), "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The deadline counts from when the grant was asked for, not from when
/// its reply came: a reply that took long leaves that much less time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leases_deadline_counts_from_when_its_request_was_sent() {
    const LATE: Duration = Duration::from_millis(1500);
    let (addr, _stub) = serve(Script {
        ttl_ms: 60_000,
        margin_ms: 4_000,
        lease_delay: LATE,
        ..Script::default()
    })
    .await;
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let alloc = on_demand(&c);
    let before = Instant::now();
    let (e, deadline) = alloc.allocate_with_deadline(16).await.unwrap();
    let after = Instant::now();
    let deadline = deadline.expect("a leased allocation has a deadline");
    let rule = Duration::from_millis(60_000 - 4_000);
    // Sent after `before`, and at least LATE before `after`.
    assert!(deadline >= before + rule, "{:?}", deadline - before);
    assert!(
        deadline <= after - LATE + rule,
        "the deadline counts from the reply: {:?} after it",
        deadline - (after - LATE)
    );
    assert_eq!(alloc.deadline(e), Some(deadline));
    alloc.commit().await.unwrap();
    assert_eq!(alloc.deadline(e), None, "committed: no deadline");
}

/// Past its deadline a lease hands out nothing more, even while its
/// renewal hangs and nothing else has told the client the lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_is_refused_past_the_leases_deadline() {
    let (addr, stub) = serve(Script {
        ttl_ms: 1_500,
        margin_ms: 500,
        renewals_hang: true,
        ..Script::default()
    })
    .await;
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let alloc = on_demand(&c);
    let (e, deadline) = alloc.allocate_with_deadline(16).await.unwrap();
    let deadline = deadline.unwrap();
    wait_until("the renewal is sent", || stub.script().renewals > 0).await;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(alloc.try_allocate_local(16), None, "past the deadline");
    assert!(
        alloc.deadline(e).is_some_and(|t| t <= Instant::now()),
        "an uncommitted allocation past its deadline must not be written"
    );
}

/// A commit refused UNAVAILABLE (a server restarting) is resent with its
/// sequence until it is answered: `commit` waits, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_commit_is_resent_until_answered_and_nothing_is_lost() {
    let (addr, stub) = serve(Script {
        ttl_ms: 60_000,
        commit_refusals: 3,
        ..Script::default()
    })
    .await;
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let alloc = on_demand(&c);
    alloc.allocate(16).await.unwrap();
    alloc.allocate(16).await.unwrap();
    alloc.commit().await.expect("resent until answered");
    let st = alloc.stats();
    assert_eq!((st.lost, st.commit_calls), (0, 4));
    assert_eq!(stub.script().commits, vec![(1, 1); 4], "one sequence");
}

/// An `Allocate` whose connection broke after the server had it is sent
/// again, with the same request id, on a new connection: the server can
/// answer it with the first call's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocate_cut_off_is_resent_with_the_same_request_id() {
    let (addr, stub) = serve(Script {
        first_allocate_hangs: true,
        ..Script::default()
    })
    .await;
    let (proxied, breaks) = breakable_proxy(addr).await;
    let c = Client::connect(&proxied).await.unwrap();
    let call = {
        let c = c.clone();
        tokio::spawn(async move { c.allocate(&DeviceId::Index(0), 1, 8, None).await })
    };
    stub.arrived.notified().await;
    breaks.send_modify(|n| *n += 1);
    let got = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the resend is answered")
        .unwrap()
        .expect("a cut-off call is resent, not failed");
    assert_eq!(got.len(), 1);
    let seen = stub.script().allocates.clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_ne!(seen[0].0, 0, "a request id is sent");
    assert_eq!(seen[0].0, seen[1].0, "the resend has the first id");
    // The next call has an id of its own.
    c.allocate(&DeviceId::Index(0), 1, 8, None).await.unwrap();
    let next = stub.script().allocates[2].0;
    assert_ne!(next, seen[0].0);

    // Without retries the cut is the caller's to handle.
    let (addr, stub) = serve(Script {
        first_allocate_hangs: true,
        ..Script::default()
    })
    .await;
    let (proxied, breaks) = breakable_proxy(addr).await;
    let once = Client::connect(&proxied)
        .await
        .unwrap()
        .with_retry_for(Duration::ZERO);
    let call = tokio::spawn(async move { once.allocate(&DeviceId::Index(0), 1, 8, None).await });
    stub.arrived.notified().await;
    breaks.send_modify(|n| *n += 1);
    let e = call.await.unwrap().unwrap_err();
    assert!(e.is_outcome_unknown() || e.is_unavailable(), "cut off: {e}");
    assert_eq!(stub.script().allocates.len(), 1);
}

/// A reply with an older epoch than one already seen for the device comes
/// from a stale owner: refused as fenced and the call resent; the client
/// sends the newest epoch it has seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_from_an_older_epoch_is_fenced_and_resent() {
    let (addr, stub) = serve(Script {
        epoch: 7,
        ..Script::default()
    })
    .await;
    let c = Client::connect(&addr.to_string()).await.unwrap();
    let dev = DeviceId::Index(0);
    c.allocate(&dev, 1, 8, None).await.unwrap();
    stub.script().stale_epochs = vec![6];
    c.allocate(&dev, 1, 8, None)
        .await
        .expect("the stale reply is refused and the call resent");
    let seen = stub.script().allocates.clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0].1, 0, "no epoch seen before the first reply");
    assert_eq!((seen[1].1, seen[2].1), (7, 7), "the newest epoch seen");
    assert_eq!(seen[1].0, seen[2].0, "resent with its request id");

    // Without retries the caller sees why.
    stub.script().stale_epochs = vec![5];
    let e = c
        .with_retry_for(Duration::ZERO)
        .allocate(&dev, 1, 8, None)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Fenced { seen: 7, got: 5 }), "{e}");
    // A newer epoch is taken in.
    stub.script().epoch = 9;
    c.allocate(&dev, 1, 8, None).await.unwrap();
    c.allocate(&dev, 1, 8, None).await.unwrap();
    assert_eq!(stub.script().allocates.last().unwrap().1, 9);
}
