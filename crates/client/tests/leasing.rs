//! The leasing allocator against an in-process server on a loopback port
//! over memory devices: a lease, local allocation, commits, frees, a
//! recall that takes the lease back, and a commit cut off after it was
//! sent, resent by itself and applied once.

// The service tests' helpers: an in-process server, a gated device.
#[path = "../../service/tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blockalloc_client::{pb, Client, Extent, LeaseOptions, LeasingAllocator};
use blockalloc_service::{ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use common::{quick, start_a_recall, wait_until, GatedDevice, OpenOnDrop, SyncGate, TestServer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const DEVICE_BYTES: u64 = 64 << 20;

/// A leasing allocator on device 0 that commits only when asked (or on
/// close), so that each test decides when a batch goes out.
fn committing_on_demand(c: &Client) -> LeasingAllocator {
    LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks: 16,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    )
}

/// Device 0 as the server reports it, after checking the store's
/// invariants.
async fn dev0(srv: &TestServer) -> pb::DeviceStatus {
    srv.state().await[0].clone()
}

/// Blocks of device 0 allocated beyond the store's own metadata: the
/// committed allocations.
async fn committed_blocks(srv: &TestServer) -> u64 {
    let d = dev0(srv).await;
    d.used_blocks - d.meta_blocks
}

fn disjoint(extents: &[Extent]) -> bool {
    let mut v = extents.to_vec();
    v.sort_by_key(|e| e.start());
    v.windows(2).all(|w| w[0].end() <= w[1].start())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_are_local_and_durable_once_committed() {
    let srv = TestServer::start(&[DEVICE_BYTES], quick()).await;
    let c = srv.client().await;
    let alloc = committing_on_demand(&c);

    let mut mine = Vec::new();
    for _ in 0..10 {
        mine.push(alloc.allocate(16).await.unwrap());
    }
    assert!(disjoint(&mine), "{mine:?}");
    let st = alloc.stats();
    assert_eq!((st.local_allocations, st.remote_allocations), (10, 0));
    assert_eq!((st.leases, st.commit_calls), (1, 0));
    assert_eq!(alloc.lease_ids().len(), 1);
    // Pending: the server holds them in the lease, not as allocations.
    assert_eq!(committed_blocks(&srv).await, 0);
    assert_eq!(dev0(&srv).await.leases, 1);

    alloc.commit().await.unwrap();
    assert_eq!(committed_blocks(&srv).await, 160);
    assert_eq!(alloc.stats().commit_calls, 1);
    // Nothing new: no round, no call.
    alloc.commit().await.unwrap();
    assert_eq!(alloc.stats().commit_calls, 1);

    alloc.close().await.unwrap();
    let d = dev0(&srv).await;
    assert_eq!((d.leases, d.leased_unused_blocks), (0, 0));
    assert_eq!(d.used_blocks - d.meta_blocks, 160, "closing frees nothing");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frees_take_effect_with_the_next_commit_and_pending_ones_at_once() {
    let srv = TestServer::start(&[DEVICE_BYTES], quick()).await;
    let c = srv.client().await;
    let alloc = committing_on_demand(&c);
    let kept = alloc.allocate(32).await.unwrap();
    let freed = alloc.allocate(32).await.unwrap();
    alloc.commit().await.unwrap();
    assert_eq!(committed_blocks(&srv).await, 64);

    alloc.free(freed).await.unwrap();
    assert_eq!(committed_blocks(&srv).await, 64, "not before the commit");
    alloc.commit().await.unwrap();
    assert_eq!(committed_blocks(&srv).await, 32);
    let calls = alloc.stats().commit_calls;

    // Freed before it was committed: the server never hears of it.
    let undone = alloc.allocate(8).await.unwrap();
    alloc.free(undone).await.unwrap();
    alloc.commit().await.unwrap();
    assert_eq!(alloc.stats().commit_calls, calls);
    assert_eq!(committed_blocks(&srv).await, 32);

    // The committed allocation is the server's to free now, once.
    alloc.close().await.unwrap();
    let dev = blockalloc_client::DeviceId::Index(0);
    assert_eq!(c.free(&dev, &[kept]).await.unwrap(), 32);
    assert!(c.free(&dev, &[kept]).await.is_err(), "freed twice");
    assert_eq!(committed_blocks(&srv).await, 0);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_makes_the_client_commit_and_give_its_lease_back() {
    let srv = TestServer::start(&[DEVICE_BYTES], quick()).await;
    let c = srv.client().await;
    let alloc = committing_on_demand(&c);
    let a = alloc.allocate(16).await.unwrap();
    let b = alloc.allocate(16).await.unwrap();
    let held = alloc.lease_ids();
    assert_eq!(held.len(), 1);

    start_a_recall(&c).await;
    // The watcher retires the lease; the background task commits what it
    // holds and releases it, with no `commit` call.
    wait_until("the recalled lease is given back", || async {
        alloc.lease_ids().is_empty()
    })
    .await;
    let d = dev0(&srv).await;
    assert_eq!(d.leased_unused_blocks, 0);
    assert_eq!(d.used_blocks - d.meta_blocks, 32);
    // Both allocations were committed on the way: nothing is lost.
    alloc.commit().await.unwrap();
    assert_eq!(alloc.stats().lost, 0);
    assert!(disjoint(&[a, b]));
    alloc.close().await.unwrap();
    srv.stop().await;
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

/// A commit whose connection breaks while the server applies it is resent
/// by itself, with the same sequence number, which the server answers
/// without applying it again (or refuses while the first send is still
/// being applied, which is resent too): `commit` returns once it is
/// durable, and nothing is lost or applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_cut_off_after_it_was_sent_is_resent_and_applied_once() {
    let gate = Arc::new(SyncGate::default());
    let _open = OpenOnDrop(Arc::clone(&gate));
    let dev = GatedDevice {
        mem: MemDevice::new(DEVICE_BYTES),
        gate: Arc::clone(&gate),
    };
    let store = Arc::new(Store::format(dev, FormatOptions::default()).unwrap());
    let server = Server::new(vec![ServedDevice::new("dev0", store)], quick()).unwrap();
    let srv = TestServer::serving(server).await;
    let (addr, breaks) = breakable_proxy(srv.addr).await;
    let c = Client::connect(&addr).await.unwrap();
    let alloc = Arc::new(committing_on_demand(&c));
    let mut mine = Vec::new();
    for _ in 0..4 {
        mine.push(alloc.allocate(16).await.unwrap());
    }

    gate.set(true);
    let committing = {
        let alloc = Arc::clone(&alloc);
        tokio::spawn(async move { alloc.commit().await })
    };
    // The commit is at the device: the server applies it.
    gate.held().await;
    breaks.send_modify(|n| *n += 1);
    // Resent while the first send may still be applying.
    wait_until("the cut-off commit is resent", || async {
        alloc.stats().commit_calls >= 2
    })
    .await;
    gate.set(false);
    tokio::time::timeout(Duration::from_secs(60), committing)
        .await
        .expect("the commit returns once the resend is answered")
        .unwrap()
        .expect("a cut-off commit is resent until answered");
    assert_eq!(alloc.stats().lost, 0);
    assert_eq!(committed_blocks(&srv).await, 64);
    // Every allocation is the server's exactly once.
    let direct = srv.client().await;
    let device = blockalloc_client::DeviceId::Index(0);
    assert_eq!(direct.free(&device, &mine).await.unwrap(), 64);
    assert_eq!(committed_blocks(&srv).await, 0);

    let alloc = Arc::into_inner(alloc).expect("the commit task has ended");
    alloc.close().await.unwrap();
    srv.stop().await;
}
