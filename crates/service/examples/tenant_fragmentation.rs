//! The space cost of per-tenant regions: runs a bench workload through an
//! in-process server over loopback gRPC (per-call Allocate and Free) until
//! the first failed allocation, with the objects spread over N tenants
//! (object i belongs to tenant i mod N, each in its own regions), and with
//! no tenant at all (one shared engine). Prints, per workload and N, the
//! utilisation at the first failure: live object blocks / data blocks.
//!
//! ```text
//! cargo run --release -p blockalloc-service --example tenant_fragmentation -- \
//!     [GiB] [seed] [seed,shift,aging] [0,1,4,16]
//! ```
//!
//! The third argument picks workloads, the fourth tenant counts (0 is the
//! shared engine, the baseline of the "vs shared" column).

use std::collections::HashMap;
use std::sync::Arc;

use blockalloc::Extent;
use blockalloc_bench::{Op, Workload, WorkloadKind, WorkloadSpec};
use blockalloc_client::{Client, DeviceId};
use blockalloc_service::{
    to_hex, token_sha256, Config, ServedDevice, Server, TenantConfig, Tenants,
};
use blockalloc_store::device::MemDevice;
use blockalloc_store::{FormatOptions, Store};

/// Allocations before a run is called off without a failure.
const MAX_ALLOCS: u64 = 2_000_000;

async fn run(kind: WorkloadKind, tenants: usize, bytes: u64, seed: u64) -> (f64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::format(MemDevice::new(bytes), FormatOptions::default()).unwrap());
    let data_blocks = store.geometry().capacity_blocks() - store.layout().meta_blocks;
    let dev = ServedDevice::new("dev0", Arc::clone(&store))
        .with_owners_file(dir.path().join("dev0.owners"));
    let tokens: Vec<String> = (0..tenants)
        .map(|i| format!("bat_fragmentation-{i}"))
        .collect();
    let list: Vec<TenantConfig> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| TenantConfig {
            name: format!("t{i}"),
            token_sha256: to_hex(&token_sha256(t)),
            quota_bytes: None,
            devices: None,
        })
        .collect();
    let server =
        Server::with_tenants(vec![dev], Config::default(), Tenants::new(&list).unwrap()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(listener, async {
        let _ = stopped.await;
    }));
    let base = Client::connect(&addr).await.unwrap();
    let clients: Vec<Client> = if tenants == 0 {
        vec![base]
    } else {
        tokens
            .iter()
            .map(|t| base.with_token(Some(t)).unwrap())
            .collect()
    };
    let spec = WorkloadSpec {
        kind,
        round_size: 1000,
        seed,
        ..WorkloadSpec::default()
    };
    let geo = store.geometry();
    let d0 = DeviceId::default();
    let mut live: HashMap<u64, Extent> = HashMap::new();
    let mut live_blocks = 0u64;
    let mut allocs = 0u64;
    let mut util = f64::NAN;
    for op in Workload::new(spec, geo).ops() {
        match op {
            Op::Alloc { object, blocks } => {
                let c = &clients[object as usize % clients.len()];
                match c.allocate(&d0, 1, blocks, None).await {
                    Ok(e) => {
                        live.insert(object, e[0]);
                        live_blocks += blocks;
                    }
                    Err(_) => {
                        util = live_blocks as f64 / data_blocks as f64;
                        break;
                    }
                }
                allocs += 1;
                if allocs >= MAX_ALLOCS {
                    break;
                }
            }
            Op::Free { object } => {
                if let Some(e) = live.remove(&object) {
                    let c = &clients[object as usize % clients.len()];
                    c.free(&d0, &[e]).await.unwrap();
                    live_blocks -= e.len();
                }
            }
            Op::RoundEnd { .. } => {}
        }
    }
    let regions = if tenants == 0 {
        0
    } else {
        store
            .geometry()
            .capacity_blocks()
            .div_ceil(blockalloc_service::region_blocks_for(
                store.geometry().capacity_blocks(),
                4096,
            ))
    };
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    (util, allocs, regions)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let gib: u64 = args.get(1).map_or(4, |s| s.parse().expect("GiB"));
    let seed: u64 = args.get(2).map_or(1, |s| s.parse().expect("seed"));
    println!("device {gib} GiB, 4 KiB blocks, workload seed {seed}, contiguous objects, per-call Allocate/Free");
    println!(
        "| workload | tenants | regions | utilisation at first failure | vs shared | allocations |"
    );
    println!("|---|---|---|---|---|---|");
    let kinds: Vec<WorkloadKind> = args
        .get(3)
        .map_or("seed,shift,aging", String::as_str)
        .split(',')
        .map(|k| {
            k.parse()
                .expect("a workload: seed, shift, fill-shift or aging")
        })
        .collect();
    let counts: Vec<usize> = args
        .get(4)
        .map_or("0,1,4,16", String::as_str)
        .split(',')
        .map(|n| n.parse().expect("a tenant count"))
        .collect();
    for &kind in &kinds {
        let mut shared = f64::NAN;
        for &tenants in &counts {
            let (u, n, regions) = run(kind, tenants, gib << 30, seed).await;
            if tenants == 0 {
                shared = u;
            }
            let who = if tenants == 0 {
                "shared engine".to_string()
            } else {
                tenants.to_string()
            };
            // Without a shared-engine run in this invocation there is no
            // baseline to compare with.
            let vs = if shared.is_nan() {
                "–".to_string()
            } else {
                format!("{:+.2} pt", (u - shared) * 100.0)
            };
            println!(
                "| {kind:?} | {who} | {regions} | {:.2}% | {vs} | {n} |",
                u * 100.0
            );
        }
    }
}
