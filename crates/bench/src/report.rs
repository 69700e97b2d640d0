//! [`RunReport`]: the result of one engine run, as a JSON Lines object for
//! machines ([`RunReport::to_json_line`]) and a row of the comparison table
//! for people ([`render_table`]).
//!
//! The JSON fields other tools rely on are [`CONTRACT_FIELDS`] (with
//! [`LATENCY_FIELDS`] inside `alloc_ns` and `free_ns`, and [`ROUND_FIELDS`] in
//! each `per_round` record): they are stable, and the tests of every command
//! that writes a report check against these lists. The other fields are
//! additions.

use std::time::{Duration, Instant};

use blockalloc::{AllocError, BuildError, ErrorClass, FreeError, Geometry, VerifyError};
use serde::Serialize;

use crate::config::{Mode, RoundRecord, StopReason};
use crate::latency::{method_description, LatencySummary, OpLatency, TimerCalibration};
use crate::rss;

/// The top-level fields of a report's JSON that other tools rely on; every
/// report (bench, threads, replay) carries them.
pub const CONTRACT_FIELDS: [&str; 21] = [
    "engine",
    "workload",
    "capacity_bytes",
    "block_size",
    "mode",
    "threads",
    "free_prob",
    "seed",
    "allocations",
    "frees",
    "rounds",
    "stopped",
    "utilization_at_first_failure",
    "alloc_ns",
    "free_ns",
    "alloc_p999_by_fill",
    "ops_per_sec",
    "extents_per_object",
    "allocator_memory_bytes",
    "peak_rss_bytes",
    "per_round",
];

/// The fields of `alloc_ns` and `free_ns` ([`LatencySummary`]).
pub const LATENCY_FIELDS: [&str; 5] = ["mean", "p50", "p99", "p999", "max"];

/// The fields of each `per_round` record ([`RoundRecord`]).
pub const ROUND_FIELDS: [&str; 3] = ["round", "secs", "utilization"];

/// One thread's share of a threaded run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThreadStats {
    /// Thread index, from 0.
    pub thread: u32,
    /// Successful allocations.
    pub allocations: u64,
    /// Objects freed.
    pub frees: u64,
    /// Rounds run.
    pub rounds: u64,
    /// This thread's allocation latency (ns).
    pub alloc_ns: LatencySummary,
    /// This thread's free latency (ns).
    pub free_ns: LatencySummary,
}

/// How the shared handle's locks and slow paths behaved during a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LockReport {
    /// Arena locks taken.
    pub lock_acquisitions: u64,
    /// Of those, taken only after waiting.
    pub lock_waits: u64,
    /// `lock_waits` per allocate or free call.
    pub waits_per_op: f64,
    /// Regions leased from the pool.
    pub leases: u64,
    /// Empty regions handed back to the pool.
    pub hand_backs: u64,
    /// Allocations served outside the caller's arena.
    pub fallbacks: u64,
    /// Full reclaims before a "no space".
    pub reclaims: u64,
    /// Blocks per region (the lease unit) in this run.
    pub region_blocks: u64,
    /// Empty regions an arena kept before handing back (the high-water
    /// mark) in this run.
    pub keep_empty_regions: usize,
}

/// The engine's own account of its space at the end of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct FinalStatus {
    /// Blocks allocated.
    pub used_blocks: u64,
    /// Blocks free.
    pub free_blocks: u64,
    /// Maximal free runs.
    pub free_extents: u64,
    /// Longest free run in blocks.
    pub largest_free_extent: u64,
    /// Fragmentation score in `[0, 1]` (see `blockalloc::fragmentation_score`).
    pub fragmentation: f64,
}

impl From<blockalloc::Status> for FinalStatus {
    fn from(s: blockalloc::Status) -> Self {
        FinalStatus {
            used_blocks: s.used_blocks,
            free_blocks: s.free_blocks,
            free_extents: s.free_extents,
            largest_free_extent: s.largest_free_extent,
            fragmentation: s.fragmentation,
        }
    }
}

/// The packing of a reference engine on the same request stream
/// (`bench --reference best-fit`), carried by every report of the run so
/// that each packing figure stands beside it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReferenceFigure {
    /// The reference engine's name.
    pub engine: String,
    /// Its `used / capacity` when its first allocation failed, `None` if
    /// none did.
    pub utilization_at_first_failure: Option<f64>,
}

