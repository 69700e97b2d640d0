//! The configuration of a run and the words its results use, shared by
//! every driver (one engine, threads, trace replay) and their reports: how objects are allocated ([`Mode`]), when to
//! stop ([`Limits`]), why a run stopped ([`StopReason`]), the bench's
//! configuration ([`BenchConfig`]) and the record of one round
//! ([`RoundRecord`]).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use blockalloc::Geometry;
use serde::Serialize;

use crate::engines::BenchEngine;
use crate::workload::WorkloadSpec;

/// How objects are allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One extent per object: `allocate(blocks, None)`.
    #[default]
    Contiguous,
    /// Any number of extents per object: `allocate_scattered`.
    Scattered,
}

impl Mode {
    /// The name used by `--mode` and in JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Contiguous => "contiguous",
            Mode::Scattered => "scattered",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown `--mode` name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown mode {0:?} (known: contiguous, scattered)")]
pub struct UnknownMode(pub String);

blockalloc::invalid_input_errors!(UnknownMode);

impl FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "contiguous" => Ok(Mode::Contiguous),
            "scattered" => Ok(Mode::Scattered),
            _ => Err(UnknownMode(s.to_string())),
        }
    }
}

/// When to stop a run that has not run out of space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Stop after this many whole rounds.
    pub max_rounds: Option<u64>,
    /// Stop after this many operations (allocate and free calls).
    pub max_ops: Option<u64>,
    /// Stop after this much time (per engine).
    pub time_limit: Option<Duration>,
}

/// Why a run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An allocation failed.
    NoSpace,
    /// `max_rounds` rounds were run.
    MaxRounds,
    /// `max_ops` operations were run.
    MaxOps,
    /// The time limit passed.
    TimeLimit,
    /// A replayed trace ran out of operations (`blockalloc replay`).
    EndOfTrace,
    /// The workload's stream ended (`churn`, after its volume).
    EndOfWorkload,
}

impl StopReason {
    /// The name used in JSON and tables.
    pub const fn name(self) -> &'static str {
        match self {
            StopReason::NoSpace => "no_space",
            StopReason::MaxRounds => "max_rounds",
            StopReason::MaxOps => "max_ops",
            StopReason::TimeLimit => "time_limit",
            StopReason::EndOfTrace => "end_of_trace",
            StopReason::EndOfWorkload => "end_of_workload",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything a bench run needs except the engine.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BenchConfig {
    /// The device.
    pub geometry: Geometry,
    /// Contiguous or scattered allocation.
    pub mode: Mode,
    /// The request stream.
    pub workload: WorkloadSpec,
    /// When to stop early.
    pub limits: Limits,
    /// Call `verify()` after every round (slow).
    pub verify: bool,
}

/// One round in the report.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct RoundRecord {
    /// Round number, from 1.
    pub round: u64,
    /// Seconds of the round's allocation and free loops.
    pub secs: f64,
    /// `used / capacity` at the end of the round.
    pub utilization: f64,
    /// Workload phase (shift workload only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<u8>,
}

/// The engines of a bench in the order they run: `reference` first, so
/// that every report after it can carry its figure, then `engines` in
/// their order, the reference left out.
pub fn run_order(engines: &[BenchEngine], reference: Option<BenchEngine>) -> Vec<BenchEngine> {
    reference
        .into_iter()
        .chain(engines.iter().copied().filter(|&e| Some(e) != reference))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_runs_first_and_once() {
        let (seg, best) = (BenchEngine::default(), BenchEngine::BestFit);
        assert_eq!(run_order(&[seg], None), [seg]);
        assert_eq!(run_order(&[seg], Some(best)), [best, seg]);
        assert_eq!(run_order(&[seg, best], Some(best)), [best, seg]);
        assert_eq!(run_order(&[best], Some(best)), [best]);
    }
}
