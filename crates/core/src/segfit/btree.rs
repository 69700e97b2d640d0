//! [`AddrTree`]: a B+tree from a free extent's end block to its node id.
//!
//! The engine needs three things by address: the free extent just before a
//! block (to merge on free and to detect a double free), the one just after
//! it, and cheap in-place edits when an extent grows or shrinks without
//! passing a neighbour. A wide B+tree gives all three with the upper levels
//! in cache and one leaf (≈ 8 cache lines for the engine's 8-byte values,
//! searched without branches) per lookup.
//!
//! Operations:
//! * `insert` adds a key; a full leaf splits in two (or, when appending at
//!   the right edge, hands just the new key to a new leaf so that bulk loads
//!   fill leaves completely); splits can climb to the root.
//! * `remove` deletes a key; a leaf left with fewer than `MIN` keys borrows
//!   from or merges with a sibling, which can climb to the root and shrink
//!   the tree.
//! * `set_key` changes a key (and its value) without changing its rank (the
//!   extent grew to the left or shrank from the left); a smaller first key
//!   of a leaf lowers the one separator that bounds it from below, a larger
//!   last key raises the one that bounds it from above.
//! * `pred` / `ceil` / `next` / `first` are read-only.
//!
//! Invariants (checked by `check`): keys strictly increase along the leaf
//! chain; every non-root leaf holds `MIN..=CAP` keys and every non-root inner
//! node `MIN..=CAP` children (the root inner node at least 2); a separator
//! `keys[i]` of an inner node is greater than every key left of child `i+1`
//! and at most every key in child `i+1`; all leaves are at depth `height`.

use std::cell::Cell;
use std::num::NonZeroU32;

use super::prefault;

/// Entries per leaf and children per inner node.
const CAP: usize = 32;
/// Fewest entries (children) a non-root leaf (inner node) keeps.
const MIN: usize = CAP / 4;
/// The key in every slot past a node's last key, so that [`rank`] can
/// count over all `CAP` slots without looking at the length.
const PAD: u64 = u64::MAX;
/// [`rank`] tests the last key of each run of this many, then counts in one.
const RUN: usize = 8;
const _: () = assert!(CAP.is_multiple_of(RUN), "rank counts in whole runs");
/// Deeper than any tree this map can hold: node ids are `u32`, so there are
/// fewer than 2^32 leaves, and every inner node below the root has at least
/// `MIN` = 8 children: 1 + ⌈log₈ 2^32⌉ + 1 levels.
const MAX_HEIGHT: usize = 14;

/// An index into one of the tree's arenas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot(NonZeroU32);

impl Slot {
    fn new(index: usize) -> Slot {
        let v = u32::try_from(index + 1).expect("B+tree arena exceeds 2^32 nodes");
        Slot(NonZeroU32::new(v).expect("index + 1 is never zero"))
    }
    fn get(self) -> usize {
        self.0.get() as usize - 1
    }
}

/// A leaf entry. Keys and values sit side by side: an insert or a removal
/// shifts one array (one `memmove`), and reading an entry touches one cache
/// line.
#[derive(Clone, Copy, Debug)]
struct Kv<V> {
    key: u64,
    val: V,
}

#[derive(Clone, Copy, Debug)]
struct Leaf<V> {
    /// Entries in key order; slots from `len` on have the key [`PAD`].
    kv: [Kv<V>; CAP],
    len: usize,
    prev: Option<Slot>,
    next: Option<Slot>,
}

impl<V: Copy + Default> Leaf<V> {
    fn empty() -> Self {
        Leaf {
            kv: [Kv {
                key: PAD,
                val: V::default(),
            }; CAP],
            len: 0,
            prev: None,
            next: None,
        }
    }
    /// Number of keys `< key`.
    #[inline]
    fn lower_bound(&self, key: u64) -> usize {
        rank(&self.kv, self.len, |e| e.key < key)
    }
    /// Puts `key → val` at `pos`, shifting the entries from `pos` on one
    /// slot right. The leaf must have room.
    #[inline]
    fn put(&mut self, pos: usize, key: u64, val: V) {
        debug_assert!(self.len < CAP && pos <= self.len);
        self.kv.copy_within(pos..self.len, pos + 1);
        self.kv[pos] = Kv { key, val };
        self.len += 1;
    }
    /// Refills the slots past the last key with [`PAD`] after the leaf
    /// lost keys from its end.
    #[inline]
    fn pad(&mut self) {
        for e in &mut self.kv[self.len..] {
            e.key = PAD;
        }
    }
}

#[derive(Clone, Debug)]
struct Inner {
    /// `keys[i]` separates `children[i]` from `children[i + 1]`; the
    /// slots from `len - 1` on hold [`PAD`].
    keys: [u64; CAP],
    children: [Slot; CAP],
    /// Number of children.
    len: usize,
}

impl Inner {
    /// The inner node over `children`, with `keys` between them and the
    /// slots past them padded.
    fn from_parts(children: &[Slot], keys: &[u64]) -> Inner {
        let n = children.len();
        debug_assert!(n <= CAP && keys.len() + 1 == n);
        let mut inner = Inner {
            keys: [PAD; CAP],
            children: [children[0]; CAP],
            len: n,
        };
        inner.children[..n].copy_from_slice(children);
        inner.keys[..n - 1].copy_from_slice(keys);
        inner
    }

    /// The child whose key range contains `key`.
    #[inline]
    fn child_for(&self, key: u64) -> usize {
        rank(&self.keys, self.len - 1, |&k| k <= key)
    }
}

