//! The replayer: drives one engine through a trace and measures it the way
//! `bench` does, so that the two reports compare field by field.
//!
//! The stream is read in batches of up to 4096 operations (a round
//! marker also ends a batch). Each batch is cut into runs of consecutive
//! allocations and consecutive frees, and each run is handled like a bench
//! round's loop:
//!
//! * **allocation run** — the loop of `allocate` calls is timed as a whole,
//!   one call in [`SAMPLE_STRIDE`] timed on its own (see
//!   [`crate::latency`]); afterwards, untimed, each object's
//!   extents are filed in the object map and, with a [`PatternDevice`],
//!   written with the object's pattern;
//! * **free run** — untimed, the objects' extents are taken out of the map
//!   and, with a device, read back and checked byte by byte *before* the
//!   space is released; then the loop of `free` calls is timed.
//!
//! Interleaved traces make short runs; each run's one extra `Instant` pair is
//! subtracted like the samples' (calibrated cost).
//!
//! **Rounds.** A round ends at each round marker of the trace, or, when
//! [`ReplayConfig::round_ops`] is set, every that many requests (markers
//! ignored). Each round yields a [`RoundRecord`] (seconds spent in the
//! engine, utilisation at its end), as in `bench`.
//!
//! **Stopping.** The first failed allocation stops the run (`no_space`,
//! utilisation at that moment), as in `bench` — unless
//! [`ReplayConfig::keep_going`]: then failures are counted, the run goes on,
//! and later frees of the objects that got no space are skipped. Otherwise a
//! run ends at the end of the trace (`end_of_trace`) or a limit.
//!
//! **Errors.** A trace that frees an object that is not live, or allocates a
//! live id, is a [`TraceError::InvalidOp`] with the operation's number. An
//! engine that refuses a free of what it handed out, fails an allocation for
//! another reason than space, breaks its invariants or (with a device) hands
//! out space that corrupts another object's data is a [`ReplayError`] naming
//! the operation and object.
//!
//! ## Example: generate, replay with verification, compare
//!
//! ```
//! use blockalloc::Geometry;
//! use blockalloc_bench::{
//!     generate, replay_engine, BenchEngine, GenSpec, NoObserver, PatternDevice, ReplayConfig,
//!     StopReason, TimerCalibration, TraceInfo, WorkloadKind,
//! };
//! use blockalloc_trace::{TraceFormat, TraceSink, TraceSource, TraceSummary};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("churn.trace");
//! let geo = Geometry::parse("64MiB", "4KiB")?;
//!
//! // A fill-then-churn trace of small objects.
//! let mut spec = GenSpec::new(WorkloadKind::Churn, geo);
//! spec.workload.round_size = 100;
//! spec.workload.churn.volume = 0.5;
//! let mut sink = TraceSink::create(&path, Some(TraceFormat::Binary), &spec.header())?;
//! generate(&spec, &mut sink)?;
//! sink.finish()?;
//!
//! // Check it once, then replay it through an engine with every byte verified.
//! let mut src = TraceSource::open(&path)?;
//! let info = TraceInfo {
//!     name: path.display().to_string(),
//!     header: src.header().clone(),
//!     summary: Some(TraceSummary::scan(&mut src, geo.block_size())?),
//! };
//! let mut device = PatternDevice::new(tempfile::tempfile()?, "scratch".into(), geo)?;
//! let report = replay_engine(
//!     BenchEngine::default(),
//!     TraceSource::open(&path)?,
//!     &info,
//!     &ReplayConfig::new(geo),
//!     Some(&mut device),
//!     TimerCalibration::ZERO,
//!     &mut NoObserver,
//! )?;
//! // Either the whole trace ran, or the engine ran out of space on the way.
//! assert!(matches!(report.run.stopped, StopReason::EndOfTrace | StopReason::NoSpace));
//! assert!(report.data_check.unwrap().objects_checked > 0);
//! assert!(report.to_json_line().contains("\"utilization_at_first_failure\":"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::{Duration, Instant};

use blockalloc::{
    AllocError, Allocator, BuildError, ErrorClass, Extent, FreeError, Geometry, VerifyError,
};
use blockalloc_trace::{
    keys, IdMap, InvalidOpKind, TraceError, TraceHeader, TraceOp, TraceSummary,
};
use serde::Serialize;

