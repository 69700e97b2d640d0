//! [`TraceSummary`]: one validating pass over a trace — counts, sizes, peak
//! live data — used by `trace info` and by `replay` before it runs any
//! engine.

use serde::Serialize;

use crate::error::TraceError;
use crate::op::TraceOp;
use crate::source::{Batch, TraceSource};
use crate::validate::Validator;

/// Buckets of [`TraceSummary::size_histogram`]: bucket `i` counts objects of
/// `[2^(i-1), 2^i)` bytes (bucket 0: empty objects).
pub const SIZE_BUCKETS: usize = 65;

/// What a trace holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TraceSummary {
    /// All operations, round markers included.
    pub ops: u64,
    /// Allocations.
    pub allocs: u64,
    /// Frees.
    pub frees: u64,
    /// Round markers.
    pub rounds: u64,
    /// Highest phase in a round marker (0 when there is none).
    pub max_phase: u8,
    /// Sum of all allocation sizes.
    pub bytes_allocated: u64,
    /// Smallest allocation (None without allocations).
    pub min_object_bytes: Option<u64>,
    /// Largest allocation.
    pub max_object_bytes: Option<u64>,
    /// Peak of the live bytes (allocated, not yet freed).
    pub peak_live_bytes: u64,
    /// Peak of the live objects.
    pub peak_live_objects: u64,
    /// Live objects at the end.
    pub live_objects_at_end: u64,
    /// Live bytes at the end.
    pub live_bytes_at_end: u64,
    /// Objects per power-of-two size bucket (see [`SIZE_BUCKETS`]), trailing
    /// empty buckets removed.
    pub size_histogram: Vec<u64>,
    /// Peak live blocks of [`block_size`](Self::block_size) bytes, each
    /// object rounded up to whole blocks (at least one): the least capacity
    /// an allocator would need.
    pub peak_live_blocks: u64,
    /// Block size used for `peak_live_blocks`.
    pub block_size: u64,
}

/// Rounds a replay draws when the trace has no round markers.
pub const DEFAULT_ROUNDS: u64 = 200;

impl TraceSummary {
    /// Reads the whole source, checking it with a [`Validator`] (every free
    /// names a live object, no allocation names a live one, no allocation
    /// is larger than the format holds). `block_size` is used for
    /// `peak_live_blocks`.
    ///
    /// Memory: one map entry per live object.
    ///
    /// # Errors
    /// The first read error, or [`TraceError::InvalidOp`] with the
    /// operation's number and position.
    pub fn scan(source: &mut TraceSource, block_size: u64) -> Result<Self, TraceError> {
        let bs = block_size.max(1);
        let mut s = TraceSummary {
            block_size: bs,
            ..TraceSummary::default()
        };
        let mut hist = [0u64; SIZE_BUCKETS];
        let mut validator = Validator::new();
        let (mut live_bytes, mut live_blocks) = (0u64, 0u64);
        // A batch at a time: see `Batch`.
        let mut batch = Batch::new();
        while batch.refill(source)? {
            for (op, pos) in batch.located() {
                let freed = validator.apply(op, Some(pos))?;
                s.ops += 1;
                match op {
                    TraceOp::Alloc { bytes, .. } => {
                        s.allocs += 1;
                        s.bytes_allocated = s.bytes_allocated.saturating_add(bytes);
                        s.min_object_bytes =
                            Some(s.min_object_bytes.map_or(bytes, |m| m.min(bytes)));
                        s.max_object_bytes =
                            Some(s.max_object_bytes.map_or(bytes, |m| m.max(bytes)));
                        hist[(64 - bytes.leading_zeros()) as usize] += 1;
                        live_bytes = live_bytes.saturating_add(bytes);
                        live_blocks = live_blocks.saturating_add(bytes.div_ceil(bs).max(1));
                        s.peak_live_bytes = s.peak_live_bytes.max(live_bytes);
                        s.peak_live_blocks = s.peak_live_blocks.max(live_blocks);
                        s.peak_live_objects = s.peak_live_objects.max(validator.live_objects());
                    }
                    TraceOp::Free { .. } => {
                        let bytes = freed.expect("a valid free releases an object");
                        s.frees += 1;
                        live_bytes -= bytes;
                        live_blocks -= bytes.div_ceil(bs).max(1);
                    }
                    TraceOp::RoundEnd { phase } => {
                        s.rounds += 1;
                        s.max_phase = s.max_phase.max(phase);
                    }
                }
            }
        }
        s.live_objects_at_end = validator.live_objects();
        s.live_bytes_at_end = live_bytes;
        let used = hist.iter().rposition(|&c| c > 0).map_or(0, |i| i + 1);
        s.size_histogram = hist[..used].to_vec();
        Ok(s)
    }

