//! The per-call end (the free space kept back from grants for per-call
//! allocations) and the fragment reports of lease holders that set it.
//!
//! In process: a real tonic server on `127.0.0.1:0` over in-memory stores,
//! driven through the client library and the raw generated client.

use blockalloc_client::{Client, LeaseOptions, LeasingAllocator};
use blockalloc_service::pb;
use blockalloc_service::Config;
use tonic::Code;

mod common;
use common::{
    before_expiry, commit, lease, quick, release, renew, renewing, status, wait_until, x,
    TestServer, RENEWING_TTL,
};

/// Regression: a refused Commit counted its fragment report, so Status
/// (`leased_fragment_blocks`) changed although the call was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_does_not_count_its_fragment_report() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let l = lease(&c, 64, 256).await;
    let before = srv.state().await;
    let last = before[0].capacity_blocks - 1;
    let report = |sequence, allocations, frees| pb::CommitRequest {
        lease_id: l.lease_id,
        sequence,
        allocations,
        frees,
        fragment_blocks: 200,
        ..Default::default()
    };
    // A free of a free block refuses the whole commit.
    let e = c
        .rpc()
        .commit(report(1, vec![], vec![x(last, 1)]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert_eq!(srv.state().await, before, "a refused call changes nothing");
    // An accepted one counts it.
    let a = l.extents[0].start;
    c.rpc()
        .commit(report(1, vec![x(a, 1)], vec![]))
        .await
        .unwrap();
    assert_eq!(status(&c, 0).await.leased_fragment_blocks, 200);
    srv.stop().await;
}

async fn renew_reporting(c: &Client, id: u64, fragment_blocks: u64) -> pb::RenewResponse {
    c.rpc()
        .renew(pb::RenewRequest {
            lease_id: id,
            fragment_blocks,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_call_end_keeps_room_for_the_fragments_split_among_leases() {
    let (srv, c) = TestServer::start_with_client(&[256 << 20], quick()).await;
    let a = lease(&c, 64, 4096).await;
    let b = lease(&c, 64, 4096).await;
    let free = status(&c, 0).await.free_blocks;
    // Two live leases of 64-block objects: the end is 8 x 64 x 3 blocks
    // until the fragments say more.
    let base = 8 * 64 * 3;
    assert_eq!(renew(&c, a.lease_id).await.grantable_blocks, free - base);
    // A's 4096 fragments: the half out of B's reach, twice
    // (per_call_fragments), is 4096 blocks.
    let r = renew_reporting(&c, a.lease_id, 4096).await;
    assert_eq!(r.grantable_blocks, free - 4096);
    // B's too: 8192 in all, 4096 of them split off, twice.
    let r = renew_reporting(&c, b.lease_id, 4096).await;
    assert_eq!(r.grantable_blocks, free - 8192);
    assert_eq!(status(&c, 0).await.leased_fragment_blocks, 8192);
    // A report counts as the lease's unused blocks at most.
    let r = renew_reporting(&c, b.lease_id, u64::MAX).await;
    assert_eq!(r.grantable_blocks, free - 8192);
    // A commit reports too, and a smaller report replaces a larger one.
    let r = c
        .rpc()
        .commit(pb::CommitRequest {
            lease_id: b.lease_id,
            sequence: 1,
            allocations: vec![x(b.extents[0].start, 1)],
            fragment_blocks: 1024,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.grantable_blocks, free - (4096 + 1024));
    // An ended lease's fragments no longer count; one lease alone sees all
    // of its own, so nothing is split off.
    release(&c, b.lease_id).await;
    let free = status(&c, 0).await.free_blocks;
    let r = renew_reporting(&c, a.lease_id, 4096).await;
    assert_eq!(r.grantable_blocks, free - 8 * 64 * 2);
    assert_eq!(status(&c, 0).await.leased_fragment_blocks, 4096);
    // A new lease beside it: A's fragments are split off again, B's are
    // gone.
    let d = lease(&c, 64, 256).await;
    let free = status(&c, 0).await.free_blocks;
    assert_eq!(d.grantable_blocks, free - 4096);
    srv.stop().await;
}

/// Regression: a round's frees recycled into a lease reached the
/// fragment count only at the holder's next call, so a recall in between
/// handed them to the store's engine unannounced and 8 clients fell up to
/// 2 points short of one engine on the same requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recycled_frees_count_as_fragments_from_the_commit_that_recycles_them() {
    let (srv, c) = TestServer::start_with_client(&[256 << 20], quick()).await;
    let _other = lease(&c, 64, 256).await;
    let l = lease(&c, 64, 4096).await;
    let a = l.extents[0].start;
    assert_eq!(l.extents[0].len, 4096);
    let objects: Vec<pb::Extent> = (0..32).map(|i| x(a + 128 * i, 128)).collect();
    commit(&c, l.lease_id, 1, objects.clone(), vec![])
        .await
        .unwrap();
    let free = status(&c, 0).await.free_blocks;
    // Two leases of 64-block objects, no fragments reported: the end is
    // 8 x 64 x 3 blocks.
    assert_eq!(
        renew(&c, l.lease_id).await.grantable_blocks,
        free - 8 * 64 * 3
    );
    // Every other object freed and recycled, the holder reporting no
    // fragments (it counted before the commit): 16 holes of 128 blocks,
    // half of them out of the other lease's reach, twice, more than the
    // objects' share.
    let holes: Vec<pb::Extent> = objects.iter().step_by(2).copied().collect();
    let r = c
        .rpc()
        .commit(pb::CommitRequest {
            lease_id: l.lease_id,
            sequence: 2,
            frees: holes,
            recycle_frees: true,
            fragment_blocks: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.recycled.len(), 16);
    let held = 16 * 128;
    assert_eq!(status(&c, 0).await.leased_fragment_blocks, held);
    assert_eq!(r.grantable_blocks, free - held);
    // The holder's next report replaces the count.
    let r = renew_reporting(&c, l.lease_id, 0).await;
    assert_eq!(r.grantable_blocks, free - 8 * 64 * 3);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_fragment_reports_the_end_is_a_few_objects_per_lease() {
    let cfg = Config {
        per_call_fragments: 0,
        ..quick()
    };
    let (srv, c) = TestServer::start_with_client(&[256 << 20], cfg).await;
    let a = lease(&c, 64, 4096).await;
    let _b = lease(&c, 64, 4096).await;
    let free = status(&c, 0).await.free_blocks;
    let r = renew_reporting(&c, a.lease_id, 4096).await;
    assert_eq!(r.grantable_blocks, free - 8 * 64 * 3);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_client_reports_the_fragments_its_frees_leave_in_its_lease() {
    // The allocator reports at its renewals, a third of a TTL apart.
    before_expiry(RENEWING_TTL, || async {
        let (srv, c) = TestServer::start_with_client(&[256 << 20], renewing()).await;
        let other = lease(&c, 64, 256).await;
        let free = status(&c, 0).await.free_blocks;
        let base = 8 * 64 * 3;
        let alloc = LeasingAllocator::new(
            c.clone(),
            LeaseOptions {
                min_blocks: 64,
                want_blocks: 4096,
                ..LeaseOptions::default()
            },
        );
        let mut got = Vec::new();
        for _ in 0..48 {
            got.push(alloc.allocate(64).await.unwrap());
        }
        alloc.commit().await.unwrap();
        // Every other object freed: 24 holes of 64 blocks join the lease.
        for e in got.iter().step_by(2) {
            alloc.free(*e).await.unwrap();
        }
        alloc.commit().await.unwrap();
        // The next commit or renewal reports them: with the holes (1536
        // blocks) and the lease's unused tail (1024), half of them split off
        // from the other lease and counted twice, the end passes its base.
        let free_now = status(&c, 0).await.free_blocks;
        wait_until("the fragments are reported", || async {
            free_now - renew(&c, other.lease_id).await.grantable_blocks > base
        })
        .await;
        let g = renew(&c, other.lease_id).await.grantable_blocks;
        assert_eq!(
            free_now - g,
            24 * 64 + 1024,
            "grantable {g} of {free_now} free ({free} before)"
        );
        alloc.close().await.unwrap();
        srv.stop().await;
    })
    .await;
}
