//! Criterion micro-benchmarks: one free + one allocation at a steady fill
//! level, for every engine of this build (with `--features peers`, the
//! crates.io peers too, through the same adapters `bench` uses).
//!
//! Each case prefills a device with random objects to a target utilisation,
//! then measures pairs "free a random live object, allocate a new one of a
//! random size", so the fill level stays put while the free space keeps
//! changing shape. The sizes and victims come from a pre-generated stream,
//! identical for every engine. The reported time is per pair (two calls).
//!
//! ```sh
//! cargo bench -p blockalloc-bench --features peers --bench engines
//! BLOCKALLOC_BENCH_ENGINES=segfit,pool cargo bench -p blockalloc-bench --bench engines
//! ```
//!
//! Every engine's prefill runs before criterion's name filter is applied,
//! and the first-fit bitmaps prefill slowly; `BLOCKALLOC_BENCH_ENGINES`
//! (a comma-separated list of engine names) builds only those.

use std::hint::black_box;

use blockalloc::{Allocator, Extent};
use blockalloc_bench::BenchEngine;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// 64 GiB of 4 KiB blocks: small enough for every engine and peer to build
/// quickly, large enough that the live set does not fit in L2.
const CAPACITY: u64 = 1 << 24;
/// Pre-generated operations per case (the measurement cycles through them).
const STREAM: usize = 1 << 16;

struct Case {
    name: &'static str,
    /// Largest object, in blocks (sizes are uniform in 1..=max).
    max_blocks: u64,
    /// Utilisation the device is filled to before measuring.
    fill: f64,
}

const CASES: [Case; 3] = [
    // The seed workload's sizes (0–4 MiB) on a half-full device.
    Case {
        name: "uniform-4MiB-50pct",
        max_blocks: 1024,
        fill: 0.5,
    },
    // The same, 90 % full: where first-fit bitmaps slow down.
    Case {
        name: "uniform-4MiB-90pct",
        max_blocks: 1024,
        fill: 0.9,
    },
    // Small objects (4–64 KiB), the thumbnail-store mix.
    Case {
        name: "uniform-64KiB-50pct",
        max_blocks: 16,
        fill: 0.5,
    },
];

/// Allocates random objects of 1..=`max_blocks` blocks until `target`
/// blocks are used; `None` if the engine refuses one.
fn fill_to(
    engine: &mut dyn Allocator,
    live: &mut Vec<Extent>,
    rng: &mut Xoshiro256PlusPlus,
    target: u64,
    max_blocks: u64,
) -> Option<()> {
    while engine.used() < target {
        let len = rng.random_range(1..=max_blocks);
        live.push(engine.allocate(len, None).ok()?);
    }
    Some(())
}

/// A prefilled engine and the stream of (victim index, new size) pairs.
struct Steady {
    engine: Box<dyn Allocator>,
    live: Vec<Extent>,
    ops: Vec<(usize, u64)>,
    next: usize,
}

impl Steady {
    fn new(which: BenchEngine, case: &Case) -> Option<Steady> {
        let mut engine = which.build(CAPACITY).ok()?;
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let mut live = Vec::new();
        let target = (CAPACITY as f64 * case.fill) as u64;
        fill_to(&mut *engine, &mut live, &mut rng, target, case.max_blocks)?;
        // Random frees at the fill level, so the free space is fragmented
        // as it is in a long-running store, then refill to the target.
        for _ in 0..live.len() / 2 {
            let i = rng.random_range(0..live.len());
            engine.free(live.swap_remove(i)).ok()?;
        }
        fill_to(&mut *engine, &mut live, &mut rng, target, case.max_blocks)?;
        let n = live.len();
        let ops = (0..STREAM)
            .map(|_| {
                (
                    rng.random_range(0..n),
                    rng.random_range(1..=case.max_blocks),
                )
            })
            .collect();
        Some(Steady {
            engine,
            live,
            ops,
            next: 0,
        })
    }

    /// Frees one live object and allocates a replacement in its slot.
    #[inline]
    fn step(&mut self) {
        let (victim, len) = self.ops[self.next];
        self.next = (self.next + 1) % self.ops.len();
        let old = self.live[victim];
        self.engine.free(old).expect("a live object frees");
        let new = match self.engine.allocate(len, None) {
            Ok(e) => e,
            // At a high fill level a large request can miss; put back an
            // object of the old size so the fill level does not drift.
            Err(_) => self
                .engine
                .allocate(old.len(), None)
                .expect("the space just freed fits the old size"),
        };
        self.live[victim] = black_box(new);
    }
}

/// The engines to measure: all of this build, or those named in
/// `BLOCKALLOC_BENCH_ENGINES`.
fn selected() -> Vec<BenchEngine> {
    let only = std::env::var("BLOCKALLOC_BENCH_ENGINES").ok();
    BenchEngine::all()
        .into_iter()
        .filter(|&e| e != BenchEngine::PoolCompact) // `pool`'s hot path again
        .filter(|e| {
            only.as_deref()
                .is_none_or(|list| list.split(',').any(|n| n.trim() == e.name()))
        })
        .collect()
}

fn engines(c: &mut Criterion) {
    let engines = selected();
    for case in &CASES {
        let mut group = c.benchmark_group(format!("free+alloc/{}", case.name));
        group.throughput(Throughput::Elements(2));
        for &which in &engines {
            let Some(mut steady) = Steady::new(which, case) else {
                eprintln!("{}: skipped (cannot run this case)", which.name());
                continue;
            };
            group.bench_function(BenchmarkId::from_parameter(which.name()), |b| {
                b.iter(|| steady.step())
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = engines
}
criterion_main!(benches);
