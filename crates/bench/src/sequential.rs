//! The sequential run ([`run_engine`]): one engine on one thread through a
//! generated workload stream, measured. Its errors ([`RunError`]) are those
//! of threaded runs too.
//!
//! For each round of the [`Workload`] the runner
//!
//! 1. runs the **allocation loop** over the round's requests — timed as a
//!    whole, 1 op in [`SAMPLE_STRIDE`] timed on its own (see
//!    [`crate::latency`]) — storing the extents it gets in a flat buffer
//!    (the loops are those of threaded runs and trace replay too);
//! 2. collects the extents of the objects to free (untimed) and runs the
//!    **free loop** over them, timed the same way. Objects are found in the
//!    runner's object → extents map; when the workload guarantees that a
//!    round frees only its own objects ([`Workload::frees_within_round`]),
//!    they are found in the round's result buffer instead and no map is
//!    kept, so the harness's memory does not grow with the live objects and
//!    the peak RSS reflects the engine;
//! 3. records the round (time, utilisation), samples the engine's memory,
//!    and with `verify` checks the engine's invariants.
//!
//! The run stops at the first failed allocation (`no_space`; utilisation at
//! first failure is `used / capacity` at that moment), when a limit hits, or
//! when the workload's stream ends (`end_of_workload`).
//! `max_ops` is exact; the time limit is checked every 256
//! operations inside the loops, so a slow engine is stopped mid-round.

use std::time::{Duration, Instant};

use blockalloc::{Allocator, Extent};
use blockalloc_trace::IdMap;

use crate::config::run_order;
use crate::config::{BenchConfig, RoundRecord, StopReason};
use crate::engines::BenchEngine;
use crate::latency::{RawSample, TimerCalibration, SAMPLE_STRIDE};
use crate::loops::{
    budget, extents_of, limit_before, timed_allocs, timed_frees, Clock, Fill, FreeBatch, Held,
};
use crate::observer::{Observer, Position, RoundProgress};
use crate::report::RunError;
use crate::report::{Measured, ReferenceFigure, RunLabels, RunReport, Throughput};
use crate::rss;
use crate::workload::{AllocRequest, Round, Workload};

/// How a timed loop ended.
struct LoopEnd {
    /// Operations that succeeded.
    done: usize,
    stop: Option<StopReason>,
}

/// State of one engine's run.
struct Run<'a> {
    name: &'static str,
    engine: Box<dyn Allocator>,
    cfg: &'a BenchConfig,
    capacity: u64,
    clock: Clock,
    /// Operations still allowed by `max_ops`.
    ops_left: u64,
    m: Measured,
    samples: Vec<RawSample>,
    /// Extents of the current round's allocations, in request order.
    got: Vec<Extent>,
    /// Scattered mode: `got[ends[i-1]..ends[i]]` belongs to request `i`.
    ends: Vec<usize>,
    /// The workload frees only objects of the current round: no live map.
    within_round: bool,
    /// Objects that may still be freed, when not `within_round`.
    live: IdMap<Held>,
    to_free: Vec<Extent>,
    /// `to_free[..free_ends[i]]` holds the extents of the first `i+1` objects.
    free_ends: Vec<usize>,
}

/// Runs one engine over the workload of `cfg` and reports.
///
/// # Errors
/// [`RunError::Build`] when the engine cannot be built for the device (the
/// caller should skip it); the other [`RunError`]s are engine bugs.
pub fn run_engine(
    engine: BenchEngine,
    cfg: &BenchConfig,
    timer: TimerCalibration,
    observer: &mut dyn Observer,
) -> Result<RunReport, RunError> {
    let name = engine.name();
    observer.engine_started(name, None);
    let result = run_inner(engine, cfg, timer, observer, false);
    observer.engine_finished(name, result.as_ref());
    result
}

/// What a run of several engines gave.
#[derive(Debug, Default)]
pub struct EnginesRun {
    /// The reports of the engines that ran, in the order they ran.
    pub reports: Vec<RunReport>,
    /// The engines skipped: they cannot be built for the device
    /// ([`RunError::is_skip`]).
    pub skipped: Vec<RunError>,
    /// The engines that failed.
    pub failed: Vec<RunError>,
}

