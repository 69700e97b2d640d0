//! Several copies of a workload through one engine, in a given order: the
//! in-process reference of a run whose requests came from many clients.
//!
//! `bench --remote ADDR --clients N` runs N copies of a workload
//! ([`WorkloadSpec::for_worker`]) against a server, each client at its
//! own pace. How full the device gets before the first failure depends on
//! the order in which the clients' requests arrived, not only on their
//! streams: a client that runs ahead frees its first round's objects while
//! the others still fill theirs. [`replay_interleaved`] replays the same
//! streams through one in-process engine in the order the clients made
//! their requests (a list of worker indices, one per allocation or free),
//! then, if asked, goes on one operation of each worker in turn until an
//! allocation fails. Its utilisation at the first failure is what one
//! engine over the whole device makes of the same workload. Starting the
//! turns with the worker whose request the server refused tells whether
//! the engine would have refused that same request
//! ([`Interleaved::ops_after_order`] is then 1).
//!
//! ```
//! use blockalloc::Geometry;
//! use blockalloc_bench::{replay_interleaved, After, Interleave, WorkloadSpec};
//!
//! let g = Geometry::new(1 << 30, 4096).unwrap();
//! let mut spec = WorkloadSpec::default();
//! spec.round_size = 400;
//! // Two clients' streams on a device whose first 64 blocks are metadata:
//! // worker 0 first for three operations, then in turn from worker 1.
//! let setup = Interleave {
//!     workers: 2,
//!     metadata_blocks: 64,
//!     ..Interleave::new(spec, g)
//! };
//! let out = replay_interleaved(&setup, &[0, 0, 0, 1], After::InTurn { first: 1 }).unwrap();
//! let u = out.utilization_at_first_failure.unwrap();
//! assert!(u > 0.9 && u <= 1.0);
//! ```

use std::collections::HashMap;

use blockalloc::{AllocError, Allocator, BuildError, Extent, Geometry};

use crate::config::Limits;
use crate::engines::BenchEngine;
use crate::workload::{Op, Ops, Workload, WorkloadSpec};

/// What [`replay_interleaved`] does once the given order is used up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Stop there (the recorded run ended at a limit).
    Stop,
    /// Go on, one operation of each worker in turn (`first`, then the
    /// next index, wrapping), until an allocation fails, every stream ends
    /// or a limit is reached.
    InTurn {
        /// The worker that goes first in each turn: the one whose request
        /// the recorded run refused, so that the continuation starts with
        /// that request.
        first: u32,
    },
}

/// The result of [`replay_interleaved`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interleaved {
    /// `used / capacity` when the engine's first allocation failed; `None`
    /// if none did.
    pub utilization_at_first_failure: Option<f64>,
    /// Allocations and frees the engine was given (the failed one
    /// included).
    pub ops: u64,
    /// The engine failed before the given order was used up: it could
    /// not serve a request the recorded run served.
    pub failed_within_order: bool,
    /// Operations given after the order was used up (the failed one
    /// included). With [`After::InTurn`] from the worker whose request the
    /// recorded run refused, 1 with a failure means the engine refused
    /// that same request; more, that it served it and went on.
    pub ops_after_order: u64,
    /// Blocks the engine held when the replay stopped.
    pub used_blocks: u64,
}

/// Why [`replay_interleaved`] could not run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InterleaveError {
    /// The engine cannot serve this device.
    #[error("{engine} cannot serve the device: {source}")]
    Build {
        /// Engine name.
        engine: &'static str,
        /// Why.
        source: BuildError,
    },
    /// The order names a worker that does not exist, or one whose stream
    /// has no operation left.
    #[error("operation {position} of the order names worker {worker}, {why}")]
    Order {
        /// Position in the order, from 0.
        position: usize,
        /// The worker it names.
        worker: u32,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The engine refused an allocation other than for lack of space, or
    /// refused to free an extent it had handed out (a bug).
    #[error("{engine} misbehaved: {what}")]
    Engine {
        /// Engine name.
        engine: &'static str,
        /// What it did.
        what: String,
    },
}

/// One worker's stream and its live objects.
struct Stream {
    ops: Ops,
    live: HashMap<u64, Extent>,
    /// Rounds this worker has finished.
    rounds: u64,
    ended: bool,
}

/// What one step of a stream did.
enum Step {
    Done,
    NoSpace,
    Ended,
}

