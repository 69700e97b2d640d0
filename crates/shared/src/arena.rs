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
    /// Regions this arena owns (thread arenas only; the pool owns the rest).
    pub(crate) regions: Vec<u32>,
    /// Regions that were seen entirely free; checked again when taken.
    pub(crate) empty: Vec<u32>,
}

impl Arena {
    /// An arena with no space.
    pub(crate) fn empty(capacity: u64) -> Arena {
        Arena {
            engine: SegFitAllocator::from_free_extents(capacity, &[])
                .expect("an empty free list is always valid"),
            regions: Vec::new(),
            empty: Vec::new(),
        }
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
        regions.account(e, true);
        Ok(e)
    }

    /// Frees `e`, which lies in regions this arena owns; notes regions that
    /// became entirely free.
    pub(crate) fn free(&mut self, regions: &Regions, e: Extent) -> Result<(), FreeError> {
        self.engine.free(e)?;
        regions.account(e, false);
        regions.pieces(e, |r, _| {
            if regions.is_empty(r) {
                self.empty.push(r);
            }
        });
        if self.empty.len() > 2 * regions.count() as usize + 64 {
            self.empty.sort_unstable();
            self.empty.dedup();
        }
        Ok(())
    }

    /// Takes one region this arena believes entirely free and that still is
    /// (owned by `me` and empty).
    pub(crate) fn pop_empty(&mut self, regions: &Regions, me: u32) -> Option<u32> {
        while let Some(r) = self.empty.pop() {
            if regions.owner(r) == me && regions.is_empty(r) {
                self.empty.retain(|&x| x != r);
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
        if let Some(i) = self.regions.iter().position(|&x| x == r) {
            self.regions.swap_remove(i);
        }
        if dest != crate::regions::POOL {
            to.regions.push(r);
        }
        if regions.is_empty(r) {
            to.empty.push(r);
        }
    }
}
