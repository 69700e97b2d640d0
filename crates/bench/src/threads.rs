//! `bench --threads N`: N threads run the workload against one
//! [`SharedAllocator`] (the recommended engine behind per-thread arenas).
//!
//! Each thread runs its own copy of the workload: seed `seed + thread`, and
//! rounds of `round_size / N` requests (rounded up), so that a "round" of the
//! whole run still asks for about `round_size` objects. Workloads whose
//! phases end at fill levels
//! ([`WorkloadInfo::shares_device`](crate::workload::WorkloadInfo::shares_device))
//! size each copy to 1/N of the device; those whose frees cross rounds keep
//! a map of each thread's live objects (untimed). Threads do not wait
//! for each other between rounds, except that those workloads' threads
//! change phase together: a thread whose next round starts a new phase
//! waits (untimed, on the wall clock) until every running thread reached
//! it, so that the device is as full as the workload says when the
//! deletions start and one thread's last phase does not fill the space
//! another still needs for its first. The run stops for everyone at the first
//! failed allocation in any thread (utilisation at first failure is taken by
//! that thread at that moment) or when a limit hits (`max_rounds` counts
//! each thread's rounds, `max_ops` all threads' operations together). A
//! thread whose copy of the workload ends (`churn`) stops alone; when every
//! copy ended, the run stopped with `end_of_workload`.
//!
//! Throughput is total allocate + free calls over the wall-clock time of the
//! parallel part (round generation included, since every thread does its
//! own): from the barrier that starts the threads to the moment the last
//! one finishes. Latency is sampled as in the single-threaded runner (1 op
//! in [`SAMPLE_STRIDE`](crate::SAMPLE_STRIDE)), per thread, and merged for the run's totals.
//!
//! The harness keeps its own cross-thread traffic out of the measurement:
//! the stop flag and the operation budget sit on cache lines of their own,
//! and the fill level that files latency samples by decile is read once per
//! phase of a round (reading it sums every arena's free counter — lines the
//! other threads keep writing — so reading it every few hundred operations
//! cost the 8-thread runs several per cent). A phase moves the fill level
//! by well under one decile.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use blockalloc::{ByteSize, Extent, Geometry};
use blockalloc_shared::{SharedAllocator, SharedConfig};
use blockalloc_trace::IdMap;
use crossbeam_utils::CachePadded;

use crate::config::{BenchConfig, RoundRecord, StopReason};
use crate::engines::BenchEngine;
use crate::latency::{fill_bucket, RawSample, TimerCalibration};
use crate::loops::{extents_of, timed_allocs, timed_frees, Fill, Held};
use crate::observer::{Observer, Position};
use crate::report::RunError;
use crate::report::{LockReport, Measured, RunLabels, RunReport, ThreadStats, Throughput};
use crate::rss;
use crate::workload::{Round, Workload};

/// The most threads a threaded run may have.
pub const MAX_THREADS: u32 = 1024;

/// A thread count that is no number from 1 to [`MAX_THREADS`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a thread count from 1 to {MAX_THREADS}")]
pub struct BadThreadCount(pub String);

/// The thread counts of a list such as `1,2,8`, each from 1 to
/// [`MAX_THREADS`], in the list's order.
///
/// # Errors
/// [`BadThreadCount`] naming the first part that is none.
pub fn parse_thread_counts(list: &str) -> Result<Vec<u32>, BadThreadCount> {
    list.split(',')
        .map(|part| match part.trim().parse::<u32>() {
            Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
            _ => Err(BadThreadCount(part.to_string())),
        })
        .collect()
}

/// A threaded run asked for what it cannot do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ThreadedRunError {
    /// Engines other than the default one: a threaded run runs the shared
    /// handle of the default engine (segfit).
    #[error("a threaded run runs the shared handle of the default engine (segfit)")]
    NotDefaultEngine,
    /// A reference engine: it compares engines on one stream.
    #[error("a reference compares engines on one stream; it does not apply to threaded runs")]
    Reference,
}

/// Checks that a threaded run asked for `engines` (in their order) and
/// `reference` can run: only the default engine, and no reference.
///
/// # Errors
/// The [`ThreadedRunError`] that stops it.
pub fn check_threaded(
    engines: &[BenchEngine],
    reference: Option<BenchEngine>,
) -> Result<(), ThreadedRunError> {
    if engines != [BenchEngine::default()] {
        return Err(ThreadedRunError::NotDefaultEngine);
    }
    if reference.is_some() {
        return Err(ThreadedRunError::Reference);
    }
    Ok(())
}

