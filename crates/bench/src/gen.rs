//! Every workload of the registry ([`WORKLOADS`]) written as a trace,
//! operation for operation as `bench` runs it, without running an engine.
//!
//! # Where a generated trace ends
//!
//! Without an engine, nothing fails, so a rule decides:
//!
//! * a trace ends **at the first allocation no allocator could serve**: the
//!   one that would make the live blocks (each object rounded up to blocks)
//!   exceed the capacity. That allocation is the trace's last operation, so
//!   every engine replaying the trace on the same capacity fails at or
//!   before it, as it would in `bench`.
//! * a workload that ends by itself ([`WorkloadInfo::ends`](crate::WorkloadInfo::ends):
//!   `churn`, after [`ChurnSpec::volume`](crate::ChurnSpec::volume)
//!   capacities) ends the trace there, if nothing impossible came first.
//! * `max_ops`, when given, ends any trace after that many requests.

use blockalloc::Geometry;
use blockalloc_trace::{keys, IdMap, TraceError, TraceHeader, TraceOp, TraceSink};

#[cfg(doc)]
use crate::workload::WORKLOADS;
use crate::workload::{Op, Workload, WorkloadKind, WorkloadSpec};

/// Sets a trace header's description of the workload `spec`: its name,
/// sizes, free probability and shape. `bench --record` and `trace gen`
/// describe a workload alike.
pub(crate) fn describe_workload(h: &mut TraceHeader, spec: &WorkloadSpec) {
    h.set(keys::WORKLOAD, spec.kind.name());
    match spec.kind {
        WorkloadKind::Seed | WorkloadKind::LogNormal => {
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
        WorkloadKind::Churn => {
            h.set(keys::SIZES, spec.sizes.to_string());
            h.set("fill", spec.churn.fill.to_string());
            h.set("volume", spec.churn.volume.to_string());
        }
    }
}

/// Everything that determines a generated trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GenSpec {
    /// The workload's stream.
    pub workload: WorkloadSpec,
    /// The device the trace is made for.
    pub geometry: Geometry,
    /// End after this many requests.
    pub max_ops: Option<u64>,
}

