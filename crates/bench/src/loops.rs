//! The timed loops every runner shares — the bench runner, threaded runs
//! and trace replay — so that their latencies mean the same thing.
//!
//! [`timed_allocs`] and [`timed_frees`] run a batch of calls as one timed
//! loop, 1 call in [`SAMPLE_STRIDE`] timed on its own (see
//! [`crate::latency`]), in chunks of [`CHECK_EVERY`] calls; between chunks
//! the caller's hooks check limits and report progress. What differs between
//! runners is outside the loops: which engine ([`Target`]), how the fill level
//! that files the samples is read ([`Fill`]), and the hooks. [`Clock`] keeps
//! the time limit and the progress ticks of a run; [`budget`] and
//! [`limit_before`] are the limits checked outside the loops.

use std::time::{Duration, Instant};

use blockalloc::{AllocError, Allocator, Extent, FreeError};
use blockalloc_shared::SharedAllocator;

use crate::config::{Limits, Mode, StopReason};
use crate::latency::{duration_ns, fill_bucket, RawSample, SAMPLE_STRIDE};

/// Limits are checked (and progress reported) every this many operations.
pub(crate) const CHECK_EVERY: usize = 256;

/// How often, at most, progress ticks are sent.
const TICK_INTERVAL: Duration = Duration::from_millis(200);

/// What the timed loops call: one engine, or the thread-safe handle shared
/// by threads.
pub(crate) trait Target {
    /// One allocation in `mode`, its extents appended to `got`; in scattered
    /// mode `ends` then gets `got.len()`, whether the call succeeded or not,
    /// so that request `i`'s extents are `got[ends[i-1]..ends[i]]`.
    fn allocate(
        &mut self,
        mode: Mode,
        blocks: u64,
        got: &mut Vec<Extent>,
        ends: &mut Vec<usize>,
    ) -> Result<(), AllocError>;
    /// Frees one extent.
    fn free(&mut self, extent: Extent) -> Result<(), FreeError>;
    /// Blocks allocated now.
    fn used(&self) -> u64;
}

/// [`Target`] for an engine type whose own calls are `$api::allocate`,
/// `$api::free` and `$api::used` (the `Allocator` trait's, or the shared
/// handle's), with the same bookkeeping.
macro_rules! target {
    ($engine:ty, $api:ident) => {
        impl Target for $engine {
            #[inline(always)]
            fn allocate(
                &mut self,
                mode: Mode,
                blocks: u64,
                got: &mut Vec<Extent>,
                ends: &mut Vec<usize>,
            ) -> Result<(), AllocError> {
                match mode {
                    Mode::Contiguous => got.push($api::allocate(self, blocks, None)?),
                    Mode::Scattered => {
                        let r = self.allocate_scattered(blocks, got);
                        ends.push(got.len());
                        r?;
                    }
                }
                Ok(())
            }

            #[inline(always)]
            fn free(&mut self, extent: Extent) -> Result<(), FreeError> {
                $api::free(self, extent)
            }

            #[inline(always)]
            fn used(&self) -> u64 {
                $api::used(self)
            }
        }
    };
}

target!(dyn Allocator, Allocator);
target!(&SharedAllocator, SharedAllocator);

/// How the fill level that files each latency sample is read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fill {
    /// Read from the engine before each sampled call (device of this many
    /// blocks).
    EachSample(u64),
    /// Read once by the caller for the whole loop: reading it from the
    /// shared handle sums counters other threads keep writing.
    Fixed(u8),
}

impl Fill {
    #[inline(always)]
    fn bucket<T: Target + ?Sized>(self, engine: &T) -> u8 {
        match self {
            Fill::EachSample(capacity) => fill_bucket(engine.used(), capacity),
            Fill::Fixed(bucket) => bucket,
        }
    }
}