/// A position of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    leaf: Slot,
    pos: usize,
}

/// The inner nodes visited on the way down, with the child index taken.
#[derive(Clone, Copy, Debug)]
struct Path {
    nodes: [u32; MAX_HEIGHT],
    child: [u8; MAX_HEIGHT],
    len: usize,
}

impl Path {
    #[inline]
    fn new() -> Path {
        Path {
            nodes: [0; MAX_HEIGHT],
            child: [0; MAX_HEIGHT],
            len: 0,
        }
    }

    /// Step `i`: the inner node's index and the child taken.
    #[inline]
    fn step(&self, i: usize) -> (usize, usize) {
        (self.nodes[i] as usize, self.child[i] as usize)
    }
}

/// A place in the tree found by one descent, so that a caller can look at
/// the neighbours of a key and then change the tree right there without
/// descending again. (The rare changes that need the path from the root —
/// splits, merges, separator fixes — find it again with `path_of`.)
#[derive(Clone, Copy, Debug)]
pub(crate) struct Finger {
    leaf: Slot,
    /// Number of keys in `leaf` below the key searched for.
    pos: usize,
}

/// An ordered map `u64 → V` (free extent end → node id and more).
#[derive(Clone, Debug)]
pub(crate) struct AddrTree<V> {
    leaves: Vec<Leaf<V>>,
    /// Slots of `leaves`' buffer written so far (see [`prefault`]).
    leaves_written: usize,
    inners: Vec<Inner>,
    free_leaves: Vec<Slot>,
    free_inners: Vec<Slot>,
    root: Slot,
    /// 0 when the root is a leaf.
    height: usize,
    len: usize,
    /// Leaf hints by key: `hints[key >> hint_shift]` is the slot (plus one)
    /// of the leaf the last descent for a key of that bucket reached, or 0.
    /// A hint is used only when its leaf still holds keys on both sides of
    /// the key looked up, or when the key falls in the gap between it and
    /// its previous or next leaf (checked against that leaf's edge key):
    /// leaves partition the keys in order, so that is a valid place for the
    /// key however the tree changed since (freed leaves are emptied, so no
    /// stale hint passes). Most lookups near an earlier one skip the
    /// descent; a bucket spans `2^hint_shift` keys.
    hints: Box<[Cell<u32>]>,
    hint_shift: u32,
    /// The hint table has at most `2^hint_bits` buckets.
    hint_bits: u32,
    /// About the largest key expected: sizes the hint buckets.
    span: u64,
}

/// Leaves [`AddrTree::walk`] steps through before descending instead.
const WALK: usize = 4;

/// log2 of the hint table's first size: 1024 buckets, 4 KiB.
const HINT_MIN_BITS: u32 = 10;
/// Hint buckets per leaf the table grows to keep.
const HINTS_PER_LEAF: usize = 16;
/// log2 of the most leaf hints: 65 536 hints, 256 KiB. Fewer (4096)
/// sent 45 % of the lookups of the 16 TiB seed run down from the root: with
/// several leaves per bucket, the hinted one was often a neighbour.
const HINT_BITS: u32 = 16;

impl<V: Copy + Default> AddrTree<V> {
    /// An empty map for keys up to about `span` (larger keys work, sharing
    /// the last hint).
    pub(crate) fn new(span: u64) -> Self {
        let mut t = AddrTree {
            leaves: vec![Leaf::empty()],
            leaves_written: 1,
            inners: Vec::new(),
            free_leaves: Vec::new(),
            free_inners: Vec::new(),
            root: Slot::new(0),
            height: 0,
            len: 0,
            hints: Box::new([]),
            hint_shift: 0,
            hint_bits: 0,
            span,
        };
        t.size_hints(HINT_MIN_BITS);
        t
    }

    /// Replaces the hint table by an empty one of up to `2^bits` buckets
    /// (no more than the span has keys).
    fn size_hints(&mut self, bits: u32) {
        let span_bits = u64::BITS - self.span.leading_zeros();
        self.hint_shift = span_bits.saturating_sub(bits);
        // Keys run up to `span`: buckets `0..=span >> hint_shift`.
        let n = ((self.span >> self.hint_shift) + 1).min(1 << bits);
        self.hints = (0..n).map(|_| Cell::new(0)).collect();
        self.hint_bits = bits;
    }

