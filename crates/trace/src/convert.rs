//! Converting between the binary and CSV formats, streaming.

use crate::error::{Position, TraceError};
use crate::format::Totals;
use crate::op::TraceOp;
use crate::source::{TraceSink, TraceSource};
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
    // In batches, as `TraceSummary::scan` reads: the validator's map misses
    // the cache on every access once millions of objects are live, and a
    // tight loop of map updates keeps several misses in flight (3x less CPU
    // than one operation decoded, checked and written at a time). It also
    // makes a trace that is both damaged and invalid fail with the same
    // error here as there.
    let mut batch: Vec<TraceOp> = Vec::with_capacity(BATCH);
    let mut at: Vec<Position> = Vec::with_capacity(BATCH);
    loop {
        batch.clear();
        at.clear();
        while batch.len() < BATCH {
            match source.next() {
                Some(op) => {
                    batch.push(op?);
                    at.push(source.location());
                }
                None => break,
            }
        }
        if batch.is_empty() {
            break;
        }
        for (&op, &pos) in batch.iter().zip(&at) {
            validator.apply(op, Some(pos))?;
        }
        for &op in &batch {
            sink.write(op)?;
        }
    }
    sink.finish()
}

/// Operations decoded ahead of the validation and the writes.
const BATCH: usize = 4096;

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
