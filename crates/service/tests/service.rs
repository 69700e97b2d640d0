//! The service end to end, in process: a real tonic server on
//! `127.0.0.1:0` over in-memory stores, driven through the client library
//! and the raw generated client.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator};
use blockalloc_service::pb;
use blockalloc_service::Config;
use tonic::Code;

mod common;
use common::{
    before_expiry, counted, expiries, expiring, quick, renewing, start_a_recall, wait_until,
    TestServer, RENEWING_TTL, SHORT_TTL,
};

async fn status(c: &Client, i: usize) -> pb::DeviceStatus {
    c.status().await.unwrap()[i].clone()
}

/// A leasing allocator on device 0 that commits only when asked (or on
/// close), so that a test decides when a batch goes out.
fn committing_on_demand(c: &Client, min_blocks: u64) -> LeasingAllocator {
    LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    )
}

/// Who holds which blocks: refuses an extent that overlaps one held.
#[derive(Default)]
struct Shadow {
    held: BTreeMap<u64, (u64, usize)>,
}

impl Shadow {
    fn take(&mut self, e: Extent, owner: usize) {
        if let Some((&s, &(end, o))) = self.held.range(..e.end()).next_back() {
            assert!(
                end <= e.start(),
                "{e} given to client {owner} overlaps {s}..{end} held by client {o}"
            );
        }
        self.held.insert(e.start(), (e.end(), owner));
    }

