//! [`ExtentSet`]: a set of blocks kept as maximal disjoint extents, on the
//! engine's own B+tree.

use crate::segfit::btree::{AddrTree, Cursor};
use crate::Extent;

/// A set of blocks, kept as maximal extents: inserting touching pieces
/// joins them, and any piece inside one member can be taken out of it.
///
/// It is what a space owner uses to track blocks that are not the engine's
/// free space — space set aside for a holder, allocations in flight,
/// frees not yet durable — with the engine's lookup costs: the members sit
/// in the segregated-fit engine's B+tree, keyed by their end, so finding
/// the member that holds a block is one descent (usually a leaf hint), and
/// cutting a piece off a member's front (a region used up object after
/// object) or joining a piece to a member's front changes that member in
/// place.
///
/// Invariants (checked by [`verify`](Self::verify)): members are
/// non-empty, disjoint and never touch; `blocks` is the sum of their
/// lengths.
///
/// ```
/// use blockalloc::{Extent, ExtentSet};
/// let mut s = ExtentSet::new(1 << 20);
/// assert_eq!(s.insert(Extent::new(0, 10)?), Ok(()));
/// assert_eq!(s.insert(Extent::new(10, 10)?), Ok(())); // joins the first
/// assert_eq!(s.insert(Extent::new(15, 10)?), Err(Extent::new(15, 5)?)); // the overlap
/// assert_eq!(s.iter().collect::<Vec<_>>(), vec![Extent::new(0, 20)?]);
/// assert!(s.remove(Extent::new(5, 5)?)); // any piece inside a member
/// assert!(!s.remove(Extent::new(8, 4)?)); // part of it is not in the set
/// assert_eq!(s.blocks(), 15);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct ExtentSet {
    /// Member end → member start.
    tree: AddrTree<u64>,
    blocks: u64,
}

impl Default for ExtentSet {
    /// An empty set sized for a device of 2^32 blocks (16 TiB of 4 KiB).
    fn default() -> Self {
        ExtentSet::new(1 << 32)
    }
}

impl ExtentSet {
    /// An empty set for blocks up to about `span` (the device's capacity;
    /// it sizes the lookup hints, larger blocks work too).
    pub fn new(span: u64) -> Self {
        ExtentSet {
            tree: AddrTree::new(span),
            blocks: 0,
        }
    }

    /// Blocks in the set.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Members (maximal extents) in the set.
    pub fn len(&self) -> usize {
        self.tree.len()
    }

    /// True when the set holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// The member holding block `at`, or the first one after it.
    fn member_from(&self, at: u64) -> Option<(Cursor, Extent)> {
        let c = self.tree.ceil(at + 1)?;
        let (end, start) = self.tree.get(c);
        Some((c, Extent::new_unchecked(start, end - start)))
    }

    /// The first blocks of the set inside `e`: the first member sharing a
    /// block with `e`, clipped to `e`.
    pub fn overlap(&self, e: Extent) -> Option<Extent> {
        self.member_from(e.start())?.1.intersection(&e)
    }

    /// True when every block of `e` is in the set.
    pub fn contains(&self, e: Extent) -> bool {
        self.member_from(e.start())
            .is_some_and(|(_, m)| m.start() <= e.start() && e.end() <= m.end())
    }

    /// Adds `e`; it joins the members it touches.
    ///
    /// # Errors
    /// The first part of `e` already in the set, when there is one (then
    /// nothing changes).
    pub fn insert(&mut self, e: Extent) -> Result<(), Extent> {
        let (s, end) = (e.start(), e.end());
        // One descent towards `s + 1`: the first member ending after `s`
        // either overlaps `e`, starts right at its end (join right) or lies
        // beyond; the member before it joins left if it ends at `s`.
        let finger = self.tree.finger(s + 1);
        let mut right = None;
        if let Some(c) = self.tree.at(&finger) {
            let (_, start) = self.tree.get(c);
            if start < end {
                let (_, m) = self.member_from(s).expect("found above");
                return Err(m.intersection(&e).expect("it overlaps"));
            }
            if start == end {
                right = Some(c);
            }
        }
        let left = self
            .tree
            .before(&finger)
            .map(|c| self.tree.get(c))
            .filter(|&(left_end, _)| left_end == s)
            .map(|(_, start)| start);
        self.blocks += e.len();
        match (left, right) {
            (None, None) => self.tree.insert_at(&finger, end, s),
            // The left member grows to the right: its key moves to `end`.
            (Some(start), None) => self.tree.set_key_before(&finger, end, start),
            // The right member grows to the left: its key stays.
            (None, Some(c)) => self.tree.set_val(c, s),
            (Some(start), Some(c)) => {
                self.tree.set_val(c, start);
                self.tree.remove_before(&finger);
            }
        }
        Ok(())
    }

    /// Removes `e` when every block of it is in the set and returns true;
    /// otherwise changes nothing and returns false.
    #[must_use]
    pub fn remove(&mut self, e: Extent) -> bool {
        let finger = self.tree.finger(e.start() + 1);
        let Some(c) = self.tree.at(&finger) else {
            return false;
        };
        let (end, start) = self.tree.get(c);
        if start > e.start() || e.end() > end {
            return false;
        }
        self.blocks -= e.len();
        match (start < e.start(), e.end() < end) {
            // The whole member.
            (false, false) => {
                self.tree.remove(end);
            }
            // Its front: the rest keeps the key.
            (false, true) => self.tree.set_val(c, e.end()),
            // Its back: the rest ends at `e`'s start.
            (true, false) => self.tree.set_key(end, e.start(), start),
            // Its middle: the right part keeps the key, the left part is
            // new, just before it.
            (true, true) => {
                self.tree.set_val(c, e.end());
                self.tree.insert_at(&finger, e.start(), start);
            }
        }
        true
    }

