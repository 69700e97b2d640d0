//! Converting between the binary and CSV formats, streaming.

use crate::error::TraceError;
use crate::format::Totals;
use crate::source::{Batch, TraceSink, TraceSource};
use crate::validate::Validator;

/// Copies every operation of `source` into `sink` and finishes the sink.
/// The sink should have been created with `source.header()`. Operations are
/// checked with a [`Validator`] on the way, so that a trace that `trace
/// info` and `replay` refuse does not convert either.
///
/// # Errors
/// The first read or write error, or [`TraceError::InvalidOp`] as
/// [`TraceSummary::scan`](crate::TraceSummary::scan) reports it; the sink
/// is then left unfinished (a binary output reads as truncated).
///
/// ```
/// use blockalloc_trace::{convert, TraceFormat, TraceSink, TraceSource};
///
/// let src = TraceSource::from_reader(&b"# block_size=4096\nalloc,1,4096\nfree,1\n"[..])?;
/// let sink = TraceSink::to_writer(Box::new(std::io::sink()), TraceFormat::Binary, src.header())?;
/// assert_eq!(convert(src, sink)?.ops, 2);
/// # Ok::<(), blockalloc_trace::TraceError>(())
/// ```
pub fn convert(mut source: TraceSource, mut sink: TraceSink) -> Result<Totals, TraceError> {
    let mut validator = Validator::new();
    // Validated a batch at a time, as `TraceSummary::scan` does (see
    // `Batch`), and written only once the whole batch is valid.
    let mut batch = Batch::new();
    while batch.refill(&mut source)? {
        for (op, pos) in batch.located() {
            validator.apply(op, Some(pos))?;
        }
        for &op in batch.ops() {
            sink.write(op)?;
        }
    }
    sink.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::InvalidOpKind;
    use crate::source::TraceFormat;

    #[test]
    fn refuses_the_streams_that_the_summary_refuses() {
        for (text, kind) in [
            ("alloc,1,1\nfree,2\n", InvalidOpKind::FreeOfUnknownObject),
            ("alloc,1,1\nalloc,1,1\n", InvalidOpKind::AllocOfLiveObject),
            (
                "alloc,1,1\nalloc,2,18446744073709551615\n",
                InvalidOpKind::ObjectTooLarge { bytes: u64::MAX },
            ),
        ] {
            let src = TraceSource::from_reader(text.as_bytes()).unwrap();
            let sink =
                TraceSink::to_writer(Box::new(std::io::sink()), TraceFormat::Binary, src.header())
                    .unwrap();
            let converted = convert(src, sink).unwrap_err();
            let mut src = TraceSource::from_reader(text.as_bytes()).unwrap();
            let scanned = crate::TraceSummary::scan(&mut src, 4096).unwrap_err();
            assert_eq!(converted.to_string(), scanned.to_string());
            match converted {
                TraceError::InvalidOp { op: 2, kind: k, .. } => assert_eq!(k, kind),
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }
}