/// The shared handle's tunables a threaded run may set; what is not set
/// keeps [`SharedConfig::for_capacity`]'s value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedTunables {
    /// The region size in bytes: a power-of-two number of blocks.
    pub region_bytes: Option<u64>,
    /// Empty regions an arena keeps.
    pub keep_empty_regions: Option<usize>,
    /// The most arenas, at least 1.
    pub arenas: Option<usize>,
}

/// A [`SharedTunables`] value the shared handle cannot take.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SharedTunablesError {
    /// The region size is no power-of-two number of blocks.
    #[error("{} must be a power-of-two number of {} blocks", ByteSize(*.region_bytes), ByteSize(*.block_size))]
    RegionSize {
        /// The region size asked for.
        region_bytes: u64,
        /// The device's block size.
        block_size: u64,
    },
    /// No arena.
    #[error("must be at least 1")]
    Arenas,
}

impl SharedTunables {
    /// The shared handle's configuration for `geometry` with these
    /// tunables.
    ///
    /// # Errors
    /// [`SharedTunablesError`] for a value the handle cannot take.
    pub fn config(&self, geometry: &Geometry) -> Result<SharedConfig, SharedTunablesError> {
        let mut c = SharedConfig::for_capacity(geometry.capacity_blocks());
        if let Some(bytes) = self.region_bytes {
            let block_size = geometry.block_size();
            let blocks = bytes / block_size;
            if bytes % block_size != 0 || !blocks.is_power_of_two() {
                return Err(SharedTunablesError::RegionSize {
                    region_bytes: bytes,
                    block_size,
                });
            }
            c.region_blocks = blocks;
        }
        if let Some(k) = self.keep_empty_regions {
            c.keep_empty_regions = k;
        }
        if let Some(n) = self.arenas {
            if n == 0 {
                return Err(SharedTunablesError::Arenas);
            }
            c.max_arenas = n;
        }
        Ok(c)
    }
}

/// What the threads share while running.
struct Shared {
    /// Read by every thread every few hundred operations: a line of its own.
    stop: CachePadded<AtomicBool>,
    /// The reason of the first stop, and utilisation at first failure.
    first: Mutex<Option<(StopReason, Option<f64>)>>,
    /// Written by every thread once per chunk of operations.
    ops: CachePadded<AtomicU64>,
    max_ops: u64,
    deadline: Option<Instant>,
    /// Per thread, how many phase changes its workload has started
    /// ([`FINISHED`] once it stopped): the gate of the workloads whose
    /// threads change phase together.
    stages: Mutex<Vec<u32>>,
    /// Woken when a thread enters a stage, finishes, or the run stops.
    stage_changed: Condvar,
}

/// The stage of a thread that has stopped: it holds no one back.
const FINISHED: u32 = u32::MAX;

impl Shared {
    fn stop(&self, why: StopReason, util: Option<f64>) {
        let mut f = self.first.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some((why, util));
        }
        self.stop.store(true, Ordering::SeqCst);
        drop(f);
        // Threads waiting at a phase change see the stop.
        let _stages = self.stages.lock().unwrap_or_else(|e| e.into_inner());
        self.stage_changed.notify_all();
    }

    /// Thread `t` enters `stage` and waits until every running thread has
    /// entered it too. False when the run stopped meanwhile (a failure, a
    /// limit, or the deadline, which the wait itself observes).
    fn enter_stage(&self, t: u32, stage: u32) -> bool {
        let mut stages = self.stages.lock().unwrap_or_else(|e| e.into_inner());
        stages[t as usize] = stage;
        self.stage_changed.notify_all();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                drop(stages);
                self.stop(StopReason::TimeLimit, None);
                return false;
            }
            if stages.iter().all(|&s| s >= stage) {
                return true;
            }
            stages = self
                .stage_changed
                .wait_timeout(stages, Duration::from_millis(10))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Thread `t` stopped: the others no longer wait for it.
    fn finish(&self, t: u32) {
        let mut stages = self.stages.lock().unwrap_or_else(|e| e.into_inner());
        stages[t as usize] = FINISHED;
        self.stage_changed.notify_all();
    }

    /// Takes `n` operations from the shared budget; false when it ran out.
    /// Without a budget the counter is left alone.
    fn take_ops(&self, n: u64) -> bool {
        self.max_ops == u64::MAX || self.ops.fetch_add(n, Ordering::Relaxed) + n <= self.max_ops
    }
}

struct WorkerOut {
    /// This thread's measurements (its latency, counts and rounds).
    m: Measured,
    /// When this thread stopped.
    finished: Instant,
}

