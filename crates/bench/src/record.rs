//! [`Recorder`]: `bench --record`, the exact operation stream of a bench run
//! written as a trace.
//!
//! The recorder is a bench [`Observer`] placed in front of the usual one
//! (progress bar). Workloads are deterministic, so it regenerates each
//! engine's stream in step with the runner and, at each round's end, writes
//! what the engine actually executed: the round's allocations up to where it
//! stopped, the frees it completed, and the round marker when the round was
//! whole. When a run ends for lack of space, the failed allocation is
//! written too, so a replay fails at the same request.
//!
//! Every engine of a bench sees a prefix of the same stream, so the trace is
//! **the longest run's stream**: each engine's operations are appended only
//! past what earlier engines already wrote. Replaying the trace with any
//! engine of the bench reproduces that engine's run up to where it stopped.

use blockalloc::Geometry;
use blockalloc_trace::{keys, Totals, TraceError, TraceHeader, TraceOp, TraceSink};

use crate::config::StopReason;
use crate::gen::describe_workload;
use crate::observer::{Observer, Position, RoundProgress};
use crate::report::RunError;
use crate::report::RunReport;
use crate::workload::{Round, Workload, WorkloadSpec};

/// The header of a trace recorded from a bench of `spec` on `geometry`.
pub fn bench_header(spec: &WorkloadSpec, geometry: Geometry) -> TraceHeader {
    let mut h = TraceHeader {
        block_size: Some(geometry.block_size()),
        capacity_bytes: Some(geometry.capacity_bytes()),
        meta: Vec::new(),
    };
    h.set(keys::SOURCE, "blockalloc bench --record");
    describe_workload(&mut h, spec);
    h.set(keys::ROUND_SIZE, spec.round_size.to_string());
    h.set(keys::SEED, spec.seed.to_string());
    h.set(keys::END, "where the longest engine run stopped");
    h
}

/// Records a bench's operation stream while forwarding every event to
/// `inner`.
pub struct Recorder<'a> {
    inner: &'a mut dyn Observer,
    sink: Option<TraceSink>,
    spec: WorkloadSpec,
    geometry: Geometry,
    workload: Option<Workload>,
    round: Round,
    /// Allocations the current engine completed in its last round.
    last_allocs: usize,
    /// Operations of the stream the current engine has executed.
    position: u64,
    /// Operations in the trace.
    written: u64,
    error: Option<TraceError>,
}

impl std::fmt::Debug for Recorder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("written", &self.written)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<'a> Recorder<'a> {
    /// Records into `sink` (whose header should come from
    /// [`bench_header`]) the bench of `spec` on `geometry`; with no sink it
    /// only forwards.
    pub fn new(
        sink: Option<TraceSink>,
        spec: WorkloadSpec,
        geometry: Geometry,
        inner: &'a mut dyn Observer,
    ) -> Self {
        Recorder {
            inner,
            sink,
            spec,
            geometry,
            workload: None,
            round: Round::default(),
            last_allocs: 0,
            position: 0,
            written: 0,
            error: None,
        }
    }

    fn emit(&mut self, op: TraceOp) {
        if self.position >= self.written {
            if let (Some(sink), None) = (self.sink.as_mut(), self.error.as_ref()) {
                match sink.write(op) {
                    Ok(()) => self.written += 1,
                    Err(e) => self.error = Some(e),
                }
            }
        }
        self.position += 1;
    }

    /// Ends the trace.
    ///
    /// # Errors
    /// The first write error met while recording, or one finishing the file.
    pub fn finish(mut self) -> Result<Totals, TraceError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match self.sink.take() {
            Some(sink) => sink.finish(),
            None => Ok(Totals::default()),
        }
    }
}

impl Observer for Recorder<'_> {
    fn engine_started(&mut self, engine: &str, total_requests: Option<u64>) {
        self.workload = self
            .sink
            .is_some()
            .then(|| Workload::new(self.spec, self.geometry));
        self.round = Round::default();
        self.position = 0;
        self.last_allocs = 0;
        self.inner.engine_started(engine, total_requests);
    }

    fn tick(&mut self, engine: &str, at: Position, utilization: f64) {
        self.inner.tick(engine, at, utilization);
    }

    fn round_finished(&mut self, p: &RoundProgress<'_>) {
        if let Some(w) = self.workload.as_mut() {
            let mut round = std::mem::take(&mut self.round);
            while round.number < p.record.round {
                if !w.next_round(&mut round) {
                    break;
                }
            }
            let (a, f) = (p.allocs as usize, p.frees as usize);
            let a = a.min(round.allocs.len());
            let f = f.min(round.frees.len());
            for r in &round.allocs[..a] {
                self.emit(TraceOp::Alloc {
                    object: r.object,
                    bytes: r.blocks * self.geometry.block_size(),
                });
            }
            for &object in &round.frees[..f] {
                self.emit(TraceOp::Free { object });
            }
            if a == round.allocs.len() && f == round.frees.len() {
                self.emit(TraceOp::RoundEnd { phase: round.phase });
            }
            self.last_allocs = a;
            self.round = round;
        }
        self.inner.round_finished(p);
    }

    fn engine_finished(&mut self, engine: &str, outcome: Result<&RunReport, &RunError>) {
        if let Ok(r) = outcome {
            if r.stopped == StopReason::NoSpace {
                if let Some(req) = self.round.allocs.get(self.last_allocs).copied() {
                    self.emit(TraceOp::Alloc {
                        object: req.object,
                        bytes: req.blocks * self.geometry.block_size(),
                    });
                }
            }
        }
        self.workload = None;
        self.inner.engine_finished(engine, outcome);
    }
}
