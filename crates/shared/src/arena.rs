//! [`Arena`]: one engine and the regions it owns.
//!
//! Arena 0 is the **pool**: it owns every region no thread has leased. The
//! others are thread arenas (the per-thread caches): a thread allocates from
//! its arena alone, under that arena's lock, and refills it by leasing whole
//! regions from the pool — a batch of space, traded in one locked step.
//!
//! Every arena's engine spans the whole device but holds, as free, only the
//! free space of the regions the arena owns; everything else looks allocated
//! to it. Moving a region between arenas is `take_free_range` on one engine
//! and `free` of the same extents on the other.

use blockalloc::{AllocError, Allocator, Extent, FreeError, FromFreeExtents, SegFitAllocator};

use crate::regions::Regions;

#[derive(Debug)]
pub(crate) struct Arena {
    pub(crate) engine: SegFitAllocator,
    /// Free blocks per region, meaningful for the regions this arena owns.
    /// (Indexed by region for speed; pages of it that no owned region falls
    /// in are never touched, so they cost no memory.)
    region_free: Vec<u64>,
    /// Regions this arena owns (thread arenas only; the pool owns the rest).
    pub(crate) regions: Vec<u32>,
    /// Per region, its index in `regions` plus one, or 0 when not listed
    /// there: lets a region leave in O(1). Invariant: `slot[regions[i]] ==
    /// i + 1` for every `i`, and 0 everywhere else.
    slot: Vec<u32>,
    /// Regions that were seen entirely free; checked again when taken.
    pub(crate) empty: EmptyList,
    /// The region this arena leased last: the next lease prefers the one
    /// after it, so that an arena's regions form runs and the free space at
    /// the end of one region merges with the start of the next.
    pub(crate) last_lease: Option<u32>,
}

impl Arena {
    /// An arena with no space.
    pub(crate) fn empty(regions: &Regions, capacity: u64) -> Arena {
        Arena {
            engine: SegFitAllocator::from_free_extents(capacity, &[])
                .expect("an empty free list is always valid"),
            region_free: vec![0; regions.count() as usize],
            regions: Vec::new(),
            slot: vec![0; regions.count() as usize],
            empty: EmptyList::new(regions.count()),
            last_lease: None,
        }
    }

    /// The pool of a device where exactly `free` is free: it owns every
    /// region.
    pub(crate) fn pool(
        regions: &Regions,
        capacity: u64,
        free: &[Extent],
    ) -> Result<Arena, blockalloc::BuildError> {
        let mut a = Arena::empty(regions, capacity);
        a.engine = SegFitAllocator::from_free_extents(capacity, free)?;
        for &e in free {
            a.account(regions, e, false);
        }
        for r in (0..regions.count()).rev() {
            if a.is_empty(regions, r) {
                a.empty.push(r);
            }
        }
        Ok(a)
    }

    /// Free blocks of region `r` (owned by this arena).
    pub(crate) fn region_free(&self, r: u32) -> u64 {
        self.region_free[r as usize]
    }

    /// True when region `r` (owned by this arena) is entirely free.
    pub(crate) fn is_empty(&self, regions: &Regions, r: u32) -> bool {
        self.region_free[r as usize] == regions.extent(r).len()
    }

    /// Counts `e` as allocated (`alloc`) or freed in the region counters.
    #[inline]
    fn account(&mut self, regions: &Regions, e: Extent, alloc: bool) {
        regions.pieces(e, |r, p| {
            let c = &mut self.region_free[r as usize];
            if alloc {
                *c -= p.len();
            } else {
                *c += p.len();
            }
        });
    }

    /// Free blocks held.
    pub(crate) fn free_blocks(&self) -> u64 {
        self.engine.capacity() - self.engine.used()
    }

    pub(crate) fn allocate(
        &mut self,
        regions: &Regions,
        len: u64,
        hint: Option<u64>,
    ) -> Result<Extent, AllocError> {
        let e = self.engine.allocate(len, hint)?;
        self.account(regions, e, true);
        Ok(e)
    }

    /// Allocates `len` blocks scattered, appended to `out`.
    pub(crate) fn allocate_scattered(
        &mut self,
        regions: &Regions,
        len: u64,
        out: &mut Vec<Extent>,
    ) -> Result<(), AllocError> {
        let before = out.len();
        self.engine.allocate_scattered(len, out)?;
        for &e in &out[before..] {
            self.account(regions, e, true);
        }
        Ok(())
    }

    /// Frees `e`, which lies in regions this arena owns; notes regions that
    /// became entirely free.
    pub(crate) fn free(&mut self, regions: &Regions, e: Extent) -> Result<(), FreeError> {
        self.engine.free(e)?;
        self.account(regions, e, false);
        regions.pieces(e, |r, _| {
            if self.region_free[r as usize] == regions.extent(r).len() {
                self.empty.push(r);
            }
        });
        Ok(())
    }

