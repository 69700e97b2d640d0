//! Eight leasing clients fill a device until "no space" means no space:
//! when the first of them is refused, every lease has been handed back
//! (the pushed recall) and no free run of the device is long enough for the
//! request, and the device is about as full as one in-process engine fills
//! it on the same requests. How close depends on how the clients' calls
//! interleave, which the machine's load decides: the tight figure (within
//! 0.1 % of the engine) is measured by `scripts/near-full.sh`
//! (BENCHMARKS.md, "Near full"); this test holds a bound that a gross
//! regression breaks on any machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockalloc::{AllocError, Allocator, Extent, FromFreeExtents, SegFitAllocator};
use blockalloc_client::{ClientError, DeviceId, LeaseOptions, LeasingAllocator, NoSpaceDetails};
use blockalloc_service::Config;

mod common;
use common::TestServer;

const CLIENTS: u64 = 8;
/// Requests per client per round.
const ROUND: u64 = 64;
/// The largest request, in blocks.
const MAX_OBJECT: u64 = 256;
const DEVICE_BYTES: u64 = 512 << 20;

/// The size of client `c`'s `i`-th request: 1 to MAX_OBJECT blocks.
fn request(c: u64, i: u64) -> u64 {
    let x = (c << 32 | i)
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    1 + ((x ^ (x >> 29)).wrapping_mul(0x94d0_49bb_1331_11eb) >> 33) % MAX_OBJECT
}

/// The objects of a round that are freed at its end: none, as in the
/// bench's fill where the device fills within the first round. (With half
/// of every round freed, each client's engine keeps its own slivers of
/// freed space, eight times one engine's; see `docs/design.md`.)
fn freed_at_round_end(_k: usize) -> bool {
    false
}

/// One engine over the device's data blocks runs every client's rounds in
/// turn until a request fails; returns used / capacity then.
fn engine_utilisation(capacity: u64, meta: u64) -> f64 {
    let data = Extent::from_range(meta, capacity).unwrap();
    let mut engine = SegFitAllocator::from_free_extents(capacity, &[data]).unwrap();
    let mut next = vec![0u64; CLIENTS as usize];
    loop {
        for c in 0..CLIENTS {
            let mut round = Vec::new();
            for _ in 0..ROUND {
                next[c as usize] += 1;
                match engine.allocate(request(c, next[c as usize]), None) {
                    Ok(e) => round.push(e),
                    Err(AllocError::NoSpace { .. }) => {
                        return engine.used() as f64 / capacity as f64;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            for (k, e) in round.into_iter().enumerate() {
                if freed_at_round_end(k) {
                    engine.free(e).unwrap();
                }
            }
        }
    }
}

/// One leasing client's rounds until any client's request fails; returns
/// the refusal's details and used / capacity then, if it failed first.
async fn client_rounds(
    a: LeasingAllocator,
    c: u64,
    stop: Arc<AtomicBool>,
    srv_addr: String,
) -> Option<(NoSpaceDetails, f64)> {
    let mut i = 0;
    let mut util = None;
    'rounds: while !stop.load(Ordering::Relaxed) {
        let mut round = Vec::new();
        for _ in 0..ROUND {
            if stop.load(Ordering::Relaxed) {
                break 'rounds;
            }
            i += 1;
            match a.allocate(request(c, i)).await {
                Ok(e) => round.push(e),
                Err(ClientError::NoSpace { details, .. }) => {
                    if !stop.swap(true, Ordering::Relaxed) {
                        let probe = blockalloc_client::Client::connect(&srv_addr).await.unwrap();
                        let st = probe.status().await.unwrap()[0].clone();
                        let details = details.expect("a refusal for want of room has details");
                        util = Some((details, st.used_blocks as f64 / st.capacity_blocks as f64));
                    }
                    break 'rounds;
                }
                Err(e) => panic!("client {c}: {e}"),
            }
        }
        a.commit().await.unwrap();
        for (k, e) in round.into_iter().enumerate() {
            if freed_at_round_end(k) {
                a.free(e).await.unwrap();
            }
        }
        a.commit().await.unwrap();
    }
    a.close().await.unwrap();
    util
}

/// Eight leasing clients fill the device; at the first failure no lease
/// holds unused space, no free run fits the request, and the utilisation is
/// within `gap` of one engine's.
async fn eight_leasing_clients_fill_within(gap: f64) {
    let cfg = Config {
        // A refused per-call allocation waits up to a TTL for the recalled
        // leases: long enough for a holder on a loaded machine.
        lease_ttl: Duration::from_secs(30),
        expiry_interval: Duration::from_millis(50),
        ..Config::default()
    };
    let srv = TestServer::start(&[DEVICE_BYTES], cfg).await;
    let layout = srv.store(0).layout();
    let local = engine_utilisation(layout.capacity_blocks, layout.meta_blocks);
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let a = LeasingAllocator::new(
            srv.client().await,
            LeaseOptions {
                device: DeviceId::Index(0),
                min_blocks: MAX_OBJECT,
                commit_interval: Duration::from_secs(3600),
                client_id: format!("fill-{c}"),
                ..LeaseOptions::default()
            },
        );
        tasks.push(tokio::spawn(client_rounds(
            a,
            c,
            Arc::clone(&stop),
            srv.addr.to_string(),
        )));
    }
    let mut leased = None;
    for t in tasks {
        leased = leased.or(t.await.unwrap());
    }
    let (refusal, leased) = leased.expect("a client ran out of space");
    assert!(local > 0.99, "the engine fills the device: {local}");
    assert_eq!(
        refusal.leased_unused_blocks, 0,
        "every lease was handed back before the refusal: {refusal:?}"
    );
    assert!(
        refusal.largest_free_extent < refusal.requested_blocks,
        "no free run fits the refused request: {refusal:?}"
    );
    assert!(
        leased >= local - gap,
        "8 leasing clients stopped at {:.3} %, one engine at {:.3} %",
        leased * 100.0,
        local * 100.0
    );
    srv.store(0).verify().unwrap();
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_leasing_clients_fill_the_device_until_no_space_means_no_space() {
    // Under load the clients' interleaving leaves up to ~0.4 % more
    // scraps than one engine (near-full.sh measures the 0.1 % claim); 1 %
    // only guards against gross losses, such as space left in leases.
    eight_leasing_clients_fill_within(0.01).await;
}
