//! The [`Observer`] every run reports to as it goes (progress displays, the
//! recorder), and what it hears.

use std::time::Duration;

use crate::config::RoundRecord;
use crate::report::{RunError, RunReport};

/// What an observer hears at the end of each round.
#[derive(Clone, Copy, Debug)]
pub struct RoundProgress<'a> {
    /// Engine name.
    pub engine: &'a str,
    /// The round's record, as in the report.
    pub record: &'a RoundRecord,
    /// Allocations done in the round.
    pub allocs: u64,
    /// Objects freed in the round.
    pub frees: u64,
    /// Time of the allocation loop.
    pub alloc_secs: f64,
    /// Time of the free loop.
    pub free_secs: f64,
    /// Time since the engine was built.
    pub elapsed: Duration,
    /// Requests done so far: allocate and free calls of a bench run,
    /// operations of a replayed trace.
    pub requests: u64,
}

/// How far a run is, as a tick reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// The round running, from 1 (0 when the runner does not say: threaded
    /// runs).
    pub round: u64,
    /// Requests done so far, as in [`RoundProgress::requests`].
    pub requests: u64,
}

/// Receives progress from a run (progress bars, logs, the recorder): the
/// one observer of bench runs (`Observer`, of [`RunReport`]s) and replays
/// (`Observer<ReplayReport, ReplayError>`). Every method has an empty
/// default.
pub trait Observer<R = RunReport, E = RunError> {
    /// An engine is about to be built, for a run of `total_requests`
    /// requests when that is known (a scanned trace).
    fn engine_started(&mut self, _engine: &str, _total_requests: Option<u64>) {}
    /// Called at most every 200 ms inside long rounds.
    fn tick(&mut self, _engine: &str, _at: Position, _utilization: f64) {}
    /// A round ended (possibly cut short by the end of the run).
    fn round_finished(&mut self, _progress: &RoundProgress<'_>) {}
    /// The engine's run ended.
    fn engine_finished(&mut self, _engine: &str, _outcome: Result<&R, &E>) {}
}

/// An observer that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoObserver;

impl<R, E> Observer<R, E> for NoObserver {}
