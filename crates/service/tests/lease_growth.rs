//! Leases that grow: Lease with `extend_lease_id` adds to a live lease,
//! and Commit with `recycle_frees` hands the freed blocks back to the
//! lease. In process, through the raw generated client.

use std::sync::Arc;
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{Client, DeviceId};
use blockalloc_service::pb;
use blockalloc_service::{Config, ServedDevice, Server};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};
use tonic::Code;

mod common;
use common::{before_expiry, expiring, quick, start_a_recall, wait_until, TestServer, SHORT_TTL};

/// Leases that live long enough for a test that does not wait for them.
fn long_leases() -> Config {
    Config {
        lease_ttl: Duration::from_secs(30),
        ..quick()
    }
}

async fn status(c: &Client, i: usize) -> pb::DeviceStatus {
    c.status().await.unwrap()[i].clone()
}

/// The live leases as Status lists them.
async fn leases(c: &Client) -> Vec<pb::LeaseStatus> {
    c.rpc()
        .status(pb::StatusRequest {
            leases: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .leases
}

/// A Lease request for `want` blocks on device `dev`, extending `extend`
/// (0: a new lease).
fn ask(dev: u32, want: u64, extend: u64) -> pb::LeaseRequest {
    pb::LeaseRequest {
        device: Some(pb::DeviceRef {
            r#ref: Some(pb::device_ref::Ref::Index(dev)),
        }),
        client_id: "grow".into(),
        min_blocks: 1,
        want_blocks: want,
        extend_lease_id: extend,
        ..Default::default()
    }
}

async fn lease(c: &Client, dev: u32, want: u64, extend: u64) -> Result<pb::LeaseResponse, Code> {
    c.rpc()
        .lease(ask(dev, want, extend))
        .await
        .map(|r| r.into_inner())
        .map_err(|s| {
            if matches!(s.code(), Code::NotFound | Code::FailedPrecondition) {
                assert!(s.message().contains("take a new lease"), "{}", s.message());
            }
            s.code()
        })
}

fn pbx(e: Extent) -> pb::Extent {
    pb::Extent {
        start: e.start(),
        len: e.len(),
    }
}

fn x(e: &pb::Extent) -> Extent {
    Extent::new(e.start, e.len).unwrap()
}

async fn commit(
    c: &Client,
    id: u64,
    seq: u64,
    allocs: &[Extent],
    frees: &[Extent],
) -> Result<pb::CommitResponse, tonic::Status> {
    c.rpc()
        .commit(pb::CommitRequest {
            lease_id: id,
            sequence: seq,
            allocations: allocs.iter().copied().map(pbx).collect(),
            frees: frees.iter().copied().map(pbx).collect(),
            recycle_frees: true,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// Space accounting that a refused call must leave as it was.
fn space(st: &pb::DeviceStatus) -> (u64, u64, u64, u64) {
    (
        st.used_blocks,
        st.free_blocks,
        st.leased_unused_blocks,
        st.leases,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_grows_one_lease_and_one_release_returns_all_of_it() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let free0 = status(&c, 0).await.free_blocks;
    let first = lease(&c, 0, 100, 0).await.unwrap();
    let more = lease(&c, 0, 300, first.lease_id).await.unwrap();
    assert_eq!(more.lease_id, first.lease_id);
    let added: u64 = more.extents.iter().map(|e| e.len).sum();
    assert_eq!(added, 300, "the reply lists only the added space");
    let st = status(&c, 0).await;
    assert_eq!(st.leases, 1);
    assert_eq!(st.leased_unused_blocks, 400);
    assert_eq!(st.free_blocks, free0 - 400);
    let listed = leases(&c).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].granted_blocks, 400);
    assert_eq!(listed[0].unused_blocks, 400);
    // The added space is the lease's: an allocation in it commits.
    let inside = Extent::new(more.extents[0].start, 10).unwrap();
    commit(&c, first.lease_id, 1, &[inside], &[]).await.unwrap();
    srv.store(0).check_allocated(inside).unwrap();
    let released = c
        .rpc()
        .release(pb::ReleaseRequest {
            lease_id: first.lease_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.released_blocks, 390);
    let st = srv.state().await[0].clone();
    assert_eq!((st.leases, st.leased_unused_blocks), (0, 0));
    assert_eq!(st.free_blocks, free0 - 10);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extending_an_ended_unknown_or_other_devices_lease_is_refused_and_changes_nothing() {
    let srv = TestServer::start(&[64 << 20, 64 << 20], quick()).await;
    let c = srv.client().await;
    let on1 = lease(&c, 1, 64, 0).await.unwrap();
    let ended = lease(&c, 0, 64, 0).await.unwrap();
    c.rpc()
        .release(pb::ReleaseRequest {
            lease_id: ended.lease_id,
            ..Default::default()
        })
        .await
        .unwrap();
    let before: Vec<_> = srv.state().await.iter().map(space).collect();
    let cases = [
        (ended.lease_id, Code::FailedPrecondition),
        // Never granted (a lease of an earlier server run looks like this).
        (12_345, Code::FailedPrecondition),
        // Live, but on device 1 while the request names device 0.
        (on1.lease_id, Code::InvalidArgument),
    ];
    for (id, code) in cases {
        assert_eq!(lease(&c, 0, 64, id).await.unwrap_err(), code, "lease {id}");
        let after: Vec<_> = srv.state().await.iter().map(space).collect();
        assert_eq!(after, before, "lease {id}: nothing changed");
    }
    // A refused extension of a live lease (too large for the device's free
    // space) leaves it as it was.
    let huge = status(&c, 1).await.free_blocks;
    let r = c
        .rpc()
        .lease(pb::LeaseRequest {
            min_blocks: huge,
            ..ask(1, huge, on1.lease_id)
        })
        .await
        .unwrap_err();
    assert_eq!(r.code(), Code::ResourceExhausted);
    assert_eq!(leases(&c).await[0].granted_blocks, 64);
    assert_eq!(status(&c, 1).await.leased_unused_blocks, 64);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_blocks_are_reserved_for_the_lease_and_a_resent_commit_lists_them_again() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let l = lease(&c, 0, 256, 0).await.unwrap();
    let base = l.extents[0].start;
    let obj = Extent::new(base + 16, 32).unwrap();
    commit(&c, l.lease_id, 1, &[obj], &[]).await.unwrap();
    let st0 = status(&c, 0).await;
    let r = commit(&c, l.lease_id, 2, &[], &[obj]).await.unwrap();
    assert_eq!(r.recycled, vec![pbx(obj)]);
    assert_eq!(r.unused_blocks, 256);
    // Neither free nor allocated: held by the lease.
    let st = srv.state().await[0].clone();
    assert_eq!(st.free_blocks, st0.free_blocks);
    assert_eq!(st.used_blocks, st0.used_blocks - 32);
    assert_eq!(st.leased_unused_blocks, 256);
    assert_eq!(leases(&c).await[0].granted_blocks, 256 + 32);
    assert!(srv.store(0).check_allocated(obj).is_err());
    let e = c.free(&DeviceId::Index(0), &[obj]).await.unwrap_err();
    assert!(
        e.to_string().contains("free"),
        "a free of leased space: {e}"
    );
    // A per-call allocation aimed right at it gets other space.
    let other = c
        .allocate(&DeviceId::Index(0), 1, 32, Some(obj.start()))
        .await
        .unwrap()[0];
    assert!(!other.overlaps(&obj), "{other} is in the lease");
    // The resent commit answers the same list and applies nothing again.
    let again = commit(&c, l.lease_id, 2, &[], &[obj]).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.recycled, r.recycled);
    assert_eq!(status(&c, 0).await.leased_unused_blocks, 256);
    // The lease allocates inside the recycled blocks.
    let reuse = Extent::new(obj.start(), 8).unwrap();
    commit(&c, l.lease_id, 3, &[reuse], &[]).await.unwrap();
    srv.store(0).check_allocated(reuse).unwrap();
    srv.store(0).verify().unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_returns_its_recycled_blocks_to_free_space() {
    let (srv, c, free0, kept, freed) = before_expiry(SHORT_TTL, || async {
        let srv = TestServer::start(&[64 << 20], expiring()).await;
        let c = srv.client().await;
        let free0 = status(&c, 0).await.free_blocks;
        let l = lease(&c, 0, 256, 0).await.unwrap();
        let base = l.extents[0].start;
        let kept = Extent::new(base, 8).unwrap();
        let freed = Extent::new(base + 8, 8).unwrap();
        commit(&c, l.lease_id, 1, &[kept, freed], &[])
            .await
            .unwrap();
        let r = commit(&c, l.lease_id, 2, &[], &[freed]).await.unwrap();
        assert_eq!(r.recycled, vec![pbx(freed)]);
        (srv, c, free0, kept, freed)
    })
    .await;
    // Not renewed: it expires, and all but the kept object is free.
    wait_until("the lease expires", || async {
        status(&c, 0).await.leases == 0
    })
    .await;
    let st = srv.state().await[0].clone();
    assert_eq!((st.leases, st.leased_unused_blocks), (0, 0));
    assert_eq!(st.free_blocks, free0 - 8);
    assert!(srv.store(0).check_allocated(freed).is_err());
    srv.store(0).check_allocated(kept).unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_but_unallocated_blocks_are_free_after_a_crash() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let store = Store::format(Arc::clone(&dev), FormatOptions::default()).unwrap();
    let server = Server::new(vec![ServedDevice::new("dev0", Arc::new(store))], quick()).unwrap();
    let srv = TestServer::serving(server).await;
    let c = srv.client().await;
    let l = lease(&c, 0, 256, 0).await.unwrap();
    let base = l.extents[0].start;
    let kept = Extent::new(base, 8).unwrap();
    let freed = Extent::new(base + 8, 24).unwrap();
    let reused = Extent::new(base + 8, 4).unwrap();
    commit(&c, l.lease_id, 1, &[kept, freed], &[])
        .await
        .unwrap();
    let r = commit(&c, l.lease_id, 2, &[], &[freed]).await.unwrap();
    assert_eq!(r.recycled, vec![pbx(freed)]);
    commit(&c, l.lease_id, 3, &[reused], &[]).await.unwrap();
    // The power goes while the lease holds the rest of the recycled blocks.
    let (reopened, _) = Store::open(MemDevice::from_image(dev.image())).unwrap();
    reopened.check_allocated(kept).unwrap();
    reopened.check_allocated(reused).unwrap();
    let rest = Extent::new(base + 12, 20).unwrap();
    assert!(reopened.check_allocated(rest).is_err());
    assert!(reopened
        .committed_free_extents()
        .iter()
        .any(|f| f.contains(&rest)));
    assert_eq!(
        reopened.status().space.used_blocks,
        reopened.layout().meta_blocks + 8 + 4
    );
    reopened.verify().unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_frees_are_recycled_while_the_device_is_recalled() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let l = lease(&c, 0, 256, 0).await.unwrap();
    let obj = Extent::new(l.extents[0].start, 32).unwrap();
    commit(&c, l.lease_id, 1, &[obj], &[]).await.unwrap();
    // A per-call allocation that found no room starts a recall.
    start_a_recall(&c).await;
    let free = status(&c, 0).await.free_blocks;
    let r = commit(&c, l.lease_id, 2, &[], &[obj]).await.unwrap();
    assert!(r.recall);
    assert!(r.recycled.is_empty(), "{:?}", r.recycled);
    let st = status(&c, 0).await;
    assert_eq!(st.free_blocks, free + 32, "the freed blocks are free");
    assert_eq!(st.leased_unused_blocks, 224);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frees_are_recycled_near_full_until_a_recall_starts() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let l = lease(&c, 0, 256, 0).await.unwrap();
    let obj = Extent::new(l.extents[0].start, 32).unwrap();
    commit(&c, l.lease_id, 1, &[obj], &[]).await.unwrap();
    // Fill per call until less than 1/16 of the device is unleased and
    // free: renewals now ask for leases back, but no grant was refused.
    let st = status(&c, 0).await;
    let fill = st.free_blocks - st.capacity_blocks / 32;
    c.allocate(&DeviceId::Index(0), 1, fill, None)
        .await
        .unwrap();
    let r = commit(&c, l.lease_id, 2, &[], &[obj]).await.unwrap();
    assert!(!r.recall);
    // The freed blocks join the lease, where its engine fits them exactly;
    // in the store no lease would take them before the per-call end.
    assert_eq!(r.recycled, vec![pbx(obj)]);
    assert_eq!(status(&c, 0).await.leased_unused_blocks, 256);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_lands_next_to_the_lease_when_hinted_there() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let l = lease(&c, 0, 128, 0).await.unwrap();
    let end = l.extents[0].start + l.extents[0].len;
    let more = c
        .rpc()
        .lease(pb::LeaseRequest {
            hint: Some(end),
            ..ask(0, 128, l.lease_id)
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(x(&more.extents[0]).start(), end);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_allocation_waits_for_leases_holding_the_room_it_needs() {
    // Short leases: the holder below never renews, so its lease expires
    // within one TTL, as a recalled holder's would come back. The server
    // waits for that a TTL and a margin: a run that a loaded machine
    // delays past it may be refused, and is run again.
    before_expiry(SHORT_TTL, || async {
        let srv = TestServer::start(&[64 << 20], expiring()).await;
        let c = srv.client().await;
        let mut id = 0;
        while let Ok(l) = lease(&c, 0, 4096, id).await {
            id = l.lease_id;
        }
        let st = status(&c, 0).await;
        assert!(st.leased_unused_blocks > 0);
        let want = st.free_blocks + 1;
        assert!(
            want <= st.free_blocks + st.leased_unused_blocks,
            "the device has room for {want} blocks, outside the leases only {}",
            st.free_blocks
        );
        let got = c
            .allocate(&DeviceId::Index(0), 1, want, None)
            .await
            .expect("the leases' space comes back and the allocation is served");
        assert_eq!(got[0].len(), want);
        let st = status(&c, 0).await;
        assert_eq!(st.leased_unused_blocks, 0);
        srv.store(0).verify().unwrap();
        srv.stop().await;
    })
    .await;
}

/// Regression: one Lease of 2^64-1 blocks on an empty server started a
/// device-wide recall ("nearly full" at 1 % used), so that, repeated, it
/// kept every other client from leases. A minimum no grant could meet, or
/// one above the grant ceiling with room to spare, is refused alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_no_space_could_satisfy_is_refused_alone_and_recalls_nothing() {
    let srv = TestServer::start(&[64 << 20], long_leases()).await;
    let c = srv.client().await;
    let held = lease(&c, 0, 64, 0).await.unwrap();
    let mut watch = c
        .rpc()
        .watch_recalls(pb::WatchRecallsRequest { device: None })
        .await
        .unwrap()
        .into_inner();
    assert!(!watch.message().await.unwrap().unwrap().recall);
    let free = status(&c, 0).await.free_blocks;
    // quick(): leases of at most 4096 blocks; a grant takes at most 1/8 of
    // the unleased free space (about 2000 blocks here).
    let hostile = [
        (u64::MAX, "largest lease"),
        (4097, "largest lease"),
        (3000, "unleased free"),
    ];
    for round in 0..10 {
        for (min, why) in hostile {
            let refused = c
                .rpc()
                .lease(pb::LeaseRequest {
                    client_id: "hostile".into(),
                    min_blocks: min,
                    ..Default::default()
                })
                .await
                .unwrap_err();
            assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
            assert!(
                refused.message().contains(why),
                "{min}: {}",
                refused.message()
            );
            assert!(!refused.message().contains("full"), "{}", refused.message());
        }
        // Another client keeps getting its grants.
        let good = c
            .rpc()
            .lease(pb::LeaseRequest {
                client_id: "good".into(),
                min_blocks: 16,
                want_blocks: 64,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("round {round}: {s:?}"))
            .into_inner();
        c.rpc()
            .release(pb::ReleaseRequest {
                lease_id: good.lease_id,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // No recall was announced, and the holder is not asked back.
    let quiet = tokio::time::timeout(Duration::from_millis(300), watch.message()).await;
    assert!(quiet.is_err(), "a recall was announced: {quiet:?}");
    let r = c
        .rpc()
        .renew(pb::RenewRequest {
            lease_id: held.lease_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.recall);
    assert_eq!(status(&c, 0).await.free_blocks, free, "nothing taken");
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_reaches_every_watcher_and_the_streams_end_when_the_server_stops() {
    let srv = TestServer::start(&[64 << 20, 64 << 20], quick()).await;
    let c = srv.client().await;
    let watch = |dev: u32| {
        let c = c.clone();
        async move {
            c.rpc()
                .watch_recalls(pb::WatchRecallsRequest {
                    device: Some(pb::DeviceRef {
                        r#ref: Some(pb::device_ref::Ref::Index(dev)),
                    }),
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let (mut a, mut b, mut other) = (watch(0).await, watch(0).await, watch(1).await);
    // The first message is the state now: no recall.
    for s in [&mut a, &mut b, &mut other] {
        let e = s.message().await.unwrap().unwrap();
        assert!(!e.recall);
    }
    start_a_recall(&c).await;
    for (s, dev) in [(&mut a, 0), (&mut b, 0)] {
        let e = tokio::time::timeout(Duration::from_secs(5), s.message())
            .await
            .expect("the recall is pushed at once")
            .unwrap()
            .unwrap();
        assert!(e.recall);
        assert_eq!(e.device_index, dev);
    }
    // Only device 0 is recalled; a recall in progress is not announced
    // again.
    start_a_recall(&c).await;
    let quiet = tokio::time::timeout(Duration::from_millis(300), other.message()).await;
    assert!(quiet.is_err(), "device 1 has no recall: {quiet:?}");
    let quiet = tokio::time::timeout(Duration::from_millis(300), a.message()).await;
    assert!(quiet.is_err(), "one recall, one message: {quiet:?}");
    // An unknown device is NOT_FOUND.
    let unknown = c
        .rpc()
        .watch_recalls(pb::WatchRecallsRequest {
            device: Some(pb::DeviceRef {
                r#ref: Some(pb::device_ref::Ref::Index(7)),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    // A graceful stop ends the open streams instead of waiting for them.
    tokio::time::timeout(Duration::from_secs(10), srv.stop())
        .await
        .expect("the server stops with streams open");
    for s in [&mut a, &mut b, &mut other] {
        assert!(!matches!(s.message().await, Ok(Some(_))));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_leasing_client_hands_its_lease_back_as_soon_as_a_recall_starts() {
    // Renewals every 20 minutes: without the pushed recall the idle client
    // below would keep its lease far longer than the wait below.
    let cfg = Config {
        lease_ttl: Duration::from_secs(3600),
        ..quick()
    };
    let srv = TestServer::start(&[64 << 20], cfg).await;
    let c = srv.client().await;
    let idle = blockalloc_client::LeasingAllocator::new(
        srv.client().await,
        blockalloc_client::LeaseOptions {
            device: DeviceId::Index(0),
            min_blocks: 16,
            commit_interval: Duration::from_secs(3600),
            client_id: "idle".into(),
            ..Default::default()
        },
    );
    let e = idle.allocate(16).await.unwrap();
    idle.commit().await.unwrap();
    assert!(status(&c, 0).await.leased_unused_blocks > 0);
    // Let the watcher's stream open before the recall.
    tokio::time::sleep(Duration::from_millis(200)).await;
    start_a_recall(&c).await;
    // The server ends the lease when the release arrives; the client
    // forgets it when the reply does.
    wait_until("the idle client hands its lease back", || async {
        status(&c, 0).await.leased_unused_blocks == 0 && idle.lease_ids().is_empty()
    })
    .await;
    // Its committed allocation stays.
    srv.store(0).check_allocated(e).unwrap();
    idle.close().await.unwrap();
    srv.store(0).verify().unwrap();
    srv.stop().await;
}
