//! The lease calls, raw: grants and their sizes, renewals, expiry,
//! recalls, what a reply says a further grant could take.
//!
//! In process: a real tonic server on `127.0.0.1:0` over in-memory stores,
//! driven through the client library and the raw generated client.

use std::sync::Arc;
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{Client, DeviceId};
use blockalloc_service::pb;
use blockalloc_service::Config;
use tonic::Code;

mod common;
use common::{
    before_expiry, commit, expiring, lease, quick, release, renew, start_a_recall, status,
    wait_until, x, TestServer, SHORT_TTL,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lease_expires_and_its_space_returns() {
    let (srv, c, free0, l) = before_expiry(SHORT_TTL, || async {
        let (srv, c) = TestServer::start_with_client(&[64 << 20], expiring()).await;
        let free0 = status(&c, 0).await.free_blocks;
        let l = lease(&c, 100, 1000).await;
        let le = l.extents[0];
        commit(&c, l.lease_id, 1, vec![x(le.start, 10)], vec![])
            .await
            .unwrap();
        let st = status(&c, 0).await;
        assert_eq!(st.leased_unused_blocks, 990);
        assert_eq!(st.free_blocks, free0 - 1000);
        assert_eq!(st.leases, 1);
        (srv, c, free0, l)
    })
    .await;
    let le = l.extents[0];
    // The holder vanishes: no renewal, no release.
    wait_until("the lease expires", || async {
        status(&c, 0).await.leases == 0
    })
    .await;
    let st = status(&c, 0).await;
    assert_eq!(st.leased_unused_blocks, 0);
    assert_eq!(st.free_blocks, free0 - 10, "only the committed part stays");
    let e = commit(&c, l.lease_id, 2, vec![x(le.start + 10, 1)], vec![])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    srv.store(0)
        .check_allocated(Extent::new(le.start, 10).unwrap())
        .unwrap();
    srv.stop().await;
}

/// Renewals half a TTL apart keep a lease past its TTL. A renewal that
/// comes later than a TTL after the one before (a loaded machine) may find
/// the lease expired, as the server is free to do: the count starts over
/// with a new lease; one that comes sooner must find it live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_keep_a_lease_past_its_ttl() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], expiring()).await;
    let mut renewals = 0;
    let (mut id, mut last) = (0, std::time::Instant::now());
    while renewals < 4 {
        if renewals == 0 {
            last = std::time::Instant::now();
            id = lease(&c, 64, 256).await.lease_id;
        }
        tokio::time::sleep(SHORT_TTL / 2).await;
        let sent = std::time::Instant::now();
        let r = c
            .rpc()
            .renew(pb::RenewRequest {
                lease_id: id,
                ..Default::default()
            })
            .await;
        match r {
            Ok(r) => {
                let r = r.into_inner();
                assert!(!r.recall);
                assert_eq!(r.unused_blocks, 256);
                renewals += 1;
                last = sent;
            }
            Err(e) => {
                assert!(
                    last.elapsed() >= SHORT_TTL,
                    "renewed {:?} after the last renewal, yet gone: {e}",
                    last.elapsed()
                );
                assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
                renewals = 0;
            }
        }
    }
    // Two TTLs after its grant, Status lists it (unless, again, it was
    // left more than a TTL since the last renewal).
    let leases = status(&c, 0).await.leases;
    assert!(
        leases == 1 || last.elapsed() >= SHORT_TTL,
        "renewed, yet gone"
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_recalled_near_full() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let l = lease(&c, 64, 256).await;
    let r = renew(&c, l.lease_id).await;
    assert!(!r.recall);
    // Fill the device per call until less than 1/16 is unleased and free.
    let st = status(&c, 0).await;
    let fill = st.free_blocks - st.capacity_blocks / 32;
    c.allocate(&DeviceId::Index(0), 1, fill, None)
        .await
        .unwrap();
    let r = renew(&c, l.lease_id).await;
    assert!(r.recall, "the device is nearly full: the lease is recalled");
    // A grant is at most 1/8 of the unleased free space.
    let free = status(&c, 0).await.free_blocks;
    let g = lease(&c, 1, free).await;
    assert!(
        g.extents[0].len <= free / 8,
        "{} of {free}",
        g.extents[0].len
    );
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_size_grows_with_the_clients_rate() {
    let (srv, c) = TestServer::start_with_client(&[256 << 20], quick()).await;
    let mut sizes = Vec::new();
    for _ in 0..5 {
        let l = lease(&c, 16, 0).await;
        sizes.push(l.extents.iter().map(|e| e.len).sum::<u64>());
        release(&c, l.lease_id).await;
    }
    assert_eq!(sizes[0], 256, "a new client starts small");
    assert!(
        sizes.windows(2).all(|w| w[1] >= w[0]) && sizes[4] > sizes[0],
        "{sizes:?}"
    );
    assert!(sizes.iter().all(|&s| s <= 4096), "capped: {sizes:?}");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_say_how_much_a_further_grant_could_take() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let l = lease(&c, 64, 256).await;
    // The unleased free space above the per-call end: per_call_objects (8)
    // x the object (64 blocks) x (live leases + 1).
    let end = 8 * 64 * 2;
    let free = status(&c, 0).await.free_blocks;
    assert_eq!(l.grantable_blocks, free - end);
    let r = renew(&c, l.lease_id).await;
    assert_eq!(r.grantable_blocks, free - end);
    let a = l.extents[0].start;
    let r = commit(&c, l.lease_id, 1, vec![x(a, 10)], vec![])
        .await
        .unwrap();
    assert_eq!(r.grantable_blocks, free - end);
    // Nothing is grantable while a recall runs.
    start_a_recall(&c).await;
    let r = renew(&c, l.lease_id).await;
    assert!(r.recall);
    assert_eq!(r.grantable_blocks, 0);
    let r = commit(&c, l.lease_id, 2, vec![x(a + 10, 10)], vec![])
        .await
        .unwrap();
    assert!(r.recall);
    assert_eq!(r.grantable_blocks, 0);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_starts_over_at_the_initial_lease_size() {
    async fn lease_size(c: &Client) -> u64 {
        let l = lease(c, 16, 0).await;
        release(c, l.lease_id).await;
        l.extents[0].len
    }
    // Two leases within a TTL: the second is larger.
    let (srv, c) = before_expiry(SHORT_TTL, || async {
        let (srv, c) = TestServer::start_with_client(&[256 << 20], expiring()).await;
        assert_eq!([lease_size(&c).await, lease_size(&c).await], [256, 512]);
        (srv, c)
    })
    .await;
    // Silent for more than four TTLs: it starts over.
    tokio::time::sleep(SHORT_TTL * 4 + Duration::from_millis(100)).await;
    assert_eq!(lease_size(&c).await, 256);
    srv.stop().await;
}

/// The blocks of the largest lease a server with `cfg` grants on a fresh
/// store over a sparse file of `bytes`.
async fn largest_lease_on(bytes: u64, cfg: Config) -> u64 {
    use blockalloc_store::device::{DirectIo, FileDevice, Preallocation, ZeroMode};
    use blockalloc_store::{FormatOptions, Store};
    let dir = tempfile::tempdir().unwrap();
    let sparse = Preallocation {
        allocate: false,
        zero: ZeroMode::None,
    };
    let dev = FileDevice::create(dir.path().join("dev0"), bytes, sparse, DirectIo::Off).unwrap();
    let store = Store::format(dev, FormatOptions::default()).unwrap();
    let served = blockalloc_service::ServedDevice::new("dev0", Arc::new(store));
    let srv =
        TestServer::serving(blockalloc_service::Server::new(vec![served], cfg).unwrap()).await;
    let c = srv.client().await;
    let l = lease(&c, 64, u64::MAX).await;
    srv.stop().await;
    l.extents.iter().map(|e| e.len).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_lease_is_a_128th_of_a_large_device_unless_configured() {
    // 256 GiB: 2^26 blocks, of which a lease may hold 2^19 (above the
    // floor of 2^18).
    assert_eq!(largest_lease_on(256 << 30, quick_auto()).await, 1 << 19);
    // A smaller device keeps the floor (16 GiB: a 128th would be 2^15
    // blocks).
    assert_eq!(largest_lease_on(16 << 30, quick_auto()).await, 1 << 18);
    // A configured cap wins.
    let cfg = Config {
        lease_max_blocks: 1000,
        ..quick_auto()
    };
    assert_eq!(largest_lease_on(256 << 30, cfg).await, 1000);
}

/// `quick()` with the default, automatic largest lease.
fn quick_auto() -> Config {
    Config {
        lease_max_blocks: Config::default().lease_max_blocks,
        ..quick()
    }
}

/// A per-call allocation that needs the space a silent holder's lease
/// holds waits for it (a recall starts) and is served once the lease
/// expires, within its wait of one TTL and a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_allocation_waiting_for_a_silent_lease_is_served_when_it_expires() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], expiring()).await;
    // The holder never renews, commits or releases.
    let l = lease(&c, 1000, 1000).await;
    let held: u64 = l.extents.iter().map(|e| e.len).sum();
    let free = status(&c, 0).await.free_blocks;
    let got = c
        .allocate(&DeviceId::Index(0), 1, free + 1, None)
        .await
        .expect("served from the expired lease's space");
    assert_eq!(got.iter().map(|e| e.len()).sum::<u64>(), free + 1);
    let st = status(&c, 0).await;
    assert_eq!(st.leases, 0, "the lease expired");
    assert_eq!(st.free_blocks, free + held - (free + 1));
    srv.store(0).verify().unwrap();
    srv.stop().await;
}