/// What [`replay_interleaved`] replays: `workers` copies of a workload
/// through one fresh engine over a device.
#[derive(Clone, Copy, Debug)]
pub struct Interleave {
    /// The engine.
    pub engine: BenchEngine,
    /// The workload every worker runs a copy of
    /// ([`WorkloadSpec::for_worker`]).
    pub spec: WorkloadSpec,
    /// The device.
    pub geometry: Geometry,
    /// Blocks at the start of the device that the engine never hands out
    /// (a store's metadata area, so that the engine has exactly the
    /// server's room); they count as used.
    pub metadata_blocks: u64,
    /// How many copies of the workload.
    pub workers: u32,
    /// A worker stops at `max_rounds` of its own rounds and all of them at
    /// `max_ops` operations together; the time limit does not apply (the
    /// replay is deterministic).
    pub limits: Limits,
}

impl Interleave {
    /// The default engine, one worker, no metadata and no limits.
    pub fn new(spec: WorkloadSpec, geometry: Geometry) -> Interleave {
        Interleave {
            engine: BenchEngine::default(),
            spec,
            geometry,
            metadata_blocks: 0,
            workers: 1,
            limits: Limits::default(),
        }
    }
}

/// Replays the workers' streams of `setup` through one fresh engine: first
/// in `order` (one worker index per allocation or free), then as `after`
/// says. Allocations are contiguous.
///
/// # Errors
/// [`InterleaveError`] when the engine cannot be built for the device (or
/// cannot set its metadata area aside), the order names a worker out of
/// range or past the end of its stream, or the engine misbehaves.
pub fn replay_interleaved(
    setup: &Interleave,
    order: &[u32],
    after: After,
) -> Result<Interleaved, InterleaveError> {
    let Interleave {
        engine,
        spec,
        geometry,
        metadata_blocks,
        workers,
        limits,
    } = *setup;
    let name = engine.name();
    let mut alloc =
        engine
            .build(geometry.capacity_blocks())
            .map_err(|source| InterleaveError::Build {
                engine: name,
                source,
            })?;
    if metadata_blocks > 0 {
        match alloc.allocate(metadata_blocks, Some(0)) {
            Ok(e) if e.start() == 0 => {}
            other => {
                return Err(InterleaveError::Engine {
                    engine: name,
                    what: format!(
                        "setting the first {metadata_blocks} blocks aside for metadata: {other:?}"
                    ),
                })
            }
        }
    }
    let workers = workers.max(1);
    let mut streams: Vec<Stream> = (0..workers)
        .map(|w| {
            let (s, g) = spec.for_worker(geometry, w, workers);
            Stream {
                ops: Workload::new(s, g).ops(),
                live: HashMap::new(),
                rounds: 0,
                ended: false,
            }
        })
        .collect();
    let mut out = Interleaved {
        utilization_at_first_failure: None,
        ops: 0,
        failed_within_order: false,
        ops_after_order: 0,
        used_blocks: 0,
    };
    drive(
        &mut streams,
        alloc.as_mut(),
        name,
        order,
        after,
        &limits,
        &mut out,
    )?;
    out.used_blocks = alloc.used();
    Ok(out)
}

/// Gives the engine the streams' operations, in `order` and then as
/// `after` says, counting them in `out` until one fails for lack of space
/// (then noting the utilisation), the streams end, or a limit is reached.
fn drive(
    streams: &mut [Stream],
    alloc: &mut dyn Allocator,
    name: &'static str,
    order: &[u32],
    after: After,
    limits: &Limits,
    out: &mut Interleaved,
) -> Result<(), InterleaveError> {
    let budget_left = |done: u64| limits.max_ops.is_none_or(|m| done < m);
    for (position, &w) in order.iter().enumerate() {
        if !budget_left(out.ops) {
            return Ok(());
        }
        let stream = streams.get_mut(w as usize).ok_or(InterleaveError::Order {
            position,
            worker: w,
            why: "which does not exist",
        })?;
        match step(stream, alloc, name, limits)? {
            Step::Done => out.ops += 1,
            Step::NoSpace => {
                out.ops += 1;
                out.failed_within_order = true;
                out.utilization_at_first_failure = Some(utilization(alloc));
                return Ok(());
            }
            Step::Ended => {
                return Err(InterleaveError::Order {
                    position,
                    worker: w,
                    why: "whose stream has no operation left",
                })
            }
        }
    }
    let first = match after {
        After::Stop => return Ok(()),
        After::InTurn { first } => first as usize % streams.len().max(1),
    };
    let ordered = out.ops;
    let turn: Vec<usize> = (0..streams.len())
        .map(|i| (first + i) % streams.len())
        .collect();
    loop {
        let mut moved = false;
        for &w in &turn {
            if !budget_left(out.ops) {
                break;
            }
            match step(&mut streams[w], alloc, name, limits)? {
                Step::Done => {
                    out.ops += 1;
                    moved = true;
                }
                Step::NoSpace => {
                    out.ops += 1;
                    out.utilization_at_first_failure = Some(utilization(alloc));
                    moved = false;
                    break;
                }
                Step::Ended => {}
            }
        }
        if !moved {
            out.ops_after_order = out.ops - ordered;
            return Ok(());
        }
    }
}