    /// Grows the hint table with the tree: [`HINTS_PER_LEAF`] buckets per
    /// leaf, up to `2^HINT_BITS`. Hints are only a cache, so the new table
    /// starts empty. A tree that stays small (one of many arenas) keeps a
    /// small table.
    fn grow_hints(&mut self) {
        let bits = self.hint_bits;
        if bits < HINT_BITS
            && self.hint_shift > 0
            && self.hints.len() < self.leaves.len() * HINTS_PER_LEAF
        {
            self.size_hints(bits + 1);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        self.leaves.capacity() * std::mem::size_of::<Leaf<V>>()
            + self.inners.capacity() * std::mem::size_of::<Inner>()
            + (self.free_leaves.capacity() + self.free_inners.capacity()) * 4
            + self.hints.len() * 4
    }

    /// A leaf where `key` has its place: one whose keys bracket it, or the
    /// left one of two neighbours whose gap holds it (its position is then
    /// past that leaf's last key). Starts at the bucket's hint and walks a
    /// few leaves along the chain; failing that, descends from the root. The
    /// leaf found becomes the hint.
    #[inline]
    fn leaf_for(&self, key: u64) -> Slot {
        let b = ((key >> self.hint_shift) as usize).min(self.hints.len() - 1);
        let hint = &self.hints[b];
        if let Some(i) = (hint.get() as usize).checked_sub(1) {
            let start = Slot::new(i);
            // A freed leaf is empty, so a stale hint fails here.
            if self.leaf(start).len > 0 {
                if let Some(found) = self.walk(start, key) {
                    if found != start {
                        hint.set(found.get() as u32 + 1);
                    }
                    return found;
                }
            }
        }
        let leaf = self.descend(key, None);
        hint.set(leaf.get() as u32 + 1);
        leaf
    }

    /// Up to [`WALK`] steps along the leaf chain from `cur` (a live leaf)
    /// towards `key`'s place. Leaves partition the keys in order, so the
    /// answer holds however the tree changed since the hint was written.
    #[inline]
    fn walk(&self, mut cur: Slot, key: u64) -> Option<Slot> {
        for _ in 0..WALK {
            let l = self.leaf(cur);
            if key < l.kv[0].key {
                let Some(p) = l.prev else {
                    return Some(cur); // below every key
                };
                let pl = self.leaf(p);
                if pl.kv[pl.len - 1].key < key {
                    return Some(p); // in the gap after `p`
                }
                cur = p;
            } else if key <= l.kv[l.len - 1].key {
                return Some(cur);
            } else {
                let Some(n) = l.next else {
                    return Some(cur); // above every key
                };
                if key < self.leaf(n).kv[0].key {
                    return Some(cur); // in the gap after `cur`
                }
                cur = n;
            }
        }
        None
    }

    #[inline]
    fn leaf(&self, s: Slot) -> &Leaf<V> {
        &self.leaves[s.get()]
    }
    #[inline]
    fn leaf_mut(&mut self, s: Slot) -> &mut Leaf<V> {
        &mut self.leaves[s.get()]
    }
    #[inline]
    fn inner(&self, s: Slot) -> &Inner {
        &self.inners[s.get()]
    }
    #[inline]
    fn inner_mut(&mut self, s: Slot) -> &mut Inner {
        &mut self.inners[s.get()]
    }

    fn new_leaf(&mut self) -> Slot {
        match self.free_leaves.pop() {
            Some(s) => {
                *self.leaf_mut(s) = Leaf::empty();
                s
            }
            None => {
                let blank = Leaf::empty();
                prefault::push(&mut self.leaves, &mut self.leaves_written, blank, blank);
                self.grow_hints();
                Slot::new(self.leaves.len() - 1)
            }
        }
    }

    fn new_inner(&mut self, inner: Inner) -> Slot {
        match self.free_inners.pop() {
            Some(s) => {
                *self.inner_mut(s) = inner;
                s
            }
            None => {
                self.inners.push(inner);
                Slot::new(self.inners.len() - 1)
            }
        }
    }

    /// Walks down to the leaf whose range holds `key`.
    #[inline]
    fn descend(&self, key: u64, path: Option<&mut Path>) -> Slot {
        let mut node = self.root;
        match path {
            Some(p) => {
                p.len = 0;
                for _ in 0..self.height {
                    let inner = self.inner(node);
                    let ci = inner.child_for(key);
                    p.nodes[p.len] = node.get() as u32;
                    p.child[p.len] = ci as u8;
                    p.len += 1;
                    node = inner.children[ci];
                }
            }
            None => {
                for _ in 0..self.height {
                    let inner = self.inner(node);
                    node = inner.children[inner.child_for(key)];
                }
            }
        }
        node
    }

    /// The entry at `c`.
    #[inline]
    pub(crate) fn get(&self, c: Cursor) -> (u64, V) {
        let l = self.leaf(c.leaf);
        (l.kv[c.pos].key, l.kv[c.pos].val)
    }

    /// Replaces the value at `c`.
    #[inline]
    pub(crate) fn set_val(&mut self, c: Cursor, v: V) {
        self.leaf_mut(c.leaf).kv[c.pos].val = v;
    }

    /// The last entry with a key `< key`.
    #[inline]
    #[cfg(test)]
    pub(crate) fn pred(&self, key: u64) -> Option<Cursor> {
        let leaf = self.descend(key, None);
        let pos = self.leaf(leaf).lower_bound(key);
        if pos > 0 {
            return Some(Cursor { leaf, pos: pos - 1 });
        }
        let prev = self.leaf(leaf).prev?;
        Some(Cursor {
            leaf: prev,
            pos: self.leaf(prev).len - 1,
        })
    }

    /// The first entry with a key `>= key`.
    #[inline]
    pub(crate) fn ceil(&self, key: u64) -> Option<Cursor> {
        let leaf = self.leaf_for(key);
        let l = self.leaf(leaf);
        let pos = l.lower_bound(key);
        if pos < l.len {
            return Some(Cursor { leaf, pos });
        }
        let next = l.next?;
        Some(Cursor { leaf: next, pos: 0 })
    }

    /// The entry after `c`.
    #[inline]
    pub(crate) fn next(&self, c: Cursor) -> Option<Cursor> {
        let l = self.leaf(c.leaf);
        if c.pos + 1 < l.len {
            return Some(Cursor {
                leaf: c.leaf,
                pos: c.pos + 1,
            });
        }
        l.next.map(|leaf| Cursor { leaf, pos: 0 })
    }

    /// The entry before `c`.
    #[inline]
    pub(crate) fn prev(&self, c: Cursor) -> Option<Cursor> {
        if c.pos > 0 {
            return Some(Cursor {
                leaf: c.leaf,
                pos: c.pos - 1,
            });
        }
        let prev = self.leaf(c.leaf).prev?;
        Some(Cursor {
            leaf: prev,
            pos: self.leaf(prev).len - 1,
        })
    }

    /// The smallest entry.
    pub(crate) fn first(&self) -> Option<Cursor> {
        self.ceil(0)
    }

    /// The largest entry.
    #[cfg(test)]
    pub(crate) fn last(&self) -> Option<Cursor> {
        self.pred(u64::MAX).or_else(|| self.ceil(u64::MAX))
    }

    /// Descends towards `key`.
    #[inline(always)]
    pub(crate) fn finger(&self, key: u64) -> Finger {
        let leaf = self.leaf_for(key);
        let pos = self.leaf(leaf).lower_bound(key);
        Finger { leaf, pos }
    }

    /// The path from the root to `leaf`, which must hold a key.
    fn path_of(&self, leaf: Slot) -> Path {
        let mut path = Path::new();
        if self.height > 0 {
            let found = self.descend(self.leaf(leaf).kv[0].key, Some(&mut path));
            debug_assert_eq!(found, leaf);
        }
        path
    }

    /// The first entry at or after the finger's key.
    #[inline]
    pub(crate) fn at(&self, f: &Finger) -> Option<Cursor> {
        let l = self.leaf(f.leaf);
        if f.pos < l.len {
            return Some(Cursor {
                leaf: f.leaf,
                pos: f.pos,
            });
        }
        l.next.map(|leaf| Cursor { leaf, pos: 0 })
    }

    /// The last entry before the finger's key.
    #[inline]
    pub(crate) fn before(&self, f: &Finger) -> Option<Cursor> {
        self.prev(Cursor {
            leaf: f.leaf,
            pos: f.pos,
        })
    }

    /// Adds `key → val`. The key must not be present.
    pub(crate) fn insert(&mut self, key: u64, val: V) {
        let f = self.finger(key);
        self.insert_at(&f, key, val);
    }

    /// Adds `key → val` at the finger: `key` must sort after every key
    /// before the finger and before every key at or after it.
    #[inline(always)]
    pub(crate) fn insert_at(&mut self, f: &Finger, key: u64, val: V) {
        let (leaf, pos) = (f.leaf, f.pos);
        self.len += 1;
        let l = self.leaf(leaf);
        debug_assert!(pos == 0 || l.kv[pos - 1].key < key);
        debug_assert!(pos == l.len || key < l.kv[pos].key, "duplicate key {key}");
        if pos == l.len && l.len > 0 {
            self.append_bound(leaf, key);
        }
        let l = self.leaf_mut(leaf);
        if l.len < CAP {
            l.put(pos, key, val);
            return;
        }
        self.split_insert(leaf, pos, key, val);
    }

    /// `insert_at` past a leaf's last key: the separator above the leaf
    /// may have to rise (out of line: about one insert in 40 on the seed
    /// run).
    #[cold]
    #[inline(never)]
    fn append_bound(&mut self, leaf: Slot, key: u64) {
        let path = self.path_of(leaf);
        self.raise_upper_bound(&path, key);
    }

    /// `insert_at` into a full leaf: splits it (out of line: one insert in
    /// about 20 on the seed run).
    #[cold]
    #[inline(never)]
    fn split_insert(&mut self, leaf: Slot, pos: usize, key: u64, val: V) {
        let mut path = self.path_of(leaf);
        let l = self.leaf(leaf);
        // Split. Appending at the right edge leaves the old leaf nearly full
        // (bulk loads fill leaves to 3/4 or more), keeping `MIN` keys on the
        // right so that no leaf is ever below `MIN`.
        let mid = if pos == CAP && l.next.is_none() {
            CAP - MIN
        } else {
            CAP / 2
        };
        let right = self.new_leaf();
        let (ks, old_next) = {
            let l = self.leaf(leaf);
            (l.kv, l.next)
        };
        {
            let r = self.leaf_mut(right);
            r.kv[..CAP - mid].copy_from_slice(&ks[mid..]);
            r.len = CAP - mid;
            r.prev = Some(leaf);
            r.next = old_next;
        }
        if let Some(n) = old_next {
            self.leaf_mut(n).prev = Some(right);
        }
        {
            let l = self.leaf_mut(leaf);
            l.len = mid;
            l.pad();
            l.next = Some(right);
        }
        let (target, tpos) = if pos <= mid {
            (leaf, pos)
        } else {
            (right, pos - mid)
        };
        self.leaf_mut(target).put(tpos, key, val);
        let sep = self.leaf(right).kv[0].key;
        self.insert_child(&mut path, sep, right);
    }

    /// Inserts `child` right of the child taken at the deepest step of
    /// `path`, with separator `sep`, splitting upward as needed.
    fn insert_child(&mut self, path: &mut Path, mut sep: u64, mut child: Slot) {
        loop {
            if path.len == 0 {
                let old_root = self.root;
                self.root = self.new_inner(Inner::from_parts(&[old_root, child], &[sep]));
                self.height += 1;
                return;
            }
            path.len -= 1;
            let (node, ci) = path.step(path.len);
            let inner = &mut self.inners[node];
            if inner.len < CAP {
                let n = inner.len;
                inner.children.copy_within(ci + 1..n, ci + 2);
                inner.children[ci + 1] = child;
                inner.keys.copy_within(ci..n - 1, ci + 1);
                inner.keys[ci] = sep;
                inner.len += 1;
                return;
            }
            // Full: lay out CAP + 1 children and split them in halves.
            let mut children = [child; CAP + 1];
            let mut keys = [0u64; CAP];
            children[..=ci].copy_from_slice(&inner.children[..=ci]);
            children[ci + 1] = child;
            children[ci + 2..].copy_from_slice(&inner.children[ci + 1..]);
            keys[..ci].copy_from_slice(&inner.keys[..ci]);
            keys[ci] = sep;
            keys[ci + 1..].copy_from_slice(&inner.keys[ci..CAP - 1]);
            let (left, up, right) = split_inner(&children, &keys);
            self.inners[node] = left;
            sep = up;
            child = self.new_inner(right);
        }
    }

    /// Removes `key`, returning its value.
    #[inline(always)]
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let f = self.finger(key);
        let l = self.leaf(f.leaf);
        if f.pos == l.len || l.kv[f.pos].key != key {
            return None;
        }
        Some(self.remove_at(&f))
    }