/// The result of one engine run. Serialises to the JSON Lines contract.
///
/// Every runner (bench, threads, replay) makes it with the one report
/// builder, from what it measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunReport {
    /// Engine name.
    pub engine: String,
    /// Workload name (`seed`, `shift`).
    pub workload: String,
    /// Device size in bytes (whole blocks).
    pub capacity_bytes: u64,
    /// Block size in bytes.
    pub block_size: u64,
    /// `contiguous` or `scattered`.
    pub mode: Mode,
    /// Threads allocating (1).
    pub threads: u32,
    /// Free probability in force when the run stopped (for `shift`, that of
    /// the phase it stopped in).
    pub free_prob: f64,
    /// Size distribution in force when the run stopped.
    pub sizes: String,
    /// Allocation requests per round.
    pub round_size: u64,
    /// RNG seed of the workload.
    pub seed: u64,
    /// Successful allocations (objects).
    pub allocations: u64,
    /// Objects freed (all their extents).
    pub frees: u64,
    /// `free` calls (extents freed; equals `frees` in contiguous mode).
    pub free_calls: u64,
    /// Rounds run, the last one possibly cut short.
    pub rounds: u64,
    /// Why the run stopped.
    pub stopped: StopReason,
    /// `used / capacity` when the first allocation failed, `None` if none did.
    pub utilization_at_first_failure: Option<f64>,
    /// `used / capacity` at the end.
    pub final_utilization: f64,
    /// Workload phase at the end (`shift` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<u8>,
    /// Allocation latency in ns.
    pub alloc_ns: LatencySummary,
    /// Free latency in ns (per `free` call).
    pub free_ns: LatencySummary,
    /// p99.9 of allocation latency (ns) per fill decile 0–10 %, …, 90–100 %.
    pub alloc_p999_by_fill: Vec<Option<u64>>,
    /// p99.9 of free latency (ns) per fill decile.
    pub free_p999_by_fill: Vec<Option<u64>>,
    /// Allocate and free calls per second of time spent in them.
    pub ops_per_sec: f64,
    /// Extents returned per allocation.
    pub extents_per_object: Option<f64>,
    /// Peak of the engine's `memory_bytes()`, sampled at each round end.
    pub allocator_memory_bytes: u64,
    /// Peak RSS of the process during this engine's run (Linux `VmHWM`).
    pub peak_rss_bytes: Option<u64>,
    /// Seconds from building the engine to the end of the run.
    pub wall_secs: f64,
    /// How latencies were measured.
    pub latency_method: String,
    /// Calibrated cost of an `Instant::now()` pair, subtracted from samples.
    pub timer_overhead_ns: u64,
    /// The engine's `status()` at the end.
    pub final_status: FinalStatus,
    /// One record per round (thread 0's rounds in a threaded run).
    pub per_round: Vec<RoundRecord>,
    /// Per-thread totals and latency (threaded runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub per_thread: Option<Vec<ThreadStats>>,
    /// `ops_per_sec` over that of the 1-thread run of the same invocation
    /// (threaded runs, when `--threads` includes 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_vs_one_thread: Option<f64>,
    /// Which pass over the thread counts this run belongs to, from 0
    /// (`bench --threads … --repeat N`; absent without `--repeat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    /// Lock waits and slow paths of the shared handle (threaded runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub locks: Option<LockReport>,
    /// The reference engine's packing on the same stream (`--reference`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<ReferenceFigure>,
}

/// What a report says about a run besides its measurements.
#[derive(Clone, Debug)]
pub(crate) struct RunLabels {
    pub(crate) engine: String,
    pub(crate) workload: String,
    pub(crate) sizes: String,
    pub(crate) free_prob: f64,
    pub(crate) round_size: u64,
    pub(crate) seed: u64,
    pub(crate) geometry: Geometry,
    pub(crate) mode: Mode,
    pub(crate) threads: u32,
    /// Workload phase at the end, for workloads with phases.
    pub(crate) phase: Option<u8>,
}

/// What a run measured.
#[derive(Debug)]
pub(crate) struct Measured {
    pub(crate) alloc_lat: OpLatency,
    pub(crate) free_lat: OpLatency,
    /// Objects allocated and freed, and extents handed out.
    pub(crate) allocations: u64,
    pub(crate) frees: u64,
    pub(crate) extents: u64,
    /// One record per round (thread 0's in a threaded run).
    pub(crate) per_round: Vec<RoundRecord>,
    /// Peak of the engine's `memory_bytes()`.
    pub(crate) peak_memory: usize,
    /// `used / capacity` when the first allocation failed.
    pub(crate) failure_utilization: Option<f64>,
    /// When the engine was built.
    pub(crate) started: Instant,
}

