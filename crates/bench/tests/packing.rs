//! Packing bounds of the recommended engine on scaled-down versions of the
//! benchmark workloads, so that a regression fails CI. The request streams
//! are deterministic, so these are exact regression tests, not statistics.

use blockalloc::{EngineKind, Geometry};
use blockalloc_bench::{
    run_engine, AgingSpec, BenchConfig, BenchEngine, Limits, Mode, NoObserver, RunReport,
    StopReason, TimerCalibration, WorkloadKind, WorkloadSpec,
};

fn run(engine: EngineKind, capacity: &str, mode: Mode, workload: WorkloadSpec) -> RunReport {
    run_bench(BenchEngine::Core(engine), capacity, mode, workload)
}

fn run_bench(engine: BenchEngine, capacity: &str, mode: Mode, workload: WorkloadSpec) -> RunReport {
    let cfg = BenchConfig {
        geometry: Geometry::parse(capacity, "4KiB").unwrap(),
        mode,
        workload,
        limits: Limits::default(),
        verify: false,
    };
    let r = run_engine(engine, &cfg, TimerCalibration::measure(), &mut NoObserver).unwrap();
    assert_eq!(r.stopped, StopReason::NoSpace, "{engine}");
    r
}

fn seed(free_prob: f64) -> WorkloadSpec {
    WorkloadSpec {
        round_size: 10_000,
        free_prob,
        ..WorkloadSpec::default()
    }
}

#[test]
fn segfit_packs_the_seed_workload_above_best_fit() {
    // The one departure from best fit, a fragment kept whole for its own
    // size while fragments are few, is there for this workload: a best fit
    // cuts each freed extent into slivers (99.89 % and 99.83 % here;
    // segfit 99.93 % and 99.88 %).
    for p in [0.5, 0.8] {
        let s = run(EngineKind::SegFit, "1TiB", Mode::Contiguous, seed(p));
        let b = run_bench(BenchEngine::BestFit, "1TiB", Mode::Contiguous, seed(p));
        let (us, them) = (
            s.utilization_at_first_failure.unwrap(),
            b.utilization_at_first_failure.unwrap(),
        );
        assert!(us > them + 0.0003, "p={p}: segfit {us}, best fit {them}");
    }
}

#[test]
fn segfit_stays_above_the_packing_bound_on_the_shift_workload() {
    let shift = WorkloadSpec {
        kind: WorkloadKind::Shift,
        round_size: 10_000,
        ..WorkloadSpec::default()
    };
    let r = run(EngineKind::SegFit, "256GiB", Mode::Contiguous, shift);
    assert_eq!(r.phase, Some(2), "the failure comes in phase 2");
    let u = r.utilization_at_first_failure.unwrap();
    assert!(u >= 0.95, "shift: segfit {u} < 0.95");
}

#[test]
fn segfit_scattered_fails_only_when_space_runs_out() {
    let r = run(EngineKind::SegFit, "256GiB", Mode::Scattered, seed(0.5));
    // The failing request was at most 1024 blocks: fewer than that were free.
    let free = r.final_status.free_blocks;
    assert!(free < 1024, "scattered failed with {free} blocks free");
    // Objects are split only where no free extent holds them: near the end,
    // among the slivers; no more often than under a best fit (1.064).
    let b = run_bench(BenchEngine::BestFit, "256GiB", Mode::Scattered, seed(0.5));
    let (e, theirs) = (r.extents_per_object.unwrap(), b.extents_per_object.unwrap());
    assert!(e <= theirs, "{e} extents per object, best fit {theirs}");
}

#[test]
fn segfit_survives_the_notes_worst_case_for_pooling() {
    // Fill with small objects, delete 80 %, then big ones: the pool strands
    // its small fragments (~24 %), segfit merges them at once.
    let w = WorkloadSpec {
        kind: WorkloadKind::FillShift,
        round_size: 10_000,
        ..WorkloadSpec::default()
    };
    let s = run(EngineKind::SegFit, "64GiB", Mode::Contiguous, w);
    let p = run(EngineKind::Pool, "64GiB", Mode::Contiguous, w);
    assert_eq!(s.phase, Some(3), "segfit fails only among the big objects");
    let (us, them) = (
        s.utilization_at_first_failure.unwrap(),
        p.utilization_at_first_failure.unwrap(),
    );
    assert!(us > 0.6 && us > 2.0 * them, "segfit {us}, pool {them}");
}

