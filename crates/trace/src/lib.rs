//! # blockalloc-trace
//!
//! The allocation trace format of [`blockalloc`]: a stream of `alloc object
//! bytes`, `free object` and round markers, read and written in a compact
//! binary form or as CSV, validated and summarised. It depends on the core
//! crate only; replaying a trace through the engines, generating traces from
//! the bench workloads and recording bench runs live in `blockalloc-bench`.
//!
//! * [`TraceOp`] (`alloc object bytes`, `free object`, round markers) and
//!   [`TraceHeader`] (block size, capacity, `key=value` metadata, its
//!   [`keys`]).
//! * The compact binary format: versioned header, chunks of
//!   delta/varint-encoded operations with a CRC-32C each, an end marker with
//!   [`Totals`]; streaming [`TraceReader`] / [`TraceWriter`].
//! * CSV, `op,object,bytes` text for traces made from users' logs:
//!   [`CsvReader`] / [`CsvWriter`].
//! * [`TraceSource`] reads either format (recognised by content),
//!   [`TraceSink`] writes either; [`convert`](fn@convert) copies.
//! * [`Validator`]: the rules of an operation stream (frees of live objects,
//!   allocations of new ids, sizes the format holds), applied alike by the
//!   summary, conversion and replay; [`TraceError`] says what broke, where.
//! * [`TraceSummary`]: one validating pass (counts, sizes, peak live data).
//! * [`IdMap`] — the map keyed by object ids that validation (and the
//!   harness's object maps) use.
//!
//! ## Example: write a trace, read it back, summarise it
//!
//! ```
//! use blockalloc_trace::{TraceFormat, TraceHeader, TraceOp, TraceSink, TraceSource, TraceSummary};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("small.trace");
//! let header = TraceHeader {
//!     block_size: Some(4096),
//!     capacity_bytes: Some(1 << 20),
//!     meta: Vec::new(),
//! };
//! let mut sink = TraceSink::create(&path, Some(TraceFormat::Binary), &header)?;
//! sink.write(TraceOp::Alloc { object: 1, bytes: 5000 })?;
//! sink.write(TraceOp::Alloc { object: 2, bytes: 100 })?;
//! sink.write(TraceOp::Free { object: 1 })?;
//! sink.write(TraceOp::RoundEnd { phase: 1 })?;
//! sink.finish()?;
//!
//! let mut src = TraceSource::open(&path)?;
//! assert_eq!(src.header().capacity_bytes, Some(1 << 20));
//! let summary = TraceSummary::scan(&mut src, 4096)?;
//! assert_eq!((summary.allocs, summary.frees, summary.rounds), (2, 1, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod convert;
mod csv;
mod error;
mod format;
mod ids;
mod op;
mod source;
mod summary;
mod validate;

pub use convert::convert;
pub use csv::{CsvReader, CsvWriter};
pub use error::{InvalidOpKind, Position, TraceError, MAX_OBJECT_BYTES};
pub use format::{Totals, TraceReader, TraceWriter};
pub use ids::IdMap;
pub use op::{keys, TraceHeader, TraceOp, MAX_PHASE};
pub use source::{TraceFormat, TraceSink, TraceSource, UnknownFormat};
pub use summary::{TraceSummary, DEFAULT_ROUNDS, SIZE_BUCKETS};
pub use validate::Validator;
