//! Converting between the binary and CSV formats, streaming.

use crate::error::TraceError;
use crate::format::Totals;
use crate::source::{TraceSink, TraceSource};

/// Copies every operation of `source` into `sink` and finishes the sink.
/// The sink should have been created with `source.header()`.
///
/// # Errors
/// The first read or write error; the sink is then left unfinished (a
/// binary output reads as truncated).
///
/// ```
/// use blockalloc_trace::{convert, TraceFormat, TraceSink, TraceSource};
///
/// let src = TraceSource::from_reader(&b"# block_size=4096\nalloc,1,4096\nfree,1\n"[..])?;
/// let sink = TraceSink::to_writer(Box::new(std::io::sink()), TraceFormat::Binary, src.header())?;
/// assert_eq!(convert(src, sink)?.ops, 2);
/// # Ok::<(), blockalloc_trace::TraceError>(())
/// ```
pub fn convert(source: TraceSource, mut sink: TraceSink) -> Result<Totals, TraceError> {
    for op in source {
        sink.write(op?)?;
    }
    sink.finish()
}
