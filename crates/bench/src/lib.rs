//! # blockalloc-bench
//!
//! The benchmark harness behind `blockalloc bench` and `blockalloc replay`: it runs
//! [`blockalloc`] engines (and, with the `peers` feature, other crates'
//! allocators) one after another over the identical, deterministic request
//! stream and reports utilisation at the first failure, latency, throughput
//! and memory.
//!
//! * Workloads: [`WORKLOADS`], the registry every command reads (name,
//!   help, sizes, shape); [`WorkloadSpec`] and [`Workload`], the
//!   engine-independent, deterministic stream of [`Round`]s; [`SizeSpec`],
//!   object size distributions (`uniform:1B..4MiB`, …).
//! * Runs (the drivers): [`run_engine`] drives one engine through a
//!   workload on one thread, [`run_engines`] a bench's engines one after
//!   another (the reference first); [`run_threads`] many threads through
//!   the thread-safe handle, [`run_thread_passes`] a list of thread counts
//!   compared pass by pass; [`run_durable`] a durable store on a device;
//!   [`run_remote`] an allocation server from many clients
//!   ([`RemoteConfig`], [`RemoteReport`]). [`BenchEngine`] names the
//!   engines, among them [`BestFit`], the plain best fit every packing
//!   figure can be shown beside (`--reference best-fit`). `peers` adapters
//!   run `offset-allocator` and `range-alloc` (feature `peers`). Each run's
//!   rules (which values go together) are checked here, so that a caller
//!   only translates its flags.
//! * Progress: every driver reports to an [`Observer`]; [`HumanProgress`]
//!   and [`ReplayProgress`] show it to people.
//! * Reports: [`RunReport`] (the JSON Lines record, [`CONTRACT_FIELDS`]),
//!   [`render_table`], SVG plots ([`render_svg`]); [`LatencySummary`] and [`TimerCalibration`]: how
//!   latency is measured (below).
//! * Traces: [`replay_engine`] replays a trace (the `blockalloc-trace`
//!   format) through an engine, measured like a bench run; a
//!   [`PatternDevice`] writes each object's pattern to a device file and
//!   checks it before every free. [`generate`] writes a workload as a trace
//!   without an engine; [`Recorder`] is `bench --record`, a bench run's
//!   stream as a trace.
//! * [`units`] — numbers for people (`1.5 GiB`, `420 ns`).
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

mod bestfit;
mod compacting;
mod config;
mod durable;
mod engines;
mod gen;
mod interleave;
mod latency;
mod loops;
mod observer;
#[cfg(feature = "peers")]
mod peers;
mod plot;
mod progress;
mod record;
mod remote;
mod replay;
mod report;
mod rss;
mod sequential;
mod sizes;
mod speedup;
mod threads;
pub mod units;
mod verify;
mod workload;

pub use bestfit::BestFit;
pub use blockalloc_shared::SharedConfig;
pub use config::{run_order, BenchConfig, Limits, Mode, RoundRecord, StopReason, UnknownMode};
pub use durable::{
    run_durable, CommitLatency, DurableConfig, DurableError, DurableProgress, DurableReport, Reopen,
};
pub use engines::{BenchEngine, EngineListError, PEER_NAMES};
pub use gen::{generate, GenEnd, GenOutcome, GenSpec};
pub use interleave::{replay_interleaved, After, Interleave, InterleaveError, Interleaved};
pub use latency::{method_description, LatencySummary, TimerCalibration, SAMPLE_STRIDE};
pub use observer::{NoObserver, Observer, Position, RoundProgress};
pub use plot::{render_svg, write_svg, PlotError, PlotSeries, PlotSpec};
pub use progress::{print_line, Bar, HumanProgress, Meter, ReplayProgress, Stream};
pub use record::{bench_header, Recorder};
pub use remote::{
    run_remote, LeaseMode, RemoteConfig, RemoteConfigError, RemoteError, RemoteReport, RemoteStop,
    RemoteStopReason, SameOrder, UnknownLease, MAX_CLIENTS, MAX_COUNT,
};
pub use replay::{replay, replay_engine, ReplayConfig, ReplayError, ReplayReport, TraceInfo};
pub use report::{
    human_bytes, render_table, FinalStatus, LockReport, ReferenceFigure, RunError, RunReport,
    ThreadStats, CONTRACT_FIELDS, LATENCY_FIELDS, ROUND_FIELDS,
};
pub use sequential::{run_engine, run_engines, EnginesRun};
pub use sizes::{SizeSampler, SizeSpec, SizeSpecError, MAX_OBJECT_BYTES};
pub use speedup::{run_thread_passes, set_speedups, thread_summary};
pub use threads::{
    check_threaded, parse_thread_counts, run_threads, run_threads_with, BadThreadCount,
    SharedTunables, SharedTunablesError, ThreadedRunError, MAX_THREADS,
};
pub use verify::{CheckError, DataCheckStats, FoundData, Mismatch, PatternDevice};
pub use workload::{
    AgingSpec, AgingSpecError, AllocRequest, ChurnSpec, ChurnSpecError, FreeProbError, Op, Ops,
    Round, UnknownWorkload, Workload, WorkloadInfo, WorkloadKind, WorkloadName, WorkloadSpec,
    CHURN_SIZES, LOGNORMAL_SIZES, WORKLOADS,
};