use crate::config::{Limits, Mode, RoundRecord, StopReason};
use crate::engines::BenchEngine;
use crate::latency::{RawSample, TimerCalibration, SAMPLE_STRIDE};
use crate::loops::{
    budget, extents_of, limit_before, timed_allocs, timed_frees, Clock, Fill, Held,
};
use crate::observer::{Observer, Position, RoundProgress};
use crate::report::{Measured, RunLabels, RunReport, Throughput};
use crate::rss;
use crate::verify::{CheckError, DataCheckStats, PatternDevice};

/// Operations decoded ahead of execution.
pub(crate) const BATCH: usize = 4096;

/// How to replay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayConfig {
    /// The device: requests are rounded up to its blocks.
    pub geometry: Geometry,
    /// Contiguous (`allocate`) or scattered (`allocate_scattered`).
    pub mode: Mode,
    /// Stop early after this many rounds, requests (allocations and frees)
    /// or seconds.
    pub limits: Limits,
    /// Go on after failed allocations instead of stopping.
    pub keep_going: bool,
    /// End a round every this many requests instead of at the trace's round
    /// markers.
    pub round_ops: Option<u64>,
    /// Call the engine's `verify()` at the end of the run.
    pub check_invariants: bool,
}

impl ReplayConfig {
    /// Contiguous, no limits, markers as rounds.
    pub fn new(geometry: Geometry) -> Self {
        ReplayConfig {
            geometry,
            mode: Mode::Contiguous,
            limits: Limits::default(),
            keep_going: false,
            round_ops: None,
            check_invariants: false,
        }
    }
}

/// What the report says about the trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceInfo {
    /// How the trace is named in reports (usually its path).
    pub name: String,
    /// Its header.
    pub header: TraceHeader,
    /// Its summary (from [`TraceSummary::scan`]), for the progress bar's
    /// length and the report; `None` when not scanned.
    pub summary: Option<TraceSummary>,
}

/// A replay that could not complete.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The engine cannot serve this device: skip it.
    #[error("{engine} skipped: {source}")]
    Build {
        /// Engine name.
        engine: &'static str,
        /// Why.
        source: BuildError,
    },
    /// The trace could not be read, or is invalid.
    #[error("{0}")]
    Trace(#[from] TraceError),
    /// An allocation failed other than for lack of space.
    #[error(
        "{engine}: operation {op}: allocating {blocks} blocks for object {object} failed: {source}"
    )]
    Alloc {
        /// Engine name.
        engine: &'static str,
        /// 1-based operation number in the trace.
        op: u64,
        /// The object.
        object: u64,
        /// Blocks requested.
        blocks: u64,
        /// The engine's error.
        source: AllocError,
    },
    /// The engine refused to free what it had handed out.
    #[error("{engine}: operation {op}: freeing object {object} failed: {source}")]
    Free {
        /// Engine name.
        engine: &'static str,
        /// 1-based operation number in the trace.
        op: u64,
        /// The object.
        object: u64,
        /// The engine's error.
        source: FreeError,
    },
    /// The engine's own invariants are broken.
    #[error("{engine} failed verification after operation {op}: {source}")]
    Invariants {
        /// Engine name.
        engine: &'static str,
        /// Operations done.
        op: u64,
        /// What broke.
        source: VerifyError,
    },
    /// Data verification failed, or the device failed.
    #[error("{engine}: {}: {source}", match op { Some(op) => format!("operation {op}"), None => "final check of the live objects".to_string() })]
    Data {
        /// Engine name.
        engine: &'static str,
        /// The free (or allocation) being verified; `None` for the final
        /// check of the live objects.
        op: Option<u64>,
        /// What was found.
        source: CheckError,
    },
}

impl ReplayError {
    /// True when the engine was skipped rather than found faulty.
    pub fn is_skip(&self) -> bool {
        matches!(self, ReplayError::Build { .. })
    }

    /// True when the engine is at fault (as opposed to the trace, the device
    /// or the environment): the class is [`ErrorClass::Bug`].
    pub fn is_engine_fault(&self) -> bool {
        self.class() == ErrorClass::Bug
    }

