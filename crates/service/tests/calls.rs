//! The `Calls` stream: per-call Allocate and Free on one long-lived
//! stream. Each call is answered once, by its id, with what the unary call
//! would have returned; a call's error leaves the stream open; a stream
//! that cannot be decoded ends with an error and nothing else; a graceful
//! stop answers every call sent and ends the streams once their clients
//! closed their side, instead of waiting for them forever.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{ClientError, Code, DeviceId, LeaseOptions, LeasingAllocator};
use blockalloc_service::pb::{self, call_reply, call_request};
use blockalloc_service::{Config, ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

mod common;
use common::{frame, wait_until, GatedDevice, OpenOnDrop, RawConn, SyncGate, TestServer};

fn dev0() -> Option<pb::DeviceRef> {
    Some(pb::DeviceRef {
        r#ref: Some(pb::device_ref::Ref::Index(0)),
    })
}

fn allocate(blocks: u64) -> call_request::Call {
    call_request::Call::Allocate(pb::AllocateRequest {
        device: dev0(),
        count: 1,
        size: Some(pb::allocate_request::Size::Blocks(blocks)),
        scattered: false,
        hint: None,
        ..Default::default()
    })
}

fn free(e: &pb::Extent) -> call_request::Call {
    call_request::Call::Free(pb::FreeRequest {
        device: dev0(),
        extents: vec![*e],
        ..Default::default()
    })
}

fn error_code(r: &pb::CallReply) -> Option<Code> {
    match &r.result {
        Some(call_reply::Result::Error(e)) => Some(Code::from_i32(e.code)),
        _ => None,
    }
}

#[tokio::test]
async fn each_call_is_answered_by_its_id_and_an_error_leaves_the_stream_open() {
    let srv = TestServer::start(&[64 << 20], Config::default()).await;
    let meta = srv.state().await[0].used_blocks;
    let (tx, rx) = mpsc::channel(16);
    let mut replies = srv
        .client()
        .await
        .rpc()
        .calls(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let send = |id, call| {
        let tx = tx.clone();
        async move { tx.send(pb::CallRequest { id, call }).await.unwrap() }
    };
    send(7, Some(allocate(16))).await;
    send(8, Some(allocate(0))).await;
    let never_allocated = pb::Extent {
        start: 12_000,
        len: 4,
    };
    send(9, Some(free(&never_allocated))).await;
    send(10, None).await;
    let mut got = BTreeMap::new();
    while got.len() < 4 {
        let r = replies.message().await.unwrap().expect("a reply per call");
        assert!(got.insert(r.id, r).is_none(), "one reply per id");
    }
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), [7, 8, 9, 10]);
    let obj = match &got[&7].result {
        Some(call_reply::Result::Allocate(a)) => a.objects[0].extents[0],
        other => panic!("allocation refused: {other:?}"),
    };
    assert_eq!(obj.len, 16);
    assert_eq!(error_code(&got[&8]), Some(Code::InvalidArgument));
    assert_eq!(error_code(&got[&9]), Some(Code::FailedPrecondition));
    assert_eq!(error_code(&got[&10]), Some(Code::InvalidArgument));
    srv.store(0)
        .check_allocated(Extent::new(obj.start, obj.len).unwrap())
        .unwrap();

    // The stream still serves after the errors.
    send(11, Some(free(&obj))).await;
    let r = replies.message().await.unwrap().unwrap();
    assert_eq!(r.id, 11);
    assert!(
        matches!(
            r.result,
            Some(call_reply::Result::Free(pb::FreeResponse {
                blocks: 16,
                ..
            }))
        ),
        "{r:?}"
    );
    // Closing the client's side ends the stream once all is answered.
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
    assert_eq!(srv.state().await[0].used_blocks, meta);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_share_one_stream_and_no_block_is_handed_out_twice() {
    let server = Server::new(
        vec![ServedDevice::new(
            "dev0",
            Arc::new(Store::format(MemDevice::new(256 << 20), FormatOptions::default()).unwrap()),
        )],
        Config::default(),
    )
    .unwrap();
    let (srv, metrics) = TestServer::serving_with_metrics(server).await;
    let client = srv.client().await;
    let (tasks, each) = (32u64, 40u64);
    let mut handles = Vec::new();
    for t in 0..tasks {
        let c = client.clone();
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            for i in 0..each {
                let e = c
                    .allocate(&DeviceId::Index(0), 1, 1 + (t + i) % 7, None)
                    .await;
                mine.push(e.unwrap()[0]);
            }
            // Half go back through the stream too.
            let (back, keep) = mine.split_at(mine.len() / 2);
            c.free(&DeviceId::Index(0), back).await.unwrap();
            keep.to_vec()
        }));
    }
    let mut owner: BTreeMap<u64, Extent> = BTreeMap::new();
    for h in handles {
        for e in h.await.unwrap() {
            // No kept extent overlaps another.
            if let Some((_, prev)) = owner.range(..e.end()).next_back() {
                assert!(prev.end() <= e.start(), "{prev:?} and {e:?} overlap");
            }
            owner.insert(e.start(), e);
            srv.store(0).check_allocated(e).unwrap();
        }
    }
    let kept: u64 = owner.values().map(|e| e.len()).sum();
    let st = srv.state().await;
    assert_eq!(st[0].used_blocks, st[0].meta_blocks + kept);
    // One stream carried every call, and each call is counted as its
    // unary method would be.
    let text = metrics.encode();
    let count = |method: &str| -> u64 {
        let key = format!("blockalloc_requests_total{{method=\"{method}\",code=\"OK\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    assert_eq!(count("Calls"), 1, "one stream, counted when it opened");
    assert_eq!(count("Allocate"), tasks * each);
    assert_eq!(count("Free"), tasks);
    srv.stop().await;
}

#[tokio::test]
async fn a_stream_that_does_not_decode_ends_with_an_error_and_the_server_serves_on() {
    let srv = TestServer::start(&[64 << 20], Config::default()).await;
    let mut raw = RawConn::connect(srv.addr).await;
    let r = raw
        .call("Calls", frame(b"\xff\xff\xff\xff not a CallRequest"))
        .await;
    assert_eq!(r.http, 200);
    assert!(r.code == Some(Code::Internal), "{r:?}");
    assert!(r.body.is_empty(), "no reply for a call that did not decode");
    let c = srv.client().await;
    let e = c.allocate(&DeviceId::Index(0), 1, 8, None).await.unwrap()[0];
    srv.store(0).check_allocated(e).unwrap();
    // And only that block range is taken.
    let st = srv.state().await;
    assert_eq!(st[0].used_blocks, st[0].meta_blocks + 8);
    srv.stop().await;
}

/// A stream is open for as long as its client keeps it; a graceful stop
/// used to wait for it forever. Now the server tells the client it stops,
/// answers every call it got (those read after the stop began as
/// unavailable: not run), and ends the stream once the client closed its
/// side; every allocation a caller saw succeed is allocated, and no call is
/// cut off with its outcome unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_answers_the_calls_it_read_and_ends_the_streams() {
    let srv = TestServer::start(&[256 << 20], Config::default()).await;
    let store = Arc::clone(srv.store(0));
    // A client that sends each call once (resends are the client's tests).
    let client = srv.client().await.with_retry_for(Duration::ZERO);
    let mut handles = Vec::new();
    let answered = Arc::new(AtomicUsize::new(0));
    for t in 0..8u64 {
        let c = client.clone();
        let answered = Arc::clone(&answered);
        handles.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut errors = HashMap::new();
            for i in 0.. {
                // Frees keep the device from filling however fast the host.
                let step = if seen.len() >= 64 {
                    let old: Vec<Extent> = seen.drain(..32).collect();
                    c.free(&DeviceId::Index(0), &old).await.map(|_| ())
                } else {
                    c.allocate(&DeviceId::Index(0), 1, 1 + (t + i) % 5, None)
                        .await
                        .map(|v| seen.push(v[0]))
                };
                match step {
                    Ok(()) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        let kind = match e {
                            ClientError::Unavailable(_) => "unavailable",
                            other => panic!("{other}"),
                        };
                        *errors.entry(kind).or_insert(0) += 1;
                        break;
                    }
                }
            }
            (seen, errors)
        }));
    }
    // The stop comes while calls run.
    wait_until("calls are answered", || async {
        answered.load(Ordering::Relaxed) >= 100
    })
    .await;
    tokio::time::timeout(Duration::from_secs(20), srv.stop())
        .await
        .expect("the stop waits for the open Calls stream");
    let mut total = 0;
    for h in handles {
        let (seen, _) = tokio::time::timeout(Duration::from_secs(20), h)
            .await
            .expect("every caller gets an answer")
            .unwrap();
        for e in &seen {
            store.check_allocated(*e).unwrap();
        }
        total += seen.len();
    }
    assert!(total > 0, "calls ran before the stop");
    store.verify().unwrap();
}