impl Measured {
    /// Nothing measured yet, for a run that starts now.
    pub(crate) fn new(timer: TimerCalibration, started: Instant) -> Self {
        Measured {
            alloc_lat: OpLatency::new(timer),
            free_lat: OpLatency::new(timer),
            allocations: 0,
            frees: 0,
            extents: 0,
            per_round: Vec::new(),
            peak_memory: 0,
            failure_utilization: None,
            started,
        }
    }
}

/// What `ops_per_sec` divides the calls by.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Throughput {
    /// The time spent in the engine's calls (the timed loops).
    Busy,
    /// Wall-clock time of the parallel part of a threaded run.
    Wall(Duration),
}

impl RunReport {
    /// The report of a run that stopped for `stopped`, with the engine's
    /// `status` at the end.
    pub(crate) fn build(
        labels: RunLabels,
        m: Measured,
        stopped: StopReason,
        status: blockalloc::Status,
        timer: TimerCalibration,
        throughput: Throughput,
    ) -> RunReport {
        let ops = m.alloc_lat.ops() + m.free_lat.ops();
        let ops_per_sec = match throughput {
            Throughput::Busy => {
                let busy = m.alloc_lat.busy() + m.free_lat.busy();
                if busy.is_zero() {
                    0.0
                } else {
                    ops as f64 / busy.as_secs_f64()
                }
            }
            Throughput::Wall(parallel) => ops as f64 / parallel.as_secs_f64().max(1e-9),
        };
        RunReport {
            engine: labels.engine,
            workload: labels.workload,
            capacity_bytes: labels.geometry.capacity_bytes(),
            block_size: labels.geometry.block_size(),
            mode: labels.mode,
            threads: labels.threads,
            free_prob: labels.free_prob,
            sizes: labels.sizes,
            round_size: labels.round_size,
            seed: labels.seed,
            allocations: m.allocations,
            frees: m.frees,
            free_calls: m.free_lat.ops(),
            rounds: m.per_round.len() as u64,
            stopped,
            utilization_at_first_failure: m.failure_utilization,
            final_utilization: status.utilization(),
            phase: labels.phase,
            alloc_ns: m.alloc_lat.summary(),
            free_ns: m.free_lat.summary(),
            alloc_p999_by_fill: m.alloc_lat.p999_by_fill(),
            free_p999_by_fill: m.free_lat.p999_by_fill(),
            ops_per_sec,
            extents_per_object: (m.allocations > 0)
                .then(|| m.extents as f64 / m.allocations as f64),
            allocator_memory_bytes: m.peak_memory as u64,
            peak_rss_bytes: rss::peak_rss_bytes(),
            wall_secs: m.started.elapsed().as_secs_f64(),
            latency_method: method_description(timer),
            timer_overhead_ns: timer.pair_ns,
            final_status: FinalStatus::from(status),
            per_round: m.per_round,
            per_thread: None,
            speedup_vs_one_thread: None,
            repeat: None,
            locks: None,
            reference: None,
        }
    }

    /// The report as one line of JSON (no trailing newline).
    pub fn to_json_line(&self) -> String {
        serde_json::to_string(self).expect("a report always serialises")
    }
}

/// Bytes as `12.3 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut x = n as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < UNITS.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", UNITS[i])
    }
}

