//! [`RangeSet`]: the store's bookkeeping of what is in flight (the
//! reservations, the allocations of open transactions, pending frees) — a
//! [`blockalloc::ExtentSet`] whose misuse is a bug of the store. These
//! sets hold what is in flight, not the device's free space; the engine
//! keeps the big structure.

use blockalloc::{Extent, ExtentSet};

/// A set of blocks, kept as maximal disjoint extents.
#[derive(Clone, Debug)]
pub(crate) struct RangeSet(ExtentSet);

impl RangeSet {
    /// An empty set for a device of `capacity` blocks.
    pub(crate) fn new(capacity: u64) -> RangeSet {
        RangeSet(ExtentSet::new(capacity))
    }

    /// The first blocks of the set inside `e`.
    pub(crate) fn overlap(&self, e: Extent) -> Option<Extent> {
        self.0.overlap(e)
    }

    /// Adds `e`, which must not overlap the set.
    ///
    /// # Panics
    /// When it does: the store checks before it inserts.
    pub(crate) fn insert(&mut self, e: Extent) {
        if let Err(overlap) = self.0.insert(e) {
            panic!("{e} overlaps the set at {overlap}");
        }
    }

    /// Removes `e` when every block of it is in the set and returns true;
    /// otherwise changes nothing and returns false.
    #[must_use]
    pub(crate) fn remove(&mut self, e: Extent) -> bool {
        self.0.remove(e)
    }

    /// Removes `e`, every block of which must be in the set.
    ///
    /// # Panics
    /// When part of `e` is not in the set: the store only removes what it
    /// inserted.
    pub(crate) fn cut(&mut self, e: Extent) {
        assert!(self.0.remove(e), "{e} is not in the set");
    }

    /// Removes every block of the set inside `range`; returns the pieces
    /// removed, in address order.
    pub(crate) fn remove_inside(&mut self, range: Extent) -> Vec<Extent> {
        self.0.remove_inside(range)
    }

    /// Blocks in the set.
    pub(crate) fn blocks(&self) -> u64 {
        self.0.blocks()
    }

    /// Members in address order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Extent> + '_ {
        self.0.iter()
    }
}

/// Merges two sorted lists of disjoint extents (disjoint from each other
/// too) into one sorted list of maximal extents: touching neighbours merge.
pub(crate) fn merge_sorted(
    a: impl IntoIterator<Item = Extent>,
    b: impl IntoIterator<Item = Extent>,
) -> Vec<Extent> {
    let mut a = a.into_iter().peekable();
    let mut b = b.into_iter().peekable();
    let mut out: Vec<Extent> = Vec::new();
    loop {
        let next = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) => {
                if x.start() <= y.start() {
                    a.next()
                } else {
                    b.next()
                }
            }
            (Some(_), None) => a.next(),
            (None, Some(_)) => b.next(),
            (None, None) => break,
        }
        .expect("peeked");
        match out.last_mut() {
            Some(last) if last.end() == next.start() => {
                *last = Extent::from_range(last.start(), next.end()).expect("non-empty");
            }
            _ => out.push(next),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(s: u64, l: u64) -> Extent {
        Extent::new(s, l).unwrap()
    }

    #[test]
    #[should_panic(expected = "not in the set")]
    fn cutting_a_non_member_is_a_bug() {
        let mut r = RangeSet::new(100);
        r.insert(x(10, 5));
        r.cut(x(12, 4));
    }

    #[test]
    fn merge_coalesces_touching_extents() {
        let m = merge_sorted(vec![x(0, 5), x(20, 5)], vec![x(5, 5), x(30, 1)]);
        assert_eq!(m, vec![x(0, 10), x(20, 5), x(30, 1)]);
        assert!(merge_sorted(vec![], vec![]).is_empty());
    }
}
