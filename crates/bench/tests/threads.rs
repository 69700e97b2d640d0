//! `bench --threads`: the shared allocator under several threads, end to end.

use blockalloc::Geometry;
use blockalloc_bench::{
    run_threads, BenchConfig, Limits, Mode, NoObserver, StopReason, TimerCalibration, WorkloadSpec,
    WORKLOADS,
};

fn config(mode: Mode, capacity: &str, round_size: u64) -> BenchConfig {
    BenchConfig {
        geometry: Geometry::parse(capacity, "4KiB").unwrap(),
        mode,
        workload: WorkloadSpec {
            round_size,
            ..WorkloadSpec::default()
        },
        limits: Limits::default(),
        verify: true,
    }
}

#[test]
fn threads_fill_the_device_and_stay_consistent() {
    // Bounds measured: 1 TiB contiguous with 3 threads reaches 0.9987–0.99997
    // depending on the interleaving (one thread: 0.9999); on 64 GiB the first failure comes earlier and varies
    // with the interleaving (0.993–0.999 seen), scattered fails only when
    // space is short.
    for (mode, capacity, rounds, bound) in [
        (Mode::Contiguous, "1TiB", 100_000, 0.998),
        (Mode::Scattered, "64GiB", 20_000, 0.98),
    ] {
        let cfg = config(mode, capacity, rounds);
        for threads in [1, 3] {
            let r = run_threads(threads, &cfg, TimerCalibration::measure(), &mut NoObserver)
                .unwrap_or_else(|e| panic!("{threads} threads {mode:?}: {e}"));
            assert_eq!(r.threads, threads);
            assert_eq!(r.stopped, StopReason::NoSpace);
            let u = r.utilization_at_first_failure.unwrap();
            // The shared handle packs almost like the engine itself.
            assert!(
                u > bound,
                "{threads} threads {mode:?} on {capacity}: utilisation {u}"
            );
            let per = r.per_thread.as_ref().unwrap();
            assert_eq!(per.len(), threads as usize);
            assert_eq!(
                per.iter().map(|t| t.allocations).sum::<u64>(),
                r.allocations
            );
            // (A thread may be scheduled too late to allocate anything on a
            // device this small; the totals must still add up.)
            assert!(r.frees > 0 && r.frees <= r.allocations);
            let locks = r.locks.unwrap();
            assert!(locks.lock_acquisitions >= r.allocations);
            assert!(locks.leases > 0);
            assert!(r.ops_per_sec > 0.0);
            let json: serde_json::Value = serde_json::from_str(&r.to_json_line()).unwrap();
            assert_eq!(json["threads"], threads);
            assert!(json["per_thread"].is_array() && json["locks"].is_object());
        }
    }
}

#[test]
fn limits_stop_every_thread() {
    let mut cfg = config(Mode::Contiguous, "64GiB", 20_000);
    cfg.limits.max_rounds = Some(2);
    let r = run_threads(4, &cfg, TimerCalibration::measure(), &mut NoObserver).unwrap();
    assert_eq!(r.stopped, StopReason::MaxRounds);
    assert!(r.utilization_at_first_failure.is_none());
    for t in r.per_thread.unwrap() {
        assert!(t.rounds <= 2, "thread {} ran {} rounds", t.thread, t.rounds);
    }
    cfg.limits = Limits {
        max_ops: Some(3000),
        ..Limits::default()
    };
    let r = run_threads(2, &cfg, TimerCalibration::measure(), &mut NoObserver).unwrap();
    assert_eq!(r.stopped, StopReason::MaxOps);
}

/// Every workload of the registry runs on threads: those whose frees cross
/// rounds keep each thread's live objects, and those whose phases end at
/// fill levels give each thread its share of the device, so that the large
/// objects of the last phase are what fails.
#[test]
fn threads_run_every_workload() {
    for w in WORKLOADS {
        let mut cfg = config(Mode::Contiguous, "64GiB", 2000);
        cfg.workload.kind = w.kind;
        let r = run_threads(2, &cfg, TimerCalibration::ZERO, &mut NoObserver)
            .unwrap_or_else(|e| panic!("{}: {e}", w.name));
        if w.ends {
            // A stream that ends stops the run there, unless space ran out
            // first.
            assert!(
                [StopReason::EndOfWorkload, StopReason::NoSpace].contains(&r.stopped),
                "{}: {}",
                w.name,
                r.stopped
            );
        } else {
            assert_eq!(r.stopped, StopReason::NoSpace, "{}", w.name);
        }
        assert_eq!(r.workload, w.name);
        assert!(r.allocations > 0 && r.frees <= r.allocations, "{}", w.name);
        let phases: Vec<u8> = r.per_round.iter().filter_map(|p| p.phase).collect();
        if w.phased {
            assert_eq!(phases.len(), r.per_round.len(), "{}", w.name);
        } else {
            assert!(phases.is_empty(), "{}", w.name);
        }
        if w.shares_device {
            assert!(
                r.per_thread.as_ref().unwrap().iter().all(|t| t.frees > 0),
                "{}: every thread reached its deletions",
                w.name
            );
        }
    }
}

#[test]
fn one_arena_fills_small_rounds_like_one_engine() {
    // One thread is deterministic. Rounds of 1 250 on 32 GiB (128 MiB
    // regions): the arena, judging its few long runs against all its
    // fragments, used to cut slivers while the pool held untouched regions,
    // and filled to 99.54 % where one engine fills to 99.87 %. Counting
    // the pool as its reserve of long runs, it fills to 99.875 %.
    let cfg = config(Mode::Contiguous, "32GiB", 1_250);
    let shared = run_threads(1, &cfg, TimerCalibration::measure(), &mut NoObserver).unwrap();
    let engine = blockalloc_bench::run_engine(
        blockalloc_bench::BenchEngine::Core(blockalloc::EngineKind::SegFit),
        &cfg,
        TimerCalibration::measure(),
        &mut NoObserver,
    )
    .unwrap();
    let (s, e) = (
        shared.utilization_at_first_failure.unwrap(),
        engine.utilization_at_first_failure.unwrap(),
    );
    assert!(s > e - 0.0005, "shared {s} against the engine's {e}");
}