/// How a [`timed_allocs`] loop ended.
#[derive(Debug)]
pub(crate) struct AllocBatch {
    /// Calls made (a prefix of the requests), failed ones included.
    pub(crate) attempted: usize,
    /// Calls refused for lack of space, by index.
    pub(crate) no_space: Vec<usize>,
    /// Blocks used when the first call was refused for lack of space.
    pub(crate) used_at_first_no_space: Option<u64>,
    /// A call that failed other than for lack of space (index, blocks,
    /// error); the loop stopped there.
    pub(crate) failed: Option<(usize, u64, AllocError)>,
    /// Why the loop stopped early: a hook's reason, or `NoSpace`.
    pub(crate) stop: Option<StopReason>,
    /// Time of the loop, timer overhead not yet removed.
    pub(crate) elapsed: Duration,
}

impl AllocBatch {
    /// Calls that succeeded.
    pub(crate) fn done(&self) -> usize {
        self.attempted - self.no_space.len() - usize::from(self.failed.is_some())
    }
}

/// Allocates `n` requests, request `i` of `blocks(i)` blocks, in `mode`,
/// extents appended to `got` (and `ends`, see [`Target::allocate`]), samples
/// to `samples` (all three cleared first).
///
/// A refusal for lack of space stops the loop (`NoSpace`) unless
/// `keep_going`. `before_chunk(len)` runs before each chunk of up to
/// [`CHECK_EVERY`] calls and `after_chunk(attempted, used)` after each;
/// either stops the loop by returning a reason.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn timed_allocs<T: Target + ?Sized>(
    engine: &mut T,
    mode: Mode,
    n: usize,
    blocks: impl Fn(usize) -> u64,
    keep_going: bool,
    fill: Fill,
    got: &mut Vec<Extent>,
    ends: &mut Vec<usize>,
    samples: &mut Vec<RawSample>,
    mut before_chunk: impl FnMut(usize) -> Option<StopReason>,
    mut after_chunk: impl FnMut(usize, u64) -> Option<StopReason>,
) -> AllocBatch {
    samples.clear();
    got.clear();
    ends.clear();
    let mut batch = AllocBatch {
        attempted: 0,
        no_space: Vec::new(),
        used_at_first_no_space: None,
        failed: None,
        stop: None,
        elapsed: Duration::ZERO,
    };
    let t0 = Instant::now();
    'chunks: for from in (0..n).step_by(CHECK_EVERY) {
        let to = (from + CHECK_EVERY).min(n);
        if let Some(s) = before_chunk(to - from) {
            batch.stop = Some(s);
            break;
        }
        for i in from..to {
            let b = blocks(i);
            let result = if (i - from) % SAMPLE_STRIDE == 0 {
                let fill = fill.bucket(engine);
                let t = Instant::now();
                let r = engine.allocate(mode, b, got, ends);
                let raw_ns = duration_ns(t.elapsed());
                samples.push(RawSample { raw_ns, fill });
                r
            } else {
                engine.allocate(mode, b, got, ends)
            };
            batch.attempted += 1;
            match result {
                Ok(()) => {}
                Err(AllocError::NoSpace { .. }) => {
                    if batch.used_at_first_no_space.is_none() {
                        batch.used_at_first_no_space = Some(engine.used());
                    }
                    batch.no_space.push(i);
                    if !keep_going {
                        batch.stop = Some(StopReason::NoSpace);
                        break 'chunks;
                    }
                }
                Err(e) => {
                    batch.failed = Some((i, b, e));
                    break 'chunks;
                }
            }
        }
        if let Some(s) = after_chunk(batch.attempted, engine.used()) {
            batch.stop = Some(s);
            break;
        }
    }
    batch.elapsed = t0.elapsed();
    batch
}

/// What [`timed_frees`] did.
#[derive(Debug)]
pub(crate) struct FreeBatch {
    /// Extents freed (a prefix of the input).
    pub(crate) done: usize,
    /// The engine's refusal of the next extent, if it refused one.
    pub(crate) failed: Option<FreeError>,
    /// Why the loop stopped early, if `between_chunks` said so.
    pub(crate) stop: Option<StopReason>,
    /// Time of the loop, timer overhead not yet removed.
    pub(crate) elapsed: Duration,
}