    /// What kind of failure this is: [`ErrorClass::Bug`] when the engine
    /// misbehaved (a refused free or allocation, broken invariants, data
    /// another object overwrote); that of the trace's, the device's or the
    /// build's error otherwise ([`ErrorClass::Corrupt`] for a damaged or
    /// invalid trace).
    pub fn class(&self) -> ErrorClass {
        match self {
            ReplayError::Build { source, .. } => source.class(),
            ReplayError::Trace(e) => e.class(),
            ReplayError::Alloc { .. }
            | ReplayError::Free { .. }
            | ReplayError::Invariants { .. } => ErrorClass::Bug,
            ReplayError::Data { source, .. } => source.class(),
        }
    }
}

/// The result of one engine's replay: the `bench` report plus what only a
/// replay knows. Serialises flat: every `bench --json` field, then these.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayReport {
    /// The bench-compatible part.
    #[serde(flatten)]
    pub run: RunReport,
    /// The trace replayed.
    pub trace: String,
    /// Requests (allocations and frees) in the trace, when scanned.
    pub trace_requests: Option<u64>,
    /// Requests executed.
    pub requests_replayed: u64,
    /// Allocations that failed for lack of space (`keep_going`; otherwise at
    /// most 1).
    pub failed_allocations: u64,
    /// Frees skipped because the object's allocation had failed.
    pub skipped_frees: u64,
    /// Data verification, when run on a device.
    pub data_check: Option<DataCheckStats>,
}

impl ReplayReport {
    /// The report as one line of JSON (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a report always serialises")
    }
}

/// Builds `engine` for the configured device and replays `ops` through it.
///
/// # Errors
/// [`ReplayError::Build`] when the engine cannot serve the device; see
/// [`replay`].
pub fn replay_engine(
    engine: BenchEngine,
    ops: impl Iterator<Item = Result<TraceOp, TraceError>>,
    trace: &TraceInfo,
    cfg: &ReplayConfig,
    device: Option<&mut PatternDevice>,
    timer: TimerCalibration,
    observer: &mut dyn Observer<ReplayReport, ReplayError>,
) -> Result<ReplayReport, ReplayError> {
    let name = engine.name();
    rss::reset_peak();
    let started = Instant::now();
    let built = engine
        .build(cfg.geometry.capacity_blocks())
        .map_err(|source| ReplayError::Build {
            engine: name,
            source,
        })?;
    replay_started(built, started, ops, trace, cfg, device, timer, observer)
}

/// Replays `ops` through an engine already built (tests wrap engines this
/// way) and reports.
///
/// # Errors
/// [`ReplayError::Trace`] for an unreadable or invalid trace; the other
/// variants when the engine misbehaves or the device fails.
pub fn replay(
    engine: Box<dyn Allocator>,
    ops: impl Iterator<Item = Result<TraceOp, TraceError>>,
    trace: &TraceInfo,
    cfg: &ReplayConfig,
    device: Option<&mut PatternDevice>,
    timer: TimerCalibration,
    observer: &mut dyn Observer<ReplayReport, ReplayError>,
) -> Result<ReplayReport, ReplayError> {
    rss::reset_peak();
    replay_started(
        engine,
        Instant::now(),
        ops,
        trace,
        cfg,
        device,
        timer,
        observer,
    )
}

#[allow(clippy::too_many_arguments)]
fn replay_started(
    engine: Box<dyn Allocator>,
    started: Instant,
    ops: impl Iterator<Item = Result<TraceOp, TraceError>>,
    trace: &TraceInfo,
    cfg: &ReplayConfig,
    device: Option<&mut PatternDevice>,
    timer: TimerCalibration,
    observer: &mut dyn Observer<ReplayReport, ReplayError>,
) -> Result<ReplayReport, ReplayError> {
    let name = engine.name();
    let total = trace.summary.as_ref().map(TraceSummary::requests);
    observer.engine_started(name, total);
    let mut run = Run::new(engine, started, cfg, device, timer);
    let result = run
        .run(ops, observer)
        .map(|stopped| run.report(stopped, trace));
    observer.engine_finished(name, result.as_ref());
    result
}