/// Runs `threads` threads of the workload against one shared allocator with
/// the default [`SharedConfig`] for the device.
///
/// # Errors
/// [`RunError`] when the allocator cannot be built or misbehaves.
pub fn run_threads(
    threads: u32,
    cfg: &BenchConfig,
    timer: TimerCalibration,
    observer: &mut dyn Observer,
) -> Result<RunReport, RunError> {
    let config = SharedConfig::for_capacity(cfg.geometry.capacity_blocks());
    run_threads_with(threads, cfg, config, timer, observer)
}

/// As [`run_threads`], with the shared handle's tunables given (region size,
/// high-water mark): how the defaults are chosen by measurement.
///
/// # Errors
/// [`RunError`] when the allocator cannot be built or misbehaves.
pub fn run_threads_with(
    threads: u32,
    cfg: &BenchConfig,
    config: SharedConfig,
    timer: TimerCalibration,
    observer: &mut dyn Observer,
) -> Result<RunReport, RunError> {
    let name = SharedAllocator::NAME;
    let threads = threads.max(1);
    observer.engine_started(name, None);
    rss::reset_peak();
    let capacity = cfg.geometry.capacity_blocks();
    let started = Instant::now();
    let alloc =
        SharedAllocator::with_config(capacity, config).map_err(|source| RunError::Config {
            engine: name,
            source,
        })?;
    let shared = Shared {
        stop: CachePadded::new(AtomicBool::new(false)),
        first: Mutex::new(None),
        ops: CachePadded::new(AtomicU64::new(0)),
        max_ops: cfg.limits.max_ops.unwrap_or(u64::MAX),
        deadline: cfg.limits.time_limit.and_then(|d| started.checked_add(d)),
        stages: Mutex::new(vec![0; threads as usize]),
        stage_changed: Condvar::new(),
    };
    let barrier = Barrier::new(threads as usize + 1);
    let mut peak_memory = 0usize;
    let (outs, parallel) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (alloc, shared, barrier) = (&alloc, &shared, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let out = worker(t, threads, alloc, cfg, timer, shared);
                    shared.finish(t);
                    out
                })
            })
            .collect();
        barrier.wait();
        let t0 = Instant::now();
        // Progress and memory samples from this thread while they run.
        let mut last_mem = Instant::now();
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            let at = Position {
                round: 0,
                requests: 0,
            };
            observer.tick(name, at, alloc.used() as f64 / capacity as f64);
            if last_mem.elapsed() >= Duration::from_secs(1) {
                peak_memory = peak_memory.max(alloc.memory_bytes());
                last_mem = Instant::now();
            }
        }
        let outs: Vec<Result<WorkerOut, RunError>> = handles
            .into_iter()
            .map(|h| h.join().expect("bench threads do not panic"))
            .collect();
        // Until the last thread finished, not until this loop noticed (it
        // sleeps 50 ms at a time: up to 4 % of a one-second run).
        let end = outs
            .iter()
            .filter_map(|o| o.as_ref().ok().map(|o| o.finished))
            .max()
            .unwrap_or_else(Instant::now);
        (outs, end.saturating_duration_since(t0))
    });
    let outs = outs.into_iter().collect::<Result<Vec<_>, _>>()?;
    if cfg.verify {
        alloc.verify().map_err(|source| RunError::Verify {
            engine: name,
            round: outs[0].m.per_round.len() as u64,
            source,
        })?;
    }
    peak_memory = peak_memory.max(alloc.memory_bytes());
    let (stopped, failure) = shared
        .first
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        // No thread stopped the run: every copy of the workload ended.
        .unwrap_or((StopReason::EndOfWorkload, None));
    let report = build_report(ReportParts {
        cfg,
        threads,
        alloc: &alloc,
        outs: &outs,
        stopped,
        failure,
        parallel,
        started,
        peak_memory,
        timer,
    });
    observer.engine_finished(name, Ok(&report));
    Ok(report)
}

