//! A device whose sync stalls holds up only the calls on it: its store
//! work runs on the device's owner thread, never on the runtime's, so the
//! other devices, new connections and the calls' deadlines go on.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockalloc_client::{ClientError, DeviceId};
use blockalloc_service::{Config, ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};

mod common;
use common::{GatedDevice, OpenOnDrop, SyncGate, TestServer};

/// Polls `done` every 10 ms for up to a minute (a "never", not a bound),
/// without the runtime (whose threads may all be held at the gate).
fn eventually(what: &str, done: impl Fn() -> bool) {
    for _ in 0..6000 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("not within a minute: {what}");
}

/// A server over a gated memory device "slow" and a memory device "fast".
async fn gated_server(cfg: Config) -> (TestServer, Arc<SyncGate>) {
    let gate = Arc::new(SyncGate::default());
    let slow = GatedDevice {
        mem: MemDevice::new(64 << 20),
        gate: Arc::clone(&gate),
    };
    let slow = Store::format(slow, FormatOptions::default()).unwrap();
    let fast = Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap();
    let devices = vec![
        ServedDevice::new("slow", Arc::new(slow)),
        ServedDevice::new("fast", Arc::new(fast)),
    ];
    let srv = TestServer::serving(Server::new(devices, cfg).unwrap()).await;
    (srv, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_sync_holds_up_only_the_calls_on_its_device() {
    let (srv, gate) = gated_server(Config::default()).await;
    let c = srv.client().await;
    let on_slow = DeviceId::Name("slow".into());
    let on_fast = DeviceId::Name("fast".into());
    c.allocate(&on_slow, 1, 8, None).await.unwrap();

    // Its sync stalls with three calls on it: the first group's sync waits
    // at the gate, the other calls wait for the next round.
    gate.set(true);
    let reopen = OpenOnDrop(Arc::clone(&gate));
    let stalled: Vec<_> = (0..3)
        .map(|_| {
            let c = c.clone();
            let d = on_slow.clone();
            tokio::spawn(async move { c.allocate(&d, 1, 8, None).await })
        })
        .collect();
    eventually("a sync at the gate", || {
        gate.waiting.load(Ordering::SeqCst) == 1
    });

    // Calls on the other device go on meanwhile, and so do
    // new connections. The caller runs on a thread of its own, so that a
    // server whose runtime threads all wait at the gate fails the test
    // instead of hanging it.
    let addr = srv.addr.to_string();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let r = rt.block_on(async {
            let other = blockalloc_client::Client::connect(&addr).await?;
            for _ in 0..8 {
                other.allocate(&on_fast, 1, 8, None).await?;
            }
            Ok::<_, blockalloc_client::ClientError>(())
        });
        let _ = done.send(r);
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("calls on the other device waited for the stall")
        .unwrap();
    assert!(stalled.iter().all(|t| !t.is_finished()), "the gate holds");
    assert_eq!(gate.waiting.load(Ordering::SeqCst), 1, "one group syncs");

    drop(reopen);
    for t in stalled {
        t.await.unwrap().unwrap();
    }
    srv.store(0).verify().unwrap();
    srv.store(1).verify().unwrap();
    srv.stop().await;
}

/// Calls waiting for their turn behind a call stalled in its sync are
/// cancelled at their deadline and change nothing; the stalled call is
/// cancelled at its own, and its allocation, durable once the sync is
/// done, is freed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_behind_a_stalled_call_are_cancelled_at_their_deadline_and_change_nothing() {
    let mut cfg = Config::default();
    // One call at a time: the stalled call holds the turn.
    cfg.limits.max_in_flight_per_client = 1;
    cfg.limits.request_timeout = Duration::from_millis(200);
    let (srv, gate) = gated_server(cfg).await;
    let c = srv.client().await.with_retry_for(Duration::ZERO);
    let on_slow = DeviceId::Name("slow".into());
    c.allocate(&on_slow, 1, 8, None).await.unwrap();
    let commits = srv.store(0).stats().commits;
    let used = srv.store(0).status().space.used_blocks;

    gate.set(true);
    let reopen = OpenOnDrop(Arc::clone(&gate));
    let first = {
        let (c, d) = (c.clone(), on_slow.clone());
        tokio::spawn(async move { c.allocate(&d, 1, 8, None).await })
    };
    eventually("the first call at the gate", || {
        gate.waiting.load(Ordering::SeqCst) == 1
    });
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let (c, d) = (c.clone(), on_slow.clone());
            tokio::spawn(async move { c.allocate(&d, 1, 8, None).await })
        })
        .collect();
    // Every waiting call ends at its deadline, while the first still holds
    // the turn at the gate: none ran.
    eventually("the waiting calls end", || {
        waiting.iter().all(|w| w.is_finished())
    });
    for w in std::iter::once(first).chain(waiting) {
        match w.await.unwrap() {
            // Cancelled: to the client, the call may have run.
            Err(ClientError::OutcomeUnknown(why)) => {
                assert!(why.contains("Timeout expired"), "{why}")
            }
            other => panic!("a call past its deadline: {other:?}"),
        }
    }
    assert_eq!(gate.waiting.load(Ordering::SeqCst), 1, "the gate holds");
    drop(reopen);
    // The first call's allocation and the free that undoes it; the calls
    // behind it never reached the store.
    let store = Arc::clone(srv.store(0));
    eventually("the stalled allocation freed again", || {
        store.stats().commits == commits + 2
    });
    assert_eq!(store.status().space.used_blocks, used);
    store.verify().unwrap();
    srv.stop().await;
}

