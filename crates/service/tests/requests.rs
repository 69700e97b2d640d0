//! Requests the server refuses, and what a refusal carries: status
//! codes, malformed batches, no-space details, scattered objects.
//!
//! In process: a real tonic server on `127.0.0.1:0` over in-memory stores,
//! driven through the client library and the raw generated client.

use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{ClientError, DeviceId};
use blockalloc_service::pb;
use tonic::Code;

mod common;
use common::{
    before_expiry, commit, lease, quick, release, renewing, status, x, TestServer, RENEWING_TTL,
};

/// A batch whose extents repeat or overlap is malformed (the schema's
/// "pairwise disjoint"): INVALID_ARGUMENT naming both, from unary Free, a
/// Free on the Calls stream and a Commit alike, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_or_overlapping_extents_in_one_batch_are_invalid_and_change_nothing() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let d0 = DeviceId::Index(0);
    let a = c.allocate(&d0, 1, 16, None).await.unwrap()[0];
    let b = c.allocate(&d0, 1, 16, None).await.unwrap()[0];
    let l = lease(&c, 16, 64).await;
    let le = l.extents[0];
    let before = status(&c, 0).await;
    let (xa, xb) = (x(a.start(), a.len()), x(b.start(), b.len()));
    let inside = x(a.start() + 4, 2);
    let batches = [
        (vec![xa, xa], xa, xa),
        (vec![xb, inside, xa], xa, inside),
        (vec![inside, xb, xa], xa, inside),
    ];
    let named = |s: &tonic::Status, p: pb::Extent, q: pb::Extent| {
        let m = s.message();
        let (p, q) = (
            format!("{}+{}", p.start, p.len),
            format!("{}+{}", q.start, q.len),
        );
        assert!(
            m.contains(&p) && m.contains(&q) && m.contains("overlap"),
            "{m}"
        );
    };
    for (list, p, q) in &batches {
        let s = c
            .rpc()
            .free(pb::FreeRequest {
                device: None,
                extents: list.clone(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        named(&s, *p, *q);
        let s = commit(&c, l.lease_id, 1, vec![], list.clone())
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        named(&s, *p, *q);
    }
    // Allocations of one commit too.
    let s = commit(
        &c,
        l.lease_id,
        1,
        vec![x(le.start, 8), x(le.start + 4, 8)],
        vec![],
    )
    .await
    .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    // The same Free on a Calls stream.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut replies = c
        .rpc()
        .calls(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    tx.send(pb::CallRequest {
        id: 1,
        call: Some(pb::call_request::Call::Free(pb::FreeRequest {
            device: None,
            extents: vec![xa, xa],
            ..Default::default()
        })),
    })
    .await
    .unwrap();
    let r = replies.message().await.unwrap().unwrap();
    match &r.result {
        Some(pb::call_reply::Result::Error(e)) => {
            assert_eq!(Code::from_i32(e.code), Code::InvalidArgument, "{e:?}");
        }
        other => panic!("{other:?}"),
    }
    drop(tx);
    // Nothing changed: both objects are allocated, the lease's sequence 1
    // is still to come.
    srv.store(0).check_allocated(a).unwrap();
    srv.store(0).check_allocated(b).unwrap();
    let after = status(&c, 0).await;
    assert_eq!(after.used_blocks, before.used_blocks);
    assert_eq!(after.free_blocks, before.free_blocks);
    commit(&c, l.lease_id, 1, vec![x(le.start, 8)], vec![xa, xb])
        .await
        .unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_codes_and_change_nothing() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20, 32 << 20], quick()).await;
    let d0 = DeviceId::Index(0);
    let kept = c.allocate(&d0, 1, 8, None).await.unwrap()[0];
    let l = lease(&c, 16, 64).await;
    let le = l.extents[0];
    commit(&c, l.lease_id, 1, vec![x(le.start, 4)], vec![])
        .await
        .unwrap();
    let before = c.status().await.unwrap();
    let cap = before[0].capacity_blocks;
    let meta = before[0].meta_blocks;

    let alloc = |count: u32, blocks: u64, hint: Option<u64>, dev: Option<pb::DeviceRef>| {
        let mut rpc = c.rpc();
        async move {
            rpc.allocate(pb::AllocateRequest {
                device: dev,
                count,
                size: Some(pb::allocate_request::Size::Blocks(blocks)),
                scattered: false,
                hint,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .unwrap_err()
            .code()
        }
    };
    let name = |n: &str| {
        Some(pb::DeviceRef {
            r#ref: Some(pb::device_ref::Ref::Name(n.into())),
        })
    };
    let index = |i: u32| {
        Some(pb::DeviceRef {
            r#ref: Some(pb::device_ref::Ref::Index(i)),
        })
    };
    assert_eq!(alloc(0, 1, None, None).await, Code::InvalidArgument);
    assert_eq!(alloc(5000, 1, None, None).await, Code::InvalidArgument);
    assert_eq!(alloc(1, 0, None, None).await, Code::InvalidArgument);
    assert_eq!(
        alloc(1, 1, Some(cap + 1), None).await,
        Code::InvalidArgument
    );
    assert_eq!(alloc(1, 1, None, name("nope")).await, Code::NotFound);
    assert_eq!(alloc(1, 1, None, index(2)).await, Code::NotFound);
    assert_eq!(alloc(1, cap, None, None).await, Code::ResourceExhausted);
    // All or nothing: the tenth object does not fit, so none is allocated.
    assert_eq!(
        alloc(10, cap / 10, None, None).await,
        Code::ResourceExhausted
    );

    let free = |extents: Vec<pb::Extent>| {
        let mut rpc = c.rpc();
        async move {
            rpc.free(pb::FreeRequest {
                device: None,
                extents,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .unwrap_err()
            .code()
        }
    };
    let k = x(kept.start(), kept.len());
    assert_eq!(free(vec![]).await, Code::InvalidArgument);
    assert_eq!(free(vec![x(5, 0)]).await, Code::InvalidArgument);
    assert_eq!(free(vec![x(cap - 1, 2)]).await, Code::InvalidArgument);
    assert_eq!(free(vec![x(u64::MAX, 2)]).await, Code::InvalidArgument);
    assert_eq!(free(vec![x(cap - 2, 1)]).await, Code::FailedPrecondition);
    assert_eq!(free(vec![x(0, 1)]).await, Code::FailedPrecondition);
    assert_eq!(free(vec![k, k]).await, Code::InvalidArgument);
    // Leased but uncommitted space is not the caller's to free.
    assert_eq!(
        free(vec![x(le.start + 10, 1)]).await,
        Code::FailedPrecondition
    );

    let id = l.lease_id;
    let code = |r: Result<pb::CommitResponse, tonic::Status>| r.unwrap_err().code();
    assert_eq!(
        code(commit(&c, id ^ (1 << 63), 2, vec![x(le.start + 4, 1)], vec![]).await),
        Code::NotFound
    );
    assert_eq!(
        code(commit(&c, id, 2, vec![x(le.start + le.len, 1)], vec![]).await),
        Code::FailedPrecondition,
        "outside the lease"
    );
    assert_eq!(
        code(commit(&c, id, 2, vec![x(le.start, 1)], vec![]).await),
        Code::FailedPrecondition,
        "already committed"
    );
    assert_eq!(
        code(commit(&c, id, 3, vec![x(le.start + 4, 1)], vec![]).await),
        Code::FailedPrecondition,
        "sequence gap"
    );
    assert_eq!(
        code(commit(&c, id, 0, vec![x(le.start + 4, 1)], vec![]).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(commit(&c, id, 2, vec![], vec![]).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(commit(&c, id, 2, vec![x(le.start + 4, 1)], vec![x(cap - 2, 1)]).await),
        Code::FailedPrecondition,
        "a free of free space fails the whole commit"
    );
    // A resend of the last sequence is answered again and applies nothing;
    // a resend with other contents conflicts.
    let again = commit(&c, id, 1, vec![x(le.start, 4)], vec![])
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(
        code(commit(&c, id, 1, vec![x(le.start, 5)], vec![]).await),
        Code::FailedPrecondition
    );
    let lease_code = |min: u64| {
        let mut rpc = c.rpc();
        async move {
            rpc.lease(pb::LeaseRequest {
                device: None,
                client_id: "raw".into(),
                min_blocks: min,
                want_blocks: 0,
                hint: None,
                ..Default::default()
            })
            .await
            .unwrap_err()
            .code()
        }
    };
    assert_eq!(lease_code(0).await, Code::InvalidArgument);
    assert_eq!(lease_code(cap).await, Code::ResourceExhausted);

    let after = c.status().await.unwrap();
    assert_eq!(before, after, "no bad request changed anything");
    assert_eq!(after[0].used_blocks, meta + 8 + 4);

    // Renew and release of an ended lease.
    release(&c, id).await;
    let st = status(&c, 0).await;
    assert_eq!(st.leased_unused_blocks, 0);
    assert_eq!(st.used_blocks, meta + 8 + 4, "committed blocks stay");
    for r in [
        c.rpc()
            .renew(pb::RenewRequest {
                lease_id: id,
                ..Default::default()
            })
            .await
            .map(|_| ()),
        c.rpc()
            .release(pb::ReleaseRequest {
                lease_id: id,
                ..Default::default()
            })
            .await
            .map(|_| ()),
        commit(&c, id, 2, vec![x(le.start + 4, 1)], vec![])
            .await
            .map(|_| ()),
    ] {
        assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition);
    }
    srv.store(0).verify().unwrap();
    srv.store(1).verify().unwrap();
    srv.stop().await;
}

/// A per-call Allocate refused because no free run holds the object
/// carries the device as the refusal found it, on the stream and as a
/// unary status; a lease that is not handed back shows in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_for_want_of_room_carries_the_device_as_it_was() {
    // The lease below is renewed all along, yet one renewal that a loaded
    // machine delays by more than a TTL lets it expire.
    before_expiry(RENEWING_TTL, || async {
        let (srv, c) = TestServer::start_with_client(&[64 << 20], renewing()).await;
        let d = DeviceId::Index(0);
        let free = status(&c, 0).await.free_blocks;
        let objs = c.allocate(&d, (free / 16) as u32, 16, None).await.unwrap();
        let holes: Vec<Extent> = objs.iter().step_by(2).copied().collect();
        c.free(&d, &holes).await.unwrap();
        let st = status(&c, 0).await;
        let expected = pb::NoSpaceDetails {
            requested_blocks: 64,
            free_blocks: st.free_blocks,
            largest_free_extent: st.largest_free_extent,
            used_blocks: st.used_blocks,
            leased_unused_blocks: 0,
            capacity_blocks: st.capacity_blocks,
        };
        assert!(
            st.largest_free_extent < 64 && st.free_blocks >= 64,
            "{st:?}"
        );
        // On the connection's stream.
        let e = c.allocate(&d, 1, 64, None).await.unwrap_err();
        assert_eq!(e.no_space_details(), Some(&expected), "{e}");
        // Unary: the same figures in the status details.
        let s = c
            .rpc()
            .allocate(pb::AllocateRequest {
                device: None,
                count: 1,
                size: Some(pb::allocate_request::Size::Blocks(64)),
                scattered: false,
                hint: None,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(blockalloc_service::details::no_space(&s), Some(expected));
        // A scattered object larger than the free space: the whole object.
        let e = c.allocate_scattered(&d, free).await.unwrap_err();
        let at = e.no_space_details().expect("details");
        assert_eq!(at.requested_blocks, free);
        assert_eq!(at.free_blocks, st.free_blocks);
        // A lease whose holder keeps renewing it but never hands it back: the
        // refusal comes after one TTL and a margin, and counts its unused
        // part (a lease left to expire would be free space by then).
        let held = c
            .rpc()
            .lease(pb::LeaseRequest {
                client_id: "deaf".into(),
                min_blocks: 16,
                want_blocks: 16,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let leased: u64 = held.extents.iter().map(|x| x.len).sum();
        let mut rpc = c.rpc();
        let renewing = tokio::spawn(async move {
            loop {
                let renew = pb::RenewRequest {
                    lease_id: held.lease_id,
                    fragment_blocks: 0,
                    ..Default::default()
                };
                rpc.renew(renew).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let e = c.allocate(&d, 1, 64, None).await.unwrap_err();
        renewing.abort();
        let at = e.no_space_details().expect("details");
        assert_eq!(at.leased_unused_blocks, leased, "{at:?}");
        assert_eq!(at.free_blocks, st.free_blocks - leased, "{at:?}");
        assert_eq!(at.used_blocks, st.used_blocks, "{at:?}");
        // Refusals that are not about room carry none.
        let e = c.allocate(&d, 0, 16, None).await.unwrap_err();
        assert_eq!(e.no_space_details(), None);
        srv.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scattered_allocation_uses_fragmented_space() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let d = DeviceId::Index(0);
    let free = status(&c, 0).await.free_blocks;
    let objs = c.allocate(&d, (free / 16) as u32, 16, None).await.unwrap();
    let holes: Vec<Extent> = objs.iter().step_by(2).copied().collect();
    c.free(&d, &holes).await.unwrap();
    let st = status(&c, 0).await;
    assert!(st.largest_free_extent < 64, "{st:?}");
    let e = c.allocate(&d, 1, 64, None).await.unwrap_err();
    assert!(matches!(e, ClientError::NoSpace { .. }), "{e}");
    let parts = c.allocate_scattered(&d, 64).await.unwrap();
    assert!(parts.len() >= 2);
    assert_eq!(parts.iter().map(|e| e.len()).sum::<u64>(), 64);
    for p in &parts {
        srv.store(0).check_allocated(*p).unwrap();
    }
    srv.store(0).verify().unwrap();
    srv.stop().await;
}

/// A hint past the device's end is INVALID_ARGUMENT naming it, for an
/// Allocate and a Lease alike, and nothing is allocated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_past_the_device_is_refused_by_allocate_and_lease() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
    let before = status(&c, 0).await;
    let past = before.capacity_blocks + 1;
    let s = c
        .rpc()
        .allocate(pb::AllocateRequest {
            count: 1,
            size: Some(pb::allocate_request::Size::Blocks(4)),
            hint: Some(past),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains(&format!("hint block {past}")), "{s:?}");
    let s = c
        .rpc()
        .lease(pb::LeaseRequest {
            min_blocks: 16,
            want_blocks: 16,
            hint: Some(past),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(s.message().contains(&format!("hint block {past}")), "{s:?}");
    assert_eq!(status(&c, 0).await.free_blocks, before.free_blocks);
    drop(srv);
}
