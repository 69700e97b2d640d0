//! A device whose sync stalls holds up only the calls on it. Store work
//! runs inline on the runtime threads while a device answers fast, but
//! never on all of them: one is always left to read the other clients'
//! calls, so a stall in the middle of a sync cannot stop the server.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use blockalloc_client::{Client, ClientError, DeviceId};
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

/// Store work inline while a device answers within 1 ms: memory devices
/// do, even in a debug build.
fn inline() -> Config {
    Config {
        inline_store_us: blockalloc_service::MAX_INLINE_STORE_US,
        ..Config::default()
    }
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

/// Allocates on `dev` until three calls in a row ran inline.
async fn warm_up(c: &Client, on: &DeviceId, dev: &ServedDevice) {
    // Until it is measured its store work runs on the pool; while it
    // answers fast, inline.
    c.allocate(on, 1, 8, None).await.unwrap();
    assert_eq!(dev.store_calls_pooled(), 1);
    assert_eq!(dev.store_calls_inline(), 0);
    let mut in_a_row = 0;
    for _ in 0..100 {
        let inline = dev.store_calls_inline();
        c.allocate(on, 1, 8, None).await.unwrap();
        in_a_row = if dev.store_calls_inline() > inline {
            in_a_row + 1
        } else {
            0
        };
        if in_a_row == 3 {
            return;
        }
    }
    panic!("a memory device's store work never ran inline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_sync_holds_up_only_the_calls_on_its_device() {
    let (srv, gate) = gated_server(inline()).await;
    let slow_dev = Arc::clone(&srv.server.devices()[0]);
    let c = srv.client().await;
    let on_slow = DeviceId::Name("slow".into());
    let on_fast = DeviceId::Name("fast".into());
    warm_up(&c, &on_slow, &slow_dev).await;
    let before = slow_dev.store_calls_inline() + slow_dev.store_calls_pooled();
    let inline_before = slow_dev.store_calls_inline();

    // Its sync stalls with three calls on it: one inline (a runtime
    // thread waits at the gate), the other two on the pool, since the
    // last runtime thread is never given to store work.
    gate.set(true);
    let reopen = OpenOnDrop(Arc::clone(&gate));
    let stalled: Vec<_> = (0..3)
        .map(|_| {
            let c = c.clone();
            let d = on_slow.clone();
            tokio::spawn(async move { c.allocate(&d, 1, 8, None).await })
        })
        .collect();
    eventually("three calls on the stalled device", || {
        slow_dev.store_calls_inline() + slow_dev.store_calls_pooled() == before + 3
    });
    assert_eq!(gate.waiting.load(Ordering::SeqCst), 1, "one group syncs");
    // (None inline if the last calls happened to be slow.)
    assert!(
        slow_dev.store_calls_inline() - inline_before <= 1,
        "at most one runtime thread waits at the gate"
    );

    // Calls on the other device (inline too) go on meanwhile, and so do
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

    drop(reopen);
    for t in stalled {
        t.await.unwrap().unwrap();
    }
    srv.store(0).verify().unwrap();
    srv.store(1).verify().unwrap();
    srv.stop().await;
}

/// Calls waiting for their turn behind a call stalled in its store work
/// (inline, on a runtime thread) are cancelled at their deadline and change
/// nothing; the stalled call, whose work had started, finishes durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_behind_a_stalled_call_are_cancelled_at_their_deadline_and_change_nothing() {
    let mut cfg = inline();
    // One call at a time: the stalled call holds the turn.
    cfg.limits.max_in_flight_per_client = 1;
    cfg.limits.request_timeout = Duration::from_millis(200);
    let (srv, gate) = gated_server(cfg).await;
    let slow_dev = Arc::clone(&srv.server.devices()[0]);
    let c = srv.client().await;
    let on_slow = DeviceId::Name("slow".into());
    warm_up(&c, &on_slow, &slow_dev).await;
    let inline_before = slow_dev.store_calls_inline();
    let pooled_before = slow_dev.store_calls_pooled();
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
    assert_eq!(
        slow_dev.store_calls_inline(),
        inline_before + 1,
        "the first call runs inline"
    );
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
    drop(reopen);

    // The first call's work had started: it finishes, durable.
    let got = first.await.unwrap().unwrap();
    srv.store(0).check_allocated(got[0]).unwrap();
    for w in waiting {
        match w.await.unwrap() {
            // Cancelled: to the client, the call may have run.
            Err(ClientError::OutcomeUnknown(why)) => {
                assert!(why.contains("Timeout expired"), "{why}")
            }
            other => panic!("a call past its deadline: {other:?}"),
        }
    }
    // The cancelled calls never reached the store.
    assert_eq!(slow_dev.store_calls_inline(), inline_before + 1);
    assert_eq!(slow_dev.store_calls_pooled(), pooled_before);
    assert_eq!(srv.store(0).status().space.used_blocks, used + 8);
    srv.store(0).verify().unwrap();
    srv.stop().await;
}

/// An allocation whose call is cancelled while its store work waits for
/// the device (on the blocking pool; inline work cannot outlive its call)
/// is freed again once that work finishes: a cancelled Allocate leaves
/// nothing allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_finished_after_its_call_was_cancelled_is_freed_again() {
    let mut cfg = Config {
        inline_store_us: 0,
        ..Config::default()
    };
    cfg.limits.request_timeout = Duration::from_millis(200);
    let (srv, gate) = gated_server(cfg).await;
    let c = srv.client().await;
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
