//! Latency measurement: phase-timed means plus sampled per-op tails.
//!
//! A single allocation takes tens of nanoseconds, about as long as the
//! `Instant::now()` pair needed to time it, so timing every operation would
//! double what we measure. Instead:
//!
//! * **Mean.** The runner times each round's allocation loop and free loop
//!   as wholes. `mean = (Σ phase time − samples × timer cost) / ops`.
//! * **Tail.** One operation in [`SAMPLE_STRIDE`] (a fixed stride: the 1st,
//!   17th, 33rd, … of each loop) is timed on its own with an `Instant::now()`
//!   pair. The cost of an empty pair, calibrated at start-up as the median of
//!   many ([`TimerCalibration`]), is subtracted, and the result goes into an
//!   HDR histogram (nanoseconds, 3 significant digits) for p50, p99, p99.9 and
//!   max. Each sample also lands in the histogram of the fill level (decile of
//!   `used / capacity` just before the operation), which gives p99.9 per fill
//!   level.
//!
//! Sampled values are clamped at zero after the subtraction; with a timer
//! resolution of tens of nanoseconds the fastest operations can read as `0`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// One operation in this many is timed individually.
pub const SAMPLE_STRIDE: usize = 16;

/// Number of fill-level buckets: deciles of utilisation.
pub const FILL_BUCKETS: usize = 10;

/// Largest latency the histograms tell apart (longer ones saturate): ~68 s.
const HIST_MAX_NS: u64 = 1 << 36;

/// The cost of timing an empty region with an `Instant::now()` pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TimerCalibration {
    /// Median cost in nanoseconds; subtracted from every sample.
    pub pair_ns: u64,
    /// Minimum cost observed, for reference.
    pub min_ns: u64,
}

impl TimerCalibration {
    /// Measures the timer: median and minimum of 20 001 empty pairs after a
    /// warm-up.
    pub fn measure() -> Self {
        const N: usize = 20_001;
        for _ in 0..1000 {
            black_box(Instant::now().elapsed());
        }
        let mut v: Vec<u64> = (0..N)
            .map(|_| {
                let t = Instant::now();
                black_box(());
                duration_ns(t.elapsed())
            })
            .collect();
        v.sort_unstable();
        TimerCalibration {
            pair_ns: v[N / 2],
            min_ns: v[0],
        }
    }

    /// A calibration of zero cost: tests, and samples whose timer cost
    /// is taken off already.
    pub const ZERO: TimerCalibration = TimerCalibration {
        pair_ns: 0,
        min_ns: 0,
    };
}

/// Nanoseconds in `d`, saturating.
pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The fill bucket of `used` blocks out of `capacity`: `0` for 0–10 %, …,
/// `9` for 90–100 %.
#[inline]
pub(crate) fn fill_bucket(used: u64, capacity: u64) -> u8 {
    let b = used as u128 * FILL_BUCKETS as u128 / capacity.max(1) as u128;
    b.min(FILL_BUCKETS as u128 - 1) as u8
}

/// One individually timed operation, as recorded inside a timed loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawSample {
    /// Raw `Instant` pair reading, timer cost not yet subtracted.
    pub raw_ns: u64,
    /// Fill bucket just before the operation (see [`fill_bucket`]).
    pub fill: u8,
}

/// Latency statistics of one kind of operation (allocate or free).
#[derive(Clone, Debug)]
pub(crate) struct OpLatency {
    timer: TimerCalibration,
    all: Histogram<u64>,
    by_fill: Vec<Histogram<u64>>,
    ops: u64,
    corrected_ns: u128,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3).expect("constant histogram bounds are valid")
}

impl OpLatency {
    /// Empty statistics; samples will have `timer.pair_ns` subtracted.
    pub fn new(timer: TimerCalibration) -> Self {
        OpLatency {
            timer,
            all: histogram(),
            by_fill: (0..FILL_BUCKETS).map(|_| histogram()).collect(),
            ops: 0,
            corrected_ns: 0,
        }
    }

    /// Adds one timed loop: `ops` operations took `elapsed`, of which
    /// `samples.len()` were timed individually.
    pub fn add_phase(&mut self, elapsed: Duration, ops: u64, samples: &[RawSample]) {
        let overhead = self.timer.pair_ns as u128 * samples.len() as u128;
        self.corrected_ns += (elapsed.as_nanos()).saturating_sub(overhead);
        self.ops += ops;
        for s in samples {
            let ns = s.raw_ns.saturating_sub(self.timer.pair_ns);
            self.all.saturating_record(ns);
            self.by_fill[s.fill as usize].saturating_record(ns);
        }
    }

    /// Adds operations each timed on its own, their timer cost already
    /// taken off: `samples` in nanoseconds, `busy` their total time (which
    /// the mean divides; it may exceed the samples' sum where a sample is
    /// a share of a call rounded down). Such samples belong to no fill
    /// level.
    pub fn add_timed(&mut self, busy: Duration, samples: &[u64]) {
        self.corrected_ns += busy.as_nanos();
        self.ops += samples.len() as u64;
        for &ns in samples {
            self.all.saturating_record(ns);
        }
    }