/// Runs `engines` one after another over the workload of `cfg`, in
/// [`run_order`]: `reference` first, so that every report after it carries
/// its figure ([`RunReport::reference`]). An engine skipped or failed does
/// not stop the others. `each` hears every engine's outcome as it ends
/// (JSON Lines written as each run finishes).
///
/// # Errors
/// `each`'s first error, which ends the run there.
pub fn run_engines<E>(
    engines: &[BenchEngine],
    reference: Option<BenchEngine>,
    cfg: &BenchConfig,
    timer: TimerCalibration,
    observer: &mut dyn Observer,
    mut each: impl FnMut(Result<&RunReport, &RunError>) -> Result<(), E>,
) -> Result<EnginesRun, E> {
    let mut out = EnginesRun::default();
    let mut figure: Option<ReferenceFigure> = None;
    for engine in run_order(engines, reference) {
        match run_engine(engine, cfg, timer, observer) {
            Ok(mut r) => {
                if Some(engine) == reference {
                    figure = Some(ReferenceFigure {
                        engine: r.engine.clone(),
                        utilization_at_first_failure: r.utilization_at_first_failure,
                    });
                }
                r.reference = figure.clone();
                each(Ok(&r))?;
                out.reports.push(r);
            }
            Err(e) => {
                each(Err(&e))?;
                if e.is_skip() {
                    out.skipped.push(e);
                } else {
                    out.failed.push(e);
                }
            }
        }
    }
    Ok(out)
}

fn run_inner(
    which: BenchEngine,
    cfg: &BenchConfig,
    timer: TimerCalibration,
    observer: &mut dyn Observer,
    force_map: bool,
) -> Result<RunReport, RunError> {
    let name = which.name();
    rss::reset_peak();
    let capacity = cfg.geometry.capacity_blocks();
    let started = Instant::now();
    let engine = which.build(capacity).map_err(|source| RunError::Build {
        engine: name,
        source,
    })?;
    let round_cap = usize::try_from(cfg.workload.round_size).unwrap_or(usize::MAX);
    let mut workload = Workload::new(cfg.workload, cfg.geometry);
    let mut run = Run {
        name,
        engine,
        cfg,
        capacity,
        clock: Clock::new(started, cfg.limits.time_limit),
        ops_left: cfg.limits.max_ops.unwrap_or(u64::MAX),
        m: Measured::new(timer, started),
        samples: Vec::with_capacity(round_cap.min(1 << 20) / SAMPLE_STRIDE + 1),
        got: Vec::with_capacity(round_cap.min(1 << 20)),
        ends: Vec::new(),
        within_round: workload.frees_within_round() && !force_map,
        live: IdMap::default(),
        to_free: Vec::new(),
        free_ends: Vec::new(),
    };
    let mut round = Round::default();
    let stopped = loop {
        if let Some(stop) = run.limit_before_round() {
            break stop;
        }
        if !workload.next_round(&mut round) {
            break StopReason::EndOfWorkload;
        }
        if let Some(stop) = run.round(&round, observer)? {
            break stop;
        }
    };
    if cfg.verify {
        run.verify()?;
    }
    run.m.peak_memory = run.m.peak_memory.max(run.engine.memory_bytes());
    Ok(run.report(stopped, &workload, timer))
}

