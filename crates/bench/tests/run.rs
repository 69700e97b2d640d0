//! End-to-end runs of every engine on small devices.

use std::time::Duration;

use blockalloc::Geometry;
use blockalloc_bench::{
    run_engine, BenchConfig, BenchEngine, Limits, Mode, NoObserver, Observer, RoundProgress,
    RunReport, SizeSpec, StopReason, TimerCalibration, WorkloadKind, WorkloadSpec, CONTRACT_FIELDS,
    LATENCY_FIELDS, ROUND_FIELDS,
};
use serde_json::Value;

fn config(mode: Mode) -> BenchConfig {
    BenchConfig {
        geometry: Geometry::parse("1GiB", "4KiB").unwrap(),
        mode,
        workload: WorkloadSpec {
            round_size: 200,
            ..WorkloadSpec::default()
        },
        limits: Limits::default(),
        verify: false,
    }
}

fn run(engine: BenchEngine, cfg: &BenchConfig) -> RunReport {
    run_engine(engine, cfg, TimerCalibration::measure(), &mut NoObserver)
        .unwrap_or_else(|e| panic!("{engine}: {e}"))
}

fn check_report(r: &RunReport, cfg: &BenchConfig) {
    let who = &r.engine;
    assert_eq!(r.stopped, StopReason::NoSpace, "{who}");
    let u = r.utilization_at_first_failure.expect("failure recorded");
    assert!(u > 0.0 && u <= 1.0, "{who}: {u}");
    assert!(r.allocations > 0 && r.frees <= r.allocations, "{who}");
    assert_eq!(r.rounds, r.per_round.len() as u64, "{who}");
    // Every round but the last is whole: round_size allocations each.
    let whole = (r.rounds - 1) * cfg.workload.round_size;
    assert!(r.allocations >= whole && r.allocations < whole + cfg.workload.round_size);
    // 1 op in 16 of each loop is sampled, the first one included.
    let samples = r.alloc_ns.samples;
    assert!(samples >= r.allocations / 16 && samples <= r.allocations / 16 + 2 * r.rounds);
    assert!(
        r.alloc_ns.mean.is_some() && r.alloc_ns.p50.is_some(),
        "{who}"
    );
    assert!(r.alloc_ns.p50 <= r.alloc_ns.p999 && r.alloc_ns.p999 <= r.alloc_ns.max);
    assert_eq!(r.alloc_p999_by_fill.len(), 10);
    assert!(
        r.alloc_p999_by_fill[0].is_some(),
        "{who}: first decile sampled"
    );
    assert!(r.ops_per_sec > 0.0);
    assert!(r.allocator_memory_bytes > 0, "{who}");
    assert!(r.extents_per_object.unwrap() >= 1.0);
    if cfg.mode == Mode::Contiguous {
        assert_eq!(r.extents_per_object, Some(1.0), "{who}");
        assert_eq!(r.frees, r.free_calls);
    }
    let st = r.final_status;
    assert_eq!(
        st.used_blocks + st.free_blocks,
        cfg.geometry.capacity_blocks()
    );
    assert!((0.0..=1.0).contains(&st.fragmentation));
    for w in r.per_round.windows(2) {
        assert_eq!(w[1].round, w[0].round + 1);
    }
    assert!(r
        .per_round
        .iter()
        .all(|p| p.utilization <= 1.0 && p.secs >= 0.0));

    let v: Value = serde_json::from_str(&r.to_json_line()).expect("valid JSON");
    for f in CONTRACT_FIELDS {
        assert!(v.get(f).is_some(), "{who}: JSON lacks {f}");
    }
    for f in LATENCY_FIELDS {
        assert!(v["alloc_ns"][f].is_number(), "{who}: alloc_ns.{f}");
    }
    for f in ROUND_FIELDS {
        assert!(v["per_round"][0][f].is_number(), "{who}: per_round.{f}");
    }
    assert_eq!(v["engine"], who.as_str());
    assert_eq!(v["mode"], cfg.mode.name());
    assert_eq!(v["threads"], 1);
    assert_eq!(v["stopped"], "no_space");
    assert_eq!(v["capacity_bytes"], cfg.geometry.capacity_bytes());
    assert!(!r.to_json_line().contains('\n'));
}

#[test]
fn every_engine_fills_a_small_device_contiguous() {
    let cfg = config(Mode::Contiguous);
    for engine in BenchEngine::all() {
        check_report(&run(engine, &cfg), &cfg);
    }
}

#[test]
fn every_engine_fills_a_small_device_scattered() {
    let cfg = config(Mode::Scattered);
    for engine in BenchEngine::all() {
        let r = run(engine, &cfg);
        check_report(&r, &cfg);
        assert_eq!(r.mode, Mode::Scattered);
    }
}

#[test]
fn verify_after_every_round() {
    let mut cfg = config(Mode::Contiguous);
    cfg.verify = true;
    cfg.geometry = Geometry::parse("256MiB", "4KiB").unwrap();
    for engine in BenchEngine::all() {
        check_report(&run(engine, &cfg), &cfg);
    }
}

/// Records the allocations of each round, to compare streams.
#[derive(Default)]
struct Rounds(Vec<(u64, u64)>);

impl Observer for Rounds {
    fn round_finished(&mut self, p: &RoundProgress<'_>) {
        self.0.push((p.record.round, p.allocs));
    }
}

