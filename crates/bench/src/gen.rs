//! Built-in workloads written as traces, without running an engine.
//!
//! * every bench workload of the registry ([`WORKLOADS`]: `seed`, `shift`,
//!   `fill-shift`, `aging`), operation for operation as `bench` runs it.
//! * `lognormal[:MEDIAN:SIGMA]` — the seed workload's rounds with
//!   log-normal sizes (default `lognormal:64KiB:1.5`, capped at 4 MiB).
//! * `churn` — fill, then churn, of small objects: phase 1 allocates
//!   objects (default sizes `lognormal:32KiB:1`) until the live blocks reach
//!   [`ChurnSpec::fill`] (95 %) of the capacity; phase 2, round after round,
//!   frees a uniformly random live object and allocates new ones until the
//!   live blocks are back at the fill level — steady state deletes and
//!   inserts, the way an object store ages.
//!
//! # Where a generated trace ends
//!
//! Without an engine, nothing fails, so a rule decides:
//!
//! * the bench workloads and `lognormal` end **at the first allocation no
//!   allocator could serve**: the one that would make the live blocks (each
//!   object rounded up to blocks) exceed the capacity. That allocation is the
//!   trace's last operation, so every engine replaying the trace on the same
//!   capacity fails at or before it, as it would in `bench`.
//! * `churn` ends when the blocks allocated in phase 2 reach
//!   [`ChurnSpec::volume`] × the capacity (default 2), or at that same
//!   impossible allocation, whichever comes first.
//! * `max_ops`, when given, ends any trace after that many requests.

use std::fmt;
use std::str::FromStr;

use blockalloc::Geometry;
use blockalloc_trace::{keys, IdMap, TraceError, TraceHeader, TraceOp, TraceSink};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::sizes::{SizeSampler, SizeSpec};
use crate::workload::{AgingSpec, Op, Workload, WorkloadKind, WorkloadSpec, WORKLOADS};

/// Default sizes of the `lognormal` workload.
pub const LOGNORMAL_DEFAULT: SizeSpec = SizeSpec::LogNormal {
    median: 64 << 10,
    sigma: 1.5,
};

/// Default sizes of the `churn` workload.
pub const CHURN_SIZES: SizeSpec = SizeSpec::LogNormal {
    median: 32 << 10,
    sigma: 1.0,
};

/// A workload name for `trace gen --workload`: every bench workload of the
/// registry ([`WORKLOADS`]), and two that exist only as traces.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GenWorkload {
    /// A bench workload, operation for operation as `bench` runs it.
    Bench(WorkloadKind),
    /// The seed workload with these log-normal sizes.
    LogNormal(SizeSpec),
    /// Fill, then churn, of small objects.
    Churn,
}

impl GenWorkload {
    /// Every workload, each `lognormal` with its default sizes: the bench
    /// workloads of the registry, then `lognormal` and `churn`.
    pub const ALL: [GenWorkload; 6] = [
        GenWorkload::Bench(WORKLOADS[0].kind),
        GenWorkload::Bench(WORKLOADS[1].kind),
        GenWorkload::Bench(WORKLOADS[2].kind),
        GenWorkload::Bench(WORKLOADS[3].kind),
        GenWorkload::LogNormal(LOGNORMAL_DEFAULT),
        GenWorkload::Churn,
    ];

    /// The base name (a bench workload's, `lognormal`, `churn`).
    pub fn name(&self) -> &'static str {
        match self {
            GenWorkload::Bench(kind) => kind.name(),
            GenWorkload::LogNormal(_) => "lognormal",
            GenWorkload::Churn => "churn",
        }
    }

    /// True when `--sizes` applies.
    pub fn uses_sizes(&self) -> bool {
        match self {
            GenWorkload::Bench(kind) => kind.info().uses_sizes,
            GenWorkload::LogNormal(_) => false,
            GenWorkload::Churn => true,
        }
    }

    /// True when `--free-prob` applies.
    pub fn uses_free_prob(&self) -> bool {
        match self {
            GenWorkload::Bench(kind) => kind.info().uses_free_prob,
            GenWorkload::LogNormal(_) => true,
            GenWorkload::Churn => false,
        }
    }
}

