//! # blockalloc-bench
//!
//! The benchmark harness behind `blockalloc bench` and `blockalloc replay`: it runs
//! [`blockalloc`] engines (and, with the `peers` feature, other crates'
//! allocators) one after another over the identical, deterministic request
//! stream and reports utilisation at the first failure, latency, throughput
//! and memory.
//!
//! * [`sizes`] — object size distributions (`uniform:1B..4MiB`, …).
//! * [`workload`] — engine-independent generators of rounds / [`Op`]s
//!   (`seed`, `shift`, `fill-shift`, `aging`).
//! * [`bestfit`] — `best-fit`, the plain best fit every packing figure
//!   can be shown beside (`--reference best-fit`).
//! * [`runner`] — drives one engine through a workload and measures it.
//! * [`latency`] — how latency is measured (below).
//! * [`report`] — the JSON Lines record and the comparison table.
//! * [`rss`] — peak resident memory from the OS.
//! * [`progress`] — progress bar and per-round lines for people.
//! * `peers` — adapters over `offset-allocator` and `range-alloc`.
//! * [`replay`](mod@replay) — replays a trace (the `blockalloc-trace` format)
//!   through an engine, measured like a bench run; [`verify`] writes each
//!   object's pattern to a device file and checks it before every free.
//! * [`gen`] — the workloads written as traces without an engine;
//!   [`record`] — `bench --record`, a bench run's stream as a trace.
//! * [`plot`] — SVG plots of reports (utilisation and time per round).
//!
//! ## How latency is measured
//!
//! An allocation costs tens of nanoseconds, about the cost of the
//! `Instant::now()` pair that would time it, so not every operation is timed.
//! Each round's allocation loop and free loop are timed as wholes, and
//! `mean = loop time / operations`. One operation in
//! [`SAMPLE_STRIDE`] (16; a fixed stride) is timed on its own with an
//! `Instant::now()` pair; the cost of an empty pair, calibrated at start-up
//! (median of 20 001), is subtracted from each sample and from the loop times,
//! and the samples feed an HDR histogram for p50, p99, p99.9 and max, plus
//! one histogram per fill decile (`alloc_p999_by_fill`).
//!
//! ## Example
//!
//! ```
//! use blockalloc::Geometry;
//! use blockalloc_bench::{
//!     run_engine, BenchConfig, BenchEngine, Limits, Mode, NoObserver, StopReason,
//!     TimerCalibration, WorkloadSpec,
//! };
//!
//! let config = BenchConfig {
//!     geometry: Geometry::parse("1GiB", "4KiB")?,
//!     mode: Mode::Contiguous,
//!     workload: WorkloadSpec { round_size: 1000, ..WorkloadSpec::default() },
//!     limits: Limits::default(),
//!     verify: false,
//! };
//! let timer = TimerCalibration::measure();
//! let report = run_engine(BenchEngine::default(), &config, timer, &mut NoObserver)?;
//! assert_eq!(report.stopped, StopReason::NoSpace);
//! assert!(report.utilization_at_first_failure.unwrap() > 0.9);
//! let line = report.to_json_line(); // one JSON Lines record
//! assert!(line.starts_with("{\"engine\":\"segfit\""));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bestfit;
pub mod compacting;
pub mod durable;
pub mod engines;
pub mod gen;
pub mod latency;
#[cfg(feature = "peers")]
pub mod peers;
pub mod plot;
pub mod progress;
pub mod record;
pub mod replay;
mod replay_progress;
pub mod report;
pub mod rss;
pub mod run;
pub mod runner;
pub mod sizes;
pub mod summary;
pub mod threads;
mod timed;
pub mod units;
pub mod verify;
pub mod workload;

pub use blockalloc_shared::SharedConfig;
pub use engines::{BenchEngine, EngineListError, PEER_NAMES};
pub use gen::{generate, ChurnSpec, GenEnd, GenOutcome, GenSpec, GenWorkload, UnknownGenWorkload};
pub use latency::{LatencySummary, TimerCalibration, SAMPLE_STRIDE};
pub use plot::{render_svg, write_svg, PlotError, PlotSeries, PlotSpec};
pub use progress::{HumanProgress, Stream};
pub use record::{bench_header, Recorder};
pub use replay::{replay, replay_engine, ReplayConfig, ReplayError, ReplayReport, TraceInfo};
pub use replay_progress::ReplayProgress;
pub use report::{
    render_table, FinalStatus, LockReport, ReferenceFigure, RunReport, ThreadStats,
    CONTRACT_FIELDS, LATENCY_FIELDS, ROUND_FIELDS,
};
pub use run::{BenchConfig, Limits, Mode, RoundRecord, StopReason, UnknownMode};
pub use runner::{run_engine, NoObserver, Observer, Position, RoundProgress, RunError};
pub use sizes::{SizeSampler, SizeSpec, SizeSpecError, MAX_OBJECT_BYTES};
pub use threads::{run_threads, run_threads_with};
pub use verify::{CheckError, DataCheckStats, FoundData, Mismatch, PatternDevice};
pub use workload::{
    AgingSpec, AgingSpecError, Op, Round, UnknownWorkload, Workload, WorkloadInfo, WorkloadKind,
    WorkloadSpec, WORKLOADS,
};
