//! [`RangeSet`]: disjoint extents in a `BTreeMap`, for the store's
//! bookkeeping of open transactions (their allocations and their pending
//! frees). These sets hold what is in flight, not the device's free space,
//! so they stay small; the engine keeps the big structure.
//!
//! Invariant: entries are disjoint; `blocks == Σ len`.

use std::collections::BTreeMap;

use blockalloc::Extent;

/// A set of disjoint extents, each inserted and removed whole.
#[derive(Clone, Debug, Default)]
pub(crate) struct RangeSet {
    /// start → end.
    map: BTreeMap<u64, u64>,
    blocks: u64,
}

impl RangeSet {
    /// The first member that shares a block with `e`, clipped to `e`.
    pub(crate) fn overlap(&self, e: Extent) -> Option<Extent> {
        // The member starting last before e's end is the only candidate that
        // could reach into e from the left; members starting inside e
        // overlap by definition, and the first of them is found by a range
        // query from e's start.
        if let Some((&s, &end)) = self.map.range(..e.start()).next_back() {
            if end > e.start() {
                return Extent::from_range(s, end).ok()?.intersection(&e);
            }
        }
        let (&s, &end) = self.map.range(e.start()..e.end()).next()?;
        Extent::from_range(s, end).ok()?.intersection(&e)
    }

    /// The members that share a block with `e`, whole, in address order.
    pub(crate) fn overlapping(&self, e: Extent) -> Vec<Extent> {
        let left = self
            .map
            .range(..e.start())
            .next_back()
            .filter(|&(_, &end)| end > e.start());
        left.into_iter()
            .chain(self.map.range(e.start()..e.end()))
            .map(|(&s, &end)| Extent::from_range(s, end).expect("members are non-empty"))
            .collect()
    }

    /// Adds `e`, which must not overlap a member.
    pub(crate) fn insert(&mut self, e: Extent) {
        debug_assert!(self.overlap(e).is_none(), "{e} overlaps the set");
        self.map.insert(e.start(), e.end());
        self.blocks += e.len();
    }

    /// Removes the member equal to `e`.
    ///
    /// # Panics
    /// When `e` is not a member: the store only removes what it inserted.
    pub(crate) fn remove(&mut self, e: Extent) {
        let end = self.map.remove(&e.start());
        assert_eq!(end, Some(e.end()), "{e} is not in the set");
        self.blocks -= e.len();
    }

    /// Blocks in the set.
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Members in address order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Extent> + '_ {
        self.map
            .iter()
            .map(|(&s, &e)| Extent::from_range(s, e).expect("members are non-empty"))
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
    fn overlap_insert_remove() {
        let mut r = RangeSet::default();
        r.insert(x(10, 5));
        r.insert(x(20, 5));
        assert_eq!(r.blocks(), 10);
        assert_eq!(r.overlap(x(0, 10)), None);
        assert_eq!(r.overlap(x(15, 5)), None);
        assert_eq!(r.overlap(x(12, 1)), Some(x(12, 1)));
        assert_eq!(r.overlap(x(0, 11)), Some(x(10, 1)));
        assert_eq!(r.overlap(x(14, 100)), Some(x(14, 1)));
        assert_eq!(r.overlap(x(16, 100)), Some(x(20, 5)));
        assert_eq!(r.overlapping(x(12, 10)), vec![x(10, 5), x(20, 5)]);
        assert_eq!(r.overlapping(x(15, 5)), vec![]);
        assert_eq!(r.overlapping(x(24, 1)), vec![x(20, 5)]);
        r.remove(x(10, 5));
        assert_eq!(r.overlap(x(12, 1)), None);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![x(20, 5)]);
        assert_eq!(r.blocks(), 5);
    }

    #[test]
    #[should_panic(expected = "not in the set")]
    fn removing_a_non_member_is_a_bug() {
        let mut r = RangeSet::default();
        r.insert(x(10, 5));
        r.remove(x(10, 4));
    }

    #[test]
    fn merge_coalesces_touching_extents() {
        let m = merge_sorted(vec![x(0, 5), x(20, 5)], vec![x(5, 5), x(30, 1)]);
        assert_eq!(m, vec![x(0, 10), x(20, 5), x(30, 1)]);
        assert!(merge_sorted(vec![], vec![]).is_empty());
    }
}