    /// Removes the entry just before the finger, which must exist.
    pub(crate) fn remove_before(&mut self, f: &Finger) -> V {
        if f.pos == 0 {
            // It sits in the previous leaf, which the path does not reach.
            let c = self.before(f).expect("remove_before: no entry before");
            let key = self.get(c).0;
            return self.remove(key).expect("the key was just read");
        }
        self.remove_at_pos(f.leaf, f.pos - 1)
    }

    /// Removes the entry at the finger, which must exist in its leaf.
    fn remove_at(&mut self, f: &Finger) -> V {
        self.remove_at_pos(f.leaf, f.pos)
    }

    fn remove_at_pos(&mut self, leaf: Slot, pos: usize) -> V {
        let l = self.leaf_mut(leaf);
        debug_assert!(pos < l.len);
        let val = l.kv[pos].val;
        let n = l.len;
        l.kv.copy_within(pos + 1..n, pos);
        l.kv[n - 1].key = PAD;
        l.len -= 1;
        let underflow = l.len < MIN;
        self.len -= 1;
        if underflow && self.height > 0 {
            self.underflow(leaf);
        }
        val
    }

    /// A leaf fell below `MIN` keys: it borrows from or merges with a
    /// sibling (out of line: about one removal in 20).
    #[cold]
    #[inline(never)]
    fn underflow(&mut self, leaf: Slot) {
        let mut path = self.path_of(leaf);
        self.rebalance_leaf(&mut path, leaf);
    }