impl Run<'_> {
    fn utilization(&self) -> f64 {
        self.engine.used() as f64 / self.capacity as f64
    }

    /// Allocate and free calls so far.
    fn requests_done(&self) -> u64 {
        self.m.alloc_lat.ops() + self.m.free_lat.ops()
    }

    fn limit_before_round(&self) -> Option<StopReason> {
        limit_before(
            &self.cfg.limits,
            self.m.per_round.len(),
            self.ops_left,
            &self.clock,
        )
    }

    /// Runs one round; returns why the run stops, if it does.
    fn round(
        &mut self,
        round: &Round,
        observer: &mut dyn Observer,
    ) -> Result<Option<StopReason>, RunError> {
        let (a, alloc_time) = self.alloc_loop(round, observer)?;
        self.m.extents += self.got.len() as u64;
        if !self.within_round {
            self.file_allocations(&round.allocs[..a.done]);
        }
        let mut stop = a.stop;
        let (mut free_time, mut objects_freed) = (Duration::ZERO, 0);
        if stop.is_none() {
            self.collect_frees(round, a.done)?;
            let (f, t) = self.free_loop(round.number, observer)?;
            free_time = t;
            objects_freed = self.free_ends.iter().take_while(|&&e| e <= f.done).count() as u64;
            self.m.frees += objects_freed;
            stop = f.stop;
        }
        let record = RoundRecord {
            round: round.number,
            secs: (alloc_time + free_time).as_secs_f64(),
            utilization: self.utilization(),
            phase: self.cfg.workload.kind.info().phased.then_some(round.phase),
        };
        self.m.per_round.push(record);
        self.m.peak_memory = self.m.peak_memory.max(self.engine.memory_bytes());
        if self.cfg.verify && stop.is_none() {
            self.verify()?;
        }
        observer.round_finished(&RoundProgress {
            engine: self.name,
            record: &record,
            allocs: a.done as u64,
            frees: objects_freed,
            alloc_secs: alloc_time.as_secs_f64(),
            free_secs: free_time.as_secs_f64(),
            elapsed: self.m.started.elapsed(),
            requests: self.requests_done(),
        });
        Ok(stop)
    }

    fn alloc_loop(
        &mut self,
        round: &Round,
        observer: &mut dyn Observer,
    ) -> Result<(LoopEnd, Duration), RunError> {
        let (n, budget_stop) = budget(self.ops_left, round.allocs.len());
        let reqs = &round.allocs[..n];
        let (name, number, cap) = (self.name, round.number, self.capacity);
        let done_before = self.requests_done();
        let clock = &mut self.clock;
        let batch = timed_allocs(
            &mut *self.engine,
            self.cfg.mode,
            n,
            |i| reqs[i].blocks,
            false,
            Fill::EachSample(cap),
            &mut self.got,
            &mut self.ends,
            &mut self.samples,
            |_| None,
            |attempted, used| {
                clock.check(|| {
                    let at = Position {
                        round: number,
                        requests: done_before + attempted as u64,
                    };
                    observer.tick(name, at, used as f64 / cap as f64)
                })
            },
        );
        let done = batch.done();
        self.m
            .alloc_lat
            .add_phase(batch.elapsed, batch.attempted as u64, &self.samples);
        self.ops_left -= batch.attempted as u64;
        self.m.allocations += done as u64;
        if let Some((_, blocks, source)) = batch.failed {
            return Err(RunError::Alloc {
                engine: self.name,
                blocks,
                source,
            });
        }
        if let Some(used) = batch.used_at_first_no_space {
            self.m.failure_utilization = Some(used as f64 / cap as f64);
        }
        let stop = batch.stop.or(budget_stop);
        Ok((LoopEnd { done, stop }, batch.elapsed))
    }

    /// The extents the current round's `i`-th request received.
    fn new_extents(&self, i: usize) -> &[Extent] {
        extents_of(self.cfg.mode, &self.got, &self.ends, i, i)
    }

    /// Files the objects just allocated in the live map (untimed).
    fn file_allocations(&mut self, reqs: &[AllocRequest]) {
        for (i, req) in reqs.iter().enumerate() {
            let held = Held::new(self.new_extents(i));
            self.live.insert(req.object, held);
        }
    }

    /// Gathers the extents of the round's frees into `to_free` (untimed):
    /// from this round's results when the workload frees within rounds,
    /// else out of the live map.
    fn collect_frees(&mut self, round: &Round, done: usize) -> Result<(), RunError> {
        let mut to_free = std::mem::take(&mut self.to_free);
        to_free.clear();
        self.free_ends.clear();
        let first = round.allocs.first().map_or(0, |a| a.object);
        for &object in &round.frees {
            if self.within_round {
                match object
                    .checked_sub(first)
                    .and_then(|i| usize::try_from(i).ok())
                {
                    Some(i) if i < done => to_free.extend_from_slice(self.new_extents(i)),
                    _ => return Err(RunError::UnknownObject { object }),
                }
            } else {
                match self.live.remove(&object) {
                    Some(held) => to_free.extend_from_slice(held.extents()),
                    None => return Err(RunError::UnknownObject { object }),
                }
            }
            self.free_ends.push(to_free.len());
        }
        self.to_free = to_free;
        Ok(())
    }

    fn free_loop(
        &mut self,
        round: u64,
        observer: &mut dyn Observer,
    ) -> Result<(LoopEnd, Duration), RunError> {
        let (n, budget_stop) = budget(self.ops_left, self.to_free.len());
        let (name, cap) = (self.name, self.capacity);
        let at = Position {
            round,
            requests: self.requests_done(),
        };
        let clock = &mut self.clock;
        let batch = timed_frees(
            &mut *self.engine,
            &self.to_free[..n],
            Fill::EachSample(cap),
            &mut self.samples,
            |used| clock.check(|| observer.tick(name, at, used as f64 / cap as f64)),
        );
        let FreeBatch {
            done,
            failed,
            stop,
            elapsed,
        } = batch;
        let stop = stop.or(budget_stop);
        if let Some(source) = failed {
            return Err(RunError::Free {
                engine: self.name,
                source,
            });
        }
        self.m
            .free_lat
            .add_phase(elapsed, done as u64, &self.samples);
        self.ops_left -= done as u64;
        Ok((LoopEnd { done, stop }, elapsed))
    }

    fn verify(&self) -> Result<(), RunError> {
        self.engine.verify().map_err(|source| RunError::Verify {
            engine: self.name,
            round: self.m.per_round.len() as u64,
            source,
        })
    }

    fn report(
        self,
        stopped: StopReason,
        workload: &Workload,
        timer: TimerCalibration,
    ) -> RunReport {
        let cfg = self.cfg;
        let with_phases = cfg.workload.kind.info().phased;
        let labels = RunLabels {
            engine: self.name.to_string(),
            workload: cfg.workload.kind.name().to_string(),
            sizes: workload.current_sizes().to_string(),
            free_prob: workload.current_free_prob(),
            round_size: cfg.workload.round_size,
            seed: cfg.workload.seed,
            geometry: cfg.geometry,
            mode: cfg.mode,
            threads: 1,
            phase: with_phases.then_some(workload.phase()),
        };
        let status = self.engine.status();
        RunReport::build(labels, self.m, stopped, status, timer, Throughput::Busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Limits, Mode};
    use crate::observer::NoObserver;
    use crate::sizes::SizeSpec;
    use crate::workload::WorkloadSpec;
    use blockalloc::EngineKind;
    use blockalloc::Geometry;

    /// The live-map path (kept for workloads that free across rounds) gives
    /// the same run as the within-round path.
    #[test]
    fn live_map_and_round_buffer_agree() {
        for mode in [Mode::Contiguous, Mode::Scattered] {
            let cfg = BenchConfig {
                geometry: Geometry::parse("256MiB", "4KiB").unwrap(),
                mode,
                workload: WorkloadSpec {
                    round_size: 100,
                    sizes: SizeSpec::Uniform {
                        min: 1,
                        max: 1 << 20,
                    },
                    ..WorkloadSpec::default()
                },
                limits: Limits::default(),
                verify: true,
            };
            for kind in EngineKind::ALL {
                let engine = BenchEngine::Core(kind);
                let run = |force_map| {
                    run_inner(
                        engine,
                        &cfg,
                        TimerCalibration::ZERO,
                        &mut NoObserver,
                        force_map,
                    )
                    .unwrap()
                };
                let (a, b) = (run(false), run(true));
                assert_eq!(a.stopped, StopReason::NoSpace);
                assert_eq!(
                    (a.allocations, a.frees, a.free_calls, a.rounds),
                    (b.allocations, b.frees, b.free_calls, b.rounds),
                    "{kind}"
                );
                assert_eq!(
                    a.utilization_at_first_failure,
                    b.utilization_at_first_failure
                );
                assert_eq!(a.final_status, b.final_status);
                assert_eq!(a.extents_per_object, b.extents_per_object);
            }
        }
    }
}