/// Frees `extents` in order, samples to `samples` (cleared first), and
/// calls `between_chunks(used)` every [`CHECK_EVERY`] frees (progress, time
/// limit; returning a reason stops the loop). Stops at the first refusal.
#[inline(always)]
pub(crate) fn timed_frees<T: Target + ?Sized>(
    engine: &mut T,
    extents: &[Extent],
    fill: Fill,
    samples: &mut Vec<RawSample>,
    mut between_chunks: impl FnMut(u64) -> Option<StopReason>,
) -> FreeBatch {
    samples.clear();
    let (mut done, mut failed, mut stop) = (0, None, None);
    let t0 = Instant::now();
    'chunks: for chunk in extents.chunks(CHECK_EVERY) {
        for (j, &e) in chunk.iter().enumerate() {
            let result = if j % SAMPLE_STRIDE == 0 {
                let fill = fill.bucket(engine);
                let t = Instant::now();
                let r = engine.free(e);
                let raw_ns = duration_ns(t.elapsed());
                samples.push(RawSample { raw_ns, fill });
                r
            } else {
                engine.free(e)
            };
            if let Err(source) = result {
                failed = Some(source);
                break 'chunks;
            }
            done += 1;
        }
        if done < extents.len() {
            if let Some(s) = between_chunks(engine.used()) {
                stop = Some(s);
                break;
            }
        }
    }
    FreeBatch {
        done,
        failed,
        stop,
        elapsed: t0.elapsed(),
    }
}

/// An object's extents in a runner's map of live objects: one extent
/// inline, several boxed.
#[derive(Debug)]
pub(crate) enum Held {
    One(Extent),
    Many(Box<[Extent]>),
}

impl Held {
    /// Holds `extents` (at least one).
    pub(crate) fn new(extents: &[Extent]) -> Self {
        match extents {
            [one] => Held::One(*one),
            many => Held::Many(many.into()),
        }
    }

    /// The extents held.
    pub(crate) fn extents(&self) -> &[Extent] {
        match self {
            Held::One(e) => std::slice::from_ref(e),
            Held::Many(v) => v,
        }
    }
}

/// A run's time limit and progress ticks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    deadline: Option<Instant>,
    next_tick: Instant,
}

impl Clock {
    /// The clock of a run started at `started` with an optional time limit.
    pub(crate) fn new(started: Instant, limit: Option<Duration>) -> Self {
        Clock {
            deadline: limit.and_then(|d| started.checked_add(d)),
            next_tick: started + TICK_INTERVAL,
        }
    }

    /// Between chunks: calls `tick` when a tick is due (at most every
    /// 200 ms), and says `TimeLimit` once the deadline has passed.
    #[inline]
    pub(crate) fn check(&mut self, tick: impl FnOnce()) -> Option<StopReason> {
        let now = Instant::now();
        if now >= self.next_tick {
            self.next_tick = now + TICK_INTERVAL;
            tick();
        }
        self.deadline
            .is_some_and(|d| now >= d)
            .then_some(StopReason::TimeLimit)
    }

