//! [`ClassHeap`]: the free extents of one size class in `(length, start)`
//! order — a 4-ary min-heap whose root is the class's best fit: the
//! shortest extent, the lowest address among equals.
//!
//! Removal is lazy. Each item carries the node's generation, which the
//! engine bumps whenever the node leaves the class or changes; an item whose
//! generation, length or start no longer match its node is *stale* and is
//! dropped when it reaches the root (or when the heap is rebuilt, once stale
//! items outnumber live ones). So taking a node out of a class or changing
//! it costs no search and no write into the heap, and moving items in the
//! heap writes nothing into the nodes: a heap step touches one contiguous
//! array.
//!
//! Invariant: every item's key is no less than its parent's
//! ([`ClassHeap::check`]).

/// Children per heap node: a 4-ary heap is half as deep as a binary one,
/// and a node's children sit side by side in one or two cache lines.
const ARITY: usize = 4;

/// A heap's room (in items) that is kept when it empties or shrinks.
const SHRINK_ABOVE: usize = 256;

/// One free extent as filed in its class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Item {
    pub(crate) len: u64,
    pub(crate) start: u64,
    /// The node's raw id.
    pub(crate) id: u32,
    /// The node's generation when filed.
    pub(crate) gen: u32,
}

impl Item {
    /// `(len, start)` as one number: one comparison instead of two.
    #[inline(always)]
    fn key(&self) -> u128 {
        (u128::from(self.len) << 64) | u128::from(self.start)
    }
}

/// The items of one class (see the module docs).
#[derive(Clone, Debug, Default)]
pub(crate) struct ClassHeap {
    items: Vec<Item>,
}

impl ClassHeap {
    /// Items, stale ones included.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Bytes held.
    pub(crate) fn capacity_bytes(&self) -> usize {
        self.items.capacity() * std::mem::size_of::<Item>()
    }

    #[inline(always)]
    pub(crate) fn root(&self) -> Option<&Item> {
        self.items.first()
    }

    /// Whether the root is the item of node `id` at generation `gen`.
    #[inline(always)]
    pub(crate) fn root_is(&self, id: u32, gen: u32) -> bool {
        self.root().is_some_and(|r| r.id == id && r.gen == gen)
    }

    /// Every item, in heap order (stale ones included).
    pub(crate) fn items(&self) -> &[Item] {
        &self.items
    }

    /// Drops every item, and the room of a heap that grew long.
    pub(crate) fn clear(&mut self) {
        self.items.clear();
        if self.items.capacity() > SHRINK_ABOVE {
            self.items = Vec::new();
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, item: Item) {
        super::prefault::push_doubling(&mut self.items, item);
        let items = &mut self.items[..];
        let key = item.key();
        let mut i = items.len() - 1;
        while i > 0 {
            let p = (i - 1) / ARITY;
            if items[p].key() <= key {
                break;
            }
            items[i] = items[p];
            i = p;
        }
        items[i] = item;
    }

    /// Drops the root.
    #[inline]
    pub(crate) fn pop(&mut self) {
        let Some(last) = self.items.pop() else { return };
        if !self.items.is_empty() {
            self.sift_down(0, last);
        }
    }

    /// Gives the root a key no greater than its own (a cut from the front
    /// of the class's best fit), keeping its place.
    #[inline]
    pub(crate) fn lower_root(&mut self, len: u64, start: u64) {
        let r = &mut self.items[0];
        debug_assert!((len, start) <= (r.len, r.start));
        r.len = len;
        r.start = start;
    }

    /// Puts `item` at `i` and moves it down to its place.
    #[inline]
    fn sift_down(&mut self, mut i: usize, item: Item) {
        let items = &mut self.items[..];
        let n = items.len();
        let key = item.key();
        loop {
            let first = ARITY * i + 1;
            // The least child. A node with all its children (the common
            // case) takes a fixed-length pass that compiles without bounds
            // checks: 8 % fewer instructions per allocation than indexing.
            let (c, ck) = if let Some(kids) = items.get(first..first + ARITY) {
                let (mut c, mut ck) = (0, kids[0].key());
                for (j, kid) in kids.iter().enumerate().skip(1) {
                    let k = kid.key();
                    if k < ck {
                        (c, ck) = (j, k);
                    }
                }
                (first + c, ck)
            } else if first < n {
                let mut c = first;
                let mut ck = items[first].key();
                for (j, kid) in items.iter().enumerate().skip(first + 1) {
                    let k = kid.key();
                    if k < ck {
                        (c, ck) = (j, k);
                    }
                }
                (c, ck)
            } else {
                break;
            };
            if key <= ck {
                break;
            }
            items[i] = items[c];
            i = c;
        }
        items[i] = item;
    }

    /// Keeps the items `keep` accepts and restores the heap order: O(n).
    /// Room beyond twice the items left is given back.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&Item) -> bool) {
        self.items.retain(keep);
        if self.items.capacity() > SHRINK_ABOVE.max(4 * self.items.len()) {
            self.items.shrink_to(2 * self.items.len());
        }
        for i in (0..self.items.len().div_ceil(ARITY)).rev() {
            let item = self.items[i];
            self.sift_down(i, item);
        }
    }