    /// Raises the separator that bounds the leaf at the end of `path` from
    /// above, if needed, so that `key` may live in that leaf. The caller
    /// guarantees that every key of the next leaf exceeds `key`.
    fn raise_upper_bound(&mut self, path: &Path, key: u64) {
        for i in (0..path.len).rev() {
            let (node, ci) = path.step(i);
            let inner = &mut self.inners[node];
            if ci + 1 < inner.len {
                let k = &mut inner.keys[ci];
                if *k <= key {
                    *k = key + 1;
                }
                return;
            }
        }
    }

    /// Changes the entry just before the finger to `new → val`; `new` must
    /// keep the entry's rank.
    #[inline(always)]
    pub(crate) fn set_key_before(&mut self, f: &Finger, new: u64, val: V) {
        if f.pos == 0 {
            let c = self.before(f).expect("set_key_before: no entry before");
            let old = self.get(c).0;
            self.set_key(old, new, val);
            return;
        }
        let l = self.leaf(f.leaf);
        let old = l.kv[f.pos - 1].key;
        debug_assert!(f.pos < 2 || l.kv[f.pos - 2].key < new);
        debug_assert!(f.pos == l.len || new < l.kv[f.pos].key);
        let raise = f.pos == l.len && new > old;
        let lower = f.pos == 1 && new < old;
        if (raise || lower) && self.height > 0 {
            // Found before the key changes: the path runs by the first key.
            let path = self.path_of(f.leaf);
            if raise {
                self.raise_upper_bound(&path, new);
            }
            if lower {
                self.lower_lower_bound(&path, new);
            }
        }
        let l = self.leaf_mut(f.leaf);
        l.kv[f.pos - 1] = Kv { key: new, val };
    }

    /// Lowers the separator that bounds the leaf at the end of `path` from
    /// below, if needed, so that its new first key `key` stays in range.
    fn lower_lower_bound(&mut self, path: &Path, key: u64) {
        for i in (0..path.len).rev() {
            let (node, ci) = path.step(i);
            if ci > 0 {
                let k = &mut self.inners[node].keys[ci - 1];
                if *k > key {
                    *k = key;
                }
                return;
            }
        }
    }

