//! What the leasing client does when the server says no: lost leases,
//! refused batches, giving leases back before reporting no space, refused
//! grants.
//!
//! In process: a real tonic server on `127.0.0.1:0` over in-memory stores,
//! driven through the client library and the raw generated client.

use std::sync::Arc;
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{ClientError, DeviceId, LeaseOptions, LeasingAllocator};
use blockalloc_service::Config;
use tonic::Code;

mod common;
use common::{
    before_expiry, committing_on_demand, counted, expiries, quick, release, renewing,
    start_a_recall, status, wait_until, TestServer, RENEWING_TTL,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_allocations_lost_with_their_lease_are_reported() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let alloc = committing_on_demand(&c, 32);
    let kept = alloc.allocate(8).await.unwrap();
    alloc.commit().await.unwrap();
    let lost = alloc.allocate(8).await.unwrap();
    // The server loses the lease (as after a restart): release it behind
    // the allocator's back.
    let ids = alloc.lease_ids();
    assert_eq!(ids.len(), 1);
    release(&c, ids[0]).await;
    match alloc.commit().await {
        Err(ClientError::Lost { extents }) => assert_eq!(extents, vec![lost]),
        other => panic!("expected the allocation to be reported lost: {other:?}"),
    }
    // The next allocation takes a new lease and commits.
    let next = alloc.allocate(8).await.unwrap();
    alloc.commit().await.unwrap();
    let store = srv.store(0);
    store.check_allocated(kept).unwrap();
    store.check_allocated(next).unwrap();
    assert!(store.check_allocated(lost).is_err() || lost == next);
    alloc.close().await.unwrap();
    assert_eq!(status(&c, 0).await.leases, 0);
    srv.stop().await;
}

/// Before it reports no space, a leasing allocator commits and gives
/// back its leases; allocations found lost on the way are reported to the
/// next `commit`, as always, and the allocation gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_found_while_giving_back_is_left_for_commit_and_no_space_is_the_answer() {
    // The renewal that finds the lease gone comes a third of a TTL on.
    before_expiry(RENEWING_TTL, || async {
        let (srv, c) = TestServer::start_with_client(&[64 << 20], renewing()).await;
        let alloc = committing_on_demand(&c, 32);
        let lost = alloc.allocate(8).await.unwrap();
        let ids = alloc.lease_ids();
        release(&c, ids[0]).await;
        // A renewal finds the lease gone; the loss waits for `commit`.
        wait_until("the loss is found", || async { alloc.lease_ids() != ids }).await;
        // A new lease serves the next allocation.
        let kept = alloc.allocate(8).await.unwrap();
        assert_ne!(alloc.lease_ids(), ids);
        // More than the device holds: the grant, then the per-call Allocate
        // are refused, and the allocator commits and gives back its lease
        // first.
        let e = alloc.allocate(1 << 20).await.unwrap_err();
        assert!(matches!(e, ClientError::NoSpace { .. }), "{e}");
        match alloc.commit().await {
            Err(ClientError::Lost { extents }) => assert_eq!(extents, vec![lost]),
            other => panic!("expected the allocation to be reported lost: {other:?}"),
        }
        assert_eq!(alloc.stats().lost, 1);
        alloc.commit().await.unwrap();
        srv.store(0).check_allocated(kept).unwrap();
        alloc.close().await.unwrap();
        srv.stop().await;
    })
    .await;
}

/// The same for a batch the server refuses while the allocator gives its
/// lease back: the refusal is the next `commit`'s to report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_found_while_giving_back_is_left_for_commit_and_no_space_is_the_answer() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let alloc = committing_on_demand(&c, 32);
    let kept = alloc.allocate(8).await.unwrap();
    // A free of a free block: the batch that carries it is refused.
    let last = status(&c, 0).await.capacity_blocks - 1;
    alloc.free(Extent::new(last, 1).unwrap()).await.unwrap();
    let e = alloc.allocate(1 << 20).await.unwrap_err();
    assert!(matches!(e, ClientError::NoSpace { .. }), "{e}");
    let e = alloc.commit().await.unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");
    alloc.commit().await.unwrap();
    assert_eq!(alloc.stats().lost, 0);
    srv.store(0).check_allocated(kept).unwrap();
    alloc.close().await.unwrap();
    srv.stop().await;
}