impl fmt::Display for GenWorkload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenWorkload::LogNormal(s) => write!(f, "{s}"),
            w => f.write_str(w.name()),
        }
    }
}

/// A `--workload` value that is no workload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown workload {0:?} (known: {names}, lognormal[:MEDIAN:SIGMA], churn)",
    names = WorkloadKind::names()
)]
pub struct UnknownGenWorkload(pub String);

impl FromStr for GenWorkload {
    type Err = UnknownGenWorkload;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(kind) = s.parse::<WorkloadKind>() {
            return Ok(GenWorkload::Bench(kind));
        }
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "churn" => Ok(GenWorkload::Churn),
            "lognormal" => Ok(GenWorkload::LogNormal(LOGNORMAL_DEFAULT)),
            _ if t.starts_with("lognormal:") => match s.trim().parse::<SizeSpec>() {
                Ok(spec @ SizeSpec::LogNormal { .. }) => Ok(GenWorkload::LogNormal(spec)),
                _ => Err(UnknownGenWorkload(s.to_string())),
            },
            _ => Err(UnknownGenWorkload(s.to_string())),
        }
    }
}

/// Sets a trace header's description of the bench workload `spec`: its
/// name, sizes, free probability and shape. `bench --record` and `trace gen`
/// describe a workload alike.
pub(crate) fn describe_workload(h: &mut TraceHeader, spec: &WorkloadSpec) {
    h.set(keys::WORKLOAD, spec.kind.name());
    match spec.kind {
        WorkloadKind::Seed => {
            h.set(keys::SIZES, spec.sizes.to_string());
            h.set(keys::FREE_PROB, spec.free_prob.to_string());
        }
        WorkloadKind::Shift | WorkloadKind::FillShift => {
            h.set(keys::SIZES, "uniform:1B..1MiB then uniform:3MiB..4MiB");
        }
        WorkloadKind::Aging => {
            let a = spec.aging;
            h.set(keys::SIZES, format!("{} then {}", spec.sizes, a.large));
            h.set("high", a.high.to_string());
            h.set("low", a.low.to_string());
            h.set("cycles", a.cycles.to_string());
        }
    }
}

/// Parameters of the `churn` workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChurnSpec {
    /// Object sizes.
    pub sizes: SizeSpec,
    /// Fraction of the capacity kept live, in `(0, 1]`.
    pub fill: f64,
    /// Blocks allocated in phase 2, as a multiple of the capacity.
    pub volume: f64,
}

impl Default for ChurnSpec {
    fn default() -> Self {
        ChurnSpec {
            sizes: CHURN_SIZES,
            fill: 0.95,
            volume: 2.0,
        }
    }
}

/// Everything that determines a generated trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GenSpec {
    /// Which workload.
    pub workload: GenWorkload,
    /// The device the trace is made for.
    pub geometry: Geometry,
    /// Sizes for `seed` and the fill phases of `aging` (ignored by the
    /// others; `lognormal` carries its own).
    pub sizes: SizeSpec,
    /// Free probability for `seed` and `lognormal`.
    pub free_prob: f64,
    /// Allocation requests per round (`churn`: frees per round in phase 2).
    pub round_size: u64,
    /// RNG seed.
    pub seed: u64,
    /// `churn` parameters (`sizes` here is used by churn).
    pub churn: ChurnSpec,
    /// `aging` marks, cycles and large sizes.
    pub aging: AgingSpec,
    /// End after this many requests.
    pub max_ops: Option<u64>,
}

impl GenSpec {
    /// Bench defaults for `workload` on `geometry`.
    pub fn new(workload: GenWorkload, geometry: Geometry) -> Self {
        let w = WorkloadSpec::default();
        GenSpec {
            workload,
            geometry,
            sizes: w.sizes,
            free_prob: w.free_prob,
            round_size: w.round_size,
            seed: w.seed,
            churn: ChurnSpec::default(),
            aging: w.aging,
            max_ops: None,
        }
    }

