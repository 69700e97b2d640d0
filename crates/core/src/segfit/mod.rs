//! `segfit`: the recommended engine. Segregated fit over coalesced free
//! extents, steered by recent demand, with an address-ordered B+tree for
//! merging and double-free detection.
//!
//! Free space is a set of maximal free extents. Each lives in a node that is
//! on two indexes at once:
//! * a **size class list** ([`classes`]): 1024 exact-size classes (every
//!   object size from 4 KiB to 4 MiB) and TLSF-style classes above, with a
//!   two-level bitmap to find the smallest non-empty class `>= n` in O(1);
//! * the **address tree** ([`btree::AddrTree`]), keyed by the block just past
//!   the extent (its end), so that cutting from the front or growing to the
//!   left leaves the tree untouched.
//!
//! Operations:
//! * allocate(n), `n` ≤ 1024 blocks, takes the first of:
//!   1. an extent of exactly `n` blocks (a pop, as in the notes' fast bins:
//!      no sliver is left behind);
//!   2. the smallest extent of a size in **surplus** — more free extents of
//!      that size than recent requests for it ([`demand`]) — so that sizes
//!      the workload stopped asking for are cut up instead of stranded (the
//!      notes' failure under a workload shift);
//!   3. while the fragments (extents of at most 1024 blocks) can wait —
//!      the large extents hold more than a third of the free space, or
//!      exact fits would use the fragments up no later than cuts use up the
//!      large extents, at the recent rates of each ([`demand`]) — and so
//!      can the fragment a best fit would cut (requests of exactly its size
//!      would take that size's free extents no later than cuts use up the
//!      large extents), unless the best fit would leave a remainder of a
//!      popular size that a coming request takes whole (then cutting it
//!      strands nothing), the smallest extent longer than 1024 blocks: its
//!      remainder stays large, and the fragments stay intact for their
//!      requests;
//!   4. the best fit: the smallest extent longer than `n`.
//!
//!   Longer requests take a fitting extent of their own class (a short scan)
//!   or any extent of the next non-empty class. The `n` blocks are cut from
//!   the **front** of the chosen extent, so its key (the end) and the tree
//!   stay untouched unless the extent is used up; successive cuts from one
//!   extent ascend, adjacent. Allocation fails only when no free extent
//!   holds `n` blocks.
//! * allocate(n, hint h): if `h` lies in a free extent with room for
//!   `[h, h+n)` that range is taken (an I/O stream passing its last end gets
//!   adjacent extents); otherwise the first of the next few free extents
//!   after `h` that fits, cut from its start; otherwise best fit.
//! * free(e): one tree lookup finds the first free extent ending after
//!   `e.start`; if it starts before `e.end` the free is refused (double
//!   free), if it starts at `e.end` the two merge; the entry before it merges
//!   if it ends at `e.start`. So a free creates, extends or merges nodes at
//!   once: no compaction ever.
//! * allocate_scattered(n): one extent when one fits; otherwise the largest
//!   extents whole, then a best fit for the rest. Fails only when fewer than
//!   `n` blocks are free.
//!
//! Complexity: allocate O(1) when it does not use up a node, otherwise the
//! B+tree's O(log₃₂ F); free O(log₃₂ F) for `F` free extents. Memory: about
//! 24 bytes per free extent in nodes plus 16–22 in the tree, 8 KiB of demand
//! counters; nothing per allocated extent.
//!
//! Invariants (checked by `verify`):
//! * every node is in exactly one class list, the one of its length, and in
//!   the tree under its end; class bit `c` is set iff list `c` is
//!   non-empty;
//! * free extents lie in the device, are disjoint, and **no two touch**
//!   (they would have merged);
//! * `used + Σ free lengths == capacity`.

pub(crate) mod btree;
mod classes;
mod demand;
mod prefault;

use std::num::NonZeroU32;

use self::btree::AddrTree;
use self::classes::{class_of, ClassBits, CLASSES, EXACT};
use self::demand::Demand;
use crate::allocator::{check_alloc, check_free_list, check_free_range};
use crate::error::{AllocError, BuildError, FreeError, VerifyError};
use crate::{Allocator, Extent, FromFreeExtents, Status, StatusBuilder};