    /// Adds another thread's statistics to these.
    pub fn merge(&mut self, other: &OpLatency) {
        self.all
            .add(&other.all)
            .expect("histograms share their bounds");
        for (a, b) in self.by_fill.iter_mut().zip(&other.by_fill) {
            a.add(b).expect("histograms share their bounds");
        }
        self.ops += other.ops;
        self.corrected_ns += other.corrected_ns;
    }

    /// Operations counted.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Time spent in the operations, timer overhead removed.
    pub fn busy(&self) -> Duration {
        let ns = u64::try_from(self.corrected_ns).unwrap_or(u64::MAX);
        Duration::from_nanos(ns)
    }

    /// The summary: `None` fields when no operation was counted.
    pub fn summary(&self) -> LatencySummary {
        let sampled = !self.all.is_empty();
        let q = |x: f64| sampled.then(|| self.all.value_at_quantile(x));
        LatencySummary {
            mean: (self.ops > 0).then(|| self.corrected_ns as f64 / self.ops as f64),
            p50: q(0.5),
            p99: q(0.99),
            p999: q(0.999),
            max: sampled.then(|| self.all.max()),
            samples: self.all.len(),
        }
    }

    /// p99.9 per fill decile (`None` where no sample fell).
    pub fn p999_by_fill(&self) -> Vec<Option<u64>> {
        self.by_fill
            .iter()
            .map(|h| (!h.is_empty()).then(|| h.value_at_quantile(0.999)))
            .collect()
    }
}

/// Latency of one kind of operation in nanoseconds, as written to JSON.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Mean over all operations (phase time / ops).
    pub mean: Option<f64>,
    /// Median of the samples.
    pub p50: Option<u64>,
    /// 99th percentile of the samples.
    pub p99: Option<u64>,
    /// 99.9th percentile of the samples.
    pub p999: Option<u64>,
    /// Largest sample.
    pub max: Option<u64>,
    /// Number of samples behind the percentiles.
    pub samples: u64,
}

/// A one-paragraph description of the method, for `--help` and JSON.
pub fn method_description(timer: TimerCalibration) -> String {
    format!(
        "mean = timed alloc/free loops / ops; percentiles from 1 op in {SAMPLE_STRIDE} timed \
         with an Instant::now() pair minus the calibrated empty-pair cost ({} ns median, {} ns min)",
        timer.pair_ns, timer.min_ns
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_is_plausible() {
        let t = TimerCalibration::measure();
        assert!(t.min_ns <= t.pair_ns);
        assert!(t.pair_ns < 1_000_000, "{t:?}");
    }

    #[test]
    fn fill_buckets() {
        assert_eq!(fill_bucket(0, 100), 0);
        assert_eq!(fill_bucket(9, 100), 0);
        assert_eq!(fill_bucket(10, 100), 1);
        assert_eq!(fill_bucket(99, 100), 9);
        assert_eq!(fill_bucket(100, 100), 9);
        assert_eq!(fill_bucket(u64::MAX, u64::MAX), 9);
        assert_eq!(fill_bucket(0, 0), 0);
    }

    #[test]
    fn summary_subtracts_timer_cost() {
        let timer = TimerCalibration {
            pair_ns: 20,
            min_ns: 15,
        };
        let mut l = OpLatency::new(timer);
        assert_eq!(l.summary().mean, None);
        assert_eq!(l.summary().p50, None);
        let samples: Vec<RawSample> = (0..100)
            .map(|i| RawSample {
                raw_ns: 120 + i,
                fill: if i < 50 { 0 } else { 9 },
            })
            .chain([RawSample {
                raw_ns: 10,
                fill: 0,
            }])
            .collect();
        // 1600 ops in 101 samples' overhead + 160 µs.
        l.add_phase(Duration::from_nanos(160_000 + 20 * 101), 1600, &samples);
        let s = l.summary();
        assert_eq!(s.mean, Some(100.0));
        assert_eq!(s.samples, 101);
        assert_eq!(s.max, Some(199));
        assert_eq!(s.p50, Some(149));
        let by_fill = l.p999_by_fill();
        assert_eq!(by_fill.len(), FILL_BUCKETS);
        assert_eq!(by_fill[0], Some(149));
        assert_eq!(by_fill[9], Some(199));
        assert!(by_fill[1..9].iter().all(Option::is_none));
        assert_eq!(l.busy(), Duration::from_nanos(160_000));
    }

    #[test]
    fn timed_samples_feed_the_percentiles_and_the_mean_their_total_time() {
        let mut l = OpLatency::new(TimerCalibration::ZERO);
        let samples: Vec<u64> = (1..=1000).collect();
        // Shares of calls rounded down: the total time is a little more.
        l.add_timed(Duration::from_nanos(500_500 + 1000), &samples);
        let s = l.summary();
        assert_eq!(s.samples, 1000);
        assert_eq!(s.mean, Some(501.5));
        assert_eq!(s.p50, Some(500));
        assert_eq!(s.p99, Some(990));
        assert_eq!(s.p999, Some(999));
        assert_eq!(s.max, Some(1000));
        assert!(l.p999_by_fill().iter().all(Option::is_none));
    }
}