/// A batch refused in a round that no `commit` waited for (the periodic
/// one) is reported to the next `commit`, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_in_a_background_round_is_reported_to_the_next_commit() {
    let (srv, metrics) = TestServer::start_with_metrics(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let alloc = LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks: 32,
            commit_interval: Duration::from_millis(20),
            ..LeaseOptions::default()
        },
    );
    let kept = alloc.allocate(8).await.unwrap();
    let last = status(&c, 0).await.capacity_blocks - 1;
    alloc.free(Extent::new(last, 1).unwrap()).await.unwrap();
    // A periodic round sends the free; the server refuses it (before any
    // commit is asked for).
    let key = "blockalloc_requests_total{method=\"Commit\",code=\"FAILED_PRECONDITION\"}";
    wait_until("the periodic round's refusal", || async {
        counted(&metrics, key) >= 1
    })
    .await;
    let e = alloc.commit().await.unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition), "{e}");
    alloc.commit().await.unwrap();
    srv.store(0).check_allocated(kept).unwrap();
    alloc.close().await.unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_client_gives_back_its_own_lease_before_reporting_no_space() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let alloc = LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks: 1000,
            want_blocks: 2000,
            ..LeaseOptions::default()
        },
    );
    let first = alloc.allocate(1000).await.unwrap();
    assert_eq!(alloc.stats().leases, 1);
    let lease_end = first.start() + 2000;
    // Another client takes everything else, leaving 100 free blocks right
    // after the lease.
    let gap = c
        .allocate(&DeviceId::Index(0), 1, 100, Some(lease_end))
        .await
        .unwrap()[0];
    assert_eq!(gap.start(), lease_end, "the layout this test needs");
    let rest = status(&c, 0).await.free_blocks;
    c.allocate(&DeviceId::Index(0), 1, rest, None)
        .await
        .unwrap();
    c.free(&DeviceId::Index(0), &[gap]).await.unwrap();
    // 1050 blocks: more than the lease's 1000 left, more than any free run;
    // only the lease's rest and the gap together hold it.
    let big = alloc.allocate(1050).await.unwrap();
    assert_eq!(big, Extent::new(first.end(), 1050).unwrap());
    assert_eq!(alloc.stats().remote_allocations, 1);
    alloc.commit().await.unwrap();
    srv.store(0).check_allocated(first).unwrap();
    srv.store(0).check_allocated(big).unwrap();
    alloc.close().await.unwrap();
    srv.store(0).verify().unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_finds_no_room_gets_the_space_another_clients_lease_holds() {
    // The holder hands its lease back at its next renewal, a third of a
    // TTL on.
    before_expiry(RENEWING_TTL, || async {
        let cfg = Config {
            lease_max_blocks: 1 << 20,
            grant_fraction_divisor: 1,
            ..renewing()
        };
        let (srv, metrics) = TestServer::start_with_metrics(&[64 << 20], cfg).await;
        let c = srv.client().await;
        // The holder leases all the free space and uses a little of it.
        let free = status(&c, 0).await.free_blocks;
        let holder = LeasingAllocator::new(
            srv.client().await,
            LeaseOptions {
                min_blocks: free,
                want_blocks: free,
                client_id: "holder".into(),
                ..LeaseOptions::default()
            },
        );
        let kept = holder.allocate(16).await.unwrap();
        holder.commit().await.unwrap();
        assert_eq!(status(&c, 0).await.free_blocks, 0);
        // Another client finds no unleased room: its refused grant recalls the
        // holder's lease, which the holder hands back at its next renewal.
        let other = LeasingAllocator::new(
            c.clone(),
            LeaseOptions {
                min_blocks: 16,
                client_id: "other".into(),
                ..LeaseOptions::default()
            },
        );
        let got = other.allocate(16).await.unwrap();
        assert_eq!(expiries(&metrics), 0, "handed back, not expired");
        assert_eq!(other.stats().remote_allocations, 1);
        srv.store(0).check_allocated(got).unwrap();
        // The server freed the lease's space when the holder's Release arrived;
        // the holder forgets the lease when the reply does, a moment later.
        wait_until("the holder forgets its lease", || async {
            holder.lease_ids().is_empty()
        })
        .await;
        assert_eq!(holder.stats().lost, 0);
        // While the recall runs, the holder allocates per call too.
        let more = holder.allocate(16).await.unwrap();
        assert_eq!(holder.stats().remote_allocations, 1);
        assert_eq!(holder.stats().leases, 1);
        for e in [kept, more] {
            srv.store(0).check_allocated(e).unwrap();
        }
        let st = status(&c, 0).await;
        assert_eq!((st.leases, st.leased_unused_blocks), (0, 0));
        holder.close().await.unwrap();
        other.close().await.unwrap();
        srv.store(0).verify().unwrap();
        srv.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_free_does_not_cost_the_allocations_committed_with_it() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let alloc = committing_on_demand(&c, 64);
    let a = alloc.allocate(4).await.unwrap();
    alloc.commit().await.unwrap();
    let ids = alloc.lease_ids();
    // A double free of a committed extent, in the same batch as a new
    // allocation: a malformed batch (its frees overlap).
    alloc.free(a).await.unwrap();
    alloc.free(a).await.unwrap();
    let b = alloc.allocate(4).await.unwrap();
    let e = alloc.commit().await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");
    alloc.commit().await.unwrap();
    let store = srv.store(0);
    store.check_allocated(b).unwrap();
    store.check_allocated(a).unwrap();
    assert_eq!(alloc.lease_ids(), ids, "the lease is still in use");
    assert_eq!(alloc.stats().lost, 0);
    alloc.close().await.unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refused_a_lease_allocates_per_call_without_asking_again_at_once() {
    use blockalloc_service::{ServedDevice, Server};
    use blockalloc_store::device::MemDevice;
    use blockalloc_store::{FormatOptions, Store};
    // The recall, and with it the refusals, last a TTL: a run that takes
    // longer may see a grant.
    let ttl = Duration::from_secs(2);
    before_expiry(ttl, move || async move {
        let store = Store::format(MemDevice::new(64 << 20), FormatOptions::default()).unwrap();
        let server = Server::new(
            vec![ServedDevice::new("dev0", Arc::new(store))],
            Config {
                lease_ttl: ttl,
                ..quick()
            },
        )
        .unwrap();
        let (srv, metrics) = TestServer::serving_with_metrics(server).await;
        let c = srv.client().await;
        // No lease is granted for a TTL.
        start_a_recall(&c).await;
        let a = committing_on_demand(&c, 16);
        for _ in 0..20 {
            a.allocate(16).await.unwrap();
        }
        assert_eq!(a.stats().remote_allocations, 20);
        assert_eq!(a.stats().leases, 0);
        // The client asked once; the other 19 went straight per call instead
        // of each after a refused round trip.
        let text = metrics.encode();
        let key = "blockalloc_requests_total{method=\"Lease\",code=\"RESOURCE_EXHAUSTED\"} ";
        let refusals: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map_or(0, |v| v.trim().parse().unwrap());
        assert_eq!(refusals, 1, "the client asked once");
        a.close().await.unwrap();
        srv.stop().await;
    })
    .await;
}