    /// Removes every block of the set inside `range`; returns the pieces
    /// removed, in address order.
    pub fn remove_inside(&mut self, range: Extent) -> Vec<Extent> {
        let mut inside = Vec::new();
        let mut at = self.member_from(range.start());
        while let Some((c, m)) = at {
            let Some(piece) = m.intersection(&range) else {
                break;
            };
            inside.push(piece);
            at = self.tree.next(c).map(|n| {
                let (end, start) = self.tree.get(n);
                (n, Extent::new_unchecked(start, end - start))
            });
        }
        for &piece in &inside {
            let removed = self.remove(piece);
            debug_assert!(removed, "{piece} was found in the set");
        }
        inside
    }

    /// The members in address order.
    pub fn iter(&self) -> impl Iterator<Item = Extent> + '_ {
        std::iter::successors(self.tree.first(), |&c| self.tree.next(c)).map(|c| {
            let (end, start) = self.tree.get(c);
            Extent::new_unchecked(start, end - start)
        })
    }

    /// Heap bytes in use.
    pub fn memory_bytes(&self) -> usize {
        self.tree.memory_bytes()
    }

    /// Checks the invariants; describes the first one broken (a bug).
    ///
    /// # Errors
    /// A description of the broken invariant.
    pub fn verify(&self) -> Result<(), String> {
        self.tree.check()?;
        let mut sum = 0;
        let mut last_end = None;
        for m in self.iter() {
            if last_end.is_some_and(|end| end >= m.start()) {
                return Err(format!("{m} touches or overlaps the member before it"));
            }
            last_end = Some(m.end());
            sum += m.len();
        }
        if sum != self.blocks {
            return Err(format!(
                "members hold {sum} blocks, the count says {}",
                self.blocks
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(s: u64, l: u64) -> Extent {
        Extent::new(s, l).unwrap()
    }

    #[test]
    fn joins_touching_pieces_and_cuts_front_back_and_middle() {
        let mut r = ExtentSet::new(1000);
        r.insert(x(20, 5)).unwrap();
        r.insert(x(10, 5)).unwrap();
        assert_eq!(r.insert(x(12, 10)), Err(x(12, 3)));
        r.insert(x(15, 5)).unwrap(); // joins both neighbours
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![x(10, 15)]);
        assert!(r.contains(x(12, 10)));
        assert!(r.remove(x(10, 2)));
        assert!(r.remove(x(23, 2)));
        assert!(r.remove(x(15, 3)));
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![x(12, 3), x(18, 5)]);
        assert_eq!(r.blocks(), 8);
        assert!(!r.remove(x(14, 5)));
        assert!(!r.remove(x(0, 1)));
        assert_eq!(r.blocks(), 8);
        assert_eq!(r.overlap(x(0, 13)), Some(x(12, 1)));
        assert_eq!(r.overlap(x(15, 3)), None);
        assert_eq!(r.remove_inside(x(13, 7)), vec![x(13, 2), x(18, 2)]);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![x(12, 1), x(20, 3)]);
        r.verify().unwrap();
    }

    proptest::proptest! {
        /// Every operation agrees with a model set of blocks, through
        /// enough members to split leaves and grow the tree.
        #[test]
        fn agrees_with_a_set_of_blocks(
            ops in proptest::collection::vec((0u8..5, 0u64..4000, 1u64..9), 1..1500)
        ) {
            let mut r = ExtentSet::new(4096);
            let mut model = std::collections::BTreeSet::new();
            for (op, start, len) in ops {
                let e = x(start, len);
                let blocks: Vec<u64> = (e.start()..e.end()).collect();
                let first = blocks.iter().find(|&b| model.contains(b)).copied();
                let all = blocks.iter().all(|b| model.contains(b));
                match op {
                    0 | 1 => {
                        let got = r.insert(e);
                        proptest::prop_assert_eq!(got.err().map(|o| o.start()), first);
                        if first.is_none() {
                            model.extend(blocks);
                        }
                    }
                    2 => {
                        proptest::prop_assert_eq!(r.remove(e), all);
                        if all {
                            for b in &blocks {
                                model.remove(b);
                            }
                        }
                    }
                    3 => {
                        let got: u64 = r.remove_inside(e).iter().map(|p| p.len()).sum();
                        let want = blocks.iter().filter(|b| model.remove(b)).count() as u64;
                        proptest::prop_assert_eq!(got, want);
                    }
                    _ => {
                        proptest::prop_assert_eq!(r.contains(e), all);
                        proptest::prop_assert_eq!(r.overlap(e).map(|o| o.start()), first);
                    }
                }
                proptest::prop_assert_eq!(r.verify(), Ok(()));
                let listed: Vec<u64> = r.iter().flat_map(|m| m.start()..m.end()).collect();
                proptest::prop_assert_eq!(&listed, &model.iter().copied().collect::<Vec<_>>());
                proptest::prop_assert_eq!(r.blocks(), model.len() as u64);
            }
        }
    }
}
