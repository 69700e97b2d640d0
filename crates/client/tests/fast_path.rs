//! The cost of a leased allocation (`try_allocate_local`) against an
//! in-process server: a measurement, not a check, so ignored by default.
//!
//! ```sh
//! cargo test --release -p blockalloc-client --test fast_path -- --ignored --nocapture
//! ```

#[path = "../../service/tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use blockalloc_client::{LeaseOptions, LeasingAllocator};
use common::{quick, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run it with --release --ignored --nocapture"]
async fn leased_fast_path_cost() {
    const ROUND: usize = 4096;
    const ROUNDS: usize = 200;
    let cfg = blockalloc_service::Config {
        lease_max_blocks: 1 << 16,
        ..quick()
    };
    let srv = TestServer::start(&[1 << 30], cfg).await;
    let c = srv.client().await;
    let alloc = LeasingAllocator::new(
        c,
        LeaseOptions {
            min_blocks: 2 * ROUND as u64,
            want_blocks: 4 * ROUND as u64,
            commit_interval: Duration::from_secs(3600),
            ..LeaseOptions::default()
        },
    );
    let mut best = Duration::MAX;
    let mut all = Vec::with_capacity(ROUNDS);
    let mut held = Vec::with_capacity(ROUND);
    for _ in 0..ROUNDS {
        // A lease with room for the whole round, outside the timing.
        let first = alloc.allocate(1).await.unwrap();
        alloc.free(first).await.unwrap();
        let t = Instant::now();
        for _ in 0..ROUND {
            match alloc.try_allocate_local(1) {
                Some(e) => held.push(e),
                None => break,
            }
        }
        let dt = t.elapsed();
        if held.len() == ROUND {
            best = best.min(dt);
            all.push(dt);
        }
        // Freed before they were committed: straight back to the lease.
        for e in held.drain(..) {
            alloc.free(e).await.unwrap();
        }
    }
    all.sort();
    let per = |d: Duration| d.as_nanos() as f64 / ROUND as f64;
    println!(
        "leased try_allocate_local: best {:.1} ns, median {:.1} ns per allocation ({} full rounds of {ROUND})",
        per(best),
        per(all[all.len() / 2]),
        all.len()
    );
    alloc.close().await.unwrap();
    srv.stop().await;
}
