//! [`Regions`]: the device cut into aligned regions, the unit that arenas
//! lease from the pool, and who owns each.
//!
//! A region is `2^shift` blocks (the last one may be shorter). Its owner is
//! an arena index (0 = the pool). The free space of a region lives in its
//! owner's engine, and only there; ownership changes only while both the old
//! and the new owner's locks are held, so a thread holding arena `a`'s lock
//! that reads `owner(r) == a` knows the answer holds until it unlocks.
//!
//! The free-block count of each region lives in its owner's arena (see
//! `Arena::region_free`): only the owner reads or writes it, under its lock,
//! so threads working in neighbouring regions never share a counter's cache
//! line.

use blockalloc::Extent;

use crate::sync::{AtomicU32, Ordering};

/// The index of the pool arena.
pub(crate) const POOL: u32 = 0;

#[derive(Debug)]
pub(crate) struct Regions {
    shift: u32,
    capacity: u64,
    owner: Box<[AtomicU32]>,
}

impl Regions {
    /// All regions owned by the pool. `shift` comes from
    /// [`SharedConfig::region_shift`](crate::SharedConfig::region_shift),
    /// which bounds the count.
    pub(crate) fn new(capacity: u64, shift: u32) -> Regions {
        let count = capacity.div_ceil(1u64 << shift);
        debug_assert!(count <= crate::config::MAX_REGIONS);
        Regions {
            shift,
            capacity,
            owner: (0..count).map(|_| AtomicU32::new(POOL)).collect(),
        }
    }

    pub(crate) fn count(&self) -> u32 {
        self.owner.len() as u32
    }

    pub(crate) fn blocks_per_region(&self) -> u64 {
        1 << self.shift
    }

    /// The region holding `block`.
    #[inline]
    pub(crate) fn of(&self, block: u64) -> u32 {
        (block >> self.shift) as u32
    }

    /// The blocks of region `r`.
    pub(crate) fn extent(&self, r: u32) -> Extent {
        let start = u64::from(r) << self.shift;
        // The last region may end at the device's end near 2^64, where a
        // whole region's end would not fit in a u64.
        let end = start.saturating_add(1 << self.shift).min(self.capacity);
        Extent::from_range(start, end).expect("regions are never empty")
    }

    #[inline]
    pub(crate) fn owner(&self, r: u32) -> u32 {
        self.owner[r as usize].load(Ordering::Acquire)
    }

    /// Records a new owner. The caller holds both owners' locks.
    pub(crate) fn set_owner(&self, r: u32, arena: u32) {
        self.owner[r as usize].store(arena, Ordering::Release);
    }

    /// Calls `f(region, blocks)` for each region `e` touches.
    #[inline]
    pub(crate) fn pieces(&self, e: Extent, mut f: impl FnMut(u32, Extent)) {
        let mut pos = e.start();
        while pos < e.end() {
            let r = self.of(pos);
            let end = self.extent(r).end().min(e.end());
            f(r, Extent::from_range(pos, end).expect("pos < end"));
            pos = end;
        }
    }

    /// True when every region `e` touches is owned by `arena`.
    pub(crate) fn owned_by(&self, e: Extent, arena: u32) -> bool {
        let (a, b) = (self.of(e.start()), self.of(e.end() - 1));
        (a..=b).all(|r| self.owner(r) == arena)
    }
}