/// An allocation whose call is cancelled while its sync waits for the
/// device is freed again once the sync is done, and one whose call is gone
/// before the device's owner takes it never runs: a cancelled Allocate
/// leaves nothing allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_finished_after_its_call_was_cancelled_is_freed_again() {
    let mut cfg = Config::default();
    cfg.limits.request_timeout = Duration::from_millis(200);
    let (srv, gate) = gated_server(cfg).await;
    let c = srv.client().await.with_retry_for(Duration::ZERO);
    let on_slow = DeviceId::Name("slow".into());
    let store = Arc::clone(srv.store(0));
    let kept = c.allocate(&on_slow, 1, 8, None).await.unwrap();
    let used = store.status().space.used_blocks;

    gate.set(true);
    let reopen = OpenOnDrop(Arc::clone(&gate));
    for scattered in [false, true] {
        let got = if scattered {
            c.allocate_scattered(&on_slow, 24).await
        } else {
            c.allocate(&on_slow, 4, 8, None).await
        };
        match got {
            Err(ClientError::OutcomeUnknown(why)) => {
                assert!(why.contains("Timeout expired"), "{why}")
            }
            other => panic!("a call past its deadline: {other:?}"),
        }
    }
    drop(reopen);
    eventually("the cancelled allocations freed again", || {
        store.status().space.used_blocks == used
    });
    store.check_allocated(kept[0]).unwrap();
    store.verify().unwrap();
    // The device serves on.
    c.allocate(&on_slow, 1, 8, None).await.unwrap();
    assert_eq!(store.status().space.used_blocks, used + 8);
    srv.stop().await;
}

/// The calls that queue while a device syncs are committed together by
/// its owner: one journal entry and one sync for all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_queued_during_a_sync_share_the_next_one() {
    let (srv, gate) = gated_server(Config::default()).await;
    let c = srv.client().await;
    let on_slow = DeviceId::Name("slow".into());
    let dev = Arc::clone(&srv.server.devices()[0]);
    let store = Arc::clone(srv.store(0));
    let kept = c.allocate(&on_slow, 1, 8, None).await.unwrap();

    gate.set(true);
    let reopen = OpenOnDrop(Arc::clone(&gate));
    let syncs = store.stats().syncs;
    let first = {
        let (c, d) = (c.clone(), on_slow.clone());
        tokio::spawn(async move { c.allocate(&d, 1, 8, None).await })
    };
    eventually("the first call at the gate", || {
        gate.waiting.load(Ordering::SeqCst) == 1
    });
    // Allocations and a free of an earlier allocation, queued behind it.
    let mut queued: Vec<_> = (0..6)
        .map(|_| {
            let (c, d) = (c.clone(), on_slow.clone());
            tokio::spawn(async move { c.allocate(&d, 2, 4, None).await })
        })
        .collect();
    queued.push({
        let (c, d) = (c.clone(), on_slow.clone());
        tokio::spawn(async move { c.free(&d, &kept).await.map(|_| Vec::new()) })
    });
    eventually("seven calls queued", || dev.queued_calls() == 7);
    drop(reopen);
    first.await.unwrap().unwrap();
    for q in queued {
        q.await.unwrap().unwrap();
    }
    assert_eq!(
        store.stats().syncs - syncs,
        2,
        "the first call's sync, then one for the seven"
    );
    assert_eq!(dev.queued_calls(), 0);
    store.verify().unwrap();
    srv.stop().await;
}

/// An allocation with a request id whose call was cancelled while its sync
/// waited used to be freed again like any other, yet its result was kept
/// for the id: the resend got blocks that were free (and could be handed
/// to anyone). Now it stays allocated for the resend, which gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_allocation_with_a_request_id_stays_allocated_for_its_resend() {
    use blockalloc_service::pb;
    let mut cfg = Config::default();
    cfg.limits.request_timeout = Duration::from_millis(200);
    let (srv, gate) = gated_server(cfg).await;
    let c = srv.client().await;
    let store = Arc::clone(srv.store(0));
    let used = store.status().space.used_blocks;
    let call = || pb::AllocateRequest {
        device: Some(pb::DeviceRef {
            r#ref: Some(pb::device_ref::Ref::Name("slow".into())),
        }),
        count: 2,
        size: Some(pb::allocate_request::Size::Blocks(8)),
        request_id: 77,
        ..Default::default()
    };
    gate.set(true);
    let reopen = OpenOnDrop(Arc::clone(&gate));
    let e = c.rpc().allocate(call()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Cancelled, "{e:?}");
    drop(reopen);
    // The sync is done: the allocation is durable and stays.
    eventually("the cancelled allocation durable", || {
        store.status().space.used_blocks == used + 16
    });
    let r = c.rpc().allocate(call()).await.unwrap().into_inner();
    assert!(r.replayed, "{r:?}");
    for o in &r.objects {
        let e = blockalloc::Extent::new(o.extents[0].start, o.extents[0].len).unwrap();
        store.check_allocated(e).unwrap();
    }
    // Whatever the owner does next round, nothing frees it.
    c.allocate(&DeviceId::Name("slow".into()), 1, 8, None)
        .await
        .unwrap();
    assert_eq!(store.status().space.used_blocks, used + 24);
    store.verify().unwrap();
    srv.stop().await;
}