/// How far below best fit segfit may land: five blocks in 10 000. The
/// streams are deterministic, so this is slack for the policy's legitimate
/// differences from best fit (which fragment a request lands in), not for
/// noise.
const BEST_FIT_MARGIN: f64 = 0.0005;

/// Utilisation at the first failure of segfit and of best fit on one stream.
fn against_best_fit(capacity: &str, workload: WorkloadSpec) -> (RunReport, f64, f64) {
    let s = run(EngineKind::SegFit, capacity, Mode::Contiguous, workload);
    let b = run_bench(BenchEngine::BestFit, capacity, Mode::Contiguous, workload);
    let (us, them) = (
        s.utilization_at_first_failure.unwrap(),
        b.utilization_at_first_failure.unwrap(),
    );
    (s, us, them)
}

#[test]
fn segfit_does_not_strand_fragments_on_a_small_device() {
    // On a small device a round is a third of the capacity: the large
    // extents run out while fragments still wait for their exact sizes,
    // and a request longer than every fragment fails early (98.4 % against
    // best fit's 99.7 % at p = 0.8) unless the fragments are used first.
    let lognormal = WorkloadSpec {
        sizes: "lognormal:64KiB:1.5".parse().unwrap(),
        ..seed(0.5)
    };
    for (name, w) in [
        ("p=0.5", seed(0.5)),
        ("p=0.8", seed(0.8)),
        ("lognormal", lognormal),
    ] {
        let (_, us, them) = against_best_fit("64GiB", w);
        assert!(
            us >= them - BEST_FIT_MARGIN,
            "{name}: segfit {us} < best fit {them}"
        );
    }
}

#[test]
fn segfit_packs_an_aged_device_like_best_fit() {
    // Four fills to 90 % with the notes' size mix, each followed by random
    // deletes down to 50 %, then 3-4 MiB objects to the first failure.
    let aging = WorkloadSpec {
        kind: WorkloadKind::Aging,
        round_size: 10_000,
        ..WorkloadSpec::default()
    };
    for capacity in ["64GiB", "256GiB"] {
        let (s, us, them) = against_best_fit(capacity, aging);
        assert_eq!(
            s.phase,
            Some(3),
            "{capacity}: fails among the large objects"
        );
        assert!(
            us >= them - BEST_FIT_MARGIN,
            "{capacity}: segfit {us} < best fit {them}"
        );
    }
}

#[test]
fn segfit_packs_the_shifts_like_best_fit_on_a_small_device() {
    for kind in [WorkloadKind::Shift, WorkloadKind::FillShift] {
        let w = WorkloadSpec {
            kind,
            round_size: 10_000,
            ..WorkloadSpec::default()
        };
        let (_, us, them) = against_best_fit("64GiB", w);
        assert!(
            us >= them - BEST_FIT_MARGIN,
            "{kind}: segfit {us} < best fit {them}"
        );
    }
}

#[test]
fn segfit_packs_aged_devices_at_least_as_well_as_best_fit() {
    // After the fill/delete cycles the last phase asks only for 3-4 MiB
    // (or 4 MiB) objects. A fragment passed over during the fills, to keep
    // it for requests of its own size, then stays free while the large
    // extents run out: waits must stay few.
    let aging = |round_size, large: &str| WorkloadSpec {
        kind: WorkloadKind::Aging,
        round_size,
        aging: AgingSpec {
            large: large.parse().unwrap(),
            ..AgingSpec::default()
        },
        ..WorkloadSpec::default()
    };
    for (capacity, w) in [
        ("4GiB", aging(1_000, "uniform:3MiB..4MiB")),
        ("64GiB", aging(10_000, "uniform:3MiB..4MiB")),
        ("64GiB", aging(10_000, "fixed:4MiB")),
    ] {
        let (s, us, them) = against_best_fit(capacity, w);
        assert_eq!(
            s.phase,
            Some(3),
            "{capacity}: fails among the large objects"
        );
        assert!(
            us >= them,
            "{capacity} {}: segfit {us} < best fit {them}",
            w.aging.large
        );
    }
}