    fn give_back(&mut self, e: Extent, owner: usize) {
        assert_eq!(self.held.remove(&e.start()), Some((e.end(), owner)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_never_hold_the_same_block() {
    let srv = TestServer::start(&[256 << 20], quick()).await;
    let shadow = Arc::new(Mutex::new(Shadow::default()));
    let mut tasks = Vec::new();
    for owner in 0..8usize {
        let client = srv.client().await;
        let shadow = Arc::clone(&shadow);
        tasks.push(tokio::spawn(async move {
            let mut kept = Vec::new();
            if owner == 7 {
                // One client allocates per call, beside the leasing ones.
                for i in 0..40u64 {
                    let e = client
                        .allocate(&DeviceId::Index(0), 2, 1 + i % 9, None)
                        .await
                        .unwrap();
                    for x in e {
                        shadow.lock().unwrap().take(x, owner);
                        kept.push(x);
                    }
                }
                return (kept, 0);
            }
            let alloc = LeasingAllocator::new(
                client,
                LeaseOptions {
                    min_blocks: 64,
                    client_id: format!("client-{owner}"),
                    ..LeaseOptions::default()
                },
            );
            let mut rng = owner as u64 * 7919 + 1;
            for round in 0..20 {
                for _ in 0..25 {
                    rng = rng
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let blocks = 1 + (rng >> 33) % 64;
                    let e = alloc.allocate(blocks).await.unwrap();
                    shadow.lock().unwrap().take(e, owner);
                    kept.push(e);
                }
                // Free about a third, some before they were committed.
                let mut i = 0;
                while i < kept.len() {
                    if (kept[i].start() + round) % 3 == 0 {
                        let e = kept.swap_remove(i);
                        shadow.lock().unwrap().give_back(e, owner);
                        alloc.free(e).await.unwrap();
                    } else {
                        i += 1;
                    }
                }
                if round % 4 == 3 {
                    alloc.commit().await.unwrap();
                }
            }
            alloc.commit().await.unwrap();
            let local = alloc.stats().local_allocations;
            alloc.close().await.unwrap();
            (kept, local)
        }));
    }
    let mut live = Vec::new();
    let mut local = 0;
    for t in tasks {
        let (kept, n) = t.await.unwrap();
        live.extend(kept);
        local += n;
    }
    assert!(local >= 7 * 500, "leased allocations were served locally");
    let c = srv.client().await;
    let st = status(&c, 0).await;
    let blocks: u64 = live.iter().map(|e| e.len()).sum();
    assert_eq!(st.leased_unused_blocks, 0, "every lease was released");
    assert_eq!(st.leases, 0);
    assert_eq!(st.used_blocks, st.meta_blocks + blocks);
    assert_eq!(
        st.used_blocks + st.free_blocks + st.leased_unused_blocks,
        st.capacity_blocks
    );
    let store = srv.store(0);
    for e in &live {
        store.check_allocated(*e).unwrap();
    }
    store.verify().unwrap();
    srv.stop().await;
}

async fn lease(c: &Client, min: u64, want: u64) -> pb::LeaseResponse {
    c.rpc()
        .lease(pb::LeaseRequest {
            device: None,
            client_id: "raw".into(),
            min_blocks: min,
            want_blocks: want,
            hint: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

async fn renew(c: &Client, id: u64) -> pb::RenewResponse {
    c.rpc()
        .renew(pb::RenewRequest {
            lease_id: id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

fn x(start: u64, len: u64) -> pb::Extent {
    pb::Extent { start, len }
}

async fn commit(
    c: &Client,
    id: u64,
    seq: u64,
    allocs: Vec<pb::Extent>,
    frees: Vec<pb::Extent>,
) -> Result<pb::CommitResponse, tonic::Status> {
    c.rpc()
        .commit(pb::CommitRequest {
            lease_id: id,
            sequence: seq,
            allocations: allocs,
            frees,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// A batch whose extents repeat or overlap is malformed (the schema's
/// "pairwise disjoint"): INVALID_ARGUMENT naming both, from unary Free, a
/// Free on the Calls stream and a Commit alike, and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_or_overlapping_extents_in_one_batch_are_invalid_and_change_nothing() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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
    let srv = TestServer::start(&[64 << 20, 32 << 20], quick()).await;
    let c = srv.client().await;
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
    c.rpc()
        .release(pb::ReleaseRequest { lease_id: id })
        .await
        .unwrap();
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
            .release(pb::ReleaseRequest { lease_id: id })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lease_expires_and_its_space_returns() {
    let (srv, c, free0, l) = before_expiry(SHORT_TTL, || async {
        let srv = TestServer::start(&[64 << 20], expiring()).await;
        let c = srv.client().await;
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
    let srv = TestServer::start(&[64 << 20], expiring()).await;
    let c = srv.client().await;
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
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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
    let srv = TestServer::start(&[256 << 20], quick()).await;
    let c = srv.client().await;
    let mut sizes = Vec::new();
    for _ in 0..5 {
        let l = lease(&c, 16, 0).await;
        sizes.push(l.extents.iter().map(|e| e.len).sum::<u64>());
        c.rpc()
            .release(pb::ReleaseRequest {
                lease_id: l.lease_id,
            })
            .await
            .unwrap();
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
async fn leased_allocations_lost_with_their_lease_are_reported() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let alloc = committing_on_demand(&c, 32);
    let kept = alloc.allocate(8).await.unwrap();
    alloc.commit().await.unwrap();
    let lost = alloc.allocate(8).await.unwrap();
    // The server loses the lease (as after a restart): release it behind
    // the allocator's back.
    let ids = alloc.lease_ids();
    assert_eq!(ids.len(), 1);
    c.rpc()
        .release(pb::ReleaseRequest { lease_id: ids[0] })
        .await
        .unwrap();
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
        let srv = TestServer::start(&[64 << 20], renewing()).await;
        let c = srv.client().await;
        let alloc = committing_on_demand(&c, 32);
        let lost = alloc.allocate(8).await.unwrap();
        let ids = alloc.lease_ids();
        c.rpc()
            .release(pb::ReleaseRequest { lease_id: ids[0] })
            .await
            .unwrap();
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
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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
async fn replies_say_how_much_a_further_grant_could_take() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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

/// Regression: a refused Commit counted its fragment report, so Status
/// (`leased_fragment_blocks`) changed although the call was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_commit_does_not_count_its_fragment_report() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_call_end_keeps_room_for_the_fragments_split_among_leases() {
    let srv = TestServer::start(&[256 << 20], quick()).await;
    let c = srv.client().await;
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
    c.rpc()
        .release(pb::ReleaseRequest {
            lease_id: b.lease_id,
        })
        .await
        .unwrap();
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
    let srv = TestServer::start(&[256 << 20], quick()).await;
    let c = srv.client().await;
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
    let srv = TestServer::start(&[256 << 20], cfg).await;
    let c = srv.client().await;
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
        let srv = TestServer::start(&[256 << 20], renewing()).await;
        let c = srv.client().await;
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

/// The allocator asks for its next grant when its lease's room falls
/// below the low-water mark, while room is left, not when an allocation
/// finds none: the grant lands before the room runs out, whatever the pace
/// of the allocations and the time a round trip takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_client_fetches_its_next_lease_before_the_last_runs_out() {
    let srv = TestServer::start(&[256 << 20], quick()).await;
    let c = srv.client().await;
    // The low-water mark starts at the smallest lease, 64 blocks; a new
    // client's first lease is 256 blocks.
    let alloc = committing_on_demand(&c, 64);
    let grants = || {
        let st = alloc.stats();
        st.leases + st.extensions
    };
    alloc.allocate(16).await.unwrap();
    assert_eq!(grants(), 1);
    // 12 objects leave 64 blocks: not below the mark, nothing is asked.
    for _ in 1..12 {
        alloc.try_allocate_local(16).expect("room in the lease");
    }
    assert_eq!(grants(), 1);
    // The 13th leaves 48: the next grant is asked for, and comes while
    // the lease still has room for 3 more.
    alloc.try_allocate_local(16).expect("room in the lease");
    wait_until("the next grant", || async { grants() == 2 }).await;
    for _ in 0..16 {
        alloc
            .try_allocate_local(16)
            .expect("no allocation waits for the grant");
    }
    assert_eq!(alloc.stats().remote_allocations, 0);
    alloc.close().await.unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_leasing_allocator_commits_and_releases_its_leases() {
    let cfg = Config {
        lease_ttl: Duration::from_secs(30),
        ..quick()
    };
    let srv = TestServer::start(&[64 << 20], cfg).await;
    let c = srv.client().await;
    let alloc = committing_on_demand(&c, 64);
    let e = alloc.allocate(10).await.unwrap();
    assert_eq!(status(&c, 0).await.leases, 1);
    drop(alloc);
    // Far sooner than the 30 s TTL: the background task commits, then
    // releases.
    wait_until("the lease is released", || async {
        status(&c, 0).await.leases == 0
    })
    .await;
    let st = status(&c, 0).await;
    assert_eq!(st.leased_unused_blocks, 0);
    assert_eq!(st.used_blocks, st.meta_blocks + 10);
    srv.store(0).check_allocated(e).unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_service_reports_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", srv.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut h = HealthClient::new(ch);
    for service in ["", "blockalloc.v1.Allocator"] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "{service:?}");
    }
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_do_not_commit_before_the_commit_interval() {
    before_expiry(RENEWING_TTL, || async {
        let (srv, metrics) = TestServer::start_with_metrics(&[64 << 20], renewing()).await;
        let c = srv.client().await;
        let alloc = committing_on_demand(&c, 64);
        let x = alloc.allocate(4).await.unwrap();
        alloc.commit().await.unwrap();
        assert_eq!(alloc.stats().commit_calls, 1);
        let y = alloc.allocate(4).await.unwrap();
        // Three renewals (every third of the TTL) meanwhile: the lease
        // lives past its TTL.
        let renewals = || {
            counted(
                &metrics,
                "blockalloc_requests_total{method=\"Renew\",code=\"OK\"}",
            )
        };
        wait_until("three renewals", || async {
            assert_eq!(expiries(&metrics), 0, "a renewal came too late");
            renewals() >= 3
        })
        .await;
        assert_eq!(status(&c, 0).await.leases, 1, "renewed past its TTL");
        assert_eq!(alloc.stats().commit_calls, 1, "nothing asked for a commit");
        srv.store(0).check_allocated(x).unwrap();
        assert!(srv.store(0).check_allocated(y).is_err());
        alloc.commit().await.unwrap();
        srv.store(0).check_allocated(y).unwrap();
        alloc.close().await.unwrap();
        srv.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_free_does_not_cost_the_allocations_committed_with_it() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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

/// A per-call Allocate refused because no free run holds the object
/// carries the device as the refusal found it, on the stream and as a
/// unary status; a lease that is not handed back shows in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_for_want_of_room_carries_the_device_as_it_was() {
    // The lease below is renewed all along, yet one renewal that a loaded
    // machine delays by more than a TTL lets it expire.
    before_expiry(RENEWING_TTL, || async {
        let srv = TestServer::start(&[64 << 20], renewing()).await;
        let c = srv.client().await;
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
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_starts_over_at_the_initial_lease_size() {
    async fn lease_size(c: &Client) -> u64 {
        let l = lease(c, 16, 0).await;
        c.rpc()
            .release(pb::ReleaseRequest {
                lease_id: l.lease_id,
            })
            .await
            .unwrap();
        l.extents[0].len
    }
    // Two leases within a TTL: the second is larger.
    let (srv, c) = before_expiry(SHORT_TTL, || async {
        let srv = TestServer::start(&[256 << 20], expiring()).await;
        let c = srv.client().await;
        assert_eq!([lease_size(&c).await, lease_size(&c).await], [256, 512]);
        (srv, c)
    })
    .await;
    // Silent for more than four TTLs: it starts over.
    tokio::time::sleep(SHORT_TTL * 4 + Duration::from_millis(100)).await;
    assert_eq!(lease_size(&c).await, 256);
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_larger_than_one_request_commits_in_several() {
    let cfg = Config {
        lease_ttl: Duration::from_secs(30),
        ..quick()
    };
    let srv = TestServer::start(&[256 << 20], cfg).await;
    let c = srv.client().await;
    let alloc = committing_on_demand(&c, 16_384);
    // More single-block allocations, then frees, than one Commit may carry.
    let mut got = Vec::new();
    for _ in 0..5_000 {
        got.push(alloc.allocate(1).await.unwrap());
    }
    alloc.commit().await.unwrap();
    for e in &got {
        srv.store(0).check_allocated(*e).unwrap();
    }
    for e in &got[..4_500] {
        alloc.free(*e).await.unwrap();
    }
    alloc.commit().await.unwrap();
    let st = status(&c, 0).await;
    assert_eq!(st.used_blocks, st.meta_blocks + 500);
    alloc.close().await.unwrap();
    srv.stop().await;
}

/// The i-th request size of a fixed pseudo-random stream: 1 to 256 blocks.
fn request_blocks(i: u64) -> u64 {
    1 + (i
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407)
        >> 33)
        % 256
}

/// Rounds of 64 requests, every second object freed at the end of its
/// round, until the first failure; returns used/capacity then.
async fn fill_until_no_space(c: &Client, leasing: Option<&LeasingAllocator>, dev: usize) -> f64 {
    let id = DeviceId::Index(dev as u32);
    let mut i = 0;
    loop {
        let mut round = Vec::new();
        for _ in 0..64 {
            i += 1;
            let n = request_blocks(i);
            let got = match leasing {
                Some(a) => a.allocate(n).await,
                None => c.allocate(&id, 1, n, None).await.map(|v| v[0]),
            };
            match got {
                Ok(e) => round.push(e),
                Err(ClientError::NoSpace { .. }) => {
                    if let Some(a) = leasing {
                        a.commit().await.unwrap();
                    }
                    let st = status(c, dev).await;
                    return st.used_blocks as f64 / st.capacity_blocks as f64;
                }
                Err(e) => panic!("{e}"),
            }
        }
        for e in round.iter().step_by(2) {
            match leasing {
                Some(a) => a.free(*e).await.unwrap(),
                None => {
                    c.free(&id, &[*e]).await.unwrap();
                }
            }
        }
        if let Some(a) = leasing {
            a.commit().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_fills_the_device_as_far_as_per_call_allocation() {
    // Leases of 1/128 of the device at most, as 16 GiB of 2 TiB.
    let cfg = Config {
        lease_ttl: Duration::from_secs(30),
        lease_initial_blocks: 256,
        lease_max_blocks: 2048,
        ..quick()
    };
    let srv = TestServer::start(&[256 << 20, 256 << 20], cfg).await;
    let c = srv.client().await;
    let per_call = fill_until_no_space(&c, None, 1).await;
    let alloc = LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            device: DeviceId::Index(0),
            min_blocks: 256,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    );
    let leased = fill_until_no_space(&c, Some(&alloc), 0).await;
    alloc.close().await.unwrap();
    assert!(per_call > 0.9, "per call {per_call}");
    assert!(
        leased >= per_call - 0.01,
        "leased {leased} against per call {per_call}"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_fragments_grows_while_the_server_has_runs_to_add() {
    let srv = TestServer::start(&[64 << 20], quick()).await;
    let c = srv.client().await;
    let a = LeasingAllocator::new(
        c.clone(),
        LeaseOptions {
            min_blocks: 16,
            want_blocks: 1024,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    );
    // Fill the lease with 16-block objects, then free every other one:
    // the lease holds 512 blocks in 32 fragments, none of 32 blocks.
    let mut objs = Vec::new();
    for _ in 0..64 {
        objs.push(a.allocate(16).await.unwrap());
    }
    assert_eq!(a.stats().leases, 1);
    for e in objs.iter().step_by(2) {
        a.free(*e).await.unwrap();
    }
    a.commit().await.unwrap();
    let ids = a.lease_ids();
    // A request no fragment fits: the server still has long runs to add,
    // so the lease grows and keeps its fragments for their exact
    // requests, instead of being retired and handing them back.
    a.allocate(32).await.unwrap();
    assert_eq!(a.stats().rotations, 0);
    assert!(a.stats().extensions >= 1);
    assert_eq!(a.lease_ids(), ids);
    for _ in 0..32 {
        let e = a.allocate(16).await.unwrap();
        assert!(
            objs.iter().step_by(2).any(|o| *o == e),
            "{e} is a kept fragment"
        );
    }
    a.close().await.unwrap();
    srv.store(0).verify().unwrap();
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

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// With `idle_poll_us` the server runs a poller per CPU while it lives and
/// serves as without; the pollers end with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pollers_run_with_the_server_and_stop_with_it() {
    let before = threads_named("idle-poll");
    let srv = TestServer::start(
        &[64 << 20],
        Config {
            idle_poll_us: 500,
            ..quick()
        },
    )
    .await;
    // A thread takes its name when it first runs.
    let t = std::time::Instant::now();
    while threads_named("idle-poll") <= before {
        assert!(t.elapsed() < Duration::from_secs(60), "no poller runs");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let c = srv.client().await;
    let d = DeviceId::Index(0);
    for _ in 0..50 {
        let e = c.allocate(&d, 1, 8, None).await.unwrap();
        c.free(&d, &e).await.unwrap();
    }
    srv.store(0).verify().unwrap();
    srv.stop().await;
    drop(c);
    let t = std::time::Instant::now();
    while threads_named("idle-poll") > before {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the pollers outlive the server"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
