//! # blockalloc-trace
//!
//! Allocation traces for [`blockalloc`], the method described in
//! `docs/background.md`: record every allocation and free of real runs, replay them against the
//! allocator, fill each allocation with a known pattern and verify it byte
//! by byte when it is freed. This crate is what `blockalloc trace`,
//! `blockalloc replay` and `bench --record/--plot` are made of.
//!
//! * [`op`] — [`TraceOp`] (`alloc object bytes`, `free object`, round
//!   markers) and [`TraceHeader`] (block size, capacity, `key=value`
//!   metadata).
//! * [`format`](mod@format) — the compact binary format: versioned header, chunks of
//!   delta/varint-encoded operations with a CRC-32C each, an end marker with
//!   totals; streaming [`TraceReader`] / [`TraceWriter`].
//! * [`csv`] — `op,object,bytes` text, for traces made from users' logs.
//! * [`source`] — [`TraceSource`] reads either format (recognised by
//!   content), [`TraceSink`] writes either; [`convert`](fn@convert) copies.
//! * [`validate`] — [`Validator`]: the rules of an operation stream (frees
//!   of live objects, allocations of new ids, sizes the format holds),
//!   applied alike by the summary, conversion and replay.
//! * [`summary`] — [`TraceSummary`]: one validating pass (counts, sizes,
//!   peak live data).
//! * [`gen`] — the built-in workloads (`seed`, `shift`, `lognormal`,
//!   `churn`) written as traces without an engine.
//! * [`record`] — [`Recorder`], the bench observer behind `bench --record`.
//! * [`replay`](mod@replay) — the replayer: the bench's measurements and JSON report
//!   ([`ReplayReport`] = bench's `RunReport` + replay fields).
//! * [`verify`] — [`PatternDevice`]: patterns on a device file, checked
//!   before every free and at the end.
//! * [`plot`] — SVG plots of runs (utilisation and time per round).
//! * [`progress`] — a progress bar for replays.
//!
//! ## Example: generate, replay with verification, compare
//!
//! ```
//! use blockalloc::Geometry;
//! use blockalloc_bench::{BenchEngine, StopReason, TimerCalibration};
//! use blockalloc_trace::{
//!     generate, replay_engine, GenSpec, GenWorkload, PatternDevice, ReplayConfig, Silent,
//!     TraceFormat, TraceInfo, TraceSink, TraceSource, TraceSummary,
//! };
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("churn.trace");
//! let geo = Geometry::parse("64MiB", "4KiB")?;
//!
//! // A fill-then-churn trace of small objects.
//! let mut spec = GenSpec::new(GenWorkload::Churn, geo);
//! spec.round_size = 100;
//! spec.churn.volume = 0.5;
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
//!     &mut Silent,
//! )?;
//! // Either the whole trace ran, or the engine ran out of space on the way.
//! assert!(matches!(report.run.stopped, StopReason::EndOfTrace | StopReason::NoSpace));
//! assert!(report.data_check.unwrap().objects_checked > 0);
//! assert!(report.to_json_line().contains("\"utilization_at_first_failure\":"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod convert;
pub mod csv;
pub mod error;
pub mod format;
pub mod gen;
pub mod op;
pub mod plot;
pub mod progress;
pub mod record;
pub mod replay;
pub mod source;
pub mod summary;
pub mod validate;
pub mod verify;

pub use convert::convert;
pub use csv::{CsvReader, CsvWriter};
pub use error::{InvalidOpKind, Position, TraceError};
pub use format::{Totals, TraceReader, TraceWriter};
pub use gen::{generate, ChurnSpec, GenEnd, GenOutcome, GenSpec, GenWorkload, UnknownGenWorkload};
pub use op::{keys, TraceHeader, TraceOp, MAX_PHASE};
pub use plot::{render_svg, write_svg, PlotError, PlotSeries, PlotSpec};
pub use progress::ReplayProgress;
pub use record::{bench_header, Recorder};
pub use replay::{
    replay, replay_engine, ReplayConfig, ReplayError, ReplayObserver, ReplayReport, Silent,
    TraceInfo,
};
pub use source::{TraceFormat, TraceSink, TraceSource, UnknownFormat};
pub use summary::TraceSummary;
pub use validate::{Validator, MAX_OBJECT_BYTES};
pub use verify::{CheckError, DataCheckStats, FoundData, Mismatch, PatternDevice};
