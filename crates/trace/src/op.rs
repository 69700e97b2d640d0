//! [`TraceOp`] and [`TraceHeader`]: what a trace holds, whatever its format.
//!
//! A trace is a header and a stream of operations on *objects*. An object is
//! named by a `u64` id chosen by whoever made the trace (a counter, an inode
//! number, a `malloc` address); an id may be reused once its object is freed.
//! Sizes are in bytes: the replayer turns them into whole blocks of the
//! replay's block size (rounded up, at least one block, as `bench` does).
//!
//! A valid stream never allocates an id that is live and never frees an id
//! that is not; [`crate::TraceSummary::scan`] checks this, and the replayer
//! checks it again as it goes.

use std::fmt;

use crate::error::TraceError;

/// One operation of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceOp {
    /// A new object of `bytes` bytes (0 is allowed: it still takes a block).
    Alloc {
        /// Object id; not live before this operation.
        object: u64,
        /// Object size in bytes.
        bytes: u64,
    },
    /// The object is deleted: every extent it holds is freed.
    Free {
        /// Object id; live before this operation.
        object: u64,
    },
    /// The end of a round (a batch of requests). Rounds are what `bench`
    /// reports per-round times and utilisation for; a trace need not have
    /// any.
    RoundEnd {
        /// Workload phase of the round that ends (1 unless the workload has
        /// phases, like `shift`); at most [`MAX_PHASE`].
        phase: u8,
    },
}

/// The largest phase number a trace can carry.
pub const MAX_PHASE: u8 = 63;

impl TraceOp {
    /// True for allocations and frees (what `--max-ops` counts), false for
    /// round markers.
    pub fn is_request(&self) -> bool {
        !matches!(self, TraceOp::RoundEnd { .. })
    }
}

impl fmt::Display for TraceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TraceOp::Alloc { object, bytes } => write!(f, "alloc,{object},{bytes}"),
            TraceOp::Free { object } => write!(f, "free,{object},"),
            TraceOp::RoundEnd { phase } => write!(f, "round,,{phase}"),
        }
    }
}

/// Well-known metadata keys. Writers add them when they know the value;
/// `replay` copies them into its JSON so that a replay of a recorded bench
/// reads like the bench.
pub mod keys {
    /// Which program made the trace: `bench --record`, `trace gen`, ….
    pub const SOURCE: &str = "source";
    /// Workload name (`seed`, `shift`, `churn`, …).
    pub const WORKLOAD: &str = "workload";
    /// Size distribution, as `--sizes` spells it.
    pub const SIZES: &str = "sizes";
    /// Free probability of the workload.
    pub const FREE_PROB: &str = "free_prob";
    /// Allocation requests per round.
    pub const ROUND_SIZE: &str = "round_size";
    /// RNG seed of the workload.
    pub const SEED: &str = "seed";
    /// Why the stream ends where it does.
    pub const END: &str = "end";
}

/// What a trace says about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceHeader {
    /// Block size the trace was made for, in bytes, if known. Traces made by
    /// `bench --record` or `trace gen` hold sizes that are multiples of it.
    /// `replay` uses it when no `--block-size` is given.
    pub block_size: Option<u64>,
    /// Device size the trace was made for, in bytes, if known. `replay`
    /// uses it when no `--capacity` is given.
    pub capacity_bytes: Option<u64>,
    /// Free-form `key=value` pairs in order; see [`keys`] for the common
    /// ones. Keys are `[a-z0-9_.-]+`; values are one line of UTF-8.
    pub meta: Vec<(String, String)>,
}

impl TraceHeader {
    /// The value of `key`, if present (the last one wins).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `key` to `value`, replacing an earlier value.
    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.meta.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.meta.push((key.to_string(), value)),
        }
    }

    /// Checks the header can be written: key syntax, one-line values, a
    /// power-of-two block size.
    ///
    /// # Errors
    /// [`TraceError::BadHeader`] saying what is wrong.
    pub fn validate(&self) -> Result<(), TraceError> {
        if let Some(bs) = self.block_size {
            if !bs.is_power_of_two() || !(512..=1 << 30).contains(&bs) {
                return Err(TraceError::BadHeader(format!(
                    "block size {bs} is not a power of two from 512 to 1GiB"
                )));
            }
        }
        for (k, v) in &self.meta {
            if !valid_key(k) {
                return Err(TraceError::BadHeader(format!(
                    "metadata key {k:?} must be non-empty and use only a-z, 0-9, '_', '.', '-'"
                )));
            }
            if v.contains(['\n', '\r']) {
                return Err(TraceError::BadHeader(format!(
                    "metadata value of {k:?} must be one line"
                )));
            }
        }
        Ok(())
    }
}

/// True for a metadata key: `[a-z0-9_.-]+`.
pub(crate) fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

/// One step of a trace reader as an iterator item: the end and the first
/// error both end the iteration (`done`), so that a reader never reads past
/// an error.
pub(crate) fn step_item(
    step: Result<Option<TraceOp>, crate::error::TraceError>,
    done: &mut bool,
) -> Option<Result<TraceOp, crate::error::TraceError>> {
    let item = step.transpose();
    if !matches!(item, Some(Ok(_))) {
        *done = true;
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_get_set_validate() {
        let mut h = TraceHeader::default();
        assert!(h.validate().is_ok());
        h.set("workload", "seed");
        h.set("seed", "1");
        h.set("workload", "shift");
        assert_eq!(h.get("workload"), Some("shift"));
        assert_eq!(h.meta.len(), 2);
        h.block_size = Some(4096);
        assert!(h.validate().is_ok());
        h.block_size = Some(3000);
        assert!(h.validate().is_err());
        h.block_size = None;
        h.set("Bad Key", "x");
        assert!(h.validate().is_err());
        let mut h = TraceHeader::default();
        h.set("k", "two\nlines");
        assert!(h.validate().is_err());
    }

    #[test]
    fn display_is_csv() {
        assert_eq!(
            TraceOp::Alloc {
                object: 3,
                bytes: 10
            }
            .to_string(),
            "alloc,3,10"
        );
        assert_eq!(TraceOp::Free { object: 3 }.to_string(), "free,3,");
        assert_eq!(TraceOp::RoundEnd { phase: 2 }.to_string(), "round,,2");
        assert!(!TraceOp::RoundEnd { phase: 1 }.is_request());
    }
}
