//! `segfit`: the recommended engine. Best fit over coalesced free extents —
//! the shortest free extent that holds a request, the lowest address among
//! equals, found in O(log n) — with one departure that keeps a bounded
//! share of freed fragments whole for their exact sizes, and an
//! address-ordered B+tree for merging and double-free detection.
//!
//! Free space is a set of maximal free extents. Each lives in a node that is
//! on two indexes at once:
//! * a **size class** ([`classes`]): 1024 exact-size classes (every object
//!   size from 4 KiB to 4 MiB) and TLSF-style classes above, with a
//!   two-level bitmap to find the smallest non-empty class `>= n` in O(1);
//!   each class keeps its extents in a min-heap by `(length, start)`
//!   ([`heap`]), so its root is the class's best fit;
//! * the **address tree** ([`btree::AddrTree`]), keyed by the block just past
//!   the extent (its end), so that cutting from the front or growing to the
//!   left leaves the tree untouched.
//!
//! Operations:
//! * allocate(n) takes the best fit, except in one case: when the best fit
//!   is a *fragment* (an extent of at most 1024 blocks) longer than `n`, the
//!   free blocks in fragments, plus one longest request, are at most 1/1024
//!   of the device, and the longer extents hold more free blocks than the
//!   fragments, the `n` blocks come from the shortest extent longer than
//!   1024 blocks instead, and the fragment waits whole for a request of its
//!   own size (as the notes' fast bins keep freed extents for their exact
//!   size: no sliver is cut). The bound is the point: were the stream to
//!   turn at once to requests no fragment can serve, the fragments kept
//!   whole would be lost where a best fit would have filled them, and they
//!   hold at most 1/1024 of the device (the cuts made in the long extents
//!   instead are not so bounded). Near the end, when the long
//!   extents hold no more than the fragments, the fragments are filled
//!   first. On a stationary stream the wait leaves no slivers, and the
//!   device fills to its last blocks. The `n` blocks are cut from the
//!   **front** of the chosen extent, so its key (the end) and the tree stay
//!   untouched unless the extent is used up; successive cuts from one
//!   extent ascend, adjacent. Allocation fails only when no free extent
//!   holds `n` blocks.
//! * allocate(n, hint h): if `h` lies in a free extent with room for
//!   `[h, h+n)` that range is taken (an I/O stream passing its last end gets
//!   adjacent extents); otherwise the first of the next few free extents
//!   after `h` that fits, cut from its start; otherwise as without a hint.
//! * free(e): one tree lookup finds the first free extent ending after
//!   `e.start`; if it starts before `e.end` the free is refused (double
//!   free), if it starts at `e.end` the two merge; the entry before it merges
//!   if it ends at `e.start`. So a free creates, extends or merges nodes at
//!   once: no compaction ever.
//! * allocate_scattered(n): one extent when one fits; otherwise the largest
//!   extents whole, then a best fit for the rest. Fails only when fewer than
//!   `n` blocks are free.
//!
//! Complexity: allocate and free O(log F) for `F` free extents (a class
//! heap's sift and the B+tree's O(log₃₂ F) descent); a cut that keeps its
//! extent in its class and at its heap's root is O(1). Memory: about 24
//! bytes per free extent in nodes, 24 in a class heap (stale items add at
//! most half as many again), 16–22 in the tree; nothing per allocated
//! extent.
//!
//! Invariants (checked by `verify`):
//! * every node has exactly one current item, in the class of its length,
//!   and is in the tree under its end; class bit `c` is set iff class `c`
//!   has a node; each class heap is in order;
//! * free extents lie in the device, are disjoint, and **no two touch**
//!   (they would have merged);
//! * `used + Σ free lengths == capacity`; the fragment counter is the sum
//!   of the fragments' lengths.

pub(crate) mod btree;
mod classes;
mod heap;
mod prefault;

use std::num::NonZeroU32;

use self::btree::AddrTree;
use self::classes::{class_of, ClassBits, CLASSES, EXACT};
use self::heap::{ClassHeap, Item};
use crate::allocator::{check_alloc, check_free_list, check_free_range};
use crate::error::{AllocError, BuildError, FreeError, VerifyError};
use crate::{Allocator, Extent, FromFreeExtents, Status, StatusBuilder};

/// Fragments may wait for their exact requests while they and one longest
/// request hold at most `capacity >> WAIT_CAP_SHIFT` blocks: 1/1024 of the
/// device, so that the fragments kept whole hold at most about 0.1 points
/// of utilisation (what the requests passing them over cut from the long
/// extents is not bounded: see `docs/design.md`).
const WAIT_CAP_SHIFT: u32 = 10;
/// How many free extents after a hint are tried before falling back to best
/// fit.
const NEAR_SCAN: usize = 8;

/// A node index; `Option<NodeId>` is four bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NodeId(NonZeroU32);

impl NodeId {
    fn from_index(i: usize) -> NodeId {
        let v = u32::try_from(i + 1).expect("more than 2^32 free extents");
        NodeId(NonZeroU32::new(v).expect("i + 1 is never zero"))
    }
    #[inline]
    fn index(self) -> usize {
        self.0.get() as usize - 1
    }
    #[inline]
    fn raw(self) -> u32 {
        self.0.get()
    }
    #[inline]
    fn from_raw(v: u32) -> NodeId {
        NodeId(NonZeroU32::new(v).expect("tree values are node ids"))
    }
}