/// The allocation service whose `Calls` stream is refused with `refusal`
/// (UNIMPLEMENTED: as an older server has it); the rest is served. Counts
/// the attempts to open the stream.
#[derive(Clone)]
struct WithoutCalls<S> {
    inner: S,
    refusal: Code,
    attempts: Arc<AtomicUsize>,
}

impl<S> tonic::server::NamedService for WithoutCalls<S> {
    const NAME: &'static str = "blockalloc.v1.Allocator";
}

type HttpReply = http::Response<tonic::body::Body>;

impl<S> tower::Service<http::Request<tonic::body::Body>> for WithoutCalls<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = HttpReply,
            Error = std::convert::Infallible,
        > + Send,
    S::Future: Send + 'static,
{
    type Response = HttpReply;
    type Error = std::convert::Infallible;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<HttpReply, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() == "/blockalloc.v1.Allocator/Calls" {
            self.attempts.fetch_add(1, Ordering::Relaxed);
            let refusal = self.refusal;
            return Box::pin(async move {
                Ok(tonic::Status::new(refusal, "no stream here").into_http())
            });
        }
        Box::pin(self.inner.call(req))
    }
}

/// A server over a fresh 64 MiB in-memory device that refuses `Calls`
/// with `refusal`.
struct Refusing {
    addr: std::net::SocketAddr,
    store: Arc<Store>,
    attempts: Arc<AtomicUsize>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Refusing {
    async fn start(refusal: Code) -> Refusing {
        let store =
            Arc::new(Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap());
        let server = Server::new(
            vec![ServedDevice::new("dev0", Arc::clone(&store))],
            Config::default(),
        )
        .unwrap();
        let attempts = Arc::new(AtomicUsize::new(0));
        let service = WithoutCalls {
            inner: pb::allocator_server::AllocatorServer::new(server),
            refusal,
            attempts: Arc::clone(&attempts),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );
        Refusing {
            addr,
            store,
            attempts,
            stop,
            task,
        }
    }

    async fn client(&self) -> blockalloc_client::Client {
        blockalloc_client::Client::connect(&self.addr.to_string())
            .await
            .unwrap()
    }

    fn attempts(&self) -> usize {
        self.attempts.load(Ordering::Relaxed)
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_client_of_a_server_without_the_stream_makes_unary_calls_and_asks_once() {
    // (And one set to unary calls does not ask at all.)
    let srv = Refusing::start(Code::Unimplemented).await;
    let c = srv.client().await;
    let mut objects = Vec::new();
    for n in 1..=10 {
        objects.push(c.allocate(&DeviceId::Index(0), 1, n, None).await.unwrap()[0]);
    }
    for e in &objects {
        srv.store.check_allocated(*e).unwrap();
    }
    assert_eq!(c.free(&DeviceId::Index(0), &objects).await.unwrap(), 55);
    let e = c
        .allocate(&DeviceId::Index(0), 1, 0, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &e,
            ClientError::Refused {
                code: Code::InvalidArgument,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        srv.attempts(),
        1,
        "an UNIMPLEMENTED stream is asked for once"
    );
    // A client set to unary calls never asks.
    let unary = blockalloc_client::Client::connect_with(
        &srv.addr.to_string(),
        &blockalloc_client::ConnectOptions {
            unary_calls: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let e = unary
        .allocate(&DeviceId::Index(0), 1, 3, None)
        .await
        .unwrap()[0];
    unary.free(&DeviceId::Index(0), &[e]).await.unwrap();
    assert_eq!(srv.attempts(), 1);
    srv.stop().await;
}

/// Callers used to queue behind one failing open after another: with a
/// server that could not be reached, each waited for every open before
/// its own. Now a failed open sends calls unary for a pause, and only then
/// is the stream tried again.
#[tokio::test]
async fn a_stream_that_could_not_be_opened_is_tried_again_only_after_a_pause() {
    let srv = Refusing::start(Code::Unavailable).await;
    let c = srv.client().await;
    let t = std::time::Instant::now();
    for n in 1..=10 {
        let e = c.allocate(&DeviceId::Index(0), 1, n, None).await.unwrap()[0];
        srv.store.check_allocated(e).unwrap();
    }
    // One attempt, then one more at most per pause that passed (each
    // attempt starts a pause; a loaded host may take more than one for the
    // ten calls).
    let most = 1 + t.elapsed().as_millis() / 1000;
    assert!(
        (1..=most).contains(&(srv.attempts() as u128)),
        "{} attempts to open in {:?}",
        srv.attempts(),
        t.elapsed()
    );
    let before = srv.attempts();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    c.allocate(&DeviceId::Index(0), 1, 1, None).await.unwrap();
    assert_eq!(srv.attempts(), before + 1, "tried again after the pause");
    srv.stop().await;
}

/// A streamed call is bounded by the request timeout, as a unary call is:
/// past it the call's reply is CANCELLED, the other calls and the stream
/// go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_call_past_the_request_timeout_is_cancelled_and_the_stream_goes_on() {
    let mut cfg = Config::default();
    // One call at a time per client, and little time to wait for the turn:
    // a burst of calls on one stream outlasts it.
    cfg.limits.max_in_flight_per_client = 1;
    cfg.limits.request_timeout = Duration::from_millis(1);
    let srv = TestServer::start(&[256 << 20], cfg).await;
    // A client that sends each call once (resends are the client's tests).
    let client = srv.client().await.with_retry_for(Duration::ZERO);
    let mut handles = Vec::new();
    for t in 0..256u64 {
        let c = client.clone();
        handles.push(tokio::spawn(async move {
            c.allocate(&DeviceId::Index(0), 1, 1 + t % 9, None).await
        }));
    }
    let (mut ok, mut cancelled) = (Vec::new(), 0);
    for h in handles {
        match tokio::time::timeout(Duration::from_secs(20), h)
            .await
            .expect("every call is answered")
            .unwrap()
        {
            Ok(v) => ok.push(v[0]),
            // CANCELLED, as the client reports it: the call may have run.
            Err(ClientError::OutcomeUnknown(why)) if why.contains("Timeout expired") => {
                cancelled += 1
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        cancelled > 0,
        "no call waited past 1 ms ({} answered)",
        ok.len()
    );
    // The stream goes on (a call alone may still outlast 1 ms on a busy
    // host: a few tries).
    let mut again = None;
    for _ in 0..100 {
        if let Ok(v) = client.allocate(&DeviceId::Index(0), 1, 4, None).await {
            again = Some(v[0]);
            break;
        }
    }
    ok.push(again.expect("a call after the burst is served"));
    for e in &ok {
        srv.store(0).check_allocated(*e).unwrap();
    }
    srv.store(0).verify().unwrap();
    srv.stop().await;
}

/// Sends a commit of `allocation` to lease `lease_id` as call `id` of a
/// stream and returns its reply.
async fn commit_on(
    tx: &mpsc::Sender<pb::CallRequest>,
    replies: &mut tonic::Streaming<pb::CallReply>,
    id: u64,
    lease_id: u64,
    sequence: u64,
    allocation: pb::Extent,
) -> pb::CallReply {
    let call = call_request::Call::Commit(pb::CommitRequest {
        lease_id,
        sequence,
        allocations: vec![allocation],
        ..Default::default()
    });
    tx.send(pb::CallRequest {
        id,
        call: Some(call),
    })
    .await
    .unwrap();
    let r = replies.message().await.unwrap().expect("a reply");
    assert_eq!(r.id, id);
    r
}

/// A lease's `Commit` on the stream is the unary `Commit`: durable on its
/// reply, idempotent per (lease, sequence), refused with the same codes
/// with nothing applied; and a leasing client sends its commits there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_the_stream_is_idempotent_and_refused_as_the_unary_commit_is() {
    let server = Server::new(
        vec![ServedDevice::new(
            "dev0",
            Arc::new(Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap()),
        )],
        Config::default(),
    )
    .unwrap();
    let (srv, metrics) = TestServer::serving_with_metrics(server).await;
    let client = srv.client().await;
    let mut rpc = client.rpc();
    let lease = rpc
        .lease(pb::LeaseRequest {
            client_id: "raw".into(),
            min_blocks: 16,
            want_blocks: 64,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let held = lease.extents[0];
    let (tx, rx) = mpsc::channel(16);
    let mut replies = rpc
        .calls(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = pb::Extent {
        start: held.start,
        len: 8,
    };
    let r = commit_on(&tx, &mut replies, 1, lease.lease_id, 1, first).await;
    let committed = match r.result {
        Some(call_reply::Result::Commit(c)) => c,
        other => panic!("commit refused: {other:?}"),
    };
    assert!(!committed.replayed);
    assert_eq!(committed.unused_blocks, held.len - 8);
    srv.store(0)
        .check_allocated(Extent::new(first.start, first.len).unwrap())
        .unwrap();
    let used = srv.state().await[0].used_blocks;
    // The same sequence again: its first reply, nothing applied twice.
    let r = commit_on(&tx, &mut replies, 2, lease.lease_id, 1, first).await;
    assert!(
        matches!(&r.result, Some(call_reply::Result::Commit(c)) if c.replayed),
        "{r:?}"
    );
    // Outside the lease, a sequence gap, an unknown lease: refused.
    let outside = pb::Extent {
        start: held.start + held.len,
        len: 4,
    };
    let inside = pb::Extent {
        start: held.start + 8,
        len: 4,
    };
    for (id, lease_id, seq, e, code) in [
        (3, lease.lease_id, 2, outside, Code::FailedPrecondition),
        (4, lease.lease_id, 5, inside, Code::FailedPrecondition),
        (5, lease.lease_id ^ 0xffff, 1, inside, Code::NotFound),
    ] {
        let r = commit_on(&tx, &mut replies, id, lease_id, seq, e).await;
        assert_eq!(error_code(&r), Some(code), "{r:?}");
    }
    assert_eq!(srv.state().await[0].used_blocks, used);
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());

    // A leasing client's commits go on its connection's stream: the only
    // stream it opens.
    let count = |method: &str| -> u64 {
        let key = format!("blockalloc_requests_total{{method=\"{method}\",code=\"OK\"}} ");
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&key))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    let (streams, commits) = (count("Calls"), count("Commit"));
    let leasing = LeasingAllocator::new(srv.client().await, LeaseOptions::default());
    let e = leasing.allocate(8).await.unwrap();
    leasing.commit().await.unwrap();
    srv.store(0).check_allocated(e).unwrap();
    assert_eq!(count("Calls"), streams + 1);
    assert_eq!(count("Commit"), commits + 1);
    leasing.close().await.unwrap();
    srv.stop().await;
}

/// A server over one 64 MiB gated device with `cfg`.
async fn gated(cfg: Config) -> (TestServer, Arc<SyncGate>) {
    let gate = Arc::new(SyncGate::default());
    let dev = GatedDevice {
        mem: MemDevice::new(64 << 20),
        gate: Arc::clone(&gate),
    };
    let store = Arc::new(Store::format(dev, FormatOptions::default()).unwrap());
    let server = Server::new(vec![ServedDevice::new("dev0", store)], cfg).unwrap();
    (TestServer::serving(server).await, gate)
}

fn allocated(r: &pb::CallReply) -> Option<pb::Extent> {
    match &r.result {
        Some(call_reply::Result::Allocate(a)) => Some(a.objects[0].extents[0]),
        _ => None,
    }
}

/// A stop that began while a call of a stream was at the device (durable
/// once the device answers) used to end the stream without reading on:
/// the reply could be lost although the allocation was made, and the
/// client took the call for one that never ran. Now the server tells the
/// client it stops (the notice, id 0), answers the call in flight, answers
/// a call sent after the notice UNAVAILABLE without running it, and ends
/// the stream once the client closes its side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_call_answers_it_and_refuses_the_calls_sent_after_it() {
    let (srv, gate) = gated(Config::default()).await;
    let _open = OpenOnDrop(Arc::clone(&gate));
    let store = Arc::clone(srv.store(0));
    let meta = store.status().space.used_blocks;
    let (tx, rx) = mpsc::channel(16);
    let mut replies = srv
        .client()
        .await
        .rpc()
        .calls(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let call = |id, blocks| pb::CallRequest {
        id,
        call: Some(allocate(blocks)),
    };
    tx.send(call(1, 8)).await.unwrap();
    let first = replies.message().await.unwrap().unwrap();
    assert!(allocated(&first).is_some(), "{first:?}");
    // Call 2 reaches the device and waits there.
    gate.set(true);
    tx.send(call(2, 16)).await.unwrap();
    gate.held().await;
    let stop = tokio::spawn(srv.stop());
    let notice = tokio::time::timeout(Duration::from_secs(20), replies.message())
        .await
        .expect("the stop notice comes while a call is in flight")
        .unwrap()
        .unwrap();
    assert_eq!(notice.id, 0, "{notice:?}");
    assert_eq!(error_code(&notice), Some(Code::Unavailable), "{notice:?}");
    // Sent after the stop began: answered, not run.
    tx.send(call(3, 32)).await.unwrap();
    let third = replies.message().await.unwrap().unwrap();
    assert_eq!(third.id, 3, "{third:?}");
    assert_eq!(error_code(&third), Some(Code::Unavailable), "{third:?}");
    match &third.result {
        Some(call_reply::Result::Error(e)) => {
            assert!(
                e.message.contains("stopping") && e.message.contains("did not run"),
                "{e:?}"
            )
        }
        r => panic!("{r:?}"),
    }
    assert!(!stop.is_finished(), "the stop waits for the call in flight");
    gate.set(false);
    let second = replies.message().await.unwrap().unwrap();
    assert_eq!(second.id, 2, "{second:?}");
    let e2 = allocated(&second).expect("the call in flight is answered");
    // The client closes its side: the stream ends and the stop finishes.
    drop(tx);
    assert!(replies.message().await.unwrap().is_none());
    tokio::time::timeout(Duration::from_secs(20), stop)
        .await
        .expect("the stop ends once the client closed its side")
        .unwrap();
    store
        .check_allocated(Extent::new(e2.start, e2.len).unwrap())
        .unwrap();
    assert_eq!(
        store.status().space.used_blocks,
        meta + 8 + 16,
        "the call refused did not run"
    );
}

/// Forwards one TCP connection to `to` until `cut` fires, then drops both
/// sides: a connection that breaks in the middle of a call.
async fn cuttable_proxy(to: std::net::SocketAddr) -> (String, tokio::sync::oneshot::Sender<()>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (cut, cut_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut a, _) = l.accept().await.unwrap();
        let mut b = tokio::net::TcpStream::connect(to).await.unwrap();
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
            _ = cut_rx => {}
        }
    });
    (addr, cut)
}

/// A call cut off after it was sent (the connection broke while the
/// server ran it) used to fail as unavailable, which says it did not run;
/// it may have. Now it fails as outcome unknown, on the stream and unary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_off_after_it_was_sent_is_outcome_unknown() {
    let (srv, gate) = gated(Config::default()).await;
    let _open = OpenOnDrop(Arc::clone(&gate));
    for unary in [false, true] {
        let (addr, cut) = cuttable_proxy(srv.addr).await;
        let opts = blockalloc_client::ConnectOptions {
            unary_calls: unary,
            ..Default::default()
        };
        // A client that sends each call once (resends are the client's
        // tests).
        let c = blockalloc_client::Client::connect_with(&addr, &opts)
            .await
            .unwrap()
            .with_retry_for(Duration::ZERO);
        c.allocate(&DeviceId::Index(0), 1, 4, None).await.unwrap();
        gate.set(true);
        let call = tokio::spawn(async move { c.allocate(&DeviceId::Index(0), 1, 4, None).await });
        gate.held().await;
        let _ = cut.send(());
        let e = tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("the call returns once its connection broke")
            .unwrap()
            .unwrap_err();
        assert!(
            e.is_outcome_unknown() && !e.is_unavailable(),
            "unary {unary}: {e}"
        );
        gate.set(false);
    }
    srv.stop().await;
}

/// Past the request timeout a call is answered CANCELLED while its device
/// operation may still complete: outcome unknown, not unavailable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_request_timeout_is_outcome_unknown() {
    let mut cfg = Config::default();
    cfg.limits.request_timeout = Duration::from_millis(300);
    let (srv, gate) = gated(cfg).await;
    let _open = OpenOnDrop(Arc::clone(&gate));
    for unary in [false, true] {
        let opts = blockalloc_client::ConnectOptions {
            unary_calls: unary,
            ..Default::default()
        };
        let c = blockalloc_client::Client::connect_with(&srv.addr.to_string(), &opts)
            .await
            .unwrap();
        // Connected and the stream open (on a busy host the first call may
        // itself outlast the short timeout: a few tries).
        let mut warm = false;
        for _ in 0..100 {
            if c.allocate(&DeviceId::Index(0), 1, 4, None).await.is_ok() {
                warm = true;
                break;
            }
        }
        assert!(warm, "no call finished within the timeout in 100 tries");
        gate.set(true);
        // The gate stays closed until the reply came: the timeout passes.
        let e = c
            .allocate(&DeviceId::Index(0), 1, 4, None)
            .await
            .unwrap_err();
        assert!(
            e.is_outcome_unknown() && !e.is_unavailable(),
            "unary {unary}: {e}"
        );
        gate.set(false);
    }
    srv.stop().await;
}

/// A client closes its side of the stream on the server's stop notice, so
/// that a stop does not wait `stop_grace` for a client that is idle and
/// keeps its stream; its next call is refused as unavailable (not run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closes_its_stream_on_the_stop_notice_so_the_stop_does_not_wait() {
    let cfg = Config {
        stop_grace: Duration::from_secs(3600),
        ..Config::default()
    };
    let srv = TestServer::start(&[64 << 20], cfg).await;
    let store = Arc::clone(srv.store(0));
    let c = srv.client().await;
    c.allocate(&DeviceId::Index(0), 1, 8, None).await.unwrap();
    let used = store.status().space.used_blocks;
    tokio::time::timeout(Duration::from_secs(60), srv.stop())
        .await
        .expect("the stop waits for no idle client");
    let e = c
        .allocate(&DeviceId::Index(0), 1, 8, None)
        .await
        .unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    assert_eq!(store.status().space.used_blocks, used);
}