fn worker(
    t: u32,
    threads: u32,
    alloc: &SharedAllocator,
    cfg: &BenchConfig,
    timer: TimerCalibration,
    shared: &Shared,
) -> Result<WorkerOut, RunError> {
    let name = SharedAllocator::NAME;
    let capacity = alloc.capacity();
    let (spec, geometry) = cfg.workload.for_worker(cfg.geometry, t, threads);
    let shares_device = cfg.workload.kind.info().shares_device;
    let mut workload = Workload::new(spec, geometry);
    let mut round = Round::default();
    let mut out = WorkerOut {
        m: Measured::new(timer, Instant::now()),
        finished: Instant::now(),
    };
    let mut samples: Vec<RawSample> = Vec::new();
    let mut got: Vec<Extent> = Vec::new();
    let mut ends: Vec<usize> = Vec::new();
    let mut to_free: Vec<Extent> = Vec::new();
    // Workloads whose frees cross rounds: this thread's live objects.
    let within_round = workload.frees_within_round();
    let mut live: IdMap<Held> = IdMap::default();
    // The phase of the previous round and the phase changes so far.
    let (mut phase, mut stage) = (None, 0u32);
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if cfg
            .limits
            .max_rounds
            .is_some_and(|m| out.m.per_round.len() as u64 >= m)
        {
            // This thread is done; the others finish their own rounds.
            shared.stop(StopReason::MaxRounds, None);
            break;
        }
        if !workload.next_round(&mut round) {
            break;
        }
        if shares_device && phase.is_some_and(|p| p != round.phase) {
            stage += 1;
            if !shared.enter_stage(t, stage) {
                break;
            }
        }
        phase = Some(round.phase);
        // Allocation loop. The fill level that files latency samples is read
        // once per phase (see the module docs).
        let fill = Fill::Fixed(fill_bucket(alloc.used(), capacity));
        let reqs = &round.allocs;
        let batch = timed_allocs(
            &mut &*alloc,
            cfg.mode,
            reqs.len(),
            |i| reqs[i].blocks,
            false,
            fill,
            &mut got,
            &mut ends,
            &mut samples,
            |len| {
                if shared.stop.load(Ordering::Relaxed) {
                    // Another thread stopped the run and said why.
                    return Some(StopReason::NoSpace);
                }
                if !shared.take_ops(len as u64) {
                    shared.stop(StopReason::MaxOps, None);
                    return Some(StopReason::MaxOps);
                }
                if shared.deadline.is_some_and(|d| Instant::now() >= d) {
                    shared.stop(StopReason::TimeLimit, None);
                    return Some(StopReason::TimeLimit);
                }
                None
            },
            |_, _| None,
        );
        if let Some((_, blocks, source)) = batch.failed {
            shared.stop(StopReason::NoSpace, None);
            return Err(RunError::Alloc {
                engine: name,
                blocks,
                source,
            });
        }
        if let Some(used) = batch.used_at_first_no_space {
            shared.stop(StopReason::NoSpace, Some(used as f64 / capacity as f64));
        }
        let done = batch.done();
        let alloc_time = batch.elapsed;
        out.m.alloc_lat.add_phase(alloc_time, done as u64, &samples);
        out.m.allocations += done as u64;
        out.m.extents += got.len() as u64;
        // Free loop: the round's marked objects that were allocated.
        let first = round.allocs.first().map_or(0, |a| a.object);
        if !within_round {
            // Untimed: file this round's objects with the earlier ones.
            for (i, req) in round.allocs[..done].iter().enumerate() {
                live.insert(
                    req.object,
                    Held::new(extents_of(cfg.mode, &got, &ends, i, i)),
                );
            }
        }
        to_free.clear();
        let mut objects = 0u64;
        for &object in &round.frees {
            let i = object
                .checked_sub(first)
                .and_then(|i| usize::try_from(i).ok());
            if i.is_some_and(|i| i >= done && i < round.allocs.len()) {
                continue; // Its allocation never happened: the run is stopping.
            }
            if within_round {
                let Some(i) = i.filter(|&i| i < done) else {
                    return Err(RunError::UnknownObject { object });
                };
                to_free.extend_from_slice(extents_of(cfg.mode, &got, &ends, i, i));
            } else {
                let Some(held) = live.remove(&object) else {
                    return Err(RunError::UnknownObject { object });
                };
                to_free.extend_from_slice(held.extents());
            }
            objects += 1;
        }
        let fill = Fill::Fixed(fill_bucket(alloc.used(), capacity));
        let batch = timed_frees(&mut &*alloc, &to_free, fill, &mut samples, |_| None);
        if let Some(source) = batch.failed {
            shared.stop(StopReason::NoSpace, None);
            return Err(RunError::Free {
                engine: name,
                source,
            });
        }
        let free_time = batch.elapsed;
        out.m
            .free_lat
            .add_phase(free_time, to_free.len() as u64, &samples);
        // The frees are done; they count towards the budget, which the next
        // chunk of allocations checks.
        let _ = shared.take_ops(to_free.len() as u64);
        out.m.frees += objects;
        out.m.per_round.push(RoundRecord {
            round: round.number,
            secs: (alloc_time + free_time).as_secs_f64(),
            utilization: alloc.used() as f64 / capacity as f64,
            phase: cfg.workload.kind.info().phased.then_some(round.phase),
        });
    }
    out.finished = Instant::now();
    Ok(out)
}