#[test]
fn same_stream_for_every_engine() {
    // Fixed sizes and p = 0: the same number of whole objects fits in every
    // engine that packs perfectly; the streams must at least agree up to the
    // first failure, which shows in identical round sizes.
    let mut cfg = config(Mode::Contiguous);
    cfg.workload.sizes = SizeSpec::Fixed(64 << 10);
    cfg.workload.free_prob = 0.0;
    for engine in BenchEngine::all() {
        let mut obs = Rounds::default();
        let r = run_engine(engine, &cfg, TimerCalibration::ZERO, &mut obs).unwrap();
        // 1 GiB holds 16384 objects of 64 KiB; engines may waste a little.
        assert!(r.allocations <= 16384 && r.allocations > 16000, "{engine}");
        assert_eq!(r.frees, 0);
        let n = obs.0.len();
        assert_eq!(n as u64, r.allocations / 200 + 1);
        assert!(obs.0[..n - 1].iter().all(|&(_, a)| a == 200));
        assert_eq!(obs.0[n - 1].1, r.allocations % 200);
        if engine.name() == "segfit" {
            assert_eq!(r.allocations, 16384);
            assert_eq!(r.utilization_at_first_failure, Some(1.0));
        }
    }
}

#[test]
fn limits_stop_with_the_right_reason() {
    let engine = BenchEngine::default();
    let mut cfg = config(Mode::Contiguous);
    cfg.geometry = Geometry::parse("1TiB", "4KiB").unwrap();

    cfg.limits = Limits {
        max_rounds: Some(3),
        ..Limits::default()
    };
    let r = run(engine, &cfg);
    assert_eq!(r.stopped, StopReason::MaxRounds);
    assert_eq!((r.rounds, r.allocations), (3, 600));
    assert_eq!(r.utilization_at_first_failure, None);
    let v: Value = serde_json::from_str(&r.to_json_line()).unwrap();
    assert!(v["utilization_at_first_failure"].is_null());
    assert_eq!(v["stopped"], "max_rounds");

    cfg.limits = Limits {
        max_ops: Some(1000),
        ..Limits::default()
    };
    let r = run(engine, &cfg);
    assert_eq!(r.stopped, StopReason::MaxOps);
    assert_eq!(r.allocations + r.free_calls, 1000, "max_ops is exact");

    cfg.limits = Limits::default();
    // Long enough that round 1 starts on a busy host (the limit is also
    // checked before a round), far shorter than the round: cut inside it.
    cfg.limits.time_limit = Some(Duration::from_millis(20));
    cfg.workload.round_size = 1_000_000;
    let r = run(engine, &cfg);
    assert_eq!(r.stopped, StopReason::TimeLimit);
    assert_eq!(r.rounds, 1);
    assert!(r.allocations < 1_000_000 && r.allocations.is_multiple_of(256));
    assert!(r.wall_secs < 30.0);
}

#[test]
fn shift_workload_reaches_phase_two() {
    let mut cfg = config(Mode::Contiguous);
    cfg.workload.kind = WorkloadKind::Shift;
    for engine in BenchEngine::all() {
        let r = run(engine, &cfg);
        assert_eq!(r.stopped, StopReason::NoSpace);
        assert_eq!(r.phase, Some(2), "{engine}");
        assert_eq!(r.free_prob, 0.5);
        assert_eq!(r.sizes, "uniform:3MiB..4MiB");
        let phases: Vec<u8> = r.per_round.iter().map(|p| p.phase.unwrap()).collect();
        assert_eq!(phases[0], 1);
        assert!(phases.windows(2).all(|w| w[0] <= w[1]));
        let v: Value = serde_json::from_str(&r.to_json_line()).unwrap();
        assert_eq!(v["per_round"][0]["phase"], 1);
        assert_eq!(v["workload"], "shift");
    }
}

/// `run_engines` runs the reference first, and every report from it on
/// carries its figure; each outcome is heard as it ends.
#[test]
fn run_engines_runs_the_reference_first_and_every_report_carries_it() {
    use blockalloc_bench::run_engines;
    let cfg = config(Mode::Contiguous);
    let (seg, best) = (BenchEngine::default(), BenchEngine::BestFit);
    let mut heard = Vec::new();
    let ran = run_engines(
        &[seg, best],
        Some(best),
        &cfg,
        TimerCalibration::ZERO,
        &mut NoObserver,
        |o| {
            heard.push(o.map(|r| r.engine.clone()).map_err(ToString::to_string));
            Ok::<(), ()>(())
        },
    )
    .unwrap();
    assert!(ran.skipped.is_empty() && ran.failed.is_empty());
    let names: Vec<&str> = ran.reports.iter().map(|r| r.engine.as_str()).collect();
    assert_eq!(names, [best.name(), seg.name()]);
    assert_eq!(
        heard,
        [Ok(best.name().to_string()), Ok(seg.name().to_string())]
    );
    let figure = ran.reports[0]
        .reference
        .clone()
        .expect("the reference's own figure");
    assert_eq!(figure.engine, best.name());
    assert_eq!(
        figure.utilization_at_first_failure,
        ran.reports[0].utilization_at_first_failure
    );
    assert_eq!(ran.reports[1].reference, Some(figure));
    // An error of the listener ends the run there.
    let mut calls = 0;
    let stopped = run_engines(
        &[seg, best],
        None,
        &cfg,
        TimerCalibration::ZERO,
        &mut NoObserver,
        |_| {
            calls += 1;
            Err("full")
        },
    );
    assert_eq!(stopped.err(), Some("full"));
    assert_eq!(calls, 1);
}