struct Run<'a> {
    name: &'static str,
    engine: Box<dyn Allocator>,
    cfg: &'a ReplayConfig,
    device: Option<&'a mut PatternDevice>,
    capacity: u64,
    block_size: u64,
    clock: Clock,
    timer: TimerCalibration,
    m: Measured,
    samples: Vec<RawSample>,
    live: IdMap<Held>,
    /// Objects whose allocation failed (`keep_going`) and are not yet freed.
    failed: IdMap<()>,
    got: Vec<Extent>,
    ends: Vec<usize>,
    to_free: Vec<Extent>,
    /// `to_free[..free_ends[i]]` holds the extents of the run's first `i+1`
    /// objects.
    free_ends: Vec<usize>,
    /// `(object, operation number, skipped)` of each free of the run.
    free_objects: Vec<(u64, u64, bool)>,
    /// Operations read (round markers included): the number of the last.
    op_no: u64,
    requests: u64,
    requests_left: u64,
    failed_allocations: u64,
    skipped_frees: u64,
    /// Time in the engine's allocation and free loops in this round, and
    /// the allocations and frees done.
    round_alloc_time: Duration,
    round_free_time: Duration,
    round_allocs: u64,
    round_frees: u64,
    round_requests: u64,
    max_phase: u8,
}

impl<'a> Run<'a> {
    fn new(
        engine: Box<dyn Allocator>,
        started: Instant,
        cfg: &'a ReplayConfig,
        device: Option<&'a mut PatternDevice>,
        timer: TimerCalibration,
    ) -> Self {
        Run {
            name: engine.name(),
            capacity: engine.capacity(),
            engine,
            cfg,
            device,
            block_size: cfg.geometry.block_size(),
            clock: Clock::new(started, cfg.limits.time_limit),
            timer,
            m: Measured::new(timer, started),
            samples: Vec::with_capacity(BATCH / SAMPLE_STRIDE + 1),
            live: IdMap::default(),
            failed: IdMap::default(),
            got: Vec::with_capacity(BATCH),
            ends: Vec::with_capacity(BATCH),
            to_free: Vec::with_capacity(BATCH),
            free_ends: Vec::with_capacity(BATCH),
            free_objects: Vec::with_capacity(BATCH),
            op_no: 0,
            requests: 0,
            requests_left: cfg.limits.max_ops.unwrap_or(u64::MAX),
            failed_allocations: 0,
            skipped_frees: 0,
            round_alloc_time: Duration::ZERO,
            round_free_time: Duration::ZERO,
            round_allocs: 0,
            round_frees: 0,
            round_requests: 0,
            max_phase: 0,
        }
    }

    fn utilization(&self) -> f64 {
        self.engine.used() as f64 / self.capacity as f64
    }