fn utilization(a: &dyn Allocator) -> f64 {
    a.used() as f64 / a.capacity() as f64
}

/// The stream's next allocation or free, given to the engine.
fn step(
    s: &mut Stream,
    alloc: &mut dyn Allocator,
    engine: &'static str,
    limits: &Limits,
) -> Result<Step, InterleaveError> {
    loop {
        if s.ended {
            return Ok(Step::Ended);
        }
        let Some(op) = s.ops.next() else {
            s.ended = true;
            continue;
        };
        match op {
            Op::Alloc { object, blocks } => {
                return match alloc.allocate(blocks.max(1), None) {
                    Ok(e) => {
                        s.live.insert(object, e);
                        Ok(Step::Done)
                    }
                    Err(AllocError::NoSpace { .. }) => Ok(Step::NoSpace),
                    Err(e) => Err(InterleaveError::Engine {
                        engine,
                        what: format!("allocating {blocks} blocks: {e}"),
                    }),
                };
            }
            Op::Free { object } => {
                let e = s.live.remove(&object).ok_or(InterleaveError::Engine {
                    engine,
                    what: format!("the workload frees object {object}, which is not live"),
                })?;
                alloc.free(e).map_err(|err| InterleaveError::Engine {
                    engine,
                    what: format!("freeing {e:?}: {err}"),
                })?;
                return Ok(Step::Done);
            }
            Op::RoundEnd { .. } => {
                s.rounds += 1;
                if limits.max_rounds.is_some_and(|m| s.rounds >= m) {
                    s.ended = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BenchConfig, Mode};
    use crate::observer::NoObserver;
    use crate::sequential::run_engine;
    use crate::TimerCalibration;
    use crate::WorkloadKind;

    fn device(gib: u64) -> Geometry {
        Geometry::new(gib << 30, 4096).unwrap()
    }

    /// The default engine over `s` on `g`, no limits.
    fn replay(
        s: &WorkloadSpec,
        g: Geometry,
        workers: u32,
        order: &[u32],
        after: After,
    ) -> Interleaved {
        replay_limited(s, g, workers, order, after, Limits::default()).unwrap()
    }

    fn replay_limited(
        s: &WorkloadSpec,
        g: Geometry,
        workers: u32,
        order: &[u32],
        after: After,
        limits: Limits,
    ) -> Result<Interleaved, InterleaveError> {
        let setup = Interleave {
            workers,
            limits,
            ..Interleave::new(*s, g)
        };
        replay_interleaved(&setup, order, after)
    }

    fn spec(round: u64, seed: u64) -> WorkloadSpec {
        let mut s = WorkloadSpec::new(WorkloadKind::Seed);
        s.round_size = round;
        s.seed = seed;
        s
    }

    #[test]
    fn one_worker_in_turn_is_the_plain_run() {
        // One worker and no order is the single stream the runner drives:
        // the same utilisation at the first failure, to the block.
        for seed in 1..=3 {
            let s = spec(300, seed);
            let g = device(1);
            let cfg = BenchConfig {
                geometry: g,
                mode: Mode::Contiguous,
                workload: s,
                limits: Limits::default(),
                verify: false,
            };
            let timer = TimerCalibration::measure();
            let plain = run_engine(BenchEngine::default(), &cfg, timer, &mut NoObserver).unwrap();
            let r = replay(&s, g, 1, &[], After::InTurn { first: 0 });
            assert_eq!(
                r.utilization_at_first_failure,
                plain.utilization_at_first_failure
            );
            assert!(!r.failed_within_order);
        }
    }

    #[test]
    fn the_order_decides_which_stream_goes_first() {
        // Worker 1 runs its whole first round (allocations and frees)
        // before worker 0 starts: a different device from taking turns.
        let s = spec(200, 7);
        let g = device(1);
        let (w1, g1) = s.for_worker(g, 1, 2);
        let mut first = Workload::new(w1, g1);
        let mut round = crate::Round::default();
        assert!(first.next_round(&mut round));
        let n = round.allocs.len() + round.frees.len();
        let order = vec![1; n];
        let ahead = replay(&s, g, 2, &order, After::Stop);
        assert_eq!(ahead.ops, n as u64);
        assert_eq!(ahead.utilization_at_first_failure, None);
        let turns = replay(&s, g, 2, &[], After::InTurn { first: 0 });
        let later = replay(&s, g, 2, &order, After::InTurn { first: 0 });
        // Worker 1's round alone: what it kept, nothing of worker 0's.
        let freed: std::collections::HashSet<u64> = round.frees.iter().copied().collect();
        let kept: u64 = round
            .allocs
            .iter()
            .filter(|a| !freed.contains(&a.object))
            .map(|a| a.blocks.max(1))
            .sum();
        assert_eq!(ahead.used_blocks, kept);
        // Taking turns from the start, both streams fill the device
        // together; letting worker 1 free its first round first changes
        // the device each later request finds.
        assert!(turns.utilization_at_first_failure.is_some());
        assert!(later.utilization_at_first_failure.is_some());
        assert_ne!(
            (turns.ops, turns.used_blocks),
            (later.ops, later.used_blocks)
        );
    }

    #[test]
    fn the_turns_after_the_order_start_with_the_named_worker() {
        let s = spec(200, 5);
        let g = device(1);
        let limits = Limits {
            max_ops: Some(1),
            ..Limits::default()
        };
        for first in 0..3u32 {
            let (w, wg) = s.for_worker(g, first, 3);
            let mut round = crate::Round::default();
            assert!(Workload::new(w, wg).next_round(&mut round));
            let r = replay_limited(&s, g, 3, &[], After::InTurn { first }, limits).unwrap();
            assert_eq!(r.ops_after_order, 1);
            assert_eq!(
                r.used_blocks,
                round.allocs[0].blocks.max(1),
                "worker {first}"
            );
        }
    }

    #[test]
    fn a_request_the_engine_refuses_at_once_is_one_operation_after_the_order() {
        // One worker: the order stops just before the request that fails.
        let s = spec(300, 2);
        let g = device(1);
        let free_run = replay(&s, g, 1, &[], After::InTurn { first: 0 });
        assert!(free_run.utilization_at_first_failure.is_some());
        let before_failure = vec![0; (free_run.ops - 1) as usize];
        let r = replay(&s, g, 1, &before_failure, After::InTurn { first: 0 });
        assert_eq!(r.ops_after_order, 1);
        assert!(!r.failed_within_order);
        assert_eq!(
            r.utilization_at_first_failure,
            free_run.utilization_at_first_failure
        );
        // Two operations earlier, it serves one more before refusing.
        let earlier = vec![0; (free_run.ops - 2) as usize];
        let r = replay(&s, g, 1, &earlier, After::InTurn { first: 0 });
        assert_eq!(r.ops_after_order, 2);
        assert_eq!(r.ops, free_run.ops);
    }

    #[test]
    fn the_metadata_area_is_set_aside_and_counts_as_used() {
        let s = spec(300, 4);
        let g = device(1);
        let meta = Interleave {
            metadata_blocks: 1000,
            workers: 2,
            ..Interleave::new(s, g)
        };
        let r = replay_interleaved(&meta, &[], After::Stop).unwrap();
        assert_eq!(r.used_blocks, 1000);
        // Less room: the same streams fail no later than without it.
        let with = replay_interleaved(&meta, &[], After::InTurn { first: 0 }).unwrap();
        let without = replay(&s, g, 2, &[], After::InTurn { first: 0 });
        assert!(with.ops <= without.ops, "{with:?} {without:?}");
        let too_much = Interleave {
            metadata_blocks: g.capacity_blocks() + 1,
            ..meta
        };
        let e = replay_interleaved(&too_much, &[], After::Stop).unwrap_err();
        assert!(matches!(e, InterleaveError::Engine { .. }), "{e}");
    }

    #[test]
    fn a_bad_order_is_refused() {
        let s = spec(10, 1);
        let g = device(1);
        let e = replay_limited(&s, g, 2, &[0, 2], After::Stop, Limits::default()).unwrap_err();
        assert!(
            matches!(
                e,
                InterleaveError::Order {
                    position: 1,
                    worker: 2,
                    ..
                }
            ),
            "{e}"
        );
        // A stream that ends (a round limit) has no operation left for the order.
        let limits = Limits {
            max_rounds: Some(1),
            ..Limits::default()
        };
        let per_round = 10 + 10; // at most a round's allocations and frees
        let order = vec![0; per_round + 1];
        let e = replay_limited(&s, g, 1, &order, After::Stop, limits).unwrap_err();
        assert!(matches!(e, InterleaveError::Order { worker: 0, .. }), "{e}");
    }

    #[test]
    fn limits_stop_the_replay() {
        let s = spec(100, 3);
        let g = device(1);
        let limits = Limits {
            max_ops: Some(150),
            ..Limits::default()
        };
        let r = replay_limited(&s, g, 4, &[], After::InTurn { first: 0 }, limits).unwrap();
        assert_eq!(r.ops, 150);
        assert_eq!(r.utilization_at_first_failure, None);
        let limits = Limits {
            max_rounds: Some(2),
            ..Limits::default()
        };
        let r = replay_limited(&s, g, 4, &[], After::InTurn { first: 0 }, limits).unwrap();
        assert_eq!(r.utilization_at_first_failure, None);
        assert!(r.ops > 0);
    }
}