    /// The least item with `len >= n` that `live` accepts. Only the
    /// subtrees whose roots are shorter than `n` or stale are searched:
    /// below a live item of at least `n` nothing is smaller.
    pub(crate) fn least_at_least(&self, n: u64, live: impl Fn(&Item) -> bool) -> Option<Item> {
        let mut best: Option<Item> = None;
        let mut stack = vec![0usize];
        while let Some(i) = stack.pop() {
            let Some(it) = self.items.get(i) else {
                continue;
            };
            if best.is_some_and(|b| b.key() <= it.key()) {
                continue;
            }
            if it.len >= n && live(it) {
                best = Some(*it);
                continue;
            }
            stack.extend((1..=ARITY).map(|j| ARITY * i + j));
        }
        best
    }

    /// `Err` naming the first item smaller than its parent.
    pub(crate) fn check(&self) -> Result<(), String> {
        for i in 1..self.items.len() {
            let p = (i - 1) / ARITY;
            if self.items[i].key() < self.items[p].key() {
                return Err(format!(
                    "heap item {i} {:?} below its parent {:?}",
                    self.items[i], self.items[p]
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(len: u64, start: u64) -> Item {
        Item {
            len,
            start,
            id: start as u32,
            gen: 0,
        }
    }

    #[test]
    fn pops_in_key_order_and_searches_at_least() {
        let mut h = ClassHeap::default();
        let mut x = 7u64;
        let mut all = Vec::new();
        for _ in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let it = item(1025 + (x >> 40) % 50, (x >> 20) % 100_000);
            h.push(it);
            all.push(it);
            h.check().unwrap();
        }
        // Searches: the least live item of at least n, items with odd start
        // counted as stale.
        for n in [1000, 1030, 1050, 1074, 1075] {
            let want = all
                .iter()
                .filter(|i| i.len >= n && i.start % 2 == 0)
                .min_by_key(|i| i.key())
                .copied();
            assert_eq!(h.least_at_least(n, |i| i.start % 2 == 0), want, "n {n}");
        }
        all.sort_by_key(|i| i.key());
        let mut got = Vec::new();
        while let Some(&r) = h.root() {
            got.push(r);
            h.pop();
            h.check().unwrap();
        }
        assert_eq!(got, all);
    }

    #[test]
    fn retain_and_lower_root_keep_the_order() {
        let mut h = ClassHeap::default();
        for i in 0..100u64 {
            h.push(item(2000 - i, i * 3));
        }
        h.retain(|i| i.start % 2 == 1);
        h.check().unwrap();
        assert_eq!(h.len(), 50);
        let r = *h.root().unwrap();
        assert_eq!(r.len, 1901);
        h.lower_root(10, r.start + 5);
        h.check().unwrap();
        assert_eq!(h.root().unwrap().len, 10);
    }
}