    fn rebalance_leaf(&mut self, path: &mut Path, leaf: Slot) {
        let (parent, ci) = path.step(path.len - 1);
        let p = &self.inners[parent];
        let (li, left, right) = if ci > 0 {
            (ci - 1, p.children[ci - 1], leaf)
        } else {
            (ci, leaf, p.children[ci + 1])
        };
        let (ln, rn) = (self.leaf(left).len, self.leaf(right).len);
        if ln + rn <= CAP {
            // Merge right into left.
            let (l, r) = two_mut(&mut self.leaves, left.get(), right.get());
            l.kv[ln..ln + rn].copy_from_slice(&r.kv[..rn]);
            l.len = ln + rn;
            l.next = r.next;
            // Emptied, so that no leaf hint can still pick it.
            r.len = 0;
            let next = r.next;
            if let Some(n) = next {
                self.leaf_mut(n).prev = Some(left);
            }
            self.free_leaves.push(right);
            self.remove_child(path, li + 1);
        } else {
            // Share evenly.
            let total = ln + rn;
            let want_left = total / 2;
            let (l, r) = two_mut(&mut self.leaves, left.get(), right.get());
            if ln > want_left {
                let k = ln - want_left;
                r.kv.copy_within(0..rn, k);
                r.kv[..k].copy_from_slice(&l.kv[want_left..ln]);
            } else {
                let k = want_left - ln;
                l.kv[ln..want_left].copy_from_slice(&r.kv[..k]);
                r.kv.copy_within(k..rn, 0);
            }
            l.len = want_left;
            r.len = total - want_left;
            l.pad();
            r.pad();
            let sep = r.kv[0].key;
            self.inners[parent].keys[li] = sep;
        }
    }

    /// Removes child `ci` (and the separator left of it) from the inner node
    /// at the deepest step of `path`, then fixes underflow upward.
    fn remove_child(&mut self, path: &mut Path, ci: usize) {
        path.len -= 1;
        let (node, _) = path.step(path.len);
        let inner = &mut self.inners[node];
        let n = inner.len;
        inner.children.copy_within(ci + 1..n, ci);
        inner.keys.copy_within(ci..n - 1, ci - 1);
        inner.keys[n - 2] = PAD;
        inner.len -= 1;
        if path.len == 0 {
            if inner.len == 1 {
                // The root has one child left: it becomes the root.
                let only = inner.children[0];
                self.free_inners.push(self.root);
                self.root = only;
                self.height -= 1;
            }
            return;
        }
        if inner.len >= MIN {
            return;
        }
        let (parent, pci) = path.step(path.len - 1);
        let p = &self.inners[parent];
        let (li, left, right) = if pci > 0 {
            (pci - 1, p.children[pci - 1], Slot::new(node))
        } else {
            (pci, Slot::new(node), p.children[pci + 1])
        };
        let sep = p.keys[li];
        let (l, r) = two_mut(&mut self.inners, left.get(), right.get());
        let (ln, rn) = (l.len, r.len);
        let mut children = [l.children[0]; 2 * CAP];
        let mut keys = [0u64; 2 * CAP - 1];
        children[..ln].copy_from_slice(&l.children[..ln]);
        children[ln..ln + rn].copy_from_slice(&r.children[..rn]);
        keys[..ln - 1].copy_from_slice(&l.keys[..ln - 1]);
        keys[ln - 1] = sep;
        keys[ln..ln + rn - 1].copy_from_slice(&r.keys[..rn - 1]);
        let total = ln + rn;
        if total <= CAP {
            l.children[..total].copy_from_slice(&children[..total]);
            l.keys[..total - 1].copy_from_slice(&keys[..total - 1]);
            l.len = total;
            self.free_inners.push(right);
            self.remove_child(path, li + 1);
        } else {
            let (nl, up, nr) = split_inner(&children[..total], &keys[..total - 1]);
            *l = nl;
            *r = nr;
            self.inners[parent].keys[li] = up;
        }
    }

    /// Replaces `old` by `new`, which must keep its rank (no other key lies
    /// between them).
    pub(crate) fn set_key(&mut self, old: u64, new: u64, val: V) {
        let f = self.finger(old);
        debug_assert!(
            f.pos < self.leaf(f.leaf).len && self.leaf(f.leaf).kv[f.pos].key == old,
            "set_key: {old} absent"
        );
        let f = Finger {
            pos: f.pos + 1,
            ..f
        };
        self.set_key_before(&f, new, val);
    }

    /// Checks the structural invariants; describes the first one broken.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut count = 0usize;
        let mut last: Option<u64> = None;
        self.check_node(
            self.root,
            self.height,
            None,
            None,
            true,
            &mut count,
            &mut last,
        )?;
        if count != self.len {
            return Err(format!(
                "tree counts {} entries, walk found {count}",
                self.len
            ));
        }
        // The leaf chain visits the same keys in order.
        let mut n = 0usize;
        let mut prev_leaf: Option<Slot> = None;
        let mut cur = self.leftmost_leaf();
        let mut prev_key: Option<u64> = None;
        while let Some(s) = cur {
            let l = self.leaf(s);
            if l.prev != prev_leaf {
                return Err(format!("leaf {} has a wrong prev link", s.get()));
            }
            for k in l.kv[..l.len].iter().map(|e| e.key) {
                if prev_key.is_some_and(|p| p >= k) {
                    return Err(format!("leaf chain keys not increasing at {k}"));
                }
                prev_key = Some(k);
            }
            n += l.len;
            prev_leaf = Some(s);
            cur = l.next;
        }
        if n != self.len {
            return Err(format!(
                "leaf chain holds {n} entries, tree says {}",
                self.len
            ));
        }
        Ok(())
    }

    fn leftmost_leaf(&self) -> Option<Slot> {
        let mut node = self.root;
        for _ in 0..self.height {
            node = self.inner(node).children[0];
        }
        Some(node)
    }

    #[allow(clippy::too_many_arguments)]
    fn check_node(
        &self,
        node: Slot,
        height: usize,
        lo: Option<u64>,
        hi: Option<u64>,
        is_root: bool,
        count: &mut usize,
        last: &mut Option<u64>,
    ) -> Result<(), String> {
        if height == 0 {
            let l = self.leaf(node);
            if !is_root && !(MIN..=CAP).contains(&l.len) {
                return Err(format!("leaf {} holds {} keys", node.get(), l.len));
            }
            if l.kv[l.len..].iter().any(|e| e.key != PAD) {
                return Err(format!("leaf {} has a key past its end", node.get()));
            }
            for k in l.kv[..l.len].iter().map(|e| e.key) {
                if lo.is_some_and(|lo| k < lo) || hi.is_some_and(|hi| k >= hi) {
                    return Err(format!("key {k} outside its separators {lo:?}..{hi:?}"));
                }
                if last.is_some_and(|p| p >= k) {
                    return Err(format!("keys not increasing at {k}"));
                }
                *last = Some(k);
            }
            *count += l.len;
            return Ok(());
        }
        let inner = self.inner(node);
        let min = if is_root { 2 } else { MIN };
        if !(min..=CAP).contains(&inner.len) {
            return Err(format!("inner {} has {} children", node.get(), inner.len));
        }
        if inner.keys[inner.len - 1..].iter().any(|&k| k != PAD) {
            return Err(format!("inner {} has a key past its end", node.get()));
        }
        for i in 0..inner.len {
            let clo = if i == 0 { lo } else { Some(inner.keys[i - 1]) };
            let chi = if i + 1 == inner.len {
                hi
            } else {
                Some(inner.keys[i])
            };
            if let (Some(a), Some(b)) = (clo, chi) {
                if a >= b {
                    return Err(format!("inner {} separators not increasing", node.get()));
                }
            }
            self.check_node(inner.children[i], height - 1, clo, chi, false, count, last)?;
        }
        Ok(())
    }
}