    /// True once the deadline has passed.
    pub(crate) fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// Operations allowed out of `n` with `left` still allowed by `max_ops`, and
/// the stop to report if cut.
pub(crate) fn budget(left: u64, n: usize) -> (usize, Option<StopReason>) {
    match usize::try_from(left) {
        Ok(left) if left < n => (left, Some(StopReason::MaxOps)),
        _ => (n, None),
    }
}

/// The limits checked before a round (or a batch of a trace): `max_rounds`
/// after `rounds` rounds, `max_ops` with `ops_left` operations left, the
/// time limit.
pub(crate) fn limit_before(
    limits: &Limits,
    rounds: usize,
    ops_left: u64,
    clock: &Clock,
) -> Option<StopReason> {
    if limits.max_rounds.is_some_and(|m| rounds as u64 >= m) {
        return Some(StopReason::MaxRounds);
    }
    if ops_left == 0 {
        return Some(StopReason::MaxOps);
    }
    clock.expired().then_some(StopReason::TimeLimit)
}

/// The extents request `i` of a [`timed_allocs`] loop received, when it was
/// the loop's `success`-th successful call (from 0): in contiguous mode
/// refused calls add nothing to `got`.
#[inline]
pub(crate) fn extents_of<'a>(
    mode: Mode,
    got: &'a [Extent],
    ends: &[usize],
    i: usize,
    success: usize,
) -> &'a [Extent] {
    match mode {
        Mode::Contiguous => std::slice::from_ref(&got[success]),
        Mode::Scattered => {
            let from = if i == 0 { 0 } else { ends[i - 1] };
            &got[from..ends[i]]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockalloc::EngineKind;

    fn engine(capacity: u64) -> Box<dyn Allocator> {
        crate::engines::BenchEngine::Core(EngineKind::ALL[0])
            .build(capacity)
            .unwrap()
    }

    /// Refusals for lack of space stop the loop, or with `keep_going` are
    /// listed and skipped; either way each request's extents are found.
    #[test]
    fn allocation_loop_stops_or_goes_on_at_no_space() {
        for mode in [Mode::Contiguous, Mode::Scattered] {
            for keep_going in [false, true] {
                let mut e = engine(100);
                let blocks = [40, 40, 40, 10, 5];
                let (mut got, mut ends, mut samples) = (Vec::new(), Vec::new(), Vec::new());
                let b = timed_allocs(
                    &mut *e,
                    mode,
                    blocks.len(),
                    |i| blocks[i],
                    keep_going,
                    Fill::EachSample(100),
                    &mut got,
                    &mut ends,
                    &mut samples,
                    |_| None,
                    |_, _| None,
                );
                assert_eq!(b.no_space, vec![2]);
                assert_eq!(b.used_at_first_no_space, Some(80));
                if keep_going {
                    assert_eq!((b.attempted, b.done(), b.stop), (5, 4, None));
                    let last = extents_of(mode, &got, &ends, 4, 3);
                    assert_eq!(last.iter().map(|x| x.len()).sum::<u64>(), 5);
                } else {
                    assert_eq!(
                        (b.attempted, b.done(), b.stop),
                        (3, 2, Some(StopReason::NoSpace))
                    );
                }
                let second = extents_of(mode, &got, &ends, 1, 1);
                assert_eq!(second.iter().map(|x| x.len()).sum::<u64>(), 40);
            }
        }
    }

    /// A hook's reason ends the loop between chunks.
    #[test]
    fn hooks_stop_the_loops_between_chunks() {
        let mut e = engine(1 << 20);
        let n = 3 * CHECK_EVERY;
        let (mut got, mut ends, mut samples) = (Vec::new(), Vec::new(), Vec::new());
        let b = timed_allocs(
            &mut *e,
            Mode::Contiguous,
            n,
            |_| 1,
            false,
            Fill::Fixed(0),
            &mut got,
            &mut ends,
            &mut samples,
            |_| None,
            |attempted, _| (attempted >= 2 * CHECK_EVERY).then_some(StopReason::TimeLimit),
        );
        assert_eq!(
            (b.attempted, b.stop),
            (2 * CHECK_EVERY, Some(StopReason::TimeLimit))
        );
        assert_eq!(samples.len(), 2 * CHECK_EVERY / SAMPLE_STRIDE);
        let f = timed_frees(&mut *e, &got, Fill::Fixed(0), &mut samples, |_| {
            Some(StopReason::MaxOps)
        });
        assert_eq!((f.done, f.stop), (CHECK_EVERY, Some(StopReason::MaxOps)));
        assert_eq!(e.used(), CHECK_EVERY as u64);
    }
}