    /// Allocations and frees (what `--max-ops` counts).
    pub fn requests(&self) -> u64 {
        self.allocs + self.frees
    }

    /// Requests per round for a replay of a trace without round markers:
    /// about [`DEFAULT_ROUNDS`] rounds, so that per-round figures and plots
    /// have a useful resolution. `None` when the trace has markers (its
    /// rounds are the ones to use).
    pub fn default_round_ops(&self) -> Option<u64> {
        (self.rounds == 0).then(|| self.requests().div_ceil(DEFAULT_ROUNDS).max(1))
    }

    /// Mean allocation size in bytes.
    pub fn mean_object_bytes(&self) -> Option<f64> {
        (self.allocs > 0).then(|| self.bytes_allocated as f64 / self.allocs as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{InvalidOpKind, Position};

    fn scan(text: &'static str) -> Result<TraceSummary, TraceError> {
        let mut src = TraceSource::from_reader(text.as_bytes())?;
        TraceSummary::scan(&mut src, 4096)
    }

    #[test]
    fn a_trace_without_round_markers_is_replayed_in_about_200_rounds() {
        let unmarked: String = (1..=1000).map(|i| format!("alloc,{i},4096\n")).collect();
        let s = scan(Box::leak(unmarked.into_boxed_str())).unwrap();
        assert_eq!(s.default_round_ops(), Some(5));
        let tiny = scan("alloc,1,4096\n").unwrap();
        assert_eq!(tiny.default_round_ops(), Some(1));
        let marked = scan("alloc,1,4096\nround\n").unwrap();
        assert_eq!(marked.default_round_ops(), None);
    }

    #[test]
    fn counts_and_peaks() {
        let s = scan("alloc,1,4096\nalloc,2,5000\nround\nfree,1\nalloc,1,0\nround,,2\n").unwrap();
        assert_eq!((s.ops, s.allocs, s.frees, s.rounds), (6, 3, 1, 2));
        assert_eq!(s.max_phase, 2);
        assert_eq!(s.peak_live_bytes, 9096);
        assert_eq!(s.peak_live_blocks, 3);
        assert_eq!(s.peak_live_objects, 2);
        assert_eq!((s.live_objects_at_end, s.live_bytes_at_end), (2, 5000));
        assert_eq!(
            (s.min_object_bytes, s.max_object_bytes),
            (Some(0), Some(5000))
        );
        assert_eq!(s.size_histogram.len(), 14);
        assert_eq!(s.size_histogram[0], 1);
        assert_eq!(s.size_histogram[13], 2);
        assert_eq!(s.requests(), 4);
    }

    #[test]
    fn invalid_streams_name_the_op() {
        match scan("alloc,1,1\nround\nfree,2\n") {
            Err(TraceError::InvalidOp {
                op: 3,
                object: 2,
                kind: InvalidOpKind::FreeOfUnknownObject,
                at,
            }) => assert_eq!(at, Some(Position::Line(3))),
            other => panic!("{other:?}"),
        }
        let e = scan("alloc,1,1\nalloc,1,1\n").unwrap_err();
        assert!(e.to_string().contains("operation 2"), "{e}");
        assert!(e.to_string().contains("already live"), "{e}");
        let e = scan("alloc,1,1\nfree,1\nfree,1\n").unwrap_err();
        assert!(e.to_string().contains("not live"), "{e}");
    }
}