/// `x` with three significant digits (at most 9 decimals), so that slow
/// engines do not all print as `0.00`.
pub(crate) fn three_digits(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let decimals = (2 - x.abs().log10().floor() as i32).clamp(0, 9) as usize;
    format!("{x:.decimals$}")
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The comparison table of several runs, plain aligned text, one row per
/// run, with a trailing newline. When the runs carry a reference figure, a
/// last column shows its utilisation at the first failure.
pub fn render_table(reports: &[RunReport]) -> String {
    let reference = reports
        .iter()
        .find_map(|r| r.reference.as_ref())
        .map(|f| format!("{} util@fail", f.engine));
    const HEAD: [&str; 17] = [
        "engine",
        "stopped",
        "util@fail",
        "rounds",
        "allocs",
        "alloc p50",
        "p99",
        "p99.9",
        "free p50",
        "p99.9",
        "Mops/s",
        "engine mem",
        "peak RSS",
        "ext/obj",
        "frag",
        "wall s",
        "util end",
    ];
    let mut head: Vec<&str> = HEAD.to_vec();
    if let Some(h) = &reference {
        head.push(h);
    }
    let rows: Vec<Vec<String>> = reports
        .iter()
        .map(|r| {
            let mut row = vec![
                if r.threads > 1 || r.per_thread.is_some() {
                    format!("{} x{}", r.engine, r.threads)
                } else {
                    r.engine.clone()
                },
                r.stopped.to_string(),
                opt(r
                    .utilization_at_first_failure
                    .map(|u| format!("{:.3}%", u * 100.0))),
                r.rounds.to_string(),
                r.allocations.to_string(),
                opt(r.alloc_ns.p50),
                opt(r.alloc_ns.p99),
                opt(r.alloc_ns.p999),
                opt(r.free_ns.p50),
                opt(r.free_ns.p999),
                three_digits(r.ops_per_sec / 1e6),
                crate::units::bytes(r.allocator_memory_bytes),
                opt(r.peak_rss_bytes.map(crate::units::bytes)),
                opt(r.extents_per_object.map(|x| format!("{x:.3}"))),
                format!("{:.3}", r.final_status.fragmentation),
                format!("{:.1}", r.wall_secs),
                format!("{:.3}%", r.final_utilization * 100.0),
            ];
            if reference.is_some() {
                row.push(opt(r.reference.as_ref().and_then(|f| {
                    f.utilization_at_first_failure
                        .map(|u| format!("{:.3}%", u * 100.0))
                })));
            }
            row
        })
        .collect();
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i == 0 {
                s.push_str(&format!("{cell:<w$}"));
            } else {
                s.push_str(&format!("  {cell:>w$}"));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(&mut head.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
    out.push_str(
        "latencies in ns (p50/p99/p99.9 from 1-in-16 samples); Mops/s = alloc+free calls per second spent in them\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(human_bytes(2 << 40), "2.0 TiB");
    }

    #[test]
    fn three_significant_digits() {
        assert_eq!(three_digits(12.471), "12.5");
        assert_eq!(three_digits(6.041), "6.04");
        assert_eq!(three_digits(0.004913), "0.00491");
        assert_eq!(three_digits(1234.5), "1234");
        assert_eq!(three_digits(0.0), "0");
    }
}

/// A run that could not complete.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The engine cannot serve this device (e.g. too large): skip it.
    #[error("{engine} skipped: {source}")]
    Build {
        /// Engine name.
        engine: &'static str,
        /// Why it could not be built.
        source: BuildError,
    },
    /// The thread-safe handle refused its configuration for this device.
    #[error("{engine} skipped: {source}")]
    Config {
        /// Engine name.
        engine: &'static str,
        /// Why the configuration does not fit.
        source: blockalloc_shared::ConfigError,
    },
    /// `verify()` found a broken invariant.
    #[error("{engine} failed verification after round {round}: {source}")]
    Verify {
        /// Engine name.
        engine: &'static str,
        /// Last round run.
        round: u64,
        /// What broke.
        source: VerifyError,
    },
    /// An allocation failed other than for lack of space.
    #[error("{engine}: allocating {blocks} blocks failed unexpectedly: {source}")]
    Alloc {
        /// Engine name.
        engine: &'static str,
        /// Blocks requested.
        blocks: u64,
        /// The engine's error.
        source: AllocError,
    },
    /// The engine refused to free an extent it had handed out.
    #[error("{engine}: freeing an extent it had allocated failed: {source}")]
    Free {
        /// Engine name.
        engine: &'static str,
        /// The engine's error.
        source: FreeError,
    },
    /// The run cannot be done this way (e.g. this workload with threads).
    #[error("unsupported: {what}")]
    Unsupported {
        /// What is not supported.
        what: &'static str,
    },
    /// The workload freed an object that is not live.
    #[error("workload frees object {object}, which is not live")]
    UnknownObject {
        /// The object id.
        object: u64,
    },
}

impl RunError {
    /// True when the engine was skipped (could not be built for this device)
    /// rather than found faulty.
    pub fn is_skip(&self) -> bool {
        matches!(
            self,
            RunError::Build { .. } | RunError::Config { .. } | RunError::Unsupported { .. }
        )
    }

    /// What kind of failure this is: that of the engine's refusal to be
    /// built, [`ErrorClass::InvalidInput`] for a run that cannot be done
    /// this way, [`ErrorClass::Bug`] when the engine (or the workload)
    /// misbehaved.
    pub fn class(&self) -> ErrorClass {
        match self {
            RunError::Build { source, .. } => source.class(),
            RunError::Config { source, .. } => source.class(),
            RunError::Unsupported { .. } => ErrorClass::InvalidInput,
            RunError::Verify { .. }
            | RunError::Alloc { .. }
            | RunError::Free { .. }
            | RunError::UnknownObject { .. } => ErrorClass::Bug,
        }
    }
}