/// A tree entry: the node of a free extent, and a lower bound on its start,
/// as a distance below the entry's key (the extent's end).
///
/// The bound is exact when written and may fall behind when allocations cut
/// the extent from the front (that leaves the tree alone). It lets `free`
/// rule out an overlap or a merge with the next free extent (`lo > e`)
/// without loading the node, which for a random free is a cache miss.
/// Stored as a `u32` distance, the entry is 8 bytes: a leaf is 2/3 the size
/// it would be with an absolute `u64` bound, and inserts and removals shift
/// less. A distance too long for `u32` is stored as `u32::MAX`, read as "no
/// bound" (0). Invariant: `lo(key) <= node.start`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Entry {
    id: u32,
    gap: u32,
}

impl Entry {
    /// The entry of node `id` for the free extent `[start, end)` (or a
    /// start bound `start` below the real start).
    #[inline]
    fn new(id: NodeId, start: u64, end: u64) -> Entry {
        let gap = u32::try_from(end - start).unwrap_or(u32::MAX);
        Entry { id: id.raw(), gap }
    }
    #[inline]
    fn node(self) -> NodeId {
        NodeId::from_raw(self.id)
    }
    /// The start bound, for the entry under `key`.
    #[inline]
    fn lo(self, key: u64) -> u64 {
        if self.gap == u32::MAX {
            0
        } else {
            key - u64::from(self.gap)
        }
    }
}

/// One free extent.
#[derive(Clone, Copy, Debug)]
struct Node {
    start: u64,
    len: u64,
    /// Bumped whenever the node leaves its class or changes: the class
    /// heap's items of older generations are stale ([`heap`]).
    gen: u32,
}

/// Whether `it` still describes its node: same generation, length and
/// start.
#[inline(always)]
fn is_current(nodes: &[Node], it: &Item) -> bool {
    let n = &nodes[NodeId::from_raw(it.id).index()];
    n.gen == it.gen && n.len == it.len && n.start == it.start
}

/// The recommended engine: best fit with immediate coalescing, and freed
/// fragments kept whole for their exact requests within a bound of 1/1024
/// of the device. `docs/design.md` describes the policy and why it packs
/// well.
///
/// ```
/// use blockalloc::{Allocator, Extent, FromFreeExtents, SegFitAllocator};
/// let mut a = SegFitAllocator::with_capacity(1000)?;
/// let x = a.allocate(10, None)?;
/// let y = a.allocate(10, None)?;
/// a.free(x)?;
/// a.free(y)?; // merges with x's space and the rest of the device
/// assert_eq!(a.free_extents(), vec![Extent::new(0, 1000)?]);
/// # Ok::<(), blockalloc::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SegFitAllocator {
    capacity: u64,
    used: u64,
    nodes: Vec<Node>,
    /// Slots of `nodes`' buffer written so far (see [`prefault`]).
    nodes_written: usize,
    /// Indices of unused nodes.
    spare: Vec<NodeId>,
    /// Per size class, its free extents in `(length, start)` order.
    classes: Box<[ClassHeap]>,
    /// Per size class, the nodes in it (its heap may hold stale items too).
    live: Box<[u32]>,
    bits: ClassBits,
    tree: AddrTree<Entry>,
    /// Free blocks in extents of at most `EXACT` blocks.
    fragment_blocks: u64,
    /// Free blocks in long runs the owner can add (see
    /// [`set_refill_blocks`](Self::set_refill_blocks)).
    refill_blocks: u64,
}

impl SegFitAllocator {
    /// Engine name.
    pub const NAME: &'static str = "segfit";

    /// The least [`set_refill_blocks`](Self::set_refill_blocks) that
    /// counts: room for four of the largest requests with exact classes
    /// (4 × 1024 blocks).
    pub const MIN_REFILL: u64 = 4 * EXACT;