#[test]
fn segfit_packs_long_tailed_sizes_like_best_fit() {
    // Log-normal sizes: mostly small requests, rarely a long one. Were the
    // fragments to wait for their exact sizes without a bound, the small
    // requests would be cut from the large extents, and the rare long
    // request would find none (94.0-97.7 % against best fit's 99.76-99.96 %
    // on the first device).
    let long_tail = |sizes: &str, free_prob, round_size, seed| WorkloadSpec {
        sizes: sizes.parse().unwrap(),
        free_prob,
        round_size,
        seed,
        ..WorkloadSpec::default()
    };
    for (capacity, w, margin) in [
        ("4GiB", long_tail("lognormal:32KiB:2.5", 0.8, 300, 1), 0.005),
        ("4GiB", long_tail("lognormal:32KiB:2.5", 0.8, 300, 2), 0.005),
        ("4GiB", long_tail("lognormal:32KiB:2.5", 0.8, 300, 3), 0.005),
        (
            "4GiB",
            long_tail("lognormal:64KiB:1.5", 0.5, 300, 1),
            BEST_FIT_MARGIN,
        ),
        (
            "8GiB",
            long_tail("lognormal:64KiB:1.5", 0.5, 1_250, 1),
            BEST_FIT_MARGIN,
        ),
    ] {
        let (_, us, them) = against_best_fit(capacity, w);
        assert!(
            us >= them - margin,
            "{capacity} {} p={} rounds of {} seed {}: segfit {us} < best fit {them}",
            w.sizes,
            w.free_prob,
            w.round_size,
            w.seed
        );
    }
}

/// splitmix64: the family's random numbers.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn pick(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn simple_sizes(&mut self) -> String {
        match self.pick(3) {
            0 => format!(
                "uniform:{}KiB..{}KiB",
                4 + self.pick(512),
                600 + self.pick(3496)
            ),
            1 => format!(
                "fixed:{}KiB",
                [4, 16, 64, 128, 1024, 3000, 4096][self.pick(7) as usize]
            ),
            _ => format!(
                "lognormal:{}KiB:{:.2}",
                8 + self.pick(2040),
                0.2 + self.pick(180) as f64 / 100.0
            ),
        }
    }
    fn sizes(&mut self) -> String {
        if self.pick(4) == 3 {
            let (a, b) = (1 + self.pick(9), self.simple_sizes());
            let (c, d) = (1 + self.pick(9), self.simple_sizes());
            format!("mix:{a}*{b}+{c}*{d}")
        } else {
            self.simple_sizes()
        }
    }
}

/// One stream of a random family: a device of 6–32 GiB (where segfit's
/// fragments may wait), a round size, a workload and object sizes — the
/// shapes of `scripts/stream-family.sh`.
fn family_stream(d: &mut Draw) -> (String, WorkloadSpec) {
    let gib = (6.0 * (32.0f64 / 6.0).powf(d.unit())) as u64;
    let round_size = (gib as f64 * (20.0 + 380.0 * d.unit())) as u64;
    let mut w = WorkloadSpec {
        round_size,
        seed: d.next() >> 33,
        ..WorkloadSpec::default()
    };
    match d.pick(5) {
        0 | 1 => {
            w.sizes = d.sizes().parse().unwrap();
            w.free_prob = 0.1 + 0.8 * d.unit();
        }
        2 => w.kind = WorkloadKind::Shift,
        3 => w.kind = WorkloadKind::FillShift,
        _ => {
            let high = 0.6 + 0.37 * d.unit();
            w.kind = WorkloadKind::Aging;
            w.sizes = d.sizes().parse().unwrap();
            w.aging = AgingSpec {
                high,
                low: 0.2 + (high - 0.25) * d.unit(),
                cycles: 1 + d.pick(5) as u32,
                large: d.sizes().parse().unwrap(),
            };
        }
    }
    (format!("{gib}GiB"), w)
}

#[test]
fn segfit_stays_within_a_tenth_of_a_point_of_best_fit_on_a_random_family() {
    // The bound of docs/design.md (segfit's policy): a wait for an exact
    // fit can cost at most about 1/1024 of the device against best fit.
    let mut d = Draw(2026);
    for i in 0..24 {
        let (capacity, w) = family_stream(&mut d);
        let cfg = |engine| {
            let cfg = BenchConfig {
                geometry: Geometry::parse(&capacity, "4KiB").unwrap(),
                mode: Mode::Contiguous,
                workload: w,
                limits: Limits::default(),
                verify: false,
            };
            run_engine(engine, &cfg, TimerCalibration::measure(), &mut NoObserver).unwrap()
        };
        let s = cfg(BenchEngine::Core(EngineKind::SegFit));
        let b = cfg(BenchEngine::BestFit);
        let (Some(us), Some(them)) = (
            s.utilization_at_first_failure,
            b.utilization_at_first_failure,
        ) else {
            panic!("stream {i} ({capacity}, {w:?}) did not fail under both engines");
        };
        assert!(
            us >= them - 0.001,
            "stream {i} ({capacity}, {w:?}): segfit {us} < best fit {them} - 0.1 point"
        );
    }
}