    /// Checks the O(1) indexes over `regions` and `empty` against the lists.
    pub(crate) fn check_lists(&self) -> Result<(), String> {
        for (i, &r) in self.regions.iter().enumerate() {
            if self.slot[r as usize] as usize != i + 1 {
                return Err(format!("region {r} is listed at {i} but its slot is stale"));
            }
        }
        let slots = self.slot.iter().filter(|&&s| s != 0).count();
        if slots != self.regions.len() {
            return Err(format!(
                "{slots} region slots set for {} listed regions",
                self.regions.len()
            ));
        }
        self.empty.check()
    }

    /// Takes one region this arena believes entirely free and that still is
    /// (owned by `me` and empty).
    pub(crate) fn pop_empty(&mut self, regions: &Regions, me: u32) -> Option<u32> {
        while let Some(r) = self.empty.pop() {
            if regions.owner(r) == me && self.is_empty(regions, r) {
                return Some(r);
            }
        }
        None
    }

    /// Gives region `r` and its free space from `self` (arena `from`) to
    /// `to` (arena `dest`). The caller holds both locks.
    pub(crate) fn move_region(
        &mut self,
        from: u32,
        to: &mut Arena,
        dest: u32,
        regions: &Regions,
        r: u32,
    ) {
        debug_assert_eq!(regions.owner(r), from);
        for e in self.engine.take_free_range(regions.extent(r)) {
            to.engine
                .free(e)
                .expect("space moved in is allocated in the receiving engine");
        }
        regions.set_owner(r, dest);
        to.region_free[r as usize] = std::mem::take(&mut self.region_free[r as usize]);
        let listed = std::mem::take(&mut self.slot[r as usize]);
        if listed != 0 {
            let i = listed as usize - 1;
            self.regions.swap_remove(i);
            if let Some(&moved) = self.regions.get(i) {
                self.slot[moved as usize] = listed;
            }
        }
        if dest != crate::regions::POOL {
            to.regions.push(r);
            to.slot[r as usize] = to.regions.len() as u32;
        }
        if to.is_empty(regions, r) {
            to.empty.push(r);
        }
    }
}

/// Regions an arena saw entirely free: a stack with a membership bit per
/// region, so each region is listed at most once and noting or taking one
/// is O(1) however many regions the device has. Entries are hints — a listed
/// region may have been allocated from or moved away since — and
/// [`Arena::pop_empty`] checks each again.
///
/// Invariant: bit `r` of `listed` is set iff `r` is in `stack`.
#[derive(Debug)]
pub(crate) struct EmptyList {
    stack: Vec<u32>,
    listed: Vec<u64>,
}

impl EmptyList {
    fn new(regions: u32) -> EmptyList {
        EmptyList {
            stack: Vec::new(),
            listed: vec![0; regions.div_ceil(64) as usize],
        }
    }

    /// The word and bit of region `r` in `listed`.
    fn bit(r: u32) -> (usize, u64) {
        (r as usize / 64, 1u64 << (r % 64))
    }

    fn is_listed(&self, r: u32) -> bool {
        let (w, b) = Self::bit(r);
        self.listed[w] & b != 0
    }

    fn unlist(&mut self, r: u32) {
        let (w, b) = Self::bit(r);
        self.listed[w] &= !b;
    }

    /// Lists region `r` unless it is listed already.
    pub(crate) fn push(&mut self, r: u32) {
        if !self.is_listed(r) {
            let (w, b) = Self::bit(r);
            self.listed[w] |= b;
            self.stack.push(r);
        }
    }

    /// Takes the region listed last.
    fn pop(&mut self) -> Option<u32> {
        let r = self.stack.pop()?;
        self.unlist(r);
        Some(r)
    }

    /// Regions listed.
    pub(crate) fn len(&self) -> usize {
        self.stack.len()
    }

    /// True when no region is listed.
    pub(crate) fn is_empty(&self) -> bool {
        self.stack.is_empty()
    }

    /// Checks that the bits match the stack and nothing is listed twice.
    fn check(&self) -> Result<(), String> {
        let bits: u64 = self.listed.iter().map(|w| u64::from(w.count_ones())).sum();
        if bits != self.stack.len() as u64 {
            return Err(format!(
                "{bits} empty-region bits set for {} listed regions",
                self.stack.len()
            ));
        }
        match self.stack.iter().find(|&&r| !self.is_listed(r)) {
            Some(r) => Err(format!("region {r} is listed as empty without its bit")),
            None => Ok(()),
        }
    }

    /// Unlists every region.
    pub(crate) fn clear(&mut self) {
        while self.pop().is_some() {}
    }
}