/// How many of the sorted `keys[..len]` satisfy `below` (a prefix).
///
/// A binary search over 32 keys is five dependent loads over four cache
/// lines. Instead, the last key of each run of eight is tested first: those
/// four loads are independent and overlap in the memory system. Then one
/// run of eight (one or two cache lines) is counted. The slots past `len` hold
/// [`PAD`], so the whole array is sorted and both steps run over fixed
/// ranges with no branch on the length; `below(PAD)` can only be true for
/// the largest possible key, and the clamp to `len` covers that case.
#[inline]
fn rank<T>(keys: &[T; CAP], len: usize, below: impl Fn(&T) -> bool) -> usize {
    const RUNS: usize = CAP / RUN;
    debug_assert!(len <= CAP);
    let mut runs = 0;
    for j in 0..RUNS {
        runs += usize::from(below(&keys[j * RUN + RUN - 1]));
    }
    // With every run's last key below, the last run counts all of its keys.
    let start = runs.min(RUNS - 1) * RUN;
    let mut n = start;
    for k in &keys[start..start + RUN] {
        n += usize::from(below(k));
    }
    n.min(len)
}

/// Splits `children` (with `keys` between them) into two inner nodes and the
/// separator that goes up.
fn split_inner(children: &[Slot], keys: &[u64]) -> (Inner, u64, Inner) {
    let n = children.len();
    debug_assert_eq!(keys.len(), n - 1);
    let h = n / 2;
    let left = Inner::from_parts(&children[..h], &keys[..h - 1]);
    let right = Inner::from_parts(&children[h..], &keys[h..]);
    (left, keys[h - 1], right)
}

