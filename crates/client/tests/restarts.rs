//! The client across a restart of the real server: the server restores
//! its leases and remembers its calls' request ids, so a leasing client
//! loses nothing and a per-call allocation cut off and resent runs once.
//! The client reaches the server through a proxy, whose address stays the
//! same when the server comes back on another port.

// The service tests' helpers: an in-process server, a gated device.
#[path = "../../service/tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use blockalloc_client::{Client, DeviceId, LeaseOptions, LeasingAllocator};
use blockalloc_service::{ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use common::{quick, wait_until, GatedDevice, OpenOnDrop, SyncGate, TestServer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const DEVICE_BYTES: u64 = 64 << 20;

/// A TCP proxy on a loopback port to the address the returned channel
/// holds. Each change of it breaks every connection open then; later ones
/// go to the new address.
async fn movable_proxy(to: SocketAddr) -> (String, watch::Sender<SocketAddr>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let (target, rx) = watch::channel(to);
    tokio::spawn(async move {
        while let Ok((mut a, _)) = l.accept().await {
            let mut moved = rx.clone();
            let to = *moved.borrow_and_update();
            tokio::spawn(async move {
                let Ok(mut b) = TcpStream::connect(to).await else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                    _ = moved.changed() => {}
                }
            });
        }
    });
    (addr, target)
}

/// A server of one memory device `dev0` over `dev` (formatted when new).
async fn serve(dev: Arc<MemDevice>) -> TestServer {
    let store = if blockalloc_store::is_formatted(&*dev) {
        Store::open(dev).unwrap().0
    } else {
        Store::format(dev, FormatOptions::default()).unwrap()
    };
    let server = Server::new(vec![ServedDevice::new("dev0", Arc::new(store))], quick()).unwrap();
    TestServer::serving(server).await
}

/// Blocks of device 0 allocated beyond the store's own metadata.
async fn committed_blocks(srv: &TestServer) -> u64 {
    let d = srv.state().await[0].clone();
    d.used_blocks - d.meta_blocks
}

/// A commit sent while the server is down is resent until the restarted
/// server, which restored the lease, answers it: `commit` returns, and no
/// allocation is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_within_the_ttl_loses_no_leased_allocation() {
    let mut dev = Arc::new(MemDevice::new(DEVICE_BYTES));
    let first = serve(Arc::clone(&dev)).await;
    let (addr, target) = movable_proxy(first.addr).await;
    let c = Client::connect(&addr).await.unwrap();
    let alloc = Arc::new(LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks: 16,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    ));
    let mut mine = Vec::new();
    for _ in 0..4 {
        mine.push(alloc.allocate(16).await.unwrap());
    }
    let lease = alloc.lease_ids();
    first.stop().await;
    let committing = {
        let alloc = Arc::clone(&alloc);
        tokio::spawn(async move { alloc.commit().await })
    };
    wait_until("the commit is tried while the server is down", || async {
        alloc.stats().commit_calls >= 2
    })
    .await;
    dev = Arc::new(MemDevice::from_image(dev.image()));
    let second = serve(Arc::clone(&dev)).await;
    target.send_replace(second.addr);
    tokio::time::timeout(Duration::from_secs(60), committing)
        .await
        .expect("the commit returns once the server is back")
        .unwrap()
        .expect("the restored lease takes the commit");
    assert_eq!(alloc.stats().lost, 0);
    assert_eq!(alloc.lease_ids(), lease, "the same lease");
    assert_eq!(committed_blocks(&second).await, 64);
    // And it serves on.
    let more = alloc.allocate(16).await.unwrap();
    alloc.commit().await.unwrap();
    mine.push(more);
    assert_eq!(committed_blocks(&second).await, 80);
    let alloc = Arc::into_inner(alloc).expect("the commit task has ended");
    alloc.close().await.unwrap();
    let st = c.status().await.unwrap();
    assert_eq!(st[0].leases, 0);
    second.stop().await;
}

/// An `Allocate` whose connection broke while the server applied it is
/// resent with its request id and answered with the first call's result:
/// the objects are allocated once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocate_cut_off_and_resent_allocates_once() {
    let gate = Arc::new(SyncGate::default());
    let _open = OpenOnDrop(Arc::clone(&gate));
    let dev = GatedDevice {
        mem: MemDevice::new(DEVICE_BYTES),
        gate: Arc::clone(&gate),
    };
    let store = Arc::new(Store::format(dev, FormatOptions::default()).unwrap());
    let server = Server::new(vec![ServedDevice::new("dev0", store)], quick()).unwrap();
    let srv = TestServer::serving(server).await;
    let (addr, target) = movable_proxy(srv.addr).await;
    let c = Client::connect(&addr).await.unwrap();
    let d0 = DeviceId::Index(0);
    c.allocate(&d0, 1, 4, None).await.unwrap();

    gate.set(true);
    let call = {
        let c = c.clone();
        tokio::spawn(async move { c.allocate(&d0, 2, 8, None).await })
    };
    gate.held().await;
    // The same address: only the connection breaks.
    target.send_replace(srv.addr);
    gate.set(false);
    let got = tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the resend is answered")
        .unwrap()
        .expect("a cut-off allocation is resent");
    assert_eq!(got.len(), 2);
    assert_eq!(committed_blocks(&srv).await, 4 + 16, "allocated once");
    assert_eq!(c.free(&DeviceId::Index(0), &got).await.unwrap(), 16);
    srv.stop().await;
}

/// A server that still serves a device another server has taken over (a
/// lower owner epoch) is fenced: the client sends the newest epoch it has
/// seen, the stale owner refuses, and the call is resent until the
/// device's owner answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_is_fenced_and_the_call_goes_to_the_owner() {
    let fresh = Arc::new(MemDevice::new(DEVICE_BYTES));
    Store::format(Arc::clone(&fresh), FormatOptions::default()).unwrap();
    let at_epoch = |dev: Arc<MemDevice>, epoch: u64| async move {
        let store = Store::open(dev).unwrap().0;
        let d = ServedDevice::new("dev0", Arc::new(store)).with_epoch(epoch);
        TestServer::serving(Server::new(vec![d], quick()).unwrap()).await
    };
    let owner = at_epoch(Arc::new(MemDevice::from_image(fresh.image())), 10).await;
    let stale = at_epoch(Arc::new(MemDevice::from_image(fresh.image())), 5).await;
    let (addr, target) = movable_proxy(owner.addr).await;
    let c = Client::connect(&addr).await.unwrap();
    let d0 = DeviceId::Index(0);
    c.allocate(&d0, 1, 4, None).await.unwrap();

    target.send_replace(stale.addr);
    // Connected to the stale owner (a status has no epoch to check), so
    // that every try below is its answer.
    wait_until("connected to the stale owner", || async {
        c.status().await.is_ok()
    })
    .await;
    let e = c
        .with_retry_for(Duration::from_millis(300))
        .allocate(&d0, 1, 4, None)
        .await
        .unwrap_err();
    assert!(
        e.is_unavailable() && e.to_string().contains("fenced"),
        "the stale owner refuses: {e}"
    );
    assert_eq!(committed_blocks(&stale).await, 0, "and runs nothing");

    let call = {
        let c = c.clone();
        tokio::spawn(async move { c.allocate(&DeviceId::Index(0), 1, 4, None).await })
    };
    target.send_replace(owner.addr);
    tokio::time::timeout(Duration::from_secs(60), call)
        .await
        .expect("the owner answers the resend")
        .unwrap()
        .unwrap();
    assert_eq!(committed_blocks(&owner).await, 8);
    stale.stop().await;
    owner.stop().await;
}