    /// Runs to the end; returns why it stopped.
    fn run(
        &mut self,
        mut ops: impl Iterator<Item = Result<TraceOp, TraceError>>,
        observer: &mut dyn Observer<ReplayReport, ReplayError>,
    ) -> Result<StopReason, ReplayError> {
        let mut batch: Vec<TraceOp> = Vec::with_capacity(BATCH);
        let stopped = 'outer: loop {
            if let Some(stop) = self.limit_before_batch() {
                break stop;
            }
            batch.clear();
            let room = match self.cfg.round_ops {
                Some(n) => n - self.round_requests,
                None => u64::MAX,
            };
            let mut requests = 0u64;
            while batch.len() < BATCH && requests < room {
                match ops.next() {
                    None => break,
                    Some(Err(e)) => return Err(e.into()),
                    Some(Ok(op)) => {
                        batch.push(op);
                        match op {
                            TraceOp::RoundEnd { .. } => {
                                if self.cfg.round_ops.is_none() {
                                    break;
                                }
                            }
                            _ => requests += 1,
                        }
                    }
                }
            }
            if batch.is_empty() {
                break StopReason::EndOfTrace;
            }
            let mut i = 0;
            while i < batch.len() {
                let stop = match batch[i] {
                    TraceOp::RoundEnd { phase } => {
                        self.op_no += 1;
                        i += 1;
                        self.max_phase = self.max_phase.max(phase);
                        if self.cfg.round_ops.is_none() {
                            self.end_round(phase, observer);
                            if let Some(stop) = self.limit_before_batch() {
                                break 'outer stop;
                            }
                        }
                        None
                    }
                    TraceOp::Alloc { .. } => {
                        let j = run_end(&batch, i, |op| matches!(op, TraceOp::Alloc { .. }));
                        let (n, stop) = self.alloc_run(&batch[i..j], observer)?;
                        i += n;
                        stop
                    }
                    TraceOp::Free { .. } => {
                        let j = run_end(&batch, i, |op| matches!(op, TraceOp::Free { .. }));
                        let (n, stop) = self.free_run(&batch[i..j], observer)?;
                        i += n;
                        stop
                    }
                };
                if let Some(stop) = stop {
                    break 'outer stop;
                }
            }
            if let Some(n) = self.cfg.round_ops {
                if self.round_requests >= n {
                    self.end_round(self.max_phase.max(1), observer);
                }
            }
        };
        if self.round_requests > 0 {
            let phase = self.max_phase.max(1);
            self.end_round(phase, observer);
        }
        if let Some(dev) = self.device.as_deref_mut() {
            let mut objects: Vec<(u64, u64)> = self
                .live
                .iter()
                .map(|(&o, h)| (h.extents()[0].start(), o))
                .collect();
            objects.sort_unstable();
            for (_, object) in objects {
                let held = &self.live[&object];
                dev.check_object(object, held.extents())
                    .map_err(|source| ReplayError::Data {
                        engine: self.name,
                        op: None,
                        source,
                    })?;
            }
        }
        if self.cfg.check_invariants {
            self.engine
                .verify()
                .map_err(|source| ReplayError::Invariants {
                    engine: self.name,
                    op: self.op_no,
                    source,
                })?;
        }
        self.m.peak_memory = self.m.peak_memory.max(self.engine.memory_bytes());
        Ok(stopped)
    }

    fn limit_before_batch(&self) -> Option<StopReason> {
        limit_before(
            &self.cfg.limits,
            self.m.per_round.len(),
            self.requests_left,
            &self.clock,
        )
    }

    fn end_round(&mut self, phase: u8, observer: &mut dyn Observer<ReplayReport, ReplayError>) {
        let record = RoundRecord {
            round: self.m.per_round.len() as u64 + 1,
            secs: (self.round_alloc_time + self.round_free_time).as_secs_f64(),
            utilization: self.utilization(),
            phase: Some(phase),
        };
        self.m.per_round.push(record);
        self.m.peak_memory = self.m.peak_memory.max(self.engine.memory_bytes());
        observer.round_finished(&RoundProgress {
            engine: self.name,
            record: &record,
            allocs: self.round_allocs,
            frees: self.round_frees,
            alloc_secs: self.round_alloc_time.as_secs_f64(),
            free_secs: self.round_free_time.as_secs_f64(),
            elapsed: self.m.started.elapsed(),
            requests: self.requests,
        });
        self.round_alloc_time = Duration::ZERO;
        self.round_free_time = Duration::ZERO;
        self.round_allocs = 0;
        self.round_frees = 0;
        self.round_requests = 0;
    }

    /// A loop's time without its one `Instant` pair (on top of the
    /// samples').
    fn net(&self, elapsed: Duration) -> Duration {
        elapsed.saturating_sub(Duration::from_nanos(self.timer.pair_ns))
    }

    /// Runs consecutive allocations; returns how many operations were
    /// consumed and why to stop, if so.
    fn alloc_run(
        &mut self,
        ops: &[TraceOp],
        observer: &mut dyn Observer<ReplayReport, ReplayError>,
    ) -> Result<(usize, Option<StopReason>), ReplayError> {
        let (n, budget_stop) = budget(self.requests_left, ops.len());
        let ops = &ops[..n];
        let (name, cap, block_size) = (self.name, self.capacity, self.block_size);
        let (requests, round) = (self.requests, self.m.per_round.len() as u64 + 1);
        let clock = &mut self.clock;
        let batch = timed_allocs(
            &mut *self.engine,
            self.cfg.mode,
            n,
            |i| match ops[i] {
                TraceOp::Alloc { bytes, .. } => bytes.div_ceil(block_size).max(1),
                _ => unreachable!("alloc runs hold allocations only"),
            },
            self.cfg.keep_going,
            Fill::EachSample(cap),
            &mut self.got,
            &mut self.ends,
            &mut self.samples,
            |_| None,
            |attempted, used| {
                clock.check(|| {
                    let at = Position {
                        round,
                        requests: requests + attempted as u64,
                    };
                    observer.tick(name, at, used as f64 / cap as f64)
                })
            },
        );
        let attempted = batch.attempted;
        let ok = batch.done();
        let elapsed = self.net(batch.elapsed);
        self.round_alloc_time += elapsed;
        self.m
            .alloc_lat
            .add_phase(elapsed, attempted as u64, &self.samples);
        if self.m.failure_utilization.is_none() {
            if let Some(used) = batch.used_at_first_no_space {
                self.m.failure_utilization = Some(used as f64 / cap as f64);
            }
        }
        let stop = batch.stop.or(budget_stop);
        if let Some((k, blocks, source)) = batch.failed {
            let TraceOp::Alloc { object, .. } = ops[k] else {
                unreachable!()
            };
            return Err(ReplayError::Alloc {
                engine: self.name,
                op: self.op_no + k as u64 + 1,
                object,
                blocks,
                source,
            });
        }
        let failures = batch.no_space;
        self.m.allocations += ok as u64;
        self.round_allocs += ok as u64;
        self.failed_allocations += failures.len() as u64;
        self.m.extents += self.got.len() as u64;
        // File the new objects (untimed) and write their patterns.
        let mut failures = failures.into_iter().peekable();
        let mut successes = 0;
        for (k, op) in ops[..attempted].iter().enumerate() {
            let TraceOp::Alloc { object, .. } = *op else {
                unreachable!()
            };
            let op_no = self.op_no + k as u64 + 1;
            let duplicate = || {
                ReplayError::Trace(TraceError::InvalidOp {
                    op: op_no,
                    at: None,
                    object,
                    kind: InvalidOpKind::AllocOfLiveObject,
                })
            };
            if failures.peek() == Some(&k) {
                failures.next();
                if self.live.contains_key(&object) || self.failed.insert(object, ()).is_some() {
                    return Err(duplicate());
                }
                continue;
            }
            let got = extents_of(self.cfg.mode, &self.got, &self.ends, k, successes);
            successes += 1;
            if let Some(&e) = got.iter().find(|e| e.end() > self.capacity) {
                return Err(ReplayError::Data {
                    engine: self.name,
                    op: Some(op_no),
                    source: CheckError::OutOfDevice {
                        object,
                        extent: e,
                        capacity: self.capacity,
                    },
                });
            }
            if let Some(dev) = self.device.as_deref_mut() {
                dev.write_object(object, got)
                    .map_err(|source| ReplayError::Data {
                        engine: self.name,
                        op: Some(op_no),
                        source,
                    })?;
            }
            let held = Held::new(got);
            if self.failed.contains_key(&object) || self.live.insert(object, held).is_some() {
                return Err(duplicate());
            }
        }
        self.op_no += attempted as u64;
        self.requests += attempted as u64;
        self.round_requests += attempted as u64;
        self.requests_left -= attempted as u64;
        Ok((attempted, stop))
    }

    /// Runs consecutive frees; returns how many operations were consumed and
    /// why to stop, if so.
    fn free_run(
        &mut self,
        ops: &[TraceOp],
        observer: &mut dyn Observer<ReplayReport, ReplayError>,
    ) -> Result<(usize, Option<StopReason>), ReplayError> {
        let (n, mut stop) = budget(self.requests_left, ops.len());
        let ops = &ops[..n];
        // Collect (untimed): take the objects out of the map, check their data.
        let mut to_free = std::mem::take(&mut self.to_free);
        to_free.clear();
        self.free_ends.clear();
        self.free_objects.clear();
        for (k, op) in ops.iter().enumerate() {
            let TraceOp::Free { object } = *op else {
                unreachable!("free runs hold frees only")
            };
            let op_no = self.op_no + k as u64 + 1;
            let mut skipped = false;
            match self.live.remove(&object) {
                Some(held) => {
                    if let Some(dev) = self.device.as_deref_mut() {
                        if let Err(source) = dev.check_object(object, held.extents()) {
                            self.to_free = to_free;
                            return Err(ReplayError::Data {
                                engine: self.name,
                                op: Some(op_no),
                                source,
                            });
                        }
                    }
                    to_free.extend_from_slice(held.extents());
                }
                None if self.failed.remove(&object).is_some() => skipped = true,
                None => {
                    self.to_free = to_free;
                    return Err(ReplayError::Trace(TraceError::InvalidOp {
                        op: op_no,
                        at: None,
                        object,
                        kind: InvalidOpKind::FreeOfUnknownObject,
                    }));
                }
            }
            self.free_ends.push(to_free.len());
            self.free_objects.push((object, op_no, skipped));
        }
        // The timed loop, shared with the bench.
        let (name, cap) = (self.name, self.capacity);
        let at = Position {
            round: self.m.per_round.len() as u64 + 1,
            requests: self.requests,
        };
        let clock = &mut self.clock;
        let batch = timed_frees(
            &mut *self.engine,
            &to_free,
            Fill::EachSample(cap),
            &mut self.samples,
            |used| clock.check(|| observer.tick(name, at, used as f64 / cap as f64)),
        );
        let (done, failed) = (batch.done, batch.failed);
        if batch.stop.is_some() {
            stop = batch.stop;
        }
        let elapsed = self.net(batch.elapsed);
        self.round_free_time += elapsed;
        self.m
            .free_lat
            .add_phase(elapsed, done as u64, &self.samples);
        // Frees (skipped ones included) whose extents were all freed.
        let objects_done = self.free_ends.iter().take_while(|&&e| e <= done).count();
        if let Some(source) = failed {
            let (object, op, _) = self.free_objects[objects_done];
            self.to_free = to_free;
            return Err(ReplayError::Free {
                engine: self.name,
                op,
                object,
                source,
            });
        }
        // A time limit may cut the loop: count only what ran.
        let consumed = if done == to_free.len() {
            ops.len()
        } else {
            objects_done
        };
        let skipped = self.free_objects[..consumed].iter().filter(|f| f.2).count() as u64;
        self.m.frees += consumed as u64 - skipped;
        self.round_frees += consumed as u64 - skipped;
        self.skipped_frees += skipped;
        self.op_no += consumed as u64;
        self.requests += consumed as u64;
        self.round_requests += consumed as u64;
        self.requests_left -= consumed as u64;
        self.to_free = to_free;
        Ok((consumed, stop))
    }

    fn report(mut self, stopped: StopReason, trace: &TraceInfo) -> ReplayReport {
        let h = &trace.header;
        let summary = trace.summary.as_ref();
        let free_prob = h
            .get(keys::FREE_PROB)
            .and_then(|v| v.parse().ok())
            .or_else(|| {
                summary
                    .filter(|s| s.allocs > 0)
                    .map(|s| s.frees as f64 / s.allocs as f64)
            })
            .unwrap_or(0.0);
        let with_phases = self.max_phase > 1;
        for r in &mut self.m.per_round {
            r.phase = r.phase.filter(|_| with_phases);
        }
        let labels = RunLabels {
            engine: self.name.to_string(),
            workload: h.get(keys::WORKLOAD).unwrap_or("trace").to_string(),
            sizes: h.get(keys::SIZES).unwrap_or("trace").to_string(),
            free_prob,
            round_size: self
                .cfg
                .round_ops
                .or_else(|| h.get(keys::ROUND_SIZE).and_then(|v| v.parse().ok()))
                .unwrap_or(0),
            seed: h.get(keys::SEED).and_then(|v| v.parse().ok()).unwrap_or(0),
            geometry: self.cfg.geometry,
            mode: self.cfg.mode,
            threads: 1,
            phase: with_phases.then_some(self.max_phase),
        };
        let status = self.engine.status();
        let data_check = self.device.as_deref().map(PatternDevice::stats);
        let run = RunReport::build(
            labels,
            self.m,
            stopped,
            status,
            self.timer,
            Throughput::Busy,
        );
        ReplayReport {
            run,
            trace: trace.name.clone(),
            trace_requests: summary.map(TraceSummary::requests),
            requests_replayed: self.requests,
            failed_allocations: self.failed_allocations,
            skipped_frees: self.skipped_frees,
            data_check,
        }
    }
}

/// End of the run of operations like `batch[i]` starting at `i`.
fn run_end(batch: &[TraceOp], i: usize, same: impl Fn(&TraceOp) -> bool) -> usize {
    batch[i..]
        .iter()
        .position(|op| !same(op))
        .map_or(batch.len(), |k| i + k)
}