impl GenSpec {
    /// Bench defaults for `kind` on `geometry`.
    pub fn new(kind: WorkloadKind, geometry: Geometry) -> Self {
        GenSpec {
            workload: WorkloadSpec::new(kind),
            geometry,
            max_ops: None,
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
        describe_workload(&mut h, &self.workload);
        h.set(keys::ROUND_SIZE, self.workload.round_size.to_string());
        h.set(keys::SEED, self.workload.seed.to_string());
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
    /// The workload's stream ended (`churn`: its volume was allocated).
    EndOfWorkload,
    /// `max_ops` requests were written.
    MaxOps,
}

impl GenEnd {
    /// A short description for the header and messages.
    pub fn describe(self) -> &'static str {
        match self {
            GenEnd::Full => "the last allocation exceeds the capacity even if perfectly packed",
            GenEnd::EndOfWorkload => "the workload ended (churn: its volume was allocated)",
            GenEnd::MaxOps => "max ops reached",
        }
    }
}

/// Writes the trace of `spec` into `sink`; the caller finishes the sink.
///
/// ```
/// use blockalloc::Geometry;
/// use blockalloc_bench::{generate, GenEnd, GenSpec, WorkloadKind};
/// use blockalloc_trace::{TraceFormat, TraceSink};
///
/// let geo = Geometry::parse("64MiB", "4KiB")?;
/// let mut spec = GenSpec::new(WorkloadKind::Seed, geo);
/// spec.workload.round_size = 100;
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
/// When the workload spec is invalid (see [`Workload::new`]); callers
/// validate user input first.
pub fn generate(spec: &GenSpec, sink: &mut TraceSink) -> Result<GenOutcome, TraceError> {
    let mut g = Gen {
        sink,
        capacity: spec.geometry.capacity_blocks(),
        block_size: spec.geometry.block_size(),
        live_blocks: 0,
        requests_left: spec.max_ops.unwrap_or(u64::MAX),
        ops: 0,
    };
    let end = g.rounds(Workload::new(spec.workload, spec.geometry))?;
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

    /// The workload's operations. Most free only objects of the same round,
    /// so the map of sizes is cleared at each round's end; the others keep
    /// it.
    fn rounds(&mut self, w: Workload) -> Result<GenEnd, TraceError> {
        if self.requests_left == 0 {
            return Ok(GenEnd::MaxOps);
        }
        let within_round = w.frees_within_round();
        let mut held: IdMap<u64> = IdMap::default();
        for op in w.ops() {
            let end = match op {
                Op::Alloc { object, blocks } => {
                    held.insert(object, blocks);
                    self.alloc(object, blocks)?
                }
                Op::Free { object } => {
                    let blocks = held
                        .remove(&object)
                        .expect("workloads free only live objects");
                    self.free(object, blocks)?
                }
                Op::RoundEnd { phase, .. } => {
                    if within_round {
                        held.clear();
                    }
                    self.put(TraceOp::RoundEnd { phase })?;
                    None
                }
            };
            if let Some(end) = end {
                return Ok(end);
            }
        }
        Ok(GenEnd::EndOfWorkload)
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

    /// The bench stream of `ws` on `geometry` as trace operations, the
    /// first `n`.
    fn bench_ops(ws: WorkloadSpec, geometry: Geometry, n: usize) -> Vec<TraceOp> {
        Workload::new(ws, geometry)
            .ops()
            .map(|op| match op {
                Op::Alloc { object, blocks } => TraceOp::Alloc {
                    object,
                    bytes: blocks * geometry.block_size(),
                },
                Op::Free { object } => TraceOp::Free { object },
                Op::RoundEnd { phase, .. } => TraceOp::RoundEnd { phase },
            })
            .take(n)
            .collect()
    }

    fn read_ops(bytes: Vec<u8>) -> Vec<TraceOp> {
        TraceSource::from_reader(std::io::Cursor::new(bytes))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn parses_names() {
        use crate::workload::{WorkloadName, LOGNORMAL_SIZES};
        assert_eq!(
            "SEED".parse::<WorkloadName>().unwrap(),
            WorkloadKind::Seed.into()
        );
        let ln: WorkloadName = "lognormal".parse().unwrap();
        assert_eq!(ln.kind, WorkloadKind::LogNormal);
        assert_eq!(GenSpec::new(ln.kind, geo()).workload.sizes, LOGNORMAL_SIZES);
        let w: WorkloadName = "lognormal:256KiB:1".parse().unwrap();
        assert_eq!(w.to_string(), "lognormal:256KiB:1");
        assert!("lognormal:1".parse::<WorkloadName>().is_err());
        assert!("zipf".parse::<WorkloadName>().is_err());
    }

    #[test]
    fn aging_trace_frees_across_rounds_and_is_the_bench_stream() {
        let mut spec = GenSpec::new(WorkloadKind::Aging, geo());
        spec.workload.round_size = 10;
        let (out, bytes) = gen(&spec);
        assert_eq!(out.end, GenEnd::Full);
        // The scan refuses a free of an object that is not live: the
        // deletes of phase 2 name objects of earlier rounds.
        let s = summary(bytes.clone());
        assert_eq!(s.max_phase, 2, "rounds of both phases of a cycle ended");
        assert!(s.frees > 0);
        let ops = read_ops(bytes);
        let ws = WorkloadSpec {
            kind: WorkloadKind::Aging,
            round_size: 10,
            ..WorkloadSpec::default()
        };
        assert_eq!(ops, bench_ops(ws, geo(), ops.len()));
        // It ends inside phase 3, at a large object.
        assert!(matches!(ops.last(), Some(TraceOp::Alloc { bytes, .. }) if *bytes >= 3 << 20));
    }

    #[test]
    fn bench_workloads_end_at_the_impossible_allocation() {
        for w in [
            WorkloadKind::Seed,
            WorkloadKind::Shift,
            WorkloadKind::LogNormal,
        ] {
            let mut spec = GenSpec::new(w, big());
            spec.workload.round_size = 100;
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
            if w == WorkloadKind::Shift {
                assert_eq!(s.max_phase, 2);
            }
        }
    }

    #[test]
    fn same_stream_as_bench() {
        let mut spec = GenSpec::new(WorkloadKind::Seed, big());
        spec.workload.round_size = 50;
        spec.max_ops = Some(500);
        let (out, bytes) = gen(&spec);
        assert_eq!(out.end, GenEnd::MaxOps);
        let ops = read_ops(bytes);
        let ws = WorkloadSpec {
            round_size: 50,
            ..WorkloadSpec::default()
        };
        assert_eq!(ops, bench_ops(ws, big(), ops.len()));
        assert_eq!(ops.iter().filter(|o| o.is_request()).count(), 500);
    }

    /// Every workload of the registry is a `trace gen` workload, under its
    /// own name, and generates a trace that ends at the first allocation
    /// nobody could serve, or where the workload ends.
    #[test]
    fn every_bench_workload_generates() {
        for w in crate::workload::WORKLOADS {
            let g: crate::workload::WorkloadName = w.name.parse().unwrap();
            assert_eq!(g.kind, w.kind);
            let mut spec = GenSpec::new(g.kind, geo());
            spec.workload.round_size = 100;
            spec.workload.churn.volume = 0.5;
            let (out, bytes) = gen(&spec);
            let end = if w.ends {
                GenEnd::EndOfWorkload
            } else {
                GenEnd::Full
            };
            assert_eq!(out.end, end, "{}", w.name);
            let s = summary(bytes);
            assert!(s.allocs > 0, "{}", w.name);
            assert!(s.max_phase <= 1 || w.phased, "{}", w.name);
        }
        let e = "nope"
            .parse::<crate::workload::WorkloadName>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("seed, shift, fill-shift, aging, lognormal"),
            "{e}"
        );
    }

    #[test]
    fn churn_fills_then_churns() {
        let mut spec = GenSpec::new(WorkloadKind::Churn, geo());
        spec.workload.round_size = 100;
        spec.workload.churn.volume = 0.5;
        let (out, bytes) = gen(&spec);
        assert_eq!(out.end, GenEnd::EndOfWorkload);
        let ops = read_ops(bytes.clone());
        assert_eq!(ops, bench_ops(spec.workload, geo(), usize::MAX));
        let s = summary(bytes);
        let cap = geo().capacity_blocks();
        assert!(s.peak_live_blocks >= cap * 95 / 100 && s.peak_live_blocks <= cap);
        assert!(s.frees > 100, "{s:?}");
        assert_eq!(s.max_phase, 2);
        assert!(s.max_object_bytes.unwrap() <= 4 << 20);
    }
}