struct ReportParts<'a> {
    cfg: &'a BenchConfig,
    threads: u32,
    alloc: &'a SharedAllocator,
    outs: &'a [WorkerOut],
    stopped: StopReason,
    failure: Option<f64>,
    parallel: Duration,
    started: Instant,
    peak_memory: usize,
    timer: TimerCalibration,
}

fn build_report(p: ReportParts<'_>) -> RunReport {
    let cfg = p.cfg;
    let mut m = Measured::new(p.timer, p.started);
    let mut per_thread = Vec::new();
    for (t, o) in p.outs.iter().enumerate() {
        m.alloc_lat.merge(&o.m.alloc_lat);
        m.free_lat.merge(&o.m.free_lat);
        m.allocations += o.m.allocations;
        m.frees += o.m.frees;
        m.extents += o.m.extents;
        per_thread.push(ThreadStats {
            thread: t as u32,
            allocations: o.m.allocations,
            frees: o.m.frees,
            rounds: o.m.per_round.len() as u64,
            alloc_ns: o.m.alloc_lat.summary(),
            free_ns: o.m.free_lat.summary(),
        });
    }
    m.per_round = p
        .outs
        .first()
        .map(|o| o.m.per_round.clone())
        .unwrap_or_default();
    m.peak_memory = p.peak_memory;
    m.failure_utilization = p.failure;
    let ops = m.alloc_lat.ops() + m.free_lat.ops();
    let st = p.alloc.stats();
    let locks = LockReport {
        lock_acquisitions: st.lock_acquisitions,
        lock_waits: st.lock_waits,
        waits_per_op: st.lock_waits as f64 / (ops.max(1)) as f64,
        leases: st.leases,
        hand_backs: st.hand_backs,
        fallbacks: st.fallbacks,
        reclaims: st.reclaims,
        region_blocks: p.alloc.config().region_blocks,
        keep_empty_regions: p.alloc.config().keep_empty_regions,
    };
    let sizes = if cfg.workload.kind.info().phased {
        cfg.workload.kind.name().to_string()
    } else {
        cfg.workload.sizes.to_string()
    };
    let labels = RunLabels {
        engine: SharedAllocator::NAME.to_string(),
        workload: cfg.workload.kind.name().to_string(),
        sizes,
        free_prob: cfg.workload.free_prob,
        round_size: cfg.workload.round_size,
        seed: cfg.workload.seed,
        geometry: cfg.geometry,
        mode: cfg.mode,
        threads: p.threads,
        phase: None,
    };
    let status = p.alloc.status();
    let mut report = RunReport::build(
        labels,
        m,
        p.stopped,
        status,
        p.timer,
        Throughput::Wall(p.parallel),
    );
    report.per_thread = Some(per_thread);
    report.locks = Some(locks);
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(threads: usize, deadline: Option<Instant>) -> Shared {
        Shared {
            stop: CachePadded::new(AtomicBool::new(false)),
            first: Mutex::new(None),
            ops: CachePadded::new(AtomicU64::new(0)),
            max_ops: u64::MAX,
            deadline,
            stages: Mutex::new(vec![0; threads]),
            stage_changed: Condvar::new(),
        }
    }

    /// Regression: with fill-shift on two threads, one thread could fill
    /// its share, delete, and fail on the big objects of the last phase
    /// before the other had reached its deletions. A thread now waits at a
    /// phase change until the others reached it.
    #[test]
    fn a_phase_change_waits_for_every_running_thread() {
        let s = shared(3, None);
        let passed = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let h = scope.spawn(|| {
                let ok = s.enter_stage(0, 1);
                passed.store(true, Ordering::SeqCst);
                ok
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!passed.load(Ordering::SeqCst), "no other thread is there");
            s.finish(2); // a stopped thread holds no one back
            std::thread::sleep(Duration::from_millis(50));
            assert!(!passed.load(Ordering::SeqCst), "thread 1 is not there");
            assert!(s.enter_stage(1, 1));
            assert!(h.join().unwrap());
        });
    }

    #[test]
    fn a_stop_or_the_deadline_releases_a_waiting_thread() {
        let s = shared(2, None);
        std::thread::scope(|scope| {
            let h = scope.spawn(|| s.enter_stage(0, 1));
            std::thread::sleep(Duration::from_millis(20));
            s.stop(StopReason::NoSpace, Some(0.9));
            assert!(!h.join().unwrap());
        });
        let s = shared(2, Some(Instant::now() + Duration::from_millis(30)));
        assert!(!s.enter_stage(0, 1));
        let first = *s.first.lock().unwrap();
        assert_eq!(first.map(|f| f.0), Some(StopReason::TimeLimit));
    }
}