/// Two distinct elements of a slice, mutably.
fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    assert_ne!(a, b);
    if a < b {
        let (x, y) = v.split_at_mut(b);
        (&mut x[a], &mut y[0])
    } else {
        let (x, y) = v.split_at_mut(a);
        (&mut y[0], &mut x[b])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn pred_model(m: &BTreeMap<u64, u32>, k: u64) -> Option<(u64, u32)> {
        m.range(..k).next_back().map(|(&a, &b)| (a, b))
    }

    fn ceil_model(m: &BTreeMap<u64, u32>, k: u64) -> Option<(u64, u32)> {
        m.range(k..).next().map(|(&a, &b)| (a, b))
    }

    /// Random operations against a `BTreeMap`; `span` sets the leaf hints'
    /// buckets (`u64::MAX`: the whole key space in one bucket, so the hint is
    /// stale after nearly every change).
    fn run(seed: u64, ops: usize, key_space: u64, span: u64) {
        let mut t = AddrTree::<u32>::new(span);
        let mut m = BTreeMap::new();
        let mut x = seed | 1;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..ops {
            let r = rnd();
            let k = r % key_space;
            match r >> 60 {
                0..=2 => {
                    // The engine's free: a finger at k, then a change there.
                    let f = t.finger(k);
                    let at = t.at(&f).map(|c| t.get(c));
                    let before = t.before(&f).map(|c| t.get(c));
                    assert_eq!(at, ceil_model(&m, k));
                    assert_eq!(before, pred_model(&m, k));
                    let hi = at.map_or(key_space + 5, |(a, _)| a);
                    match (r >> 8) % 3 {
                        0 if hi > k && !m.contains_key(&k) => {
                            let key = k + (r >> 12) % (hi - k);
                            t.insert_at(&f, key, i as u32);
                            m.insert(key, i as u32);
                        }
                        1 if before.is_some() => {
                            let (old, v) = before.unwrap();
                            let lo = m.range(..old).next_back().map_or(0, |(&p, _)| p + 1);
                            let new = lo + (r >> 12) % (hi - lo);
                            // A new value too: both must be written.
                            t.set_key_before(&f, new, v ^ 1);
                            m.remove(&old);
                            m.insert(new, v ^ 1);
                        }
                        2 if before.is_some() => {
                            let (old, v) = before.unwrap();
                            assert_eq!(t.remove_before(&f), v);
                            m.remove(&old);
                        }
                        _ => {}
                    }
                }
                3..=6 => {
                    if let std::collections::btree_map::Entry::Vacant(e) = m.entry(k) {
                        e.insert(i as u32);
                        t.insert(k, i as u32);
                    }
                }
                7..=12 => {
                    assert_eq!(t.remove(k), m.remove(&k), "remove {k}");
                }
                _ => {
                    // Move a key within its gap.
                    if let Some((&old, &v)) = m.range(k..).next() {
                        let lo = m.range(..old).next_back().map_or(0, |(&p, _)| p + 1);
                        let hi = m.range(old + 1..).next().map_or(key_space, |(&n, _)| n);
                        let new = lo + rnd() % (hi - lo);
                        if new != old {
                            t.set_key(old, new, v ^ 1);
                            m.remove(&old);
                            m.insert(new, v ^ 1);
                        }
                    }
                }
            }
            let q = rnd() % (key_space + 2);
            assert_eq!(t.pred(q).map(|c| t.get(c)), pred_model(&m, q), "pred {q}");
            assert_eq!(t.ceil(q).map(|c| t.get(c)), ceil_model(&m, q), "ceil {q}");
            if i % 97 == 0 {
                t.check().unwrap();
                let mut v = Vec::new();
                let mut c = t.first();
                while let Some(cc) = c {
                    v.push(t.get(cc));
                    c = t.next(cc);
                }
                let w: Vec<_> = m.iter().map(|(&a, &b)| (a, b)).collect();
                assert_eq!(v, w);
                let mut v = Vec::new();
                let mut c = t.last();
                while let Some(cc) = c {
                    v.push(t.get(cc));
                    c = t.prev(cc);
                }
                v.reverse();
                assert_eq!(v, w);
            }
        }
        t.check().unwrap();
        assert_eq!(t.len(), m.len());
    }

    /// `rank` against a count over the real keys, for every length, with
    /// probes at, between and beyond the keys, and with the largest key
    /// equal to the pad value.
    #[test]
    fn rank_counts_only_the_real_keys() {
        for len in 0..=CAP {
            for top_is_max in [false, true] {
                let mut keys = [PAD; CAP];
                for (i, k) in keys[..len].iter_mut().enumerate() {
                    *k = 10 * (i as u64 + 1);
                }
                if top_is_max && len > 0 {
                    keys[len - 1] = u64::MAX;
                }
                let last = 10 * len as u64;
                for probe in [0, 5, 10, 11, last, last + 1, u64::MAX - 1, u64::MAX] {
                    let real = &keys[..len];
                    let lt = real.iter().filter(|&&k| k < probe).count();
                    let le = real.iter().filter(|&&k| k <= probe).count();
                    assert_eq!(rank(&keys, len, |&k| k < probe), lt, "len {len} < {probe}");
                    assert_eq!(
                        rank(&keys, len, |&k| k <= probe),
                        le,
                        "len {len} <= {probe}"
                    );
                }
            }
        }
    }

    #[test]
    fn matches_btreemap_dense() {
        run(1, 60_000, 3_000, u64::MAX);
    }

    #[test]
    fn matches_btreemap_with_a_hint_per_few_keys() {
        // About one hint bucket per key: hints of merged-away and reused
        // leaves are looked up all the time.
        run(3, 60_000, 3_000, 3_000);
        run(5, 60_000, 1 << 20, 1 << 20);
    }

    #[test]
    fn matches_btreemap_sparse() {
        run(7, 60_000, 1 << 40, u64::MAX);
    }

    #[test]
    fn hint_table_grows_with_the_tree() {
        let mut t = AddrTree::<u32>::new(1 << 40);
        for k in 0..100u64 {
            t.insert(k << 20, k as u32);
        }
        // A few leaves: the first table.
        assert_eq!(t.hint_bits, HINT_MIN_BITS);
        assert!(t.hints.len() <= 1 << HINT_MIN_BITS);
        for k in 100..200_000u64 {
            t.insert(k << 20, k as u32);
        }
        // Thousands of leaves: the largest table, and lookups still agree.
        assert_eq!(t.hint_bits, HINT_BITS);
        assert!(t.hints.len() > 1 << (HINT_BITS - 1));
        for k in (0..200_000u64).step_by(997) {
            assert_eq!(t.get(t.ceil(k << 20).unwrap()), (k << 20, k as u32));
        }
        t.check().unwrap();
        // A span too small for more buckets than keys stays small.
        let mut small = AddrTree::<u32>::new(300);
        for k in 0..300u64 {
            small.insert(k, k as u32);
        }
        assert!(small.hints.len() <= 301);
    }

    #[test]
    fn grows_and_shrinks_to_nothing() {
        let mut t = AddrTree::<u32>::new(u64::MAX);
        for k in 0..50_000u64 {
            t.insert(k * 3, k as u32);
        }
        t.check().unwrap();
        assert!(t.height >= 2);
        // Appends fill leaves to CAP - MIN keys, not half.
        assert!(t.leaves.len() <= 50_000 / (CAP - MIN) + 1);
        for k in (0..50_000u64).rev() {
            assert_eq!(t.remove(k * 3), Some(k as u32));
            if k % 1000 == 0 {
                t.check().unwrap();
            }
        }
        assert_eq!(t.height, 0);
        assert_eq!(t.len(), 0);
        assert!(t.pred(10).is_none() && t.ceil(0).is_none());
    }
}