/// How many nodes of a range class are looked at for one that fits before
/// moving to the next class (which always fits).
const CLASS_SCAN: usize = 8;
/// How many classes of large extents step 3 looks at for one whose
/// remainder is of use.
const LARGE_SCAN: usize = 8;
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

/// One free extent and its place in its size class.
#[derive(Clone, Copy, Debug)]
struct Node {
    start: u64,
    len: u64,
    /// Index in `classes[class_of(len)]`.
    pos: u32,
}

/// The recommended engine: demand-steered segregated fit with immediate
/// coalescing. `docs/design.md` describes the policy and why it packs well.
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
    /// Per size class, a stack of the nodes in it. A stack rather than an
    /// intrusive list: pushing touches only the stack's end, not the node
    /// that was on top, and a removal from the middle moves one id.
    classes: Box<[Vec<NodeId>]>,
    bits: ClassBits,
    tree: AddrTree<Entry>,
    demand: Demand,
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
        let n = Node { start, len, pos: 0 };
        match self.spare.pop() {
            Some(id) => {
                *self.node_mut(id) = n;
                id
            }
            None => self.grow_nodes(n),
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
            pos: 0,
        };
        prefault::push(&mut self.nodes, &mut self.nodes_written, n, blank);
        NodeId::from_index(self.nodes.len() - 1)
    }

    /// Puts `id` on top of its class.
    #[inline(always)]
    fn link(&mut self, id: NodeId) {
        let c = class_of(self.node(id).len);
        self.link_in(id, c);
    }

    /// Puts `id` on top of class `c`, its class.
    #[inline(always)]
    fn link_in(&mut self, id: NodeId, c: usize) {
        debug_assert_eq!(c, class_of(self.node(id).len));
        let stack = &mut self.classes[c];
        if stack.is_empty() {
            self.bits.set(c);
        }
        let pos = stack.len() as u32;
        prefault::push_doubling(stack, id);
        self.node_mut(id).pos = pos;
        self.demand.linked(c);
    }

    /// Takes `id` out of its class (the class of its current length).
    #[inline(always)]
    fn unlink(&mut self, id: NodeId) {
        let c = class_of(self.node(id).len);
        self.unlink_from(id, c);
    }

    /// Takes `id` out of class `c`, its class.
    #[inline(always)]
    fn unlink_from(&mut self, id: NodeId, c: usize) {
        let pos = self.node(id).pos;
        debug_assert_eq!(c, class_of(self.node(id).len));
        let stack = &mut self.classes[c];
        let last = stack.pop().expect("a linked node's class is not empty");
        let now_empty = stack.is_empty();
        if last != id {
            stack[pos as usize] = last;
            self.node_mut(last).pos = pos;
        }
        if now_empty {
            self.bits.clear(c);
        }
        self.demand.unlinked(c);
    }

    /// The node on top of class `c`.
    #[inline]
    fn top(&self, c: usize) -> Option<NodeId> {
        self.classes[c].last().copied()
    }

    /// Makes node `id` describe `[start, start + len)`, moving it to the
    /// class of its new length only if that class differs (cutting from a
    /// large extent rarely changes its class, and then touches no list).
    #[inline(always)]
    fn reshape(&mut self, id: NodeId, start: u64, len: u64) {
        let (from, to) = (class_of(self.node(id).len), class_of(len));
        if from != to {
            self.unlink_from(id, from);
        }
        let n = self.node_mut(id);
        n.start = start;
        n.len = len;
        if from != to {
            self.link_in(id, to);
        }
    }

    /// Chooses the free extent to cut `len` blocks from (see the module
    /// docs for the order and why). With `may_refill`, `None` also when the
    /// policy wants a long extent, none is here, and the owner can add one
    /// (see [`set_refill_blocks`](Self::set_refill_blocks)).
    #[inline(always)]
    fn choose(&self, len: u64, may_refill: bool) -> Option<NodeId> {
        let c = class_of(len);
        if len <= EXACT {
            // 1. Exact fit.
            if let Some(id) = self.top(c) {
                return Some(id);
            }
            // 2. A size nobody is asking for.
            if let Some(m) = self.demand.surplus_above(c) {
                return self.top(m);
            }
            // 3. A large extent, if the fragments can wait, so can the best
            // fit (when it is a fragment), and the best fit's remainder is
            // not a size about to be taken whole; else 4. the best fit.
            let fit = self.bits.first_at_or_after(c + 1)?;
            let large = self.large_blocks();
            if self.fragments_may_wait(fit, large) && !self.remainder_taken_soon(fit, len, large) {
                if let Some(id) = self.choose_large(len) {
                    return Some(id);
                }
                // No long extent here, but the caller can add one: better
                // than cutting a fragment the policy means to keep.
                if may_refill && self.refill_blocks >= Self::MIN_REFILL {
                    return None;
                }
            }
            return self.top(fit);
        }
        // Longer than any exact class: a fitting extent of its own class, or
        // any extent of the next non-empty class.
        let stack = &self.classes[c];
        let mut best: Option<NodeId> = None;
        for &id in stack.iter().rev().take(CLASS_SCAN) {
            let n = self.node(id);
            if n.len >= len && best.is_none_or(|b| self.node(b).len > n.len) {
                best = Some(id);
                if n.len == len {
                    break;
                }
            }
        }
        if best.is_some() {
            return best;
        }
        if let Some(next) = self.bits.first_at_or_after(c + 1) {
            return self.top(next);
        }
        // Nothing larger exists: the whole class must be searched before
        // giving up, or a fitting extent deep in the stack would be missed.
        stack
            .iter()
            .rev()
            .copied()
            .find(|&id| self.node(id).len >= len)
    }

    /// Whether step 3 may cut a request with no exact fit from a large
    /// extent and leave the fragments (free extents of at most `EXACT`
    /// blocks) to their exact requests; `fit` is the best fit's class.
    ///
    /// First, the fragments as a whole: while the large extents hold more
    /// than a third of the free space (then the fragments' wait costs
    /// nothing a later long request needs), or while exact fits, at their
    /// recent rate, would use the fragments up no later than cuts use up
    /// the large extents ([`Demand::fragments_may_wait`]). Second, the one
    /// fragment passed over, the best fit: its own size may be asked for
    /// too rarely to be taken in time even when the rest are (the mix moved
    /// to other sizes, or the size was always rare), so requests for
    /// exactly its size must take its free extents no later than cuts use
    /// up the large extents ([`Demand::size_may_wait`]). Otherwise waiting
    /// would only end with the large extents gone and the fragment still
    /// free, which is how a small or aged device fails early: best fit
    /// instead.
    #[inline(always)]
    fn fragments_may_wait(&self, fit: usize, large: u64) -> bool {
        (large > self.demand.fragment_blocks() / 2 || self.demand.fragments_may_wait(large))
            && (fit >= EXACT as usize || self.demand.size_may_wait(fit, large))
    }

    /// The free blocks in extents longer than `EXACT`, with the refill the
    /// owner can add (see [`set_refill_blocks`](Self::set_refill_blocks)).
    #[inline(always)]
    fn large_blocks(&self) -> u64 {
        let large = self.capacity - self.used - self.demand.fragment_blocks();
        if self.refill_blocks >= Self::MIN_REFILL {
            large.saturating_add(self.refill_blocks)
        } else {
            large
        }
    }

    /// Whether cutting `len` blocks from the best fit, the top extent of
    /// exact class `fit`, leaves a remainder the workload is about to take
    /// whole ([`Demand::takes_soon`]): then the best fit strands nothing,
    /// and step 3 would spend a large extent on a request a fragment
    /// serves. Under sizes with a long tail (log-normal) the large extents
    /// went to the many small requests while their fragments waited, and
    /// the rare long request then found none: up to 4 % of the device
    /// short of a plain best fit.
    #[inline]
    fn remainder_taken_soon(&self, fit: usize, len: u64, large: u64) -> bool {
        if fit >= EXACT as usize {
            return false;
        }
        // Exact classes hold extents of exactly `fit + 1` blocks.
        let rest = fit as u64 + 1 - len;
        self.demand.takes_soon(class_of(rest), large)
    }

    /// Step 3 of the policy for `len <= EXACT`: the smallest extent longer
    /// than 1024 blocks whose remainder after the cut is still of use —
    /// longer than 1024 blocks, or no shorter than some recent request. A
    /// remainder shorter than everything the workload asks for would be
    /// stranded (as when small objects give way to large ones), so such
    /// extents are passed over, for a few classes, in favour of one that
    /// leaves a useful remainder; failing that, the smallest large extent.
    #[inline]
    fn choose_large(&self, len: u64) -> Option<NodeId> {
        let first = self.bits.first_at_or_after(EXACT as usize)?;
        let mut c = first;
        for _ in 0..LARGE_SCAN {
            let id = self.top(c)?;
            let rest = self.node(id).len - len;
            if rest == 0 || rest > EXACT || self.demand.wanted_up_to(rest) {
                return Some(id);
            }
            match self.bits.first_at_or_after(c + 1) {
                Some(next) => c = next,
                None => break,
            }
        }
        self.top(first)
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

    /// The longest free extent's length (0 when full): a scan of the
    /// largest non-empty class only.
    pub fn largest_free(&self) -> u64 {
        let Some(c) = self.bits.last() else { return 0 };
        self.classes[c]
            .iter()
            .map(|&id| self.node(id).len)
            .max()
            .unwrap_or(0)
    }

    fn no_space(&self, requested: u64) -> AllocError {
        AllocError::NoSpace {
            requested,
            free: self.capacity - self.used,
            largest_free: self.largest_free(),
        }
    }

    /// Counts a request for `len` blocks that was served elsewhere, inside
    /// space this engine handed out whole (a lease, an arena), in the
    /// demand that steers the policy, as if this engine had served it.
    ///
    /// An engine that hands out regions sees only their lengths, not the
    /// object sizes allocated inside them. When the regions' free space
    /// comes back (a lease is returned) and this engine serves the objects
    /// itself, every fragment would look like a size nobody asks for (step
    /// 2) and be cut up; noting each object it allocates in a region keeps
    /// the fragments of sizes in demand for their exact requests.
    pub fn note_request(&mut self, len: u64) {
        if len > 0 {
            self.demand.requested(len);
        }
    }

    /// Tells the engine how many free blocks in long runs its owner can
    /// add to it on request: a pool's untouched regions, a server's unleased
    /// space. `0`, the default, makes the engine decide from its own free
    /// space alone, as a whole device.
    ///
    /// An engine that holds part of a device (an arena, a lease) otherwise
    /// judges the fragments against its own few long extents, finds they
    /// cannot wait, and cuts slivers from them while long runs stay free
    /// elsewhere: the device then fills worse than one engine over all of
    /// it. With `blocks` of at least [`MIN_REFILL`](Self::MIN_REFILL),
    /// step 3 of the policy counts them with its long extents; and when it
    /// would cut a request from a long extent but holds none, the
    /// allocation fails with [`AllocError::NoSpace`] (with `largest_free` of
    /// at least the request), so that the owner adds a run and asks again.
    /// The owner sets `0` again once it can add no more.
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
        self.demand.fragment_blocks()
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
            classes: (0..CLASSES).map(|_| Vec::new()).collect(),
            bits: ClassBits::new(),
            tree: AddrTree::new(capacity),
            demand: Demand::new(),
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
        self.demand.requested(len);
        match self.choose(len, true) {
            Some(id) => {
                self.demand.served(len, self.node(id).len);
                Ok(self.take_front(id, len))
            }
            None => Err(self.no_space(len)),
        }
    }

    fn allocate_scattered(&mut self, len: u64, out: &mut Vec<Extent>) -> Result<(), AllocError> {
        check_alloc(self.capacity, len, None)?;
        if len > self.capacity - self.used {
            return Err(self.no_space(len));
        }
        // The request counts towards demand like a contiguous one: without
        // it every size would look like surplus and be cut into slivers.
        self.demand.requested(len);
        let mut need = len;
        loop {
            if let Some(id) = self.choose(need, false) {
                self.demand.served(need, self.node(id).len);
                out.push(self.take_front(id, need));
                return Ok(());
            }
            // Nothing holds the rest: take the head of the largest class.
            let c = self.bits.last().expect("free counter says blocks are free");
            let id = self.top(c).expect("class bit set means class non-empty");
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
            + self.classes.len() * std::mem::size_of::<Vec<NodeId>>()
            + self.classes.iter().map(|v| v.capacity() * 4).sum::<usize>()
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
        if let Err(what) = self.demand.check() {
            return fail(what);
        }
        let mut listed = 0usize;
        for c in 0..CLASSES {
            let before = listed;
            if self.bits.get(c) == self.classes[c].is_empty() {
                return fail(format!("class {c}: bit and stack disagree"));
            }
            for (i, &id) in self.classes[c].iter().enumerate() {
                let Some(n) = self.nodes.get(id.index()) else {
                    return fail(format!("class {c}: missing node {}", id.raw()));
                };
                if n.pos as usize != i {
                    return fail(format!("class {c}: node at {} says it is at {}", i, n.pos));
                }
                if class_of(n.len) != c {
                    return fail(format!(
                        "extent at {} of {} blocks filed in class {c}",
                        n.start, n.len
                    ));
                }
                listed += 1;
            }
            if c < EXACT as usize && self.demand.count(c) as usize != listed - before {
                return fail(format!(
                    "class {c}: {} extents listed, demand counter says {}",
                    listed - before,
                    self.demand.count(c)
                ));
            }
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

    #[test]
    fn served_sums_survive_requests_as_long_as_the_device() {
        // The decaying sums of served blocks add each request's length: on
        // a device of 2^64 - 1 blocks three half-device requests within one
        // half-life exceed u64.
        let mut a = SegFitAllocator::with_capacity(u64::MAX).unwrap();
        for _ in 0..3 {
            let e = a.allocate(u64::MAX / 2, None).unwrap();
            a.verify().unwrap();
            a.free(e).unwrap();
        }
        // Small requests still choose by the policy afterwards.
        let x = a.allocate(10, None).unwrap();
        assert_eq!(x.len(), 10);
        a.verify().unwrap();
    }

    #[test]
    fn a_best_fit_leaving_a_popular_size_spares_the_large_extents() {
        let mut a = SegFitAllocator::with_capacity(1_000_000).unwrap();
        // Demand: 4 blocks far more often than any other size, 12 blocks
        // now and then, and one request each of 21 other sizes.
        for _ in 0..50 {
            a.allocate(4, None).unwrap();
        }
        let twelve: Vec<_> = (0..3).map(|_| a.allocate(12, None).unwrap()).collect();
        for len in 20..41 {
            a.allocate(len, None).unwrap();
        }
        // One 12-block fragment between allocated neighbours.
        let hole = twelve[1];
        a.free(hole).unwrap();
        a.verify().unwrap();
        // Cutting 5 blocks from it would leave 7, a size nobody asks for:
        // the fragment waits for a 12-block request, and the 5 blocks come
        // from the large extent (step 3).
        let e = a.allocate(5, None).unwrap();
        assert!(!hole.overlaps(&e), "{e} cut from the fragment {hole}");
        // Cutting 8 leaves 4, the popular size, which a coming request
        // takes whole: the best fit strands nothing and spares the large
        // extent.
        let e = a.allocate(8, None).unwrap();
        assert_eq!(
            e.start(),
            hole.start(),
            "{e} not cut from the fragment {hole}"
        );
        a.verify().unwrap();
    }

    #[test]
    fn noted_requests_keep_their_fragments_whole() {
        // A 10-block fragment of a size nobody asked this engine for: a
        // 4-block request cuts it as surplus (step 2).
        let mut a = SegFitAllocator::with_capacity(100_000).unwrap();
        let three = a.allocate(3, None).unwrap();
        let seven = a.allocate(7, None).unwrap();
        a.allocate(5, None).unwrap();
        a.free(three).unwrap();
        a.free(seven).unwrap();
        let hole = Extent::from_range(three.start(), seven.end()).unwrap();
        let mut noted = a.clone();
        let e = a.allocate(4, None).unwrap();
        assert_eq!(e.start(), hole.start(), "{e}");
        // Told that 10-block objects are allocated elsewhere, the engine
        // keeps the fragment for them and cuts the long extent.
        noted.note_request(10);
        noted.note_request(10);
        noted.note_request(0);
        let e = noted.allocate(4, None).unwrap();
        assert!(!hole.overlaps(&e), "{e} cut from {hole}");
        noted.verify().unwrap();
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
