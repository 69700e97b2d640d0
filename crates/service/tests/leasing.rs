//! The leasing client against a real server: local allocations inside
//! leases, next grants, commits, close and drop, filling a device.
//!
//! In process: a real tonic server on `127.0.0.1:0` over in-memory stores,
//! driven through the client library and the raw generated client.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockalloc::Extent;
use blockalloc_client::{Client, ClientError, DeviceId, LeaseOptions, LeasingAllocator};
use blockalloc_service::Config;

mod common;
use common::{
    before_expiry, committing_on_demand, counted, expiries, quick, renewing, status, wait_until,
    TestServer, RENEWING_TTL,
};

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

/// The allocator asks for its next grant when its lease's room falls
/// below the low-water mark, while room is left, not when an allocation
/// finds none: the grant lands before the room runs out, whatever the pace
/// of the allocations and the time a round trip takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_client_fetches_its_next_lease_before_the_last_runs_out() {
    let (srv, c) = TestServer::start_with_client(&[256 << 20], quick()).await;
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
    let (srv, c) = TestServer::start_with_client(&[64 << 20], cfg).await;
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
async fn a_batch_larger_than_one_request_commits_in_several() {
    let cfg = Config {
        lease_ttl: Duration::from_secs(30),
        ..quick()
    };
    let (srv, c) = TestServer::start_with_client(&[256 << 20], cfg).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_fragments_grows_while_the_server_has_runs_to_add() {
    let (srv, c) = TestServer::start_with_client(&[64 << 20], quick()).await;
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
    let (srv, c) = TestServer::start_with_client(&[256 << 20, 256 << 20], cfg).await;
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