    /// The bench workload behind a `Bench` or `LogNormal` trace (`seed` for
    /// `churn`, which has none).
    fn workload_spec(&self) -> WorkloadSpec {
        let (kind, sizes) = match self.workload {
            GenWorkload::Bench(kind) => (kind, self.sizes),
            GenWorkload::LogNormal(s) => (WorkloadKind::Seed, s),
            GenWorkload::Churn => (WorkloadKind::Seed, self.sizes),
        };
        WorkloadSpec {
            kind,
            sizes,
            free_prob: self.free_prob,
            round_size: self.round_size,
            seed: self.seed,
            aging: self.aging,
        }
    }

    /// The header a generated trace carries.
    pub fn header(&self) -> TraceHeader {
        let mut h = TraceHeader {
            block_size: Some(self.geometry.block_size()),
            capacity_bytes: Some(self.geometry.capacity_bytes()),
            meta: Vec::new(),
        };
        h.set(keys::SOURCE, "blockalloc trace gen");
        match self.workload {
            GenWorkload::Bench(_) | GenWorkload::LogNormal(_) => {
                describe_workload(&mut h, &self.workload_spec());
                if let GenWorkload::LogNormal(_) = self.workload {
                    h.set(keys::WORKLOAD, "lognormal");
                }
            }
            GenWorkload::Churn => {
                h.set(keys::WORKLOAD, "churn");
                h.set(keys::SIZES, self.churn.sizes.to_string());
                h.set("fill", self.churn.fill.to_string());
                h.set("volume", self.churn.volume.to_string());
            }
        }
        h.set(keys::ROUND_SIZE, self.round_size.to_string());
        h.set(keys::SEED, self.seed.to_string());
        h
    }
}

/// Why generation stopped, and what was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenOutcome {
    /// Operations written (round markers included).
    pub ops: u64,
    /// Why the trace ends.
    pub end: GenEnd,
}

/// Why a generated trace ends where it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenEnd {
    /// The last allocation would exceed the capacity even if perfectly
    /// packed.
    Full,
    /// `churn`: its volume was allocated.
    Volume,
    /// `max_ops` requests were written.
    MaxOps,
}

impl GenEnd {
    /// A short description for the header and messages.
    pub fn describe(self) -> &'static str {
        match self {
            GenEnd::Full => "the last allocation exceeds the capacity even if perfectly packed",
            GenEnd::Volume => "the churn volume was allocated",
            GenEnd::MaxOps => "max ops reached",
        }
    }
}

/// Writes the trace of `spec` into `sink`; the caller finishes the sink.
///
/// ```
/// use blockalloc::Geometry;
/// use blockalloc_bench::gen::{generate, GenEnd, GenSpec, GenWorkload};
/// use blockalloc_bench::WorkloadKind;
/// use blockalloc_trace::{TraceFormat, TraceSink};
///
/// let geo = Geometry::parse("64MiB", "4KiB")?;
/// let mut spec = GenSpec::new(GenWorkload::Bench(WorkloadKind::Seed), geo);
/// spec.round_size = 100;
/// let mut sink = TraceSink::to_writer(Box::new(Vec::new()), TraceFormat::Binary, &spec.header())?;
/// let out = generate(&spec, &mut sink)?;
/// assert_eq!(out.end, GenEnd::Full);
/// sink.finish()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`TraceError`] from the sink.
///
/// # Panics
/// When the spec is invalid (`round_size == 0`, a probability or fill
/// outside its range); callers validate user input first.
pub fn generate(spec: &GenSpec, sink: &mut TraceSink) -> Result<GenOutcome, TraceError> {
    assert!(spec.round_size > 0, "round size must be at least 1");
    let mut g = Gen {
        sink,
        capacity: spec.geometry.capacity_blocks(),
        block_size: spec.geometry.block_size(),
        live_blocks: 0,
        requests_left: spec.max_ops.unwrap_or(u64::MAX),
        ops: 0,
    };
    let end = match spec.workload {
        GenWorkload::Churn => g.churn(spec)?,
        _ => {
            let ws = spec.workload_spec();
            g.rounds(Workload::new(ws, spec.geometry))?
        }
    };
    Ok(GenOutcome { ops: g.ops, end })
}