    #[inline]
    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    #[inline]
    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id.index()]
    }

    #[inline]
    fn new_node(&mut self, start: u64, len: u64) -> NodeId {
        match self.spare.pop() {
            Some(id) => {
                // The generation goes on: items of the node's past stay stale.
                let n = self.node_mut(id);
                n.start = start;
                n.len = len;
                id
            }
            None => self.grow_nodes(Node { start, len, gen: 0 }),
        }
    }

    /// `new_node` when no node is spare: the array grows, only while the
    /// number of free extents reaches a new high (one new node in 20 on the
    /// seed run), so it is kept out of line.
    #[cold]
    fn grow_nodes(&mut self, n: Node) -> NodeId {
        let blank = Node {
            start: 0,
            len: 0,
            gen: 0,
        };
        prefault::push(&mut self.nodes, &mut self.nodes_written, n, blank);
        NodeId::from_index(self.nodes.len() - 1)
    }

    /// Files `id` in its class.
    #[inline(always)]
    fn link(&mut self, id: NodeId) {
        let c = class_of(self.node(id).len);
        self.link_in(id, c);
    }

    /// Files `id` in class `c`, its class.
    #[inline(always)]
    fn link_in(&mut self, id: NodeId, c: usize) {
        debug_assert_eq!(c, class_of(self.node(id).len));
        if self.live[c] == 0 {
            self.bits.set(c);
        }
        self.live[c] += 1;
        self.file(id, c);
        if c < EXACT as usize {
            self.fragment_blocks += self.node(id).len;
        }
    }

    /// Pushes the current item of `id` into class `c`'s heap, rebuilding
    /// the heap once stale items outnumber the live ones.
    #[inline(always)]
    fn file(&mut self, id: NodeId, c: usize) {
        let n = *self.node(id);
        let heap = &mut self.classes[c];
        heap.push(Item {
            len: n.len,
            start: n.start,
            id: id.raw(),
            gen: n.gen,
        });
        let live = self.live[c] as usize;
        if heap.len() > live + live / 2 + 16 {
            self.compact(c);
        }
    }

    /// Drops class `c`'s stale items (and the room of a heap that was once
    /// much longer).
    #[cold]
    fn compact(&mut self, c: usize) {
        let nodes = &self.nodes;
        self.classes[c].retain(|it| is_current(nodes, it));
    }

    /// Takes `id` out of its class (the class of its current length).
    #[inline(always)]
    fn unlink(&mut self, id: NodeId) {
        let c = class_of(self.node(id).len);
        self.unlink_from(id, c);
    }

    /// Takes `id` out of class `c`, its class: its item goes stale (and is
    /// dropped at once when it is the root, as after a best fit).
    #[inline(always)]
    fn unlink_from(&mut self, id: NodeId, c: usize) {
        debug_assert_eq!(c, class_of(self.node(id).len));
        let gen = self.node(id).gen;
        self.node_mut(id).gen = gen.wrapping_add(1);
        self.live[c] -= 1;
        let heap = &mut self.classes[c];
        if self.live[c] == 0 {
            self.bits.clear(c);
            heap.clear();
        } else if heap.root_is(id.raw(), gen) {
            heap.pop();
        }
        if c < EXACT as usize {
            self.fragment_blocks -= self.node(id).len;
        }
    }

    /// Class `c`'s best fit: its shortest extent, the lowest address among
    /// equals (stale items on the way are dropped).
    #[inline]
    fn top(&mut self, c: usize) -> Option<NodeId> {
        loop {
            let it = *self.classes[c].root()?;
            if is_current(&self.nodes, &it) {
                return Some(NodeId::from_raw(it.id));
            }
            self.classes[c].pop();
        }
    }

    /// Makes node `id` describe `[start, start + len)`. Cutting the front
    /// of a class's best fit without leaving the class only lowers the
    /// root's key; any other change files a new item and leaves the old
    /// one stale.
    #[inline(always)]
    fn reshape(&mut self, id: NodeId, start: u64, len: u64) {
        let old = *self.node(id);
        let (from, to) = (class_of(old.len), class_of(len));
        if from != to {
            self.unlink_from(id, from);
            let n = self.node_mut(id);
            n.start = start;
            n.len = len;
            self.link_in(id, to);
            return;
        }
        let n = self.node_mut(id);
        n.start = start;
        n.len = len;
        let heap = &mut self.classes[from];
        if heap.root_is(id.raw(), old.gen) && (len, start) <= (old.len, old.start) {
            heap.lower_root(len, start);
        } else {
            self.node_mut(id).gen = old.gen.wrapping_add(1);
            self.file(id, from);
        }
    }

    /// The best fit for `len` blocks: the shortest free extent that holds
    /// them, the lowest address among equals.
    #[inline(always)]
    fn best_fit(&mut self, len: u64) -> Option<NodeId> {
        let c = class_of(len);
        if len <= EXACT {
            // Every extent of an exact class at or above `c`, and of any
            // range class, holds `len`: the first non-empty class's best.
            let f = self.bits.first_at_or_after(c)?;
            return self.top(f);
        }
        // A range class holds lengths on both sides of `len`: its least
        // fitting item, else the next non-empty class's best.
        if self.live[c] > 0 {
            let nodes = &self.nodes;
            if let Some(it) = self.classes[c].least_at_least(len, |it| is_current(nodes, it)) {
                return Some(NodeId::from_raw(it.id));
            }
        }
        let next = self.bits.first_at_or_after(c + 1)?;
        self.top(next)
    }

    /// Chooses the free extent to cut `len` blocks from (see the module
    /// docs). With `may_refill`, `None` also when the policy would keep the
    /// best fit whole, no long extent is here, and the owner can add one
    /// (see [`set_refill_blocks`](Self::set_refill_blocks)).
    #[inline(always)]
    fn choose(&mut self, len: u64, may_refill: bool) -> Option<NodeId> {
        let fit = self.best_fit(len)?;
        let have = self.node(fit).len;
        if have == len
            || have > EXACT
            || self.fragment_blocks + EXACT > self.wait_cap()
            || self.long_blocks() <= self.fragment_blocks
        {
            return Some(fit);
        }
        // The best fit is a fragment longer than the request: while few
        // blocks are in fragments, it waits for a request of its own size
        // and the cut comes from the shortest long extent. Once the long
        // extents hold no more than the fragments, the device is about to
        // end with fragments only: they are filled first, by best fit, and
        // the long extents are left to the requests no fragment holds.
        if let Some(c) = self.bits.first_at_or_after(EXACT as usize) {
            return self.top(c);
        }
        if may_refill && self.refill_blocks >= Self::MIN_REFILL {
            return None;
        }
        Some(fit)
    }

    /// Free blocks in extents longer than `EXACT`, with the long runs the
    /// owner can add (see [`set_refill_blocks`](Self::set_refill_blocks)).
    #[inline(always)]
    fn long_blocks(&self) -> u64 {
        let own = self.capacity - self.used - self.fragment_blocks;
        if self.refill_blocks >= Self::MIN_REFILL {
            own.saturating_add(self.refill_blocks)
        } else {
            own
        }
    }

    /// The most free blocks in fragments (extents of at most `EXACT`
    /// blocks) at which a fragment may still wait for its exact request.
    #[inline(always)]
    fn wait_cap(&self) -> u64 {
        self.capacity >> WAIT_CAP_SHIFT
    }

    /// Cuts `len` blocks from the front of node `id` (all of it if it is
    /// that long). The tree is keyed by end, so it is touched only when the
    /// node disappears.
    #[inline(always)]
    fn take_front(&mut self, id: NodeId, len: u64) -> Extent {
        let Node {
            start, len: have, ..
        } = *self.node(id);
        debug_assert!(have >= len);
        self.used += len;
        if have == len {
            self.unlink(id);
            self.tree.remove(start + have);
            self.spare.push(id);
        } else {
            self.reshape(id, start + len, have - len);
        }
        Extent::new_unchecked(start, len)
    }

    /// Cuts `[at, at + len)` out of node `id`, which must contain it.
    fn take_at(&mut self, id: NodeId, at: u64, len: u64) -> Extent {
        let Node {
            start, len: have, ..
        } = *self.node(id);
        let end = start + have;
        debug_assert!(start <= at && at + len <= end);
        if at == start {
            return self.take_front(id, len);
        }
        self.used += len;
        if at + len == end {
            // Shrink from the right: the key (the end) falls but keeps its rank.
            self.tree.set_key(end, at, Entry::new(id, start, at));
            self.reshape(id, start, at - start);
        } else {
            // Split: the node keeps the right part and its key; the left part
            // is a new node ending at `at`.
            self.reshape(id, at + len, end - at - len);
            let left = self.new_node(start, at - start);
            self.tree.insert(at, Entry::new(left, start, at));
            self.link(left);
        }
        Extent::new_unchecked(at, len)
    }

    /// Near `hint`: the free extent holding it if `[hint, hint+len)` fits,
    /// else the first of the next few free extents that fits.
    fn allocate_near(&mut self, hint: u64, len: u64) -> Option<Extent> {
        // The first free extent ending after the hint holds it or follows it.
        // (`hint` may be `u64::MAX` on a device that large: nothing ends after it.)
        let mut cur = hint.checked_add(1).and_then(|k| self.tree.ceil(k));
        if let Some(c) = cur {
            let id = self.tree.get(c).1.node();
            let n = *self.node(id);
            if n.start <= hint {
                if n.start + n.len - hint >= len {
                    return Some(self.take_at(id, hint, len));
                }
                cur = self.tree.next(c);
            }
        }
        for _ in 0..NEAR_SCAN {
            let c = cur?;
            let id = self.tree.get(c).1.node();
            let n = *self.node(id);
            if n.len >= len {
                return Some(self.take_at(id, n.start, len));
            }
            cur = self.tree.next(c);
        }
        None
    }

    /// The longest free extent's length (0 when full): O(1) when the
    /// largest non-empty class is an exact class, else a scan of it.
    pub fn largest_free(&self) -> u64 {
        let Some(c) = self.bits.last() else { return 0 };
        if c < EXACT as usize {
            return c as u64 + 1;
        }
        self.longest_in(c).map_or(0, |it| it.len)
    }

    /// The longest free extent, the lowest address among equals: the best
    /// fit of the largest non-empty class when it is an exact class (its
    /// extents are equally long), else a scan of that class.
    fn largest(&mut self) -> Option<NodeId> {
        let c = self.bits.last()?;
        if c < EXACT as usize {
            return self.top(c);
        }
        self.longest_in(c).map(|it| NodeId::from_raw(it.id))
    }

    /// Range class `c`'s longest current item, the lowest address among
    /// equals: a scan of the class.
    fn longest_in(&self, c: usize) -> Option<Item> {
        self.classes[c]
            .items()
            .iter()
            .filter(|it| is_current(&self.nodes, it))
            .max_by_key(|it| (it.len, std::cmp::Reverse(it.start)))
            .copied()
    }

    fn no_space(&self, requested: u64) -> AllocError {
        AllocError::NoSpace {
            requested,
            free: self.capacity - self.used,
            largest_free: self.largest_free(),
        }
    }

    /// Tells the engine how many free blocks in long runs its owner can
    /// add to it on request: a pool's untouched regions, a server's unleased
    /// space. `0`, the default, makes the engine decide from its own free
    /// space alone, as a whole device.
    ///
    /// An engine that holds part of a device (an arena, a lease) and holds
    /// no long extent of its own would otherwise cut its best-fit fragment
    /// where the policy would keep it whole for its exact request, while
    /// long runs stay free elsewhere: the device then fills worse than one
    /// engine over all of it. With `blocks` of at least
    /// [`MIN_REFILL`](Self::MIN_REFILL), such an allocation fails with
    /// [`AllocError::NoSpace`] (with `largest_free` of at least the
    /// request), so that the owner adds a run and asks again. The owner sets
    /// `0` again once it can add no more.
    pub fn set_refill_blocks(&mut self, blocks: u64) {
        self.refill_blocks = blocks;
    }

    /// The value last given to [`set_refill_blocks`](Self::set_refill_blocks).
    pub fn refill_blocks(&self) -> u64 {
        self.refill_blocks
    }

    /// Free blocks in extents of at most 1024 blocks: the fragments, which
    /// the policy keeps for requests of about their size (the rest of the
    /// free space is long runs).
    pub fn fragment_blocks(&self) -> u64 {
        self.fragment_blocks
    }

    /// Number of free extents (all maximal: no two touch).
    pub fn free_extent_count(&self) -> u64 {
        self.tree.len() as u64
    }

    /// Takes every free block inside `range` out of this engine, as if it
    /// had been allocated, and returns the free extents it took (clipped to
    /// `range`, in address order). Used to hand a region's free space from
    /// one engine to another; O(k log F) for `k` extents.
    ///
    /// ```
    /// use blockalloc::{Allocator, Extent, FromFreeExtents, SegFitAllocator};
    /// let mut a = SegFitAllocator::with_capacity(100)?;
    /// let x = a.allocate(10, Some(20))?;
    /// let taken = a.take_free_range(Extent::new(0, 50)?);
    /// assert_eq!(taken, vec![Extent::new(0, 20)?, Extent::new(30, 20)?]);
    /// assert_eq!(a.free_extents(), vec![Extent::new(50, 50)?]);
    /// # Ok::<(), blockalloc::Error>(())
    /// ```
    pub fn take_free_range(&mut self, range: Extent) -> Vec<Extent> {
        let mut taken = Vec::new();
        let (a, b) = (range.start(), range.end());
        loop {
            let finger = self.tree.finger(a + 1);
            let Some(c) = self.tree.at(&finger) else {
                break;
            };
            let id = self.tree.get(c).1.node();
            let n = *self.node(id);
            if n.start >= b {
                break;
            }
            let s = n.start.max(a);
            let e = (n.start + n.len).min(b);
            taken.push(self.take_at(id, s, e - s));
        }
        taken
    }

    /// Appends the maximal free extents that overlap `range` (whole, not
    /// clipped) to `out`, in address order; changes nothing. O(log F + k)
    /// for `k` extents.
    ///
    /// ```
    /// use blockalloc::{Allocator, Extent, FromFreeExtents, SegFitAllocator};
    /// let mut a = SegFitAllocator::with_capacity(100)?;
    /// a.allocate(10, Some(20))?;
    /// let mut out = Vec::new();
    /// a.free_extents_overlapping(Extent::new(25, 10)?, &mut out);
    /// assert_eq!(out, vec![Extent::new(30, 70)?]);
    /// # Ok::<(), blockalloc::Error>(())
    /// ```
    pub fn free_extents_overlapping(&self, range: Extent, out: &mut Vec<Extent>) {
        let finger = self.tree.finger(range.start() + 1);
        let mut cur = self.tree.at(&finger);
        while let Some(c) = cur {
            let n = self.node(self.tree.get(c).1.node());
            if n.start >= range.end() {
                break;
            }
            out.push(Extent::new_unchecked(n.start, n.len));
            cur = self.tree.next(c);
        }
    }

    /// `Ok` when every block of `extent` is allocated (so that
    /// [`Allocator::free`] would accept it), else the free part found.
    /// Changes nothing.
    ///
    /// # Errors
    /// [`FreeError::OutOfRange`] or [`FreeError::NotAllocated`], exactly as
    /// `free` would return them.
    pub fn check_allocated(&self, extent: Extent) -> Result<(), FreeError> {
        check_free_range(self.capacity, extent)?;
        let finger = self.tree.finger(extent.start() + 1);
        if let Some(c) = self.tree.at(&finger) {
            let n = self.node(self.tree.get(c).1.node());
            if n.start < extent.end() {
                let overlap = Extent::new_unchecked(n.start, n.len)
                    .intersection(&extent)
                    .expect("a free extent ending after s and starting before e overlaps");
                return Err(FreeError::NotAllocated { extent, overlap });
            }
        }
        Ok(())
    }
}

impl FromFreeExtents for SegFitAllocator {
    fn from_free_extents(capacity: u64, free: &[Extent]) -> Result<Self, BuildError> {
        check_free_list(capacity, free)?;
        let mut a = SegFitAllocator {
            capacity,
            used: capacity,
            nodes: Vec::new(),
            nodes_written: 0,
            spare: Vec::new(),
            classes: (0..CLASSES).map(|_| ClassHeap::default()).collect(),
            live: vec![0; CLASSES].into_boxed_slice(),
            bits: ClassBits::new(),
            tree: AddrTree::new(capacity),
            fragment_blocks: 0,
            refill_blocks: 0,
        };
        let mut i = 0;
        while i < free.len() {
            let start = free[i].start();
            let mut end = free[i].end();
            i += 1;
            while i < free.len() && free[i].start() == end {
                end = free[i].end();
                i += 1;
            }
            let id = a.new_node(start, end - start);
            a.tree.insert(end, Entry::new(id, start, end));
            a.link(id);
            a.used -= end - start;
        }
        Ok(a)
    }
}

impl Allocator for SegFitAllocator {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn capacity(&self) -> u64 {
        self.capacity
    }

    fn used(&self) -> u64 {
        self.used
    }

    fn allocate(&mut self, len: u64, hint: Option<u64>) -> Result<Extent, AllocError> {
        check_alloc(self.capacity, len, hint)?;
        if len > self.capacity - self.used {
            return Err(self.no_space(len));
        }
        if let Some(h) = hint {
            if let Some(e) = self.allocate_near(h, len) {
                return Ok(e);
            }
        }
        match self.choose(len, true) {
            Some(id) => Ok(self.take_front(id, len)),
            None => Err(self.no_space(len)),
        }
    }

    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        check_alloc(self.capacity, len, None)?;
        if len > self.capacity - self.used {
            return Err(self.no_space(len));
        }
        let mut need = len;
        loop {
            if let Some(id) = self.choose(need, false) {
                out.push(self.take_front(id, need));
                return Ok(());
            }
            // Nothing holds the rest: take the head of the largest class.
            let id = self.largest().expect("free counter says blocks are free");
            let have = self.node(id).len;
            debug_assert!(have < need);
            out.push(self.take_front(id, have));
            need -= have;
        }
    }

    fn free(&mut self, extent: Extent) -> Result<(), FreeError> {
        check_free_range(self.capacity, extent)?;
        let (s, e) = (extent.start(), extent.end());
        // One descent towards `s + 1`. The first free extent ending after
        // `s` either overlaps the freed range, starts right at its end
        // (merge right), or lies beyond it; the one before it merges left if
        // it ends at `s`. Every change below happens at this finger.
        let finger = self.tree.finger(s + 1);
        let mut right = None;
        let at = self.tree.at(&finger);
        if let Some(c) = at {
            let (key, entry) = self.tree.get(c);
            // `lo > e` proves the next free extent starts after `e`: no
            // overlap, no merge, and no need to load its node.
            if entry.lo(key) <= e {
                let id = entry.node();
                let n = *self.node(id);
                if n.start < e {
                    let overlap = Extent::new_unchecked(n.start, n.len)
                        .intersection(&extent)
                        .expect("a free extent ending after s and starting before e overlaps");
                    return Err(FreeError::NotAllocated { extent, overlap });
                }
                if n.start == e {
                    right = Some((id, c, key));
                } else if entry.lo(key) != n.start {
                    self.tree.set_val(c, Entry::new(id, n.start, key));
                }
            }
        }
        let left = self
            .tree
            .before(&finger)
            .map(|c| self.tree.get(c))
            .filter(|&(end, _)| end == s)
            .map(|(_, v)| v.node());
        self.used -= extent.len();
        match (left, right) {
            (None, None) => {
                let id = self.new_node(s, extent.len());
                self.tree.insert_at(&finger, e, Entry::new(id, s, e));
                self.link(id);
            }
            (Some(l), None) => {
                // Grows to the right: its key moves from `s` to `e`.
                let n = *self.node(l);
                self.tree
                    .set_key_before(&finger, e, Entry::new(l, n.start, e));
                self.reshape(l, n.start, n.len + extent.len());
            }
            (None, Some((r, c, key))) => {
                // Grows to the left: its key (the end) stays, `lo` follows.
                self.tree.set_val(c, Entry::new(r, s, key));
                let n = *self.node(r);
                self.reshape(r, s, n.len + extent.len());
            }
            (Some(l), Some((r, c, key))) => {
                let left = *self.node(l);
                self.tree.set_val(c, Entry::new(r, left.start, key));
                self.unlink(l);
                self.tree.remove_before(&finger);
                self.spare.push(l);
                let right = *self.node(r);
                self.reshape(r, left.start, left.len + extent.len() + right.len);
            }
        }
        Ok(())
    }

    fn status(&self) -> Status {
        let mut b = StatusBuilder::new(self.capacity);
        self.for_each_free_extent(&mut |e| b.push(e));
        b.finish()
    }

    fn memory_bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.spare.capacity() * 4
            + self.classes.len() * (std::mem::size_of::<ClassHeap>() + 4)
            + self
                .classes
                .iter()
                .map(ClassHeap::capacity_bytes)
                .sum::<usize>()
            + std::mem::size_of::<ClassBits>()
            + self.tree.memory_bytes()
    }

    fn for_each_free_extent(&self, f: &mut dyn FnMut(Extent)) {
        let mut cur = self.tree.first();
        while let Some(c) = cur {
            let n = self.node(self.tree.get(c).1.node());
            f(Extent::new_unchecked(n.start, n.len));
            cur = self.tree.next(c);
        }
    }

    fn verify(&self) -> Result<(), VerifyError> {
        let fail = |what: String| Err(VerifyError::new(Self::NAME, what));
        if let Err(what) = self.tree.check() {
            return fail(format!("address tree: {what}"));
        }
        let live = self.nodes.len() - self.spare.len();
        if live != self.tree.len() {
            return fail(format!(
                "{live} live nodes but {} tree entries",
                self.tree.len()
            ));
        }
        let mut free = 0u64;
        let mut prev_end: Option<u64> = None;
        let mut cur = self.tree.first();
        while let Some(c) = cur {
            let (key, entry) = self.tree.get(c);
            let Some(n) = (entry.id != 0)
                .then(|| self.nodes.get(entry.node().index()))
                .flatten()
            else {
                return fail(format!(
                    "tree key {key} points to missing node {}",
                    entry.id
                ));
            };
            if n.start.checked_add(n.len) != Some(key) || n.len == 0 {
                return fail(format!("tree key {key} holds node [{}+{}]", n.start, n.len));
            }
            if entry.lo(key) > n.start {
                return fail(format!(
                    "tree key {key}: start bound {} above the start {}",
                    entry.lo(key),
                    n.start
                ));
            }
            let end = key;
            if end > self.capacity {
                return fail(format!(
                    "free extent ending at {key} runs past the device end"
                ));
            }
            if let Some(p) = prev_end {
                if p >= n.start {
                    return fail(format!(
                        "free extent at {key} touches or overlaps the one ending at {p}"
                    ));
                }
            }
            prev_end = Some(end);
            free += n.len;
            cur = self.tree.next(c);
        }
        let mut listed = 0usize;
        let mut fragments = 0u64;
        for c in 0..CLASSES {
            if self.bits.get(c) != (self.live[c] > 0) {
                return fail(format!("class {c}: bit and live count disagree"));
            }
            if let Err(what) = self.classes[c].check() {
                return fail(format!("class {c}: {what}"));
            }
            let mut current = 0usize;
            for it in self.classes[c].items() {
                let Some(n) = self.nodes.get(it.id.wrapping_sub(1) as usize) else {
                    return fail(format!("class {c}: missing node {}", it.id));
                };
                if !(n.gen == it.gen && n.len == it.len && n.start == it.start) {
                    continue;
                }
                if class_of(n.len) != c {
                    return fail(format!(
                        "extent at {} of {} blocks filed in class {c}",
                        n.start, n.len
                    ));
                }
                current += 1;
            }
            if current != self.live[c] as usize {
                return fail(format!(
                    "class {c}: {current} current items, {} live nodes",
                    self.live[c]
                ));
            }
            if c < EXACT as usize {
                fragments += current as u64 * (c as u64 + 1);
            }
            listed += current;
        }
        if fragments != self.fragment_blocks {
            return fail(format!(
                "{fragments} blocks in fragments, counted {}",
                self.fragment_blocks
            ));
        }
        if listed != live {
            return fail(format!("{listed} nodes in class lists, {live} live"));
        }
        if self.used + free != self.capacity {
            return fail(format!(
                "used {} + free {free} != capacity {}",
                self.used, self.capacity
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hint_gives_adjacent_extents() {
        let mut a = SegFitAllocator::with_capacity(10_000).unwrap();
        let mut next = 100;
        for _ in 0..20 {
            let e = a.allocate(7, Some(next)).unwrap();
            assert_eq!(e.start(), next);
            next = e.end();
            a.verify().unwrap();
        }
        // A hint inside allocated space lands on the next free space after it.
        let e = a.allocate(5, Some(100)).unwrap();
        assert_eq!(e.start(), next);
    }

    #[test]
    fn take_free_range_moves_exactly_the_free_blocks_in_range() {
        let mut a = SegFitAllocator::with_capacity(5000).unwrap();
        let mut live = Vec::new();
        let mut x = 12345u64;
        for _ in 0..400 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if x >> 63 == 0 || live.is_empty() {
                if let Ok(e) = a.allocate((x >> 40) % 40 + 1, None) {
                    live.push(e);
                }
            } else {
                let i = (x >> 20) as usize % live.len();
                a.free(live.swap_remove(i)).unwrap();
            }
        }
        let before = a.free_extents();
        for (s, len) in [(0u64, 5000u64), (100, 1), (777, 1234), (4990, 10)] {
            let mut b = a.clone();
            let range = Extent::new(s, len).unwrap();
            let taken = b.take_free_range(range);
            b.verify().unwrap();
            let want: Vec<Extent> = before
                .iter()
                .filter_map(|f| f.intersection(&range))
                .collect();
            assert_eq!(taken, want);
            assert!(b.free_extents().iter().all(|f| !f.overlaps(&range)));
            assert_eq!(
                b.used(),
                a.used() + want.iter().map(|e| e.len()).sum::<u64>()
            );
            for e in taken {
                assert!(b.check_allocated(e).is_ok());
                assert!(a.check_allocated(e).is_err());
                b.free(e).unwrap();
            }
            assert_eq!(b.free_extents(), before);
            b.verify().unwrap();
        }
    }

    #[test]
    fn free_extents_too_long_for_the_entry_gap() {
        // Free extents longer than 2^32 blocks store no start bound in the
        // tree; merges and double-free checks must still be exact.
        let cap = (1u64 << 40) + 7;
        let mut a = SegFitAllocator::with_capacity(cap).unwrap();
        let x = a.allocate(10, Some(1 << 35)).unwrap();
        assert_eq!(x.start(), 1 << 35);
        let y = a.allocate(5, Some(x.end())).unwrap();
        a.verify().unwrap();
        // Freeing free space on either side of the allocations is refused.
        for bad in [
            Extent::new(x.start() - 1, 2).unwrap(),
            Extent::new(y.end() - 1, 2).unwrap(),
            Extent::new(0, 1).unwrap(),
            Extent::new(cap - 1, 1).unwrap(),
        ] {
            assert!(matches!(a.free(bad), Err(FreeError::NotAllocated { .. })));
        }
        a.verify().unwrap();
        a.free(x).unwrap();
        assert_eq!(a.free_extent_count(), 2);
        assert!(matches!(a.free(x), Err(FreeError::NotAllocated { .. })));
        a.free(y).unwrap();
        assert_eq!(a.free_extents(), vec![Extent::new(0, cap).unwrap()]);
        a.verify().unwrap();
    }

    /// What the policy must choose for `len` blocks over `free` (address
    /// order): the best fit — the shortest free extent that holds `len`,
    /// the lowest address among equals — unless it is a fragment longer
    /// than `len`, the fragments are few and the long extents hold more;
    /// then the shortest long extent.
    fn model_choice(free: &[Extent], capacity: u64, len: u64) -> Option<u64> {
        let best = |min: u64| {
            free.iter()
                .filter(|e| e.len() >= min)
                .min_by_key(|e| (e.len(), e.start()))
                .copied()
        };
        let fit = best(len)?;
        let fragments: u64 = free.iter().map(|e| e.len()).filter(|&l| l <= EXACT).sum();
        let long: u64 = free.iter().map(|e| e.len()).filter(|&l| l > EXACT).sum();
        if fit.len() == len
            || fit.len() > EXACT
            || fragments + EXACT > capacity >> WAIT_CAP_SHIFT
            || long <= fragments
        {
            return Some(fit.start());
        }
        Some(best(EXACT + 1).unwrap_or(fit).start())
    }

    #[test]
    fn every_choice_is_the_models() {
        // Devices on both sides of the fragment cap, requests of fragment
        // sizes and longer, frees in random order.
        for (capacity, seed) in [(1u64 << 20, 1u64), (1 << 22, 2), (1 << 24, 3), (3 << 20, 4)] {
            let mut a = SegFitAllocator::with_capacity(capacity).unwrap();
            let mut live: Vec<Extent> = Vec::new();
            let mut x = seed;
            let mut rnd = |n: u64| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 33) % n
            };
            let mut waited = 0;
            for step in 0..6000 {
                if live.is_empty() || rnd(100) < 55 {
                    let len = match rnd(10) {
                        0 => 1025 + rnd(3000),
                        1..=3 => 1 + rnd(8),
                        _ => 1 + rnd(EXACT),
                    };
                    let free = a.free_extents();
                    let want = model_choice(&free, capacity, len);
                    let fit = free
                        .iter()
                        .filter(|e| e.len() >= len)
                        .min_by_key(|e| (e.len(), e.start()))
                        .map(|e| e.start());
                    waited += usize::from(want != fit);
                    match a.allocate(len, None) {
                        Ok(e) => {
                            assert_eq!(Some(e.start()), want, "step {step}: {len} blocks");
                            live.push(e);
                        }
                        Err(_) => assert_eq!(want, None, "step {step}: {len} blocks"),
                    }
                } else {
                    let i = rnd(live.len() as u64) as usize;
                    a.free(live.swap_remove(i)).unwrap();
                }
                a.verify().unwrap();
            }
            if capacity >= 1 << 22 {
                assert!(waited > 0, "capacity {capacity}: no fragment ever waited");
            }
        }
    }

    #[test]
    fn a_fragment_waits_only_while_fragments_are_few() {
        // 2^21 blocks: fragments may hold up to 2048 - 1024 free blocks.
        let cap = 1u64 << 21;
        let mut a = SegFitAllocator::with_capacity(cap).unwrap();
        let x = a.allocate(10, None).unwrap();
        let _y = a.allocate(1, None).unwrap();
        a.free(x).unwrap();
        // A 10-block fragment and the long rest: 4 blocks come from the
        // long extent, and the fragment waits for a 10-block request.
        let e = a.allocate(4, None).unwrap();
        assert_eq!(e.start(), 11);
        assert_eq!(a.allocate(10, None).unwrap(), x);
        // Fragments past the cap: plain best fit.
        let mut holes = Vec::new();
        for _ in 0..200 {
            let h = a.allocate(10, None).unwrap();
            a.allocate(1, None).unwrap();
            holes.push(h);
        }
        for h in holes {
            a.free(h).unwrap();
        }
        assert!(a.fragment_blocks() + EXACT > cap >> WAIT_CAP_SHIFT);
        let e = a.allocate(4, None).unwrap();
        assert_eq!(e.len(), 4);
        assert!(a.fragment_blocks() == 1996, "{}", a.fragment_blocks());
        a.verify().unwrap();
    }

    #[test]
    fn exact_fit_and_merges() {
        let mut a = SegFitAllocator::with_capacity(100).unwrap();
        let x: Vec<_> = (0..10).map(|_| a.allocate(10, None).unwrap()).collect();
        assert_eq!(a.used(), 100);
        a.verify().unwrap();
        a.free(x[3]).unwrap();
        a.free(x[5]).unwrap();
        assert_eq!(a.free_extent_count(), 2);
        a.free(x[4]).unwrap(); // merges both sides
        assert_eq!(a.free_extent_count(), 1);
        a.verify().unwrap();
        // Best fit picks the 30-block hole for a 30-block request exactly.
        let y = a.allocate(30, None).unwrap();
        assert_eq!(y.len(), 30);
        assert_eq!(a.used(), 100);
        a.verify().unwrap();
    }
}