struct Gen<'a> {
    sink: &'a mut TraceSink,
    capacity: u64,
    block_size: u64,
    live_blocks: u64,
    requests_left: u64,
    ops: u64,
}

impl Gen<'_> {
    fn put(&mut self, op: TraceOp) -> Result<(), TraceError> {
        if op.is_request() {
            self.requests_left -= 1;
        }
        self.ops += 1;
        self.sink.write(op)
    }

    /// Writes an allocation of `blocks`; `Some(end)` when the trace ends.
    fn alloc(&mut self, object: u64, blocks: u64) -> Result<Option<GenEnd>, TraceError> {
        self.put(TraceOp::Alloc {
            object,
            bytes: blocks * self.block_size,
        })?;
        if self.live_blocks + blocks > self.capacity {
            return Ok(Some(GenEnd::Full));
        }
        self.live_blocks += blocks;
        Ok((self.requests_left == 0).then_some(GenEnd::MaxOps))
    }

    fn free(&mut self, object: u64, blocks: u64) -> Result<Option<GenEnd>, TraceError> {
        self.put(TraceOp::Free { object })?;
        self.live_blocks -= blocks;
        Ok((self.requests_left == 0).then_some(GenEnd::MaxOps))
    }

    /// The bench workloads. Most free only objects of the same round, so
    /// the map of sizes is cleared at each round's end; the others keep it.
    fn rounds(&mut self, w: Workload) -> Result<GenEnd, TraceError> {
        if self.requests_left == 0 {
            return Ok(GenEnd::MaxOps);
        }
        let within_round = w.frees_within_round();
        let mut round: IdMap<u64> = IdMap::default();
        for op in w.ops() {
            let end = match op {
                Op::Alloc { object, blocks } => {
                    round.insert(object, blocks);
                    self.alloc(object, blocks)?
                }
                Op::Free { object } => {
                    let blocks = round
                        .remove(&object)
                        .expect("workloads free only live objects");
                    self.free(object, blocks)?
                }
                Op::RoundEnd { phase, .. } => {
                    if within_round {
                        round.clear();
                    }
                    self.put(TraceOp::RoundEnd { phase })?;
                    None
                }
            };
            if let Some(end) = end {
                return Ok(end);
            }
        }
        unreachable!("workloads never end")
    }

    fn churn(&mut self, spec: &GenSpec) -> Result<GenEnd, TraceError> {
        let c = spec.churn;
        assert!(c.fill > 0.0 && c.fill <= 1.0, "fill must be in (0, 1]");
        assert!(c.volume >= 0.0, "volume must be at least 0");
        if self.requests_left == 0 {
            return Ok(GenEnd::MaxOps);
        }
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(spec.seed);
        let sampler = SizeSampler::new(c.sizes, self.block_size);
        let target = ((self.capacity as f64 * c.fill) as u64).max(1);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut next = 0u64;
        // Phase 1: fill, in rounds of `round_size` allocations.
        let mut in_round = 0;
        while self.live_blocks < target {
            let blocks = sampler.sample_blocks(&mut rng);
            live.push((next, blocks));
            if let Some(end) = self.alloc(next, blocks)? {
                return Ok(end);
            }
            next += 1;
            in_round += 1;
            if in_round == spec.round_size {
                self.put(TraceOp::RoundEnd { phase: 1 })?;
                in_round = 0;
            }
        }
        if in_round > 0 {
            self.put(TraceOp::RoundEnd { phase: 1 })?;
        }
        // Phase 2: rounds of `round_size` random deletions, each followed by
        // inserts back up to the fill level.
        let volume = (self.capacity as f64 * c.volume) as u64;
        let mut churned = 0u64;
        loop {
            for _ in 0..spec.round_size {
                if churned >= volume {
                    self.put(TraceOp::RoundEnd { phase: 2 })?;
                    return Ok(GenEnd::Volume);
                }
                if !live.is_empty() {
                    let i = rng.random_range(0..live.len());
                    let (object, blocks) = live.swap_remove(i);
                    if let Some(end) = self.free(object, blocks)? {
                        return Ok(end);
                    }
                }
                while self.live_blocks < target {
                    let blocks = sampler.sample_blocks(&mut rng);
                    live.push((next, blocks));
                    churned += blocks;
                    if let Some(end) = self.alloc(next, blocks)? {
                        return Ok(end);
                    }
                    next += 1;
                }
            }
            self.put(TraceOp::RoundEnd { phase: 2 })?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockalloc_trace::{TraceFormat, TraceSource, TraceSummary};

    fn gen(spec: &GenSpec) -> (GenOutcome, Vec<u8>) {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut sink = TraceSink::to_writer(
            Box::new(Shared(buf.clone())),
            TraceFormat::Binary,
            &spec.header(),
        )
        .unwrap();
        let out = generate(spec, &mut sink).unwrap();
        sink.finish().unwrap();
        let bytes = buf.lock().unwrap().clone();
        (out, bytes)
    }

    fn summary(bytes: Vec<u8>) -> TraceSummary {
        let mut src = TraceSource::from_reader(std::io::Cursor::new(bytes)).unwrap();
        TraceSummary::scan(&mut src, 4096).unwrap()
    }

    fn geo() -> Geometry {
        Geometry::parse("64MiB", "4KiB").unwrap()
    }

    fn big() -> Geometry {
        Geometry::parse("1GiB", "4KiB").unwrap()
    }

    #[test]
    fn parses_names() {
        assert_eq!(
            "SEED".parse::<GenWorkload>().unwrap(),
            GenWorkload::Bench(WorkloadKind::Seed)
        );
        assert_eq!(
            "lognormal".parse::<GenWorkload>().unwrap(),
            GenWorkload::LogNormal(LOGNORMAL_DEFAULT)
        );
        let w: GenWorkload = "lognormal:256KiB:1".parse().unwrap();
        assert_eq!(w.to_string(), "lognormal:256KiB:1");
        assert!("lognormal:1".parse::<GenWorkload>().is_err());
        assert!("zipf".parse::<GenWorkload>().is_err());
    }

    #[test]
    fn aging_trace_frees_across_rounds_and_is_the_bench_stream() {
        let mut spec = GenSpec::new(GenWorkload::Bench(WorkloadKind::Aging), geo());
        spec.round_size = 10;
        assert_eq!(
            "aging".parse::<GenWorkload>().unwrap(),
            GenWorkload::Bench(WorkloadKind::Aging)
        );
        let (out, bytes) = gen(&spec);
        assert_eq!(out.end, GenEnd::Full);
        // The scan refuses a free of an object that is not live: the
        // deletes of phase 2 name objects of earlier rounds.
        let s = summary(bytes.clone());
        assert_eq!(s.max_phase, 2, "rounds of both phases of a cycle ended");
        assert!(s.frees > 0);
        let ops: Vec<TraceOp> = TraceSource::from_reader(std::io::Cursor::new(bytes))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let ws = WorkloadSpec {
            kind: WorkloadKind::Aging,
            round_size: 10,
            ..WorkloadSpec::default()
        };
        let bench: Vec<TraceOp> = Workload::new(ws, geo())
            .ops()
            .map(|op| match op {
                Op::Alloc { object, blocks } => TraceOp::Alloc {
                    object,
                    bytes: blocks * 4096,
                },
                Op::Free { object } => TraceOp::Free { object },
                Op::RoundEnd { phase, .. } => TraceOp::RoundEnd { phase },
            })
            .take(ops.len())
            .collect();
        assert_eq!(ops, bench);
        // It ends inside phase 3, at a large object.
        assert!(matches!(ops.last(), Some(TraceOp::Alloc { bytes, .. }) if *bytes >= 3 << 20));
    }

    #[test]
    fn bench_workloads_end_at_the_impossible_allocation() {
        for w in [
            GenWorkload::Bench(WorkloadKind::Seed),
            GenWorkload::Bench(WorkloadKind::Shift),
            GenWorkload::LogNormal(LOGNORMAL_DEFAULT),
        ] {
            let mut spec = GenSpec::new(w, big());
            spec.round_size = 100;
            let (out, bytes) = gen(&spec);
            assert_eq!(out.end, GenEnd::Full, "{w}");
            let s = summary(bytes);
            assert_eq!(s.ops, out.ops);
            let cap = big().capacity_blocks();
            assert!(
                s.peak_live_blocks > cap,
                "{w}: the last allocation overflows"
            );
            assert!(s.rounds >= 1);
            if w == GenWorkload::Bench(WorkloadKind::Shift) {
                assert_eq!(s.max_phase, 2);
            }
        }
    }

    #[test]
    fn same_stream_as_bench() {
        let mut spec = GenSpec::new(GenWorkload::Bench(WorkloadKind::Seed), big());
        spec.round_size = 50;
        spec.max_ops = Some(500);
        let (out, bytes) = gen(&spec);
        assert_eq!(out.end, GenEnd::MaxOps);
        let ops: Vec<TraceOp> = TraceSource::from_reader(std::io::Cursor::new(bytes))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let ws = WorkloadSpec {
            round_size: 50,
            ..WorkloadSpec::default()
        };
        let bench: Vec<TraceOp> = Workload::new(ws, big())
            .ops()
            .map(|op| match op {
                Op::Alloc { object, blocks } => TraceOp::Alloc {
                    object,
                    bytes: blocks * 4096,
                },
                Op::Free { object } => TraceOp::Free { object },
                Op::RoundEnd { phase, .. } => TraceOp::RoundEnd { phase },
            })
            .take(ops.len())
            .collect();
        assert_eq!(ops, bench);
        assert_eq!(ops.iter().filter(|o| o.is_request()).count(), 500);
    }

    /// Every bench workload of the registry is a `trace gen` workload, under
    /// its own name, and generates a trace that ends at the first allocation
    /// nobody could serve.
    #[test]
    fn every_bench_workload_generates() {
        for w in crate::workload::WORKLOADS {
            let g: GenWorkload = w.name.parse().unwrap();
            assert_eq!(g, GenWorkload::Bench(w.kind));
            assert!(GenWorkload::ALL.contains(&g), "{}", w.name);
            assert_eq!(g.name(), w.name);
            let mut spec = GenSpec::new(g, geo());
            spec.round_size = 100;
            let (out, bytes) = gen(&spec);
            assert_eq!(out.end, GenEnd::Full, "{}", w.name);
            let s = summary(bytes);
            assert!(s.allocs > 0, "{}", w.name);
            assert!(s.max_phase <= 1 || w.phased, "{}", w.name);
        }
        let e = "nope".parse::<GenWorkload>().unwrap_err().to_string();
        assert!(
            e.contains("seed, shift, fill-shift, aging, lognormal"),
            "{e}"
        );
    }

    #[test]
    fn churn_fills_then_churns() {
        let mut spec = GenSpec::new(GenWorkload::Churn, geo());
        spec.round_size = 100;
        spec.churn.volume = 0.5;
        let (out, bytes) = gen(&spec);
        assert_eq!(out.end, GenEnd::Volume);
        let s = summary(bytes);
        let cap = geo().capacity_blocks();
        assert!(s.peak_live_blocks >= cap * 95 / 100 && s.peak_live_blocks <= cap);
        assert!(s.frees > 100, "{s:?}");
        assert_eq!(s.max_phase, 2);
        assert!(s.max_object_bytes.unwrap() <= 4 << 20);
    }
}
